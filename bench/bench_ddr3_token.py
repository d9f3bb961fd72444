"""Benchmark: whole tokens of the ECPIX-5 DDR3 board at the 370M shape in the C++ harness (simulated).

:mod:`sim.ddr3_token` runs ``Ddr3Ecp5Top``'s logic (``DRAMBoard`` at 128 bits, the core of the 370M bitstream
build: ``hw.boards.ecp5.DDR3_BUILD``'s lanes and quantize lanes, the 370M shape's capacities and the recurrent state
in DRAM (``state_in_dram``, served by the board's ``StateEngine``); ``Ddr3Crossings``, the LiteDRAM DDR3 simulation
core) at the ECPIX-5's core clock (``sim.ddr3_token.CORE_HZ``, 68 MHz) and a 75 MHz controller clock, with the
bundle put into the DDR3 model through a back door and the tokens driven by the host's ECP5 driver over the link's
byte streams (no UART). Each token's logits are compared bit for bit with the golden device's, and the state's
committed bank in DRAM with the golden device's state.

Writes ``bench/results/ddr3_token_370m.json`` (``--out``): provenance (command, revision, machine), ``lscpu``'s CPU,
the load average before and after, ``settings`` (the core's build, the clocks, the DRAM settings record, the
harness's Verilator and C++ flags), ``model`` (shape, seed, image and table bytes), ``build`` (seconds of the
Verilog conversion, Verilator and the C++ compile; whether it was cached), ``load_s`` (the back door and the
register writes), ``tokens`` (per token: ``bit_exact``, ``argmax``, ``cycles`` (core cycles from the ``'T'``
command to the output packet's last link byte, logits mode), ``hw_cycles`` (the core's own ``CYCLES`` counter),
``model_cycles`` (host.perf's cycle model for the build with a stream at full rate; its steady token fills every
layer's state row, which the first token after reset does not), ``dram_cycles``,
``rd_bursts``, ``read_window``, ``efficiency_read_window``, ``efficiency_token`` (bytes read over 8 bytes a
controller cycle), ``tokens_per_s`` (simulated: the core clock over ``cycles``), ``sim_wall_s``, ``cycles_per_s``,
``state_bank`` and ``state_rows_equal``), ``summary`` (the first token's figures, ``stream_efficiency`` as DESIGN.md
defines it with the core's cycles, ``bit_exact`` over all tokens and ``state_rows_equal`` over all tokens). The
first token after reset writes every layer's state row back to DRAM and fills none; later tokens (``--tokens``)
also fill each layer's row first. Every rate is labelled simulated; nothing here ran on a board.

Usage (under the heavy-job lock)::

    flock /tmp/heavy.lock .venv/bin/python -m bench.bench_ddr3_token            # one token of the 370M shape
    flock /tmp/heavy.lock .venv/bin/python -m bench.bench_ddr3_token --layers 2 --vocab 1000 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench._common import RESULTS, peak_rss_bytes, provenance, write_json

RESULT = RESULTS / "ddr3_token_370m.json"


def lscpu() -> dict:
    """``lscpu``'s model name, CPU count and threads per core (empty when lscpu is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k: fields[k].strip() for k in ("Model name", "CPU(s)", "Thread(s) per core", "Vendor ID") if k in fields}


def main(argv: list[str] | None = None) -> int:
    from host.model import HGRNBitConfig, random_weights
    from hw import dram
    from sim import ddr3_token as dt

    p = argparse.ArgumentParser(prog="python -m bench.bench_ddr3_token", description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=dt.SHAPE_370M["num_hidden_layers"],
                   help="hidden layers of the random model (default: the 370M shape's 24)")
    p.add_argument("--vocab", type=int, default=dt.SHAPE_370M["vocab_size"],
                   help="vocabulary of the random model (default: the 370M shape's 32000)")
    p.add_argument("--tokens", type=int, default=1, help="tokens to run (positions 0, 1, ...)")
    p.add_argument("--seed", type=int, default=0, help="host.model.random_weights seed")
    p.add_argument("--level", action="store_true", help="run the host's read leveling over the link first")
    p.add_argument("--out", type=Path, default=RESULT, help=f"the JSON (default: {RESULT})")
    p.add_argument("--w0-fifo-variant", type=int, default=0,
                   help="also run a variant of the board whose w0_fifo has this many entries (0: only the board as "
                        "built; the committed JSON was made with 1, the board before 8366e7c)")
    args = p.parse_args(argv)

    report = provenance("ddr3_token_370m")
    report["lscpu"] = lscpu()
    report["loadavg_start"] = list(os.getloadavg())
    shape = {**dt.SHAPE_370M, "num_hidden_layers": args.layers, "vocab_size": args.vocab}
    params = dt.design_point()
    report["settings"] = {"build": params.as_dict(), "w0_fifo_depth": dt.as_built_w0_fifo_depth(),
                          "core_hz": dt.CORE_HZ, "dram_hz": dt.DRAM_HZ,
                          "time_unit_hz": dt.TIME_UNIT_HZ, "clock_periods_units": [dt.CORE_PERIOD, dt.DRAM_PERIOD],
                          "link": "DRAMBoard rx/tx byte streams, one byte a core cycle (no UART)",
                          "dram_load": "back door into the DDR3 model's bank arrays (host.devices.ecp5.dram_contents)",
                          "dram": dram.settings_record(dram.sim_settings(dram.ECPIX5_CONFIG)),
                          "verilator_flags": dt.BUILD_FLAGS, "cxx_opt": dt.OPT_FAST, "leveling": args.level}

    t0 = time.perf_counter()
    built = dt.build(params, log=lambda s: print(s, file=sys.stderr))
    report["build"] = {**built.meta, "call_s": round(time.perf_counter() - t0, 1)}

    t0 = time.perf_counter()
    weights = random_weights(HGRNBitConfig(**shape), seed=args.seed)
    bundle = dt.compile_bundle(weights, params)
    del weights
    ids = np.random.default_rng(args.seed + 1).integers(0, shape["vocab_size"], args.tokens)
    report["model"] = {"shape": shape, "weights": f"host.model.random_weights(seed={args.seed})",
                       "token_ids": f"numpy default_rng({args.seed + 1}).integers(0, vocab)",
                       "image_bytes": len(bundle.image), "table_bytes": int(bundle.embeddings.nbytes),
                       "compile_s": round(time.perf_counter() - t0, 1)}
    print(f"model {shape}: image {len(bundle.image):,} bytes, compiled in {report['model']['compile_s']} s",
          file=sys.stderr)

    result = dt.run_case(built, bundle, ids.tolist(), level=args.level, log=lambda s: print(s, file=sys.stderr))
    report.update({k: v for k, v in result.items() if k != "harness"})
    report["harness_counters"] = result["harness"]
    report["summary"] = summary(result, bundle, params, dt.board_label(None))
    if args.w0_fifo_variant > 0:
        d = args.w0_fifo_variant
        t0 = time.perf_counter()
        variant = dt.build(params, w0_fifo_depth=d, log=lambda s: print(s, file=sys.stderr))
        meta = {**variant.meta, "call_s": round(time.perf_counter() - t0, 1)}
        res = dt.run_case(variant, bundle, ids.tolist(), level=args.level, log=lambda s: print(s, file=sys.stderr))
        report["w0_fifo_variant"] = {
            "w0_fifo_depth": d, "build": meta, "tokens": res["tokens"], "harness_counters": res["harness"],
            "summary": summary(res, bundle, params, dt.board_label(d))}
    report["loadavg_end"] = list(os.getloadavg())
    report["peak_rss_bytes_python"] = peak_rss_bytes()
    out = write_json(args.out, report)
    runs = [report["summary"]] + ([report["w0_fifo_variant"]["summary"]] if "w0_fifo_variant" in report else [])
    for s in runs:
        print(f"{out} [{s['board']}]: bit-exact {s['bit_exact']}; {s['cycles_per_token']:,} core cycles a token (core "
              f"counter {s['hw_cycles_per_token']:,}, cycle model {s['model_cycles_per_token']:,}); DRAM efficiency "
              f"{s['dram_efficiency_read_window']:.4f} (read window), {s['dram_efficiency_token']:.4f} (token); "
              f"{s['tokens_per_s_simulated']:.3f} tokens/s simulated; state rows in DRAM equal the golden state: "
              f"{s['state_rows_equal']}", file=sys.stderr)
    return 0 if all(s["bit_exact"] and s["state_rows_equal"] is not False for s in runs) else 1


def summary(result: dict, bundle, params, board: str) -> dict:
    """The first token's figures of a :func:`sim.ddr3_token.run_case` result (module docstring), with
    DESIGN.md's stream efficiency ``max(image bytes / 8, trits / lanes) / core cycles`` on the core's counter."""
    from sim import ddr3_token as dt

    first = result["tokens"][0]
    n_trits = sum(ins.n * ins.k for ins in _instructions(bundle.image))
    return {
        "board": board, "bit_exact": all(t["bit_exact"] for t in result["tokens"]),
        "state_in_dram": params.state_in_dram,
        "state_rows_equal": all(t["state_rows_equal"] for t in result["tokens"]) if params.state_in_dram else None,
        "cycles_per_token": first["cycles"], "hw_cycles_per_token": first["hw_cycles"],
        "model_cycles_per_token": first["model_cycles"],
        "hw_over_model": first["hw_cycles"] / first["model_cycles"] if first["model_cycles"] else None,
        "dram_efficiency_read_window": first["efficiency_read_window"],
        "dram_efficiency_token": first["efficiency_token"],
        "stream_efficiency": max(len(bundle.image) / 8, n_trits / params.lanes) / first["hw_cycles"],
        "tokens_per_s_simulated": first["tokens_per_s"], "sim_cycles_per_s": first["cycles_per_s"],
        "sim_wall_s": first["sim_wall_s"],
        "label": f"simulated (Verilator; {dt.CORE_HZ / 1e6:g} MHz core, {dt.DRAM_HZ / 1e6:g} MHz controller; not a "
                 "board measurement)"}


def _instructions(image: bytes):
    from host.image import parse_image
    from hw.isa import Opcode

    return [ins for ins in parse_image(image).instructions if ins.opcode is Opcode.GEMV]


if __name__ == "__main__":
    sys.exit(main())
