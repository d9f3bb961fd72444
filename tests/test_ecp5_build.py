# amaranth: UnusedElaboratable=no
"""ECP5 board builds (hw.boards.ecp5, python -m hw.boards): PLL settings, parameter checks, the nextpnr
report parser, the dispatcher, the committed reports; the toolchain run itself is `make bitstream`
(minutes to hours), and the committed bitstreams are checked here for what they claim."""

import json
from pathlib import Path

import pytest
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hw.boards import __main__ as dispatcher
from hw.boards import ecp5
from hw.boards.facts import CAPACITY_370M
from hw.dram import NativePortSignature
from hw.dram_init import WishboneSignature

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


def test_pll_refusal_names_the_nearest_frequency():
    """73 MHz from 100 MHz needs a 1 MHz phase detector input; the refusal names what the PLL makes instead."""
    with pytest.raises(ValueError) as exc:
        ecp5.pll_config(100e6, 73e6)
    nearest = ecp5.pll_config(100e6, 950e6 / 13)["f_out"]      # 100 MHz / 13 x 19 / 2
    assert str(exc.value) == ("no EHXPLLL setting gives 73 MHz from 100 MHz within 0.1 %; "
                              f"the nearest is {nearest / 1e6:.6g} MHz")
    assert f"{nearest / 1e6:.6g}" == "73.0769"


def test_baud_refusal_names_the_rates_and_clocks_that_work():
    """72 MHz divides to 10.29 or 12 Mbaud, not 11: the refusal gives both, and the clocks (6 or 7 x 11 MHz)
    that make 11 Mbaud; each rate it names passes the same check. With a bridge, only rates it makes too."""
    core = {"lanes": 16, "quant_lanes": 4}
    with pytest.raises(ValueError) as exc:
        ecp5._link_clocking(core, 100e6, 72e6, 11_000_000)
    assert str(exc.value) == ("72 MHz cannot make 11000000 baud within 1 % (clock / divisor, divisor >= 4); "
                              "it makes 10285714 or 12000000 baud; 11000000 baud needs a clock of 66 or 77 MHz")
    for baud in (10_285_714, 12_000_000):
        ecp5._link_clocking(core, 100e6, 72e6, baud)
    with pytest.raises(ValueError) as exc:
        ecp5._link_clocking(core, 100e6, 72e6, 11_000_000, "FT2232H")
    assert "it makes 8000000 or 12000000 baud (rates the FT2232H makes too); " \
           "the FT2232H makes no rate within 1 % of 11000000 baud" in str(exc.value)
    for baud in (8_000_000, 12_000_000):
        ecp5._link_clocking(core, 100e6, 72e6, baud, "FT2232H")
    with pytest.raises(ValueError, match="it makes 18000000 baud; 20000000 baud needs a clock of 80 MHz"):
        ecp5._link_clocking(core, 100e6, 72e6, 20_000_000)     # above the clock / 4


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
    assert ecp5.build_tag(core, 50.0, 1, placer="static", lut_mapper="abc") == "l32_q4_f50_s1_static_abc"


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


def test_dispatcher_passes_the_chosen_seed(monkeypatch):
    """Without ``--seed`` a board builds with its chosen build's seed (the ULX3S's committed build used 2), else 1;
    ``--seed`` wins."""
    seen = []
    monkeypatch.setattr(ecp5, "build", lambda board, out, **kw: seen.append(kw["seed"]) or 0)
    for args in (["ulx3s-85f"], ["ulx3s-85f", "--seed", "5"], ["ecpix5-85f"]):
        assert dispatcher.main(args) == 0
    assert seen == [ecp5.CHOSEN["ulx3s-85f"]["seed"], 5, ecp5.CHOSEN["ecpix5-85f"].get("seed", 1)]
    rep = json.loads((ROOT / "bitstreams" / "ulx3s-85f" / "report.json").read_text())
    assert rep["seed"] == ecp5.CHOSEN["ulx3s-85f"]["seed"]      # make bitstream repeats the committed build


def test_dispatcher_passes_the_lut_mapper(monkeypatch, capsys):
    """``--lut-mapper`` reaches the build (abc9 without it); a Xilinx board refuses it, as every ECP5 option."""
    seen = []
    monkeypatch.setattr(ecp5, "build", lambda board, out, **kw: seen.append(kw["lut_mapper"]) or 0)
    assert dispatcher.main(["ecpix5-85f", "--dram", "--lut-mapper", "abc"]) == 0
    assert dispatcher.main(["ecpix5-85f"]) == 0
    assert seen == ["abc", ecp5.CHOSEN["ecpix5-85f"].get("lut_mapper", "abc9")]
    with pytest.raises(SystemExit):
        dispatcher.main(["ecpix5-85f", "--lut-mapper", "vpr"])
    with pytest.raises(SystemExit):
        dispatcher.main(["kv260", "--lut-mapper", "abc"])
    assert "--lut-mapper" in capsys.readouterr().err


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
    if rep.get("top") == "dram":
        _check_dram_report(rep)


def _check_dram_report(rep):
    """A committed DRAM build: this tree's ISA version and a link version this host serves (the tree's, or an
    older one :data:`~hw.boards.link_protocol.DRAM_LINK_VERSIONS` keeps), every clock met, the SDRAM clock's PLL
    output, and the LiteDRAM config it was built from (unchanged since: a changed config needs a new bitstream)."""
    import hashlib

    from hw.boards.link_protocol import DRAM_LINK_VERSIONS, LINK_VERSION
    from hw.isa import ISA_VERSION

    assert rep["isa_version"] == ISA_VERSION
    assert rep["link_version"] in DRAM_LINK_VERSIONS and LINK_VERSION in DRAM_LINK_VERSIONS
    clocks = rep["clocks"].values()
    assert all(c["timing_met"] and c["achieved_mhz"] >= c["target_mhz"] for c in clocks)
    lite = rep["litedram"]
    assert hashlib.sha256((ROOT / lite["config"]).read_bytes()).hexdigest() == lite["config_sha256"]
    if ecp5.dram_top_class(rep["board"]) is ecp5.Ddr3Ecp5Top:
        # the DDR3 top: the core's own clock, the controller's, its init clock and the oscillator's, each met
        # (sys2x is an edge clock nextpnr does not report); the port held until read leveling
        roles = {c["role"]: c for c in clocks}
        assert set(roles) == {"core", "dram", "init", "other"} and rep["hold_port"] is True
        assert roles["core"]["target_mhz"] == rep["target_mhz"] and roles["dram"]["target_mhz"] >= 75.0
        assert lite["dram_bytes"] == 512 << 20 and lite["port_data_width"] == 128
        assert rep["target_mhz"] * 1e6 == rep["baud"] * rep["uart_divisor"]
        return
    assert sorted(c["role"] for c in clocks) == ["core", "sdram"]
    clkos = rep["pll"]["clkos"]
    assert clkos["f_out"] == rep["pll"]["f_out"] == rep["target_mhz"] * 1e6
    assert clkos == {**ecp5.pll_phase_output(rep["pll"], clkos["f_out"], clkos["phase_deg"]), "drives": clkos["drives"]}
    assert lite["dram_bytes"] == 32 << 20 and set(lite["versions"]) == {"litedram", "litex", "migen"}
    assert rep["utilisation"]["IOLOGIC"]["used"] == 39          # every SDRAM pin registered in its IO cell


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
    good, bad = root / "build/boards/ecpix5-85f/l16_f50_s1", root / "build/boards/ecpix5-85f/l32_f50_s1"
    good.mkdir(parents=True)
    bad.mkdir(parents=True)
    (good / "report.json").write_text(json.dumps({"lanes": 16, "target_mhz": 50.0, "status": "built", "top": "dram",
                                                  "timing_met": True, "fmax_mhz": 52.0}))
    (bad / "report.json").write_text('{"lanes": 32, ')          # a build killed while writing
    monkeypatch.setattr(ecp5, "REPO_ROOT", root)
    res = ecp5.collect_sweep("ecpix5-85f", tmp_path / "out")
    assert res["chosen"] == "l16_f50_s1"
    assert [r["config"] for r in res["builds"]] == ["l16_f50_s1", "l32_f50_s1"]
    assert res["builds"][1]["status"].startswith("unreadable report.json")


def test_sweep_chooses_among_builds_of_the_boards_default_top(tmp_path, monkeypatch):
    """Both boards build their DRAM top by default (the ECPIX-5's DDR3 top since its bitstream closed): a faster
    stream build is listed but not chosen."""
    root = tmp_path / "repo"
    for tag, top, fmax in (("l16_f50_s1", "stream", 60.0), ("dram_l16_f50_s1", "dram", 52.0),
                           ("dram_l16_f50_s2", "dram", 51.0)):
        d = root / "build/boards/ulx3s-85f" / tag
        d.mkdir(parents=True)
        rep = {"lanes": 16, "target_mhz": 50.0, "status": "built", "timing_met": True, "fmax_mhz": fmax}
        (d / "report.json").write_text(json.dumps({**rep, "top": top} if top == "dram" else rep))
    monkeypatch.setattr(ecp5, "REPO_ROOT", root)
    assert ecp5.CHOSEN["ulx3s-85f"]["dram"] and ecp5.CHOSEN["ecpix5-85f"]["dram"]
    res = ecp5.collect_sweep("ulx3s-85f", tmp_path / "out")
    assert res["chosen"] == "dram_l16_f50_s1" and "dram top" in res["rule"]
    assert {r["config"]: r["top"] for r in res["builds"]}["l16_f50_s1"] == "stream"



# ------------------------------------------------------------------------------------- the DRAM board top

def test_sdram_clock_phase_is_set_in_eighths_of_a_vco_period():
    """25 MHz -> 50 MHz (VCO 800 MHz, dividers 1/2/16): the SDRAM clock's CLKOS at the chosen 90 degrees is
    CPHASE 15 + 4 (four VCO periods of 1.25 ns), FPHASE 0; 180 degrees is CPHASE 23; odd phases use FPHASE."""
    pll = ecp5.pll_config(25e6, 50e6)
    assert (pll["clki_div"], pll["clkfb_div"], pll["clkop_div"], pll["f_vco"]) == (1, 2, 16, 800e6)
    p90 = ecp5.pll_phase_output(pll, 50e6, ecp5.SDRAM_CLK_PHASE_DEG)
    assert ecp5.SDRAM_CLK_PHASE_DEG == 90
    assert p90 == {"div": 16, "cphase": 19, "fphase": 0, "f_out": 50e6, "phase_deg": 90.0, "delay_ns": 5.0}
    assert ecp5.pll_phase_output(pll, 50e6, 180)["cphase"] == 23
    assert ecp5.pll_phase_output(pll, 50e6, 0)["cphase"] == pll["clkop_div"] - 1      # CLKOP's own zero phase
    p10 = ecp5.pll_phase_output(pll, 50e6, 10)            # 10 deg = 3.56 eighths -> 4 eighths = 11.25 deg
    assert (p10["cphase"], p10["fphase"], p10["phase_deg"], p10["delay_ns"]) == (15, 4, 11.25, 0.625)
    p100 = ecp5.pll_phase_output(pll, 100e6, 90)          # another divider of the same VCO
    assert (p100["div"], p100["cphase"], p100["fphase"], p100["f_out"]) == (8, 9, 0, 100e6)


@pytest.mark.parametrize("f_in,f_out,f_s", [(25e6, 50e6, 50e6), (100e6, 75e6, 75e6), (25e6, 50e6, 25e6),
                                            (100e6, 100e6, 50e6)])
def test_sdram_clock_phase_stays_within_the_pll_limits(f_in, f_out, f_s):
    pll = ecp5.pll_config(f_in, f_out)
    for deg in range(0, 360, 7):
        p = ecp5.pll_phase_output(pll, f_s, deg)
        assert 1 <= p["div"] <= 128 and 0 <= p["cphase"] <= 127 and 0 <= p["fphase"] <= 7
        assert 3.125e6 <= p["f_out"] <= 400e6 and p["f_out"] == pytest.approx(f_s)
        eighths = (p["cphase"] - (p["div"] - 1)) * 8 + p["fphase"]
        assert p["phase_deg"] == pytest.approx(eighths * 45 / p["div"])
        step = 45 / p["div"]                                 # the resolution: an eighth of a VCO period
        assert abs(p["phase_deg"] - deg) <= step / 2 + 1e-9 or abs(p["phase_deg"] - deg + 360) <= step / 2 + 1e-9
        assert p["delay_ns"] == pytest.approx(p["phase_deg"] / 360 / f_s * 1e9, abs=1e-4)


def test_sdram_clock_phase_refuses_what_the_pll_cannot_make():
    pll = ecp5.pll_config(25e6, 50e6)
    for bad in (-1, 360, 400):
        with pytest.raises(ValueError, match="outside 0 <= phase < 360"):
            ecp5.pll_phase_output(pll, 50e6, bad)
    with pytest.raises(ValueError, match="output divider"):
        ecp5.pll_phase_output(pll, 33e6, 90)                 # 800 / 33 is no whole divider
    with pytest.raises(ValueError, match="output divider"):
        ecp5.pll_phase_output(pll, 800e6, 90)                # above the outputs' 400 MHz


def test_build_refuses_a_dram_top_without_a_litedram_config(tmp_path, monkeypatch):
    import dataclasses

    assert ecp5.BOARDS["ulx3s-85f"].dram_config.name == "ulx3s.yml"
    assert ecp5.BOARDS["ecpix5-85f"].dram_config.name == "ecpix5.yml"
    monkeypatch.setitem(ecp5.BOARDS, "ecpix5-85f", dataclasses.replace(ecp5.BOARDS["ecpix5-85f"], dram_config=None))
    with pytest.raises(ValueError, match="no LiteDRAM config"):
        ecp5.build("ecpix5-85f", tmp_path, freq_mhz=100, baud=2_000_000, dram=True)


def test_the_dram_top_follows_the_boards_memory(tmp_path):
    assert ecp5.dram_top_class("ulx3s-85f") is ecp5.DramEcp5Top          # SDR: one clock domain, as before
    assert ecp5.dram_top_class("ecpix5-85f") is ecp5.Ddr3Ecp5Top
    # the DDR3 core makes its own clocks: an SDRAM clock phase means nothing there
    with pytest.raises(ValueError, match="SDR board's DRAM top"):
        ecp5.build("ecpix5-85f", tmp_path, freq_mhz=100, baud=2_000_000, dram=True, sdram_phase_deg=180)


def test_dram_builds_have_their_own_folder():
    core = {**ecp5.DEFAULT_PARAMS, "lanes": 16, "quant_lanes": 4}
    assert ecp5.build_tag(core, 50.0, 1, placer="static", dram=True) == "dram_l16_q4_f50_s1_static"
    assert ecp5.build_tag(core, 50.0, 1, dram=True, sdram_phase_deg=180) == "dram_l16_q4_f50_p180_s1"
    assert ecp5.build_tag(core, 50.0, 1, sdram_phase_deg=180) == "l16_q4_f50_s1"       # a stream top has no phase


def test_clock_roles_tell_the_core_clock_from_the_sdram_clock():
    clocks = {"$glbnet$sdram_clk_clk": {"target_mhz": 50.0}, "$glbnet$clk": {"target_mhz": 50.0},
              "$glbnet$clk25_0__i": {"target_mhz": 25.0}}
    assert ecp5._clock_roles(clocks, 50.0) == {"$glbnet$sdram_clk_clk": "sdram", "$glbnet$clk": "core",
                                               "$glbnet$clk25_0__i": "other"}


def test_dispatcher_builds_the_dram_top_by_default_on_the_ulx3s(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(ecp5, "build", lambda board, out, **kw: seen.append((board, kw)) or 0)
    assert dispatcher.main(["ulx3s-85f"]) == 0
    assert seen[-1][1]["dram"] is True and "sdram_phase_deg" not in seen[-1][1]      # the top's default phase
    assert (seen[-1][1]["freq_mhz"], seen[-1][1]["baud"], seen[-1][1]["lanes"]) == (50.0, 2_000_000, 16)
    assert dispatcher.main(["ulx3s-85f", "--sdram-phase", "180"]) == 0
    assert seen[-1][1]["sdram_phase_deg"] == 180.0
    assert dispatcher.main(["ulx3s-85f", "--no-dram"]) == 0
    assert seen[-1][1]["dram"] is False
    with pytest.raises(SystemExit):
        dispatcher.main(["ulx3s-85f", "--no-dram", "--sdram-phase", "90"])
    assert "--sdram-phase applies to the DRAM top" in capsys.readouterr().err
    # any explicit phase on a DDR3 board, its default value included, is refused before a build starts
    with pytest.raises(SystemExit):
        dispatcher.main(["ecpix5-85f", "--dram", "--sdram-phase", "90"])
    assert "DDR3 core makes its own clocks" in capsys.readouterr().err


def test_dispatcher_reports_a_dram_request_on_a_board_without_dram(capsys, monkeypatch):
    import dataclasses

    monkeypatch.setitem(ecp5.BOARDS, "ecpix5-85f", dataclasses.replace(ecp5.BOARDS["ecpix5-85f"], dram_config=None))
    monkeypatch.setitem(ecp5.CHOSEN, "ecpix5-85f", {**ecp5.CHOSEN["ecpix5-85f"], "dram": False})
    assert dispatcher.main(["ecpix5-85f", "--dram"]) == 2
    assert "no LiteDRAM config" in capsys.readouterr().err


def test_dispatcher_builds_the_ddr3_top_by_default(monkeypatch):
    """The ECPIX-5 builds its DDR3 top by default, at the committed DDR3 build's design point
    (``hw.boards.ecp5.DDR3_BUILD``: the core's own clock, not the controller's 75 MHz; the static placer and
    router2); ``--no-dram`` builds the stream top."""
    seen = []
    monkeypatch.setattr(ecp5, "build", lambda board, out, **kw: seen.append((board, kw)) or 0)
    assert ecp5.CHOSEN["ecpix5-85f"]["dram"] is True and ecp5.CHOSEN["ulx3s-85f"]["dram"] is True
    assert dispatcher.main(["ecpix5-85f"]) == 0
    kw = seen[-1][1]
    assert kw["dram"] is True and "sdram_phase_deg" not in kw
    point = ecp5.DDR3_BUILD
    assert (kw["freq_mhz"], kw["lanes"], kw["quant_lanes"], kw["baud"]) == (
        point["freq_mhz"], point["lanes"], point["quant_lanes"], point["baud"])
    assert (kw["placer"], kw["router"]) == ("static", "router2")
    # the 370M shape's capacities with the state in DRAM (its two banks would not fit the block RAM)
    assert point["shape"] == "370m" and kw["state_in_dram"] is True
    assert {k: kw[k] for k in ("max_hidden", "max_intermediate", "max_layers")} == CAPACITY_370M
    rep = json.loads((ROOT / "bitstreams" / "ecpix5-85f" / "report.json").read_text())
    assert {k: rep["params"][k] for k in (*CAPACITY_370M, "state_in_dram")} == {**CAPACITY_370M, "state_in_dram": True}
    assert "--shape 370m" in rep["command"]
    assert (rep["target_mhz"], rep["lanes"], rep["params"]["quant_lanes"], rep["baud"], rep["placer"],
            rep["router"], rep["seed"]) == (kw["freq_mhz"], kw["lanes"], kw["quant_lanes"], kw["baud"], kw["placer"],
                                           kw["router"], kw["seed"])      # make bitstream repeats the committed build
    assert dispatcher.main(["ecpix5-85f", "--no-dram"]) == 0 and seen[-1][1]["dram"] is False


def test_clock_roles_of_the_ddr3_top():
    """Names as the generated core has them (sys2x_clk, init_clk, sys_clk); a net of another name by its target."""
    clocks = {"$glbnet$clk100_0__i": {"target_mhz": 100.0}, "$glbnet$dram.litedram.sys2x_clk": {"target_mhz": 150.0},
              "$glbnet$dram.litedram.init_clk": {"target_mhz": 25.0}, "$glbnet$dram_clk": {"target_mhz": 75.0},
              "$glbnet$clk": {"target_mhz": 100.0}}
    targets = {"dram": 75.0, "sys2x": 150.0, "init": 25.0}
    roles = ecp5._clock_roles(clocks, 100.0, targets)
    assert roles["$glbnet$dram.litedram.sys2x_clk"] == "sys2x" and roles["$glbnet$dram.litedram.init_clk"] == "init"
    assert roles["$glbnet$dram_clk"] == "dram"
    assert roles["$glbnet$clk"] == "core" and roles["$glbnet$clk100_0__i"] == "other"     # both at 100 MHz
    renamed = {"$glbnet$clk": {"target_mhz": 100.0}, "$glbnet$x": {"target_mhz": 75.0},
               "$glbnet$y": {"target_mhz": 150.0}, "$glbnet$z": {"target_mhz": 25.0}}
    assert ecp5._clock_roles(renamed, 100.0, targets) == {"$glbnet$clk": "core", "$glbnet$x": "dram",
                                                          "$glbnet$y": "sys2x", "$glbnet$z": "init"}
    # without DDR3 targets (the ULX3S) nothing changes: sdram, core, other
    assert ecp5._clock_roles(renamed, 100.0) == {"$glbnet$clk": "core", "$glbnet$x": "other", "$glbnet$y": "other",
                                                 "$glbnet$z": "other"}


class StandInBoard(wiring.Component):
    """A stand-in for ``hw.boards.dram_board.DRAMBoard`` with its members: every received byte is sent back,
    XORed with the low byte of the last word read from DRAM, after one native-port command (a write of the
    byte, twice, when its bit 0 is set, else a read) at a counting address; ``irq`` is ``dram_ready`` and
    ``dram_error``/``rx_overflow``/``framing`` feed a register the echo also XORs in (all ports used, so
    that synthesis keeps the controller)."""

    def __init__(self, *, build, addr_width, port_width, clock_hz, byte_timeout=None, hold_port=None):
        self.params = {"build": build, "addr_width": addr_width, "port_width": port_width, "clock_hz": clock_hz,
                       "byte_timeout": byte_timeout}
        if hold_port is not None:           # DRAMBoard's hold_port, as the DDR3 top passes it
            self.params["hold_port"] = hold_port
        super().__init__({"rx": In(stream.Signature(8)), "tx": Out(stream.Signature(8)),
                          "port": Out(NativePortSignature(addr_width=addr_width, data_width=port_width)),
                          "dram_ready": In(1), "dram_error": In(1), "rx_overflow": In(1), "framing": In(16),
                          "irq": Out(1), "ctrl": Out(WishboneSignature()), "port_enable": Out(1)})

    def elaborate(self, platform):
        m = Module()
        byte, addr, last, flags = Signal(8), Signal(self.params["addr_width"]), Signal(8), Signal(8)
        pending, full = Signal(), Signal()          # a command to issue; a byte to send
        cmd, tx = self.port.cmd, self.tx
        m.d.comb += [self.rx.ready.eq(~pending & ~full), cmd.valid.eq(pending), cmd.payload.we.eq(byte[0]),
                     cmd.payload.addr.eq(addr), self.port.wdata.payload.data.eq(Cat(byte, byte)),
                     self.port.wdata.payload.we.eq(0b11), tx.valid.eq(full), tx.payload.eq(byte ^ last ^ flags),
                     self.irq.eq(self.dram_ready), self.port_enable.eq(1)]   # ctrl idle (cyc low)
        m.d.sync += flags.eq(Cat(self.dram_error, self.rx_overflow, self.framing[:6]))
        with m.If(self.rx.valid & self.rx.ready):
            m.d.sync += [byte.eq(self.rx.payload), pending.eq(1)]
        with m.If(cmd.valid & cmd.ready):
            m.d.sync += [pending.eq(0), full.eq(1), addr.eq(addr + 1)]
        with m.If(tx.valid & tx.ready):
            m.d.sync += full.eq(0)
        with m.If(self.port.rdata.valid):
            m.d.sync += last.eq(self.port.rdata.payload[:8])
        return m


async def _serial_send(ctx, line, byte, divisor):
    for bit in [0, *((byte >> i) & 1 for i in range(8)), 1]:
        ctx.set(line, bit)
        for _ in range(divisor):
            await ctx.tick()


async def _serial_receive(ctx, line, divisor, limit=10_000):
    """The next byte on ``line`` (8N1), sampled at mid-bit."""
    for _ in range(limit):
        if not ctx.get(line):
            break
        await ctx.tick()
    else:
        raise AssertionError("no start bit")
    for _ in range(divisor // 2):
        await ctx.tick()
    bits = []
    for _ in range(9):
        for _ in range(divisor):
            await ctx.tick()
        bits.append(ctx.get(line))
    assert bits[8] == 1, "missing stop bit"
    return sum(b << i for i, b in enumerate(bits[:8]))


def test_linked_dram_board_passes_bytes_both_ways_and_flags_overflow():
    """The UART receiver, the receive FIFO, the board and the transmitter (LinkedDramBoard) in the Amaranth
    simulator: bytes sent on ``rx`` reach the board (one DRAM command each) and its bytes leave on ``tx``; a flood
    while the board is stalled overflows a small FIFO, which sets the sticky ``overflow`` and the board's
    ``rx_overflow``."""
    divisor = 4
    board = StandInBoard(build=ecp5.DEFAULT_BUILD, addr_width=24, port_width=16, clock_hz=50_000_000)
    dut = ecp5.LinkedDramBoard(board, divisor=divisor, fifo_depth=16)
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    got, sent = [], [0x00, 0x5A, 0xFF, 0x81]

    async def receiver(ctx):
        for _ in sent:
            got.append(await _serial_receive(ctx, dut.tx, divisor))

    async def host(ctx):
        ctx.set(dut.rx, 1)
        ctx.set(board.port.cmd.ready, 1)
        for _ in range(5):
            await ctx.tick()
        for b in sent:
            await _serial_send(ctx, dut.rx, b, divisor)
        for _ in range(40 * divisor):
            await ctx.tick()
        assert not ctx.get(dut.overflow) and not ctx.get(board.rx_overflow)
        ctx.set(board.port.cmd.ready, 0)          # the board stalls: the FIFO fills, then overflows
        for b in range(20):
            await _serial_send(ctx, dut.rx, b, divisor)
        await ctx.tick()
        assert ctx.get(dut.overflow) and ctx.get(board.rx_overflow)

    sim.add_testbench(host)
    sim.add_testbench(receiver, background=True)
    sim.run_until(2e-3)
    assert got == sent


def test_dram_top_checks_its_clock_against_the_litedram_config():
    pytest.importorskip("yaml")
    with pytest.raises(ValueError, match="sys_clk_freq"):
        ecp5.DramEcp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=25e6, freq_hz=60e6, baud=2_000_000)
    with pytest.raises(ValueError, match="one 64-bit weight channel"):
        ecp5.DramEcp5Top(core_params={**ecp5.DEFAULT_PARAMS, "channels": 2}, clk_in_hz=25e6, freq_hz=50e6,
                         baud=2_000_000)
    with pytest.raises(ValueError, match="outside 0 <= phase"):
        ecp5.DramEcp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=25e6, freq_hz=50e6, baud=2_000_000,
                         sdram_phase_deg=360)
    top = ecp5.DramEcp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=25e6, freq_hz=50e6, baud=2_000_000)
    assert top.divisor == 25 and top.sdram_clk["cphase"] == 19


def _dram_plan(tmp_path, **kw):
    """The ULX3S DRAM top with the stand-in board, elaborated into a build plan (no tools run)."""
    pytest.importorskip("litedram")
    from amaranth_boards.ulx3s import ULX3S_85F_Platform

    from hw.dram import generate_core

    core = generate_core()
    boards = []
    top = ecp5.DramEcp5Top(core_params=ecp5.DEFAULT_BUILD.replace(lanes=16, quant_lanes=4), clk_in_hz=25e6,
                           freq_hz=50e6, baud=2_000_000, dram_core=core,
                           board=lambda **p: boards.append(StandInBoard(**p)) or boards[-1], **kw)
    plan = ULX3S_85F_Platform().build(top, name="top", build_dir=str(tmp_path), do_build=False)
    return plan, core, boards[0]


def test_dram_top_elaborates_with_the_litedram_core_and_its_pins(tmp_path):
    plan, core, board = _dram_plan(tmp_path)
    assert board.params == {"build": ecp5.DEFAULT_BUILD.replace(lanes=16, quant_lanes=4), "addr_width": 24,
                            "port_width": 16, "clock_hz": 50_000_000, "byte_timeout": None}
    files = plan.files
    # the generated core's Verilog is in the build and Yosys reads it before the design
    assert files[f"{core.name}.v"] == core.verilog[0].read_bytes()
    ys = files["top.ys"]
    assert ys.index(f"read_verilog  {core.name}.v") < ys.index("read_rtlil top.il")
    il = files["top.il"]
    # the PLL: CLKOP 50 MHz (1/2/16), CLKOS the same at 90 degrees (CPHASE 19) into the SDRAM clock's ODDRX1F
    pll = il[il.index("cell \\EHXPLLL"):]
    pll = pll[:pll.index("\n  end")]
    for param, value in (("CLKI_DIV", 1), ("CLKFB_DIV", 2), ("CLKOP_DIV", 16), ("CLKOP_CPHASE", 15),
                         ("CLKOS_DIV", 16), ("CLKOS_CPHASE", 19), ("CLKOS_FPHASE", 0)):
        assert f"parameter \\{param} {value}\n" in pll, param
    assert 'parameter \\CLKOS_ENABLE "ENABLED"' in pll and "connect \\CLKOS " in pll
    assert "cell \\ODDRX1F" in il and f"cell \\{core.name}" in il
    lpf = files["top.lpf"]
    # every SDRAM pin of the resource is located: the clock at F19, the core's pins at theirs
    for pin in ("F19", "F20", "P20", "T20", "T19", "R20", "U19", "E20", "P19", "N20", "M20", "G19", "J16", "J17"):
        assert f'SITE "{pin}"' in lpf, pin
    assert "LOCATE COMP \"sdram_0__clk__io\" SITE \"F19\"" in lpf
    assert 'FREQUENCY PORT "clk25_0__io" 25000000' in lpf


def test_dram_top_passes_its_phase_to_the_pll(tmp_path):
    plan, _, _ = _dram_plan(tmp_path, sdram_phase_deg=180)
    assert "parameter \\CLKOS_CPHASE 23\n" in plan.files["top.il"]


@pytest.mark.slow
def test_dram_top_builds_with_the_litedram_core(tmp_path, monkeypatch):
    """The whole flow of ``build(dram=True)`` with the stand-in board (about a minute): Yosys reads the generated
    core, nextpnr places and routes it on the ULX3S's pins with every SDRAM IO register in its IO cell, both
    clocks meet 50 MHz, ecppack writes the bitstream, and the report records what the issue asks."""
    pytest.importorskip("litedram")
    env = ecp5._tool_env()
    import shutil

    if not all(shutil.which(env[k]) for k in ("YOSYS", "NEXTPNR_ECP5", "ECPPACK")):
        pytest.skip("the ECP5 tools (the synth extra) are not installed")
    monkeypatch.setattr(ecp5, "_dram_board", StandInBoard)
    bdir = tmp_path / "build"
    rc = ecp5.build("ulx3s-85f", tmp_path / "out", freq_mhz=50, baud=2_000_000, build_root=bdir,
                    write_bitstream_dir=False, dram=True, lanes=16, quant_lanes=4)
    rep = json.loads((bdir / "report.json").read_text())
    assert rc == 0 and rep["status"] == "built" and rep["timing_met"] is True, rep.get("clocks")
    assert (bdir / "top.bit").stat().st_size > 100_000
    from hw.boards.link_protocol import LINK_VERSION
    from hw.isa import ISA_VERSION

    assert (rep["top"], rep["isa_version"], rep["link_version"]) == ("dram", ISA_VERSION, LINK_VERSION)
    roles = {c["role"]: c for c in rep["clocks"].values()}
    assert set(roles) >= {"core", "sdram"} and all(c["timing_met"] for c in rep["clocks"].values())
    assert roles["core"]["target_mhz"] == roles["sdram"]["target_mhz"] == 50.0
    assert rep["fmax_mhz"] == roles["core"]["achieved_mhz"] >= 50.0
    # the control bus's register map travels with the bitstream (mmfree board level --csr report.json)
    from host.leveling import load_csr_map

    assert "sdram_dfii_control" in load_csr_map(bdir / "report.json")
    assert rep["pll"]["clkos"]["phase_deg"] == ecp5.SDRAM_CLK_PHASE_DEG and rep["pll"]["clkos"]["cphase"] == 19
    lite = rep["litedram"]
    assert lite["config"] == "hw/boards/litedram/ulx3s.yml" and lite["settings"]["sdram_phy"] == "GENSDRPHY"
    assert set(lite["versions"]) == {"litedram", "litex", "migen"} and lite["dram_bytes"] == 32 << 20
    # 13 a + 2 ba + ras/cas/we/cs + cke + 2 dm output registers, 16 dq (input, output, enable), the SDRAM clock
    assert rep["utilisation"]["IOLOGIC"]["used"] == 39
    assert rep["utilisation"]["EHXPLLL"]["used"] == 1
    assert "--dram --sdram-phase 90" in rep["command"]


def test_every_top_checks_the_bridges_baud_generator():
    """A baud the gateware divides exactly but the board's FTDI bridge cannot make (the FT231X: 3 MHz / n or
    its eighths; 2.5 Mbaud is 20 % from its nearest rate) is refused on every top, before any synthesis."""
    import gc
    import warnings

    from amaranth.hdl import UnusedElaboratable

    core = {"lanes": 16, "quant_lanes": 4}
    with pytest.raises(ValueError, match="FT231X makes no rate within 1 %"):
        ecp5._link_clocking(core, 25e6, 50e6, 2_500_000, "FT231X")
    assert ecp5._link_clocking(core, 25e6, 50e6, 2_000_000, "FT231X")[2] == 25
    with warnings.catch_warnings():     # the top refused in its constructor is never elaborated
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="FT231X makes no rate within 1 %"):
            ecp5.build("ulx3s-85f", None, freq_mhz=50, baud=2_500_000, dram=False, lanes=16, quant_lanes=4,
                       write_bitstream_dir=False)
        gc.collect()


def _no_build(monkeypatch):
    """Make every build entry of the dispatcher fail the test: a refusal must come before any of them."""
    def called(*a, **kw):
        raise AssertionError("a build started")
    for name in ("build", "sweep", "publish"):
        monkeypatch.setattr(ecp5, name, called)
    xil = dispatcher._xilinx()
    if xil is not None:
        monkeypatch.setattr(xil, "build", called)


@pytest.mark.parametrize(("flag", "value"), [("--baud", "0"), ("--baud", "-9600"), ("--quant-lanes", "0"),
                                             ("--quant-lanes", "-4")])
def test_dispatcher_refuses_non_positive_rates_and_lanes(monkeypatch, capsys, flag, value):
    """An explicit ``--baud 0`` or ``--quant-lanes 0`` is refused, not replaced by the chosen build's value."""
    _no_build(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        dispatcher.main(["ulx3s-85f", flag, value])
    assert exc.value.code == 2
    assert f"{flag} must be a positive integer, got {value}" in capsys.readouterr().err


def test_dispatcher_keeps_an_explicit_quant_lanes_and_baud(monkeypatch):
    seen = []
    monkeypatch.setattr(ecp5, "build", lambda board, out, **kw: seen.append(kw) or 0)
    assert dispatcher.main(["ulx3s-85f", "--quant-lanes", "2", "--baud", "1000000"]) == 0
    assert seen[-1]["quant_lanes"] == 2 and seen[-1]["baud"] == 1_000_000


XILINX_BOARDS = ("pynq-z2", "kv260", "zcu104", "u55c")


@pytest.mark.parametrize("args", [["--dram"], ["--no-dram"], ["--freq-mhz", "50"], ["--baud", "3000000"],
                                  ["--quant-lanes", "4"], ["--placer", "static"], ["--router", "router2"],
                                  ["--placer-density", "0.7"], ["--place-only"], ["--pipelined-epilogue"],
                                  ["--sdram-phase", "90"], ["--sweep"], ["--publish", "build/x"], ["--seed", "3"],
                                  ["--lanes", "16,32"]])
def test_dispatcher_refuses_ecp5_options_for_xilinx_boards(monkeypatch, capsys, args):
    """A Xilinx board's flow takes ``--out`` and one ``--lanes``; an ECP5 option is refused before any build."""
    if dispatcher._xilinx() is None:
        pytest.skip("hw/boards/xilinx.py is not in this tree")
    _no_build(monkeypatch)
    for board in XILINX_BOARDS:
        with pytest.raises(SystemExit) as exc:
            dispatcher.main([board, *args])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"{board} is a Xilinx board" in err and "(ECP5 options)" in err
        assert (args[0] if args[0] != "--lanes" else "several --lanes") in err


def test_dispatcher_passes_xilinx_boards_their_own_options(monkeypatch):
    xil = dispatcher._xilinx()
    if xil is None:
        pytest.skip("hw/boards/xilinx.py is not in this tree")
    seen = []
    monkeypatch.setattr(xil, "build", lambda board, out, **kw: seen.append((board, out, kw)) or 0)
    assert dispatcher.main(["kv260", "--lanes", "32", "--out", "x"]) == 0
    assert seen == [("kv260", Path("x"), {"lanes": 32})]
    with pytest.raises(SystemExit):     # a nextpnr seed is an ECP5 option, whatever its value
        dispatcher.main(["kv260", "--lanes", "32", "--seed", "1", "--out", "x"])


def test_shape_option_and_build_tag(monkeypatch):
    """``--shape`` sets the core's capacities and the state in DRAM (the DRAM top only); the build tag and the
    report's command say so, so that the command repeats the build."""
    seen = []
    monkeypatch.setattr(ecp5, "build", lambda board, out, **kw: seen.append(kw) or 0)
    assert dispatcher.main(["ecpix5-85f", "--shape", "shipped"]) == 0
    assert "state_in_dram" not in seen[-1] and "max_hidden" not in seen[-1]
    assert dispatcher.main(["ulx3s-85f", "--shape", "370m"]) == 0
    assert seen[-1]["state_in_dram"] is True and seen[-1]["max_layers"] == CAPACITY_370M["max_layers"]
    with pytest.raises(SystemExit):
        dispatcher.main(["ecpix5-85f", "--no-dram", "--shape", "370m"])
    core = {**ecp5.DEFAULT_PARAMS, **ecp5.SHAPES["370m"]}
    assert ecp5.shape_of(core) == "370m" and ecp5.shape_of(dict(ecp5.DEFAULT_PARAMS)) == "shipped"
    assert ecp5.build_tag(core, 68, 1, dram=True).endswith("_h1024_sd_f68_s1")
