#!/usr/bin/env python3
"""GPU baseline: batch-1 greedy decode of HGRN-Bit shapes in PyTorch, tokens/s and energy per token.

The model is :class:`bench.torch_hgrn.TorchHGRNBit` (the architecture of :mod:`host.reference` in plain
PyTorch) with **random** ternary weights of the 370M shape (``host.model.random_weights``: vocab 32000,
hidden 1024, 24 layers, intermediate 2816; ``--shape`` 1.3B or 2.7B for the larger released shapes; trits
uniform over {-1, 0, 1}): decode speed does not depend on
the weight values, since every GEMV is dense. Weights are stored dequantized as dense bfloat16 tensors
(trits are exact in bfloat16) and every BitLinear is one ``torch.nn.functional.linear`` (cuBLAS
GEMV/GEMM kernels); RMSNorm, absmax quantization, the MLGRU and GLU elementwise work run as separate
float32 PyTorch kernels. Variants, each decoding its own greedy sequence entirely on the GPU (the next
token is the argmax of the logits, written into a device tensor, no host round trip):

``eager``
    one Python call per step, every operator launched separately (hundreds of kernel launches a token);
``cuda_graph``
    the same step captured once in a ``torch.cuda.CUDAGraph`` and replayed (launch overhead removed,
    kernels unchanged);
``compile``
    ``torch.compile`` (Inductor, default mode: Triton kernels fuse the elementwise work, cuBLAS keeps the
    GEMVs) of the step;
``compile_cuda_graph``
    the compiled step captured in a ``torch.cuda.CUDAGraph``.

Measurement, per variant, after warm-up: tokens/s as the median of ``--bursts`` bursts of
``--burst-s`` seconds (each synchronised), then one energy window of at least ``--energy-s`` seconds
of continuous decoding read from NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
millijoules since driver load) at both ends, with the GPU synchronised; a sampler thread reads power,
SM clock and utilisation every 100 ms for context. Idle power is the same counter over ``--idle-s``
seconds with nothing running, read twice before the variants: once before this process creates a CUDA
context (the GPU as found) and once after setup and a ``--settle-s`` pause with the context alive;
J/token above idle subtracts the second (``j_per_token_above_idle``) or the first
(``j_per_token_above_idle_before_cuda``). A correctness check decodes the shipped model
(``models/hgrn-bit-pydoc``) on the GPU in bfloat16 and compares logits and greedy tokens with the numpy
float reference.

Usage (on a machine with a CUDA GPU)::

    python3 -m bench.bench_gpu --out bench/results/gpu.json
    python3 -m bench.bench_gpu --variants eager,cuda_graph --energy-s 10
    python3 -m bench.bench_gpu --shape 2.7B --variants cuda_graph,compile_cuda_graph \
        --out bench/results/gpu_2.7b.json

Results go to ``--out`` (default ``bench/results/gpu.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench._common import REPO, RESULTS, provenance, write_json

SHAPES = {  # the released checkpoints' shapes (ridger/MMfreeLM-370M, -1.3B, -2.7B)
    "370M": {"vocab_size": 32000, "hidden_size": 1024, "num_hidden_layers": 24, "intermediate_size": 2816},
    "1.3B": {"vocab_size": 32000, "hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 5632},
    "2.7B": {"vocab_size": 32000, "hidden_size": 2560, "num_hidden_layers": 32, "intermediate_size": 6912},
}
SHAPE_370M = SHAPES["370M"]
VARIANTS = ("eager", "cuda_graph", "compile", "compile_cuda_graph")


class Nvml:
    """NVML through ``pynvml`` (the ``nvidia-ml-py`` package): energy counter, power, clocks, names."""

    def __init__(self, index: int = 0):
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(index)

    def energy_mj(self) -> int:
        return int(self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h))

    def power_w(self) -> float:
        return self.nv.nvmlDeviceGetPowerUsage(self.h) / 1000.0

    def sm_clock_mhz(self) -> int:
        return int(self.nv.nvmlDeviceGetClockInfo(self.h, self.nv.NVML_CLOCK_SM))

    def util(self) -> int:
        return int(self.nv.nvmlDeviceGetUtilizationRates(self.h).gpu)

    def info(self) -> dict:
        nv, h = self.nv, self.h

        def s(x):
            return x.decode() if isinstance(x, bytes) else str(x)

        out = {"name": s(nv.nvmlDeviceGetName(h)), "driver": s(nv.nvmlSystemGetDriverVersion())}
        for key, fn in (("power_limit_w", lambda: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0),
                        ("max_sm_clock_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
                        ("max_mem_clock_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)),
                        ("memory_total_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h).total),
                        ("cuda_driver_version", lambda: nv.nvmlSystemGetCudaDriverVersion())):
            try:
                out[key] = fn()
            except Exception as e:  # noqa: BLE001 - an unsupported query is recorded, not fatal
                out[key] = f"unavailable: {e}"
        return out


class Sampler:
    """Background thread sampling power (W), SM clock (MHz) and utilisation (%) every ``period_s``."""

    def __init__(self, nvml: Nvml, period_s: float = 0.1):
        self.nvml, self.period = nvml, period_s
        self.rows: list[tuple[float, float, int, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.rows.append((time.perf_counter(), self.nvml.power_w(), self.nvml.sm_clock_mhz(), self.nvml.util()))
            self._stop.wait(self.period)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()

    def summary(self) -> dict:
        if not self.rows:
            return {}
        p = [r[1] for r in self.rows]
        c = [r[2] for r in self.rows]
        u = [r[3] for r in self.rows]
        return {"samples": len(self.rows), "power_w_mean": statistics.fmean(p), "power_w_max": max(p),
                "sm_clock_mhz_median": statistics.median(c), "gpu_util_pct_median": statistics.median(u)}


def energy_window(nvml: Nvml, torch, seconds: float, work=None, chunk: int = 50) -> dict:
    """Run ``work`` (a callable doing one decode step, or None for idle) for >= ``seconds``; energy from NVML.

    ``torch`` may be None for an idle window before CUDA is initialised."""
    sync = torch.cuda.synchronize if torch is not None else (lambda: None)
    sync()
    with Sampler(nvml) as smp:
        e0, t0 = nvml.energy_mj(), time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < seconds:
            if work is None:
                time.sleep(0.05)
                continue
            for _ in range(chunk):
                work()
            n += chunk
            sync()
        sync()
        t1, e1 = time.perf_counter(), nvml.energy_mj()
    joules = (e1 - e0) / 1000.0
    return {"seconds": t1 - t0, "tokens": n, "energy_j": joules, "power_w": joules / (t1 - t0),
            **{f"sampled_{k}": v for k, v in smp.summary().items()}}


def tokens_per_s(torch, work, burst_s: float, bursts: int, chunk: int = 20) -> list[float]:
    """``bursts`` synchronised bursts of >= ``burst_s`` seconds of ``work``; tokens/s of each."""
    rates = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = 0
        while True:
            for _ in range(chunk):
                work()
            n += chunk
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if dt >= burst_s:
                break
        rates.append(n / dt)
    return rates


def capture(torch, fn, warmup: int = 3):
    """Capture one call of ``fn`` in a CUDA graph (after ``warmup`` calls on a side stream); returns replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def check_shipped(torch, tokens: int = 32) -> dict:
    """Greedy-decode the shipped model on the GPU (bfloat16 weights) and with the numpy float reference."""
    from bench.torch_hgrn import TorchHGRNBit
    from host.checkpoint import load_checkpoint
    from host.reference import ReferenceModel

    ck = load_checkpoint(REPO / "models" / "hgrn-bit-pydoc")
    ref = ReferenceModel(ck.weights)
    m = TorchHGRNBit(ck.weights, device="cuda", weight_dtype=torch.bfloat16)
    tok = int(ck.config.bos_token_id or 1)
    m.reset(tok)
    state = ref.init_state()
    errs, agree = [], 0
    for _ in range(tokens):
        lr, state = ref.step(tok, state)
        m.step()
        lt = m.logits.double().cpu().numpy()
        errs.append(float(np.linalg.norm(lt - lr) / np.linalg.norm(lr)))
        nt = int(np.argmax(lr))
        agree += int(nt == int(m.token.item()))
        tok = nt
        m.token.fill_(tok)  # follow the reference's sequence
    return {"model": "models/hgrn-bit-pydoc", "tokens": tokens, "greedy_token_agreement": agree / tokens,
            "logits_rel_err_median": statistics.median(errs), "logits_rel_err_max": max(errs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "gpu.json")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="370M", help="model shape (random weights)")
    ap.add_argument("--layers", type=int, default=None, help="override the shape's layer count")
    ap.add_argument("--energy-s", type=float, default=12.0, help="energy window per variant (>= 10 s)")
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--settle-s", type=float, default=20.0, help="pause before the post-setup idle window")
    ap.add_argument("--burst-s", type=float, default=1.0)
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--git-revision", default=None,
                    help="revision of the checkout that was copied to the GPU machine (no .git there)")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")

    # idle before this process touches CUDA (the GPU as found), then again after setup, below
    nvml = Nvml(0)
    idle_cold = energy_window(nvml, None, args.idle_s, None)
    print("idle before CUDA init", idle_cold, flush=True)

    import torch

    from bench.torch_hgrn import TorchHGRNBit
    from host.model import HGRNBitConfig, random_weights

    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    report = provenance("gpu")
    if args.git_revision:
        report["git"] = {"revision": args.git_revision, "dirty": None, "describe": args.git_revision,
                         "note": "revision of the checkout copied to the GPU machine (passed on the command line)"}
    report["gpu"] = {**nvml.info(), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
                     "device_name_torch": torch.cuda.get_device_name(0),
                     "sm_count": torch.cuda.get_device_properties(0).multi_processor_count}
    try:
        import triton

        report["gpu"]["triton"] = triton.__version__
    except ImportError:
        pass
    print(report["gpu"], flush=True)

    shape = dict(SHAPES[args.shape])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    cfg = HGRNBitConfig(**shape)
    t0 = time.perf_counter()
    weights = random_weights(cfg, seed=args.seed)
    model = TorchHGRNBit(weights, device="cuda", weight_dtype=torch.bfloat16)
    del weights
    report["model"] = {"name": args.shape, "shape": shape,
                       "weights": f"random ternary (host.model.random_weights seed {args.seed})",
                       "weight_dtype": "bfloat16 (dense, dequantized trits)", "n_trits": cfg.n_trits,
                       "weight_bytes_per_token": model.bytes_per_token(),
                       "setup_s": time.perf_counter() - t0}
    report["kernels"] = {
        "gemv": "torch.nn.functional.linear on bfloat16 weights [N, K] x bfloat16 codes [1, K] (cuBLAS)",
        "elementwise": "PyTorch float32 kernels (eager) or Inductor-generated Triton kernels (compile)",
        "graph": "torch.cuda.CUDAGraph capture of one whole decode step (cuda_graph variants)",
        "compile": "torch.compile(mode='default', fullgraph=True, dynamic=False), Inductor backend"}

    # bandwidth ceiling: a large device-to-device copy, bytes read + written
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    for _ in range(10):
        b.copy_(a)
    ev1.record()
    torch.cuda.synchronize()
    copy_bw = 2 * 10 * a.numel() / (ev0.elapsed_time(ev1) / 1000.0)
    del a, b
    floor_s = model.bytes_per_token() / copy_bw
    report["roofline"] = {"copy_bandwidth_bytes_per_s": copy_bw, "memory_floor_s_per_token": floor_s,
                          "memory_bound_tokens_per_s": 1.0 / floor_s,
                          "note": "weight bytes per token / measured device-to-device copy bandwidth"}

    try:
        report["correctness"] = check_shipped(torch)
    except Exception as e:  # noqa: BLE001 - the check is recorded, the speed run goes on
        report["correctness"] = {"error": repr(e)}
    print("correctness", report["correctness"], flush=True)

    time.sleep(args.settle_s)  # let power settle before the second idle window
    idle = energy_window(nvml, torch, args.idle_s, None)
    report["idle_before_cuda"] = idle_cold
    report["idle"] = idle
    report["idle_note"] = ("'idle_before_cuda': the GPU as found, before this process created a CUDA context; "
                           "'idle': after setup and a pause of settle_s, with this process's context alive "
                           "and nothing running (the baseline subtracted in j_per_token_above_idle; "
                           "j_per_token_above_idle_before_cuda subtracts the other)")
    print("idle", idle, flush=True)

    results = {}
    with torch.inference_mode():
        compiled = None
        for v in variants:
            entry: dict = {}
            try:
                model.reset(1)
                tc = time.perf_counter()
                if v == "eager":
                    work = model.step
                elif v == "cuda_graph":
                    work = capture(torch, model.step)
                else:
                    if compiled is None:
                        compiled = torch.compile(model.step, mode="default", fullgraph=True, dynamic=False)
                        for _ in range(3):
                            compiled()
                        torch.cuda.synchronize()
                        entry["compile_s"] = time.perf_counter() - tc
                    work = compiled if v == "compile" else capture(torch, compiled)
                for _ in range(20):
                    work()
                torch.cuda.synchronize()
                entry["prepare_s"] = time.perf_counter() - tc
                rates = tokens_per_s(torch, work, args.burst_s, args.bursts)
                entry["tokens_per_s_bursts"] = rates
                entry["tokens_per_s"] = statistics.median(rates)
                win = energy_window(nvml, torch, args.energy_s, work)
                entry["energy_window"] = win
                tps = win["tokens"] / win["seconds"]
                j_total = win["energy_j"] / win["tokens"]
                j_above = (win["energy_j"] - idle["power_w"] * win["seconds"]) / win["tokens"]
                entry["j_per_token_above_idle_before_cuda"] = (
                    win["energy_j"] - idle_cold["power_w"] * win["seconds"]) / win["tokens"]
                entry.update({"tokens_per_s_energy_window": tps, "j_per_token_total": j_total,
                              "j_per_token_above_idle": j_above, "tokens_per_j_total": 1.0 / j_total,
                              "tokens_per_j_above_idle": 1.0 / j_above if j_above > 0 else None,
                              "fraction_of_memory_bound": entry["tokens_per_s"] * floor_s})
            except Exception as e:  # noqa: BLE001 - one failing variant must not lose the others
                entry["error"] = repr(e)
            results[v] = entry
            print(v, {k: entry.get(k) for k in ("tokens_per_s", "j_per_token_total", "j_per_token_above_idle",
                                                "error")}, flush=True)
    report["variants"] = results
    report["idle_after"] = energy_window(nvml, torch, min(args.idle_s, 5.0), None)
    write_json(args.out, report)
    print("\nvariant              tokens/s   J/token   J/token above idle")
    for v, e in results.items():
        if "error" in e:
            print(f"{v:20s} error: {e['error'][:80]}")
        else:
            print(f"{v:20s} {e['tokens_per_s']:9.1f} {e['j_per_token_total']:9.4f} {e['j_per_token_above_idle']:9.4f}")
    print(f"idle before CUDA {idle_cold['power_w']:.1f} W; idle {idle['power_w']:.1f} W; "
          f"memory-bound ceiling {1 / floor_s:.0f} tokens/s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
