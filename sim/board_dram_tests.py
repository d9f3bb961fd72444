"""cocotb tests of the simulated DRAM boards, the ULX3S (SDRAM) and the ECPIX-5 (DDR3) (``sim/test_board_dram.py``
and ``sim/test_board_ddr3.py`` build a board and run one test per pytest case: parameters in
``MMFREE_BOARD_PARAMS``, results to ``MMFREE_BOARD_RESULT``).

:class:`BoardLink` is the testbench's side of the board: the clocks (cocotb's GPI clocks, so that Verilator runs
free between bytes: the board's, and the controller's own where it has one, ``dram_clk``, unrelated), reset, the
DRAM's power-up, the port's opening on a board that holds it (:func:`open_port`), and the board's link bytes
either through the byte port (``bp_rx``/``bp_tx``, one byte a cycle, driven and sampled at falling edges: both
sides pass a FIFO whose ``ready``/``valid`` depend on its state only) or through the serial line (8N1 bit by
bit on ``uart_rx``/``uart_tx`` with timers, at the simulation's divisor; the board's own UART on the other
side). It logs each host-to-board command when the board has received its last byte, and each board-to-host
frame when its last byte left the board, with the simulated time and the DRAM model's DFI command counters, and
it owns the back door (``$readmemh`` into the model's bank arrays).

The host side is the real driver, :mod:`host.devices.ecp5`, run by :func:`host_call` in a thread
(``cocotb.task.bridge``) on :class:`SimSerial`, a pyserial-like port whose ``read``/``write`` run in the
simulator (``cocotb.task.resume``). While the thread runs the simulator waits, so the host is infinitely fast
in simulated time; the driver's clock (the ``time`` module of ``host.devices.ecp5`` and ``host.devices.driver``)
is the simulated one during the call (:class:`SimClock`): its time-outs, its waits and its ``link_ns`` are the
board's seconds.

Expectations come from the host code alone: tiny random models compiled by :mod:`host.compiler`
(``accelerator_tests.tiny_model``), bundles written and read by :mod:`host.bundle`, the golden device
(:class:`host.devices.golden.GoldenDevice`) for every token and ``accelerator_tests.golden_cause`` for the error a
corrupted image must raise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cocotb
import numpy as np
from accelerator_tests import golden_cause, tiny_model
from cocotb.clock import Clock
from cocotb.task import bridge, resume
from cocotb.triggers import ClockCycles, Event, FallingEdge, First, RisingEdge, Timer, with_timeout
from cocotb.utils import get_sim_time
from dram_tests import monitor

from host.bundle import read_bundle, write_bundle
from host.devices.base import DeviceError
from host.devices.golden import GoldenDevice
from host.image import parse_image
from host.protocol import CoreError, parse_output_packet
from hw.boards import link_protocol as lp
from hw.boards.link_protocol import BoardReg, BoardStatus, TokenStatus
from hw.isa import ErrorCause, Opcode, TritPacking
from hw.params import BuildParams

log = logging.getLogger("cocotb.board")

#: DFI counters of :func:`dram_tests.monitor` that count commands (``ref_max_gap`` is a maximum, not a count)
COUNTS = ("ref_count", "act_count", "pre_count", "rd_count", "wr_count")


def params() -> dict:
    return json.loads(os.environ["MMFREE_BOARD_PARAMS"])


# ------------------------------------------------------------------------------------------- logs
@dataclass
class Command:
    """A host-to-board command as the board received it (``t_ps``: its last byte in, simulated ps)."""

    op: int
    args: bytes
    data_bytes: int
    t_ps: float
    monitor: dict | None = None


@dataclass
class Frame:
    """A board-to-host frame (``t_ps``: its last byte out, simulated ps)."""

    head: int
    body: bytes
    t_ps: float
    monitor: dict | None = None


class CommandParser:
    """Splits the host's byte stream into link commands (:data:`hw.boards.link_protocol.COMMAND_BYTES`; ``'L'``
    and ``'S'`` then ``8 n`` data bytes); an unknown opcode is a one-byte command."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.op, self.args, self.need = None, bytearray(), 0

    @property
    def idle(self) -> bool:
        return self.op is None

    def feed(self, b: int) -> tuple[int, bytes, int] | None:
        """One byte; returns ``(op, args, data bytes)`` when it completes a command."""
        if self.op is None:
            self.op, self.args, self.need = b, bytearray(), lp.COMMAND_BYTES.get(b, 0)
            self.data = 0
        elif len(self.args) < lp.COMMAND_BYTES.get(self.op, 0):
            self.args.append(b)
            self.need -= 1
            if len(self.args) == lp.COMMAND_BYTES[self.op] and self.op in (lp.OP_DRAM_WRITE, lp.OP_STREAM):
                n = (struct.unpack_from("<H", self.args, 4 if self.op == lp.OP_DRAM_WRITE else 0)[0] + 1)
                self.data = self.need = lp.BEAT_BYTES * n
        else:
            self.need -= 1
        if self.need == 0:
            done = (self.op, bytes(self.args), self.data)
            self.reset()
            return done
        return None


class FrameParser:
    """Splits the board's byte stream into reply frames (:data:`hw.boards.link_protocol.REPLY_BYTES`)."""

    def __init__(self):
        self.head, self.body, self.lost = None, bytearray(), 0

    def feed(self, b: int) -> tuple[int, bytes] | None:
        if self.head is None:
            if b not in lp.REPLY_BYTES:
                self.lost += 1
                return None
            self.head, self.body = b, bytearray()
        else:
            self.body.append(b)
        if len(self.body) == lp.REPLY_BYTES[self.head]:
            done = (self.head, bytes(self.body))
            self.head = None
            return done
        return None


# ------------------------------------------------------------------------------------------- the board
class BoardLink:
    """The testbench side of the simulated board (module docstring).

    Attributes
    ----------
    uart : bool
        Link bytes over the serial line (else the byte port); change it only while no byte moves.
    commands : list of Command
    frames : list of Frame
    framing_errors : int
        Bytes from the board's UART without a stop bit.
    """

    def __init__(self, dut, p: dict):
        self.dut, self.p = dut, p
        self.clock_ps = int(p["clock_ps"])
        #: the controller's clock (``dram_clk``) where it has its own (the DDR3 board), else the board's
        self.dram_clock_ps = int(p.get("dram_clock_ps") or self.clock_ps)
        self.bit_ps = int(p["divisor"]) * self.clock_ps
        self.uart = False
        self.to_board: deque[int] = deque()
        self.from_board = bytearray()
        self._to_board_ev, self._from_board_ev = Event(), Event()
        self.commands: list[Command] = []
        self.frames: list[Frame] = []
        self._cmd, self._frm = CommandParser(), FrameParser()
        self.framing_errors = 0
        self.bytes_to_board = self.bytes_from_board = 0
        self.now_ps = 0.0
        self.geom = p["geom"]

    # ---------------------------------------------------------------- start
    async def start(self) -> int:
        """Clock, reset, the link coroutines; returns the cycles from reset to the DRAM's ``init_done``."""
        dut = self.dut
        Clock(dut.clk, self.clock_ps, unit="ps").start()
        two = bool(self.p.get("dram_clock_ps"))
        if two:     # the controller's own clock, unrelated to the board's (the DDR3 board); reset together
            Clock(dut.dram_clk, self.dram_clock_ps, unit="ps").start()
            dut.dram_rst.value = 1
        dut.uart_rx.value = 1
        dut.uart_sel.value = 0
        dut.bp_rx__valid.value = 0
        dut.bp_tx__ready.value = 1
        dut.backdoor_load.value = 0
        dut.rst.value = 1
        await ClockCycles(dut.clk, 8)
        dut.rst.value = 0
        if two:
            dut.dram_rst.value = 0
        t0 = get_sim_time("ps")
        await with_timeout(RisingEdge(dut.init_done), int(self.p.get("init_cycles_max", 60000)) * self.dram_clock_ps,
                           "ps")
        assert not dut.init_error.value, "the DRAM's init_error after its power-up sequence"
        for coro in (self._sender(), self._bp_receiver(), self._uart_receiver()):
            cocotb.start_soon(coro)
        await FallingEdge(dut.clk)
        self.now_ps = get_sim_time("ps")
        return self.dram_cycles(self.now_ps - t0)

    def cycles(self, t_ps: float) -> int:
        """Board (``sync``) clock cycles in ``t_ps`` simulated ps."""
        return round(t_ps / self.clock_ps)

    def dram_cycles(self, t_ps: float) -> int:
        """Controller clock cycles in ``t_ps`` simulated ps."""
        return round(t_ps / self.dram_clock_ps)

    def set_uart(self, on: bool) -> None:
        assert not self.to_board, "switching the link while bytes are queued"
        self.uart = on
        self.dut.uart_sel.value = int(on)

    # ---------------------------------------------------------------- host -> board
    async def _sender(self) -> None:
        dut = self.dut
        while True:
            while not self.to_board:
                dut.bp_rx__valid.value = 0
                self._to_board_ev.clear()
                await self._to_board_ev.wait()
            await FallingEdge(dut.clk)
            if self.uart:
                while self.to_board:
                    await self._uart_send(self.to_board.popleft())
                continue
            while self.to_board:    # at a falling edge: bp_rx's ready is its FIFO's state until the next rising edge
                if dut.bp_rx__ready.value:
                    b = self.to_board.popleft()
                    dut.bp_rx__payload.value = b
                    dut.bp_rx__valid.value = 1
                    self._delivered(b)
                else:
                    dut.bp_rx__valid.value = 0
                await FallingEdge(dut.clk)

    async def _uart_send(self, b: int) -> None:
        """One 8N1 frame on ``uart_rx`` (LSB first), bit times of ``divisor`` cycles from a falling clock edge."""
        for bit in (0, *((b >> i) & 1 for i in range(8)), 1):
            self.dut.uart_rx.value = bit
            await Timer(self.bit_ps, "ps")
        self._delivered(b)

    def _delivered(self, b: int) -> None:
        self.bytes_to_board += 1
        done = self._cmd.feed(b)
        if done is not None:
            op, args, nbytes = done
            t = get_sim_time("ps")
            self.commands.append(Command(op, args, nbytes, t, monitor(self.dut) if op == lp.OP_TOKEN else None))

    # ---------------------------------------------------------------- board -> host
    async def _bp_receiver(self) -> None:
        dut = self.dut
        while True:
            if not dut.bp_tx__valid.value:
                await RisingEdge(dut.bp_tx__valid)
            await FallingEdge(dut.clk)
            while dut.bp_tx__valid.value:    # ready is held high: each falling edge with valid is one byte
                self._received(int(dut.bp_tx__payload.value))
                await FallingEdge(dut.clk)

    async def _uart_receiver(self) -> None:
        """8N1 from ``uart_tx``: the start bit's falling edge, then each bit sampled at its middle."""
        dut = self.dut
        while True:
            await FallingEdge(dut.uart_tx)
            await Timer(self.bit_ps // 2 + self.clock_ps // 4, "ps")
            if dut.uart_tx.value:
                self.framing_errors += 1     # a glitch, not a start bit
                continue
            b = 0
            for i in range(8):
                await Timer(self.bit_ps, "ps")
                b |= int(dut.uart_tx.value) << i
            await Timer(self.bit_ps, "ps")
            if not dut.uart_tx.value:
                self.framing_errors += 1
            self._received(b)

    def _received(self, b: int) -> None:
        self.bytes_from_board += 1
        self.from_board.append(b)
        self._from_board_ev.set()
        done = self._frm.feed(b)
        if done is not None:
            head, body = done
            mon = monitor(self.dut) if head == lp.REP_TOKEN else None
            self.frames.append(Frame(head, body, get_sim_time("ps"), mon))

    # ---------------------------------------------------------------- for SimSerial (run in the simulator)
    async def put(self, data: bytes) -> float:
        self.to_board.extend(data)
        self._to_board_ev.set()
        return self._sync()

    async def take(self, n: int, timeout_s: float) -> tuple[bytes, bool, float]:
        """Up to ``n`` received bytes, waiting for them at most ``timeout_s`` simulated seconds; returns
        ``(bytes, whether it had to wait, now)``."""
        waited = len(self.from_board) < n
        if waited and timeout_s > 0:
            deadline = get_sim_time("ps") + timeout_s * 1e12
            while len(self.from_board) < n:
                left = deadline - get_sim_time("ps")
                if left <= 0:
                    break
                self._from_board_ev.clear()
                await First(self._from_board_ev.wait(), Timer(max(self.clock_ps, round(left)), "ps"))
        got = bytes(self.from_board[:n])
        del self.from_board[:n]
        return got, waited, self._sync()

    async def flush(self) -> float:
        self.from_board.clear()
        return self._sync()

    async def wait_seconds(self, s: float) -> float:
        await Timer(max(self.clock_ps, round(s * 1e12 / self.clock_ps) * self.clock_ps), "ps")
        return self._sync()

    def _sync(self) -> float:
        self.now_ps = get_sim_time("ps")
        return self.now_ps

    # ---------------------------------------------------------------- sessions
    async def quiet(self, cycles: int | None = None) -> None:
        """Let the board run ``cycles`` (default: twice the link's byte time-out, after which a command a dropped
        host left open has been abandoned), then start the command log afresh (a new host session)."""
        await ClockCycles(self.dut.clk, cycles if cycles is not None else 2 * int(self.p["byte_timeout"]))
        await FallingEdge(self.dut.clk)
        self._cmd.reset()
        self._sync()

    # ---------------------------------------------------------------- back door
    async def backdoor_write(self, addr: int, data: bytes) -> None:
        """Put ``data`` at byte address ``addr`` into the DRAM model's bank arrays (``$readmemh``).

        ``addr`` and ``len(data)`` are multiples of the port word (``geom["word_bytes"]``: 2 on the ULX3S, 16 on the
        DDR3 board). The controller's address mapping is ``ROW_BANK_COL``: port word address = row, bank, column
        word (``colbits - col_align`` bits; a DDR3 word is a BL8 burst, 8 columns, ``col_align`` 3). The model's
        bank array holds ``(row << colbits | column) >> model_shift`` (``litedram.phy.model.BankModel``; at rate
        1:2 ``model_shift`` is 2, so that only every other array word is used)."""
        g = self.geom
        wb = int(g["word_bytes"])
        assert addr % wb == 0 and len(data) % wb == 0 and data, (addr, len(data), wb)
        words = np.frombuffer(data, dtype=np.uint8).reshape(-1, wb)
        a = np.arange(addr // wb, addr // wb + len(words), dtype=np.int64)
        cbits = g["colbits"] - g["col_align"]
        col = (a & ((1 << cbits) - 1)) << g["col_align"]
        bank = (a >> cbits) & ((1 << g["bankbits"]) - 1)
        row = a >> (cbits + g["bankbits"])
        index = ((row << g["colbits"]) | col) >> g["model_shift"]
        mask = 0
        for b, name in enumerate(self.p["backdoor_files"]):
            sel = bank == b
            if not sel.any():
                continue
            mask |= 1 << b
            Path(name).write_bytes(_readmemh_text(index[sel], words[sel]))
        await FallingEdge(self.dut.clk)
        self.dut.backdoor_load.value = mask
        await FallingEdge(self.dut.clk)
        self.dut.backdoor_load.value = 0
        await FallingEdge(self.dut.clk)
        self._sync()


_HEX2 = np.frombuffer("".join(f"{v:02x}" for v in range(256)).encode(), dtype=np.uint8).reshape(256, 2)


def _readmemh_text(index: np.ndarray, words: np.ndarray) -> bytes:
    """``$readmemh`` text: an ``@address`` line at each run of consecutive indices, then one word a line.

    ``words`` is ``uint8 [n, word bytes]``, each row a little-endian word (its first byte the lowest address)."""
    n, wb = words.shape
    text = np.empty((n, 2 * wb + 1), dtype=np.uint8)
    text[:, :-1] = _HEX2[words[:, ::-1]].reshape(n, 2 * wb)
    text[:, -1] = ord("\n")
    starts = np.flatnonzero(np.diff(index, prepend=-2) != 1)
    ends = [*starts[1:], len(index)]
    parts = []
    for s, e in zip(starts, ends, strict=True):
        parts.append(f"@{int(index[s]):x}\n".encode())
        parts.append(text[s:e].tobytes())
    return b"".join(parts)


# ------------------------------------------------------------------------------------------- the host's port
class LinkDropped(OSError):
    """The simulated serial port went away (a board unplugged mid-command)."""


@dataclass
class PortStats:
    bytes_out: int = 0
    bytes_in: int = 0
    writes: int = 0
    reads: int = 0
    #: reads that found fewer bytes than asked right after a write: the host waits for the board's reply (on a real
    #: link each costs a USB round trip: the FTDI latency timer)
    round_trips: int = 0


class SimSerial:
    """A pyserial-like port on the simulated board's link, for host code running in a :func:`host_call` thread.

    ``read(n)`` returns when ``n`` bytes have arrived or ``timeout`` simulated seconds have passed (fewer bytes
    then), ``write`` queues bytes for the board, ``reset_input_buffer`` drops what arrived, ``close`` closes.

    Parameters
    ----------
    link : BoardLink
    drop_at : int, optional
        A DRAM address: the first ``'L'`` command at or beyond it is cut in the middle of its data, after which
        the port raises :class:`LinkDropped` (an ``OSError``, as pyserial's ``SerialException``) on every call.
    """

    def __init__(self, link: BoardLink, *, drop_at: int | None = None):
        self.link = link
        self.timeout: float | None = 1.0
        self.is_open = True
        self.drop_at = drop_at
        self.dropped_at: int | None = None
        self.stats = PortStats()
        self._last = "read"
        self._put, self._take, self._flush = resume(link.put), resume(link.take), resume(link.flush)

    def _check(self) -> None:
        if not self.is_open:
            raise LinkDropped("simulated serial port: closed" if self.dropped_at is None else
                              f"simulated serial port: the link dropped in the 'L' at 0x{self.dropped_at:x}")

    def write(self, data: bytes) -> int:
        self._check()
        data = bytes(data)
        if (self.drop_at is not None and len(data) > 7 and data[0] == lp.OP_DRAM_WRITE
                and struct.unpack_from("<I", data, 1)[0] >= self.drop_at):
            self.dropped_at = struct.unpack_from("<I", data, 1)[0]
            self._put(data[:7 + (len(data) - 7) // 2])
            self.is_open = False
            self._check()
        self._put(data)
        self.stats.bytes_out += len(data)
        self.stats.writes += 1
        self._last = "write"
        return len(data)

    def read(self, size: int = 1) -> bytes:
        self._check()
        got, waited, _ = self._take(size, self.timeout or 0.0)
        self.stats.bytes_in += len(got)
        self.stats.reads += 1
        if waited and self._last == "write":
            self.stats.round_trips += 1
        self._last = "read"
        return got

    @property
    def in_waiting(self) -> int:
        return len(self.link.from_board)

    def reset_input_buffer(self) -> None:
        self._check()
        self._flush()

    def close(self) -> None:
        self.is_open = False


class SimClock:
    """The functions of ``time`` the driver calls, in the simulated board's time (:class:`BoardLink`'s clock):
    ``sleep`` lets the simulator run, the others read the simulated time (exact between two calls into the
    simulator, during which it does not advance)."""

    def __init__(self, link: BoardLink):
        self.link = link
        self._wait = resume(link.wait_seconds)

    def monotonic(self) -> float:
        return self.link.now_ps / 1e12

    time = perf_counter = monotonic

    def monotonic_ns(self) -> int:
        return int(self.link.now_ps // 1000)

    perf_counter_ns = time_ns = monotonic_ns

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._wait(seconds)


@contextlib.contextmanager
def _driver_clock(link: BoardLink):
    import host.devices.driver as driver_module
    import host.devices.ecp5 as ecp5_module

    clock = SimClock(link)
    saved = [(m, m.time) for m in (ecp5_module, driver_module)]
    try:
        for m, _ in saved:
            m.time = clock
        yield clock
    finally:
        for m, t in saved:
            m.time = t


async def host_call(link: BoardLink, fn: Callable, *args, **kwargs):
    """Run the blocking ``fn(*args, **kwargs)`` (host code) in a bridge thread with the driver on the simulated
    clock; returns its result, raises what it raised."""
    link._sync()
    with _driver_clock(link):
        return await bridge(fn)(*args, **kwargs)


# ------------------------------------------------------------------------------------------- models
def bundle_of(shape: tuple, path: Path, seed: int = 0):
    """A tiny random model (``accelerator_tests.tiny_model``: ``(hidden, intermediate, layers, vocab)``) compiled
    for the board (base-3, one channel) as a bundle file; returns the read bundle."""
    m = tiny_model(*shape, packing=TritPacking.BASE3, seed=seed)
    write_bundle(path, m.image, config=m.weights.config, embeddings=m.weights.embeddings,
                 compile_options={"packing": "base3", "channels": 1})
    return read_bundle(path)


def golden_for(bundle) -> GoldenDevice:
    dev = GoldenDevice(packing="base3", channels=1)
    dev.load_image(bundle)
    return dev


def ecp5_device(port: SimSerial, **kw):
    """The driver's device on a simulated port (timeouts in simulated seconds: ``SimClock``)."""
    from host.devices.ecp5 import Ecp5Device

    return Ecp5Device(serial=port, timeout=kw.pop("timeout", 2.0), progress=False, **kw)


def check_tokens(dev, gold: GoldenDevice, tokens: list[int], modes: list[str], label: str) -> list[dict]:
    """Run ``tokens`` on the board (``modes``: ``"logits"`` through ``step``, ``"argmax"`` through
    ``step_argmax``) and on the golden device; each bit-exact (logits: every float32; argmax: the golden output
    packet's ``argmax``, the core's first index of the largest accumulator). Returns a record per token."""
    out = []
    for t, mode in zip(tokens, modes, strict=True):
        pos = dev.position
        assert gold.position == pos, f"{label}: positions differ ({pos} board, {gold.position} golden)"
        if mode == "logits":
            got = dev.step(t)
            want = gold.step(t)
            assert got.dtype == want.dtype and np.array_equal(got, want), (
                f"{label}: token {t} at {pos}: logits differ in {int(np.sum(got != want))} of {len(want)}")
            arg = int(parse_output_packet(gold.last.output).argmax)
        else:
            got = dev.step_argmax(t)
            gold.step(t)
            arg = int(parse_output_packet(gold.last.output).argmax)
            assert got == arg, f"{label}: token {t} at {pos}: argmax {got}, the golden device's {arg}"
        out.append({"token": int(t), "position": pos, "mode": mode, "argmax": arg})
    return out


def load_and_check(link, bundle, tokens: list[int], label: str) -> dict:
    """On a fresh driver: load ``bundle`` whole (every block written: nothing of it on the board yet), then
    ``tokens`` alternately with logits and argmax-only, bit-exact (:func:`check_tokens`). Returns the load's
    report, the token records and the board registers afterwards."""
    dev = ecp5_device(SimSerial(link))
    dev.load_image(bundle)
    rep = dev.last_load
    assert not rep.skipped and rep.blocks_written == rep.blocks_total, f"{label}: load {rep}"
    modes = ["logits", "argmax"] * len(tokens)
    recs = check_tokens(dev, golden_for(bundle), tokens, modes[:len(tokens)], label)
    regs = dev.transport.read_board()
    dev.close()
    return {"load": asdict(rep), "tokens": recs, "board": {r.name: int(v) for r, v in regs.items()}}


def l_commands(commands: list[Command]) -> list[tuple[int, int]]:
    """``(address, bytes)`` of each ``'L'`` in a command log."""
    return [(struct.unpack_from("<I", c.args)[0], c.data_bytes) for c in commands if c.op == lp.OP_DRAM_WRITE]


class Result:
    """The cocotb test's results JSON (``MMFREE_BOARD_RESULT``): written at the end, ``passed`` only when the
    test got there."""

    def __init__(self):
        self.data: dict = {"passed": False}

    def write(self, passed: bool) -> None:
        self.data["passed"] = passed
        Path(os.environ["MMFREE_BOARD_RESULT"]).write_text(json.dumps(self.data, indent=1, default=_json) + "\n")


def _json(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    raise TypeError(f"not JSON: {o!r}")


@contextlib.contextmanager
def recording():
    res = Result()
    try:
        yield res.data
    except BaseException:
        res.write(False)
        raise
    res.write(True)


# ------------------------------------------------------------------------------------------- cases
def refused_token(port: SimSerial) -> dict:
    """A token before any image, through the driver's transport: ``TokenStatus.NO_IMAGE`` and the driver's
    DeviceError naming it; nothing from the core."""
    from host.devices.ecp5 import Ecp5Transport

    tr = Ecp5Transport("sim", 2_000_000, 2.0, port, progress=False)
    tr.connect(None)
    assert tr.mode == "dram", f"the driver took the board for a {tr.mode!r} board"
    regs = tr.read_board()
    assert not regs[BoardReg.STATUS] & BoardStatus.IMAGE_VALID, "IMAGE_VALID set before any load"
    status = tr.link.token(3, 0, logits=False)
    assert status == TokenStatus.NO_IMAGE, f"token before any image: status {status!r}, expected NO_IMAGE"
    try:
        tr.run_token(3, 0, False, None, lambda: None)
    except DeviceError as exc:
        message = str(exc)
    else:
        raise AssertionError("the driver ran a token on a board without an image")
    assert "no verified image" in message, message
    assert not tr.link.output, f"output frames after a refused token: {list(tr.link.output)}"
    tokens = tr.read_board()[BoardReg.TOKENS]
    assert tokens == regs[BoardReg.TOKENS] + 2, f"TOKENS {tokens}, two refused tokens after {regs[BoardReg.TOKENS]}"
    board = {r.name: int(v) for r, v in tr.read_board().items()}
    tr.close()
    return {"status": int(status), "error": message, "board": board}


async def open_port(link: BoardLink, *, level: bool = False) -> dict | None:
    """A board that holds its DRAM port until the host enables it (``hold_port``: the DDR3 board, link version 3):
    the port held after power-up (``BoardStatus.PORT_HELD``, a token refused with ``TokenStatus.NOT_READY``), then
    the port enabled as the driver's leveling ends, by ``BoardReg.PORT_ENABLE`` = 1 (``BoardStatus.PORT_ENABLED``).
    With ``level`` the driver's read leveling runs first (:meth:`host.devices.ecp5.Ecp5Device.level`: the
    controller's CSRs read and written over ``'K'``/``'J'`` through the board's control-bus crossing, which enables
    the port itself); it raises what the procedure raises. Returns what happened (None on a board that does not
    hold its port: nothing to do)."""
    p = link.p
    if not p.get("hold_port"):
        return None
    from host.leveling import load_csr_map

    csr = load_csr_map(p["csr_json"])

    def host():
        dev = ecp5_device(SimSerial(link))
        dev.connect()
        tr = dev.transport
        held = tr.read_board()[BoardReg.STATUS]
        assert held & BoardStatus.PORT_HELD and not held & BoardStatus.PORT_ENABLED, f"STATUS 0x{held:x} at power-up"
        status = tr.link.token(3, 0, logits=False)
        assert status == TokenStatus.NOT_READY, f"a token on the held port: status {status!r}, expected NOT_READY"
        out = {"status_held": int(held), "token_held": int(status), "leveled": level}
        if level:
            result = dev.level(csr)
            out["lanes"] = [{"module": ln.module, "bitslip": ln.bitslip, "delay": ln.delay, "window": list(ln.window),
                             "scans": {str(b): list(e) for b, e in ln.scans.items()}} for ln in result.lanes]
            out["delays"] = int(result.params.delays)
            out["report"] = result.format()
            out.update({k: int(v) for k, v in tr.stats.items() if k.startswith("ctrl_")})
        else:
            tr.link.board_write(BoardReg.PORT_ENABLE, 1)
        after = tr.read_board()[BoardReg.STATUS]
        assert after & BoardStatus.PORT_ENABLED, f"STATUS 0x{after:x} after the port enable"
        out["status_enabled"] = int(after)
        dev.close()
        return out

    t0 = get_sim_time("ps")
    out = await host_call(link, host)
    out["cycles"] = link.cycles(get_sim_time("ps") - t0)
    await link.quiet(1000)
    return out


@cocotb.test()
async def read_leveling(dut):
    """The driver's read leveling (``host.leveling`` over ``'K'``/``'J'`` through the board's control-bus crossing)
    against the simulation core, then the tiny model loaded through ``'L'`` and tokens bit-exact. The model has no
    delay lines or bitslip (``hw.dram._sim_phy_with_csrs``: its data arrive at a fixed latency), so every tap of
    every bitslip should read the test bursts back whole and the procedure pick bitslip 0 and the window's centre;
    the port ends enabled, and the load rewrites the block the test bursts overwrote (``IMAGE_VALID`` cleared). When
    the procedure raises, one test burst is written and read back by the procedure's own steps and both phases'
    read registers recorded (``burst``), before the error is raised again."""
    from host import leveling as lvl
    from host.leveling import ECPIX5_PARAMS, CSRBus, LevelingError, load_csr_map

    p = params()
    link = BoardLink(dut, p)
    with recording() as res:
        res["init_cycles"] = await link.start()
        try:
            res["port_open"] = await open_port(link, level=True)
        except LevelingError as exc:
            res["leveling_error"] = str(exc)[:400]
            # one test burst as the procedure writes and reads it (its own steps, host.leveling._Leveler), to show
            # what the DFI injector's read registers hold per phase (the port is held again)
            csr = load_csr_map(p["csr_json"])

            def burst():
                from host.devices.ecp5 import ControlBus

                dev = ecp5_device(SimSerial(link))
                dev.connect()
                with ControlBus(dev.transport.link) as bus:
                    regs = CSRBus(csr, bus.read_word, bus.write_word)
                    lv = lvl._Leveler(regs, ECPIX5_PARAMS, None, 0, (1,))
                    data = lvl._pattern(1, ECPIX5_PARAMS)
                    cs, we = lvl.DFII_COMMAND_CS, lvl.DFII_COMMAND_WE
                    cas, ras = lvl.DFII_COMMAND_CAS, lvl.DFII_COMMAND_RAS
                    regs.write("sdram_dfii_control", lvl.DFII_CONTROL_SOFTWARE)
                    lv.command(0, ras | cs)                                     # activate bank 0 row 0
                    for ph, v in enumerate(data):
                        regs.write(f"sdram_dfii_pi{ph}_wrdata", v)
                    lv.command(ECPIX5_PARAMS.wrphase, cas | we | cs | lvl.DFII_COMMAND_WRDATA)
                    lv.command(ECPIX5_PARAMS.rdphase, cas | cs | lvl.DFII_COMMAND_RDDATA)
                    lv.command(0, ras | we | cs)                                # precharge bank 0
                    got = [regs.read(f"sdram_dfii_pi{ph}_rddata") for ph in range(ECPIX5_PARAMS.nphases)]
                    regs.write("sdram_dfii_control", lvl.DFII_CONTROL_SEL)
                dev.close()
                return {"wrote": [f"0x{v:016x}" for v in data], "read": [f"0x{v:016x}" for v in got]}

            res["burst"] = await host_call(link, burst)
            raise
        for line in res["port_open"]["report"].splitlines():
            log.info(line)
        # the leveled port in use: the tiny model through 'L' (the block the bursts overwrote rewritten), tokens
        bundle = bundle_of(tuple(p["tiny_shape"]), Path("tiny.mmf"))

        res.update(await host_call(link, load_and_check, link, bundle, [3, 17], "after leveling"))


@cocotb.test()
async def uart_path(dut):
    """Through the real serial line (the board's UART at the simulation's divisor): a token before any image,
    the tiny model loaded through ``'L'`` by the driver, a token with logits and one argmax-only, bit-exact."""
    p = params()
    link = BoardLink(dut, p)
    with recording() as res:
        res["init_cycles"] = await link.start()
        res["port_open"] = await open_port(link)
        link.set_uart(True)
        t0 = time.perf_counter()
        res["refused"] = await host_call(link, refused_token, SimSerial(link))
        bundle = bundle_of(tuple(p["uart_shape"]), Path("uart.mmf"))

        res.update(await host_call(link, load_and_check, link, bundle, [1, 5], "uart"))
        assert res["board"]["LINK_FRAMING"] == 0, "the board's UART saw bytes without a stop bit"
        assert link.framing_errors == 0 and link._frm.lost == 0, "the testbench's UART lost framing"
        res["bytes_to_board"], res["bytes_from_board"] = link.bytes_to_board, link.bytes_from_board
        res["sim_cycles"], res["wall_s"] = link.cycles(get_sim_time("ps")), round(time.perf_counter() - t0, 1)


@cocotb.test()
async def tiny_model_load_once(dut):
    """Byte port: the tiny model loaded once by the driver (every block written, the CRC compared), tokens in both
    modes bit-exact; a second connect finds the bundle and writes nothing; the back door agrees with ``'C'``."""
    p = params()
    link = BoardLink(dut, p)
    with recording() as res:
        res["init_cycles"] = await link.start()
        res["port_open"] = await open_port(link)
        bundle = bundle_of(tuple(p["tiny_shape"]), Path("tiny.mmf"))
        tokens = [3, 0, 17, 60, 9, 9]
        modes = ["logits", "logits", "argmax", "argmax", "logits", "argmax"]

        def first():
            dev = ecp5_device(SimSerial(link))
            dev.load_image(bundle)
            rep = dev.last_load
            assert not rep.skipped and rep.blocks_written == rep.blocks_total, f"first load: {rep}"
            recs = check_tokens(dev, golden_for(bundle), tokens, modes, "first session")
            dev.close()
            return {"load": asdict(rep), "tokens": recs}

        res["first"] = await host_call(link, first)
        first_l = l_commands(link.commands)
        assert sum(n for _, n in first_l) == res["first"]["load"]["bytes_written"], "'L' bytes != bytes written"
        await link.quiet(1000)
        link.commands.clear()

        def second():
            dev = ecp5_device(SimSerial(link))
            dev.load_image(bundle)
            rep = dev.last_load
            assert rep.skipped and rep.blocks_written == 0, f"second connect: {rep}"
            recs = check_tokens(dev, golden_for(bundle), tokens[:3], modes[:3], "second session")
            return dev, {"load": asdict(rep), "tokens": recs}

        dev, res["second"] = await host_call(link, second)
        assert not l_commands(link.commands), f"the second session wrote DRAM: {l_commands(link.commands)}"

        # the controller's control bus over the link (link version 3): the power-up flag, and a write read back
        csr = p["csr"]

        def control_bus():
            assert dev.link_version >= 3, f"link version {dev.link_version}"
            done = dev.ctrl_read(csr["ddrctrl_init_done"])
            dev.ctrl_write(csr["sdram_dfii_pi0_address"], 0x1A5C)
            return {"init_done": done, "written": 0x1A5C, "read_back": dev.ctrl_read(csr["sdram_dfii_pi0_address"])}

        res["csr"] = await host_call(link, control_bus)
        assert res["csr"]["read_back"] == 0x1A5C and res["csr"]["init_done"] == 1, res["csr"]

        # the back door against the board's own CRC: a span across a row boundary (every bank), then one word
        # (``backdoor_check``: the ULX3S 4 KiB and 2 bytes, the DDR3 board 32 KiB and 16 bytes)
        chk, wb = p["backdoor_check"], int(p["geom"]["word_bytes"])
        rng = np.random.default_rng(5)
        addr, span, patch = int(chk["addr"]), int(chk["bytes"]), int(chk["patch"])
        blob = rng.bytes(span)
        await link.backdoor_write(addr, blob)
        word = rng.bytes(wb)
        await link.backdoor_write(addr + patch, word)
        want = bytearray(blob)
        want[patch:patch + wb] = word
        got = await host_call(link, dev.transport.link.dram_crc, addr, span)
        assert got == zlib.crc32(want), "the back door's words are not where the controller reads them"
        await host_call(link, dev.close)
        res["backdoor"] = {"addr": addr, "bytes": span, "crc": got}


@cocotb.test()
async def faults(dut):
    """Byte port: a token before any image; a link dropped in the middle of a load, then a restart that rewrites
    only the blocks not written; a corrupted image word (back door) caught by the core's weight CRC
    (``CoreError``), then a reload that rewrites its block and the next tokens right."""
    from host.devices.ecp5 import DRAM_BLOCK_BYTES, dram_contents

    p = params()
    link = BoardLink(dut, p)
    with recording() as res:
        res["init_cycles"] = await link.start()
        res["port_open"] = await open_port(link)
        res["refused"] = await host_call(link, refused_token, SimSerial(link))
        bundle = bundle_of(tuple(p["faults_shape"]), Path("faults.mmf"), seed=3)
        layout, _ = dram_contents(bundle.image, bundle.embeddings)
        blocks = -(-layout.total_bytes // DRAM_BLOCK_BYTES)
        assert blocks >= 3, f"the faults model spans {blocks} DRAM blocks: the drop test needs 3 or more"

        # -- a link dropped mid-load
        drop_block = 2
        port = SimSerial(link, drop_at=drop_block * DRAM_BLOCK_BYTES + 3 * lp.CHUNK_BEATS * lp.BEAT_BYTES)

        def dropped():
            dev = ecp5_device(port)
            try:
                dev.load_image(bundle)
            except DeviceError as exc:
                return str(exc)
            raise AssertionError("the load went through a dropped link")

        res["drop_error"] = await host_call(link, dropped)
        assert "serial port failed" in res["drop_error"], res["drop_error"]
        assert port.dropped_at is not None
        before = l_commands(link.commands)
        await link.quiet()      # the user reconnects after more than the board's byte time-out
        link.commands.clear()

        def restart():
            dev = ecp5_device(SimSerial(link))
            dev.load_image(bundle)
            rep = dev.last_load
            regs = dev.transport.read_board()
            recs = check_tokens(dev, golden_for(bundle), [5, 1000], ["logits", "argmax"], "after the restart")
            return dev, {"load": asdict(rep), "tokens": recs, "board": {r.name: int(v) for r, v in regs.items()}}

        dev, res["restart"] = await host_call(link, restart)
        rep, after = res["restart"]["load"], l_commands(link.commands)
        assert not rep["skipped"] and rep["blocks_total"] == blocks
        assert rep["blocks_written"] == blocks - drop_block, (
            f"the restart wrote {rep['blocks_written']} of {blocks} blocks; only the {blocks - drop_block} from the "
            f"dropped one on were missing")
        assert min(a for a, _ in after) == drop_block * DRAM_BLOCK_BYTES, f"restart 'L' from 0x{min(after)[0]:x}"
        assert res["restart"]["board"]["LINK_TIMEOUTS"] == 1, "the board did not abandon the cut 'L' (LINK_TIMEOUTS)"
        res["drop"] = {"blocks": blocks, "dropped_in_block": drop_block, "l_before": len(before),
                       "l_restart": len(after), "bytes_restart": sum(n for _, n in after)}

        # -- a corrupted image word: one bit of a weight byte (still a valid base-3 byte), by the back door
        img = parse_image(bundle.image)
        gemv = next(i for i in img.instructions if i.opcode is Opcode.GEMV)
        off = gemv.weight_offset + 3
        while bundle.image[off] >= 242:
            off += 1
        bad = bytearray(bundle.image)
        bad[off] ^= 0x01
        wb = int(p["geom"]["word_bytes"])       # the back door writes whole port words: the word around the byte
        word = (layout.image_base + off) // wb * wb
        _, bad_data = dram_contents(bytes(bad), bundle.embeddings)
        await link.backdoor_write(word, bytes(bad_data[word:word + wb]))
        build = BuildParams(**p["build"])
        gold = golden_for(bundle)
        cause, where = golden_cause(bytes(bad), gold.token_packet(7, 0), gold.machine.init_state(), build)
        assert cause is ErrorCause.WEIGHT_CRC, f"the golden device calls the corruption {cause!r}"
        link.commands.clear()

        def corrupted():
            try:
                dev.step(7)
            except CoreError as exc:
                err = exc
            else:
                raise AssertionError("a token over a corrupted image ran")
            dev.load_image(bundle)              # the reload finds the block that differs
            rep = dev.last_load
            g = golden_for(bundle)
            recs = check_tokens(dev, g, [7, 8], ["logits", "argmax"], "after the reload")
            dev.close()
            return {"error": str(err), "cause": err.cause.name, "where": err.where, "load": asdict(rep),
                    "tokens": recs}

        res["corrupt"] = await host_call(link, corrupted)
        assert res["corrupt"]["cause"] == cause.name and res["corrupt"]["where"] == where, res["corrupt"]
        rep = res["corrupt"]["load"]
        assert not rep["skipped"] and rep["blocks_written"] == 1, f"the reload after the corruption: {rep}"
        assert [a for a, _ in l_commands(link.commands)][0] == word // DRAM_BLOCK_BYTES * \
            DRAM_BLOCK_BYTES


# ------------------------------------------------------------------------------------------- the shipped model
@dataclass
class TokenTiming:
    """One token on the board, from the link logs (cycles of the simulated clock)."""

    mode: str
    token: int
    position: int
    cycles_to_status: int       #: 'T' received -> its 't' sent (the core has finished the token: its irq)
    cycles_to_output: int       #: 'T' received -> the last output frame sent
    dram_cycles_to_status: int  #: 'T' received -> its 't' sent, in controller cycles (the board's own on the ULX3S)
    dram_cycles_to_output: int  #: 'T' received -> the last output frame sent, in controller cycles
    dfi: dict = field(default_factory=dict)     #: DFI commands between 'T' and 't'
    bytes_out: int = 0
    bytes_in: int = 0
    round_trips: int = 0
    hw_cycles: int = 0          #: the core's CYCLES counter
    sim_wall_s: float = 0.0     #: wall time of the token in the simulation (the golden device's included)


def token_timings(link: BoardLink, since_cmd: int, since_frame: int) -> list[tuple]:
    """Pair each ``'T'`` of the log with its ``'t'`` and its output's last frame: the frames between this ``'T'``
    and the next (the host sends the next only once it has read this token's output). The board sends the ``'t'``
    once the core is done (``irq``), so a logits packet's frames come before it and an argmax summary's before or
    after it."""
    cmds = [c for c in link.commands[since_cmd:] if c.op == lp.OP_TOKEN]
    frames = link.frames[since_frame:]
    out = []
    for i, c in enumerate(cmds):
        end = cmds[i + 1].t_ps if i + 1 < len(cmds) else float("inf")
        mine = [f for f in frames if c.t_ps < f.t_ps < end]
        status = [f for f in mine if f.head == lp.REP_TOKEN]
        last = [f for f in mine if f.head == lp.REP_OUTPUT and f.body[4] & 1]
        assert len(status) == 1 and last, f"'T' {i}: {len(status)} 't' and {len(last)} last output frames"
        out.append((c, status[0], last[-1]))
    return out


@cocotb.test()
async def shipped_model(dut):
    """The shipped model in DRAM by the back door (the driver's layout, ``host.devices.ecp5.dram_contents``) and
    the board registers written as the driver's load writes them; the driver then connects, finds the bundle
    (``IMAGE_VALID``, its checksum, the board's CRC of the region) and skips the load; tokens with logits and
    greedy argmax-only tokens bit-exact with the golden device; refresh counted during them."""
    from host.devices.ecp5 import UartLink, dram_contents

    p = params()
    link = BoardLink(dut, p)
    with recording() as res:
        res["init_cycles"] = await link.start()
        res["port_open"] = await open_port(link)
        bundle = read_bundle(p["shipped_bundle"])
        layout, data = dram_contents(bundle.image, bundle.embeddings)
        t0 = time.perf_counter()
        await link.backdoor_write(0, data)
        res["backdoor"] = {"bytes": len(data), "wall_s": round(time.perf_counter() - t0, 1)}

        def registers():
            ul = UartLink(SimSerial(link), timeout=2.0)
            ul.board_write(BoardReg.STATUS, 0)
            for reg, value in layout.registers().items():
                ul.board_write(reg, value)
            ul.board_write(BoardReg.STATUS, int(BoardStatus.IMAGE_VALID))
            ul.close()

        await host_call(link, registers)
        gold = golden_for(bundle)
        n_logits, n_greedy = int(p["shipped_logits_tokens"]), int(p["shipped_greedy_tokens"])

        def host():
            port = SimSerial(link)
            dev = ecp5_device(port)
            w0 = time.perf_counter()
            dev.load_image(bundle)
            rep = dev.last_load
            assert rep.skipped and rep.blocks_written == 0, f"the driver did not skip the back-door image: {rep}"
            load_wall = time.perf_counter() - w0
            ids = bundle.tokenizer.encode("def parse(").ids[:n_logits] if bundle.tokenizer else [1] * n_logits
            recs, stats, hw = [], [], []
            dev.counters()
            tok = ids[0]
            plan = [(t, "logits") for t in ids] + [(None, "argmax")] * n_greedy
            for t, mode in plan:
                tok = tok if t is None else t
                c0 = dev.counters()["hw_cycles"]
                s0 = asdict(port.stats)
                w = time.perf_counter()
                r = check_tokens(dev, gold, [tok], [mode], "shipped model")[0]
                r["wall_s"] = round(time.perf_counter() - w, 2)
                s1 = asdict(port.stats)
                stats.append({k: s1[k] - s0[k] for k in s1})
                hw.append(dev.counters()["hw_cycles"] - c0)
                recs.append(r)
                tok = r["argmax"]       # greedy: the next token is this one's argmax
            counters = dev.counters()
            dev.close()
            return {"load": asdict(rep), "load_wall_s": round(load_wall, 1), "tokens": recs, "port": stats,
                    "hw_cycles": hw, "counters": {k: int(v) for k, v in counters.items()}}

        n_cmd, n_frame, m0 = len(link.commands), len(link.frames), monitor(dut)
        t1 = time.perf_counter()
        out = await host_call(link, host)
        res["host_wall_s"] = round(time.perf_counter() - t1, 1)
        m1 = monitor(dut)
        timings = []
        for rec, st, hwc, (cmd, status, last) in zip(out["tokens"], out["port"], out["hw_cycles"],
                                                     token_timings(link, n_cmd, n_frame), strict=True):
            assert status.body[0] == 0, f"token {rec}: status 0x{status.body[0]:02x}"
            timings.append(TokenTiming(
                rec["mode"], rec["token"], rec["position"], link.cycles(status.t_ps - cmd.t_ps),
                link.cycles(last.t_ps - cmd.t_ps), link.dram_cycles(status.t_ps - cmd.t_ps),
                link.dram_cycles(last.t_ps - cmd.t_ps), {k: status.monitor[k] - cmd.monitor[k] for k in COUNTS},
                st["bytes_out"], st["bytes_in"], st["round_trips"], hwc, rec["wall_s"]))
        res.update(out)
        res["timings"] = timings
        res["dfi_total"] = {k: m1[k] - m0[k] for k in COUNTS}
        res["ref_max_gap"] = m1["ref_max_gap"]
        res["layout"] = asdict(layout)
        refs = sum(t.dfi["ref_count"] for t in timings)
        assert refs > 0, "no refresh command during the tokens"
