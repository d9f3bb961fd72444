"""The one interface every power source implements: timestamped samples of watts per rail.

A :class:`PowerSource` is opened (the sensor is found and checked, the rails it reports are known),
started (it records in the background, or models), polled for the samples taken since the last poll,
and stopped. Each :class:`Sample` is a time in seconds and the watts of every rail at that time.

Time bases
----------
Measured sources stamp samples with ``time.time()`` (seconds since the epoch): the clock that
``pynq.DataRecorder`` uses and the one an external meter's log can be aligned to. Model sources
(:mod:`host.power.estimate`, :mod:`host.power.replay`) run on a :class:`VirtualClock`: their time is
the accelerator's modelled time, advanced by each token and each sleep, never by the host's wall time.
A session uses ``source.clock`` for every timestamp and every sleep, so both kinds run the same code.

Sample semantics
----------------
A sample's watts hold from its time until the next sample (sample-and-hold; the last sample holds to
the end of any window). Energies are integrals of that step function (:mod:`host.power.accounting`).

Writing a source
----------------
Subclass :class:`PolledSource` and implement ``_open`` (find and check the sensor, return the rail
names) and ``read`` (one reading: a dict of watts per rail), or subclass :class:`PowerSource` when the
sensor records on its own (as ``pynq.DataRecorder`` does). Board libraries (``pynq``, ``smbus2``,
``pyxrt``) are imported inside the source's methods only, so importing :mod:`host.power` never needs
them.
"""

from __future__ import annotations

import abc
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

__all__ = [
    "Clock", "PolledSource", "PowerError", "PowerSource", "RealClock", "Sample", "SensorError",
    "VirtualClock",
]


class PowerError(RuntimeError):
    """A power measurement that cannot be made or accounted: bad arguments, no samples, a budget below idle."""


class SensorError(PowerError):
    """A sensor, library or file that is missing, unreadable or not what was expected.

    The message names what is missing and what to do about it, in one line (the CLI prints it as is).
    """


@dataclass(frozen=True)
class Sample:
    """One reading of every rail of a source.

    Attributes
    ----------
    t : float
        Seconds on the source's clock (``time.time()`` for measured sources, modelled seconds for model
        sources).
    watts : Mapping[str, float]
        Watts per rail name; NaN where a rail could not be read this time.
    """

    t: float
    watts: Mapping[str, float]


class Clock(Protocol):
    """Where a session reads the time and sleeps (the governor's sleeps included)."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall time: ``time.time()`` (seconds since the epoch) and ``time.sleep``."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """Modelled time for model sources: ``sleep`` advances it through the source (which records idle)."""

    def __init__(self, source: ModelClockOwner) -> None:
        self._source = source

    def now(self) -> float:
        return self._source.model_time

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._source.idle_for(seconds)


class ModelClockOwner(Protocol):
    model_time: float

    def idle_for(self, seconds: float) -> None: ...


class PowerSource(abc.ABC):
    """A source of timestamped per-rail power samples.

    Life cycle: :meth:`open` (returns the rails), :meth:`start`, any number of :meth:`poll` and
    :meth:`on_token` calls, :meth:`stop` (returns the last samples), :meth:`close`. Usable as a context
    manager (``close`` on exit).

    Attributes
    ----------
    name : str
        Registry name (``"estimate"``, ``"pynq"``, ``"ina260"``, ``"xrt"``, ``"csv"``, ``"replay"``).
    kind : str
        ``"measured"`` or ``"estimate"``; every figure derived from an estimate is labelled as one.
    default_period_s : float
        Sampling period used when :meth:`start` is given none.
    clock : Clock
        The time base of the samples and of the session's sleeps.
    """

    name: ClassVar[str] = "abstract"
    kind: ClassVar[str] = "measured"
    default_period_s: ClassVar[float] = 0.05

    def __init__(self) -> None:
        self.clock: Clock = RealClock()
        self._rails: tuple[str, ...] | None = None

    @property
    def rails(self) -> tuple[str, ...]:
        """Rail names, in order (after :meth:`open`).

        Raises
        ------
        PowerError
            If the source is not open.
        """
        if self._rails is None:
            raise PowerError(f"power source {self.name!r} is not open")
        return self._rails

    @property
    def is_estimate(self) -> bool:
        return self.kind == "estimate"

    def describe(self) -> dict:
        """JSON-ready description of the source (name, kind, rails, options)."""
        return {"name": self.name, "kind": self.kind, "rails": list(self._rails or ())}

    def open(self) -> tuple[str, ...]:
        """Find and check the sensor; return its rails.

        Raises
        ------
        SensorError
            With a one-line message naming what is missing (library, bus, device, file, rails).
        """
        rails = tuple(self._open())
        if not rails:
            raise SensorError(f"power source {self.name!r} reports no rails")
        if len(set(rails)) != len(rails):
            raise SensorError(f"power source {self.name!r} reports duplicate rail names: {list(rails)}")
        self._rails = rails
        return rails

    @abc.abstractmethod
    def _open(self) -> Sequence[str]:
        """Find and check the sensor, return the rail names (raise SensorError otherwise)."""

    @abc.abstractmethod
    def start(self, period_s: float | None = None) -> None:
        """Start recording (every ``period_s`` seconds, or :attr:`default_period_s`)."""

    @abc.abstractmethod
    def poll(self) -> list[Sample]:
        """The samples taken since :meth:`start` or the last poll, oldest first (may be empty)."""

    @abc.abstractmethod
    def stop(self) -> list[Sample]:
        """Stop recording; return the samples not yet polled."""

    def on_token(self, activity: Mapping[str, int]) -> None:  # noqa: B027 - optional hook
        """A token has just run, with these device counters (``hw_*`` keys). Model sources use it."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the sensor (bus handles, threads). Idempotent."""

    def __enter__(self) -> PowerSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class PolledSource(PowerSource):
    """A source read by polling :meth:`read` from a background thread at a fixed period.

    One reading is taken synchronously by :meth:`start` (so a broken sensor fails there, not silently in
    the thread) and one by :meth:`stop`. An exception in the thread stops it and is raised, as a
    :class:`SensorError`, by the next :meth:`poll` or :meth:`stop`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._period = self.default_period_s

    @abc.abstractmethod
    def read(self) -> dict[str, float]:
        """One reading now: watts per rail (every rail of :attr:`rails`)."""

    def _take(self) -> None:
        t = self.clock.now()
        watts = self.read()
        with self._lock:
            self._samples.append(Sample(t, {r: float(watts.get(r, math.nan)) for r in self.rails}))

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._period):
                self._take()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by poll/stop
            self._error = exc

    def start(self, period_s: float | None = None) -> None:
        if self._thread is not None:
            raise PowerError(f"power source {self.name!r} is already recording")
        period = self.default_period_s if period_s is None else float(period_s)
        if not period > 0:
            raise PowerError(f"the sampling period must be > 0 s, got {period_s}")
        self._period = period
        self._stop.clear()
        self._error = None
        self._take()
        self._thread = threading.Thread(target=self._run, name=f"power-{self.name}", daemon=True)
        self._thread.start()

    def _check_error(self) -> None:
        if self._error is not None:
            exc, self._error = self._error, None
            if isinstance(exc, SensorError):
                raise exc
            raise SensorError(f"power source {self.name!r} failed while recording: {exc}") from exc

    def poll(self) -> list[Sample]:
        self._check_error()
        with self._lock:
            out, self._samples = self._samples, []
        return out

    def stop(self) -> list[Sample]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._check_error()
            self._take()
        return self.poll()

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
