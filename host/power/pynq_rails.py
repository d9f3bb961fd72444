"""Power rails of a PYNQ board (ZCU104, Ultra96, Kria with PYNQ) through ``pynq.get_rails()``.

``pynq.get_rails()`` (``pynq/pmbus.py``) enumerates the board's libsensors power monitors (PMBus
regulators, INA2xx) into ``Rail`` objects with ``voltage``, ``current`` and ``power`` sensors (each
``None`` when absent) whose ``value`` is read on access, in volts, amperes and watts.
``pynq.DataRecorder(*sensors)`` samples them from a thread: ``record(interval)`` starts it, ``stop()``
ends it, and ``frame`` is a pandas DataFrame indexed by ``time.time()`` timestamps with one column per
sensor (named ``sensor.name``) and a ``Mark`` column.

``pynq`` is imported in :meth:`PynqRailsSource._open` only (it pins numpy<2 and exists on board images).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from host.power.base import PowerSource, Sample, SensorError

__all__ = ["PynqRailsSource"]


class PynqRailsSource(PowerSource):
    """Every power rail that ``pynq.get_rails()`` finds, recorded with ``pynq.DataRecorder``.

    Parameters
    ----------
    config_file : str, optional
        A libsensors configuration file for ``get_rails`` (default: the system's).

    Notes
    -----
    A rail's watts are its power sensor's value, or voltage times current when it has no power sensor;
    rails with neither are left out. ``DataRecorder.frame`` is read while the recorder's thread appends
    to it, so a read that catches a half-written row (pandas raises ``ValueError`` on the length
    mismatch) is simply retried at the next poll.
    """

    name = "pynq"
    default_period_s = 0.05

    def __init__(self, *, config_file: str | None = None) -> None:
        super().__init__()
        self.config_file = config_file
        self._pynq: Any = None
        self._channels: dict[str, tuple[Any, ...]] = {}
        self._recorder: Any = None
        self._seen = 0

    def _open(self) -> Sequence[str]:
        try:
            import pynq
        except ImportError as exc:
            raise SensorError(f"the pynq power source needs the pynq package, found on PYNQ board images "
                              f"(import failed: {exc})") from None
        try:
            rails = pynq.get_rails(self.config_file) if self.config_file else pynq.get_rails()
        except Exception as exc:  # noqa: BLE001 - libsensors failures surface as anything
            raise SensorError(f"pynq.get_rails() failed: {exc}") from exc
        if not rails:
            raise SensorError("pynq.get_rails() found no power rails: libsensors sees no power sensors on this "
                              "board (the PYNQ-Z1/Z2 have none: log an external meter and use --source csv:FILE)")
        channels: dict[str, tuple[Any, ...]] = {}
        for name, rail in rails.items():
            if getattr(rail, "power", None) is not None:
                channels[str(name)] = (rail.power,)
            elif getattr(rail, "voltage", None) is not None and getattr(rail, "current", None) is not None:
                channels[str(name)] = (rail.voltage, rail.current)
        if not channels:
            raise SensorError(f"pynq.get_rails() found rails ({', '.join(map(str, rails))}) but none reports "
                              "power, or voltage and current")
        self._pynq = pynq
        self._channels = channels
        return tuple(channels)

    def describe(self) -> dict:
        return {**super().describe(), "sensors": {r: [s.name for s in c] for r, c in self._channels.items()}}

    def read(self) -> dict[str, float]:
        """One reading of every rail now (watts)."""
        return {r: math.prod(float(s.value) for s in c) for r, c in self._channels.items()}

    def _sensors(self) -> list[Any]:
        seen: dict[int, Any] = {}
        for c in self._channels.values():
            for s in c:
                seen.setdefault(id(s), s)
        return list(seen.values())

    def start(self, period_s: float | None = None) -> None:
        if self._recorder is not None:
            raise SensorError("the pynq DataRecorder is already recording")
        period = self.default_period_s if period_s is None else float(period_s)
        self._recorder = self._pynq.DataRecorder(*self._sensors())
        self._seen = 0
        self._recorder.record(period)

    def _rows(self) -> list[Sample]:
        try:
            frame = self._recorder.frame
        except ValueError:  # a row half-appended by the recorder's thread: next time
            return []
        times = np.asarray(frame.index, dtype="datetime64[ns]").astype(np.int64) / 1e9
        n = len(times)
        if n <= self._seen:
            return []
        cols = {s.name: np.asarray(frame[s.name], dtype=np.float64) for s in self._sensors()}
        out = []
        for i in range(self._seen, n):
            out.append(Sample(float(times[i]),
                              {r: math.prod(float(cols[s.name][i]) for s in c) for r, c in self._channels.items()}))
        self._seen = n
        return out

    def poll(self) -> list[Sample]:
        return self._rows() if self._recorder is not None else []

    def stop(self) -> list[Sample]:
        if self._recorder is None:
            return []
        self._recorder.stop()
        out = self._rows()
        self._recorder = None
        return out

    def close(self) -> None:
        if self._recorder is not None:
            try:
                self._recorder.stop()
            finally:
                self._recorder = None
