"""Perplexity and bits per byte of a text on any :class:`~host.devices.base.Device`.

Protocol
--------
The whole text is tokenized once (no special tokens), optionally cut to its first ``max_tokens`` tokens,
and split into consecutive windows of ``context`` tokens (the last one may be shorter). Each window
starts from a zero recurrent state (``device.reset()``) with BOS prepended, so every token of the window
is predicted from its predecessors, the first one from BOS alone: the device runs
``[BOS] + window[:-1]`` and token ``window[t]`` is scored with the logits of position ``t``. Windows
therefore do not overlap and every token is scored exactly once. Without a BOS token (config
``bos_token_id`` None) the first token of each window has nothing to be predicted from and is not scored.

Cross-entropy is computed in float64 from the device's float32 logits (log-softmax: ``logsumexp(z) -
z[target]``, in nats). ``perplexity = exp(nll / tokens)``; ``bits_per_byte = nll / ln 2 / bytes``.

Counting bytes
--------------
Bits per byte divides by the number of UTF-8 bytes of the text that was scored. We count them per
token, from the tokenizer's vocabulary (:func:`token_byte_lengths`): for a byte-level BPE (GPT-2
``ByteLevel``, the shipped model's tokenizer) every vocabulary character stands for exactly one byte and
every byte of the text belongs to exactly one token, so the byte lengths of the scored tokens add up to
exactly the bytes they cover, even when a multi-byte character is split across tokens (decoding token
by token would count a U+FFFD per fragment instead). When every token of the text is scored the count is
``len(text.encode("utf-8"))`` by definition (for a byte-level BPE the two agree; for other tokenizers,
for example SentencePiece's added leading space, the file's byte count is the one used).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from types import EllipsisType
from typing import TYPE_CHECKING, Any

import numpy as np

from host.devices.base import Device
from host.generate import encode_text

if TYPE_CHECKING:
    from rich.console import Console
    from tokenizers import Tokenizer

__all__ = [
    "DEFAULT_CONTEXT", "EvalResult", "cross_entropy", "evaluate", "evaluate_file", "read_text_file",
    "token_byte_lengths",
]

#: Tokens scored per window (each window starts from a zero state).
DEFAULT_CONTEXT = 512
_ROWS_PER_CHUNK = 64  # log-softmax rows at a time: bounds float64 temporaries to 64 x V


@dataclass(frozen=True)
class EvalResult:
    """Scores of one :func:`evaluate` run.

    Attributes
    ----------
    nll : float
        Total negative log-likelihood of the scored tokens, in nats.
    tokens : int
        Tokens scored.
    bytes : int
        UTF-8 bytes of the text those tokens cover (module docstring).
    seconds : float
        Wall time of the scoring (device work and cross-entropy; tokenization excluded), in seconds.
    windows : int
        Windows run (each from a zero state).
    context : int
        Window length in tokens.
    """

    nll: float
    tokens: int
    bytes: int
    seconds: float
    windows: int
    context: int

    @property
    def mean_nll(self) -> float:
        """Mean NLL per token, in nats."""
        return self.nll / self.tokens if self.tokens else float("nan")

    @property
    def perplexity(self) -> float:
        """``exp(nll / tokens)`` (inf on overflow)."""
        try:
            return math.exp(self.mean_nll)
        except OverflowError:
            return float("inf")

    @property
    def bits_per_byte(self) -> float:
        """Total NLL in bits over the scored UTF-8 bytes."""
        return self.nll / math.log(2) / self.bytes if self.bytes else float("nan")

    @property
    def tokens_per_s(self) -> float:
        """Tokens scored per second."""
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary: the fields and the derived scores."""
        d = asdict(self)
        d.update(mean_nll=self.mean_nll, perplexity=self.perplexity, bits_per_byte=self.bits_per_byte,
                 tokens_per_s=self.tokens_per_s)
        return d


def cross_entropy(logits: np.ndarray, targets: Sequence[int] | np.ndarray) -> np.ndarray:
    """Per-position cross-entropy ``logsumexp(logits[t]) - logits[t, targets[t]]``, in float64.

    Parameters
    ----------
    logits : ndarray, shape [T, V], float32
    targets : sequence of int, length T, each in [0, V)

    Returns
    -------
    ndarray, shape [T], float64
        NLL of each target, in nats.

    Raises
    ------
    ValueError
        On mismatched shapes or out-of-range targets.
    """
    z = np.asarray(logits)
    tgt = np.asarray(targets, dtype=np.int64)
    if z.ndim != 2 or tgt.shape != (z.shape[0],):
        raise ValueError(f"logits [T, V] and targets [T] expected, got shapes {z.shape} and {tgt.shape}")
    if tgt.size and (tgt.min() < 0 or tgt.max() >= z.shape[1]):
        raise ValueError(f"targets must be in [0, {z.shape[1]})")
    out = np.empty(z.shape[0], dtype=np.float64)
    for a in range(0, z.shape[0], _ROWS_PER_CHUNK):
        x = z[a:a + _ROWS_PER_CHUNK].astype(np.float64)
        m = x.max(axis=1)
        lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
        out[a:a + _ROWS_PER_CHUNK] = lse - x[np.arange(x.shape[0]), tgt[a:a + _ROWS_PER_CHUNK]]
    return out


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: each byte-level vocabulary character -> its byte."""
    bs = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]  # printable bytes map to themselves
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _has_component(node: Any, kind: str) -> bool:
    if isinstance(node, dict):
        return node.get("type") == kind or any(_has_component(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_has_component(v, kind) for v in node)
    return False


def _is_byte_level(tokenizer: Tokenizer) -> bool:
    spec = json.loads(tokenizer.to_str())
    return any(_has_component(spec.get(part), "ByteLevel") for part in ("decoder", "pre_tokenizer"))


def token_byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """UTF-8 bytes of text each token id stands for.

    Byte-level BPE: one byte per vocabulary character (GPT-2 byte alphabet). Otherwise (SentencePiece
    style): ``<0xNN>`` byte-fallback tokens count 1, other pieces the UTF-8 length of the piece with
    ``▁`` read as a space. Special tokens count 0; other added tokens their UTF-8 length.

    Parameters
    ----------
    tokenizer : tokenizers.Tokenizer

    Returns
    -------
    ndarray, shape [tokenizer vocab size, added tokens included], int64
    """
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    added = tokenizer.get_added_tokens_decoder()
    size = max([size, *(i + 1 for i in added)])
    out = np.zeros(size, dtype=np.int64)
    alphabet = _byte_level_alphabet() if _is_byte_level(tokenizer) else None
    for i in range(size):
        if i in added:
            tok = added[i]
            out[i] = 0 if tok.special else len(tok.content.encode("utf-8"))
            continue
        piece = tokenizer.id_to_token(i)
        if piece is None:
            continue
        if alphabet is not None and all(ch in alphabet for ch in piece):
            out[i] = len(piece)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out[i] = 1
        else:
            out[i] = len(piece.replace("\u2581", " ").encode("utf-8"))
    return out


def _positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def evaluate(device: Device, tokenizer: Tokenizer, text: str, *, context: int = DEFAULT_CONTEXT,
             max_tokens: int | None = None, bos_token_id: int | None | EllipsisType = ...,
             progress: bool = False, console: Console | None = None) -> EvalResult:
    """Perplexity and bits per byte of ``text`` on a loaded device (protocol in the module docstring).

    Parameters
    ----------
    device : Device
        A loaded device; it is reset before every window.
    tokenizer : tokenizers.Tokenizer
    text : str
    context : int, default 512
        Tokens per window (>= 2 without a BOS token).
    max_tokens : int or None
        Score only the first ``max_tokens`` tokens of the text.
    bos_token_id : int or None, default: ``device.config.bos_token_id``
    progress : bool, default False
        Show a rich progress bar over windows (on ``console``, default stderr).
    console : rich.console.Console, optional

    Returns
    -------
    EvalResult

    Raises
    ------
    ValueError
        On invalid ``context`` / ``max_tokens``, a text with nothing to score, or token ids out of the
        model's vocabulary.
    DeviceError
        If the device is not loaded.
    """
    config = device.config
    bos = config.bos_token_id if bos_token_id is ... else bos_token_id
    context = _positive_int("context", context, 1 if bos is not None else 2)
    if max_tokens is not None:
        max_tokens = _positive_int("max_tokens", max_tokens)
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    all_ids = encode_text(tokenizer, text)
    ids = np.asarray(all_ids[:max_tokens] if max_tokens is not None else all_ids, dtype=np.int64)
    if ids.size == 0 or (bos is None and ids.size < 2):
        raise ValueError("the text has nothing to score (fewer tokens than one prediction needs)")
    lengths = token_byte_lengths(tokenizer)
    if ids.max() >= lengths.size:
        lengths = np.pad(lengths, (0, int(ids.max()) + 1 - lengths.size))
    starts = range(0, ids.size, context)
    if bos is None:  # a 1-token last window has nothing to score
        starts = [s for s in starts if ids.size - s >= 2]

    nll = 0.0
    tokens = 0
    n_bytes = 0
    windows = 0
    t0 = time.perf_counter()
    with _progress(progress, console, len(starts)) as advance:
        for s in starts:
            chunk = ids[s:s + context]
            if bos is not None:
                inputs, targets = np.concatenate([[bos], chunk[:-1]]).astype(np.int64), chunk
            else:
                inputs, targets = chunk[:-1], chunk[1:]
            device.reset()
            logits = device.forward(inputs)
            nll += float(cross_entropy(logits, targets).sum())
            tokens += int(targets.size)
            n_bytes += int(lengths[targets].sum())
            windows += 1
            advance(math.exp(min(nll / tokens, 700.0)))
    seconds = time.perf_counter() - t0
    if bos is not None and ids.size == len(all_ids):
        n_bytes = len(text.encode("utf-8"))  # every token scored: the text's own byte count
    return EvalResult(nll=nll, tokens=tokens, bytes=n_bytes, seconds=seconds, windows=windows,
                      context=context)


def read_text_file(path: str | Path) -> str:
    """The text of a UTF-8 file, newlines read as by ``open(path, encoding="utf-8")`` (``\\r\\n`` and
    ``\\r`` become ``\\n``).

    Raises
    ------
    FileNotFoundError, IsADirectoryError, PermissionError (OSErrors)
        If the file cannot be read.
    ValueError
        If the file is not valid UTF-8; the message names the file and the offending bytes, their byte
        offset in the file and their line.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start:max(exc.end, exc.start + 1)]
        what = ("byte " if len(bad) == 1 else "bytes ") + " ".join(f"0x{b:02x}" for b in bad)
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path} is not valid UTF-8: {what} at byte offset {exc.start} (line {line}): "
                         f"{exc.reason}") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def evaluate_file(device: Device, tokenizer: Tokenizer, path: str | Path, **options: Any) -> EvalResult:
    """:func:`evaluate` on a UTF-8 text file (read by :func:`read_text_file`).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the file is not valid UTF-8 (the message names the file and the byte offset).
    """
    return evaluate(device, tokenizer, read_text_file(path), **options)


class _progress:
    """Context manager giving ``advance(perplexity)``; a rich progress bar when enabled."""

    def __init__(self, enabled: bool, console: Console | None, total: int) -> None:
        self._enabled = enabled
        self._console = console
        self._total = total
        self._bar: Any = None

    def __enter__(self) -> Callable[[float], None]:
        if not self._enabled:
            return lambda ppl: None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(TextColumn("[bold]scoring"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("windows  ppl {task.fields[ppl]}"), TimeElapsedColumn(),
                             TimeRemainingColumn(), console=self._console or Console(stderr=True))
        self._bar.start()
        task = self._bar.add_task("scoring", total=self._total, ppl="-")

        def advance(ppl: float) -> None:
            self._bar.update(task, advance=1, ppl=f"{ppl:.3f}")

        return advance

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
