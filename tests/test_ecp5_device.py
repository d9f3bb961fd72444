"""The ECP5 device (host.devices.ecp5) on a stream-only board (link version 1) against a protocol-level board
model, and without a board.

:class:`board_fakes.FakeEcp5Board` speaks the UART link protocol byte for byte (hw.boards.link_protocol: the
same frames the gateware test drives through the Amaranth simulator, tests/hw/test_uart_link.py) and runs each
streamed token packet and image on the golden machine, the way the bitstream's core would. It also checks that
the host never has more stream bytes unacknowledged than the board's receive FIFO holds. The DRAM boards (link
version 2) are tests/test_ecp5_dram.py. A real board is a ``board``-marked test that skips without
``MMFREE_ECP5_PORT``.
"""

import os
from pathlib import Path

import numpy as np
import pytest
from board_fakes import FakeEcp5Board as FakeBoard
from board_fakes import ecp5_id_values as id_values

from host.devices import DeviceError, open_device
from host.devices.ecp5 import DEFAULT_BOARD, ECP5_BOARDS, Ecp5Device, LinkTimeout, token_seconds
from host.devices.golden import GoldenDevice
from host.model import HGRNBitConfig, random_weights
from hw import isa
from hw.boards import link_protocol as lp

R = isa.REGISTER_MAP
CFG = HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28)


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=3)


def test_tokens_match_the_golden_device_bit_for_bit(weights):
    board = FakeBoard()
    gold = GoldenDevice()
    gold.load(weights)
    with Ecp5Device(serial=board, timeout=1.0) as dev:
        dev.load(weights)
        assert dev.mode == "stream" and not dev.transport.runs_token_ids   # it answered '?' to 'G'
        for t in (5, 17, 0, 60):
            assert np.array_equal(dev.step(t), gold.step(t))
        c = dev.counters()
        assert c["hw_stream_beats"] == board.counters[isa.Counter.STREAM_BEATS] > 0
        assert c["link_bytes"] > 4 * len(dev.transport.stream)
        link = len(dev.transport.stream) + len(dev.token_packet(0))
        assert dev.seconds_per_token() == pytest.approx(token_seconds(link))
    # the host kept the board's receive FIFO from overflowing
    assert 0 < board.max_unacked <= lp.RX_FIFO_BYTES


def test_state_save_restore_and_reset_replay(weights):
    gold = GoldenDevice()
    gold.load(weights)
    dev = Ecp5Device(serial=FakeBoard(), timeout=1.0)
    dev.load(weights)
    dev.step(3)
    saved = dev.save_state()
    a = dev.step(9)
    dev.reset()
    dev.step(11)
    dev.restore_state(saved)        # a core reset and a replay of token 3
    assert np.array_equal(dev.step(9), a)
    gold.step(3)
    assert np.array_equal(gold.step(9), a)
    assert dev.counters()["replayed_tokens"] == 1


def test_core_error_is_reported_and_cleared(weights):
    dev = Ecp5Device(serial=FakeBoard(), timeout=1.0)
    dev.load(weights)
    bad = bytearray(dev.token_packet(4))
    bad[-1] ^= 0xFF                                  # break the packet's CRC
    with pytest.raises(DeviceError, match="TOKEN_CRC"):
        dev.run_packet(bytes(bad))
    gold = GoldenDevice()
    gold.load(weights)
    assert np.array_equal(dev.step(4), gold.step(4))  # the state was not touched


def test_wrong_id_block_is_refused(weights):
    ids = id_values()
    ids[R.ID_MAGIC] = 0x12345678
    with pytest.raises(DeviceError, match="ID magic"):
        Ecp5Device(serial=FakeBoard(ids), timeout=1.0).load(weights)
    with pytest.raises(DeviceError, match="64-bit channel"):
        Ecp5Device(serial=FakeBoard(id_values(bus_bits=128)), timeout=1.0).load(weights)


def test_model_too_big_for_the_bitstream(weights):
    with pytest.raises(DeviceError, match="does not fit"):
        Ecp5Device(serial=FakeBoard(id_values(max_hidden=16)), timeout=1.0).load(weights)


class Silent:
    timeout = None

    def read(self, n):
        return b""

    def write(self, b):
        return len(b)

    def reset_input_buffer(self):
        pass

    def close(self):
        pass


def test_no_board_is_a_timeout_error(weights):
    with pytest.raises(LinkTimeout, match="is the board connected"):
        Ecp5Device(serial=Silent(), timeout=0.05).load(weights)


def test_missing_port_is_a_clear_error(weights, tmp_path):
    dev = open_device("ecp5", port=str(tmp_path / "no-such-tty"), timeout=0.1)
    with pytest.raises(DeviceError, match="no-such-tty|pyserial"):
        dev.load(weights)


def test_shipped_model_fits_the_ecp5_builds():
    """The shipped model loads on the committed builds' buffers and its first token matches the golden device."""
    from host.checkpoint import load_checkpoint

    ck = load_checkpoint(Path(__file__).resolve().parents[1] / "models" / "hgrn-bit-pydoc")
    gold = GoldenDevice()
    gold.load(ck)
    with Ecp5Device(serial=FakeBoard(), timeout=1.0) as dev:
        dev.load(ck)
        assert np.array_equal(dev.step(1), gold.step(1))
        assert 9.5 < dev.seconds_per_token() < 10.5      # 1.95 MB at 2 Mbaud, 10 bits per byte


def test_default_rate_is_the_builds_rate(monkeypatch):
    """The device opens each board's port at the rate its committed bitstream runs the link at (the build
    dispatcher's default too), on the port Linux usually gives its bridge; ``MMFREE_ECP5_BOARD``,
    ``MMFREE_ECP5_BAUD`` and ``MMFREE_ECP5_PORT`` override, and an unknown board is refused by name."""
    from hw.boards import ecp5 as boards

    for var in ("MMFREE_ECP5_BAUD", "MMFREE_ECP5_BOARD", "MMFREE_ECP5_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert set(boards.CHOSEN) == set(ECP5_BOARDS)
    for key, chosen in boards.CHOSEN.items():
        dev = Ecp5Device(serial=FakeBoard(), board=key)
        assert (dev.board, dev.baud) == (key, chosen["baud"])
    assert Ecp5Device(serial=FakeBoard()).board == DEFAULT_BOARD == "ulx3s-85f"
    assert Ecp5Device(serial=FakeBoard()).port_name == "/dev/ttyUSB0"
    assert Ecp5Device(serial=FakeBoard(), board="ecpix5-85f").port_name == "/dev/ttyUSB1"
    monkeypatch.setenv("MMFREE_ECP5_BOARD", "ecpix5-85f")
    assert Ecp5Device(serial=FakeBoard()).port_name == "/dev/ttyUSB1"
    monkeypatch.setenv("MMFREE_ECP5_PORT", "/dev/ttyACM3")
    assert Ecp5Device(serial=FakeBoard()).port_name == "/dev/ttyACM3"
    assert Ecp5Device(serial=FakeBoard(), port="/dev/ttyUSB4").port_name == "/dev/ttyUSB4"
    monkeypatch.setenv("MMFREE_ECP5_BAUD", "3000000")
    assert Ecp5Device(serial=FakeBoard()).baud == 3_000_000
    assert Ecp5Device(serial=FakeBoard(), baud=115_200).baud == 115_200
    for bad in ("fast", "0", "-5"):
        monkeypatch.setenv("MMFREE_ECP5_BAUD", bad)
        with pytest.raises(ValueError, match="MMFREE_ECP5_BAUD"):
            Ecp5Device(serial=FakeBoard())
        assert Ecp5Device(serial=FakeBoard(), baud=12_000_000).baud == 12_000_000    # a given rate wins
    monkeypatch.delenv("MMFREE_ECP5_BAUD")
    for board in ("pynq-z2", "ulx3s"):
        with pytest.raises(ValueError, match=f"unknown ECP5 board '{board}'.*ulx3s-85f, ecpix5-85f"):
            Ecp5Device(serial=FakeBoard(), board=board)


@pytest.mark.board
def test_real_board_matches_golden(weights):
    port = os.environ.get("MMFREE_ECP5_PORT")
    if not port:
        pytest.skip("no ECP5 board: set MMFREE_ECP5_PORT to the serial port of a board running bitstreams/<board>")
    gold = GoldenDevice()
    gold.load(weights)
    with open_device("ecp5", port=port) as dev:
        dev.load(weights)
        for t in (1, 2):
            assert np.array_equal(dev.step(t), gold.step(t))
