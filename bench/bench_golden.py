#!/usr/bin/env python3
"""Golden device decode speed and resident weight memory, side by side with the float reference.

Two models:

* **shipped**: ``models/hgrn-bit-pydoc`` (loaded with :func:`host.checkpoint.load_checkpoint`), decoding
  the first tokens of ``data/pydoc/heldout.txt``;
* **370M shape**: :func:`host.model.random_weights` of ``HGRNBitConfig(vocab_size=32000,
  hidden_size=1024, num_hidden_layers=24, intermediate_size=2816)`` (341 M trits), decoding random ids.

Speed
    Both devices run behind the :class:`~host.devices.base.Device` interface (``step``: the golden
    device builds the token packet, runs the whole image and decodes the output packet; the reference
    runs ``ReferenceModel.step``). After ``--warmup`` steps each (numba compilation, caches), ``--runs``
    timed runs of ``--steps`` steps alternate golden, reference, golden, ... so machine noise hits both
    alike; the decode continues across runs (one sequence, no reset). Reported: every run, the median
    tokens/s of each, the golden/reference ratio of the medians, each run's process CPU seconds and the
    load average (the machine is shared: other processes' load shows there). A third device, the
    golden device with ``numba.set_num_threads(1)``, joins the rotation: the GEMV kernel is
    ``prange``-parallel, and on a machine whose cores are busy its threads wait for each other.
    ``--budget-s`` caps the timed decoding per model: if the warm-up shows the requested steps would not
    fit, every run gets fewer steps (recorded as ``steps_reduced_to_fit_budget``).
Resident weights
    What the :class:`~host.devices.golden.GoldenMachine` holds besides the image buffer, measured two
    ways: ``tracemalloc`` around ``GoldenMachine(image)`` (bytes still allocated after construction,
    the image itself allocated before), and the sum of ``nbytes`` of every array the machine owns
    (weight blocks that are views of the image count zero; constants decoded to int64 count in full).
    The requirement is ``(len(image) + owned) / len(image) <= 1.1``. The float reference's resident
    weights (float32 trits, transposed) are reported for contrast. Host-side embeddings ([V, H]
    float32, looked up by the host and never sent to the accelerator) are listed separately.

Numba's parallel GEMV runs on its ``omp`` threading layer here (GNU libgomp), whose idle threads
spin before they sleep; on a machine whose cores are busy with other processes the spinning threads
take the cores from the working ones. ``OMP_WAIT_POLICY=passive`` (set before the process starts)
makes them sleep at once; the result file records such variables in ``command`` and ``environment``.

Usage::

    python -m bench.bench_golden                    # both models, 5 runs of 100 steps
    python -m bench.bench_golden --layers-370m 4    # fewer layers of the 370M shape
    OMP_WAIT_POLICY=passive python -m bench.bench_golden --out bench/results/golden_omp_passive.json

Results go to ``bench/results/golden.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from bench._common import REPO, RESULTS, peak_rss_bytes, provenance, write_json

MODEL = REPO / "models" / "hgrn-bit-pydoc"
HELDOUT = REPO / "data" / "pydoc" / "heldout.txt"
SHAPE_370M = {"vocab_size": 32000, "hidden_size": 1024, "num_hidden_layers": 24, "intermediate_size": 2816}
TARGET_TOKS = {"shipped": 100.0, "370m": 1.0}
MAX_HELD_RATIO = 1.1


def _root(a: np.ndarray):
    """The object that finally owns an array's memory (follows ``.base``)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def machine_owned_bytes(machine, image: bytes) -> dict:
    """Bytes of the arrays a GoldenMachine owns beyond the image buffer.

    Weight blocks are ``np.frombuffer`` views of the image (counted zero if their root is the image);
    constant vectors are slices of one int64 decode per instruction (the root counted once); the sigmoid
    table and trit-decode LUT are counted too.
    """
    seen: dict[int, int] = {}
    views = 0
    raw = machine.image.raw
    image_obj = raw.obj if isinstance(raw, memoryview) else raw

    def add(a) -> None:
        nonlocal views
        if a is None:
            return
        r = _root(a)
        if isinstance(r, memoryview):
            r = r.obj
        if r is image_obj or r is image:
            views += a.nbytes
            return
        seen.setdefault(id(r), r.nbytes if isinstance(r, np.ndarray) else len(r))

    for ins in machine.image.instructions:
        add(ins.qconst)
        for c in ins.consts:
            add(c)
        for b in ins.blocks:
            add(b)
        if getattr(ins, "trits", None) is not None:
            add(ins.trits)
    const_bytes = sum(seen.values())
    tables = int(machine.table.nbytes + machine._lut.nbytes)
    return {"owned_const_bytes": int(const_bytes), "tables_bytes": tables,
            "owned_bytes": int(const_bytes + tables), "weight_view_bytes": int(views),
            "image_shared_not_copied": bool(image_obj is image)}


def measure_machine(image: bytes) -> tuple[object, dict]:
    """Construct a GoldenMachine under tracemalloc; return it and the memory report."""
    from host.devices.golden import GoldenMachine

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    machine = GoldenMachine(image)
    wall = time.perf_counter() - t0
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    owned = machine_owned_bytes(machine, image)
    retained = current - before
    held = len(image) + max(retained, owned["owned_bytes"])
    return machine, {
        "image_bytes": len(image),
        "tracemalloc_retained_bytes": int(retained),
        "tracemalloc_construction_peak_bytes": int(peak - before),
        **owned,
        "held_bytes": int(held),
        "held_over_image": held / len(image),
        "target_max_ratio": MAX_HELD_RATIO,
        "meets_target": held / len(image) <= MAX_HELD_RATIO,
        "construct_s": wall,
        "note": "held = image + max(tracemalloc retained, owned arrays); construction peak is transient "
                "(parse and trit-code validation temporaries)",
    }


def token_working_set(device, token_id: int) -> dict:
    """Transient allocations of one decode step (vectors, codes, logits): tracemalloc peak above the
    steady state. Not weights: reported so the 1.1x figure is not mistaken for the whole footprint."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    device.step(token_id)
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"step_peak_bytes": int(peak - base), "step_retained_bytes": int(cur - base)}


def reference_weight_bytes(ref_device) -> dict:
    """Resident weights of the float reference: float32 trits of every BitLinear, and its norms."""
    m = ref_device._model
    bls = [p[k] for p in m._layers for k in ("i", "f", "g", "o", "gate", "down")] + [m._head]
    trits = sum(b.wt.nbytes for b in bls)
    gammas = sum(b.gamma.nbytes for b in bls)
    return {"float32_trit_bytes": int(trits), "bitlinear_gamma_bytes": int(gammas),
            "embedding_bytes": int(m.embeddings.nbytes)}


def decode_speed(devices: dict, tokens: np.ndarray, *, warmup: int, runs: int, steps: int,
                 budget_s: float | None = None) -> dict:
    """Alternate timed runs of ``steps`` decode steps over the devices; tokens/s per run and medians.

    ``devices`` maps a name to ``(device, numba_threads)``; ``numba.set_num_threads`` is applied around
    that device's runs (None: the default). Each run also records its process CPU seconds (all threads)
    and the 1-minute load average after it, so contention from other processes is visible. With
    ``budget_s``, the warm-up's pace decides whether ``steps`` must shrink (never below 10) for all the
    timed runs to fit the budget; the result says so.
    """
    import numba

    default_threads = numba.get_num_threads()
    pos = 0

    def take(n: int) -> np.ndarray:
        nonlocal pos
        out = np.take(tokens, np.arange(pos, pos + n), mode="wrap")
        pos += n
        return out

    def run(dev, threads, ids) -> tuple[float, float]:
        numba.set_num_threads(threads or default_threads)
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            for t in ids:
                dev.step(int(t))
            return time.perf_counter() - t0, time.process_time() - c0
        finally:
            numba.set_num_threads(default_threads)

    for dev, _ in devices.values():
        dev.reset()
    warm = take(max(warmup, 2))
    for dev, threads in devices.values():    # first step: JIT / cache load, not timed
        run(dev, threads, warm[:1])
    warm_s = sum(run(dev, threads, warm[1:])[0] for dev, threads in devices.values())
    requested = steps
    if budget_s and warm_s > 0:   # keep the whole comparison inside the budget on a loaded machine
        steps = max(10, min(steps, int(budget_s / runs / (warm_s / (warm.size - 1)))))
    per_run: dict[str, list[float]] = {k: [] for k in devices}
    cpu: dict[str, list[float]] = {k: [] for k in devices}
    load: list[float] = []
    for _ in range(runs):
        ids = take(steps)
        for name, (dev, threads) in devices.items():
            wall, cpu_s = run(dev, threads, ids)
            per_run[name].append(steps / wall)
            cpu[name].append(cpu_s)
        load.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in per_run.items()}
    return {"warmup_steps": warmup, "runs": runs, "steps_per_run": steps, "steps_requested": requested,
            "steps_reduced_to_fit_budget": steps < requested, "budget_s": budget_s,
            "numba_threads": {k: (t or default_threads) for k, (_, t) in devices.items()},
            "tokens_per_s_runs": per_run, "tokens_per_s_median": med,
            "cpu_s_runs": cpu,
            "tokens_per_cpu_s_median": {k: statistics.median(steps / c for c in v if c > 0) for k, v in cpu.items()},
            "loadavg_1min_after_runs": load,
            "golden_over_reference": med["golden"] / med["reference"]}


def bench_model(name: str, weights, tokens: np.ndarray, args) -> dict:
    from host.compiler import CompileOptions, calibrate, compile_model
    from host.devices.golden import GoldenDevice
    from host.devices.reference import ReferenceDevice

    cfg = weights.config
    t0 = time.perf_counter()
    formats = calibrate(weights)
    t_cal = time.perf_counter() - t0
    gold = GoldenDevice()
    gold.options = CompileOptions(formats=formats)
    t0 = time.perf_counter()
    gold.load(weights)                          # compile_model + GoldenMachine (parse, validate)
    t_load = time.perf_counter() - t0
    image = gold.machine.image.raw.obj          # the image bytes the device's machine holds
    assert isinstance(image, bytes) and image == compile_model(weights, gold.options)
    in_use = machine_owned_bytes(gold.machine, image)
    machine, mem = measure_machine(image)       # a second machine from the same bytes, under tracemalloc
    del machine
    mem["device_machine_owned_bytes"] = in_use["owned_bytes"]
    ref = ReferenceDevice()
    ref.load(weights)
    devices = {"golden": (gold, None), "reference": (ref, None)}
    if args.single_thread:
        gold1 = GoldenDevice()
        gold1.options = gold.options
        gold1.load(weights)
        devices["golden_1thread"] = (gold1, 1)
    speed = decode_speed(devices, tokens, warmup=args.warmup, runs=args.runs, steps=args.steps,
                         budget_s=args.budget_s)
    med = speed["tokens_per_s_median"]
    trit_bytes = int(sum(bl.trits.nbytes for _, bl in weights.bitlinears()))
    report = {
        "shape": {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
                  "num_hidden_layers": cfg.num_hidden_layers, "intermediate_size": cfg.intermediate_size,
                  "n_trits": cfg.n_trits},
        "calibrate_s": t_cal, "compile_and_load_s": t_load,
        "image": {"bytes": len(image), "packing": gold.machine.info.packing.name,
                  "bits_per_trit": 8 * len(image) / cfg.n_trits},
        "speed": speed,
        "golden_target_tokens_per_s": TARGET_TOKS[name],
        "golden_meets_speed_target": med["golden"] >= TARGET_TOKS[name],
        "golden_trits_per_s": med["golden"] * cfg.n_trits,
        "golden_memory": mem,
        "golden_step_working_set": token_working_set(gold, int(tokens[0])),
        "reference_memory": {**reference_weight_bytes(ref),
                             "over_image": reference_weight_bytes(ref)["float32_trit_bytes"] / len(image)},
        "int8_trit_bytes_in_ModelWeights": trit_bytes,
        "host_embedding_bytes": int(np.asarray(weights.embeddings).nbytes),
    }
    print(f"[{name}] golden {med['golden']:.2f} tok/s, reference {med['reference']:.2f} tok/s "
          f"(ratio {speed['golden_over_reference']:.2f}); image {len(image) / 1e6:.2f} MB, held "
          f"{mem['held_over_image']:.4f}x image; reference float32 trits "
          f"{report['reference_memory']['float32_trit_bytes'] / 1e6:.1f} MB", file=sys.stderr)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps-370m", type=int, default=None, help="steps per run for the 370M (default --steps)")
    p.add_argument("--layers-370m", type=int, default=SHAPE_370M["num_hidden_layers"],
                   help="layers of the 370M shape (default 24, the full model; 0 skips it)")
    p.add_argument("--no-single-thread", dest="single_thread", action="store_false",
                   help="skip the extra golden device run with numba.set_num_threads(1)")
    p.add_argument("--budget-s", type=float, default=300.0,
                   help="seconds of timed decoding per model; fewer steps per run if the warm-up is slow (0: off)")
    p.add_argument("--out", type=Path, default=RESULTS / "golden.json")
    args = p.parse_args(argv)

    import numba

    from host import compiler
    from host.checkpoint import load_checkpoint
    from host.model import HGRNBitConfig, random_weights

    report = provenance("golden")
    report["settings"] = {"runs": args.runs, "steps": args.steps, "warmup": args.warmup,
                          "numba_threads": numba.get_num_threads(),
                          "compiler.HEADROOM_BITS": compiler.HEADROOM_BITS,
                          "timer": "time.perf_counter around Device.step loops"}
    report["loadavg_start"] = os.getloadavg()
    t_all = time.perf_counter()

    ckpt = load_checkpoint(MODEL)
    text = HELDOUT.read_text(encoding="utf-8")
    ids = np.asarray(ckpt.tokenizer.encode(text, add_special_tokens=False).ids[:4096], dtype=np.int64)
    report["shipped"] = {"model": str(MODEL.relative_to(REPO)), "tokens": "data/pydoc/heldout.txt from the start",
                         **bench_model("shipped", ckpt.weights, ids, args)}

    if args.layers_370m > 0:
        shape = {**SHAPE_370M, "num_hidden_layers": args.layers_370m}
        t0 = time.perf_counter()
        w = random_weights(HGRNBitConfig(**shape), seed=0)
        t_build = time.perf_counter() - t0
        rids = np.random.default_rng(1).integers(0, shape["vocab_size"], 4096)
        a370 = argparse.Namespace(**{**vars(args), "steps": args.steps_370m or args.steps})
        r = bench_model("370m", w, rids, a370)
        full = args.layers_370m == SHAPE_370M["num_hidden_layers"]
        report["random_370m"] = {"weights": "host.model.random_weights(seed=0)", "tokens": "random ids (seed 1)",
                                 "build_s": t_build, "is_full_24_layers": full, **r}
        del w
    report["loadavg_end"] = os.getloadavg()
    report["numba_threading_layer"] = numba.threading_layer()
    report["process_peak_rss_bytes"] = peak_rss_bytes()
    report["wall_s"] = time.perf_counter() - t_all
    write_json(args.out, report)
    print(f"wrote {args.out} in {report['wall_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
