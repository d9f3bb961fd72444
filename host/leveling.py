"""Read leveling of LiteDRAM's ECP5 DDR3 PHY (``ECP5DDRPHY``), driven by the host over the core's control bus.

**Not run on hardware.** No ECPIX-5 board was available; the procedure is tested only against a scripted
register model of the PHY (``tests/test_leveling.py``).

Why
---
A DDR3 core generated without a soft CPU (``hw/boards/litedram/ecpix5.yml``) comes up with every byte lane's
read-capture delay and bitslip at zero. Whether reads then return the right data depends on the board's trace
lengths and the chip, so LiteX's BIOS calibrates them after the power-up sequence (``sdram_read_leveling`` in
``litex/soc/software/liblitedram/sdram.c``). Without a CPU the host runs the same calibration through the
core's CSRs, which the board exposes over its link (issue 23). This module is a port of that procedure,
written from its description, over an abstract register interface:

For each byte lane ("module": 8 DQ bits with their own DQS strobe, 2 on the x16 ECPIX-5 chip):

1. For each read bitslip ``b`` (0 .. ``bitslips`` - 1; ECP5DDRPHY: 4 positions of its 4-bit read gearbox):
   reset the lane's read delay, then for each delay tap ``d`` (0 .. ``delays`` - 1; ECP5DDRPHY: the 3-bit
   ``READCLKSEL`` of its DQSBUFM) write a pseudo-random burst through the DFI injector's software path
   (activate row 0 of bank 0, write, read, precharge), compare the lane's bits of what comes back, check the
   PHY's burst detector saw the read burst, and step the delay. The scan is repeated for several seeds; a tap
   "works" when every seed reads back without error.
2. Per bitslip, the longest run of consecutive working taps is the window.
3. The bitslip with the longest window wins (ties: fewer bit errors over the scan, then the lower bitslip); the
   lane is set to it and its read delay to the window's centre (``(first + last) // 2``), and the pattern is
   checked once more there.
4. A lane with no working tap at any bitslip is an error (:class:`LevelingError`, naming the lane).

Each delay or bitslip step selects the lane (``ddrphy_dly_sel`` = ``1 << lane``), strobes the step register,
deselects, then writes all lanes' bits and zero again: ``dly_sel`` also drives the DQSBUFMs' ``PAUSE``, and
toggling them together keeps the lanes' DQS buffers in step (LiteX does the same for this PHY).

Register interface
------------------
Anything with ``read(name) -> int`` and ``write(name, value)`` over the CSR names of the generated core's
``csr.json`` (``ddrphy_dly_sel``, ``ddrphy_rdly_dq_rst``, ``ddrphy_rdly_dq_inc``, ``ddrphy_rdly_dq_bitslip_rst``,
``ddrphy_rdly_dq_bitslip``, ``ddrphy_burstdet_clr``, ``ddrphy_burstdet_seen``, ``sdram_dfii_control``,
``sdram_dfii_pi<p>_{command,command_issue,address,baddress,wrdata,rddata}``), each value the whole register
(64 bits for ``wrdata``/``rddata`` at ECP5DDRPHY's 64-bit DFI phases). :class:`CSRBus` builds that interface
over 32-bit word accesses of the core's Wishbone control bus (``wb_ctrl``) from ``csr.json``.

DFI data layout (``litedram/phy/ecp5ddrphy.py``): a phase's ``wrdata``/``rddata`` carries 4 beats of the
burst, beat ``k`` in bits ``[k * databits, (k + 1) * databits)``, and DQ bit ``j`` of a beat at offset ``j``,
so lane ``m`` owns bits ``8m .. 8m + 7`` of every beat. Phase 0 holds beats 0-3 of the BL8 burst, phase 1
beats 4-7.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

__all__ = ["DFII_CONTROL_SEL", "DFII_CONTROL_CKE", "DFII_CONTROL_ODT", "DFII_CONTROL_RESET_N", "DFII_COMMAND_CS",
           "DFII_COMMAND_WE", "DFII_COMMAND_CAS", "DFII_COMMAND_RAS", "DFII_COMMAND_WRDATA",
           "DFII_COMMAND_RDDATA", "SEEDS", "RegisterAccess", "LevelingParams", "ECPIX5_PARAMS", "LevelingError",
           "LaneResult", "LevelingResult", "required_csrs", "read_leveling", "CSRBus", "load_csr_map",
           "CLOBBERED_BYTES"]

# LiteDRAM's DFI injector (litedram/dfii.py; the values litedram.init writes into sdram_phy.h)
DFII_CONTROL_SEL = 0x01      #: hardware (controller) control of the DFI
DFII_CONTROL_CKE = 0x02
DFII_CONTROL_ODT = 0x04
DFII_CONTROL_RESET_N = 0x08
DFII_COMMAND_CS = 0x01
DFII_COMMAND_WE = 0x02
DFII_COMMAND_CAS = 0x04
DFII_COMMAND_RAS = 0x08
DFII_COMMAND_WRDATA = 0x10   #: the command's phase raises wrdata_en (the PHY sends the wrdata registers)
DFII_COMMAND_RDDATA = 0x20   #: the command's phase raises rddata_en (the rddata registers capture the burst)
#: software control: the DRAM clocked and out of reset, commands from the pi<p> registers
DFII_CONTROL_SOFTWARE = DFII_CONTROL_CKE | DFII_CONTROL_ODT | DFII_CONTROL_RESET_N

#: pattern seeds: a tap must read all of them back without error (three, as LiteX's BIOS uses)
SEEDS = (42, 84, 36)
#: DRAM bytes from address 0 that the procedure overwrites: its test bursts go to bank 0, row 0, column 0,
#: which is the user port's word 0 (one BL8 burst of the x16 chip: 16 bytes on the ECPIX-5)
CLOBBERED_BYTES = 16


class RegisterAccess(Protocol):
    """Access to a LiteDRAM core's CSRs by name (the keys of its ``csr.json`` ``csr_registers``)."""

    def read(self, name: str) -> int:
        """The whole register's value (all its subregisters)."""

    def write(self, name: str, value: int) -> None:
        """Write the whole register; a write to an action register (``*_rst``, ``*_inc``, ``*_issue``,
        ``*_clr``) is its strobe."""


@dataclasses.dataclass(frozen=True)
class LevelingParams:
    """What the procedure needs to know about the PHY (its ``PhySettings``).

    Attributes
    ----------
    modules : int
        Byte lanes (``databits // 8``).
    databits : int
        DQ bits of the DRAM bus.
    dfi_databits : int
        Bits of one DFI phase's ``wrdata``/``rddata`` (ECP5DDRPHY: ``4 * databits``).
    nphases : int
        DFI phases.
    rdphase, wrphase : int
        The phases that carry read and write commands.
    bitslips, delays : int
        Read bitslip positions and read delay taps per lane.
    """

    modules: int
    databits: int
    dfi_databits: int
    nphases: int
    rdphase: int
    wrphase: int
    bitslips: int
    delays: int

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{f.name} must be an int, not {v!r}")
        if self.modules < 1 or self.databits != 8 * self.modules:
            raise ValueError(f"databits ({self.databits}) must be 8 x modules ({self.modules})")
        if self.dfi_databits < self.databits or self.dfi_databits % self.databits:
            raise ValueError(f"dfi_databits ({self.dfi_databits}) must be a multiple of databits ({self.databits})")
        if self.nphases < 1 or not (0 <= self.rdphase < self.nphases and 0 <= self.wrphase < self.nphases):
            raise ValueError(f"rdphase {self.rdphase}, wrphase {self.wrphase} must be phases of {self.nphases}")
        if self.bitslips < 1 or self.delays < 1:
            raise ValueError(f"bitslips ({self.bitslips}) and delays ({self.delays}) must be >= 1")

    @property
    def beats(self) -> int:
        """Beats of the burst in one phase's data (4 for ECP5DDRPHY)."""
        return self.dfi_databits // self.databits

    @classmethod
    def from_phy_settings(cls, phy) -> LevelingParams:
        """From a ``litedram.common.PhySettings`` (``hw.dram.hardware_settings(...)["phy"]``).

        Raises
        ------
        ValueError
            If the PHY does not do read leveling (``read_leveling`` false) or has no bitslips/delays.
        """
        if not getattr(phy, "read_leveling", False):
            raise ValueError(f"{getattr(phy, 'phytype', phy)!r} has no read leveling")
        return cls(modules=phy.databits // 8, databits=phy.databits, dfi_databits=phy.dfi_databits,
                   nphases=phy.nphases, rdphase=phy.rdphase, wrphase=phy.wrphase, bitslips=phy.bitslips,
                   delays=phy.delays)


#: the ECPIX-5 core's PHY (hw/boards/litedram/ecpix5.yml: ECP5DDRPHY, x16, 75 MHz: CL 6, CWL 5 at tCK 6.67 ns;
#: tests/hw/test_dram.py checks it against the generated core's settings)
ECPIX5_PARAMS = LevelingParams(modules=2, databits=16, dfi_databits=64, nphases=2, rdphase=0, wrphase=1,
                               bitslips=4, delays=8)


class LevelingError(RuntimeError):
    """Read leveling found no working setting for a lane (:attr:`module`), or the chosen one failed its
    check. :attr:`scans` holds that lane's bit errors per bitslip and tap."""

    def __init__(self, message: str, *, module: int, scans: Mapping):
        super().__init__(message)
        self.module = module
        self.scans = dict(scans)


@dataclasses.dataclass(frozen=True)
class LaneResult:
    """One lane's outcome.

    Attributes
    ----------
    module : int
    bitslip, delay : int
        The setting the lane was left at.
    window : tuple of (int, int)
        First and last working tap at that bitslip (inclusive).
    scans : dict of int to tuple of int
        Bitslip -> bit errors per delay tap (summed over :data:`SEEDS`; a missing burst counts 1 per seed).
    """

    module: int
    bitslip: int
    delay: int
    window: tuple
    scans: dict

    def format(self, delays: int) -> list:
        """Report lines: one scan line per bitslip (``.`` a working tap, ``x`` a failing one) and the choice."""
        out = []
        for b, errs in sorted(self.scans.items()):
            taps = "".join("." if e == 0 else "x" for e in errs)
            lo, hi = _longest_window(errs)
            win = f"window {lo}-{hi}" if hi >= lo else "no window"
            out.append(f"  m{self.module} b{b}: |{taps}| {win}")
        out.append(f"  m{self.module}: bitslip {self.bitslip}, delay {self.delay} "
                   f"(window {self.window[0]}-{self.window[1]} of {delays} taps)")
        return out


@dataclasses.dataclass(frozen=True)
class LevelingResult:
    """The outcome of :func:`read_leveling`: one :class:`LaneResult` per lane, in lane order."""

    lanes: tuple
    params: LevelingParams

    def format(self) -> str:
        """A text report (not run on hardware: the label is part of it)."""
        lines = ["read leveling (host-driven port of LiteX's procedure; not run on hardware):"]
        for lane in self.lanes:
            lines += lane.format(self.params.delays)
        return "\n".join(lines)


def required_csrs(params: LevelingParams = ECPIX5_PARAMS) -> tuple:
    """The CSR names :func:`read_leveling` reads or writes (all must be in the core's ``csr.json``)."""
    names = ["sdram_dfii_control", "ddrphy_dly_sel", "ddrphy_rdly_dq_rst", "ddrphy_rdly_dq_inc",
             "ddrphy_rdly_dq_bitslip_rst", "ddrphy_rdly_dq_bitslip", "ddrphy_burstdet_clr", "ddrphy_burstdet_seen"]
    for p in range(params.nphases):
        names += [f"sdram_dfii_pi{p}_{r}" for r in ("command", "command_issue", "address", "baddress", "wrdata",
                                                     "rddata")]
    return tuple(names)


def _longest_window(errors) -> tuple:
    """(first, last) of the longest run of zero entries in ``errors`` (the earliest of equal runs); (0, -1)
    when there is none."""
    best, start = (0, -1), None
    for i, e in enumerate(list(errors) + [1]):
        if e == 0 and start is None:
            start = i
        elif e != 0 and start is not None:
            if i - 1 - start > best[1] - best[0]:
                best = (start, i - 1)
            start = None
    return best


def _pattern(seed: int, params: LevelingParams) -> list:
    """One burst of pseudo-random data: ``nphases`` integers of ``dfi_databits`` bits (xorshift32 from
    ``seed``; any sequence with varied bits in every lane and beat does)."""
    x = (seed * 0x9E3779B1 + 0x7F4A7C15) & 0xFFFFFFFF or 1
    out = []
    for _ in range(params.nphases):
        v = 0
        for w in range(0, params.dfi_databits, 32):
            x ^= (x << 13) & 0xFFFFFFFF
            x ^= x >> 17
            x ^= (x << 5) & 0xFFFFFFFF
            v |= x << w
        out.append(v & ((1 << params.dfi_databits) - 1))
    return out


def _lane_bit_errors(expected: list, got: list, module: int, params: LevelingParams) -> int:
    """Bit errors in lane ``module``'s 8 bits of every beat of every phase."""
    errors = 0
    for e, g in zip(expected, got, strict=True):
        for k in range(params.beats):
            shift = k * params.databits + 8 * module
            errors += bin(((e ^ g) >> shift) & 0xFF).count("1")
    return errors


class _Leveler:
    """The procedure's steps on one register interface (module docstring)."""

    def __init__(self, regs: RegisterAccess, params: LevelingParams, wait: Callable[[int], None] | None,
                 settle_cycles: int, seeds: tuple):
        self.r, self.p, self._wait, self.settle, self.seeds = regs, params, wait, settle_cycles, seeds

    def wait(self) -> None:
        if self._wait is not None:
            self._wait(self.settle)

    def command(self, phase: int, command: int, *, address: int = 0, bank: int = 0) -> None:
        """Issue ``command`` on DFI phase ``phase`` through the injector (software control)."""
        self.r.write(f"sdram_dfii_pi{phase}_address", address)
        self.r.write(f"sdram_dfii_pi{phase}_baddress", bank)
        self.r.write(f"sdram_dfii_pi{phase}_command", command)
        self.r.write(f"sdram_dfii_pi{phase}_command_issue", 1)
        self.wait()

    def action(self, module: int, register: str) -> None:
        """Strobe ``ddrphy_<register>`` for lane ``module`` only, then resynchronise the lanes' DQS buffers."""
        self.r.write("ddrphy_dly_sel", 1 << module)
        self.r.write(f"ddrphy_{register}", 1)
        self.r.write("ddrphy_dly_sel", 0)
        self.r.write("ddrphy_dly_sel", (1 << self.p.modules) - 1)
        self.r.write("ddrphy_dly_sel", 0)

    def errors(self, module: int) -> int:
        """Bit errors of lane ``module`` over one write/read of every seed's burst (+1 per missing burst)."""
        p, total = self.p, 0
        for seed in self.seeds:
            data = _pattern(seed, p)
            self.command(0, DFII_COMMAND_RAS | DFII_COMMAND_CS)                      # activate bank 0 row 0
            for ph, v in enumerate(data):
                self.r.write(f"sdram_dfii_pi{ph}_wrdata", v)
            self.command(p.wrphase, DFII_COMMAND_CAS | DFII_COMMAND_WE | DFII_COMMAND_CS | DFII_COMMAND_WRDATA)
            self.r.write("ddrphy_burstdet_clr", 1)
            self.command(p.rdphase, DFII_COMMAND_CAS | DFII_COMMAND_CS | DFII_COMMAND_RDDATA)
            self.command(0, DFII_COMMAND_RAS | DFII_COMMAND_WE | DFII_COMMAND_CS)     # precharge bank 0
            got = [self.r.read(f"sdram_dfii_pi{ph}_rddata") for ph in range(p.nphases)]
            total += _lane_bit_errors(data, got, module, p)
            total += not (self.r.read("ddrphy_burstdet_seen") >> module) & 1
        return total

    def scan(self, module: int) -> list:
        """Bit errors per tap at the current bitslip, from tap 0 up (the delay is left at the last tap)."""
        self.action(module, "rdly_dq_rst")
        errs = []
        for d in range(self.p.delays):
            if d:
                self.action(module, "rdly_dq_inc")
            errs.append(self.errors(module))
        return errs

    def set(self, module: int, bitslip: int, delay: int) -> None:
        self.action(module, "rdly_dq_bitslip_rst")
        for _ in range(bitslip):
            self.action(module, "rdly_dq_bitslip")
        self.action(module, "rdly_dq_rst")
        for _ in range(delay):
            self.action(module, "rdly_dq_inc")

    def level(self, module: int) -> LaneResult:
        scans = {}
        self.action(module, "rdly_dq_bitslip_rst")
        for b in range(self.p.bitslips):
            if b:
                self.action(module, "rdly_dq_bitslip")
            scans[b] = tuple(self.scan(module))

        def rank(b):
            lo, hi = _longest_window(scans[b])
            return (hi - lo + 1, -sum(scans[b]), -b)

        best = max(scans, key=rank)
        lo, hi = _longest_window(scans[best])
        if hi < lo:
            raise LevelingError(f"read leveling: module {module} has no working read delay at any of "
                                f"{self.p.bitslips} bitslips ({self.p.delays} taps each; bit errors per tap: "
                                f"{scans})", module=module, scans=scans)
        delay = (lo + hi) // 2
        self.set(module, best, delay)
        check = self.errors(module)
        if check:
            raise LevelingError(f"read leveling: module {module} at bitslip {best}, delay {delay} (window {lo}-{hi})"
                                f" read {check} bit errors on its check", module=module, scans=scans)
        return LaneResult(module=module, bitslip=best, delay=delay, window=(lo, hi), scans=scans)


def read_leveling(regs: RegisterAccess, params: LevelingParams = ECPIX5_PARAMS, *,
                  wait: Callable[[int], None] | None = None, settle_cycles: int = 32,
                  seeds: tuple = SEEDS) -> LevelingResult:
    """Calibrate every lane's read bitslip and delay (module docstring). **Not run on hardware.**

    Call after the DRAM's power-up sequence (``hw.dram.init_writes``) and before traffic. The DFII is put
    under software control for the procedure and given back to the controller (``SEL``) at the end, also when
    it fails.

    Parameters
    ----------
    regs : RegisterAccess
        The core's CSRs by name (:class:`CSRBus`, or the link's register access).
    params : LevelingParams
        The PHY's layout (:data:`ECPIX5_PARAMS` for the ECPIX-5 core).
    wait : callable, optional
        ``wait(cycles)``: lets ``cycles`` controller cycles pass after each DFI command. Over a UART every
        register access already takes far longer than the DRAM needs (read latency 13 cycles at 75 MHz), so
        the default does nothing; a cycle-level simulation passes a clock wait.
    settle_cycles : int
        Cycles to wait after each command (default 32).
    seeds : tuple of int
        Test pattern seeds (default :data:`SEEDS`).

    Returns
    -------
    LevelingResult
        Per lane: the bitslip and delay chosen, the window, and the scans (:meth:`LevelingResult.format`).

    Raises
    ------
    LevelingError
        A lane has no working tap at any bitslip, or fails its check at the chosen setting; the message names
        the lane (``module <m>``).
    """
    if not isinstance(params, LevelingParams):
        raise TypeError(f"params must be a LevelingParams, not {params!r}")
    if not seeds:
        raise ValueError("seeds must not be empty")
    lv = _Leveler(regs, params, wait, settle_cycles, tuple(seeds))
    regs.write("sdram_dfii_control", DFII_CONTROL_SOFTWARE)
    try:
        for m in range(params.modules):
            lv.action(m, "rdly_dq_rst")
            lv.action(m, "rdly_dq_bitslip_rst")
        lanes = tuple(lv.level(m) for m in range(params.modules))
    finally:
        regs.write("sdram_dfii_control", DFII_CONTROL_SEL)
    return LevelingResult(lanes=lanes, params=params)


def load_csr_map(path: str | os.PathLike) -> dict:
    """The control-bus register map a bitstream's LiteDRAM core was built with, for :class:`CSRBus`.

    Parameters
    ----------
    path : str or os.PathLike
        The core's ``csr.json`` (``litedram_gen``'s output: ``{"csr_registers": {name: {"addr", "size",
        "type"}}, ...}``), or a bitstream's ``report.json`` that carries it as ``litedram.csr_registers``.

    Returns
    -------
    dict
        ``csr_registers``: name -> ``{"addr": int, "size": int, "type": "rw" | "ro"}``.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        Not JSON, or no register map in it, or an entry without an integer ``addr``/``size`` (the message says
        what the file must hold).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"CSR map {p}: no such file (the csr.json of the bitstream's LiteDRAM core)")
    try:
        doc = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"CSR map {p}: not JSON ({exc})") from exc
    regs = None
    if isinstance(doc, dict):
        regs = doc.get("csr_registers")
        if regs is None and isinstance(doc.get("litedram"), dict):
            regs = doc["litedram"].get("csr_registers")
    if not isinstance(regs, dict) or not regs:
        raise ValueError(f"CSR map {p}: no register map (a LiteDRAM core's csr.json has 'csr_registers'; a bitstream "
                         f"report.json carries it as 'litedram.csr_registers')")
    for name, v in regs.items():
        if not (isinstance(v, dict) and all(isinstance(v.get(k), int) and not isinstance(v.get(k), bool)
                                            and v[k] >= 0 for k in ("addr", "size"))):
            raise ValueError(f"CSR map {p}: register {name!r} needs integer 'addr' and 'size', got {v!r}")
    return regs


class CSRBus:
    """:class:`RegisterAccess` over 32-bit word accesses of a LiteDRAM core's Wishbone control bus.

    A register of ``size`` subregisters occupies ``size`` consecutive 32-bit words from its ``csr.json``
    address, most significant first (LiteX's default ``"big"`` CSR ordering, ``csr_data_width`` 32).

    Parameters
    ----------
    csr : str, os.PathLike or mapping
        The core's ``csr.json`` (path), or its ``csr_registers`` mapping: name -> ``{"addr", "size", "type"}``.
    read_word, write_word : callable
        ``read_word(byte_address) -> int`` and ``write_word(byte_address, value)`` of one 32-bit word.

    Raises
    ------
    KeyError
        On :meth:`read`/:meth:`write` of a name the core does not have.
    ValueError
        Writing a read-only register, or a value that does not fit the register.
    """

    def __init__(self, csr, read_word: Callable[[int], int], write_word: Callable[[int, int], None]):
        if isinstance(csr, (str, os.PathLike)):
            csr = json.loads(Path(csr).read_text())["csr_registers"]
        self._regs = {k: (int(v["addr"]), int(v["size"]), v.get("type", "rw")) for k, v in csr.items()}
        self._read_word, self._write_word = read_word, write_word

    @property
    def names(self) -> frozenset:
        return frozenset(self._regs)

    def _reg(self, name: str) -> tuple:
        if name not in self._regs:
            raise KeyError(f"the core has no CSR {name!r}")
        return self._regs[name]

    def read(self, name: str) -> int:
        addr, size, _ = self._reg(name)
        v = 0
        for i in range(size):
            v = (v << 32) | (self._read_word(addr + 4 * i) & 0xFFFFFFFF)
        return v

    def write(self, name: str, value: int) -> None:
        addr, size, kind = self._reg(name)
        if kind == "ro":
            raise ValueError(f"CSR {name!r} is read-only")
        if not 0 <= value < 1 << (32 * size):
            raise ValueError(f"{value:#x} does not fit CSR {name!r} ({32 * size} bits)")
        for i in range(size):
            self._write_word(addr + 4 * i, (value >> (32 * (size - 1 - i))) & 0xFFFFFFFF)
