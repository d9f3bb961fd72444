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
