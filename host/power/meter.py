"""An external power meter's CSV log (timestamp, watts): for boards without sensors, such as the PYNQ-Z2.

Format: one row per reading, the timestamp first, then one or more columns of watts (one rail each).
Separators ``,``, ``;`` or tab; lines starting with ``#`` are skipped; an optional header row names the
rails (default ``meter``, or ``meter1``, ``meter2``, ... for several columns). Timestamps are seconds
since the epoch (``1718000000.25``) or ISO 8601 date-times (``2024-06-10T08:13:20.250``, ``...Z`` or
``+02:00``; a time without a zone is local time). ``offset_s`` is added to every timestamp, to correct a
meter whose clock differs from the host's.

The log is read again at every poll, so a meter that appends while the run goes on is followed live
(and the governor can use it); rows are matched to the run by time. Only rows from the last one at or
before :meth:`MeterCsvSource.start` onwards are used, and a reading stands for at most five of the
log's median intervals (at least 1 s): a log that stops before the run ends is an error, not a last
reading held forever.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

from host.power.base import PowerSource, Sample, SensorError

__all__ = ["MeterCsvSource", "parse_meter_csv", "parse_timestamp"]


def parse_timestamp(text: str) -> float:
    """Seconds since the epoch of a number or an ISO 8601 date-time.

    Raises
    ------
    ValueError
        If ``text`` is neither.
    """
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"timestamp {text!r} is not finite")
        return value
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    return datetime.fromisoformat(iso).timestamp()


def _delimiter(line: str) -> str:
    for d in (",", ";", "\t"):
        if d in line:
            return d
    return ","


def parse_meter_csv(text: str, *, name: str = "meter log") -> tuple[tuple[str, ...], list[Sample]]:
    """Rails and samples of a meter log (see the module docstring), sorted by time.

    Raises
    ------
    SensorError
        On a row that does not parse (the message gives its line), or no columns of watts.
    """
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        return (), []
    delim = _delimiter(lines[0][1])
    first = [c.strip() for c in lines[0][1].split(delim)]
    if len(first) < 2:
        raise SensorError(f"{name}: line {lines[0][0]} has {len(first)} column(s); expected a timestamp and watts")
    try:
        parse_timestamp(first[0])
        header = None
    except ValueError:
        header = first
        lines = lines[1:]
    ncol = len(first) - 1
    if header is not None:
        rails = tuple(h or f"meter{j + 1}" for j, h in enumerate(header[1:]))
    else:
        rails = ("meter",) if ncol == 1 else tuple(f"meter{j + 1}" for j in range(ncol))
    if len(set(rails)) != len(rails):
        raise SensorError(f"{name}: duplicate column names {list(rails)}")
    samples = []
    for lineno, ln in lines:
        cells = [c.strip() for c in ln.split(delim)]
        if len(cells) != ncol + 1:
            raise SensorError(f"{name}: line {lineno} has {len(cells)} columns, expected {ncol + 1}")
        try:
            t = parse_timestamp(cells[0])
        except ValueError:
            raise SensorError(f"{name}: line {lineno}: bad timestamp {cells[0]!r}") from None
        watts = {}
        for rail, cell in zip(rails, cells[1:], strict=True):
            try:
                watts[rail] = float(cell) if cell else math.nan
            except ValueError:
                raise SensorError(f"{name}: line {lineno}: bad watts {cell!r} in column {rail!r}") from None
        samples.append(Sample(t, watts))
    samples.sort(key=lambda s: s.t)
    return rails, samples


class MeterCsvSource(PowerSource):
    """Samples from an external meter's CSV log (see the module docstring).

    Parameters
    ----------
    path : path
        The log. It must exist when the source is opened (start the meter's logging first).
    offset_s : float
        Seconds added to the log's timestamps (host clock = meter clock + offset).
    """

    name = "csv"
    default_period_s = 1.0

    def __init__(self, path: str | Path, *, offset_s: float = 0.0) -> None:
        super().__init__()
        self.path = Path(path)
        self.offset_s = float(offset_s)
        self._t_start: float | None = None
        self._last: float | None = None
        self._span: tuple[float, float] | None = None

    def _load(self) -> tuple[tuple[str, ...], list[Sample]]:
        try:
            text = self.path.read_text(encoding="utf-8-sig")
        except FileNotFoundError:
            raise SensorError(f"meter log not found: {self.path}") from None
        except IsADirectoryError:
            raise SensorError(f"meter log is a directory: {self.path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SensorError(f"cannot read the meter log {self.path}: {exc}") from None
        rails, samples = parse_meter_csv(text, name=str(self.path))
        if self.offset_s:
            samples = [Sample(s.t + self.offset_s, s.watts) for s in samples]
        if samples:
            self._span = (samples[0].t, samples[-1].t)
        return rails, samples

    def _open(self) -> tuple[str, ...]:
        rails, _ = self._load()
        if not rails:
            raise SensorError(f"the meter log {self.path} is empty: expected rows of timestamp, watts")
        return rails

    @property
    def span(self) -> tuple[float, float] | None:
        """Time of the first and last row read (host clock), or None."""
        return self._span

    def describe(self) -> dict:
        return {**super().describe(), "path": str(self.path), "offset_s": self.offset_s}

    def max_gap_s(self, samples: list[Sample]) -> float:
        """Longest time a reading may stand for: 5 times the log's median interval, at least 1 s."""
        times = sorted(s.t for s in samples)
        steps = sorted(b - a for a, b in zip(times, times[1:], strict=False) if b > a)
        median = steps[len(steps) // 2] if steps else 1.0
        return max(5.0 * median, 1.0)

    def start(self, period_s: float | None = None) -> None:
        self._t_start = self.clock.now()
        self._last = None
        self._gap = 1.0

    def poll(self) -> list[Sample]:
        if self._t_start is None:
            return []
        rails, samples = self._load()
        if rails != self.rails:
            raise SensorError(f"the meter log {self.path} changed its columns from {list(self.rails)} to {list(rails)}")
        self._gap = self.max_gap_s(samples)
        if self._last is None:
            # the reading standing at the start, if recent enough to stand for it, then every later one
            before = [s for s in samples if self._t_start - self._gap <= s.t <= self._t_start]
            out = before[-1:] + [s for s in samples if s.t > self._t_start]
        else:
            out = [s for s in samples if s.t > self._last]
        if out:
            self._last = out[-1].t
        return out

    def stop(self) -> list[Sample]:
        """The last rows; the log must reach the end of the run (a stale log would hold its last reading).

        Raises
        ------
        SensorError
            If the log's last reading is older than the end of the run by more than :meth:`max_gap_s`.
        """
        out = self.poll()
        now = self.clock.now()
        self._t_start = None
        if self._last is None or now - self._last > self._gap:
            span = "no reading" if self._span is None else f"readings from {self._span[0]:.3f} to {self._span[1]:.3f}"
            raise SensorError(f"the meter log {self.path} has {span} (host clock), but the run ran until {now:.3f}: "
                              "is the meter still logging, and does its clock agree with the host's (--csv-offset)?")
        return out
