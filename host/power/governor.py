"""The governor: when the measured mean power exceeds the budget, slow the token rate with sleeps.

After each token the session asks :meth:`Governor.sleep_needed` how long to wait before the next one.
Over the governed window (the run so far, or the last ``window_s`` seconds of it) the measured energy
is ``E`` over ``T`` seconds; while the host sleeps the board draws its idle power ``P_idle`` (measured
before the run), so sleeping ``s`` seconds brings the mean to ``(E + P_idle s) / (T + s)``. The
governor asks for the ``s`` that makes this equal to the budget ``B``::

    s = (E - B T) / (B - P_idle)          when E > B T, else 0

The session sleeps, reads the sensor again and asks again (a sensor reports with a delay, so the first
sleep may fall short), up to ``max_sleep_s`` per token. With a windowed mean, samples leaving the
window are ignored by the formula; asking again after each token corrects for it. A budget at or
below the idle draw cannot be met by sleeping: :class:`Governor` refuses it.
"""

from __future__ import annotations

import math

import numpy as np

from host.power.accounting import hold_durations
from host.power.base import PowerError

__all__ = ["Governor"]


class Governor:
    """Sleep-based rate control keeping the mean of the budget rails at or under the budget.

    Parameters
    ----------
    limit_w : float
        The budget in watts on the budget rails (for an above-idle budget: budget + idle).
    idle_w : float
        Idle draw of the budget rails, measured before the run.
    window_s : float, optional
        Govern the mean over the last ``window_s`` seconds (default: the whole run so far).
    max_sleep_s : float
        Longest total sleep after one token.

    Raises
    ------
    PowerError
        If ``limit_w <= idle_w`` (no token rate can meet it) or a parameter is out of range.
    """

    def __init__(self, limit_w: float, idle_w: float, *, window_s: float | None = None,
                 max_sleep_s: float = 10.0) -> None:
        if not (math.isfinite(limit_w) and math.isfinite(idle_w)):
            raise PowerError(f"governor: budget {limit_w} W and idle {idle_w} W must be finite")
        if limit_w <= idle_w:
            raise PowerError(f"the budget ({limit_w:.3f} W on the budget rails) is not above their idle draw "
                             f"({idle_w:.3f} W): no token rate can meet it; raise --budget or use "
                             "--budget-basis above-idle")
        if window_s is not None and not window_s > 0:
            raise PowerError(f"--governor-window must be > 0 s, got {window_s}")
        if not max_sleep_s > 0:
            raise PowerError(f"max_sleep_s must be > 0, got {max_sleep_s}")
        self.limit_w = float(limit_w)
        self.idle_w = float(idle_w)
        self.window_s = window_s
        self.max_sleep_s = float(max_sleep_s)

    @staticmethod
    def _mean(times: np.ndarray, totals: np.ndarray, a: float, b: float) -> float:
        ok = np.isfinite(totals)
        d = hold_durations(np.asarray(times)[ok], a, b)
        covered = float(d.sum())
        if b <= a or covered <= 0:
            return math.nan
        return float((d * np.asarray(totals)[ok]).sum() / covered)

    def mean(self, times: np.ndarray, totals: np.ndarray, start: float, now: float) -> float:
        """Mean of the budget rails over the governed window ending at ``now`` (NaN when uncovered)."""
        a = start if self.window_s is None else max(start, now - self.window_s)
        return self._mean(times, totals, a, now)

    def _need(self, mean: float, seconds: float) -> float:
        if not math.isfinite(mean) or mean <= self.limit_w:
            return 0.0
        return (mean - self.limit_w) * seconds / (self.limit_w - self.idle_w)

    def sleep_needed(self, times: np.ndarray, totals: np.ndarray, start: float, now: float) -> float:
        """Seconds to sleep now so that the governed mean comes back to the budget (0 when it is under).

        With a window, both the window's mean and the run's mean are brought back (the budget's pass or
        fail is judged on the run's mean; the window makes the governor react to recent draw).

        Parameters
        ----------
        times, totals : ndarray [N]
            Sample times and watts on the budget rails so far.
        start : float
            Start of the run (first token).
        now : float
            Current time on the same clock.
        """
        need = self._need(self._mean(times, totals, start, now), now - start)
        if self.window_s is not None:
            a = max(start, now - self.window_s)
            need = max(need, self._need(self._mean(times, totals, a, now), now - a))
        return need
