"""host.leveling: the host-driven read leveling of the ECPIX-5's DDR3 PHY against a scripted register model.

The model (:class:`board_fakes.ScriptedECP5PHY`, shared with the fake ECP5 board's control bus in
tests/test_ecp5_dram.py) stands for a LiteDRAM ECP5DDRPHY core behind its CSRs: the DFI injector's software path
(control, per-phase command/address/bank/wrdata/rddata), a DRAM that stores what is written to an open row, and
per lane a read delay (3 bits, wraps like ECP5DDRPHY's ``rdly``) and a bitslip (4 positions, wraps), stepped only
for the lanes whose ``dly_sel`` bit is set, as the PHY does. A lane's read data are right only inside a scripted
set of (bitslip, delay) settings; elsewhere they come back corrupted. It refuses what the hardware would not do
sensibly (a command outside software control, a read or write on the wrong phase or to a closed row, a register
the generated core does not have), so the procedure is checked for how it drives the PHY as well as for the
setting it picks. Not run on hardware.
"""

from __future__ import annotations

import pytest
from board_fakes import ECPIX5_CSRS, CSRWordModel, ScriptedECP5PHY

from host import leveling
from host.leveling import ECPIX5_PARAMS, CSRBus, LevelingError, LevelingParams, read_leveling


def _window(bitslip, lo, hi):
    return {(bitslip, d) for d in range(lo, hi + 1)}


def test_finds_each_lanes_window_centre():
    phy = ScriptedECP5PHY({0: _window(1, 2, 6), 1: _window(2, 0, 3)})
    result = read_leveling(phy)
    assert [(r.bitslip, r.delay, r.window) for r in result.lanes] == [(1, 4, (2, 6)), (2, 1, (0, 3))]
    # the PHY is left there, and the DFI handed back to the controller
    assert phy.bitslip == [1, 2] and phy.rdly == [4, 1]
    assert phy.control == leveling.DFII_CONTROL_SEL
    assert phy.log[0] == ("control", leveling.DFII_CONTROL_SOFTWARE) and phy.log[-1] == ("control", 1)
    # every bitslip and tap was scanned, each with all seeds
    for lane in result.lanes:
        assert sorted(lane.scans) == [0, 1, 2, 3] and all(len(s) == 8 for s in lane.scans.values())
    assert [e == 0 for e in result.lanes[0].scans[1]] == [2 <= d <= 6 for d in range(8)]
    assert all(e > 0 for b in (0, 2, 3) for e in result.lanes[0].scans[b])
    text = result.format()
    assert "not run on hardware" in text
    assert "m0 b1: |xx.....x| window 2-6" in text and "m1: bitslip 2, delay 1 (window 0-3 of 8 taps)" in text


def test_picks_the_bitslip_with_the_longest_window():
    # lane 0: a 3-tap window at bitslip 0, a 5-tap one at bitslip 3; lane 1: equal windows, fewer errors wins
    phy = ScriptedECP5PHY({0: _window(0, 0, 2) | _window(3, 3, 7), 1: _window(1, 1, 4) | _window(2, 4, 7)})
    result = read_leveling(phy)
    assert (result.lanes[0].bitslip, result.lanes[0].delay) == (3, 5)
    assert result.lanes[1].bitslip == 1 and result.lanes[1].delay == 2   # tie on length: the lower bitslip
    assert phy.bitslip == [3, 1] and phy.rdly == [5, 2]


def test_longest_run_within_one_bitslip():
    # two windows at the same bitslip: taps 0-1 and 4-7; the longer one's centre (5), not the middle of both
    phy = ScriptedECP5PHY({0: _window(2, 0, 1) | _window(2, 4, 7), 1: _window(0, 3, 3)})
    result = read_leveling(phy)
    assert (result.lanes[0].bitslip, result.lanes[0].window, result.lanes[0].delay) == (2, (4, 7), 5)
    assert (result.lanes[1].bitslip, result.lanes[1].window, result.lanes[1].delay) == (0, (3, 3), 3)


def test_marginal_edge_taps_and_missing_bursts_do_not_count():
    # lane 0 reads right at taps 1-7 of bitslip 1, but taps 1 and 7 only every other read; lane 1's data are
    # right at taps 0-7 of bitslip 0 yet the burst detector fires only at taps 2-5
    phy = ScriptedECP5PHY({0: _window(1, 1, 7), 1: _window(0, 0, 7)},
                          flaky={0: {(1, 1), (1, 7)}}, burst={0: _window(1, 0, 7), 1: _window(0, 2, 5)})
    result = read_leveling(phy)
    assert (result.lanes[0].window, result.lanes[0].delay) == ((2, 6), 4)
    assert (result.lanes[1].bitslip, result.lanes[1].window, result.lanes[1].delay) == (0, (2, 5), 3)


def test_no_window_names_the_lane():
    phy = ScriptedECP5PHY({0: _window(1, 2, 5), 1: set()})
    with pytest.raises(LevelingError, match=r"module 1 has no working read delay at any of 4 bitslips") as e:
        read_leveling(phy)
    assert e.value.module == 1 and sorted(e.value.scans) == [0, 1, 2, 3]
    assert all(err > 0 for s in e.value.scans.values() for err in s)
    assert phy.control == leveling.DFII_CONTROL_SEL   # handed back to the controller even so


def test_a_failing_check_at_the_centre_is_an_error():
    # the window's centre tap is marginal: the scan saw it work (even read), its check reads wrong (odd read)
    phy = ScriptedECP5PHY({0: _window(0, 0, 7), 1: _window(0, 0, 7)}, flaky={1: {(0, 3)}})
    phy.reads = -1   # make the scan's reads of tap 3 land on even counts, the check's on an odd one
    with pytest.raises(LevelingError, match=r"module 1 at bitslip 0, delay 3 \(window 0-7\) read 64 bit errors on "
                                            r"its check") as e:
        read_leveling(phy, seeds=(42,))
    assert e.value.module == 1


def test_steps_select_one_lane_and_resynchronise():
    phy = ScriptedECP5PHY({0: _window(0, 0, 7), 1: _window(0, 0, 7)})
    read_leveling(phy)
    sels = [v for name, v in phy.log if name == "ddrphy_dly_sel"]
    steps = [(i, name) for i, (name, _) in enumerate(phy.log) if name.startswith("ddrphy_rdly")]
    assert steps
    for i, _ in steps:   # every step strobed with exactly one lane selected, then 0, all lanes, 0
        assert phy.log[i - 1][0] == "ddrphy_dly_sel" and phy.log[i - 1][1] in (1, 2)
        assert [v for _, v in phy.log[i + 1:i + 4]] == [0, 3, 0]
    assert set(sels) == {0, 1, 2, 3}


def test_required_csrs_are_the_cores():
    assert set(leveling.required_csrs()) <= set(ECPIX5_CSRS)
    assert {"sdram_dfii_pi1_wrdata", "ddrphy_burstdet_seen"} <= set(leveling.required_csrs())


def test_params_validation_and_from_phy_settings():
    class Phy:
        read_leveling, databits, dfi_databits, nphases, rdphase, wrphase, bitslips, delays = (
            True, 16, 64, 2, 0, 1, 4, 8)
    assert LevelingParams.from_phy_settings(Phy()) == ECPIX5_PARAMS
    Phy.read_leveling = False
    with pytest.raises(ValueError, match="no read leveling"):
        LevelingParams.from_phy_settings(Phy())
    with pytest.raises(ValueError, match="databits"):
        LevelingParams(modules=2, databits=8, dfi_databits=32, nphases=2, rdphase=0, wrphase=1, bitslips=4,
                       delays=8)
    with pytest.raises(ValueError, match="wrphase"):
        LevelingParams(modules=2, databits=16, dfi_databits=64, nphases=2, rdphase=0, wrphase=2, bitslips=4,
                       delays=8)
    with pytest.raises(TypeError):
        LevelingParams(modules=2.0, databits=16, dfi_databits=64, nphases=2, rdphase=0, wrphase=1, bitslips=4,
                       delays=8)
    with pytest.raises(TypeError):
        read_leveling(ScriptedECP5PHY({}), params="ecpix5")


def test_csr_bus_splits_wide_registers_most_significant_first():
    words = {}
    bus = CSRBus({k: {"addr": a, "size": s, "type": t} for k, (a, s, t) in ECPIX5_CSRS.items()},
                 read_word=lambda a: words.get(a, 0), write_word=words.__setitem__)
    bus.write("sdram_dfii_pi1_wrdata", 0x0123456789ABCDEF)
    assert words == {0x1034: 0x01234567, 0x1038: 0x89ABCDEF}
    words[0x103C], words[0x1040] = 0xDEADBEEF, 0x00C0FFEE   # pi1_rddata
    assert bus.read("sdram_dfii_pi1_rddata") == 0xDEADBEEF00C0FFEE
    bus.write("ddrphy_dly_sel", 2)
    assert words[0x800] == 2 and bus.read("ddrphy_dly_sel") == 2
    with pytest.raises(ValueError, match="read-only"):
        bus.write("ddrphy_burstdet_seen", 1)
    with pytest.raises(ValueError, match="does not fit"):
        bus.write("ddrphy_dly_sel", 1 << 32)
    with pytest.raises(KeyError):
        bus.read("ddrphy_wdly_dq_rst")   # ECP5DDRPHY has no write leveling


def test_leveling_through_the_csr_bus():
    """The procedure over CSRBus over word accesses reaches the same PHY state as over names directly."""
    phy = ScriptedECP5PHY({0: _window(3, 1, 4), 1: _window(1, 5, 7)})
    words = CSRWordModel(phy)
    bus = CSRBus({k: {"addr": a, "size": s, "type": t} for k, (a, s, t) in ECPIX5_CSRS.items()},
                 words.read_word, words.write_word)
    result = read_leveling(bus)
    assert [(r.bitslip, r.delay) for r in result.lanes] == [(3, 2), (1, 6)]
    assert phy.bitslip == [3, 1] and phy.rdly == [2, 6]
    assert not words.pending                    # every wide write completed with its last word


def test_dfii_constants_are_litedrams():
    pytest.importorskip("litedram")
    from litedram.init import get_sdram_phy_py_header
    from litedram.phy.ecp5ddrphy import ECP5DDRPHY  # noqa: F401 - the PHY these constants serve

    class Phy:
        memtype, nphases, cl, cwl, is_rdimm, is_clam_shell = "DDR3", 2, 6, 5, False, False

    class Timing:
        tWTR = 2

    ns = {}
    exec(get_sdram_phy_py_header(Phy(), Timing()), ns)
    for name in ("control_sel", "control_cke", "control_odt", "control_reset_n", "command_cs", "command_we",
                 "command_cas", "command_ras", "command_wrdata", "command_rddata"):
        assert getattr(leveling, f"DFII_{name.upper()}") == ns[f"dfii_{name}"], name


def test_scripted_model_has_the_generated_cores_registers(tmp_path):
    """The model's register map (ECPIX5_CSRS) and ECPIX5_PARAMS are the generated ECPIX-5 core's."""
    pytest.importorskip("litedram")
    import json

    from hw import dram

    core = dram.generate_core(dram.ECPIX5_CONFIG, build_root=tmp_path)
    regs = json.loads((core.directory / "csr.json").read_text())["csr_registers"]
    assert {k: (v["addr"], v["size"], v["type"]) for k, v in regs.items()} == ECPIX5_CSRS
    assert LevelingParams.from_phy_settings(dram.hardware_settings(dram.ECPIX5_CONFIG)["phy"]) == ECPIX5_PARAMS
    assert set(leveling.required_csrs(ECPIX5_PARAMS)) <= set(CSRBus(core.directory / "csr.json", None, None).names)


def test_load_csr_map_takes_a_csr_json_or_a_report(tmp_path):
    import json

    regs = {k: {"addr": a, "size": s, "type": t} for k, (a, s, t) in ECPIX5_CSRS.items()}
    (tmp_path / "csr.json").write_text(json.dumps({"csr_bases": {}, "csr_registers": regs, "constants": {}}))
    assert leveling.load_csr_map(tmp_path / "csr.json") == regs
    (tmp_path / "report.json").write_text(json.dumps({"board": "ecpix5-85f", "litedram": {"csr_registers": regs}}))
    assert leveling.load_csr_map(str(tmp_path / "report.json")) == regs
    with pytest.raises(FileNotFoundError, match="no such file"):
        leveling.load_csr_map(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        leveling.load_csr_map(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text(json.dumps({"board": "ulx3s-85f", "litedram": {"core": "litedram_ulx3s"}}))
    with pytest.raises(ValueError, match="no register map"):
        leveling.load_csr_map(tmp_path / "old.json")
    (tmp_path / "odd.json").write_text(json.dumps({"csr_registers": {"ddrphy_dly_sel": {"addr": "0x800", "size": 1}}}))
    with pytest.raises(ValueError, match="'ddrphy_dly_sel' needs integer 'addr'"):
        leveling.load_csr_map(tmp_path / "odd.json")
