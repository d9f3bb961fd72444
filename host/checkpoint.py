"""Load and save HGRN-Bit checkpoints in the Hugging Face safetensors format.

A checkpoint is a directory laid out like ``ridger/MMfreeLM-370M``, ``-1.3B`` and ``-2.7B`` (the released
models of Zhu et al., *Scalable MatMul-free Language Modeling*, arXiv 2406.02528):

``config.json``
    The ``HGRNBitConfig`` fields, parsed by :meth:`host.model.HGRNBitConfig.from_dict`.
``model.safetensors``, or ``model.safetensors.index.json`` plus the shards its ``weight_map`` names
    The latent (16- or 32-bit float) weights, under the key names of the released code (see
    :func:`checkpoint_shapes`). When both forms are present the single file wins, as in ``transformers``.
``tokenizer.json`` (optional)
    A ``tokenizers`` tokenizer.

The loader ternarizes every BitLinear weight as soon as it is read (:func:`host.model.ternarize`), so the
float latent weights of the whole model are never held at once: loading the 2.7B shape holds the int8
trits (2.6 GB) and the float32 embeddings (0.33 GB) plus a few transient copies of one tensor (peak RSS
3.5 GB measured by ``bench/bench_checkpoint_memory.py``, against 10.8 GB for all latents as float32). It
reads safetensors files itself (8-byte little-endian header length, JSON header, raw little-endian
buffer) because the ``safetensors`` numpy backend cannot decode bfloat16, the dtype of the released 2.7B.

Supported tensor dtypes: ``F32``, ``F16``, ``BF16``; ``F64`` is accepted and converted to float32 (a value
beyond the float32 range then becomes infinite and is reported as non-finite). Any other dtype (integer,
boolean, 8-bit float) is an error. The writer produces ``F32``, ``F16`` or ``BF16`` (round to nearest
even), with ``"__metadata__": {"format": "pt"}`` like ``transformers``.

Every problem with the input raises :class:`CheckpointError` (a ``ValueError``) whose message starts with
the offending file and names the tensor key or config field. Loading never writes to the directory.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from host.model import (
    BitLinearWeights,
    ConfigError,
    HGRNBitConfig,
    LayerWeights,
    ModelWeights,
    lower_bounds_per_layer,
    ternarize,
)

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_INDEX_NAME",
    "TOKENIZER_NAME",
    "MAX_HEADER_BYTES",
    "CheckpointError",
    "CheckpointConfigError",
    "Checkpoint",
    "TensorInfo",
    "SafetensorsFile",
    "checkpoint_shapes",
    "read_config",
    "load_checkpoint",
    "save_checkpoint",
    "write_safetensors",
    "bf16_bits_to_f32",
    "f32_to_bf16_bits",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TOKENIZER_NAME = "tokenizer.json"

#: Largest safetensors JSON header accepted (the ``safetensors`` library's own limit).
MAX_HEADER_BYTES = 100_000_000

# safetensors dtype code -> (name reported in Checkpoint.dtype, little-endian storage dtype).
# BF16 is stored as its raw uint16 bit pattern and decoded by bf16_bits_to_f32.
_READ_DTYPES: dict[str, tuple[str, np.dtype]] = {
    "F32": ("float32", np.dtype("<f4")),
    "F16": ("float16", np.dtype("<f2")),
    "BF16": ("bfloat16", np.dtype("<u2")),
    "F64": ("float64", np.dtype("<f8")),
}
# dtype name accepted by the writer -> safetensors dtype code.
_WRITE_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_MAX_LISTED = 5  # key names listed in one error message
_WRITE_CHUNK = 1 << 22  # elements converted at a time by the writer (16 MiB of float32)


class CheckpointError(ValueError):
    """A checkpoint directory, file or tensor that cannot be loaded; the message names the file and key."""


class CheckpointConfigError(CheckpointError, ConfigError):
    """``config.json`` is unreadable or describes an unsupported model (also a :class:`ConfigError`)."""


# --------------------------------------------------------------------------------------------------------
# bfloat16 bit conversions


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Decode bfloat16 bit patterns to float32 (exact: bf16 is the high half of a float32).

    Parameters
    ----------
    bits : ndarray, any shape, uint16 (any byte order)

    Returns
    -------
    ndarray, same shape, float32 (native byte order)
    """
    wide = np.asarray(bits).astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16, to nearest with ties to even, and return the bit patterns.

    ``bits16 = (bits32 + 0x7FFF + ((bits32 >> 16) & 1)) >> 16``: finite values beyond the largest bfloat16
    (3.3895e38) round to infinity, infinities stay infinite with their sign, and every NaN stays a
    (quiet) NaN with its sign, even one whose payload lies only in the dropped low 16 bits. Subnormals
    round like any other value. This is what ``torch`` and ``ml_dtypes`` do.

    Parameters
    ----------
    x : array_like, any shape, converted to float32 first

    Returns
    -------
    ndarray, same shape, uint16 (native byte order)
    """
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    r = bits >> 16
    r &= 1
    r += 0x7FFF
    r += bits  # wraps only for NaN bit patterns (>= 0xFF800001), which are replaced below
    r >>= 16
    out = r.astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return out


# --------------------------------------------------------------------------------------------------------
# Expected tensors


def checkpoint_shapes(config: HGRNBitConfig) -> dict[str, tuple[int, ...]]:
    """Key names and shapes of every tensor an HGRN-Bit checkpoint holds, in execution order.

    Parameters
    ----------
    config : HGRNBitConfig

    Returns
    -------
    dict[str, tuple[int, ...]]
        ``model.embeddings.weight`` [V, H]; per layer ``l``: ``model.layers.{l}.attn_norm.weight`` [H],
        ``attn.{i,f,g}_proj.weight`` [H, H] and ``.norm.weight`` [H], ``attn.g_norm.weight`` [H],
        ``attn.o_proj.weight`` [H, H] and ``.norm.weight`` [H], ``mlp_norm.weight`` [H],
        ``mlp.gate_proj.weight`` [2I, H] and ``.norm.weight`` [H], ``mlp.down_proj.weight`` [H, I] and
        ``.norm.weight`` [I]; ``model.lower_bounds`` [L, H] (only with ``use_lower_bound``);
        ``model.norm.weight`` [H]; ``lm_head.weight`` [V, H]; ``lm_head.norm.weight`` [H].
        (Key names of ``HGRNBitForCausalLM`` in ``ridgerchu/matmulfreellm``.)
    """
    h, i, v, n = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_hidden_layers
    shapes: dict[str, tuple[int, ...]] = {"model.embeddings.weight": (v, h)}
    for layer in range(n):
        p = f"model.layers.{layer}."
        shapes[p + "attn_norm.weight"] = (h,)
        for proj in ("i_proj", "f_proj", "g_proj"):
            shapes[p + f"attn.{proj}.weight"] = (h, h)
            shapes[p + f"attn.{proj}.norm.weight"] = (h,)
        shapes[p + "attn.g_norm.weight"] = (h,)
        shapes[p + "attn.o_proj.weight"] = (h, h)
        shapes[p + "attn.o_proj.norm.weight"] = (h,)
        shapes[p + "mlp_norm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (2 * i, h)
        shapes[p + "mlp.gate_proj.norm.weight"] = (h,)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
        shapes[p + "mlp.down_proj.norm.weight"] = (i,)
    if config.use_lower_bound:
        shapes["model.lower_bounds"] = (n, h)
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (v, h)
    shapes["lm_head.norm.weight"] = (h,)
    return shapes


# --------------------------------------------------------------------------------------------------------
# safetensors reading


@dataclass(frozen=True)
class TensorInfo:
    """One tensor entry of a safetensors header.

    Attributes
    ----------
    name : str
        The tensor key.
    dtype : str
        safetensors dtype code (``"F32"``, ``"F16"``, ``"BF16"``, ``"F64"``).
    shape : tuple of int
    begin, end : int
        Absolute byte offsets of the tensor data in the file (``end - begin == prod(shape) * itemsize``).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def dtype_name(self) -> str:
        """numpy-style name of the stored dtype (``"bfloat16"`` for ``BF16``)."""
        return _READ_DTYPES[self.dtype][0]

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class SafetensorsFile:
    """A safetensors file whose header is parsed and validated on construction; tensors read one at a time.

    The header is checked completely before any tensor is read: length field within the file and below
    :data:`MAX_HEADER_BYTES`, valid UTF-8 JSON object, every entry with a supported ``dtype``, a ``shape``
    of non-negative integers and ``data_offsets`` ``[begin, end]`` inside the data section, of exactly
    ``prod(shape) * itemsize`` bytes, and no two tensors overlapping. Bytes of the data section that no
    tensor uses are tolerated. The file is only ever opened for reading.

    Parameters
    ----------
    path : str or os.PathLike

    Attributes
    ----------
    path : pathlib.Path
    metadata : dict[str, str]
        The ``__metadata__`` object (empty when absent).
    tensors : dict[str, TensorInfo]
        Entries in header order.

    Raises
    ------
    CheckpointError
        Naming the file (and the key for a bad entry): file missing or unreadable, truncated header or
        data, invalid JSON, malformed entry, unsupported dtype, size mismatch, overlapping tensors.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fh: BinaryIO | None = None
        self.metadata, self.tensors = self._parse_header()

    def _error(self, msg: str, key: str | None = None) -> CheckpointError:
        where = f"{self.path}: tensor {key!r}: " if key is not None else f"{self.path}: "
        return CheckpointError(where + msg)

    def _parse_header(self) -> tuple[dict[str, str], dict[str, TensorInfo]]:
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise self._error(f"truncated safetensors file: {size} bytes, less than the 8-byte "
                                      "header length field")
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER_BYTES:
                    raise self._error(f"safetensors header length field says {n} bytes (limit "
                                      f"{MAX_HEADER_BYTES}): not a safetensors file, or corrupt")
                if 8 + n > size:
                    raise self._error(f"truncated safetensors header: the length field says {n} bytes but "
                                      f"only {size - 8} follow")
                raw = f.read(n)
        except OSError as e:
            raise self._error(f"cannot read safetensors file ({e.strerror or e})") from e
        if len(raw) < n:
            raise self._error(f"truncated safetensors header: read {len(raw)} of {n} bytes")
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._error(f"safetensors header is not valid JSON ({e})") from e
        if not isinstance(header, dict):
            raise self._error(f"safetensors header must be a JSON object, got {type(header).__name__}")
        data_start = 8 + n
        data_len = size - data_start
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise self._error("safetensors '__metadata__' must be a JSON object")
        tensors: dict[str, TensorInfo] = {}
        for key, entry in header.items():
            tensors[key] = self._parse_entry(key, entry, data_start, data_len)
        by_offset = sorted(tensors.values(), key=lambda t: (t.begin, t.end))
        for prev, cur in zip(by_offset, by_offset[1:], strict=False):
            if cur.begin < prev.end and cur.nbytes and prev.nbytes:
                span = f"[{prev.begin - data_start}, {prev.end - data_start}]"
                raise self._error(f"data_offsets [{cur.begin - data_start}, {cur.end - data_start}] overlap "
                                  f"tensor {prev.name!r} at {span}", cur.name)
        return {str(k): str(v) for k, v in metadata.items()}, tensors

    def _parse_entry(self, key: str, entry: Any, data_start: int, data_len: int) -> TensorInfo:
        if not isinstance(entry, dict):
            raise self._error(f"header entry must be a JSON object, got {entry!r:.80}", key)
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise self._error(f"header entry has no string 'dtype' (got {dtype!r:.40})", key)
        if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
            raise self._error(f"'shape' must be a list of non-negative integers, got {shape!r:.80}", key)
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise self._error("'data_offsets' must be [begin, end] with 0 <= begin <= end, got "
                              f"{offsets!r:.80}", key)
        if dtype not in _READ_DTYPES:
            raise self._error(f"unsupported dtype {dtype!r} (supported: F32, F16, BF16; F64 is converted "
                              "to float32)", key)
        begin, end = offsets
        if end > data_len:
            raise self._error(f"data_offsets [{begin}, {end}] run past the end of the data section "
                              f"({data_len} bytes): the file is truncated or the header is corrupt", key)
        expected = math.prod(shape) * _READ_DTYPES[dtype][1].itemsize
        if end - begin != expected:
            raise self._error(f"data_offsets [{begin}, {end}] span {end - begin} bytes but {dtype} shape "
                              f"{tuple(shape)} needs {expected}", key)
        return TensorInfo(key, dtype, tuple(shape), data_start + begin, data_start + end)

    # -- reading ------------------------------------------------------------------------------------------

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file handle opened by :meth:`read` (reopened on the next read)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def read(self, key: str) -> np.ndarray:
        """Read one tensor, converted to float32.

        Parameters
        ----------
        key : str
            A key of :attr:`tensors`.

        Returns
        -------
        ndarray, shape ``tensors[key].shape``, float32, C-contiguous, owning its memory
            F16, BF16 and F32 are exact; F64 is rounded to float32 (out-of-range values become +-inf).

        Raises
        ------
        KeyError
            ``key`` is not in the file.
        CheckpointError
            The file is shorter than the header promised (changed since it was opened), or unreadable.
        """
        info = self.tensors[key]
        storage = _READ_DTYPES[info.dtype][1]
        buf = np.empty(math.prod(info.shape), dtype=storage)
        try:
            if self._fh is None:
                self._fh = open(self.path, "rb", buffering=0)  # closed by close()
            self._fh.seek(info.begin)
            got = _readinto(self._fh, buf.view(np.uint8))
        except OSError as e:
            raise self._error(f"cannot read tensor data ({e.strerror or e})", key) from e
        if got != info.nbytes:
            raise self._error(f"truncated tensor data: read {got} of {info.nbytes} bytes at offset "
                              f"{info.begin}", key)
        if info.dtype == "BF16":
            out = bf16_bits_to_f32(buf)
        elif info.dtype == "F64":
            with np.errstate(over="ignore"):
                out = buf.astype(np.float32)
        else:
            out = buf.astype(np.float32, copy=False)
        return out.reshape(info.shape)


def _readinto(fh: BinaryIO, view: np.ndarray) -> int:
    """Fill ``view`` (uint8, 1-D) from ``fh``; returns the bytes read (fewer only at end of file)."""
    mv = memoryview(view)
    total = 0
    while total < len(mv):
        got = fh.readinto(mv[total:])
        if not got:
            break
        total += got
    return total


# --------------------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A loaded checkpoint.

    Attributes
    ----------
    path : pathlib.Path
        The checkpoint directory.
    config : HGRNBitConfig
        From ``config.json``.
    weights : ModelWeights
        Ternarized BitLinears (int8 trits, float32 scale), float32 norms and embeddings, transformed
        lower bounds.
    tokenizer : tokenizers.Tokenizer or None
        From ``tokenizer.json``; None when the directory has none.
    dtype : str
        Storage dtype of the tensors in the files: ``"float32"``, ``"float16"``, ``"bfloat16"``,
        ``"float64"``, or ``"mixed"`` when they differ.
    """

    path: Path
    config: HGRNBitConfig
    weights: ModelWeights = field(repr=False)
    tokenizer: tokenizers.Tokenizer | None = field(repr=False)
    dtype: str


def _checkpoint_dir(path: str | os.PathLike[str]) -> Path:
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"{root}: checkpoint directory does not exist")
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory (a checkpoint is a directory holding {CONFIG_NAME} "
                              f"and {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME})")
    return root


def read_config(path: str | os.PathLike[str]) -> HGRNBitConfig:
    """Read and validate ``config.json``.

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint directory, or the ``config.json`` file itself.

    Returns
    -------
    HGRNBitConfig

    Raises
    ------
    CheckpointError
        Missing directory or file, unreadable file, invalid JSON.
    CheckpointConfigError
        (A :class:`CheckpointError` and a :class:`host.model.ConfigError`.) Missing or mistyped field,
        unsupported value (short convolution, several heads, unknown activation, ...); the message names
        the file and the field.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: checkpoint directory does not exist")
    cfg_path = p / CONFIG_NAME if p.is_dir() else p
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path}: missing: the checkpoint directory has no {CONFIG_NAME}")
    try:
        d = json.loads(cfg_path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CheckpointError(f"{cfg_path}: cannot read ({e.strerror or e})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointConfigError(f"{cfg_path}: not valid JSON ({e})") from e
    if isinstance(d, dict):  # name the field before from_dict's own int() conversions trip over it
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "hidden_ratio"):
            v = d.get(name)
            if v is not None and not _is_int(v):
                raise CheckpointConfigError(f"{cfg_path}: {name} must be an integer, got {v!r}")
    try:
        return HGRNBitConfig.from_dict(d, source=str(cfg_path))
    except ConfigError as e:
        raise CheckpointConfigError(str(e)) from e
    except (TypeError, ValueError) as e:  # e.g. int() of a non-numeric hidden_size inside from_dict
        raise CheckpointConfigError(f"{cfg_path}: invalid field value ({e})") from e


def _listed(names: Iterable[str]) -> str:
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    return shown + (f", ... ({len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else "")


def _open_weights(root: Path, stack: ExitStack) -> tuple[Path, dict[str, SafetensorsFile]]:
    """Parse every weights file's header; return (the file that lists the weights, key -> file)."""
    single = root / WEIGHTS_NAME
    index = root / WEIGHTS_INDEX_NAME
    if single.is_file():
        st = stack.enter_context(SafetensorsFile(single))
        return single, dict.fromkeys(st.tensors, st)
    if not index.is_file():
        pickles = sorted(p.name for p in root.glob("pytorch_model*.bin*"))
        hint = (f" (found {', '.join(pickles)}: PyTorch pickles are not read; convert them to safetensors)"
                if pickles else "")
        raise CheckpointError(f"{root}: no weights: neither {WEIGHTS_NAME} nor {WEIGHTS_INDEX_NAME} exists"
                              + hint)
    try:
        idx = json.loads(index.read_text(encoding="utf-8"))
    except OSError as e:
        raise CheckpointError(f"{index}: cannot read ({e.strerror or e})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{index}: not valid JSON ({e})") from e
    weight_map = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: needs a non-empty 'weight_map' object (tensor key -> shard file)")
    shards: dict[str, SafetensorsFile] = {}
    for key, fname in weight_map.items():
        if not isinstance(fname, str) or not fname or Path(fname).name != fname or fname in (".", ".."):
            raise CheckpointError(f"{index}: weight_map[{key!r}] must be a file name in the checkpoint "
                                  f"directory, got {fname!r}")
        if fname in shards:
            continue
        shard = root / fname
        if not shard.is_file():
            raise CheckpointError(f"{index}: shard file {fname!r} (holding tensor {key!r}) does not exist "
                                  f"in {root}")
        shards[fname] = stack.enter_context(SafetensorsFile(shard))
    where: dict[str, SafetensorsFile] = {}
    for st in shards.values():
        for key in st.tensors:
            if key in where:
                raise CheckpointError(f"{st.path}: tensor {key!r} is also stored in {where[key].path.name}: "
                                      "a key must be in one shard only")
            where[key] = st
    for key, fname in weight_map.items():
        if key not in where:
            raise CheckpointError(f"{index}: tensor {key!r} is mapped to shard {fname!r}, which does not "
                                  "hold it")
        if where[key].path.name != fname:
            raise CheckpointError(f"{index}: tensor {key!r} is mapped to shard {fname!r} but is stored in "
                                  f"{where[key].path.name}")
    unlisted = [k for k in where if k not in weight_map]
    if unlisted:
        st = where[unlisted[0]]
        raise CheckpointError(f"{st.path}: tensor(s) {_listed(unlisted)} not listed in the weight_map of "
                              f"{index.name}")
    return index, where


def _check_tensors(config: HGRNBitConfig, listing: Path, where: Mapping[str, SafetensorsFile]) -> None:
    expected = checkpoint_shapes(config)
    missing = [k for k in expected if k not in where]
    if missing:
        raise CheckpointError(f"{listing}: missing {len(missing)} tensor(s) that {CONFIG_NAME} requires: "
                              f"{_listed(missing)}")
    extra = sorted(k for k in where if k not in expected)
    if extra:
        named = [f"{k} (in {where[k].path.name})" for k in extra]
        hint = ""
        if "model.lower_bounds" in extra and not config.use_lower_bound:
            hint = f" ({CONFIG_NAME} has use_lower_bound=false)"
        raise CheckpointError(f"{where[extra[0]].path}: {len(extra)} unexpected tensor(s) not part of "
                              f"HGRN-Bit{hint}: {_listed(named)}")
    for key, shape in expected.items():
        got = where[key].tensors[key].shape
        if got != shape:
            raise CheckpointError(f"{where[key].path}: tensor {key!r}: shape {list(got)} but {CONFIG_NAME} "
                                  f"implies {list(shape)}")


def _check_finite(path: Path, key: str, a: np.ndarray, dtype: str) -> None:
    finite = np.isfinite(a)
    if finite.all():
        return
    n_nan = int(np.count_nonzero(np.isnan(a)))
    n_bad = int(a.size - np.count_nonzero(finite))
    first = tuple(int(i) for i in np.unravel_index(int(np.argmin(finite.reshape(-1))), a.shape))
    note = " after conversion to float32" if dtype == "F64" else ""
    raise CheckpointError(f"{path}: tensor {key!r}: {n_bad} non-finite value(s){note} ({n_nan} NaN, "
                          f"{n_bad - n_nan} Inf), first at index {list(first)}")


def _load_tokenizer(root: Path, config: HGRNBitConfig) -> tokenizers.Tokenizer | None:
    path = root / TOKENIZER_NAME
    if not path.exists():
        return None
    import tokenizers  # only when there is a tokenizer to load

    try:
        tok = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise CheckpointError(f"{path}: cannot load the tokenizer ({e})") from e
    n = tok.get_vocab_size(with_added_tokens=True)
    if n > config.vocab_size:
        raise CheckpointError(f"{path}: the tokenizer has {n} tokens but {CONFIG_NAME} vocab_size is "
                              f"{config.vocab_size}: token ids would index past the embeddings")
    return tok


def _progress_bar() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("loading {task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True))


def load_checkpoint(path: str | os.PathLike[str], *, progress: bool = False) -> Checkpoint:
    """Load a checkpoint directory: config, ternarized weights and optional tokenizer.

    All headers, key names and shapes are validated before any tensor data is read. Tensors are then read
    one at a time, converted to float32 and checked for NaN/Inf; BitLinear latent weights are ternarized
    at once with :func:`host.model.ternarize` (per-tensor absmean scale, arXiv 2406.02528 eq. 3) and
    dropped, so peak memory is about the result plus a few copies of the largest tensor. Norm gammas and
    embeddings stay float32; ``model.lower_bounds`` is transformed by
    :func:`host.model.lower_bounds_per_layer`. Nothing is written to disk.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory (see the module docstring for its layout).
    progress : bool
        Show a ``rich`` progress bar over the tensors on stderr.

    Returns
    -------
    Checkpoint

    Raises
    ------
    CheckpointError
        With the offending file and key or field in the message: missing directory, ``config.json`` or
        weights; unsupported config (:class:`CheckpointConfigError`); invalid or truncated safetensors
        header or data; unsupported dtype; missing, unexpected or misshapen tensors; NaN or Inf values;
        a sharded index naming a missing shard, a key stored in two shards, or an index inconsistent with
        the shards; an unloadable ``tokenizer.json`` or one with more tokens than ``vocab_size``.
    """
    root = _checkpoint_dir(path)
    config = read_config(root)
    with ExitStack() as stack:
        listing, where = _open_weights(root, stack)
        _check_tensors(config, listing, where)
        tokenizer = _load_tokenizer(root, config)
        dtypes = {where[k].tensors[k].dtype_name for k in where}
        expected = checkpoint_shapes(config)
        bar = _progress_bar() if progress else nullcontext()
        with bar:
            task = bar.add_task("", total=len(expected)) if progress else None

            def get(key: str) -> np.ndarray:
                st = where[key]
                if progress:
                    bar.update(task, description=key)
                a = st.read(key)
                _check_finite(st.path, key, a, st.tensors[key].dtype)
                if progress:
                    bar.advance(task)
                return a

            weights = _build_weights(config, get)
            if progress:
                bar.update(task, description=root.name)
    return Checkpoint(path=root, config=config, weights=weights, tokenizer=tokenizer,
                      dtype=dtypes.pop() if len(dtypes) == 1 else "mixed")


def _build_weights(config: HGRNBitConfig, get: Callable[[str], np.ndarray]) -> ModelWeights:
    def bitlinear(prefix: str) -> BitLinearWeights:
        trits, beta = ternarize(get(prefix + ".weight"))  # the float latent copy dies here
        return BitLinearWeights(norm=get(prefix + ".norm.weight"), trits=trits, scale=beta)

    # The LM head is the largest ternarized tensor: quantize it first, while little else is held, so the
    # temporaries of ternarize() do not stack on top of all the other trits.
    lm_head = bitlinear("lm_head")
    embeddings = get("model.embeddings.weight")
    layers = []
    for idx in range(config.num_hidden_layers):
        p = f"model.layers.{idx}."
        layers.append(LayerWeights(
            attn_norm=get(p + "attn_norm.weight"),
            i_proj=bitlinear(p + "attn.i_proj"),
            f_proj=bitlinear(p + "attn.f_proj"),
            g_proj=bitlinear(p + "attn.g_proj"),
            g_norm=get(p + "attn.g_norm.weight"),
            o_proj=bitlinear(p + "attn.o_proj"),
            mlp_norm=get(p + "mlp_norm.weight"),
            gate_proj=bitlinear(p + "mlp.gate_proj"),
            down_proj=bitlinear(p + "mlp.down_proj"),
        ))
    lower_bounds = lower_bounds_per_layer(get("model.lower_bounds")) if config.use_lower_bound else None
    return ModelWeights(config=config, embeddings=embeddings, lower_bounds=lower_bounds, layers=layers,
                        norm=get("model.norm.weight"), lm_head=lm_head)


# --------------------------------------------------------------------------------------------------------
# Writing


def _encode(a: np.ndarray, code: str) -> np.ndarray:
    """float32 array -> little-endian storage array of safetensors dtype ``code``."""
    if code == "BF16":
        return f32_to_bf16_bits(a).astype("<u2", copy=False)
    if code == "F16":
        with np.errstate(over="ignore"):
            return a.astype("<f2")
    return a.astype("<f4", copy=False)


def _encoded_finite(code: str, enc: np.ndarray) -> bool:
    if code == "BF16":  # exponent all ones: Inf or NaN
        return not np.any((enc & 0x7F80) == 0x7F80)
    return bool(np.isfinite(enc).all())


def write_safetensors(path: str | os.PathLike[str], tensors: Mapping[str, Any], *,
                      dtype: str = "bfloat16", metadata: Mapping[str, str] | None = None,
                      check_finite: bool = False) -> int:
    """Write one safetensors file, streaming: one tensor is converted and held at a time.

    The header (shapes from each value's ``shape`` attribute) is written first, padded with spaces to a
    multiple of 8 bytes as the ``safetensors`` library does, then the tensors in mapping order, contiguous.

    Parameters
    ----------
    path : str or os.PathLike
        The file to (over)write.
    tensors : Mapping[str, array_like]
        Float values. Each value needs a ``shape`` attribute and must convert with
        ``numpy.asarray(value, dtype=numpy.float32)``; a lazy object with ``shape`` and ``__array__`` is
        materialized only when its turn comes, so huge files can be written in little memory.
    dtype : {"bfloat16", "float16", "float32"}
        Storage dtype; bfloat16 rounds to nearest even (:func:`f32_to_bf16_bits`), float16 likewise.
    metadata : Mapping[str, str], optional
        The ``__metadata__`` object (e.g. ``{"format": "pt"}``).
    check_finite : bool
        Raise :class:`CheckpointError` for a value that is NaN or Inf before or after rounding to ``dtype``
        (a float32 beyond the float16/bfloat16 range overflows to Inf).

    Returns
    -------
    int
        Bytes written.

    Raises
    ------
    ValueError
        Unknown ``dtype``; a value whose converted shape differs from its ``shape`` attribute.
    CheckpointError
        Non-finite value with ``check_finite``, naming the file and key.
    """
    return _write_safetensors(Path(path), tensors, dtype=dtype, metadata=metadata, check_finite=check_finite,
                              shown=Path(path))


def _write_safetensors(path: Path, tensors: Mapping[str, Any], *, dtype: str,
                       metadata: Mapping[str, str] | None, check_finite: bool, shown: Path) -> int:
    """:func:`write_safetensors`, naming ``shown`` in error messages (the final name of a temporary file)."""
    if dtype not in _WRITE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_WRITE_DTYPES)}, got {dtype!r}")
    code = _WRITE_DTYPES[dtype]
    itemsize = _READ_DTYPES[code][1].itemsize
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    shapes = {}
    for key, value in tensors.items():
        shape = tuple(int(s) for s in value.shape)
        nbytes = math.prod(shape) * itemsize
        header[key] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        shapes[key] = shape
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for key, value in tensors.items():
            a = np.asarray(value, dtype=np.float32)
            if a.shape != shapes[key]:
                raise ValueError(f"{shown}: tensor {key!r}: value has shape {a.shape} but its 'shape' "
                                 f"attribute said {shapes[key]}")
            if check_finite:
                _check_finite(shown, key, a, "F32")
            flat = np.ascontiguousarray(a).reshape(-1)
            for start in range(0, flat.size, _WRITE_CHUNK):  # bounded temporaries for huge tensors
                enc = _encode(flat[start:start + _WRITE_CHUNK], code)
                if check_finite and not _encoded_finite(code, enc):
                    raise CheckpointError(f"{shown}: tensor {key!r}: a value overflows {dtype} (Inf after "
                                          "rounding)")
                f.write(enc.view(np.uint8))
            del a, flat
    return 8 + len(raw) + offset


def _shard_plan(sizes: Mapping[str, int], shard_size_bytes: int | None) -> list[list[str]]:
    """Greedy split, in key order, into groups of at most ``shard_size_bytes`` (a larger tensor alone)."""
    keys = list(sizes)
    if shard_size_bytes is None or sum(sizes.values()) <= shard_size_bytes:
        return [keys]
    groups: list[list[str]] = [[]]
    used = 0
    for k in keys:
        if groups[-1] and used + sizes[k] > shard_size_bytes:
            groups.append([])
            used = 0
        groups[-1].append(k)
        used += sizes[k]
    return groups


def _existing_weight_files(root: Path) -> list[Path]:
    found = []
    if (root / WEIGHTS_NAME).exists():
        found.append(root / WEIGHTS_NAME)
    index = root / WEIGHTS_INDEX_NAME
    if index.exists():
        found.append(index)
        try:
            wm = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            names = {v for v in wm.values() if isinstance(v, str) and Path(v).name == v}
        except (OSError, ValueError, AttributeError):
            names = set()
        found += [root / n for n in sorted(names) if (root / n).is_file()]
    return found


def save_checkpoint(path: str | os.PathLike[str], config: HGRNBitConfig, tensors: Mapping[str, Any], *,
                    dtype: str = "bfloat16", shard_size_bytes: int | None = None, strict: bool = True,
                    overwrite: bool = False) -> Path:
    """Write a Hugging Face-format checkpoint directory from float latent tensors.

    Writes ``config.json`` (``config.to_dict()`` with ``torch_dtype`` set to ``dtype``) and either
    ``model.safetensors`` or, when the tensors exceed ``shard_size_bytes``, shards
    ``model-00001-of-0000N.safetensors`` (greedy, in mapping order) plus ``model.safetensors.index.json``
    (``{"metadata": {"total_size": bytes}, "weight_map": {key: shard}}``), all with
    ``"__metadata__": {"format": "pt"}``: the layout :func:`load_checkpoint` and ``transformers`` read.
    Each file is written under a temporary name and renamed, so an interrupted save leaves no partial
    file under a final name. Memory: one tensor converted at a time (see :func:`write_safetensors`).

    Parameters
    ----------
    path : str or os.PathLike
        Directory; created if needed.
    config : HGRNBitConfig
    tensors : Mapping[str, array_like]
        Float latent tensors by key (values as in :func:`write_safetensors`; lazy values are fine).
    dtype : {"bfloat16", "float16", "float32"}
    shard_size_bytes : int, optional
        Largest shard in bytes of tensor data; None writes a single file.
    strict : bool
        Require exactly the keys and shapes of :func:`checkpoint_shapes` and finite values that stay finite
        in ``dtype``. ``strict=False`` writes anything (used by tests to build broken checkpoints).
    overwrite : bool
        Replace existing weights in ``path``; the old ``model.safetensors``, index and shards that the new
        checkpoint does not reuse are deleted. Without it existing weights raise ``FileExistsError``.

    Returns
    -------
    pathlib.Path
        The directory.

    Raises
    ------
    ValueError
        Bad ``dtype`` or ``shard_size_bytes``.
    CheckpointError
        With ``strict``: missing, unexpected or misshapen tensors, non-finite values.
    FileExistsError
        Weights already in ``path`` and not ``overwrite``.
    """
    if dtype not in _WRITE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_WRITE_DTYPES)}, got {dtype!r}")
    if shard_size_bytes is not None and (not _is_int(shard_size_bytes) or shard_size_bytes <= 0):
        raise ValueError(f"shard_size_bytes must be a positive integer or None, got {shard_size_bytes!r}")
    root = Path(path)
    config.validate(source="config")
    if strict:
        expected = checkpoint_shapes(config)
        missing = [k for k in expected if k not in tensors]
        extra = [k for k in tensors if k not in expected]
        if missing or extra:
            raise CheckpointError(f"{root}: tensors do not match the config: missing "
                                  f"{_listed(missing) or 'none'}; unexpected {_listed(extra) or 'none'}")
        for k, shape in expected.items():
            got = tuple(int(s) for s in tensors[k].shape)
            if got != shape:
                raise CheckpointError(f"{root}: tensor {k!r}: shape {list(got)}, config implies "
                                      f"{list(shape)}")
    root.mkdir(parents=True, exist_ok=True)
    old = _existing_weight_files(root)
    if old and not overwrite:
        raise FileExistsError(f"{old[0]}: weights already exist (pass overwrite=True to replace them)")

    itemsize = _READ_DTYPES[_WRITE_DTYPES[dtype]][1].itemsize
    sizes = {k: math.prod(int(s) for s in v.shape) * itemsize for k, v in tensors.items()}
    groups = _shard_plan(sizes, shard_size_bytes)
    names = ([WEIGHTS_NAME] if len(groups) == 1 else
             [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))])
    written: list[Path] = []

    def commit(final: Path, write: Callable[[Path], object]) -> None:
        tmp = final.with_name(final.name + ".tmp")
        try:
            write(tmp)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        written.append(final)

    for name, group in zip(names, groups, strict=True):
        commit(root / name, lambda p, g=group, n=name: _write_safetensors(
            p, {k: tensors[k] for k in g}, dtype=dtype, metadata={"format": "pt"}, check_finite=strict,
            shown=root / n))
    if len(groups) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())},
                 "weight_map": {k: n for n, g in zip(names, groups, strict=True) for k in sorted(g)}}
        index["weight_map"] = dict(sorted(index["weight_map"].items()))
        commit(root / WEIGHTS_INDEX_NAME, lambda p: p.write_text(json.dumps(index, indent=2) + "\n"))
    cfg = config.to_dict()
    cfg["torch_dtype"] = dtype
    commit(root / CONFIG_NAME, lambda p: p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n"))
    for stale in old:
        if stale not in written:
            stale.unlink(missing_ok=True)
    return root
