"""The ECPIX-5 DDR3 token harness: whole tokens of the DRAM board in Verilator with the LiteDRAM DDR3 simulation core,
DRAM filled through a back door, driven by the host's own ECP5 driver (issue 23, docs/DDR3.md "What remains").

What is simulated (:func:`sim_top`, top module ``ddr3_token_sim``) is the logic of
:class:`hw.boards.ecp5.Ddr3Ecp5Top` less its PLLs, pins and UART:

- :class:`hw.boards.dram_board.DRAMBoard` (``port_width=128``, ``hold_port=True``) with the real core
  (:class:`hw.top.Accelerator`) at :func:`design_point` (the 370M build of the ECPIX-5 bitstream: its 64-bit base-3
  channel, the lanes and quantize lanes of ``hw.boards.ecp5.DDR3_BUILD``, the folded epilogue, capacities of the
  370M shape and the recurrent state in DRAM, served by the board's :class:`hw.boards.dram_board.StateEngine`), in
  ``sync`` at :data:`CORE_HZ`;
- :class:`hw.boards.ecp5.Ddr3Crossings` (the native port through :class:`hw.dram_cdc.NativePortCDC`, the control bus
  through :class:`hw.wishbone_cdc.WishboneCDC`, the status bits through synchronizers): two clocks as on the board;
- :class:`hw.dram.LiteDRAMCore` (``hold_port=True``) on the ECPIX-5 config's simulation core
  (:func:`hw.dram.generate_sim_core`: the LiteDRAM controller, ``SDRAMPHYModel`` with ECP5DDRPHY's rate-1:2
  settings and the ``MT41K256M16_4Gb`` timings, DFI timing checker on; the whole 512 MiB device), in ``dram`` at
  :data:`DRAM_HZ`.

The board's link byte streams (``rx``/``tx``) are the harness's: a byte a core cycle, no UART (at 2 Mbaud the
UART's 36 core cycles a byte matter only for the load, which the back door replaces). The C++ harness
(``harness.cpp``) runs the two clocks (:data:`CORE_PERIOD` and :data:`DRAM_PERIOD` units of 1 / :data:`TIME_UNIT_HZ`:
150 and 136 units of 1/10.2 GHz, exactly 68 and 75 MHz), queues link bytes, counts the DFI commands (the model's
``sim_monitor_*``) and writes the DRAM's bytes straight into the model's eight bank arrays (public through
``public.vlt``) at the controller's address mapping.

The host side is the real driver: :class:`Ddr3TokenDevice` is :class:`host.devices.ecp5.Ecp5Device` over
:class:`SimPort` (pyserial's ``read``/``write``/``timeout`` on the harness; ``timeout`` seconds are simulated
time, :data:`CORE_HZ` cycles a second), so every command, reply and token goes through
:class:`host.devices.ecp5.UartLink`'s encoding. Its transport (:class:`Ddr3TokenTransport`) replaces only the load:
the bytes :func:`host.devices.ecp5.dram_contents` lays out (the image at 0, the int32 table at the next 4 KiB) go
through the back door, then the layout's board registers and ``IMAGE_VALID`` over the link, as
:meth:`host.devices.ecp5.Ecp5Transport.load_model` writes them after its CRC check. The back door writes only
below the state region (``StateGeometry(max_hidden, max_layers).base(DRAM_BYTES)``, :mod:`hw.state_layout`: the
top 256 KiB of the 512 MiB at the 370M capacities), as the driver's load does (its ``state_reserve``); the region
starts as the DDR3 model's zeros, which the core never reads (the first token after reset fills no row). After
each token :func:`run_case` reads the committed bank's rows back through the back door and compares them with the
golden device's state.

The build (:func:`build`) is cached in ``build/ddr3_token/<key>/`` (the key hashes ``hw/**/*.py``, this package's
files, the design point and the tools) and serialised on a lock file there.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import math
import os
import re
import shutil
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from host.devices.base import DeviceError
from hw.boards.facts import BOARDS as BOARD_FACTS

__all__ = ["CORE_HZ", "DRAM_HZ", "TIME_UNIT_HZ", "CORE_PERIOD", "DRAM_PERIOD", "SHAPE_370M", "design_point", "sim_top",
           "build", "Build", "Harness", "SimPort", "Ddr3TokenTransport", "Ddr3TokenDevice", "COUNTERS",
           "dram_word_place"]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
HARNESS_CPP = HERE / "harness.cpp"
PUBLIC_VLT = HERE / "public.vlt"
TOP = "ddr3_token_sim"
BUILD_ROOT = Path(os.environ.get("MMFREE_DDR3_TOKEN_BUILD", ROOT / "build" / "ddr3_token"))

#: the core's clock (``sync``: the ECPIX-5's design point, ``hw.boards.facts``, which ``hw.boards.ecp5.DDR3_BUILD``
#: reads too), Hz, and the controller's (``dram``, the ECPIX-5 config's ``sys_clk_freq``)
CORE_HZ = round(BOARD_FACTS["ecpix5-85f"].design.fmax_mhz * 1e6)
DRAM_HZ = 75_000_000
#: the harness's time unit, Hz: the smallest in which both clocks have even periods (68 and 75 MHz: 10.2 GHz)
TIME_UNIT_HZ = 2 * math.lcm(CORE_HZ, DRAM_HZ)
#: the clocks' periods in that unit (68 MHz = 150 units, 75 MHz = 136 units of 1/10.2 GHz)
CORE_PERIOD, DRAM_PERIOD = TIME_UNIT_HZ // CORE_HZ, TIME_UNIT_HZ // DRAM_HZ
#: the 370M model's shape (ridger/MMfreeLM-370M config.json; as bench.bench_golden.SHAPE_370M)
SHAPE_370M = {"vocab_size": 32000, "hidden_size": 1024, "num_hidden_layers": 24, "intermediate_size": 2816}
#: the harness's counters ('N'), in order
COUNTERS = ("core_cycles", "dram_cycles", "ref", "act", "pre", "rd", "wr", "ref_max_gap", "rd_first", "rd_last",
            "rx_bytes", "tx_bytes", "sim_ns", "sim_cpu_ns", "construct_ns", "maxrss_kib", "init_done", "init_error",
            "rx_pending", "tx_pending")
#: the board's link byte time-out in the simulation, core cycles (the bitstream's default 2**24)
BYTE_TIMEOUT = 1 << 24


def design_point():
    """The core the harness builds: the 370M build as the ECPIX-5 bitstream makes it (``python -m hw.boards
    ecpix5-85f --dram --shape 370m``): the DDR3 top's channel (``hw.boards.ecp5.DEFAULT_PARAMS``: one 64-bit base-3
    channel, the folded epilogue) with :data:`hw.boards.ecp5.DDR3_BUILD`'s lanes (40: one base-3 beat, 40 trits, a
    cycle) and quantize lanes, the 370M shape's capacities (:data:`hw.boards.facts.CAPACITY_370M`: hidden 1024,
    intermediate 2816, 32 layers, the next power of two of 24) and the recurrent state in DRAM (``state_in_dram``:
    one layer's rows in :class:`hw.state_cache.StateCache`, both banks in the region
    :class:`hw.state_layout.StateGeometry` places at the top of the DRAM, served by the board's
    :class:`hw.boards.dram_board.StateEngine`), at :data:`CORE_HZ`.

    Returns
    -------
    hw.params.BuildParams
    """
    from hw.boards.ecp5 import DDR3_BUILD, DEFAULT_PARAMS, SHAPES
    from hw.params import BuildParams

    return BuildParams.from_mapping({**DEFAULT_PARAMS, "lanes": DDR3_BUILD["lanes"],
                                     "quant_lanes": DDR3_BUILD["quant_lanes"], **SHAPES["370m"],
                                     "fmax_mhz": CORE_HZ / 1e6})


def sim_top():
    """The simulated board's class (built lazily: it needs Amaranth).

    Its ``w0_fifo_depth`` (default None: the board as built, ``hw.boards.dram_board.W0_FIFO_DEPTH`` entries) is an
    experiment on the board without a change to ``hw/``: the entries of the FIFO that
    :class:`~hw.boards.dram_board.DRAMBoard` puts between its weight-stream mux and the core
    (``stream_register(m, "w0_fifo", ...)``; one entry passes a beat every other cycle, three or more a beat a
    cycle). Another depth is substituted while the board elaborates; the result is a variant of the board, labelled
    so wherever it is reported."""
    from amaranth.hdl import ClockDomain, ClockSignal, DomainRenamer, Module, ResetSignal
    from amaranth.lib import stream, wiring
    from amaranth.lib.wiring import In, Out, connect, flipped

    from hw import dram
    from hw.boards.dram_board import DRAMBoard
    from hw.boards.ecp5 import Ddr3Crossings

    class Ddr3TokenSim(wiring.Component):
        """:class:`hw.boards.ecp5.Ddr3Ecp5Top`'s logic on the DDR3 simulation core, with the link's byte streams
        as ports (module docstring).

        Members
        -------
        rx : In(stream.Signature(8)); tx : Out(stream.Signature(8))
            The board's link bytes (``sync``).
        dram_clk, dram_rst : In(1)
            The controller's clock and reset (reset both domains together: the crossings' FIFOs need it).
        init_done, init_error, irq : Out(1)
            The controller's power-up status (``dram``), the board's ``irq`` (``sync``).
        monitor : Out(hw.dram.sim_monitor_layout())
            The DDR3 model's DFI command counters (``dram``).
        """

        def __init__(self, core: dram.GeneratedCore, build, w0_fifo_depth: int | None = None):
            self._core, self._build, self._w0_depth = core, build, w0_fifo_depth
            byte = stream.Signature(8)
            super().__init__({"rx": In(byte), "tx": Out(byte), "dram_clk": In(1), "dram_rst": In(1),
                              "init_done": Out(1), "init_error": Out(1), "irq": Out(1),
                              "monitor": Out(dram.sim_monitor_layout())})

        def elaborate(self, platform):
            m = Module()
            core = self._core
            m.domains.dram = ClockDomain("dram")
            m.d.comb += [ClockSignal("dram").eq(self.dram_clk), ResetSignal("dram").eq(self.dram_rst)]
            m.submodules.dram = ctl = DomainRenamer({"sync": "dram"})(dram.LiteDRAMCore(core, hold_port=True))
            board_class = DRAMBoard if self._w0_depth is None else _w0_fifo_variant(DRAMBoard, self._w0_depth)
            m.submodules.board = board = board_class(build=self._build, addr_width=core.addr_width,
                                                   port_width=core.data_width, clock_hz=CORE_HZ, hold_port=True,
                                                   byte_timeout=BYTE_TIMEOUT)
            m.submodules.crossings = x = Ddr3Crossings(core.addr_width, core.data_width)
            connect(m, board.port, x.port)
            connect(m, board.ctrl, x.ctrl)
            connect(m, x.dram_port, ctl.port)
            connect(m, x.dram_ctrl, ctl.ctrl)
            connect(m, flipped(self.rx), board.rx)
            connect(m, board.tx, flipped(self.tx))
            m.d.comb += [x.port_enable.eq(board.port_enable), ctl.port_enable.eq(x.dram_port_enable),
                         x.init_done.eq(ctl.init_done), x.init_error.eq(ctl.init_error), x.pll_locked.eq(1),
                         board.dram_ready.eq(x.dram_ready), board.dram_error.eq(x.dram_error),
                         board.rx_overflow.eq(0), board.framing.eq(0),
                         self.init_done.eq(ctl.init_done), self.init_error.eq(ctl.init_error),
                         self.irq.eq(board.irq), self.monitor.eq(ctl.monitor)]
            return m

    return Ddr3TokenSim


def _w0_fifo_variant(board_class, w0_depth: int):
    """``board_class`` (DRAMBoard) whose ``w0_fifo`` has ``w0_depth`` entries (:func:`sim_top`): its module's
    ``stream_register`` is replaced while it elaborates."""
    import hw.boards.dram_board as db

    class W0Variant(board_class):
        def elaborate(self, platform):
            original = db.stream_register

            def register(m, name, src, dst, *, rst=None, depth=1):
                return original(m, name, src, dst, rst=rst, depth=w0_depth if name == "w0_fifo" else depth)

            db.stream_register = register
            try:
                return super().elaborate(platform)
            finally:
                db.stream_register = original

    return W0Variant


def as_built_w0_fifo_depth() -> int:
    """Entries of the board's weight-stream FIFO as ``hw/`` builds it (``hw.boards.dram_board.W0_FIFO_DEPTH``; 1
    before that constant existed)."""
    import hw.boards.dram_board as db

    return int(getattr(db, "W0_FIFO_DEPTH", 1))


def board_label(w0_fifo_depth: int | None) -> str:
    """How a result names the simulated board: as built, or the ``w0_fifo`` variant."""
    built = as_built_w0_fifo_depth()
    if w0_fifo_depth is None:
        return f"the board as built (DRAMBoard's w0_fifo: {built} entries)"
    return (f"variant, not the board in hw/: DRAMBoard's w0_fifo with {w0_fifo_depth} entries substituted in the "
            f"harness (hw/ builds {built})")


# ------------------------------------------------------------------------------------------- the back door
def _bank_arrays(verilog: str) -> list[str]:
    """The DDR3 model's bank arrays in the simulation core's Verilog, by bank: the ``mem*`` array that
    ``bankmodel<b>_write_port_adr`` addresses (``model_bankmodel<b>_...`` since the model sits inside the PHY
    wrapper of ``hw.dram._sim_phy_with_csrs``)."""
    found = dict(re.findall(r"^\s*(mem(?:_\d+)?)\[(?:model_)?bankmodel(\d+)_write_port_adr\]", verilog, re.M))
    by_bank = {int(b): name for name, b in found.items()}
    if sorted(by_bank) != list(range(len(by_bank))) or not by_bank:
        raise DeviceError(f"ddr3 token harness: bank arrays not found in the simulation core ({by_bank})")
    return [by_bank[b] for b in range(len(by_bank))]


def _geometry(core) -> dict:
    """The controller's mapping and the model's array geometry (``backdoor.h``'s ``MODEL_*``)."""
    from hw import dram

    s = dram.sim_settings(dram.ECPIX5_CONFIG)
    geom, phy, ctl = s["geom"], s["phy"], s["controller"]
    if ctl.address_mapping != "ROW_BANK_COL":
        raise DeviceError(f"ddr3 token harness: address mapping {ctl.address_mapping}, the back door knows "
                          f"ROW_BANK_COL")
    align = 3                                    # log2(burst length 8): DDR3 (litedram.core.controller)
    model_bl = 2                                 # SDRAMPHYModel's DDR3 burst_length (docs/DDR3.md)
    return {"COLW": geom.colbits - align, "ALIGN": align, "BANKBITS": geom.bankbits, "NCOLS": 1 << geom.colbits,
            "INDEX_SHIFT": (model_bl * phy.nphases).bit_length() - 1,
            "BYTES": (1 << core.addr_width) * (core.data_width // 8)}


def _monitor_words() -> dict[str, int]:
    """The 32-bit word of the ``monitor`` port that holds each of :func:`hw.dram.sim_monitor_layout`'s counters."""
    from hw import dram

    out = {}
    for name, field in dram.sim_monitor_layout():
        if field.offset % 32 or field.width != 32:
            raise DeviceError(f"ddr3 token harness: monitor field {name} is not a 32-bit word")
        out[name] = field.offset // 32
    return out


def dram_word_place(word: int, geom: dict) -> tuple[int, int]:
    """(bank, index in its array) of port word ``word`` (16 bytes at byte ``16 word``): the harness's
    ``word_place``, in Python for the tests."""
    col = (word & ((1 << geom["COLW"]) - 1)) << geom["ALIGN"]
    bank = (word >> geom["COLW"]) & ((1 << geom["BANKBITS"]) - 1)
    row = word >> (geom["COLW"] + geom["BANKBITS"])
    return bank, (row * geom["NCOLS"] | col) >> geom["INDEX_SHIFT"]


# ------------------------------------------------------------------------------------------- build
@dataclass(frozen=True)
class Build:
    """A built harness: the executable, its folder, the core and what the build took (``meta``: seconds of the
    Verilog conversion, Verilator, the C++ compile; sizes)."""

    exe: Path
    directory: Path
    core: Any
    params: Any
    meta: dict


def _key(core, params, toolchain, w0_fifo_depth: int | None) -> str:
    import amaranth

    h = hashlib.sha256()
    for p in sorted((ROOT / "hw").rglob("*.py")):
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    for p in (HARNESS_CPP, PUBLIC_VLT):
        h.update(p.read_bytes())
    for f in (sim_top, _w0_fifo_variant, _geometry, _bank_arrays, _monitor_words):   # this file's part of the build
        h.update(inspect.getsource(f).encode())
    h.update(json.dumps([core.directory.name, amaranth.__version__, params.gateware(), CORE_HZ, DRAM_HZ,
                         toolchain.version, BUILD_FLAGS, OPT_FAST, w0_fifo_depth]).encode())
    return h.hexdigest()[:16]


#: Verilator's flags (the DRAM benches' plus the C++ optimisation level below)
BUILD_FLAGS = ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-WIDTH", "--x-assign", "fast", "--x-initial", "fast",
               "--noassert"]
#: the C++ optimisation of the Verilated model (make's ``OPT_FAST``): -O1 keeps the compile of the 370M-shape core
#: short on a 2-core machine
OPT_FAST = os.environ.get("MMFREE_DDR3_TOKEN_OPT", "-O1")


def build(params=None, *, jobs: int = 2, w0_fifo_depth: int | None = None, log=print) -> Build:
    """Convert, Verilate and compile the harness for ``params`` (default :func:`design_point`), cached.
    A ``w0_fifo_depth`` (not None) builds the variant of :func:`sim_top` instead of the board as built.

    Raises
    ------
    DeviceError
        LiteDRAM, Verilator, a compiler or make missing, or a failed step (the log's tail in the message).
    """
    from host.devices.rtl_harness import find_toolchain
    from hw import dram

    if not dram.litedram_available():
        raise DeviceError("ddr3 token harness: LiteDRAM is not installed (pip install -e '.[dram]')")
    params = design_point() if params is None else params
    core = dram.generate_sim_core(dram.ECPIX5_CONFIG)
    tc = find_toolchain()
    root = BUILD_ROOT / _key(core, params, tc, w0_fifo_depth)
    root.mkdir(parents=True, exist_ok=True)
    obj = root / "obj"
    exe = obj / f"V{TOP}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = root / "build.json"
        if stamp.exists() and exe.exists():
            return Build(exe, root, core, params, json.loads(stamp.read_text()))
        meta: dict[str, Any] = {"params": params.gateware(), "w0_fifo_depth": w0_fifo_depth,
                                "board": board_label(w0_fifo_depth),
                                "core": core.directory.name, "opt_fast": OPT_FAST,
                                "verilator": tc.version.strip(), "jobs": jobs}
        vfile = root / f"{TOP}.v"
        if not vfile.exists():
            from amaranth.back import verilog

            t0 = time.perf_counter()
            text = verilog.convert(sim_top()(core, params, w0_fifo_depth), name=TOP)
            vfile.with_suffix(".tmp").write_text(text)
            vfile.with_suffix(".tmp").replace(vfile)
            meta["convert_s"] = round(time.perf_counter() - t0, 1)
            log(f"ddr3 token harness: Verilog in {meta['convert_s']} s ({vfile})")
        core_v = Path(core.verilog[0])
        banks = _bank_arrays(core_v.read_text())
        g = _geometry(core)
        if obj.exists():
            shutil.rmtree(obj)
        obj.mkdir()
        env = tc.env()
        env["MAKEFLAGS"] = f"CFG_CXXFLAGS_PCH_I=-include OPT_FAST={OPT_FAST}"
        t0 = time.perf_counter()
        cmd = [str(tc.verilator), "--cc", "--exe", "--top-module", TOP, *BUILD_FLAGS, "--Mdir", str(obj),
               "-CFLAGS", "-std=c++17", str(PUBLIC_VLT), str(vfile), *map(str, core.verilog), str(HARNESS_CPP)]
        _run(cmd, root, env, "verilator")
        meta["verilate_s"] = round(time.perf_counter() - t0, 1)
        rootfile = (obj / f"V{TOP}___024root.h").read_text()
        members = []
        for name in banks:
            hit = re.search(rf"\b(\w*__DOT__{name})\s*;", rootfile)
            if hit is None:
                raise DeviceError(f"ddr3 token harness: the bank array {name} is not public in {obj} (public.vlt)")
            members.append(hit.group(1))
        (obj / "backdoor.h").write_text(
            "// written by sim/ddr3_token/__init__.py (build): the DDR3 model's bank arrays and geometry\n"
            + "#define BACKDOOR_BANKS(X) " + " ".join(f"X({b}, {m})" for b, m in enumerate(members)) + "\n"
            + "".join(f"#define MODEL_{k} {v}ull\n" for k, v in g.items())
            + "".join(f"#define MON_{k.upper().removesuffix('_COUNT')} {v}\n" for k, v in _monitor_words().items()))
        log(f"ddr3 token harness: verilated in {meta['verilate_s']} s; compiling (make -j {jobs}, {OPT_FAST})")
        t0 = time.perf_counter()
        _run([tc.make, "-j", str(jobs), "-C", str(obj), "-f", f"V{TOP}.mk", f"V{TOP}"], root, env, "make")
        meta["compile_s"] = round(time.perf_counter() - t0, 1)
        meta["verilog_bytes"] = vfile.stat().st_size + core_v.stat().st_size
        meta["exe_bytes"] = exe.stat().st_size
        meta["banks"], meta["geometry"] = members, g
        stamp.write_text(json.dumps(meta, indent=1) + "\n")
        log(f"ddr3 token harness: compiled in {meta['compile_s']} s ({exe})")
        return Build(exe, root, core, params, meta)


def _run(cmd: list[str], cwd: Path, env: dict, what: str) -> None:
    log = cwd / f"{what}.log"
    with open(log, "w") as f:
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise DeviceError(f"ddr3 token harness: {what} failed (exit {done.returncode}); {log}:\n{tail}")


# ------------------------------------------------------------------------------------------- the process
class Harness:
    """A running harness process (``harness.cpp``: requests on its stdin, replies on its stdout).

    Parameters
    ----------
    built : Build
    core_period, dram_period : int
        The clocks' periods in one time unit (even; default :data:`CORE_PERIOD`, :data:`DRAM_PERIOD`).
    """

    def __init__(self, built: Build, *, core_period: int = CORE_PERIOD, dram_period: int = DRAM_PERIOD):
        self.built = built
        self._stderr = open(built.directory / f"stderr-{os.getpid()}.txt", "w+b")
        self._proc = subprocess.Popen([str(built.exe), "--core-period", str(core_period), "--dram-period",
                                       str(dram_period)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, bufsize=0)

    def _send(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
        except OSError as exc:
            raise DeviceError(f"ddr3 token harness died: {self._died()}") from exc

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            got = self._proc.stdout.read(n - len(buf))
            if not got:
                raise DeviceError(f"ddr3 token harness died: {self._died()}")
            buf += got
        return bytes(buf)

    def _died(self) -> str:
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "no reply"
        self._stderr.seek(0)
        return f"exit {self._proc.returncode}: {self._stderr.read().decode(errors='replace')[-2000:]}"

    def write_link(self, data: bytes) -> None:
        """Queue link bytes for the board's ``rx``."""
        self._send(b"W" + struct.pack("<I", len(data)) + bytes(data))

    def read_link(self, n: int, budget: int) -> bytes:
        """Run until ``n`` bytes from the board's ``tx`` are queued or ``budget`` core cycles passed; up to ``n``
        of them."""
        self._send(b"R" + struct.pack("<IQ", n, budget))
        k = struct.unpack("<I", self._recv(4))[0]
        return self._recv(k)

    def flush_link(self) -> None:
        self._send(b"F")

    def wait_init(self, budget: int = 10_000_000) -> int:
        """Run until the controller's ``init_done``; returns the core cycle count then.

        Raises
        ------
        DeviceError
            Not within ``budget`` core cycles."""
        self._send(b"I" + struct.pack("<Q", budget))
        ok, cycles = struct.unpack("<BQ", self._recv(9))
        if not ok:
            raise DeviceError(f"ddr3 token harness: no init_done within {budget} core cycles")
        return cycles

    def dram_write(self, addr: int, data: bytes | memoryview) -> None:
        """Back door: DRAM bytes ``[addr, addr + len(data))`` written into the model's arrays."""
        self._send(b"B" + struct.pack("<QQ", addr, len(data)))
        self._send(data)
        if self._recv(1) != b"b":
            raise DeviceError("ddr3 token harness: back-door write not acknowledged")

    def dram_read(self, addr: int, n: int) -> bytes:
        """Back door: DRAM bytes ``[addr, addr + n)`` from the model's arrays."""
        self._send(b"D" + struct.pack("<QQ", addr, n))
        return self._recv(n)

    def mark(self) -> None:
        """Start the read window (first and last DFI read command) again."""
        self._send(b"M")

    def counters(self) -> dict[str, int]:
        """The harness's counters (:data:`COUNTERS`): cycles of both clocks, the model's DFI commands (reads
        ``rd``: one 16-byte BL8 burst each), the read window's first and last controller cycle since
        :meth:`mark`, link bytes, simulation wall and CPU time (ns), the model's construction time, peak memory."""
        self._send(b"N")
        return dict(zip(COUNTERS, struct.unpack(f"<{len(COUNTERS)}Q", self._recv(8 * len(COUNTERS))), strict=True))

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write(b"Q")
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()


class SimPort:
    """pyserial's port interface (what :class:`host.devices.ecp5.UartLink` uses) on a :class:`Harness`: ``write``
    queues link bytes, ``read(n)`` runs the simulation until ``n`` bytes came or ``timeout`` seconds of simulated time
    (:data:`CORE_HZ` core cycles a second) passed."""

    def __init__(self, harness: Harness, *, timeout: float = 0.1):
        self.harness, self.timeout = harness, timeout

    def write(self, data: bytes) -> int:
        self.harness.write_link(bytes(data))
        return len(data)

    def read(self, n: int) -> bytes:
        return self.harness.read_link(n, max(1, int(self.timeout * CORE_HZ)))

    def reset_input_buffer(self) -> None:
        self.harness.flush_link()

    def close(self) -> None:
        pass


def _transport_class():
    from host.devices.ecp5 import Ecp5Transport

    class Ddr3TokenTransport(Ecp5Transport):
        """:class:`host.devices.ecp5.Ecp5Transport` whose load goes through the harness's back door (module
        docstring); everything else is the board's link."""

        harness: Harness | None = None

        def stage_model(self, image, table: np.ndarray, out_bytes: int) -> None:
            from host.devices.ecp5 import dram_contents
            from hw.boards.link_protocol import BoardReg, BoardStatus

            self.stream = bytes(image.raw)
            self.require_port("load a bundle into DRAM")
            t0 = time.monotonic()
            layout, data = dram_contents(self.stream, table)
            room = self.board[BoardReg.DRAM_BYTES] - self.state_reserve
            if layout.total_bytes > room:
                raise DeviceError(f"ddr3 token harness: the bundle needs {layout.total_bytes:,} bytes of DRAM, "
                                  f"{room:,} lie below the recurrent state's region")
            link = self.link
            link.board_write(BoardReg.STATUS, 0)
            self.harness.dram_write(0, data)
            for reg, value in layout.registers().items():
                link.board_write(reg, value)
            link.board_write(BoardReg.STATUS, int(BoardStatus.IMAGE_VALID))
            if not self.holds(layout):
                raise DeviceError("ddr3 token harness: the board's registers do not describe the loaded bundle")
            self.layout = layout
            self.backdoor_seconds = time.monotonic() - t0

    return Ddr3TokenTransport


def __getattr__(name: str):
    if name == "Ddr3TokenTransport":
        return _transport_class()
    if name == "Ddr3TokenDevice":
        return _device_class()
    raise AttributeError(name)


def _device_class():
    from host.devices.ecp5 import Ecp5Device

    class Ddr3TokenDevice(Ecp5Device):
        """The host's ECP5 driver on the simulated ECPIX-5 DDR3 board (:class:`Harness`): the port enabled (with
        ``level``: after the host's read leveling over the link, :meth:`host.devices.ecp5.Ecp5Transport.level`),
        the bundle loaded through the back door, tokens by id over the link.

        Parameters
        ----------
        harness : Harness
            Started and past ``init_done`` (:meth:`Harness.wait_init`) or not: the driver waits for
            ``DRAM_READY`` either way.
        level : bool
            Run the host's read leveling (the simulation core's CSR map) instead of writing ``PORT_ENABLE``
            (:attr:`leveling`: the :class:`host.leveling.LevelingResult`). The simulation core has no delay lines
            or bitslip (its read data arrive at a fixed latency), so every tap of every bitslip works and the
            procedure picks bitslip 0, delay 3, window 0-7 on both lanes: this exercises the CSR map, the DFI
            injector and the link's control-bus path, not the calibration. It found no tap before the simulation
            core flagged read data on every DFI phase (``hw.dram._sim_phy_with_csrs``): ``SDRAMPHYModel``
            (``litedram/phy/model.py``, 2024.12) assigns its one-bit read strobe to ``Cat`` of the phases'
            ``rddata_valid``, which raises phase 0's alone, so the DFI injector's phase-1 read register stayed 0.
        timeout : float
            Wall-clock seconds the driver waits for a reply (a token: 10 times that).
        """

        name = "ecp5"

        def __init__(self, harness: Harness, *, level: bool = False, timeout: float = 3600.0):
            super().__init__(serial=SimPort(harness), timeout=timeout, progress=False)
            old = self.transport
            self.transport = _transport_class()(old.port_name, old.baud, old.timeout, old._serial, progress=False)
            self.transport.harness = harness
            self.harness, self._level = harness, level
            self.leveling = None

        def connect(self, info=None):
            from hw.boards.link_protocol import BoardReg

            first = self.transport.link is None
            ident = super().connect(info)
            if first:
                if self._level:
                    from host.leveling import load_csr_map

                    csr = load_csr_map(Path(self.harness.built.core.directory) / "csr.json")
                    self.leveling = self.transport.level(csr)
                else:
                    self.transport.link.board_write(BoardReg.PORT_ENABLE, 1)
            return ident

    return Ddr3TokenDevice


# ------------------------------------------------------------------------------------------- a case
def compile_bundle(weights, params=None):
    """The image the driver would compile for the harness's core (one 64-bit base-3 channel, the released output
    gate), as a :class:`host.bundle.Bundle` both devices load, so that they run the same bytes.

    Returns
    -------
    host.bundle.Bundle
        ``image`` (bytes), ``embeddings`` ([V, H] int32, the residual format of the image's header).
    """
    from host.bundle import Bundle, embeddings_fixed
    from host.compiler import CompileOptions, compile_model
    from hw import isa

    params = design_point() if params is None else params
    options = CompileOptions(packing=params.packing, channels=params.channels, output_gate="released")
    image = compile_model(weights, options)
    frac = int(isa.unpack(isa.ImageHeader, image).residual_frac)
    return Bundle(image=image, embeddings=embeddings_fixed(weights.embeddings, frac), config=weights.config,
                  tokenizer_json=None, compile_options={"packing": params.packing.name.lower(),
                                                        "channels": params.channels, "output_gate": "released"})


def run_case(built: Build, bundle, token_ids, *, level: bool = False, crc_blocks: int = 3, log=print) -> dict:
    """Run ``token_ids`` (positions 0, 1, ...) on the harness and on the golden device; compare the logits bit for
    bit and measure each token.

    Parameters
    ----------
    built : Build
    bundle : host.bundle.Bundle
        :func:`compile_bundle`'s.
    token_ids : sequence of int
    level : bool
        Run the host's read leveling over the link (else ``PORT_ENABLE`` is written).
    crc_blocks : int
        64 KiB blocks of the loaded region (the first, the last and evenly spaced ones) whose CRC the board computes
        through the controller (``'C'``) and the host from the bytes it laid out: the back door's mapping checked
        against the controller's.

    Returns
    -------
    dict
        ``tokens``: per token ``bit_exact`` (logits equal), ``argmax`` (both devices'), ``cycles`` (core cycles of the
        harness from ``'T'`` queued to the output's last byte; ``dram_cycles`` likewise), ``hw_cycles`` (the core's
        ``CYCLES`` counter), ``model_cycles`` (:func:`host.perf.token_counters`' ``CYCLES`` for the image on the
        harness's build, every token alike: the model's token is a steady one, which with ``state_in_dram`` fills every
        layer's state row, and the first token after reset fills none), ``rd_bursts`` (DFI reads: 16 bytes each),
        ``read_window`` (controller cycles from the token's first DFI read to its last), ``efficiency_read_window`` and
        ``efficiency_token`` (bytes read over 8 bytes a controller cycle), ``tokens_per_s`` (simulated: :data:`CORE_HZ`
        over ``cycles``), ``sim_wall_s``, ``sim_cpu_s``, ``cycles_per_s`` (core cycles a wall second); and
        ``init_cycles``, ``backdoor_s``, ``crc_checked`` (blocks), ``leveling`` (the result's text, or None),
        ``leveling_lanes`` (per lane ``module``, ``bitslip``, ``delay``, ``window`` and ``scans``: bitslip -> bit errors
        per tap; or None), ``harness`` (its final counters). A build with ``state_in_dram`` adds per token
        ``state_bank`` (the bank the token's commit made current: 1 after the first token after reset, then alternating)
        and ``state_rows_equal`` (that bank's rows of the model's layers, read through the back door at
        :class:`hw.state_layout.StateGeometry`'s addresses, equal the golden device's state element for element; the
        rows past the model's hidden size are not compared).
    """
    import zlib

    from host.devices.ecp5 import dram_contents
    from host.devices.golden import GoldenDevice
    from host.perf import token_counters
    from hw.boards.link_protocol import BoardReg
    from hw.isa import Counter

    params = built.params
    gold = GoldenDevice(**params.device_kwargs())
    t0 = time.perf_counter()
    gold.load(bundle)
    log(f"golden device loaded in {time.perf_counter() - t0:.1f} s")
    # the golden device's own counters model a build of its device fields only (no capacities, no state_in_dram)
    image = gold.machine.image
    model_cycles = int(token_counters(image.instructions, image.info, params)[1][Counter.CYCLES])
    h = Harness(built)
    try:
        init = h.wait_init()
        dev = _device_class()(h, level=level)
        t0 = time.perf_counter()
        dev.load(bundle)
        load_s = time.perf_counter() - t0
        log(f"harness: init_done at core cycle {init}, bundle loaded through the back door in {load_s:.1f} s")
        layout, data = dram_contents(bytes(bundle.image), np.asarray(bundle.embeddings, dtype=np.int32))
        n_blocks = -(-layout.total_bytes // 65536)
        picks = sorted({0, n_blocks - 1, *np.linspace(0, n_blocks - 1, max(crc_blocks, 2)).astype(int).tolist()})
        for b in picks:
            a, n = b * 65536, min(65536, layout.total_bytes - b * 65536)
            n -= n % 8
            got = dev.link.dram_crc(a, n)
            if got != zlib.crc32(data[a:a + n]):
                raise DeviceError(f"ddr3 token harness: the board's CRC of DRAM [{a:#x}, {a + n:#x}) is {got:#010x}, "
                                  f"the laid-out bytes' {zlib.crc32(data[a:a + n]):#010x}: the back door's mapping is "
                                  f"not the controller's")
        out: dict[str, Any] = {"init_cycles": init, "load_s": round(load_s, 2), "crc_checked": len(picks),
                               "layout": {"image_bytes": layout.image_bytes, "embed_base": layout.embed_base,
                                          "total_bytes": layout.total_bytes},
                               "leveling": dev.leveling.format() if dev.leveling is not None else None,
                               "leveling_lanes": None if dev.leveling is None else [
                                   {"module": ln.module, "bitslip": ln.bitslip, "delay": ln.delay,
                                    "window": list(ln.window), "scans": {b: list(e) for b, e in ln.scans.items()}}
                                   for ln in dev.leveling.lanes],
                               "tokens": []}
        d_prev = dev.counters().get("hw_cycles", 0)
        for pos, tok in enumerate(token_ids):
            h.mark()
            c0 = h.counters()
            logits = dev.step(int(tok))
            c1 = h.counters()
            ref = gold.step(int(tok))
            d_now = dev.counters()["hw_cycles"]
            cycles, dcycles = c1["core_cycles"] - c0["core_cycles"], c1["dram_cycles"] - c0["dram_cycles"]
            rd = c1["rd"] - c0["rd"]
            window = c1["rd_last"] - c1["rd_first"] + 1 if rd else 0
            wall = (c1["sim_ns"] - c0["sim_ns"]) / 1e9
            r = {"position": pos, "token": int(tok), "bit_exact": bool(np.array_equal(logits, ref)),
                 "argmax": [int(np.argmax(logits)), int(np.argmax(ref))], "cycles": cycles, "dram_cycles": dcycles,
                 "hw_cycles": d_now - d_prev, "model_cycles": model_cycles, "rd_bursts": rd,
                 "read_window": window, "refresh": c1["ref"] - c0["ref"],
                 "efficiency_read_window": rd * 16 / (8 * window) if window else None,
                 "efficiency_token": rd * 16 / (8 * dcycles) if dcycles else None,
                 "tokens_per_s": CORE_HZ / cycles, "sim_wall_s": round(wall, 2),
                 "sim_cpu_s": round((c1["sim_cpu_ns"] - c0["sim_cpu_ns"]) / 1e9, 2),
                 "cycles_per_s": round(cycles / wall) if wall else None}
            if params.state_in_dram:
                r["state_bank"] = (pos + 1) % 2
                r["state_rows_equal"] = _state_rows_equal(h, params, dev.transport.board[BoardReg.DRAM_BYTES],
                                                          r["state_bank"], gold.save_state().payload)
            d_prev = d_now
            out["tokens"].append(r)
            log(f"token {pos} (id {tok}): bit-exact {r['bit_exact']}, argmax {r['argmax']}, {cycles:,} core cycles "
                f"(core counter {r['hw_cycles']:,}, model {r['model_cycles']:,}), read efficiency "
                f"{r['efficiency_read_window'] or 0:.4f} in the read window, {r['efficiency_token'] or 0:.4f} over the "
                f"token; {r['tokens_per_s']:.3f} tokens/s simulated; {wall:.1f} s wall, {r['cycles_per_s']} cycles/s"
                + (f"; state rows in DRAM bank {r['state_bank']} equal the golden state: {r['state_rows_equal']}"
                   if params.state_in_dram else ""))
        out["harness"] = h.counters()
        dev.close()
        return out
    finally:
        h.close()
        gold.close()


def _state_rows_equal(h: Harness, params, dram_bytes: int, bank: int, state: np.ndarray) -> bool:
    """Whether bank ``bank``'s rows in the harness's DRAM (:class:`hw.state_layout.StateGeometry` of ``params`` at
    the top of ``dram_bytes``; int32 little-endian) hold ``state`` (the golden device's, int64 [L, H]) in their first
    H elements."""
    from hw.state_layout import StateGeometry

    geo = StateGeometry(params.max_hidden, params.max_layers)
    base = geo.base(dram_bytes)
    n_layers, hidden = state.shape
    for layer in range(n_layers):
        row = np.frombuffer(h.dram_read(base + geo.offset(bank, layer), geo.row_bytes), dtype="<i4")[:hidden]
        if not np.array_equal(row.astype(np.int64), state[layer]):
            return False
    return True
