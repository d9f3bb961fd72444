"""The reference device: the float numpy model of :mod:`host.reference` behind the Device interface.

It is the accuracy yardstick (docs/ARCHITECTURE.md section 1): float32 arithmetic, no fixed-point formats, no
counters beyond the common ones. Prompts and scored text run through the model's vectorized
``forward`` (all positions of a window at once); decode runs ``step``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host.devices.base import Device, DeviceError
from host.model import ModelWeights
from host.reference import ReferenceModel

__all__ = ["ReferenceDevice"]


class ReferenceDevice(Device):
    """:class:`host.reference.ReferenceModel` as a :class:`~host.devices.base.Device`.

    Parameters
    ----------
    output_gate : str, default "released"
        Output-gate variant passed to ``ReferenceModel``: ``"released"`` (``RMSNorm(g)·γ_g ⊙ SiLU(h)``,
        the released code) or the paper's ``σ(g) ⊙ h`` (see ``host.reference`` for its name). An unknown
        value raises the model's ValueError at :meth:`load`.

    Notes
    -----
    The state is the [L, H] float32 array of ``ReferenceModel.init_state``. ``ReferenceModel.step`` and
    ``forward`` are pure (they return a new state), so saved states are never mutated by later steps;
    they are copied anyway, so a state can be restored any number of times.
    """

    name = "reference"

    def __init__(self, *, output_gate: str = "released") -> None:
        super().__init__()
        if not isinstance(output_gate, str):
            raise TypeError(f"output_gate must be a string, got {type(output_gate).__name__}")
        self.output_gate = output_gate
        self._model: ReferenceModel | None = None
        self._state: np.ndarray | None = None

    def _load(self, weights: ModelWeights) -> None:
        self._model = ReferenceModel(weights, output_gate=self.output_gate)
        self._state = self._model.init_state()

    def _reset(self) -> None:
        assert self._model is not None
        self._state = self._model.init_state()

    def _step(self, token_id: int) -> np.ndarray:
        assert self._model is not None
        logits, self._state = self._model.step(token_id, self._state)
        return logits

    def _forward(self, token_ids: np.ndarray) -> np.ndarray:
        assert self._model is not None
        logits, self._state = self._model.forward([int(t) for t in token_ids], self._state)
        return logits

    def _prefill(self, token_ids: np.ndarray) -> np.ndarray:
        return self._forward(token_ids)[-1]

    def _save_state(self) -> Any:
        assert self._state is not None
        return np.array(self._state, dtype=np.float32, copy=True)

    def _restore_state(self, payload: Any) -> None:
        assert self._model is not None
        state = np.array(payload, dtype=np.float32, copy=True)
        expected = self._model.init_state().shape
        if state.shape != expected:
            raise DeviceError(f"reference state has shape {state.shape}, expected {expected}")
        self._state = state

    def _close(self) -> None:
        self._model = None
        self._state = None
