"""The governor keeps an over-budget run under its budget: synthetic traces, a recorded trace, a lagging sensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_power_fakes import FakeClock, FakeDevice

from host.power import Budget, Governor, PowerError, PowerSession, summarize
from host.power.accounting import window_stats
from host.power.base import PolledSource
from host.power.replay import ReplaySource

RECORDED = Path(__file__).parent / "fixtures" / "power" / "estimate_kv260_golden_32tok.csv"


def run(source, budget: Budget, tokens: int, **kw):
    source.open()
    device = FakeDevice()
    with PowerSession(source, budget, **kw) as s:
        s.begin()
        for t in range(tokens):
            s.step(device, t)
        trace = s.finish()
    return trace, summarize(trace, budget)


def synthetic(active_w: float = 20.0, idle_w: float = 4.0, token_s: float = 0.1) -> ReplaySource:
    return ReplaySource([(token_s, {"in": active_w})], {"in": idle_w})


def test_synthetic_over_budget_run_is_brought_under_budget():
    budget = Budget(13.0, ("in",))
    _, free = run(synthetic(), budget, 50, idle_s=1.0)
    assert not free["budget"]["pass"] and free["total"]["mean_w"] == pytest.approx(20.0)
    trace, gov = run(synthetic(), budget, 50, idle_s=1.0, governor=True)
    assert gov["budget"]["pass"] and gov["total"]["mean_w"] == pytest.approx(13.0)
    # (20 * 0.1 + 4 s) / (0.1 + s) = 13  =>  s = 0.7 / 9 after every token
    assert [e - s for s, e in trace.sleeps] == pytest.approx([0.7 / 9] * 50)
    assert gov["run"]["tokens_per_s"] == pytest.approx(1 / (0.1 + 0.7 / 9))
    # the mean of the run so far is at or under the budget after every token's sleep
    total = trace.total(["in"])
    for _token, (_, slept_to) in zip(trace.tokens, trace.sleeps, strict=True):
        assert window_stats(trace.times, total, trace.tokens[0][0], slept_to).mean_w <= 13.0 + 1e-9
    assert gov["per_token"]["j_per_token_above_idle"] == pytest.approx(free["per_token"]["j_per_token_above_idle"])


def test_governor_leaves_an_under_budget_run_alone():
    trace, s = run(synthetic(active_w=9.0), Budget(13.0, ("in",)), 20, governor=True, idle_s=1.0)
    assert s["budget"]["pass"] and trace.sleeps == [] and s["run"]["tokens_per_s"] == pytest.approx(10.0)


def test_windowed_governor():
    budget = Budget(13.0, ("in",))
    trace, s = run(synthetic(), budget, 60, idle_s=1.0, governor=True, governor_window_s=0.5)
    assert s["budget"]["pass"]
    total = trace.total(["in"])
    ends = [max(e for _, e in trace.sleeps if e <= nxt[0] + 1e-12)
            for nxt in trace.tokens[1:]]            # where the governor let each next token start
    assert len(ends) == 59
    for end in ends:                                 # the last 0.5 s were at or under the budget
        assert window_stats(trace.times, total, max(trace.tokens[0][0], end - 0.5), end).mean_w <= 13.0 + 1e-6


def test_above_idle_budget():
    budget = Budget(3.0, ("in",), basis="above-idle")   # limit 4 + 3 = 7 W
    _, s = run(synthetic(), budget, 30, idle_s=1.0, governor=True)
    assert s["budget"]["pass"] and s["total"]["mean_w"] == pytest.approx(7.0)


def test_recorded_trace_over_a_tight_budget():
    """The recorded estimate (3.585 W during tokens over 3.5 W idle) under a 3.55 W budget."""
    budget = Budget(3.55, ("pl", "mem", "rest"))
    _, free = run(ReplaySource.from_csv(RECORDED), budget, 32)
    assert not free["budget"]["pass"] and free["total"]["mean_w"] == pytest.approx(3.5846, abs=1e-4)
    trace, gov = run(ReplaySource.from_csv(RECORDED), budget, 32, governor=True)
    assert gov["budget"]["pass"] and gov["total"]["mean_w"] == pytest.approx(3.55)
    assert len(trace.sleeps) == 32 and gov["kind"] == "estimate"


def test_budget_at_or_below_idle_is_refused():
    with pytest.raises(PowerError, match=r"not above their idle draw .* no token rate can meet it"):
        run(synthetic(), Budget(3.0, ("in",)), 5, governor=True, idle_s=1.0)
    with pytest.raises(PowerError, match="not above"):
        Governor(4.0, 4.0)


def test_sleep_formula():
    g = Governor(13.0, 4.0)
    times, totals = np.array([0.0]), np.array([20.0])
    assert g.sleep_needed(times, totals, 0.0, 0.1) == pytest.approx(0.7 / 9)
    assert g.sleep_needed(times, np.array([12.0]), 0.0, 0.1) == 0.0
    assert g.sleep_needed(np.array([]), np.array([]), 0.0, 0.1) == 0.0


class LaggingSensor(PolledSource):
    """A polled sensor on a fake clock that reports the draw of ``lag`` seconds ago (a real sensor's delay)."""

    name = "lagging"

    def __init__(self, clock: FakeClock, device: FakeDevice, active_w: float, idle_w: float, lag: float) -> None:
        super().__init__()
        self.clock = clock
        self.device = device
        self.active = []       # (start, end) of each token, from the device
        self.active_w, self.idle_w, self.lag = active_w, idle_w, lag

    def _open(self):
        return ("in",)

    def start(self, period_s=None):  # no thread: the test takes readings when the clock moves
        self._take()

    def read(self):
        t = self.clock.now() - self.lag
        return {"in": self.active_w if any(a <= t < b for a, b in self.active) else self.idle_w}


def test_governor_with_a_lagging_sensor_on_a_real_time_base():
    """Tokens of 0.1 s at 20 W over 4 W idle, a sensor 0.02 s late sampled every 0.01 s: still under budget."""
    clock = FakeClock(100.0)
    sensor = LaggingSensor(clock, None, 20.0, 4.0, lag=0.02)
    sensor.open()

    def sample_while(seconds):  # time passes: the sensor is sampled every 10 ms
        end = clock.t + seconds
        while clock.t < end - 1e-12:
            clock.t = min(end, clock.t + 0.01)
            sensor._take()

    clock.sleep = sample_while

    class Device(FakeDevice):
        def step(self, token_id):
            sensor.active.append((clock.t, clock.t + 0.1))
            return super().step(token_id)

    device = Device(clock, token_s=0.1)
    budget = Budget(13.0, ("in",))
    with PowerSession(sensor, budget, governor=True, idle_s=0.5) as s:
        s.begin()
        for t in range(40):
            s.step(device, t)
        trace = s.finish()
    summary = summarize(trace, budget)
    assert summary["budget"]["pass"], summary["budget"]
    assert summary["total"]["mean_w"] == pytest.approx(13.0, abs=0.3)
    assert len(trace.sleeps) >= 40
    _, free = run(synthetic(), budget, 40, idle_s=0.5)
    assert not free["budget"]["pass"]
