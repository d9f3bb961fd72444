"""host.sampling: greedy, temperature, top-k, top-p, repetition penalty, seeded reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from host.sampling import (
    Sampler,
    apply_repetition_penalty,
    filter_top_k,
    filter_top_p,
    greedy,
    probabilities,
    validate_sampling,
)


def _logits(v: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(v).astype(np.float32) * 2


def _draws(sampler: Sampler, logits: np.ndarray, n: int, context=()) -> list[int]:
    return [sampler(logits, context) for _ in range(n)]


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": -0.2}, "top_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
])
def test_invalid_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        validate_sampling(**kwargs)
    with pytest.raises(ValueError, match=name):
        Sampler(**kwargs)


def test_invalid_seed():
    with pytest.raises(ValueError, match="seed"):
        Sampler(seed=-1)


def test_valid_edges_accepted():
    validate_sampling(temperature=0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    validate_sampling(temperature=2.0, top_k=10**6, top_p=1e-9, repetition_penalty=0.5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_greedy_is_argmax(seed):
    logits = _logits(seed=seed)
    sampler = Sampler(temperature=0.0, top_k=5, top_p=0.5, seed=seed)
    assert _draws(sampler, logits, 5) == [int(np.argmax(logits))] * 5
    assert greedy(logits) == int(np.argmax(logits))


def test_greedy_ties_pick_lowest_id():
    assert Sampler(temperature=0)(np.array([1.0, 3.0, 3.0, 0.0], dtype=np.float32)) == 1


def test_seed_reproducible_and_seeds_differ():
    logits = _logits()
    kw = dict(temperature=1.0, top_k=20, top_p=0.9, repetition_penalty=1.2)
    a = _draws(Sampler(**kw, seed=123), logits, 200, context=[3, 4])
    b = _draws(Sampler(**kw, seed=123), logits, 200, context=[3, 4])
    c = _draws(Sampler(**kw, seed=124), logits, 200, context=[3, 4])
    assert a == b
    assert a != c


def test_sampler_does_not_modify_logits():
    logits = _logits()
    before = logits.copy()
    Sampler(temperature=0.7, top_k=3, top_p=0.5, repetition_penalty=1.3, seed=0)(logits, [0, 1, 2])
    np.testing.assert_array_equal(logits, before)


def test_top_k_restricts_support():
    logits = _logits(v=50, seed=5) * 0.3  # flat enough that every kept token gets drawn
    top5 = set(np.argsort(-logits)[:5].tolist())
    drawn = set(_draws(Sampler(temperature=1.0, top_k=5, seed=0), logits, 3000))
    assert drawn == top5


def test_top_k_keeps_ties_at_boundary():
    x = filter_top_k(np.array([3.0, 1.0, 2.0, 2.0, 0.0]), 2)
    assert np.isfinite(x).tolist() == [True, False, True, True, False]


def test_top_k_zero_or_large_is_off():
    logits = _logits(v=8)
    np.testing.assert_array_equal(filter_top_k(logits, 0), logits.astype(np.float64))
    np.testing.assert_array_equal(filter_top_k(logits, 8), logits.astype(np.float64))


@pytest.mark.parametrize(("top_p", "kept"), [
    (0.4, {0}), (0.75, {0, 1}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3}),
])
def test_top_p_restricts_support(top_p, kept):
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs).astype(np.float32)
    p = probabilities(logits, temperature=1.0, top_p=top_p)
    assert set(np.flatnonzero(p).tolist()) == kept
    np.testing.assert_allclose(p[sorted(kept)], probs[sorted(kept)] / probs[sorted(kept)].sum(), rtol=1e-6)
    drawn = set(_draws(Sampler(temperature=1.0, top_p=top_p, seed=1), logits, 2000))
    assert drawn == kept


def test_top_p_always_keeps_the_most_likely():
    x = filter_top_p(np.array([0.0, 5.0, 1.0]), 1e-6)
    assert np.isfinite(x).tolist() == [False, True, False]


def test_temperature_scales_logits():
    logits = _logits(v=10)
    for t in (0.5, 1.0, 2.0):
        z = logits.astype(np.float64) / t
        expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        np.testing.assert_allclose(probabilities(logits, temperature=t), expected, rtol=1e-12)


def test_repetition_penalty_ctrl_convention():
    logits = np.array([2.0, -2.0, 1.0, 0.5, 0.0], dtype=np.float32)
    # repeats count once, out-of-range ids are ignored
    out = apply_repetition_penalty(logits, [0, 1, 1, 4, 99, -3], 2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0, 0.5, 0.0])
    np.testing.assert_array_equal(logits, [2.0, -2.0, 1.0, 0.5, 0.0])  # input untouched
    np.testing.assert_allclose(apply_repetition_penalty(logits, [0, 1], 1.0), logits)
    np.testing.assert_allclose(apply_repetition_penalty(logits, [0, 1], 0.5), [4.0, -1.0, 1.0, 0.5, 0.0])


def test_repetition_penalty_changes_greedy_choice():
    logits = np.array([2.0, 1.5, -1.0], dtype=np.float32)
    assert Sampler(temperature=0)(logits, context=[0]) == 0
    assert Sampler(temperature=0, repetition_penalty=1.5)(logits, context=[0]) == 1  # 2/1.5 < 1.5


def test_nan_logits_rejected():
    with pytest.raises(ValueError, match="NaN"):
        Sampler(seed=0)(np.array([0.0, np.nan], dtype=np.float32))


def test_masked_logits_never_drawn():
    logits = np.array([-np.inf, 0.0, -np.inf, 0.0], dtype=np.float32)
    assert set(_draws(Sampler(temperature=1.0, seed=3), logits, 500)) == {1, 3}
