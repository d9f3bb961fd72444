"""A LiteDRAM native port carried between two clock domains over asynchronous FIFOs.

On the ECPIX-5 the DDR3 controller runs on its own 75 MHz clock (the generated core's ``user_clk``) while the
accelerator core runs in a faster domain (docs/DDR3.md). :class:`NativePortCDC` gives the image reader, the
token builder and the DRAM writer a native port (:class:`hw.dram.NativePortSignature`) in their domain that
behaves as the controller's does, and drives the controller's port in its domain.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.wiring import In, Out

from hw.dram import NativePortSignature, native_cmd_layout, native_wdata_layout

__all__ = ["NativePortCDC"]

#: cycles of ``from_domain`` between a write command's acceptance on ``port`` and the earliest cycle its data
#: are taken (``port.wdata.ready``): a user may put the data into a FIFO in the cycle the command is accepted
#: (``hw.dram_writer.DRAMStreamWriter`` does), whose output follows one or two cycles later
WDATA_DELAY = 3


class NativePortCDC(wiring.Component):
    """A native port in ``from_domain`` (``port``) carried to a native port in ``to_domain`` (``dram_port``).

    Three :class:`amaranth.lib.fifo.AsyncFIFO` of ``depth`` entries carry the commands and the write data to
    ``to_domain`` and the read data back. Towards ``port`` the component keeps the controller's contract
    (:class:`hw.dram.NativePortSignature`):

    * ``port.cmd`` is accepted while the command FIFO has room; commands reach ``dram_port`` in order.
    * A write's data are taken (``port.wdata.ready``, one cycle per write, in command order) no sooner than
      :data:`WDATA_DELAY` cycles after its command was accepted; the user holds them on ``port.wdata`` from
      the cycle after acceptance. On ``dram_port`` a write command is issued only when its data are already
      in ``to_domain`` (so whenever the controller raises ``wdata.ready`` the data are there).
    * Read data come back on ``port.rdata`` in command order, one word per read, without backpressure (as from
      the controller: the user reserves room before it issues reads). A read is issued on ``dram_port`` only
      when the read-data FIFO has room for its word beside the words already in it and those of every read
      outstanding at the controller (whose ``rdata`` cannot be held back either).

    Latency: about 3 cycles of ``to_domain`` each way for the FIFOs' Gray-code synchronisers, on top of the
    controller's. Throughput: one command per cycle of the slower domain once the FIFOs are primed, as long
    as ``depth`` covers the reads outstanding at the controller plus about 6 cycles of ``to_domain``.

    Reset: the FIFOs are reset by the domain that writes them (:class:`AsyncFIFO`); reset both domains
    together (a reset of one alone leaves the other's counters out of step).

    Parameters
    ----------
    addr_width, data_width : int
        The port's widths (:class:`hw.dram.NativePortSignature`).
    from_domain : str
        The domain of ``port`` (default ``"sync"``).
    to_domain : str
        The domain of ``dram_port``: the controller's clock (default ``"dram"``).
    depth : int, power of 2, >= 4
        Entries of each FIFO (default 32).

    Members
    -------
    port : In(NativePortSignature(addr_width=addr_width, data_width=data_width))
        The users' side, in ``from_domain``.
    dram_port : Out(NativePortSignature(addr_width=addr_width, data_width=data_width))
        To :class:`hw.dram.LiteDRAMCore`'s ``port``, in ``to_domain``.

    Raises
    ------
    TypeError
        If a width or ``depth`` is not an int, or a domain not a str.
    ValueError
        If the widths are out of range (:class:`hw.dram.NativePortSignature`), ``depth`` is not a power of 2
        >= 4, or the two domains are the same.
    """

    def __init__(self, addr_width: int, data_width: int, *, from_domain: str = "sync", to_domain: str = "dram",
                 depth: int = 32):
        sig = NativePortSignature(addr_width=addr_width, data_width=data_width)
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise TypeError(f"depth must be an int, not {depth!r}")
        if depth < 4 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of 2 >= 4, got {depth}")
        for n, d in (("from_domain", from_domain), ("to_domain", to_domain)):
            if not isinstance(d, str):
                raise TypeError(f"{n} must be a str, not {d!r}")
        if from_domain == to_domain:
            raise ValueError(f"from_domain and to_domain are both {from_domain!r}")
        self._aw, self._dw, self._from, self._to, self._depth = addr_width, data_width, from_domain, to_domain, depth
        super().__init__({"port": In(sig), "dram_port": Out(sig)})

    @property
    def depth(self) -> int:
        return self._depth

    def elaborate(self, platform):
        m = Module()
        fd, td, depth = self._from, self._to, self._depth
        cmd_shape, wdata_shape = native_cmd_layout(self._aw), native_wdata_layout(self._dw)
        m.submodules.cmd_fifo = cmd_fifo = AsyncFIFO(width=cmd_shape.size, depth=depth, w_domain=fd, r_domain=td)
        m.submodules.wdata_fifo = wdata_fifo = AsyncFIFO(width=wdata_shape.size, depth=depth, w_domain=fd,
                                                         r_domain=td)
        m.submodules.rdata_fifo = rdata_fifo = AsyncFIFO(width=self._dw, depth=depth, w_domain=td, r_domain=fd)
        port, dram = self.port, self.dram_port

        # ---- from_domain: commands in, write data taken WDATA_DELAY cycles after their command, read data out
        m.d.comb += [cmd_fifo.w_data.eq(port.cmd.payload), cmd_fifo.w_en.eq(port.cmd.valid),
                     port.cmd.ready.eq(cmd_fifo.w_rdy)]
        accepted_write = port.cmd.valid & port.cmd.ready & port.cmd.payload.we
        delay = [Signal(name=f"write_accepted_{i}") for i in range(WDATA_DELAY - 1)]
        m.d[fd] += [a.eq(b) for a, b in zip(delay, [accepted_write, *delay[:-1]], strict=True)]
        # writes whose data may be taken now and are not yet: at most the command FIFO's entries (a write
        # leaves that FIFO only once its data are in to_domain)
        due = Signal(range(depth + 2))
        take = Signal()
        m.d.comb += [take.eq((due != 0) & wdata_fifo.w_rdy), port.wdata.ready.eq(take),
                     wdata_fifo.w_data.eq(port.wdata.payload), wdata_fifo.w_en.eq(take)]
        m.d[fd] += due.eq(due + delay[-1] - take)
        m.d.comb += [port.rdata.valid.eq(rdata_fifo.r_rdy), port.rdata.payload.eq(rdata_fifo.r_data),
                     rdata_fifo.r_en.eq(1)]

        # ---- to_domain: issue a command when what it needs is there
        head = cmd_shape(cmd_fifo.r_data)
        issued_writes = Signal(range(depth + 1))    # writes issued whose data the controller has not taken
        outstanding = Signal(range(depth + 1))      # reads issued whose word has not come back
        arrived = Signal()                          # a word came back last cycle (not yet in w_level)
        can_write = wdata_fifo.r_level > issued_writes
        can_read = rdata_fifo.w_level + outstanding + arrived < depth
        issue = dram.cmd.valid & dram.cmd.ready
        m.d.comb += [dram.cmd.valid.eq(cmd_fifo.r_rdy & Mux(head.we, can_write, can_read)),
                     dram.cmd.payload.eq(head), cmd_fifo.r_en.eq(issue)]
        m.d.comb += [dram.wdata.payload.eq(wdata_fifo.r_data), wdata_fifo.r_en.eq(dram.wdata.ready)]
        m.d.comb += [rdata_fifo.w_data.eq(dram.rdata.payload), rdata_fifo.w_en.eq(dram.rdata.valid)]
        m.d[td] += [issued_writes.eq(issued_writes + (issue & head.we) - dram.wdata.ready),
                    outstanding.eq(outstanding + (issue & ~head.we) - dram.rdata.valid),
                    arrived.eq(dram.rdata.valid)]
        return m
