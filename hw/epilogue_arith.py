"""The epilogue's arithmetic building blocks: saturation, carry-in adders and the two-cycle 32 x 32 product.

Combinational expression builders (no state) shared by the epilogue's entry and its micro-op stage
(:mod:`hw.epilogue_stage`); each gives the value of the :mod:`hw.numerics` operation it names, bit for bit
(``tests/hw/test_epilogue_arith.py`` checks them against Python integers). None is wider than 64 bits.
"""

from amaranth.hdl import Cat, Const, Mux, Value, signed, unsigned

from hw import numerics as nx

__all__ = ["INT32", "I32_MIN", "I32_MAX", "U64_MAX", "add_cin", "sat32", "sat32_inc", "mul_parts", "mul_sum"]

INT32 = signed(32)
I32_MIN = Const(nx.INT32_MIN, INT32)       #: ``hw.numerics.INT32_MIN`` as a 32-bit constant
I32_MAX = Const(nx.INT32_MAX, INT32)       #: ``hw.numerics.INT32_MAX`` as a 32-bit constant
U64_MAX = Const(nx.UINT64_MAX, unsigned(64))   #: a saturated reduction, ``2**64 - 1``


def add_cin(x, y, cin):
    """``x + y + cin`` (unsigned ``x``, ``y``; ``cin`` one bit) as one adder, ``max(len(x), len(y)) + 1`` bits
    wide with the carry out on top: the carry in enters as an extra low bit of both operands."""
    return (Cat(cin, x) + Cat(cin, y))[1:]


def sat32(v):
    """``hw.numerics.sat32`` of an expression (to be assigned to a 32-bit signal), from its bits: an overflow is
    a word above bit 30 that is not all sign bits (no comparator, no carry chain)."""
    v = Value.cast(v)
    width = len(v)
    if not v.shape().signed:
        return v if width <= 31 else Mux(v[31:].any(), I32_MAX, v[:32].as_signed())
    if width <= 32:
        return v
    top = v[31:width - 1]
    return Mux(~v[width - 1] & top.any(), I32_MAX, Mux(v[width - 1] & ~top.all(), I32_MIN, v[:32].as_signed()))


def sat32_inc(t, inc):
    """``sat32(t + inc)`` for a signed ``t`` (33..64 bits) and a one-bit ``inc`` (the rounding increment) with a
    32-bit increment only: ``t + inc`` fits int32 iff ``t``'s bits above bit 30, plus the carry out of its low
    31 bits, make all zeros or all ones (``t >> 31 = -2`` with the carry gives ``INT32_MIN``, which the
    saturation gives too); otherwise it saturates to ``t``'s sign."""
    t = Value.cast(t)
    width = len(t)
    assert t.shape().signed and 33 <= width <= 64
    low = t[:32] + inc
    carry = inc & t[:31].all()
    top = t[31:]                      # width - 31 >= 2 bits
    fits = (~top.any() & ~carry) | top.all()
    return Mux(fits, low[:32].as_signed(), Mux(t[width - 1], I32_MIN, I32_MAX))


def mul_parts(x, y):
    """First cycle of a 32 x 32 signed product: the four 16 x 16 partial products (one 18 x 18 multiplier each),
    the two middle ones already summed: ``(low, high, mid)`` with ``x * y = (high << 32) + (mid << 16) + low``."""
    xl, xh, yl, yh = x[:16], x[16:32].as_signed(), y[:16], y[16:32].as_signed()
    return xl * yl, xh * yh, xl * yh + xh * yl


def mul_sum(low, high, mid):
    """Second cycle: ``x * y`` (signed 64) from :func:`mul_parts`'s registers, one 48-bit adder (the low 16 bits
    of ``low`` pass)."""
    return Cat(low[:16], (Cat(low[16:32], high).as_signed() + mid)[:48]).as_signed()
