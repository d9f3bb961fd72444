"""bench/report.py: docs/PERFORMANCE.md from the committed benchmark JSON, deterministic, and labelled rows
for inputs that do not exist yet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import report as bench_report
from hw.boards.facts import BOARDS as FACTS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    return bench_report


def _tree(tmp_path: Path, keep: set[str], boards: dict | None = None) -> Path:
    """A repository root holding only the result files in ``keep`` (keys of report.INPUTS) and board reports."""
    root = tmp_path / "repo"
    (root / "bench" / "results").mkdir(parents=True)
    for name in keep:
        src = REPO / "bench" / "results" / f"{name}.json"
        if src.exists():
            shutil.copy(src, root / "bench" / "results" / src.name)
    for board, rep in (boards or {}).items():
        (root / "bitstreams" / board).mkdir(parents=True)
        (root / "bitstreams" / board / "report.json").write_text(json.dumps(rep))
    return root


def test_committed_report_matches_json(report):
    """docs/PERFORMANCE.md is what the committed JSON gives (regenerate with `python -m bench.report`)."""
    data = report.load_inputs(REPO)
    figs = sorted(p.name for p in report.FIG_DIR.glob("*.png"))
    text = report.render(data, figs)
    assert report.DOC.read_text() == text, "docs/PERFORMANCE.md is stale: run `python -m bench.report`"
    for fig in figs:
        assert f"(perf/{fig})" in text


def test_render_is_deterministic_and_traceable(report):
    data = report.load_inputs(REPO)
    a, b = report.render(data), report.render(report.load_inputs(REPO))
    assert a == b
    gpu = data["gpu"]
    if gpu is None:
        pytest.skip("bench/results/gpu.json not committed")
    best = gpu["variants"]["compile_cuda_graph"]
    assert report.fmt(best["tokens_per_s"]) in a
    assert report.fmt(best["j_per_token_total"]) in a
    assert gpu["gpu"]["name"] in a
    for label in ("measured", "simulated", "model", "projected", "published"):
        assert f"**{label}**" in a


def test_plots_are_byte_identical(report, tmp_path):
    data = report.load_inputs(REPO)
    proj = report.project(data)
    names = report.plots(data, proj, tmp_path / "a")
    assert names
    report.plots(data, proj, tmp_path / "b")
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n


def test_missing_inputs_give_labelled_rows(report, tmp_path):
    root = _tree(tmp_path, {"perf"})
    data = report.load_inputs(root)
    assert data["gpu"] is None and data["rtl"] is None and data["perf"] is not None
    text = report.render(data)
    assert "**not yet measured** (`bench/results/rtl.json` absent" in text
    assert "**not yet measured** (`bench/results/gpu.json` absent" in text
    assert "**not yet measured** (`bench/results/cpu.json` absent" in text
    assert "**not yet built** (`bitstreams/kv260/report.json` absent)" in text
    assert "Projected decode rate" in text  # the model-only sections still render

    empty = report.render(report.load_inputs(_tree(tmp_path / "none", set())))
    assert "**not yet measured** (`bench/results/perf.json` absent" in empty


def test_measured_fmax_and_rtl_rows_are_used(report, tmp_path):
    boards = {"ulx3s-85f": {"board": "ulx3s-85f", "status": "built", "target_mhz": 60.0, "fmax_mhz": 71.5,
                            "timing_met": True, "lanes": 64, "channels": 1, "bus_bits": 64,
                            "utilisation": {"TRELLIS_COMB": {"used": 30000, "available": 83640}},
                            "git_revision": "0123456789abcdef", "command": "python -m hw.boards ulx3s-85f"},
              "pynq-z2": {"board": "pynq-z2", "bitstream_built": False, "target_clock_mhz": 100.0,
                          "core": {"lanes": 64, "channels": 2, "bus_bits": 64}, "git": "0123456789abcdef"}}
    root = _tree(tmp_path, {"perf"}, boards)
    rtl = {"benchmark": "rtl", "command": "python bench/bench_rtl.py", "git": {"describe": "abc"},
           "builds": {"64": {"build": {"lanes": 64, "channels": 1, "bus_bits": 64},
                             "cycles_per_token": {"hw": 251655.0, "model": 250823, "rel_diff": 0.0033},
                             "stream_efficiency": {"hw": 0.9664, "model": 0.9696}, "bit_exact_logits": True}}}
    (root / "bench" / "results" / "rtl.json").write_text(json.dumps(rtl))
    data = report.load_inputs(root)
    text = report.render(data)
    assert "251,655" in text and "96.6%" in text and "logits bit-exact" in text
    assert "71.5 MHz (target 60.0)" in text and "measured (nextpnr timing)" in text
    assert "not measured (vendor tool not run here)" in text
    proj = {(p["board"], p["schedule"]): p for p in report.project(data)}
    p = proj[("ulx3s-85f", "default")]
    # a board report of another build does not move the board off its design point, nor lend it its Fmax
    assert p["build"] == FACTS["ulx3s-85f"].design.triple and p["fmax_mhz"] == FACTS["ulx3s-85f"].fmax_mhz
    assert "holds another build (64x1x64)" in p["build_source"] and "after routing" not in p["fmax_status"]
    assert "= `bitstreams/pynq-z2/report.json` build" in proj[("pynq-z2", "default")]["build_source"]


def test_a_built_board_runs_at_its_design_clock(report, tmp_path):
    """A bitstream runs at the clock its PLL makes (the design point's), not at the Fmax routing achieved: the
    measured Fmax is shown beside the design clock, never used as the clock."""
    boards = {"ulx3s-85f": {"board": "ulx3s-85f", "status": "built", "target_mhz": 50.0, "fmax_mhz": 57.07,
                            "timing_met": True, "lanes": 16, "channels": 1, "bus_bits": 64,
                            "utilisation": {"TRELLIS_COMB": {"used": 30000, "available": 83640}},
                            "git_revision": "0123456789abcdef", "command": "python -m hw.boards ulx3s-85f"}}
    data = report.load_inputs(_tree(tmp_path, {"perf"}, boards))
    p = {(q["board"], q["schedule"]): q for q in report.project(data)}[("ulx3s-85f", "default")]
    assert "= `bitstreams/ulx3s-85f/report.json` build" in p["build_source"]
    assert p["fmax_mhz"] == 50.0 and p["fmax_status"] == "design clock; 57.1 MHz after routing"
    assert not p["fits_dram"]     # 70 MB of 370M image, 32 MB of SDRAM


def test_report_rows_are_the_board_table(report):
    """Every projected row is its board's entry of hw.boards.facts: order, title, build, clock, bandwidths, idle."""
    data = report.load_inputs(REPO)
    if data["perf"] is None:
        pytest.skip("bench/results/perf.json not committed")
    proj = report.project(data)
    assert [p["board"] for p in proj if p["schedule"] == "default"] == list(FACTS)
    for p in proj:
        f = FACTS[p["board"]]
        assert p["title"] == f.title and p["build"] == f.design.triple and p["fmax_mhz"] == f.design.fmax_mhz
        assert p["quant_lanes"] == f.design.quant_lanes and p["epilogue_folded"] == f.design.epilogue_folded
        img = p["tokens_per_s"] and report.design_prediction(report._shape(data["perf"], "370M"), f.design,
                                                              p["schedule"])["image_bytes"]
        assert p["roofline"]["dram"] == pytest.approx(f.dram_gbs * 1e9 / img)
        assert p["roofline"]["ports"] == pytest.approx(min(f.design.channels, f.ports) * f.port_gbs * 1e9 / img)
        assert p["idle_w"] == f.idle.total_w


def test_projection_respects_roofline(report):
    data = report.load_inputs(REPO)
    if data["perf"] is None:
        pytest.skip("bench/results/perf.json not committed")
    for p in report.project(data):
        cyc = p["fmax_mhz"] * 1e6 / p["cycles_per_token"]
        assert p["tokens_per_s"] == pytest.approx(min(cyc, p["roofline"]["dram"], p["roofline"]["ports"]))
        assert p["tokens_per_s"] <= p["roofline_bound"] * (1 + 1e-9)  # cycles >= ideal cycles
        assert p["power_w"] > p["idle_w"] > 0
        assert p["tokens_per_j"] == pytest.approx(p["tokens_per_s"] / p["power_w"])


def test_the_dram_boards_sit_side_by_side(report, tmp_path):
    """Both whole-board benchmarks in one table (clocks, efficiency against the 85 % goal, cycles in each clock,
    tokens/s) and a summary row each; a missing one is a labelled cell, not a blank."""
    data = report.load_inputs(_tree(tmp_path, {"board_ulx3s_dram", "board_ecpix5_ddr3"}))
    ddr3, sdr = data["board_ecpix5_ddr3"], data["board_ulx3s_dram"]
    assert ddr3 is not None and sdr is not None
    text = report.board_dram_section(data)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| ---")}
    c = ddr3["clock"]
    assert rows["clocks (simulated; the bitstream's PLL settings)"][1] == (
        f"{report.fmt(c['core_hz'] / 1e6)} MHz core, {report.fmt(c['controller_hz'] / 1e6)} MHz controller")
    assert rows["DRAM read efficiency during tokens (mean / min)"][1].startswith(
        report.pct(ddr3["dram_read_efficiency"]))
    assert rows["issue goal (85 %) met"] == ["yes" if b["dram_read_efficiency"] >= 0.85 else "**no**"
                                             for b in (sdr, ddr3)]
    assert rows["cycles per greedy token, controller clock"][1] == report.fmt(ddr3["cycles_per_token_dram"])
    assert rows["tokens/s end to end, greedy (simulated board + link model)"] == [
        report.fmt(b["tokens_per_s"]) for b in (sdr, ddr3)]
    summary = report.summary_section(data, [])
    assert "ECPIX-5 DDR3 board" in summary and "`bench/results/board_ecpix5_ddr3.json`" in summary

    one = report.load_inputs(_tree(tmp_path / "one", {"board_ulx3s_dram"}))
    assert "**not yet measured** (`bench/results/board_ecpix5_ddr3.json` absent" in report.board_dram_section(one)


def test_the_370m_token_row_says_bit_exact_and_its_variant(report):
    """The simulated 370M token: the board as built beside the one-entry FIFO variant, the ratio to the cycle
    model and the bit-exact verdict come from the JSON (a non-bit-exact run would be shown as such)."""
    data = json.loads((REPO / report.INPUTS["ddr3_token_370m"][0]).read_text())
    s = data["summary"]
    text = report.ddr3_token_section({"ddr3_token_370m": data})
    assert "the board as built" in text and "one-entry weight FIFO" in text
    assert report.fmt(s["cycles_per_token"]) in text and report.fmt(s["hw_over_model"]) in text
    row = report._ddr3_token_row({"ddr3_token_370m": data})
    assert row[1] == f"{report.fmt(s['tokens_per_s_simulated'])} tokens/s" and "bit-exact: yes" in row[2]
    s["bit_exact"] = False
    assert "bit-exact: **no**" in report._ddr3_token_row({"ddr3_token_370m": data})[2]
    assert "**no**" in report.ddr3_token_section({"ddr3_token_370m": data})
    assert report._ddr3_token_row({})[1] == report.missing("ddr3_token_370m")


def test_the_ddr3_projection_reproduces_the_simulated_token(report):
    """The 370M row of the DDR3 projection (cycle model and DRAM time at the measured efficiency) lands within
    2 % of the simulated token it was derived from, and the 1.3B shape, about 3.75x its image, is DRAM-bound at
    a proportionally lower rate."""
    data = report.load_inputs(REPO)
    rows = {p["model"]: p for p in report.ddr3_projection(data)}
    sim = data["ddr3_token_370m"]["summary"]["tokens_per_s_simulated"]
    assert rows["370M"]["tokens_per_s"] == pytest.approx(sim, rel=0.02)
    big = rows["1.3B"]
    assert big["bound"] == "DRAM" and big["image_bytes"] > 3 * rows["370M"]["image_bytes"]
    assert big["tokens_per_s"] == pytest.approx(
        rows["370M"]["tokens_per_s"] * rows["370M"]["image_bytes"] / big["image_bytes"], rel=0.05)
    assert "| 1.3B |" in report.ddr3_token_section(data) and "projected" in report.ddr3_token_section(data)
