"""CRC-32 checkers that run one cycle behind their stream (docs/RTL.md, "CRC pipes").

Each registers the data, valid and start that its stream's controller drives this cycle and feeds them to an
``amaranth.lib.crc`` processor (``CRC32_ETHERNET``, the CRC of :func:`hw.isa.crc32_words`) the next cycle, so
that the controller's decode (or an output word's source multiplexer) and the CRC's XOR tree never share a
cycle: a check reads the CRC one cycle after the last word's cycle.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import crc, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["CrcPipe", "BlockTapSignature", "BlockCrc"]


def _check_width(data_width: int) -> int:
    if isinstance(data_width, bool) or not isinstance(data_width, int) or data_width < 8 or data_width % 8:
        raise ValueError(f"data_width must be a positive multiple of 8, got {data_width!r}")
    return data_width


class CrcPipe(wiring.Component):
    """CRC-32 over the words of a stream, one cycle behind it.

    Parameters
    ----------
    data_width : int
        Bits per word (a multiple of 8: 32 for words, the bus width for beats).

    Attributes
    ----------
    data : In(data_width)
    valid : In(1)
        ``data`` enters the CRC (registered: it counts from the next cycle).
    start : In(1)
        Restart the CRC with this word (with ``valid``).
    crc : Out(32)
        The CRC of the words up to those of the previous cycle.
    match : Out(1)
        ``crc`` is the residue of a message that ends with its own CRC word (``match_detected``).
    """

    def __init__(self, data_width: int):
        self._width = _check_width(data_width)
        super().__init__({"data": In(data_width), "valid": In(1), "start": In(1), "crc": Out(32), "match": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.proc = proc = crc.catalog.CRC32_ETHERNET(data_width=self._width).create()
        d, v, st = Signal.like(proc.data), Signal(), Signal()
        m.d.sync += [d.eq(self.data), v.eq(self.valid), st.eq(self.start)]
        m.d.comb += [proc.data.eq(d), proc.valid.eq(v), proc.start.eq(st),
                     self.crc.eq(proc.crc), self.match.eq(proc.match_detected)]
        return m


class BlockTapSignature(wiring.Signature):
    """A weight block's beats as :class:`BlockCrc` checks them, from the stream's side: ``data``
    Out(data_width), and ``valid``, ``start``, ``last`` Out(1) (a beat is taken; the block's first; its last)."""

    def __init__(self, data_width: int):
        super().__init__({"data": Out(data_width), "valid": Out(1), "start": Out(1), "last": Out(1)})


class BlockCrc(wiring.Component):
    """The verdict on one weight block's CRC word (its last 4 bytes), checked at beat rate one cycle behind
    the beats, registered two cycles after the block's last beat.

    Parameters
    ----------
    data_width : int
        The weight channel's beat bits.

    Attributes
    ----------
    i : In(BlockTapSignature(data_width))
        The channel's beats (raw, as they arrive).
    clear : In(1)
        A new block streams: ``done`` takes ``preset`` (1: an empty block), ``bad`` 0 (over a verdict in the
        same cycle).
    preset : In(1)
    done : Out(1)
        The block's verdict is in (registered; until ``clear``).
    bad : Out(1)
        The CRC word does not match (with ``done``).
    """

    def __init__(self, data_width: int):
        self._width = _check_width(data_width)
        super().__init__({"i": In(BlockTapSignature(data_width)),
                          "clear": In(1), "preset": In(1), "done": Out(1), "bad": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.pipe = pipe = CrcPipe(self._width)
        l1, l2 = Signal(), Signal()
        m.d.comb += [pipe.data.eq(self.i.data), pipe.valid.eq(self.i.valid), pipe.start.eq(self.i.start)]
        m.d.sync += [l1.eq(self.i.valid & self.i.last), l2.eq(l1)]
        with m.If(l2):
            m.d.sync += [self.done.eq(1), self.bad.eq(~pipe.match)]
        with m.If(self.clear):
            m.d.sync += [self.done.eq(self.preset), self.bad.eq(0)]
        return m
