"""Banked on-chip vector buffer: one element or an aligned group of elements per cycle, either way.

The accelerator's vectors are written and read at different widths: the epilogue writes and reads one
element per cycle, the quantize prologue reads ``quant_lanes`` consecutive elements per cycle, and the
sequencer writes a constant vector a whole bus beat (``bus_bits / 32`` elements) per cycle. Element
``e`` lives in bank ``e % banks`` at row ``e // banks``; with ``banks`` a power of two at least as large as
every group width, an aligned group of ``g`` elements occupies ``g`` distinct banks of one row, so
each bank needs one write port and two read ports (narrow and wide), as a block RAM provides.
"""

from amaranth.hdl import Const, Module, Signal, signed
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2

__all__ = ["VectorBuffer"]

INT32 = signed(32)


def _pow2(name: str, v: int) -> None:
    if not isinstance(v, int) or v < 1 or v & (v - 1):
        raise ValueError(f"{name} must be a power of two >= 1, got {v!r}")


class VectorBuffer(wiring.Component):
    """A vector of int32 elements in ``banks`` memories.

    Parameters
    ----------
    depth : int
        Elements (capacity).
    banks : int
        Power of two, >= ``write_group`` and ``read_group``.
    write_group : int or None
        Elements written at once by ``wr_wide`` (power of two; 1 is a port of one element); None: no ``wr_wide``.
    read_group : int or None
        Elements read at once by ``rd_wide`` (power of two; 1 is a port of one element, as a one-lane quantizer
        reads); None: no ``rd_wide``.

    Attributes
    ----------
    wr : WritePort.Signature(addr = element index, data int32)
        One element per cycle (priority over ``wr_wide``).
    rd : ReadPort.Signature(addr = element index, data int32)
        One element, one cycle after ``addr`` (sync read, ``en`` honoured).
    wr_wide : WritePort.Signature(addr = group index, data ArrayLayout(int32, write_group))
        Only with a ``write_group``.
    rd_wide : ReadPort.Signature(addr = group index, data ArrayLayout(int32, read_group))
        Only with a ``read_group``; its own read port on every bank (``rd``'s are separate).

    Raises
    ------
    ValueError
        A non-positive ``depth``; ``banks`` or a group not a power of two; ``banks`` below a group.
    """

    #: Cycles from a read's ``addr``/``en`` (on ``rd`` or ``rd_wide``) to its ``data``
    READ_LATENCY = 1

    @staticmethod
    def addr_width_for(depth: int, group: int = 1) -> int:
        """Address width of a port reading or writing ``group`` elements at once in a buffer of ``depth``
        elements, without an instance: ``ceil(log2(max(ceil(depth / group), 2)))`` (``rd``/``wr``: group 1,
        the element index; ``rd_wide``/``wr_wide``: the group index)."""
        return ceil_log2(max(-(-depth // group), 2))

    def __init__(self, *, depth: int, banks: int, write_group: int | None = None, read_group: int | None = None):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        for name, v in (("banks", banks), ("write_group", write_group), ("read_group", read_group)):
            if v is not None:
                _pow2(name, v)
        if banks < max(write_group or 1, read_group or 1):
            raise ValueError(f"banks ({banks}) must be >= write_group ({write_group}) and read_group ({read_group})")
        self._depth, self._banks, self._wg, self._rg = depth, banks, write_group, read_group
        self._rows = -(-depth // banks)
        aw = self.addr_width_for(depth)
        ports = {"wr": Out(memory.WritePort.Signature(addr_width=aw, shape=INT32)),
                 "rd": Out(memory.ReadPort.Signature(addr_width=aw, shape=INT32))}
        if write_group is not None:
            ports["wr_wide"] = Out(memory.WritePort.Signature(addr_width=self.addr_width_for(depth, write_group),
                                                              shape=data.ArrayLayout(INT32, write_group)))
        if read_group is not None:
            ports["rd_wide"] = Out(memory.ReadPort.Signature(addr_width=self.addr_width_for(depth, read_group),
                                                             shape=data.ArrayLayout(INT32, read_group)))
        super().__init__(ports)

    depth = property(lambda self: self._depth)
    banks = property(lambda self: self._banks)

    @property
    def addr_width(self) -> int:
        """Width of ``rd.addr`` and ``wr.addr`` (an element index): :meth:`addr_width_for` ``(depth)``."""
        return self.addr_width_for(self._depth)

    def elaborate(self, platform):
        m = Module()
        b, wg, rg = self._banks, self._wg, self._rg
        lb = ceil_log2(b)
        mems = []
        for k in range(b):
            mem = memory.Memory(shape=INT32, depth=self._rows, init=[])
            m.submodules[f"bank{k}"] = mem
            mems.append(mem)
        # one write port per bank: the narrow write wins over the wide one
        for k, mem in enumerate(mems):
            w = mem.write_port()
            narrow = self.wr.en & (self.wr.addr[:lb] == k) if lb else self.wr.en
            with m.If(narrow):
                m.d.comb += [w.addr.eq(self.wr.addr >> lb), w.data.eq(self.wr.data), w.en.eq(1)]
            if wg is not None:
                lwg, lane = ceil_log2(wg), k % wg
                wide_first = self.wr_wide.addr << lwg          # element index of the group's first element
                wide = self.wr_wide.en & ((wide_first[:lb] == (k - lane)) if lb > lwg else Const(1))
                with m.Elif(wide):
                    m.d.comb += [w.addr.eq(wide_first >> lb), w.data.eq(self.wr_wide.data[lane]), w.en.eq(1)]
        # narrow read: bank select registered with the read
        sel = Signal(max(lb, 1))
        with m.If(self.rd.en):
            m.d.sync += sel.eq(self.rd.addr[:lb] if lb else 0)
        rdata = []
        for mem in mems:
            r = mem.read_port()
            m.d.comb += [r.addr.eq(self.rd.addr >> lb), r.en.eq(self.rd.en)]
            rdata.append(r.data)
        with m.Switch(sel):
            for k in range(b):
                with m.Case(k):
                    m.d.comb += self.rd.data.eq(rdata[k])
        # wide read: an aligned group of rg elements of one row
        if rg is not None:
            lrg = ceil_log2(rg)
            gsel = Signal(max(lb - lrg, 1))
            first = self.rd_wide.addr << lrg
            row = first >> lb
            with m.If(self.rd_wide.en):
                m.d.sync += gsel.eq(first[lrg:lb] if lb > lrg else 0)
            wdata = []
            for mem in mems:
                r = mem.read_port()
                m.d.comb += [r.addr.eq(row), r.en.eq(self.rd_wide.en)]
                wdata.append(r.data)
            groups = b // rg
            with m.Switch(gsel):
                for g in range(groups):
                    with m.Case(g):
                        m.d.comb += [self.rd_wide.data[j].eq(wdata[g * rg + j]) for j in range(rg)]
        return m
