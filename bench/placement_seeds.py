"""nextpnr placement estimates of one ECP5 build over several seeds, for two or more hw/ revisions side by side.

A placement-only build (``python -m hw.boards <board> ... --place-only``) reports nextpnr's timing estimate
after placement (``report.json``: ``clocks.*.placed_mhz``). One run's figure moves with the placer's seed by
more than most code changes move it, so a "before/after" of one seed says little; this collects the reports of
several seeds per revision and states each revision's runs, median, minimum and maximum, and the ratios of the
medians and of each seed's pair.

The builds themselves are run beforehand, each in a clean clone of its revision (the YoWASP tools see only
paths below their working directory)::

    git clone -q . /tmp/rev && git -C /tmp/rev checkout -q <rev>
    cd /tmp/rev && python -m hw.boards ecpix5-85f --freq-mhz 100 --lanes 32 --seed <s> --quant-lanes 4 \\
        --baud 2000000 --placer heap --place-only        # build/boards/ecpix5-85f/l32_q4_f100_s<s>_placed/

then::

    python -m bench.placement_seeds --label before /tmp/base/build/boards/ecpix5-85f/*_placed/report.json \\
        --label after /tmp/rev/build/boards/ecpix5-85f/*_placed/report.json --out placement_seeds_ecpix5.json

Every figure is nextpnr's estimate after placement (label "estimated (placement)"), not a routed Fmax.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench._common import RESULTS, provenance, write_json

__all__ = ["run_record", "summarise", "main"]

#: the fields of a build report that say what was built and how
_KEEP = ("board", "git_revision", "seed", "placer", "target_mhz", "build_seconds", "load_average", "command")


def run_record(report: dict) -> dict:
    """One placement-only build's record: what was built (:data:`_KEEP`) and its core clock's estimate (the clock
    whose ``role`` is ``core``, or the only clock of a report that names no roles).

    Raises
    ------
    ValueError
        If the report is not a placement-only build or has no core clock with ``placed_mhz``.
    """
    if report.get("status") != "placed":
        raise ValueError(f"not a placement-only build (status {report.get('status')!r})")
    clocks = list(report.get("clocks", {}).values())
    # reports before clock roles were recorded have one clock, the core's
    core = [c for c in clocks if c.get("role", "core" if len(clocks) == 1 else None) == "core" and "placed_mhz" in c]
    if len(core) != 1:
        raise ValueError("the report has no single core clock with a placement estimate")
    missing = [k for k in _KEEP if k not in report]
    if missing:
        raise ValueError(f"the report lacks {missing}")
    return {**{k: report[k] for k in _KEEP}, "placed_mhz": core[0]["placed_mhz"]}


def summarise(groups: dict[str, list[dict]]) -> dict:
    """Per label: the runs by seed, median, min, max; the ratios of each label's median to the first label's,
    and per seed present in both, of the pair.

    Raises
    ------
    ValueError
        If a label repeats a seed, or mixes boards, placers or targets with the first label.
    """
    labels = list(groups)
    ref = groups[labels[0]][0]
    out = {}
    for label, runs in groups.items():
        seeds = [r["seed"] for r in runs]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{label}: seed repeated in {seeds}")
        for r in runs:
            for k in ("board", "placer", "target_mhz"):
                if r[k] != ref[k]:
                    raise ValueError(f"{label}: {k} {r[k]!r} differs from {ref[k]!r}")
        mhz = [r["placed_mhz"] for r in runs]
        out[label] = {"runs": sorted(runs, key=lambda r: r["seed"]), "median_mhz": statistics.median(mhz),
                      "min_mhz": min(mhz), "max_mhz": max(mhz),
                      "spread": round(max(mhz) / min(mhz) - 1, 4)}
    base = out[labels[0]]
    by_seed = {r["seed"]: r["placed_mhz"] for r in base["runs"]}
    for label in labels[1:]:
        o = out[label]
        o["median_ratio"] = round(o["median_mhz"] / base["median_mhz"], 4)
        o["seed_ratios"] = {str(r["seed"]): round(r["placed_mhz"] / by_seed[r["seed"]], 4)
                            for r in o["runs"] if r["seed"] in by_seed}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.placement_seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", action="append", nargs="+", metavar=("LABEL", "REPORT"), required=True,
                    help="a label, then the report.json of each of its placement-only builds (repeat per revision)")
    ap.add_argument("--out", default="placement_seeds_ecpix5.json", help="file name in bench/results/")
    args = ap.parse_args(argv)
    groups = {}
    for label, *paths in args.label:
        if not paths:
            ap.error(f"--label {label}: no report.json given")
        try:
            groups[label] = [run_record(json.loads(Path(p).read_text())) for p in paths]
        except (OSError, ValueError) as e:
            print(f"placement_seeds: {label}: {e}", file=sys.stderr)
            return 1
    summary = summarise(groups)
    report = {**provenance("placement_seeds"), "label": "estimated (nextpnr timing after placement, not routed)",
              "groups": summary}
    path = write_json(RESULTS / args.out, report)
    for label, s in summary.items():
        runs = ", ".join(f"seed {r['seed']}: {r['placed_mhz']:.2f}" for r in s["runs"])
        ratio = f"; median ratio {s['median_ratio']:.3f}" if "median_ratio" in s else ""
        print(f"{label}: {runs}; median {s['median_mhz']:.2f} MHz{ratio}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
