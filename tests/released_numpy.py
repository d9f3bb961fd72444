"""An independent float32 numpy reconstruction of the released HGRN-Bit forward pass (test support).

Written from the released source (``ridgerchu/matmulfreellm``, the version the ``ridger/MMfreeLM-*``
checkpoints run, where ``mmfreelm/layers/hgrn_bit.py`` and ``mmfreelm/models/hgrn_bit/modeling_hgrn_bit.py``
import ``mmfreelm.ops.fusedbitnet.FusedBitLinear as BitLinear``), formula by formula, without importing
anything from ``host`` (not the reference, not the loader, not ``host.model.ternarize``), so that
``tests/test_released_reconstruction.py`` can hold :class:`host.reference.ReferenceModel` against it.

Everything is float32, as the released model runs with ``torch_dtype=float32``:

BitLinear (``FusedBitLinear.forward`` -> ``layer_norm_linear_quant_fn`` -> ``LayerNormLinearQuantFn.forward``
and ``_layer_norm_fwd_quant_kernel``, ``mmfreelm/ops/fusedbitnet.py``)
    ``u = x * rstd * gamma`` with ``rstd = 1 / sqrt(sum(x*x) / N + eps)``; ``FusedBitLinear.forward`` passes
    no ``eps``, so ``layer_norm_linear_quant_fn``'s default 1e-6 applies (the ``RMSNorm(eps=1e-8)`` built in
    ``BitLinear.__init__`` only holds gamma). A ``config.json`` field ``bitlinear_norm_eps``, where present
    (a field of this project's configs, not of the released ones), overrides it.
    ``s_a = 127 / max(max|u|, 1e-5)``; ``q = clamp(round(u * s_a), -128, 127)`` with the kernel's
    ``tl.math.round`` (libdevice ``roundf``: half away from zero); the kernel stores ``q / s_a``.
    ``weight_quant`` (same file): ``s_w = 1 / max(mean|W|, 1e-5)``, ``W_t = clamp(round(W * s_w), -1, 1)``
    (``torch.round``: half to even), dequantized ``W_t / s_w``; then ``F.linear``: ``y = (q / s_a) @ (W_t / s_w).T``.
MLGRU (``HGRNBitAttention.forward``, ``mmfreelm/layers/hgrn_bit.py``)
    ``i, f, g`` are three BitLinears of the block-normed input; ``f = sigmoid(f)``; for ``layer_idx > 0``
    ``f = lb + (1 - lb) * f``; ``i = swiglu(i, 1 - f)`` (``mmfreelm/modules/activations.py``:
    ``x * y / (1 + exp(-x))``); ``fused_recurrent_hgrn`` (``mmfreelm/ops/hgrn/recurrent_fuse.py``):
    ``h_t = f_t * h_{t-1} + i_t`` from ``h = 0``; ``g_norm = FusedRMSNormSwishGate(eps=rms_norm_eps)``
    (``mmfreelm/modules/fused_norm_gate.py``: ``y = x * rstd * w; y = y * o * sigmoid(o)``) with ``x = g``,
    ``o = h``; ``o_proj``.
Blocks (``HGRNBitBlock.forward``, ``modeling_hgrn_bit.py``)
    ``attn_norm`` (``RMSNorm``, eps ``rms_norm_eps``, ``mmfreelm/modules/layernorm.py``), attention,
    ``mlp_norm(hidden, residual, prenorm=True)``: the kernel adds the residual first and returns both the
    normed sum and the sum; ``HGRNBitMLP.forward``: ``gate, y = gate_proj(x).chunk(2, -1)``,
    ``down_proj(swiglu(gate, y))``; ``residual + mlp``.
Model (``HGRNBitModel.forward``, ``HGRNBitForCausalLM``)
    ``lb = softmax(lower_bounds, 0)``; ``lb = lb.cumsum(0) - lb[0]``; final ``norm`` (RMSNorm, eps
    ``rms_norm_eps``); ``lm_head`` is a BitLinear.

The Triton kernels' own float32 details (``1 / tl.sqrt`` and ``/`` may be approximate on a GPU, reduction
order) are not modelled: IEEE float32 numpy is the target, as for the reference.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file

__all__ = [
    "RELEASED_BITLINEAR_EPS",
    "read_released_dir",
    "released_lower_bounds",
    "released_weight_quant",
    "round_half_away_from_zero",
    "released_activation_quant",
    "ReleasedModel",
]

F32 = np.float32
#: Importing ``ml_dtypes`` registers this dtype with numpy, which lets ``safetensors.numpy`` decode BF16.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16, np.dtype(np.float64))
#: ``layer_norm_linear_quant_fn(..., eps=1e-6)``: the eps every ``FusedBitLinear`` runs with.
RELEASED_BITLINEAR_EPS = 1e-6
_CLAMP = 1e-5  # both ``weight_quant``'s ``clamp_(min=1e-5)`` and the kernel's ``tl.maximum(..., 1e-5)``


def read_released_dir(path: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """``config.json`` and every tensor of a checkpoint directory, as float32 (bfloat16 via ``ml_dtypes``).

    Reads ``model.safetensors`` or, without it, the shards listed in ``model.safetensors.index.json``.

    Returns
    -------
    config : dict
        The parsed ``config.json``.
    tensors : dict[str, ndarray float32]
    """
    root = Path(path)
    config = json.loads((root / "config.json").read_text())
    single = root / "model.safetensors"
    if single.exists():
        files = [single]
    else:
        index = json.loads((root / "model.safetensors.index.json").read_text())
        files = [root / name for name in sorted(set(index["weight_map"].values()))]
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            if v.dtype not in _FLOATS:
                raise ValueError(f"{f}: {k} has dtype {v.dtype}, not a float latent tensor")
            tensors[k] = v.astype(F32)
    return config, tensors


def released_lower_bounds(p: np.ndarray) -> np.ndarray:
    """``HGRNBitModel.forward``: ``lb = softmax(P, 0); lb = lb.cumsum(0) - lb[0]``, float32, shape [L, H]."""
    p = np.asarray(p, dtype=F32)
    e = np.exp(p - np.max(p, axis=0))
    sm = (e / np.sum(e, axis=0, dtype=F32)).astype(F32)
    return (np.cumsum(sm, axis=0, dtype=F32) - sm[0]).astype(F32)


def released_weight_quant(w: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """``weight_quant`` of ``mmfreelm/ops/fusedbitnet.py`` in float32: (trits int8 [N, K], ``s_w``).

    ``s_w = 1 / clamp(mean|W|, min=1e-5)`` (float32 division), ``W_t = clamp(round(W * s_w), -1, 1)`` with
    ``torch.round`` (half to even, ``numpy.rint``). The mean is taken as the correctly rounded float32 of
    the exact mean (torch sums in float32 in an unspecified order; it is within a few ulp of this).
    """
    w = np.asarray(w, dtype=F32)
    mean_abs = F32(np.abs(w.astype(np.float64)).mean())
    s_w = F32(F32(1.0) / max(mean_abs, F32(_CLAMP)))
    trits = np.clip(np.rint(w * s_w), -1, 1).astype(np.int8)
    return trits, s_w


def round_half_away_from_zero(v: np.ndarray) -> np.ndarray:
    """libdevice ``roundf`` (the kernel's ``tl.math.round``): nearest integer, ties away from zero.

    Computed as ``sign(v) * floor(|v| + 0.5)`` in float64, where ``|v| + 0.5`` is exact for every float32
    ``|v| < 2**24`` (in float32 it is not: ``0.49999997 + 0.5`` rounds to 1).
    """
    v64 = np.asarray(v, dtype=np.float64)
    return (np.sign(v64) * np.floor(np.abs(v64) + 0.5)).astype(F32)


def released_activation_quant(u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The quantization tail of ``_layer_norm_fwd_quant_kernel``, per row of ``u`` [T, K] float32.

    Returns
    -------
    q : ndarray [T, K] float32 holding integers in [-128, 127]
    s_a : ndarray [T, 1] float32, ``127 / max(max|u|, 1e-5)``
    v : ndarray [T, K] float32, ``u * s_a`` before rounding (how close each code was to a tie)
    """
    amax = np.maximum(np.max(np.abs(u), axis=-1, keepdims=True), F32(_CLAMP)).astype(F32)
    s_a = (F32(127.0) / amax).astype(F32)
    v = (u * s_a).astype(F32)
    q = np.clip(round_half_away_from_zero(v), -128, 127).astype(F32)
    return q, s_a, v


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The Triton RMSNorm kernels: ``var = sum(x*x) / N``, ``rstd = 1 / sqrt(var + eps)``, ``x * rstd * w``."""
    var = (np.sum(x * x, axis=-1, keepdims=True, dtype=F32) / F32(x.shape[-1])).astype(F32)
    rstd = (F32(1.0) / np.sqrt(var + F32(eps))).astype(F32)
    return ((x * rstd).astype(F32) * w).astype(F32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) -> inf for x < -88 gives 1/inf = 0, as torch does
        return (F32(1.0) / (F32(1.0) + np.exp(-x))).astype(F32)


def _swiglu(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``swiglu_fwd`` of ``mmfreelm/modules/activations.py``: ``x * y / (1 + exp(-x))``."""
    with np.errstate(over="ignore"):
        return ((x * y).astype(F32) / (F32(1.0) + np.exp(-x))).astype(F32)


class _ReleasedBitLinear:
    def __init__(self, name: str, gamma: np.ndarray, latent: np.ndarray, eps: float):
        self.name = name
        self.gamma = np.asarray(gamma, dtype=F32)
        self.trits, self.s_w = released_weight_quant(latent)
        self.w_deq_t = np.ascontiguousarray((self.trits.astype(F32) / self.s_w).astype(F32).T)  # [K, N]
        self.eps = float(eps)

    def __call__(self, x: np.ndarray, hook: Callable | None) -> np.ndarray:
        u = _rms_norm(x, self.gamma, self.eps)
        q, s_a, v = released_activation_quant(u)
        if hook is not None:
            q = hook(self.name, q, v)
        x_deq = (q / s_a).astype(F32)  # what the kernel stores: clamp(round(y * scale)) / scale
        return (x_deq @ self.w_deq_t).astype(F32)  # F.linear(y, weight_quant(W))


class ReleasedModel:
    """The released ``HGRNBitForCausalLM`` forward in float32 numpy, from a config dict and latent tensors.

    Parameters
    ----------
    config : Mapping
        The ``config.json`` fields (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
        ``intermediate_size`` (or None with ``hidden_ratio``), ``rms_norm_eps``, ``use_lower_bound``, and
        optionally ``bitlinear_norm_eps``).
    tensors : Mapping[str, ndarray]
        Latent float tensors under the released key names.

    Attributes
    ----------
    bitlinears : dict[str, _ReleasedBitLinear]
        By checkpoint prefix (``"model.layers.0.attn.i_proj"``, ..., ``"lm_head"``): ``trits`` int8 [N, K],
        ``s_w`` float32.
    """

    def __init__(self, config: Mapping, tensors: Mapping[str, np.ndarray]):
        self.config = dict(config)
        h = int(config["hidden_size"])
        self.num_layers = int(config["num_hidden_layers"])
        inter = config.get("intermediate_size")
        if inter is None:  # HGRNBitMLP.__init__
            inter = int(h * int(config.get("hidden_ratio") or 4) * 2 / 3)
            inter = 256 * ((inter + 256 - 1) // 256)
        self.intermediate_size = int(inter)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.bitlinear_eps = float(config.get("bitlinear_norm_eps", RELEASED_BITLINEAR_EPS))
        t = {k: np.asarray(v, dtype=F32) for k, v in tensors.items()}
        self.embeddings = t["model.embeddings.weight"]
        self.lower_bounds = (released_lower_bounds(t["model.lower_bounds"])
                             if config.get("use_lower_bound", True) else None)
        self.bitlinears: dict[str, _ReleasedBitLinear] = {}

        def bl(prefix: str) -> _ReleasedBitLinear:
            m = _ReleasedBitLinear(prefix, t[prefix + ".norm.weight"], t[prefix + ".weight"], self.bitlinear_eps)
            self.bitlinears[prefix] = m
            return m

        self.layers = []
        for idx in range(self.num_layers):
            p = f"model.layers.{idx}."
            self.layers.append({
                "attn_norm": t[p + "attn_norm.weight"],
                "i": bl(p + "attn.i_proj"), "f": bl(p + "attn.f_proj"), "g": bl(p + "attn.g_proj"),
                "g_norm": t[p + "attn.g_norm.weight"], "o": bl(p + "attn.o_proj"),
                "mlp_norm": t[p + "mlp_norm.weight"],
                "gate": bl(p + "mlp.gate_proj"), "down": bl(p + "mlp.down_proj"),
            })
        self.norm = t["model.norm.weight"]
        self.lm_head = bl("lm_head")

    @classmethod
    def from_dir(cls, path: str | Path) -> ReleasedModel:
        """Load a checkpoint directory with :func:`read_released_dir`."""
        return cls(*read_released_dir(path))

    def forward(self, token_ids: Sequence[int], hook: Callable | None = None) -> np.ndarray:
        """Logits [T, V] float32 after every position of ``token_ids``, from a zero recurrent state.

        ``hook(name, q, v) -> q``, if given, sees every BitLinear's codes in call order (per layer ``i, f, g,
        o, gate, down``, then ``lm_head``): ``q`` [T, K] float32 integers, ``v = u * s_a`` [T, K] float32
        before rounding; the codes it returns are used (a test may record them, or follow another
        implementation's choice where ``v`` sits on a rounding tie).
        """
        x = self.embeddings[np.asarray(token_ids, dtype=np.int64)]
        n_tok = x.shape[0]
        for idx, p in enumerate(self.layers):
            # HGRNBitBlock.forward: residual = hidden; hidden = attn_norm(hidden); attn
            residual = x
            xn = _rms_norm(x, p["attn_norm"], self.eps)
            i = p["i"](xn, hook)
            f = p["f"](xn, hook)
            f = _sigmoid(f)
            if self.lower_bounds is not None and idx > 0:
                lb = self.lower_bounds[idx]
                f = (lb + ((F32(1.0) - lb) * f).astype(F32)).astype(F32)
            i = _swiglu(i, (F32(1.0) - f).astype(F32))
            hs = np.empty_like(i)
            h = np.zeros(i.shape[-1], dtype=F32)
            for tt in range(n_tok):  # fused_recurrent_hgrn_fwd_kernel: b_h = b_g * b_h + b_x
                h = ((f[tt] * h).astype(F32) + i[tt]).astype(F32)
                hs[tt] = h
            g = p["g"](xn, hook)
            y = _rms_norm(g, p["g_norm"], self.eps)  # FusedRMSNormSwishGate: y = x * rstd * w
            o = ((y * hs).astype(F32) * _sigmoid(hs)).astype(F32)  # y = y * o * sigmoid(o)
            attn = p["o"](o, hook)
            # mlp_norm(hidden, residual, prenorm=True): x = hidden + residual, normed; residual_out = x
            x = (attn + residual).astype(F32)
            xn = _rms_norm(x, p["mlp_norm"], self.eps)
            ab = p["gate"](xn, hook)
            gate, up = ab[:, : self.intermediate_size], ab[:, self.intermediate_size:]
            mlp = p["down"](_swiglu(gate, up), hook)
            x = (x + mlp).astype(F32)
        return self.lm_head(_rms_norm(x, self.norm, self.eps), hook)
