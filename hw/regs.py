"""AXI4-Lite register block of the accelerator: ID block, control, status and counters.

The map is :data:`hw.isa.REGISTER_MAP` (32-bit registers, byte addresses, relative to the platform's
base, :func:`hw.isa.register_base`). AXI4-Lite per ARM IHI 0022E, chapter B1: independent read and
write channels, one outstanding transaction each, ``OKAY`` responses (unmapped reads return 0; writes
other than to ``CTRL`` are ignored).

``CTRL`` (write) holds :class:`hw.isa.Ctrl`: ``CLEAR`` (leave the error state, wait for the next token packet)
and ``ABORT`` (stop the token in flight with ``ErrorCause.ABORTED``), one-cycle strobes; other bits are
ignored and ``CTRL`` reads as 0. ``STATUS`` (read) holds :class:`hw.isa.Status`: ``BUSY``, ``DONE``, ``ERROR``.
"""

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.isa import REGISTER_MAP, Counter, Ctrl, Status

__all__ = ["AXI4LiteSignature", "HostSignature", "CountersSignature", "RegisterBlock"]


class AXI4LiteSignature(wiring.Signature):
    """AXI4-Lite, subordinate (slave) view, with the flat AMBA member names (``awaddr``, ``wdata``, ...)
    that cocotbext-axi's ``AxiLiteBus.from_prefix`` finds."""

    def __init__(self, *, addr_width: int = 8, data_width: int = 32):
        if addr_width < 2:
            raise ValueError(f"addr_width must be >= 2, got {addr_width}")
        if data_width not in (32, 64):
            raise ValueError(f"data_width must be 32 or 64, got {data_width}")
        super().__init__({
            "awaddr": In(addr_width), "awprot": In(3), "awvalid": In(1), "awready": Out(1),
            "wdata": In(data_width), "wstrb": In(data_width // 8), "wvalid": In(1), "wready": Out(1),
            "bresp": Out(2), "bvalid": Out(1), "bready": In(1),
            "araddr": In(addr_width), "arprot": In(3), "arvalid": In(1), "arready": Out(1),
            "rdata": Out(data_width), "rresp": Out(2), "rvalid": Out(1), "rready": In(1),
        })


class HostSignature(wiring.Signature):
    """The core's status and control registers, from the core's side: ``busy``, ``done``, ``error`` Out(1)
    (:class:`hw.isa.Status`), ``error_cause`` Out(8), ``error_where`` Out(32), ``position`` Out(32);
    ``clear``, ``abort`` In(1): one-cycle strobes from ``CTRL`` (:class:`hw.isa.Ctrl`)."""

    def __init__(self):
        super().__init__({"busy": Out(1), "done": Out(1), "error": Out(1), "error_cause": Out(8),
                          "error_where": Out(32), "position": Out(32), "clear": In(1), "abort": In(1)})


class CountersSignature(wiring.Signature):
    """Every counter's value: one Out(64) per :class:`hw.isa.Counter`, by its lower-case name."""

    def __init__(self):
        super().__init__({c.name.lower(): Out(64) for c in Counter})


class RegisterBlock(wiring.Component):
    """The core's AXI4-Lite registers.

    Parameters
    ----------
    id_values : dict[int, int]
        ID-block register values by offset (:func:`hw.isa.id_block_values`).
    addr_width : int
        Byte-address bits of the AXI4-Lite port (8 covers ``REGISTER_MAP.SIZE`` = 0x100).

    Attributes
    ----------
    axil : AXI4LiteSignature
    host : In(HostSignature())
        ``STATUS`` (``busy``, ``done``, ``error``), ``ERROR_CAUSE``, ``ERROR_WHERE``, ``POSITION``; ``clear``,
        ``abort``: one-cycle strobes from ``CTRL`` writes (:class:`hw.isa.Ctrl` ``CLEAR``, ``ABORT``).
    argmax : In(32)
    counters : In(CountersSignature())
        ``COUNTERS`` (low word, then high word).
    """

    def __init__(self, *, id_values: dict, addr_width: int = 8):
        if not isinstance(id_values, dict) or not id_values:
            raise TypeError(f"id_values must be a non-empty dict of offset -> value, got {id_values!r}")
        for off, val in id_values.items():
            if off % 4 or not 0 <= off < REGISTER_MAP.CTRL:
                raise ValueError(f"ID register offset 0x{off:x} is not a word in the ID block")
            if not 0 <= val < 1 << 32:
                raise ValueError(f"ID register 0x{off:x} value {val} does not fit 32 bits")
        if (1 << addr_width) < REGISTER_MAP.SIZE:
            raise ValueError(f"addr_width {addr_width} cannot address the 0x{REGISTER_MAP.SIZE:x}-byte map")
        self._id_values = dict(id_values)
        self._addr_width = addr_width
        members = {
            "axil": Out(AXI4LiteSignature(addr_width=addr_width)),  # subordinate view: not flipped
            "host": In(HostSignature()), "argmax": In(32), "counters": In(CountersSignature()),
        }
        super().__init__(members)

    @property
    def id_values(self) -> dict:
        return dict(self._id_values)

    def elaborate(self, platform):
        m = Module()
        r = REGISTER_MAP
        bus, host = self.axil, self.host

        # ---- read channel: accept an address, answer one cycle later, hold until rready
        rvalid = Signal()
        rdata = Signal(32)
        m.d.comb += [bus.arready.eq(~rvalid), bus.rvalid.eq(rvalid), bus.rdata.eq(rdata), bus.rresp.eq(0)]
        word = Signal(32)
        addr = Signal(self._addr_width)
        m.d.comb += addr.eq(bus.araddr & ~Const(3, self._addr_width))
        with m.Switch(addr):
            for off, val in self._id_values.items():
                with m.Case(off):
                    m.d.comb += word.eq(val)
            with m.Case(r.STATUS):
                status = Signal(Status)
                m.d.comb += [status.eq(Mux(host.busy, Status.BUSY, 0) | Mux(host.done, Status.DONE, 0)
                                       | Mux(host.error, Status.ERROR, 0)),
                             word.eq(status.as_value())]
            with m.Case(r.ERROR_CAUSE):
                m.d.comb += word.eq(host.error_cause)
            with m.Case(r.ERROR_WHERE):
                m.d.comb += word.eq(host.error_where)
            with m.Case(r.POSITION):
                m.d.comb += word.eq(host.position)
            with m.Case(r.ARGMAX):
                m.d.comb += word.eq(self.argmax)
            for c in Counter:
                value = getattr(self.counters, c.name.lower())
                with m.Case(r.counter(c)):
                    m.d.comb += word.eq(value[:32])
                with m.Case(r.counter(c) + 4):
                    m.d.comb += word.eq(value[32:])
            with m.Default():
                m.d.comb += word.eq(0)
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += [rvalid.eq(1), rdata.eq(word)]
        with m.Elif(rvalid & bus.rready):
            m.d.sync += rvalid.eq(0)

        # ---- write channel: take address and data (in either order), respond, strobe CTRL
        aw_ok, w_ok, bvalid = Signal(), Signal(), Signal()
        awaddr = Signal(self._addr_width)
        wdata = Signal(32)
        m.d.comb += [bus.awready.eq(~aw_ok & ~bvalid), bus.wready.eq(~w_ok & ~bvalid),
                     bus.bvalid.eq(bvalid), bus.bresp.eq(0)]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [aw_ok.eq(1), awaddr.eq(bus.awaddr)]
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += [w_ok.eq(1), wdata.eq(bus.wdata)]
        m.d.sync += [host.clear.eq(0), host.abort.eq(0)]
        with m.If(aw_ok & w_ok & ~bvalid):
            m.d.sync += [bvalid.eq(1), aw_ok.eq(0), w_ok.eq(0)]
            with m.If((awaddr & ~Const(3, self._addr_width)) == r.CTRL):
                ctrl = Ctrl(wdata)
                m.d.sync += [host.clear.eq((ctrl & Ctrl.CLEAR).as_value().any()),
                             host.abort.eq((ctrl & Ctrl.ABORT).as_value().any())]
        with m.If(bvalid & bus.bready):
            m.d.sync += bvalid.eq(0)
        return m
