"""The XRT driver (host/devices/xrt.py) against a fake ``pyxrt`` whose kernels and registers are a golden core.

The fake (tests/board_fakes.py) implements exactly the ``pyxrt`` subset the driver uses: buffer objects
must be synced before a data mover reads them, stream arguments cannot be set from the host, and what the
``mmfree_mm2s`` runs stream is reassembled into the model image and executed by the golden device, whose
output packet the ``mmfree_s2mm`` run writes back. Registers are read at the Alveo offset (0x10).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from board_fakes import FakeCore, Faults, fake_pyxrt

from host.devices import DEVICES, DeviceError, open_device
from host.devices.golden import GoldenDevice
from host.model import HGRNBitConfig, random_weights
from hw import isa
from hw.isa import ErrorCause

CFG = HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28)
BUILD = {"lanes": 24, "channels": 3, "bus_bits": 256, "quant_lanes": 4}


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=6)


@pytest.fixture
def card(tmp_path, monkeypatch):
    def make(faults=None, **kw):
        core = FakeCore(**{**BUILD, **kw}, base=isa.register_base("alveo"), faults=faults)
        mod = fake_pyxrt(core)
        monkeypatch.setitem(sys.modules, "pyxrt", mod)
        xb = tmp_path / "mmfree.xclbin"
        xb.write_bytes(b"xclbin")
        return core, mod, xb
    return make


def _golden(weights):
    g = GoldenDevice(**BUILD)
    g.load(weights)
    return g


def test_registered():
    assert DEVICES["xrt"].module == "host.devices.xrt"


def test_bit_exact_with_golden(card, weights):
    core, mod, xb = card()
    dev = open_device("xrt", xclbin=xb)
    dev.load(weights)
    gold = _golden(weights)
    for t in [0, 59, 12, 12, 33]:
        assert np.array_equal(dev.step(t), gold.step(t))
    assert dev.counters()["hw_trits"] == gold.counters()["hw_trits"]
    # one s2mm run, the token and image on mm2s_0, the image on every other channel: per token
    assert len(mod.runs) == 5 * (2 + BUILD["channels"])
    # the token packet is not the end of channel 0's stream (last = 0); each image stream ends with last = 1
    first = mod.streamed[:1 + BUILD["channels"]]
    assert first[0][0] == 0 and first[0][2] == 0 and all(last == 1 for _, _, last in first[1:])
    saved, gsaved = dev.save_state(), gold.save_state()
    x = dev.step(4)
    assert np.array_equal(x, gold.step(4))
    dev.restore_state(saved)
    gold.restore_state(gsaved)
    assert np.array_equal(dev.step(4), x)
    dev.close()


def test_id_block_is_read_above_xrt_registers(card):
    core, _, xb = card()
    core.base = 0          # a core answering at 0x00 (a Zynq build in an xclbin): ID magic not at 0x10
    with pytest.raises(DeviceError, match="ID magic"):
        open_device("xrt", xclbin=xb)


def test_wrong_magic(card):
    _, _, xb = card(Faults(magic=0))
    with pytest.raises(DeviceError, match="no mmfree core"):
        open_device("xrt", xclbin=xb)


def test_stalled_kernel_is_a_timeout(card, weights):
    core, _, xb = card()
    dev = open_device("xrt", xclbin=xb, timeout_s=0.2)
    dev.load(weights)
    gold = _golden(weights)
    assert np.array_equal(dev.step(1), gold.step(1))
    core.faults.stall_channel = 2
    with pytest.raises(DeviceError, match=r"time-out .*mm2s_2"):
        dev.step(2)
    core.faults.stall_channel = None
    assert np.array_equal(dev.step(2), gold.step(2))


def test_core_error_flag(card, weights):
    core, mod, xb = card()
    dev = open_device("xrt", xclbin=xb, timeout_s=0.5)
    dev.load(weights)
    gold = _golden(weights)
    assert np.array_equal(dev.step(3), gold.step(3))
    core.faults.force_error = ErrorCause.CONST_CRC
    n_s2mm = sum(r.k.kind == "mmfree_s2mm" for r in mod.runs)
    with pytest.raises(DeviceError, match="CONST_CRC"):
        dev.step(1)
    core.faults.force_error = None
    # the s2mm run of the failed token (no output packet came) takes the next token's packet
    assert np.array_equal(dev.step(1), gold.step(1))
    assert sum(r.k.kind == "mmfree_s2mm" for r in mod.runs) == n_s2mm + 1


def test_missing_xclbin_and_pyxrt(card, tmp_path, monkeypatch):
    card()
    with pytest.raises(DeviceError, match="not found"):
        open_device("xrt", xclbin=tmp_path / "none.xclbin")
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    with pytest.raises(DeviceError, match="pyxrt"):
        open_device("xrt", xclbin=tmp_path / "none.xclbin")
