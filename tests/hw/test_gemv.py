# amaranth: UnusedElaboratable=no
"""hw.gemv.TernaryGemv in the Amaranth simulator: every row's accumulator exact against numpy
(``acc[n] = sum_k W[n, k] q[k]``, hw.isa GEMV step 2), with and without idle input cycles and output
backpressure; one chunk per cycle when unthrottled; no multiplier in the netlist; Verilog export."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.back import rtlil, verilog
from amaranth.hdl import Module, Shape, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.sim import Simulator

from hw import isa
from hw.gemv import TernaryGemv
from hw.streams import acc_row_layout, code_word_layout, trit_chunk_layout
from tests.hw.streams import stream_get_all, stream_put_all

pytestmark = pytest.mark.filterwarnings("error")


class _Bench(wiring.Component):
    """The GEMV with its code buffer: a ``lib.memory.Memory`` whose read port feeds ``codes``."""

    def __init__(self, *, lanes: int, max_k: int, codes: np.ndarray):
        self.dut = TernaryGemv(lanes=lanes, max_k=max_k)
        words = np.zeros(self.dut.code_depth * lanes, np.int64)
        words[:codes.size] = codes
        self.mem = memory.Memory(shape=code_word_layout(lanes), depth=self.dut.code_depth,
                                 init=[list(map(int, w)) for w in words.reshape(-1, lanes)])
        super().__init__({"i": wiring.In(stream.Signature(trit_chunk_layout(lanes))),
                          "o": wiring.Out(stream.Signature(acc_row_layout(self.dut.acc_bits)))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        m.submodules.mem = self.mem
        wiring.connect(m, self.dut.codes, self.mem.read_port())
        wiring.connect(m, wiring.flipped(self.i), self.dut.i)
        wiring.connect(m, self.dut.o, wiring.flipped(self.o))
        return m


def _chunks(w: np.ndarray, lanes: int, end: bool, rng: np.random.Generator) -> list[dict]:
    """A row's TritChunk payloads; lanes >= count carry junk trits (-2..1) that must be masked."""
    k = w.size
    n = -(-k // lanes)
    out = []
    for c in range(n):
        t = w[c * lanes:(c + 1) * lanes]
        trits = rng.integers(-2, 2, lanes)
        trits[:t.size] = t
        out.append({"trits": [int(x) for x in trits], "count": int(t.size), "first": int(c == 0),
                    "last": int(c == n - 1), "end": int(end and c == n - 1)})
    return out


def _run(lanes: int, codes: np.ndarray, rows: list[np.ndarray], ends: list[bool], *, max_k: int,
         idle: float, stall: float, seed: int) -> tuple[list[tuple[int, int]], int, TernaryGemv]:
    """Stream ``rows`` through the DUT; return the output rows (acc, last), the producer's cycles, the DUT."""
    rng = np.random.default_rng(seed)
    bench = _Bench(lanes=lanes, max_k=max_k, codes=codes)
    chunk_layout = trit_chunk_layout(lanes)
    chunks = [chunk_layout.const(c) for w, e in zip(rows, ends, strict=True) for c in _chunks(w, lanes, e, rng)]
    got: list[tuple[int, int]] = []
    cycles = [0]

    async def producer(ctx):
        cycles[0] = await stream_put_all(ctx, bench.i, chunks, idle=idle, rng=rng)

    async def consumer(ctx):
        for payload in await stream_get_all(ctx, bench.o, len(rows), stall=stall, rng=rng, timeout=1000):
            got.append((payload.acc, payload.last))
        # nothing more comes out
        ctx.set(bench.o.ready, 1)
        for _ in range(bench.dut.latency + 4):
            _, _, valid = await ctx.tick().sample(bench.o.valid)
            assert not valid

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return got, cycles[0], bench.dut


def _random_case(lanes: int, n_rows: int, max_k: int, seed: int):
    rng = np.random.default_rng(seed)
    codes = rng.integers(-128, 128, max_k)
    rows, ends = [], []
    for _ in range(n_rows):
        k = int(rng.integers(1, max_k + 1))
        if k % lanes == 0 and k > 1:
            k -= 1  # random K, not a multiple of lanes (multiples are covered by the extreme case)
        rows.append(rng.integers(-1, 2, k))
        ends.append(bool(rng.random() < 0.2))
    ends[-1] = True
    return codes, rows, ends


def _expected(codes, rows, ends):
    q = codes.astype(np.int64)
    return [(int(np.dot(w.astype(np.int64), q[:w.size])), int(e)) for w, e in zip(rows, ends, strict=True)]


@pytest.mark.parametrize("lanes", [4, 7, 16, 64])
@pytest.mark.parametrize("idle, stall", [(0.0, 0.0), (0.3, 0.5)], ids=["streaming", "idles+backpressure"])
def test_random_rows_exact(lanes, idle, stall):
    """Random rows of random K (mostly several chunks, last chunk partial), random int8 codes and trits."""
    n_rows = {4: 150, 7: 120, 16: 80, 64: 30}[lanes]
    max_k = lanes * 6 + 3
    codes, rows, ends = _random_case(lanes, n_rows, max_k, seed=lanes)
    got, cycles, dut = _run(lanes, codes, rows, ends, max_k=max_k, idle=idle, stall=stall, seed=lanes + 1)
    assert got == _expected(codes, rows, ends)
    for (acc, _), w in zip(got, rows, strict=True):
        assert abs(acc) <= 128 * w.size < 1 << (isa.acc_bits_for(w.size) - 1)
    if idle == 0 and stall == 0:
        n_chunks = sum(-(-w.size // lanes) for w in rows)
        assert cycles == n_chunks, "one chunk per cycle while the output is ready"


@pytest.mark.parametrize("lanes", [4, 7])
def test_one_chunk_rows_full_rate(lanes):
    """Rows of one chunk each still go at one per cycle (the credits cover the whole round trip)."""
    rng = np.random.default_rng(7)
    codes = rng.integers(-128, 128, lanes)
    rows = [rng.integers(-1, 2, int(rng.integers(1, lanes + 1))) for _ in range(60)]
    ends = [bool(x) for x in rng.random(60) < 0.3]
    got, cycles, _ = _run(lanes, codes, rows, ends, max_k=lanes, idle=0.0, stall=0.0, seed=3)
    assert got == _expected(codes, rows, ends)
    assert cycles == len(rows)


def test_one_chunk_rows_heavy_backpressure():
    """One-chunk rows against a mostly stalled output: the FIFO fills, i.ready drops, nothing is lost."""
    lanes = 4
    rng = np.random.default_rng(11)
    codes = rng.integers(-128, 128, 3 * lanes)
    rows = [rng.integers(-1, 2, int(rng.integers(1, 3 * lanes + 1))) for _ in range(40)]
    ends = [bool(x) for x in rng.random(40) < 0.3]
    got, _, _ = _run(lanes, codes, rows, ends, max_k=3 * lanes, idle=0.0, stall=0.9, seed=5)
    assert got == _expected(codes, rows, ends)


@pytest.mark.parametrize("lanes", [4, 16])
def test_extreme_all_minus_128(lanes):
    """All codes -128, all trits -1, K = 3 lanes: acc = +128 K, the top of the range (default max_k)."""
    k = 3 * lanes
    codes = np.full(k, -128)
    rows = [np.full(k, -1), np.full(k, 1), np.full(k - 1, -1)]
    got, _, dut = _run(lanes, codes, rows, [False, False, True], max_k=isa.MAX_K, idle=0.2, stall=0.3, seed=1)
    assert dut.acc_bits == isa.ACC_BITS
    assert got == [(128 * k, 0), (-128 * k, 0), (128 * (k - 1), 1)]


def test_latency_property():
    """The first row's result appears exactly ``latency`` cycles after its last chunk's transfer."""
    lanes = 4
    bench = _Bench(lanes=lanes, max_k=lanes, codes=np.arange(1, lanes + 1))
    layout = trit_chunk_layout(lanes)
    seen = []

    async def tb(ctx):
        ctx.set(bench.o.ready, 1)
        ctx.set(bench.i.payload, layout.const({"trits": [1, -1, 1, 0], "count": 3, "first": 1, "last": 1,
                                               "end": 1}))
        ctx.set(bench.i.valid, 1)
        _, _, ready = await ctx.tick().sample(bench.i.ready)
        assert ready
        ctx.set(bench.i.valid, 0)
        for cycle in range(1, 30):
            # sample in cycle `cycle` after the transfer (the transfer is cycle 0)
            valid, payload = ctx.get(bench.o.valid), ctx.get(bench.o.payload)
            if valid:
                seen.append((cycle, payload.acc, payload.last))
            await ctx.tick()

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert bench.dut.latency == bench.dut.tree_levels + 5 == 7 == TernaryGemv.latency_for(lanes)
    assert seen and seen[0] == (bench.dut.latency, 1 - 2 + 3, 1)


@pytest.mark.parametrize("lanes", [7, 16])
def test_no_multiplier(lanes):
    """The netlist adds, negates and muxes: no ``$mul`` cell (nor any other multiply or divide)."""
    text = rtlil.convert(TernaryGemv(lanes=lanes), name="gemv")
    assert "cell $add" in text and "cell $neg" in text
    for cell in ("$mul", "$macc", "$div", "$mod", "$pow"):
        assert cell not in text


@pytest.mark.parametrize("lanes", [4, 256])
def test_verilog_convert(lanes):
    v = verilog.convert(TernaryGemv(lanes=lanes), name=f"ternary_gemv_{lanes}")
    assert f"module ternary_gemv_{lanes}" in v
    assert "codes__addr" in v and "o__payload" in v


def test_ports_and_properties():
    g = TernaryGemv(lanes=16)
    assert g.lanes == 16 and g.acc_bits == isa.ACC_BITS and g.max_k == isa.MAX_K
    assert g.code_depth == isa.MAX_K // 16 and len(g.codes.addr) == 9
    assert g.i.payload.shape() == trit_chunk_layout(16)
    assert g.codes.data.shape() == code_word_layout(16)
    assert g.o.payload.shape() == acc_row_layout(isa.ACC_BITS)
    assert g.tree_levels == 4 and g.latency == 9 and g.fifo_depth == 10
    assert TernaryGemv(lanes=7).tree_levels == 3
    assert TernaryGemv(lanes=256).latency == 13
    # read without an instance (host.perf): the adder tree's levels plus BASE_LATENCY
    assert TernaryGemv.BASE_LATENCY == 5
    assert [TernaryGemv.latency_for(n) for n in (4, 7, 16, 64, 256)] == [7, 8, 9, 11, 13]
    with pytest.raises(ValueError, match="0"):
        TernaryGemv.latency_for(0)
    with pytest.raises(AttributeError):
        g.latency = 3


@pytest.mark.parametrize("kwargs, exc, word", [
    ({"lanes": 3}, ValueError, "3"),
    ({"lanes": 257}, ValueError, "257"),
    ({"lanes": 16.0}, TypeError, "16.0"),
    ({"lanes": True}, TypeError, "True"),
    ({"lanes": 16, "acc_bits": 21}, ValueError, "21"),
    ({"lanes": 16, "acc_bits": 65}, ValueError, "65"),
    ({"lanes": 16, "acc_bits": "22"}, TypeError, "'22'"),
    ({"lanes": 16, "max_k": 15}, ValueError, "15"),
    ({"lanes": 16, "max_k": 1 << 16}, ValueError, "65536"),
])
def test_parameter_validation(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        TernaryGemv(**kwargs)
    with pytest.raises(TypeError):
        TernaryGemv(16)  # keyword-only


def test_smaller_acc_bits_for_smaller_k():
    g = TernaryGemv(lanes=8, max_k=64, acc_bits=isa.acc_bits_for(64))
    assert g.acc_bits == 15 and g.code_depth == 8 and len(g.codes.addr) == 3


def test_stream_layouts():
    lay = trit_chunk_layout(7)
    assert lay.size == 7 * 2 + 3 + 3
    assert Shape.cast(lay["count"].shape) == unsigned(3)
    assert lay["trits"].shape == data.ArrayLayout(signed(2), 7)
    assert [name for name, _ in lay] == ["trits", "count", "first", "last", "end"]
    with pytest.raises(ValueError, match="0"):
        trit_chunk_layout(0)
    with pytest.raises(TypeError):
        trit_chunk_layout("4")
