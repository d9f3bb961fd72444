"""Payload layouts of the streams between gateware components (docs/RTL.md), defined once.

The producer and the consumer of every datapath edge import the layout from here, so both sides agree
on the bits (STYLE.md point 7). All are ``amaranth.lib.data`` layouts, structurally compared: two calls
with the same parameters give equal layouts.
"""

from amaranth.hdl import signed
from amaranth.lib import data

__all__ = ["trit_chunk_layout", "code_word_layout", "acc_row_layout"]


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
