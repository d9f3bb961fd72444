"""The core as the Xilinx block designs see it: register offset per platform and a soft reset.

:class:`XilinxShell` wraps :class:`hw.top.Accelerator` for the Vivado block designs of the PYNQ boards
(``platform="zynq"``: the register map at offset 0 of the AXI4-Lite port) and for the Vitis RTL kernel of
the Alveo U55C (``platform="alveo"``: the map at :func:`hw.isa.register_base` ``("alveo")`` = 0x10,
above the 0x00-0x0C control registers that XRT reserves). Two things the core lacks and a board needs:

* **Address offset.** On Alveo the port is 9 bits wide and every address has 0x10 subtracted before it
  reaches the core (8 bits): the core's ID block then answers at 0x10, and 0x00-0x0C land on core offsets
  0xF0-0xFC, which the core leaves unmapped (reads 0, writes ignored).
* **Soft reset** (:data:`SOFT_RESET`, core-relative offset 0xF0, so 0xF0 on Zynq and 0x100 on Alveo): a
  write with bit 0 set holds the core in reset for :data:`SOFT_RESET_CYCLES` cycles, exactly what the
  RTL device's hard reset does (the committed recurrent state reads as zero again, counters restart). The
  host needs it to start a new sequence: the register map has no other way to zero the state. The shell
  watches the AXI4-Lite write channel the core answers, and holds every AXI4-Lite handshake off while the
  core is in reset (a transaction issued right after the reset write waits instead of being lost).

The weight streams and the output stream pass through, except that no beat is taken or offered while
the core is held in reset (the Verilog top of :mod:`hw.boards.xilinx` renames the ports and ties
``tkeep``).
"""

from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw import isa
from hw.params import BuildParams
from hw.regs import AXI4LiteSignature
from hw.top import Accelerator, AXIStreamSignature

__all__ = ["PLATFORMS", "SOFT_RESET", "SOFT_RESET_CYCLES", "XilinxShell"]

#: Core-relative offset of the shell's soft-reset register (write-only; unmapped in the core's map).
SOFT_RESET = 0xF0
#: Cycles the core is held in reset after a soft-reset write.
SOFT_RESET_CYCLES = 16
#: Platforms and their AXI4-Lite address width in bits.
PLATFORMS = {"zynq": 8, "alveo": 9}


class XilinxShell(wiring.Component):
    """:class:`hw.top.Accelerator` with the platform's register offset and a soft reset.

    Parameters
    ----------
    build : hw.params.BuildParams, optional
        The core's build, as given (:attr:`hw.boards.xilinx.XilinxBoard.core` sets the framing the data movers
        give: ``token_tlast`` False, ``image_tlast`` only on Alveo).
    platform : {"zynq", "alveo"}
        Register map at offset 0 (Zynq, 8-bit addresses) or 0x10 (Alveo, 9-bit addresses).
    **core
        Instead of ``build``: its fields as keywords (``lanes``, ``channels``, ``bus_bits``, ...), where
        ``token_tlast`` defaults to False and ``image_tlast`` to the platform being Alveo.

    Attributes
    ----------
    s_axis_w0 .. : In(AXIStreamSignature(bus_bits))
        Weight channels, received (as the core's).
    m_axis_out : Out(AXIStreamSignature(32))
        Output packets, sent.
    s_axil : AXI4LiteSignature(addr_width=8 or 9)
    irq : Out(1)
        The core's interrupt (token done or error).
    soft_reset : Out(1)
        High while the core is held in reset by a :data:`SOFT_RESET` write.

    Raises
    ------
    ValueError
        Unknown ``platform``; the Accelerator's own errors for bad core parameters.
    """

    def __init__(self, build: BuildParams | None = None, *, platform: str = "zynq", **core):
        if platform not in PLATFORMS:
            raise ValueError(f"platform must be one of {sorted(PLATFORMS)}, got {platform!r}")
        if build is not None and core:
            raise TypeError("pass a BuildParams or keyword parameters, not both")
        self.platform = platform
        self.base = isa.register_base(platform)
        if build is None:
            # the DMAs do not mark the token packet's end (and on Zynq not the image's: the driver may split a
            # stream into several transfers, each ending with tlast, which hw/boards/xilinx.py does not pass on)
            core.setdefault("token_tlast", False)
            core.setdefault("image_tlast", platform == "alveo")
            build = BuildParams.from_mapping(core)
        self.core = Accelerator(build)
        members = {f"s_axis_w{c}": In(AXIStreamSignature(self.core.bus_bits)) for c in range(self.core.channels)}
        members["m_axis_out"] = Out(AXIStreamSignature(32))
        members["s_axil"] = Out(AXI4LiteSignature(addr_width=PLATFORMS[platform]))
        members["irq"] = Out(1)
        members["soft_reset"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        core = self.core
        rst = Signal()
        m.submodules.core = ResetInserter({"sync": rst})(core)
        # streams: no beat may be taken while the core is held in reset (it would be lost)
        for c in range(core.channels):
            outer, inner = getattr(self, f"s_axis_w{c}"), getattr(core, f"s_axis_w{c}")
            m.d.comb += [inner.tdata.eq(outer.tdata), inner.tlast.eq(outer.tlast),
                         inner.tvalid.eq(outer.tvalid & ~rst), outer.tready.eq(inner.tready & ~rst)]
        out, inner = self.m_axis_out, core.m_axis_out
        m.d.comb += [out.tdata.eq(inner.tdata), out.tlast.eq(inner.tlast),
                     out.tvalid.eq(inner.tvalid & ~rst), inner.tready.eq(out.tready & ~rst)]
        m.d.comb += self.irq.eq(core.irq)

        bus, cb = self.s_axil, core.s_axil
        for name in ("awprot", "wdata", "wstrb", "bready", "arprot", "rready"):
            m.d.comb += getattr(cb, name).eq(getattr(bus, name))
        for name in ("bresp", "bvalid", "rdata", "rresp", "rvalid"):
            m.d.comb += getattr(bus, name).eq(getattr(cb, name))
        # while the core is held in reset its register block would accept an address and lose it (no
        # response: a hung bus), so no handshake happens until the reset is over
        for v, r in (("awvalid", "awready"), ("wvalid", "wready"), ("arvalid", "arready")):
            m.d.comb += [getattr(cb, v).eq(getattr(bus, v) & ~rst), getattr(bus, r).eq(getattr(cb, r) & ~rst)]
        m.d.comb += [cb.awaddr.eq((bus.awaddr - self.base)[:8]), cb.araddr.eq((bus.araddr - self.base)[:8])]

        # soft reset: watch the write the core completes (address and data latched at their handshakes)
        awaddr = Signal(8)
        wbit = Signal()
        count = Signal(range(SOFT_RESET_CYCLES + 1))
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += awaddr.eq(cb.awaddr)
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += wbit.eq(bus.wdata[0] & bus.wstrb[0])
        with m.If(bus.bvalid & bus.bready & ((awaddr & ~3) == SOFT_RESET) & wbit):
            m.d.sync += count.eq(SOFT_RESET_CYCLES)
        with m.Elif(count != 0):
            m.d.sync += count.eq(count - 1)
        m.d.comb += [rst.eq(count != 0), self.soft_reset.eq(rst)]
        return m
