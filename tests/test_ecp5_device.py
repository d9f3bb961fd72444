"""The ECP5 device (host.devices.ecp5) against a protocol-level board model, and without a board.

:class:`FakeBoard` speaks the UART link protocol byte for byte (hw.boards.uart_link: the same frames the
gateware test drives through the Amaranth simulator, tests/hw/test_uart_link.py) and runs each streamed
token packet and image on the golden machine, the way the bitstream's core would. It also checks that the
host never has more stream bytes unacknowledged than the board's receive FIFO holds. A real board is a
``board``-marked test that skips without ``MMFREE_ECP5_PORT``.
"""

import os
import struct
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from host.devices import DeviceError, open_device
from host.devices.ecp5 import Ecp5Device, LinkTimeout, token_seconds
from host.devices.golden import GoldenDevice, GoldenMachine
from host.image import ImageError
from host.model import HGRNBitConfig, random_weights
from hw import isa
from hw.boards import ecp5
from hw.boards import uart_link as ul

R = isa.REGISTER_MAP
CFG = HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28)


def id_values(**over):
    """The ID block of the committed ECP5 builds (hw.boards.ecp5.DEFAULT_PARAMS), with overrides."""
    p = ecp5.DEFAULT_PARAMS
    kw = dict(lanes=p["lanes"], channels=1, bus_bits=64, packings=[isa.TritPacking[p["packing"].upper()]],
              quant_lanes=p["quant_lanes"], max_hidden=p["max_hidden"], max_intermediate=p["max_intermediate"],
              max_layers=p["max_layers"])
    kw.update(over)
    return isa.id_block_values(**kw)


class FakeBoard:
    """The bitstream seen from the serial port: link protocol, register block, golden core."""

    def __init__(self, ids=None):
        self.ids = ids if ids is not None else id_values()
        self.timeout = None
        self.rx = bytearray()            # bytes from the host not yet parsed
        self.tx = deque()                # frames to the host
        self.unacked = deque()           # stream bytes per 'S' command whose 's' the host has not read
        self.max_unacked = 0
        self.state = None
        self.machines = {}
        self.reset()

    def reset(self):
        self.phase, self.packet, self.beats = "token", b"", bytearray()
        self.state = None
        self.counters = dict.fromkeys(isa.Counter, 0)
        self.status, self.cause, self.where = 0, 0, 0

    # ---- pyserial subset
    def write(self, data):
        self.rx += data
        self._parse()
        return len(data)

    def read(self, n):
        out = bytearray()
        while self.tx and len(out) < n:
            frame = self.tx[0]          # [bytes left, first byte of the frame]
            k = min(n - len(out), len(frame[0]))
            out += frame[0][:k]
            del frame[0][:k]
            if not frame[0]:
                self.tx.popleft()
                if frame[1] == ul.REP_STREAM:
                    self.unacked.popleft()
        return bytes(out)

    def reset_input_buffer(self):
        self.tx.clear()

    def close(self):
        pass

    # ---- board
    def _reply(self, *chunks):
        frame = bytearray(b"".join(chunks))
        self.tx.append([frame, frame[0]])

    def _reg(self, addr):
        if addr in self.ids:
            return self.ids[addr]
        if addr == R.STATUS:
            return self.status
        if addr == R.ERROR_CAUSE:
            return self.cause
        if addr == R.ERROR_WHERE:
            return self.where
        for c in isa.Counter:
            if addr == R.counter(c):
                return self.counters[c] & 0xFFFFFFFF
            if addr == R.counter(c) + 4:
                return self.counters[c] >> 32
        return 0

    def _parse(self):
        while self.rx:
            op = self.rx[0]
            if op == ul.OP_READ:
                if len(self.rx) < 2:
                    return
                self._reply(bytes([ul.REP_READ]), struct.pack("<I", self._reg(self.rx[1])))
                del self.rx[:2]
            elif op == ul.OP_WRITE:
                if len(self.rx) < 6:
                    return
                addr, value = self.rx[1], struct.unpack_from("<I", self.rx, 2)[0]
                if addr == R.CTRL and value & isa.Ctrl.CLEAR.value:
                    self.status, self.phase, self.beats = 0, "token", bytearray()
                self._reply(bytes([ul.REP_WRITE]))
                del self.rx[:6]
            elif op == ul.OP_STREAM:
                if len(self.rx) < 4:
                    return
                n1, flags = struct.unpack_from("<HB", self.rx, 1)
                size = 8 * (n1 + 1)
                if len(self.rx) < 4 + size:
                    return
                self.unacked.append(4 + size)
                self.max_unacked = max(self.max_unacked, sum(self.unacked))
                self.beats += self.rx[4:4 + size]
                del self.rx[:4 + size]
                self._reply(bytes([ul.REP_STREAM]))
                if flags & 1:
                    self._packet_end()
            elif op == ul.OP_RESET:
                self.reset()
                self._reply(bytes([ul.REP_RESET]))
                del self.rx[:1]
            else:
                self._reply(bytes([ul.REP_UNKNOWN]))
                del self.rx[:1]

    def _packet_end(self):
        data, self.beats = bytes(self.beats), bytearray()
        if self.status & isa.Status.ERROR.value:     # error state: inputs are drained
            return
        if self.phase == "token":
            self.packet, self.phase = data, "image"
            return
        self.phase = "token"
        m = self.machines.get(data) or self.machines.setdefault(data, GoldenMachine(data))
        state = self.state if self.state is not None else m.init_state()
        try:
            res = m.run_token(self.packet, state)
        except ImageError as exc:
            self.status = (isa.Status.ERROR | isa.Status.DONE).value
            self.cause, self.where = exc.cause.value, exc.instruction or 0
            return
        self.state = res.state
        for c, v in res.counters.items():     # the oracle's activity counts; the beats its bytes make
            self.counters[c] += int(v)
        self.counters[isa.Counter.STREAM_BEATS] += sum(res.stream_bytes) // ul.BEAT_BYTES
        words = struct.unpack(f"<{len(res.output) // 4}I", res.output)
        for i, w in enumerate(words):
            self._reply(bytes([ul.REP_OUTPUT]), struct.pack("<IB", w, int(i == len(words) - 1)))
        self.status = isa.Status.DONE.value


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=3)


def test_tokens_match_the_golden_device_bit_for_bit(weights):
    board = FakeBoard()
    gold = GoldenDevice()
    gold.load(weights)
    with Ecp5Device(serial=board, timeout=1.0) as dev:
        dev.load(weights)
        for t in (5, 17, 0, 60):
            assert np.array_equal(dev.step(t), gold.step(t))
        c = dev.counters()
        assert c["hw_stream_beats"] == board.counters[isa.Counter.STREAM_BEATS] > 0
        assert c["link_bytes"] > 4 * len(dev.transport.stream)
        link = len(dev.transport.stream) + len(dev.token_packet(0))
        assert dev.seconds_per_token() == pytest.approx(token_seconds(link))
    # the host kept the board's receive FIFO from overflowing
    assert 0 < board.max_unacked <= ul.RX_FIFO_BYTES


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
    """The device opens the port at the rate the boards' default bitstreams run their link at."""
    from hw.boards import ecp5 as boards

    monkeypatch.delenv("MMFREE_ECP5_BAUD", raising=False)
    assert {c["baud"] for c in boards.CHOSEN.values()} == {Ecp5Device(serial=FakeBoard()).baud}
    monkeypatch.setenv("MMFREE_ECP5_BAUD", "3000000")
    assert Ecp5Device(serial=FakeBoard()).baud == 3_000_000
    assert Ecp5Device(serial=FakeBoard(), baud=115_200).baud == 115_200
    for bad in ("fast", "0", "-5"):
        monkeypatch.setenv("MMFREE_ECP5_BAUD", bad)
        with pytest.raises(ValueError, match="MMFREE_ECP5_BAUD"):
            Ecp5Device(serial=FakeBoard())


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
