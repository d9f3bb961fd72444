# amaranth: UnusedElaboratable=no
"""ECP5 board builds (hw.boards.ecp5, python -m hw.boards): PLL settings, parameter checks, the nextpnr
report parser, the dispatcher, the committed reports; the toolchain run itself is `make bitstream`
(minutes to hours), and the committed bitstreams are checked here for what they claim."""

import json
from pathlib import Path

import pytest

from hw.boards import __main__ as dispatcher
from hw.boards import ecp5

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("f_in,f_out", [(25e6, 60e6), (100e6, 60e6), (25e6, 75e6), (100e6, 50e6)])
def test_pll_config_is_exact_and_within_limits(f_in, f_out):
    p = ecp5.pll_config(f_in, f_out)
    assert p["f_out"] == pytest.approx(f_out)
    assert f_in / p["clki_div"] * p["clkfb_div"] == pytest.approx(f_out)
    assert 3.125e6 <= f_in / p["clki_div"] <= 400e6
    assert 400e6 <= p["f_vco"] <= 800e6
    assert p["f_vco"] == pytest.approx(p["f_out"] * p["clkop_div"])


def test_pll_config_refuses_what_it_cannot_make():
    with pytest.raises(ValueError, match="no EHXPLLL setting"):
        ecp5.pll_config(25e6, 51e6)         # needs a 1 MHz phase detector input


def test_top_checks_the_link_parameters():
    with pytest.raises(ValueError, match="one 64-bit weight channel"):
        ecp5.Ecp5Top(core_params={**ecp5.DEFAULT_PARAMS, "channels": 2}, clk_in_hz=25e6, freq_hz=60e6, baud=3_000_000)
    with pytest.raises(ValueError, match="baud"):
        ecp5.Ecp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=25e6, freq_hz=60e6, baud=7_000_000)
    top = ecp5.Ecp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=25e6, freq_hz=60e6, baud=3_000_000)
    assert top.divisor == 20


def test_build_refuses_bad_requests(tmp_path):
    with pytest.raises(ValueError, match="unknown ECP5 board"):
        ecp5.build("icebreaker", tmp_path)
    with pytest.raises(ValueError, match="below the 50 MHz"):
        ecp5.build("ulx3s-85f", tmp_path, freq_mhz=40)
    with pytest.raises(ValueError, match="FT231X"):
        ecp5.build("ulx3s-85f", tmp_path, baud=6_000_000)
    with pytest.raises(ValueError, match="unknown nextpnr placer"):
        ecp5.build("ulx3s-85f", tmp_path, placer="sa")
    with pytest.raises(ValueError, match="heap placer only"):
        ecp5.build("ulx3s-85f", tmp_path, placer="static", density=0.7)


def test_nextpnr_report_parser(tmp_path):
    (tmp_path / "nextpnr_report.json").write_text(json.dumps({
        "fmax": {"$glbnet$clk": {"achieved": 63.21, "constraint": 60.0},
                 "$glbnet$clk25_0__i": {"achieved": 400.0, "constraint": 25.0}},
        "utilization": {"TRELLIS_COMB": {"used": 41000, "available": 83640},
                        "DP16KD": {"used": 100, "available": 208}, "EHXPLLL": {"used": 1, "available": 4},
                        "DCCA": {"used": 0, "available": 56}}}))
    (tmp_path / "top.tim").write_text("Info: Max frequency for clock '$glbnet$clk': 63.21 MHz (PASS at 60.00 MHz)\n")
    r = ecp5._parse_nextpnr(tmp_path, "top")
    assert r["clocks"]["$glbnet$clk"] == {"achieved_mhz": 63.21, "target_mhz": 60.0, "log_verdict": "PASS",
                                          "placed_mhz": 63.21}
    assert r["utilisation"]["DP16KD"] == {"used": 100, "available": 208, "percent": 48.1}
    assert "DCCA" not in r["utilisation"]


def test_nextpnr_log_gives_the_placement_estimate_and_the_routed_figure(tmp_path):
    (tmp_path / "nextpnr_report.json").write_text(json.dumps({"fmax": {}, "utilization": {}}))
    (tmp_path / "top.tim").write_text(
        "Info: Max frequency for clock '$glbnet$clk': 51.35 MHz (PASS at 50.00 MHz)\n"
        "Info: Routing..\n"
        "Info: Max frequency for clock '$glbnet$clk': 48.10 MHz (FAIL at 50.00 MHz)\n")
    clk = ecp5._parse_nextpnr(tmp_path, "top")["clocks"]["$glbnet$clk"]
    assert clk == {"achieved_mhz": 48.1, "target_mhz": 50.0, "log_verdict": "FAIL", "placed_mhz": 51.35}


def test_place_only_builds_have_their_own_folder():
    core = {**ecp5.DEFAULT_PARAMS, "lanes": 32, "quant_lanes": 4}
    assert ecp5.build_tag(core, 50.0, 1) == "l32_q4_f50_s1"
    assert ecp5.build_tag(core, 50.0, 1, place_only=True) == "l32_q4_f50_s1_placed"
    assert ecp5.build_tag(core, 50.0, 2, "router2", 0.6) == "l32_q4_f50_s2_router2_d0.6"
    assert ecp5.build_tag(core, 50.0, 1, placer="static") == "l32_q4_f50_s1_static"
    assert ecp5.build_tag({**core, "epilogue_folded": False}, 50.0, 1) == "l32_q4_pipelined_f50_s1"


def test_ecp5_builds_fold_the_epilogue():
    """The ECP5 builds use the folded epilogue, and their ID block says so."""
    from hw import isa

    assert ecp5.DEFAULT_PARAMS["epilogue_folded"] is True
    top = ecp5.Ecp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=25e6, freq_hz=50e6, baud=2_000_000)
    from hw.top import Accelerator

    core = Accelerator(top.build)
    assert top.build == ecp5.DEFAULT_BUILD
    assert core.epilogue_folded and core.id_values()[isa.REGISTER_MAP.ID_EPILOGUE] == 1


def test_dispatcher_passes_the_placer(monkeypatch):
    """``--placer`` reaches the build; without it, the board's chosen placer, or heap with a density."""
    seen = []
    monkeypatch.setattr(ecp5, "build", lambda board, out, **kw: seen.append((board, kw["placer"])) or 0)
    assert dispatcher.main(["ecpix5-85f", "--placer", "static"]) == 0
    assert dispatcher.main(["ulx3s-85f"]) == 0
    assert seen == [("ecpix5-85f", "static"), ("ulx3s-85f", ecp5.CHOSEN["ulx3s-85f"].get("placer", "heap"))]
    assert dispatcher.main(["ulx3s-85f", "--placer-density", "0.7"]) == 0     # a density selects heap
    assert seen[-1] == ("ulx3s-85f", "heap")
    with pytest.raises(SystemExit):
        dispatcher.main(["ecpix5-85f", "--placer", "sa"])


def test_dispatcher_rejects_unknown_boards(capsys):
    assert dispatcher.main(["no-such-board"]) == 2
    assert "ulx3s-85f" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--freq-mhz", "abc"), ("--lanes", "16,x")])
def test_dispatcher_rejects_bad_numbers(capsys, flag, value):
    with pytest.raises(SystemExit) as exc:
        dispatcher.main(["ecpix5-85f", flag, value])
    assert exc.value.code == 2 and "separated by commas" in capsys.readouterr().err


@pytest.mark.parametrize("board", sorted(ecp5.BOARDS))
def test_committed_bitstream_report(board):
    d = ROOT / "bitstreams" / board
    if not (d / "report.json").exists():
        pytest.skip(f"no committed build for {board}")
    rep = json.loads((d / "report.json").read_text())
    assert rep["board"] == board and rep["status"] == "built"
    assert rep["timing_met"] is True
    assert rep["fmax_mhz"] >= rep["target_mhz"] >= 50
    bit = d / rep["bitstream"]
    assert bit.stat().st_size == rep["bitstream_bytes"] > 100_000
    assert rep["lanes"] == rep["params"]["lanes"] and rep["channels"] == 1 and rep["bus_bits"] == 64
    assert rep["utilisation"]["TRELLIS_COMB"]["used"] <= rep["utilisation"]["TRELLIS_COMB"]["available"]


def test_publish_copies_only_closed_timing(tmp_path):
    bdir = tmp_path / "l32_f60_s1"
    bdir.mkdir()
    (bdir / "top.bit").write_bytes(b"\xff" * 1000)
    rep = {"board": "ulx3s-85f", "status": "built", "timing_met": False, "fmax_mhz": 55.0, "target_mhz": 60.0,
           "lanes": 32}
    (bdir / "report.json").write_text(json.dumps(rep))
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="timing not met"):
        ecp5.publish("ulx3s-85f", bdir, out)
    assert not (out / "ulx3s-85f.bit").exists()
    with pytest.raises(ValueError, match="not 'ecpix5-85f'"):
        ecp5.publish("ecpix5-85f", bdir, out)
    rep.update(status="placed", placed_fmax_mhz=61.5)      # a placement estimate is never published
    (bdir / "report.json").write_text(json.dumps(rep))
    with pytest.raises(ValueError, match="placement-only"):
        ecp5.publish("ulx3s-85f", bdir, out)
    rep.update(status="built", timing_met=True, fmax_mhz=61.5)
    (bdir / "report.json").write_text(json.dumps(rep))
    bit = ecp5.publish("ulx3s-85f", bdir, out)
    assert bit.read_bytes() == b"\xff" * 1000
    assert json.loads((out / "report.json").read_text())["bitstream_bytes"] == 1000


def test_sweep_lists_an_unreadable_report_instead_of_failing(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    good, bad = root / "build/boards/ulx3s-85f/l16_f50_s1", root / "build/boards/ulx3s-85f/l32_f50_s1"
    good.mkdir(parents=True)
    bad.mkdir(parents=True)
    (good / "report.json").write_text(json.dumps({"lanes": 16, "target_mhz": 50.0, "status": "built",
                                                  "timing_met": True, "fmax_mhz": 52.0}))
    (bad / "report.json").write_text('{"lanes": 32, ')          # a build killed while writing
    monkeypatch.setattr(ecp5, "REPO_ROOT", root)
    res = ecp5.collect_sweep("ulx3s-85f", tmp_path / "out")
    assert res["chosen"] == "l16_f50_s1"
    assert [r["config"] for r in res["builds"]] == ["l16_f50_s1", "l32_f50_s1"]
    assert res["builds"][1]["status"].startswith("unreadable report.json")
