"""hw.scalar.ScalarUnit in the Amaranth simulator: ``quant_recip`` and ``dequant_scale`` bit-exact against
hw.numerics over the whole input ranges and their edges, and on low-energy inputs whose statistic carries
the instruction's epsilon term (``ssq_with_bias``), with and without idle input cycles and output
backpressure; the exact latency (within host.perf.SCALAR_CYCLES); the result field widths; no multiplier
in the netlist; Verilog export. hw.scalar.SsqBias: ``ssq_with_bias`` bit-exact (carries between the halves,
saturation), its latency and hold."""

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
from hw.scalar import SCALAR_LATENCY, SSQ_BIAS_LATENCY, ScalarRequest, ScalarResult, ScalarUnit, SsqBias
from tests.hw.streams import stream_get_all, stream_put, stream_put_all

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
        payloads = [ScalarRequest.const(dict(zip(_FIELDS, req, strict=True))) for req in reqs]
        await stream_put_all(ctx, dut.i, payloads, idle=idle, rng=rng)

    async def consumer(ctx):
        for p in await stream_get_all(ctx, dut.o, len(reqs), stall=stall, rng=rng, timeout=500):
            got.append((p.r_mant, p.r_shift, p.s_mant, p.s_shift))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return got


def _low_energy_requests(n: int, seed: int) -> list[tuple[int, ...]]:
    """Requests whose statistic is ``ssq_with_bias`` of a low-energy register: inputs with a mean square
    about 1e-4 of the usual one (the residual at 2**-2 .. 2**2 in Q.16 .. Q.26, K = 20 .. 8192) plus the
    compiler's epsilon terms (``K eps`` for ``eps`` 1e-8 .. 1e-4, in the register's units, as a 32-bit
    mantissa and a shift), so that the bias moves the scale (checked: it does for most of them)."""
    rng = random.Random(seed)
    reqs, moved = [], 0
    for _ in range(n):
        k, frac = rng.randint(20, 8192), rng.randint(16, 26)
        rms = 2.0 ** rng.uniform(-2, 2) * 1e-2 * 2 ** frac      # 1e-2 of the usual RMS: 1e-4 of the energy
        reg = int(k * rms * rms) >> nx.SSQ_SHIFT
        v = round(10 ** rng.uniform(-8, -4) * k * 2.0 ** (2 * frac - nx.SSQ_SHIFT))
        shift = max(0, v.bit_length() - 32)
        bias = v >> shift
        amax = max(1, int(rms * rng.uniform(1.5, 4)))
        ssq = nx.ssq_with_bias(reg, bias, shift)
        req = (ssq, amax, rng.randint(*CB_MANT), rng.randint(*CB_SHIFT), rng.randint(*OUT_FRAC))
        moved += _expected(req) != _expected((reg, *req[1:]))
        reqs.append(req)
    assert moved > n // 2
    return reqs


@pytest.mark.parametrize("idle, stall", [(0.0, 0.0), (0.3, 0.5)], ids=["streaming", "idles+backpressure"])
def test_random_and_edges_exact(idle, stall):
    """Random inputs over the whole ranges, the edge cases and low-energy inputs with their epsilon terms,
    exactly as hw.numerics computes them."""
    reqs = _random_requests(150, seed=int(idle * 10)) + _edge_requests() + _low_energy_requests(40, seed=7)
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
    assert dut.latency == SCALAR_LATENCY == ScalarUnit.LATENCY == 61 <= perf.SCALAR_CYCLES
    first_valid = next(c for c, _, v in trace if v)
    assert first_valid == SCALAR_LATENCY
    assert all(v for c, _, v in trace if SCALAR_LATENCY <= c <= 65)
    assert not any(r for c, r, _ in trace if c <= 65)
    assert all(r and not v for c, r, v in trace if c > 65)


def test_cycles_per_request():
    """``ScalarUnit.CYCLES`` (62, host.perf.SCALAR_CYCLES): from a request's transfer cycle through its result's,
    inclusive, when the result is taken as soon as it is valid; the next request is taken in the cycle after."""
    dut = ScalarUnit()
    req = ScalarRequest.const(dict(zip(_FIELDS, (1 << 40, 777, (1 << 24) - 1, 3, 20), strict=True)))
    spans = []

    async def tb(ctx):
        for _ in range(2):
            assert await stream_put(ctx, dut.i, req) == 1          # idle unit: the request goes at once
            ctx.set(dut.o.ready, 1)
            cycles = 1                                               # the request's transfer cycle
            while True:
                _, _, valid = await ctx.tick().sample(dut.o.valid)
                cycles += 1
                if valid:
                    break
            ctx.set(dut.o.ready, 0)
            spans.append(cycles)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert spans == [ScalarUnit.CYCLES] * 2 and ScalarUnit.CYCLES == ScalarUnit.LATENCY + 1 == 62


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


# ------------------------------------------------------------------------------------------- SsqBias
def _bias_cases(n: int, seed: int) -> list[tuple[int, int, int]]:
    """(ssq, bias, bias_shift): random magnitudes, carries out of the low half, saturation and its edge."""
    rng = random.Random(seed)
    cases = [(_random_bits(rng, 64), _random_bits(rng, 32), rng.randint(0, 31)) for _ in range(n)]
    cases += [(0, 0, 0), (SSQ_MAX, 0, 0), (SSQ_MAX, 1, 0), (SSQ_MAX - 1, 1, 0), (0, (1 << 32) - 1, 31),
              (SSQ_MAX - ((1 << 63) - (1 << 31)), (1 << 32) - 1, 31),        # exactly 2**64 - 1
              (SSQ_MAX - ((1 << 63) - (1 << 31)) + 1, (1 << 32) - 1, 31),    # one more: saturates
              ((1 << 32) - 1, 1, 0), ((1 << 63) + (1 << 32) - 1, (1 << 32) - 1, 0),   # carries into the high half
              (1 << 63, 1 << 31, 31), ((1 << 63) - 1, 1, 0), (12345, 77, 5)]
    return cases


def test_ssq_bias_exact():
    """SsqBias against ``hw.numerics.ssq_with_bias``: ``o`` from SSQ_BIAS_LATENCY cycles after ``load`` up to
    and including the next ``load``'s cycle, whatever the inputs do in between; loads back to back and
    apart."""
    cases = _bias_cases(200, seed=11)
    rng = random.Random(12)
    dut = SsqBias()
    checked = []

    async def tb(ctx):
        for j, (ssq, bias, shift) in enumerate(cases):
            ctx.set(dut.load, 1)
            ctx.set(dut.ssq, ssq)
            ctx.set(dut.bias, bias)
            ctx.set(dut.bias_shift, shift)
            await ctx.tick()
            ctx.set(dut.load, 0)
            want = nx.ssq_with_bias(ssq, bias, shift)
            gap = SSQ_BIAS_LATENCY + (rng.randint(0, 3) if j % 2 else 0)
            for c in range(1, gap + 1):
                ctx.set(dut.ssq, rng.getrandbits(64))       # the inputs matter only with load
                ctx.set(dut.bias, rng.getrandbits(32))
                ctx.set(dut.bias_shift, rng.getrandbits(5))
                if c >= SSQ_BIAS_LATENCY:
                    assert ctx.get(dut.o) == want, (ssq, bias, shift)
                if c < gap:
                    await ctx.tick()
            checked.append(want)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert len(checked) == len(cases)
    assert nx.UINT64_MAX in checked and checked.count(nx.UINT64_MAX) >= 3
    assert dut.latency == SSQ_BIAS_LATENCY == SsqBias.LATENCY == 2


def test_ssq_bias_no_multiplier_and_verilog():
    text = rtlil.convert(SsqBias(), name="ssq_bias")
    for cell in ("$mul", "$macc", "$div", "$mod", "$pow"):
        assert f"cell {cell} " not in text
    assert "module ssq_bias" in verilog.convert(SsqBias(), name="ssq_bias")
