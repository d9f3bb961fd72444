"""Float reference of HGRN-Bit in numpy: the accuracy yardstick of every device.

Implements the MatMul-free LM of Zhu et al., *Scalable MatMul-free Language Modeling*
(arXiv 2406.02528), as the released code computes it (``ridgerchu/matmulfreellm``:
``mmfreelm/ops/bitnet.py``, ``mmfreelm/layers/hgrn_bit.py``, ``mmfreelm/models/hgrn_bit``), in float32:

BitLinear (section 2.2 of the paper; ``FusedBitLinear.forward`` of ``mmfreelm/ops/fusedbitnet.py``)
    ``u = RMSNorm(x) * gamma`` with eps ``bitlinear_norm_eps`` (1e-6: ``layer_norm_linear_quant_fn``'s
    default, see :data:`host.model.BITLINEAR_NORM_EPS`), per-token absmax int8 codes
    ``q = clamp(round(u * s_a), -128, 127)`` with ``s_a = 127 / max(max|u|, 1e-5)`` and ``round`` half
    away from zero (the Triton kernel's libdevice ``round``; :func:`round_half_away`), ternary weights
    ``W_t`` with ``s_w = fl32(1 / beta)`` (:func:`host.model.ternarize`), and ``y = (W_t q) / s_a / s_w``:
    the released ``(q / s_a) @ (W_t / s_w)`` with the integer product formed first. ``W_t q`` is exact in
    float32 (``|W_t q| <= 128 K < 2**24`` for every supported K), so prompt processing and single-token
    decode give bit-identical results.
MLGRU token mixer (section 3.3.1, eq. 4-6; ``HGRNBitAttention.forward``)
    ``f = sigmoid(f_hat)``; beyond layer 0, ``f = lb + (1 - lb) f`` with per-channel lower bounds;
    ``c = SiLU(i) (1 - f)`` with ``1 - f`` formed in float32 from ``f`` as the released code does (the
    accelerator forms it as ``(1 - lb) sigmoid(-f_hat)``, which keeps the bits that float32 loses when
    ``lb`` is near 1); ``h = f h + c``; output gate ``RMSNorm(g) gamma_g * SiLU(h)``
    as released (``"released"``), or the paper's ``sigmoid(g) * h`` (``"paper"``); then ``o_proj``.
GLU channel mixer (section 3.3.2; ``HGRNBitMLP``)
    ``[a, b] = gate_proj(x)``, ``down_proj(SiLU(a) * b)``.
Blocks
    pre-norm residual (``attn_norm``, ``mlp_norm``, eps ``rms_norm_eps``), final ``model.norm``, and the
    BitLinear LM head. Embeddings are looked up by the host; there are no positions.

The recurrent state is one vector ``h`` per layer: an ndarray of shape [L, H], float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from host.model import ACT_SCALE_MIN, BITLINEAR_NORM_EPS, BitLinearWeights, ModelWeights

__all__ = ["ReferenceModel", "OUTPUT_GATES", "rms_norm", "sigmoid", "silu", "absmax_quantize", "round_half_away"]

OUTPUT_GATES = ("released", "paper")


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function, float32, without overflow for large ``|x|``."""
    x = np.asarray(x, dtype=np.float32)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish), ``x * sigmoid(x)``, float32."""
    return (x * sigmoid(x)).astype(np.float32)


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: ``x / sqrt(mean(x**2) + eps) * gamma`` (float32).

    Parameters
    ----------
    x : ndarray, shape [..., D], float32
    gamma : ndarray, shape [D], float32
    eps : float
    """
    x = np.asarray(x, dtype=np.float32)
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return (x * (1.0 / np.sqrt(ms + np.float32(eps))) * gamma).astype(np.float32)


def round_half_away(v: np.ndarray) -> np.ndarray:
    """Round to the nearest integer, ties away from zero (C ``roundf``, libdevice ``round``), exactly.

    ``floor(|v| + 0.5)`` is not exact in floating point (``0.49999997 + 0.5`` rounds up to 1); this
    splits off the integer part, whose difference from ``v`` is exact.

    Parameters
    ----------
    v : ndarray, float32 or float64

    Returns
    -------
    ndarray, same dtype, integral values
    """
    v = np.asarray(v)
    t = np.trunc(v)
    return t + np.sign(v) * (np.abs(v - t) >= 0.5)


def absmax_quantize(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token absmax int8 quantization as the released Triton kernel forms the codes.

    ``s_a = fl32(127 / max(max|u|, 1e-5))``, ``q = clamp(round_half_away(u * s_a), -128, 127)``
    (``_layer_norm_fwd_quant_kernel`` of ``mmfreelm/ops/fusedbitnet.py``; ``activation_quant`` of
    ``ops/bitnet.py`` computes the same with ``torch.round``, half to even).

    Parameters
    ----------
    u : ndarray, shape [T, K], float32

    Returns
    -------
    q : ndarray, shape [T, K], float32 holding integers in [-128, 127]
    scale : ndarray, shape [T, 1], float32
        ``s_a``; the dequantized activation is ``q / s_a``.
    """
    amax = np.maximum(np.max(np.abs(u), axis=-1, keepdims=True), np.float32(ACT_SCALE_MIN))
    scale = (np.float32(127.0) / amax).astype(np.float32)
    q = np.clip(round_half_away((u * scale).astype(np.float32)), -128, 127).astype(np.float32)
    return q, scale


class _BitLinear:
    """One BitLinear prepared for fast float32 evaluation (trits transposed to [K, N])."""

    def __init__(self, w: BitLinearWeights, eps: float = BITLINEAR_NORM_EPS):
        self.gamma = np.asarray(w.norm, dtype=np.float32)
        self.wt = np.ascontiguousarray(w.trits.T, dtype=np.float32)  # [K, N], exact small integers
        self.s_w = w.inv_scale
        self.eps = float(eps)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        u = rms_norm(x, self.gamma, self.eps)
        q, s_a = absmax_quantize(u)
        acc = q @ self.wt  # exact integer accumulation (|acc| < 2**24)
        return ((acc / s_a).astype(np.float32) / self.s_w).astype(np.float32)


class ReferenceModel:
    """Float32 numpy HGRN-Bit: prompt processing and step-by-step decode with explicit state.

    Parameters
    ----------
    weights : ModelWeights
        Quantized weights from :func:`host.checkpoint.load_checkpoint`.
    output_gate : {"released", "paper"}
        ``"released"``: ``o = RMSNorm(g) gamma_g * SiLU(h)`` (``FusedRMSNormSwishGate`` of the released
        code, the default); ``"paper"``: ``o = sigmoid(g) * h`` (eq. 6 of arXiv 2406.02528).

    Raises
    ------
    ValueError
        On an unknown ``output_gate``, a token id outside ``[0, vocab_size)`` or a state of the wrong shape.
    """

    def __init__(self, weights: ModelWeights, *, output_gate: str = "released"):
        if output_gate not in OUTPUT_GATES:
            raise ValueError(f"output_gate must be one of {OUTPUT_GATES}, got {output_gate!r}")
        self.weights = weights
        self.config = weights.config
        self.output_gate = output_gate
        self.eps = float(self.config.rms_norm_eps)
        self.embeddings = np.asarray(weights.embeddings, dtype=np.float32)
        self._layers = []
        be = float(self.config.bitlinear_norm_eps)
        for idx, lw in enumerate(weights.layers):
            lb = np.asarray(weights.lower_bound(idx), dtype=np.float32)
            self._layers.append({
                "attn_norm": np.asarray(lw.attn_norm, np.float32),
                "i": _BitLinear(lw.i_proj, be), "f": _BitLinear(lw.f_proj, be), "g": _BitLinear(lw.g_proj, be),
                "g_norm": np.asarray(lw.g_norm, np.float32), "o": _BitLinear(lw.o_proj, be),
                "mlp_norm": np.asarray(lw.mlp_norm, np.float32),
                "gate": _BitLinear(lw.gate_proj, be), "down": _BitLinear(lw.down_proj, be),
                "lb": lb, "one_minus_lb": (np.float32(1.0) - lb).astype(np.float32),
            })
        self._norm = np.asarray(weights.norm, np.float32)
        self._head = _BitLinear(weights.lm_head, be)
        self._inter = self.config.intermediate_size

    # ------------------------------------------------------------------------------------- state
    def init_state(self) -> np.ndarray:
        """A zero recurrent state, shape [L, H], float32."""
        return np.zeros((self.config.num_hidden_layers, self.config.hidden_size), dtype=np.float32)

    def _check_state(self, state: np.ndarray | None) -> np.ndarray:
        if state is None:
            return self.init_state()
        state = np.asarray(state, dtype=np.float32)
        want = (self.config.num_hidden_layers, self.config.hidden_size)
        if state.shape != want:
            raise ValueError(f"recurrent state must have shape {want}, got {state.shape}")
        return state

    def _embed(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        v = self.config.vocab_size
        bad = ids[(ids < 0) | (ids >= v)]
        if bad.size:
            raise ValueError(f"token id {int(bad[0])} is outside the vocabulary [0, {v})")
        return self.embeddings[ids]

    # ----------------------------------------------------------------------------------- compute
    def forward(self, token_ids: Sequence[int], state: np.ndarray | None = None,
                *, trace: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Run a sequence of tokens (prompt processing).

        Parameters
        ----------
        token_ids : sequence of int, length T >= 1
        state : ndarray, shape [L, H], float32, optional
            Recurrent state before the first token (zeros if None). Not modified.
        trace : dict, optional
            If given, filled with per-layer intermediate outputs for accuracy studies:
            ``trace["o_proj"][l]`` and ``trace["down_proj"][l]`` ([T, H] float32), ``trace["h"][l]``
            ([T, H] float32, the recurrent state after each token).

        Returns
        -------
        logits : ndarray, shape [T, V], float32
            Next-token logits after every position.
        state : ndarray, shape [L, H], float32
            Recurrent state after the last token.
        """
        h_all = self._check_state(state)
        x = self._embed(token_ids)
        if x.shape[0] == 0:
            raise ValueError("token_ids must hold at least one token")
        new_state = np.empty_like(h_all)
        if trace is not None:
            for key in ("o_proj", "down_proj", "h", "i", "f", "g", "p", "gate", "m", "x"):
                trace[key] = []
        for idx, p in enumerate(self._layers):
            # token mixer (MLGRU)
            xn = rms_norm(x, p["attn_norm"], self.eps)
            i_t, f_hat, g_t = p["i"](xn), p["f"](xn), p["g"](xn)
            f = (p["lb"] + p["one_minus_lb"] * sigmoid(f_hat)).astype(np.float32)
            one_minus_f = (np.float32(1.0) - f).astype(np.float32)  # as released: swiglu(i, 1 - f)
            c = (silu(i_t) * one_minus_f).astype(np.float32)
            hs = np.empty_like(c)
            h = h_all[idx].copy()
            for t in range(c.shape[0]):
                h = (f[t] * h + c[t]).astype(np.float32)
                hs[t] = h
            new_state[idx] = h
            if self.output_gate == "released":
                o = rms_norm(g_t, p["g_norm"], self.eps) * silu(hs)
                p_vec = g_t * p["g_norm"] * silu(hs) if trace is not None else None
            else:
                o = sigmoid(g_t) * hs
                p_vec = o
            attn_out = p["o"](o.astype(np.float32))
            x = (x + attn_out).astype(np.float32)
            # channel mixer (GLU)
            xn = rms_norm(x, p["mlp_norm"], self.eps)
            ab = p["gate"](xn)
            m = (silu(ab[:, : self._inter]) * ab[:, self._inter:]).astype(np.float32)
            mlp_out = p["down"](m)
            x_mid = x
            x = (x + mlp_out).astype(np.float32)
            if trace is not None:
                trace["o_proj"].append(attn_out)
                trace["down_proj"].append(mlp_out)
                trace["h"].append(hs)
                trace["i"].append(i_t)
                trace["f"].append(f_hat)
                trace["g"].append(g_t)
                trace["p"].append(p_vec)
                trace["gate"].append(ab)
                trace["m"].append(m)
                trace["x"].append(np.maximum(np.abs(x_mid), np.abs(x)))
        logits = self._head(rms_norm(x, self._norm, self.eps))
        return logits, new_state

    def step(self, token_id: int, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decode one token: ``(logits [V] float32, new state [L, H] float32)``; ``state`` is not modified."""
        logits, new_state = self.forward([int(token_id)], state)
        return logits[0], new_state
