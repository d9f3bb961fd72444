"""host.devices: the Device contract (on a toy device and the reference device) and the registry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from host_fakes import ToyDevice, tiny_checkpoint, tiny_weights

import host.devices
from host.devices import (
    DEFAULT_DEVICE,
    DEVICES,
    PLANNED_DEVICES,
    Device,
    DeviceEntry,
    DeviceError,
    DeviceState,
    open_device,
)

ROOT = Path(__file__).resolve().parent.parent


def _reference_device(**options) -> Device:
    pytest.importorskip("host.reference", reason="host/reference.py (ReferenceModel) is not written yet")
    from host.devices.reference import ReferenceDevice

    return ReferenceDevice(**options)


@pytest.fixture(params=["toy", "reference"])
def device(request):
    dev = ToyDevice() if request.param == "toy" else _reference_device()
    yield dev
    dev.close()


@pytest.fixture
def loaded(device):
    device.load(tiny_checkpoint())
    return device


PROMPT = [1, 40, 41, 42, 7, 99, 250]


# ---------------------------------------------------------------------- the contract, on every device

def test_step_before_load_raises(device):
    with pytest.raises(DeviceError, match="load"):
        device.step(1)
    with pytest.raises(DeviceError):
        device.prefill([1, 2])
    with pytest.raises(DeviceError):
        device.reset()
    with pytest.raises(DeviceError):
        device.save_state()
    assert not device.loaded


def test_step_returns_float32_logits(loaded):
    v = loaded.vocab_size
    logits = loaded.step(1)
    assert logits.shape == (v,) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert loaded.position == 1


@pytest.mark.parametrize("bad", [-1, 10**6])
def test_out_of_range_token_names_id_and_vocab(loaded, bad):
    v = loaded.vocab_size
    with pytest.raises(ValueError, match=rf"token id {bad}\b.*vocabulary size {v}"):
        loaded.step(bad)
    with pytest.raises(ValueError, match=rf"token id {bad}\b.*vocabulary size {v}"):
        loaded.prefill([1, 2, bad])
    assert loaded.position == 0


def test_non_integer_token_raises_type_error(loaded):
    for bad in (1.5, "3", True):
        with pytest.raises(TypeError):
            loaded.step(bad)
    loaded.step(np.int64(3))  # numpy integers are fine


def test_empty_prompt_raises(loaded):
    with pytest.raises(ValueError, match="empty"):
        loaded.prefill([])


def test_prefill_equals_stepping(loaded):
    stepped = [loaded.step(t) for t in PROMPT]
    loaded.reset()
    last = loaded.prefill(PROMPT)
    assert loaded.position == len(PROMPT)
    np.testing.assert_allclose(last, stepped[-1], rtol=1e-4, atol=1e-4)
    loaded.reset()
    rows = loaded.forward(PROMPT)
    assert rows.shape == (len(PROMPT), loaded.vocab_size) and rows.dtype == np.float32
    np.testing.assert_allclose(rows, np.stack(stepped), rtol=1e-4, atol=1e-4)
    # prefill continues from the current state, like step
    loaded.reset()
    loaded.prefill(PROMPT[:3])
    np.testing.assert_allclose(loaded.prefill(PROMPT[3:]), stepped[-1], rtol=1e-4, atol=1e-4)
    assert loaded.position == len(PROMPT)


def test_reset_starts_a_new_sequence(loaded):
    first = loaded.prefill(PROMPT)
    loaded.step(9)
    loaded.reset()
    assert loaded.position == 0
    np.testing.assert_array_equal(loaded.prefill(PROMPT), first)


def test_bad_prompt_leaves_state_untouched(loaded):
    loaded.prefill(PROMPT[:3])
    saved = loaded.save_state()
    with pytest.raises(ValueError):
        loaded.prefill([5, 6, loaded.vocab_size])
    assert loaded.position == 3
    after = loaded.step(7)
    loaded.restore_state(saved)
    np.testing.assert_array_equal(loaded.step(7), after)


def test_save_restore_gives_identical_continuations(loaded):
    loaded.prefill(PROMPT)
    state = loaded.save_state()
    assert isinstance(state, DeviceState) and state.device == loaded.name and state.position == len(PROMPT)
    cont = [20, 21, 22, 3, 3]
    first = [loaded.step(t) for t in cont]
    for _ in range(2):  # a state can be restored more than once
        loaded.restore_state(state)
        assert loaded.position == len(PROMPT)
        again = [loaded.step(t) for t in cont]
        for a, b in zip(first, again, strict=True):
            np.testing.assert_array_equal(a, b)
    # restoring after a reset, and across a fresh device of the same kind
    loaded.reset()
    loaded.restore_state(state)
    np.testing.assert_array_equal(loaded.step(cont[0]), first[0])


def test_restore_on_other_model_or_device_raises(loaded):
    state = loaded.save_state()
    with pytest.raises(DeviceError, match="shape"):
        other = type(loaded)()
        other.load(tiny_weights(hidden=8))
        other.restore_state(state)
    foreign = DeviceState(device="somewhere-else", model=state.model, position=0, payload=state.payload)
    with pytest.raises(DeviceError, match="somewhere-else"):
        loaded.restore_state(foreign)
    with pytest.raises(TypeError):
        loaded.restore_state(state.payload)


def test_counters(loaded):
    before = loaded.counters()
    assert before["loads"] == 1 and before["tokens"] == 0
    loaded.prefill(PROMPT)
    loaded.step(3)
    loaded.step(4)
    loaded.reset()
    c = loaded.counters()
    assert c["tokens"] == len(PROMPT) + 2
    assert c["step_calls"] == 2 and c["prefill_calls"] == 1 and c["prefill_tokens"] == len(PROMPT)
    assert c["resets"] == 1
    c["tokens"] = -1  # a copy
    assert loaded.counters()["tokens"] == len(PROMPT) + 2
    assert all(isinstance(v, int) for v in loaded.counters().values())


def test_close_and_context_manager(device):
    with device as dev:
        dev.load(tiny_checkpoint())
        dev.step(1)
        assert dev.loaded
    assert device.closed and not device.loaded
    device.close()  # idempotent
    with pytest.raises(DeviceError, match="closed"):
        device.step(1)
    with pytest.raises(DeviceError, match="closed"):
        device.load(tiny_checkpoint())


def test_load_accepts_checkpoint_or_weights(device):
    device.load(tiny_weights())
    a = device.prefill(PROMPT)
    device.load(tiny_checkpoint())
    np.testing.assert_array_equal(device.prefill(PROMPT), a)
    with pytest.raises(TypeError, match="Checkpoint"):
        device.load(object())


def test_repr_and_name(loaded):
    assert isinstance(type(loaded).name, str) and type(loaded).name in repr(loaded)


# ---------------------------------------------------------------------- reference device specifics

def test_reference_device_matches_reference_model():
    dev = _reference_device()
    from host.reference import ReferenceModel

    weights = tiny_weights()
    model = ReferenceModel(weights)
    dev.load(weights)
    state = model.init_state()
    for t in PROMPT:
        expected, state = model.step(t, state)
        np.testing.assert_array_equal(dev.step(t), expected)
    dev.reset()
    logits, _ = model.forward(PROMPT, model.init_state())
    np.testing.assert_array_equal(dev.prefill(PROMPT), logits[-1])


def test_reference_device_through_registry():
    _reference_device()
    with open_device("reference", output_gate="released") as dev:
        assert dev.name == "reference"
        dev.load(tiny_checkpoint())
        assert dev.step(1).shape == (dev.vocab_size,)
    with pytest.raises(ValueError, match="output_gate"):
        open_device("reference", no_such_option=1)


# ---------------------------------------------------------------------- registry

def test_registry_default_and_entries():
    assert DEFAULT_DEVICE in DEVICES
    assert "reference" in DEVICES
    for name in ("golden", "rtl", "pynq", "xrt"):
        assert name in PLANNED_DEVICES or name in DEVICES
    for entry in DEVICES.values():
        assert isinstance(entry, DeviceEntry)


def test_unknown_device_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown device 'nope'.*reference"):
        open_device("nope")


def test_planned_device_says_not_implemented(monkeypatch):
    monkeypatch.setitem(PLANNED_DEVICES, "future", "a device from the future")
    with pytest.raises(DeviceError, match=r"'future'.*not implemented.*reference"):
        open_device("future")


def test_device_module_import_failure_is_device_error(monkeypatch):
    monkeypatch.setitem(DEVICES, "broken", DeviceEntry("host.devices._no_such_module", "X", "broken"))
    with pytest.raises(DeviceError, match="broken.*not available"):
        open_device("broken")


def test_open_device_options(monkeypatch):
    monkeypatch.setitem(DEVICES, "toy", DeviceEntry(ToyDevice.__module__, "ToyDevice", "toy"))
    dev = open_device("toy", gain=3.0)
    assert isinstance(dev, ToyDevice) and dev.gain == 3.0 and not dev.loaded
    with pytest.raises(ValueError, match=r"does not accept.*\bgain\b"):
        open_device("toy", gian=3.0)
    monkeypatch.setitem(DEVICES, "notadevice", DeviceEntry("host.devices", "DEVICES", "x"))
    with pytest.raises(DeviceError, match="not a Device"):
        open_device("notadevice")


def test_registry_imports_no_device_module_eagerly():
    code = ("import sys, host.devices, host.cli; "
            "bad = [m for m in ('host.devices.reference', 'host.reference', 'host.checkpoint', "
            "'pynq', 'pyxrt') "
            "if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    assert host.devices.open_device is open_device
