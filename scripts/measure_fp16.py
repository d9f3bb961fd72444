#!/usr/bin/env python3
"""What running a checkpoint in float16, as the released ``generate.py`` does (``model.half()``), changes.

The float32 model is ``scripts/train_hgrn_bit.py``'s (the released numerics: ``FusedBitLinear``, half
away from zero activation codes, ``weight_quant`` in float32). The float16 model is the same code with the
dtypes of the released kernels when the model is in float16 and no autocast is on:

* ``FusedBitLinear`` (``layer_norm_linear_quant_fn``): RMSNorm and the absmax int8 codes in float32
  inside the kernel, the dequantized activations stored in float16; ``weight_quant`` of the float16
  latent weights entirely in float16 (``mean|W|``, ``1 / mean``, ``W * s``, ``round``); the GEMM in float16.
* ``RMSNorm`` / ``FusedRMSNormSwishGate`` / ``swiglu``: float32 inside, float16 out; the pre-norm residual
  sum formed in float32 and stored in float16; ``sigmoid``, the lower bounds and ``1 - f`` in float16.
* ``fused_recurrent_hgrn``: the state is float32 inside one call, each output ``h_t`` and the final
  state are stored in float16 (``o = torch.empty_like(x)``, ``final_state = x.new_empty(...)``), so in
  token-by-token decoding the state passes through float16 between tokens.

It reports (a) the share of trits that change when ``weight_quant`` runs in float16, (b) the logits of the
float16 model against the float32 one on held-out text, in units of the float32 logits' standard
deviation at each position, greedy agreement, and held-out perplexity, split into the trits' share and
the rest's, and (c) the effect of keeping the recurrent state in float16 between decode steps. Needs
PyTorch; a GPU to measure what CUDA computes. Not imported by the tests.

Usage::

    python scripts/measure_fp16.py --model models/hgrn-bit-pydoc --json fp16.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import train_hgrn_bit as T  # noqa: E402  (the model code of the training script)


# --------------------------------------------------------------------- the model in a runtime dtype
def _rms(x, weight, eps, dt):
    """Triton RMSNorm: float32 inside, output in ``dt``."""
    return T.rms_norm(x.float(), weight.float(), eps).to(dt)


def _bitlinear(lin, x, dt, wq_dt=None):
    """``FusedBitLinear.forward`` with the module's parameters already in ``dt``.

    ``weight_quant`` runs in ``wq_dt`` (default ``dt``, as released), its result cast to ``dt``.
    """
    u = T.rms_norm(x.float(), lin.norm.weight.float(), lin.norm.eps)
    y = T.activation_quant(u).to(dt)                    # stored in the output dtype
    trits, s = T.weight_trits(lin.weight.to(wq_dt or dt))
    return F.linear(y, (trits / s).to(dt))


def _swiglu(a, b, dt):
    return (F.silu(a.float()) * b.float()).to(dt)


def forward_rt(m, ids, dt, state=None, state_dt=None, wq_dt=None):
    """Logits (float32) and final states of ``m`` (parameters in ``dt``) on ids [B, T].

    ``state``: per-layer [B, D] tensors (any dtype) or None; the returned states are in ``state_dt``
    (default ``dt``, as the released kernel stores them). ``wq_dt``: dtype of ``weight_quant``
    (default ``dt``).
    """
    def bl(lin, v):
        return _bitlinear(lin, v, dt, wq_dt)

    state_dt = state_dt or dt
    x = m.model.embeddings.weight[ids]
    lbs = m.model.lower_bounds.softmax(0)
    lbs = lbs.cumsum(0) - lbs[0]
    new_state = []
    for li, layer in enumerate(m.model.layers):
        at = layer.attn
        residual = x
        h_in = _rms(x, layer.attn_norm.weight, layer.attn_norm.eps, dt)
        i = bl(at.i_proj, h_in)
        f = bl(at.f_proj, h_in).sigmoid()
        if li > 0:
            f = lbs[li] + (1 - lbs[li]) * f
        c = _swiglu(i, 1 - f, dt)
        h = torch.zeros(ids.shape[0], x.shape[-1], dtype=torch.float32, device=x.device) \
            if state is None else state[li].float()
        outs = []
        for t in range(ids.shape[1]):
            h = f[:, t].float() * h + c[:, t].float()
            outs.append(h.to(dt))
        new_state.append(h.to(state_dt))
        o = torch.stack(outs, 1)
        g = bl(at.g_proj, h_in)
        gated = (T.rms_norm(g.float(), at.g_norm.weight.float(), at.g_norm.eps) * F.silu(o.float())).to(dt)
        a = bl(at.o_proj, gated)
        s32 = a.float() + residual.float()
        residual = s32.to(dt)
        h_mlp = _rms(s32, layer.mlp_norm.weight, layer.mlp_norm.eps, dt)
        ga, gb = bl(layer.mlp.gate_proj, h_mlp).chunk(2, -1)
        x = residual + bl(layer.mlp.down_proj, _swiglu(ga, gb, dt))
    x = _rms(x, m.model.norm.weight, m.model.norm.eps, dt)
    return bl(m.lm_head, x).float(), new_state


def decode_rt(m, ids, dt, state_dt):
    """Token by token (one call per token, the state kept in ``state_dt`` between calls)."""
    state, out = None, []
    for t in range(ids.shape[1]):
        lg, state = forward_rt(m, ids[:, t:t + 1], dt, state, state_dt)
        out.append(lg)
    return torch.cat(out, 1)


@torch.no_grad()
def greedy(m, prompt, n, dt, state_dt):
    lg, state = forward_rt(m, prompt, dt, None, state_dt)
    tok, out = lg[:, -1].argmax(-1, keepdim=True), []
    for _ in range(n):
        out.append(int(tok))
        lg, state = forward_rt(m, tok, dt, state, state_dt)
        tok = lg[:, -1].argmax(-1, keepdim=True)
    return out


# ---------------------------------------------------------------------------------------- metrics
def compare(ref, other, tgt):
    """Per-position max|d| and rms(d) in units of std(ref), greedy agreement, NLLs; ref/other [T, V]."""
    std = ref.std(-1)
    d = (other - ref).abs()
    mx = (d.amax(-1) / std).cpu().numpy()
    rms = (d.pow(2).mean(-1).sqrt() / std).cpu().numpy()
    nll_ref = F.cross_entropy(ref, tgt).item()
    nll_o = F.cross_entropy(other, tgt).item()
    return {"max_abs_diff_over_std": {"median": float(np.median(mx)), "max": float(mx.max()),
                                      "mean": float(mx.mean())},
            "rms_diff_over_std": {"median": float(np.median(rms)), "max": float(rms.max())},
            "greedy_agreement": float((ref.argmax(-1) == other.argmax(-1)).float().mean()),
            "positions": int(ref.shape[0]), "nll_fp32": nll_ref, "nll_this": nll_o}


def trit_flips(model, device):
    rows, total, flips = [], 0, 0
    for name, p in model.named_parameters():
        if not (name.endswith("_proj.weight") or name == "lm_head.weight"):
            continue
        w32 = p.detach().to(device, torch.float32)
        t32, s32 = T.weight_trits(w32)
        w16 = w32.half()
        t16, s16 = T.weight_trits(w16)
        n = int((t32 != t16.float()).sum())
        rows.append({"tensor": name, "numel": w32.numel(), "flipped": n, "share": n / w32.numel(),
                     "scale_fp32": float(s32), "scale_fp16": float(s16)})
        total += w32.numel()
        flips += n
    worst = max(rows, key=lambda r: r["share"])
    return {"total_trits": total, "flipped": flips, "share": flips / total,
            "max_share_per_tensor": worst["share"], "max_share_tensor": worst["tensor"], "per_tensor": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models/hgrn-bit-pydoc")
    ap.add_argument("--text", type=Path, default=ROOT / "data/pydoc/heldout.txt")
    ap.add_argument("--positions", type=int, default=512, help="BOS + the first POSITIONS-1 tokens")
    ap.add_argument("--gen", type=int, default=128, help="greedy tokens generated in each dtype")
    ap.add_argument("--heldout-windows", type=int, default=-1,
                    help="512-token windows of --text for the perplexity in each dtype (-1: all)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    t0 = time.time()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    toks = T.load_tokens(tok, args.text)
    model32 = T.load_hf(args.model).to(device).eval()
    m16 = copy.deepcopy(model32).half()
    res = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
           "model": str(args.model), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "platform": platform.platform()}
    try:
        res["revision"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                         text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        res["revision"] = os.environ.get("MMFREE_REVISION")  # a copy of the tree without .git

    with torch.no_grad():
        res["a_trit_flips_fp16_weight_quant"] = trit_flips(model32, device)

        n = args.positions
        ids = torch.from_numpy(np.concatenate([[1], toks[: n - 1]]).astype(np.int64))[None].to(device)
        tgt = torch.from_numpy(toks[:n].astype(np.int64)).to(device)
        ref, _ = forward_rt(model32, ids, torch.float32)
        own, _ = model32(ids, chunk=0)
        variants = {
            "fp32_parallel_vs_training_module": own,
            "fp32_decode": decode_rt(model32, ids, torch.float32, torch.float32),
            "fp16_parallel": forward_rt(m16, ids, torch.float16)[0],
            "fp16_decode_state_fp16": decode_rt(m16, ids, torch.float16, torch.float16),
            "fp16_decode_state_fp32": decode_rt(m16, ids, torch.float16, torch.float32),
            "fp32_decode_state_fp16": decode_rt(model32, ids, torch.float32, torch.float16),
            # which part of float16 matters: only the trits (weight_quant in float16, the rest float32),
            # or everything but the trits (weight_quant in float32, the rest float16)
            "fp32_with_fp16_trits_parallel": forward_rt(model32, ids, torch.float32, wq_dt=torch.float16)[0],
            "fp16_with_fp32_trits_parallel": forward_rt(m16, ids, torch.float16, wq_dt=torch.float32)[0],
        }
        res["b_logits_vs_fp32_parallel"] = {k: compare(ref[0], v[0], tgt) for k, v in variants.items()}
        res["b_logits_note"] = (f"ids = BOS + the first {n - 1} tokens of {args.text.name}; reference: "
                                "float32, one parallel call; diffs per position over the vocabulary, divided "
                                "by the std of the float32 logits at that position; decode = one call per "
                                "token, state_* = the dtype the state is kept in between calls")

        prompt = ids[:, :32]
        g32 = greedy(model32, prompt, args.gen, torch.float32, torch.float32)
        gens = {"fp16_state_fp16": greedy(m16, prompt, args.gen, torch.float16, torch.float16),
                "fp16_state_fp32": greedy(m16, prompt, args.gen, torch.float16, torch.float32)}
        res["b_free_greedy"] = {"prompt_tokens": 32, "generated": args.gen, **{
            k: {"first_divergence": next((i for i, (a, b) in enumerate(zip(g32, g, strict=True)) if a != b), None),
                "same_tokens": sum(a == b for a, b in zip(g32, g, strict=True))} for k, g in gens.items()}}

        # held-out perplexity in each dtype, 512-token windows from a zero state (one call each)
        wins = [toks[s:s + 512] for s in range(0, len(toks), 512)]
        if args.heldout_windows >= 0:
            wins = wins[: args.heldout_windows]
        runs = {"fp32": (model32, torch.float32, None), "fp16": (m16, torch.float16, None),
                "fp32_with_fp16_trits": (model32, torch.float32, torch.float16),
                "fp16_with_fp32_trits": (m16, torch.float16, torch.float32)}
        nll = dict.fromkeys(runs, 0.0)
        count = 0
        full = [w for w in wins if len(w) == 512]
        rest = [w for w in wins if len(w) != 512]
        groups = [full[k:k + 64] for k in range(0, len(full), 64)] + [[w] for w in rest]
        for grp in groups:
            w = torch.from_numpy(np.stack(grp).astype(np.int64)).to(device)
            inp = torch.cat([torch.ones_like(w[:, :1]), w[:, :-1]], 1)
            for key, (mm, dt, wq) in runs.items():
                lg, _ = forward_rt(mm, inp, dt, wq_dt=wq)
                nll[key] += F.cross_entropy(lg.flatten(0, 1), w.flatten(), reduction="sum").item()
            count += w.numel()
        res["heldout"] = {"tokens": count, "windows": len(wins), **{
            f"perplexity_{k}": math.exp(v / count) for k, v in nll.items()},
            **{f"nll_per_token_{k}": v / count for k, v in nll.items()}}
    res["seconds"] = time.time() - t0
    brief = {k: res[k] for k in ("device", "revision", "seconds", "heldout", "b_free_greedy")}
    brief["a"] = {k: v for k, v in res["a_trit_flips_fp16_weight_quant"].items() if k != "per_tensor"}
    brief["b"] = {k: {"max/std": v["max_abs_diff_over_std"], "greedy": v["greedy_agreement"]}
                  for k, v in res["b_logits_vs_fp32_parallel"].items()}
    print(json.dumps(brief, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
