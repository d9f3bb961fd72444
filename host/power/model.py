"""Model sources: power as a function of what the accelerator did, on a virtual clock.

A :class:`ModelSource` produces a piecewise-constant power trace: a sample at the start of every
segment (a token, a sleep, the idle baseline), whose watts hold until the next sample. Time is the
modelled time of the accelerator (:class:`~host.power.base.VirtualClock`): a token lasts what the
model says it lasts, whatever the host's wall time; the session's sleeps (the idle baseline, the
governor) advance it at idle power.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping

from host.power.base import PowerError, PowerSource, Sample, VirtualClock

__all__ = ["ModelSource"]


class ModelSource(PowerSource):
    """Base of the estimate and replay sources: segments of constant power on a virtual clock.

    Subclasses implement ``_open`` (the rails), :meth:`idle_watts` and :meth:`on_token`, which calls
    :meth:`segment` with the token's modelled duration and watts.
    """

    kind = "estimate"

    def __init__(self) -> None:
        super().__init__()
        self.model_time = 0.0
        self.clock = VirtualClock(self)
        self._pending: list[Sample] = []
        self._last: Sample | None = None
        self._running = False

    @abc.abstractmethod
    def idle_watts(self) -> dict[str, float]:
        """Watts per rail while the accelerator waits."""

    def _emit(self, watts: Mapping[str, float]) -> None:
        sample = Sample(self.model_time, {r: float(watts[r]) for r in self.rails})
        if self._last is not None and self._last == sample:
            return  # the same reading again at the same time
        if self._pending and self._pending[-1].t == sample.t:
            self._pending[-1] = sample  # a zero-length segment: the later one holds from this time
        else:
            self._pending.append(sample)
        self._last = sample

    def segment(self, duration_s: float, watts: Mapping[str, float]) -> None:
        """Record ``watts`` from now for ``duration_s`` modelled seconds and advance the clock."""
        if not self._running:
            raise PowerError(f"power source {self.name!r} is not recording: call start() first")
        if duration_s < 0:
            raise PowerError(f"a segment cannot last {duration_s} s")
        self._emit(watts)
        self.model_time += duration_s

    def idle_for(self, seconds: float) -> None:
        """Idle for ``seconds`` (the virtual clock's sleep)."""
        self.segment(seconds, self.idle_watts())

    def start(self, period_s: float | None = None) -> None:
        # The period does not apply: a model's trace is exact at every segment boundary.
        self._running = True
        self._emit(self.idle_watts())

    def poll(self) -> list[Sample]:
        out, self._pending = self._pending, []
        return out

    def stop(self) -> list[Sample]:
        if self._running:
            self._emit(self.idle_watts())
            self._running = False
        return self.poll()
