#!/usr/bin/env python3
"""Peak memory and wall time of loading a checkpoint of the 2.7B shape (``ridger/MMfreeLM-2.7B``).

Writes a synthetic bfloat16 checkpoint (hidden 2560, intermediate 6912, 32 layers, vocabulary 32000:
about 5.4 GB, sharded like the released one) into a temporary directory, then loads it with
:func:`host.checkpoint.load_checkpoint` in a fresh subprocess and records that process's peak resident
set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) and wall time. Writing also runs in its own
subprocess and is measured the same way (it streams one tensor at a time). The loader keeps int8 trits,
so its floor is the trits plus the float32 embeddings and norms (``result_bytes``): about 2.95 GB for
the full shape, against 10.8 GB for every latent weight as float32.

The load reads files that were just written, so they are usually in the page cache: the wall time is
the CPU cost of decoding and ternarizing, not of a cold disk.

Usage::

    python -m bench.bench_checkpoint_memory                 # full 2.7B shape: ~5.4 GB of disk
    python -m bench.bench_checkpoint_memory --layers 4      # same widths, 4 layers (~1.1 GB)

Results go to ``bench/results/checkpoint_memory.json`` (``--out``): the command, git revision, machine,
shape, and the numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import REPO, command_line, git_info, machine_info, peak_rss_bytes, write_json

SHAPE_2P7B = {"hidden": 2560, "intermediate": 6912, "layers": 32, "vocab": 32000}


def make_config(args: argparse.Namespace):
    from host.model import HGRNBitConfig

    return HGRNBitConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                         intermediate_size=args.intermediate)


def child_write(args: argparse.Namespace) -> dict:
    from host.checkpoint import save_checkpoint
    from host.testing import random_tensors

    config = make_config(args)
    t0 = time.perf_counter()
    tensors = random_tensors(config, seed=args.seed, lazy=True, fast=not args.exact_random)
    save_checkpoint(args.dir, config, tensors, dtype=args.dtype, shard_size_bytes=args.shard_size_bytes)
    return {"wall_s": time.perf_counter() - t0, "peak_rss_bytes": peak_rss_bytes()}


def child_load(args: argparse.Namespace) -> dict:
    import numpy as np

    from host.checkpoint import load_checkpoint

    baseline = peak_rss_bytes()  # interpreter + numpy + host imports
    t0 = time.perf_counter()
    ckpt = load_checkpoint(args.dir)
    wall = time.perf_counter() - t0
    peak = peak_rss_bytes()
    w = ckpt.weights
    bls = [bl for _, bl in w.bitlinears()]
    arrays = [w.embeddings, w.norm, *(bl.trits for bl in bls), *(bl.norm for bl in bls)]
    arrays += [getattr(layer, n) for layer in w.layers for n in ("attn_norm", "g_norm", "mlp_norm")]
    if w.lower_bounds is not None:
        arrays.append(w.lower_bounds)
    trits = sum(bl.trits.size for bl in bls)
    assert trits == ckpt.config.n_trits
    nonzero = sum(np.count_nonzero(bl.trits) for bl in bls)
    return {"wall_s": wall, "peak_rss_bytes": peak, "baseline_rss_bytes": baseline,
            "result_bytes": int(sum(a.nbytes for a in arrays)), "n_trits": int(trits), "dtype": ckpt.dtype,
            "trits_nonzero_fraction": float(nonzero / trits)}


def run_child(phase: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "bench.bench_checkpoint_memory", "--_child", phase,
           "--dir", str(Path(args.dir).resolve()), "--layers", str(args.layers), "--hidden", str(args.hidden),
           "--intermediate", str(args.intermediate), "--vocab", str(args.vocab), "--dtype", args.dtype,
           "--seed", str(args.seed), "--shard-size-bytes", str(args.shard_size_bytes)]
    if args.exact_random:
        cmd.append("--exact-random")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)   # -m finds bench/ from REPO
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=SHAPE_2P7B["layers"], help="layers (default 32, the 2.7B)")
    p.add_argument("--hidden", type=int, default=SHAPE_2P7B["hidden"])
    p.add_argument("--intermediate", type=int, default=SHAPE_2P7B["intermediate"])
    p.add_argument("--vocab", type=int, default=SHAPE_2P7B["vocab"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shard-size-bytes", type=int, default=2_000_000_000, help="shard size (default 2 GB)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exact-random", action="store_true",
                   help="draw every value independently (slow); default tiles a pool of 1e6 normals")
    p.add_argument("--dir", type=Path, default=None, help="parent of the temporary checkpoint directory")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint directory")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "checkpoint_memory.json")
    p.add_argument("--_child", choices=["write", "load"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args._child:
        result = child_write(args) if args._child == "write" else child_load(args)
        print(json.dumps(result))
        return 0

    from host.checkpoint import checkpoint_shapes

    config = make_config(args)
    itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}[args.dtype]
    data_bytes = sum(math.prod(s) for s in checkpoint_shapes(config).values()) * itemsize
    parent = args.dir or Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(parent).free
    need = int(data_bytes * 1.05) + (1 << 30)
    if free < need:
        print(f"not enough disk in {parent}: {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed for "
              f"{args.layers} layers; use --layers to scale down or --dir elsewhere", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=parent))
    args.dir = work / "checkpoint"
    print(f"writing {data_bytes / 1e9:.2f} GB ({args.dtype}, {args.layers} layers) to {args.dir} ...",
          file=sys.stderr)
    try:
        write = run_child("write", args)
        files = sorted(args.dir.iterdir())
        on_disk = sum(f.stat().st_size for f in files)
        print(f"  written in {write['wall_s']:.1f} s, peak RSS {write['peak_rss_bytes'] / 1e9:.2f} GB; "
              "loading ...", file=sys.stderr)
        load = run_child("load", args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    overhead = load["peak_rss_bytes"] - load["baseline_rss_bytes"] - load["result_bytes"]
    full_shapes = checkpoint_shapes(make_config(argparse.Namespace(**SHAPE_2P7B)))
    is_full = (args.layers, args.hidden, args.intermediate, args.vocab) == tuple(
        SHAPE_2P7B[k] for k in ("layers", "hidden", "intermediate", "vocab"))
    same_widths = is_full or (args.hidden, args.intermediate, args.vocab) == tuple(
        SHAPE_2P7B[k] for k in ("hidden", "intermediate", "vocab"))
    full_result = sum(math.prod(s) * (1 if k.endswith("proj.weight") or k == "lm_head.weight" else 4)
                      for k, s in full_shapes.items())
    report = {
        "benchmark": "checkpoint_memory",
        "command": command_line(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": git_info(),
        "machine": machine_info(),
        "shape": {"vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
                  "num_hidden_layers": config.num_hidden_layers,
                  "intermediate_size": config.intermediate_size, "is_full_2p7b": is_full},
        "checkpoint": {"dtype": args.dtype, "bytes_on_disk": on_disk, "tensor_bytes": data_bytes,
                       "files": [f.name for f in files], "shard_size_bytes": args.shard_size_bytes,
                       "values": "independent normals" if args.exact_random else "tiled pool of 1e6 normals",
                       "float32_latent_bytes": data_bytes // itemsize * 4},
        "write": write,
        "load": {**load, "overhead_bytes": overhead,
                 "note": "files were just written: page cache warm; RSS counts only this process"},
        "full_2p7b": {
            "result_bytes": full_result,
            "disk_bytes": sum(math.prod(s) for s in full_shapes.values()) * 2,
            "estimated_peak_rss_bytes": (load["peak_rss_bytes"] if is_full else
                                         load["baseline_rss_bytes"] + full_result + overhead),
            "estimate": ("measured" if is_full else
                         "baseline + full-shape result + this run's transient overhead; the transient copies "
                         "depend on the largest tensors (widths, vocabulary), not on the layer count"
                         + ("" if same_widths else " - NOT representative: this run has other widths")),
        },
    }
    write_json(args.out, report)
    print(f"  loaded in {load['wall_s']:.1f} s, peak RSS {load['peak_rss_bytes'] / 1e9:.2f} GB "
          f"(baseline {load['baseline_rss_bytes'] / 1e9:.2f}, result {load['result_bytes'] / 1e9:.2f}, "
          f"overhead {overhead / 1e9:.2f}); wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
