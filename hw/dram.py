"""LiteDRAM controller cores for the ECP5 boards' DRAM, generated at build time, and their Amaranth wrapper.

The controller is LiteDRAM's (``litedram==2024.12``, the ``dram`` extra), never our own. A board's core is
described by a YAML config kept in the repository (``hw/boards/litedram/ulx3s.yml``: GENSDRPHY, one
MT48LC16M16 x16 SDRAM, 50 MHz, no CPU, one native user port; ``hw/boards/litedram/ecpix5.yml``: ECP5DDRPHY at
rate 1:2, one MT41K256M16 x16 DDR3 chip, 75 MHz, no CPU, one native port, docs/DDR3.md) and made in two forms,
each cached in a build folder keyed by (config bytes, litedram/litex/migen versions):

* :func:`generate_core`: the hardware core, by LiteDRAM's own standalone generator (``litedram_gen``,
  ``litedram/gen.py``): ``gateware/<name>.v`` with the PHY's IO registers and tristates inside, ``csr.json``.
* :func:`generate_sim_core`: the simulation core, the same controller (``litedram.core.LiteDRAMCore``: DFI
  injector, controller, crossbar), the same CRG, CSR map and user-port wiring, built from the hardware core's
  PHY settings and module timings (:func:`hardware_settings`) but with LiteDRAM's DFI-level memory model
  (``litedram.phy.model.SDRAMPHYModel``) in place of the PHY and its DFI timing checker on (it ``$display``\\ s
  every tRP/tRCD/tRAS/tRFC/tCCD/tRC/tWR/tWTR/tRRD/tREFI violation). ``litedram_gen --sim`` is not used: it
  takes ``litex_sim``'s generic PHY settings (for SDR a read latency of 4 where GENSDRPHY has ``cl + 1`` = 3;
  for DDR3 a rate of 1:4 where ECP5DDRPHY has 1:2) and leaves the checker off. For a PHY with CSRs of its own
  (ECP5DDRPHY's read-leveling registers) the simulation core carries registers of the same names and sizes, so
  that its CSR map, and with it the power-up writes, equal the hardware core's, and flags read data on every DFI
  phase as that PHY does (the model flags phase 0 only), so that the host's read leveling runs against it.

:class:`LiteDRAMCore` wraps either as an Amaranth ``Instance`` in the controller clock's domain (``sync``, or
for the DDR3 hardware core the clock it makes itself, ``dram_clk``) and runs the DRAM's power-up sequence
itself (:class:`hw.dram_init.DFIIInitSequencer`, the sequence of ``litedram.init.get_sdram_phy_init_sequence``
over the core's Wishbone control bus, as LiteX's BIOS ``sdram_init`` does), so that ``init_done`` rises
without a soft CPU.

The generator functions import LiteDRAM lazily: this module imports (and :class:`NativePortSignature`
works) without the ``dram`` extra; :func:`litedram_available` says whether it is installed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from amaranth.hdl import ClockDomain, ClockSignal, Const, DomainRenamer, Instance, IOValue, Module, ResetSignal, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ULX3S_CONFIG", "ECPIX5_CONFIG", "DEFAULT_BUILD_ROOT", "LITEDRAM_PACKAGES", "litedram_available",
           "MT41K256M16_TRFC_NS", "local_modules", "register_modules", "load_config", "core_key",
           "GeneratedCore", "generate_core", "generate_sim_core", "hardware_settings",
           "sim_settings", "init_writes", "port_geometry", "sim_monitor_layout", "NativePortSignature",
           "native_cmd_layout", "native_wdata_layout", "DDR3_OPTIONAL_PINS", "LiteDRAMCore"]

CONFIG_DIR = Path(__file__).resolve().parent / "boards" / "litedram"
#: the ULX3S 85F's SDRAM core config (GENSDRPHY, MT48LC16M16, 50 MHz, one native port)
ULX3S_CONFIG = CONFIG_DIR / "ulx3s.yml"
#: the ECPIX-5 85F's DDR3 core config (ECP5DDRPHY at rate 1:2, MT41K256M16, 75 MHz, one native port; docs/DDR3.md)
ECPIX5_CONFIG = CONFIG_DIR / "ecpix5.yml"
#: where generated cores are cached (``build/`` is git-ignored); ``MMFREE_LITEDRAM_BUILD`` overrides it
DEFAULT_BUILD_ROOT = Path(os.environ.get("MMFREE_LITEDRAM_BUILD",
                                         Path(__file__).resolve().parents[1] / "build" / "litedram"))
#: the packages whose versions key the cache (and that the ``dram`` extra pins)
LITEDRAM_PACKAGES = ("litedram", "litex", "migen")
#: the port name of the config's user port (``user_port_<name>_*`` in the generated Verilog)
USER_PORT = "0"
#: the generated module's SDRAM pins for an SDR config (``litedram/gen.py`` ``get_dram_ios``):
#: name -> direction as the generated Verilog declares it (``dq`` is ``input``: its tristates are inside)
SDR_PINS = {"a": "o", "ba": "o", "ras_n": "o", "cas_n": "o", "we_n": "o", "cs_n": "o", "dm": "o", "dq": "io",
            "cke": "o"}
#: the generated module's DRAM pins for a DDR3 config (``ddram_<name>`` in the Verilog): ``o`` an output, ``io``
#: a pad whose tristate buffer is inside the core (declared ``input``), ``nc`` a port the ECP5DDRPHY never drives
#: (declared ``input``; the differential IO type of the ``_p`` pad makes the ``_n`` side)
DDR3_PINS = {"a": "o", "ba": "o", "ras_n": "o", "cas_n": "o", "we_n": "o", "cs_n": "o", "dm": "o", "dq": "io",
             "dqs_p": "io", "dqs_n": "nc", "clk_p": "o", "clk_n": "nc", "cke": "o", "odt": "o", "reset_n": "o"}
#: the PHYs a config may name: ``sdram_phy`` -> (frequency ratio of the DRAM module, attribute of the hardware
#: core that holds the PHY, its Verilog pin prefix, its pins)
PHYS = {"GENSDRPHY": ("1:1", "sdrphy", "sdram", SDR_PINS), "ECP5DDRPHY": ("1:2", "ddrphy", "ddram", DDR3_PINS)}

#: DDR3 tZQinit = tDLLK = 512 DRAM clocks (JESD79-3): the least wait after ZQCL before the first command
DDR3_TZQINIT_NCK = 512
#: DRAM commands the simulation core counts on its DFI (``sim_monitor_<name>_count`` outputs)
SIM_COMMANDS = ("ref", "act", "pre", "rd", "wr")


def litedram_available() -> bool:
    """True when the ``dram`` extra (LiteDRAM, LiteX, Migen) is importable."""
    return all(importlib.util.find_spec(p) is not None for p in LITEDRAM_PACKAGES)


def _require_litedram() -> None:
    if not litedram_available():
        raise ImportError("LiteDRAM is not installed: pip install -e '.[dram]' (litedram, litex, migen)")


def load_config(path: str | os.PathLike = ULX3S_CONFIG) -> dict:
    """The raw config of a LiteDRAM core (``litedram_gen``'s YAML format; ``litedram/gen.py`` ``main``).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the config is not a mapping, lacks one of ``memtype``, ``sdram_module``, ``sdram_module_nb``,
        ``sdram_phy``, ``sys_clk_freq``, ``user_ports``, or its user ports are not exactly one ``native`` port
        named ``"0"`` (what :class:`LiteDRAMCore` wraps).
    """
    import yaml  # a dependency of litedram (and of the dram extra)

    text = Path(path).read_text()
    cfg = yaml.safe_load(text)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a LiteDRAM config must be a mapping, got {type(cfg).__name__}")
    missing = [k for k in ("memtype", "sdram_module", "sdram_module_nb", "sdram_phy", "sys_clk_freq",
                           "user_ports") if k not in cfg]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    ports = cfg["user_ports"]
    if list(ports) != [USER_PORT] or ports[USER_PORT].get("type") != "native":
        raise ValueError(f"{path}: user_ports must be one native port named {USER_PORT!r}, got {ports!r}")
    return cfg


def _converted(cfg: Mapping) -> dict:
    """``cfg`` with ``litedram_gen``'s conversions (``litedram/gen.py`` ``main``): "None"/"True"/"False"
    strings, ``*clk_freq`` floats, the module and PHY names resolved to LiteDRAM classes."""
    from litedram import modules, phy

    register_modules()
    out = {}
    for k, v in cfg.items():
        v = {"None": None, "True": True, "False": False}.get(v, v) if isinstance(v, str) else v
        if "clk_freq" in k:
            v = float(v)
        if k == "sdram_module":
            v = getattr(modules, v)
        if k == "sdram_phy":
            v = getattr(phy, v)
        out[k] = v
    return out


@contextlib.contextmanager
def _quiet():
    """LiteX's SoC builder logs its whole hierarchy at INFO: silence it while building in this process."""
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _versions() -> dict:
    return {p: importlib.metadata.version(p) for p in LITEDRAM_PACKAGES}


def core_key(path: str | os.PathLike = ULX3S_CONFIG) -> str:
    """16 hex digits of SHA-256 over the config file's bytes, the LiteDRAM/LiteX/Migen versions and this
    module's source (which builds the simulation core)."""
    _require_litedram()
    h = hashlib.sha256(Path(path).read_bytes())
    h.update(Path(__file__).read_bytes())
    h.update(json.dumps(_versions(), sort_keys=True).encode())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------------- cores
@dataclasses.dataclass(frozen=True)
class GeneratedCore:
    """A generated LiteDRAM core on disk.

    Attributes
    ----------
    name : str
        Verilog module name.
    directory : Path
        Its build folder (``<build_root>/<name>-<key>``).
    verilog : tuple of Path
        The Verilog sources to hand to Yosys/Verilator (the module and any memory init files beside it).
    csr : dict
        CSR name -> byte address on the ``wb_ctrl`` bus (``csr.json`` ``csr_registers``).
    addr_width, data_width : int
        The native user port's address (in ``data_width`` words) and data widths, bits.
    sdram_pins : dict
        Pin name -> (direction, width) of the DRAM pins (empty for a simulation core): :data:`SDR_PINS`
        (Verilog ``sdram_<name>``) or :data:`DDR3_PINS` (``ddram_<name>``).
    init : tuple of (int, int, int)
        The power-up sequence as Wishbone writes ``(byte address, value, cycles to wait after)``
        (:func:`init_writes`).
    sim : bool
        True for the simulation core (:func:`generate_sim_core`).
    memtype : str
        ``"SDR"`` (the default) or ``"DDR3"``: the config's ``memtype``.
    """

    name: str
    directory: Path
    verilog: tuple
    csr: dict
    addr_width: int
    data_width: int
    sdram_pins: dict
    init: tuple
    sim: bool
    memtype: str = "SDR"

    @property
    def bytes(self) -> int:
        """Bytes addressable through the user port (``2**addr_width`` words of ``data_width`` bits)."""
        return (1 << self.addr_width) * self.data_width // 8

    def save(self) -> None:
        """Write ``core.json`` (this record) into :attr:`directory`."""
        rec = dataclasses.asdict(self)
        rec["directory"] = str(self.directory)
        rec["verilog"] = [str(p) for p in self.verilog]
        (self.directory / "core.json").write_text(json.dumps(rec, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> GeneratedCore:
        """The record :meth:`save` wrote into ``directory``."""
        rec = json.loads((Path(directory) / "core.json").read_text())
        rec["directory"] = Path(rec["directory"])
        rec["verilog"] = tuple(Path(p) for p in rec["verilog"])
        rec["sdram_pins"] = {k: tuple(v) for k, v in rec["sdram_pins"].items()}
        rec["init"] = tuple(tuple(w) for w in rec["init"])
        return cls(**rec)


def _hardware_soc(cfg: Mapping):
    """The hardware core exactly as ``litedram_gen`` builds it (``litedram.gen.LiteDRAMCore`` on the
    Lattice platform), elaborated in this process and not written anywhere."""
    from litedram import gen
    from litedram import phy as phys
    from litex.build.lattice import LatticePlatform

    c = _converted(cfg)
    if c["sdram_phy"] not in (phys.GENSDRPHY, phys.ECP5DDRPHY):
        raise ValueError(f"only GENSDRPHY (SDR) and ECP5DDRPHY (DDR3) configs are supported here, got "
                         f"{c['sdram_phy'].__name__}")
    platform = LatticePlatform(c["device"], io=[], toolchain="trellis")
    with _quiet():
        return gen.LiteDRAMCore(platform, c, integrated_rom_size=0xC000)


def hardware_settings(path: str | os.PathLike = ULX3S_CONFIG) -> dict:
    """The settings the hardware core is built from, as ``litedram_gen`` derives them from the config.

    Returns
    -------
    dict
        ``phy``: the PHY's ``PhySettings`` (``litedram/phy/gensdrphy.py``: ``nphases`` 1, ``cl``,
        ``read_latency = cl + 1``, ...; ``litedram/phy/ecp5ddrphy.py``: ``nphases`` 2, ``cl``/``cwl`` for
        tCK = 1/(2 sys), ``read_latency = ceil(cl/2) + 10``, ``write_latency = ceil(cwl/2)``, ``rdphase``,
        ``wrphase``, the read-leveling ``bitslips``/``delays``, the electrical settings); ``geom``:
        ``GeomSettings`` (bank/row/column bits); ``timing``: ``TimingSettings`` in controller cycles (tRP,
        tRCD, tWR, tREFI, tRFC, ...); ``controller``: ``ControllerSettings``; ``module``: the ``SDRAMModule``
        instance (``litedram/modules.py``) at ``sys_clk_freq`` and the PHY's rate (1:1 for GENSDRPHY, 1:2 for
        ECP5DDRPHY); ``sys_clk_freq``: Hz.
    """
    _require_litedram()
    cfg = load_config(path)
    soc = _hardware_soc(cfg)
    ctl = soc.sdram.controller.settings
    return {"phy": _hardware_phy(cfg, soc).settings, "geom": ctl.geom, "timing": ctl.timing, "controller": ctl,
            "module": _module(cfg), "sys_clk_freq": float(cfg["sys_clk_freq"])}


def _phy_entry(cfg: Mapping) -> tuple:
    """:data:`PHYS`' entry of the config's PHY (``ValueError`` for another PHY)."""
    name = str(cfg["sdram_phy"])
    if name not in PHYS:
        raise ValueError(f"sdram_phy {name!r} is not one of {sorted(PHYS)}")
    return PHYS[name]


def _hardware_phy(cfg: Mapping, soc):
    """The PHY object of a hardware core built by :func:`_hardware_soc` (``sdrphy`` or ``ddrphy``)."""
    return getattr(soc, _phy_entry(cfg)[1])


#: tRFC of the 4 Gb DDR3L die, ns: Micron's MT41K256M16 data sheet (4Gb DDR3L SDRAM, MT41K1G4/MT41K512M8/
#: MT41K256M16), refresh parameters, tRFC = 260 ns for 4Gb (the JESD79-3 figure for 4 Gb; tREFI = 64 ms / 8192
#: = 7.8 us at normal temperature, as LiteDRAM's class has it)
MT41K256M16_TRFC_NS = 260


@functools.cache
def local_modules() -> dict:
    """The SDRAM module classes this repository adds to ``litedram.modules``: name -> class. A config's
    ``sdram_module`` may name one of them; :func:`register_modules` makes them visible to ``litedram_gen``
    and to the settings and simulation cores built in this process (the same class object every call).

    ``MT41K256M16_4Gb``: LiteDRAM's ``MT41K256M16`` (an alias of its ``MT41J256M16``: 8 banks x 32768 rows x
    1024 columns) with tRFC as Micron's MT41K256M16 (4 Gb DDR3L) datasheet gives it for the 4 Gb density,
    260 ns (:data:`MT41K256M16_TRFC_NS`), in every speed bin. LiteDRAM's class gives tRFC as DRAM clocks (208
    in its DDR3-1600 bin, 260 ns at 800 MHz), which LiteDRAM scales at the actual clock: at the ECPIX-5's
    150 MHz DRAM clock 208 clocks are 1.39 us, 104 of every 586 controller cycles (docs/DDR3.md). Every other
    timing is the library class's, unchanged.

    Raises
    ------
    ImportError
        Without the ``dram`` extra.
    """
    _require_litedram()
    from litedram.modules import MT41K256M16, _SpeedgradeTimings

    def with_trfc(t):
        return _SpeedgradeTimings(tRP=t.tRP, tRCD=t.tRCD, tWR=t.tWR, tRFC=(None, MT41K256M16_TRFC_NS),
                                  tFAW=t.tFAW, tRAS=t.tRAS)

    mt41k256m16_4gb = type("MT41K256M16_4Gb", (MT41K256M16,), {
        "__doc__": "MT41K256M16 (4 Gb DDR3L) with the datasheet's tRFC of 260 ns (hw.dram.local_modules).",
        "__module__": "litedram.modules",
        "speedgrade_timings": {k: with_trfc(v) for k, v in MT41K256M16.speedgrade_timings.items()},
    })
    return {"MT41K256M16_4Gb": mt41k256m16_4gb}


def register_modules() -> None:
    """Adds :func:`local_modules` to ``litedram.modules`` (idempotent), so that ``getattr(litedram.modules,
    name)``, as ``litedram_gen`` resolves a config's ``sdram_module``, finds them.

    Raises
    ------
    ImportError
        Without the ``dram`` extra.
    RuntimeError
        If ``litedram.modules`` already has another class of one of those names.
    """
    from litedram import modules

    for name, cls in local_modules().items():
        have = getattr(modules, name, None)
        if have is not None and have is not cls:
            raise RuntimeError(f"litedram.modules.{name} exists already and is not hw.dram's")
        setattr(modules, name, cls)


#: ``python -c`` program that runs ``litedram_gen`` (``litedram.gen.main``, arguments after it) with
#: :func:`register_modules` done first; ``{root}`` is the repository root
_GEN_PROGRAM = ("import sys; sys.path.insert(0, {root!r}); from hw.dram import register_modules; "
                "register_modules(); from litedram.gen import main; main()")


def _module(cfg: Mapping):
    c = _converted(cfg)
    return c["sdram_module"](c["sys_clk_freq"], rate=_phy_entry(cfg)[0])


def port_geometry(controller_settings) -> tuple:
    """``(addr_width, data_width)`` of a native user port of the controller with ``controller_settings``.

    A port word is one DRAM burst over all DFI phases (``dfi_databits * nphases`` bits: 16 for GENSDRPHY x16,
    128 for ECP5DDRPHY x16, where one BL8 burst of 8 x 16 bits is one word), and its address counts words:
    bank + row + column bits less log2 of the columns a burst covers (``litedram.common.burst_lengths``: 1 for
    SDR, 8 for DDR3), as ``LiteDRAMCrossbar`` derives it. ULX3S: (24, 16); ECPIX-5: (25, 128).
    """
    from litedram.common import burst_lengths

    phy, geom = controller_settings.phy, controller_settings.geom
    align = (burst_lengths[phy.memtype] - 1).bit_length()
    return geom.bankbits + geom.rowbits + geom.colbits - align, phy.dfi_databits * phy.nphases


def init_writes(phy_settings, timing_settings, csr: Mapping) -> tuple:
    """The DRAM power-up sequence as Wishbone writes on the core's control bus.

    What LiteX's BIOS ``sdram_init`` (``litex/soc/software/liblitedram/sdram.c``) does without leveling or a
    memory test: DFII to software control (``CKE|ODT|RESET_N``), ``init_done``/``init_error`` to 0, every step
    of ``litedram.init.get_sdram_phy_init_sequence`` (address, bank address, then either the DFII control
    register for CKE/unreset steps or the phase-0 command and its issue strobe), DFII back to hardware
    control (``SEL``), ``init_done`` to 1. A step's delay (BIOS ``cdelay`` loop iterations, one or more CPU
    cycles each) is taken as that many controller cycles, the bus accesses in between adding more
    (for SDR: 20000 cycles = 400 us at 50 MHz after CKE, over the 100-200 us the datasheets ask).

    For DDR3 (JESD79-3 3.3.1) the sequence is: RESET# released with CKE low (50000 cycles, 667 us at 75 MHz,
    over the 500 us asked), CKE high (10000 cycles, over tXPR), MR2 (CWL, RTT_WR), MR3, MR1 (RON, RTT_NOM),
    MR0 (CL, BL8, write recovery, DLL reset; 200 cycles, over tMOD), ZQCL (address 0x400, ``WE|CS``). The
    one change here: the wait after ZQCL becomes at least ``ceil(512 / nphases)`` cycles (tZQinit and tDLLK,
    512 DRAM clocks: 256 cycles at rate 1:2) instead of the library's 200, because without a CPU nothing else
    separates ZQCL from the controller's first command (the BIOS's loop and leveling take longer than that).
    Read leveling is not part of these writes (:mod:`host.leveling` runs it afterwards over the same bus).

    Parameters
    ----------
    phy_settings, timing_settings : litedram.common.PhySettings, TimingSettings
    csr : mapping
        CSR name -> byte address (:attr:`GeneratedCore.csr`).

    Returns
    -------
    tuple of (int, int, int)
        ``(byte address, 32-bit value, cycles to wait after the write)``.
    """
    from litedram.init import get_sdram_phy_py_header

    ns: dict = {}
    exec(get_sdram_phy_py_header(phy_settings, timing_settings), ns)  # the library's own rendering
    software = ns["dfii_control_cke"] | ns["dfii_control_odt"] | ns["dfii_control_reset_n"]
    control_values = {software, ns["dfii_control_odt"] | ns["dfii_control_reset_n"]}
    w = [(csr["sdram_dfii_control"], software, 0), (csr["ddrctrl_init_done"], 0, 0),
         (csr["ddrctrl_init_error"], 0, 0)]
    for comment, a, ba, cmd, delay in ns["init_sequence"]:
        if phy_settings.memtype == "DDR3" and comment.startswith("ZQ Calibration"):
            delay = max(delay, -(-DDR3_TZQINIT_NCK // phy_settings.nphases))
        w += [(csr["sdram_dfii_pi0_address"], a, 0), (csr["sdram_dfii_pi0_baddress"], ba, 0)]
        if cmd in control_values:
            w.append((csr["sdram_dfii_control"], cmd, delay))
        else:
            w += [(csr["sdram_dfii_pi0_command"], cmd, 0), (csr["sdram_dfii_pi0_command_issue"], 1, delay)]
    w += [(csr["sdram_dfii_control"], ns["dfii_control_sel"], 0), (csr["ddrctrl_init_done"], 1, 0)]
    return tuple(w)


def _csr_map(csr_json: Path) -> dict:
    regs = json.loads(csr_json.read_text())["csr_registers"]
    return {k: int(v["addr"]) for k, v in regs.items()}


def _locked_build(build_root: Path, name: str, key: str, make) -> GeneratedCore:
    """``GeneratedCore.load`` of ``<build_root>/<name>-<key>``, made by ``make(directory)`` first when
    absent (under an exclusive lock, so concurrent builds wait instead of racing)."""
    directory = Path(build_root) / f"{name}-{key}"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / "core.json").exists():
            make(directory).save()
    return GeneratedCore.load(directory)


def _default_name(path: str | os.PathLike, sim: bool) -> str:
    """``litedram_<config stem>`` (``_sim`` for the simulation core): ``litedram_ulx3s`` for ulx3s.yml."""
    return f"litedram_{Path(path).stem}" + ("_sim" if sim else "")


def generate_core(path: str | os.PathLike = ULX3S_CONFIG, *, name: str | None = None,
                  build_root: str | os.PathLike | None = None) -> GeneratedCore:
    """The hardware core of config ``path``, generated by ``litedram_gen`` (cached).

    Runs ``litedram_gen CONFIG --name NAME --output-dir DIR`` (``litedram.gen.main`` in a fresh Python, after
    :func:`register_modules`, so that the config may name :func:`local_modules`; about a second) into
    ``<build_root>/<name>-<core_key>/`` unless that folder already holds it. ``name`` defaults to
    ``litedram_<config stem>`` (``litedram_ulx3s``, ``litedram_ecpix5``).

    The ECPIX-5 (DDR3) core differs from the ULX3S one beyond its pins: its ``clk`` input is the board's
    100 MHz oscillator, and the controller clock (75 MHz) comes out of its own PLL on ``user_clk`` (with
    ``pll_locked``), which :class:`LiteDRAMCore` passes out as ``dram_clk`` (docs/DDR3.md).

    Raises
    ------
    ImportError
        Without the ``dram`` extra.
    subprocess.CalledProcessError
        If the generator fails (its output is in the exception).
    """
    _require_litedram()
    cfg = load_config(path)
    name = name or _default_name(path, sim=False)

    def make(directory: Path) -> GeneratedCore:
        program = _GEN_PROGRAM.format(root=str(Path(__file__).resolve().parents[1]))
        subprocess.run([sys.executable, "-c", program, str(Path(path).resolve()), "--name", name,
                        "--output-dir", str(directory)],
                       check=True, capture_output=True, text=True, cwd=directory)
        csr = _csr_map(directory / "csr.json")
        hw = hardware_settings(path)
        geom = hw["geom"]
        nb, ranks = int(cfg["sdram_module_nb"]), int(cfg.get("sdram_rank_nb", 1))
        widths = {"a": geom.addressbits, "ba": geom.bankbits, "ras_n": 1, "cas_n": 1, "we_n": 1, "cs_n": 1,
                  "dm": nb, "dq": 8 * nb, "cke": 1}
        pins = _phy_entry(cfg)[3]
        if pins is DDR3_PINS:
            widths.update(cs_n=ranks, dqs_p=nb, dqs_n=nb, clk_p=ranks, clk_n=ranks, cke=ranks, odt=ranks,
                          reset_n=1)
        addr_width, data_width = port_geometry(hw["controller"])
        return GeneratedCore(
            name=name, directory=directory, verilog=(directory / "gateware" / f"{name}.v",), csr=csr,
            addr_width=addr_width, data_width=data_width,
            sdram_pins={k: (pins[k], widths[k]) for k in pins},
            init=init_writes(hw["phy"], hw["timing"], csr), sim=False, memtype=str(cfg["memtype"]))

    return _locked_build(Path(build_root or DEFAULT_BUILD_ROOT), name, core_key(path), make)


def _sim_phy_with_csrs(model, hw_phy):
    """``model`` (an ``SDRAMPHYModel``) with CSRs of the same names, kinds and sizes as ``hw_phy``'s, so that
    the simulation core's CSR map equals the hardware core's, behind a DFI of its own whose read strobe is on
    every phase.

    The registers do nothing to the model (its data arrive at a fixed latency whatever the read delay or
    bitslip), except ``burstdet_seen``: every bit set when read data arrive on the DFI, cleared by a write to
    ``burstdet_clr`` (ECP5DDRPHY's DQSBUFM burst detector, which the leveling procedure checks).

    The DFI (``.dfi``, what the controller and its DFI injector drive) passes commands and write data to the
    model's and read data back, and raises ``rddata_valid`` of every phase with the model's one-bit read strobe,
    as ECP5DDRPHY does (``litedram/phy/ecp5ddrphy.py``: ``phase.rddata_valid.eq(rddata_en.output) for phase in
    dfi.phases``). ``SDRAMPHYModel`` (2024.12, ``litedram/phy/model.py``) assigns that strobe to ``Cat`` of the
    phases' ``rddata_valid``, which raises phase 0's only: the DFI injector (``litedram/dfii.py``) latches a
    phase's ``rddata`` register on that phase's ``rddata_valid``, so phase 1's (beats 4-7 of a BL8 burst at rate
    1:2) stayed 0 and the host's read leveling found no working tap. The controller's reads do not use
    ``rddata_valid`` (it counts ``read_latency``), so the port path is unchanged.
    """
    from functools import reduce
    from operator import or_

    from litedram.phy.dfi import Interface
    from litex.soc.interconnect.csr import CSR, AutoCSR, CSRStatus, CSRStorage
    from migen import If, Module
    from migen import Signal as Signal_  # noqa: N813 - Migen's, not Amaranth's

    class SimPHYWithCSRs(Module, AutoCSR):
        def __init__(self):
            self.submodules.model = model
            self.settings, self.module = model.settings, model.module
            inner = model.dfi
            p0 = inner.phases[0]
            self.dfi = Interface(addressbits=len(p0.address), bankbits=len(p0.bank), nranks=len(p0.cs_n),
                                 databits=len(p0.rddata), nphases=len(inner.phases))
            strobe = Signal_()   # the model's read strobe: bit 0 of its Cat(rddata_valid ...)
            self.comb += strobe.eq(p0.rddata_valid)
            for outer, phase in zip(self.dfi.phases, inner.phases, strict=True):
                self.comb += outer.connect(phase, omit={"rddata_valid"})
                self.comb += outer.rddata_valid.eq(strobe)
            regs = {}
            for r in hw_phy.get_csrs():
                kind = type(r)
                if kind not in (CSR, CSRStorage, CSRStatus):
                    raise ValueError(f"{hw_phy.__class__.__name__} CSR {r.name!r} of kind {kind.__name__}")
                regs[r.name] = kind(r.size, name=r.name)
                setattr(self, f"_{r.name}", regs[r.name])
            if "burstdet_seen" in regs and "burstdet_clr" in regs:
                seen, clr = regs["burstdet_seen"], regs["burstdet_clr"]
                valid = Signal_()
                self.comb += valid.eq(reduce(or_, [p.rddata_valid for p in self.dfi.phases]))
                self.sync += [If(clr.re, seen.status.eq(0)), If(valid, seen.status.eq(2 ** seen.size - 1))]

    return SimPHYWithCSRs()


def _whole_ps_timing_checker(model, module, clk_freq: float):
    """LiteDRAM's ``DFITimingsChecker`` for ``model`` as ``SDRAMPHYModel`` builds it (the module's timings at
    ``clk_freq``), except that a timing given in DRAM clocks is that many times the checker's own tCK.

    The checker keeps time in whole picoseconds: ``cnt * tCK_ps`` with tCK truncated to whole ps, while its
    library version converts a timing of ``c`` clocks by truncating ``c * tCK`` after the multiplication. When
    tCK is not a whole number of ps (75 MHz at rate 1:2: 6666.67 ps) the two disagree, and commands exactly
    ``c`` clocks apart are reported as violations by 2 ps (every back-to-back burst at tCCD = 4 tCK: the
    checker's 26664 ps against its 26666). Here ``c`` clocks are ``c * tCK_ps`` on the checker's own
    timeline; timings in ns are as in the library (against a clock 0.01 % shorter than real, a slightly
    stricter check). With a whole-ps tCK (the ULX3S's 20 ns) the result equals the library's.
    """
    from litedram.modules import _speedgrade_timings, _technology_timings
    from litedram.phy.model import DFITimingsChecker

    class WholePsChecker(DFITimingsChecker):
        def ck_ns_to_ps(self, val, tck):
            c, t = val
            return max(0 if c is None else c * self.ns_to_ps(tck), 0 if t is None else self.ns_to_ps(t))

    nphases = model.settings.nphases
    timings = {"tCK": (1e9 / clk_freq) / nphases}
    for name in _speedgrade_timings + _technology_timings:   # as SDRAMPHYModel collects them
        key = module.timing_settings.fine_refresh_mode if name in ("tREFI", "tRFC") else None
        timings[name] = module.get(name, key)
    return WholePsChecker(dfi=model.dfi, nbanks=2 ** module.geom_settings.bankbits, nphases=nphases,
                          timings=timings, refresh_mode=module.timing_settings.fine_refresh_mode,
                          memtype=model.settings.memtype, verbose=False)


def _sim_soc(cfg: Mapping):
    """The simulation core: ``litedram.gen.LiteDRAMCore``'s structure with ``SDRAMPHYModel`` for the PHY."""
    from litedram import gen
    from litedram.phy.model import SDRAM_VERBOSE_OFF, SDRAM_VERBOSE_STD, SDRAMPHYModel
    from litex.build.generic_platform import Pins, Subsignal
    from litex.build.sim import SimPlatform
    from litex.soc.integration.soc_core import SoCCore
    from litex.soc.interconnect import wishbone
    from migen import ClockDomain, If
    from migen import ClockSignal as ClockSignal_  # noqa: N813 - Migen's, not Amaranth's
    from migen import Module as Module_  # noqa: N813
    from migen import ResetSignal as ResetSignal_  # noqa: N813
    from migen import Signal as Signal_  # noqa: N813
    from migen.genlib.resetsync import AsyncResetSynchronizer

    c = _converted(cfg)
    hw = _hardware_soc(cfg)  # the settings come from the hardware core itself
    hw_ctl = hw.sdram.controller.settings
    hw_phy = _hardware_phy(cfg, hw)

    class SimCRG(Module_):
        """The controller clock from ``clk``, ``rst`` through an AsyncResetSynchronizer (the DDR3 hardware
        core's PLL, ECLKSYNCB, CLKDIVF and DDRDLLA have no part in the DFI-level model)."""

        def __init__(self):
            self.clock_domains.cd_sys = ClockDomain()
            self.comb += self.cd_sys.clk.eq(platform.request("clk"))
            self.specials += AsyncResetSynchronizer(self.cd_sys, platform.request("rst"))
    platform = SimPlatform("", io=[])
    platform.add_extension(gen.get_common_ios())
    platform.add_extension([("sim_monitor", 0, *[Subsignal(f"{n}_count", Pins(32)) for n in SIM_COMMANDS],
                             Subsignal("ref_max_gap", Pins(32)))])

    class SimDRAMCore(SoCCore):
        def __init__(self):
            SoCCore.__init__(self, platform, c["sys_clk_freq"], cpu_type=None, csr_data_width=32,
                             with_uart=False, integrated_rom_size=0, integrated_sram_size=0, with_timer=False,
                             with_ctrl=False)
            if c["memtype"] == "SDR":
                self.crg = gen.LiteDRAMGENSDRPHYCRG(platform, c)  # clk, rst -> AsyncResetSynchronizer
            else:
                self.crg = SimCRG()
            tck_ps = 1e12 / c["sys_clk_freq"] / hw_phy.settings.nphases
            whole_ps = abs(tck_ps - round(tck_ps)) < 1e-6
            model = SDRAMPHYModel(module=_module(cfg), settings=hw_phy.settings, clk_freq=c["sys_clk_freq"],
                                  verbosity=SDRAM_VERBOSE_STD if whole_ps else SDRAM_VERBOSE_OFF)
            if not whole_ps:   # 75 MHz: tCK 6666.67 ps (_whole_ps_timing_checker)
                model.submodules.timing_checker = _whole_ps_timing_checker(model, model.module, c["sys_clk_freq"])
            has_csrs = hasattr(type(hw_phy), "get_csrs") and hw_phy.get_csrs()  # GENSDRPHY: no AutoCSR
            self.ddrphy = _sim_phy_with_csrs(model, hw_phy) if has_csrs else model
            self.add_sdram("sdram", phy=self.ddrphy, module=_module(cfg), size=0x01000000,
                           with_soc_interconnect=False, l2_cache_size=8, l2_cache_min_data_width=0,
                           controller_settings=hw_ctl)
            self.ddrctrl = gen.LiteDRAMCoreControl()
            self.comb += platform.request("init_done").eq(self.ddrctrl.init_done.storage)
            self.comb += platform.request("init_error").eq(self.ddrctrl.init_error.storage)
            wb_bus = wishbone.Interface()
            self.bus.add_master(master=wb_bus)
            platform.add_extension(wb_bus.get_ios("wb_ctrl"))
            self.comb += wb_bus.connect_to_pads(platform.request("wb_ctrl"), mode="slave")
            # the user port, wired as litedram_gen wires a native port (gated until init_done, not error)
            user_enable = Signal_()
            self.sync += user_enable.eq(self.ddrctrl.init_done.storage & ~self.ddrctrl.init_error.storage)
            self.user_port = port = self.sdram.crossbar.get_port()
            platform.add_extension(gen.get_native_user_port_ios(USER_PORT, port.address_width,
                                                                port.data_width))
            io = platform.request(f"user_port_{USER_PORT}")
            self.comb += [
                port.cmd.valid.eq(io.cmd_valid & user_enable), io.cmd_ready.eq(port.cmd.ready & user_enable),
                port.cmd.we.eq(io.cmd_we), port.cmd.addr.eq(io.cmd_addr),
                port.wdata.valid.eq(io.wdata_valid & user_enable),
                io.wdata_ready.eq(port.wdata.ready & user_enable),
                port.wdata.we.eq(io.wdata_we), port.wdata.data.eq(io.wdata_data),
                io.rdata_valid.eq(port.rdata.valid & user_enable),
                port.rdata.ready.eq(io.rdata_ready & user_enable), io.rdata_data.eq(port.rdata.data),
            ]
            self.comb += platform.request("user_clk").eq(ClockSignal_())
            self.comb += platform.request("user_rst").eq(ResetSignal_())
            self._monitor(platform.request("sim_monitor"))

        def _monitor(self, pads):
            """Counters of the DRAM commands on the model's DFI (observation only, not in the hardware core),
            over every DFI phase (a command on any phase counts once)."""
            hits = {name: [] for name in SIM_COMMANDS}
            for p in self.ddrphy.dfi.phases:
                cmd = {name: Signal_() for name in SIM_COMMANDS}
                sel = ~p.cs_n[0]
                self.comb += [
                    cmd["ref"].eq(sel & ~p.ras_n & ~p.cas_n & p.we_n),
                    cmd["act"].eq(sel & ~p.ras_n & p.cas_n & p.we_n),
                    cmd["pre"].eq(sel & ~p.ras_n & p.cas_n & ~p.we_n),
                    cmd["rd"].eq(sel & p.ras_n & ~p.cas_n & p.we_n),
                    cmd["wr"].eq(sel & p.ras_n & ~p.cas_n & ~p.we_n),
                ]
                for name in SIM_COMMANDS:
                    hits[name].append(cmd[name])
            for name, phase_hits in hits.items():
                count = getattr(pads, f"{name}_count")
                self.sync += count.eq(count + sum(phase_hits[1:], phase_hits[0]))
            any_ref = Signal_()
            self.comb += any_ref.eq(sum(hits["ref"][1:], hits["ref"][0]) != 0)
            gap, seen = Signal_(32), Signal_()
            self.sync += [
                gap.eq(gap + 1),
                If(any_ref,
                   gap.eq(1), seen.eq(1),
                   If(seen & (gap > pads.ref_max_gap), pads.ref_max_gap.eq(gap))),
            ]

    with _quiet():
        return platform, SimDRAMCore()


def sim_settings(path: str | os.PathLike = ULX3S_CONFIG) -> dict:
    """The settings of the simulation core of config ``path``, read back from the built core itself.

    Returns
    -------
    dict
        The keys of :func:`hardware_settings` (``phy`` is the model's ``settings``, ``geom``/``timing``/
        ``controller`` the controller's, ``module`` the model's module) plus ``timing_checker``: True when
        the model carries LiteDRAM's ``DFITimingsChecker``, ``checker_timings``: its timings in ps,
        ``model_words``: the words the model's arrays hold (all banks; one word per BL burst), and
        ``model_width``: their width, bits.
    """
    _require_litedram()
    from litedram.phy.model import DFITimingsChecker

    cfg = load_config(path)
    _, soc = _sim_soc(cfg)
    ctl = soc.sdram.controller.settings
    model = getattr(soc.ddrphy, "model", soc.ddrphy)
    checkers = [m for _, m in model._submodules if isinstance(m, DFITimingsChecker)]
    mems = [sp for _, sub in model._submodules for sp in sub._fragment.specials if hasattr(sp, "depth")]
    return {"phy": model.settings, "geom": ctl.geom, "timing": ctl.timing, "controller": ctl,
            "module": model.module, "sys_clk_freq": float(soc.sys_clk_freq),
            "timing_checker": bool(checkers), "checker_timings": checkers[0].timings if checkers else None,
            "model_words": sum(m.depth for m in mems), "model_width": mems[0].width if mems else None}


def settings_record(settings: Mapping) -> dict:
    """The DRAM facts a benchmark records (JSON-ready): the LiteDRAM/LiteX/Migen versions, the controller clock,
    the PHY's settings, the module class, the geometry, the timings in controller cycles and the controller's
    options.

    Parameters
    ----------
    settings : mapping
        :func:`hardware_settings` or :func:`sim_settings` of a config.
    """
    phy, t, geom, ctl = settings["phy"], settings["timing"], settings["geom"], settings["controller"]
    return {
        "versions": _versions(),
        "controller_clock_hz": settings["sys_clk_freq"],
        "phy": {k: getattr(phy, k) for k in ("phytype", "memtype", "databits", "nphases", "cl", "read_latency",
                                              "write_latency")},
        "module": type(settings["module"]).__name__,
        "geometry": {"banks": 2 ** geom.bankbits, "rows": 2 ** geom.rowbits, "columns": 2 ** geom.colbits},
        "timing_cycles": {k: getattr(t, k) for k in ("tRP", "tRCD", "tWR", "tWTR", "tREFI", "tRFC", "tRAS", "tRC",
                                                     "tCCD", "tRRD")},
        "controller": {"cmd_buffer_depth": ctl.cmd_buffer_depth, "address_mapping": ctl.address_mapping},
    }


def generate_sim_core(path: str | os.PathLike = ULX3S_CONFIG, *, name: str | None = None,
                      build_root: str | os.PathLike | None = None) -> GeneratedCore:
    """The simulation core of config ``path`` (module docstring), converted to Verilog (cached).

    ``name`` defaults to ``litedram_<config stem>_sim`` (``litedram_ulx3s_sim``, ``litedram_ecpix5_sim``).
    The whole device is modelled as Verilog arrays, so the refresh timing is the module's own: for the ULX3S
    config 4 banks x 8192 rows x 512 columns x 16 bits = 32 MiB. For the ECPIX-5 config the arrays hold
    1 GiB for the 512 MiB device: ``SDRAMPHYModel`` sizes a bank as ``rows x columns / (2 nphases)`` words
    of one DFI cycle (``burst_length`` 2 for DDR3, which is right at rate 1:4), so at rate 1:2 it allocates a
    128-bit word per 4 columns where a BL8 burst covers 8; every other word is never addressed
    (docs/DDR3.md).

    Raises
    ------
    ImportError
        Without the ``dram`` extra.
    """
    _require_litedram()
    cfg = load_config(path)
    name = name or _default_name(path, sim=True)

    def make(directory: Path) -> GeneratedCore:
        from litex.soc.integration.export import get_csr_json

        platform, soc = _sim_soc(cfg)
        gw = directory / "gateware"
        gw.mkdir(exist_ok=True)
        with _quiet():
            soc.finalize()
            out = platform.get_verilog(soc, name=name, regular_comb=False)
        out.write(str(gw / f"{name}.v"))
        (directory / "csr.json").write_text(get_csr_json(soc.csr_regions, soc.constants, soc.mem_regions))
        csr = _csr_map(directory / "csr.json")
        ctl = soc.sdram.controller.settings
        verilog = (gw / f"{name}.v", *sorted(p for p in gw.iterdir() if p.suffix == ".init"))
        addr_width, data_width = soc.user_port.address_width, soc.user_port.data_width
        if (addr_width, data_width) != port_geometry(ctl):
            raise AssertionError(f"port {addr_width}x{data_width} != {port_geometry(ctl)}")
        return GeneratedCore(
            name=name, directory=directory, verilog=verilog, csr=csr, addr_width=addr_width,
            data_width=data_width, sdram_pins={}, init=init_writes(ctl.phy, ctl.timing, csr), sim=True,
            memtype=str(cfg["memtype"]))

    return _locked_build(Path(build_root or DEFAULT_BUILD_ROOT), name, core_key(path), make)


# ------------------------------------------------------------------------------------- native port
def native_cmd_layout(addr_width: int) -> data.StructLayout:
    """Payload of a native port's command stream: ``we`` (1: write, 0: read), ``addr`` (word address,
    ``addr_width`` bits; a word is the port's ``data_width``). ``litedram/common.py`` ``cmd_description``."""
    return data.StructLayout({"we": 1, "addr": addr_width})


def native_wdata_layout(data_width: int) -> data.StructLayout:
    """Payload of a native port's write-data stream: ``data`` (``data_width`` bits, byte ``k`` of the word
    in bits ``8k .. 8k+7``, little-endian) and ``we`` (``data_width // 8`` byte enables)."""
    return data.StructLayout({"data": data_width, "we": data_width // 8})


def sim_monitor_layout() -> data.StructLayout:
    """The simulation core's observation outputs (``LiteDRAMCore.monitor``), 32 bits each, counted on the
    DRAM model's DFI from reset: ``ref_count``, ``act_count``, ``pre_count``, ``rd_count``, ``wr_count``
    (auto-refresh, activate, precharge, read and write commands, the power-up sequence's included) and
    ``ref_max_gap`` (the longest interval between two consecutive refresh commands, controller cycles)."""
    return data.StructLayout({**{f"{n}_count": 32 for n in SIM_COMMANDS}, "ref_max_gap": 32})


class NativePortSignature(wiring.Signature):
    """A LiteDRAM native user port, as its user (manager) sees it (``litedram/common.py``
    ``LiteDRAMNativePort``).

    Members
    -------
    cmd : Out(stream.Signature(native_cmd_layout(addr_width)))
        One command per word; accepted on ``valid & ready``.
    wdata : Out(stream.Signature(native_wdata_layout(data_width), always_valid=True))
        The controller takes a write's data in the cycle it raises ``ready`` (the write-latency after it
        executes the command) and ignores ``valid``: the user must hold each accepted write's data ready
        beforehand, in command order (``LiteDRAMCrossbar``: ``wdata.valid`` unused).
    rdata : In(stream.Signature(data_width, always_ready=True))
        Read data in command order, one word per read, at a latency set by the controller; it cannot be
        held back (the crossbar ignores ``ready``), so the user reserves room before issuing reads.

    Parameters
    ----------
    addr_width : int, >= 1
        Word address bits (24 for the ULX3S core: 32 MiB of 16-bit words).
    data_width : int, multiple of 8
        Word bits (16 for the ULX3S core).

    Raises
    ------
    TypeError, ValueError
        If a width is not an int, or out of range.
    """

    def __init__(self, *, addr_width: int, data_width: int):
        for n, v in (("addr_width", addr_width), ("data_width", data_width)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{n} must be an int, not {v!r}")
        if addr_width < 1:
            raise ValueError(f"addr_width must be >= 1, got {addr_width}")
        if data_width < 8 or data_width % 8:
            raise ValueError(f"data_width must be a positive multiple of 8, got {data_width}")
        self._addr_width, self._data_width = addr_width, data_width
        super().__init__({
            "cmd": Out(stream.Signature(native_cmd_layout(addr_width))),
            "wdata": Out(stream.Signature(native_wdata_layout(data_width), always_valid=True)),
            "rdata": In(stream.Signature(data_width, always_ready=True)),
        })

    @property
    def addr_width(self) -> int:
        return self._addr_width

    @property
    def data_width(self) -> int:
        return self._data_width

    def __eq__(self, other):
        return (isinstance(other, NativePortSignature) and other.addr_width == self.addr_width
                and other.data_width == self.data_width)

    def __hash__(self):
        return hash((NativePortSignature, self._addr_width, self._data_width))

    def __repr__(self):
        return f"NativePortSignature(addr_width={self._addr_width}, data_width={self._data_width})"


#: DDR3 pins the board may leave unconnected (outputs the ECPIX-5 does not wire: one rank, RESET# tied on the
#: board; LITEDRAM.md): :class:`LiteDRAMCore` takes them in ``pins`` or leaves the Instance's outputs open
DDR3_OPTIONAL_PINS = frozenset({"cs_n", "reset_n"})


class LiteDRAMCore(wiring.Component):
    """A generated LiteDRAM core (:class:`GeneratedCore`) as an Amaranth component.

    **Clocks.** For an SDR core and for every simulation core the component is in the ``sync`` domain: the
    ``sync`` clock is the controller clock (``clk`` of the generated module; 50 MHz on the ULX3S, 75 MHz for
    the ECPIX-5 simulation core) and ``sync`` reset its reset (synchronised inside). A **DDR3 hardware core**
    (``core.memtype == "DDR3"``, not ``core.sim``; the ECPIX-5) makes its controller clock itself: the board's
    oscillator comes in on ``osc`` (the module's ``clk``: 100 MHz, ``input_clk_freq`` of the config), the
    core's PLL, ECLKSYNCB and CLKDIVF make sys2x (150 MHz), init (25 MHz) and the controller clock (75 MHz),
    which comes out on ``dram_clk`` with its reset ``dram_rst`` (the module's ``user_clk``/``user_rst``; the
    reset is held until the PLL locks and the DDRDLLA start-up is done, and released synchronously to
    ``dram_clk``) and ``pll_locked``. The board top makes a clock domain of them (``m.domains.dram =
    ClockDomain()``, ``ClockSignal("dram").eq(dram_clk)``, ``ResetSignal("dram").eq(dram_rst)``) and uses it
    for ``port``, ``ctrl``, ``port_enable``, ``init_done`` and ``init_error``, which are then all synchronous to
    ``dram_clk`` (the component's own logic runs on ``dram_clk`` in a local domain); it does not use ``sync``.
    Logic in another domain reaches the port through :class:`hw.dram_cdc.NativePortCDC`.

    The DRAM's power-up sequence runs by itself after reset (:class:`hw.dram_init.DFIIInitSequencer`,
    :attr:`GeneratedCore.init`); until ``init_done`` the core holds ``port`` (``cmd.ready`` low:
    ``block_until_ready``).

    **Pins.** For a hardware core the DRAM pins come from the board top as ``pins``: name -> raw IO value
    (``platform.request(..., dir="-")`` in Amaranth 0.5), the names of :attr:`GeneratedCore.sdram_pins`.
    SDR (``sdram_<name>``): all of them (amaranth-boards' ULX3S ``sdram`` resource calls ``dm`` ``dqm``: pass it
    as ``dm``); the SDRAM clock pin is not driven here: the board top drives it with a phase-shifted copy of the
    controller clock (LITEDRAM.md). DDR3 (``ddram_<name>``, :data:`DDR3_PINS`): every ``o`` and ``io`` pin
    (``clk_p`` and ``dqs_p`` are the true sides of differential pads: give them the ``SSTL15D_I`` IO type and
    the complement follows), except :data:`DDR3_OPTIONAL_PINS`, which may be left out (their outputs stay
    open); never the ``nc`` pins ``clk_n``/``dqs_n`` (tied low here: the core never uses them).

    Parameters
    ----------
    core : GeneratedCore
    pins : mapping of str to IOValue, optional
        Required for a hardware core, refused for a simulation core.
    init_timeout : int, >= 1
        Cycles of the controller clock a control-bus write may wait for its ``ack`` before ``init_error``
        (default 1024).
    hold_port : bool
        False (default, the ULX3S): the port is enabled as soon as the power-up sequence has run. True: it
        stays blocked after that (``cmd.ready`` low, no command reaches the core) while ``port_enable`` is
        low, so that the host can level the DRAM over ``ctrl`` first (docs/DDR3.md). The ECPIX-5 wants True.

    Members
    -------
    port : In(NativePortSignature(addr_width=core.addr_width, data_width=core.data_width))
        The native user port (the core is its subordinate).
    ctrl : In(hw.dram_init.WishboneSignature())
        The host's access to the core's control bus (``wb_ctrl``: its CSRs, byte addresses
        :attr:`GeneratedCore.csr`, word address = byte address >> 2, 32-bit data): read leveling and memory
        tests. The power-up sequencer owns the bus until it is done or in error; until then ``ctrl.ack``
        stays low and a transfer waits (:class:`hw.dram_init.DRAMControl`). Leave it idle (all zero) if
        unused.
    port_enable : In(1)
        With ``hold_port``: commands pass to the core only while it is high (a level; raise it once leveling
        is done and keep it). Ignored without ``hold_port``.
    init_done : Out(1)
        The power-up sequence has run and the core takes commands (the core's ``ddrctrl_init_done`` CSR;
        with ``hold_port`` the port also needs ``port_enable``).
    init_error : Out(1)
        A control-bus write was never acknowledged (the sequencer gave up), or the core's
        ``ddrctrl_init_error`` CSR is set.
    monitor : Out(sim_monitor_layout())
        Simulation cores only: DFI command counters (:func:`sim_monitor_layout`).
    osc : In(1)
        DDR3 hardware cores only: the board oscillator (``input_clk_freq`` of the config, 100 MHz on the
        ECPIX-5), straight from its pin (the core's PLL input).
    osc_rst : In(1)
        DDR3 hardware cores only: resets the core's PLL and with it everything (active high, asynchronous;
        tie low: the core has a power-on reset of 65,536 oscillator cycles of its own).
    dram_clk, dram_rst : Out(1)
        DDR3 hardware cores only: the controller clock (``sys_clk_freq``, 75 MHz) and its reset, for the board
        top's ``dram`` domain (above).
    pll_locked : Out(1)
        DDR3 hardware cores only: the core's PLL is locked (asynchronous; for an LED or a status register).

    Raises
    ------
    TypeError
        If ``core`` is not a :class:`GeneratedCore` or ``hold_port`` is not a bool.
    ValueError
        If ``pins`` is missing, names pins the core lacks (or an ``nc`` pin), lacks a required pin, or holds
        a value other than an IOValue.
    """

    def __init__(self, core: GeneratedCore, *, pins: Mapping | None = None, init_timeout: int = 1024,
                 hold_port: bool = False):
        from hw.dram_init import WishboneSignature

        if not isinstance(core, GeneratedCore):
            raise TypeError(f"core must be a GeneratedCore, not {core!r}")
        if core.sim and pins is not None:
            raise ValueError("a simulation core has no SDRAM pins: pass pins=None")
        self._own_clock = not core.sim and core.memtype == "DDR3"
        if not core.sim:
            usable = {k for k, (d, _) in core.sdram_pins.items() if d != "nc"}
            required = usable - (DDR3_OPTIONAL_PINS if self._own_clock else frozenset())
            if pins is None or not required <= set(pins) <= usable:
                raise ValueError(f"pins must name {sorted(required)}"
                                 + (f" (and may name {sorted(usable - required)})" if usable - required else "")
                                 + f", got {None if pins is None else sorted(pins)}")
            for k, v in pins.items():
                if not isinstance(v, IOValue):
                    raise ValueError(f"pin {k!r} must be an IOValue (platform.request(..., dir='-')), got {v!r}")
        if not isinstance(hold_port, bool):
            raise TypeError(f"hold_port must be a bool, not {hold_port!r}")
        self._core, self._pins, self._init_timeout, self._hold = core, dict(pins or {}), init_timeout, hold_port
        members = {
            "port": In(NativePortSignature(addr_width=core.addr_width, data_width=core.data_width)),
            "ctrl": In(WishboneSignature()),
            "port_enable": In(1),
            "init_done": Out(1),
            "init_error": Out(1),
        }
        if core.sim:
            members["monitor"] = Out(sim_monitor_layout())
        if self._own_clock:
            members.update(osc=In(1), osc_rst=In(1), dram_clk=Out(1), dram_rst=Out(1), pll_locked=Out(1))
        super().__init__(members)

    @property
    def core(self) -> GeneratedCore:
        return self._core

    @property
    def hold_port(self) -> bool:
        return self._hold

    def elaborate(self, platform):
        from hw.dram_init import DRAMControl

        m = Module()
        control = DRAMControl(writes=self._core.init, addr_width=self._core.addr_width,
                              data_width=self._core.data_width, timeout=self._init_timeout, hold_port=self._hold)
        if self._own_clock:   # the controller clock is the core's own user_clk: a local domain on it
            m.domains.litedram_user = ClockDomain("litedram_user", local=True)
            m.submodules.control = DomainRenamer({"sync": "litedram_user"})(control)
            clk, rst = self.osc, self.osc_rst
        else:
            m.submodules.control = control
            clk, rst = ClockSignal("sync"), ResetSignal("sync")
        wiring.connect(m, wiring.flipped(self.port), control.port)
        wiring.connect(m, wiring.flipped(self.ctrl), control.ctrl)
        m.d.comb += control.port_enable.eq(self.port_enable)
        p = f"user_port_{USER_PORT}_"
        port, bus = control.core_port, control.bus
        done, error = Signal(), Signal()
        ports = {
            "i_clk": clk, "i_rst": rst,
            "o_init_done": done, "o_init_error": error,
            "i_wb_ctrl_adr": bus.adr, "i_wb_ctrl_dat_w": bus.dat_w, "o_wb_ctrl_dat_r": bus.dat_r,
            "i_wb_ctrl_sel": Const(0xF, 4), "i_wb_ctrl_cyc": bus.cyc, "i_wb_ctrl_stb": bus.stb,
            "o_wb_ctrl_ack": bus.ack, "i_wb_ctrl_we": bus.we, "i_wb_ctrl_cti": Const(0, 3),
            "i_wb_ctrl_bte": Const(0, 2), "o_wb_ctrl_err": Signal(),
            f"i_{p}cmd_valid": port.cmd.valid, f"o_{p}cmd_ready": port.cmd.ready,
            f"i_{p}cmd_we": port.cmd.payload.we, f"i_{p}cmd_addr": port.cmd.payload.addr,
            f"i_{p}wdata_valid": Const(1, 1), f"o_{p}wdata_ready": port.wdata.ready,
            f"i_{p}wdata_we": port.wdata.payload.we, f"i_{p}wdata_data": port.wdata.payload.data,
            f"o_{p}rdata_valid": port.rdata.valid, f"i_{p}rdata_ready": Const(1, 1),
            f"o_{p}rdata_data": port.rdata.payload,
            "o_user_clk": Signal(), "o_user_rst": Signal(),
        }
        prefix = "ddram" if self._core.memtype == "DDR3" else "sdram"
        for k, pin in self._pins.items():
            ports[f"{'io' if self._core.sdram_pins[k][0] == 'io' else 'o'}_{prefix}_{k}"] = pin
        if self._own_clock:
            ports.update(o_user_clk=self.dram_clk, o_user_rst=self.dram_rst, o_pll_locked=self.pll_locked)
            m.d.comb += [ClockSignal("litedram_user").eq(self.dram_clk), ResetSignal("litedram_user").eq(self.dram_rst)]
            for k, (d, w) in self._core.sdram_pins.items():
                if d == "nc":
                    ports[f"i_{prefix}_{k}"] = Const(0, w)
        if self._core.sim:
            ports["i_sim_trace"] = Const(0, 1)
            for name in sim_monitor_layout().members:
                ports[f"o_sim_monitor_{name}"] = self.monitor[name]
        m.submodules.litedram = Instance(self._core.name, **ports)
        m.d.comb += [self.init_done.eq(done), self.init_error.eq(error | control.error)]
        return m
