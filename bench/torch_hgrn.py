"""HGRN-Bit decode in PyTorch at batch 1: the GPU and CPU baselines of ``bench/bench_gpu.py`` and
``bench/bench_cpu.py``.

The same computation as :mod:`host.reference` (arXiv 2406.02528 as released in
``ridgerchu/matmulfreellm``), written with plain PyTorch operators so that it runs on any device:

BitLinear
    ``u = RMSNorm(x) * gamma`` (eps ``bitlinear_norm_eps``, 1e-6 as released), per-token absmax int8 codes
    ``q = clamp(round(u * 127 / max(max|u|, 1e-5)), -128, 127)`` (ties away from zero, as the released
    kernel and :func:`host.reference.round_half_away`), then one dense matrix-vector product
    ``W_t q`` on the ternary weights stored *dequantized* as a dense tensor of ``weight_dtype``
    (``torch.nn.functional.linear``: cuBLAS GEMV/GEMM on CUDA, the CPU BLAS/oneDNN path on CPU), scaled by
    ``max|u| / 127 / s_w`` (``s_w = fl32(1 / beta)``). The codes and trits are small integers, exact
    in bfloat16 and float32; with bfloat16 weights the product is accumulated in float32 by cuBLAS and
    rounded to bfloat16 on output (relative error about 2**-9 per GEMV output).
MLGRU token mixer, GLU channel mixer, pre-norm residual blocks, final RMSNorm and BitLinear LM head
    as in :class:`host.reference.ReferenceModel` (released output gate ``RMSNorm(g) gamma_g * SiLU(h)``,
    ``1 - f`` formed as ``(1 - lb) sigmoid(-f_hat)``). Elementwise work is float32.

Every tensor the step touches is preallocated: the token id lives in a 1-element int64 tensor on the
device, the recurrent state in an [L, H] float32 tensor updated in place, and the greedy next token
(argmax of the logits) is written back into the token tensor, so a whole autoregressive decode runs
without a host round trip and one step can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACT_SCALE_MIN = 1e-5

__all__ = ["TorchHGRNBit"]


class TorchHGRNBit:
    """Batch-1 HGRN-Bit decoder on one torch device.

    Parameters
    ----------
    weights : host.model.ModelWeights
        Quantized weights (trits int8 [N, K] and per-tensor scales), e.g. from
        :func:`host.checkpoint.load_checkpoint` or :func:`host.model.random_weights`.
    device : str or torch.device
    weight_dtype : torch.dtype
        Storage and GEMV dtype of the dense ternary weights (``torch.bfloat16`` on CUDA,
        ``torch.float32`` on CPU).

    Attributes
    ----------
    token : Tensor, shape [1], int64
        The next input token; :meth:`step` overwrites it with the greedy next token.
    state : Tensor, shape [L, H], float32
        Recurrent state, updated in place by :meth:`step`.
    logits : Tensor, shape [V], float32
        Logits of the last step (written in place).
    """

    def __init__(self, weights, *, device="cpu", weight_dtype=torch.float32):
        cfg = weights.config
        self.device = torch.device(device)
        self.weight_dtype = weight_dtype
        self.hidden = cfg.hidden_size
        self.inter = cfg.intermediate_size
        self.eps = float(cfg.rms_norm_eps)
        self.bitlinear_eps = float(cfg.bitlinear_norm_eps)
        f32 = dict(device=self.device, dtype=torch.float32)

        def vec(a):
            return torch.as_tensor(a).to(**f32)

        def bitlinear(w):
            return {"gamma": vec(w.norm), "w": torch.as_tensor(w.trits).to(device=self.device, dtype=weight_dtype),
                    "inv_s_w": 1.0 / float(w.inv_scale)}

        self.embeddings = vec(weights.embeddings)
        self.layers = []
        for idx, lw in enumerate(weights.layers):
            lb = vec(weights.lower_bound(idx))
            self.layers.append({
                "attn_norm": vec(lw.attn_norm), "i": bitlinear(lw.i_proj), "f": bitlinear(lw.f_proj),
                "g": bitlinear(lw.g_proj), "g_norm": vec(lw.g_norm), "o": bitlinear(lw.o_proj),
                "mlp_norm": vec(lw.mlp_norm), "gate": bitlinear(lw.gate_proj), "down": bitlinear(lw.down_proj),
                "lb": lb, "one_minus_lb": 1.0 - lb})
        self.norm = vec(weights.norm)
        self.head = bitlinear(weights.lm_head)
        self.token = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.state = torch.zeros(cfg.num_hidden_layers, cfg.hidden_size, **f32)
        self.logits = torch.zeros(cfg.vocab_size, **f32)

    # ----------------------------------------------------------------------------------------- ops
    @staticmethod
    def _rms(x, gamma, eps):
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * gamma

    def _bitlinear(self, x, p):
        u = self._rms(x, p["gamma"], self.bitlinear_eps)
        amax = u.abs().amax(-1, keepdim=True).clamp_min(ACT_SCALE_MIN)
        v = u * (127.0 / amax)
        t = v.trunc()
        q = (t + torch.sign(v) * ((v - t).abs() >= 0.5)).clamp_(-128, 127)  # round half away from zero
        acc = F.linear(q.to(self.weight_dtype), p["w"]).float()
        return acc * (amax * (p["inv_s_w"] / 127.0))

    def bytes_per_token(self) -> int:
        """Bytes of dense weight storage read by one decode step (every BitLinear once, LM head included)."""
        n = sum(p[k]["w"].numel() for p in self.layers for k in ("i", "f", "g", "o", "gate", "down"))
        return (n + self.head["w"].numel()) * self.head["w"].element_size()

    def step(self) -> None:
        """One greedy decode step on :attr:`token` and :attr:`state` (both updated in place)."""
        x = self.embeddings.index_select(0, self.token)  # [1, H]
        for idx, p in enumerate(self.layers):
            xn = self._rms(x, p["attn_norm"], self.eps)
            i_t, f_hat, g_t = self._bitlinear(xn, p["i"]), self._bitlinear(xn, p["f"]), self._bitlinear(xn, p["g"])
            f = p["lb"] + p["one_minus_lb"] * torch.sigmoid(f_hat)
            c = F.silu(i_t) * (p["one_minus_lb"] * torch.sigmoid(-f_hat))
            h = f * self.state[idx] + c
            self.state[idx].copy_(h[0])
            o = self._rms(g_t, p["g_norm"], self.eps) * F.silu(h)
            x = x + self._bitlinear(o, p["o"])
            ab = self._bitlinear(self._rms(x, p["mlp_norm"], self.eps), p["gate"])
            m = F.silu(ab[:, : self.inter]) * ab[:, self.inter:]
            x = x + self._bitlinear(m, p["down"])
        logits = self._bitlinear(self._rms(x, self.norm, self.eps), self.head)[0]
        self.logits.copy_(logits)
        self.token.copy_(torch.argmax(logits).reshape(1))

    def reset(self, token: int = 0) -> None:
        """Zero the state and set the next input token."""
        self.state.zero_()
        self.token.fill_(int(token))
