"""hw.scalar.ScalarUnit in the Amaranth simulator: ``quant_recip`` and ``dequant_scale`` bit-exact against
hw.numerics over the whole input ranges and their edges, with and without idle input cycles and output
backpressure; the exact latency (within host.perf.SCALAR_CYCLES); the result field widths; no multiplier
in the netlist; Verilog export."""

from __future__ import annotations

import itertools
import random

import pytest
from amaranth.back import rtlil, verilog
from amaranth.hdl import Fragment, Shape
from amaranth.lib.data import Layout
from amaranth.sim import Simulator

from host import perf
from hw import numerics as nx
from hw.scalar import SCALAR_LATENCY, ScalarRequest, ScalarResult, ScalarUnit

pytestmark = pytest.mark.filterwarnings("error")

_FIELDS = ("ssq", "amax", "cb_mant", "cb_shift", "out_frac")

# The ranges the unit is specified for (compiler: cb_mant is a 24-bit mantissa, hw.numerics.float_mant_shift).
SSQ_MAX = (1 << 64) - 1
AMAX_MAX = (1 << 31) - 1
CB_MANT = (1 << 23, (1 << 24) - 1)
CB_SHIFT = (0, 63)
OUT_FRAC = (8, 28)


def _expected(req: tuple[int, ...]) -> tuple[int, int, int, int]:
    ssq, amax, cb_mant, cb_shift, out_frac = req
    return nx.quant_recip(amax) + nx.dequant_scale(ssq, amax, cb_mant, cb_shift, out_frac)


def _random_bits(rng: random.Random, max_bits: int) -> int:
    """A value with a uniformly chosen bit length 0..max_bits (covers every magnitude)."""
    b = rng.randint(0, max_bits)
    return rng.getrandbits(b) | (1 << (b - 1)) if b else 0


# s_shift's extremes for any cb_mant < 2**24, amax < 2**32, cb_shift in [0, 63], out_frac in [0, 63]
_WIDE_EXTREMES = [(SSQ_MAX, 0, 0, 63, 0), (0, (1 << 32) - 1, (1 << 24) - 1, 0, 63)]


def _random_requests(n: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        ssq = _random_bits(rng, 64) if i % 4 else rng.randint(0, SSQ_MAX)
        amax = _random_bits(rng, 31) if i % 4 else rng.randint(0, AMAX_MAX)
        reqs.append((ssq, amax, rng.randint(*CB_MANT), rng.randint(*CB_SHIFT), rng.randint(*OUT_FRAC)))
    return reqs


def _edge_requests() -> list[tuple[int, ...]]:
    """Zeros, ones, powers of two and their neighbours, perfect squares, maxima."""
    ssqs = [0, 1, 2, 3, 4, 5, 8, 1 << 16, (1 << 32) - 1, 1 << 32, 1 << 62, (1 << 63) - 1, 1 << 63,
            ((1 << 32) - 1) ** 2, ((1 << 32) - 1) ** 2 - 1, SSQ_MAX]
    amaxs = [0, 1, 2, 3, 127, 128, 1 << 30, AMAX_MAX]
    reqs = []
    for j, (ssq, amax) in enumerate(itertools.product(ssqs, amaxs)):
        cb_mant = CB_MANT[j % 2]
        reqs.append((ssq, amax, cb_mant, CB_SHIFT[(j // 2) % 2], OUT_FRAC[(j // 4) % 2]))
    # the extremes of s_shift (see test_result_field_widths)
    reqs.append((0, AMAX_MAX, CB_MANT[1], CB_SHIFT[0], OUT_FRAC[1]))
    reqs.append((SSQ_MAX, 1, CB_MANT[0], CB_SHIFT[1], OUT_FRAC[0]))
    return reqs


def _run(reqs, *, idle: float, stall: float, seed: int) -> list[tuple[int, int, int, int]]:
    """Stream ``reqs`` through a ScalarUnit (random idle input cycles, random output backpressure);
    return the results in order, checking that an offered result stays valid and stable until taken."""
    rng = random.Random(seed)
    dut = ScalarUnit()
    got: list[tuple[int, int, int, int]] = []

    async def producer(ctx):
        for req in reqs:
            while rng.random() < idle:
                ctx.set(dut.i.valid, 0)
                await ctx.tick()
            ctx.set(dut.i.payload, ScalarRequest.const(dict(zip(_FIELDS, req, strict=True))))
            ctx.set(dut.i.valid, 1)
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        held = None  # a payload offered but not taken
        quiet = 0
        while len(got) < len(reqs):
            ready = int(rng.random() >= stall)
            ctx.set(dut.o.ready, ready)
            valid, payload = ctx.get(dut.o.valid), ctx.get(dut.o.payload)
            if held is not None:
                assert valid and payload.as_value().value == held, "o changed before its transfer"
            held = None
            if valid and ready:
                got.append((payload.r_mant, payload.r_shift, payload.s_mant, payload.s_shift))
                quiet = 0
            elif valid:
                held = payload.as_value().value
            await ctx.tick()
            quiet += 1
            assert quiet < 500, "no result"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return got


@pytest.mark.parametrize("idle, stall", [(0.0, 0.0), (0.3, 0.5)], ids=["streaming", "idles+backpressure"])
def test_random_and_edges_exact(idle, stall):
    """Random inputs over the whole ranges, and the edge cases, exactly as hw.numerics computes them."""
    reqs = _random_requests(150, seed=int(idle * 10)) + _edge_requests()
    got = _run(reqs, idle=idle, stall=stall, seed=5)
    assert got == [_expected(r) for r in reqs]


def test_full_width_fields():
    """Beyond the specified ranges (cb_mant of 32 bits and 0, amax up to 2**32 - 1, out_frac 0..63,
    negative cb_shift): still exact (s_shift modulo 2**8 where it leaves signed(8))."""
    rng = random.Random(9)
    reqs = [(_random_bits(rng, 64), _random_bits(rng, 32), _random_bits(rng, 32), rng.randint(-60, 60),
             rng.randint(0, 63)) for _ in range(60)]
    reqs += [(5, 0, 0, 0, 0), (SSQ_MAX, (1 << 32) - 1, (1 << 32) - 1, 0, 0), (0, 1 << 31, 1, 3, 63),
             (1 << 40, (1 << 32) - 1, 0, -5, 17)] + _WIDE_EXTREMES
    got = _run(reqs, idle=0.0, stall=0.0, seed=1)
    for req, g in zip(reqs, got, strict=True):
        r_mant, r_shift, s_mant, s_shift = _expected(req)
        assert g == (r_mant, r_shift, s_mant, ((s_shift + 128) % 256) - 128), req


def test_latency_and_ready():
    """o.valid rises exactly SCALAR_LATENCY (61) cycles after the transfer (<= host.perf.SCALAR_CYCLES);
    i.ready is low while busy and returns the cycle after the result's transfer."""
    dut = ScalarUnit()
    req = (12345678901234, 1000, 1 << 23, 10, 16)
    trace = []

    async def tb(ctx):
        ctx.set(dut.i.payload, ScalarRequest.const(dict(zip(_FIELDS, req, strict=True))))
        ctx.set(dut.i.valid, 1)
        assert ctx.get(dut.i.ready)
        await ctx.tick()          # transfer: cycle 0
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.o.ready, 0)
        for cycle in range(1, 70):
            trace.append((cycle, ctx.get(dut.i.ready), ctx.get(dut.o.valid)))
            if cycle == 65:
                ctx.set(dut.o.ready, 1)
                p = ctx.get(dut.o.payload)
                assert (p.r_mant, p.r_shift, p.s_mant, p.s_shift) == _expected(req)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert dut.latency == SCALAR_LATENCY == 61 <= perf.SCALAR_CYCLES
    first_valid = next(c for c, _, v in trace if v)
    assert first_valid == SCALAR_LATENCY
    assert all(v for c, _, v in trace if SCALAR_LATENCY <= c <= 65)
    assert not any(r for c, r, _ in trace if c <= 65)
    assert all(r and not v for c, r, v in trace if c > 65)


def test_result_field_widths():
    """The ScalarResult fields hold every result over the specified input ranges.

    r_mant <= 127 * 2**18 < 2**25, r_shift in [18, 48]; s_mant in [2**23, 2**25); s_shift in [-50, 95]:
    t = 24 - (bitlength(cb_mant * A) - bitlength(root)) lies in [24 - 54, 24 + 8] and
    s_shift = t + cb_shift - out_frac + 8. Checked at the extremes and on random inputs.
    """
    lay = Layout.cast(ScalarResult)
    bits = {name: Shape.cast(lay[name].shape) for name in ("r_mant", "r_shift", "s_mant", "s_shift")}
    assert bits["r_mant"].width == 26 and bits["s_mant"].width == 27
    assert bits["r_shift"].width == 6 and bits["s_shift"] == Shape(8, signed=True)
    rng = random.Random(3)
    reqs = _random_requests(20000, seed=4) + _edge_requests()
    reqs += [(rng.randint(0, SSQ_MAX), rng.randint(0, AMAX_MAX), rng.choice(CB_MANT), rng.choice(CB_SHIFT),
              rng.choice(OUT_FRAC)) for _ in range(2000)]
    res = [_expected(r) for r in reqs]
    r_mants, r_shifts, s_mants, s_shifts = zip(*res, strict=True)
    assert max(r_mants) <= 127 << 18 < 1 << 25 and min(r_mants) >= 127 << 17
    assert (min(r_shifts), max(r_shifts)) == (18, 48)
    assert max(s_mants) < 1 << 25 and min(s_mants) >= 1 << 23
    assert (min(s_shifts), max(s_shifts)) == (-50, 95)
    assert [_expected(r)[3] for r in _WIDE_EXTREMES] == [127, -86]


def test_no_multiplier():
    """Square root, product and divisions are sequential: no multiply, divide or modulo cell."""
    text = rtlil.convert(ScalarUnit(), name="scalar")
    for cell in ("$mul", "$macc", "$div", "$mod", "$divfloor", "$modfloor", "$pow"):
        assert f"cell {cell} " not in text


@pytest.mark.parametrize("name", ["scalar_unit", "mmf_scalar"])
def test_verilog_convert(name):
    v = verilog.convert(ScalarUnit(), name=name)
    assert f"module {name}" in v and "i__payload" in v and "o__payload" in v


def test_ports_and_properties():
    dut = ScalarUnit()
    assert dut.i.payload.shape() is ScalarRequest and dut.o.payload.shape() is ScalarResult
    assert Shape.cast(ScalarRequest).width == 64 + 32 + 32 + 32 + 6
    assert Shape.cast(ScalarResult).width == 26 + 6 + 27 + 8
    with pytest.raises(AttributeError):
        dut.latency = 3
    Fragment.get(dut, None)
