#!/usr/bin/env python3
"""The accuracy of the golden device's fixed-point numerics, and the format sweep behind the defaults.

(a) **Shipped model** (``models/hgrn-bit-pydoc``) on the first ``--tokens`` tokens of
    ``data/pydoc/heldout.txt``, windows of ``--context`` tokens from a zero state with BOS first (as
    :func:`host.accuracy.shipped_model_accuracy` and ``mmfree eval`` score text): perplexity of the float
    reference and of the golden device (relative difference; target <= 1 %), greedy next-token
    agreement (target >= 99 %), and the same agreement restricted to positions where the reference's
    top-2 logit gap exceeds ``--gap`` (0.05).
    **Noise floor**: the float reference against itself with its embeddings perturbed by relative
    Gaussian noise (``e * (1 + r N(0, 1))``, r = 1e-7 and 1e-6, three seeds each). A ternary / int8
    network flips activation codes at rounding boundaries and the recurrence carries each flip, so this
    bounds the agreement any implementation (however exact its arithmetic) can show against the
    reference.
(b) **Random 370M-shape model** (hidden 1024, intermediate 2816, vocabulary 32000, ``--random-layers``
    layers) with per-channel gammas spread over two decades:
    :func:`host.accuracy.random_model_accuracy` (``tokens=--random-tokens``): the minimum cosine of
    the ``o_proj`` / ``down_proj`` outputs of every layer (target >= 0.999) and of ``h`` after the
    decode (target >= 0.99); and the same measures for the float reference against itself with
    perturbed embeddings (the noise floor of (b)).
(c) **Sweep**: ``lut_segments_log2`` in ``--luts`` (6, 8, 10, 12) times formats = calibrated
    (:func:`host.compiler.calibrate`), ``Formats.uniform(L, residual=16, state=20)`` and
    ``Formats.uniform(L, 12, 16)``, on (a) (all ``--tokens`` positions) and on (b) with
    ``--sweep-random-tokens`` (256) tokens. The (calibrated, 10) point of (a) is the main measurement.
    Two more points at LUT 10: ``calibrated(headroom=2)`` (the compiler's previous headroom, on (a) and
    (b)) and, on (a), ``calibrated(text)``: ``calibrate`` fed 512 held-out tokens that follow the scored
    ones instead of its default 64 random ids. The sigmoid LUT's own error (max abs
    error of the piecewise-linear sigmoid and SiLU against float64, and ROM size) is tabulated, and so
    is how much of each calibrated format's range the scored text uses (above 1: saturation).

Usage::

    python -m bench.bench_numerics                 # everything (~10 min on 2 cores)
    python -m bench.bench_numerics --no-sweep      # (a) and (b) only

Results go to ``bench/results/numerics.json`` (``--out``); ``docs/NUMERICS.md`` discusses them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench._common import REPO, RESULTS, provenance, write_json

MODEL = REPO / "models" / "hgrn-bit-pydoc"
HELDOUT = REPO / "data" / "pydoc" / "heldout.txt"
TARGETS = {"ppl_rel_diff_max": 0.01, "greedy_agreement_min": 0.99, "min_cos_gemv_min": 0.999, "min_cos_h_min": 0.99}
FORMAT_SETS = ("calibrated", "uniform(16,20)", "uniform(12,16)")
EXTRA_POINTS = ("calibrated(headroom=2)", "calibrated(text)")   #: at LUT 10 only
TEXT_CALIBRATION_TOKENS = 512   #: held-out tokens right after the scored ones (disjoint from them)


def formats_for(name: str, weights):
    from host.compiler import Formats, calibrate

    n = weights.config.num_hidden_layers
    if name == "calibrated":
        return calibrate(weights)
    if name == "calibrated(headroom=2)":
        return calibrate(weights, headroom_bits=2)
    if name == "uniform(16,20)":
        return Formats.uniform(n, residual=16, state=20)
    if name == "uniform(12,16)":
        return Formats.uniform(n, residual=12, state=16)
    raise ValueError(name)


def format_usage(weights, formats, token_ids: np.ndarray, context: int) -> dict:
    """How much of each calibrated format's int32 range the float reference uses on scored text.

    For every quantity :func:`host.compiler.calibrate` sizes (the residual and every product of it the
    hardware forms, the state, each layer's epilogue values), the largest magnitude over the windows of
    ``token_ids`` divided by the format's range ``2**(31 - frac)``. Above 1 the golden device saturates.
    """
    from host.accuracy import scoring_windows
    from host.reference import ReferenceModel

    ref = ReferenceModel(weights)
    mx = {}

    def upd(key, v) -> None:
        m = float(np.max(np.abs(v))) if np.size(v) else 0.0
        mx[key] = max(mx.get(key, 0.0), m)

    for inp, _ in scoring_windows(token_ids, context=context):
        tr: dict = {}
        ref.forward(inp, trace=tr)
        emb = weights.embeddings[inp]
        upd("residual", emb)
        for li, lw in enumerate(weights.layers):
            x_in = emb if li == 0 else tr["x"][li - 1]
            ga = lw.attn_norm
            for v in (tr["x"][li], x_in * ga, tr["x"][li] * lw.mlp_norm * lw.gate_proj.norm,
                      *(x_in * ga * bl.norm for bl in (lw.i_proj, lw.f_proj, lw.g_proj))):
                upd("residual", v)
            upd("state", tr["h"][li])
            for k in ("i", "f", "g", "gate"):
                upd((li, k), tr[k][li])
            upd((li, "p"), tr["p"][li])
            upd((li, "p"), tr["p"][li] * lw.o_proj.norm)
            upd((li, "m"), tr["m"][li])
            upd((li, "m"), tr["m"][li] * lw.down_proj.norm)
        upd("residual", tr["x"][-1] * weights.norm * weights.lm_head.norm)

    def use(m: float, frac: int) -> dict:
        return {"frac": frac, "max_abs": m, "range": 2.0 ** (31 - frac), "used": m / 2.0 ** (31 - frac)}

    out = {"residual": use(mx["residual"], formats.residual), "state": use(mx["state"], formats.state),
           "layers": [{k: use(mx[(li, k)], getattr(lf, k)) for k in ("i", "f", "g", "p", "gate", "m")}
                      for li, lf in enumerate(formats.layers)]}
    allu = [out["residual"]["used"], out["state"]["used"]] + [v["used"] for lay in out["layers"] for v in lay.values()]
    out["max_used"] = max(allu)
    out["saturating"] = [f"layers.{li}.{k}" for li, lay in enumerate(out["layers"]) for k, v in lay.items()
                         if v["used"] > 1.0] + [k for k in ("residual", "state") if out[k]["used"] > 1.0]
    return out


def lut_error(segments_log2: int) -> dict:
    """Max abs error of the LUT sigmoid (and SiLU) against float64, on a dense grid of Q.24 inputs."""
    from hw import numerics as nx

    in_frac = 24
    table = nx.sigmoid_table(segments_log2)
    x = np.arange(-(16 << in_frac), 16 << in_frac, 1 << (in_frac - 12), dtype=np.int64)   # step 2**-12
    xf = x / float(1 << in_frac)
    sig = nx.sigmoid(x, in_frac, table, segments_log2) / float(1 << nx.GATE_FRAC)
    exact = 1.0 / (1.0 + np.exp(-xf))
    silu = nx.silu(x, in_frac, table, segments_log2) / float(1 << in_frac)
    sel = np.abs(xf) <= 8.0
    return {"segments_log2": segments_log2, "rom_entries": int(table.size), "rom_bits": int(table.size * 31),
            "sigmoid_max_abs_err": float(np.max(np.abs(sig - exact))),
            "silu_max_abs_err_|x|<=8": float(np.max(np.abs(silu[sel] - xf[sel] * exact[sel]))),
            "grid": "x in [-16, 16) step 2**-12, input Q.24"}


def agreement_by_gap(la: np.ndarray, lb: np.ndarray, gaps=(0.0, 0.05, 0.1, 0.25, 0.5, 1.0)) -> list[dict]:
    """Greedy agreement of ``lb`` with ``la`` on the positions where ``la``'s top-2 gap exceeds each gap."""
    top2 = np.partition(la.astype(np.float64), -2, axis=-1)[:, -2:]
    g = top2[:, 1] - top2[:, 0]
    same = la.argmax(-1) == lb.argmax(-1)
    out = []
    for t in gaps:
        sel = g > t
        out.append({"gap_gt": t, "positions": int(sel.sum()),
                    "agreement": float(same[sel].mean()) if sel.any() else 1.0})
    return out


def golden_logits(weights, ids, options, context: int) -> tuple[np.ndarray, float]:
    from host.accuracy import golden_window_logits
    from host.devices.golden import GoldenDevice

    t0 = time.perf_counter()
    gold = GoldenDevice(packing=options.packing, channels=options.channels, output_gate=options.output_gate)
    gold.options = options
    gold.load(weights)
    lg = golden_window_logits(gold, ids, context=context)
    return lg, time.perf_counter() - t0


def shipped(args, report: dict) -> None:
    from host.accuracy import compare_next_token, reference_window_logits, shipped_model_accuracy, with_embedding_noise
    from host.checkpoint import load_checkpoint
    from host.compiler import CompileOptions, calibrate
    from host.reference import ReferenceModel

    ckpt = load_checkpoint(MODEL)
    w = ckpt.weights
    text = HELDOUT.read_text(encoding="utf-8")
    all_ids = ckpt.tokenizer.encode(text, add_special_tokens=False).ids
    ids = np.asarray(all_ids[:args.tokens], dtype=np.int64)
    t0 = time.perf_counter()
    lr = reference_window_logits(ReferenceModel(w), ids, context=args.context)
    t_ref = time.perf_counter() - t0
    cal_ids = np.asarray(all_ids[args.tokens:args.tokens + TEXT_CALIBRATION_TOKENS], dtype=np.int64)
    fm_text = calibrate(w, token_ids=cal_ids)
    fm_cal = formats_for("calibrated", w)
    out = {"model": str(MODEL.relative_to(REPO)), "text": "data/pydoc/heldout.txt, first tokens",
           "positions": int(ids.size), "context": args.context, "gap": args.gap, "reference_s": t_ref,
           "calibrated_formats": dataclasses.asdict(fm_cal),
           "text_calibrated_formats": {
               "calibration_tokens": f"held-out tokens [{args.tokens}, {args.tokens + cal_ids.size}) "
                                     "(after the scored ones)", **dataclasses.asdict(fm_text)},
           "format_usage_on_scored_text": {
               "calibrated": format_usage(w, fm_cal, ids, args.context),
               "calibrated(headroom=2)": format_usage(w, formats_for("calibrated(headroom=2)", w), ids, args.context),
               "calibrated(text)": format_usage(w, fm_text, ids, args.context)}}

    # noise floor of the float reference
    floor = []
    for rel in args.noise:
        for seed in range(args.noise_seeds):
            wn, changed = with_embedding_noise(w, rel, seed=seed)
            ln = reference_window_logits(ReferenceModel(wn), ids, context=args.context)
            c = compare_next_token(lr, ln, ids, gap=args.gap)
            floor.append({"rel_noise": rel, "seed": seed, "embedding_elements_changed": changed, **c.as_dict(),
                          "agreement_by_gap": agreement_by_gap(lr, ln)})
            print(f"[floor] rel {rel:g} seed {seed}: agreement {c.greedy_agreement:.4f}, confident "
                  f"{c.confident_agreement:.4f} ({c.confident_positions}), ppl diff {c.ppl_rel_diff:.2e}",
                  file=sys.stderr)
    out["noise_floor"] = floor
    summary = {}
    for rel in args.noise:
        rows = [f for f in floor if f["rel_noise"] == rel]
        summary[f"{rel:g}"] = {k: float(np.mean([r[k] for r in rows]))
                               for k in ("greedy_agreement", "confident_agreement", "ppl_rel_diff")}
    out["noise_floor_mean"] = summary

    # golden vs reference: the main point and the sweep
    points = [("calibrated", 10)]
    if args.sweep:
        points += [(f, s) for f in FORMAT_SETS for s in args.luts if (f, s) != ("calibrated", 10)]
        points += [(f, 10) for f in EXTRA_POINTS]
    sweep = []
    main_logits = None
    for fname, seg in points:
        row = {"formats": fname, "lut_segments_log2": seg}
        try:
            fm = fm_text if fname == "calibrated(text)" else formats_for(fname, w)
            opts = CompileOptions(formats=fm, lut_segments_log2=seg)
            lg, secs = golden_logits(w, ids, opts, args.context)
        except ValueError as e:  # inconsistent formats are a result too
            row["error"] = str(e)
            sweep.append(row)
            print(f"[shipped] {fname} lut {seg}: {e}", file=sys.stderr)
            continue
        c = compare_next_token(lr, lg, ids, gap=args.gap)
        row.update(c.as_dict())
        row["agreement_by_gap"] = agreement_by_gap(lr, lg)
        row["seconds"] = secs
        row["meets_ppl_target"] = c.ppl_rel_diff <= TARGETS["ppl_rel_diff_max"]
        row["meets_agreement_target"] = c.greedy_agreement >= TARGETS["greedy_agreement_min"]
        sweep.append(row)
        if (fname, seg) == ("calibrated", 10):
            main_logits = lg
        print(f"[shipped] {fname} lut {seg}: ppl ref {c.ppl_a:.4f} golden {c.ppl_b:.4f} "
              f"(diff {c.ppl_rel_diff:.2e}), agreement {c.greedy_agreement:.4f}, confident "
              f"{c.confident_agreement:.4f} ({c.confident_positions}); {secs:.0f} s", file=sys.stderr)
    out["golden_vs_reference"] = sweep[0]
    out["sweep"] = sweep

    # cross-check: the library function on the default options gives the same numbers
    if args.cross_check:
        acc = shipped_model_accuracy(w, ids, context=args.context)
        main = sweep[0]
        out["cross_check_shipped_model_accuracy"] = {
            **acc.as_dict(),
            "matches": bool(abs(acc.ppl_reference - main["ppl_a"]) <= 1e-9 * main["ppl_a"]
                            and abs(acc.ppl_golden - main["ppl_b"]) <= 1e-9 * main["ppl_b"]
                            and acc.greedy_agreement == main["greedy_agreement"])}
    # where golden and reference disagree: the reference's own top-2 gaps there
    if main_logits is not None:
        top2 = np.partition(lr.astype(np.float64), -2, axis=-1)[:, -2:]
        gaps = top2[:, 1] - top2[:, 0]
        flips = lr.argmax(-1) != main_logits.argmax(-1)
        out["disagreement_reference_gaps"] = {
            "count": int(flips.sum()), "gaps": sorted(float(g) for g in gaps[flips]),
            "median_gap_all_positions": float(np.median(gaps))}
    report["shipped"] = out


def random_noise_floor(layers: int, tokens_list: list[int], rels: list[float], seed: int = 0) -> list[dict]:
    """The float reference against itself with relative embedding noise, on the random model of (b).

    Same weights and token ids as :func:`host.accuracy.random_model_accuracy` (``seed=0``: weights seed 0,
    ids seed 1), same measures: per-layer cosine of the ``o_proj`` / ``down_proj`` outputs over the
    first ``tokens`` positions and of ``h`` after ``tokens`` tokens. One 2048-token run serves every
    shorter count (its prefix).
    """
    from host.accuracy import cosine, with_embedding_noise
    from host.model import HGRNBitConfig, random_weights
    from host.reference import ReferenceModel

    cfg = HGRNBitConfig(vocab_size=32000, num_hidden_layers=layers, hidden_size=1024, intermediate_size=2816)
    w = random_weights(cfg, seed=0, gamma_spread=2.0)
    n = max(tokens_list)
    ids = np.random.default_rng(1).integers(0, 32000, n)
    ta: dict = {}
    ReferenceModel(w).forward(ids, trace=ta)
    out = []
    for rel in rels:
        wn, changed = with_embedding_noise(w, rel, seed=seed)
        tb: dict = {}
        ReferenceModel(wn).forward(ids, trace=tb)
        for t in tokens_list:
            co = [cosine(ta["o_proj"][li][:t], tb["o_proj"][li][:t]) for li in range(layers)]
            cd = [cosine(ta["down_proj"][li][:t], tb["down_proj"][li][:t]) for li in range(layers)]
            ch = [cosine(ta["h"][li][t - 1], tb["h"][li][t - 1]) for li in range(layers)]
            out.append({"rel_noise": rel, "seed": seed, "tokens": t, "embedding_elements_changed": changed,
                        "cos_o_proj": co, "cos_down_proj": cd, "cos_h": ch, "min_cos_gemv": min(co + cd),
                        "min_cos_h": min(ch)})
            print(f"[random floor] rel {rel:g} tokens {t}: min cos gemv {min(co + cd):.6f}, h {min(ch):.6f}",
                  file=sys.stderr)
    return out


def random_model(args, report: dict) -> None:
    from host.accuracy import random_model_accuracy
    from host.compiler import CompileOptions, calibrate
    from host.model import HGRNBitConfig, random_weights

    shape = {"hidden_size": 1024, "intermediate_size": 2816}
    cfg = HGRNBitConfig(vocab_size=32000, num_hidden_layers=args.random_layers, **shape)
    w = random_weights(cfg, seed=0, gamma_spread=2.0)   # the weights random_model_accuracy builds
    out = {"shape": {"vocab_size": 32000, "num_hidden_layers": args.random_layers, **shape}, "gamma_spread": 2.0,
           "seed": 0, "calibrated_formats": dataclasses.asdict(calibrate(w))}
    del w

    def one(tokens: int, fname: str, seg: int) -> dict:
        row = {"formats": fname, "lut_segments_log2": seg, "tokens": tokens}
        try:
            if fname == "calibrated":
                fm = None  # random_model_accuracy calibrates itself
            elif fname == "calibrated(headroom=2)":
                fm = calibrate(random_weights(cfg, seed=0, gamma_spread=2.0), headroom_bits=2)
            else:
                from host.compiler import Formats
                res, st = (16, 20) if fname == "uniform(16,20)" else (12, 16)
                fm = Formats.uniform(args.random_layers, residual=res, state=st)
            r = random_model_accuracy(layers=args.random_layers, tokens=tokens, gamma_spread=2.0,
                                      options=CompileOptions(formats=fm, lut_segments_log2=seg))
        except ValueError as e:
            row["error"] = str(e)
            print(f"[random] {fname} lut {seg}: {e}", file=sys.stderr)
            return row
        row.update(r.as_dict())
        row["meets_gemv_target"] = r.min_cos_gemv >= TARGETS["min_cos_gemv_min"]
        row["meets_h_target"] = r.min_cos_h >= TARGETS["min_cos_h_min"]
        print(f"[random] {fname} lut {seg} tokens {tokens}: min cos gemv {r.min_cos_gemv:.6f}, h "
              f"{r.min_cos_h:.6f}; {r.seconds:.0f} s", file=sys.stderr)
        return row

    out["noise_floor"] = random_noise_floor(args.random_layers,
                                            sorted({args.random_tokens, args.sweep_random_tokens}), args.noise)
    out["main"] = one(args.random_tokens, "calibrated", 10)
    if args.sweep:
        out["sweep"] = [one(args.sweep_random_tokens, f, s) for f in FORMAT_SETS for s in args.luts]
        out["sweep"].append(one(args.sweep_random_tokens, "calibrated(headroom=2)", 10))
    report["random_370m"] = out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048, help="held-out tokens scored (default 2048)")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--gap", type=float, default=0.05, help="top-2 logit gap of 'confident' positions")
    p.add_argument("--noise", type=float, nargs="+", default=[1e-7, 1e-6])
    p.add_argument("--noise-seeds", type=int, default=3)
    p.add_argument("--random-layers", type=int, default=2)
    p.add_argument("--random-tokens", type=int, default=2048)
    p.add_argument("--sweep-random-tokens", type=int, default=256)
    p.add_argument("--luts", type=int, nargs="+", default=[6, 8, 10, 12])
    p.add_argument("--no-sweep", dest="sweep", action="store_false")
    p.add_argument("--no-cross-check", dest="cross_check", action="store_false",
                   help="skip re-running host.accuracy.shipped_model_accuracy on the default options")
    p.add_argument("--numba-threads", type=int, default=1,
                   help="threads of the golden GEMV kernel (default 1: results are bit-identical for any "
                        "count, and one thread does not stall when other processes share the cores)")
    p.add_argument("--out", type=Path, default=RESULTS / "numerics.json")
    args = p.parse_args(argv)

    import numba

    numba.set_num_threads(args.numba_threads)

    from host import compiler
    from hw import numerics as nx

    t0 = time.perf_counter()
    report = provenance("numerics")
    report["targets"] = TARGETS
    report["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    report["loadavg_start"] = os.getloadavg()
    report["defaults"] = {"LUT_SEGMENTS_LOG2": nx.LUT_SEGMENTS_LOG2, "LUT_RANGE_LOG2": nx.LUT_RANGE_LOG2,
                          "GATE_FRAC": nx.GATE_FRAC, "RESIDUAL_FRAC": nx.RESIDUAL_FRAC, "STATE_FRAC": nx.STATE_FRAC,
                          "SSQ_SHIFT": nx.SSQ_SHIFT, "compiler.HEADROOM_BITS": compiler.HEADROOM_BITS,
                          "compiler.MIN_FRAC": compiler.MIN_FRAC, "compiler.MAX_FRAC": compiler.MAX_FRAC}
    report["lut_error"] = [lut_error(s) for s in sorted(set(args.luts) | {nx.LUT_SEGMENTS_LOG2})]
    shipped(args, report)
    write_json(args.out, report)       # partial results survive a failure in (b)
    random_model(args, report)
    report["wall_s"] = time.perf_counter() - t0
    report["loadavg_end"] = os.getloadavg()
    write_json(args.out, report)
    print(f"wrote {args.out} in {report['wall_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
