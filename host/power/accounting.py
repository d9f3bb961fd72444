"""Accounting of a power trace: idle baseline, mean and peak watts, energy per token, the budget.

Integration
-----------
A sample's watts hold from its time until the next sample (sample-and-hold; the last sample holds to
the end of any window), so the energy over a window ``[a, b]`` is ``sum(v_i * d_i)`` with ``d_i`` the
part of ``[t_i, t_{i+1})`` inside the window. Samples with a NaN reading of a rail are skipped for
that rail (the previous reading holds). Where the first sample comes after ``a`` the part before it is
uncovered: the mean is taken over the covered part and energies are ``mean * (b - a)``; ``coverage``
reports the covered fraction.

Figures
-------
* idle: time-weighted mean of each rail over the idle window (before the run);
* run: from the start of the first decode token to the end of the last one, or of the governor's
  sleep after it (governor sleeps are part of the run: they are how it lowers the mean); the prompt's
  prefill is not in it;
* per rail and total: mean and peak watts, mean above idle, energy (J) and energy above idle;
  "total" is the sum of the budget rails (never of every rail: a board's input rail and its sub-rails
  would be counted twice);
* per token: joules per token and tokens per joule, in total and above idle (energy over the run
  divided by the tokens: a sensor's samples are too coarse to split energy between tokens);
* budget: the run's mean on the budget basis (``total``: watts on the budget rails; ``above-idle``:
  those watts minus their idle) against the budget; time and energy over the budget; pass when the
  mean is at or under it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from host.power.base import PowerError, Sample

__all__ = ["BASES", "Budget", "Trace", "hold_durations", "summarize", "window_stats"]

#: Budget bases: the budget applies to the watts on the budget rails, or to the draw above their idle.
BASES = ("total", "above-idle")


@dataclass(frozen=True)
class Budget:
    """A power budget on a set of rails.

    Attributes
    ----------
    watts : float
        The budget, > 0.
    rails : tuple of str
        Rails whose sum is checked against it.
    basis : {"total", "above-idle"}
    """

    watts: float
    rails: tuple[str, ...]
    basis: str = "total"

    def __post_init__(self) -> None:
        if not (isinstance(self.watts, (int, float)) and math.isfinite(self.watts) and self.watts > 0):
            raise PowerError(f"the budget must be a positive number of watts, got {self.watts!r}")
        if self.basis not in BASES:
            raise PowerError(f"the budget basis must be one of {', '.join(BASES)}, got {self.basis!r}")
        if not self.rails:
            raise PowerError("the budget needs at least one rail")

    def absolute(self, idle_w: float) -> float:
        """The budget in watts on the budget rails, given their idle draw."""
        return self.watts + (idle_w if self.basis == "above-idle" else 0.0)


@dataclass
class Trace:
    """Samples of a run and its windows, on one clock.

    Attributes
    ----------
    rails : tuple of str
        Every rail of the source, in order.
    times : ndarray, float64 [N]
        Sample times (s), ascending.
    watts : ndarray, float64 [N, R]
        Watts per sample and rail (NaN: not read).
    idle : (float, float)
        Idle window.
    tokens : list of (float, float)
        Window of each decode token.
    prefill : (float, float) or None
        Window of the prompt's prefill.
    sleeps : list of (float, float)
        Governor sleeps.
    kind : {"measured", "estimate"}
    """

    rails: tuple[str, ...]
    times: np.ndarray
    watts: np.ndarray
    idle: tuple[float, float]
    tokens: list[tuple[float, float]] = field(default_factory=list)
    prefill: tuple[float, float] | None = None
    sleeps: list[tuple[float, float]] = field(default_factory=list)
    kind: str = "measured"

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], rails: Sequence[str], **windows) -> Trace:
        """Build a trace from samples (sorted here; stable for equal times)."""
        rails = tuple(rails)
        ordered = sorted(samples, key=lambda s: s.t)
        times = np.array([s.t for s in ordered], dtype=np.float64)
        watts = np.array([[float(s.watts.get(r, math.nan)) for r in rails] for s in ordered],
                         dtype=np.float64).reshape(len(ordered), len(rails))
        return cls(rails=rails, times=times, watts=watts, **windows)

    @property
    def run(self) -> tuple[float, float]:
        """From the start of the first token to the end of the last, or of the governor's sleep after it.

        Raises
        ------
        PowerError
            If the trace has no tokens.
        """
        if not self.tokens:
            raise PowerError("the trace has no tokens")
        end = self.tokens[-1][1]
        for s, e in self.sleeps:
            if s >= self.tokens[-1][0]:
                end = max(end, e)
        return self.tokens[0][0], end

    def column(self, rail: str) -> np.ndarray:
        return self.watts[:, self.rails.index(rail)]

    def total(self, rails: Sequence[str]) -> np.ndarray:
        """Sum of ``rails`` per sample (NaN where any is NaN)."""
        idx = [self.rails.index(r) for r in rails]
        return self.watts[:, idx].sum(axis=1)

    def phase_of(self, t: float) -> tuple[str, int | None]:
        """Phase at time ``t``: idle, prefill, token (with its index), sleep, before, between or after."""
        a, b = self.idle
        if a <= t < b:
            return "idle", None
        if self.prefill is not None and self.prefill[0] <= t < self.prefill[1]:
            return "prefill", None
        i = _find(self.tokens, t)
        if i is not None:
            return "token", i
        if _find(self.sleeps, t) is not None:
            return "sleep", None
        if t < a:
            return "before", None
        if self.tokens and t >= self.run[1]:
            return "after", None
        return "between", None


def _find(windows: list[tuple[float, float]], t: float) -> int | None:
    """Index of the window of ``windows`` (sorted, disjoint) holding ``t``, or None."""
    i = bisect.bisect_right(windows, (t, math.inf)) - 1
    return i if i >= 0 and windows[i][0] <= t < windows[i][1] else None


def hold_durations(times: np.ndarray, a: float, b: float) -> np.ndarray:
    """Seconds each sample's value holds inside ``[a, b]`` (sample-and-hold; the last holds forever)."""
    times = np.asarray(times, dtype=np.float64)
    if times.size == 0:
        return times
    nxt = np.append(times[1:], np.inf)
    return np.clip(np.minimum(nxt, b) - np.maximum(times, a), 0.0, None)


@dataclass(frozen=True)
class WindowStats:
    """Time-weighted statistics of one series over one window."""

    mean_w: float        #: time-weighted mean over the covered part (NaN when nothing is covered)
    peak_w: float        #: largest reading held inside the window
    energy_j: float      #: mean * window length
    coverage: float      #: covered fraction of the window
    over_s: float = 0.0  #: time above the threshold (when one was given)
    over_j: float = 0.0  #: energy above the threshold


def window_stats(times: np.ndarray, values: np.ndarray, a: float, b: float,
                 threshold: float | None = None) -> WindowStats:
    """Statistics of ``values`` (sample-and-hold at ``times``) over ``[a, b]``; NaN readings skipped."""
    ok = np.isfinite(values)
    t, v = np.asarray(times)[ok], np.asarray(values)[ok]
    span = b - a
    d = hold_durations(t, a, b)
    covered = float(d.sum())
    if span <= 0 or covered <= 0:
        return WindowStats(math.nan, math.nan, math.nan, 0.0)
    inside = d > 0
    mean = float((d * v).sum() / covered)
    scale = span / covered
    over_s = over_j = 0.0
    if threshold is not None:
        excess = np.clip(v - threshold, 0.0, None)
        over_s = float(d[v > threshold].sum() * scale)
        over_j = float((d * excess).sum() * scale)
    return WindowStats(mean, float(v[inside].max()), mean * span, covered / span, over_s, over_j)


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def summarize(trace: Trace, budget: Budget) -> dict:
    """Every figure of a run (see the module docstring), JSON-ready (NaN becomes None).

    Returns
    -------
    dict
        ``kind``, ``estimate``, ``idle``, ``run``, ``rails`` (per rail), ``total``, ``per_token``,
        ``budget``, ``coverage``.

    Raises
    ------
    PowerError
        If the trace has no tokens, or no sample covers the idle window or the run.
    """
    missing = [r for r in budget.rails if r not in trace.rails]
    if missing:
        raise PowerError(f"budget rails {missing} are not in the trace (rails: {', '.join(trace.rails)})")
    a, b = trace.run
    ia, ib = trace.idle
    n = len(trace.tokens)
    total = trace.total(budget.rails)
    idle_total = window_stats(trace.times, total, ia, ib)
    if idle_total.coverage == 0:
        raise PowerError(f"no sample covers the idle window ({ib - ia:.3g} s): lengthen --idle or sample faster "
                         "(--period)")
    run_total = window_stats(trace.times, total, a, b)
    if run_total.coverage == 0:
        raise PowerError("no sample covers the run: the source recorded nothing while the tokens ran")
    idle_w = idle_total.mean_w
    limit = budget.absolute(idle_w)
    run_total = window_stats(trace.times, total, a, b, threshold=limit)
    duration = b - a

    rails = {}
    for r in trace.rails:
        col = trace.column(r)
        ri = window_stats(trace.times, col, ia, ib)
        rr = window_stats(trace.times, col, a, b)
        rails[r] = {"idle_w": _num(ri.mean_w), "mean_w": _num(rr.mean_w), "peak_w": _num(rr.peak_w),
                    "above_idle_w": _num(rr.mean_w - ri.mean_w), "energy_j": _num(rr.energy_j),
                    "energy_above_idle_j": _num((rr.mean_w - ri.mean_w) * duration), "in_budget": r in budget.rails}

    energy = run_total.energy_j
    above = (run_total.mean_w - idle_w) * duration
    basis_mean = run_total.mean_w - (idle_w if budget.basis == "above-idle" else 0.0)
    passed = bool(basis_mean <= budget.watts * (1 + 1e-9))  # the governor lands on the budget, up to rounding
    return {
        "kind": trace.kind,
        "estimate": trace.kind == "estimate",
        "idle": {"seconds": ib - ia, "total_w": _num(idle_w), "coverage": idle_total.coverage},
        "run": {"seconds": duration, "tokens": n, "tokens_per_s": n / duration if duration > 0 else None,
                "prefill_seconds": (trace.prefill[1] - trace.prefill[0]) if trace.prefill else None,
                "governor_sleeps": len(trace.sleeps), "governor_sleep_s": sum(e - s for s, e in trace.sleeps),
                "coverage": run_total.coverage},
        "rails": rails,
        "total": {"rails": list(budget.rails), "mean_w": _num(run_total.mean_w), "peak_w": _num(run_total.peak_w),
                  "idle_w": _num(idle_w), "above_idle_w": _num(run_total.mean_w - idle_w),
                  "energy_j": _num(energy), "energy_above_idle_j": _num(above)},
        "per_token": {"j_per_token": _num(energy / n) if n else None,
                      "tokens_per_j": _num(n / energy) if n and energy > 0 else None,
                      "j_per_token_above_idle": _num(above / n) if n else None,
                      "tokens_per_j_above_idle": _num(n / above) if n and above > 0 else None},
        "budget": {"watts": budget.watts, "basis": budget.basis, "rails": list(budget.rails),
                   "limit_w": _num(limit), "mean_w": _num(basis_mean), "pass": passed,
                   "time_over_s": run_total.over_s, "energy_over_j": run_total.over_j,
                   "fraction_over": run_total.over_s / duration if duration > 0 else 0.0},
    }
