# amaranth: UnusedElaboratable=no
"""hw.boards.ecp5.Ddr3Ecp5Top, the ECPIX-5's DDR3 board top, elaborated with the real generated DDR3 core
(hw.dram.generate_core(ECPIX5_CONFIG)) and the stand-in board of tests/test_ecp5_build.py (DRAMBoard's members at
the core's 128-bit port), into the build plan the toolchain would run (no tools run), and its netlist read back
through Yosys (``proc; flatten``, seconds): the oscillator on both PLLs, two clock domains and their resets, the
DDR3 pins, the crossings; the build's report with the toolchain stubbed; the ULX3S top still one clock domain; and
the top with the real DRAMBoard at 128 bits (elaborated only)."""

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hw.boards import ecp5
from tests.test_ecp5_build import StandInBoard

pytest.importorskip("litedram")

#: the ECPIX-5's DDR3 pads (amaranth-boards' ``ddr3`` resource, the sites of LiteX's ecpix5 platform): the
#: core's pin -> sites (the true side of clk and dqs)
DDR3_SITES = {"clk_p": ["H3"], "cke": ["P1"], "we_n": ["R3"], "ras_n": ["T3"], "cas_n": ["P2"],
              "a": "T5 M3 L3 V6 K2 W6 K3 L1 H2 L2 N1 J1 M1 K1 H1".split(), "ba": "U6 N3 N4".split(),
              "dqs_p": ["V4", "V1"], "dq": "T4 W4 R4 W5 R6 P6 P5 P4 R1 W3 T2 V3 U3 W1 T1 W2".split(),
              "dm": ["U4", "U1"], "odt": ["P3"]}
#: the complementary pads of the differential pairs: never in the design (the SSTL15D_I type makes them)
DDR3_N_SITES = ("J3", "U5", "U2")


def _yosys():
    env = ecp5._tool_env()
    tool = shutil.which(env["YOSYS"])
    if tool is None:
        pytest.skip("Yosys (the synth extra) is not installed")
    return tool


@pytest.fixture(scope="module")
def ddr3(tmp_path_factory):
    """The plan of the DDR3 top at 100 MHz (32 lanes, 2 Mbaud), the stand-in board, the generated core."""
    from amaranth_boards.ecpix5 import ECPIX585Platform

    from hw.dram import ECPIX5_CONFIG, generate_core

    core = generate_core(ECPIX5_CONFIG)
    boards = []
    top = ecp5.Ddr3Ecp5Top(core_params=ecp5.DEFAULT_BUILD.replace(quant_lanes=4), clk_in_hz=100e6, freq_hz=100e6,
                           baud=2_000_000, dram_core=core,
                           board=lambda **p: boards.append(StandInBoard(**p)) or boards[-1])
    d = tmp_path_factory.mktemp("ddr3_top")
    plan = ECPIX585Platform().build(top, name="top", build_dir=str(d), do_build=False)
    plan.extract(str(d))
    return {"plan": plan, "core": core, "board": boards[0], "top": top, "dir": d}


@pytest.fixture(scope="module")
def netlist(ddr3):
    """The top module of the design read back through Yosys (the core a black box, ``proc; flatten``)."""
    d = ddr3["dir"]
    subprocess.run([_yosys(), "-q", "-p", f"read_verilog -lib {ddr3['core'].name}.v; read_rtlil top.il; "
                    "hierarchy -top top; proc; flatten; opt_clean; write_json net.json"], cwd=d, check=True,
                   capture_output=True, timeout=600)
    return json.loads((d / "net.json").read_text())["modules"]["top"]


def _cells(net, kind):
    return {n: c for n, c in net["cells"].items() if c["type"] == kind}


def _one(net, kind):
    cells = _cells(net, kind)
    assert len(cells) == 1, (kind, sorted(cells))
    return next(iter(cells.values()))["connections"]


def test_the_board_gets_the_ddr3_port_and_holds_it(ddr3):
    core = ddr3["core"]
    assert (core.addr_width, core.data_width, core.bytes) == (25, 128, 512 << 20)
    assert ddr3["board"].params == {"build": ecp5.DEFAULT_BUILD.replace(quant_lanes=4), "addr_width": 25,
                                    "port_width": 128, "clock_hz": 100_000_000, "byte_timeout": None,
                                    "hold_port": True}
    top = ddr3["top"]
    assert top.divisor == 50 and top.freq_hz == 100e6          # 2 Mbaud from the core's 100 MHz, exactly
    assert top.dram_clocks == {"dram": 75e6, "sys2x": 150e6, "init": 25e6}


def test_the_plan_reads_the_core_and_locates_every_ddr3_pin(ddr3):
    files, core = ddr3["plan"].files, ddr3["core"]
    assert files[f"{core.name}.v"] == core.verilog[0].read_bytes()
    ys = files["top.ys"]
    assert ys.index(f"read_verilog  {core.name}.v") < ys.index("read_rtlil top.il")
    lpf = files["top.lpf"]
    for pin, sites in DDR3_SITES.items():
        for site in sites:
            assert f'SITE "{site}";' in lpf, (pin, site)
    for site in DDR3_N_SITES:
        assert f'SITE "{site}";' not in lpf, site
    assert 'IOBUF PORT "ddr3_0__clk__p" IO_TYPE=SSTL15D_I' in lpf
    for i in (0, 1):
        assert (f'IOBUF PORT "ddr3_0__dqs__p[{i}]" IO_TYPE=SSTL15D_I SLEWRATE=FAST TERMINATION=OFF '
                'DIFFRESISTOR=100;') in lpf
    assert 'IOBUF PORT "ddr3_0__dq__io[15]" IO_TYPE=SSTL15_I SLEWRATE=FAST TERMINATION=75;' in lpf
    assert 'FREQUENCY PORT "clk100_0__io" 100000000' in lpf
    # the FT2232H's serial lines and four green LEDs
    for site in ("R26", "R24", "R21", "W21", "K24", "R23"):
        assert f'SITE "{site}";' in lpf, site


def test_the_oscillator_feeds_both_plls_and_two_domains_run(netlist):
    """One pad buffer on the oscillator drives the DDR3 core's clk (its PLL) and the core clock's EHXPLLL; every
    flip-flop of the design is clocked by that EHXPLLL's CLKOP (sync) or by the DDR3 core's user_clk (dram), and
    both are present; the dram reset is the core's user_rst, the sync reset comes from the PLL's lock through
    an asynchronous-assert reset synchroniser."""
    ports = netlist["ports"]
    pad = netlist["cells"]["clk_in.buf.buf0"]["connections"]
    assert netlist["cells"]["clk_in.buf.buf0"]["type"] == "IB" and pad["I"] == ports["clk100_0__io"]["bits"]
    lite, pll = _one(netlist, "litedram_ecpix5"), _one(netlist, "EHXPLLL")
    assert lite["clk"] == pll["CLKI"] == pad["O"]
    assert lite["rst"] == ["0"]
    sync_clk, dram_clk = pll["CLKOP"], lite["user_clk"]
    assert sync_clk != dram_clk
    names = netlist["netnames"]
    assert names["clk"]["bits"] == sync_clk and names["dram_clk"]["bits"] == dram_clk
    assert names["dram_rst"]["bits"] == lite["user_rst"]
    clocks = Counter()
    for c in netlist["cells"].values():
        if c["type"] in ("$dff", "$adff", "$sdff", "$dffe", "$adffe", "$sdffe", "$memwr_v2"):
            clocks[tuple(c["connections"]["CLK"])] += 1
    assert set(clocks) == {tuple(sync_clk), tuple(dram_clk)}, clocks
    assert clocks[tuple(sync_clk)] > 20 and clocks[tuple(dram_clk)] > 10
    # sync reset: the ResetSynchronizer's flops, set asynchronously while the PLL is unlocked
    rsync = [c for n, c in netlist["cells"].items() if "reset_sync" in n and c["type"] == "$adff"]
    assert len(rsync) == 2 and all(c["connections"]["CLK"] == sync_clk for c in rsync)
    for c in rsync:           # reset while LOCK is low (the inverter folded into the flops' reset polarity)
        assert c["connections"]["ARST"] == pll["LOCK"] and int(c["parameters"]["ARST_POLARITY"], 2) == 0
    assert names["rst"]["bits"] in [c["connections"]["Q"] for c in rsync]


def test_the_core_pll_makes_the_core_clock(netlist):
    pll = next(iter(_cells(netlist, "EHXPLLL").values()))["parameters"]
    want = ecp5.pll_config(100e6, 100e6)
    assert int(pll["CLKI_DIV"], 2) == want["clki_div"] and int(pll["CLKFB_DIV"], 2) == want["clkfb_div"]
    assert int(pll["CLKOP_DIV"], 2) == want["clkop_div"]
    assert pll["FEEDBK_PATH"] == "CLKOP" and want["f_out"] == 100e6


def test_the_ddr3_pins_reach_the_core(netlist):
    """Every pin of the core's port list (DDR3_PINS) on its top-level port, the differential pairs by their true
    sides, the never-driven complements tied low, cs_n and reset_n (not wired on the ECPIX-5) open."""
    ports, lite = netlist["ports"], _one(netlist, "litedram_ecpix5")
    for pin, sub in ecp5.DDR3_PINS.items():
        field, side = sub if isinstance(sub, tuple) else (sub, "io")
        if pin in ("cs_n", "reset_n"):
            assert f"ddram_{pin}" not in lite and f"ddr3_0__{field}__{side}" not in ports
            continue
        assert lite[f"ddram_{pin}"] == ports[f"ddr3_0__{field}__{side}"]["bits"], pin
        assert len(lite[f"ddram_{pin}"]) == len(DDR3_SITES[pin]), pin
    assert lite["ddram_clk_n"] == ["0"] and lite["ddram_dqs_n"] == ["0", "0"]
    assert {k for k in ports if k.startswith("ddr3_")} == {f"ddr3_0__{f}__{s}" for f, s in (
        ("a", "io"), ("ba", "io"), ("ras", "io"), ("cas", "io"), ("we", "io"), ("dm", "io"), ("dq", "io"),
        ("dqs", "p"), ("clk", "p"), ("clk_en", "io"), ("odt", "io"))}
    assert ports["ddr3_0__dq__io"]["direction"] == "inout" and ports["ddr3_0__dqs__p"]["direction"] == "inout"


def test_the_crossings_are_in_place(netlist):
    """The port through NativePortCDC (three AsyncFIFOs), the control bus through WishboneCDC (four toggles), and
    the four status levels through 2-stage synchronisers into the domain that reads them."""
    names = netlist["netnames"]
    lite, pll = _one(netlist, "litedram_ecpix5"), _one(netlist, "EHXPLLL")
    sync_clk, dram_clk = pll["CLKOP"], lite["user_clk"]
    # the core's ports are driven and read in the dram domain only: its cmd_valid/wb_ctrl_cyc come from logic
    # clocked by user_clk (the crossings' dram sides), not from the board's sync logic
    for fifo in ("cmd_fifo", "wdata_fifo", "rdata_fifo"):
        assert any(n.startswith(f"crossings.port_cdc.{fifo}") for n in names), fifo
    for t in ("req", "cancel", "ack", "cancel_ack"):
        assert f"crossings.ctrl_cdc.{t}_sync" in names, t

    def ff_clock_of(prefix):
        clks = {tuple(c["connections"]["CLK"]) for n, c in netlist["cells"].items()
                if n.startswith(f"$flatten\\crossings.\\{prefix}.") and c["type"] == "$dff"}
        assert len(clks) == 1, (prefix, clks)
        return list(clks.pop())

    assert ff_clock_of("ready_sync") == ff_clock_of("error_sync") == ff_clock_of("dram_lock_sync") == sync_clk
    assert ff_clock_of("port_enable_sync") == dram_clk
    # the board's dram_ready is the synchronised init_done
    assert names["crossings.init_done"]["bits"] == lite["init_done"]


def test_the_top_refuses_what_it_cannot_build():
    from hw.dram import ULX3S_CONFIG, generate_sim_core

    with pytest.raises(ValueError, match="not DDR3"):
        ecp5.Ddr3Ecp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=100e6, freq_hz=100e6, baud=2_000_000,
                         dram_config=ULX3S_CONFIG)
    with pytest.raises(ValueError, match="input_clk_freq"):
        ecp5.Ddr3Ecp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=25e6, freq_hz=100e6, baud=2_000_000)
    with pytest.raises(ValueError, match="within 1 %"):
        ecp5.Ddr3Ecp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=100e6, freq_hz=100e6, baud=12_000_000)
    with pytest.raises(ValueError, match="one 64-bit weight channel"):
        ecp5.Ddr3Ecp5Top(core_params={**ecp5.DEFAULT_PARAMS, "channels": 2}, clk_in_hz=100e6, freq_hz=100e6,
                         baud=2_000_000)
    from hw.dram import ECPIX5_CONFIG

    sim = generate_sim_core(ECPIX5_CONFIG)
    with pytest.raises(ValueError, match="hardware core"):
        ecp5.Ddr3Ecp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=100e6, freq_hz=100e6, baud=2_000_000,
                         dram_core=sim)
    # 4 Mbaud: 25 cycles of 100 MHz, and 12 MHz / 3 on the FT2232H
    assert ecp5.Ddr3Ecp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=100e6, freq_hz=100e6,
                            baud=4_000_000).divisor == 25
    # 5 Mbaud: 20 cycles of 100 MHz, but the FT2232H's nearest is 12 MHz / 2.375 = 5.05 Mbaud
    with pytest.raises(ValueError, match="FT2232H makes no rate within 1 %"):
        ecp5.Ddr3Ecp5Top(core_params=ecp5.DEFAULT_PARAMS, clk_in_hz=100e6, freq_hz=100e6, baud=5_000_000)


@pytest.mark.parametrize("chip,baud,made", [("FT2232H", 12e6, 12e6), ("FT2232H", 8e6, 8e6), ("FT2232H", 4e6, 4e6),
                                            ("FT2232H", 5e6, 12e6 / 2.375), ("FT2232H", 115200, 12e6 / 104.125),
                                            ("FT231X", 3e6, 3e6), ("FT231X", 2e6, 2e6), ("FT231X", 1e6, 1e6)])
def test_ftdi_baud_generators(chip, baud, made):
    assert ecp5.ftdi_baud(chip, baud) == pytest.approx(made)


def test_the_generated_pll_is_read_from_the_core(ddr3):
    gen = ecp5._generated_pll(ddr3["core"], 100e6)
    assert gen["outputs"]["CLKOP"] == 150e6 and gen["outputs"]["CLKOS"] == 25e6      # sys2x, init
    assert 400e6 <= gen["f_vco"] <= 800e6


def test_the_build_report_records_both_plls_and_every_clock(tmp_path, monkeypatch):
    """build(dram=True) on the ECPIX-5 with the toolchain stubbed by a nextpnr report of the nets the DDR3 top has:
    report.json carries the core PLL, the DDR3 core's PLL, every clock's role and target, the LiteDRAM record with
    its CSR map, hold_port, the link version and the command; timing_met needs every clock."""
    from amaranth.build.plat import BuildPlan

    from hw.boards.link_protocol import LINK_VERSION

    fmax = {"$glbnet$clk": (104.2, 100.0), "$glbnet$dram_clk": (96.1, 75.0),
            "$glbnet$dram.litedram.sys2x_clk": (151.0, 150.0), "$glbnet$dram.litedram.init_clk": (300.0, 25.0)}

    def fake_tools(self, root, **kw):
        root = Path(root)
        self.extract(str(root))
        (root / "nextpnr_report.json").write_text(json.dumps({
            "fmax": {k: {"achieved": a, "constraint": c} for k, (a, c) in fmax.items()},
            "utilization": {"TRELLIS_COMB": {"used": 30000, "available": 83640}}}))
        (root / "top.tim").write_text("".join(
            f"Info: Max frequency for clock '{k}': {a:.2f} MHz ({'PASS' if a >= c else 'FAIL'} at {c:.2f} MHz)\n"
            for k, (a, c) in fmax.items()))
        (root / "top.bit").write_bytes(b"\0" * 16)

    monkeypatch.setattr(BuildPlan, "execute_local", fake_tools)
    monkeypatch.setattr(ecp5, "_dram_board", StandInBoard)
    monkeypatch.setattr(ecp5, "_tool_version", lambda cmd: "stub")
    bdir = tmp_path / "build"
    rc = ecp5.build("ecpix5-85f", tmp_path / "out", freq_mhz=100, baud=2_000_000, build_root=bdir,
                    write_bitstream_dir=False, dram=True, lanes=32, quant_lanes=4)
    rep = json.loads((bdir / "report.json").read_text())
    assert rc == 0 and rep["timing_met"] is True and rep["fmax_mhz"] == 104.2
    assert (rep["top"], rep["link_version"], rep["hold_port"]) == ("dram", LINK_VERSION, True)
    assert rep["pll"]["f_out"] == 100e6 and "clkos" not in rep["pll"]
    dp = rep["dram_pll"]
    assert dp["outputs"] == {"CLKOP": {"role": "sys2x", "mhz": 150.0}, "CLKOS": {"role": "init", "mhz": 25.0}}
    assert (dp["clki_div"], dp["clkfb_div"], dp["f_in_mhz"]) == (1, 6, 100.0)
    targets = {k: v["target_mhz"] for k, v in rep["clock_targets"].items()}
    assert targets == {"core": 100.0, "dram": 75.0, "sys2x": 150.0, "init": 25.0, "osc": 100.0}
    assert {c["role"] for c in rep["clocks"].values()} == {"core", "dram", "sys2x", "init"}
    assert rep["clocks"]["$glbnet$dram_clk"]["role"] == "dram" and rep["core_clock_net"] == "$glbnet$clk"
    lite = rep["litedram"]
    assert lite["config"] == "hw/boards/litedram/ecpix5.yml" and lite["settings"]["sdram_phy"] == "ECP5DDRPHY"
    assert lite["port_data_width"] == 128 and lite["dram_bytes"] == 512 << 20
    assert lite["csr_registers"]["ddrphy_rdly_dq_bitslip"]["addr"] == 0x810
    assert rep["command"].endswith(" --dram") and "--sdram-phase" not in rep["command"]
    # one clock short of its target fails the build
    fmax["$glbnet$dram.litedram.sys2x_clk"] = (140.0, 150.0)
    rc = ecp5.build("ecpix5-85f", tmp_path / "out", freq_mhz=100, baud=2_000_000, build_root=bdir,
                    write_bitstream_dir=False, dram=True, lanes=32, quant_lanes=4)
    rep = json.loads((bdir / "report.json").read_text())
    assert rc == 1 and rep["timing_met"] is False
    assert rep["lut_mapper"] == "abc9" and "--lut-mapper" not in rep["command"]
    assert "synth_ecp5  -top top" in (bdir / "top.ys").read_text()
    # Yosys's abc in place of abc9: synth_ecp5 up to map_luts, abc's LUT map, then synth_ecp5 from map_cells on
    fmax["$glbnet$dram.litedram.sys2x_clk"] = (151.0, 150.0)
    rc = ecp5.build("ecpix5-85f", tmp_path / "out", freq_mhz=100, baud=2_000_000, build_root=bdir,
                    write_bitstream_dir=False, dram=True, lanes=32, quant_lanes=4, lut_mapper="abc")
    rep = json.loads((bdir / "report.json").read_text())
    assert rc == 0 and rep["lut_mapper"] == "abc" and " --lut-mapper abc" in rep["command"]
    lines = [ln.strip() for ln in (bdir / "top.ys").read_text().splitlines()]
    steps = ["synth_ecp5 -run :map_luts -top top", "techmap -map +/lattice/latches_map.v", "abc -lut 4:7 -dress",
             "clean", "synth_ecp5 -top top -run map_cells:", "write_json top.json"]
    assert lines[lines.index(steps[0]):][:len(steps)] == steps
    with pytest.raises(ValueError, match="unknown LUT mapper 'abc10'; known: abc9, abc"):
        ecp5.build("ecpix5-85f", tmp_path / "out", freq_mhz=100, baud=2_000_000, build_root=bdir, dram=True,
                   lut_mapper="abc10")


def test_the_ulx3s_top_keeps_one_clock_domain(tmp_path):
    """The ULX3S's SDR top is not the DDR3 top: one EHXPLLL, every flip-flop on its CLKOP (the SDRAM clock pin's
    ODDRX1F on CLKOS), no crossing."""
    from amaranth_boards.ulx3s import ULX3S_85F_Platform

    from hw.dram import generate_core

    core = generate_core()
    top = ecp5.DramEcp5Top(core_params=ecp5.DEFAULT_BUILD.replace(lanes=16, quant_lanes=4), clk_in_hz=25e6,
                           freq_hz=50e6, baud=2_000_000, dram_core=core, board=StandInBoard)
    plan = ULX3S_85F_Platform().build(top, name="top", build_dir=str(tmp_path), do_build=False)
    plan.extract(str(tmp_path))
    subprocess.run([_yosys(), "-q", "-p", f"read_verilog -lib {core.name}.v; read_rtlil top.il; hierarchy -top top; "
                    "proc; flatten; opt_clean; write_json net.json"], cwd=tmp_path, check=True, capture_output=True,
                   timeout=600)
    net = json.loads((tmp_path / "net.json").read_text())["modules"]["top"]
    pll = _one(net, "EHXPLLL")
    clocks = {tuple(c["connections"]["CLK"]) for c in net["cells"].values()
              if c["type"] in ("$dff", "$adff", "$memwr_v2")}
    assert clocks == {tuple(pll["CLKOP"])}
    assert _one(net, "ODDRX1F")["SCLK"] == pll["CLKOS"]
    assert not any(n.startswith(("crossings", "port_cdc", "ctrl_cdc")) for n in net["netnames"])
    assert _one(net, f"{core.name}")["clk"] == pll["CLKOP"]


def test_the_ddr3_top_elaborates_with_dram_board_at_128_bits(tmp_path):
    """The default board component, hw.boards.dram_board.DRAMBoard, at the core's 128-bit port with its port held
    (about 15 s: the whole accelerator is elaborated)."""
    from amaranth_boards.ecpix5 import ECPIX585Platform

    from hw.boards.dram_board import DRAMBoard
    from hw.dram import ECPIX5_CONFIG, generate_core

    made = []

    def board(**params):
        made.append(DRAMBoard(**params))
        return made[-1]

    core = generate_core(ECPIX5_CONFIG)
    top = ecp5.Ddr3Ecp5Top(core_params=ecp5.DEFAULT_BUILD.replace(quant_lanes=4), clk_in_hz=100e6, freq_hz=100e6,
                           baud=2_000_000, dram_core=core, board=board)
    plan = ECPIX585Platform().build(top, name="top", build_dir=str(tmp_path), do_build=False)
    (b,) = made
    assert b.port.signature.members["wdata"].signature.members["payload"].shape.size == 128 + 16
    assert len(b.port.cmd.payload.addr) == 25
    il = plan.files["top.il"]
    assert f"cell \\{core.name}" in il and il.count("cell \\EHXPLLL") == 1
    assert b.hold_port is True
    for part in ("crossings.port_cdc", "crossings.ctrl_cdc", "crossings.port_enable_sync", "crossings.ready_sync",
                 "linked"):
        assert f"  cell \\top.{part} \\{part.split('.')[-1]}\n" in il, part


# ------------------------------------------------------------------------------- the board through the crossings

class CrossedBench:
    """DRAMBoard (128-bit port, ``hold_port``, the loopback core of tests/hw/test_dram_board.py) in ``core`` (10 ns,
    as the 100 MHz core clock), wired to :class:`hw.boards.ecp5.Ddr3Crossings` as the DDR3 top wires it, and on
    the crossings' far side, in ``sync`` (13.3 ns, as the 75 MHz controller clock), the native-port model and the
    Wishbone register file of the board's own tests, and an ``init_done`` that rises after ``ready_after``
    controller cycles."""

    def __init__(self, *, ready_after=60, seed=0):
        from amaranth.hdl import ClockDomain, DomainRenamer, Module
        from amaranth.lib.wiring import connect

        from tests.hw.test_dram_board import ADDR_WIDTH, WishboneModel, blank_mem, small_board
        from tests.hw.test_dram_reader import NativePortModel, addr_width_for

        self.board = small_board(128, hold_port=True)
        self.x = ecp5.Ddr3Crossings(addr_width_for(128, ADDR_WIDTH), 128, from_domain="core", to_domain="sync",
                                    depth=8)
        m = Module()
        m.domains.core = ClockDomain("core")
        m.domains.sync = ClockDomain("sync")
        m.submodules.board = DomainRenamer({"sync": "core"})(self.board)
        m.submodules.x = x = self.x
        b = self.board
        connect(m, b.port, x.port)
        connect(m, b.ctrl, x.ctrl)
        m.d.comb += [x.port_enable.eq(b.port_enable), b.dram_ready.eq(x.dram_ready), b.dram_error.eq(x.dram_error)]
        self.top = m
        self.mem = blank_mem()
        rng = np.random.default_rng(seed)
        self.model = NativePortModel(x.dram_port, self.mem, rng, cmd_stall=0.2)
        self.wb = WishboneModel(x.dram_ctrl, np.random.default_rng(seed + 1))
        self.ready_after = ready_after
        self.replies = []

    async def controller_status(self, ctx):
        ctx.set(self.x.pll_locked, 1)
        for _ in range(self.ready_after):
            await ctx.tick()
        ctx.set(self.x.init_done, 1)

    async def collect(self, ctx):
        from hw.boards import link_protocol as lp

        ctx.set(self.board.tx.ready, 1)
        buf = bytearray()
        while True:
            _, _, valid, byte = await ctx.tick("core").sample(self.board.tx.valid, self.board.tx.payload)
            if valid:
                buf.append(byte)
                if len(buf) == 1 + lp.REPLY_BYTES[buf[0]]:
                    self.replies.append((buf[0], bytes(buf[1:])))
                    buf.clear()

    async def command(self, ctx, data: bytes, rep: int, max_cycles=20_000) -> bytes:
        rx = self.board.rx
        for byte in data:
            ctx.set(rx.payload, byte)
            ctx.set(rx.valid, 1)
            await ctx.tick("core").until(rx.ready)
        ctx.set(rx.valid, 0)
        for _ in range(max_cycles):
            if self.replies:
                head, body = self.replies.pop(0)
                assert head == rep, (chr(head), chr(rep))
                return body
            await ctx.tick("core")
        raise AssertionError(f"no {chr(rep)!r} reply")

    def run(self, script):
        from amaranth.sim import Simulator

        sim = Simulator(self.top)
        sim.add_clock(10e-9, domain="core")
        sim.add_clock(13.3e-9, domain="sync", phase=4.1e-9)
        sim.add_testbench(self.model.process, background=True)
        sim.add_testbench(self.wb.process, background=True)
        sim.add_testbench(self.controller_status, background=True)
        sim.add_testbench(self.collect, background=True)

        async def main(ctx):
            await script(ctx, self)

        sim.add_testbench(main)
        sim.run()


def test_the_board_levels_loads_and_reads_through_the_crossings():
    """What the host does on the ECPIX-5, in simulation with the two clocks: the control bus is refused (BUSY)
    until the controller's init_done has crossed; reads and writes of the controller's registers ('K'/'J') reach
    the register file in the controller's domain and read back; the port stays held (refused, nothing reaches the
    controller) until the host enables it, which crosses to the controller's side; then a load ('L') and a CRC
    ('C') go through the port's crossing at 128 bits, and a register that never answers ends in TIMEOUT without
    stopping the link."""
    import struct
    import zlib

    from hw.boards import link_protocol as lp
    from tests.hw.test_dram_board import cmd_crc, cmd_ctrl_read, cmd_ctrl_write, cmd_get, cmd_load, cmd_put

    bench = CrossedBench()
    payload = bytes(range(7, 7 + 96))

    async def script(ctx, b):
        async def ctrl_read(addr):
            return struct.unpack("<BI", await b.command(ctx, cmd_ctrl_read(addr), lp.REP_CTRL_READ))

        async def ctrl_write(addr, value):
            return (await b.command(ctx, cmd_ctrl_write(addr, value), lp.REP_CTRL_WRITE))[0]

        async def get(reg):
            return struct.unpack("<I", await b.command(ctx, cmd_get(reg), lp.REP_BOARD_READ))[0]

        assert (await ctrl_read(0x818))[0] == lp.CtrlStatus.BUSY            # init_done not across yet
        assert not b.wb.transfers
        for _ in range(120):
            await ctx.tick("core")
        assert await get(lp.BoardReg.STATUS) == lp.BoardStatus.DRAM_READY | lp.BoardStatus.PORT_HELD
        b.wb.regs[0x818 >> 2] = 0x3
        assert await ctrl_read(0x818) == (0, 0x3)
        for addr, value in ((0x800, 1), (0x80C, 0xA5A5A5A5), (0x1000, 0x0E)):
            assert await ctrl_write(addr, value) == 0
            assert await ctrl_read(addr) == (0, value)
        assert b.wb.transfers[-2][:3] == (1, 0x1000 >> 2, 0x0E) and b.wb.transfers[-1][:2] == (0, 0x1000 >> 2)
        assert len(b.wb.transfers) == 7                                     # each once
        # held: refused on the board, nothing at the controller
        assert (await b.command(ctx, cmd_load(0x40, payload), lp.REP_DRAM_WRITE))[0] == lp.DramStatus.NOT_READY
        assert b.model.reads == 0 and b.model.writes_taken == 0 and ctx.get(b.x.dram_port_enable) == 0
        assert await b.command(ctx, cmd_put(lp.BoardReg.PORT_ENABLE, 1), lp.REP_BOARD_WRITE) == b""
        for _ in range(4):
            await ctx.tick()
        assert ctx.get(b.x.dram_port_enable) == 1                           # across in the controller's domain
        assert (await b.command(ctx, cmd_load(0x40, payload), lp.REP_DRAM_WRITE, max_cycles=40_000))[0] == 0
        # the board's 'l' means the writes are in the port's crossing; the CRC's reads come after them there
        crc, status = struct.unpack("<IB", await b.command(ctx, cmd_crc(0x40, len(payload)), lp.REP_DRAM_CRC,
                                                           max_cycles=40_000))
        assert (crc, status) == (zlib.crc32(payload), 0)
        assert b.mem.view(np.uint8)[0x40:0x40 + len(payload)].tobytes() == payload
        assert b.model.reads >= len(payload) // 16 and b.model.writes_taken == len(payload) // 16
        # a register that never answers: TIMEOUT, withdrawn at the controller too; the next access works
        b.wb.respond = False
        assert (await ctrl_read(0x818))[0] == lp.CtrlStatus.TIMEOUT
        for _ in range(20):
            await ctx.tick("core")
        assert b.wb.abandoned >= 1 and not ctx.get(b.x.dram_ctrl.cyc)
        b.wb.respond = True
        assert await ctrl_read(0x818) == (0, 0x3)

    bench.run(script)


#: the cells the synthesis below counts: logic, memory, the DDR3 core's IO logic and clocking
SYNTH_CELLS = ("LUT4", "TRELLIS_FF", "CCU2C", "DP16KD", "TRELLIS_DPR16X4", "MULT18X18D", "IDDRX2DQA", "ODDRX2DQA",
               "ODDRX2DQSB", "TSHX2DQA", "TSHX2DQSA", "ODDRX2F", "DELAYG", "DELAYF", "DQSBUFM", "EHXPLLL", "ECLKSYNCB",
               "CLKDIVF", "DDRDLLA", "TRELLIS_IO")


def synth_counts(stat: str) -> dict:
    """Cell counts from Yosys's ``stat`` text (either column order)."""
    counts = {}
    for cell in SYNTH_CELLS:
        found = re.search(rf"^\s*(\d+)\s+{cell}\s*$", stat, re.M) or re.search(rf"^\s*{cell}\s+(\d+)\s*$", stat,
                                                                                  re.M)
        counts[cell] = int(found.group(1)) if found else 0
    return counts


def test_the_whole_ddr3_top_synthesises(tmp_path):
    """Yosys synth_ecp5 of the whole DDR3 top with DRAMBoard (32 lanes, the shipped model's buffers) and the generated
    core, no place and route; prints the cell counts. Opt-in: ``MMFREE_DDR3_TOP_SYNTH=1``, under
    ``flock /tmp/heavy.lock`` (minutes)."""
    import os

    if os.environ.get("MMFREE_DDR3_TOP_SYNTH") != "1":
        pytest.skip("opt-in: MMFREE_DDR3_TOP_SYNTH=1 (a Yosys run of minutes)")
    from amaranth_boards.ecpix5 import ECPIX585Platform

    from hw.dram import ECPIX5_CONFIG, generate_core

    core = generate_core(ECPIX5_CONFIG)
    top = ecp5.Ddr3Ecp5Top(core_params=ecp5.DEFAULT_BUILD.replace(quant_lanes=4), clk_in_hz=100e6, freq_hz=100e6,
                           baud=2_000_000, dram_core=core)
    plan = ECPIX585Platform().build(top, name="top", build_dir=str(tmp_path), do_build=False)
    plan.extract(str(tmp_path))
    subprocess.run([_yosys(), "-q", "-l", "synth.log", "-p", f"read_verilog {core.name}.v; read_rtlil top.il; "
                    "synth_ecp5 -top top; tee -q -o stat.txt stat"], cwd=tmp_path, check=True, capture_output=True)
    counts = synth_counts((tmp_path / "stat.txt").read_text())
    print("SYNTH", " ".join(f"{k}={v}" for k, v in counts.items()))
    assert counts["EHXPLLL"] == 2 and counts["DQSBUFM"] == 2 and counts["DDRDLLA"] == 1 and counts["CLKDIVF"] == 1
    assert counts["LUT4"] > 10_000 and counts["DP16KD"] > 0


def test_the_simulations_model_the_ddr3_build():
    """The token harness's clocks and core are :data:`hw.boards.ecp5.DDR3_BUILD`'s (one home for the design
    point): 72 MHz and 75 MHz exactly from its periods, its lanes and quantize lanes, and a divisor of whole
    cycles a bit for its baud rate."""
    from sim import ddr3_token

    point = ecp5.DDR3_BUILD
    assert ddr3_token.CORE_HZ == point["freq_mhz"] * 1e6
    unit = ddr3_token.TIME_UNIT_HZ
    assert ddr3_token.CORE_HZ * ddr3_token.CORE_PERIOD == ddr3_token.DRAM_HZ * ddr3_token.DRAM_PERIOD == unit
    assert ddr3_token.CORE_PERIOD % 2 == ddr3_token.DRAM_PERIOD % 2 == 0
    build = ddr3_token.design_point()
    assert (build.lanes, build.quant_lanes) == (point["lanes"], point["quant_lanes"])
    assert build.fmax_mhz == point["freq_mhz"]
    assert ddr3_token.CORE_HZ % point["baud"] == 0
