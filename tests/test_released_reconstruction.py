"""The float reference against an independent reconstruction of the released model's float32 forward pass.

``tests/released_numpy.py`` rebuilds ``HGRNBitForCausalLM`` of ``ridgerchu/matmulfreellm`` (the
``FusedBitLinear`` version the ``ridger/MMfreeLM-*`` checkpoints run) in numpy from the released formulas,
reading the safetensors itself and ternarizing the latent weights itself. :class:`host.reference.ReferenceModel`
(loaded through :func:`host.checkpoint.load_checkpoint`) must agree with it, on the shipped model and on a
random checkpoint in the released format:

* the same trits and weight scales;
* the reference's int8 activation codes follow the released rule (``round`` half away from zero of
  ``u * s_a``, ``s_a = 127 / max(max|u|, 1e-5)``) given its own ``u``;
* the two differ in activation codes only by rounding flips: a code one apart where the two float32
  values of ``u * s_a`` lie within :data:`TIE_MARGIN` of each other on either side of a ``.5`` boundary;
* logits agree to float rounding (``max |diff| / std(logits) < REL_TOL``) at every position when the
  reconstruction takes the reference's side of each flip, and at every position before the first flip
  when it runs free (one flip perturbs every later position through the recurrent state, by a few
  percent of the logits' spread on the shipped model, so there the greedy tokens must only agree wherever
  the top two logits are :data:`ARGMAX_GAP` std apart or more: a loose bound on that divergence).

Guards show the comparison can fail: a reference with the BitLinear eps 1e-8 of ``BitLinear.__init__`` is
caught, and so is a reference that rounds activation ties half to even.

Nothing here pins numbers of the shipped weights (it is retrained from time to time); the measured
agreement is written to the test log (``pytest -rA`` / ``-s``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from released_numpy import (
    RELEASED_BITLINEAR_EPS,
    ReleasedModel,
    _ReleasedBitLinear,
    released_activation_quant,
    round_half_away_from_zero,
)

import host.reference
from host.checkpoint import load_checkpoint, save_checkpoint
from host.model import BitLinearWeights, ternarize
from host.reference import ReferenceModel
from host.testing import random_tensors, tiny_config

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "hgrn-bit-pydoc"
HELDOUT = ROOT / "data" / "pydoc" / "heldout.txt"

N_TOKENS = 48
#: Float-rounding agreement of logits: ``max_v |ref - rec| / std_v(rec)`` per position.
REL_TOL = 1e-4
#: Largest ``|v_ref - v_rec|`` (code units, ``v = u * s_a``) of a rounding flip. Float32 rounding moves ``v``
#: by a few ulp of values up to 127 (a few 1e-5 at most); a real difference in the arithmetic moves it by far more.
TIE_MARGIN = 1e-3
#: Largest share of all activation codes that may be rounding flips.
MAX_FLIP_SHARE = 1e-4
#: Free-running greedy tokens may differ only where the top two logits are closer than this (times std).
ARGMAX_GAP = 0.25
#: Of the random checkpoint: hidden 128, 3 layers (lower bounds of two layers), vocabulary 384.
RANDOM_SHAPE = {"vocab_size": 384, "hidden_size": 128, "num_hidden_layers": 3, "intermediate_size": 344}


# ------------------------------------------------------------------------------------------ fixtures
def _shipped_ids() -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    text = HELDOUT.read_text(encoding="utf-8")[:4000]
    ids = [1] + tok.encode(text).ids  # BOS id 1 first, as host.generate does
    assert len(ids) >= N_TOKENS
    return ids[:N_TOKENS]


def _write_random_checkpoint(path: Path, *, bitlinear_norm_eps: float | None = None, seed: int = 7) -> None:
    """A random checkpoint in the released format (bfloat16, sharded) with spread and outlier gammas.

    Every RMSNorm gamma is ``10 ** U(-0.5, 0.5)`` per channel (a decade), one channel in 32 of each is an
    outlier (x 8, a few negative), and layer 1's ``attn_norm`` carries a gain of 0.01, so that the
    BitLinears fed by it see a mean square near 1e-4 and their RMSNorm eps matters at the 1e-3 level.
    """
    extra = {} if bitlinear_norm_eps is None else {"bitlinear_norm_eps": bitlinear_norm_eps}
    config = tiny_config(**RANDOM_SHAPE, **extra)
    tensors = random_tensors(config, seed=seed)
    rng = np.random.default_rng(seed)
    for key, t in tensors.items():
        if key.endswith("norm.weight"):
            g = 10.0 ** rng.uniform(-0.5, 0.5, size=t.shape)
            out = rng.random(t.shape) < 1 / 32
            g[out] *= 8.0 * rng.choice([1.0, 1.0, 1.0, -1.0], size=int(out.sum()))
            tensors[key] = g.astype(np.float32)
    tensors["model.layers.1.attn_norm.weight"] *= np.float32(0.01)
    save_checkpoint(path, config, tensors, dtype="bfloat16", shard_size_bytes=200_000)


@dataclass
class Models:
    name: str
    rec: ReleasedModel
    ref: ReferenceModel
    ids: list[int]


def _models(name: str, path: Path, ids: list[int]) -> Models:
    return Models(name=name, rec=ReleasedModel.from_dir(path), ref=ReferenceModel(load_checkpoint(path).weights),
                  ids=ids)


@pytest.fixture(scope="module")
def shipped() -> Models:
    if not (SHIPPED / "config.json").exists() or not HELDOUT.exists():
        pytest.skip(f"{SHIPPED} or {HELDOUT} is missing")
    return _models("shipped", SHIPPED, _shipped_ids())


def _random_models(tmp_path_factory, bitlinear_norm_eps: float | None) -> Models:
    path = tmp_path_factory.mktemp("released_random")
    _write_random_checkpoint(path, bitlinear_norm_eps=bitlinear_norm_eps)
    ids = np.random.default_rng(11).integers(3, RANDOM_SHAPE["vocab_size"], size=N_TOKENS).tolist()
    name = "random" if bitlinear_norm_eps is None else f"random, bitlinear_norm_eps {bitlinear_norm_eps:g}"
    return _models(name, path, [1] + ids[1:])


@pytest.fixture(scope="module")
def random_ckpt(tmp_path_factory) -> Models:
    return _random_models(tmp_path_factory, None)


@pytest.fixture(scope="module", params=["shipped", "random", "random-eps-1e-5"])
def models(request, tmp_path_factory) -> Models:
    """The shipped model; a random checkpoint; one whose config.json sets ``bitlinear_norm_eps`` 1e-5."""
    if request.param == "shipped":
        return request.getfixturevalue("shipped")
    if request.param == "random":
        return request.getfixturevalue("random_ckpt")
    return _random_models(tmp_path_factory, 1e-5)


# ---------------------------------------------------------------------------------------- comparison
@dataclass
class Comparison:
    """How the reference's forward pass compares with the reconstruction's on one token sequence."""

    rel_err: np.ndarray  # [T]: max_v |ref - rec| / std_v(rec) per position
    n_codes: int  # activation codes compared
    rule_violations: int  # reference codes/scales that the released quantization of its own u does not give
    flips: list[tuple[str, int, int, float, float]] = field(default_factory=list)  # (call, t, k, v_rec, v_ref)
    other_diffs: int = 0  # codes that differ without being a rounding flip
    first_diff: int | None = None  # earliest position with any differing code
    first_diff_is_flip: bool = True  # every code difference of the first BitLinear call that differs there is a flip
    argmax_ref: np.ndarray | None = None
    argmax_rec: np.ndarray | None = None
    top2_gap: np.ndarray | None = None  # [T] reconstruction's top-1 minus top-2 logit, over std

    def summary(self) -> str:
        beyond = float(np.mean(self.rel_err >= REL_TOL))
        return (f"max rel diff {self.rel_err.max():.2e} (median {np.median(self.rel_err):.2e}, "
                f"{beyond:.0%} of positions >= {REL_TOL:g}), "
                f"{len(self.flips)} flips and {self.other_diffs} other code differences in {self.n_codes} codes, "
                f"first at position {self.first_diff}, {self.rule_violations} rule violations, "
                f"{int((self.argmax_ref != self.argmax_rec).sum())} greedy-token differences")


def _reference_calls(ref: ReferenceModel, ids: list[int]) -> tuple[np.ndarray, list[tuple]]:
    """The reference's logits and, per BitLinear call, ``(u, q, s_a)`` as its ``absmax_quantize`` saw them."""
    calls: list[tuple] = []
    inner = host.reference.absmax_quantize

    def spy(u):
        q, s_a = inner(u)
        calls.append((np.array(u, dtype=np.float32), np.array(q), np.array(s_a)))
        return q, s_a

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(host.reference, "absmax_quantize", spy)
        logits, _ = ref.forward(ids)
    return logits, calls


def compare(rec: ReleasedModel, ref: ReferenceModel, ids: list[int], *, follow_flips: bool) -> Comparison:
    """Run both; with ``follow_flips`` the reconstruction takes the reference's code at each rounding flip."""
    logits_ref, calls = _reference_calls(ref, ids)
    n_calls = 6 * rec.num_layers + 1
    assert len(calls) == n_calls, (f"the reference quantized {len(calls)} activation vectors through "
                                   f"host.reference.absmax_quantize, expected {n_calls}")
    # The released rule applied to the reference's own u must give exactly its codes and scales.
    rule_violations = 0
    ref_v = []
    for u, q, s_a in calls:
        q_rule, s_rule, _ = released_activation_quant(u)
        rule_violations += int((q_rule != q).sum()) + int((s_rule != s_a).sum())
        ref_v.append((q, (u * s_a).astype(np.float32)))
    cmp = Comparison(rel_err=np.zeros(0), n_codes=sum(q.size for _, q, _ in calls), rule_violations=rule_violations)
    index = iter(range(n_calls))

    def hook(name, q, v):
        q_ref, v_ref = ref_v[next(index)]
        assert q.shape == q_ref.shape, f"{name}: codes {q.shape} against the reference's {q_ref.shape}"
        diff = q != q_ref
        # a flip: codes one apart because the two float32 values of u * s_a straddle a .5 boundary (equal
        # values with different codes are a different rounding rule, never a flip)
        flip = diff & (np.abs(q - q_ref) == 1) & (v != v_ref) & (np.abs(v - v_ref) < TIE_MARGIN)
        cmp.other_diffs += int((diff & ~flip).sum())
        for t, k in np.argwhere(flip):
            cmp.flips.append((name, int(t), int(k), float(v[t, k]), float(v_ref[t, k])))
        rows = np.nonzero(diff.any(axis=1))[0]
        if rows.size and (cmp.first_diff is None or rows[0] < cmp.first_diff):  # causally first: earliest call
            cmp.first_diff = int(rows[0])
            cmp.first_diff_is_flip = bool(np.all(flip[rows[0]][diff[rows[0]]]))
        return np.where(flip, q_ref, q) if follow_flips else q

    logits = rec.forward(ids, hook)
    std = logits.std(axis=1)
    cmp.rel_err = np.max(np.abs(logits_ref - logits), axis=1) / std
    cmp.argmax_ref, cmp.argmax_rec = logits_ref.argmax(axis=1), logits.argmax(axis=1)
    top2 = np.sort(logits, axis=1)[:, -2:]
    cmp.top2_gap = (top2[:, 1] - top2[:, 0]) / std
    return cmp


def assert_agrees(cmp: Comparison, *, follow_flips: bool) -> None:
    """The assertions on one comparison (see the module docstring)."""
    assert cmp.rule_violations == 0, (
        f"{cmp.rule_violations} reference activation codes or scales differ from the released "
        "clamp(round_half_away(u * 127 / max(max|u|, 1e-5)), -128, 127) of its own u")
    assert len(cmp.flips) <= MAX_FLIP_SHARE * cmp.n_codes, f"too many rounding flips: {cmp.summary()}"
    if follow_flips:
        assert cmp.other_diffs == 0, f"activation codes differ beyond rounding flips: {cmp.summary()}"
        bad = np.nonzero(cmp.rel_err >= REL_TOL)[0]
        assert bad.size == 0, (f"logits differ beyond float rounding at positions {bad.tolist()} "
                               f"(rel diff {cmp.rel_err[bad].max():.2e}): {cmp.summary()}")
        assert np.array_equal(cmp.argmax_ref, cmp.argmax_rec) or np.all(
            cmp.top2_gap[cmp.argmax_ref != cmp.argmax_rec] < 2 * REL_TOL), cmp.summary()
    else:
        clean = slice(None, cmp.first_diff)  # every position when no code differs
        assert np.all(cmp.rel_err[clean] < REL_TOL), (
            f"logits differ beyond float rounding before any activation code differs: {cmp.summary()}")
        assert cmp.first_diff_is_flip, (
            f"the first code difference (position {cmp.first_diff}) is no rounding flip: {cmp.summary()}")
        mismatch = cmp.argmax_ref != cmp.argmax_rec
        assert np.all(cmp.top2_gap[mismatch] < ARGMAX_GAP), (
            f"greedy tokens differ at positions {np.nonzero(mismatch)[0].tolist()} where the top two logits are "
            f"{cmp.top2_gap[mismatch].round(3).tolist()} std apart: {cmp.summary()}")


# --------------------------------------------------------------------------------------------- tests
def test_same_trits_and_weight_scales(models):
    ref_bitlinears = dict(models.ref.weights.bitlinears())
    assert ref_bitlinears.keys() == models.rec.bitlinears.keys()
    for name, mine in models.rec.bitlinears.items():
        theirs = ref_bitlinears[name]
        assert np.array_equal(theirs.trits, mine.trits), f"{models.name} {name}: trits differ"
        assert theirs.inv_scale == mine.s_w, f"{models.name} {name}: s_w {theirs.inv_scale!r} != {mine.s_w!r}"
        np.testing.assert_array_equal(theirs.norm, mine.gamma, err_msg=f"{models.name} {name}: gamma")


def test_bitlinear_eps_is_read_from_config(models):
    assert models.ref.config.bitlinear_norm_eps == models.rec.bitlinear_eps
    if "bitlinear_norm_eps" not in models.rec.config:
        assert models.rec.bitlinear_eps == RELEASED_BITLINEAR_EPS


@pytest.mark.parametrize("follow_flips", [True, False], ids=["following-flips", "free-running"])
def test_logits_agree_with_released_reconstruction(models, follow_flips):
    cmp = compare(models.rec, models.ref, models.ids, follow_flips=follow_flips)
    print(f"\n{models.name}, {'following flips' if follow_flips else 'free-running'}: {cmp.summary()}")
    for name, t, k, v, v_ref in cmp.flips[:5]:
        print(f"  flip {name} position {t} channel {k}: u*s_a {v!r} here, {v_ref!r} in the reference")
    assert_agrees(cmp, follow_flips=follow_flips)


def test_guard_bitlinear_eps_1e8_is_caught(random_ckpt):
    """A reference running the ``BitLinear.__init__`` eps (1e-8) instead of 1e-6 must fail the comparison."""
    w = random_ckpt.ref.weights
    wrong = ReferenceModel(dataclasses.replace(w, config=dataclasses.replace(w.config, bitlinear_norm_eps=1e-8)))
    cmp = compare(random_ckpt.rec, wrong, random_ckpt.ids, follow_flips=True)
    assert cmp.rel_err.max() > 10 * REL_TOL, cmp.summary()
    with pytest.raises(AssertionError):
        assert_agrees(cmp, follow_flips=True)


def _tie_bitlinear() -> tuple[np.ndarray, BitLinearWeights, _ReleasedBitLinear]:
    """A BitLinear input whose codes land exactly on ties: x = +-128 (mean square 16384, so rstd = 1/128 even
    with eps 1e-6), gamma = the wanted ``u * s_a`` with max 127 (so ``s_a = 1``): ``v = +-gamma`` exactly."""
    gamma = np.array([127.0, 2.5, -3.5, 0.5, -0.5, 1.5, 4.5, 6.0], np.float32)
    x = np.array([[128.0, 128, 128, 128, 128, 128, 128, 128],
                  [-128.0, 128, -128, 128, -128, 128, -128, 128]], np.float32)
    latent = np.array([[0.02, -0.02, 0.02, 0.0, 0.02, 0.02, -0.02, 0.0],
                       [0.0, 0.02, 0.02, 0.02, -0.02, 0.0, 0.02, 0.02],
                       [0.02, 0.02, 0.0, -0.02, 0.02, -0.02, 0.0, 0.02]], np.float32)
    trits, beta = ternarize(latent)
    return x, BitLinearWeights(norm=gamma, trits=trits, scale=beta), \
        _ReleasedBitLinear("tie", gamma, latent, RELEASED_BITLINEAR_EPS)


def _bitlinear_outputs(ref_w: BitLinearWeights, rec: _ReleasedBitLinear, x: np.ndarray):
    """``(y_ref, y_rec, (q_rec, v_rec))`` of one BitLinear: the reference's ``_BitLinear`` and the reconstruction's."""
    seen = []
    y_rec = rec(x, lambda name, q, v: seen.append((q, v)) or q)
    y_ref = host.reference._BitLinear(ref_w, RELEASED_BITLINEAR_EPS)(x)
    return y_ref, y_rec, seen[0]


def test_activation_ties_round_away_from_zero():
    x, ref_w, rec = _tie_bitlinear()
    y_ref, y_rec, (q, v) = _bitlinear_outputs(ref_w, rec, x)
    assert np.array_equal(np.abs(v) - np.floor(np.abs(v)), np.tile([0, .5, .5, .5, .5, .5, .5, 0], (2, 1)))
    assert q[0].tolist() == [127, 3, -4, 1, -1, 2, 5, 6]
    assert round_half_away_from_zero(np.float32(0.49999997)) == 0  # not floor(v + 0.5) in float32
    np.testing.assert_allclose(y_ref, y_rec, rtol=1e-6, atol=0)


def test_guard_half_to_even_is_caught(monkeypatch):
    """A reference that rounds activation ties half to even (``torch.round``) must disagree."""
    monkeypatch.setattr(host.reference, "round_half_away", np.rint)
    x, ref_w, rec = _tie_bitlinear()
    y_ref, y_rec, _ = _bitlinear_outputs(ref_w, rec, x)
    assert np.max(np.abs(y_ref - y_rec) / np.abs(y_rec).max()) > 10 * REL_TOL
