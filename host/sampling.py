"""Next-token selection from logits: greedy, temperature, top-k, top-p (nucleus), repetition penalty.

The processing order and conventions are those of Hugging Face ``transformers`` ``generate`` (so results
are comparable with the released model's usual decoding):

1. repetition penalty (Keskar et al., *CTRL*, 2019, eq. in section 4.1; HF
   ``RepetitionPenaltyLogitsProcessor``): for every token id already in the context, a positive logit is
   divided by the penalty and a negative one multiplied by it;
2. temperature 0 selects the argmax (greedy; the lowest id on ties) and skips the rest;
3. logits divided by the temperature;
4. top-k: keep the tokens whose logit is at least the k-th largest (ties at the boundary are all kept,
   as HF's ``TopKLogitsWarper``);
5. top-p (Holtzman et al., 2020): keep the smallest set of most probable tokens whose probability mass
   reaches ``top_p`` (always at least one token);
6. softmax over the kept tokens (float64), and one draw from a :class:`numpy.random.Generator` by
   inverse CDF (one ``random()`` per token), so a seed gives the same tokens on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Sampler",
    "apply_repetition_penalty",
    "filter_top_k",
    "filter_top_p",
    "greedy",
    "probabilities",
    "validate_sampling",
]


#: The command-line flags of the sampling arguments, for :func:`validate_sampling` ``cli=True``.
CLI_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
             "repetition_penalty": "--repetition-penalty"}


def validate_sampling(*, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      repetition_penalty: float = 1.0, cli: bool = False) -> None:
    """Check sampling arguments.

    Parameters
    ----------
    temperature : float, >= 0
        0 selects greedy decoding.
    top_k : int, >= 0
        0 disables top-k.
    top_p : float, in (0, 1]
        1 disables top-p.
    repetition_penalty : float, > 0
        1 disables the penalty; > 1 discourages repeats.
    cli : bool
        Name the arguments by their command-line flags (:data:`CLI_FLAGS`: ``--top-p``) in the messages.

    Raises
    ------
    ValueError
        Naming the argument, for a value out of range, NaN, or of the wrong type.
    """
    def n(name: str) -> str:
        return CLI_FLAGS[name] if cli else name

    def real(name: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ValueError(f"{n(name)} must be a number, got {value!r}")
        v = float(value)
        if math.isnan(v) or math.isinf(v):
            raise ValueError(f"{n(name)} must be finite, got {value!r}")
        return v

    if real("temperature", temperature) < 0:
        raise ValueError(f"{n('temperature')} must be >= 0 (0 = greedy), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"{n('top_k')} must be an integer >= 0 (0 = off), got {top_k!r}")
    if not 0 < real("top_p", top_p) <= 1:
        raise ValueError(f"{n('top_p')} must be in (0, 1] (1 = off), got {top_p!r}")
    if real("repetition_penalty", repetition_penalty) <= 0:
        raise ValueError(f"{n('repetition_penalty')} must be > 0 (1 = off), got {repetition_penalty!r}")


def _as_logits(logits: np.ndarray) -> np.ndarray:
    x = np.array(logits, dtype=np.float64)  # a copy: callers' arrays are never modified
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
    if np.isnan(x).any():
        raise ValueError("logits contain NaN")
    if (x == np.inf).any():
        raise ValueError("logits contain +inf")
    if not (x > -np.inf).any():
        raise ValueError("every logit is -inf: nothing can be sampled")
    return x


def apply_repetition_penalty(logits: np.ndarray, context: Iterable[int], penalty: float) -> np.ndarray:
    """Penalize tokens already in the context (CTRL / HF convention).

    Parameters
    ----------
    logits : ndarray, shape [V], float
    context : iterable of int
        Token ids seen so far (prompt and generated); repeats count once. Ids outside ``[0, V)`` are
        ignored.
    penalty : float, > 0

    Returns
    -------
    ndarray, shape [V], float64
        A new array: for ids in the context, ``logit / penalty`` where ``logit > 0``, else
        ``logit * penalty``; other ids unchanged.
    """
    validate_sampling(repetition_penalty=penalty)
    x = _as_logits(logits)
    if penalty == 1.0:
        return x
    ids = np.unique(np.fromiter((int(t) for t in context), dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < x.size)]
    sel = x[ids]
    x[ids] = np.where(sel > 0, sel / penalty, sel * penalty)
    return x


def filter_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Set every logit below the k-th largest to -inf (ties at the boundary are kept).

    Parameters
    ----------
    logits : ndarray, shape [V], float
    k : int, >= 0
        0 (or k >= V) returns the logits unchanged.

    Returns
    -------
    ndarray, shape [V], float64
    """
    validate_sampling(top_k=k)
    x = _as_logits(logits)
    if k == 0 or k >= x.size:
        return x
    kth = np.partition(x, x.size - k)[x.size - k]
    x[x < kth] = -np.inf
    return x


def filter_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most probable tokens whose softmax mass reaches ``p``; others -inf.

    A token is kept when the mass of the tokens strictly more probable than it (stable order: lower id
    first among equals) is below ``p``, so the most probable token is always kept.

    Parameters
    ----------
    logits : ndarray, shape [V], float
        Already divided by the temperature.
    p : float, in (0, 1]
        1 returns the logits unchanged.

    Returns
    -------
    ndarray, shape [V], float64
    """
    validate_sampling(top_p=p)
    x = _as_logits(logits)
    if p >= 1.0:
        return x
    order = np.argsort(-x, kind="stable")
    probs = _softmax(x[order])
    before = np.cumsum(probs) - probs
    x[order[before >= p]] = -np.inf
    return x


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def greedy(logits: np.ndarray) -> int:
    """Index of the largest logit (the lowest index on ties)."""
    return int(np.argmax(_as_logits(logits)))


def probabilities(logits: np.ndarray, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  repetition_penalty: float = 1.0, context: Iterable[int] = ()) -> np.ndarray:
    """The distribution :class:`Sampler` draws from, after every processing step (module docstring).

    Returns
    -------
    ndarray, shape [V], float64
        Sums to 1; zero outside the kept set. With ``temperature == 0``, one-hot at the (penalized)
        argmax.

    Raises
    ------
    ValueError
        On invalid arguments (see :func:`validate_sampling`) or NaN logits.
    """
    validate_sampling(temperature=temperature, top_k=top_k, top_p=top_p,
                      repetition_penalty=repetition_penalty)
    x = apply_repetition_penalty(logits, context, repetition_penalty)
    if temperature == 0:
        out = np.zeros(x.size)
        out[int(np.argmax(x))] = 1.0
        return out
    x = filter_top_p(filter_top_k(x / temperature, top_k), top_p)
    return _softmax(x)


@dataclass(eq=False)
class Sampler:
    """Seeded next-token selection; call it with logits (and the context, for the repetition penalty).

    Parameters
    ----------
    temperature : float, >= 0, default 1.0
        0 selects greedy decoding (deterministic; the generator is not used).
    top_k : int, >= 0, default 0 (off)
    top_p : float, in (0, 1], default 1.0 (off)
    repetition_penalty : float, > 0, default 1.0 (off)
    seed : int >= 0 or None, default None
        Seed of the :func:`numpy.random.default_rng` generator; None draws fresh OS entropy. The same
        seed and logits give the same tokens.

    Raises
    ------
    ValueError
        Naming the argument, on invalid values.

    Examples
    --------
    >>> sampler = Sampler(temperature=0.8, top_k=40, seed=0)
    >>> token = sampler(logits, context=ids)  # doctest: +SKIP
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        validate_sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                          repetition_penalty=self.repetition_penalty)
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                                 or seed < 0):
            raise ValueError(f"seed must be an integer >= 0 or None, got {self.seed!r}")
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray, context: Iterable[int] = ()) -> int:
        """Select the next token.

        Parameters
        ----------
        logits : ndarray, shape [V], float32 or float64
        context : iterable of int
            Ids already in the sequence (prompt and generated), for the repetition penalty.

        Returns
        -------
        int
            Token id in ``[0, V)``.
        """
        probs = probabilities(logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              repetition_penalty=self.repetition_penalty, context=context)
        if self.temperature == 0:
            return int(np.argmax(probs))
        cdf = np.cumsum(probs)
        u = self.rng.random() * cdf[-1]
        return min(int(np.searchsorted(cdf, u, side="right")), probs.size - 1)
