"""The DRAM power-up sequencer of :class:`hw.dram.LiteDRAMCore`: a fixed list of Wishbone writes.

A LiteDRAM core generated without a CPU leaves its DFI injector in hardware control with the DRAM
uninitialised and ``init_done`` low; LiteX's BIOS (``sdram_init`` in ``liblitedram/sdram.c``) would bring it
up. This component plays the same writes (:func:`hw.dram.init_writes`) on the core's ``wb_ctrl`` bus
(Wishbone B4 classic, 32-bit data, word addresses) from a small ROM, waiting each write's delay after its
acknowledge.
"""

from __future__ import annotations

from collections.abc import Sequence

from amaranth.hdl import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["WishboneWriteSignature", "DFIIInitSequencer"]


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
