"""A Wishbone B4 classic control bus carried between two clock domains, one transfer at a time.

On the ECPIX-5 the host's access to the DDR3 controller's CSRs (``hw.boards.dram_board.DRAMBoard.ctrl``, in the
core's ``sync`` domain) and the controller's control bus (:attr:`hw.dram.LiteDRAMCore.ctrl`, in its 75 MHz
``dram`` domain) run on unrelated clocks (docs/DDR3.md). :class:`WishboneCDC` joins them with a
request/acknowledge handshake: the manager's address, data and direction are registered and held while a
toggle crosses to the subordinate's domain through :class:`amaranth.lib.cdc.FFSynchronizer`; the
subordinate's read data are registered there and held while a toggle crosses back.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from hw.dram_init import WishboneSignature

__all__ = ["WishboneCDC"]


class WishboneCDC(wiring.Component):
    """A Wishbone B4 classic bus (:class:`hw.dram_init.WishboneSignature`: 30-bit word address, 32-bit data) from a
    manager in ``from_domain`` (``bus``) to a subordinate in ``to_domain`` (``sub``).

    **One transfer in flight.** When the manager raises ``cyc & stb`` and the bridge is idle, ``adr``, ``dat_w``
    and ``we`` are registered in ``from_domain`` and a request toggle flips. The registers hold still until the
    transfer is over, so ``to_domain`` reads them directly once it sees the toggle through a 2-stage
    :class:`~amaranth.lib.cdc.FFSynchronizer` (the toggle changes only after they settled). ``to_domain`` then
    drives ``sub`` (``cyc``, ``stb``, the registered ``adr``/``dat_w``/``we``) until ``sub.ack``, registers
    ``sub.dat_r`` and flips an acknowledge toggle, which comes back through another synchroniser; ``bus.ack`` is
    then high for one cycle with the registered ``dat_r`` (held until the next transfer ends). Each accepted
    transfer reaches ``sub`` at most once, and each ``bus.ack`` answers the transfer the manager is presenting.

    **Withdrawn transfers.** A manager may drop ``cyc`` or ``stb`` before its ``ack`` (``DRAMBoard`` does after
    its ``ctrl_timeout``). The bridge then flips a cancel toggle towards ``to_domain``: a transfer still waiting
    there for ``sub.ack`` is withdrawn (``sub.cyc`` drops), one not yet started is skipped, and one that already
    ended (or that starts before the cancel arrives) has happened: a withdrawn write may still land. No
    ``bus.ack`` is given for a withdrawn transfer. ``to_domain`` answers every request with one acknowledge
    toggle and every cancel with one cancel-acknowledge toggle, and the bridge takes the next transfer only when
    both have come back, so no answer is ever taken for a later transfer's. Until then a new transfer waits
    (``bus.ack`` low): a subordinate that never acknowledges keeps the bridge busy only until the manager
    withdraws, and the manager's own time-out is what ends its wait.

    Latency: about 3 cycles of ``to_domain`` to start the transfer and 3 of ``from_domain`` for the
    acknowledge, on top of the subordinate's.

    Reset: each side's state is in its own domain. A reset of ``to_domain`` alone before any transfer (it is
    held until its clock runs) only delays a pending transfer until it ends; a reset of one side during a
    transfer leaves the toggles out of step (the bridge may then issue one stray transfer or give one stray
    answer). Reset them at power-up; on the ECPIX-5 neither reset returns afterwards unless a PLL loses its lock.

    Parameters
    ----------
    from_domain : str
        The domain of ``bus`` (default ``"sync"``).
    to_domain : str
        The domain of ``sub`` (default ``"dram"``).

    Members
    -------
    bus : In(WishboneSignature())
        The subordinate side the manager drives (``DRAMBoard.ctrl``), in ``from_domain``.
    sub : Out(WishboneSignature())
        The manager side towards the subordinate (``LiteDRAMCore.ctrl``), in ``to_domain``.
    busy : Out(1)
        In ``from_domain``: a transfer, or the answer to a withdrawn one, is outstanding.

    Raises
    ------
    TypeError
        If a domain is not a str.
    ValueError
        If the two domains are the same.
    """

    def __init__(self, *, from_domain: str = "sync", to_domain: str = "dram"):
        for name, d in (("from_domain", from_domain), ("to_domain", to_domain)):
            if not isinstance(d, str):
                raise TypeError(f"{name} must be a str, not {d!r}")
        if from_domain == to_domain:
            raise ValueError(f"from_domain and to_domain are both {from_domain!r}: no crossing to make")
        self._from, self._to = from_domain, to_domain
        super().__init__({"bus": In(WishboneSignature()), "sub": Out(WishboneSignature()), "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        fd, td = m.d[self._from], m.d[self._to]
        bus, sub = self.bus, self.sub

        # the four toggles: request and cancel (from_domain -> to_domain), their answers (back); each crosses
        # through an FFSynchronizer and is compared with the last value its receiver saw
        toggles = {}
        for name, dst in (("req", self._to), ("cancel", self._to), ("ack", self._from),
                          ("cancel_ack", self._from)):
            t, synced, seen = Signal(name=f"{name}_t"), Signal(name=f"{name}_sync"), Signal(name=f"{name}_seen")
            m.submodules[f"{name}_sync"] = FFSynchronizer(t, synced, o_domain=dst)
            edge = Signal(name=f"{name}_edge")
            m.d.comb += edge.eq(synced != seen)
            m.d[dst] += seen.eq(synced)
            toggles[name] = (t, edge)
        (req_t, req_edge), (cancel_t, cancel_edge) = toggles["req"], toggles["cancel"]
        (ack_t, ack_edge), (cancel_ack_t, cancel_ack_edge) = toggles["ack"], toggles["cancel_ack"]

        # ---- from_domain: the held request, pending until its answer; cancelled once the manager withdrew it
        # (no ack for it); cancel_out until the cancel's own answer (the two answers cross separately and may
        # come back in either order)
        adr, dat_w, we = Signal.like(bus.adr), Signal.like(bus.dat_w), Signal()
        pending, cancelled, cancel_out = Signal(), Signal(), Signal()
        dat_r = Signal.like(sub.dat_r)                 # to_domain's register, stable whenever ack_edge is seen
        presenting = bus.cyc & bus.stb
        m.d.comb += [bus.ack.eq(pending & ack_edge & ~cancelled & presenting), bus.dat_r.eq(dat_r),
                     self.busy.eq(pending | cancel_out)]
        with m.If(cancel_out & cancel_ack_edge):
            fd += cancel_out.eq(0)
        with m.If(pending):
            with m.If(ack_edge):
                fd += [pending.eq(0), cancelled.eq(0)]
            with m.Elif(~presenting & ~cancelled):
                fd += [cancelled.eq(1), cancel_out.eq(1), cancel_t.eq(~cancel_t)]
        with m.Elif(presenting & ~cancel_out):
            fd += [adr.eq(bus.adr), dat_w.eq(bus.dat_w), we.eq(bus.we), req_t.eq(~req_t), pending.eq(1)]

        # ---- to_domain: the transfer on sub
        active = Signal()
        m.d.comb += [sub.cyc.eq(active), sub.stb.eq(active), sub.adr.eq(adr), sub.dat_w.eq(dat_w), sub.we.eq(we)]
        with m.If(cancel_edge):
            td += cancel_ack_t.eq(~cancel_ack_t)
        with m.If(active):
            with m.If(sub.ack):
                td += [dat_r.eq(sub.dat_r), active.eq(0), ack_t.eq(~ack_t)]
            with m.Elif(cancel_edge):
                td += [active.eq(0), ack_t.eq(~ack_t)]
        with m.Elif(req_edge):
            with m.If(cancel_edge):
                td += ack_t.eq(~ack_t)                  # withdrawn before it started: skipped
            with m.Else():
                td += active.eq(1)
        return m
