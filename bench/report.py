#!/usr/bin/env python3
"""Generate ``docs/PERFORMANCE.md`` and its plots from the committed benchmark JSON.

Reads (each optional: a missing file gives a row that says "not yet measured" and which file would
fill it):

* ``bench/results/perf.json``   cycle-model predictions (``bench/bench_perf.py``): MODEL numbers
* ``bench/results/rtl.json``    cycles per token and stream efficiency of the Verilated RTL
  (``bench/bench_rtl.py``): SIMULATED (cycle-accurate RTL) numbers
* ``bitstreams/*/report.json``  Fmax and resources per board (nextpnr for ECP5: MEASURED by the tool;
  Yosys estimates for Xilinx parts: ESTIMATE)
* ``bench/results/synth.json``  Yosys utilisation estimates per component (``bench/bench_synth.py``)
* ``bench/results/gpu.json``    the H200 baseline (``bench/bench_gpu.py``): MEASURED
* ``bench/results/cpu.json``    golden vs reference vs PyTorch on this CPU (``bench/bench_cpu.py``): MEASURED
* ``bench/results/golden.json`` golden device speed incl. the 370M shape (``bench/bench_golden.py``): MEASURED

and computes the PROJECTED per-board decode rates at each board's design point (lanes, channels, bus width and
clock of :data:`hw.boards.facts.BOARDS`, the build its flow or bitstream builds) from the cycle model
(:func:`host.perf.token_prediction` on the shapes of ``perf.json``), the roofline of docs/ARCHITECTURE.md
section 4 (the table's peak bandwidths) and the activity power estimate of :mod:`host.power.estimate` (the
table's idle draw).

The output is a pure function of those files and the code (no timestamps, no machine state), so
``python -m bench.report`` run twice gives the same bytes; ``--check`` exits 1 when the committed
``docs/PERFORMANCE.md`` differs from what the JSON gives.

Usage::

    python -m bench.report                 # write docs/PERFORMANCE.md and docs/perf/*.png
    python -m bench.report --check         # compare only
    python -m bench.report --no-plots      # markdown only
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

from hw.boards.facts import BOARDS as FACTS

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "PERFORMANCE.md"
FIG_DIR = REPO / "docs" / "perf"
BITSTREAMS = REPO / "bitstreams"

#: the boards of docs/ARCHITECTURE.md section 4 (keys of hw.boards.facts.BOARDS, the one table of board facts),
#: in table order; each is projected at its design point (the build its flow or bitstream builds)
BOARD_ORDER = tuple(FACTS)
MODEL_SHAPES = ("370M", "1.3B", "2.7B")
#: share of non-zero trits assumed by the energy projection (uniform trits; trained models differ)
NONZERO_SHARE = 2 / 3

INPUTS = {
    "perf": ("bench/results/perf.json", "python -m bench.bench_perf"),
    "rtl": ("bench/results/rtl.json", "python -m bench.bench_rtl"),
    "rtl_layer370m": ("bench/results/rtl_layer370m.json", "python -m bench.bench_rtl --layer-370m"),
    "synth": ("bench/results/synth.json", "python -m bench.bench_synth"),
    "gpu": ("bench/results/gpu.json", "python3 -m bench.bench_gpu (on an H200)"),
    "gpu_1.3b": ("bench/results/gpu_1.3b.json", "python3 -m bench.bench_gpu --shape 1.3B (on an H200)"),
    "gpu_2.7b": ("bench/results/gpu_2.7b.json", "python3 -m bench.bench_gpu --shape 2.7B (on an H200)"),
    "cpu": ("bench/results/cpu.json", "python -m bench.bench_cpu"),
    "golden": ("bench/results/golden.json", "python -m bench.bench_golden"),
    "board_ulx3s_dram": ("bench/results/board_ulx3s_dram.json",
                         "MMFREE_DRAM_BENCH=1 python -m pytest -m sim sim/test_board_dram.py -k shipped_model"),
    "board_ecpix5_ddr3": ("bench/results/board_ecpix5_ddr3.json",
                          "MMFREE_DRAM_BENCH=1 python -m pytest -m sim sim/test_board_ddr3.py -k shipped_model"),
    "bram": ("bench/results/bram_370m.json", "python -m bench.bench_bram"),
    "ddr3_token_370m": ("bench/results/ddr3_token_370m.json", "python -m bench.bench_ddr3_token --w0-fifo-variant 1"),
}

# Published anchors (numbers are theirs, not ours), with the caveats that keep them comparable.
ANCHORS = [
    {"work": "MatMul-free LM (Zhu et al., arXiv 2406.02528 v1), FPGA", "short": "MatMul-free LM FPGA (1.3B, d=1024)",
     "hardware": "Intel FPGA PAC D5005",
     "model": "one d=512 block; 1.3B figure from the d=1024 row",
     "tokens_per_s": 23.8, "power_w": 13.0,
     "caveat": "one d=512 block took 43 ms at 60 MHz, near 13 W (close to the board's idle draw); its 23.8 "
               "tokens/s for the 1.3B model used the d=1024 row of its own table; at the real d=2048 the "
               "same design gives about 6 tokens/s"},
    {"work": "TeLLMe v2", "short": "TeLLMe v2 KV260 (other model)",
     "hardware": "AMD KV260", "model": "a different ternary model (not HGRN-Bit)",
     "tokens_per_s": 25.0, "power_w": 5.0,
     "caveat": "up to 25 tokens/s decode under 5 W; a different model, so tokens/s do not compare one to one"},
    {"work": "TerEffic", "short": "TerEffic 370M (on chip)", "hardware": "FPGA, weights fully on chip", "model": "370M",
     "tokens_per_s": 16300.0, "power_w": None,
     "caveat": "16,300 tokens/s for 370M with every weight on chip (no DRAM stream)"},
    {"work": "TerEffic", "short": "TerEffic 2.7B (HBM)", "hardware": "FPGA with HBM", "model": "2.7B",
     "tokens_per_s": 727.0, "power_w": 46.0,
     "caveat": "727 tokens/s for 2.7B with HBM at 46 W"},
]


# ------------------------------------------------------------------------------------------ loading
def load_inputs(root: Path = REPO) -> dict:
    """Every input JSON that exists under ``root`` (None for a missing or unreadable one), and the boards."""
    data: dict = {}
    for key, (rel, _) in INPUTS.items():
        p = root / rel
        try:
            data[key] = json.loads(p.read_text())
        except (OSError, ValueError):
            data[key] = None
    boards = {}
    bdir = root / "bitstreams"
    if bdir.is_dir():
        for p in sorted(bdir.glob("*/report.json")):
            try:
                boards[p.parent.name] = json.loads(p.read_text())
            except (OSError, ValueError):
                boards[p.parent.name] = None
    data["boards"] = boards
    return data


# ------------------------------------------------------------------------------------------ format
def fmt(x, digits: int = 3) -> str:
    """A number with ``digits`` significant figures (thousands separated), or an em dash for None."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if not isinstance(x, float) or not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    dec = max(0, digits - 1 - mag)
    return f"{x:,.{dec}f}"


def pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)


def rev(d: dict | None) -> str:
    """Short git revision of a result file (``-dirty`` kept), or "—"."""
    if not d:
        return "—"
    g = d.get("git")
    if isinstance(g, dict):
        s = g.get("describe") or g.get("revision") or "—"
    else:
        s = str(g or d.get("git_revision") or "—")
    head, _, tail = s.partition("-")
    return head[:10] + ("-" + tail if tail else "")


def missing(key: str) -> str:
    rel, cmd = INPUTS[key]
    return f"**not yet measured** (`{rel}` absent: run `{cmd}`)"


# ------------------------------------------------------------------------------------------ sections
def provenance_section(data: dict) -> str:
    rows = []
    for key, (rel, cmd) in INPUTS.items():
        d = data.get(key)
        if d is None:
            rows.append([f"`{rel}`", "missing", "—", f"`{cmd}`", "—", "—"])
            continue
        load = d.get("loadavg_start") or (d.get("speed") or {}).get("loadavg_1min_after_runs")
        if isinstance(load, list) and load:
            load = ", ".join(fmt(float(x), 2) for x in load[:3])
        mach = d.get("machine") or {}
        where = (d.get("gpu") or {}).get("name") if key.startswith("gpu") else mach.get("cpu")
        command = d.get("command_short") or d.get("command") or cmd
        if key == "synth" and "runs" in d:
            first = next(iter(d["runs"].values()), {})
            command, where = first.get("bench_command", cmd), "Yosys (no timing)"
        rows.append([f"`{rel}`", d.get("timestamp", "—"), f"`{rev(d) if key != 'synth' else rev_synth(d)}`",
                     f"`{command}`", where or "—", load or "—"])
    for b, rep in sorted(data["boards"].items()):
        rows.append([f"`bitstreams/{b}/report.json`", "—", f"`{rev(rep)}`", f"`{(rep or {}).get('command', '—')}`",
                     (rep or {}).get("tool", "nextpnr" if (rep or {}).get("fmax_mhz") else "—"),
                     ", ".join(fmt(float(x), 2) for x in (rep or {}).get("load_average", [])) or "—"])
    return table(["input", "timestamp (UTC)", "git revision", "command", "machine / tool", "load average"], rows)


def rev_synth(d: dict) -> str:
    first = next(iter(d.get("runs", {}).values()), {})
    return str(first.get("git", "—"))[:10] + ("-dirty" if "dirty" in str(first.get("git", "")) else "")


def _rtl_entries(rtl: dict) -> list[tuple[str, dict]]:
    """Every (label, entry) in rtl.json that carries RTL cycles per token (``cycles_per_token.hw``)."""
    out = []

    def walk(node, path):
        if isinstance(node, dict):
            cpt = node.get("cycles_per_token")
            if isinstance(cpt, dict) and "hw" in cpt:
                out.append((path, node))
                return
            for k, v in node.items():
                walk(v, f"{path}/{k}" if path else str(k))

    walk(rtl, "")
    return out


def cycles_section(data: dict) -> str:
    perf, rtl = data.get("perf"), data.get("rtl")
    parts = ["### Shipped model (`models/hgrn-bit-pydoc`), whole token\n"]
    rows = []
    if rtl is None:
        rows.append(["RTL (Verilator)", "—", missing("rtl"), "—", "—", "—", "simulated"])
    else:
        for label, e in _rtl_entries(rtl):
            b = e.get("build", {})
            build = f"{b.get('lanes')} lanes, {b.get('channels')} ch x {b.get('bus_bits')} bit"
            cpt, se = e["cycles_per_token"], e.get("stream_efficiency", {})
            exact = e.get("bit_exact_logits")
            rows.append([f"RTL (Verilator), `{label}`", build, fmt(int(cpt["hw"])), pct(se.get("hw")),
                         fmt(int(cpt["model"])) if cpt.get("model") is not None else "—",
                         pct(cpt.get("rel_diff")) + (", logits bit-exact" if exact else ", logits NOT bit-exact"),
                         "simulated (cycle-accurate RTL)"])
    if perf is None:
        rows.append(["cycle model", "—", missing("perf"), "—", "—", "—", "model"])
    else:
        for r in perf["predictions"].get("shipped", []):
            if r["packing"] != "1.6-bit":
                continue
            rows.append([f"cycle model, {r['schedule']} schedule",
                         f"{r['lanes']} lanes, {r['channels']} ch x {r['bus_bits']} bit", fmt(r["cycles_per_token"]),
                         pct(r["stream_efficiency"]), "—", f"binds: {r['binding']}", "model"])
    parts.append(table(["source", "build", "cycles/token", "stream efficiency", "model cycles",
                        "RTL vs model", "status"], rows))
    parts.append("\nStream efficiency = max(image bytes / (channels x beat bytes), trits / lanes) / cycles "
                 "(docs/ARCHITECTURE.md section 3). The `default` schedule is the one the RTL implements "
                 "(headers and constants prefetched); "
                 "`proposed` adds the schedule changes of docs/PERFORMANCE_MODEL.md (not in the RTL).\n")
    parts.append("### One layer of the 370M / 1.3B / 2.7B shapes (1.6-bit packing)\n")
    parts.append("A middle layer (all seven GEMVs of one block), at the boards' design points "
                 "(`hw/boards/facts.py`, the builds of the per-board projections below; the cycle model "
                 "`host.perf.token_prediction` on the shapes of `bench/results/perf.json`, which holds the whole "
                 "sweep of other builds and the whole-token figures).\n")
    rows = []
    layer370 = data.get("rtl_layer370m")
    for model in MODEL_SHAPES:
        if model == "370M" and layer370 is not None:
            for entry in layer370["builds"].values():
                b, lay = entry["build"], entry["tokens"][0]["layers"][0]
                rows.append([model, "RTL (Verilator), layer 0 of a 2-layer random model",
                             f"{b['lanes']} lanes, {b['channels']} ch x {b['bus_bits']} bit",
                             fmt(int(lay["cycles"]["hw"])), pct(lay["stream_efficiency"]["hw"]), lay["binding"],
                             "simulated" + ("" if entry["bit_exact_logits"] else " (NOT bit-exact)")])
            continue
        rows.append([model, "RTL (Verilator)", "—", "**not yet measured** (no layer run of this shape in "
                     "`bench/results/rtl.json`)" if rtl is not None else missing("rtl"), "—", "—", "simulated"])
        if perf is None:
            rows.append([model, "cycle model", "—", missing("perf"), "—", "—", "model"])
            continue
        shape = _shape(perf, model)
        for design, boards in _designs().items():
            for schedule in ("default", "proposed"):
                lay = design_prediction(shape, design, schedule)["layer"]
                rows.append([model, f"cycle model, {schedule} ({', '.join(boards)})", _build_text(design),
                             fmt(int(lay["cycles"])), pct(lay["stream_efficiency"]), lay["binding"], "model"])
    parts.append(table(["shape", "source", "build", "cycles/layer", "stream efficiency", "binds", "status"], rows))
    return "\n".join(parts)


def _resources(rep: dict) -> tuple[str, str]:
    """(resources text, status) of one board report, whatever its schema."""
    util = rep.get("utilisation") or rep.get("utilization")
    if isinstance(util, dict) and util:
        items = []
        for k, v in util.items():
            if isinstance(v, dict):
                items.append(f"{k} {v.get('used')}/{v.get('available')}")
            else:
                items.append(f"{k} {v}")
        return ", ".join(items), "measured (place and route report)"
    est = rep.get("estimate") or rep.get("resources")
    if isinstance(est, dict) and est:
        if est.get("status") not in (None, "ok"):
            return (f"**estimate not obtained** (`status: {est.get('status')}`; the reason is in the board's "
                    "`report.json`)", "ESTIMATE (Yosys synth, not run to completion)")
        inner = est.get("resources", est)
        items = [f"{k} {fmt(v) if isinstance(v, (int, float)) else v}" for k, v in inner.items()
                 if isinstance(v, (int, float, str)) and k not in ("note",)]
        return ", ".join(items[:10]), "ESTIMATE (Yosys synth, no vendor place and route)"
    return "—", "not reported"


def boards_section(data: dict) -> str:
    rows = []
    boards = data["boards"]
    names = [b for b in BOARD_ORDER if b not in boards] + sorted(boards)
    for b in sorted(set(names), key=lambda k: (k not in boards, k)):
        rep = boards.get(b)
        if rep is None:
            rows.append([b, "—", "—", f"**not yet built** (`bitstreams/{b}/report.json` absent)", "—", "—"])
            continue
        core = rep.get("core") or rep.get("params") or {}
        lanes = rep.get("lanes", core.get("lanes"))
        ch = rep.get("channels", core.get("channels"))
        bus = rep.get("bus_bits", core.get("bus_bits"))
        target = rep.get("target_mhz", rep.get("target_clock_mhz"))
        fmax = rep.get("fmax_mhz")
        if fmax is not None:
            fstat = "measured (nextpnr timing)" + ("" if rep.get("timing_met", True) else ", TIMING NOT MET")
        else:
            fstat = "not measured (vendor tool not run here)"
        res, rstat = _resources(rep)
        rows.append([f"{rep.get('title', b)}", f"{lanes} lanes, {ch} ch x {bus} bit",
                     f"{fmt(fmax)} MHz (target {fmt(target)})" if fmax is not None else f"— (target {fmt(target)} MHz)",
                     res, fstat, rstat])
    out = [table(["board", "core build", "Fmax", "resources", "Fmax status", "resources status"], rows)]
    synth = data.get("synth")
    out.append("\n#### Component utilisation estimates (`bench/results/synth.json`)\n")
    if synth is None:
        out.append(missing("synth"))
    else:
        srows = []
        for key, r in sorted(synth.get("runs", {}).items()):
            res = r.get("resources") or {}
            srows.append([f"`{key}`", r.get("status", "—"), fmt(res.get("luts")), fmt(res.get("ffs")),
                          fmt(res.get("carry")), fmt(res.get("bram")), fmt(res.get("dsp")),
                          "ESTIMATE (Yosys, no timing)"])
        out.append(table(["component/config/target", "status", "LUTs", "FFs", "carry", "BRAM", "DSP", "status"],
                         srows))
    return "\n".join(out)


def bram_section(data: dict) -> str:
    """The ECPIX-5 core's block RAM per buffer at each point of ``bench/results/bram_370m.json`` (DP16KD, LUT-RAM
    cells beside), the check against the committed build's nextpnr count, and the state-in-DRAM variants."""
    d = data.get("bram")
    if d is None:
        return missing("bram")
    points = d["points"]
    names = list(points)
    order: list[str] = []
    for n in names:
        order += [b["buffer"] for b in points[n]["buffers"] if b["buffer"] not in order]
    rows = []
    for buf in order:
        row = [buf]
        for n in names:
            b = next((b for b in points[n]["buffers"] if b["buffer"] == buf), None)
            cell = "—" if b is None else fmt(b["dp16kd"])
            if b is not None and b.get("lutram_cells"):
                cell += f" (+{b['lutram_cells']} LUT-RAM)"
            row.append(cell)
        rows.append(row)
    part = points[names[0]]["part_dp16kd"]
    rows.append([f"**total** (of {part})"] + [f"**{points[n]['total_dp16kd']}**" for n in names])
    head = ["buffer"]
    for n in names:
        pr = points[n].get("params", {})
        head.append(f"{n} ({pr.get('max_hidden', '?')}/{pr.get('max_intermediate', '?')}/{pr.get('max_layers', '?')})")
    out = [table(head, rows), ""]
    for n in names:
        c = points[n].get("check")
        if c:
            out.append(f"- `{n}` against the committed bitstream's nextpnr count: {c['nextpnr_dp16kd']} DP16KD, "
                       f"{'agrees' if c.get('agrees') else 'DIFFERS'}.")
    out.append(f"- Status: {d.get('label', '—')}; revision {rev(d)}.")
    return "\n".join(out)


_PACKINGS = {"1.6-bit": "BASE3", "2-bit": "BITS2"}


def _shape(perf: dict, model: str) -> tuple[int, int, int, int]:
    """``(hidden, intermediate, layers, vocab)`` of a model shape of ``perf.json``."""
    sh = perf["images"][model]["shape"]
    return (sh["hidden"], sh["intermediate"], sh["layers"], sh["vocab"])


def _build_text(design) -> str:
    return (f"{design.lanes} lanes, {design.channels} ch x {design.bus_bits} bit, q{design.quant_lanes}"
            + (", folded epilogue" if design.epilogue_folded else ""))


def _designs() -> dict:
    """Each distinct design point of :data:`hw.boards.facts.BOARDS` and the boards that build it."""
    out: dict = {}
    for key, f in FACTS.items():
        out.setdefault(f.design, []).append(key)
    return out


@functools.cache
def design_prediction(shape: tuple, design, schedule: str, packing: str = "1.6-bit") -> dict:
    """:func:`host.perf.token_prediction` of a model shape at a board's design point (``schedule`` ``"default"``:
    as built; ``"proposed"``: every schedule option of :meth:`hw.params.BuildParams.overlapped` on)."""
    from host.compiler import plan_shape
    from host.perf import token_prediction
    from hw.isa import TritPacking
    from hw.params import BuildParams

    kw = design.device_kwargs()
    build = BuildParams(**kw) if schedule == "default" else BuildParams.overlapped(**kw)
    prog = plan_shape(*shape, packing=TritPacking[_PACKINGS[packing]], channels=design.channels)
    return token_prediction(prog, build)


def project(data: dict, model: str = "370M", packing: str = "1.6-bit") -> list[dict]:
    """Projected decode rate and energy per board (PROJECTED: cycle model x clock x roofline x power estimate), each
    board at its design point (:data:`hw.boards.facts.BOARDS`: build and clock) with its peak bandwidths and idle."""
    from host.perf import roofline
    from host.power.estimate import IDLE, EstimateSource

    perf = data.get("perf")
    if perf is None:
        return []
    out = []
    # RTL cycles / model cycles of the shipped model per build: the model's error where the RTL was run
    rtl_ratios = {}
    if data.get("rtl"):
        for _, e in _rtl_entries(data["rtl"]):
            bb, cpt = e.get("build", {}), e["cycles_per_token"]
            if cpt.get("model"):
                rtl_ratios[(bb.get("lanes"), bb.get("channels"), bb.get("bus_bits"))] = cpt["hw"] / cpt["model"]
    shape = _shape(perf, model)
    h, i, layers, v = shape
    for b in BOARD_ORDER:
        facts = FACTS[b]
        design = facts.design
        rep = data["boards"].get(b) or {}
        core = rep.get("core") or rep.get("params") or {}
        built = (rep.get("lanes", core.get("lanes")), rep.get("channels", core.get("channels")),
                 rep.get("bus_bits", core.get("bus_bits")))
        if not rep:
            source = "design point (`hw/boards/facts.py`; no board report)"
        elif built == design.triple:
            source = f"design point (`hw/boards/facts.py`) = `bitstreams/{b}/report.json` build"
        else:
            source = (f"design point (`hw/boards/facts.py`); `bitstreams/{b}/report.json` holds another build "
                      f"({built[0]}x{built[1]}x{built[2]})")
        fmax = design.fmax_mhz
        measured = rep.get("fmax_mhz") if rep.get("timing_met") and built == design.triple else None
        fstat = (f"design clock; {fmt(float(measured))} MHz after routing" if measured
                 else "design clock (target, not yet timed)")
        for schedule in ("default", "proposed"):
            r = design_prediction(shape, design, schedule, packing)
            cycles = r["cycles"]
            img, trits = r["image_bytes"], r["trits"]
            rl = roofline(img, trits, design, facts)
            rates = {k: rl[k] for k in ("dram", "ports", "channels", "lanes")}
            cycles_rate = fmax * 1e6 / cycles
            tok_s = min(cycles_rate, rates["dram"], rates["ports"])
            limited = "cycles" if tok_s == cycles_rate else ("dram" if tok_s == rates["dram"] else "ports")
            activity = {"hw_cycles": cycles, "hw_trits": trits,
                        "hw_nonzero_trits": int(round(trits * NONZERO_SHARE)),
                        "hw_epilogue_elements": layers * (5 * h + 2 * i) + v + h,
                        "hw_stream_beats": int(math.ceil(img / (design.bus_bits / 8)))}
            src = EstimateSource(b, fmax_mhz=fmax, bus_bits=design.bus_bits)
            _, energy = src.token_energy(activity)
            e_dyn = energy["pl"] + energy["mem"]
            idle_w = IDLE[b]["total"].value
            duration = 1.0 / tok_s
            j_total = idle_w * duration + e_dyn
            ratio = rtl_ratios.get(design.triple)
            out.append({"board": b, "title": facts.title, "model": model, "packing": packing,
                        "rtl_over_model": ratio,
                        "tokens_per_s_rtl_corrected": (min(cycles_rate / ratio, rates["dram"], rates["ports"])
                                                       if ratio and schedule == "default" else None),
                        "schedule": schedule, "build": design.triple, "quant_lanes": design.quant_lanes,
                        "epilogue_folded": design.epilogue_folded, "build_source": source, "fmax_mhz": fmax,
                        "fmax_status": fstat, "cycles_per_token": cycles,
                        "stream_efficiency": r["stream_efficiency"], "roofline": rates,
                        "roofline_bound": rl["bound"], "roofline_binding": rl["binding"], "tokens_per_s": tok_s,
                        "limited_by": limited, "fits_dram": img <= facts.dram_mb * 2**20, "idle_w": idle_w,
                        "power_w": idle_w + e_dyn / duration,
                        "j_per_token": j_total, "j_per_token_above_idle": e_dyn, "tokens_per_j": 1.0 / j_total,
                        "tokens_per_j_above_idle": 1.0 / e_dyn if e_dyn > 0 else None})
    return out


def projection_section(data: dict, proj: list[dict]) -> str:
    if data.get("perf") is None:
        return missing("perf")
    rows = []
    for p in proj:
        lanes, ch, bus = p["build"]
        rl = p["roofline"]
        rows.append([p["title"], p["schedule"], f"{lanes}x{ch}x{bus}", f"{fmt(p['fmax_mhz'])} ({p['fmax_status']})",
                     fmt(p["cycles_per_token"]), fmt(p["tokens_per_s"]) + f" ({p['limited_by']})"
                     + ("" if p["fits_dram"] else "; the image does not fit the board's DRAM"),
                     f"{fmt(p['roofline_bound'])} ({p['roofline_binding']})",
                     " / ".join(fmt(rl[k]) for k in ("dram", "ports", "channels", "lanes")),
                     fmt(p["power_w"]), fmt(p["tokens_per_j"]), fmt(p["tokens_per_j_above_idle"]),
                     (f"{fmt(p['tokens_per_s_rtl_corrected'])} (x{p['rtl_over_model']:.4f})"
                      if p["tokens_per_s_rtl_corrected"] else "— (no RTL run of this build)")])
    t = table(["board", "schedule", "build (lanes x ch x bus)", "clock MHz", "cycles/token (model)",
               "**projected tokens/s**", "roofline tokens/s", "dram / ports / channels / lanes",
               "power W (estimate)", "tokens/J", "tokens/J above idle",
               "tokens/s with the RTL/model cycle ratio (shipped model, same build)"], rows)
    notes = ("\n\nAll numbers in this table are PROJECTED: the cycle model's cycles per token "
             "(`host.perf.token_prediction` at each board's design point; the RTL matches the model within the "
             "differences listed above for the shipped model), at the design clock (the clock the build targets: "
             "the PLL's on the ECP5 boards, whatever margin routing left), capped by DRAM and port bandwidth "
             "(`hw/boards/facts.py`, vendor peaks); power is the activity ESTIMATE of `host/power/estimate.py` "
             f"with its ASSUMED idle draw per board and {NONZERO_SHARE:.2f} of trits non-zero. Build source per "
             "board: " + "; ".join(sorted({f"{p['board']}: {p['build_source']}" for p in proj})) + ". "
             "No FPGA decode of the 370M model has been run.\n")
    return t + notes


def anchors_section(proj: list[dict]) -> str:
    rows = []
    for a in ANCHORS:
        tpj = a["tokens_per_s"] / a["power_w"] if a["power_w"] else None
        rows.append([a["work"], a["hardware"], a["model"], fmt(a["tokens_per_s"]), fmt(a["power_w"]),
                     fmt(tpj), "published", a["caveat"]])
    for p in proj:
        if p["schedule"] != "default":
            continue
        lanes, ch, bus = p["build"]
        rows.append([f"this project ({lanes}x{ch}x{bus}, {p['fmax_mhz']:g} MHz)", p["title"], "HGRN-Bit 370M",
                     fmt(p["tokens_per_s"]), fmt(p["power_w"]), fmt(p["tokens_per_j"]), "projected",
                     "cycle model x roofline x power estimate; not run on the board"])
    return table(["work", "hardware", "model", "decode tokens/s", "power W", "tokens/J", "status", "caveat"], rows)


def gpu_section(data: dict) -> str:
    g = data.get("gpu")
    if g is None:
        return missing("gpu")
    gi = g["gpu"]
    rows = []
    for name, e in g["variants"].items():
        if "error" in e:
            rows.append([f"`{name}`", f"failed: {e['error'][:60]}", "", "", "", "", ""])
            continue
        rows.append([f"`{name}`", fmt(e["tokens_per_s"]), fmt(e["energy_window"]["power_w"]),
                     fmt(e["j_per_token_total"]), fmt(e["j_per_token_above_idle"]), fmt(e["tokens_per_j_total"]),
                     fmt(e["tokens_per_j_above_idle"])])
    m = g["model"]
    idle, idle0 = g["idle"], g.get("idle_before_cuda")
    corr = g.get("correctness", {})
    rl = g["roofline"]
    window = min(e["energy_window"]["seconds"] for e in g["variants"].values() if "energy_window" in e)
    lines = [table(["variant", "tokens/s (median)", "power W", "J/token", "J/token above idle", "tokens/J",
                    "tokens/J above idle"], rows), "",
             f"MEASURED on one {gi['name']} (driver {gi['driver']}, PyTorch {gi['torch']}, CUDA {gi['cuda_runtime']}, "
             f"Triton {gi.get('triton', '—')}), batch 1, greedy decode kept on the GPU, 370M shape "
             f"({fmt(m['n_trits'])} trits) with **random weights**: {m['weights']}; speed does not "
             f"depend on the values, since every GEMV is dense. Weights: {m['weight_dtype']}, "
             f"{fmt(m['weight_bytes_per_token'] / 1e6)} MB read per token. The `eager` and `compile` variants "
             "launch every kernel from Python, so they also measure the GPU machine's host CPU "
             f"({g['machine'].get('cpu')}, {g['machine'].get('cpu_count')} cores).",
             "",
             "Kernels: " + "; ".join(f"{k}: {v}" for k, v in g["kernels"].items()) + ".",
             "",
             f"Energy: NVML total-energy counter over >= {fmt(window)} s of decoding per variant. Idle subtracted: "
             f"{fmt(idle['power_w'])} W (CUDA context alive, clocks up, after a pause); the GPU as found, before any "
             f"CUDA context, drew {fmt(idle0['power_w']) if idle0 else '—'} W "
             "(against that, J/token above idle is larger: "
             + ", ".join(f"{k} {fmt(e.get('j_per_token_above_idle_before_cuda'))}"
                         for k, e in g["variants"].items() if "error" not in e) + " J).",
             "",
             f"Roofline: {fmt(rl['copy_bandwidth_bytes_per_s'] / 1e12)} TB/s measured copy bandwidth gives a "
             f"memory-bound ceiling of {fmt(rl['memory_bound_tokens_per_s'])} tokens/s for bfloat16 weights; the best "
             f"variant reaches {pct(max((e.get('fraction_of_memory_bound') or 0) for e in g['variants'].values()))} of "
             "it: at batch 1 the step is a chain of ~170 small GEMVs and their elementwise kernels, bound by "
             "kernel latency, not by bandwidth. This is a framework baseline (cuBLAS and Inductor kernels), not a "
             "tuned ternary kernel: with 2-bit packed weights "
             f"({fmt(m['n_trits'] / 4 / 1e6)} MB a token) the same bandwidth would bound decode at "
             f"{fmt(rl['copy_bandwidth_bytes_per_s'] / (m['n_trits'] / 4))} tokens/s.",
             "",
             f"Check: the same PyTorch code on the shipped model in bfloat16 agrees with the float reference on "
             f"{pct(corr.get('greedy_token_agreement'))} of {corr.get('tokens', '—')} greedy tokens (logits "
             f"relative error median {fmt(corr.get('logits_rel_err_median'))}, "
             f"max {fmt(corr.get('logits_rel_err_max'))})."]
    big = []
    for key in ("gpu_1.3b", "gpu_2.7b"):
        d = data.get(key)
        if d is None:
            big.append([key.split("_")[1].upper(), "—", missing(key), "", "", "", "", ""])
            continue
        rl2 = d["roofline"]
        for name, e in d["variants"].items():
            if "error" in e:
                big.append([d["model"]["name"], f"`{name}`", f"failed: {e['error'][:60]}", "", "", "", "", ""])
                continue
            big.append([d["model"]["name"], f"`{name}`", fmt(e["tokens_per_s"]), fmt(e["energy_window"]["power_w"]),
                        fmt(e["j_per_token_total"]), fmt(e["tokens_per_j_total"]), fmt(e["tokens_per_j_above_idle"]),
                        f"{fmt(rl2['memory_bound_tokens_per_s'])} ({pct(e.get('fraction_of_memory_bound'))})"])
    lines += ["", "#### Larger released shapes on the same GPU\n",
              table(["shape", "variant", "tokens/s (median)", "power W", "J/token", "tokens/J", "tokens/J above idle",
                     "bfloat16 memory-bound tokens/s (reached)"], big),
              "", "MEASURED the same way (random weights of each shape, idle measured and subtracted in each run; "
              "only the `cuda_graph` and `compile_cuda_graph` variants). TerEffic's 2.7B HBM figure (727 tokens/s "
              "at 46 W, published) sits beside the 2.7B rows."]
    return "\n".join(lines)


def engine_summary(c: dict) -> str:
    """The golden engine's rates against PyTorch, the golden device and the C++ engine of issue 24."""
    cpu = c["machine"].get("cpu")
    cpp = c.get("cpp_engine_reference") or {}
    rows = []
    for label, sp, key in [("shipped model", c["speed"], "shipped")] + (
            [("370M shape" if c["random_370m"].get("full_370m") else "370M shape, fewer layers",
              c["random_370m"]["speed"], "random_370m")] if "random_370m" in c else []):
        med = sp["tokens_per_s_median"]
        goal = cpp.get(key) if key != "random_370m" or c["random_370m"].get("full_370m") else None
        n = sp["numba_threads"]["engine"]
        for dev, threads in (("engine_1thread", "1"), ("engine", f"{n} (pool while faster)"),
                             ("engine_pool", f"{n} (pool always)")):
            if dev not in med:
                continue
            rows.append([label, threads, fmt(med[dev]), f"{fmt(med[dev] / med['torch'], 2)}×",
                         f"{fmt(med[dev] / med['golden'], 2)}×",
                         f"{fmt(goal[0])} – {fmt(goal[1])}" if goal else "—",
                         f"{fmt(med[dev] / goal[1], 2)}× – {fmt(med[dev] / goal[0], 2)}×" if goal else "—"])
    loads = [x for sp in [c["speed"]] + ([c["random_370m"]["speed"]] if "random_370m" in c else [])
             for x in sp["loadavg_1min_after_runs"]]
    gains = [sp["tokens_per_s_median"]["engine_pool"] / sp["tokens_per_s_median"]["engine_1thread"]
             for sp in [c["speed"]] + ([c["random_370m"]["speed"]] if "random_370m" in c else [])
             if "engine_pool" in sp["tokens_per_s_median"]]
    threads_note = ""
    if gains and max(gains) < 1.1:
        threads_note = (f" Two threads gained nothing in this run (pool always ÷ one thread: "
                        f"{', '.join(fmt(g, 2) + '×' for g in gains)}): the 1-minute load average was "
                        f"{fmt(min(loads))} – {fmt(max(loads))} on {c['machine'].get('cpu_count')} cores, so "
                        "other jobs held the second core; the adaptive mode then costs next to nothing against one "
                        "thread.")
    return ("\n#### Golden engine (`host/devices/golden_engine.py`)\n\n"
            + table(["model", "numba threads", "engine tokens/s (median)", "÷ PyTorch (same run)",
                     "÷ golden device (same run)", "C++ engine tokens/s (issue 24)", "engine ÷ C++ engine"], rows)
            + f"\n\nMEASURED on {cpu} ({c['machine'].get('cpu_count')} logical cores, shared with other jobs; "
            f"OpenMP wait policy {c['settings'].get('omp_wait_policy')}, numba threading layer "
            f"{c['settings'].get('numba_threading_layer')}). The engine runs the golden device's image bit for bit "
            "(the same output packets and states, checked in the run and by `tests/test_golden_engine.py`): the "
            "whole token in one numba function, a table-lookup GEMV (one 256-entry table of partial sums per five "
            "codes, one load and one add per five trits) over row-aligned base-3 rows, and the GEMVs that share "
            "codes in one parallel region. The C++ engine's figures are issue 24's, measured on a 2-core Intel "
            "Xeon of this kind (not re-run here)." + threads_note)


def cpu_section(data: dict) -> str:
    c, gold = data.get("cpu"), data.get("golden")
    out = []
    if c is None:
        out.append(missing("cpu"))
    else:
        sp = c["speed"]
        med = sp["tokens_per_s_median"]
        rows = []
        for k in med:
            runs = sp["tokens_per_s_runs"][k]
            rows.append([f"`{k}`", c["devices"].get(k, ""), fmt(med[k]), f"{fmt(min(runs))} – {fmt(max(runs))}",
                         fmt(sp["tokens_per_cpu_s_median"][k])])
        load = sp["loadavg_1min_after_runs"]
        m = c["machine"]
        out.append(table(["device", "what", "tokens/s (median)", "range over runs", "tokens per CPU-second"], rows))
        chk = c.get("torch_check", {})
        out.append(f"\nMEASURED on {m.get('cpu')} ({m.get('cpu_count')} logical cores), shipped model, "
                   f"{sp['runs']} runs of {sp['steps_per_run']} teacher-forced steps rotating over the devices; "
                   f"numba threads {c['settings']['numba_threads']}, torch threads {c['settings']['torch_threads']}. "
                   f"**Machine shared with other jobs**: 1-minute load average "
                   f"{fmt(min(load))} – {fmt(max(load))} during the runs (start "
                   f"{fmt(c['loadavg_start'][0])}), so absolute numbers are pessimistic and the multi-threaded "
                   f"golden device suffers most. PyTorch vs float reference: argmax agreement "
                   f"{pct(chk.get('argmax_agreement'))} over {chk.get('tokens')} tokens, logits relative error "
                   f"median {fmt(chk.get('logits_rel_err_median'))}.")
    if c is not None and "random_370m" in c:
        r = c["random_370m"]
        sp = r["speed"]
        med = sp["tokens_per_s_median"]
        load = sp["loadavg_1min_after_runs"]
        shape = r["shape"]
        out.append(f"\n#### {'370M' if r.get('full_370m') else str(shape['num_hidden_layers']) + '-layer 370M'} "
                   "shape on this CPU (`bench/results/cpu.json`, `random_370m`)\n")
        out.append(table(["device", "tokens/s (median)", "range over runs", "tokens per CPU-second"],
                         [[f"`{k}`", fmt(v), f"{fmt(min(sp['tokens_per_s_runs'][k]))} – "
                           f"{fmt(max(sp['tokens_per_s_runs'][k]))}", fmt(sp["tokens_per_cpu_s_median"][k])]
                          for k, v in med.items()]))
        out.append(f"\nMEASURED on {c['machine'].get('cpu')}, random weights of the shape {shape} "
                   f"({sp['runs']} runs of {sp['steps_per_run']} steps rotating over the devices, load average "
                   f"{fmt(min(load))} – {fmt(max(load))}); the engine's output packets and states were checked "
                   f"identical to the golden device's on {r['engine_check']['tokens']} tokens first.")
    if c is not None and "engine" in c["speed"]["tokens_per_s_median"]:
        out.append(engine_summary(c))
    out.append("\n#### 370M shape, earlier golden-device run (`bench/results/golden.json`)\n")
    if gold is None or "random_370m" not in gold:
        out.append(missing("golden"))
    else:
        r = gold["random_370m"]
        med = r["speed"]["tokens_per_s_median"]
        load = r["speed"]["loadavg_1min_after_runs"]
        out.append(table(["device", "tokens/s (median)", "load average during runs"],
                         [[f"`{k}`", fmt(v), f"{fmt(min(load))} – {fmt(max(load))}"] for k, v in med.items()]))
        out.append(f"\nMEASURED, random weights of the 370M shape ({r['speed']['runs']} runs of "
                   f"{r['speed']['steps_per_run']} steps).")
    return "\n".join(out)


def summary_section(data: dict, proj: list[dict]) -> str:
    """One row per headline figure, each with its status and source file."""
    rows = []
    rtl = data.get("rtl")
    if rtl is None:
        rows.append(["stream efficiency, shipped model, RTL", missing("rtl"), "—", "simulated", "—"])
    else:
        for _, e in _rtl_entries(rtl):
            b = e.get("build", {})
            rows.append([f"stream efficiency, shipped model, RTL {b.get('lanes')}x{b.get('channels')}x"
                         f"{b.get('bus_bits')}", pct(e.get("stream_efficiency", {}).get("hw")),
                         f"{fmt(int(e['cycles_per_token']['hw']))} cycles/token", "simulated",
                         "`bench/results/rtl.json`"])
    for p in proj:
        if p["schedule"] == "default":
            lanes, ch, bus = p["build"]
            rows.append([f"370M decode, {p['title']} ({lanes}x{ch}x{bus}, {p['fmax_mhz']:g} MHz)",
                         f"{fmt(p['tokens_per_s'])} tokens/s", f"{fmt(p['tokens_per_j'])} tokens/J", "projected",
                         "`hw/boards/facts.py` design point, `host.perf` + power estimate"])
    rows += [_board_dram_row(data, key, title) for key, title in BOARD_DRAM_BENCHES]
    rows.append(_ddr3_token_row(data))
    g = data.get("gpu")
    if g is None:
        rows.append(["370M decode, H200 (PyTorch)", missing("gpu"), "—", "measured", "—"])
    else:
        ok = {k: e for k, e in g["variants"].items() if "tokens_per_s" in e}
        if ok:
            k, e = max(ok.items(), key=lambda kv: kv[1]["tokens_per_s"])
            rows.append([f"370M decode, H200, PyTorch `{k}`", f"{fmt(e['tokens_per_s'])} tokens/s",
                         f"{fmt(e['tokens_per_j_total'])} tokens/J ({fmt(e['tokens_per_j_above_idle'])} above idle)",
                         "measured", "`bench/results/gpu.json`"])
    for key in ("gpu_1.3b", "gpu_2.7b"):
        d = data.get(key)
        ok = {k: e for k, e in (d or {}).get("variants", {}).items() if "tokens_per_s" in e}
        if ok:
            k, e = max(ok.items(), key=lambda kv: kv[1]["tokens_per_s"])
            rows.append([f"{d['model']['name']} decode, H200, PyTorch `{k}`", f"{fmt(e['tokens_per_s'])} tokens/s",
                         f"{fmt(e['tokens_per_j_total'])} tokens/J ({fmt(e['tokens_per_j_above_idle'])} above idle)",
                         "measured", f"`{INPUTS[key][0]}`"])
    gold = data.get("golden")
    if gold and "random_370m" in gold:
        med = gold["random_370m"]["speed"]["tokens_per_s_median"]
        k = max(med, key=med.get)
        rows.append([f"370M decode, golden device on this CPU (`{k}`)", f"{fmt(med[k])} tokens/s", "—",
                     "measured (shared machine)", "`bench/results/golden.json`"])
    for a in ANCHORS:
        rows.append([f"{a['short']}, {a['hardware']}", f"{fmt(a['tokens_per_s'])} tokens/s",
                     f"{fmt(a['tokens_per_s'] / a['power_w'])} tokens/J" if a["power_w"] else "—", "published",
                     "see Published anchors"])
    return table(["figure", "rate", "efficiency", "status", "source"], rows)


#: the whole-board simulations' benchmarks: (input key, the board's title)
BOARD_DRAM_BENCHES = (("board_ulx3s_dram", "ULX3S DRAM board"), ("board_ecpix5_ddr3", "ECPIX-5 DDR3 board"))


def _board_clock_mhz(b: dict) -> str:
    """The simulated clocks of a board benchmark: the one clock (ULX3S), or core / controller (DDR3)."""
    c = b["clock"]
    if "controller_hz" in c:
        return f"{fmt(c['core_hz'] / 1e6)} MHz core, {fmt(c['controller_hz'] / 1e6)} MHz controller"
    return f"{fmt(c['simulated_hz'] / 1e6)} MHz"


def _board_dram_row(data: dict, key: str, title: str) -> list:
    """The summary row of a whole-board simulation's shipped-model benchmark (``sim/test_board_*.py``)."""
    b = data.get(key)
    if b is None:
        return [f"shipped model decode, {title}", missing(key), "—", "simulated", "—"]
    return [f"shipped model decode, {title} ({b['design_point']['lanes']} lanes, {_board_clock_mhz(b)}), greedy, "
            f"end to end", f"{fmt(b['tokens_per_s'])} tokens/s",
            f"DRAM read efficiency {pct(b['dram_read_efficiency'])}, {fmt(b['cycles_per_token'])} cycles/token",
            "simulated (whole board; link time a model)", f"`{INPUTS[key][0]}`"]


def _cycles_per_beat(b: dict) -> str:
    """Core cycles from a token's command to its status per 64-bit beat the DRAM delivered (the tokens' mean)."""
    beats = sum(t["read_bytes"] for t in b["tokens"]) / len(b["tokens"]) / 8
    return fmt(sum(t["cycles_to_status"] for t in b["tokens"]) / len(b["tokens"]) / beats)


def board_dram_section(data: dict) -> str:
    """The whole-board simulations side by side: clocks, DRAM read efficiency during tokens against the issues'
    85 %, cycles per token in each clock, refresh, the link model and tokens/s (all simulated but the link)."""
    head = ["", *(title for _, title in BOARD_DRAM_BENCHES)]
    boards = [data.get(key) for key, _ in BOARD_DRAM_BENCHES]

    def row(label: str, f) -> list:
        pairs = zip(boards, BOARD_DRAM_BENCHES, strict=True)
        return [label, *(f(b) if b is not None else missing(k) for b, (k, _) in pairs)]

    rows = [
        row("core build", lambda b: f"{b['design_point']['lanes']} lanes, {b['design_point']['quant_lanes']} "
                                    f"quantize lane{'s' if b['design_point']['quant_lanes'] != 1 else ''}"),
        row("clocks (simulated; the bitstream's PLL settings)", _board_clock_mhz),
        row("DRAM, controller", lambda b: f"{b['phy']['memtype']} {b['phy']['phytype']} rate 1:{b['phy']['nphases']},"
                                          f" {b['module']}, tRFC {b['timing_cycles']['tRFC']} / tREFI "
                                          f"{b['timing_cycles']['tREFI']} cycles"),
        row("DRAM read efficiency during tokens (mean / min)",
            lambda b: f"{pct(b['dram_read_efficiency'])} / {pct(b['dram_read_efficiency_min'])} of "
                      f"{fmt(b['peak_bytes_per_cycle'])} B/cycle"),
        row("issue goal (85 %) met", lambda b: "yes" if b["dram_read_efficiency"] >= 0.85 else "**no**"),
        row("cycles per greedy token, core clock", lambda b: fmt(b["cycles_per_token"])),
        row("cycles per greedy token, controller clock",
            lambda b: fmt(b.get("cycles_per_token_dram", b["cycles_per_token"]))),
        row("core cycles per 64-bit beat read (1: a beat a cycle into the core)", _cycles_per_beat),
        row("refresh commands during the tokens (all of them)",
            lambda b: f"{fmt(b['refresh_commands_during_tokens'])} in {len(b['tokens'])} tokens"),
        row("DFI timing violations", lambda b: fmt(b["timing_violations"])),
        row("link (model): baud, bytes and round trips per token",
            lambda b: f"{fmt(b['link_model']['baud'] / 1e6)} Mbaud, {fmt(b['link_model']['bytes_per_token'])} B, "
                      f"{fmt(b['link_model']['round_trips_per_token'])}"),
        row("board time / link time per token (ms)",
            lambda b: f"{fmt(b['board_s_per_token'] * 1e3)} / {fmt(b['link_model']['link_s_per_token'] * 1e3)}"),
        row("tokens/s end to end, greedy (simulated board + link model)", lambda b: fmt(b["tokens_per_s"])),
        row("tokens/s with logits", lambda b: fmt(b["tokens_per_s_logits"])),
        row("simulated on", lambda b: f"{b['sim'].get('lscpu_model_name')}, {rev(b)}"),
    ]
    return table(head, rows)


def _ddr3_token_row(data: dict) -> list:
    """The summary row of the 370M-shape token in the ECPIX-5 board's C++ harness (``sim/ddr3_token``)."""
    d = data.get("ddr3_token_370m")
    if d is None:
        return ["370M-shape token, ECPIX-5 DDR3 board logic", missing("ddr3_token_370m"), "—", "simulated", "—"]
    s, b = d["summary"], d["settings"]["build"]
    return [f"370M-shape token (random weights), ECPIX-5 DDR3 board logic ({b['lanes']} lanes, "
            f"{fmt(d['settings']['core_hz'] / 1e6)} MHz core, {fmt(d['settings']['dram_hz'] / 1e6)} MHz controller)",
            f"{fmt(s['tokens_per_s_simulated'])} tokens/s",
            f"DRAM read efficiency {pct(s['dram_efficiency_token'])}, {fmt(s['cycles_per_token'])} cycles/token, "
            f"bit-exact: {'yes' if s['bit_exact'] else '**no**'}",
            "simulated (board logic and DRAM controller; no link time)", f"`{INPUTS['ddr3_token_370m'][0]}`"]


def ddr3_token_section(data: dict) -> str:
    """The 370M-shape token of ``bench/results/ddr3_token_370m.json``: the board as built beside the one-entry
    weight-FIFO variant, against the cycle model."""
    d = data.get("ddr3_token_370m")
    if d is None:
        return missing("ddr3_token_370m")
    runs = [("the board as built", d["summary"])]
    if d.get("w0_fifo_variant"):
        runs.append(("one-entry weight FIFO (the board before 8366e7c)", d["w0_fifo_variant"]["summary"]))
    head = ["board", "core cycles", "cycle model", "ratio", "DRAM read efficiency", "tokens/s (simulated)",
            "bit-exact"]
    rows = [[name, fmt(s["cycles_per_token"]), fmt(s["model_cycles_per_token"]), fmt(s["hw_over_model"]),
             pct(s["dram_efficiency_token"]), fmt(s["tokens_per_s_simulated"]), "yes" if s["bit_exact"] else "**no**"]
            for name, s in runs]
    cpu = d.get("machine", {}).get("cpu", "—")
    out = table(head, rows) + f"\n\nSimulated on {cpu}, {rev(d)}; {d['summary']['label']}.\n"
    proj = ddr3_projection(data)
    if proj:
        out += ("\nProjected from that token: each shape's token on the same board logic takes the longer of the cycle "
                "model's core time (the token's build at its core clock) and the DRAM time (the image over the peak "
                f"of {fmt(proj[0]['peak_bytes_per_cycle'])} bytes per controller cycle at the simulated "
                f"{pct(proj[0]['efficiency'])}). The 370M row checks the method against the simulated token; the "
                "1.3B shape would also need buffers for its hidden size of 2048 (docs/DDR3.md), so no bitstream runs "
                "it.\n\n")
        out += table(["shape", "image bytes", "core time (cycle model)", "DRAM time", "tokens/s", "bound", "status"],
                     [[p["model"], fmt(p["image_bytes"]), f"{fmt(p['core_s'] * 1e3)} ms",
                       f"{fmt(p['dram_s'] * 1e3)} ms", fmt(p["tokens_per_s"]), p["bound"], "projected"]
                      for p in proj]) + "\n"
    return out


def ddr3_projection(data: dict) -> list[dict]:
    """The 370M and 1.3B shapes on the ECPIX-5's DDR3 board logic at the DRAM read efficiency of the simulated
    370M-shape token (``bench/results/ddr3_token_370m.json``), PROJECTED: a token takes the longer of
    :func:`host.perf.token_prediction`'s cycles at the token's core clock and its image's bytes over the DRAM's
    peak (DDR: ``databits`` x 2 transfers x ``nphases`` DRAM clocks per controller cycle, bytes) times that
    efficiency at the controller clock. Empty without that result or ``perf.json``'s shapes."""
    from hw.params import BuildParams

    d, perf = data.get("ddr3_token_370m"), data.get("perf")
    if d is None or perf is None:
        return []
    st = d["settings"]
    build = BuildParams.from_mapping(st["build"])
    phy = st["dram"]["phy"]
    peak = phy["databits"] * 2 * phy["nphases"] / 8
    eff = d["summary"]["dram_efficiency_token"]
    out = []
    for model in ("370M", "1.3B"):
        packing = next(k for k, v in _PACKINGS.items() if v == build.packing.name)
        r = design_prediction(_shape(perf, model), build, "default", packing)
        core_s = r["cycles"] / st["core_hz"]
        dram_s = r["image_bytes"] / (peak * st["dram"]["controller_clock_hz"] * eff)
        out.append({"model": model, "image_bytes": r["image_bytes"], "model_cycles": r["cycles"], "core_s": core_s,
                    "dram_s": dram_s, "tokens_per_s": 1 / max(core_s, dram_s),
                    "bound": "DRAM" if dram_s >= core_s else "core", "peak_bytes_per_cycle": peak, "efficiency": eff})
    return out


# ------------------------------------------------------------------------------------------ plots
def plots(data: dict, proj: list[dict], fig_dir: Path) -> list[str]:
    """Write the PNG plots (deterministic bytes: Agg, fixed size, no timestamp metadata); returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir.mkdir(parents=True, exist_ok=True)
    written = []
    meta = {"Software": None}

    # 1. decode tokens/s of the 370M shape (and anchors), log scale
    bars = []  # (label, value, status)
    for p in proj:
        bars.append((f"{p['board']} {p['schedule']}", p["tokens_per_s"], "projected"))
    g = data.get("gpu")
    if g:
        for k, e in g["variants"].items():
            if "tokens_per_s" in e:
                bars.append((f"H200 {k}", e["tokens_per_s"], "measured"))
    gold = data.get("golden")
    if gold and "random_370m" in gold:
        for k, v in gold["random_370m"]["speed"]["tokens_per_s_median"].items():
            bars.append((f"CPU {k}", v, "measured"))
    for a in ANCHORS:
        if a["model"] == "370M":
            bars.append((a["short"], a["tokens_per_s"], "published"))
    colors = {"projected": "#4c72b0", "measured": "#55a868", "published": "#c44e52"}
    if bars:
        fig, ax = plt.subplots(figsize=(8, 0.32 * len(bars) + 1.2), dpi=100)
        y = range(len(bars))
        ax.barh(list(y), [b[1] for b in bars], color=[colors[b[2]] for b in bars])
        ax.set_yticks(list(y), [b[0] for b in bars], fontsize=8)
        ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_xlabel("decode tokens/s, batch 1, 370M shape (log)")
        for s, c in colors.items():
            ax.bar(0, 0, color=c, label=s)
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(axis="x", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(fig_dir / "tokens_per_s_370m.png", metadata=meta)
        plt.close(fig)
        written.append("tokens_per_s_370m.png")

    # 2. stream efficiency: model vs RTL, shipped model, per build
    perf, rtl = data.get("perf"), data.get("rtl")
    if perf:
        preds = [r for r in perf["predictions"].get("shipped", []) if r["packing"] == "1.6-bit"]
        builds = sorted({(r["lanes"], r["channels"], r["bus_bits"]) for r in preds})
        fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
        xs = range(len(builds))
        for k, (sched, off) in enumerate((("default", -0.27), ("proposed", 0.0))):
            vals = [next((r["stream_efficiency"] for r in preds if (r["lanes"], r["channels"], r["bus_bits"]) == b
                          and r["schedule"] == sched), 0) for b in builds]
            ax.bar([x + off for x in xs], vals, width=0.27, label=f"model, {sched} schedule",
                   color=("#4c72b0", "#8172b2")[k])
        if rtl:
            hw = {}
            for _, e in _rtl_entries(rtl):
                b = e.get("build", {})
                hw[(b.get("lanes"), b.get("channels"), b.get("bus_bits"))] = e.get("stream_efficiency", {}).get("hw")
            vals = [hw.get(b) or 0 for b in builds]
            ax.bar([x + 0.27 for x in xs], vals, width=0.27, label="RTL (Verilator), simulated", color="#55a868")
        ax.set_xticks(list(xs), [f"{lanes}x{c}x{bb}" for lanes, c, bb in builds], fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("stream efficiency")
        ax.set_xlabel("build: lanes x channels x bus bits (shipped model, 1.6-bit)")
        ax.legend(fontsize=8, loc="lower left")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(fig_dir / "stream_efficiency_shipped.png", metadata=meta)
        plt.close(fig)
        written.append("stream_efficiency_shipped.png")

    # 3. tokens/J: projected boards vs GPU vs anchors
    pts = [(f"{p['board']} {p['schedule']} (370M)", p["tokens_per_j"], "projected") for p in proj]
    if g:
        pts += [(f"H200 {k} (370M)", e["tokens_per_j_total"], "measured") for k, e in g["variants"].items()
                if "tokens_per_j_total" in e]
    for key in ("gpu_1.3b", "gpu_2.7b"):
        d = data.get(key)
        e = (d or {}).get("variants", {}).get("compile_cuda_graph", {})
        if "tokens_per_j_total" in e:
            pts.append((f"H200 compile_cuda_graph ({d['model']['name']})", e["tokens_per_j_total"], "measured"))
    pts += [(a["short"], a["tokens_per_s"] / a["power_w"], "published") for a in ANCHORS
            if a["power_w"]]
    if pts:
        fig, ax = plt.subplots(figsize=(8, 0.32 * len(pts) + 1.2), dpi=100)
        y = range(len(pts))
        ax.barh(list(y), [p[1] for p in pts], color=[colors[p[2]] for p in pts])
        ax.set_yticks(list(y), [p[0] for p in pts], fontsize=8)
        ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_xlabel("tokens/J, whole board or card (log)")
        for s, c in colors.items():
            ax.bar(0, 0, color=c, label=s)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(axis="x", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(fig_dir / "tokens_per_j.png", metadata=meta)
        plt.close(fig)
        written.append("tokens_per_j.png")
    return written


# ------------------------------------------------------------------------------------------ document
def render(data: dict, figures: list[str] | None = None) -> str:
    """The whole of docs/PERFORMANCE.md as a string (a pure function of ``data`` and ``figures``)."""
    proj = project(data)
    figs = figures or []

    def fig(name: str, caption: str) -> str:
        return f"\n![{caption}](perf/{name})\n" if name in figs else ""

    s = []
    s.append("# Performance\n")
    s.append("<!-- Generated by `python -m bench.report` from the JSON listed under Sources; do not edit by hand. "
             "`make bench` re-runs the cheap benchmarks first. -->\n")
    s.append("Every number below says what it is:\n\n"
             "- **measured**: timed on real hardware (this project's CPU host, one H200 GPU), with the load "
             "recorded;\n"
             "- **simulated**: cycles counted by the cycle-accurate RTL (Verilator) running whole tokens, logits "
             "compared bit for bit with the golden device;\n"
             "- **model**: predicted by the cycle model `host/perf.py` (the schedule written down);\n"
             "- **projected**: model cycles x a clock x the board's bandwidth roofline and the activity power "
             "ESTIMATE (`host/power/estimate.py`), for boards on which nothing has run yet;\n"
             "- **published**: others' numbers, cited with their caveats.\n\n"
             "No FPGA board has decoded a token of the 370M, 1.3B or 2.7B models in this project yet: every "
             "board figure is projected, except the simulated 370M-shape token of the ECPIX-5's board logic "
             "(below), which no bitstream runs yet.\n")
    s.append("## Summary\n")
    s.append(summary_section(data, proj) + "\n")
    s.append("## DRAM boards, whole-board simulation (shipped model)\n")
    s.append("The board logic with the LiteDRAM controller and its DRAM model under Verilator, driven by the host's "
             "own driver (`sim/test_board_dram.py`, `sim/test_board_ddr3.py`): cycles are simulated, the link's "
             "time is a model (8N1 at the bitstream's rate plus a 1 ms USB round trip per reply waited for). "
             "Efficiency: DRAM bytes read per controller cycle from a token's command in to its status out, over "
             "the peak (one burst per tCCD). A 64-bit beat holds 40 trits (base-3): a core that takes more cycles "
             "per beat than the DRAM's peak allows is bounded by its own intake, and the DRAM waits.\n")
    s.append(board_dram_section(data) + "\n")
    s.append("## The 370M shape on the ECPIX-5's board logic: one simulated token\n")
    s.append("Random ternary weights at the 370M shape (hidden 1024, intermediate 2816, 24 layers, vocabulary 32,000) "
             "through `DRAMBoard` at the 128-bit port, the clock-domain crossings and LiteDRAM's DDR3 controller "
             "with its model, in a C++ Verilator harness (`sim/ddr3_token`); DRAM filled through a back door; the "
             "logits compared bit for bit with the golden device. The part's block RAM cannot hold this core "
             "until the recurrent state moves to DRAM (docs/DDR3.md), so no bitstream of this shape exists.\n")
    s.append(ddr3_token_section(data) + "\n")
    s.append("## Sources\n")
    s.append(provenance_section(data) + "\n")
    s.append("## Cycles per token and stream efficiency\n")
    s.append(cycles_section(data))
    s.append(fig("stream_efficiency_shipped.png", "stream efficiency per build, model and RTL"))
    s.append("\n## Fmax and resources per board\n")
    s.append(boards_section(data) + "\n")
    s.append("#### Block RAM per buffer, ECPIX-5 core (`bench/results/bram_370m.json`; synthesized, not placed)\n")
    s.append(bram_section(data) + "\n")
    s.append("## Projected decode rate and energy per board (370M, 1.6-bit)\n")
    s.append(projection_section(data, proj))
    s.append(fig("tokens_per_s_370m.png", "decode tokens/s at 370M: projected, measured, published"))
    s.append(fig("tokens_per_j.png", "tokens per joule"))
    s.append("\n## Published anchors beside ours\n")
    s.append(anchors_section(proj) + "\n")
    s.append("The anchors run other models, boards and setups; they place our projections, they do not rank them. "
             "The MatMul-free LM paper's FPGA result (arXiv 2406.02528 v1) is a single d=512 block at 60 MHz on an "
             "Intel D5005 near 13 W, close to the board's idle draw, and its 1.3B rate came from the d=1024 row "
             "of its own table (about 6 tokens/s at the real d=2048). TeLLMe v2 (KV260, under 5 W) decodes a "
             "different model. TerEffic's 16,300 tokens/s keep all 370M weights on chip, which removes the DRAM "
             "stream this design is built around; its 2.7B HBM figure (727 tokens/s at 46 W) is the closest to "
             "our Alveo U55C target.\n")
    s.append("## GPU baseline (H200)\n")
    s.append(gpu_section(data) + "\n")
    s.append("## CPU baseline (this machine)\n")
    s.append(cpu_section(data) + "\n")
    s.append("## Reproducing\n")
    s.append("- `python -m bench.report` regenerates this file and `docs/perf/*.png` from the committed JSON "
             "(deterministic: same JSON, same bytes); `python -m bench.report --check` verifies it.\n"
             "- `make bench` re-runs the cheap benchmarks, then the report: `bench/bench_perf.py` (cycle model, "
             "under a minute) and `bench/bench_cpu.py` (golden vs reference vs PyTorch, about 3-5 minutes on "
             "a 2-core machine). It only reads the others: `bench/bench_golden.py` (about 12 minutes, 370M "
             "golden decode), `bench/bench_rtl.py` (Verilator builds, tens of minutes), `bench/bench_synth.py` "
             "(Yosys, tens of minutes), `bitstreams/*/report.json` (`make bitstream BOARD=...`), and "
             "`bench/bench_gpu.py` (needs an H200: about 2.5 minutes there, "
             "`python3 -m bench.bench_gpu --out bench/results/gpu.json --git-revision $(git rev-parse HEAD)`; "
             "the committed result ran on a copy of `bench/`, `host/` and `models/hgrn-bit-pydoc` at the "
             "revision it records, without `.git`, so the revision is passed on the command line).\n")
    return "\n".join(s).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DOC)
    ap.add_argument("--fig-dir", type=Path, default=FIG_DIR)
    ap.add_argument("--root", type=Path, default=REPO, help="repository whose JSON to read")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 if --out differs from the generated text")
    args = ap.parse_args(argv)
    data = load_inputs(args.root)
    if args.check:
        figs = sorted(p.name for p in args.fig_dir.glob("*.png")) if args.fig_dir.is_dir() else []
        text = render(data, figs)
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'differs from the JSON'}", file=sys.stderr)
        return 0 if same else 1
    figs = [] if args.no_plots else plots(data, project(data), args.fig_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(data, figs))
    missing_inputs = [INPUTS[k][0] for k in INPUTS if data.get(k) is None]
    print(f"wrote {args.out}" + (f" and {len(figs)} plots" if figs else "")
          + (f"; missing (labelled not yet measured): {', '.join(missing_inputs)}" if missing_inputs else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
