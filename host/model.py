"""Model description shared by the loader, the float reference, the compiler and the devices.

The architecture is HGRN-Bit, the "MatMul-free LM" of Zhu et al., *Scalable MatMul-free Language
Modeling* (arXiv 2406.02528), as released in ``ridgerchu/matmulfreellm`` and the Hugging Face
checkpoints ``ridger/MMfreeLM-370M``, ``-1.3B`` and ``-2.7B``.

This module holds only data: the configuration (the ``config.json`` fields of ``HGRNBitConfig``) and
the quantized weights of every BitLinear (ternary codes plus one per-tensor scale), laid out exactly as
the checkpoints name them. It has no model code, so every consumer (reference, compiler, golden device)
agrees on one description.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

__all__ = [
    "BITLINEAR_NORM_EPS",
    "WEIGHT_SCALE_MIN",
    "ACT_SCALE_MIN",
    "HGRNBitConfig",
    "BitLinearWeights",
    "LayerWeights",
    "ModelWeights",
    "ConfigError",
    "ternarize",
    "lower_bounds_per_layer",
    "random_weights",
]

#: eps of the RMSNorm inside every BitLinear, as the released checkpoints run it: every projection is a
#: ``FusedBitLinear`` (``mmfreelm/ops/fusedbitnet.py``) whose ``forward`` calls ``layer_norm_linear_quant_fn``
#: without an ``eps``, so that function's default 1e-6 applies (the ``RMSNorm(in_features, eps=1e-8)`` built in
#: ``BitLinear.__init__`` only supplies gamma). A model may declare another value in its ``config.json``
#: (``bitlinear_norm_eps``, :class:`HGRNBitConfig`).
BITLINEAR_NORM_EPS = 1e-6
#: clamp of the absmean weight scale, ``beta = max(mean|W|, 1e-5)`` (``weight_quant``).
WEIGHT_SCALE_MIN = 1e-5
#: clamp of the absmax activation scale, ``max(max|u|, 1e-5)`` (``activation_quant``).
ACT_SCALE_MIN = 1e-5


class ConfigError(ValueError):
    """A ``config.json`` value this project does not support or cannot parse."""


def _default_intermediate(hidden_size: int, hidden_ratio: int) -> int:
    # HGRNBitMLP: a multiple of 256 closest above 2/3 * hidden_size * hidden_ratio.
    size = int(hidden_size * hidden_ratio * 2 / 3)
    return 256 * ((size + 256 - 1) // 256)


@dataclass(frozen=True)
class HGRNBitConfig:
    """The ``config.json`` of an HGRN-Bit checkpoint (``HGRNBitConfig`` of the released code).

    Only the single-head, expand-ratio-1, no-short-convolution, SiLU ("swish") variant is supported: it
    is what every released checkpoint uses. ``intermediate_size`` is resolved as the released
    ``HGRNBitMLP`` does when it is ``null``.

    Raises
    ------
    ConfigError
        On a missing required field, a wrong type, or an unsupported value, naming the field.
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    #: eps inside every BitLinear's RMSNorm (not a field of the released config: its value is fixed there,
    #: :data:`BITLINEAR_NORM_EPS`); written to the shipped model's config.json so it states what it was trained with
    bitlinear_norm_eps: float = BITLINEAR_NORM_EPS
    use_lower_bound: bool = True
    hidden_ratio: int = 4
    hidden_act: str = "swish"
    num_heads: int = 1
    expand_ratio: int = 1
    use_short_conv: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    model_type: str = "hgrn_bit"
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "config.json") -> HGRNBitConfig:
        """Build and validate a config from the parsed ``config.json`` dictionary."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"{source}: expected a JSON object, got {type(d).__name__}")
        for key in ("vocab_size", "hidden_size", "num_hidden_layers"):
            if key not in d:
                raise ConfigError(f"{source}: missing required field {key!r}")
        known = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: v for k, v in d.items() if k in known}
        extra = {k: v for k, v in d.items() if k not in known}
        if kw.get("intermediate_size") is None:
            try:
                kw["intermediate_size"] = _default_intermediate(
                    int(d["hidden_size"]), int(d.get("hidden_ratio") or 4))
            except (TypeError, ValueError):
                raise ConfigError(f"{source}: hidden_size and hidden_ratio must be integers when "
                                  f"intermediate_size is null, got {d['hidden_size']!r}, "
                                  f"{d.get('hidden_ratio')!r}") from None
        if kw.get("hidden_ratio") is None:
            kw["hidden_ratio"] = 4
        if kw.get("num_heads") is None:
            kw["num_heads"] = 1
        if kw.get("expand_ratio") is None:
            kw["expand_ratio"] = 1
        cfg = cls(**kw, extra=extra)
        cfg.validate(source=source)
        return cfg

    def validate(self, *, source: str = "config.json") -> None:
        """Check types and supported values; raise :class:`ConfigError` naming the field."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{source}: {name} must be a positive integer, got {v!r}")
        if not isinstance(self.rms_norm_eps, (int, float)) or not (0 < self.rms_norm_eps < 1):
            raise ConfigError(f"{source}: rms_norm_eps must be in (0, 1), got {self.rms_norm_eps!r}")
        if isinstance(self.bitlinear_norm_eps, bool) or not isinstance(self.bitlinear_norm_eps, (int, float)) \
                or not (0 < self.bitlinear_norm_eps < 1):
            raise ConfigError(
                f"{source}: bitlinear_norm_eps must be in (0, 1), got {self.bitlinear_norm_eps!r}")
        if self.model_type != "hgrn_bit":
            raise ConfigError(f"{source}: model_type {self.model_type!r} is not supported (need 'hgrn_bit')")
        if self.use_short_conv:
            raise ConfigError(
                f"{source}: use_short_conv=true is not supported (no released checkpoint uses it)")
        if self.num_heads != 1:
            raise ConfigError(f"{source}: num_heads={self.num_heads!r} is not supported (only 1)")
        if self.expand_ratio != 1:
            raise ConfigError(f"{source}: expand_ratio={self.expand_ratio!r} is not supported (only 1)")
        if self.hidden_act not in ("swish", "silu"):
            raise ConfigError(f"{source}: hidden_act={self.hidden_act!r} is not supported (only swish/silu)")
        if self.tie_word_embeddings:
            raise ConfigError(
                f"{source}: tie_word_embeddings=true is not supported (released models are untied)")
        if not isinstance(self.use_lower_bound, bool):
            raise ConfigError(f"{source}: use_lower_bound must be a boolean, got {self.use_lower_bound!r}")

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dictionary, in the released field names."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        d.update(self.extra)
        d.setdefault("architectures", ["HGRNBitForCausalLM"])
        return d

    @property
    def n_params(self) -> int:
        """Parameters as the released code counts them (latent weights, norms, embeddings, lower bounds)."""
        h, i, v, n = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_hidden_layers
        # projections; attn_norm, mlp_norm, g_norm; the norms of i, f, g, o, gate (H) and down (I) BitLinears
        per_layer = 4 * h * h + 3 * h * i + 3 * h + 5 * h + i
        total = n * per_layer + v * h + v * h + h + h  # embeddings, lm_head, lm_head.norm, model.norm
        if self.use_lower_bound:
            total += n * h
        return total

    @property
    def n_trits(self) -> int:
        """Ternary weights streamed per decoded token (every BitLinear, the LM head included)."""
        h, i, v, n = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_hidden_layers
        return n * (4 * h * h + 3 * h * i) + v * h


def ternarize(w: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """Absmean ternary quantization of one latent weight tensor (``weight_quant`` of the released code).

    As ``mmfreelm/ops/bitnet.py`` ``weight_quant`` computes it in float32: ``beta = max(mean|W|, 1e-5)``,
    ``s = fl32(1 / beta)``, ``W_t = clamp(round(W * s), -1, 1)`` with ``round`` half to even
    (``torch.round``, ``numpy.rint``) of the float32 product; the dequantized weight is ``W_t / s``
    (:attr:`BitLinearWeights.inv_scale`). The mean is formed in float64 and rounded once to float32 (torch's
    float32 reduction may differ from it in the last bit). The released ``generate.py`` runs the model in
    float16, which changes some trits (docs/NUMERICS.md); float32 is the target here.

    Parameters
    ----------
    w : ndarray, shape [N, K], float32/float16/bfloat16-as-float32
        Latent weights of one BitLinear (``out_features`` x ``in_features``).

    Returns
    -------
    trits : ndarray, shape [N, K], int8, values in {-1, 0, 1}
    beta : numpy.float32
        The per-tensor scale; the dequantized weight is ``trits * beta``.
    """
    w32 = np.asarray(w, dtype=np.float32)
    beta = np.float32(max(float(np.mean(np.abs(w32), dtype=np.float64)), WEIGHT_SCALE_MIN))
    scaled = np.multiply(w32, np.float32(1.0) / beta)  # float32 product, as released; rounded, clipped in place
    np.rint(scaled, out=scaled)
    np.clip(scaled, -1, 1, out=scaled)
    return scaled.astype(np.int8), beta


def lower_bounds_per_layer(p: np.ndarray) -> np.ndarray:
    """Per-layer, per-channel forget-gate lower bounds from ``model.lower_bounds``.

    ``lb = cumsum(softmax(P, axis=0), axis=0) - softmax(P, axis=0)[0]`` (``HGRNBitModel.forward``), so
    ``lb[0] == 0`` and ``lb`` grows with depth towards ``1 - softmax(P)[0]``.

    Parameters
    ----------
    p : ndarray, shape [L, H], float32

    Returns
    -------
    ndarray, shape [L, H], float32
    """
    p = np.asarray(p, dtype=np.float32)
    e = np.exp(p - p.max(axis=0, keepdims=True))
    s = e / e.sum(axis=0, keepdims=True)
    return (np.cumsum(s, axis=0) - s[0]).astype(np.float32)


@dataclass
class BitLinearWeights:
    """One BitLinear: its own RMSNorm gamma, ternary codes and per-tensor scale.

    Attributes
    ----------
    norm : ndarray, shape [K], float32
        ``<name>.norm.weight``: gamma of the RMSNorm applied to the input (eps
        :attr:`HGRNBitConfig.bitlinear_norm_eps`, :data:`BITLINEAR_NORM_EPS` by default).
    trits : ndarray, shape [N, K], int8 in {-1, 0, 1}
        ``W_t`` from ``<name>.weight``, rows are output features.
    scale : numpy.float32
        ``beta``, the absmean scale; ``W ~= trits * scale``.
    """

    norm: np.ndarray
    trits: np.ndarray
    scale: np.float32

    @property
    def inv_scale(self) -> np.float32:
        """``s = fl32(1 / beta)``: the released ``weight_quant`` dequantizes as ``W_t / s``."""
        return np.float32(np.float32(1.0) / np.float32(self.scale))

    @property
    def in_features(self) -> int:
        return int(self.trits.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.trits.shape[0])


@dataclass
class LayerWeights:
    """One HGRN-Bit block (``model.layers.{l}``): MLGRU token mixer and GLU channel mixer.

    Norm gammas are ndarrays of shape [H] float32 (``g_norm``: [H], the output-gate RMSNorm).
    """

    attn_norm: np.ndarray
    i_proj: BitLinearWeights
    f_proj: BitLinearWeights
    g_proj: BitLinearWeights
    g_norm: np.ndarray
    o_proj: BitLinearWeights
    mlp_norm: np.ndarray
    gate_proj: BitLinearWeights  # [2I, H]: rows [0, I) are the SiLU gate, rows [I, 2I) the linear half
    down_proj: BitLinearWeights  # [H, I]

    def bitlinears(self) -> Iterator[tuple[str, BitLinearWeights]]:
        """(name, weights) of the six BitLinears in checkpoint order."""
        yield "attn.i_proj", self.i_proj
        yield "attn.f_proj", self.f_proj
        yield "attn.g_proj", self.g_proj
        yield "attn.o_proj", self.o_proj
        yield "mlp.gate_proj", self.gate_proj
        yield "mlp.down_proj", self.down_proj


@dataclass
class ModelWeights:
    """A whole quantized HGRN-Bit model, as the loader produces it.

    Attributes
    ----------
    config : HGRNBitConfig
    embeddings : ndarray, shape [V, H], float32
        ``model.embeddings.weight`` (looked up by the host; never streamed to the accelerator).
    lower_bounds : ndarray, shape [L, H], float32, or None
        Already transformed by :func:`lower_bounds_per_layer` (``lb[0] == 0``); None without lower bounds.
    layers : list of LayerWeights, length L
    norm : ndarray, shape [H], float32
        ``model.norm.weight``, the final RMSNorm.
    lm_head : BitLinearWeights
        ``lm_head``, shape [V, H].
    """

    config: HGRNBitConfig
    embeddings: np.ndarray
    lower_bounds: np.ndarray | None
    layers: list[LayerWeights]
    norm: np.ndarray
    lm_head: BitLinearWeights

    def lower_bound(self, layer: int) -> np.ndarray:
        """Forget-gate lower bound of ``layer``, shape [H] float32 (zeros for layer 0 or without bounds)."""
        h = self.config.hidden_size
        if self.lower_bounds is None or layer == 0:
            return np.zeros(h, dtype=np.float32)
        return self.lower_bounds[layer]

    def bitlinears(self) -> Iterator[tuple[str, BitLinearWeights]]:
        """(checkpoint prefix, weights) of every BitLinear, in execution order, the LM head last."""
        for idx, layer in enumerate(self.layers):
            for name, bl in layer.bitlinears():
                yield f"model.layers.{idx}.{name}", bl
        yield "lm_head", self.lm_head


def random_weights(config: HGRNBitConfig, *, seed: int = 0, gamma_spread: float = 0.0,
                   lower_bound_logits_std: float = 1.0) -> ModelWeights:
    """A randomly initialised quantized model, for tests and accuracy studies.

    Trits are drawn with P(0) = 1/3; embeddings ~ N(0, 1); every RMSNorm gamma is
    ``10 ** U(-gamma_spread/2, +gamma_spread/2)`` per channel (``gamma_spread=2`` spreads the channels
    over two orders of magnitude, so outlier channels exist), with random signs for none of them
    (gammas of trained models are positive almost everywhere). Lower-bound logits ~ N(0, std).

    Parameters
    ----------
    config : HGRNBitConfig
    seed : int
    gamma_spread : float
        Decades spanned by the per-channel gammas (0: all ones).
    lower_bound_logits_std : float

    Returns
    -------
    ModelWeights
    """
    rng = np.random.default_rng(seed)
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size

    def gamma(n: int) -> np.ndarray:
        return (10.0 ** rng.uniform(-gamma_spread / 2, gamma_spread / 2, size=n)).astype(np.float32)

    def bitlinear(n: int, k: int) -> BitLinearWeights:
        trits = rng.integers(-1, 2, size=(n, k), dtype=np.int8)
        return BitLinearWeights(norm=gamma(k), trits=trits, scale=np.float32(rng.uniform(0.01, 0.05)))

    layers = [
        LayerWeights(
            attn_norm=gamma(h), i_proj=bitlinear(h, h), f_proj=bitlinear(h, h), g_proj=bitlinear(h, h),
            g_norm=gamma(h), o_proj=bitlinear(h, h), mlp_norm=gamma(h), gate_proj=bitlinear(2 * i, h),
            down_proj=bitlinear(h, i))
        for _ in range(config.num_hidden_layers)
    ]
    lbs = None
    if config.use_lower_bound:
        p = rng.normal(0.0, lower_bound_logits_std, size=(config.num_hidden_layers, h)).astype(np.float32)
        lbs = lower_bounds_per_layer(p)
    return ModelWeights(config=config, embeddings=rng.normal(size=(v, h)).astype(np.float32),
                        lower_bounds=lbs, layers=layers, norm=gamma(h), lm_head=bitlinear(v, h))
