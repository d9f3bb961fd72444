# amaranth: UnusedElaboratable=no
"""The epilogue's arithmetic building blocks (``hw/epilogue_arith.py``) against Python integers, in the Amaranth
simulator: ``sat32`` from bits, ``sat32_inc`` (the rounding increment with ``sat32``, from a 32-bit
increment), ``add_cin`` and the two-cycle 32 x 32 product (``mul_parts`` then ``mul_sum``), on edge values
(the int32 and int64 bounds, carries out of the low 31 bits) and random ones.
"""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from hw import numerics as nx
from hw.epilogue_arith import add_cin, mul_parts, mul_sum, sat32, sat32_inc

pytestmark = pytest.mark.filterwarnings("error")


def _run(m: Module, inputs, vectors, check) -> int:
    """Apply each input vector (a tuple of values for ``inputs``) and call ``check(ctx, *vector)``; returns
    how many ran."""
    done = []

    async def bench(ctx):
        for vec in vectors:
            for sig, value in zip(inputs, vec, strict=True):
                ctx.set(sig, value)
            await ctx.delay(1e-9)
            check(ctx, *vec)
            done.append(1)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    return len(done)


def _sat(v: int) -> int:
    """sat32 of a Python int of any size (``hw.numerics.sat32`` is int64)."""
    return max(nx.INT32_MIN, min(nx.INT32_MAX, v))


def _edges(bits: int) -> list[int]:
    """Values around the int32 bounds and the carry edges of a signed ``bits``-bit word."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    out = {lo, hi, 0, -1, 1, -2, 2}
    for base in (nx.INT32_MIN, nx.INT32_MAX, 1 << 31, -(1 << 31) - 1, 1 << 32, -(1 << 32), (1 << 31) - 2,
                 -(1 << 32) + (1 << 31) - 1):
        for d in (-2, -1, 0, 1, 2):
            v = base + d
            if lo <= v <= hi:
                out.add(v)
    return sorted(out)


@pytest.mark.parametrize("width", [33, 34, 50, 64])
def test_sat32_inc(width):
    rng = np.random.default_rng(width)
    t, inc = Signal(signed(width)), Signal()
    out, ref_sat = Signal(signed(32)), Signal(signed(32))
    m = Module()
    m.d.comb += [out.eq(sat32_inc(t, inc)), ref_sat.eq(sat32(t))]
    mags = np.floor(2.0 ** rng.uniform(0, width - 1, 400)).astype(object)
    rand = [int(v) * (1 if s else -1) for v, s in zip(mags, rng.integers(0, 2, 400), strict=True)]
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    values = [v for v in _edges(width) + rand if lo <= v <= hi]
    vectors = [(v, i) for v in values for i in (0, 1)]

    def check(ctx, v, i):
        assert ctx.get(out) == _sat(v + i), (width, v, i)
        assert ctx.get(ref_sat) == _sat(v), (width, v)

    assert _run(m, (t, inc), vectors, check) == len(vectors)


def test_sat32_of_unsigned_and_narrow():
    u, n = Signal(unsigned(40)), Signal(signed(20))
    ou, on = Signal(signed(32)), Signal(signed(32))
    m = Module()
    m.d.comb += [ou.eq(sat32(u)), on.eq(sat32(n))]
    vectors = [(a, b) for a in (0, 1, (1 << 31) - 1, 1 << 31, (1 << 40) - 1) for b in (-(1 << 19), -1, 0, 5)]

    def check(ctx, a, b):
        assert ctx.get(ou) == _sat(a) and ctx.get(on) == b

    assert _run(m, (u, n), vectors, check) == len(vectors)


def test_add_cin():
    x, y, c = Signal(32), Signal(15), Signal()
    s = Signal(33)
    m = Module()
    m.d.comb += s.eq(add_cin(x, y, c))
    rng = np.random.default_rng(7)
    vectors = [(int(a), int(b), int(k)) for a, b, k in zip(
        [0, (1 << 32) - 1, (1 << 32) - 1, *rng.integers(0, 1 << 32, 100)],
        [0, 0, (1 << 15) - 1, *rng.integers(0, 1 << 15, 100)], [1, 1, 1, *rng.integers(0, 2, 100)], strict=True)]

    def check(ctx, a, b, k):
        assert ctx.get(s) == a + b + k

    assert _run(m, (x, y, c), vectors, check) == len(vectors)


def test_two_cycle_product():
    x, y = Signal(signed(32)), Signal(signed(32))
    p = Signal(signed(64))
    m = Module()
    low, high, mid = mul_parts(x, y)
    m.d.comb += p.eq(mul_sum(low, high, mid))
    rng = np.random.default_rng(11)
    edge = [nx.INT32_MIN, nx.INT32_MAX, 0, 1, -1, 0xFFFF, 0x10000, -0x10000, -0x10001, 0x7FFF, -0x8000]
    rand = [int(v) for v in rng.integers(nx.INT32_MIN, nx.INT32_MAX, 200, endpoint=True)]
    vectors = [(a, b) for a in edge for b in edge] + list(zip(rand[::2], rand[1::2], strict=True))

    def check(ctx, a, b):
        assert ctx.get(p) == a * b, (a, b)

    assert _run(m, (x, y), vectors, check) == len(vectors)
