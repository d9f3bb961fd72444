"""Payload layouts of the streams between gateware components (docs/RTL.md), defined once.

The producer and the consumer of every datapath edge import the layout from here, so both sides agree
on the bits (STYLE.md point 7). All are ``amaranth.lib.data`` layouts, structurally compared: two calls
with the same parameters give equal layouts.
"""

from amaranth.hdl import Module, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["trit_chunk_layout", "code_word_layout", "acc_row_layout", "packet_beat_layout", "WORD_LAYOUT",
           "AXIStreamSignature", "AXIStreamReceiver", "AXIStreamSender"]


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def trit_chunk_layout(lanes: int) -> data.StructLayout:
    """``TritChunk``: up to ``lanes`` trits of one weight row (``TritGearbox.o`` -> ``TernaryGemv.i``).

    Parameters
    ----------
    lanes : int, >= 1
        Trits per chunk.

    Returns
    -------
    data.StructLayout
        ``trits``: ``ArrayLayout(signed(2), lanes)``, trit ``j`` of the chunk in lane ``j`` (values
        -1, 0, +1; ``0b10`` = -2 is an invalid code the gearbox flags); ``count``: ``range(lanes + 1)``,
        the valid trits, in lanes ``0 .. count - 1`` (lanes ``>= count`` are don't-care);
        ``first``/``last``: 1 bit each, the row's first/last chunk; ``end``: 1 bit, the weight block's
        last chunk (only with ``last``). A row of K trits is ``ceil(K / lanes)`` chunks; all but the
        last hold ``lanes`` trits (docs/RTL.md, ``hw/gearbox.py``).

    Raises
    ------
    TypeError, ValueError
        If ``lanes`` is not an int >= 1.
    """
    lanes = _check_positive_int("lanes", lanes)
    return data.StructLayout({
        "trits": data.ArrayLayout(signed(2), lanes),
        "count": range(lanes + 1),
        "first": 1,
        "last": 1,
        "end": 1,
    })


def code_word_layout(lanes: int) -> data.ArrayLayout:
    """One word of the code buffer: ``lanes`` int8 codes (``ArrayLayout(signed(8), lanes)``).

    Word ``c`` holds codes ``q[c * lanes .. c * lanes + lanes - 1]`` of the GEMV input (the quantize
    prologue's output, ``hw.numerics.quantize``, range [-128, 127]); code ``j`` of the word in element
    ``j``. Written by ``Quantizer.codes``, read by ``TernaryGemv.codes``.

    Raises
    ------
    TypeError, ValueError
        If ``lanes`` is not an int >= 1.
    """
    lanes = _check_positive_int("lanes", lanes)
    return data.ArrayLayout(signed(8), lanes)


def acc_row_layout(acc_bits: int) -> data.StructLayout:
    """One GEMV output row (``TernaryGemv.o``): ``acc``: ``signed(acc_bits)``, ``last``: 1 bit.

    ``acc[n] = sum_k W[n, k] q[k]`` exactly (``hw.isa`` GEMV step 2; ``|acc| <= 128 K``, so
    ``acc_bits >= hw.isa.acc_bits_for(K)``); ``last`` marks the weight block's last row.

    Raises
    ------
    TypeError, ValueError
        If ``acc_bits`` is not an int >= 1.
    """
    acc_bits = _check_positive_int("acc_bits", acc_bits)
    return data.StructLayout({"acc": signed(acc_bits), "last": 1})


def packet_beat_layout(data_bits: int) -> data.StructLayout:
    """One beat of a packet stream: ``data``: ``unsigned(data_bits)`` (byte ``b`` in bits ``8b+7 .. 8b``),
    ``last``: 1 bit, the packet's last beat (AXI4-Stream ``tlast``).

    Raises
    ------
    TypeError, ValueError
        If ``data_bits`` is not an int >= 1.
    """
    data_bits = _check_positive_int("data_bits", data_bits)
    return data.StructLayout({"data": unsigned(data_bits), "last": 1})


#: A 32-bit word of a packet: channel 0's words (token packet, image header) and the output packet's words.
WORD_LAYOUT = packet_beat_layout(32)


class AXIStreamSignature(wiring.Signature):
    """AXI4-Stream (ARM IHI 0051A) with ``tdata``, ``tvalid``, ``tready``, ``tlast``, from the transmitter's
    side as :class:`amaranth.lib.stream.Signature` (``tdata``, ``tvalid``, ``tlast`` ``Out``, ``tready``
    ``In``): a port of this signature as ``Out`` sends, ``In`` (flipped) receives. These names appear only at
    the core's boundary (inside, streams are ``lib.stream`` with :func:`packet_beat_layout` payloads:
    :class:`AXIStreamReceiver`, :class:`AXIStreamSender`). cocotbext-axi finds a port with
    ``AxiStreamBus.from_prefix(dut, name, bus_separator="__")``.

    Parameters
    ----------
    data_width : int
        ``tdata`` bits, a positive multiple of 8.
    """

    def __init__(self, data_width: int):
        if not isinstance(data_width, int) or data_width % 8 or data_width < 8:
            raise ValueError(f"data_width must be a positive multiple of 8, got {data_width}")
        self.data_width = data_width
        super().__init__({"tdata": Out(data_width), "tvalid": Out(1), "tready": In(1), "tlast": Out(1)})

    def __eq__(self, other):
        return isinstance(other, AXIStreamSignature) and other.data_width == self.data_width

    def __hash__(self):
        return hash((AXIStreamSignature, self.data_width))

    def __repr__(self):
        return f"AXIStreamSignature({self.data_width})"


class AXIStreamReceiver(wiring.Component):
    """An AXI4-Stream input as a ``lib.stream`` (wires only, no logic).

    Parameters
    ----------
    data_width : int

    Attributes
    ----------
    axis : In(AXIStreamSignature(data_width))
    o : Out(stream.Signature(packet_beat_layout(data_width)))
        ``data`` = ``tdata``, ``last`` = ``tlast``.
    """

    def __init__(self, data_width: int):
        super().__init__({"axis": In(AXIStreamSignature(data_width)),
                          "o": Out(stream.Signature(packet_beat_layout(data_width)))})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.o.payload.data.eq(self.axis.tdata), self.o.payload.last.eq(self.axis.tlast),
                     self.o.valid.eq(self.axis.tvalid), self.axis.tready.eq(self.o.ready)]
        return m


class AXIStreamSender(wiring.Component):
    """A ``lib.stream`` as an AXI4-Stream output (wires only, no logic).

    Parameters
    ----------
    data_width : int

    Attributes
    ----------
    i : In(stream.Signature(packet_beat_layout(data_width)))
    axis : Out(AXIStreamSignature(data_width))
        ``tdata`` = ``data``, ``tlast`` = ``last``.
    """

    def __init__(self, data_width: int):
        super().__init__({"i": In(stream.Signature(packet_beat_layout(data_width))),
                          "axis": Out(AXIStreamSignature(data_width))})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.axis.tdata.eq(self.i.payload.data), self.axis.tlast.eq(self.i.payload.last),
                     self.axis.tvalid.eq(self.i.valid), self.i.ready.eq(self.axis.tready)]
        return m
