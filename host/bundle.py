"""The deployable model bundle (``.mmf``): everything a device needs to run a compiled model, in one file.

Compile on a workstation (``mmfree compile --out model.mmf``), copy one file, run on a board with the
runtime dependencies only (numpy, safetensors, tokenizers; no compiler, numba, torch or Amaranth)::

    bundle = read_bundle("model.mmf")      # checks format, version and checksum
    bundle.image                           # the model image (hw.isa): what the accelerator streams
    bundle.embeddings                      # [V, H] int32, the residual format: token packets' payloads
    bundle.tokenizer                       # tokenizers.Tokenizer
    bundle.config                          # host.model.HGRNBitConfig

Format
------
A `safetensors <https://huggingface.co/docs/safetensors>`_ file (the format of the checkpoints themselves,
so no container of our own): two tensors, ``image`` (uint8 [image bytes]) and ``embeddings`` (int32 [V, H],
already converted to the image's ``residual_frac`` fraction bits with :func:`hw.numerics.to_fixed`, exactly
what :func:`host.protocol.make_token_packet` carries), and string metadata:

=====================  ==============================================================================
``format``             ``"mmfree-bundle"``
``bundle_version``     :data:`BUNDLE_VERSION`
``isa_version``        :data:`hw.isa.ISA_VERSION` of the image (checked against this host's)
``config``             the model's ``config.json`` (JSON)
``tokenizer``          the model's ``tokenizer.json`` (JSON; empty when the model has none)
``compile``            how it was compiled (packing, channels, output gate, LUT size; JSON)
``sha256``             SHA-256 over the image bytes, the embeddings' bytes and every other metadata
                       entry (sorted, ``key=value\\n``): one checksum over all of it
=====================  ==============================================================================

A single file rather than a directory: one thing to copy and one checksum, and safetensors maps it without
copying. The image inside still carries its own CRCs (header, instructions, constants), which the hardware
checks every token; the bundle's checksum catches what happens to the file before that.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from host.model import HGRNBitConfig
from hw import isa

if TYPE_CHECKING:
    import tokenizers

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "BUNDLE_SUFFIX", "Bundle", "BundleError", "read_bundle",
           "write_bundle", "embeddings_fixed"]

BUNDLE_FORMAT = "mmfree-bundle"
BUNDLE_VERSION = 1
BUNDLE_SUFFIX = ".mmf"


class BundleError(ValueError):
    """A bundle that cannot be used: not a bundle, corrupt (checksum), another version, inconsistent."""


def embeddings_fixed(embeddings: np.ndarray, residual_frac: int) -> np.ndarray:
    """Float embeddings [V, H] in the residual format (int32, ``residual_frac`` fraction bits, round half to
    even, saturated: :func:`hw.numerics.to_fixed`), the payload of each token's packet."""
    from hw import numerics as nx

    return nx.to_fixed(np.asarray(embeddings, dtype=np.float32), int(residual_frac)).astype(np.int32)


@dataclass(frozen=True)
class Bundle:
    """A read (and verified) model bundle.

    Attributes
    ----------
    image : bytes
        The model image (:mod:`hw.isa`), as compiled.
    embeddings : ndarray, shape [V, H], int32
        Embedding rows in the image's residual format.
    config : HGRNBitConfig
    tokenizer_json : str or None
    compile_options : dict
        ``packing``, ``channels``, ``output_gate``, ``lut_segments_log2`` as compiled.
    path : Path or None
    """

    image: bytes
    embeddings: np.ndarray
    config: HGRNBitConfig
    tokenizer_json: str | None
    compile_options: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def tokenizer(self) -> tokenizers.Tokenizer | None:
        """The model's tokenizer (a new :class:`tokenizers.Tokenizer` each call), or None."""
        if not self.tokenizer_json:
            return None
        import tokenizers

        return tokenizers.Tokenizer.from_str(self.tokenizer_json)

    @property
    def residual_frac(self) -> int:
        """Fraction bits of the residual format (the image header's ``residual_frac``)."""
        return int(isa.unpack(isa.ImageHeader, self.image).residual_frac)


def _digest(image: bytes, embeddings: np.ndarray, meta: dict[str, str]) -> str:
    h = hashlib.sha256()
    h.update(image)
    h.update(np.ascontiguousarray(embeddings, dtype="<i4").tobytes())
    for key in sorted(k for k in meta if k != "sha256"):
        h.update(f"{key}={meta[key]}\n".encode())
    return h.hexdigest()


def write_bundle(path: str | os.PathLike[str], image: bytes, *, config: HGRNBitConfig, embeddings: np.ndarray,
                 tokenizer_json: str | None = None, compile_options: dict[str, Any] | None = None) -> Path:
    """Write a bundle atomically (a ``.partial`` file renamed into place).

    Parameters
    ----------
    path : path-like
        The bundle file (conventionally ``*.mmf``).
    image : bytes
        A model image (:func:`host.compiler.compile_model`); only its header is read here.
    config : HGRNBitConfig
    embeddings : ndarray, shape [V, H], float32
        The model's float embeddings; stored in the image's residual format.
    tokenizer_json : str, optional
    compile_options : dict, optional
        Recorded as metadata (JSON-serializable values).

    Returns
    -------
    Path

    Raises
    ------
    BundleError
        If the image header does not match the config or the embeddings' shape.
    """
    from safetensors.numpy import save_file

    path = Path(path)
    head = isa.unpack(isa.ImageHeader, image)
    emb = np.asarray(embeddings)
    if emb.shape != (config.vocab_size, config.hidden_size):
        raise BundleError(f"embeddings have shape {emb.shape}, the config says "
                          f"({config.vocab_size}, {config.hidden_size})")
    if (head.vocab, head.hidden, head.n_layers) != (config.vocab_size, config.hidden_size, config.num_hidden_layers):
        raise BundleError(f"the image is of another model (vocab {head.vocab}, hidden {head.hidden}, "
                          f"{head.n_layers} layers) than the config")
    fixed = emb if emb.dtype == np.int32 else embeddings_fixed(emb, head.residual_frac)
    meta = {
        "format": BUNDLE_FORMAT, "bundle_version": str(BUNDLE_VERSION), "isa_version": str(int(head.version)),
        "config": json.dumps(config.to_dict(), sort_keys=True), "tokenizer": tokenizer_json or "",
        "compile": json.dumps(compile_options or {}, sort_keys=True),
    }
    meta["sha256"] = _digest(image, fixed, meta)
    tmp = path.with_name(path.name + ".partial")
    try:
        save_file({"image": np.frombuffer(image, dtype=np.uint8), "embeddings": np.ascontiguousarray(fixed)},
                  str(tmp), metadata=meta)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Read and verify a bundle.

    Raises
    ------
    FileNotFoundError, IsADirectoryError, PermissionError
        If the file cannot be read.
    BundleError
        Not a bundle (or not a safetensors file), another bundle or ISA version (saying what to rebuild), a
        checksum mismatch (corrupt or edited), or contents that contradict each other.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a bundle file (compile one with "
                                f"`mmfree compile --out model{BUNDLE_SUFFIX}`)")
    if not path.exists():
        raise FileNotFoundError(f"bundle not found: {path}")
    try:
        with safe_open(str(path), framework="np") as f:
            meta = dict(f.metadata() or {})
            if meta.get("format") != BUNDLE_FORMAT:
                raise BundleError(f"{path} is not an mmfree model bundle (a safetensors file without "
                                  f"format={BUNDLE_FORMAT!r}; a checkpoint directory goes to --model)")
            keys = set(f.keys())
            if keys != {"image", "embeddings"}:
                raise BundleError(f"{path}: bundle tensors {sorted(keys)}, expected ['embeddings', 'image']")
            image = f.get_tensor("image").tobytes()
            emb = f.get_tensor("embeddings")
    except SafetensorError as e:
        raise BundleError(f"{path} is not a readable bundle (safetensors: {e})") from None
    except (ValueError, OSError) as e:
        if isinstance(e, (BundleError, OSError)):
            raise
        raise BundleError(f"{path} is not a readable bundle ({e})") from None
    version = meta.get("bundle_version")
    if version != str(BUNDLE_VERSION):
        raise BundleError(f"{path}: bundle version {version}, this host reads version {BUNDLE_VERSION}: "
                          "recompile it with this host's `mmfree compile`")
    if meta.get("isa_version") != str(isa.ISA_VERSION):
        raise BundleError(f"{path}: the image inside is ISA version {meta.get('isa_version')}, this host speaks "
                          f"ISA {isa.ISA_VERSION}: recompile it with this host's `mmfree compile`")
    if _digest(image, emb, meta) != meta.get("sha256"):
        raise BundleError(f"{path}: checksum mismatch: the file is corrupt or was modified after compiling")
    try:
        config = HGRNBitConfig.from_dict(json.loads(meta["config"]), source=f"{path} (config)")
        options = json.loads(meta.get("compile") or "{}")
    except (KeyError, json.JSONDecodeError) as e:
        raise BundleError(f"{path}: unreadable metadata ({e})") from None
    if emb.dtype != np.int32 or emb.shape != (config.vocab_size, config.hidden_size):
        raise BundleError(f"{path}: embeddings {emb.dtype} {emb.shape}, expected int32 "
                          f"({config.vocab_size}, {config.hidden_size})")
    return Bundle(image=image, embeddings=emb, config=config, tokenizer_json=meta.get("tokenizer") or None,
                  compile_options=options, path=path)
