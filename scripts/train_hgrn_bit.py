#!/usr/bin/env python3
"""Quantization-aware training of a small HGRN-Bit ("MatMul-free LM") model.

The model is the architecture of Zhu et al., *Scalable MatMul-free Language Modeling* (arXiv 2406.02528)
as released in ``ridgerchu/matmulfreellm``, with the same parameter names as the Hugging Face
checkpoints ``ridger/MMfreeLM-*``, so ``host.checkpoint`` reads what this script writes exactly as it
reads the released models:

* BitLinear, with the numerics of the released inference path (``FusedBitLinear.forward`` of
  ``mmfreelm/ops/fusedbitnet.py``), in float32 even under bfloat16 autocast: ``u = RMSNorm(x) * gamma``
  with eps ``bitlinear_norm_eps`` of the config (default 1e-6: ``FusedBitLinear`` calls
  ``layer_norm_linear_quant_fn`` without an eps, so that function's default applies, not the 1e-8 given
  to ``BitLinear.__init__``'s unused ``RMSNorm``); per-token absmax int8 codes
  ``q = clamp(round(u * 127 / max(max|u|, 1e-5)), -128, 127)`` with ``round`` half away from zero (the
  Triton kernel's libdevice ``round``; :func:`round_half_away`, exact); absmean ternary weights as the
  released ``weight_quant``: ``s = 1 / max(mean|W|, 1e-5)``, ``trits = clamp(round(W * s), -1, 1)``
  (``torch.round``, half to even), dequantized ``trits / s``. Both through a straight-through estimator
  whose forward value is exactly the quantized one (``q(x).detach() + (x - x.detach())``). The saved
  ``config.json`` states ``bitlinear_norm_eps``.
* MLGRU token mixer: ``f = sigmoid(f_proj)``, ``f = lb + (1 - lb) f`` beyond layer 0 with the per-channel
  lower bounds ``cumsum(softmax(P, 0)) - softmax(P, 0)[0]``, ``i = SiLU(i_proj) (1 - f)``,
  ``h_t = f_t h_{t-1} + i_t``, ``o = o_proj(RMSNorm(g_proj) * gamma_g * SiLU(h))``.
* GLU channel mixer ``down_proj(SiLU(a) * b)`` with ``[a, b] = gate_proj(x)``; pre-norm residual
  blocks, final RMSNorm, untied BitLinear LM head.

Training runs the recurrence as a chunked parallel scan (exact up to float rounding); the fixture that
pins the numpy reference is computed afterwards with the plain sequential recurrence in float32 on the
CPU, from the bfloat16 checkpoint as saved.

Needs PyTorch (the ``train`` extra), ``tokenizers``, ``safetensors`` and ``numpy``. The shipped model
was trained with (see ``models/hgrn-bit-pydoc/README.md``)::

    python scripts/prepare_corpus.py
    python scripts/train_hgrn_bit.py --out models/hgrn-bit-pydoc --time-budget 400
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- model
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def round_half_away(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest integer, ties away from zero (libdevice ``round``, C ``roundf``), exactly.

    ``sign(v) * floor(|v| + 0.5)`` is not exact in floating point (``0.49999997 + 0.5`` rounds up to 1);
    ``v - trunc(v)`` is exact, so comparing it with 0.5 is.
    """
    t = torch.trunc(v)
    return t + torch.sign(v) * ((v - t).abs() >= 0.5).to(v.dtype)


def activation_quant(x: torch.Tensor) -> torch.Tensor:
    """Per-token absmax int8 fake quantization, as ``_layer_norm_fwd_quant_kernel`` (dtype of ``x``)."""
    scale = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    return round_half_away(x * scale).clamp(-128, 127) / scale


def weight_trits(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The released ``weight_quant``'s trits and scale ``s`` (``trits / s`` dequantized), in ``w``'s dtype.

    ``s = 1 / max(mean|W|, 1e-5)``, ``trits = clamp(round(W * s), -1, 1)`` with ``torch.round`` (half to
    even). Training passes float32; ``scripts/measure_fp16.py`` passes float16 to see what the released
    ``generate.py`` (``model.half()``) computes.
    """
    s = 1.0 / w.abs().mean().clamp(min=1e-5)
    return (w * s).round().clamp(-1, 1), s


def weight_quant(w: torch.Tensor) -> torch.Tensor:
    trits, s = weight_trits(w)
    return trits / s


class BitLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, norm_eps: float = 1e-6):
        super().__init__(in_features, out_features, bias=False)
        self.norm = RMSNorm(in_features, eps=norm_eps)

    def forward(self, x):
        # The norm and both quantizations in float32 whatever the autocast; the GEMM under it.
        # Straight-through estimators written ``q.detach() + (x - x.detach())``: the forward value is
        # exactly q (x - x is 0), where ``x + (q - x).detach()`` would be q up to float rounding.
        with torch.autocast(x.device.type, enabled=False):
            x = self.norm(x.float())
            xq = activation_quant(x).detach() + (x - x.detach())
            w = self.weight.float()
            wq = weight_quant(w).detach() + (w - w.detach())
        return F.linear(xq, wq)  # under autocast this GEMM runs in bfloat16


def hgrn_scan(i: torch.Tensor, f: torch.Tensor, h0: torch.Tensor | None, chunk: int) -> torch.Tensor:
    """``h_t = f_t h_{t-1} + i_t`` over [B, T, D]; chunked parallel form (chunk=0: sequential loop)."""
    B, T, D = i.shape
    h = torch.zeros(B, D, dtype=torch.float32, device=i.device) if h0 is None else h0.float()
    i, f = i.float(), f.float()
    if chunk <= 0:
        out = []
        for t in range(T):
            h = f[:, t] * h + i[:, t]
            out.append(h)
        return torch.stack(out, 1)
    outs = []
    mask = torch.ones(chunk, chunk, dtype=torch.bool, device=i.device).tril()
    for s in range(0, T, chunk):
        fi, ii = f[:, s:s + chunk], i[:, s:s + chunk]
        c = fi.shape[1]
        a = torch.log(fi.clamp(min=1e-30)).cumsum(1)                     # [B, c, D]
        diff = a[:, :, None, :] - a[:, None, :, :]                         # [B, t, s, D]
        decay = torch.exp(diff.masked_fill(~mask[:c, :c, None], -float("inf")))
        hc = torch.einsum("btsd,bsd->btd", decay, ii) + torch.exp(a) * h[:, None, :]
        outs.append(hc)
        h = hc[:, -1]
    return torch.cat(outs, 1)


class HGRNBitAttention(nn.Module):
    def __init__(self, hidden: int, eps: float, layer_idx: int, bl_eps: float = 1e-6):
        super().__init__()
        self.layer_idx = layer_idx
        self.i_proj = BitLinear(hidden, hidden, bl_eps)
        self.f_proj = BitLinear(hidden, hidden, bl_eps)
        self.g_proj = BitLinear(hidden, hidden, bl_eps)
        self.g_norm = RMSNorm(hidden, eps)
        self.o_proj = BitLinear(hidden, hidden, bl_eps)

    def forward(self, x, lower_bound, h0, chunk):
        i = self.i_proj(x).float()
        f = torch.sigmoid(self.f_proj(x).float())
        if lower_bound is not None and self.layer_idx > 0:
            f = lower_bound + (1 - lower_bound) * f
        i = F.silu(i) * (1 - f)
        h = hgrn_scan(i, f, h0, chunk)
        o = rms_norm(self.g_proj(x).float(), self.g_norm.weight, self.g_norm.eps) * F.silu(h)
        return self.o_proj(o), h[:, -1]


class HGRNBitMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bl_eps: float = 1e-6):
        super().__init__()
        self.gate_proj = BitLinear(hidden, 2 * intermediate, bl_eps)
        self.down_proj = BitLinear(intermediate, hidden, bl_eps)

    def forward(self, x):
        a, b = self.gate_proj(x).float().chunk(2, -1)
        return self.down_proj(F.silu(a) * b)


class HGRNBitBlock(nn.Module):
    def __init__(self, cfg: dict, layer_idx: int):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        bl_eps = cfg.get("bitlinear_norm_eps", 1e-6)
        self.attn_norm = RMSNorm(h, eps)
        self.attn = HGRNBitAttention(h, eps, layer_idx, bl_eps)
        self.mlp_norm = RMSNorm(h, eps)
        self.mlp = HGRNBitMLP(h, cfg["intermediate_size"], bl_eps)

    def forward(self, x, lower_bound, h0, chunk):
        a, h_last = self.attn(self.attn_norm(x), lower_bound, h0, chunk)
        x = x + a.float()
        x = x + self.mlp(self.mlp_norm(x)).float()
        return x, h_last


class HGRNBitModel(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.embeddings = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.lower_bounds = nn.Parameter(torch.zeros(cfg["num_hidden_layers"], cfg["hidden_size"]))
        self.layers = nn.ModuleList(HGRNBitBlock(cfg, i) for i in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class HGRNBitForCausalLM(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.model = HGRNBitModel(cfg)
        self.lm_head = BitLinear(cfg["hidden_size"], cfg["vocab_size"], cfg.get("bitlinear_norm_eps", 1e-6))
        self._init()

    def _init(self):
        n = self.cfg["num_hidden_layers"]
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            if name == "model.lower_bounds":
                nn.init.zeros_(p)
            elif ".attn." in name and name.endswith("_proj.weight"):
                nn.init.xavier_uniform_(p, gain=2 ** -2.5)
            else:
                nn.init.normal_(p, std=0.02)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                with torch.no_grad():
                    p /= math.sqrt(2 * n)

    def forward(self, ids: torch.Tensor, state: list | None = None, chunk: int = 64):
        x = self.model.embeddings(ids).float()
        s = self.model.lower_bounds.float().softmax(0)
        lbs = s.cumsum(0) - s[0]
        new_state = []
        for li, layer in enumerate(self.model.layers):
            x, h_last = layer(x, lbs[li], None if state is None else state[li], chunk)
            new_state.append(h_last)
        x = self.model.norm(x)
        return self.lm_head(x).float(), new_state


# ------------------------------------------------------------------------------------------------ data
def load_tokens(tokenizer, path: Path) -> np.ndarray:
    text = path.read_text(encoding="utf-8")
    return np.asarray(tokenizer.encode(text).ids, dtype=np.int32)


def batch_iter(tokens: np.ndarray, batch: int, seq: int, bos: int, rng: np.random.Generator):
    """Random windows; each starts with BOS and a zero state, as ``mmfree eval`` scores them."""
    while True:
        starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
        win = np.stack([tokens[s:s + seq] for s in starts])
        inp = np.concatenate([np.full((batch, 1), bos, np.int32), win[:, :-1]], axis=1)
        yield torch.from_numpy(inp).long(), torch.from_numpy(win).long()


def eval_windows(tokens: np.ndarray, seq: int, bos: int):
    """Consecutive windows over the whole held-out text (the last one shorter)."""
    for s in range(0, len(tokens), seq):
        win = tokens[s:s + seq]
        inp = np.concatenate([[bos], win[:-1]]).astype(np.int32)
        yield torch.from_numpy(inp).long()[None], torch.from_numpy(win.astype(np.int32)).long()[None]


@torch.no_grad()
def evaluate(model, tokens, seq, bos, device, max_windows=None, bf16=True):
    model.eval()
    nll, n = 0.0, 0
    for k, (inp, tgt) in enumerate(eval_windows(tokens, seq, bos)):
        if max_windows is not None and k >= max_windows:
            break
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda"):
            logits, _ = model(inp.to(device))
        nll += F.cross_entropy(logits[0].float(), tgt[0].to(device), reduction="sum").item()
        n += tgt.numel()
    model.train()
    return nll / n, n


# ------------------------------------------------------------------------------------------------- save
def save_hf(model: HGRNBitForCausalLM, cfg: dict, out: Path, tokenizer_json: Path,
            shard_bytes: int = 12 << 20) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    for old in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)
    # Shards of at most `shard_bytes`, with the Hugging Face index, as the larger released checkpoints.
    shards, cur, size = [], {}, 0
    for k, v in tensors.items():
        nbytes = v.numel() * v.element_size()
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += nbytes
    shards.append(cur)
    if len(shards) == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for n, shard in enumerate(shards, 1):
            name = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in shard})
        total = sum(v.numel() * v.element_size() for v in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config = {
        "architectures": ["HGRNBitForCausalLM"], "model_type": "hgrn_bit", "attn_mode": "fused_recurrent",
        **cfg, "num_heads": 1, "expand_ratio": 1, "use_short_conv": False, "conv_size": 4,
        "share_conv_kernel": True, "use_lower_bound": True, "hidden_ratio": 4, "hidden_act": "swish",
        "max_position_embeddings": 2048, "use_cache": True, "bos_token_id": 1, "eos_token_id": 2,
        "tie_word_embeddings": False, "initializer_range": 0.02, "fuse_cross_entropy": True,
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_json.resolve() != (out / "tokenizer.json").resolve():
        shutil.copy(tokenizer_json, out / "tokenizer.json")


def load_hf(out: Path) -> HGRNBitForCausalLM:
    from safetensors.torch import load_file

    cfg_all = json.loads((out / "config.json").read_text())
    cfg = {k: cfg_all[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                   "intermediate_size", "rms_norm_eps")}
    # a config without the field: the released code's value
    cfg["bitlinear_norm_eps"] = cfg_all.get("bitlinear_norm_eps", 1e-6)
    model = HGRNBitForCausalLM(cfg)
    sd = {}
    for f in sorted(out.glob("model*.safetensors")):
        sd.update({k: v.float() for k, v in load_file(str(f)).items()})
    model.load_state_dict(sd, strict=True)
    return model


@torch.no_grad()
def write_fixture(out_dir: Path, fixture: Path, tokens: np.ndarray, n: int) -> dict:
    """Float32 CPU logits of the saved checkpoint on held-out text (sequential recurrence)."""
    model = load_hf(out_dir).eval()
    ids = np.concatenate([[1], tokens[: n - 1]]).astype(np.int32)
    logits, state = model(torch.from_numpy(ids).long()[None], chunk=0)
    fixture.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(fixture, ids=ids, logits=logits[0].numpy().astype(np.float32),
                        state=torch.stack(state, 0)[:, 0].numpy().astype(np.float32))
    return {"fixture": str(fixture), "positions": int(n)}


# ------------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data/pydoc")
    ap.add_argument("--tokenizer", type=Path, default=ROOT / "models/hgrn-bit-pydoc/tokenizer.json")
    ap.add_argument("--out", type=Path, default=ROOT / "models/hgrn-bit-pydoc")
    ap.add_argument("--fixture", type=Path, default=ROOT / "tests/fixtures/reference_logits.npz")
    ap.add_argument("--hidden", type=int, default=324)
    ap.add_argument("--intermediate", type=int, default=868)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--time-budget", type=float, default=480.0, help="seconds of training at most")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--bitlinear-norm-eps", type=float, default=1e-6,
                    help="eps of BitLinear's RMSNorm (the released FusedBitLinear's: 1e-6); saved in config.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fixture-positions", type=int, default=96)
    ap.add_argument("--log", type=Path, default=None, help="JSON training log (default OUT/train_log.json)")
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = Tokenizer.from_file(str(args.tokenizer))
    train = load_tokens(tok, args.data / "train.txt")
    held = load_tokens(tok, args.data / "heldout.txt")
    held_bytes = len((args.data / "heldout.txt").read_bytes())
    cfg = {"vocab_size": tok.get_vocab_size(), "hidden_size": args.hidden, "num_hidden_layers": args.layers,
           "intermediate_size": args.intermediate, "rms_norm_eps": 1e-6,
           "bitlinear_norm_eps": args.bitlinear_norm_eps}
    model = HGRNBitForCausalLM(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"device {device}, params {n_params:,}, train tokens {len(train):,}, held-out tokens {len(held):,}",
          file=sys.stderr)

    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and n != "model.lower_bounds"]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim == 2 and n != "model.lower_bounds")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            fused=device.type == "cuda")

    def lr_at(step, total):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))

    log = {"config": cfg, "args": {k: str(v) for k, v in vars(args).items()}, "params": n_params,
           "train_tokens": int(len(train)), "heldout_tokens": int(len(held)), "heldout_bytes": held_bytes,
           "evals": [], "machine": {"platform": platform.platform(), "torch": torch.__version__,
                                    "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None}}
    batches = batch_iter(train, args.batch, args.seq, 1, rng)
    t0 = time.time()
    best = (float("inf"), -1)
    total = args.steps
    step = 0
    for step in range(args.steps):
        # the schedule follows whichever ends first: --steps or --time-budget
        elapsed = time.time() - t0
        if step > 50:
            total = min(args.steps, int(step / elapsed * args.time_budget))
        if step >= total:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total)
        inp, tgt = next(batches)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits, _ = model(inp.to(device), chunk=args.chunk)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.to(device).flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"step {step}/{total} loss {loss.item():.4f} lr {lr_at(step, total):.2e} "
                  f"{time.time() - t0:.0f}s", file=sys.stderr, flush=True)
        if (step + 1) % args.eval_every == 0:
            ev, _ = evaluate(model, held, args.seq, 1, device, max_windows=64)
            log["evals"].append({"step": step + 1, "train_loss": loss.item(), "heldout_loss_64win": ev,
                                 "seconds": time.time() - t0})
            print(f"  eval step {step + 1}: held-out loss {ev:.4f}", file=sys.stderr, flush=True)
            if ev < best[0]:
                best = (ev, step + 1)
                save_hf(model, cfg, args.out, args.tokenizer)
    train_s = time.time() - t0
    ev, _ = evaluate(model, held, args.seq, 1, device, max_windows=64)
    if ev < best[0]:
        best = (ev, step)
        save_hf(model, cfg, args.out, args.tokenizer)
    # final numbers from the saved (bfloat16) checkpoint over the whole held-out text
    saved = load_hf(args.out).to(device)
    nll, n = evaluate(saved, held, args.seq, 1, device, bf16=False)
    log.update({"steps": step, "best_step": best[1], "train_seconds": train_s,
                "final_train_loss": loss.item(),
                "heldout_nll_per_token": nll, "heldout_perplexity": math.exp(nll),
                "heldout_tokens_scored": n,
                "heldout_bits_per_byte": nll * n / math.log(2) / held_bytes,
                "tokens_seen": step * args.batch * args.seq})
    log.update(write_fixture(args.out, args.fixture, held, args.fixture_positions))
    (args.log or args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(json.dumps({k: log[k] for k in ("steps", "best_step", "train_seconds", "heldout_perplexity",
                                           "heldout_bits_per_byte")}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
