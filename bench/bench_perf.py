#!/usr/bin/env python3
"""Predicted decode performance from the cycle model (:mod:`host.perf`): **predictions, not measurements**.

For the shipped model (``models/hgrn-bit-pydoc``) and the shapes of the released 370M, 1.3B and 2.7B
checkpoints, at a few build points (lanes, channels, bus bits) and both trit packings:

* image bytes (1.6-bit vs 2-bit and the saving; the shipped model's images are compiled for real and
  must equal the plan's size, the others come from the compiler's plan, :func:`host.compiler.plan_shape`);
* predicted cycles per token and stream efficiency (DESIGN.md section 3), for the default (as-built)
  schedule and for the proposed one (every option of :class:`host.perf.BuildParams` on, 64 quantize
  lanes), plus one steady-state 370M layer;
* per board of :data:`host.perf.BOARDS`: the roofline (smallest of DRAM, ports x port bandwidth,
  channels x bus x Fmax, lanes x Fmax, with the binding resource) and the predicted tokens/s
  ``Fmax / cycles per token`` (the cycle model assumes every channel delivers a beat per cycle; where the
  board's DRAM or ports are slower than that, ``capped_tok_s`` takes the smaller);
* the 370M layer analysis: the per-instruction split of the cycles (header, prologue, body, drain) and
  the efficiency with each proposed schedule change alone and together;
* DESIGN.md section 4's figures, recomputed.

Usage::

    python -m bench.bench_perf                     # writes bench/results/perf.json
    python -m bench.bench_perf --update-doc        # also rewrites the tables in docs/PERFORMANCE_MODEL.md

Takes a few seconds (the shipped model is compiled six times; nothing of the large shapes is allocated).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from bench._common import REPO, RESULTS, provenance, write_json
from host import perf
from host.compiler import plan_shape
from host.perf import BOARDS, MODEL_FIELDS, roofline, token_prediction
from hw.isa import InstrFlags, TritPacking
from hw.params import SCHEDULE_OPTIONS, BuildParams

MODEL = REPO / "models" / "hgrn-bit-pydoc"
DOC = REPO / "docs" / "PERFORMANCE_MODEL.md"
SHAPES = {  # name: (hidden, intermediate, layers, vocab)
    "370M": (1024, 2816, 24, 32000),
    "1.3B": (2048, 5632, 24, 32000),
    "2.7B": (2560, 6912, 32, 32000),
}
BUILDS = [(64, 1, 64), (128, 1, 128), (256, 1, 256), (256, 2, 128), (256, 4, 128), (256, 2, 256), (512, 4, 128)]
PACKINGS = {"1.6-bit": TritPacking.BASE3, "2-bit": TritPacking.BITS2}
PROPOSED_QUANT_LANES = 64
NOTE = ("Predictions of the cycle model in host/perf.py (a schedule written down), not measurements: no RTL "
        "or board has run these numbers. Roofline figures use the peak bandwidths of host.perf.BOARDS.")


def schedules(lanes: int, channels: int, bus: int) -> dict[str, BuildParams]:
    return {"default": BuildParams(lanes=lanes, channels=channels, bus_bits=bus),
            "proposed": BuildParams.overlapped(lanes=lanes, channels=channels, bus_bits=bus,
                                               quant_lanes=PROPOSED_QUANT_LANES)}


def shipped_images(channels: list[int]) -> tuple[tuple[int, int, int, int], dict]:
    """Compile the shipped model for every packing and channel count; check the plans' sizes."""
    from host.checkpoint import load_checkpoint
    from host.compiler import CompileOptions, calibrate, compile_model

    ck = load_checkpoint(MODEL)
    cfg = ck.config
    shape = (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size)
    fm = calibrate(ck.weights)
    out = {}
    for pname, packing in PACKINGS.items():
        for ch in channels:
            n = len(compile_model(ck.weights, CompileOptions(packing=packing, channels=ch, formats=fm)))
            model = plan_shape(*shape, packing=packing, channels=ch).image_bytes
            if n != model:
                raise SystemExit(f"planned image size {model} != compiled {n} ({pname}, {ch} channels)")
            out[f"{pname}/{ch}ch"] = n
    return shape, out


def qc_words(prog) -> int:
    return sum(i.k for i in prog.instructions if InstrFlags.QCONST in i.flags)


def const_words(prog) -> int:
    return sum((i.k if InstrFlags.QCONST in i.flags else 0) + i.n_consts * i.n for i in prog.instructions)


def image_table(name: str, shape: tuple) -> dict:
    row = {"shape": dict(zip(("hidden", "intermediate", "layers", "vocab"), shape, strict=True))}
    progs = {p: plan_shape(*shape, packing=pk) for p, pk in PACKINGS.items()}
    row["trits"] = progs["1.6-bit"].trits
    for p, prog in progs.items():
        row[p] = {"image_bytes": {f"{ch}ch": plan_shape(*shape, packing=PACKINGS[p], channels=ch).image_bytes
                                  for ch in (1, 2, 4)},
                  "weight_bytes": prog.weight_bytes}
    one = progs["1.6-bit"]
    row["const_words"] = const_words(one)
    row["qc_words"] = qc_words(one)
    row["header_bytes"] = 64 * (1 + len(one.instructions))
    row["saving_1ch"] = 1 - row["1.6-bit"]["image_bytes"]["1ch"] / row["2-bit"]["image_bytes"]["1ch"]
    return row


def predict(shape: tuple) -> list[dict]:
    rows = []
    for pname, packing in PACKINGS.items():
        for lanes, ch, bus in BUILDS:
            prog = plan_shape(*shape, packing=packing, channels=ch)
            for sname, build in schedules(lanes, ch, bus).items():
                p = token_prediction(prog, build)
                boards = {}
                for bname, bd in BOARDS.items():
                    b = dataclasses.replace(build, fmax_mhz=bd.fmax_mhz)
                    r = roofline(p["image_bytes"], p["trits"], b, bd)
                    tok = bd.fmax_mhz * 1e6 / p["cycles"]
                    mem = min(r["dram"], r["ports"])
                    boards[bname] = {"fmax_mhz": bd.fmax_mhz, "roofline": r, "predicted_tok_s": tok,
                                     "capped_tok_s": min(tok, mem),
                                     "capped_by": "cycles" if tok <= mem else ("dram" if r["dram"] <= r["ports"]
                                                                               else "ports")}
                layer = {k: v for k, v in p["layer"].items() if k != "per_instruction"}
                rows.append({"packing": pname, "lanes": lanes, "channels": ch, "bus_bits": bus,
                             "schedule": sname, "build": build.as_dict(MODEL_FIELDS), "image_bytes": p["image_bytes"],
                             "trits": p["trits"], "cycles_per_token": p["cycles"],
                             "ideal_cycles": p["ideal_cycles"], "stream_efficiency": p["stream_efficiency"],
                             "binding": p["binding"], "parts": p["parts"], "layer": layer, "boards": boards})
    return rows


def layer_analysis() -> dict:
    """The 370M layer at matched 256-lane builds: the split of the cycles and each proposal's effect."""
    out = {}
    for lanes, ch, bus in [(256, 4, 128), (256, 2, 256)]:
        prog = plan_shape(*SHAPES["370M"], channels=ch)
        key = f"{lanes}x{ch}x{bus}"
        base = token_prediction(prog, BuildParams(lanes=lanes, channels=ch, bus_bits=bus))
        prop = token_prediction(prog, BuildParams.overlapped(lanes=lanes, channels=ch, bus_bits=bus,
                                                             quant_lanes=PROPOSED_QUANT_LANES))
        entry = {"default_layer": base["layer"], "proposed_layer": prop["layer"], "ablation": []}
        variants = [("default", {})] + [(o, {o: True}) for o in SCHEDULE_OPTIONS] + [
            ("overlap_headers+stripe_consts", {"overlap_headers": True, "stripe_consts": True}),
            ("overlap_headers+overlap_prologue", {"overlap_headers": True, "overlap_prologue": True}),
            ("all", {o: True for o in SCHEDULE_OPTIONS})]
        for ql in (8, 16, 64):
            for vname, opts in variants:
                p = token_prediction(prog, BuildParams(lanes=lanes, channels=ch, bus_bits=bus, quant_lanes=ql,
                                                       **opts))
                entry["ablation"].append({"quant_lanes": ql, "schedule": vname,
                                          "layer_efficiency": p["layer"]["stream_efficiency"],
                                          "token_efficiency": p["stream_efficiency"],
                                          "cycles_per_token": p["cycles"], "layer_parts": p["layer"]["parts"]})
        # what-if (an ISA change, not a schedule option): no QC vectors; the producing epilogue already
        # forms x * gamma_block * gamma_own for its AMAX and would store it for the consumer's prologue
        noqc = dataclasses.replace(prog, instructions=tuple(
            dataclasses.replace(i, flags=i.flags & ~InstrFlags.QCONST) for i in prog.instructions))
        entry["without_qc"] = {
            "image_bytes": noqc.image_bytes, "image_bytes_with_qc": prog.image_bytes,
            **{f"{name}_layer_efficiency": token_prediction(noqc, b)["layer"]["stream_efficiency"]
               for name, b in (("default", BuildParams(lanes=lanes, channels=ch, bus_bits=bus)),
                               ("default_q64", BuildParams(lanes=lanes, channels=ch, bus_bits=bus, quant_lanes=64)),
                               ("proposed", BuildParams.overlapped(lanes=lanes, channels=ch, bus_bits=bus,
                                                                   quant_lanes=PROPOSED_QUANT_LANES)))}}
        out[key] = entry
    return out


def design_checks(images: dict, preds: dict) -> list[dict]:
    """DESIGN.md section 4's numbers against the model."""
    m = images["370M"]
    checks = []

    def check(claim: str, value, agrees: bool, note: str = "") -> None:
        checks.append({"claim": claim, "model": value, "agrees": bool(agrees), "note": note})

    w16, w2 = m["1.6-bit"]["weight_bytes"], m["2-bit"]["weight_bytes"]
    i16, i2 = m["1.6-bit"]["image_bytes"]["1ch"], m["2-bit"]["image_bytes"]["1ch"]
    check("370M streams 341 M trits per token", m["trits"], abs(m["trits"] / 341e6 - 1) < 0.01)
    check("370M weights are 68 MB at 1.6 bit", w16, abs(w16 / 68e6 - 1) < 0.01,
          f"the whole image is {i16 / 1e6:.2f} MB: headers and constants add {(i16 - w16) / 1e6:.2f} MB "
          f"({i16 / w16 - 1:.1%})")
    check("370M weights are 85 MB at 2 bit", w2, abs(w2 / 85e6 - 1) < 0.01, f"image {i2 / 1e6:.2f} MB")
    check("the 370M 1.6-bit image is >= 18% smaller than the 2-bit one", 1 - i16 / i2, 1 - i16 / i2 >= 0.18)
    b = BuildParams(lanes=256, channels=4, bus_bits=512, fmax_mhz=250.0)
    lanes_bound = roofline(i16, m["trits"], b, BOARDS["u55c"])["lanes"]
    check("256 lanes at 250 MHz bound the 370M at ~188 tok/s", lanes_bound, abs(lanes_bound - 188) < 1.5)
    for bname, want, label in [("pynq-z2", 18, "~18 tok/s per port"), ("kv260", 70, "~70 tok/s per port"),
                               ("u55c", 210, "~210 tok/s per channel")]:
        bd = BOARDS[bname]
        v = bd.port_gbs * 1e9 / i16
        check(f"{bd.name}: 370M at 1.6 bit, {label}", v, abs(v / want - 1) < 0.05,
              f"on the weights alone {bd.port_gbs * 1e9 / w16:.1f}")
    v = 4 * BOARDS["kv260"].port_gbs * 1e9 / i16
    check("KV260: ~280 tok/s with 4 ports", v, abs(v / 280 - 1) < 0.05,
          f"= DRAM peak 19.2 GB/s; on the weights alone {4 * BOARDS['kv260'].port_gbs * 1e9 / w16:.0f}")
    for sched in ("default", "proposed"):
        row = _row(preds["370M"], "1.6-bit", sched, (256, 4, 128))
        tok = 250e6 / row["cycles_per_token"]
        check(f"the cycle model reaches that bound at 256 lanes, 4 x 128-bit channels, 250 MHz ({sched} schedule)",
              tok, tok >= 0.95 * lanes_bound,
              f"{tok / lanes_bound:.1%} of the lanes bound" + (
                  ": the rest goes to the quantize barriers, the drains and the constants channel 0 cannot prefetch"
                  if sched == "default" else ""))
    return checks


# ------------------------------------------------------------------------------------------- markdown
def _f(x: float, nd: int = 3) -> str:
    return f"{x:.{nd}f}"


def _row(rows: list[dict], packing: str, schedule: str, build: tuple) -> dict:
    return next(r for r in rows if r["packing"] == packing and r["schedule"] == schedule
                and (r["lanes"], r["channels"], r["bus_bits"]) == build)


def markdown(report: dict) -> str:
    L = []
    imgs = report["images"]
    L.append("### Image bytes (exact: the shipped model's images are compiled and compared)\n")
    L.append("| model | trits | 1.6-bit image (1 / 4 channels) | 2-bit image (1 / 4 channels) | saving | "
             "headers + constants |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for name, m in imgs.items():
        a, b = m["1.6-bit"]["image_bytes"], m["2-bit"]["image_bytes"]
        extra = a["1ch"] - m["1.6-bit"]["weight_bytes"]
        L.append(f"| {name} | {m['trits']:,} | {a['1ch']:,} / {a['4ch']:,} | {b['1ch']:,} / {b['4ch']:,} | "
                 f"{m['saving_1ch']:.1%} | {extra:,} B ({extra / a['1ch']:.1%}) |")
    L.append("")
    L.append("### Cycles per token and stream efficiency (1.6-bit; default schedule → proposed schedule)\n")
    L.append("Proposed = every `BuildParams` schedule option on, 64 quantize lanes, 1024-beat weight FIFOs. "
             "*layer* = one steady-state layer (mean of layers 1..L-2).\n")
    L.append("| model | lanes×ch×bus | binding | cycles/token | efficiency (token) | efficiency (layer) |")
    L.append("|---|---|---|---:|---:|---:|")
    for name, rows in report["predictions"].items():
        for lanes, ch, bus in BUILDS:
            d, p = (_row(rows, "1.6-bit", s, (lanes, ch, bus)) for s in ("default", "proposed"))
            L.append(f"| {name} | {lanes}×{ch}×{bus} | {d['binding']} | {d['cycles_per_token']:,} → "
                     f"{p['cycles_per_token']:,} | {_f(d['stream_efficiency'])} → {_f(p['stream_efficiency'])} | "
                     f"{_f(d['layer']['stream_efficiency'])} → {_f(p['layer']['stream_efficiency'])} |")
    L.append("")
    L.append("2-bit packing, 370M (same columns):\n")
    L.append("| lanes×ch×bus | binding | cycles/token | efficiency (token) | efficiency (layer) |")
    L.append("|---|---|---:|---:|---:|")
    rows = report["predictions"]["370M"]
    for lanes, ch, bus in BUILDS:
        d, p = (_row(rows, "2-bit", s, (lanes, ch, bus)) for s in ("default", "proposed"))
        L.append(f"| {lanes}×{ch}×{bus} | {d['binding']} | {d['cycles_per_token']:,} → {p['cycles_per_token']:,} | "
                 f"{_f(d['stream_efficiency'])} → {_f(p['stream_efficiency'])} | "
                 f"{_f(d['layer']['stream_efficiency'])} → {_f(p['layer']['stream_efficiency'])} |")
    L.append("")
    L.append("### Boards: 370M at 1.6 bit, each build clocked at the board's Fmax\n")
    L.append("Roofline = min(DRAM, min(channels, ports) × port, channels × bus × Fmax, lanes × Fmax) on the "
             "image bytes and trits. *Predicted* = Fmax / cycles per token (default → proposed). *Capped* also "
             "applies the DRAM and port rates, which the cycle model itself does not see. Resource fit (LUTs, "
             "DSPs, BRAM for the lanes) is not modelled: a 512-lane build on a Zynq-7020 is a bound, not a plan.\n")
    L.append("| board | Fmax | lanes×ch×bus | roofline tok/s (binding) | predicted tok/s | capped tok/s |")
    L.append("|---|---:|---|---:|---:|---:|")
    for bname in BOARDS:
        for lanes, ch, bus in BUILDS:
            d, p = (_row(rows, "1.6-bit", s, (lanes, ch, bus)) for s in ("default", "proposed"))
            bd, bp = d["boards"][bname], p["boards"][bname]
            r = bd["roofline"]
            L.append(f"| {bname} | {bd['fmax_mhz']:.0f} | {lanes}×{ch}×{bus} | {r['bound']:.1f} ({r['binding']}) | "
                     f"{bd['predicted_tok_s']:.1f} → {bp['predicted_tok_s']:.1f} | "
                     f"{bd['capped_tok_s']:.1f} → {bp['capped_tok_s']:.1f} |")
    L.append("")
    L.append(f"### Other models: predicted tok/s on the KV260 ({BOARDS['kv260'].fmax_mhz:.0f} MHz) and the U55C "
             f"({BOARDS['u55c'].fmax_mhz:.0f} MHz), 1.6 bit\n")
    L.append("| model | lanes×ch×bus | KV260 roofline (binding) | KV260 capped | U55C roofline (binding) | "
             "U55C capped |")
    L.append("|---|---|---:|---:|---:|---:|")
    for name in ("shipped", "1.3B", "2.7B"):
        for lanes, ch, bus in [(256, 4, 128), (512, 4, 128)]:
            d, p = (_row(report["predictions"][name], "1.6-bit", s, (lanes, ch, bus)) for s in ("default", "proposed"))
            cells = []
            for bname in ("kv260", "u55c"):
                r = d["boards"][bname]["roofline"]
                cells.append(f"{r['bound']:.1f} ({r['binding']})")
                cells.append(f"{d['boards'][bname]['capped_tok_s']:.1f} → {p['boards'][bname]['capped_tok_s']:.1f}")
            L.append(f"| {name} | {lanes}×{ch}×{bus} | " + " | ".join(cells) + " |")
    L.append("")
    an = report["layer_analysis"]["256x4x128"]
    shapes = {i.name: i for i in plan_shape(*SHAPES["370M"], channels=4).instructions}
    for which, title in (("default_layer", "default schedule"),
                         ("proposed_layer", f"proposed schedule ({PROPOSED_QUANT_LANES} quantize lanes)")):
        lay = an[which]
        L.append(f"### One 370M layer at 256 lanes × 4 channels × 128 bits, {title}\n")
        L.append(f"Ideal (lanes-bound) {lay['ideal_cycles']:,.0f} cycles; predicted {lay['cycles']:,.0f}; "
                 f"efficiency {_f(lay['stream_efficiency'])}. Critical-path cycles each instruction adds, by cause "
                 "(`host.perf.Step`).\n")
        L.append("| instruction | N×K | header | prologue | body | drain | cycles |")
        L.append("|---|---|---:|---:|---:|---:|---:|")
        for s in lay["per_instruction"]:
            i = shapes[s["name"]]
            L.append(f"| {s['name'].split('.', 2)[-1]} | {i.n}×{i.k} | {s['header']} | {s['prologue']} | "
                     f"{s['body']} | {s['drain']} | {s['cycles']:,} |")
        t = lay["parts"]
        L.append(f"| **layer** | | **{t['header']:,.0f}** | **{t['prologue']:,.0f}** | **{t['body']:,.0f}** | "
                 f"**{t['drain']:,.0f}** | **{lay['cycles']:,.0f}** |")
        L.append("")
    L.append("### Each proposal alone and together (370M layer efficiency; token efficiency in the JSON)\n")
    L.append("| schedule | 256×4×128, 8 quant lanes | 16 | 64 | 256×2×256, 8 quant lanes | 16 | 64 |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    names = list(dict.fromkeys(a["schedule"] for a in an["ablation"]))
    for n in names:
        cells = []
        for key in ("256x4x128", "256x2x256"):
            for ql in (8, 16, 64):
                a = next(a for a in report["layer_analysis"][key]["ablation"]
                         if a["schedule"] == n and a["quant_lanes"] == ql)
                cells.append(_f(a["layer_efficiency"]))
        L.append(f"| {n} | " + " | ".join(cells) + " |")
    L.append("")
    L.append("What-if without QC vectors (an ISA change: the producer's epilogue stores the products it already "
             "forms for its AMAX reductions, so the consumer's prologue needs no QC; the image shrinks by the QC "
             "words):\n")
    L.append("| build | image bytes (with QC → without) | layer efficiency default | default, 64 quant lanes | "
             "proposed |")
    L.append("|---|---:|---:|---:|---:|")
    for key in ("256x4x128", "256x2x256"):
        w = report["layer_analysis"][key]["without_qc"]
        base = report["layer_analysis"][key]
        d8 = next(a for a in base["ablation"] if a["schedule"] == "default" and a["quant_lanes"] == 8)
        d64 = next(a for a in base["ablation"] if a["schedule"] == "default" and a["quant_lanes"] == 64)
        pr = next(a for a in base["ablation"] if a["schedule"] == "all" and a["quant_lanes"] == 64)
        L.append(f"| {key.replace('x', '×')} | {w['image_bytes_with_qc']:,} → {w['image_bytes']:,} | "
                 f"{_f(d8['layer_efficiency'])} → {_f(w['default_layer_efficiency'])} | "
                 f"{_f(d64['layer_efficiency'])} → {_f(w['default_q64_layer_efficiency'])} | "
                 f"{_f(pr['layer_efficiency'])} → {_f(w['proposed_layer_efficiency'])} |")
    L.append("")
    L.append("### DESIGN.md section 4, recomputed\n")
    L.append("| claim | model | agrees | note |")
    L.append("|---|---:|---|---|")
    for c in report["design_checks"]:
        v = c["model"]
        vs = f"{v:,}" if isinstance(v, int) else (f"{v:.1%}" if v < 1 else f"{v:,.1f}")
        L.append(f"| {c['claim']} | {vs} | {'yes' if c['agrees'] else '**no**'} | {c['note']} |")
    return "\n".join(L) + "\n"


BEGIN = "<!-- BEGIN TABLES: generated by python -m bench.bench_perf --update-doc; do not edit by hand -->"
END = "<!-- END TABLES -->"


def update_doc(tables: str, report: dict) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} lacks the generated-tables markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    stamp = (f"*Generated {report['timestamp']} by `{report['command_short']}` at revision "
             f"`{report['git']['describe']}`. {NOTE}*\n\n")
    DOC.write_text(head + BEGIN + "\n\n" + stamp + tables + "\n" + END + tail)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS / "perf.json")
    p.add_argument("--update-doc", action="store_true", help=f"rewrite the tables in {DOC.relative_to(REPO)}")
    p.add_argument("--print", action="store_true", help="print the markdown tables")
    args = p.parse_args(argv)

    report = provenance("perf")
    args_given = argv if argv is not None else sys.argv[1:]
    report["command_short"] = " ".join(["python -m bench.bench_perf", *args_given])
    report["note"] = NOTE
    report["model_constants"] = {k: getattr(perf, k) for k in ("SCALAR_CYCLES", "RECIP_CYCLES", "QUANT_LATENCY",
                                                               "EPILOGUE_LATENCY", "OUTPUT_CYCLES")}
    report["boards"] = {k: {**dataclasses.asdict(v), "design": v.design.device_kwargs()} for k, v in BOARDS.items()}
    report["builds"] = [dict(zip(("lanes", "channels", "bus_bits"), b, strict=True)) for b in BUILDS]
    report["proposed_schedule"] = BuildParams.overlapped(quant_lanes=PROPOSED_QUANT_LANES).as_dict(MODEL_FIELDS)
    shipped_shape, compiled = shipped_images(sorted({ch for _, ch, _ in BUILDS} | {1, 2, 4}))
    shapes = {"shipped": shipped_shape, **SHAPES}
    report["shipped_compiled_image_bytes"] = compiled
    report["images"] = {name: image_table(name, s) for name, s in shapes.items()}
    report["predictions"] = {name: predict(s) for name, s in shapes.items()}
    report["layer_analysis"] = layer_analysis()
    report["design_checks"] = design_checks(report["images"], report["predictions"])
    m = report["images"]["370M"]
    report["qc_removal_saving_370m_bytes"] = 4 * m["qc_words"]
    write_json(args.out, report)
    tables = markdown(report)
    if args.print:
        print(tables)
    if args.update_doc:
        update_doc(tables, report)
    s370 = report["images"]["370M"]
    print(f"wrote {args.out}: 370M image {s370['1.6-bit']['image_bytes']['1ch']:,} B at 1.6 bit, "
          f"{s370['2-bit']['image_bytes']['1ch']:,} B at 2 bit ({s370['saving_1ch']:.1%} smaller); "
          f"design checks: {sum(c['agrees'] for c in report['design_checks'])}/{len(report['design_checks'])} agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
