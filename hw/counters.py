"""The core's performance and activity counters (:class:`hw.isa.Counter`, 64 bits each; docs/ISA.md).

The sequencer's events count as they happen; the output stall and the trits of the cycle are registered first
and count a cycle late (the trailer's multiplexer or the chunks' population counts and the 64-bit adders would
otherwise share a cycle; an instruction's last stall and a GEMV's last chunk are at least two cycles before its
end, so the per-instruction counts are unchanged).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.isa import Counter
from hw.regs import CountersSignature
from hw.sequencer import SEQUENCER_EVENTS, SequencerEventsSignature
from hw.streams import trit_chunk_layout

__all__ = ["ChunkTapSignature", "Counters"]


class ChunkTapSignature(wiring.Signature):
    """A gearbox's chunk as it is taken: ``taken`` Out(1), ``trits`` Out(ArrayLayout(signed(2), lanes)),
    ``count`` Out(range(lanes + 1)) (the valid trits, in lanes ``0 .. count - 1``)."""

    def __init__(self, lanes: int):
        chunk = trit_chunk_layout(lanes)
        super().__init__({"taken": Out(1), "trits": Out(chunk["trits"].shape), "count": Out(chunk["count"].shape)})


class Counters(wiring.Component):
    """The counters.

    Parameters
    ----------
    channels : int
    lanes : int
        Lanes per channel.

    Attributes
    ----------
    events : In(hw.sequencer.SequencerEventsSignature())
    beats : In(range(channels + 1))
        Input beats taken this cycle, all channels (``STREAM_BEATS``).
    out_stall : In(1)
    elements : In(1)
        An element enters the epilogue.
    chunks : In(ChunkTapSignature(lanes)) x channels
        ``TRITS`` and ``NONZERO_TRITS``.
    values : Out(hw.regs.CountersSignature())
    """

    def __init__(self, *, channels: int, lanes: int):
        self._channels, self._lanes = channels, lanes
        super().__init__({"events": In(SequencerEventsSignature()), "beats": In(range(channels + 1)),
                          "out_stall": In(1), "elements": In(1),
                          "chunks": In(ChunkTapSignature(lanes)).array(channels), "values": Out(CountersSignature())})

    def elaborate(self, platform):
        m = Module()
        ctr = {c: getattr(self.values, c.name.lower()) for c in Counter}
        for name in SEQUENCER_EVENTS:
            c = Counter[name.upper()]
            m.d.sync += ctr[c].eq(ctr[c] + getattr(self.events, name))
        m.d.sync += ctr[Counter.STREAM_BEATS].eq(ctr[Counter.STREAM_BEATS] + self.beats)
        m.d.sync += ctr[Counter.EPILOGUE_ELEMENTS].eq(ctr[Counter.EPILOGUE_ELEMENTS] + self.elements)
        out_stall = Signal()
        m.d.sync += [out_stall.eq(self.out_stall), ctr[Counter.OUT_STALLS].eq(ctr[Counter.OUT_STALLS] + out_stall)]
        trits, nonzero = [], []
        for c, tap in enumerate(self.chunks):
            n, nz = Signal(range(self._lanes + 1), name=f"chunk_trits{c}"), Signal(range(self._lanes + 1),
                                                                                  name=f"chunk_nz{c}")
            m.d.comb += [n.eq(tap.count),
                         nz.eq(sum(((tap.trits[j] != 0) & (j < tap.count)) for j in range(self._lanes)))]
            trits.append(Mux(tap.taken, n, 0))
            nonzero.append(Mux(tap.taken, nz, 0))
        trits_now, nz_now = Signal(32), Signal(32)
        m.d.sync += [trits_now.eq(sum(trits)), nz_now.eq(sum(nonzero)),
                     ctr[Counter.TRITS].eq(ctr[Counter.TRITS] + trits_now),
                     ctr[Counter.NONZERO_TRITS].eq(ctr[Counter.NONZERO_TRITS] + nz_now)]
        return m
