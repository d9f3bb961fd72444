# amaranth: UnusedElaboratable=no
"""hw.epilogue.Epilogue in the Amaranth simulator, bit-exact against hw.numerics and the golden device.

(1) every micro-op alone on random inputs (saturation edges, negative and huge dequantization shifts,
sigmoid tails beyond +-16) against the hw.numerics formulas; (2) every program the compiler emits for a
tiny model (both output gates; the released gate's g_proj reduces twice into one register) against
``host.devices.golden._Executor._epilogue`` (a pure function of its arguments), with random accumulators, buffers and
state, and scales formed as the scalar unit would from the statistic with its epsilon term
(``ssq_with_bias``), some of low-energy inputs; each with and without input idles and logits backpressure,
in the pipelined and the folded form.
"""

import dataclasses
from collections import Counter, deque
from types import SimpleNamespace

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module, signed
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator

from host.compiler import CompileOptions, compile_program
from host.devices.golden import _Executor
from host.image import MicroOpSpec
from host.model import HGRNBitConfig, random_weights
from hw import numerics as nx
from hw.epilogue import (
    ENTRY_LATENCY,
    READ_BUFFERS,
    STAGE_LATENCY,
    WRITE_BUFFERS,
    Epilogue,
    FoldedEpilogue,
    PipelinedEpilogue,
    epilogue_class,
)
from hw.isa import ACC_BITS, MAX_OPS, Buffer, MicroOpcode, Opcode
from tests.hw.streams import stream_get, stream_put, stream_put_all

pytestmark = pytest.mark.filterwarnings("error")

M = MicroOpcode
DEPTH = 64          # buffer words in the harness (index_bits = 6)
INDEX_BITS = 6
N = 24              # elements per micro-op case
I32 = (nx.INT32_MIN, nx.INT32_MAX)


class Harness(Elaboratable):
    """The epilogue with a memory per buffer, connected with ``connect`` as the sequencer will."""

    def __init__(self, **params):
        self.dut = Epilogue(index_bits=INDEX_BITS, **params)
        self.mems = {b: Memory(shape=signed(32), depth=DEPTH, init=[]) for b in READ_BUFFERS}

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        for b, mem in self.mems.items():
            m.submodules[f"mem_{b.name.lower()}"] = mem
            connect(m, getattr(self.dut, f"rd_{b.name.lower()}"), mem.read_port())
            if b in WRITE_BUFFERS:
                connect(m, getattr(self.dut, f"wr_{b.name.lower()}"), mem.write_port())
        return m


@dataclasses.dataclass
class Case:
    """One instruction: its program, inputs, buffer contents and the expectations from hw.numerics."""

    ops: list
    values: np.ndarray
    mem: dict
    raw: bool = True
    s_mant: int = 0
    s_shift: int = 0
    n_ops: int | None = None          # default len(ops); ops beyond it are garbage the unit must ignore
    layer: int = 0
    golden: bool = True               # compare with the golden epilogue
    expect: dict = dataclasses.field(default_factory=dict)   # "logits", "regs" {k: v}, "argmax", Buffer: arr
    saturate_acc: dict | None = None  # white box: {stage: value} preset into stage accumulators after start


# ------------------------------------------------------------------------------------- stimulus
def mixed(rng, n, edges=()):
    """int32 values of every magnitude (log-uniform), both signs, with ``edges`` mixed in."""
    v = np.sign(rng.standard_normal(n)) * np.floor(2.0 ** rng.uniform(0, 31.0, n))
    v = np.clip(v, *I32).astype(np.int64)
    e = np.asarray([x for x in edges if I32[0] <= x <= I32[1]], dtype=np.int64)[: n // 2]
    pos = rng.choice(n, e.size, replace=False)
    v[pos] = e
    return v


EDGES = (nx.INT32_MIN, nx.INT32_MAX, nx.INT32_MIN + 1, nx.INT32_MAX - 1, 0, 1, -1)


def random_mem(rng):
    return {b: mixed(rng, DEPTH, EDGES) for b in READ_BUFFERS}


def op(o, **kw):
    return MicroOpSpec(op=o, **kw)


def sigmoid_exact(x, in_frac, table, seg):
    """hw.numerics.sigmoid in Python integers (numpy's int64 product wraps for huge ``in_frac``)."""
    step = in_frac + nx.LUT_RANGE_LOG2 + 1 - seg
    lo = -(1 << (nx.LUT_RANGE_LOG2 + in_frac))
    out = []
    for v in np.asarray(x).tolist():
        xc = min(max(v, lo), -lo - 1) - lo
        i, f = xc >> step, xc & ((1 << step) - 1)
        t0, t1 = int(table[i]), int(table[i + 1])
        out.append(t0 + (((t1 - t0) * f + (1 << (step - 1))) >> step))
    return np.asarray(out, dtype=np.int64)


def sigmoid_ref(x, in_frac, table, seg):
    """hw.numerics.sigmoid where its int64 arithmetic is exact (checked equal to the exact model), else
    the exact model."""
    exact = sigmoid_exact(x, in_frac, table, seg)
    step = in_frac + nx.LUT_RANGE_LOG2 + 1 - seg
    if int(np.diff(table).max()) << step < 1 << 63:
        np.testing.assert_array_equal(nx.sigmoid(x, in_frac, table, seg), exact)
    return exact


def op_cases(rng, seg):
    """Test (1): every micro-op alone; each case checks up to three independent variants (ST X, ST P, OUT)."""
    table = nx.sigmoid_table(seg)
    cases = []

    def grouped(variants, edges=EDGES, golden=True):
        for j in range(0, len(variants), 3):
            group = variants[j:j + 3]
            x = mixed(rng, N, edges)
            mem = random_mem(rng)
            b, v = mem[Buffer.C0][:N], mem[Buffer.C1][:N]
            ops, expect = [op(M.LD, dst=2, buf=Buffer.C0)], {}
            for (spec, fn), sink in zip(group, ("X", "P", "OUT"), strict=False):
                ops.append(spec)
                want = fn(x, b, v, mem)
                if sink == "OUT":
                    ops.append(op(M.OUT, a=3))
                    expect["logits"] = want
                else:
                    ops.append(op(M.ST, a=3, buf=Buffer[sink]))
                    expect[Buffer[sink]] = want
            cases.append(Case(ops=ops, values=x, mem=mem, expect=expect, golden=golden))

    def spec(o, **kw):
        return op(o, dst=3, a=kw.pop("a", 0), b=kw.pop("b", 2), **kw)

    variants = [(spec(M.ADD), lambda x, b, v, mm: nx.sat32(x + b)),
                (spec(M.SUB), lambda x, b, v, mm: nx.sat32(x - b)),
                (spec(M.SUB, a=2, b=0), lambda x, b, v, mm: nx.sat32(b - x)),
                (spec(M.ADDV, buf=Buffer.C1), lambda x, b, v, mm: nx.sat32(x + v))]
    variants += [(spec(M.MUL, shift=s), lambda x, b, v, mm, s=s: nx.mul(x, b, s)) for s in (0, 1, 16, 30, 31, 45, 62)]
    variants += [(spec(M.MULV, buf=Buffer.C1, shift=s), lambda x, b, v, mm, s=s: nx.mul(x, v, s)) for s in (0, 20, 62)]
    variants += [(spec(M.RSUB1, shift=s), lambda x, b, v, mm, s=s: nx.sat32((1 << s) - x))
                 for s in (0, 20, 30, 31, 32, 62)]
    grouped(variants)
    # LD from every buffer; X and P are read before this program's ST X / ST P (the compiler's guarantee)
    order = (Buffer.X, Buffer.P, Buffer.A, Buffer.STATE_OLD, Buffer.STATE_NEW, Buffer.C0, Buffer.C1, Buffer.C2,
             Buffer.C3)
    grouped([(spec(M.LD, buf=bf), lambda x, b, v, mm, bf=bf: mm[bf][:N]) for bf in order])

    # sigmoid family, one shift per case, with the clamp edges and tails beyond +-16 of that format
    for s in sorted({seg - 4, 8, 16, 26, 27, 28, 40, 62} - set(range(seg - 4))):
        lim = 1 << (s + 4)
        edges = (*EDGES, lim, lim - 1, lim + 1, -lim, -lim - 1, -lim + 1, 3 * lim, -3 * lim, lim >> 1, -(lim >> 1))
        exact_ok = int(np.diff(table).max()) << (s + 5 - seg) < 1 << 63
        grouped([(spec(M.SIG, shift=s), lambda x, b, v, mm, s=s: sigmoid_ref(x, s, table, seg)),
                 (spec(M.SIGNEG, shift=s), lambda x, b, v, mm, s=s: sigmoid_ref(nx.sat32(-x), s, table, seg)),
                 (spec(M.SILU, shift=s),
                  lambda x, b, v, mm, s=s: nx.mul(x, sigmoid_ref(x, s, table, seg), nx.GATE_FRAC))],
                edges=edges, golden=exact_ok)

    # dequantization: r0 = dequant(acc, s_mant, s_shift), r1 = acc, r2 = r3 = 0
    amax = 1 << (ACC_BITS - 1)
    for sh in (-128, -40, -32, -3, -1, 0, 1, 9, 17, 24, 47, 62, 63, 127):   # 9, 17: (sh - 1) % 8 == 0
        acc = rng.integers(-amax, amax, N)
        acc[:4] = (-amax, amax - 1, 0, -1)
        acc[4:10] = np.sign(acc[4:10]) * (np.abs(acc[4:10]) >> rng.integers(0, 20, 6))
        s_mant = int(rng.choice([(1 << 27) - 1, int(rng.integers(1 << 25, 1 << 26)), int(rng.integers(0, 1 << 27))]))
        ops = [op(M.OUT, a=0), op(M.ST, a=1, buf=Buffer.X), op(M.ST, a=2, buf=Buffer.A), op(M.ST, a=3, buf=Buffer.P)]
        cases.append(Case(ops=ops, values=acc, mem=random_mem(rng), raw=False, s_mant=s_mant, s_shift=sh,
                          expect={"logits": nx.dequant(acc, s_mant, sh), Buffer.X: acc,
                                  Buffer.A: np.zeros(N, np.int64), Buffer.P: np.zeros(N, np.int64)}))

    # reductions: SSQ and AMAX with and without a constant, two SSQs into one register
    for _ in range(2):
        x = mixed(rng, N, EDGES)
        mem = random_mem(rng)
        c0, c1, c2 = (mem[b][:N] for b in (Buffer.C0, Buffer.C1, Buffer.C2))
        w1, w2 = nx.mul(x, c1, 20), nx.mul(c0, c2, 62)
        ops = [op(M.LD, dst=2, buf=Buffer.C0), op(M.SSQ, a=0, reg=0), op(M.SSQ, a=0, buf=Buffer.C1, shift=20, reg=1),
               op(M.AMAX, a=0, reg=2), op(M.AMAX, a=2, buf=Buffer.C2, shift=62, reg=3), op(M.SSQ, a=2, reg=5),
               op(M.SSQ, a=1, buf=Buffer.C1, shift=20, reg=5), op(M.AMAX, a=1, buf=Buffer.C1, shift=20, reg=7)]
        regs = {0: nx.ssq_accumulate(0, x), 1: nx.ssq_accumulate(0, w1), 2: int(np.abs(x).max()),
                3: int(np.abs(w2).max()), 5: nx.ssq_accumulate(nx.ssq_accumulate(0, c0), w1),
                7: int(np.abs(w1).max())}
        cases.append(Case(ops=ops, values=x, mem=mem, expect={"regs": regs}))
    # ... and one writing only R4, so the others must keep their values
    x = mixed(rng, N, EDGES)
    cases.append(Case(ops=[op(M.NOP), op(M.SSQ, a=1, reg=4)], values=x, mem=random_mem(rng),
                      expect={"regs": {4: nx.ssq_accumulate(0, x)}}))
    # SSQ saturation at 2**64 - 1 (stage accumulator preset close to the top, white box)
    x = mixed(rng, N, (nx.INT32_MIN, nx.INT32_MAX) * 4)
    near = nx.UINT64_MAX - (1 << 40)
    cases.append(Case(ops=[op(M.SSQ, a=0, reg=6), op(M.SSQ, a=0, buf=Buffer.C3, shift=3, reg=6)], values=x,
                      mem=random_mem(rng), golden=False, saturate_acc={0: near},
                      expect={"regs": {6: nx.UINT64_MAX}}))
    assert nx.ssq_accumulate(near, x) == nx.UINT64_MAX

    # ARGMAX: ties (first index wins), a later ARGMAX overrides an earlier one (golden: the last op wins)
    for seq in (rng.integers(-3, 4, N), np.full(N, -7), np.arange(N)[::-1] - 100):
        x = np.asarray(seq, dtype=np.int64)
        i = int(np.argmax(x))
        cases.append(Case(ops=[op(M.ARGMAX, a=0), op(M.OUT, a=1)], values=x, mem=random_mem(rng),
                          expect={"argmax": (i, int(x[i])), "logits": x}))
    # (the first ARGMAX's values are all larger: counting it too would pick one of them)
    x = rng.integers(1000, 2000, N)
    mem = random_mem(rng)
    mem[Buffer.C3][:N] = rng.integers(-50, 50, N)
    c3 = mem[Buffer.C3][:N]
    j = int(np.argmax(c3))
    cases.append(Case(ops=[op(M.ARGMAX, a=0), op(M.LD, dst=3, buf=Buffer.C3), op(M.ARGMAX, a=3)], values=x, mem=mem,
                      expect={"argmax": (j, int(c3[j]))}))
    # two OUTs: only the last one streams (the golden device would append both: not a compiled program)
    cases.append(Case(ops=[op(M.OUT, a=0), op(M.LD, dst=3, buf=Buffer.C3), op(M.OUT, a=3)], values=x, mem=mem,
                      golden=False, expect={"logits": c3}))

    # NOPs and ops beyond n_ops are ignored
    x = mixed(rng, N, EDGES)
    garbage = [op(M.ST, a=0, buf=Buffer.X), op(M.SSQ, a=0, reg=3), op(M.ARGMAX, a=0), op(M.OUT, a=0)]
    cases.append(Case(ops=[op(M.NOP), op(M.OUT, a=0), op(M.NOP), *garbage], n_ops=3, values=x, mem=random_mem(rng),
                      expect={"logits": x}))
    return cases


def program_cases(rng, output_gate):
    """Test (2): every instruction of a tiny compiled model, in program order."""
    w = random_weights(HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28),
                       seed=1)
    cases = []
    for ins in compile_program(w, CompileOptions(output_gate=output_gate)):
        if ins.opcode is Opcode.END_TOKEN:
            continue
        assert ins.n <= DEPTH and len(ins.ops) <= MAX_OPS
        mem = random_mem(rng)
        for j, c in enumerate(ins.consts):
            mem[Buffer(Buffer.C0.value + j)][: ins.n] = c
        if ins.opcode is Opcode.LOAD_TOKEN:
            cases.append(Case(ops=list(ins.ops), values=mixed(rng, ins.n, EDGES), mem=mem, layer=ins.layer))
            continue
        # a plausible scale from plausible reductions, as the scalar unit would form it (every other one from
        # a low-energy input, 1e-4 of the usual mean square, where the epsilon term counts)
        amax = int(rng.integers(1 << 12, 1 << 28))
        reg = amax * amax * int(rng.integers(1, ins.k + 1)) >> nx.SSQ_SHIFT
        if len(cases) % 2:
            amax, reg = max(amax // 100, 1), reg // 10_000
        ssq = nx.ssq_with_bias(reg, ins.ssq_bias, ins.ssq_bias_shift)
        s_mant, s_shift = nx.dequant_scale(ssq, amax, ins.cb_mant, ins.cb_shift, ins.out_frac)
        assert s_mant < 1 << 27 and -128 <= s_shift < 128
        lim = 128 * ins.k
        acc = np.sign(rng.standard_normal(ins.n)) * np.floor(2.0 ** rng.uniform(0, np.log2(lim), ins.n))
        cases.append(Case(ops=list(ins.ops), values=acc.astype(np.int64), mem=mem, raw=False, s_mant=s_mant,
                          s_shift=s_shift, layer=ins.layer))
    return cases


# ------------------------------------------------------------------------------------ the oracle
class GoldenState:
    """Reduction registers and argmax carried across instructions, updated by the golden epilogue."""

    def __init__(self, seg):
        self.machine = SimpleNamespace(table=nx.sigmoid_table(seg),
                                       info=SimpleNamespace(lut_segments_log2=seg, gate_frac=nx.GATE_FRAC))
        self.regs = [0] * 8
        self.best = (0, 0)

    def run(self, case):
        """Buffer contents after the instruction (dict), and the OUT values."""
        n = len(case.values)
        n_ops = len(case.ops) if case.n_ops is None else case.n_ops
        consts = [case.mem[Buffer(Buffer.C0.value + j)][:n].copy() for j in range(4)]
        ins = SimpleNamespace(n=n, layer=case.layer, ops=case.ops[:n_ops], consts=consts)
        vals = np.asarray(case.values, dtype=np.int64)
        if case.raw:
            r = [vals.copy(), vals.copy()]
        else:
            r = [nx.dequant(vals, case.s_mant, case.s_shift), vals.copy()]
        r += [np.zeros(n, np.int64), np.zeros(n, np.int64)]
        bufs = {b: case.mem[b].copy() for b in (Buffer.X, Buffer.A, Buffer.P)}
        state = np.zeros((case.layer + 1, DEPTH), np.int64)
        new_state = np.zeros((case.layer + 1, DEPTH), np.int64)
        state[case.layer] = case.mem[Buffer.STATE_OLD]
        new_state[case.layer] = case.mem[Buffer.STATE_NEW]
        logits = []
        self.best = _Executor._epilogue(self.machine, ins, r, bufs, state, new_state, self.regs, logits,
                                            self.best, {})
        after = {b: a.copy() for b, a in case.mem.items()}
        after.update(bufs)
        after[Buffer.STATE_NEW] = new_state[case.layer]
        return after, (np.concatenate(logits) if logits else np.zeros(0, np.int64))


# --------------------------------------------------------------------------------- the simulation
def simulate(cases, *, seg=nx.LUT_SEGMENTS_LOG2, idle=0.0, backpressure=0.0, seed=0, folded=False):
    """Run ``cases`` back to back in one simulation and check every instruction's results."""
    h = Harness(lut_segments_log2=seg, folded=folded)
    dut = h.dut
    rng = np.random.default_rng(seed)
    gold = GoldenState(seg)
    hw_regs = [0] * 8
    checked = []

    feed = deque()      # the current instruction's elements not yet presented on ``i``
    taken = []          # OUT values taken from ``logits`` (the stream rules checked while it is stalled)
    sent = [0]          # elements transferred on ``i``

    async def producer(ctx):
        while True:
            if feed:
                await stream_put(ctx, dut.i, feed.popleft(), idle=idle, rng=rng)
                sent[0] += 1
            else:
                await ctx.tick()

    async def consumer(ctx):
        while True:
            taken.append(await stream_get(ctx, dut.logits, stall=backpressure, rng=rng))

    async def bench(ctx):
        for ci, case in enumerate(cases):
            n = len(case.values)
            for b, arr in case.mem.items():
                for k in range(DEPTH):
                    ctx.set(h.mems[b].data[k], int(arr[k]))
            ops = [o.fields() for o in case.ops] + [{}] * (MAX_OPS - len(case.ops))
            ctx.set(dut.cfg, {"ops": ops, "n_ops": len(case.ops) if case.n_ops is None else case.n_ops,
                              "s_mant": case.s_mant, "s_shift": case.s_shift, "raw": int(case.raw)})
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            for stage, value in (case.saturate_acc or {}).items():
                ctx.set(dut._stage_accs[stage], value)
            taken.clear()
            sent[0] = 0
            feed.extend({"value": int(case.values[j]), "index": j, "last": int(j == n - 1)} for j in range(n))
            done_seen = 0
            for _cycle in range(n * 8 * dut.interval + dut.latency + 200):
                done = ctx.get(dut.done)
                await ctx.tick()
                if done:
                    done_seen += 1
                    assert sent[0] == n and not feed, "done before the last element was accepted"
                    break
            assert done_seen == 1, f"case {ci}: no done"
            for _ in range(3):  # done is a strobe
                assert not ctx.get(dut.done)
                await ctx.tick()
            after = {b: np.array([ctx.get(h.mems[b].data[k]) for k in range(DEPTH)], dtype=np.int64)
                     for b in WRITE_BUFFERS}
            regs = [ctx.get(dut.regs[k]) for k in range(8)]
            best = (ctx.get(dut.argmax_index), ctx.get(dut.argmax_value))
            logits = list(taken)
            # hw.numerics expectations
            exp = case.expect
            if "logits" in exp:
                np.testing.assert_array_equal(logits, exp["logits"], err_msg=f"case {ci} logits")
            for b in WRITE_BUFFERS:
                if b in exp:
                    np.testing.assert_array_equal(after[b][:n], exp[b], err_msg=f"case {ci} {b.name}")
                    np.testing.assert_array_equal(after[b][n:], case.mem[b][n:], err_msg=f"case {ci} {b.name}")
            for k, v in exp.get("regs", {}).items():
                assert regs[k] == v, f"case {ci}: R{k} = {regs[k]}, expected {v}"
            unwritten = set(range(8)) - set(exp.get("regs", {}))
            if "regs" in exp or not case.golden:
                for k in unwritten:
                    assert regs[k] == hw_regs[k], f"case {ci}: R{k} changed"
            if "argmax" in exp:
                assert best == exp["argmax"], f"case {ci}: argmax {best}, expected {exp['argmax']}"
            # the golden device's epilogue
            if case.golden:
                g_after, g_logits = gold.run(case)
                np.testing.assert_array_equal(logits, g_logits, err_msg=f"case {ci} logits vs golden")
                for b in WRITE_BUFFERS:
                    np.testing.assert_array_equal(after[b], g_after[b], err_msg=f"case {ci} {b.name} vs golden")
                assert regs == gold.regs, f"case {ci}: regs {regs} vs golden {gold.regs}"
                assert best == gold.best, f"case {ci}: argmax {best} vs golden {gold.best}"
            else:
                gold.regs[:] = regs
                gold.best = best
            hw_regs[:] = regs
            checked.append(ci)

    sim = Simulator(h)
    sim.add_clock(1e-8)
    sim.add_testbench(producer, background=True)
    sim.add_testbench(consumer, background=True)
    sim.add_testbench(bench)
    sim.run()
    assert checked == list(range(len(cases)))


STALLS = [pytest.param(0.0, 0.0, id="streaming"), pytest.param(0.3, 0.4, id="idles+backpressure")]


FOLDED = [pytest.param(False, id="pipelined"), pytest.param(True, id="folded")]


@pytest.mark.parametrize("folded", FOLDED)
@pytest.mark.parametrize(("idle", "backpressure"), STALLS)
def test_micro_ops(idle, backpressure, folded):
    simulate(op_cases(np.random.default_rng(1), nx.LUT_SEGMENTS_LOG2), idle=idle, backpressure=backpressure,
             seed=2, folded=folded)


@pytest.mark.parametrize("folded", FOLDED)
@pytest.mark.parametrize("seg", [6, 14])
def test_sigmoid_resolutions(seg, folded):
    cases = [c for c in op_cases(np.random.default_rng(seg), seg) if any(
        o.op in (M.SIG, M.SIGNEG, M.SILU) for o in c.ops)]
    simulate(cases, seg=seg, idle=0.1, backpressure=0.1, seed=seg, folded=folded)


@pytest.mark.parametrize("folded", FOLDED)
@pytest.mark.parametrize("output_gate", ["released", "paper"])
@pytest.mark.parametrize(("idle", "backpressure"), STALLS)
def test_compiled_programs(output_gate, idle, backpressure, folded):
    cases = program_cases(np.random.default_rng(3), output_gate)
    if output_gate == "released":
        # the released gate's g_proj: eight micro-ops, two SSQs into one register (o_proj's statistic)
        twice = [c for c in cases if max(Counter(o.reg for o in c.ops if o.op is M.SSQ).values(), default=0) > 1]
        assert twice and any(len(c.ops) == MAX_OPS for c in twice)
    simulate(cases, idle=idle, backpressure=backpressure, seed=4, folded=folded)


@pytest.mark.parametrize("folded", FOLDED)
def test_measured_latency(folded):
    """Cycles from the last input transfer to ``done``, streaming without stalls: ``latency_for(n_ops)`` plus
    1 to ``DONE_LATENCY`` (2, ``host.perf.DONE_LATENCY``), plus two more when the last micro-op reduces."""
    progs = [([op(M.NOP)], False), ([op(M.ADD, dst=2, a=0, b=1), op(M.OUT, a=2)], False),
             ([op(M.LD, dst=2, buf=Buffer.C0), op(M.SSQ, a=2, reg=1)], True),
             ([op(M.SIG, dst=1, a=0, shift=16), op(M.ST, a=1, buf=Buffer.A), op(M.SSQ, a=0, reg=2),
               op(M.AMAX, a=0, buf=Buffer.C1, reg=3), op(M.NOP), op(M.NOP), op(M.MUL, dst=3, a=0, b=1, shift=4),
               op(M.OUT, a=3)], False)]
    h = Harness(folded=folded)
    dut = h.dut
    got = []

    async def bench(ctx):
        ctx.set(dut.logits.ready, 1)
        for ops, _ in progs:
            ctx.set(dut.cfg, {"ops": [o.fields() for o in ops] + [{}] * (MAX_OPS - len(ops)), "n_ops": len(ops),
                              "s_mant": 0, "s_shift": 0, "raw": 1})
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            await stream_put_all(ctx, dut.i, [{"value": j, "index": j, "last": int(j == N - 1)} for j in range(N)])
            # cycles from the last transfer to ``done`` (the cycle after the transfer is 1)
            for cycles in range(1, 2000):
                if ctx.get(dut.done):
                    got.append(cycles)
                    break
                await ctx.tick()
            else:
                raise AssertionError("no done")
            for _ in range(3):
                await ctx.tick()

    sim = Simulator(h)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = [(dut.latency_for(len(ops)) + (3 if reduces and folded else 1),
             dut.latency_for(len(ops)) + (4 if reduces and folded else dut.DONE_LATENCY)) for ops, reduces in progs]
    assert all(lo <= g <= hi for g, (lo, hi) in zip(got, want, strict=True)), (got, want)


def test_parameters():
    dut = Epilogue()
    assert dut.latency == 86 and dut.multipliers == 17
    assert dut.lut_rom == (MAX_OPS // 2, 1 << nx.LUT_SEGMENTS_LOG2, 30 + 23)
    assert dut.read_port_name(Buffer.STATE_OLD) == "rd_state_old"
    f = Epilogue(folded=True)
    assert not dut.folded and f.folded and dut.interval == 1 and f.interval == MAX_OPS
    assert f.multipliers == 3 and f.lut_rom[0] == 1 and f.latency == 4 + 11 * MAX_OPS
    assert [f.latency_for(n) for n in (0, 1, 7, 9)] == [15, 15, 81, 92] and dut.latency_for(2) == 86
    # the latencies without an instance (host.perf reads them), the same as the instances'
    assert epilogue_class(False) is PipelinedEpilogue and epilogue_class(True) is FoldedEpilogue
    assert isinstance(dut, PipelinedEpilogue) and isinstance(f, FoldedEpilogue)
    assert PipelinedEpilogue.LATENCY == dut.latency == ENTRY_LATENCY + MAX_OPS * STAGE_LATENCY
    assert FoldedEpilogue.LATENCY == f.latency and FoldedEpilogue.INTERVAL == f.interval
    assert [FoldedEpilogue.latency_for(n) for n in (0, 1, 7, 9)] == [f.latency_for(n) for n in (0, 1, 7, 9)]
    assert FoldedEpilogue.LATENCY_BASE == ENTRY_LATENCY - 2 and FoldedEpilogue.PASS_CYCLES == STAGE_LATENCY + 1
    assert [FoldedEpilogue.passes(n) for n in (0, 1, 8, 9)] == [1, 1, 8, 8]
    assert PipelinedEpilogue.DONE_LATENCY == FoldedEpilogue.DONE_LATENCY == 2
    with pytest.raises(TypeError, match="folded"):
        Epilogue(folded=1)
    with pytest.raises(TypeError, match="folded"):
        epilogue_class(None)
    for kw, exc in (({"lut_segments_log2": 5}, ValueError), ({"lut_segments_log2": 15}, ValueError),
                    ({"acc_bits": 33}, ValueError), ({"acc_bits": 1}, ValueError), ({"index_bits": 0}, ValueError),
                    ({"acc_bits": 22.0}, TypeError), ({"index_bits": True}, TypeError),
                    ({"lut_segments_log2": "10"}, TypeError)):
        with pytest.raises(exc, match=next(iter(kw))):
            Epilogue(**kw)
    with pytest.raises(TypeError):
        Epilogue(10)


@pytest.mark.parametrize("params", [{}, {"lut_segments_log2": 6, "acc_bits": 24, "index_bits": 12}, {"folded": True}])
def test_verilog(params):
    assert "module epilogue" in verilog.convert(Epilogue(**params), name="epilogue")
