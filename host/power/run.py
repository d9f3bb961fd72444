"""Generate a fixed number of tokens under a :class:`~host.power.session.PowerSession`.

The loop is :func:`host.generate.generate`'s, with two differences that power accounting needs:
exactly ``tokens`` decode steps are run (EOS does not stop it, and every sampled token is stepped, so
the run holds ``tokens`` device tokens), and each step goes through the session, which stamps it and
lets the governor sleep after it. The idle baseline is recorded after the model is loaded and before
the prompt is prefilled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from host.generate import IncrementalDecoder, encode_prompt
from host.power.accounting import Trace
from host.power.session import PowerSession
from host.sampling import Sampler

__all__ = ["PowerGeneration", "prepare_device", "run_generation"]


@dataclass
class PowerGeneration:
    """What :func:`run_generation` produced."""

    trace: Trace
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""


def prepare_device(device: Any) -> None:
    """Make the golden device count non-zero trits (it counts them only once asked, the first time)."""
    machine = getattr(device, "machine", None)
    count = getattr(machine, "nonzero_trits", None)
    if callable(count):
        count()


def run_generation(device: Any, tokenizer: Any, prompt: str, session: PowerSession, *, tokens: int,
                   temperature: float = 0.8, top_k: int = 50, top_p: float = 0.95, repetition_penalty: float = 1.1,
                   seed: int | None = 0) -> PowerGeneration:
    """Idle baseline, prefill, then ``tokens`` sampled decode steps, all recorded by ``session``.

    Parameters
    ----------
    device : host.devices.Device
        A loaded device.
    tokenizer : tokenizers.Tokenizer
    prompt : str
    session : PowerSession
        Not begun yet (this function calls ``begin`` and ``finish``).
    tokens : int, >= 1
    temperature, top_k, top_p, repetition_penalty, seed
        As :class:`host.sampling.Sampler`.

    Raises
    ------
    ValueError
        On bad sampling arguments or ``tokens < 1``.
    host.power.base.PowerError
        From the session (no idle coverage, a budget below idle with the governor, ...).
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be an integer >= 1, got {tokens!r}")
    config = device.config
    sampler = Sampler(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                      seed=seed)
    prompt_ids = encode_prompt(tokenizer, prompt, config.bos_token_id)
    bad = [t for t in prompt_ids if not 0 <= t < config.vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is out of range for vocabulary size {config.vocab_size}: "
                         "the tokenizer does not match the model")
    prepare_device(device)
    device.reset()
    decoder = IncrementalDecoder(tokenizer, prompt_ids)
    context = list(prompt_ids)
    session.begin()
    logits = session.prefill(device, prompt_ids)
    out: list[int] = []
    for _ in range(tokens):
        token = sampler(logits, context)
        context.append(token)
        out.append(token)
        decoder.push(token)
        logits = session.step(device, token)
    trace = session.finish()
    return PowerGeneration(trace=trace, prompt_ids=prompt_ids, token_ids=out, text=decoder.text)
