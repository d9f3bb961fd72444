"""Synthetic checkpoints for tests and benchmarks: tiny configs, random latent tensors, a tiny tokenizer.

Everything here writes through :func:`host.checkpoint.save_checkpoint`, i.e. in the on-disk format of the
released ``ridger/MMfreeLM-*`` checkpoints (Hugging Face safetensors, ``config.json``, ``tokenizer.json``).
Tensors can be lazy (:class:`RandomTensor`): they are generated only when the writer reaches them, so a
checkpoint of the 2.7B shape can be written with one tensor in memory at a time.
"""

from __future__ import annotations

import functools
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from host.checkpoint import TOKENIZER_NAME, checkpoint_shapes, save_checkpoint
from host.model import HGRNBitConfig

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "TINY",
    "tiny_config",
    "RandomTensor",
    "random_tensors",
    "tiny_tokenizer",
    "write_tiny_checkpoint",
]

#: The tiny shape used by the checkpoint tests: vocabulary 67, hidden 12, 2 layers, intermediate 20.
TINY = {"vocab_size": 67, "hidden_size": 12, "num_hidden_layers": 2, "intermediate_size": 20}

_SENTENCES = [
    "The MatMul-free language model replaces every multiplication with ternary additions.",
    "A recurrent token mixer keeps one hidden state per layer and channel.",
    "Ternary weights take the values minus one, zero and plus one.",
    "The accelerator streams packed trits from memory and adds int8 activations.",
    "The quick brown fox jumps over the lazy dog.",
]
_POOL_SIZE = 1_000_003  # values in the shared random pool of "fast" tensors (a prime: no row alignment)


@functools.lru_cache(maxsize=4)
def _pool(seed: int) -> np.ndarray:
    pool = np.random.default_rng(seed).standard_normal(_POOL_SIZE, dtype=np.float32)
    pool.flags.writeable = False
    return pool


def tiny_config(**overrides: Any) -> HGRNBitConfig:
    """:data:`TINY` with ``overrides`` (any ``config.json`` field), validated."""
    return HGRNBitConfig.from_dict({**TINY, **overrides}, source="tiny_config")


def _kind(key: str) -> str:
    if key == "model.lower_bounds":
        return "lower_bounds"
    if key == "model.embeddings.weight":
        return "embeddings"
    if key.endswith("norm.weight"):  # block norms, BitLinear norms, g_norm, model.norm
        return "gamma"
    return "latent"


class RandomTensor:
    """A lazy random float32 tensor: generated on ``numpy.asarray(t)``, deterministic in (seed, key).

    Values by kind: latent BitLinear weights ~ N(0, 0.02^2); RMSNorm gammas ~ 1 + N(0, 0.1^2);
    embeddings ~ N(0, 1); lower-bound logits ~ N(0, 1).

    Parameters
    ----------
    key : str
        Checkpoint key; selects the distribution and seeds the generator.
    shape : tuple of int
    seed : int
    fast : bool
        Instead of drawing every value, tile a shared pool of about 10^6 standard normals from an offset
        that depends on the key (memory-bandwidth speed; for benchmarks where the values only need to look
        like weights, not be independent).

    Attributes
    ----------
    key, shape, dtype (always float32), nbytes (float32 bytes)
    """

    dtype = np.dtype(np.float32)

    def __init__(self, key: str, shape: tuple[int, ...], *, seed: int = 0, fast: bool = False) -> None:
        self.key = key
        self.shape = tuple(int(s) for s in shape)
        self.seed = int(seed)
        self.fast = bool(fast)

    @property
    def nbytes(self) -> int:
        return 4 * int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self) -> str:
        return f"RandomTensor({self.key!r}, {self.shape}, seed={self.seed}, fast={self.fast})"

    def materialize(self) -> np.ndarray:
        """The values, shape ``self.shape``, float32."""
        n = int(np.prod(self.shape, dtype=np.int64))
        tag = zlib.crc32(self.key.encode())
        if self.fast:
            pool = _pool(self.seed)
            start = tag % _POOL_SIZE
            z = np.resize(np.concatenate([pool[start:], pool[:start]]), n)
        else:
            z = np.random.default_rng([self.seed, tag]).standard_normal(n, dtype=np.float32)
        kind = _kind(self.key)
        if kind == "latent":
            z *= np.float32(0.02)
        elif kind == "gamma":
            z *= np.float32(0.1)
            z += np.float32(1.0)
        return z.reshape(self.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.materialize()
        return a if dtype is None else a.astype(dtype, copy=False)


def random_tensors(config: HGRNBitConfig, *, seed: int = 0, lazy: bool = False,
                   fast: bool = False) -> dict[str, Any]:
    """Random float latent tensors for every key of :func:`host.checkpoint.checkpoint_shapes`.

    Parameters
    ----------
    config : HGRNBitConfig
    seed : int
    lazy : bool
        Return :class:`RandomTensor` objects (generated when read) instead of float32 ndarrays.
    fast : bool
        See :class:`RandomTensor`.

    Returns
    -------
    dict[str, ndarray or RandomTensor]
        In checkpoint order; ndarrays are float32 of the checkpoint shapes.
    """
    out = {k: RandomTensor(k, s, seed=seed, fast=fast) for k, s in checkpoint_shapes(config).items()}
    return out if lazy else {k: t.materialize() for k, t in out.items()}


def tiny_tokenizer(vocab_size: int = TINY["vocab_size"]) -> tokenizers.Tokenizer:
    """A byte-pair-encoding tokenizer trained on a few sentences, with at most ``vocab_size`` tokens.

    Special tokens ``<unk>`` = 0, ``<s>`` = 1, ``</s>`` = 2 (the released models' ids); whitespace
    pre-tokenization, ``##`` continuation prefix and a WordPiece decoder, so ``decode(encode(s).ids)``
    gives back ``s`` for text made of the training characters (single spaces between words).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  continuing_subword_prefix="##", show_progress=False)
    tok.train_from_iterator(_SENTENCES, trainer)
    return tok


def write_tiny_checkpoint(path: str | os.PathLike[str], config: HGRNBitConfig | None = None, *,
                          dtype: str = "bfloat16", seed: int = 0, shard_size_bytes: int | None = None,
                          tokenizer: bool = False) -> dict[str, np.ndarray]:
    """Write a random checkpoint (default :data:`TINY` shape) and return the float32 tensors written.

    Parameters
    ----------
    path : str or os.PathLike
        Directory to create.
    config : HGRNBitConfig, optional
        Default :func:`tiny_config`.
    dtype : {"bfloat16", "float16", "float32"}
    seed : int
    shard_size_bytes : int, optional
        Shard the weights (see :func:`host.checkpoint.save_checkpoint`).
    tokenizer : bool
        Also write ``tokenizer.json`` (:func:`tiny_tokenizer`).

    Returns
    -------
    dict[str, ndarray]
        The float32 tensors before rounding to ``dtype``.
    """
    config = config or tiny_config()
    tensors = random_tensors(config, seed=seed)
    save_checkpoint(path, config, tensors, dtype=dtype, shard_size_bytes=shard_size_bytes)
    if tokenizer:
        tiny_tokenizer(config.vocab_size).save(str(Path(path) / TOKENIZER_NAME))
    return tensors
