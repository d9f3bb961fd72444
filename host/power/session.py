"""A power session: idle baseline, then tokens on a device, each stamped on the source's clock.

::

    with PowerSession(source, budget, governor=True) as session:   # source already open
        session.begin()                          # start recording, measure the idle baseline
        logits = session.prefill(device, prompt_ids)
        for ...:
            logits = session.step(device, token)  # the governor may sleep after each token
        trace = session.finish()

Every time stamp and every sleep goes through ``source.clock``: wall time for measured sources, the
modelled time of model sources. After each token the source's :meth:`~PowerSource.on_token` hook gets
the change of the device's ``hw_*`` counters over the token (the estimate turns it into watts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from host.power.accounting import Budget, Trace, window_stats
from host.power.base import PowerError, PowerSource, Sample
from host.power.governor import Governor
from host.power.model import ModelSource

__all__ = ["DEFAULT_IDLE_S", "DEFAULT_MODEL_IDLE_S", "PowerSession", "activity"]

#: Idle baseline of measured sources (wall seconds).
DEFAULT_IDLE_S = 2.0
#: Idle baseline of model sources (modelled seconds).
DEFAULT_MODEL_IDLE_S = 0.02
_MAX_GOVERNOR_ROUNDS = 64


def activity(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Change of the ``hw_*`` counters between two ``Device.counters()`` snapshots."""
    return {k: int(v) - int(before.get(k, 0)) for k, v in after.items() if k.startswith("hw_")}


class PowerSession:
    """Record a run's power with an idle baseline, token boundaries and, optionally, the governor.

    Parameters
    ----------
    source : PowerSource
        An open source.
    budget : Budget
        Budget and its rails (which must be rails of the source).
    governor : bool
        Slow the token rate with sleeps whenever the mean exceeds the budget.
    governor_window_s : float, optional
        Govern the mean over the last N seconds instead of the whole run.
    max_sleep_s : float
        Longest governor sleep after one token.
    period_s : float, optional
        Sampling period (default: the source's).
    idle_s : float, optional
        Length of the idle baseline (default :data:`DEFAULT_IDLE_S`, :data:`DEFAULT_MODEL_IDLE_S` for
        model sources).
    """

    def __init__(self, source: PowerSource, budget: Budget, *, governor: bool = False,
                 governor_window_s: float | None = None, max_sleep_s: float = 10.0, period_s: float | None = None,
                 idle_s: float | None = None) -> None:
        missing = [r for r in budget.rails if r not in source.rails]
        if missing:
            raise PowerError(f"budget rails {missing} are not rails of the {source.name} source "
                             f"({', '.join(source.rails)})")
        if idle_s is None:
            idle_s = DEFAULT_MODEL_IDLE_S if isinstance(source, ModelSource) else DEFAULT_IDLE_S
        if not idle_s > 0:
            raise PowerError(f"--idle must be > 0 s, got {idle_s}")
        if period_s is not None and not period_s > 0:
            raise PowerError(f"--period must be > 0 s, got {period_s}")
        self.source = source
        self.budget = budget
        self.clock = source.clock
        self.use_governor = governor
        self.governor_window_s = governor_window_s
        self.max_sleep_s = max_sleep_s
        self.period_s = period_s
        self.idle_s = float(idle_s)
        self.samples: list[Sample] = []
        self._t: list[float] = []
        self._v: list[float] = []
        self.idle: tuple[float, float] | None = None
        self.idle_w: float = math.nan
        self.prefill_window: tuple[float, float] | None = None
        self.tokens: list[tuple[float, float]] = []
        self.sleeps: list[tuple[float, float]] = []
        self.governor: Governor | None = None
        self._started = False
        self._finished = False

    # ------------------------------------------------------------------ recording

    def _collect(self, samples: Sequence[Sample] | None = None) -> None:
        new = self.source.poll() if samples is None else list(samples)
        rails = self.budget.rails
        for s in new:
            self.samples.append(s)
            self._t.append(s.t)
            self._v.append(sum(float(s.watts.get(r, math.nan)) for r in rails))

    def _series(self) -> tuple[np.ndarray, np.ndarray]:
        t = np.asarray(self._t, dtype=np.float64)
        v = np.asarray(self._v, dtype=np.float64)
        order = np.argsort(t, kind="stable")
        return t[order], v[order]

    def begin(self) -> None:
        """Start the source and record the idle baseline (the device must be idle meanwhile).

        Raises
        ------
        PowerError
            If no sample covers the idle window, or the governor is on and the budget is not above idle.
        """
        if self._started:
            raise PowerError("the power session has already begun")
        self._started = True
        self.source.start(self.period_s)
        self._collect()
        t0 = self.clock.now()
        self.clock.sleep(self.idle_s)
        t1 = self.clock.now()
        self.idle = (t0, t1)
        self._collect()
        t, v = self._series()
        stats = window_stats(t, v, t0, t1)
        if stats.coverage == 0:
            raise PowerError(f"no sample of the {self.source.name} source covers the idle window ({t1 - t0:.3g} s): "
                             "lengthen --idle, sample faster (--period), or check the source's clock")
        self.idle_w = stats.mean_w
        if self.use_governor:
            self.governor = Governor(self.budget.absolute(self.idle_w), self.idle_w,
                                     window_s=self.governor_window_s, max_sleep_s=self.max_sleep_s)

    def _run(self, fn: Any, device: Any) -> tuple[Any, tuple[float, float]]:
        if not self._started or self._finished:
            raise PowerError("call begin() before running tokens, and not after finish()")
        before = device.counters()
        t0 = self.clock.now()
        out = fn()
        self.source.on_token(activity(before, device.counters()))
        t1 = self.clock.now()
        return out, (t0, t1)

    def prefill(self, device: Any, token_ids: Sequence[int]) -> np.ndarray:
        """``device.prefill(token_ids)``, recorded as the prefill window (not part of the run's figures)."""
        logits, window = self._run(lambda: device.prefill(token_ids), device)
        self.prefill_window = window
        self._collect()
        return logits

    def step(self, device: Any, token_id: int) -> np.ndarray:
        """``device.step(token_id)``, recorded as one decode token; then the governor, if on."""
        logits, window = self._run(lambda: device.step(token_id), device)
        self.tokens.append(window)
        self._collect()
        if self.governor is not None:
            self._govern()
        return logits

    def _govern(self) -> None:
        gov = self.governor
        assert gov is not None
        start = self.tokens[0][0]
        slept = 0.0
        for _ in range(_MAX_GOVERNOR_ROUNDS):
            now = self.clock.now()
            t, v = self._series()
            s = gov.sleep_needed(t, v, start, now)
            if s <= 1e-9 * max(1.0, now - start) or slept >= gov.max_sleep_s:
                return
            s = min(s, gov.max_sleep_s - slept)
            t0 = self.clock.now()
            self.clock.sleep(s)
            t1 = self.clock.now()
            self.sleeps.append((t0, t1))
            slept += t1 - t0
            self._collect()

    def finish(self) -> Trace:
        """Stop the source and return the trace.

        Raises
        ------
        PowerError
            If no token was run.
        """
        if self._finished:
            raise PowerError("the power session has already finished")
        self._finished = True
        self._collect(self.source.stop())
        if not self.tokens:
            raise PowerError("no token was run: nothing to account")
        assert self.idle is not None
        return Trace.from_samples(self.samples, self.source.rails, idle=self.idle, tokens=list(self.tokens),
                                  prefill=self.prefill_window, sleeps=list(self.sleeps), kind=self.source.kind)

    def close(self) -> None:
        """Stop recording if a run ended early (an exception, Ctrl-C); the source stays open."""
        if self._started and not self._finished:
            self._finished = True
            try:
                self.source.stop()
            except Exception:  # noqa: BLE001 - already failing: keep the first error
                pass

    def __enter__(self) -> PowerSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
