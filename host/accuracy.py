"""What the accelerator's fixed-point formats cost: the golden device against the float reference.

Two yardsticks (the accuracy targets of the golden device):

* **the shipped model** on held-out text: perplexity of both, and greedy next-token agreement;
* **a random model of the 370M shape** (hidden 1024, intermediate 2816) whose per-channel gammas span
  two orders of magnitude (outlier channels): cosine similarity of every layer's ``o_proj`` and
  ``down_proj`` outputs (the GEMV outputs themselves, not the residual, which hides errors) and of the
  recurrent state ``h`` after a long decode.

Both devices consume the same token sequence, each carrying its own recurrent state.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from host.compiler import CompileOptions, calibrate, compile_program
from host.devices.golden import GoldenDevice
from host.model import HGRNBitConfig, ModelWeights, random_weights
from host.reference import ReferenceModel
from hw import numerics as nx

__all__ = ["SHAPE_370M", "cosine", "shipped_model_accuracy", "random_model_accuracy", "scoring_windows",
           "reference_window_logits", "golden_window_logits", "NextTokenComparison", "compare_next_token",
           "with_embedding_noise"]

SHAPE_370M = {"hidden_size": 1024, "intermediate_size": 2816}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays (flattened, float64)."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / den) if den else 1.0


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@dataclass
class ShippedAccuracy:
    positions: int
    ppl_reference: float
    ppl_golden: float
    ppl_rel_diff: float
    greedy_agreement: float
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def shipped_model_accuracy(weights: ModelWeights, token_ids: np.ndarray, *, context: int = 512,
                           options: CompileOptions | None = None, bos: int = 1) -> ShippedAccuracy:
    """Held-out perplexity and greedy agreement of golden vs reference over ``token_ids``.

    Windows of ``context`` tokens from a zero state with BOS first, as :mod:`host.evaluate` scores them.
    """
    t0 = time.time()
    options = options or CompileOptions()
    ref = ReferenceModel(weights, output_gate=options.output_gate)
    gold = GoldenDevice(packing=options.packing, channels=options.channels, output_gate=options.output_gate)
    gold.options = options
    gold.load(weights)
    nll_r = nll_g = 0.0
    agree = n = 0
    ids = np.asarray(token_ids)
    for s in range(0, len(ids), context):
        win = ids[s:s + context]
        inp = np.concatenate([[bos], win[:-1]])
        lr, _ = ref.forward(inp)
        gold.reset()
        lg = np.stack([gold.step(int(t)) for t in inp])
        nll_r -= float(_log_softmax(lr)[np.arange(len(win)), win].sum())
        nll_g -= float(_log_softmax(lg)[np.arange(len(win)), win].sum())
        agree += int((lr.argmax(-1) == lg.argmax(-1)).sum())
        n += len(win)
    pr, pg = math.exp(nll_r / n), math.exp(nll_g / n)
    return ShippedAccuracy(n, pr, pg, abs(pg - pr) / pr, agree / n, time.time() - t0)


@dataclass
class RandomAccuracy:
    layers: int
    tokens: int
    gamma_spread: float
    cos_o_proj: list[float]
    cos_down_proj: list[float]
    cos_h: list[float]
    min_cos_gemv: float
    min_cos_h: float
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def random_model_accuracy(*, layers: int = 2, tokens: int = 2048, vocab: int = 32000, seed: int = 0,
                          gamma_spread: float = 2.0, options: CompileOptions | None = None,
                          shape: dict | None = None) -> RandomAccuracy:
    """Per-layer GEMV-output and state cosine similarity of golden vs reference on a random model."""
    t0 = time.time()
    options = options or CompileOptions()
    cfg = HGRNBitConfig(vocab_size=vocab, num_hidden_layers=layers, **(shape or SHAPE_370M))
    w = random_weights(cfg, seed=seed, gamma_spread=gamma_spread)
    # embeddings ~ N(0, 1) are far from a trained model's; scale them to a typical residual size
    ids = np.random.default_rng(seed + 1).integers(0, vocab, tokens)
    ref = ReferenceModel(w, output_gate=options.output_gate)
    trace: dict = {}
    _, state_r = ref.forward(ids, trace=trace)
    formats = options.formats or calibrate(w, output_gate=options.output_gate)
    options = CompileOptions(**{**options.__dict__, "formats": formats})
    names = [ins.name for ins in compile_program(w, options)]
    gold = GoldenDevice(packing=options.packing, channels=options.channels, output_gate=options.output_gate)
    gold.options = options
    gold.load(w)
    want = {f"layers.{li}.attn.o_proj": ("o_proj", li) for li in range(layers)}
    want.update({f"layers.{li}.mlp.down_proj": ("down_proj", li) for li in range(layers)})
    got: dict[tuple[str, int], list[np.ndarray]] = {v: [] for v in want.values()}
    for t in ids:
        packet = gold.token_packet(int(t), gold.position)
        res = gold.machine.run_token(packet, gold._state, trace=True)
        gold._state = res.state
        gold._position += 1
        for name, r0 in zip(names, res.trace["r0"], strict=False):
            if name in want:
                got[want[name]].append(r0)
    frac, sfrac = formats.residual, formats.state
    cos_o = [cosine(nx.from_fixed(np.stack(got[("o_proj", li)]), frac), trace["o_proj"][li]) for li in range(layers)]
    cos_d = [cosine(nx.from_fixed(np.stack(got[("down_proj", li)]), frac), trace["down_proj"][li])
             for li in range(layers)]
    cos_h = [cosine(nx.from_fixed(gold._state[li], sfrac), state_r[li]) for li in range(layers)]
    return RandomAccuracy(layers, tokens, gamma_spread, cos_o, cos_d, cos_h, min(cos_o + cos_d), min(cos_h),
                          time.time() - t0)


# ------------------------------------------------------------------ logit-level comparison helpers
# Used by bench/bench_numerics.py: the same windows as :func:`shipped_model_accuracy`, but the logits are
# kept so that several devices (or perturbed copies of the reference) can be compared pairwise without
# recomputing the reference.
def scoring_windows(token_ids: np.ndarray, *, context: int = 512, bos: int = 1) -> Iterator[tuple[np.ndarray,
                                                                                                   np.ndarray]]:
    """``(inputs, targets)`` of each window of ``context`` tokens: BOS first, as
    :func:`shipped_model_accuracy` and :mod:`host.evaluate` score text (every window from a zero state)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    for s in range(0, len(ids), context):
        win = ids[s:s + context]
        yield np.concatenate([[bos], win[:-1]]).astype(np.int64), win


def reference_window_logits(ref: ReferenceModel, token_ids: np.ndarray, *, context: int = 512,
                            bos: int = 1) -> np.ndarray:
    """Next-token logits of the float reference over :func:`scoring_windows`: float32 [len(token_ids), V]."""
    return np.concatenate([ref.forward(inp)[0] for inp, _ in scoring_windows(token_ids, context=context, bos=bos)])


def golden_window_logits(gold: GoldenDevice, token_ids: np.ndarray, *, context: int = 512,
                         bos: int = 1) -> np.ndarray:
    """Next-token logits of a loaded golden device, token by token, over :func:`scoring_windows`
    (the device is reset before each window): float32 [len(token_ids), V]."""
    out = []
    for inp, _ in scoring_windows(token_ids, context=context, bos=bos):
        gold.reset()
        out.append(np.stack([gold.step(int(t)) for t in inp]))
    return np.concatenate(out)


@dataclass
class NextTokenComparison:
    """Perplexity and greedy agreement of a model ``b`` against a yardstick ``a`` on the same targets.

    ``confident_*`` restrict the agreement to positions where ``a``'s top-2 logit gap exceeds ``gap``
    (in logit units, nats): there a flip needs a logit error of at least ``gap / 2``.
    """

    positions: int
    ppl_a: float
    ppl_b: float
    ppl_rel_diff: float              #: ``|ppl_b - ppl_a| / ppl_a``
    greedy_agreement: float          #: share of positions with the same argmax
    gap: float
    confident_positions: int         #: positions with ``a``'s top-2 gap > ``gap``
    confident_agreement: float       #: greedy agreement on those positions (1.0 if there are none)
    max_abs_logit_diff: float

    def as_dict(self) -> dict:
        return asdict(self)


def compare_next_token(logits_a: np.ndarray, logits_b: np.ndarray, targets: np.ndarray, *,
                       gap: float = 0.05) -> NextTokenComparison:
    """Compare two [T, V] logit arrays against the targets [T] (int): see :class:`NextTokenComparison`.

    Raises
    ------
    ValueError
        If the shapes disagree.
    """
    a = np.asarray(logits_a)
    b = np.asarray(logits_b)
    t = np.asarray(targets, dtype=np.int64)
    if a.shape != b.shape or a.ndim != 2 or a.shape[0] != t.size:
        raise ValueError(f"logits {a.shape} and {b.shape} and targets {t.shape} do not match")
    n = t.size
    rows = np.arange(n)
    pa = math.exp(-float(_log_softmax(a)[rows, t].sum()) / n)
    pb = math.exp(-float(_log_softmax(b)[rows, t].sum()) / n)
    same = a.argmax(-1) == b.argmax(-1)
    top2 = np.partition(a.astype(np.float64), -2, axis=-1)[:, -2:]
    confident = (top2[:, 1] - top2[:, 0]) > gap
    nc = int(confident.sum())
    return NextTokenComparison(
        positions=n, ppl_a=pa, ppl_b=pb, ppl_rel_diff=abs(pb - pa) / pa, greedy_agreement=float(same.mean()),
        gap=float(gap), confident_positions=nc,
        confident_agreement=float(same[confident].mean()) if nc else 1.0,
        max_abs_logit_diff=float(np.max(np.abs(a.astype(np.float64) - b))))


def with_embedding_noise(weights: ModelWeights, rel: float, *, seed: int = 0) -> tuple[ModelWeights, float]:
    """A copy of ``weights`` whose embeddings carry relative Gaussian noise: ``e * (1 + rel * N(0, 1))``,
    computed in float64 and rounded to float32 (other arrays are shared, not copied).

    The float reference run on such a copy measures the model's own sensitivity (its noise floor): a
    ternary/int8 network flips activation codes at rounding boundaries and the recurrence carries the
    flip forward, so even a perturbation near float32's resolution changes some greedy choices.

    Returns
    -------
    weights : ModelWeights
    changed : float
        Share of embedding elements whose float32 value actually changed.
    """
    e = np.asarray(weights.embeddings, dtype=np.float32)
    noise = np.random.default_rng(seed).standard_normal(e.shape)
    noisy = (e.astype(np.float64) * (1.0 + rel * noise)).astype(np.float32)
    return dataclasses.replace(weights, embeddings=noisy), float(np.mean(noisy != e))
