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
``engine``, ``engine_1thread``
    :class:`EngineDevice`: the same image, token packets and output packets, run by
    :class:`host.devices.golden_engine.GoldenEngine` (the whole token in one numba function, table-lookup GEMV;
    bit-exact with the golden device, checked here on the first ``--check-tokens`` tokens), with numba's default
    thread count (GEMVs above ``PARALLEL_MIN_TRITS`` split over the threads) and with one thread;
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

A second case, ``random_370m``, decodes random weights of the 370M shape (:data:`bench.bench_golden.SHAPE_370M`,
``--layers-370m`` layers, random token ids) with the same devices but ``golden_1thread`` (fewer, shorter runs:
``--runs-370m``, ``--steps-370m``).

Usage::

    python -m bench.bench_cpu                       # 5 runs of 100 steps each, then the 370M shape
    python -m bench.bench_cpu --runs 3 --steps 50 --layers-370m 0

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
#: what each device key is (recorded in the JSON)
DEVICES = {
    "golden": "host.devices.golden.GoldenDevice (integer ISS, numba prange GEMV on packed trits)",
    "golden_1thread": "GoldenDevice with numba.set_num_threads(1)",
    "engine": "host.devices.golden_engine.GoldenEngine behind GoldenDevice's packets (bit-exact; whole token in "
              "one numba function, table-lookup GEMV), numba's default threads, parallel=None (the thread pool only "
              "while it is measured faster)",
    "engine_pool": "the engine with numba's default threads and parallel=True (every GEMV group of 2**20 trits or "
                   "more split over the threads, whatever it costs)",
    "engine_1thread": "the engine with numba.set_num_threads(1)",
    "reference": "host.devices.reference.ReferenceDevice (float32 numpy, float32 trits, BLAS GEMV)",
    "torch": "bench/torch_hgrn.py TorchHGRNBit on CPU, float32 dense weights, eager"}
#: the goal of issue 24: an external C++ CPU engine (AVX2, OpenMP) for this architecture, measured side by side
#: on a 2-core Intel Xeon of this kind (tokens/s, the range over its one- and two-thread runs)
CPP_ENGINE = {"shipped": [384.0, 677.0], "random_370m": [13.0, 16.0],
              "source": "issue 24 (measured by the session that filed it; the engine is not run here)"}
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


class EngineDevice:
    """A :class:`host.devices.golden.GoldenDevice` whose tokens run on :class:`GoldenEngine`: the same token
    packet (built, then its header, length and CRC read back as the golden device does), the engine, the same
    output packet parsed into logits. ``step``/``reset`` as :func:`bench_golden.decode_speed` uses them."""

    name = "engine"

    def __init__(self, golden, parallel: bool | None = None) -> None:
        from host.devices.golden_engine import GoldenEngine

        self.golden = golden
        self.engine = GoldenEngine(golden.machine.image, parallel=parallel)
        self.state = golden.machine.init_state()
        self.position = 0

    def reset(self) -> None:
        self.state = self.golden.machine.init_state()
        self.position = 0

    def run_packet(self, packet: bytes) -> bytes:
        from hw import isa
        from hw.isa import TokenHeader

        hb = isa.layout_bytes(TokenHeader)
        h = isa.unpack(TokenHeader, packet[:hb])
        if h.magic != isa.TOKEN_MAGIC or isa.crc32_words(packet[:-4]) != int.from_bytes(packet[-4:], "little"):
            raise ValueError("bad token packet")
        x = np.frombuffer(packet[hb:hb + 4 * h.length], dtype="<i4").astype(np.int64)
        out, self.state = self.engine.run(x, h.flags, h.position, self.state)
        return out

    def step(self, token_id: int) -> np.ndarray:
        from host.protocol import parse_output_packet

        out = self.run_packet(self.golden.token_packet(int(token_id), self.position))
        self.position += 1
        return parse_output_packet(out).logits()


def check_engine(golden, engine: EngineDevice, ids: np.ndarray, tokens: int) -> dict:
    """Output packets and states of the engine against the golden device's interpreter, token by token
    (``engine=False`` once :class:`GoldenMachine` can delegate to the engine, so it is not compared with itself)."""
    import inspect

    from host.devices.golden import GoldenMachine

    kw = {"engine": False} if "engine" in inspect.signature(GoldenMachine).parameters else {}
    machine = GoldenMachine(golden.machine.image, golden.machine.build, **kw)
    state = machine.init_state()
    engine.reset()
    n = int(min(tokens, ids.size))
    for pos, t in enumerate(ids[:n]):
        packet = golden.token_packet(int(t), pos)
        res = machine.run_token(packet, state)
        out = engine.run_packet(packet)
        if out != res.output or not np.array_equal(engine.state, res.state):
            raise AssertionError(f"engine differs from the golden device at token {pos}")
        state = res.state
    engine.reset()
    return {"tokens": n, "output_packets_and_states_identical": True}


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
    p.add_argument("--layers-370m", type=int, default=24,
                   help="layers of the random 370M-shape case (24: the full shape; 0 skips it)")
    p.add_argument("--runs-370m", type=int, default=3)
    p.add_argument("--steps-370m", type=int, default=10)
    p.add_argument("--out", type=Path, default=RESULTS / "cpu.json")
    args = p.parse_args(argv)

    import numba
    import torch

    from bench.bench_golden import decode_speed
    from host.checkpoint import load_checkpoint
    from host.compiler import CompileOptions, calibrate
    from host.devices.golden import GoldenDevice
    from host.devices.golden_engine import PARALLEL_MIN_TRITS
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
    eng, eng1, engp = EngineDevice(gold), EngineDevice(gold), EngineDevice(gold, parallel=True)
    ref = ReferenceDevice()
    ref.load(weights)
    tdev = TorchDevice(weights)
    report["engine_check"] = check_engine(gold, eng, ids, args.check_tokens)
    report["torch_check"] = check_torch(weights, ids, args.check_tokens)
    devices = {"golden": (gold, None), "golden_1thread": (gold1, 1), "engine": (eng, None),
               "engine_pool": (engp, None), "engine_1thread": (eng1, 1), "reference": (ref, None),
               "torch": (tdev, None)}
    speed = decode_speed(devices, ids, warmup=args.warmup, runs=args.runs, steps=args.steps,
                         budget_s=args.budget_s or None)
    report["engine_prefers_thread_pool_at_end"] = eng.engine.threads_in_use
    del gold1, eng1, engp
    cfg = weights.config
    report["model"] = {"path": str(MODEL.relative_to(REPO)), "tokens": "data/pydoc/heldout.txt from the start",
                       "shape": {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
                                 "num_hidden_layers": cfg.num_hidden_layers,
                                 "intermediate_size": cfg.intermediate_size, "n_trits": cfg.n_trits}}
    report["settings"] = {"runs": args.runs, "steps": args.steps, "warmup": args.warmup,
                          "numba_threads": numba.get_num_threads(), "torch_threads": torch.get_num_threads(),
                          "numba_threading_layer": _threading_layer(),
                          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                          "engine_parallel_min_trits": PARALLEL_MIN_TRITS,
                          "torch": torch.__version__, "timer": "time.perf_counter around Device.step loops"}
    report["devices"] = dict(DEVICES)
    report["speed"] = speed
    report["cpp_engine_reference"] = CPP_ENGINE
    if args.layers_370m > 0:
        report["random_370m"] = bench_370m(args)
    report["loadavg_end"] = os.getloadavg()
    report["wall_s"] = time.perf_counter() - t_all
    write_json(args.out, report)
    for name, sp in [("shipped", speed)] + ([("370m", report["random_370m"]["speed"])]
                                            if "random_370m" in report else []):
        print(name, "  ".join(f"{k} {v:.1f} tok/s" for k, v in sp["tokens_per_s_median"].items()), file=sys.stderr)
    print(f"(load {report['loadavg_start'][0]:.1f} -> {report['loadavg_end'][0]:.1f}); wrote {args.out}",
          file=sys.stderr)
    return 0


def _threading_layer() -> str | None:
    import numba

    try:
        return numba.threading_layer()
    except ValueError:     # no parallel region has run yet
        return None


def bench_370m(args) -> dict:
    """The random 370M-shape case: compile, check the engine, then the alternating timed runs."""
    import torch

    from bench.bench_golden import SHAPE_370M, decode_speed
    from host.compiler import CompileOptions, calibrate
    from host.devices.golden import GoldenDevice
    from host.devices.reference import ReferenceDevice
    from host.model import HGRNBitConfig, random_weights

    shape = {**SHAPE_370M, "num_hidden_layers": args.layers_370m}
    cfg = HGRNBitConfig(**shape)
    t0 = time.perf_counter()
    weights = random_weights(cfg, seed=0)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, size=4096)
    gold = GoldenDevice()
    gold.options = CompileOptions(formats=calibrate(weights, n_tokens=16))
    gold.load(weights)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    eng, eng1, engp = EngineDevice(gold), EngineDevice(gold), EngineDevice(gold, parallel=True)
    t_engine = (time.perf_counter() - t0) / 3
    check = check_engine(gold, eng, ids, 3)
    ref = ReferenceDevice()
    ref.load(weights)
    tdev = TorchDevice(weights)
    devices = {"golden": (gold, None), "engine": (eng, None), "engine_pool": (engp, None),
               "engine_1thread": (eng1, 1), "reference": (ref, None), "torch": (tdev, None)}
    speed = decode_speed(devices, ids, warmup=3, runs=args.runs_370m, steps=args.steps_370m, budget_s=None)
    return {"shape": shape, "full_370m": args.layers_370m == SHAPE_370M["num_hidden_layers"],
            "weights": "host.model.random_weights(seed=0)", "tokens": "random ids (seed 1)",
            "calibrate_compile_load_s": t_load, "engine_load_s": t_engine,
            "engine_weight_bytes": eng.engine.weight_bytes, "image_bytes": gold.machine.image_bytes,
            "engine_check": check, "torch_threads": torch.get_num_threads(), "speed": speed,
            "engine_prefers_thread_pool_at_end": eng.engine.threads_in_use}


if __name__ == "__main__":
    sys.exit(main())
