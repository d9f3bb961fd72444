"""hw.quant.Quantizer in the Amaranth simulator, with ``lib.memory`` source, QC and code buffers: every
code word exact against hw.numerics (``quantize(mul(src, qc, q_shift), r_mant, r_shift)``, or
``quantize(src, ...)`` without QCONST), k not a multiple of quant_lanes or lanes, with and without idle
cycles between commands; products exactly half-way between two codes in both signs (rounded away from
zero); the write order, ``done`` timing (``ceil(k / quant_lanes) + 7`` cycles, as host.perf models it) and
one read per cycle; the multiplier count; Verilog export.

The write port has no backpressure (a memory always accepts), so there is none to randomize."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
from amaranth.back import rtlil, verilog
from amaranth.hdl import Fragment, Module, UnusedElaboratable
from amaranth.lib import memory, stream, wiring
from amaranth.sim import Simulator

from host import perf
from hw import isa
from hw import numerics as nx
from hw.quant import QUANT_LATENCY, QuantCmd, Quantizer, src_word_layout
from hw.streams import code_word_layout
from tests.hw.streams import stream_put_all

pytestmark = pytest.mark.filterwarnings("error")

_GARBAGE = 0x5A  # initial code-buffer contents: shows which words were written


class _Bench(wiring.Component):
    """The quantizer with its three buffers: src and QC memories (read ports), the code memory (write port)."""

    def __init__(self, *, quant_lanes: int, lanes: int, max_k: int, src: np.ndarray, qc: np.ndarray):
        self.dut = Quantizer(quant_lanes=quant_lanes, lanes=lanes, max_k=max_k)

        def words(v):
            w = np.zeros(self.dut.src_depth * quant_lanes, np.int64)
            w[:v.size] = v
            return [list(map(int, x)) for x in w.reshape(-1, quant_lanes)]

        self.src_mem = memory.Memory(shape=src_word_layout(quant_lanes), depth=self.dut.src_depth,
                                     init=words(src))
        self.qc_mem = memory.Memory(shape=src_word_layout(quant_lanes), depth=self.dut.src_depth, init=words(qc))
        self.codes_mem = memory.Memory(shape=code_word_layout(lanes), depth=self.dut.code_depth,
                                       init=[[_GARBAGE] * lanes] * self.dut.code_depth)
        super().__init__({"cmd": wiring.In(stream.Signature(QuantCmd)), "done": wiring.Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        m.submodules.src_mem = self.src_mem
        m.submodules.qc_mem = self.qc_mem
        m.submodules.codes_mem = self.codes_mem
        wiring.connect(m, self.dut.src, self.src_mem.read_port())
        wiring.connect(m, self.dut.qc, self.qc_mem.read_port())
        wiring.connect(m, self.dut.codes, self.codes_mem.write_port())
        wiring.connect(m, wiring.flipped(self.cmd), self.dut.cmd)
        m.d.comb += self.done.eq(self.dut.done)
        return m


def _expected_words(src, qc, cmd: dict, lanes: int) -> list[list[int]]:
    k = cmd["k"]
    s = src[:k].astype(np.int64)
    w = nx.mul(s, qc[:k].astype(np.int64), cmd["q_shift"]) if cmd["qconst"] else s
    q = nx.quantize(w, cmd["r_mant"], cmd["r_shift"])
    n = max(-(-k // lanes), 1)
    out = np.zeros(n * lanes, np.int64)
    out[:k] = q
    return [list(map(int, x)) for x in out.reshape(n, lanes)]


def _run(quant_lanes: int, lanes: int, max_k: int, src, qc, cmds: list[dict], *, idle: float, seed: int):
    """Run ``cmds``; return per command (transfer cycle, [(cycle, addr, word)], done cycles, read cycles)
    and the final code memory."""
    rng = np.random.default_rng(seed)
    bench = _Bench(quant_lanes=quant_lanes, lanes=lanes, max_k=max_k, src=src, qc=qc)
    dut = bench.dut
    events = {"xfer": [], "writes": [], "done": [], "reads": [], "qc_reads": []}
    final = []

    async def producer(ctx):
        await stream_put_all(ctx, bench.cmd, [QuantCmd.const(c) for c in cmds], idle=idle, rng=rng)
        for _ in range(200):
            if len(events["done"]) == len(cmds):
                break
            await ctx.tick()
        for _ in range(10):  # nothing more happens
            await ctx.tick()
        final.extend([int(x) for x in ctx.get(bench.codes_mem.data[a])] for a in range(dut.code_depth))

    async def monitor(ctx):
        cycle = 0
        async for _, _, cv, cr, se, qe, we, wa, wd, done in ctx.tick().sample(
                bench.cmd.valid, bench.cmd.ready, dut.src.en, dut.qc.en, dut.codes.en, dut.codes.addr,
                dut.codes.data, dut.done):
            if cv and cr:
                events["xfer"].append(cycle)
            if se:
                events["reads"].append(cycle)
            if qe:
                events["qc_reads"].append(cycle)
            if we:
                events["writes"].append((cycle, int(wa), [int(x) for x in wd]))
            if done:
                events["done"].append(cycle)
            cycle += 1

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_process(monitor)
    sim.run()
    return events, final


def _check(quant_lanes, lanes, src, qc, cmds, events, final):
    assert len(events["xfer"]) == len(events["done"]) == len(cmds)
    writes = list(events["writes"])
    reads = list(events["reads"])
    qc_reads = list(events["qc_reads"])
    for c, t0, t_done in zip(cmds, events["xfer"], events["done"], strict=True):
        n_src = max(-(-c["k"] // quant_lanes), 1)
        exp = _expected_words(src, qc, c, lanes)
        # one source word per cycle from the transfer cycle on
        mine, reads = reads[:n_src], reads[n_src:]
        assert mine == list(range(t0, t0 + n_src))
        if c["qconst"]:
            mine_qc, qc_reads = qc_reads[:n_src], qc_reads[n_src:]
            assert mine_qc == mine
        # the code words in order, done with the last one, ceil(k / quant_lanes) + QUANT_LATENCY (7) cycles on
        got, writes = writes[:len(exp)], writes[len(exp):]
        assert [a for _, a, _ in got] == list(range(len(exp)))
        assert [w for _, _, w in got] == exp, c
        assert t_done == got[-1][0] == t0 + n_src + QUANT_LATENCY == t0 + Quantizer.done_cycles(c["k"], quant_lanes)
    assert not writes and not reads and not qc_reads
    # the memory holds the last command's words (and garbage beyond the longest command)
    exp = _expected_words(src, qc, cmds[-1], lanes)
    assert final[:len(exp)] == exp
    longest = max(max(-(-c["k"] // lanes), 1) for c in cmds)
    assert all(w == [_GARBAGE] * lanes for w in final[longest:])


def _random_vectors(rng, max_k):
    """src: int32 of mixed magnitudes (residual-stream-like and full-range); qc: block-float mantissas."""
    mag = rng.choice([1 << 8, 1 << 20, 1 << 31], max_k)
    src = np.clip(rng.integers(-(1 << 31), 1 << 31, max_k) % (2 * mag) - mag, nx.INT32_MIN, nx.INT32_MAX)
    qc = rng.integers(-(1 << 30), 1 << 30, max_k)
    qc[::7] = rng.integers(nx.INT32_MIN, nx.INT32_MAX + 1, qc[::7].size)
    return src.astype(np.int64), qc.astype(np.int64)


def _random_cmds(rng, src, qc, quant_lanes, lanes, max_k, n):
    cmds = []
    for i in range(n):
        k = int(rng.integers(1, max_k + 1))
        while k > 1 and (k % quant_lanes == 0 or k % lanes == 0):
            k -= 1
        qconst = int(i % 2 == 0)
        q_shift = int(rng.integers(0, 64)) if i % 3 == 0 else int(rng.integers(24, 40))
        s = src[:k].astype(np.int64)
        w = nx.mul(s, qc[:k].astype(np.int64), q_shift) if qconst else s
        amax = int(np.max(np.abs(w)))
        if i % 4 == 3:
            amax = int(rng.integers(0, amax + 1))  # a stale absmax: codes clamp
        r_mant, r_shift = nx.quant_recip(amax)
        if i % 5 == 4:
            r_mant, r_shift = int(rng.integers(0, 1 << 26)), int(rng.integers(1, 64))  # any field values
        cmds.append({"k": k, "q_shift": q_shift, "qconst": qconst, "r_mant": r_mant, "r_shift": r_shift})
    return cmds


@pytest.mark.parametrize("quant_lanes, lanes", [(1, 4), (4, 4), (4, 16), (3, 12), (8, 64)])
@pytest.mark.parametrize("idle", [0.0, 0.4], ids=["back-to-back", "idles"])
def test_random_vectors_exact(quant_lanes, lanes, idle):
    """Random vectors and commands (k not a multiple of quant_lanes or lanes, with and without QCONST)."""
    rng = np.random.default_rng(quant_lanes * 100 + lanes + int(idle * 10))
    max_k = 2 * lanes + 5 * quant_lanes + 3
    src, qc = _random_vectors(rng, max_k)
    cmds = _random_cmds(rng, src, qc, quant_lanes, lanes, max_k, 8)
    events, final = _run(quant_lanes, lanes, max_k, src, qc, cmds, idle=idle, seed=1)
    _check(quant_lanes, lanes, src, qc, cmds, events, final)
    if idle == 0:  # back to back: the next command goes 8 cycles after the previous one's last read
        for c, t0, t1 in zip(cmds[:-1], events["xfer"], events["xfer"][1:], strict=False):
            assert t1 == t0 + max(-(-c["k"] // quant_lanes), 1) + QUANT_LATENCY


def test_edges_exact():
    """Saturation and wrap corners of ``mul`` (int32 extremes, q_shift 0 and 63, the int64 wrap of
    ``-2**31 * -2**31 + 2**62``), codes at +-127/-128, k = 1, k = max_k (whole words), k = 0; the last
    shifts where the threshold compares hand over to the plain shift (q_shift 31/32, r_shift 55/56)."""
    ql, lanes = 4, 8
    max_k = 3 * lanes
    src = np.array([nx.INT32_MIN, nx.INT32_MAX, -1, 0, 1, nx.INT32_MIN, 12345, -77777] * 3, np.int64)
    qc = np.array([nx.INT32_MIN, nx.INT32_MAX, nx.INT32_MIN, 5, -1, 1, nx.INT32_MAX, -(1 << 30)] * 3, np.int64)
    cmds = []
    for q_shift in (0, 1, 31, 32, 62, 63):
        for r_mant, r_shift in (nx.quant_recip(0), nx.quant_recip(1 << 31), nx.quant_recip(100), ((1 << 26) - 1, 1),
                                ((1 << 26) - 1, 55), ((1 << 26) - 1, 56), ((1 << 26) - 1, 63), (1, 1), (3, 2)):
            cmds.append({"k": max_k, "q_shift": q_shift, "qconst": 1, "r_mant": r_mant, "r_shift": r_shift})
    cmds += [{"k": max_k, "q_shift": 5, "qconst": 0, "r_mant": 127 << 17, "r_shift": 49},
             {"k": 1, "q_shift": 63, "qconst": 1, "r_mant": 1 << 25, "r_shift": 20},
             {"k": 0, "q_shift": 0, "qconst": 0, "r_mant": 1, "r_shift": 1},
             {"k": max_k - 1, "q_shift": 30, "qconst": 1, "r_mant": 1 << 25, "r_shift": 40}]
    events, final = _run(ql, lanes, max_k, src, qc, cmds, idle=0.2, seed=2)
    _check(ql, lanes, src, qc, cmds, events, final)
    # hw.numerics wraps the rounding add in int64 here, and the gateware does the same
    assert int(nx.mul(np.array([nx.INT32_MIN]), np.array([nx.INT32_MIN]), 63)[0]) == -1


def _ties(r_mant: int, r_shift: int, rng) -> np.ndarray:
    """Values ``w`` whose ``w * r_mant * 2**-r_shift`` lies exactly half-way between two codes, in both signs
    (codes -129.5 .. 128.5, so ties at the clamp too), with their neighbours ``w +- 1`` (not ties unless
    ``r_mant`` is tiny) and a few zeros."""
    # w * r_mant = (2 c + 1) * 2**(r_shift - 1): with r_mant = o * 2**t (o odd), c such that o divides 2 c + 1
    t = (r_mant & -r_mant).bit_length() - 1
    o = r_mant >> t
    assert t < r_shift
    halves = np.array([h for h in range(-259, 259, 2) if h % o == 0], np.int64)
    w = halves // o << (r_shift - 1 - t)
    w = w[np.abs(w) < 1 << 31]
    assert w.size, (r_mant, r_shift)
    picked = rng.choice(w, min(w.size, 40), replace=False)
    p = picked.astype(object) * r_mant
    assert all(x % (1 << r_shift) == 1 << (r_shift - 1) for x in p)        # exactly half-way
    out = np.concatenate([picked, picked + 1, picked - 1, [0, 0]])
    return out[np.abs(out) < 1 << 31]


@pytest.mark.parametrize("r_mant, r_shift", [(1, 1), (1, 6), (3, 9), (5 << 4, 12), (9 << 20, 30),
                                             nx.quant_recip(1 << 20)])
def test_ties_round_half_away_from_zero(r_mant, r_shift):
    """Products at exactly .5 of a code, positive and negative, without QCONST and through ``mul`` by 1:
    ``-2.5 -> -3``, ``2.5 -> 3`` (``hw.numerics.quantize``), also where the tie is at the clamp (+-127.5,
    -128.5). With a power-of-two absmax ``A`` (``quant_recip``: ``r_mant = 127 * 2**18``) the only ties are
    ``w = +-A/2``, codes +-63.5."""
    ql, lanes = 4, 8
    rng = np.random.default_rng(r_mant + r_shift)
    src = _ties(r_mant, r_shift, rng)
    max_k = -(-src.size // lanes) * lanes
    src = np.concatenate([src, np.zeros(max_k - src.size, np.int64)])
    qc = np.ones(max_k, np.int64)
    exact = np.asarray([float(x) * r_mant / 2.0 ** r_shift for x in src])
    half = np.abs(exact - np.trunc(exact)) == 0.5
    away = np.clip(np.trunc(exact) + np.sign(exact) * half, -128, 127)
    assert (exact[half] < 0).any() and (exact[half] > 0).any()
    codes = nx.quantize(src, r_mant, r_shift)
    np.testing.assert_array_equal(codes[half], away[half])                  # the oracle rounds half away
    cmds = [{"k": max_k, "q_shift": 0, "qconst": q, "r_mant": r_mant, "r_shift": r_shift} for q in (0, 1)]
    cmds.append({"k": max_k - 3, "q_shift": 0, "qconst": 0, "r_mant": r_mant, "r_shift": r_shift})
    events, final = _run(ql, lanes, max_k, src, qc, cmds, idle=0.3, seed=r_shift)
    _check(ql, lanes, src, qc, cmds, events, final)


def test_latency_matches_perf_model():
    q = Quantizer(quant_lanes=8, lanes=64)
    assert q.latency == QUANT_LATENCY == Quantizer.LATENCY == perf.QUANT_LATENCY
    assert [Quantizer.done_cycles(k, 4) for k in (0, 1, 4, 5)] == [8, 8, 8, 9]
    with pytest.raises(ValueError, match="quant_lanes"):
        Quantizer.done_cycles(8, 0)
    Fragment.get(q, None)


@pytest.mark.parametrize("quant_lanes, lanes", [(3, 12), (8, 64)])
def test_multiplier_count(quant_lanes, lanes):
    """Five multipliers per lane (mul as four 16 x 16 partial products, and quantize); the rest adds,
    shifts and compares."""
    dut = Quantizer(quant_lanes=quant_lanes, lanes=lanes)
    text = rtlil.convert(dut, name="quant")
    assert text.count("cell $mul ") == dut.multipliers == 5 * quant_lanes
    for cell in ("$div", "$mod", "$divfloor", "$modfloor", "$pow"):
        assert f"cell {cell} " not in text


@pytest.mark.parametrize("quant_lanes, lanes", [(1, 4), (64, 256)])
def test_verilog_convert(quant_lanes, lanes):
    name = f"quantizer_{quant_lanes}_{lanes}"
    v = verilog.convert(Quantizer(quant_lanes=quant_lanes, lanes=lanes), name=name)
    assert f"module {name}" in v
    assert "cmd__payload" in v and "src__addr" in v and "qc__data" in v and "codes__en" in v


def test_ports_and_properties():
    q = Quantizer(quant_lanes=8, lanes=64)
    assert (q.quant_lanes, q.lanes, q.max_k) == (8, 64, isa.MAX_K)
    assert q.src_depth == isa.MAX_K // 8 and len(q.src.addr) == 10 and len(q.qc.addr) == 10
    assert q.code_depth == isa.MAX_K // 64 and len(q.codes.addr) == 7
    assert q.src.data.shape() == src_word_layout(8) and q.codes.data.shape() == code_word_layout(64)
    assert q.cmd.payload.shape() is QuantCmd
    with pytest.raises(AttributeError):
        q.latency = 3
    Fragment.get(q, None)
    r = Quantizer(quant_lanes=3, lanes=12, max_k=100)
    assert (r.src_depth, r.code_depth) == (34, 9)
    Fragment.get(r, None)


@pytest.mark.parametrize("kwargs, exc, word", [
    ({"quant_lanes": 0, "lanes": 4}, ValueError, "0"),
    ({"quant_lanes": 65, "lanes": 260}, ValueError, "65"),
    ({"quant_lanes": 4, "lanes": 3}, ValueError, "3"),
    ({"quant_lanes": 4, "lanes": 512}, ValueError, "512"),
    ({"quant_lanes": 3, "lanes": 16}, ValueError, "16"),
    ({"quant_lanes": 4.0, "lanes": 16}, TypeError, "4.0"),
    ({"quant_lanes": True, "lanes": 16}, TypeError, "True"),
    ({"quant_lanes": 4, "lanes": "16"}, TypeError, "'16'"),
    ({"quant_lanes": 4, "lanes": 16, "max_k": 15}, ValueError, "15"),
    ({"quant_lanes": 4, "lanes": 16, "max_k": 1 << 16}, ValueError, "65536"),
])
def test_parameter_validation(kwargs, exc, word):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)  # the half-built component is dropped
        with pytest.raises(exc, match=word):
            Quantizer(**kwargs)
        gc.collect()
