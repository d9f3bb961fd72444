"""Tiny models, a tiny tokenizer and fake devices for the host runtime tests (no checkpoint on disk).

* :func:`tiny_tokenizer`: a byte-level BPE (ByteLevel pre-tokenizer and decoder) trained in a few
  milliseconds; ``<unk>``, ``<s>``, ``</s>`` are ids 0, 1, 2 (the config's default BOS 1 / EOS 2).
* :func:`tiny_weights`: a random :class:`~host.model.ModelWeights` (random trits and gammas).
* :class:`ToyDevice`: a small recurrent numpy model over those weights, a stand-in for real devices
  while testing the :class:`~host.devices.base.Device` contract, generation and the CLI.
* :class:`ScriptedDevice`, :class:`UniformDevice`, :class:`FixedDistDevice`: devices with known outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from host.devices.base import Device
from host.model import HGRNBitConfig, ModelWeights, random_weights

BOS, EOS = 1, 2

CORPUS = [
    "def parse(text):\n    return text.split()\n",
    "class Foo:\n    \"\"\"A naïve café résumé.\"\"\"\n",
    "héllo wörld, grüße aus Köln",
    "中文字符 和 日本語のテキスト",
    "emoji 🙂 and 🚀 and ✓",
    "import numpy as np\nx = np.zeros(3)\n",
]


@lru_cache(maxsize=1)
def tiny_tokenizer() -> Tokenizer:
    """A byte-level BPE of about 320 tokens (every byte is a token, so any text encodes)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def tiny_weights(vocab_size: int | None = None, *, hidden: int = 16, layers: int = 2, intermediate: int = 32,
                 seed: int = 0) -> ModelWeights:
    """Random HGRN-Bit weights (:func:`host.model.random_weights`); ``vocab_size`` defaults to the tiny
    tokenizer's."""
    v = tiny_tokenizer().get_vocab_size() if vocab_size is None else vocab_size
    config = HGRNBitConfig(vocab_size=v, hidden_size=hidden, num_hidden_layers=layers,
                           intermediate_size=intermediate)
    return random_weights(config, seed=seed, gamma_spread=0.1)


@dataclass
class FakeCheckpoint:
    """Stand-in for ``host.checkpoint.Checkpoint`` (same attributes)."""

    path: Path
    config: HGRNBitConfig
    weights: ModelWeights
    tokenizer: Tokenizer | None
    dtype: str = "float32"


def tiny_checkpoint(seed: int = 0, *, tokenizer: bool = True) -> FakeCheckpoint:
    weights = tiny_weights(seed=seed)
    return FakeCheckpoint(path=Path("tiny"), config=weights.config, weights=weights,
                          tokenizer=tiny_tokenizer() if tokenizer else None)


class ToyDevice(Device):
    """``h = 0.6 h + 0.4 E[token]``, ``logits = 2 * (W_head @ tanh(h))``: history-dependent logits."""

    name = "toy"

    def __init__(self, *, gain: float = 2.0) -> None:
        super().__init__()
        self.gain = gain
        self._w: ModelWeights | None = None
        self._h: np.ndarray | None = None

    def _load(self, weights: ModelWeights) -> None:
        self._w = weights
        self._h = np.zeros(weights.config.hidden_size, dtype=np.float32)

    def _reset(self) -> None:
        assert self._h is not None
        self._h = np.zeros_like(self._h)

    def _step(self, token_id: int) -> np.ndarray:
        assert self._w is not None and self._h is not None
        self._h = (0.6 * self._h + 0.4 * self._w.embeddings[token_id]).astype(np.float32)
        return (self.gain * (self._w.lm_head.trits @ np.tanh(self._h))).astype(np.float32)

    def _save_state(self) -> Any:
        return self._h.copy()

    def _restore_state(self, payload: Any) -> None:
        self._h = np.array(payload, dtype=np.float32, copy=True)


class ScriptedDevice(Device):
    """Logits that make greedy decoding emit ``script`` in order (then EOS): prefill gives ``script[0]``.

    The state is the number of :meth:`step` calls since reset.
    """

    name = "scripted"

    def __init__(self, *, script: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.script = list(script)
        self._i = 0
        self.v = 0

    def _load(self, weights: ModelWeights) -> None:
        self.v = weights.config.vocab_size
        self._i = 0

    def _reset(self) -> None:
        self._i = 0

    def _logits(self) -> np.ndarray:
        out = np.zeros(self.v, dtype=np.float32)
        out[self.script[self._i] if self._i < len(self.script) else EOS] = 50.0
        return out

    def _prefill(self, token_ids: np.ndarray) -> np.ndarray:
        return self._logits()

    def _step(self, token_id: int) -> np.ndarray:
        self._i += 1
        return self._logits()

    def _save_state(self) -> Any:
        return self._i

    def _restore_state(self, payload: Any) -> None:
        self._i = int(payload)


class UniformDevice(Device):
    """All-zero logits: every token has probability 1/V. Records the inputs of every forward call."""

    name = "uniform"

    def __init__(self) -> None:
        super().__init__()
        self.v = 0
        self.calls: list[list[int]] = []

    def _load(self, weights: ModelWeights) -> None:
        self.v = weights.config.vocab_size

    def _reset(self) -> None:
        pass

    def _step(self, token_id: int) -> np.ndarray:
        return np.zeros(self.v, dtype=np.float32)

    def _forward(self, token_ids: np.ndarray) -> np.ndarray:
        self.calls.append([int(t) for t in token_ids])
        return np.zeros((len(token_ids), self.v), dtype=np.float32)

    def _save_state(self) -> Any:
        return None

    def _restore_state(self, payload: Any) -> None:
        pass


class FixedDistDevice(UniformDevice):
    """Logits ``log p`` for one fixed distribution ``p`` at every position."""

    name = "fixed"

    def __init__(self, *, probs: tuple[float, ...] = ()) -> None:
        super().__init__()
        self.log_p = np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)

    def _load(self, weights: ModelWeights) -> None:
        super()._load(weights)
        assert self.log_p.size == self.v

    def _step(self, token_id: int) -> np.ndarray:
        return self.log_p.copy()

    def _forward(self, token_ids: np.ndarray) -> np.ndarray:
        self.calls.append([int(t) for t in token_ids])
        return np.tile(self.log_p, (len(token_ids), 1))
