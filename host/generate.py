"""Text generation on any :class:`~host.devices.base.Device`: prompt in, streamed text out, with timing.

::

    gen = generate(device, tokenizer, "def main():", max_new_tokens=64, temperature=0.8, seed=0)
    for piece in gen:              # text as it is produced, never a broken UTF-8 character
        print(piece, end="", flush=True)
    result = gen.result            # GenerationResult: ids, text, timing

Streaming text from a byte-level BPE
------------------------------------
A byte-level BPE token can end inside a multi-byte UTF-8 character (``"中"`` is three bytes and may be
split over two tokens), so one token's text is not always printable on its own.
:class:`IncrementalDecoder` decodes the *whole* generated id list after every token (preceded by a few
prompt tokens, so decoders that strip a leading space, such as SentencePiece's, keep the space before
the first generated word), and emits only the new suffix, holding it back while the decoded text ends
with U+FFFD (an incomplete character). At the end, whatever is left is emitted as it is.

Greedy decoding without logits
------------------------------
When the sampler's choice is the argmax of the raw logits (``temperature == 0``, or ``top_k == 1``, with no
repetition penalty), :func:`generate` asks the device for the greedy token alone
(:meth:`~host.devices.base.Device.prefill_argmax`, :meth:`~host.devices.base.Device.step_argmax`): the same
tokens on every device (by default those methods take the argmax of the logits), and on an ECP5 DRAM board a
12-byte summary per token on the link instead of the output packet. ``top_k == 1`` keeps every token tied at the
largest logit and samples among them; the greedy path takes the lowest id of a tie.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from host.devices.base import Device
from host.sampling import Sampler

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "Generation", "GenerationResult", "IncrementalDecoder", "encode_prompt", "encode_text", "generate",
    "generate_text", "is_greedy",
]

#: Prompt tokens decoded ahead of the generated ids (see the module docstring).
PREFIX_TOKENS = 4
#: Tokens per prefill call when :func:`generate` reports prefill progress.
PREFILL_CHUNK = 32
_REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Turns a growing list of token ids into text pieces that never split a UTF-8 character.

    Parameters
    ----------
    tokenizer : tokenizers.Tokenizer
    prefix_ids : sequence of int
        Ids that precede the decoded ones (the end of the prompt); only their last
        :data:`PREFIX_TOKENS` are used, as decoding context. Their text is not emitted.

    Notes
    -----
    Each :meth:`push` costs one decode of the whole id list (O(n) per token): negligible next to a model
    step for the lengths generated here.
    """

    def __init__(self, tokenizer: Tokenizer, prefix_ids: Sequence[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._prefix = [int(t) for t in list(prefix_ids)[-PREFIX_TOKENS:]] if PREFIX_TOKENS else []
        self._prefix_text = self._decode(self._prefix) if self._prefix else ""
        self.ids: list[int] = []
        self._emitted = ""

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def text(self) -> str:
        """Text of every id pushed so far (may end with U+FFFD while a character is incomplete)."""
        if not self._prefix:
            return self._decode(self.ids)
        full = self._decode(self._prefix + self.ids)
        if full.startswith(self._prefix_text):
            return full[len(self._prefix_text):]
        return self._decode(self.ids)  # a decoder that rewrites across the boundary: decode alone

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        self.ids.append(int(token_id))
        text = self.text
        if text.endswith(_REPLACEMENT):
            return ""
        return self._emit(text)

    def flush(self) -> str:
        """Return whatever is held back (an incomplete character decodes as U+FFFD)."""
        return self._emit(self.text)

    def _emit(self, text: str) -> str:
        # Decoding is concatenative for byte-level BPE, so ``text`` extends what was emitted. Should a
        # decoder ever rewrite earlier text, it cannot be taken back: only what lies beyond is emitted
        # (GenerationResult.text is always the full decode).
        new = text[len(self._emitted):]
        self._emitted = text
        return new


@dataclass
class GenerationResult:
    """What one :func:`generate` call produced.

    Attributes
    ----------
    prompt : str
    prompt_ids : list of int
        Ids fed to the device, BOS first when one was used.
    token_ids : list of int
        Generated ids, in order (an EOS that stopped generation is not included).
    text : str
        Decoded generated text (without the prompt).
    stop_reason : str
        ``"eos"`` (the model produced EOS), ``"length"`` (``max_new_tokens`` reached) or ``"unfinished"``
        (the stream was not consumed to its end).
    device : str
        :attr:`Device.name`.
    prefill_seconds : float
        Wall time of ``device.prefill(prompt_ids)`` (greedy: ``device.prefill_argmax``), in seconds.
    decode_seconds : float
        Wall time of the ``device.step`` calls, in seconds (device time, without sampling).
    decode_steps : int
        Number of ``device.step`` (or, greedy, ``device.step_argmax``) calls (generated tokens minus one: the
        last token is not run).
    total_seconds : float
        Wall time spent inside the generator (prefill, steps, sampling, detokenization), in seconds;
        time the consumer spends between pieces is not counted.
    counters : dict of str to int
        Change of :meth:`Device.counters` over the generation.
    """

    prompt: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = "unfinished"
    device: str = ""
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    total_seconds: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.token_ids)

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens per second of the prefill (NaN when it took no measurable time)."""
        return len(self.prompt_ids) / self.prefill_seconds if self.prefill_seconds > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """Device decode rate, ``decode_steps / decode_seconds`` in tokens/s (NaN without steps)."""
        return self.decode_steps / self.decode_seconds if self.decode_steps and self.decode_seconds > 0 \
            else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (rates included)."""
        return {
            "prompt": self.prompt, "prompt_ids": self.prompt_ids, "token_ids": self.token_ids,
            "text": self.text, "stop_reason": self.stop_reason, "device": self.device,
            "prefill_seconds": self.prefill_seconds, "decode_seconds": self.decode_seconds,
            "decode_steps": self.decode_steps, "total_seconds": self.total_seconds,
            "decode_tokens_per_s": self.decode_tokens_per_s, "counters": self.counters,
        }


class Generation(Iterator[str]):
    """The stream returned by :func:`generate`: iterate for text pieces, then read :attr:`result`.

    Attributes
    ----------
    result : GenerationResult
        Filled in as generation goes; complete (``stop_reason`` set) once the iterator is exhausted.
    """

    def __init__(self, steps: Generator[str, None, None], result: GenerationResult) -> None:
        self._steps = steps
        self.result = result

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> str:
        return next(self._steps)

    def run(self) -> GenerationResult:
        """Consume the rest of the stream; return the result."""
        for _ in self:
            pass
        return self.result

    def close(self) -> None:
        """Stop early (the result keeps what was generated, with ``stop_reason`` "unfinished")."""
        self._steps.close()


def check_utf8(text: str, what: str = "prompt") -> None:
    """Refuse a str that cannot be encoded as UTF-8: the lone surrogates Python makes of a command-line
    argument or file name whose bytes are not valid UTF-8 (``surrogateescape``).

    Raises
    ------
    ValueError
        Naming the bytes and their character offset.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start:exc.end]
        raw = bad.encode("utf-8", "surrogateescape") if all(0xDC80 <= ord(c) <= 0xDCFF for c in bad) else b""
        what_bytes = " ".join(f"0x{b:02x}" for b in raw) or repr(bad)
        raise ValueError(f"the {what} is not valid UTF-8: {what_bytes} at character {exc.start} "
                         f"(check the terminal's encoding, or pass the text in a UTF-8 file)") from None


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of plain text: control tokens written in the text (a literal ``<s>`` or ``</s>``) are
    encoded as the characters they are, never as the BOS/EOS control tokens.

    Raises
    ------
    TypeError
        If ``text`` is not a str.
    ValueError
        If ``text`` is not valid UTF-8 (:func:`check_utf8`).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text:
        return []
    check_utf8(text, "text")
    saved = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True   # special tokens in the input are split like any other text
    try:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)
    finally:
        tokenizer.encode_special_tokens = saved


def encode_prompt(tokenizer: Tokenizer, prompt: str, bos_token_id: int | None) -> list[int]:
    """Prompt ids as the model sees them: ``[bos] + encode_text(prompt)`` (no BOS when it is None).

    Raises
    ------
    ValueError
        If the prompt is not valid UTF-8, or the result is empty (an empty prompt and no BOS token): the
        model needs one token to start.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    if prompt:
        check_utf8(prompt)
    ids = encode_text(tokenizer, prompt)
    if bos_token_id is not None:
        ids = [int(bos_token_id), *ids]
    if not ids:
        raise ValueError("empty prompt and the model has no BOS token: give a non-empty prompt")
    return [int(t) for t in ids]


def generate(device: Device, tokenizer: Tokenizer, prompt: str, *, max_new_tokens: int = 64,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
             seed: int | None = None, stop_at_eos: bool = True,
             bos_token_id: int | None | EllipsisType = ...,
             eos_token_id: int | None | EllipsisType = ...,
             prefill_progress: Callable[[int, int], None] | None = None) -> Generation:
    """Generate text after ``prompt`` on a loaded device, streaming it as it is produced.

    The device is :meth:`~Device.reset` (a new sequence), the prompt is prefilled, then tokens are
    sampled (:class:`host.sampling.Sampler`; the repetition penalty sees the prompt and the generated
    ids) and stepped one at a time; greedy decoding asks the device for the argmax alone (module docstring).
    Arguments are validated here, eagerly; the device runs as the returned stream is consumed.

    Parameters
    ----------
    device : Device
        A loaded device.
    tokenizer : tokenizers.Tokenizer
    prompt : str
        May be empty when there is a BOS token (unconditional generation).
    max_new_tokens : int, >= 0
    temperature, top_k, top_p, repetition_penalty, seed
        See :class:`host.sampling.Sampler`. A seed gives the same tokens on every run.
    stop_at_eos : bool, default True
        Stop when the model samples the EOS token (which is then not part of the output).
    bos_token_id : int or None, default: ``device.config.bos_token_id``
        Prepended to the prompt ids when not None.
    eos_token_id : int or None, default: ``device.config.eos_token_id``
    prefill_progress : callable ``(done, total)``, optional
        Called as the prompt is prefilled, in chunks of :data:`PREFILL_CHUNK` tokens (same results as one
        call: prefill runs token by token from the current state), so a long prompt can show progress.

    Returns
    -------
    Generation
        An iterator of text pieces (str); its ``result`` (:class:`GenerationResult`) holds the ids,
        text and timing. After a ``"length"`` stop the device state covers the prompt and every
        generated token but the last (which was never run).

    Raises
    ------
    ValueError
        On invalid sampling arguments, a negative ``max_new_tokens``, an empty prompt without BOS, or a
        prompt id outside the model's vocabulary (a tokenizer that does not match the model).
    DeviceError
        If the device is not loaded.
    """
    config = device.config  # DeviceError when not loaded
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    sampler = Sampler(temperature=temperature, top_k=top_k, top_p=top_p,
                      repetition_penalty=repetition_penalty, seed=seed)
    bos = config.bos_token_id if bos_token_id is ... else bos_token_id
    eos = config.eos_token_id if eos_token_id is ... else eos_token_id
    prompt_ids = encode_prompt(tokenizer, prompt, bos)
    bad = [t for t in prompt_ids if not 0 <= t < config.vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is out of range for vocabulary size {config.vocab_size}: "
                         "the tokenizer does not match the model")
    result = GenerationResult(prompt=prompt, prompt_ids=prompt_ids, device=device.name)
    steps = _run(device, tokenizer, sampler, result, max_new_tokens=max_new_tokens,
                 eos=eos if stop_at_eos else None, prefill_progress=prefill_progress,
                 greedy=is_greedy(temperature=temperature, top_k=top_k, repetition_penalty=repetition_penalty))
    return Generation(steps, result)


def is_greedy(*, temperature: float, top_k: int, repetition_penalty: float) -> bool:
    """Whether these sampling arguments pick the argmax of the raw logits (see the module docstring)."""
    return repetition_penalty == 1 and (temperature == 0 or top_k == 1)


def _prefill(device: Device, ids: list[int], progress: Callable[[int, int], None] | None, greedy: bool = False):
    """The logits after the prompt (greedy: the argmax token), in chunks when progress is reported."""
    run = device.prefill_argmax if greedy else device.prefill
    if progress is None or len(ids) <= PREFILL_CHUNK:
        out = run(ids)
        if progress is not None:
            progress(len(ids), len(ids))
        return out
    for start in range(0, len(ids), PREFILL_CHUNK):
        out = run(ids[start:start + PREFILL_CHUNK])
        progress(min(start + PREFILL_CHUNK, len(ids)), len(ids))
    return out


def _run(device: Device, tokenizer: Tokenizer, sampler: Sampler, result: GenerationResult, *,
         max_new_tokens: int, eos: int | None,
         prefill_progress: Callable[[int, int], None] | None = None,
         greedy: bool = False) -> Generator[str, None, None]:
    clock = time.perf_counter
    before = device.counters()
    decoder = IncrementalDecoder(tokenizer, result.prompt_ids)
    context = list(result.prompt_ids)
    try:
        t_start = clock()
        device.reset()
        t0 = clock()
        nxt = _prefill(device, result.prompt_ids, prefill_progress, greedy)   # logits, or greedy the token
        result.prefill_seconds = clock() - t0
        result.total_seconds += clock() - t_start
        reason = "length"
        for i in range(max_new_tokens):
            t_start = clock()
            token = int(nxt) if greedy else sampler(nxt, context)
            if eos is not None and token == eos:
                reason = "eos"
                result.total_seconds += clock() - t_start
                break
            result.token_ids.append(token)
            context.append(token)
            piece = decoder.push(token)
            if i + 1 < max_new_tokens:
                t0 = clock()
                nxt = device.step_argmax(token) if greedy else device.step(token)
                result.decode_seconds += clock() - t0
                result.decode_steps += 1
            result.total_seconds += clock() - t_start
            if piece:
                yield piece
        tail = decoder.flush()
        result.stop_reason = reason
        if tail:
            yield tail
    finally:
        result.text = decoder.text
        after = device.counters() if not device.closed else before
        result.counters = _diff(before, after)


def _diff(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items()}


def generate_text(device: Device, tokenizer: Tokenizer, prompt: str, **kwargs: Any) -> GenerationResult:
    """:func:`generate` without streaming: run to the end and return the :class:`GenerationResult`."""
    return generate(device, tokenizer, prompt, **kwargs).run()
