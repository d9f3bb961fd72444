"""The PYNQ driver (host/devices/pynq.py) against a fake ``pynq`` whose DMAs and registers are a golden core.

The fake (tests/board_fakes.py) implements exactly the ``pynq`` subset the driver uses; what the driver
streams is reassembled into a model image and executed by the golden device, so these tests check the
driver's whole path bit for bit (logits identical to the golden device's, token after token, with chunked
DMA transfers), and its error paths: wrong ID block, a stalled DMA (a time-out, not a hang), a DMA error
bit, the core's error flag, a model too large for the bitstream, missing files.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from board_fakes import FakeCore, Faults, fake_pynq

from host.devices import DEVICES, DeviceError, open_device
from host.devices.golden import GoldenDevice
from host.model import HGRNBitConfig, random_weights
from hw.isa import Counter, ErrorCause

CFG = HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28)
BUILD = {"lanes": 16, "channels": 2, "bus_bits": 64, "quant_lanes": 4}


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=5)


@pytest.fixture
def board(tmp_path, monkeypatch):
    """(core, pynq module, bitstream path) with the fake installed as ``pynq``."""
    def make(faults=None, **kw):
        core = FakeCore(**{**BUILD, **kw}, faults=faults)
        mod = fake_pynq(core)
        monkeypatch.setitem(sys.modules, "pynq", mod)
        bit = tmp_path / "mmfree.bit"
        bit.write_bytes(b"bit")
        bit.with_suffix(".hwh").write_text("<hwh/>")
        return core, mod, bit
    return make


def _golden(weights, **kw):
    g = GoldenDevice(**{**{k: v for k, v in BUILD.items()}, **kw})
    g.load(weights)
    return g


def test_registered_and_lazy():
    assert DEVICES["pynq"].module == "host.devices.pynq"
    import host.devices.pynq  # noqa: F401 - importing the module must not import pynq
    assert "pynq" not in sys.modules or not hasattr(sys.modules["pynq"], "allocations")


def test_bit_exact_with_golden_chunked(board, weights):
    core, mod, bit = board()
    # 4 KiB chunks: every channel stream of this image is split into several DMA transfers
    dev = open_device("pynq", bitstream=bit, chunk_bytes=4096)
    dev.load(weights)
    gold = _golden(weights)
    ids = [3, 17, 0, 60, 42, 5]
    for t in ids:
        got, want = dev.step(t), gold.step(t)
        assert np.array_equal(got, want), f"token {t}: logits differ from the golden device"
    assert core.tokens_run == len(ids)
    from host.protocol import channel_streams

    lens = [len(s) for s in channel_streams(dev.image)]
    assert lens[0] > 4096       # channel 0 really is split
    for c in range(2):
        sent = getattr(mod.overlays[0], f"dma{c}").sendchannel.transfers
        per_token = -(-lens[c] // 4096) + (c == 0)          # chunks (+ the token packet on channel 0)
        assert len(sent) == per_token * len(ids) and max(sent) <= 4096
    c = dev.counters()
    # counters read back from the core: the golden device's counts per token
    assert c["hw_tokens"] == len(ids)
    assert c["hw_trits"] == gold.counters()["hw_trits"]
    assert dev.last_counters[Counter.CYCLES] == gold.last.counters[Counter.CYCLES]
    rep = dev.cycles_report()
    assert rep["measured"] == pytest.approx(gold.counters()["hw_cycles"] / len(ids))
    dev.close()
    assert all(getattr(b, "freed", False) for b in mod.allocations)


def test_reset_save_restore_and_prefill(board, weights):
    core, _, bit = board()
    dev = open_device("pynq", bitstream=bit)
    dev.load(weights)
    gold = _golden(weights)
    dev.prefill([1, 2, 3])
    gold.prefill([1, 2, 3])
    saved, gsaved = dev.save_state(), gold.save_state()
    a = dev.step(9)
    assert np.array_equal(a, gold.step(9))
    dev.restore_state(saved)
    gold.restore_state(gsaved)
    assert np.array_equal(dev.step(9), a)
    dev.reset()
    gold.reset()
    assert np.array_equal(dev.step(4), gold.step(4))
    assert core.soft_resets >= 3


def test_wrong_id_magic(board):
    _, _, bit = board(Faults(magic=0xDEADBEEF))
    with pytest.raises(DeviceError, match="ID magic 0xdeadbeef"):
        open_device("pynq", bitstream=bit)


def test_wrong_isa_version(board):
    _, _, bit = board(Faults(version=99))
    with pytest.raises(DeviceError, match="ISA version 99, newer than this host's"):
        open_device("pynq", bitstream=bit)


def test_isa_1_bitstream_is_refused_with_what_to_rebuild(board):
    """A bitstream built before ISA 2 computes the earlier arithmetic: refused, naming the fix."""
    _, _, bit = board(Faults(version=1))
    with pytest.raises(DeviceError, match=r"ISA version 1 \(the arithmetic before the released checkpoints' "
                                          r"numerics.*make bitstream BOARD="):
        open_device("pynq", bitstream=bit)


def test_stalled_dma_is_a_timeout_and_recovers(board, weights):
    core, _, bit = board()
    dev = open_device("pynq", bitstream=bit, timeout_s=0.2)
    dev.load(weights)
    gold = _golden(weights)
    assert np.array_equal(dev.step(7), gold.step(7))
    core.faults.stall_channel = 1
    with pytest.raises(DeviceError, match=r"time-out after 0.2 s: DMA channel\(s\) \[1\]"):
        dev.step(8)
    assert 2 in core.ctrl_writes                  # aborted
    core.faults.stall_channel = None
    # the next token replays the sequence (token 7) after the reset: same logits as the golden device
    assert np.array_equal(dev.step(8), gold.step(8))
    assert dev.counters()["replayed_tokens"] == 1


def test_dma_error_bit(board, weights):
    core, _, bit = board()
    dev = open_device("pynq", bitstream=bit)
    dev.load(weights)
    core.faults.dma_error_channel = 0
    with pytest.raises(DeviceError, match=r"DMA 0 \(MM2S\) reported an error"):
        dev.step(1)


def test_core_error_flag(board, weights):
    core, _, bit = board()
    dev = open_device("pynq", bitstream=bit)
    dev.load(weights)
    gold = _golden(weights)
    assert np.array_equal(dev.step(2), gold.step(2))
    core.faults.force_error = ErrorCause.BAD_TRIT
    with pytest.raises(DeviceError, match="BAD_TRIT at instruction 3.*state is unchanged"):
        dev.step(3)
    core.faults.force_error = None
    assert np.array_equal(dev.step(3), gold.step(3))     # the failed token left the state as it was


def test_model_too_large_for_bitstream(board, weights):
    _, _, bit = board(max_hidden=16)
    dev = open_device("pynq", bitstream=bit)
    with pytest.raises(DeviceError, match="does not fit this bitstream"):
        dev.load(weights)


def test_missing_files_and_bad_options(board, tmp_path):
    board()
    with pytest.raises(DeviceError, match="not found"):
        open_device("pynq", bitstream=tmp_path / "none.bit")
    lone = tmp_path / "lone.bit"
    lone.write_bytes(b"x")
    with pytest.raises(DeviceError, match=r"\.hwh"):
        open_device("pynq", bitstream=lone)
    with pytest.raises(ValueError, match="chunk_bytes"):
        open_device("pynq", bitstream=lone, chunk_bytes=1000)


def test_missing_dma_in_overlay(board, monkeypatch):
    core, _, bit = board()
    monkeypatch.setitem(sys.modules, "pynq", fake_pynq(core, dmas=1))
    with pytest.raises(DeviceError, match="no 'dma1' DMA"):
        open_device("pynq", bitstream=bit)


def test_no_pynq_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynq", None)
    with pytest.raises(DeviceError, match="pynq package"):
        open_device("pynq", bitstream=tmp_path / "x.bit")
