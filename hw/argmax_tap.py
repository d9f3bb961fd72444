"""The board's output filter: for a token that asked for argmax only, the link carries the output trailer's
argmax and position and a word of error flags, not the 64-byte output packet (issue 22, "the output is the
argmax for greedy decoding").

:class:`ArgmaxTap` sits between the core's ``m_axis_out`` words (:data:`hw.streams.WORD_LAYOUT`: 32-bit
words, ``last`` on a packet's final word; docs/ISA.md section 2.4, "Output packet") and the link. A packet
whose first word arrives while ``argmax_only`` is 0 passes through unchanged, word for word and at full
rate (a combinational path: ``o`` is ``i``). A packet whose first word arrives while ``argmax_only`` is 1
is consumed at one word per cycle and replaced by :data:`SUMMARY_WORDS` words:

======  ==========================================================================================
word    contents
======  ==========================================================================================
0       the trailer's ``position``
1       the trailer's ``argmax`` (the greedy next token)
2       flags (:class:`TapFlags`): ``CRC`` the packet's CRC word does not match, ``MAGIC`` the
        trailer's magic is not ``OUTPUT_MAGIC``, ``ABORT`` the packet was closed with
        ``OUTPUT_ABORT_WORD`` (an error in the LM head), ``LENGTH`` its word count is not the one its
        ``n_logits`` announces; ``last``
======  ==========================================================================================

The packet's CRC is checked on the fly (``amaranth.lib.crc``'s ``CRC32_ETHERNET`` over 32-bit words,
:func:`hw.isa.crc32_words`: the residue of a message that ends with its own CRC); the last
:data:`TRAILER_WORDS` words are kept in a shift register (256 flip-flops). The summary's first word is
offered two cycles after the packet's last word was taken; the next packet is taken once the summary's
last word has left.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import crc, stream, wiring
from amaranth.lib.wiring import In, Out

from hw import isa
from hw.boards.link_protocol import ARGMAX_SUMMARY_WORDS as SUMMARY_WORDS
from hw.boards.link_protocol import SummaryFlags as TapFlags
from hw.isa import OutputTrailer
from hw.streams import WORD_LAYOUT

__all__ = ["TapFlags", "ArgmaxTap", "SUMMARY_WORDS", "TRAILER_WORDS"]

TRAILER_WORDS = isa.layout_bytes(OutputTrailer) // 4
_WORD = {name: isa.field_span(OutputTrailer, (name,))[0] // 32 for name in ("magic", "position", "argmax",
                                                                             "n_logits")}
_SECTION_WORDS = isa.SECTION_BYTES // 4




class ArgmaxTap(wiring.Component):
    """Passes output packets through, or reduces those of argmax-only tokens to (position, argmax, flags).

    Parameters
    ----------
    count_bits : int, >= 5
        Width of the packet's word counter (default 24: packets up to 16 M words; a longer one saturates
        and reads as ``LENGTH``).

    Members
    -------
    i : In(stream.Signature(hw.streams.WORD_LAYOUT))
        The core's output words (``m_axis_out``).
    argmax_only : In(1)
        Sampled with each packet's first word: the token asked for argmax only (its command's ``logits``
        was 0). The board top holds it from the token command until the packet's end.
    o : Out(stream.Signature(hw.streams.WORD_LAYOUT))
        To the link: the packet as it came, or its :data:`SUMMARY_WORDS`-word summary (``last`` on the flags).
    """

    def __init__(self, *, count_bits: int = 24):
        if isinstance(count_bits, bool) or not isinstance(count_bits, int):
            raise TypeError(f"count_bits must be an int, not {count_bits!r}")
        if count_bits < 5:
            raise ValueError(f"count_bits must be >= 5, got {count_bits}")
        self._count_bits = count_bits
        super().__init__({"i": In(stream.Signature(WORD_LAYOUT)), "argmax_only": In(1),
                          "o": Out(stream.Signature(WORD_LAYOUT))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = proc = crc.catalog.CRC32_ETHERNET(data_width=32).create()

        first = Signal(init=1)        # the next word starts a packet
        reduce = Signal()             # the current packet is being reduced
        win = [Signal(32, name=f"win{k}") for k in range(TRAILER_WORDS)]   # the last words, oldest first
        count = Signal(self._count_bits)
        flags = Signal(4)
        send = Signal(range(SUMMARY_WORDS + 1))   # summary words still to send (0: not sending)
        check = Signal()              # the cycle after the last word: the CRC's residue is ready

        cur_reduce = Signal()
        m.d.comb += cur_reduce.eq((first & self.argmax_only) | (~first & reduce))
        taken = self.i.valid & self.i.ready
        with m.If(taken):
            m.d.sync += first.eq(self.i.payload.last)
            with m.If(first):
                m.d.sync += reduce.eq(self.argmax_only)

        with m.If(~cur_reduce & (send == 0) & ~check):
            # pass through
            m.d.comb += [self.o.valid.eq(self.i.valid), self.o.payload.eq(self.i.payload),
                         self.i.ready.eq(self.o.ready)]
        with m.Elif((send == 0) & ~check):
            # reduce: take every word, keep the last TRAILER_WORDS, CRC and count them
            m.d.comb += self.i.ready.eq(1)
            m.d.comb += [proc.data.eq(self.i.payload.data), proc.valid.eq(taken), proc.start.eq(taken & first)]
            with m.If(taken):
                m.d.sync += [w.eq(n) for w, n in zip(win, win[1:] + [self.i.payload.data], strict=True)]
                with m.If(first):
                    m.d.sync += count.eq(1)
                with m.Elif(count != (1 << self._count_bits) - 1):
                    m.d.sync += count.eq(count + 1)
                with m.If(self.i.payload.last):
                    m.d.sync += check.eq(1)

        with m.If(check):
            t = {name: win[k] for name, k in _WORD.items()}
            expected = ((t["n_logits"] + TRAILER_WORDS + _SECTION_WORDS - 1) >> 4) << 4
            # bit k of the flags is TapFlags' bit k
            m.d.sync += [flags.eq(Cat(~proc.match_detected, t["magic"] != isa.OUTPUT_MAGIC,
                                      win[-1] == isa.OUTPUT_ABORT_WORD, count != expected)),
                         check.eq(0), send.eq(SUMMARY_WORDS)]

        with m.If(send != 0):
            m.d.comb += self.o.valid.eq(1)
            with m.Switch(send):
                with m.Case(3):
                    m.d.comb += self.o.payload.data.eq(win[_WORD["position"]])
                with m.Case(2):
                    m.d.comb += self.o.payload.data.eq(win[_WORD["argmax"]])
                with m.Case(1):
                    m.d.comb += [self.o.payload.data.eq(flags), self.o.payload.last.eq(1)]
            with m.If(self.o.ready):
                m.d.sync += send.eq(send - 1)
        return m
