"""The output packet's framer (docs/ISA.md, "Output packet"; docs/RTL.md).

The LM head's logits pass through as they are computed (when the token asked for them; else they are
dropped), then END_TOKEN's trailer follows: zero padding to a whole number of 64-byte sections, the
:class:`hw.isa.OutputTrailer` words, and its CRC word (``last``). The CRC (:class:`hw.crc_pipe.CrcPipe`) runs
one cycle behind the words, so the trailer leaves a one-cycle gap before the CRC word. An error while a packet
is open (the LM head was streaming) closes it with :data:`hw.isa.OUTPUT_ABORT_WORD` (``last``).
"""

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw import isa
from hw.crc_pipe import CrcPipe
from hw.isa import OutputTrailer
from hw.streams import WORD_LAYOUT

__all__ = ["FramerSignature", "OutputFramer"]

_TRAILER_WORDS = isa.layout_bytes(OutputTrailer) // 4
#: word index of each OutputTrailer field
_TRAILER_WORD = {name: isa.field_span(OutputTrailer, (name,))[0] // 32
                 for name in ("magic", "position", "argmax", "max_acc", "scale_mant", "scale_shift", "n_logits",
                              "crc")}
assert _TRAILER_WORD["crc"] == _TRAILER_WORDS - 1


class FramerSignature(wiring.Signature):
    """The sequencer's side of :class:`OutputFramer`.

    Members (sequencer's view): ``logits`` Out(1): pass the epilogue's logits on (else drop them); ``head``
    Out(1): the LM head starts (count the logits from 0, take its scale: ``scale_mant`` Out(27),
    ``scale_shift`` Out(signed(8)) plus ``out_frac`` Out(6)); ``trailer`` Out(1): send the trailer;
    ``close`` Out(1): close an open packet (error); ``position`` Out(32): the token's; ``sent`` In(1): the
    packet's last word leaves this cycle; ``open`` In(1): a packet has started and not ended.
    """

    def __init__(self):
        super().__init__({"logits": Out(1), "head": Out(1), "trailer": Out(1), "close": Out(1),
                          "position": Out(32), "scale_mant": Out(27), "scale_shift": Out(signed(8)),
                          "out_frac": Out(6), "sent": In(1), "open": In(1)})


class OutputFramer(wiring.Component):
    """Output packets, 32-bit words.

    Parameters
    ----------
    index_bits : int
        Width of the epilogue's argmax index.

    Attributes
    ----------
    ctrl : In(FramerSignature())
    logits : In(stream.Signature(signed(32)))
        The epilogue's OUT elements.
    argmax_index : In(index_bits); argmax_value : In(signed(32))
        The epilogue's running argmax (final by END_TOKEN).
    o : Out(stream.Signature(hw.streams.WORD_LAYOUT))
    stall : Out(1)
        A word waits for ``ready`` this cycle (the ``OUT_STALLS`` counter).
    """

    #: The output CRC runs on a registered copy of each word: the trailer's CRC word waits this many cycles
    #: after the word before it (ECP5 timing; ``host.perf``)
    CRC_GAP_CYCLES = 1

    def __init__(self, *, index_bits: int):
        super().__init__({"ctrl": In(FramerSignature()), "logits": In(stream.Signature(signed(32))),
                          "argmax_index": In(index_bits), "argmax_value": In(signed(32)),
                          "o": Out(stream.Signature(WORD_LAYOUT)), "stall": Out(1)})

    def elaborate(self, platform):
        m = Module()
        ctrl, o, lg = self.ctrl, self.o, self.logits
        word, last = o.payload.data, o.payload.last
        take = Signal()
        m.d.comb += [take.eq(o.valid & o.ready), ctrl.sent.eq(take & last), self.stall.eq(o.valid & ~o.ready)]
        n_logits = Signal(16)
        out_scale_m, out_scale_s = Signal(27), Signal(signed(16))
        pad_words = Signal(4)         # the trailer's zero padding, registered: n_logits is stable for cycles before
        m.d.sync += pad_words.eq(-(n_logits + _TRAILER_WORDS))
        with m.If(ctrl.head):
            m.d.sync += [out_scale_m.eq(ctrl.scale_mant), out_scale_s.eq(ctrl.scale_shift + ctrl.out_frac),
                         n_logits.eq(0)]
        with m.If(ctrl.logits):
            m.d.comb += [word.eq(lg.payload), o.valid.eq(lg.valid), lg.ready.eq(o.ready)]
            with m.If(lg.valid & o.ready):
                m.d.sync += n_logits.eq(n_logits + 1)
        with m.Else():
            m.d.comb += lg.ready.eq(1)

        # the CRC covers every word taken but the trailer's last (the CRC word itself); it restarts with each
        # packet, after the previous one's last word
        first = Signal(init=1)        # the next word starts a packet
        m.submodules.crc = crc = CrcPipe(32)
        m.d.comb += [crc.data.eq(word), crc.valid.eq(take & ~last), crc.start.eq(first & take),
                     ctrl.open.eq(~first)]
        with m.If(take):
            m.d.sync += first.eq(last)

        idx = Signal(5)               # the trailer's word, <= pad_words + 8 <= 24: five bits (a short trailer mux)
        gap = Signal()                # the cycle before the CRC word: nothing is sent
        with m.If(ctrl.trailer):
            m.d.comb += o.valid.eq(~gap)
            with m.If(idx < pad_words):
                m.d.comb += word.eq(0)
            with m.Else():
                fields = {"magic": isa.OUTPUT_MAGIC, "position": ctrl.position, "argmax": self.argmax_index,
                          "max_acc": self.argmax_value, "scale_mant": out_scale_m,
                          "scale_shift": out_scale_s.as_signed(), "n_logits": n_logits}
                with m.Switch(idx - pad_words):
                    for name, value in fields.items():
                        with m.Case(_TRAILER_WORD[name]):
                            m.d.comb += word.eq(value)
                    with m.Case(_TRAILER_WORD["crc"]):
                        m.d.comb += gap.eq(1)
                    with m.Case(_TRAILER_WORD["crc"] + 1):
                        m.d.comb += [word.eq(crc.crc), last.eq(1)]
            with m.If(take | gap):
                m.d.sync += idx.eq(idx + 1)
                with m.If(last):
                    m.d.sync += idx.eq(0)
        with m.Else():
            m.d.sync += idx.eq(0)
        with m.If(ctrl.close & ~first):
            m.d.comb += [o.valid.eq(1), word.eq(isa.OUTPUT_ABORT_WORD), last.eq(1)]
        return m
