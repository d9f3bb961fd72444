"""The compiled golden engine (host/devices/golden_engine.py) against the golden device, bit for bit.

Outputs (the whole output packet: logits accumulators, argmax, scale) and the new recurrent state must be
identical to :class:`host.devices.golden.GoldenMachine`'s for every token of a sequence (state carried), on
random models of several shapes (hidden and intermediate not multiples of 5), both packings, 1-3 channels,
both output gates and low-energy inputs, and on the shipped model. The batched GEMV must equal B single ones.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from host.compiler import CompileOptions, calibrate, compile_model
from host.devices.golden import GoldenMachine
from host.devices.golden_engine import (
    GoldenEngine,
    build_table,
    gemv_batch,
    pack_rows,
    quantize_codes,
    scalar_scales,
)
from host.model import HGRNBitConfig, random_weights
from host.protocol import make_token_packet
from hw import numerics as nx
from hw.isa import TritPacking
from hw.params import BuildParams

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "hgrn-bit-pydoc"


def _interpreter(image, build: BuildParams | None = None) -> GoldenMachine:
    """GoldenMachine's own interpreter, the oracle: with ``engine=False`` once GoldenMachine can delegate its
    tokens to the engine (the wiring: a keyword ``engine``), so that the engine is never compared with itself."""
    kw = {"engine": False} if "engine" in inspect.signature(GoldenMachine).parameters else {}
    return GoldenMachine(image, build, **kw)


def _compare(machine: GoldenMachine, engine: GoldenEngine, vectors, *, flags: int = 1) -> np.ndarray:
    """Run both over the token vectors (state carried); assert every output packet and state are equal."""
    s_gold = machine.init_state()
    s_eng = s_gold.copy()
    for pos, x in enumerate(vectors):
        res = machine.run_token(make_token_packet(x, position=pos, logits=bool(flags & 1)), s_gold)
        frozen = s_eng.copy()
        out, st = engine.run(x, flags, pos, s_eng)
        assert np.array_equal(s_eng, frozen), "the engine must not modify the committed state"
        assert out == res.output, f"output packet differs at token {pos}"
        assert np.array_equal(st, res.state), f"state differs at token {pos}"
        s_gold, s_eng = res.state, st
    return s_gold


CASES = [
    # (hidden, intermediate, layers, vocab, packing, channels, output gate, gamma spread)
    (38, 54, 3, 101, TritPacking.BASE3, 1, "released", 1.0),
    (33, 47, 2, 64, TritPacking.BITS2, 1, "paper", 0.0),
    (41, 67, 2, 50, TritPacking.BASE3, 3, "paper", 2.0),
    (36, 92, 2, 77, TritPacking.BITS2, 2, "released", 2.0),
    (64, 171, 2, 300, TritPacking.BASE3, 2, "released", 1.0),
    (17, 23, 1, 9, TritPacking.BITS2, 3, "released", 0.0),
]


@pytest.mark.parametrize("hidden,inter,layers,vocab,packing,channels,gate,spread", CASES)
def test_engine_matches_golden_on_random_models(hidden, inter, layers, vocab, packing, channels, gate, spread):
    cfg = HGRNBitConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter)
    w = random_weights(cfg, seed=hidden + inter, gamma_spread=spread)
    fm = calibrate(w, n_tokens=16, output_gate=gate)
    img = compile_model(w, CompileOptions(formats=fm, packing=packing, channels=channels, output_gate=gate))
    machine = _interpreter(img, BuildParams(lanes=4 * channels, channels=channels))
    engine = GoldenEngine(machine.image)
    rng = np.random.default_rng(hidden)
    ids = rng.integers(0, vocab, size=5)
    vectors = [nx.to_fixed(w.embeddings[t], fm.residual) for t in ids]
    # low-energy inputs: all zero (absmax 0: the one-LSB floor), a few LSBs, one spike
    vectors.insert(2, np.zeros(hidden, np.int64))
    vectors.insert(4, rng.integers(-2, 3, size=hidden).astype(np.int64))
    spike = np.zeros(hidden, np.int64)
    spike[hidden // 2] = nx.INT32_MAX
    vectors.append(spike)
    state = _compare(machine, engine, vectors)
    assert np.any(state != 0)
    _compare(machine, engine, vectors[:2], flags=0)      # no logits requested: the packet has none


def test_engine_matches_golden_on_the_shipped_model():
    from host.checkpoint import load_checkpoint

    ckpt = load_checkpoint(MODEL)
    w = ckpt.weights
    fm = calibrate(w, n_tokens=16)
    machine = _interpreter(compile_model(w, CompileOptions(formats=fm)))
    engine = GoldenEngine(machine.image)
    ids = ckpt.tokenizer.encode("def main():\n    return 0", add_special_tokens=False).ids[:6]
    _compare(machine, engine, [nx.to_fixed(w.embeddings[t], fm.residual) for t in ids])


def test_engine_is_thread_count_independent():
    import numba

    cfg = HGRNBitConfig(vocab_size=300, hidden_size=96, num_hidden_layers=1, intermediate_size=256)
    w = random_weights(cfg, seed=3, gamma_spread=1.0)
    fm = calibrate(w, n_tokens=8)
    machine = _interpreter(compile_model(w, CompileOptions(formats=fm)))
    engine = GoldenEngine(machine.image, parallel_min_trits=1, parallel=True)   # every GEMV through the pool
    x = nx.to_fixed(w.embeddings[7], fm.residual)
    before = numba.get_num_threads()
    try:
        outs = []
        for t in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(t)
            outs.append(engine.run(x, 1, 0, machine.init_state()))
    finally:
        numba.set_num_threads(before)
    ref = machine.run_token(make_token_packet(x), machine.init_state())
    for out, st in outs:
        assert out == ref.output and np.array_equal(st, ref.state)


@pytest.mark.parametrize("k", [1, 4, 5, 13, 324, 868])
def test_batched_gemv_equals_single_gemvs(k):
    rng = np.random.default_rng(k)
    n = 37
    trits = rng.integers(-1, 2, size=(n, k)).astype(np.int8)
    codes = rng.integers(-128, 128, size=(4, k)).astype(np.int32)
    codes[1] = 127
    codes[2] = -128
    rows = pack_rows(trits)
    assert rows.shape == (n, (k + 4) // 5)
    want = codes.astype(np.int64) @ trits.T.astype(np.int64)          # [B, N]
    batch = gemv_batch(rows, codes)
    singles = np.stack([gemv_batch(rows, codes[q:q + 1])[0] for q in range(codes.shape[0])])
    assert batch.dtype == np.int64 and np.array_equal(batch, want) and np.array_equal(singles, want)
    # the table of one vector: every byte's partial sum of its five codes
    table = build_table(codes[0])
    digits = (np.arange(243)[:, None] // 3 ** np.arange(5)[None, :]) % 3 - 1
    padded = np.concatenate([codes[0], np.zeros(5 * table.shape[0] - k, np.int32)]).reshape(-1, 5)
    assert np.array_equal(table[:, :243], padded @ digits.T)


def test_scalar_unit_and_quantize_match_numerics():
    rng = np.random.default_rng(0)
    cases = [(0, 0, 0, 0), (1, 1, 0, 0), (nx.INT32_MAX + 1, nx.UINT64_MAX, 2**32 - 1, 31),
             (127, 2**64 - 2**40, 5, 31), (3, 2**62 + 12345, 1, 0)]
    cases += [(int(rng.integers(0, 2**31)), int(rng.integers(0, 2**63)), int(rng.integers(0, 2**32)),
               int(rng.integers(0, 32))) for _ in range(200)]
    for amax, ssq, bias, bias_shift in cases:
        cb_mant, cb_shift, out_frac = int(rng.integers(2**23, 2**25)), int(rng.integers(0, 40)), 16
        want = nx.quant_recip(amax) + nx.dequant_scale(nx.ssq_with_bias(ssq, bias, bias_shift), amax, cb_mant,
                                                       cb_shift, out_frac)
        assert scalar_scales(amax, ssq, bias, bias_shift, cb_mant, cb_shift, out_frac) == want
    w = np.concatenate([rng.integers(nx.INT32_MIN, nx.INT32_MAX, size=500), [nx.INT32_MIN, nx.INT32_MAX, 0, 1, -1]])
    for amax in (1, 1000, nx.INT32_MAX + 1):
        r_mant, r_shift = nx.quant_recip(amax)
        assert np.array_equal(quantize_codes(w, r_mant, r_shift), nx.quantize(w, r_mant, r_shift))
