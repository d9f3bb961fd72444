#!/usr/bin/env python3
"""CPU baseline: golden device vs float reference vs PyTorch, decode tokens/s side by side in one run.

All three decode the shipped model (``models/hgrn-bit-pydoc``) on this machine's CPU, teacher-forced on
the first tokens of ``data/pydoc/heldout.txt``:

``golden``
    :class:`host.devices.golden.GoldenDevice`: the bit-exact integer ISS of the accelerator (numba GEMV
    on packed trits), behind the ``Device`` interface (token packet in, output packet out);
``golden_1thread``
    the same with ``numba.set_num_threads(1)`` (the parallel GEMV threads wait for each other on a busy
    machine);
``reference``
    :class:`host.devices.reference.ReferenceDevice`: the float32 numpy model (:mod:`host.reference`);
``torch``
    :class:`bench.torch_hgrn.TorchHGRNBit` on the CPU: float32 dense weights, ``torch.nn.functional.linear``
    per BitLinear, eager mode, ``torch.get_num_threads()`` intra-op threads, under ``torch.inference_mode``.

The timed runs rotate over the devices (golden, golden_1thread, reference, torch, golden, ...) so that
load from other processes hits all of them alike (:func:`bench_golden.decode_speed`); medians over
``--runs`` runs of ``--steps`` steps each, every run's tokens/s, CPU seconds and 1-minute load average
are recorded. Before timing, the PyTorch model's greedy tokens and logits are checked against the float
reference over ``--check-tokens`` tokens (recorded, not asserted: the numbers are only meaningful if they
agree).

Usage::

    python -m bench.bench_cpu                       # 5 runs of 100 steps each
    python -m bench.bench_cpu --runs 3 --steps 50

Results go to ``bench/results/cpu.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from bench._common import REPO, RESULTS, provenance, write_json

# The golden device's OpenMP wait policy (host/devices/golden.py), for every OpenMP runtime of the process:
# libgomp reads it once, when it starts, and torch starts it first here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402 - imported after OMP_WAIT_POLICY is set (its BLAS may start OpenMP)

MODEL = REPO / "models" / "hgrn-bit-pydoc"
HELDOUT = REPO / "data" / "pydoc" / "heldout.txt"


class TorchDevice:
    """The two methods of the ``Device`` interface that :func:`bench_golden.decode_speed` uses, over
    :class:`torch_hgrn.TorchHGRNBit` (teacher-forced: ``step`` sets the input token, then decodes)."""

    name = "torch"

    def __init__(self, weights):
        import torch

        from bench.torch_hgrn import TorchHGRNBit

        self._torch = torch
        self.model = TorchHGRNBit(weights, device="cpu", weight_dtype=torch.float32)

    def reset(self) -> None:
        self.model.reset(0)

    def step(self, token_id: int) -> np.ndarray:
        with self._torch.inference_mode():
            self.model.token.fill_(int(token_id))
            self.model.step()
            return self.model.logits.numpy()


def check_torch(weights, ids: np.ndarray, tokens: int) -> dict:
    """Teacher-forced comparison of PyTorch and float-reference logits over ``tokens`` tokens."""
    from host.reference import ReferenceModel

    ref = ReferenceModel(weights)
    dev = TorchDevice(weights)
    dev.reset()
    state = ref.init_state()
    errs, agree = [], 0
    for t in ids[:tokens]:
        lr, state = ref.step(int(t), state)
        lt = dev.step(int(t))
        errs.append(float(np.linalg.norm(lt - lr) / np.linalg.norm(lr)))
        agree += int(np.argmax(lt) == np.argmax(lr))
    return {"tokens": int(min(tokens, ids.size)), "argmax_agreement": agree / min(tokens, ids.size),
            "logits_rel_err_median": statistics.median(errs), "logits_rel_err_max": max(errs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--check-tokens", type=int, default=64)
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="seconds of timed decoding; fewer steps per run if the warm-up is slow (0: off)")
    p.add_argument("--out", type=Path, default=RESULTS / "cpu.json")
    args = p.parse_args(argv)

    import numba
    import torch

    from bench.bench_golden import decode_speed
    from host.checkpoint import load_checkpoint
    from host.compiler import CompileOptions, calibrate
    from host.devices.golden import GoldenDevice
    from host.devices.reference import ReferenceDevice

    report = provenance("cpu")
    report["loadavg_start"] = os.getloadavg()
    t_all = time.perf_counter()
    ckpt = load_checkpoint(MODEL)
    weights = ckpt.weights
    text = HELDOUT.read_text(encoding="utf-8")
    ids = np.asarray(ckpt.tokenizer.encode(text, add_special_tokens=False).ids[:4096], dtype=np.int64)

    gold = GoldenDevice()
    gold.options = CompileOptions(formats=calibrate(weights))
    gold.load(weights)
    gold1 = GoldenDevice()
    gold1.options = gold.options
    gold1.load(weights)
    ref = ReferenceDevice()
    ref.load(weights)
    tdev = TorchDevice(weights)
    report["torch_check"] = check_torch(weights, ids, args.check_tokens)
    devices = {"golden": (gold, None), "golden_1thread": (gold1, 1), "reference": (ref, None), "torch": (tdev, None)}
    speed = decode_speed(devices, ids, warmup=args.warmup, runs=args.runs, steps=args.steps,
                         budget_s=args.budget_s or None)
    cfg = weights.config
    report["model"] = {"path": str(MODEL.relative_to(REPO)), "tokens": "data/pydoc/heldout.txt from the start",
                       "shape": {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
                                 "num_hidden_layers": cfg.num_hidden_layers,
                                 "intermediate_size": cfg.intermediate_size, "n_trits": cfg.n_trits}}
    report["settings"] = {"runs": args.runs, "steps": args.steps, "warmup": args.warmup,
                          "numba_threads": numba.get_num_threads(), "torch_threads": torch.get_num_threads(),
                          "torch": torch.__version__, "timer": "time.perf_counter around Device.step loops"}
    report["devices"] = {
        "golden": "host.devices.golden.GoldenDevice (integer ISS, numba prange GEMV on packed trits)",
        "golden_1thread": "GoldenDevice with numba.set_num_threads(1)",
        "reference": "host.devices.reference.ReferenceDevice (float32 numpy, float32 trits, BLAS GEMV)",
        "torch": "bench/torch_hgrn.py TorchHGRNBit on CPU, float32 dense weights, eager"}
    report["speed"] = speed
    report["loadavg_end"] = os.getloadavg()
    report["wall_s"] = time.perf_counter() - t_all
    write_json(args.out, report)
    med = speed["tokens_per_s_median"]
    print("  ".join(f"{k} {v:.1f} tok/s" for k, v in med.items()),
          f"(load {report['loadavg_start'][0]:.1f} -> {report['loadavg_end'][0]:.1f}); wrote {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
