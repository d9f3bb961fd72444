#!/usr/bin/env python3
"""The RTL device (:mod:`host.devices.rtl`): simulation speed, cycles per token, stream efficiency, and every
hardware counter next to the golden device's cycle model.

For the shipped model (``models/hgrn-bit-pydoc``) at two builds of the core, 64 lanes on one 64-bit channel
and 256 lanes on one 256-bit channel (the builds of ``bench/bench_perf.py``), both with 8 quantize lanes:

Speed
    The Verilator harness runs ``--tokens`` tokens of the held-out text (``data/pydoc/heldout.txt``) through the
    core; per token it reports the clock cycles it simulated, the wall time and the CPU time of the
    simulation (pipe I/O excluded). Reported: simulated cycles per wall-clock second and per CPU second
    (the machine is shared: the load average is recorded, and the CPU-time rate is the one other processes do
    not dilute), and the first build's times (Verilog export, Verilation, C++ compile). With ``--cocotb``
    the cocotb testbench of ``sim/`` (Verilator through cocotb's runner, stimulus and checks in Python)
    runs the first token on the same 64-lane design; the harness runs that token too (same position,
    after a reset) in the same benchmark run: the speed-up. With ``--amaranth-cycles N`` the same design
    also runs ``N`` cycles of its token in the Amaranth simulator (stimulus in Python).
Cycles and efficiency
    Cycles per token from the hardware counters (``CYCLES``), against the cycle model's prediction
    (:func:`host.perf.token_counters`), and the stream efficiency of both
    (:func:`host.perf.stream_efficiency`: ``max(image bytes / (channels x beat bytes), trits / lanes) / cycles``).
Counters
    One token is profiled per instruction (the harness snapshots the core's counter registers at every
    instruction boundary); every :class:`hw.isa.Counter` is compared with the golden device's per-instruction
    prediction (``GoldenMachine`` counters; non-zero trits counted from the image): whole-token totals, and
    per counter the instructions that differ by more than 2 % (issue 5's tolerance). Differences are reported,
    not fixed.
Bit-exactness
    Every timed token's logits are compared with the golden device's.
Side by side (``--versus``)
    The 64-lane build's timed tokens also run, in alternation over ``--rounds`` rounds, on another harness
    executable of the same build parameters (for instance ``build/rtl/<key>/obj/harness`` built from an
    earlier revision): the median CPU-time rates of both and their ratio, in the same run and under the same
    load, with the two executables' output packets compared (:func:`side_by_side`).

370M layer (``--layer-370m``)
    Instead of the above: one whole layer of the 370M shape (hidden 1024, intermediate 2816; random ternary
    weights, 2 layers, a 64-word LM head) on cores built for that shape at 64 lanes x 1 channel x 64 bits and
    256 lanes x 4 channels x 128 bits: the layer's cycles and stream efficiency (its own bytes and trits)
    against the cycle model, every counter per instruction, logits bit-exact (:func:`bench_layer370m`).

Usage::

    python -m bench.bench_rtl --cocotb                 # both builds, 8 tokens each, and the cocotb path
    python -m bench.bench_rtl --lanes 64 --tokens 4    # one build
    python -m bench.bench_rtl --layer-370m             # the 370M layer, both builds, 2 tokens each
    python -m bench.bench_rtl --lanes 64 --versus OLD/obj/harness   # side by side with another revision's build

Results go to ``bench/results/rtl.json`` (``--out``), with ``--layer-370m`` to
``bench/results/rtl_layer370m.json``. The first run builds each core (minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench._common import REPO, RESULTS, provenance, write_json

MODEL = REPO / "models" / "hgrn-bit-pydoc"
HELDOUT = REPO / "data" / "pydoc" / "heldout.txt"
#: lanes -> bus bits (bench/bench_perf.py's builds with one channel)
BUILDS = {64: 64, 256: 256}
TOLERANCE = 0.02
TARGET_CYCLES_PER_S = 1e6


def _token_ids(tokenizer, n: int) -> list[int]:
    text = HELDOUT.read_text(encoding="utf-8")[:4000]
    return tokenizer.encode(text).ids[:n]


def _names(checkpoint, options) -> list[str]:
    from host.compiler import compile_program

    return [i.name for i in compile_program(checkpoint.weights, options)]


def compare_counters(hw: list[dict], model: list[dict], names: list[str]) -> dict:
    """Per counter: whole-token totals and the instructions beyond :data:`TOLERANCE`.

    Parameters
    ----------
    hw, model : list of dict[Counter, int]
        Per-instruction increments (hardware) and predictions (cycle model), same length.
    names : list of str
        Instruction names.
    """
    from hw.isa import Counter

    out = {}
    for c in Counter:
        h = np.array([x[c] for x in hw], dtype=np.int64)
        m = np.array([x[c] for x in model], dtype=np.int64)
        diff = h - m
        rel = np.abs(diff) / np.maximum(np.abs(m), 1)
        bad = np.flatnonzero(rel > TOLERANCE)
        by_name: dict[str, list[int]] = {}
        for i in bad:
            key = names[i].split(".", 2)[-1] if names[i].startswith("layers.") else names[i]
            by_name.setdefault(key, []).append(int(diff[i]))
        out[c.name] = {
            "hw_total": int(h.sum()), "model_total": int(m.sum()), "diff_total": int(diff.sum()),
            "rel_total": float(diff.sum() / max(abs(int(m.sum())), 1)),
            "max_rel_instruction": float(rel.max()) if rel.size else 0.0,
            "instructions_beyond_2pct": int(bad.size),
            "beyond_2pct_by_kind": {k: {"count": len(v), "diff_min": min(v), "diff_max": max(v)}
                                    for k, v in by_name.items()},
            "examples": [{"instruction": int(i), "name": names[i], "hw": int(h[i]), "model": int(m[i])}
                         for i in bad[:6]],
        }
    return out


def _model_counters(gold, nonzero: list[int]) -> list[dict]:
    """The golden device's per-instruction counters of its last token, with each GEMV's nonzero-trit count
    (which the cycle model does not produce) filled in, to set beside the core's profile."""
    from hw.isa import Counter

    return [{**m, Counter.NONZERO_TRITS: nonzero[i]} for i, m in enumerate(gold.last.per_instruction)]


def side_by_side(rtl, versus: Path, ids: list[int], rounds: int) -> dict:
    """Simulation speed of this revision's harness and of ``versus`` (a harness executable of the same build
    parameters, e.g. built from an earlier revision), in alternation on the same machine: ``rounds`` times
    each, every round a reset then ``ids`` at positions 0, 1, ...; the two must return identical output packets.
    The rates of one round are CPU-time rates (other processes dilute them less than wall-clock rates)."""
    from host.devices.rtl import Harness
    from host.protocol import channel_streams

    packets = [rtl.token_packet(t, pos) for pos, t in enumerate(ids)]
    other = Harness(versus, channel_streams(rtl.image, rtl.build.channels))
    try:
        rates = {"this": [], "versus": []}
        wall = {"this": [], "versus": []}
        outputs = {}
        load_before = os.getloadavg()
        for _ in range(rounds):
            for name, h in (("this", rtl.harness), ("versus", other)):
                h.reset()
                cycles = cpu = ns = 0
                out = []
                for pkt in packets:
                    r = h.run_token(pkt)
                    cycles, cpu, ns = cycles + r.cycles, cpu + r.cpu_ns, ns + r.wall_ns
                    out.append(r.output)
                if outputs.setdefault(name, out) != out:
                    raise RuntimeError(f"{name}: output packets differ between rounds")
                rates[name].append(cycles / (cpu * 1e-9))
                wall[name].append(cycles / (ns * 1e-9))
        rtl.reset()
        info = versus.parent.parent / "build.json"
        med = {k: float(np.median(v)) for k, v in rates.items()}
        return {"versus": str(versus), "versus_build": json.loads(info.read_text()) if info.is_file() else None,
                "tokens": len(ids), "rounds": rounds, "identical_outputs": outputs["this"] == outputs["versus"],
                "cycles_per_cpu_s": rates, "cycles_per_wall_s": wall, "median_cycles_per_cpu_s": med,
                "speedup_median_cpu": med["this"] / med["versus"],
                "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    finally:
        other.close()


def bench_build(checkpoint, lanes: int, bus_bits: int, n_tokens: int, ids: list[int], versus: Path | None = None,
                rounds: int = 3) -> dict:
    from host.devices.golden import GoldenDevice
    from host.devices.rtl import RtlDevice
    from host.perf import stream_efficiency
    from hw.isa import Counter, Opcode

    build = {"lanes": lanes, "channels": 1, "bus_bits": bus_bits, "quant_lanes": 8}
    rtl = RtlDevice(**build)
    t0 = time.perf_counter()
    rtl.load(checkpoint)
    load_s = time.perf_counter() - t0
    gold = GoldenDevice(**build)
    gold.load(checkpoint)
    try:
        names = _names(checkpoint, rtl.options)
        image = rtl.image
        trits = sum(i.n * i.k for i in image.instructions if i.opcode is Opcode.GEMV)
        nonzero = gold.machine.nonzero_trits()
        # one profiled token (per-instruction counters), then the timed ones
        rtl.profile = True
        rtl.step(ids[0])
        gold.step(ids[0])
        rtl.profile = False
        hw_per = rtl.last.per_instruction
        model_per = _model_counters(gold, nonzero)
        counters = compare_counters(hw_per, model_per, names)
        runs, exact = [], True
        load_before = os.getloadavg()
        for pos, t in enumerate(ids[1:1 + n_tokens], start=1):
            a = rtl.step(t)
            b = gold.step(t)
            exact &= bool(np.array_equal(a, b))
            r = rtl.last
            runs.append({"position": pos, "token": int(t), "hw_cycles": int(r.counters[Counter.CYCLES]),
                         "sim_cycles": r.cycles, "wall_s": r.wall_ns * 1e-9, "cpu_s": r.cpu_ns * 1e-9})
        load_after = os.getloadavg()
        # the cocotb comparison's token (ids[0] at position 0 after a reset), unprofiled
        rtl.reset()
        rtl.step(ids[0])
        r = rtl.last
        same_token = {"token": int(ids[0]), "position": 0, "sim_cycles": r.cycles, "wall_s": r.wall_ns * 1e-9,
                      "cpu_s": r.cpu_ns * 1e-9, "cycles_per_wall_s": r.cycles / (r.wall_ns * 1e-9),
                      "cycles_per_cpu_s": r.cycles / (r.cpu_ns * 1e-9), "loadavg": os.getloadavg()}
        versus_run = side_by_side(rtl, versus, ids[:n_tokens], rounds) if versus is not None else None
        sim = sum(x["sim_cycles"] for x in runs)
        wall = sum(x["wall_s"] for x in runs)
        cpu = sum(x["cpu_s"] for x in runs)
        hw_cycles = float(np.mean([x["hw_cycles"] for x in runs]))
        predicted = int(rtl.prediction[Counter.CYCLES])
        bp = rtl.build
        return {
            "build": {**build, **{k: getattr(rtl.params, k) for k in ("max_hidden", "max_intermediate", "max_layers")},
                      "packing": "base3"},
            "harness_build": rtl.build_info, "load_seconds": round(load_s, 2),
            "speed": {"tokens": len(runs), "sim_cycles": sim, "wall_s": wall, "cpu_s": cpu,
                      "cycles_per_wall_s": sim / wall, "cycles_per_cpu_s": sim / cpu,
                      "target_cycles_per_s": TARGET_CYCLES_PER_S if lanes == 64 else None,
                      "meets_target": (sim / wall >= TARGET_CYCLES_PER_S) if lanes == 64 else None,
                      "loadavg_before": load_before, "loadavg_after": load_after, "per_token": runs,
                      "same_token_as_cocotb": same_token},
            "cycles_per_token": {"hw": hw_cycles, "model": predicted, "rel_diff": hw_cycles / predicted - 1,
                                 "ideal": max(image.info.image_bytes / (bp.channels * bp.beat_bytes),
                                              trits / bp.lanes)},
            "stream_efficiency": {"hw": stream_efficiency(image.info.image_bytes, trits, round(hw_cycles), bp),
                                  "model": stream_efficiency(image.info.image_bytes, trits, predicted, bp)},
            "image_bytes": image.info.image_bytes, "trits": trits,
            "bit_exact_logits": exact, "n_instructions": len(hw_per),
            **({"side_by_side": versus_run} if versus_run is not None else {}),
            "counters": counters,
        }
    finally:
        rtl.close()


#: the 370M layer benchmark's builds: name -> (lanes, channels, bus bits)
LAYER_BUILDS = {"64x1x64": (64, 1, 64), "256x4x128": (256, 4, 128)}
LAYER_SHAPE = {"hidden_size": 1024, "intermediate_size": 2816}   # ridger/MMfreeLM-370M's config.json
LAYER_FULL = {"num_hidden_layers": 24, "vocab_size": 32000}


def _instruction_bytes(image) -> list[int]:
    """Bytes of each instruction of a parsed image (header, constants, weight blocks), from the offsets."""
    offs = [i.offset for i in image.instructions] + [len(image.raw)]
    return [b - a for a, b in zip(offs, offs[1:], strict=False)]


def bench_layer370m(lanes: int, channels: int, bus_bits: int, *, n_layers: int = 2, vocab: int = 64,
                    n_tokens: int = 2, seed: int = 0) -> dict:
    """One whole 370M-shape layer in RTL simulation: cycles, stream efficiency and every counter per instruction.

    A random ternary model (:func:`host.model.random_weights`) of the 370M layer shape (hidden 1024,
    intermediate 2816) with ``n_layers`` layers and a ``vocab``-word LM head runs ``n_tokens`` tokens (positions
    0, 1, ...: the recurrent state is carried) on the Verilated core built for that shape (``max_hidden`` 1024,
    ``max_intermediate`` 2816, ``max_layers`` = ``n_layers`` rounded up to a power of two), each profiled per
    instruction, and on the golden device; logits compared bit for bit.

    Layer ``0`` has the shape of a steady-state layer of the 24-layer 370M program (its ``down_proj`` forms
    the next layer's three code sets, as every layer but the last does): its cycles are the sum of its seven
    GEMVs' ``CYCLES`` increments, and its stream efficiency (:func:`host.perf.stream_efficiency`) uses the
    layer's own image bytes (headers, constants, weights) and trits, as :func:`host.perf.token_prediction`
    does for its ``layer`` entry (reported next to it for the 24-layer, 32000-word 370M program).

    Returns
    -------
    dict
        JSON-ready results of this build.
    """
    from host.compiler import plan_instructions, plan_shape
    from host.devices.golden import GoldenDevice
    from host.devices.rtl import RtlDevice
    from host.model import HGRNBitConfig, random_weights
    from host.perf import stream_efficiency, token_prediction
    from hw.isa import Counter, Opcode

    cfg = HGRNBitConfig(vocab_size=vocab, num_hidden_layers=n_layers, **LAYER_SHAPE)
    t0 = time.perf_counter()
    weights = random_weights(cfg, seed=seed)
    build = {"lanes": lanes, "channels": channels, "bus_bits": bus_bits, "quant_lanes": 8}
    caps = {"max_hidden": cfg.hidden_size, "max_intermediate": cfg.intermediate_size,
            "max_layers": 1 << (n_layers - 1).bit_length()}
    rtl = RtlDevice(**build, **caps)
    rtl.load(weights)
    gold = GoldenDevice(**build)
    gold.load(weights)
    load_s = time.perf_counter() - t0
    try:
        image, bp = rtl.image, rtl.build
        # instruction names from the compiler's plan (parsed images carry none); the plan checked against the image
        shapes = plan_shape(cfg.hidden_size, cfg.intermediate_size, n_layers, vocab,
                            packing=rtl.options.packing, channels=channels).instructions
        parsed = plan_instructions(image.instructions, packing=rtl.options.packing, channels=channels)
        if [dataclasses.replace(s, name="") for s in shapes] != [dataclasses.replace(i, name="") for i in parsed]:
            raise RuntimeError("the image's instructions differ from host.compiler.plan_shape's")
        names = [s.name for s in shapes]
        nbytes = _instruction_bytes(image)
        nonzero = gold.machine.nonzero_trits()
        ids = [int(t) for t in np.random.default_rng(seed).integers(0, vocab, size=n_tokens)]
        tokens, exact = [], True
        rtl.profile = True
        for pos, t in enumerate(ids):
            load_before = os.getloadavg()
            a = rtl.step(t)
            b = gold.step(t)
            same = bool(np.array_equal(a, b))
            exact &= same
            hw_per = rtl.last.per_instruction
            model_per = _model_counters(gold, nonzero)
            if len(hw_per) != len(model_per):
                raise RuntimeError(f"{len(hw_per)} profiled instructions, the image has {len(model_per)}")
            r = rtl.last
            layers = []
            for li in range(n_layers):
                idx = [i for i, n in enumerate(names) if n.startswith(f"layers.{li}.")]
                lb = sum(nbytes[i] for i in idx)
                lt = sum(image.instructions[i].n * image.instructions[i].k for i in idx
                         if image.instructions[i].opcode is Opcode.GEMV)
                hc = sum(hw_per[i][Counter.CYCLES] for i in idx)
                mc = sum(model_per[i][Counter.CYCLES] for i in idx)
                layers.append({
                    "layer": li, "bytes": lb, "trits": lt,
                    "ideal_cycles": max(lb / (bp.channels * bp.beat_bytes), lt / bp.lanes),
                    "binding": "stream" if lb / (bp.channels * bp.beat_bytes) >= lt / bp.lanes else "lanes",
                    "cycles": {"hw": int(hc), "model": int(mc), "diff": int(hc - mc), "rel_diff": hc / mc - 1},
                    "stream_efficiency": {"hw": stream_efficiency(lb, lt, int(hc), bp),
                                          "model": stream_efficiency(lb, lt, int(mc), bp)},
                    "per_instruction": [
                        {"name": names[i], "n": image.instructions[i].n, "k": image.instructions[i].k,
                         "bytes": nbytes[i], "hw": {c.name: int(hw_per[i][c]) for c in Counter},
                         "model": {c.name: int(model_per[i][c]) for c in Counter}} for i in idx],
                })
            tokens.append({
                "position": pos, "token": t, "bit_exact_logits": same,
                # what was compared: a non-degenerate logit vector (spread, arg max)
                "logits": {"n": int(a.size), "min": float(a.min()), "max": float(a.max()), "std": float(a.std()),
                           "argmax": int(a.argmax())},
                "hw_cycles": int(r.counters[Counter.CYCLES]),
                "model_cycles": int(sum(m[Counter.CYCLES] for m in model_per)),
                "sim_cycles": r.cycles, "wall_s": r.wall_ns * 1e-9, "cpu_s": r.cpu_ns * 1e-9,
                "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                "layers": layers, "counters": compare_counters(hw_per, model_per, names)})
        rtl.profile = False
        # the cycle model of the full 24-layer, 32000-word 370M program: its steady-state layer
        program = plan_shape(cfg.hidden_size, cfg.intermediate_size, LAYER_FULL["num_hidden_layers"],
                             LAYER_FULL["vocab_size"], packing=rtl.options.packing, channels=channels)
        full = token_prediction(program, bp)["layer"]
        return {
            "build": {**build, **caps, "packing": rtl.options.packing.name.lower()},
            "model": {"config": {k: v for k, v in cfg.to_dict().items() if k in (
                "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")},
                      "weights": f"host.model.random_weights(seed={seed})", "image_bytes": image.info.image_bytes},
            "harness_build": rtl.build_info, "load_seconds": round(load_s, 1), "token_ids": ids,
            "bit_exact_logits": exact, "n_instructions": len(names),
            "model_prediction_370m_24_layers": {k: full[k] for k in (
                "layers", "cycles", "bytes", "trits", "ideal_cycles", "binding", "stream_efficiency", "parts",
                "per_instruction")},
            "tokens": tokens,
        }
    finally:
        rtl.close()


def _print_layer(name: str, r: dict) -> None:
    t = r["tokens"][-1]
    lay = t["layers"][0]
    print(f"  {name}: layer 0 {lay['cycles']['hw']:,} cycles (model {lay['cycles']['model']:,}, "
          f"{lay['cycles']['rel_diff']:+.4%}); ideal {lay['ideal_cycles']:,.0f} ({lay['binding']}); stream "
          f"efficiency {lay['stream_efficiency']['hw']:.4f} (model {lay['stream_efficiency']['model']:.4f}); "
          f"bit-exact {r['bit_exact_logits']}", file=sys.stderr, flush=True)
    for p in lay["per_instruction"]:
        h, m = p["hw"]["CYCLES"], p["model"]["CYCLES"]
        print(f"    {p['name']:<32} {p['n']:>5}x{p['k']:<5} hw {h:>7,} model {m:>7,} diff {h - m:+d}",
              file=sys.stderr, flush=True)


def bench_cocotb(lanes: int, bus_bits: int, token: int, max_layers: int = 8) -> dict:
    """The cocotb path (``sim/test_accelerator.py``) on the same design and token: the core's Verilog built by
    cocotb's Verilator runner, stimulus and checks in Python (cocotbext-axi), one whole token bit-exact."""
    # sim/ on sys.path, not an import of sim.test_accelerator: cocotb's runner hands this process's sys.path to
    # the simulator as PYTHONPATH, where the cocotb module (sim/accelerator_tests.py) is imported by bare name
    sim_dir = str(REPO / "sim")
    if sim_dir not in sys.path:
        sys.path.insert(0, sim_dir)
    import test_accelerator as ta

    from host.image import parse_image
    from hw.isa import TritPacking

    model = ta.shipped_model(TritPacking.BASE3)
    info = parse_image(model.image).info
    build = ta.Build(lanes=lanes, bus_bits=bus_bits, quant_lanes=8, packing=TritPacking.BASE3,
                     max_hidden=info.hidden, max_intermediate=info.intermediate, max_layers=max_layers)
    t0 = time.perf_counter()
    built = ta.get_sim(build)
    build_s = time.perf_counter() - t0
    run = ta.Run(built, f"bench-rtl-{token}", stress=False)
    run.step("reset")
    ta.add_tokens(run, model, [token], build, label="bench")
    load_before = os.getloadavg()
    run.execute("tokens")
    timing = json.loads((run.dir / "timings-tokens.json").read_text())[0]
    execute = json.loads((run.dir / "execute.json").read_text())
    return {"lanes": lanes, "bus_bits": bus_bits, "token": token, "position": 0, "cycles": timing["cycles"],
            "wall_s": timing["wall_s"], "cycles_per_wall_s": timing["cycles"] / timing["wall_s"],
            # the simulator process's whole CPU time (start-up, reset, register reads included): a lower bound
            "cycles_per_cpu_s_lower_bound": timing["cycles"] / execute["cpu_s"],
            "process": execute, "build_or_cache_s": round(build_s, 1), "sim_dir": str(built.sim_dir),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "note": "sim/test_accelerator.py's cocotb 2 testbench (AxiStreamSource/Sink, AxiLiteMaster) under "
                    "Verilator: one token, output packet bit-exact with the golden device; wall_s covers the "
                    "token only (the counter reads and checks around it excluded)"}


def bench_amaranth(checkpoint, lanes: int, bus_bits: int, cycles: int) -> dict:
    """Cycles per second of the Amaranth simulator on the same core and token, stimulus in Python."""
    from amaranth.sim import Simulator

    from host.compiler import CompileOptions, compile_model
    from host.image import parse_image
    from host.protocol import make_token_packet
    from hw import numerics as nx
    from hw.params import BuildParams
    from hw.top import Accelerator

    image = compile_model(checkpoint.weights, CompileOptions())
    info = parse_image(image).info
    pk = make_token_packet(nx.to_fixed(checkpoint.weights.embeddings[1], info.residual_frac))
    dut = Accelerator(BuildParams(lanes=lanes, channels=1, bus_bits=bus_bits, quant_lanes=8, max_hidden=info.hidden,
                                  max_intermediate=info.intermediate, max_layers=8))
    bb = bus_bits // 8
    raw = pk + image
    beats = [int.from_bytes(raw[i:i + bb], "little") for i in range(0, len(raw), bb)]
    ticks = {"n": 0}

    async def feed(ctx):   # one beat per cycle while tready, as the harness drives it; `cycles` cycles
        port = dut.s_axis_w0
        ctx.set(dut.m_axis_out.tready, 1)
        ctx.set(port.tvalid, 1)
        i = 0
        ctx.set(port.tdata, beats[0])
        for _ in range(cycles):
            ready = ctx.get(port.tready)
            await ctx.tick()
            ticks["n"] += 1
            if ready and i + 1 < len(beats):
                i += 1
                ctx.set(port.tdata, beats[i])

    t0 = time.perf_counter()
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(feed)
    t1 = time.perf_counter()
    sim.run()
    t2 = time.perf_counter()
    return {"lanes": lanes, "bus_bits": bus_bits, "cycles": ticks["n"], "setup_s": t1 - t0, "run_s": t2 - t1,
            "cycles_per_wall_s": ticks["n"] / (t2 - t1), "loadavg": os.getloadavg(),
            "note": "Amaranth's Python simulator (pysim), stimulus per beat in Python as in tests/hw/test_top.py; "
                    "the first cycles of a token (token packet, headers, first GEMV)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lanes", default="64,256", help="comma-separated lane counts (64 and/or 256)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="timed tokens per build (after one profiled token; default 8); with --layer-370m: "
                         "profiled tokens per build (default 2)")
    ap.add_argument("--amaranth-cycles", type=int, default=0,
                    help="also run this many cycles of the 64-lane core in the Amaranth simulator")
    ap.add_argument("--cocotb", action="store_true",
                    help="also run the cocotb testbench (sim/) on the 64-lane design and the same token")
    ap.add_argument("--layer-370m", action="store_true",
                    help="instead: one whole layer of the 370M shape (random ternary weights, 2 layers, 64-word "
                         "vocabulary) at 64x1x64 and 256x4x128 (--builds), into bench/results/rtl_layer370m.json")
    ap.add_argument("--builds", default=",".join(LAYER_BUILDS),
                    help=f"with --layer-370m: comma-separated builds among {', '.join(LAYER_BUILDS)}")
    ap.add_argument("--versus", type=Path, default=None,
                    help="a harness executable of the same build (e.g. built from an earlier revision): run the timed "
                         "tokens on it and on this revision's in alternation, side by side (64 lanes only)")
    ap.add_argument("--rounds", type=int, default=3, help="with --versus: rounds per executable (default 3)")
    ap.add_argument("--out", type=Path, default=None,
                    help="result file (default bench/results/rtl.json, or rtl_layer370m.json with --layer-370m)")
    args = ap.parse_args(argv)
    if args.layer_370m:
        out = args.out or RESULTS / "rtl_layer370m.json"
        report = {**provenance("rtl_layer370m"), "loadavg_start": os.getloadavg(), "builds": {}}
        for name in args.builds.split(","):
            if name not in LAYER_BUILDS:
                ap.error(f"unknown build {name!r}; known: {', '.join(LAYER_BUILDS)}")
            print(f"bench_rtl: 370M layer, {name} ...", file=sys.stderr, flush=True)
            r = bench_layer370m(*LAYER_BUILDS[name], n_tokens=max(1, args.tokens or 2))
            report["builds"][name] = r
            _print_layer(name, r)
        report["loadavg_end"] = os.getloadavg()
        write_json(out, report)
        print(f"wrote {out}", file=sys.stderr)
        return 0
    args.out = args.out or RESULTS / "rtl.json"
    args.tokens = 8 if args.tokens is None else args.tokens
    from host.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(MODEL)
    ids = _token_ids(checkpoint.tokenizer, args.tokens + 1)
    report = {**provenance("rtl"), "model": str(MODEL.relative_to(REPO)), "token_ids": ids,
              "tolerance": TOLERANCE, "builds": {}}
    for lanes in (int(x) for x in args.lanes.split(",")):
        bus = BUILDS.get(lanes, 64)
        print(f"bench_rtl: {lanes} lanes, {bus}-bit bus ...", file=sys.stderr, flush=True)
        r = bench_build(checkpoint, lanes, bus, args.tokens, ids, versus=args.versus if lanes == 64 else None,
                        rounds=args.rounds)
        report["builds"][str(lanes)] = r
        s = r["speed"]
        print(f"  {s['cycles_per_wall_s'] / 1e6:.3f} M cycles/s wall, {s['cycles_per_cpu_s'] / 1e6:.3f} per CPU s; "
              f"{r['cycles_per_token']['hw']:,.0f} cycles/token (model {r['cycles_per_token']['model']:,}); "
              f"efficiency {r['stream_efficiency']['hw']:.3f}; bit-exact {r['bit_exact_logits']}",
              file=sys.stderr, flush=True)
        if "side_by_side" in r:
            v = r["side_by_side"]
            print(f"  side by side: {v['median_cycles_per_cpu_s']['this'] / 1e6:.3f} against "
                  f"{v['median_cycles_per_cpu_s']['versus'] / 1e6:.3f} M cycles per CPU s (medians of "
                  f"{v['rounds']}): x{v['speedup_median_cpu']:.2f}; identical outputs {v['identical_outputs']}",
                  file=sys.stderr, flush=True)
    if args.cocotb:
        print("bench_rtl: cocotb path, 64 lanes ...", file=sys.stderr, flush=True)
        c = bench_cocotb(64, BUILDS[64], ids[0])
        report["cocotb"] = c
        if "64" in report["builds"]:
            v = report["builds"]["64"]["speed"]["same_token_as_cocotb"]
            report["speedup_vs_cocotb"] = {"wall": v["cycles_per_wall_s"] / c["cycles_per_wall_s"],
                                           "cpu_upper_bound": v["cycles_per_cpu_s"] / c["cycles_per_cpu_s_lower_bound"],
                                           "same_token_cycles": [v["sim_cycles"], c["cycles"]]}
        print(f"  cocotb {c['cycles_per_wall_s'] / 1e3:.1f} k cycles/s wall; speed-up "
              f"{report.get('speedup_vs_cocotb', {}).get('wall', float('nan')):.0f}x", file=sys.stderr, flush=True)
    if args.amaranth_cycles:
        a = bench_amaranth(checkpoint, 64, 64, args.amaranth_cycles)
        report["amaranth_sim"] = a
        if "64" in report["builds"]:
            v = report["builds"]["64"]["speed"]
            report["speedup_vs_amaranth_sim"] = {"wall": v["cycles_per_wall_s"] / a["cycles_per_wall_s"]}
    write_json(args.out, report)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
