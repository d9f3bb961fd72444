"""The one interface every device implements: load a model, run tokens, read logits and counters.

docs/ARCHITECTURE.md section 1: the float reference, the golden ISS (the bit-exact oracle), the Verilated RTL and
the boards (PYNQ, XRT) all sit behind :class:`Device`, so :mod:`host.generate`, :mod:`host.evaluate`
and the CLI run unchanged on any of them (the pattern of Glasgow's ``abstract.py`` and corundum's
driver model).

Writing a device
----------------
Subclass :class:`Device`, set the class attribute :attr:`Device.name`, and implement the protected
hooks ``_load``, ``_reset``, ``_step``, ``_save_state`` and ``_restore_state`` (optionally ``_prefill``,
``_forward`` and ``_close`` where the device has something faster or something to release). The public
methods (:meth:`Device.step`, :meth:`Device.prefill`, ...) live here and do everything that must be the
same on every device: the loaded / closed checks, token-id validation, logits shape checks, the
position and the counters. Hooks therefore receive only validated input:

* ``_load(weights)`` gets a :class:`~host.model.ModelWeights`; after it returns the recurrent state must
  be zero (``load`` implies ``reset``).
* ``_step(token_id)`` gets an ``int`` in ``[0, vocab_size)`` and returns logits of shape [V] (float32).
* ``_prefill(ids)`` / ``_forward(ids)`` get a non-empty 1-D int64 array of valid ids.
* ``_save_state()`` returns an *independent* copy of the recurrent state (any picklable object);
  ``_restore_state(payload)`` must not keep a reference to ``payload`` that later steps would mutate.
* ``_step_argmax(token_id)`` / ``_prefill_argmax(ids)`` (optional) return the greedy next token alone, for a
  device that can deliver it without the logits (an ECP5 DRAM board: 12 bytes on its link instead of the
  output packet); the defaults take the argmax of ``_step`` / ``_prefill``.

Device modules that need board libraries (``pynq``, ``pyxrt``) import them inside the module that
defines the device, never at package import: :mod:`host.devices` imports device modules lazily.
"""

from __future__ import annotations

import abc
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from host.model import HGRNBitConfig, ModelWeights
from host.sampling import greedy

if TYPE_CHECKING:
    from host.bundle import Bundle

__all__ = ["CheckpointLike", "Device", "DeviceError", "DeviceState", "ReplayLogDevice", "weights_of"]


class DeviceError(RuntimeError):
    """A device used out of order (not loaded, closed), a device that failed, or a foreign state.

    Bad *arguments* (an out-of-range token id, an empty prompt) raise :class:`ValueError` instead.
    """


@runtime_checkable
class CheckpointLike(Protocol):
    """What :meth:`Device.load` needs from a loaded checkpoint (``host.checkpoint.Checkpoint``)."""

    config: HGRNBitConfig
    weights: ModelWeights


def weights_of(checkpoint: CheckpointLike | ModelWeights) -> ModelWeights:
    """The :class:`~host.model.ModelWeights` of a checkpoint, or the weights themselves.

    Raises
    ------
    TypeError
        If ``checkpoint`` is neither a ``ModelWeights`` nor an object with a ``weights`` attribute that
        is one.
    """
    if isinstance(checkpoint, ModelWeights):
        return checkpoint
    weights = getattr(checkpoint, "weights", None)
    if isinstance(weights, ModelWeights):
        return weights
    raise TypeError(
        f"expected a host.checkpoint.Checkpoint or host.model.ModelWeights, got {type(checkpoint).__name__}")


def _model_key(config: HGRNBitConfig) -> tuple[int, int, int, int]:
    return (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.intermediate_size)


@dataclass(frozen=True)
class DeviceState:
    """An opaque snapshot of a device's recurrent state, from :meth:`Device.save_state`.

    Restoring it (:meth:`Device.restore_state`) and stepping gives the same logits as stepping right
    after it was saved. It can be restored any number of times, only on a device of the same kind
    (:attr:`device`) loaded with a model of the same shape.

    Attributes
    ----------
    device : str
        :attr:`Device.name` of the device that saved it.
    model : tuple of int
        ``(vocab_size, hidden_size, num_hidden_layers, intermediate_size)`` of the loaded model.
    position : int
        Tokens run since the last :meth:`Device.reset` when it was saved.
    payload : object
        Device-specific contents (for the reference: the [L, H] float32 state array). Treat as read-only.
    """

    device: str
    model: tuple[int, int, int, int]
    position: int
    payload: Any


class Device(abc.ABC):
    """A device that runs an HGRN-Bit model one token at a time (batch 1), keeping the recurrent state.

    Life cycle: construct (through :func:`host.devices.open_device`), :meth:`load` a checkpoint, then any
    number of sequences, each started by :meth:`reset` (a fresh :meth:`load` starts one too) and fed with
    :meth:`prefill` / :meth:`step`; finally :meth:`close` (or use the device as a context manager).

    Attributes
    ----------
    name : str
        Registry name of the device kind (``"reference"``, ``"golden"``, ``"rtl"``, ``"pynq"``, ``"xrt"``).

    Notes
    -----
    Counters (:meth:`counters`) every device keeps: ``tokens`` (tokens run, prompt tokens included),
    ``step_calls``, ``prefill_calls`` (calls of :meth:`prefill` and :meth:`forward`), ``prefill_tokens``,
    ``resets`` and ``loads``. Hardware devices add their own (``cycles``, ``stall_cycles``, ...) by
    adding keys to ``self._counters``. Counters are cumulative since construction: they survive
    :meth:`reset` and :meth:`restore_state`.
    """

    name: ClassVar[str] = "abstract"

    def __init__(self) -> None:
        self._config: HGRNBitConfig | None = None
        self._closed = False
        self._position = 0
        self._counters: dict[str, int] = {
            "tokens": 0, "step_calls": 0, "prefill_calls": 0, "prefill_tokens": 0, "resets": 0, "loads": 0,
        }

    # ------------------------------------------------------------------ hooks for subclasses

    @abc.abstractmethod
    def _load(self, weights: ModelWeights) -> None:
        """Take the model; leave the recurrent state at zero."""

    @abc.abstractmethod
    def _reset(self) -> None:
        """Zero the recurrent state."""

    @abc.abstractmethod
    def _step(self, token_id: int) -> np.ndarray:
        """Run one valid token, advance the state, return logits [V]."""

    @abc.abstractmethod
    def _save_state(self) -> Any:
        """Return an independent copy of the recurrent state."""

    @abc.abstractmethod
    def _restore_state(self, payload: Any) -> None:
        """Set the recurrent state from a payload of :meth:`_save_state` (without aliasing it)."""

    def _prefill(self, token_ids: np.ndarray) -> np.ndarray:
        """Run a prompt, return the logits of its last token. Default: a loop of :meth:`_step`."""
        logits = None
        for t in token_ids:
            logits = self._step(int(t))
        return logits

    def _forward(self, token_ids: np.ndarray) -> np.ndarray:
        """Run tokens, return the logits of every position [T, V]. Default: a loop of :meth:`_step`."""
        return np.stack([np.asarray(self._step(int(t)), dtype=np.float32) for t in token_ids])

    def _step_argmax(self, token_id: int) -> int:
        """Run one valid token, advance the state, return the greedy next token. Default: the argmax of
        :meth:`_step`'s logits (:func:`host.sampling.greedy`: the lowest id on ties)."""
        return greedy(self._check_logits(self._step(token_id), (self.vocab_size,)))

    def _prefill_argmax(self, token_ids: np.ndarray) -> int:
        """Run a prompt, return the greedy token after it. Default: the argmax of :meth:`_prefill`'s logits."""
        return greedy(self._check_logits(self._prefill(token_ids), (self.vocab_size,)))

    def _close(self) -> None:  # noqa: B027 - optional hook: most devices have nothing to release
        """Release resources (buffers, board handles). Default: nothing."""

    # ------------------------------------------------------------------ public interface

    @property
    def loaded(self) -> bool:
        """Whether a model is loaded (and the device is not closed)."""
        return self._config is not None and not self._closed

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    @property
    def config(self) -> HGRNBitConfig:
        """Configuration of the loaded model.

        Raises
        ------
        DeviceError
            If no model is loaded or the device is closed.
        """
        self._check_loaded()
        assert self._config is not None
        return self._config

    @property
    def vocab_size(self) -> int:
        """Vocabulary size V of the loaded model (logits have shape [V])."""
        return self.config.vocab_size

    @property
    def position(self) -> int:
        """Tokens run since the last :meth:`reset` (or :meth:`load`), restored by :meth:`restore_state`."""
        return self._position

    def load(self, checkpoint: CheckpointLike | ModelWeights | Bundle) -> None:
        """Load a model and start a new sequence (zero recurrent state).

        Parameters
        ----------
        checkpoint : host.checkpoint.Checkpoint, host.model.ModelWeights or host.bundle.Bundle
            The loaded checkpoint (its ``weights`` are used), the weights themselves, or a compiled bundle
            (:meth:`load_image`).

        Raises
        ------
        DeviceError
            If the device is closed or the device cannot take the model (the device is then left
            without a model).
        TypeError
            If ``checkpoint`` is none of the accepted types.
        """
        from host.bundle import Bundle

        if isinstance(checkpoint, Bundle):
            self.load_image(checkpoint)
            return
        self._check_open()
        weights = weights_of(checkpoint)
        self._take_model(lambda: self._load(weights), weights.config)

    def load_image(self, bundle: Bundle | str | os.PathLike[str]) -> None:
        """Load a compiled model bundle (:mod:`host.bundle`, ``mmfree compile --out model.mmf``) and start a new
        sequence: what runs on a board, with no compiler (no numba, no torch) on the host.

        Parameters
        ----------
        bundle : host.bundle.Bundle or path-like
            A bundle, or the path of one (read and verified with :func:`host.bundle.read_bundle`).

        Raises
        ------
        DeviceError
            If the device is closed, or runs checkpoints only (the float reference has no image), or cannot
            take this image (another packing or channel count than its build).
        host.bundle.BundleError
            If the file is not a usable bundle.
        """
        from host.bundle import Bundle, read_bundle

        self._check_open()
        if not isinstance(bundle, Bundle):
            bundle = read_bundle(bundle)
        self._take_model(lambda: self._load_image(bundle), bundle.config)

    def _take_model(self, load: Callable[[], None], config: HGRNBitConfig) -> None:
        """Run a load hook with no model held (a failed load leaves none), then start a new sequence."""
        self._config = None
        load()
        self._config = config
        self._position = 0
        self._counters["loads"] += 1

    def _load_image(self, bundle: Bundle) -> None:
        """Take a compiled bundle; leave the recurrent state at zero. Devices that run images override it."""
        raise DeviceError(f"device {self.name!r} runs checkpoints, not compiled images: load a checkpoint "
                          "(--model DIR) instead of a bundle")

    def reset(self) -> None:
        """Start a new sequence: zero the recurrent state and the position.

        Raises
        ------
        DeviceError
            If no model is loaded or the device is closed.
        """
        self._check_loaded()
        self._reset()
        self._position = 0
        self._counters["resets"] += 1

    def step(self, token_id: int) -> np.ndarray:
        """Run one token, advance the recurrent state, return the next-token logits.

        Parameters
        ----------
        token_id : int
            Token id in ``[0, vocab_size)``.

        Returns
        -------
        ndarray, shape [V], float32
            Logits of the token following ``token_id``.

        Raises
        ------
        DeviceError
            If no model is loaded, the device is closed, or the device returned malformed logits.
        ValueError
            If ``token_id`` is out of range (the message names the id and the vocabulary size).
        TypeError
            If ``token_id`` is not an integer.
        """
        self._check_loaded()
        tok = self._check_token(token_id)
        logits = self._check_logits(self._step(tok), (self.vocab_size,))
        self._position += 1
        self._counters["tokens"] += 1
        self._counters["step_calls"] += 1
        return logits

    def step_argmax(self, token_id: int) -> int:
        """Run one token like :meth:`step` and return the greedy next token instead of the logits.

        What greedy decoding needs (``temperature == 0`` and no repetition penalty: :func:`host.generate.generate`
        uses it then). By default the argmax of :meth:`step`'s logits (the lowest id on ties, as
        :func:`host.sampling.greedy`); a device that computes it itself returns its own: the accelerator's is the
        first index of the largest logit accumulator, the same token unless two accumulators above 2**24 round to
        one float32 logit. Counted as a step (``tokens``, ``step_calls``).

        Returns
        -------
        int
            Token id in ``[0, vocab_size)``.

        Raises
        ------
        DeviceError, ValueError, TypeError
            As :meth:`step`; DeviceError too for an id outside the vocabulary from the device.
        """
        self._check_loaded()
        tok = self._check_token(token_id)
        nxt = self._check_argmax(self._step_argmax(tok))
        self._position += 1
        self._counters["tokens"] += 1
        self._counters["step_calls"] += 1
        return nxt

    def prefill_argmax(self, token_ids: Sequence[int]) -> int:
        """Run a prompt like :meth:`prefill` and return the greedy token after it instead of the logits (see
        :meth:`step_argmax`). Counted as a prefill.

        Raises
        ------
        DeviceError, ValueError
            As :meth:`prefill`.
        """
        self._check_loaded()
        ids = self._check_tokens(token_ids)
        nxt = self._check_argmax(self._prefill_argmax(ids))
        self._count_prefill(len(ids))
        return nxt

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Run a prompt from the current state, return the logits of its last token.

        Equivalent to calling :meth:`step` on each id in turn (devices may do it faster, e.g. the
        reference's vectorized ``forward``). The ids are all validated before any is run, so a bad id
        leaves the state untouched.

        Parameters
        ----------
        token_ids : sequence of int, length T >= 1
            Prompt token ids, each in ``[0, vocab_size)``.

        Returns
        -------
        ndarray, shape [V], float32
            Logits of the token following the prompt.

        Raises
        ------
        DeviceError
            If no model is loaded or the device is closed.
        ValueError
            If ``token_ids`` is empty or holds an out-of-range id.
        """
        self._check_loaded()
        ids = self._check_tokens(token_ids)
        logits = self._check_logits(self._prefill(ids), (self.vocab_size,))
        self._count_prefill(len(ids))
        return logits

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        """Run tokens from the current state, return the logits of every position (for scoring text).

        Parameters
        ----------
        token_ids : sequence of int, length T >= 1
            Token ids, each in ``[0, vocab_size)``.

        Returns
        -------
        ndarray, shape [T, V], float32
            Row ``t`` holds the logits of the token following ``token_ids[t]``.

        Raises
        ------
        DeviceError, ValueError
            As :meth:`prefill`.
        """
        self._check_loaded()
        ids = self._check_tokens(token_ids)
        logits = self._check_logits(self._forward(ids), (len(ids), self.vocab_size))
        self._count_prefill(len(ids))
        return logits

    def save_state(self) -> DeviceState:
        """An opaque copy of the recurrent state (and position), for :meth:`restore_state`.

        Raises
        ------
        DeviceError
            If no model is loaded or the device is closed.
        """
        self._check_loaded()
        return DeviceState(device=self.name, model=_model_key(self.config), position=self._position,
                           payload=self._save_state())

    def restore_state(self, state: DeviceState) -> None:
        """Continue from a state of :meth:`save_state`; stepping then gives identical logits.

        Raises
        ------
        DeviceError
            If no model is loaded, the device is closed, or ``state`` was saved by another kind of
            device or for a model of another shape.
        TypeError
            If ``state`` is not a :class:`DeviceState`.
        """
        self._check_loaded()
        if not isinstance(state, DeviceState):
            raise TypeError(f"expected a DeviceState from save_state(), got {type(state).__name__}")
        if state.device != self.name:
            raise DeviceError(f"state saved by device {state.device!r} cannot be restored on device "
                              f"{self.name!r}")
        if state.model != _model_key(self.config):
            raise DeviceError(
                f"state saved for a model of shape {state.model} cannot be restored on a model of shape "
                f"{_model_key(self.config)} (vocab, hidden, layers, intermediate)")
        self._restore_state(state.payload)
        self._position = state.position

    def counters(self) -> dict[str, int]:
        """A copy of the device's counters (see the class notes for their names)."""
        return dict(self._counters)

    def close(self) -> None:
        """Release the device; idempotent. Every later call except :meth:`close` raises DeviceError."""
        if self._closed:
            return
        try:
            self._close()
        finally:
            self._closed = True
            self._config = None

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            what = "closed"
        elif self._config is None:
            what = "not loaded"
        else:
            c = self._config
            what = f"V={c.vocab_size} H={c.hidden_size} L={c.num_hidden_layers} position={self._position}"
        return f"<{type(self).__name__} {self.name!r} {what}>"

    # ------------------------------------------------------------------ checks

    def _check_open(self) -> None:
        if self._closed:
            raise DeviceError(f"device {self.name!r} is closed")

    def _check_loaded(self) -> None:
        self._check_open()
        if self._config is None:
            raise DeviceError(f"device {self.name!r} has no model loaded: call load(checkpoint) first")

    def _check_token(self, token_id: int) -> int:
        if isinstance(token_id, (bool, np.bool_)):
            raise TypeError(f"token id must be an integer, got {token_id!r}")
        try:
            tok = operator.index(token_id)
        except TypeError:
            raise TypeError(f"token id must be an integer, got {token_id!r}") from None
        v = self.vocab_size
        if not 0 <= tok < v:
            raise ValueError(f"token id {tok} is out of range for vocabulary size {v} "
                             f"(valid ids: 0..{v - 1})")
        return tok

    def _check_tokens(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1:
            raise ValueError(f"token ids must be a 1-D sequence, got shape {ids.shape}")
        if ids.size == 0:
            raise ValueError("token ids must not be empty")
        if ids.dtype.kind not in "iu":
            raise TypeError(f"token ids must be integers, got dtype {ids.dtype}")
        v = self.vocab_size
        bad = np.flatnonzero((ids < 0) | (ids >= v))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"token id {int(ids[i])} (position {i}) is out of range for vocabulary size {v} "
                             f"(valid ids: 0..{v - 1})")
        return ids.astype(np.int64, copy=False)

    def _check_logits(self, logits: Any, shape: tuple[int, ...]) -> np.ndarray:
        out = np.asarray(logits, dtype=np.float32)
        if out.shape != shape:
            raise DeviceError(f"device {self.name!r} returned logits of shape {out.shape}, expected {shape}")
        return out

    def _check_argmax(self, token: Any) -> int:
        try:
            t = operator.index(token)
        except TypeError:
            raise DeviceError(f"device {self.name!r} returned a greedy token {token!r}, not an integer") from None
        if not 0 <= t < self.vocab_size:
            raise DeviceError(f"device {self.name!r} returned greedy token {t}, outside the vocabulary "
                              f"(0..{self.vocab_size - 1})")
        return t

    def _count_prefill(self, n: int) -> None:
        self._position += n
        self._counters["tokens"] += n
        self._counters["prefill_calls"] += 1
        self._counters["prefill_tokens"] += n


class ReplayLogDevice(Device):
    """A :class:`Device` whose recurrent state the host cannot read (it stays in the core's state memory):
    the saved state is the token ids run since the last reset, and restoring it replays them.

    Subclasses implement ``_run(token_id, position)`` (one token on the core; its result goes through
    :meth:`_logits`), optionally ``_run_argmax(token_id, position)`` (the greedy token alone; default: the
    argmax of ``_run``'s logits), and ``_reset()``, which resets the core and must empty ``self._log`` and clear
    ``self._lost``. ``self._lost`` set by a subclass (say, after a time-out reset the core) makes the next
    step replay the log first. Replayed tokens count in ``counters()["replayed_tokens"]``.
    """

    _log: list[int]
    _lost: bool

    def _run(self, token_id: int, position: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _run(token_id, position)")

    def _logits(self, result: Any) -> np.ndarray:
        """The logits of one :meth:`_run` result (default: the result is the logits)."""
        return result

    def _replay(self, ids: Sequence[int]) -> None:
        """Reset, then run ``ids`` from position 0 (recomputes the state they lead to)."""
        self._reset()
        for t in ids:
            self._run_argmax(int(t), len(self._log))   # the logits of replayed tokens are not read
            self._log.append(int(t))
            self._counters["replayed_tokens"] += 1

    def _run_argmax(self, token_id: int, position: int) -> int:
        """The greedy token after one token on the core (default: the argmax of its logits)."""
        return greedy(self._check_logits(self._logits(self._run(token_id, position)), (self.vocab_size,)))

    def _step(self, token_id: int) -> np.ndarray:
        if self._lost:
            self._replay(list(self._log))
        logits = self._logits(self._run(token_id, len(self._log)))
        self._log.append(int(token_id))
        return logits

    def _step_argmax(self, token_id: int) -> int:
        if self._lost:
            self._replay(list(self._log))
        nxt = self._run_argmax(token_id, len(self._log))
        self._log.append(int(token_id))
        return nxt

    def _prefill_argmax(self, token_ids: np.ndarray) -> int:
        nxt = 0
        for t in token_ids:
            nxt = self._step_argmax(int(t))
        return nxt

    def _save_state(self) -> Any:
        return tuple(self._log)

    def _restore_state(self, payload: Any) -> None:
        ids = [int(t) for t in payload]
        if not self._lost and ids[:len(self._log)] == self._log:
            for t in ids[len(self._log):]:   # the saved sequence extends the current one: run the rest
                self._run_argmax(t, len(self._log))
                self._log.append(t)
                self._counters["replayed_tokens"] += 1
            return
        self._replay(ids)
