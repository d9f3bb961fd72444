"""host.power.accounting on synthetic traces with known answers; the outputs (CSV, JSON, PNG) written safely."""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import pytest

from host.power import Budget, PowerError, Sample, Trace, summarize
from host.power.accounting import hold_durations, window_stats
from host.power.output import atomic_write, plot_trace, write_json, write_samples_csv


def constant_run(run_w: float = 10.0, idle_w: float = 4.0, seconds: float = 2.0, tokens: int = 20) -> Trace:
    """Idle ``idle_w`` for 1 s, then ``run_w`` for ``seconds`` split evenly over ``tokens`` tokens."""
    dt = seconds / tokens
    samples = [Sample(0.0, {"in": idle_w}), Sample(1.0, {"in": run_w}), Sample(1.0 + seconds, {"in": idle_w})]
    return Trace.from_samples(samples, ("in",), idle=(0.0, 1.0),
                              tokens=[(1.0 + i * dt, 1.0 + (i + 1) * dt) for i in range(tokens)])


def test_constant_10w_for_2s_over_4w_idle_with_20_tokens():
    s = summarize(constant_run(), Budget(13.0, ("in",)))
    assert s["idle"]["total_w"] == pytest.approx(4.0)
    assert s["run"]["seconds"] == pytest.approx(2.0) and s["run"]["tokens_per_s"] == pytest.approx(10.0)
    t = s["total"]
    assert t["mean_w"] == pytest.approx(10.0) and t["peak_w"] == pytest.approx(10.0)
    assert t["above_idle_w"] == pytest.approx(6.0)
    assert t["energy_j"] == pytest.approx(20.0)
    assert t["energy_above_idle_j"] == pytest.approx(12.0)
    p = s["per_token"]
    assert p["j_per_token"] == pytest.approx(1.0) and p["tokens_per_j"] == pytest.approx(1.0)
    assert p["j_per_token_above_idle"] == pytest.approx(0.6) and p["tokens_per_j_above_idle"] == pytest.approx(5 / 3)
    b = s["budget"]
    assert b["pass"] and b["time_over_s"] == 0.0 and b["energy_over_j"] == 0.0
    assert s["kind"] == "measured" and not s["estimate"]


def test_over_budget_total_and_above_idle():
    s = summarize(constant_run(), Budget(8.0, ("in",)))["budget"]
    assert not s["pass"] and s["mean_w"] == pytest.approx(10.0)
    assert s["time_over_s"] == pytest.approx(2.0) and s["energy_over_j"] == pytest.approx(4.0)
    assert s["fraction_over"] == pytest.approx(1.0)
    s = summarize(constant_run(), Budget(5.0, ("in",), basis="above-idle"))["budget"]
    assert not s["pass"] and s["mean_w"] == pytest.approx(6.0) and s["limit_w"] == pytest.approx(9.0)
    assert s["time_over_s"] == pytest.approx(2.0) and s["energy_over_j"] == pytest.approx(2.0)
    assert summarize(constant_run(), Budget(6.0, ("in",), basis="above-idle"))["budget"]["pass"]


def test_per_rail_peak_and_total_of_budget_rails_only():
    """Rails pl and ddr are budgeted; the board input (which contains them) is reported but not summed."""
    samples = [Sample(0.0, {"input": 12.0, "pl": 1.0, "ddr": 0.5}),
               Sample(1.0, {"input": 14.0, "pl": 2.0, "ddr": 1.0}),
               Sample(1.5, {"input": 16.0, "pl": 4.0, "ddr": 1.0}),   # a 0.25 s spike
               Sample(1.75, {"input": 14.0, "pl": 2.0, "ddr": 1.0}),
               Sample(3.0, {"input": 12.0, "pl": 1.0, "ddr": 0.5})]
    trace = Trace.from_samples(samples, ("input", "pl", "ddr"), idle=(0.0, 1.0), tokens=[(1.0, 2.0), (2.0, 3.0)])
    s = summarize(trace, Budget(3.5, ("pl", "ddr")))
    assert s["rails"]["pl"]["mean_w"] == pytest.approx((2 * 0.5 + 4 * 0.25 + 2 * 1.25) / 2)
    assert s["rails"]["pl"]["peak_w"] == 4.0 and s["rails"]["input"]["in_budget"] is False
    assert s["rails"]["ddr"]["energy_above_idle_j"] == pytest.approx(1.0)
    assert s["total"]["rails"] == ["pl", "ddr"]
    assert s["total"]["mean_w"] == pytest.approx(s["rails"]["pl"]["mean_w"] + 1.0)
    assert s["total"]["peak_w"] == pytest.approx(5.0)
    assert s["budget"]["time_over_s"] == pytest.approx(0.25) and s["budget"]["energy_over_j"] == pytest.approx(0.375)


def test_nan_readings_are_skipped_and_coverage_reported():
    samples = [Sample(0.0, {"a": 2.0}), Sample(0.5, {"a": math.nan}), Sample(1.0, {"a": 6.0})]
    st = window_stats(np.array([s.t for s in samples]), np.array([s.watts["a"] for s in samples]), 0.0, 2.0)
    assert st.mean_w == pytest.approx(4.0) and st.coverage == 1.0       # 2 W held through the NaN
    late = window_stats(np.array([1.0]), np.array([3.0]), 0.0, 2.0)
    assert late.coverage == pytest.approx(0.5) and late.energy_j == pytest.approx(6.0)


def test_hold_durations():
    d = hold_durations(np.array([0.0, 1.0, 3.0]), 0.5, 4.0)
    assert d.tolist() == [0.5, 2.0, 1.0]
    assert hold_durations(np.array([]), 0, 1).size == 0


def test_bad_budgets_and_empty_traces():
    with pytest.raises(PowerError, match="positive number of watts"):
        Budget(0.0, ("a",))
    with pytest.raises(PowerError, match="basis"):
        Budget(13.0, ("a",), basis="peak")
    with pytest.raises(PowerError, match="not in the trace"):
        summarize(constant_run(), Budget(13.0, ("vccint",)))
    empty = Trace.from_samples([Sample(0.0, {"in": 4.0})], ("in",), idle=(0.0, 1.0))
    with pytest.raises(PowerError, match="no tokens"):
        summarize(empty, Budget(13.0, ("in",)))
    uncovered = Trace.from_samples([Sample(5.0, {"in": 4.0})], ("in",), idle=(0.0, 1.0), tokens=[(5.0, 6.0)])
    with pytest.raises(PowerError, match="no sample covers the idle window"):
        summarize(uncovered, Budget(13.0, ("in",)))


def test_phases():
    trace = constant_run()
    trace.prefill = (1.0, 1.0)
    assert trace.phase_of(0.5) == ("idle", None)
    assert trace.phase_of(1.25) == ("token", 2)
    assert trace.phase_of(-1) == ("before", None)
    assert trace.phase_of(3.5) == ("after", None)


# ---------------------------------------------------------------------------------------------- outputs
def test_samples_csv_and_json(tmp_path):
    trace = constant_run()
    s = summarize(trace, Budget(13.0, ("in",)))
    write_samples_csv(trace, tmp_path / "p.csv", ("in",))
    rows = list(csv.DictReader(open(tmp_path / "p.csv", encoding="utf-8")))
    assert [r["phase"] for r in rows] == ["idle", "token", "after"]
    assert rows[1]["token"] == "0" and float(rows[1]["in_w"]) == 10.0 and float(rows[1]["total_w"]) == 10.0
    assert rows[0]["kind"] == "measured"
    write_json({**s, "nan": math.nan}, tmp_path / "p.json")
    back = json.loads((tmp_path / "p.json").read_text())
    assert back["nan"] is None and back["total"]["energy_j"] == pytest.approx(20.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv", "p.json"]
    mask = os.umask(0o022)
    os.umask(mask)
    assert (tmp_path / "p.csv").stat().st_mode & 0o777 == 0o666 & ~mask


def test_interrupted_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "samples.csv"

    def half_then_ctrl_c(f):
        f.write(b"t_s,time\n0.0,")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half_then_ctrl_c)
    assert list(tmp_path.iterdir()) == []
    target.write_text("previous\n")
    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half_then_ctrl_c)
    assert target.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == ["samples.csv"]
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "missing" / "x.csv", lambda f: f.write(b"x"))


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    trace = constant_run()
    trace.sleeps = [(1.5, 1.6)]
    s = summarize(trace, Budget(8.0, ("in",)))
    out = plot_trace(trace, s, tmp_path / "p.png", title="synthetic: 10 W over 4 W idle")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
