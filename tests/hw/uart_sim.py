"""A serial port backed by the UART link's gateware in the Amaranth simulator (for the link and device tests).

:class:`SimSerial` has the pyserial subset :class:`host.devices.ecp5.UartLink` uses (``read``, ``write``,
``reset_input_buffer``, ``close``, ``timeout``); bytes written are driven onto ``rx`` bit by bit, ``tx``
is sampled at mid-bit, so every transaction crosses the real UART, FIFO, parser and framer. The link is
the boards' :class:`hw.boards.ecp5.LinkedCore` (with its stream FIFOs and registered core reset); behind it
sits the core's real :class:`hw.regs.RegisterBlock` and, on the stream, a loopback that returns each
64-bit beat as two 32-bit output words (low word first, ``tlast`` on the second when the beat had it).
"""

from collections import deque

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped
from amaranth.sim import Simulator

from hw import isa
from hw.boards.ecp5 import LinkedCore
from hw.regs import AXI4LiteSignature, RegisterBlock
from hw.top import AXIStreamSignature

DIVISOR = 4                 # clock cycles per bit in the simulation
PERIOD = 1e-6               # simulated clock period, seconds
ID_VALUES = isa.id_block_values(lanes=32, channels=1, bus_bits=64, packings=[isa.TritPacking.BASE3], quant_lanes=8,
                                max_hidden=324, max_intermediate=868, max_layers=8)


async def _ticks(ctx, n: int) -> None:
    # plain awaits, not ``tick().repeat()``: a simulator dropped mid-wait must not leave an async
    # generator to be closed at garbage collection
    for _ in range(n):
        await ctx.tick()


class LoopbackCore(wiring.Component):
    """A stand-in for the core: its real :class:`hw.regs.RegisterBlock` (``STATUS.done`` is set by a
    ``CTRL.clear`` write) and a stream loopback returning each 64-bit beat as two 32-bit words."""

    s_axil: Out(AXI4LiteSignature(addr_width=8))        # the same members as hw.top.Accelerator's
    s_axis_w0: In(AXIStreamSignature(64))
    m_axis_out: Out(AXIStreamSignature(32))
    irq: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.regs = regs = RegisterBlock(id_values=ID_VALUES)
        connect(m, flipped(self.s_axil), regs.axil)
        done = Signal()
        with m.If(regs.host.clear):
            m.d.sync += done.eq(1)
        m.d.comb += [regs.host.done.eq(done), self.irq.eq(done)]
        # loopback: beat -> two words
        hold = Signal(64)
        hold_last = Signal()
        half = Signal(2)            # 0 empty, 2 words to send, 1 word left
        w, o = self.s_axis_w0, self.m_axis_out
        m.d.comb += w.tready.eq(half == 0)
        with m.If(w.tvalid & w.tready):
            m.d.sync += [hold.eq(w.tdata), hold_last.eq(w.tlast), half.eq(2)]
        m.d.comb += [o.tvalid.eq(half != 0), o.tdata.eq(hold.word_select(half == 1, 32)),
                     o.tlast.eq((half == 1) & hold_last)]
        with m.If(o.tvalid & o.tready):
            m.d.sync += half.eq(half - 1)
        return m


def link_harness(*, fifo_depth: int = 64, byte_timeout: int = 4000) -> LinkedCore:
    """The board's :class:`hw.boards.ecp5.LinkedCore` (link, stream FIFOs, registered core reset) around a
    :class:`LoopbackCore`."""
    return LinkedCore(LoopbackCore(), divisor=DIVISOR, fifo_depth=fifo_depth, byte_timeout=byte_timeout)


class SimSerial:
    """The pyserial subset over the simulated link; ``timeout`` is in (wall) seconds as for pyserial, and
    each ``read`` simulates at most ``cycles_per_read`` cycles."""

    def __init__(self, harness: LinkedCore | None = None, *, cycles_per_read: int = 3000):
        self.h = harness or link_harness()
        self.timeout = 1.0
        self.cycles_per_read = cycles_per_read
        self.to_board: deque[int] = deque()
        self.from_board: deque[int] = deque()
        self.framing_errors = 0
        self.sim = Simulator(self.h)
        self.sim.add_clock(PERIOD)
        self.sim.add_testbench(self._drive_rx, background=True)
        self.sim.add_testbench(self._sample_tx, background=True)
        self.now = 0.0
        self.closed = False

    async def _drive_rx(self, ctx):
        rx = self.h.rx
        ctx.set(rx, 1)
        while True:
            if not self.to_board:
                await ctx.tick()
                continue
            b = self.to_board.popleft()
            for bit in [0, *((b >> i) & 1 for i in range(8)), 1]:
                ctx.set(rx, bit)
                await _ticks(ctx, DIVISOR)

    async def _sample_tx(self, ctx):
        tx = self.h.tx
        while True:
            await ctx.tick()
            if ctx.get(tx):
                continue
            await _ticks(ctx, DIVISOR // 2)       # middle of the start bit
            byte = 0
            for i in range(8):
                await _ticks(ctx, DIVISOR)
                byte |= ctx.get(tx) << i
            await _ticks(ctx, DIVISOR)
            if not ctx.get(tx):
                self.framing_errors += 1
            self.from_board.append(byte)

    def run(self, cycles: int) -> None:
        self.now += cycles * PERIOD
        self.sim.run_until(self.now)

    # ---- pyserial subset
    def write(self, data: bytes) -> int:
        assert not self.closed
        self.to_board.extend(data)
        return len(data)

    def read(self, n: int) -> bytes:
        assert not self.closed
        spent = 0
        while len(self.from_board) < n and spent < self.cycles_per_read:
            self.run(100)
            spent += 100
        k = min(n, len(self.from_board))
        return bytes(self.from_board.popleft() for _ in range(k))

    def reset_input_buffer(self) -> None:
        self.from_board.clear()

    def close(self) -> None:
        self.closed = True
