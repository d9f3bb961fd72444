"""The control logic of :class:`hw.dram.LiteDRAMCore` beside the generated core: the DRAM power-up
sequencer, the arbitration of the core's control bus, and the user-port gate.

A LiteDRAM core generated without a CPU leaves its DFI injector in hardware control with the DRAM
uninitialised and ``init_done`` low; LiteX's BIOS (``sdram_init`` in ``liblitedram/sdram.c``) would bring it
up. :class:`DFIIInitSequencer` plays the same writes (:func:`hw.dram.init_writes`) on the core's ``wb_ctrl``
bus (Wishbone B4 classic, 32-bit data, word addresses) from a small ROM, waiting each write's delay after its
acknowledge. :class:`DRAMControl` puts it in front of the bus and hands the bus to the host once it is done
(read leveling and memory tests over :class:`WishboneSignature`), and can hold the user port until the host
says the DRAM is calibrated.
"""

from __future__ import annotations

from collections.abc import Sequence

from amaranth.hdl import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["WishboneSignature", "WishboneWriteSignature", "DFIIInitSequencer", "DRAMControl"]


class WishboneSignature(wiring.Signature):
    """A Wishbone B4 classic manager with 32-bit data and all byte lanes selected (``sel`` = 0b1111, no burst
    tags), as LiteX's ``wishbone.Interface`` in a generated core's ``wb_ctrl`` expects it.

    Members
    -------
    adr : Out(30)
        Word address (byte address >> 2).
    dat_w : Out(32)
        Write data (``we`` = 1).
    dat_r : In(32)
        Read data, valid in the cycle ``ack`` is high (``we`` = 0).
    we : Out(1)
        1: write, 0: read.
    cyc, stb : Out(1)
        Held high from the start of a transfer to its ``ack`` (one transfer per ``cyc & stb & ack``).
    ack : In(1)
        The subordinate completes the transfer.
    """

    def __init__(self):
        super().__init__({"adr": Out(30), "dat_w": Out(32), "dat_r": In(32), "we": Out(1), "cyc": Out(1),
                          "stb": Out(1), "ack": In(1)})

    def __eq__(self, other):
        return type(other) is WishboneSignature

    def __hash__(self):
        return hash(WishboneSignature)

    def __repr__(self):
        return "WishboneSignature()"


class WishboneWriteSignature(wiring.Signature):
    """The write-only subset of a Wishbone B4 classic manager with 32-bit data and all byte lanes selected:
    ``adr`` (30-bit word address = byte address >> 2), ``dat_w`` (32), ``cyc``, ``stb`` (out), ``ack`` (in).
    The subordinate is written when ``cyc & stb & ack``."""

    def __init__(self):
        super().__init__({"adr": Out(30), "dat_w": Out(32), "cyc": Out(1), "stb": Out(1), "ack": In(1)})


class DFIIInitSequencer(wiring.Component):
    """Performs ``writes`` on ``bus`` once after reset, then raises ``done``.

    Parameters
    ----------
    writes : sequence of (int, int, int)
        ``(byte address, 32-bit value, cycles to wait after the acknowledge)``; byte addresses must be
        multiples of 4 and below 2**32, delays >= 0.
    timeout : int, >= 1
        Cycles a write may wait for ``ack``; past it the sequencer stops with ``error`` (sticky until reset).

    Members
    -------
    bus : Out(WishboneWriteSignature())
    done : Out(1)
        Every write acknowledged and its delay waited (sticky until reset).
    error : Out(1)
        A write timed out.

    Raises
    ------
    TypeError, ValueError
        If ``writes`` is empty or malformed, or ``timeout`` is not an int >= 1.
    """

    def __init__(self, *, writes: Sequence, timeout: int = 1024):
        if isinstance(timeout, bool) or not isinstance(timeout, int):
            raise TypeError(f"timeout must be an int, not {timeout!r}")
        if timeout < 1:
            raise ValueError(f"timeout must be >= 1, got {timeout}")
        rows = [tuple(w) for w in writes]
        if not rows:
            raise ValueError("writes must not be empty")
        for a, v, d in rows:
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a, v, d)):
                raise TypeError(f"a write is (int, int, int), got {(a, v, d)!r}")
            if a % 4 or not 0 <= a < 2**32 or not 0 <= v < 2**32 or d < 0:
                raise ValueError(f"bad write (byte address {a:#x}, value {v:#x}, delay {d})")
        self._rows, self._timeout = tuple(rows), timeout
        super().__init__({"bus": Out(WishboneWriteSignature()), "done": Out(1), "error": Out(1)})

    @property
    def writes(self) -> tuple:
        return self._rows

    def elaborate(self, platform):
        m = Module()
        max_delay = max(max(d for _, _, d in self._rows), self._timeout)
        layout = data.StructLayout({"adr": 30, "dat": 32, "delay": range(max_delay + 1)})
        m.submodules.rom = rom = Memory(shape=layout, depth=len(self._rows),
                                        init=[{"adr": a >> 2, "dat": v, "delay": d} for a, v, d in self._rows])
        rd = rom.read_port(domain="comb")
        index = Signal(range(len(self._rows)))
        count = Signal(range(max_delay + 1))
        m.d.comb += [rd.addr.eq(index), self.bus.adr.eq(rd.data.adr), self.bus.dat_w.eq(rd.data.dat)]

        with m.FSM():
            with m.State("WRITE"):
                m.d.comb += [self.bus.cyc.eq(1), self.bus.stb.eq(1)]
                m.d.sync += count.eq(count + 1)
                with m.If(self.bus.ack):
                    m.d.sync += count.eq(rd.data.delay)
                    m.next = "WAIT"
                with m.Elif(count == self._timeout - 1):
                    m.next = "ERROR"
            with m.State("WAIT"):
                m.d.sync += count.eq(count - 1)
                with m.If(count == 0):
                    m.d.sync += count.eq(0)
                    with m.If(index == len(self._rows) - 1):
                        m.next = "DONE"
                    with m.Else():
                        m.d.sync += index.eq(index + 1)
                        m.next = "WRITE"
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
            with m.State("ERROR"):
                m.d.comb += self.error.eq(1)
        return m


class DRAMControl(wiring.Component):
    """The power-up sequencer, the control-bus arbiter and the user-port gate of :class:`hw.dram.LiteDRAMCore`,
    all in one clock domain (``sync``: the controller clock).

    The control bus ``bus`` (the generated core's ``wb_ctrl``) belongs to :class:`DFIIInitSequencer` from reset
    until it is ``done`` or in ``error``, then to the host's ``ctrl`` for good: its address, data, ``we``,
    ``cyc`` and ``stb`` go to ``bus`` and ``bus``'s ``dat_r`` and ``ack`` come back. While the sequencer owns
    the bus, ``ctrl``'s requests do not reach it and ``ctrl.ack`` stays low (a host transfer waits, it is not
    lost). The sequencer's bus is idle in ``done`` and ``error``, so the hand-over never splits a transfer.

    ``port`` (the user's native port) is passed to ``core_port`` (the generated core's) unchanged, except that
    with ``hold_port`` its commands are gated by ``port_enable``: while ``port_enable`` is low, ``core_port``
    sees no ``cmd.valid`` and ``port`` no ``cmd.ready``. Write data (``wdata.ready``) and read data
    (``rdata``) are never gated, so commands accepted before ``port_enable`` falls complete.

    Parameters
    ----------
    writes, timeout
        As :class:`DFIIInitSequencer` (the power-up writes, cycles a write may wait for ``ack``).
    addr_width, data_width : int
        The native port's widths (:class:`hw.dram.NativePortSignature`).
    hold_port : bool
        False (default): ``port`` is ``core_port`` and ``port_enable`` is ignored. True: commands pass only
        while ``port_enable`` is high.

    Members
    -------
    ctrl : In(WishboneSignature())
        The host's access to ``bus`` once the sequencer is done or in error.
    bus : Out(WishboneSignature())
        To the generated core's ``wb_ctrl``.
    port : In(NativePortSignature(addr_width, data_width))
        The user's native port.
    core_port : Out(NativePortSignature(addr_width, data_width))
        To the generated core's user port.
    port_enable : In(1)
        With ``hold_port``: let commands through (a level, e.g. a host "calibrated" register).
    done, error : Out(1)
        The sequencer's ``done`` and ``error`` (sticky until reset).

    Raises
    ------
    TypeError, ValueError
        As :class:`DFIIInitSequencer` and :class:`hw.dram.NativePortSignature`; ``TypeError`` if ``hold_port``
        is not a bool.
    """

    def __init__(self, *, writes: Sequence, addr_width: int, data_width: int, timeout: int = 1024,
                 hold_port: bool = False):
        from hw.dram import NativePortSignature

        if not isinstance(hold_port, bool):
            raise TypeError(f"hold_port must be a bool, not {hold_port!r}")
        self._seq = DFIIInitSequencer(writes=writes, timeout=timeout)
        self._hold = hold_port
        port = NativePortSignature(addr_width=addr_width, data_width=data_width)
        super().__init__({"ctrl": In(WishboneSignature()), "bus": Out(WishboneSignature()), "port": In(port),
                          "core_port": Out(port), "port_enable": In(1), "done": Out(1), "error": Out(1)})

    @property
    def hold_port(self) -> bool:
        return self._hold

    def elaborate(self, platform):
        m = Module()
        m.submodules.sequencer = seq = self._seq
        host = Signal()   # the host owns the bus
        m.d.comb += [host.eq(seq.done | seq.error), self.done.eq(seq.done), self.error.eq(seq.error),
                     self.ctrl.dat_r.eq(self.bus.dat_r)]
        with m.If(host):
            m.d.comb += [self.bus.adr.eq(self.ctrl.adr), self.bus.dat_w.eq(self.ctrl.dat_w),
                         self.bus.we.eq(self.ctrl.we), self.bus.cyc.eq(self.ctrl.cyc),
                         self.bus.stb.eq(self.ctrl.stb), self.ctrl.ack.eq(self.bus.ack)]
        with m.Else():
            m.d.comb += [self.bus.adr.eq(seq.bus.adr), self.bus.dat_w.eq(seq.bus.dat_w), self.bus.we.eq(1),
                         self.bus.cyc.eq(seq.bus.cyc), self.bus.stb.eq(seq.bus.stb), seq.bus.ack.eq(self.bus.ack)]

        port, core = self.port, self.core_port
        enable = self.port_enable if self._hold else 1
        m.d.comb += [
            core.cmd.valid.eq(port.cmd.valid & enable), port.cmd.ready.eq(core.cmd.ready & enable),
            core.cmd.payload.eq(port.cmd.payload),
            core.wdata.payload.eq(port.wdata.payload), port.wdata.ready.eq(core.wdata.ready),
            port.rdata.valid.eq(core.rdata.valid), port.rdata.payload.eq(core.rdata.payload),
        ]
        return m
