"""bench/placement_seeds.py: the records of placement-only builds and their per-seed summary."""

import pytest

from bench.placement_seeds import run_record, summarise


def _report(seed, mhz, rev="abc", **kw):
    rep = {"board": "ecpix5-85f", "git_revision": rev, "seed": seed, "placer": "heap", "target_mhz": 100.0,
           "build_seconds": 500.0, "load_average": [1.0, 1.0, 1.0], "command": "python -m hw.boards ...",
           "status": "placed", "clocks": {"$glbnet$clk": {"role": "core", "placed_mhz": mhz, "achieved_mhz": mhz}}}
    rep.update(kw)
    return rep


def test_summary_medians_and_seed_ratios():
    before = [run_record(_report(s, f)) for s, f in ((1, 77.94), (2, 69.0), (3, 72.47))]
    after = [run_record(_report(s, f, rev="def")) for s, f in ((2, 70.98), (1, 69.41))]
    out = summarise({"before": before, "after": after})
    assert out["before"]["median_mhz"] == 72.47 and out["before"]["min_mhz"] == 69.0
    assert out["before"]["spread"] == round(77.94 / 69.0 - 1, 4)
    assert [r["seed"] for r in out["after"]["runs"]] == [1, 2]
    assert out["after"]["median_mhz"] == pytest.approx((69.41 + 70.98) / 2)
    assert out["after"]["median_ratio"] == round(out["after"]["median_mhz"] / 72.47, 4)
    assert out["after"]["seed_ratios"] == {"1": round(69.41 / 77.94, 4), "2": round(70.98 / 69.0, 4)}


def test_refuses_what_is_not_comparable():
    with pytest.raises(ValueError, match="not a placement-only build"):
        run_record(_report(1, 70.0, status="built"))
    with pytest.raises(ValueError, match="single core clock"):
        run_record(_report(1, 70.0, clocks={}))
    # an older report without roles: its only clock is the core's; two clocks without roles are ambiguous
    assert run_record(_report(1, 70.0, clocks={"clk": {"placed_mhz": 70.0}}))["placed_mhz"] == 70.0
    with pytest.raises(ValueError, match="single core clock"):
        run_record(_report(1, 70.0, clocks={"a": {"placed_mhz": 70.0}, "b": {"placed_mhz": 90.0}}))
    with pytest.raises(ValueError, match="seed repeated"):
        summarise({"a": [run_record(_report(1, 70.0)), run_record(_report(1, 71.0))]})
    with pytest.raises(ValueError, match="placer"):
        summarise({"a": [run_record(_report(1, 70.0))], "b": [run_record(_report(1, 70.0, placer="sa"))]})
