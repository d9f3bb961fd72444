"""DRAMBoard (hw/boards/dram_board.py) in the Amaranth simulator, driven with link bytes below the UART
(hw.boards.link_protocol frames), its native port answered by tests/hw/test_dram_reader.py's behavioural
LiteDRAM port model: the board registers, 'L' and 'C' against zlib.crc32, alignment and readiness checks,
an 'L' abandoned mid-load, 'X' with DRAM reads in flight, refused tokens, and tokens of a tiny random model
run from DRAM bit-exact with the golden device (the whole output packet, or the argmax summary), a corrupted
image word (the weight CRC) and the next token after CTRL.clear. The control bus ('K'/'J', link version 3)
is answered by a behavioural Wishbone subordinate (:class:`WishboneModel`): accesses, the power-up
sequencer's ownership, a missing ack, bad addresses, and the port enable of a board built with
``hold_port``. A build with ``state_in_dram`` (the state engine): a stand-in core whose state ports a
testbench drives (:class:`StateDriver`) writes rows back and fills them beside a token's image, 'L' and 'C';
the rows land at StateGeometry's addresses; a lost state read and a stalled write-back end the token with
READ_TIMEOUT until 'X'; and the real core runs tokens bit-exact with its state in the board's DRAM.

The tests that touch the DRAM run with the ULX3S's 16-bit port and the ECPIX-5 DDR3's 128-bit one (two 64-bit
beats a word) over the same 32 KiB of bytes: the same bytes must land at the same byte addresses, and loads,
CRCs, images and embedding rows that start or end in the middle of a 16-byte word must read and write only
their own bytes.
"""

from __future__ import annotations

import gc
import struct
import warnings
import zlib
from collections import deque
from functools import cache

import numpy as np
import pytest
from amaranth.hdl import Module, Mux, Signal, UnusedElaboratable
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped
from amaranth.sim import Simulator

from host.bundle import embeddings_fixed
from host.compiler import CompileOptions, calibrate, compile_model
from host.devices.golden import GoldenMachine
from host.image import ImageError, parse_image
from host.model import HGRNBitConfig, random_weights
from host.protocol import make_token_packet, parse_output_packet
from hw import isa
from hw.boards import link_protocol as lp
from hw.boards.dram_board import DRAMBoard
from hw.dram import NativePortSignature
from hw.dram_init import DRAMControl, WishboneSignature
from hw.params import BuildParams
from hw.regs import RegisterBlock
from hw.state_cache import StateCmd, StateGeometry, state_beats
from hw.streams import AXIStreamSignature
from tests.hw.test_dram_reader import PORT_WIDTHS, NativePortModel, addr_width_for
from tests.hw.uart_sim import ID_VALUES, LoopbackCore

pytestmark = pytest.mark.filterwarnings("error")

ADDR_WIDTH = 14            # 16 K words of 16 bits: 32 KiB of DRAM (2 K words of 128 bits)
DRAM_BYTES = 2 << ADDR_WIDTH
CLOCK_HZ = 50_000_000
BYTE_TIMEOUT = 400
TINY = HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28)
BUILD = BuildParams(lanes=8, channels=1, bus_bits=64, quant_lanes=4, packing=isa.TritPacking.BASE3,
                    max_hidden=32, max_intermediate=32, max_layers=2, epilogue_folded=True)
IMAGE_BASE, EMBED_BASE = 0x0000, 0x6000
R = isa.REGISTER_MAP


# ---------------------------------------------------------------------------------------------- host side

def cmd_get(reg):
    return struct.pack("<BB", lp.OP_BOARD_READ, reg)


def cmd_put(reg, value):
    return struct.pack("<BBI", lp.OP_BOARD_WRITE, reg, value)


def cmd_load(addr, payload):
    assert len(payload) % 8 == 0 and payload
    return struct.pack("<BIH", lp.OP_DRAM_WRITE, addr, len(payload) // 8 - 1) + payload


def cmd_crc(addr, n):
    return struct.pack("<BII", lp.OP_DRAM_CRC, addr, n)


def cmd_token(token, position, flags=0):
    return struct.pack("<BIIB", lp.OP_TOKEN, token, position, flags)


def cmd_ctrl_read(addr):
    return struct.pack("<BI", lp.OP_CTRL_READ, addr)


def cmd_ctrl_write(addr, value):
    return struct.pack("<BII", lp.OP_CTRL_WRITE, addr, value)


class WishboneModel:
    """A Wishbone B4 classic subordinate on the board's ``ctrl`` (word addresses): ``regs`` (word address ->
    value; others read 0) answered after a random latency of ``latency`` cycles, or never while ``respond`` is
    false. ``transfers`` lists the completed ones as (we, word address, data); ``abandoned`` counts requests
    withdrawn (``cyc`` low) before their ``ack``; ``max_wait`` is the longest ``cyc`` without ``ack``."""

    def __init__(self, bus, rng, *, latency=(0, 4)):
        self.bus, self.rng, self.latency = bus, rng, latency
        self.regs: dict[int, int] = {}
        self.respond = True
        self.transfers: list[tuple[int, int, int]] = []
        self.abandoned = 0
        self.max_wait = 0

    async def process(self, ctx):
        bus = self.bus
        acking, waited, due = False, 0, None
        while True:
            _, _, cyc, stb, we, adr, dat_w = await ctx.tick().sample(bus.cyc, bus.stb, bus.we, bus.adr, bus.dat_w)
            if cyc and stb and acking:           # the transfer completed at this edge
                self.transfers.append((int(we), int(adr), int(dat_w)))
                if we:
                    self.regs[int(adr)] = int(dat_w)
                acking, waited, due = False, 0, None
            elif cyc and stb:
                waited += 1
                self.max_wait = max(self.max_wait, waited)
                if due is None:
                    due = int(self.rng.integers(*self.latency, endpoint=True))
                if self.respond and waited > due:
                    acking = True
            else:
                if waited:
                    self.abandoned += 1
                acking, waited, due = False, 0, None
            ctx.set(bus.ack, acking)
            ctx.set(bus.dat_r, self.regs.get(int(adr), 0) if acking else 0xDEADBEEF)


class Bench:
    """A :class:`DRAMBoard` with link bytes in and out and a native-port model over ``mem`` (uint16 words).

    Scripts are async functions of ``(ctx, bench)``; :meth:`command` sends a command's bytes and returns its
    reply frame's body; ``'o'`` frames collect into :attr:`packets` (bytes per packet, by ``tlast``)."""

    def __init__(self, dut: DRAMBoard, mem: np.ndarray, *, seed: int = 0, cmd_stall: float = 0.0,
                 dram_ready: bool = True, dram_error: bool = False):
        self.dut, self.mem = dut, mem
        self.model = NativePortModel(dut.port, mem, np.random.default_rng(seed), cmd_stall=cmd_stall)
        self.wb = WishboneModel(dut.ctrl, np.random.default_rng(seed + 1))
        self.dram_error = dram_error
        self.replies: deque[tuple[int, bytes]] = deque()
        self.packets: list[bytes] = []
        self.words: list[int] = []
        self.cycle = 0
        self.dram_ready = dram_ready

    async def _collect(self, ctx):
        ctx.set(self.dut.tx.ready, 1)
        ctx.set(self.dut.dram_ready, self.dram_ready)
        ctx.set(self.dut.dram_error, self.dram_error)
        buf = bytearray()
        while True:
            _, _, valid, byte = await ctx.tick().sample(self.dut.tx.valid, self.dut.tx.payload)
            self.cycle += 1
            if not valid:
                continue
            buf.append(byte)
            head = buf[0]
            assert head in lp.REPLY_BYTES, f"unknown frame {chr(head)!r}"
            if len(buf) < 1 + lp.REPLY_BYTES[head]:
                continue
            body = bytes(buf[1:])
            buf.clear()
            if head == lp.REP_OUTPUT:
                word, flags = struct.unpack("<IB", body)
                self.words.append(word)
                if flags & 1:
                    self.packets.append(b"".join(w.to_bytes(4, "little") for w in self.words))
                    self.words = []
            else:
                self.replies.append((head, body))

    async def send(self, ctx, data: bytes, *, idle: int = 0):
        for b in data:
            ctx.set(self.dut.rx.payload, b)
            ctx.set(self.dut.rx.valid, 1)
            await ctx.tick().until(self.dut.rx.ready)
            if idle:
                ctx.set(self.dut.rx.valid, 0)
                for _ in range(idle):
                    await ctx.tick()
        ctx.set(self.dut.rx.valid, 0)

    async def reply(self, ctx, rep: int, *, max_cycles: int = 20_000) -> bytes:
        for _ in range(max_cycles):
            if self.replies:
                head, body = self.replies.popleft()
                assert head == rep, f"reply {chr(head)!r}, expected {chr(rep)!r}"
                return body
            await ctx.tick()
        raise AssertionError(f"no {chr(rep)!r} reply in {max_cycles} cycles")

    async def command(self, ctx, data: bytes, rep: int, *, max_cycles: int = 20_000) -> bytes:
        await self.send(ctx, data)
        return await self.reply(ctx, rep, max_cycles=max_cycles)

    async def get(self, ctx, reg) -> int:
        return struct.unpack("<I", await self.command(ctx, cmd_get(reg), lp.REP_BOARD_READ))[0]

    async def put(self, ctx, reg, value):
        assert await self.command(ctx, cmd_put(reg, value), lp.REP_BOARD_WRITE) == b""

    async def load(self, ctx, addr, payload) -> int:
        return (await self.command(ctx, cmd_load(addr, payload), lp.REP_DRAM_WRITE,
                                   max_cycles=40 * len(payload) + 2000))[0]

    async def crc(self, ctx, addr, n) -> tuple[int, int]:
        return struct.unpack("<IB", await self.command(ctx, cmd_crc(addr, n), lp.REP_DRAM_CRC,
                                                       max_cycles=4 * n + 2000))

    async def ctrl_read(self, ctx, addr) -> tuple[int, int]:
        """``'K'``: (status, data)."""
        return struct.unpack("<BI", await self.command(ctx, cmd_ctrl_read(addr), lp.REP_CTRL_READ))

    async def ctrl_write(self, ctx, addr, value) -> int:
        """``'J'``: status."""
        return (await self.command(ctx, cmd_ctrl_write(addr, value), lp.REP_CTRL_WRITE))[0]

    async def core_read(self, ctx, addr) -> int:
        return struct.unpack("<I", await self.command(ctx, struct.pack("<BB", lp.OP_READ, addr), lp.REP_READ))[0]

    async def core_write(self, ctx, addr, value):
        await self.command(ctx, struct.pack("<BBI", lp.OP_WRITE, addr, value), lp.REP_WRITE)

    async def token(self, ctx, token, position, flags=0, *, max_cycles=200_000) -> int:
        return (await self.command(ctx, cmd_token(token, position, flags), lp.REP_TOKEN, max_cycles=max_cycles))[0]

    async def output(self, ctx, n: int, *, max_cycles: int = 200_000) -> list[bytes]:
        """Wait until ``n`` packets have come in all; returns them (and forgets them)."""
        for _ in range(max_cycles):
            if len(self.packets) >= n:
                out, self.packets = self.packets[:n], self.packets[n:]
                return out
            await ctx.tick()
        raise AssertionError(f"{len(self.packets)} of {n} output packets in {max_cycles} cycles")

    async def quiet(self, ctx, cycles: int):
        """Nothing comes back for ``cycles`` cycles."""
        for _ in range(cycles):
            await ctx.tick()
        assert not self.replies and not self.packets and not self.words, "unexpected frames"

    def run(self, script, *watchers):
        """Run ``script`` with the port, control-bus and reply processes, and ``watchers`` (background
        testbenches of ``ctx``) beside it."""
        sim = Simulator(self.dut)
        sim.add_clock(1e-8)
        sim.add_testbench(self.model.process, background=True)
        sim.add_testbench(self.wb.process, background=True)
        sim.add_testbench(self._collect, background=True)
        for w in watchers:
            sim.add_testbench(w, background=True)

        async def main(ctx):
            await script(ctx, self)

        sim.add_testbench(main)
        sim.run()


@pytest.fixture(params=PORT_WIDTHS, ids=lambda w: f"port{w}")
def port_width(request) -> int:
    return request.param


#: the last beat of an image that :class:`TokenCore` fails, :data:`TokenCore.LATE` cycles after taking it
LATE_ERROR_BEAT = b"LATE-ERR"


class TokenCore(LoopbackCore):
    """The loopback stand-in (each 64-bit beat comes back as two output words) with the core's ``irq`` and
    ``STATUS`` as a token sees them: ``DONE`` clears when a packet's first beat is taken and is set when an
    output word with ``tlast`` leaves, so a token (its packet, then its image) is done once its image's last
    word has left. A packet whose last beat is :data:`LATE_ERROR_BEAT` is dropped and, :attr:`LATE` cycles
    after that beat was taken, sets ``ERROR`` (``ERROR_CAUSE`` ``WEIGHT_CRC``, as the core's check of an
    image's last weight block would); ``CTRL.clear`` clears it."""

    LATE = 300

    def elaborate(self, platform):
        m = Module()
        m.submodules.regs = regs = RegisterBlock(id_values=ID_VALUES)
        connect(m, flipped(self.s_axil), regs.axil)
        done, error, first = Signal(), Signal(), Signal(init=1)
        late = Signal(range(self.LATE + 1))
        hold, hold_last = Signal(64), Signal()
        half = Signal(2)            # 0 empty, 2 words to send, 1 word left
        w, o = self.s_axis_w0, self.m_axis_out
        m.d.comb += [regs.host.done.eq(done), regs.host.error.eq(error), self.irq.eq(done | error),
                     regs.host.error_cause.eq(Mux(error, isa.ErrorCause.WEIGHT_CRC.value, 0)),
                     w.tready.eq(half == 0)]
        with m.If(w.tvalid & w.tready):
            m.d.sync += first.eq(w.tlast)
            with m.If(first):
                m.d.sync += done.eq(0)
            with m.If(w.tlast & (w.tdata == int.from_bytes(LATE_ERROR_BEAT, "little"))):
                m.d.sync += late.eq(self.LATE)
            with m.Else():
                m.d.sync += [hold.eq(w.tdata), hold_last.eq(w.tlast), half.eq(2)]
        with m.If(late != 0):
            m.d.sync += late.eq(late - 1)
            with m.If(late == 1):
                m.d.sync += error.eq(1)
        m.d.comb += [o.tvalid.eq(half != 0), o.tdata.eq(hold.word_select(half == 1, 32)),
                     o.tlast.eq((half == 1) & hold_last)]
        with m.If(o.tvalid & o.tready):
            m.d.sync += half.eq(half - 1)
            with m.If(o.tlast):
                m.d.sync += done.eq(1)
        with m.If(regs.host.clear):
            m.d.sync += error.eq(0)
        return m


def small_board(port_width: int = 16, **kw) -> DRAMBoard:
    """A board around :class:`TokenCore`, its port ``port_width`` bits wide over the 32 KiB test DRAM."""
    return DRAMBoard(build=BUILD, addr_width=addr_width_for(port_width, ADDR_WIDTH), port_width=port_width,
                     clock_hz=CLOCK_HZ, byte_timeout=BYTE_TIMEOUT, core=TokenCore(), dram_timeout=200, **kw)


def blank_mem(seed=1):
    return np.random.default_rng(seed).integers(0, 1 << 16, size=1 << ADDR_WIDTH, dtype=np.uint16)


def mem_bytes(mem, addr, n) -> bytes:
    return mem.astype("<u2").tobytes()[addr:addr + n]


def put_bytes(mem, addr, data: bytes):
    view = mem.view(np.uint8)
    assert addr % 2 == 0 and len(data) % 2 == 0
    view[addr:addr + len(data)] = np.frombuffer(data, dtype=np.uint8)


# ---------------------------------------------------------------------------------------------- registers

def test_board_registers(port_width):
    bench = Bench(small_board(port_width), blank_mem())

    async def script(ctx, b):
        assert await b.get(ctx, lp.BoardReg.MAGIC) == lp.BOARD_MAGIC
        assert await b.get(ctx, lp.BoardReg.LINK_VERSION) == lp.LINK_VERSION
        assert await b.get(ctx, lp.BoardReg.DRAM_BYTES) == DRAM_BYTES
        assert await b.get(ctx, lp.BoardReg.CLOCK_HZ) == CLOCK_HZ
        ready = lp.BoardStatus.DRAM_READY | lp.BoardStatus.PORT_ENABLED        # no hold_port: always enabled
        assert await b.get(ctx, lp.BoardReg.STATUS) == ready
        assert await b.get(ctx, 0xFC) == 0                                   # unmapped
        data_regs = sorted(lp.WRITABLE - {lp.BoardReg.STATUS, lp.BoardReg.PORT_ENABLE})
        for k, reg in enumerate(data_regs):
            await b.put(ctx, reg, 0x9E3779B9 * (k + 1) & 0xFFFFFFFF)
        for k, reg in enumerate(data_regs):
            assert await b.get(ctx, reg) == 0x9E3779B9 * (k + 1) & 0xFFFFFFFF
        for reg in set(lp.BoardReg) - lp.WRITABLE | {lp.BoardReg.PORT_ENABLE}:   # read-only: writes ignored
            before = await b.get(ctx, reg)
            await b.put(ctx, reg, 0x12345678 if reg != lp.BoardReg.PORT_ENABLE else 0)
            assert await b.get(ctx, reg) == before, reg.name
        assert await b.get(ctx, lp.BoardReg.PORT_ENABLE) == 1 and ctx.get(b.dut.port_enable) == 1
        await b.put(ctx, lp.BoardReg.STATUS, 0xFFFFFFFF)                     # only IMAGE_VALID is writable
        assert await b.get(ctx, lp.BoardReg.STATUS) == ready | lp.BoardStatus.IMAGE_VALID
        await b.put(ctx, lp.BoardReg.STATUS, 0)
        assert await b.get(ctx, lp.BoardReg.STATUS) == ready
        assert await b.get(ctx, lp.BoardReg.TOKENS) == 0
        # the core's registers through 'R' still reach the stand-in's register block
        assert await b.core_read(ctx, R.ID_MAGIC) == isa.ID_MAGIC
        await b.send(ctx, b"Z")
        assert await b.reply(ctx, lp.REP_UNKNOWN) == b""

    bench.run(script)


# ---------------------------------------------------------------------------------------------- DRAM

def test_load_then_crc_equals_zlib(port_width):
    """'L' writes bytes the port model then holds; 'C' over any 8-byte-aligned range equals zlib.crc32;
    'L' clears IMAGE_VALID."""
    mem = blank_mem()
    bench = Bench(small_board(port_width), mem, cmd_stall=0.3)
    rng = np.random.default_rng(7)
    chunks = [(0x100, rng.bytes(8)), (0x1000, rng.bytes(8 * 40)), (DRAM_BYTES - 64, rng.bytes(64))]

    async def script(ctx, b):
        await b.put(ctx, lp.BoardReg.STATUS, lp.BoardStatus.IMAGE_VALID)
        for addr, data in chunks:
            assert await b.load(ctx, addr, data) == 0
            assert mem_bytes(mem, addr, len(data)) == data
            assert not await b.get(ctx, lp.BoardReg.STATUS) & lp.BoardStatus.IMAGE_VALID
            await b.put(ctx, lp.BoardReg.STATUS, lp.BoardStatus.IMAGE_VALID)
        for addr, n in [(0x1000, 8 * 40), (0x1008, 8 * 17), (0x100, 8), (DRAM_BYTES - 64, 64), (0, 4096),
                        (0x40, 0)]:
            crc, status = await b.crc(ctx, addr, n)
            assert status == 0
            assert crc == zlib.crc32(mem_bytes(mem, addr, n)), (addr, n)
        assert await b.get(ctx, lp.BoardReg.STATUS) & lp.BoardStatus.IMAGE_VALID   # 'C' leaves it

    bench.run(script)


def test_loads_and_crcs_that_start_or_end_mid_word(port_width):
    """'L's of one beat into the upper and the lower half of a 16-byte word, and of odd and even beats from
    and to 8 mod 16: the bytes land at their addresses and every other byte of the DRAM keeps its value (on
    the 128-bit port the byte enables cover only the load's half of a word it shares), one write per port
    word touched; 'C' over odd numbers of beats from either half equals zlib.crc32."""
    mem = blank_mem(seed=4)
    want = bytearray(mem.view(np.uint8).tobytes())
    bench = Bench(small_board(port_width), mem, cmd_stall=0.2)
    rng = np.random.default_rng(9)
    loads = [(0x108, rng.bytes(8)), (0x200, rng.bytes(8)), (0x318, rng.bytes(8 * 7)), (0x428, rng.bytes(16)),
             (0x500, rng.bytes(24)), (DRAM_BYTES - 8, rng.bytes(8))]
    word = port_width // 8

    async def script(ctx, b):
        writes = 0
        for addr, data in loads:
            assert await b.load(ctx, addr, data) == 0
            want[addr:addr + len(data)] = data
            assert mem.view(np.uint8).tobytes() == bytes(want), hex(addr)
            writes += (addr + len(data) - 1) // word - addr // word + 1
            assert b.model.writes_taken == writes
        for addr, n in [(0x108, 8), (0x100, 24), (0x318, 56), (0x310, 8 * 9), (0x428, 8), (0x420, 40),
                        (0x508, 8), (DRAM_BYTES - 8, 8), (DRAM_BYTES - 24, 24)]:
            assert await b.crc(ctx, addr, n) == (zlib.crc32(bytes(want[addr:addr + n])), 0), (hex(addr), n)

    bench.run(script)


def test_port_width_is_checked():
    """A port word must be a power-of-two number of bytes: a divisor of the 64-bit beat or a multiple of it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        for pw in (24, 48, 96, 192, 4, 12):
            with pytest.raises(ValueError, match="port_width"):
                DRAMBoard(build=BUILD, addr_width=10, port_width=pw, clock_hz=CLOCK_HZ, core=LoopbackCore())
        with pytest.raises(TypeError, match="port_width"):
            DRAMBoard(build=BUILD, addr_width=10, port_width=128.0, clock_hz=CLOCK_HZ, core=LoopbackCore())
        with pytest.raises(ValueError, match="DRAM_BYTES"):     # 2**28 words of 16 bytes: 4 GiB
            DRAMBoard(build=BUILD, addr_width=28, port_width=128, clock_hz=CLOCK_HZ, core=LoopbackCore())
        ecpix5 = DRAMBoard(build=BUILD, addr_width=25, port_width=128, clock_hz=75_000_000, core=LoopbackCore())
        assert ecpix5.dram_bytes == 512 << 20 and ecpix5.byte_addr_width == 29
        assert ecpix5.port.signature == NativePortSignature(addr_width=25, data_width=128)
        del ecpix5
        gc.collect()


def test_bad_alignment_and_range_do_nothing(port_width):
    mem = blank_mem()
    before = mem.copy()
    bench = Bench(small_board(port_width), mem)

    async def script(ctx, b):
        for addr in (4, 0x101, DRAM_BYTES - 8, DRAM_BYTES, 0xFFFFFFF8):
            assert await b.load(ctx, addr, bytes(16)) == lp.DramStatus.BAD_ALIGN, hex(addr)
        for addr, n in ((4, 8), (0, 12), (DRAM_BYTES - 8, 16), (8, DRAM_BYTES), (0xFFFFFFF8, 8)):
            assert (await b.crc(ctx, addr, n))[1] == lp.DramStatus.BAD_ALIGN, (hex(addr), n)
        assert np.array_equal(mem, before)
        assert await b.load(ctx, 0x200, bytes(range(16))) == 0      # the next good command works
        assert mem_bytes(mem, 0x200, 16) == bytes(range(16))

    bench.run(script)


def test_dram_not_ready(port_width):
    mem = blank_mem()
    before = mem.copy()
    bench = Bench(small_board(port_width), mem, dram_ready=False)

    async def script(ctx, b):
        assert await b.get(ctx, lp.BoardReg.STATUS) == lp.BoardStatus.PORT_ENABLED
        assert await b.load(ctx, 0, bytes(8)) == lp.DramStatus.NOT_READY
        assert (await b.crc(ctx, 0, 8))[1] == lp.DramStatus.NOT_READY
        assert await b.load(ctx, 3, bytes(8)) == lp.DramStatus.NOT_READY | lp.DramStatus.BAD_ALIGN
        assert np.array_equal(mem, before) and bench.model.reads == 0

    bench.run(script)


def test_load_abandoned_mid_data(port_width):
    """A link dropped mid-'L': the parser gives up after the byte time-out, the write completes with zero
    beats, no reply comes, and the next commands work."""
    mem = blank_mem()
    bench = Bench(small_board(port_width), mem)
    data = bytes(range(1, 1 + 8 * 6))

    async def script(ctx, b):
        await b.send(ctx, cmd_load(0x300, data)[:7 + 8 * 2 + 3])      # two beats and three bytes of a third
        await b.quiet(ctx, BYTE_TIMEOUT + 500)
        assert await b.get(ctx, lp.BoardReg.LINK_TIMEOUTS) == 1
        assert mem_bytes(mem, 0x300, 48) == data[:16] + bytes(32)
        assert await b.load(ctx, 0x300, data) == 0
        assert (await b.crc(ctx, 0x300, 48)) == (zlib.crc32(data), 0)

    bench.run(script)


# ---------------------------------------------------------------------------------------------- control bus

def test_ctrl_reads_and_writes_reach_the_wishbone_subordinate():
    """'J' writes a word at its byte address (word address on the bus), 'K' reads it back; several registers,
    random ack latencies; one bus transfer per command, nothing else on the bus."""
    bench = Bench(small_board(), blank_mem())
    words = {0x000: 0x00000001, 0x800: 0x3, 0x1014: 0x89ABCDEF, 0x1018: 0x01234567, lp.CTRL_BYTES - 4: 0xFFFFFFFF}

    async def script(ctx, b):
        b.wb.regs[0x1020 >> 2] = 0xCAFEF00D                          # a register the subordinate holds itself
        assert await b.ctrl_read(ctx, 0x1020) == (0, 0xCAFEF00D)
        for addr, value in words.items():
            assert await b.ctrl_write(ctx, addr, value) == 0
        assert {a << 2: v for a, v in b.wb.regs.items() if a != 0x1020 >> 2} == words
        for addr, value in reversed(words.items()):
            assert await b.ctrl_read(ctx, addr) == (0, value)
        assert await b.ctrl_read(ctx, 0x2000) == (0, 0)                # unmapped words read 0
        writes = [(1, a >> 2, v) for a, v in words.items()]
        reads = [(0, a >> 2, 0) for a in reversed(words)]
        assert [(we, adr, d if we else 0) for we, adr, d in b.wb.transfers] == \
            [(0, 0x1020 >> 2, 0), *writes, *reads, (0, 0x2000 >> 2, 0)]
        assert b.wb.abandoned == 0
        assert await b.get(ctx, lp.BoardReg.MAGIC) == lp.BOARD_MAGIC  # the other commands are unaffected

    bench.run(script)


def test_ctrl_bad_address_touches_nothing():
    bench = Bench(small_board(), blank_mem())

    async def script(ctx, b):
        for addr in (2, 0x801, lp.CTRL_BYTES, lp.CTRL_BYTES + 4, 0xFFFFFFFC):
            assert await b.ctrl_read(ctx, addr) == (lp.CtrlStatus.BAD_ADDR, 0), hex(addr)
            assert await b.ctrl_write(ctx, addr, 0x5A5A5A5A) == lp.CtrlStatus.BAD_ADDR, hex(addr)
        assert b.wb.transfers == [] and b.wb.max_wait == 0              # cyc never raised
        assert await b.ctrl_write(ctx, 0x804, 7) == 0                  # the next good access works
        assert b.wb.transfers == [(1, 0x804 >> 2, 7)]

    bench.run(script)


def test_ctrl_busy_while_the_sequencer_owns_the_bus():
    """Before init_done (and no init_error) every access is refused with BUSY and the bus stays idle; after
    an init error the host may still read the controller's registers; with init_done accesses run."""
    bench = Bench(small_board(), blank_mem(), dram_ready=False)

    async def script(ctx, b):
        b.wb.regs[1] = 1
        assert await b.ctrl_read(ctx, 0x4) == (lp.CtrlStatus.BUSY, 0)
        assert await b.ctrl_write(ctx, 0x800, 1) == lp.CtrlStatus.BUSY
        assert await b.ctrl_read(ctx, 0x3) == (lp.CtrlStatus.BUSY | lp.CtrlStatus.BAD_ADDR, 0)
        assert b.wb.transfers == [] and b.wb.max_wait == 0
        ctx.set(b.dut.dram_error, 1)
        assert await b.ctrl_read(ctx, 0x4) == (0, 1)
        ctx.set(b.dut.dram_error, 0)
        ctx.set(b.dut.dram_ready, 1)
        assert await b.ctrl_write(ctx, 0x800, 1) == 0
        assert b.wb.transfers == [(0, 1, 0), (1, 0x200, 1)]

    bench.run(script)


def test_ctrl_timeout_then_the_link_goes_on():
    """A subordinate that never acknowledges: 'K' and 'J' end with TIMEOUT after ctrl_timeout cycles, the request
    is withdrawn (cyc low), and the link, the board registers and the next accesses work."""
    timeout = 50
    bench = Bench(small_board(ctrl_timeout=timeout), blank_mem())

    async def script(ctx, b):
        b.wb.respond = False
        start = b.cycle
        assert await b.ctrl_read(ctx, 0x818) == (lp.CtrlStatus.TIMEOUT, 0)
        assert timeout <= b.cycle - start < timeout + 60              # bounded, and not before the time-out
        assert await b.ctrl_write(ctx, 0x818, 3) == lp.CtrlStatus.TIMEOUT
        assert b.wb.abandoned == 2 and b.wb.max_wait == timeout + 1 and b.wb.transfers == []
        assert await b.get(ctx, lp.BoardReg.MAGIC) == lp.BOARD_MAGIC
        assert await b.load(ctx, 0x40, bytes(range(8))) == 0           # the DRAM engine is untouched
        b.wb.respond = True
        assert await b.ctrl_write(ctx, 0x818, 3) == 0
        assert await b.ctrl_read(ctx, 0x818) == (0, 3)

    bench.run(script)


def test_held_port_until_the_host_enables_it(port_width):
    """hold_port: after power-up the port is held (port_enable low, PORT_HELD set, PORT_ENABLED clear); 'L', 'C'
    and 'T' are refused with nothing read or written while 'K'/'J' (leveling) work; PORT_ENABLE 1 releases the
    port, 0 holds it again, and writes leave the other registers."""
    mem = blank_mem()
    before = mem.copy()
    bench = Bench(small_board(port_width, hold_port=True), mem)
    held, enabled = lp.BoardStatus.PORT_HELD, lp.BoardStatus.PORT_ENABLED

    async def script(ctx, b):
        assert await b.get(ctx, lp.BoardReg.STATUS) == lp.BoardStatus.DRAM_READY | held
        assert await b.get(ctx, lp.BoardReg.PORT_ENABLE) == 0 and ctx.get(b.dut.port_enable) == 0
        for reg, v in ((lp.BoardReg.IMAGE_BYTES, 64), (lp.BoardReg.EMBED_HIDDEN, 4), (lp.BoardReg.EMBED_VOCAB, 4),
                       (lp.BoardReg.EMBED_BASE, 0x100), (lp.BoardReg.STATUS, lp.BoardStatus.IMAGE_VALID)):
            await b.put(ctx, reg, v)
        assert await b.token(ctx, 1, 0) == lp.TokenStatus.NOT_READY     # IMAGE_VALID set, yet refused
        assert (await b.crc(ctx, 0, 64))[1] == lp.DramStatus.NOT_READY
        assert await b.load(ctx, 0x40, bytes(range(8))) == lp.DramStatus.NOT_READY
        assert b.model.reads == 0 and np.array_equal(mem, before) and not b.packets and not b.words
        assert await b.ctrl_write(ctx, 0x800, 1) == 0 and await b.ctrl_read(ctx, 0x800) == (0, 1)
        await b.put(ctx, lp.BoardReg.PORT_ENABLE, 0xFFFFFFFF)           # bit 0
        assert await b.get(ctx, lp.BoardReg.PORT_ENABLE) == 1 and ctx.get(b.dut.port_enable) == 1
        assert await b.get(ctx, lp.BoardReg.STATUS) == lp.BoardStatus.DRAM_READY | held | enabled  # 'L' cleared
        assert await b.load(ctx, 0x40, bytes(range(8))) == 0
        assert await b.crc(ctx, 0x40, 8) == (zlib.crc32(bytes(range(8))), 0)
        await b.put(ctx, lp.BoardReg.PORT_ENABLE, 2)                   # bit 0 clear: held again
        assert ctx.get(b.dut.port_enable) == 0
        assert await b.get(ctx, lp.BoardReg.STATUS) == lp.BoardStatus.DRAM_READY | held
        assert (await b.crc(ctx, 0x40, 8))[1] == lp.DramStatus.NOT_READY
        assert await b.command(ctx, bytes([lp.OP_RESET]), lp.REP_RESET) == b""
        assert await b.get(ctx, lp.BoardReg.PORT_ENABLE) == 0           # 'X' leaves the board registers

    bench.run(script)


def test_hold_port_and_ctrl_timeout_are_checked():
    # no core passed: the checks come before the default core is built
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)     # the refused instances are never elaborated
        with pytest.raises(TypeError, match="hold_port"):
            DRAMBoard(build=BUILD, addr_width=ADDR_WIDTH, clock_hz=CLOCK_HZ, hold_port=1)
        with pytest.raises(ValueError, match="ctrl_timeout"):
            DRAMBoard(build=BUILD, addr_width=ADDR_WIDTH, clock_hz=CLOCK_HZ, ctrl_timeout=0)
        gc.collect()


#: power-up writes for the sequencer of test_ctrl_with_the_power_up_sequencer: (byte address, value, delay)
INIT = ((0x1000, 0xE, 0), (0x1004, 0xF, 300), (0x1000, 0x1, 0), (0x0, 0x1, 0))


class ControlledBoard(wiring.Component):
    """A ``hold_port`` :class:`DRAMBoard` behind :class:`hw.dram_init.DRAMControl` (the power-up sequencer, the
    control-bus arbiter and the port gate of :class:`hw.dram.LiteDRAMCore`), joined as a board top joins the
    board to the core: ``ctrl`` to ``ctrl``, ``port`` to ``port``, ``port_enable`` to ``port_enable``,
    ``dram_ready``/``dram_error`` from the sequencer. ``port`` and ``ctrl`` here are the generated core's side
    (``core_port``, ``bus``); ``dram_ready``/``dram_error`` are unused (the bench sets them)."""

    def __init__(self, port_width: int = 16):
        self._port_width = port_width
        super().__init__({"rx": In(stream.Signature(8)), "tx": Out(stream.Signature(8)),
                          "port": Out(NativePortSignature(addr_width=addr_width_for(port_width, ADDR_WIDTH),
                                                          data_width=port_width)),
                          "ctrl": Out(WishboneSignature()), "dram_ready": In(1), "dram_error": In(1),
                          "init_done": Out(1)})

    def elaborate(self, platform):
        m = Module()
        pw = self._port_width
        m.submodules.board = board = small_board(pw, hold_port=True)
        m.submodules.control = control = DRAMControl(writes=INIT, addr_width=addr_width_for(pw, ADDR_WIDTH),
                                                     data_width=pw, hold_port=True)
        connect(m, flipped(self.rx), board.rx)
        connect(m, board.tx, flipped(self.tx))
        connect(m, board.ctrl, control.ctrl)
        connect(m, board.port, control.port)
        connect(m, control.core_port, flipped(self.port))
        connect(m, control.bus, flipped(self.ctrl))
        m.d.comb += [control.port_enable.eq(board.port_enable), board.dram_ready.eq(control.done),
                     board.dram_error.eq(control.error), self.init_done.eq(control.done)]
        return m


def test_ctrl_with_the_power_up_sequencer(port_width):
    """Board and DRAMControl joined: while the sequencer plays its writes the board answers BUSY and only the
    sequencer's transfers reach the bus; then 'K' reads what it wrote and 'J' writes; the port stays held
    (NOT_READY, no port command) until PORT_ENABLE, then 'L' and 'C' run through the gate."""
    mem = blank_mem()
    bench = Bench(ControlledBoard(port_width), mem)
    data = bytes(range(3, 43, 2)) + bytes(4)

    async def script(ctx, b):
        assert await b.ctrl_read(ctx, 0x1000) == (lp.CtrlStatus.BUSY, 0)
        assert await b.ctrl_write(ctx, 0x800, 7) == lp.CtrlStatus.BUSY
        assert not ctx.get(b.dut.init_done)
        for _ in range(1000):
            if ctx.get(b.dut.init_done):
                break
            await ctx.tick()
        assert [(adr << 2, v) for _, adr, v in b.wb.transfers] == [(a, v) for a, v, _ in INIT]
        assert await b.ctrl_read(ctx, 0x1000) == (0, 0x1) and await b.ctrl_read(ctx, 0x1004) == (0, 0xF)
        assert await b.ctrl_write(ctx, 0x800, 7) == 0 and b.wb.regs[0x800 >> 2] == 7
        assert await b.get(ctx, lp.BoardReg.STATUS) == lp.BoardStatus.DRAM_READY | lp.BoardStatus.PORT_HELD
        assert await b.load(ctx, 0x80, data) == lp.DramStatus.NOT_READY and b.model.writes_taken == 0
        await b.put(ctx, lp.BoardReg.PORT_ENABLE, 1)
        assert await b.load(ctx, 0x80, data) == 0 and mem_bytes(mem, 0x80, len(data)) == data
        assert await b.crc(ctx, 0x80, len(data)) == (zlib.crc32(data), 0)

    bench.run(script)


# ---------------------------------------------------------------------------------------------- tokens, stand-in core

@pytest.mark.parametrize("image_base, embed_base", [(IMAGE_BASE, EMBED_BASE), (0x1008, 0x6008)],
                         ids=["aligned", "mid-word"])
def test_token_packet_and_image_reach_channel_zero(port_width, image_base, embed_base):
    """Around the loopback stand-in: a token with LOGITS sends make_token_packet of the row, then the image
    (each with tlast), which come back as they went in; refused tokens send nothing; 'S' still streams.
    The image is 21 beats (not a whole number of 16-byte words); with "mid-word" it starts at 8 mod 16 and
    the table too (hidden 13: rows at every 4 mod 16, in either half of a word)."""
    rng = np.random.default_rng(3)
    hidden, vocab = 13, 9
    table = rng.integers(-(1 << 31), 1 << 31, size=(vocab, hidden), dtype=np.int64)
    image = rng.bytes(8 * 21)
    mem = blank_mem()
    put_bytes(mem, embed_base, table.astype("<i4").tobytes())
    put_bytes(mem, image_base, image)
    bench = Bench(small_board(port_width), mem, cmd_stall=0.2)

    async def script(ctx, b):
        assert await b.token(ctx, 1, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.NO_IMAGE
        await b.put(ctx, lp.BoardReg.STATUS, lp.BoardStatus.IMAGE_VALID)
        for base, n in ((0, 0), (0, 7), (8, DRAM_BYTES), (0, 1 << 31)):     # empty, or beyond the DRAM
            await b.put(ctx, lp.BoardReg.IMAGE_BASE, base)
            await b.put(ctx, lp.BoardReg.IMAGE_BYTES, n)
            assert await b.token(ctx, 1, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.NO_IMAGE, (base, n)
        assert bench.model.reads == 0
        if port_width > 64:     # the wide reader's granularity is the beat: an IMAGE_BASE below it is refused
            await b.put(ctx, lp.BoardReg.IMAGE_BASE, image_base + 4)
            await b.put(ctx, lp.BoardReg.IMAGE_BYTES, len(image) - 8)
            assert await b.token(ctx, 1, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.NO_IMAGE
            assert bench.model.reads == 0
        for reg, v in ((lp.BoardReg.IMAGE_BASE, image_base), (lp.BoardReg.IMAGE_BYTES, len(image)),
                       (lp.BoardReg.EMBED_BASE, embed_base), (lp.BoardReg.EMBED_HIDDEN, hidden),
                       (lp.BoardReg.EMBED_VOCAB, vocab), (lp.BoardReg.STATUS, lp.BoardStatus.IMAGE_VALID)):
            await b.put(ctx, reg, v)
        assert await b.token(ctx, vocab, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.BAD_TOKEN
        await b.put(ctx, lp.BoardReg.EMBED_HIDDEN, 33)                       # above max_hidden (32)
        assert await b.token(ctx, 0, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.BAD_HIDDEN
        await b.put(ctx, lp.BoardReg.EMBED_HIDDEN, 0)
        assert await b.token(ctx, 0, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.BAD_HIDDEN
        await b.put(ctx, lp.BoardReg.EMBED_HIDDEN, hidden)
        await b.quiet(ctx, 200)
        for token, pos in ((vocab - 1, 7), (0, 0xFFFFFFFF), (1, 3), (2, 4), (3, 5)):
            assert await b.token(ctx, token, pos, lp.TokenFlags.LOGITS) == 0
            packet, img = await b.output(ctx, 2)
            assert packet == make_token_packet(table[token], position=pos, logits=True), token
            assert img == image
        assert await b.get(ctx, lp.BoardReg.TOKENS) == 13 + (port_width > 64)
        # 'S' beats reach the core as before, passed through whole
        data = bytes(range(40, 64))
        await b.send(ctx, struct.pack("<BHB", lp.OP_STREAM, 2, 1) + data)
        assert await b.reply(ctx, lp.REP_STREAM) == b""
        assert await b.output(ctx, 1) == [data]

    bench.run(script)


class SinkCore(TokenCore):
    """:class:`TokenCore`, taking a weight beat every cycle (and echoing only some of them)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.comb += self.s_axis_w0.tready.eq(1)     # the last driver wins: always ready, the loopback idle
        return m


def test_weights_reach_the_core_a_beat_a_cycle():
    """On the 128-bit port a word is two beats, so the DRAM can feed the core a beat every cycle; the stream
    between the token engine and the core must pass them at that rate (a one-entry register passes a beat
    every other cycle, which halved the ECPIX-5's weight rate: 17.6 M cycles for a 370M token where the cycle
    model has 8.8 M, bench/results/ddr3_token_370m.json). Over a 256-beat image with no command stalls, the
    beats after the first arrive in at most 1.1 cycles each."""
    beats = 256
    image = np.random.default_rng(5).bytes(8 * beats)
    mem = blank_mem()
    put_bytes(mem, IMAGE_BASE, image)
    put_bytes(mem, EMBED_BASE, bytes(4 * 13 * 9))
    core = SinkCore()
    bench = Bench(DRAMBoard(build=BUILD, addr_width=addr_width_for(128, ADDR_WIDTH), port_width=128,
                            clock_hz=CLOCK_HZ, byte_timeout=BYTE_TIMEOUT, core=core, dram_timeout=200), mem)
    arrivals: list[int] = []

    async def watch(ctx):
        cycle = 0
        async for _, _, valid, ready in ctx.tick().sample(core.s_axis_w0.tvalid, core.s_axis_w0.tready):
            cycle += 1
            if valid and ready:
                arrivals.append(cycle)

    async def script(ctx, b):
        for reg, v in ((lp.BoardReg.IMAGE_BASE, IMAGE_BASE), (lp.BoardReg.IMAGE_BYTES, len(image)),
                       (lp.BoardReg.EMBED_BASE, EMBED_BASE), (lp.BoardReg.EMBED_HIDDEN, 13),
                       (lp.BoardReg.EMBED_VOCAB, 9), (lp.BoardReg.STATUS, lp.BoardStatus.IMAGE_VALID)):
            await b.put(ctx, reg, v)
        assert await b.token(ctx, 1, 0) == 0

    bench.run(script, watch)
    img = arrivals[-beats:]                   # the image's beats follow the token packet's
    assert len(arrivals) > beats
    span = img[-1] - img[0]
    assert span <= 1.1 * (beats - 1), f"{beats} beats over {span} cycles: {span / (beats - 1):.2f} cycles a beat"


# ---------------------------------------------------------------------------------------------- the real core

@cache
def tiny_model():
    """A tiny random model: (image bytes, int32 embedding table [V, H] in the residual format)."""
    w = random_weights(TINY, seed=3, gamma_spread=1.0)
    fm = calibrate(w)
    image = compile_model(w, CompileOptions(formats=fm, packing=BUILD.packing))
    return image, embeddings_fixed(w.embeddings, fm.residual)


def real_board(port_width: int = 16):
    return DRAMBoard(build=BUILD, addr_width=addr_width_for(port_width, ADDR_WIDTH), port_width=port_width,
                     clock_hz=CLOCK_HZ, byte_timeout=BYTE_TIMEOUT)


#: where the slow tests put the image and the table: at word boundaries on the 16-bit port, at 8 mod 16 (the
#: upper half of a 128-bit word) on the 128-bit one
BASES = {16: (IMAGE_BASE, EMBED_BASE), 128: (IMAGE_BASE + 8, EMBED_BASE + 8)}


def model_mem(image: bytes, table: np.ndarray, bases=(IMAGE_BASE, EMBED_BASE)) -> np.ndarray:
    image_base, embed_base = bases
    mem = blank_mem()
    put_bytes(mem, image_base, image)
    raw = table.astype("<i4").tobytes()
    assert image_base + len(image) <= embed_base and embed_base + len(raw) <= DRAM_BYTES
    put_bytes(mem, embed_base, raw + bytes(len(raw) % 2))
    return mem


async def configure(ctx, b, image, table, *, valid=True, bases=(IMAGE_BASE, EMBED_BASE)):
    image_base, embed_base = bases
    for reg, v in ((lp.BoardReg.IMAGE_BASE, image_base), (lp.BoardReg.IMAGE_BYTES, len(image)),
                   (lp.BoardReg.EMBED_BASE, embed_base), (lp.BoardReg.EMBED_HIDDEN, table.shape[1]),
                   (lp.BoardReg.EMBED_VOCAB, table.shape[0]),
                   (lp.BoardReg.STATUS, lp.BoardStatus.IMAGE_VALID if valid else 0)):
        await b.put(ctx, reg, v)


def summary(packet: bytes, flags: int = 0) -> bytes:
    out = parse_output_packet(packet)
    return struct.pack("<III", out.position, out.argmax, flags)


@pytest.mark.slow
def test_tokens_from_dram_bit_exact(port_width):
    """A token before any image (NO_IMAGE, no output), then tokens of a tiny model from DRAM: argmax-only
    (the summary of the golden device's packet, flags 0) and with LOGITS (the golden packet itself), state
    carried. The first token's output is awaited; the others are sent as soon as the previous 't' came,
    before its output (each packet must still get its own token's form), and a refused token between them
    changes nothing. On the 128-bit port the image and the table start in the upper half of a word."""
    image, table = tiny_model()
    gold = GoldenMachine(image)
    state = gold.init_state()
    steps = [(5, 0, 0), (17, 1, lp.TokenFlags.LOGITS), (60, 2, 0), (33, 3, lp.TokenFlags.LOGITS), (0, 4, 0)]
    expected = []
    for token, pos, flags in steps:
        res = gold.run_token(make_token_packet(table[token], position=pos, logits=bool(flags)), state)
        state = res.state
        expected.append(res.output if flags else summary(res.output))
    bases = BASES[port_width]
    bench = Bench(real_board(port_width), model_mem(image, table, bases), cmd_stall=0.1)
    image_words = len(image) // 2

    async def script(ctx, b):
        await configure(ctx, b, image, table, valid=False, bases=bases)
        assert await b.token(ctx, 5, 0) == lp.TokenStatus.NO_IMAGE
        await b.quiet(ctx, 300)
        await b.put(ctx, lp.BoardReg.STATUS, lp.BoardStatus.IMAGE_VALID)
        start = b.cycle
        assert await b.token(ctx, *steps[0]) == 0
        # the image at the 16-bit port's rate (10 % stalls), and no slower on the 128-bit port
        assert b.cycle - start < 1.3 * image_words, f"{b.cycle - start} cycles"
        assert await b.output(ctx, 1) == expected[:1]
        for k, step in enumerate(steps[1:], 1):
            assert await b.token(ctx, *step) == 0
            if k == 2:
                assert await b.token(ctx, TINY.vocab_size, 9, lp.TokenFlags.LOGITS) == lp.TokenStatus.BAD_TOKEN
        assert await b.output(ctx, len(steps) - 1) == expected[1:]
        assert await b.get(ctx, lp.BoardReg.TOKENS) == len(steps) + 2

    bench.run(script)


def corrupted_token_then_recovery(port_width: int, image: bytes, table, bad: bytes, where: int | None = None):
    """Run token 9 with ``bad`` (the image with a weight CRC fault) in DRAM: ``CORE_ERROR``, the core's
    ``ERROR_CAUSE`` ``WEIGHT_CRC`` (and ``ERROR_WHERE`` ``where`` when given); then ``image`` restored and
    ``CTRL.clear`` written, the next token 9 is the golden device's (the failed token committed nothing)."""
    bases = BASES[port_width]
    mem = model_mem(bad, table, bases)
    gold = GoldenMachine(image)
    want = gold.run_token(make_token_packet(table[9], position=0, logits=False), gold.init_state()).output
    bench = Bench(real_board(port_width), mem)

    async def script(ctx, b):
        await configure(ctx, b, image, table, bases=bases)
        assert await b.token(ctx, 9, 0) == lp.TokenStatus.CORE_ERROR
        assert await b.core_read(ctx, R.STATUS) & isa.Status.ERROR.value
        assert await b.core_read(ctx, R.ERROR_CAUSE) == isa.ErrorCause.WEIGHT_CRC.value
        if where is not None:
            assert await b.core_read(ctx, R.ERROR_WHERE) == where
        put_bytes(mem, bases[0], image)
        await b.core_write(ctx, R.CTRL, isa.Ctrl.CLEAR.value)
        b.words, b.packets = [], []          # the host drops what an error cut short
        assert await b.token(ctx, 9, 0) == 0
        assert await b.output(ctx, 1) == [summary(want)]

    bench.run(script)


@pytest.mark.slow
def test_corrupted_image_is_a_core_error_then_the_next_token_is_right(port_width):
    """A weight byte of the image changed in DRAM (to another valid base-3 byte): CORE_ERROR, the core's
    ERROR_CAUSE is WEIGHT_CRC; the image restored and CTRL.clear written, the next token is right (the
    failed token committed nothing)."""
    image, table = tiny_model()
    gemv = next(ins for ins in parse_image(image).instructions if ins.blocks)
    off = gemv.weight_offset + 3
    bad = bytearray(image)
    bad[off] = (bad[off] + 1) % 243
    with pytest.raises(ImageError) as err:
        parse_image(bytes(bad))
    assert err.value.cause == isa.ErrorCause.WEIGHT_CRC
    corrupted_token_then_recovery(port_width, image, table, bytes(bad))


@pytest.mark.slow
def test_a_bad_crc_in_the_last_weight_block_is_a_core_error(port_width):
    """The CRC word of the image's last weight block changed in DRAM: the core finds it only when it reaches
    that block, after it has taken the image's last beat (the whole tiny image fits its weight FIFO), and the
    token's status is still CORE_ERROR (ERROR_CAUSE WEIGHT_CRC at the last GEMV); the image restored and
    CTRL.clear written, the next token is right."""
    image, table = tiny_model()
    parsed = parse_image(image)
    idx, last = [(k, ins) for k, ins in enumerate(parsed.instructions) if ins.blocks][-1]
    crc_at = last.weight_offset + sum(len(blk) for blk in last.blocks) - 4
    bad = bytearray(image)
    bad[crc_at] ^= 0x01
    with pytest.raises(ImageError) as err:
        parse_image(bytes(bad))
    assert (err.value.cause, err.value.instruction) == (isa.ErrorCause.WEIGHT_CRC, idx)
    corrupted_token_then_recovery(port_width, image, table, bytes(bad), where=idx)


def small_image_bench(port_width: int, *, seed: int):
    """A board around the loopback stand-in with a random 9-beat image at ``IMAGE_BASE`` and a random 9 x 13
    int32 table at ``EMBED_BASE``: ``(bench, image, table)``."""
    rng = np.random.default_rng(seed)
    hidden, vocab = 13, 9
    table = rng.integers(-(1 << 31), 1 << 31, size=(vocab, hidden), dtype=np.int64)
    image = rng.bytes(8 * 9)
    mem = blank_mem()
    put_bytes(mem, EMBED_BASE, table.astype("<i4").tobytes())
    put_bytes(mem, IMAGE_BASE, image)
    return Bench(small_board(port_width), mem), image, table


def test_an_error_after_the_image_is_in_is_a_core_error(port_width):
    """The stand-in raises ERROR :attr:`TokenCore.LATE` cycles after it took the image's last beat (as the
    core's check of the last weight block's CRC can): the token's status is CORE_ERROR, not 0, and the core's
    STATUS has ERROR (ERROR_CAUSE WEIGHT_CRC). Tokens before and after it (the image restored, CTRL.clear
    written) report 0 with their output whole."""
    bench, image, table = small_image_bench(port_width, seed=7)

    async def script(ctx, b):
        await configure(ctx, b, image, table)
        assert await b.token(ctx, 2, 0, lp.TokenFlags.LOGITS) == 0
        assert await b.output(ctx, 2) == [make_token_packet(table[2], position=0, logits=True), image]
        put_bytes(b.mem, IMAGE_BASE, image[:-8] + LATE_ERROR_BEAT)
        start = b.cycle
        assert await b.token(ctx, 3, 1, lp.TokenFlags.LOGITS) == lp.TokenStatus.CORE_ERROR
        assert b.cycle - start > TokenCore.LATE
        assert await b.core_read(ctx, R.STATUS) == isa.Status.ERROR.value
        assert await b.core_read(ctx, R.ERROR_CAUSE) == isa.ErrorCause.WEIGHT_CRC.value
        assert await b.output(ctx, 1) == [make_token_packet(table[3], position=1, logits=True)]
        assert b"".join(w.to_bytes(4, "little") for w in b.words) == image[:-8]
        put_bytes(b.mem, IMAGE_BASE, image)
        await b.core_write(ctx, R.CTRL, isa.Ctrl.CLEAR.value)
        b.words = []                         # the host drops what an error cut short
        assert await b.token(ctx, 4, 2, lp.TokenFlags.LOGITS) == 0
        assert await b.output(ctx, 2) == [make_token_packet(table[4], position=2, logits=True), image]
        assert await b.core_read(ctx, R.STATUS) == isa.Status.DONE.value

    bench.run(script)


def test_read_timeout_then_reset(port_width):
    """Reads that never return: the token ends with READ_TIMEOUT, the reader stays stopped (READER_ERROR;
    'C' TIMEOUT, the next 'T' READ_TIMEOUT at once) until 'X', after which tokens run again."""
    bench, image, table = small_image_bench(port_width, seed=5)
    bench.model.lose_after = 5 if port_width == 16 else 2

    async def script(ctx, b):
        await configure(ctx, b, image, table)
        assert await b.token(ctx, 2, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.READ_TIMEOUT
        assert await b.get(ctx, lp.BoardReg.STATUS) & lp.BoardStatus.READER_ERROR
        assert (await b.crc(ctx, 0, 64))[1] == lp.DramStatus.TIMEOUT
        reads = b.model.reads
        assert await b.token(ctx, 2, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.READ_TIMEOUT
        assert b.model.reads == reads                        # refused at once: nothing read
        b.model.lose_after = None
        assert await b.command(ctx, bytes([lp.OP_RESET]), lp.REP_RESET) == b""
        b.words, b.packets = [], []                         # the host drops what came before 'x'
        assert not await b.get(ctx, lp.BoardReg.STATUS) & lp.BoardStatus.READER_ERROR
        assert await b.token(ctx, 3, 4, lp.TokenFlags.LOGITS) == 0
        packet, img = await b.output(ctx, 2)
        assert packet == make_token_packet(table[3], position=4, logits=True)
        assert img == image
        assert (await b.crc(ctx, IMAGE_BASE, len(image))) == (zlib.crc32(image), 0)

    bench.run(script)


def test_reset_with_reads_in_flight(port_width):
    """Reads slower than the time-out: the token ends with READ_TIMEOUT while its reads are still in flight,
    and ``'X'`` comes before their words, which arrive after it into the reset reader and are dropped: the
    next ``'C'`` and ``'T'`` read exactly their own bytes."""
    bench, image, table = small_image_bench(port_width, seed=6)

    async def script(ctx, b):
        await configure(ctx, b, image, table)
        b.model.latency = (330, 330)       # dram_timeout is 200 cycles
        assert await b.token(ctx, 2, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.READ_TIMEOUT
        assert await b.command(ctx, bytes([lp.OP_RESET]), lp.REP_RESET) == b""
        assert b.model.pending > 0, "no read in flight after 'x': the test proves nothing"
        b.model.latency = (3, 10)
        b.words, b.packets = [], []                         # the host drops what came before 'x'
        assert await b.crc(ctx, IMAGE_BASE, len(image)) == (zlib.crc32(image), 0)
        assert b.model.pending == 0
        assert await b.token(ctx, 3, 4, lp.TokenFlags.LOGITS) == 0
        packet, img = await b.output(ctx, 2)
        assert packet == make_token_packet(table[3], position=4, logits=True)
        assert img == image
        assert not await b.get(ctx, lp.BoardReg.STATUS) & lp.BoardStatus.READER_ERROR

    bench.run(script)


def test_write_timeout_then_reset(port_width):
    """A controller that never takes a write command: 'L' ends with TIMEOUT after dram_timeout cycles (its
    beats still taken, the next command parsed), the stuck writer refuses the next 'L' at once, and 'X'
    frees it."""
    mem = blank_mem()
    bench = Bench(small_board(port_width), mem)
    data = bytes(range(100, 132))

    async def script(ctx, b):
        b.model.cmd_stall = 1.0
        assert await b.load(ctx, 0x100, data) == lp.DramStatus.TIMEOUT
        assert await b.load(ctx, 0x100, data) == lp.DramStatus.TIMEOUT
        assert await b.get(ctx, lp.BoardReg.MAGIC) == lp.BOARD_MAGIC
        b.model.cmd_stall = 0.0
        assert await b.command(ctx, bytes([lp.OP_RESET]), lp.REP_RESET) == b""
        assert await b.load(ctx, 0x100, data) == 0
        assert mem_bytes(mem, 0x100, len(data)) == data
        assert await b.crc(ctx, 0x100, len(data)) == (zlib.crc32(data), 0)

    bench.run(script)


# ---------------------------------------------------------------------------------------------- the state in DRAM

STATE_BUILD = BUILD.replace(state_in_dram=True)
GEO = StateGeometry(STATE_BUILD.max_hidden, STATE_BUILD.max_layers)
STATE_BASE = GEO.base(DRAM_BYTES)
ROW_BEATS = state_beats(STATE_BUILD.max_hidden)


def row_address(bank: int, layer: int) -> int:
    return STATE_BASE + GEO.offset(bank, layer)


def row_in_mem(mem, bank: int, layer: int) -> list[int]:
    """Row ``(bank, layer)`` as the host reads it from the DRAM: 64-bit beats, little-endian."""
    raw = mem_bytes(mem, row_address(bank, layer), GEO.row_bytes)
    return [int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)]


def put_row(want: bytearray, bank: int, layer: int, beats: list[int]):
    a = row_address(bank, layer)
    want[a:a + GEO.row_bytes] = b"".join(b.to_bytes(8, "little") for b in beats)


class StateTokenCore(wiring.Component):
    """:class:`TokenCore` with a ``state_in_dram`` core's state ports (:class:`hw.top.Accelerator`'s), which a
    :class:`StateDriver` drives from the testbench (nothing in the stand-in drives them)."""

    def __init__(self):
        self._inner = TokenCore()
        super().__init__({**self._inner.signature.members, "state_cmd": Out(stream.Signature(StateCmd)),
                          "m_axis_state": Out(AXIStreamSignature(64)), "s_axis_state": In(AXIStreamSignature(64))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.token_core = c = self._inner
        connect(m, flipped(self.s_axil), c.s_axil)
        connect(m, flipped(self.s_axis_w0), c.s_axis_w0)
        connect(m, c.m_axis_out, flipped(self.m_axis_out))
        m.d.comb += self.irq.eq(c.irq)
        return m


class StateDriver:
    """Plays the core's :class:`hw.state_cache.StateCache` on a :class:`StateTokenCore`'s state ports: runs
    :attr:`ops` in order, as they are appended:

    - ``("write", bank, layer, beats, idle)``: the command, then the beats with ``idle`` cycles between them;
    - ``("fill", bank, layer)``: the command, then :data:`ROW_BEATS` beats taken with random backpressure
      (``tlast`` checked on the last, the payload held while not taken) into :attr:`fills`;
    - ``("wait", predicate)``: until ``predicate()`` is true.

    :attr:`log` gets ``(op, bank, layer, cycle accepted, cycle of the last beat)`` per transfer (cycles of
    :attr:`Bench.cycle`); :attr:`abandon` ends a transfer in progress (the beats never come)."""

    def __init__(self, bench: Bench, core: StateTokenCore, *, seed: int = 0, ready: float = 0.7):
        self.bench, self.core = bench, core
        self.rng = np.random.default_rng(seed)
        self.ready = ready
        self.ops: deque = deque()
        self.fills: list[tuple[int, int, list[int]]] = []
        self.log: list[tuple[str, int, int, int, int]] = []
        self.busy = False
        self.abandon = False

    async def process(self, ctx):
        cmd, wb, fill = self.core.state_cmd, self.core.m_axis_state, self.core.s_axis_state
        while True:
            if not self.ops:
                self.busy = False
                await ctx.tick()
                continue
            self.busy = True
            op, *args = self.ops.popleft()
            if op == "wait":
                while not args[0]():
                    await ctx.tick()
                continue
            bank, layer = args[0], args[1]
            ctx.set(cmd.payload, {"write": op == "write", "bank": bank, "layer": layer})
            ctx.set(cmd.valid, 1)
            await ctx.tick().until(cmd.ready)
            ctx.set(cmd.valid, 0)
            accepted = self.bench.cycle
            if op == "write":
                beats, idle = args[2], args[3]
                for j, beat in enumerate(beats):
                    ctx.set(wb.tdata, beat)
                    ctx.set(wb.tlast, j == len(beats) - 1)
                    ctx.set(wb.tvalid, 1)
                    while True:
                        _, _, ready = await ctx.tick().sample(wb.tready)
                        if ready or self.abandon:
                            break
                    ctx.set(wb.tvalid, 0)
                    if self.abandon:
                        break
                    for _ in range(idle if j < len(beats) - 1 else 0):
                        await ctx.tick()
            else:
                got, prev = [], None
                while len(got) < ROW_BEATS and not self.abandon:
                    ready = self.rng.random() < self.ready
                    ctx.set(fill.tready, ready)
                    _, _, valid, data_, last = await ctx.tick().sample(fill.tvalid, fill.tdata, fill.tlast)
                    if prev is not None:
                        assert valid and data_ == prev, "fill: valid dropped or payload changed before the transfer"
                    prev = data_ if valid and not ready else None
                    if valid and ready:
                        assert last == (len(got) == ROW_BEATS - 1), "fill: tlast not on the last beat only"
                        got.append(data_)
                ctx.set(fill.tready, 0)
                self.fills.append((bank, layer, got))
            self.log.append((op, bank, layer, accepted, self.bench.cycle))
            self.abandon = False


def port_log(dut, log: list):
    """A watcher appending ``(we, byte address, cycle)`` for every command the port takes."""
    word = len(dut.port.rdata.payload) // 8

    async def watch(ctx):
        cycle = 0
        async for _, _, valid, ready, we, addr in ctx.tick().sample(dut.port.cmd.valid, dut.port.cmd.ready,
                                                                    dut.port.cmd.payload.we,
                                                                    dut.port.cmd.payload.addr):
            cycle += 1
            if valid and ready:
                log.append((int(we), int(addr) * word, cycle))
    return watch


def state_bench(port_width: int, *, seed: int, image_beats: int = 160, cmd_stall: float = 0.1):
    """A ``state_in_dram`` board around :class:`StateTokenCore` with a random image of ``image_beats`` beats
    at ``IMAGE_BASE`` and a random 9 x 13 table at ``EMBED_BASE``: ``(bench, driver, image, table)``."""
    rng = np.random.default_rng(seed)
    table = rng.integers(-(1 << 31), 1 << 31, size=(9, 13), dtype=np.int64)
    image = rng.bytes(8 * image_beats)
    mem = blank_mem(seed)
    put_bytes(mem, EMBED_BASE, table.astype("<i4").tobytes())
    put_bytes(mem, IMAGE_BASE, image)
    core = StateTokenCore()
    dut = DRAMBoard(build=STATE_BUILD, addr_width=addr_width_for(port_width, ADDR_WIDTH), port_width=port_width,
                    clock_hz=CLOCK_HZ, byte_timeout=BYTE_TIMEOUT, core=core, dram_timeout=200)
    bench = Bench(dut, mem, seed=seed, cmd_stall=cmd_stall)
    return bench, StateDriver(bench, core, seed=seed + 1), image, table


def random_row(rng) -> list[int]:
    return [int(v) for v in rng.integers(0, 1 << 63, ROW_BEATS)]


def image_taken(core, counts: dict):
    """A watcher counting the beats the core takes on ``s_axis_w0`` into ``counts["w0"]``."""
    async def watch(ctx):
        async for _, _, valid, ready in ctx.tick().sample(core.s_axis_w0.tvalid, core.s_axis_w0.tready):
            counts["w0"] += bool(valid and ready)
    return watch


def test_state_geometry_and_ports_are_checked():
    """A state_in_dram board needs a core with the state ports and a DRAM that holds the state region; the
    region lies at the top of the DRAM."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(TypeError, match="state_cmd"):
            DRAMBoard(build=STATE_BUILD, addr_width=ADDR_WIDTH, clock_hz=CLOCK_HZ, core=TokenCore())
        with pytest.raises(ValueError, match="state"):   # 256 words of 16 bits: 512 bytes, the region is 512
            DRAMBoard(build=STATE_BUILD.replace(max_layers=3), addr_width=8, clock_hz=CLOCK_HZ,
                      core=StateTokenCore())
        assert STATE_BASE == DRAM_BYTES - GEO.region_bytes and STATE_BASE > EMBED_BASE
        gc.collect()


def test_state_rows_beside_a_token(port_width):
    """A token streams a 160-beat image while the stand-in core writes rows back and fills rows: each written
    row lands at StateGeometry's address, little-endian, and nothing else in the DRAM changes; a fill of an
    unwritten row returns the bytes there; a fill after a write of the same row returns what was written
    (also after an overwrite); image reads and state transfers interleave on the port and the image still
    comes back complete and in order. The last write-back, with slow beats, starts as the image's last beat
    enters the core and ends after the core's irq: the 't' reply comes only once its row is in DRAM. An image
    that reaches into the state region is refused (NO_IMAGE) without a read."""
    bench, drv, image, table = state_bench(port_width, seed=21)
    mem = bench.mem
    rng = np.random.default_rng(22)
    want = bytearray(mem.view(np.uint8).tobytes())
    rows = [random_row(rng) for _ in range(6)]
    fresh = row_in_mem(mem, 1, 0)                            # never written: the DRAM's bytes
    packet_beats = len(make_token_packet(table[4], position=3, logits=True)) // 8
    counts = {"w0": 0}
    log: list = []
    st = {}

    async def script(ctx, b):
        await configure(ctx, b, image, table)
        await b.put(ctx, lp.BoardReg.IMAGE_BASE, STATE_BASE - len(image) + 8)        # 8 bytes into the region
        assert await b.token(ctx, 4, 3, lp.TokenFlags.LOGITS) == lp.TokenStatus.NO_IMAGE
        assert b.model.reads == 0 and not b.packets
        await b.put(ctx, lp.BoardReg.IMAGE_BASE, IMAGE_BASE)
        start = counts["w0"]
        drv.ops.extend([
            ("wait", lambda: counts["w0"] >= start + packet_beats + 10),
            ("write", 0, 0, rows[0], 0), ("write", 1, 1, rows[1], 2), ("fill", 0, 0), ("fill", 1, 0),
            ("write", 0, 0, rows[2], 1), ("fill", 0, 0), ("write", 1, 0, rows[3], 0), ("fill", 1, 1),
            ("wait", lambda: counts["w0"] >= start + packet_beats + len(image) // 8 - 1),
            ("write", 0, 1, rows[4], 15),
        ])
        await b.send(ctx, cmd_token(4, 3, lp.TokenFlags.LOGITS))
        assert await b.reply(ctx, lp.REP_TOKEN, max_cycles=30_000) == b"\x00"
        st["reply"] = b.cycle
        assert not drv.ops and not drv.busy, "the reply came before the last state transfer"
        for (bank, layer), row in (((0, 0), rows[2]), ((1, 1), rows[1]), ((1, 0), rows[3]), ((0, 1), rows[4])):
            assert row_in_mem(mem, bank, layer) == row, (bank, layer)
        packet, img = await b.output(ctx, 2)
        assert packet == make_token_packet(table[4], position=3, logits=True) and img == image

    bench.run(script, drv.process, image_taken(drv.core, counts), port_log(bench.dut, log))
    assert [(bank, layer, beats) for bank, layer, beats in drv.fills] == [
        (0, 0, rows[0]), (1, 0, fresh), (0, 0, rows[2]), (1, 1, rows[1])]
    for bank, layer, row in ((0, 0, rows[2]), (1, 1, rows[1]), (1, 0, rows[3]), (0, 1, rows[4])):
        put_row(want, bank, layer, row)
    assert mem.view(np.uint8).tobytes() == bytes(want), "bytes outside the written rows changed"
    last = drv.log[-1]
    assert last[0] == "write" and last[4] < st["reply"]
    # the port: image reads before, between and after the state transfers, which are the rows' own
    image_reads = [k for k, (we, a, _) in enumerate(log) if not we and a < len(image)]
    state_cmds = [k for k, (_, a, _) in enumerate(log) if a >= STATE_BASE]
    assert state_cmds and image_reads[0] < state_cmds[0] < image_reads[-1]
    assert any(state_cmds[0] < k < state_cmds[-1] for k in image_reads), "no image read between the transfers"
    word = port_width // 8
    assert {a // GEO.row_stride * GEO.row_stride for k in state_cmds for a in [log[k][1]]} == \
        {row_address(bank, layer) // word * word for bank in (0, 1) for layer in (0, 1)}


def test_state_transfers_beside_loads_and_crcs(port_width):
    """No token: the stand-in core writes and fills rows (as an 'S' stream's core would) while the host runs
    'L' and 'C' commands; the writer serves one at a time and every byte lands where it belongs."""
    bench, drv, _, _ = state_bench(port_width, seed=31, cmd_stall=0.2)
    mem = bench.mem
    rng = np.random.default_rng(32)
    want = bytearray(mem.view(np.uint8).tobytes())
    rows = [random_row(rng) for _ in range(8)]
    loads = [(0x1000 + 0x200 * k, rng.bytes(8 * (40 + k))) for k in range(4)]

    async def script(ctx, b):
        drv.ops.extend([("write", k % 2, k // 2 % 2, rows[k], k % 3) for k in range(4)])
        drv.ops.extend([("fill", k % 2, k // 2 % 2) for k in range(4)])
        drv.ops.extend([("write", k % 2, k // 2 % 2, rows[k + 4], 0) for k in range(4)])
        for addr, data_ in loads:
            assert await b.load(ctx, addr, data_) == 0
            assert (await b.crc(ctx, addr, len(data_))) == (zlib.crc32(data_), 0)
        for _ in range(20_000):
            if not drv.ops and not drv.busy:
                break
            await ctx.tick()
        assert not drv.ops and not drv.busy
        assert await b.crc(ctx, STATE_BASE, GEO.region_bytes) == (zlib.crc32(
            bytes(mem.view(np.uint8)[STATE_BASE:STATE_BASE + GEO.region_bytes])), 0)

    bench.run(script, drv.process)
    assert [f[2] for f in drv.fills] == rows[:4]
    for k in range(4):
        put_row(want, k % 2, k // 2 % 2, rows[k + 4])
    for addr, data_ in loads:
        want[addr:addr + len(data_)] = data_
    assert mem.view(np.uint8).tobytes() == bytes(want)


def lose_state_reads(bench, after: int = 1):
    """A watcher: once the port has taken ``after`` reads of the state region, the model answers no more."""
    dut, word = bench.dut, len(bench.dut.port.rdata.payload) // 8

    async def watch(ctx):
        seen = 0
        async for _, _, valid, ready, we, addr in ctx.tick().sample(dut.port.cmd.valid, dut.port.cmd.ready,
                                                                    dut.port.cmd.payload.we,
                                                                    dut.port.cmd.payload.addr):
            if valid and ready and not we and int(addr) * word >= STATE_BASE:
                seen += 1
                if seen == after:
                    bench.model.lose_after = bench.model.reads
    return watch


def test_state_read_timeout_ends_the_token_then_reset(port_width):
    """A fill whose reads stop coming mid-token: the token ends with READ_TIMEOUT, READER_ERROR is set and the
    next 'T' is refused at once (READ_TIMEOUT, nothing read), while 'C' still reads (the image reader was
    aborted, the lost state reads given up); 'X' resets the state engine, and the next token's write and fill
    run."""
    bench, drv, image, table = state_bench(port_width, seed=41)
    rng = np.random.default_rng(42)
    row = random_row(rng)
    counts = {"w0": 0}

    async def script(ctx, b):
        await configure(ctx, b, image, table)
        drv.ops.extend([("wait", lambda: counts["w0"] >= 10), ("fill", 1, 1)])
        assert await b.token(ctx, 2, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.READ_TIMEOUT
        assert await b.get(ctx, lp.BoardReg.STATUS) & lp.BoardStatus.READER_ERROR
        drv.abandon = True                                  # the core's fill is cut short
        b.model.lose_after = None
        reads = b.model.reads
        assert await b.token(ctx, 2, 0) == lp.TokenStatus.READ_TIMEOUT
        assert b.model.reads == reads
        assert await b.crc(ctx, IMAGE_BASE, len(image)) == (zlib.crc32(image), 0)
        assert await b.command(ctx, bytes([lp.OP_RESET]), lp.REP_RESET) == b""
        b.words, b.packets = [], []                         # the host drops what came before 'x'
        assert not await b.get(ctx, lp.BoardReg.STATUS) & lp.BoardStatus.READER_ERROR
        drv.ops.extend([("wait", lambda: counts["w0"] >= 10), ("write", 1, 1, row, 0), ("fill", 1, 1)])
        counts["w0"] = 0
        assert await b.token(ctx, 3, 1, lp.TokenFlags.LOGITS) == 0
        assert await b.output(ctx, 2) == [make_token_packet(table[3], position=1, logits=True), image]

    bench.run(script, drv.process, image_taken(drv.core, counts), lose_state_reads(bench))
    assert len(drv.fills) == 2 and len(drv.fills[0][2]) < ROW_BEATS and drv.fills[1] == (1, 1, row)
    assert row_in_mem(bench.mem, 1, 1) == row


def test_state_write_timeout_ends_the_token_then_reset(port_width):
    """A write-back the controller never takes: the token ends with READ_TIMEOUT after dram_timeout cycles
    without progress (the core's remaining beats never taken); 'X' frees the writer and the state engine,
    and the next token's write-back lands."""
    bench, drv, image, table = state_bench(port_width, seed=51, cmd_stall=0.0)
    rng = np.random.default_rng(52)
    row = random_row(rng)
    counts = {"w0": 0}

    def stall():
        bench.model.cmd_stall = 1.0
        return True

    async def script(ctx, b):
        await configure(ctx, b, image, table)
        drv.ops.extend([("wait", lambda: counts["w0"] >= 10), ("wait", stall), ("write", 0, 1, row, 0)])
        assert await b.token(ctx, 2, 0, lp.TokenFlags.LOGITS) == lp.TokenStatus.READ_TIMEOUT
        drv.abandon = True
        b.model.cmd_stall = 0.0
        assert await b.command(ctx, bytes([lp.OP_RESET]), lp.REP_RESET) == b""
        b.words, b.packets = [], []
        drv.ops.extend([("wait", lambda: counts["w0"] >= 10), ("write", 0, 1, row, 0)])
        counts["w0"] = 0
        assert await b.token(ctx, 3, 1, lp.TokenFlags.LOGITS) == 0
        assert await b.output(ctx, 2) == [make_token_packet(table[3], position=1, logits=True), image]
        assert row_in_mem(b.mem, 0, 1) == row

    bench.run(script, drv.process, image_taken(drv.core, counts))


@pytest.mark.slow
def test_tokens_with_the_state_in_dram_bit_exact(port_width):
    """The real core built with ``state_in_dram`` on the board: three tokens from DRAM (with and without
    LOGITS; the state carried through the board's DRAM, each layer's row written back and filled again)
    bit-exact with the golden device, and the state region then holds the golden device's committed states
    where StateGeometry puts them (int32, little-endian: as the host reads them): token 1's in bank 0, token
    2's in bank 1."""
    image, table = tiny_model()
    gold = GoldenMachine(image)
    state = gold.init_state()
    steps = [(5, 0, lp.TokenFlags.LOGITS), (17, 1, 0), (60, 2, lp.TokenFlags.LOGITS)]
    expected, states = [], []
    for token, pos, flags in steps:
        res = gold.run_token(make_token_packet(table[token], position=pos, logits=bool(flags)), state)
        state = res.state
        states.append(state)
        expected.append(res.output if flags else summary(res.output))
    bases = BASES[port_width]
    mem = model_mem(image, table, bases)
    dut = DRAMBoard(build=STATE_BUILD, addr_width=addr_width_for(port_width, ADDR_WIDTH), port_width=port_width,
                    clock_hz=CLOCK_HZ, byte_timeout=BYTE_TIMEOUT)
    bench = Bench(dut, mem, cmd_stall=0.1)

    async def script(ctx, b):
        await configure(ctx, b, image, table, bases=bases)
        for step in steps:
            assert await b.token(ctx, *step) == 0
        assert await b.output(ctx, len(steps)) == expected

    bench.run(script)
    hidden = TINY.hidden_size
    for bank, st in ((0, states[1]), (1, states[2])):
        for layer in range(TINY.num_hidden_layers):
            row = np.frombuffer(mem_bytes(mem, row_address(bank, layer), 4 * hidden), dtype="<i4")
            assert np.array_equal(row, st[layer]), (bank, layer)
