"""Replay a recorded power trace, token by token, on a virtual clock (for the governor and what-ifs).

A :class:`ReplaySource` holds, for each recorded token, how long it lasted and its mean watts per rail,
plus the idle watts. Each token the session runs plays the next recorded token (cycling when the run
is longer than the recording); sleeps play idle. So a recorded run can be re-run under another budget,
with or without the governor, and the result compared with the recording.

:meth:`ReplaySource.from_csv` reads the samples CSV that ``mmfree power`` writes
(:func:`host.power.output.write_samples_csv`): rows of phase ``idle`` give the idle watts, and each run
of rows of phase ``token`` with the same token index gives one token, lasting from its first row to the
next row, with the time-weighted mean of its rows.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from host.power.base import SensorError
from host.power.model import ModelSource

__all__ = ["ReplaySource"]


class ReplaySource(ModelSource):
    """Play recorded tokens (duration, watts per rail) on a virtual clock.

    Parameters
    ----------
    tokens : sequence of (float, mapping of str to float)
        Each recorded token's duration in seconds (> 0) and mean watts per rail.
    idle : mapping of str to float
        Watts per rail at idle; its keys are the rails.
    kind : {"measured", "estimate"}
        What the recording was (its figures keep that label).
    origin : str
        Where the recording came from, for :meth:`describe`.
    """

    name = "replay"

    def __init__(self, tokens: Sequence[tuple[float, Mapping[str, float]]], idle: Mapping[str, float], *,
                 kind: str = "measured", origin: str = "") -> None:
        super().__init__()
        if not tokens:
            raise SensorError("a replay needs at least one recorded token")
        if kind not in ("measured", "estimate"):
            raise ValueError(f"kind must be 'measured' or 'estimate', got {kind!r}")
        rails = tuple(idle)
        for i, (d, w) in enumerate(tokens):
            if not d > 0:
                raise SensorError(f"recorded token {i} lasts {d} s; durations must be > 0")
            missing = [r for r in rails if r not in w]
            if missing:
                raise SensorError(f"recorded token {i} has no watts for rail(s) {missing}")
        self._tokens = [(float(d), {r: float(w[r]) for r in rails}) for d, w in tokens]
        self._idle = {r: float(v) for r, v in idle.items()}
        self._rails_given = rails
        self.kind = kind  # type: ignore[misc] - a replay keeps the label of what it replays
        self.origin = origin
        self._next = 0

    def _open(self) -> tuple[str, ...]:
        return self._rails_given

    def idle_watts(self) -> dict[str, float]:
        return dict(self._idle)

    def describe(self) -> dict:
        return {**super().describe(), "origin": self.origin, "recorded_tokens": len(self._tokens)}

    def on_token(self, activity: Mapping[str, int]) -> None:
        duration, watts = self._tokens[self._next % len(self._tokens)]
        self._next += 1
        self.segment(duration, watts)

    @classmethod
    def from_csv(cls, path: str | Path) -> ReplaySource:
        """A replay of a samples CSV written by ``mmfree power`` (see the module docstring).

        Raises
        ------
        SensorError
            If the file is missing, not in that format, or holds no idle rows or no token rows.
        """
        path = Path(path)
        try:
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
        except FileNotFoundError:
            raise SensorError(f"trace not found: {path}") from None
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise SensorError(f"cannot read the trace {path}: {exc}") from None
        if not rows or not {"time", "phase", "token"} <= set(rows[0]):
            raise SensorError(f"{path} is not a samples CSV of mmfree power (columns time, phase, token, <rail>_w)")
        rails = [c[:-2] for c in rows[0] if c.endswith("_w") and c != "total_w"]
        if not rails:
            raise SensorError(f"{path} has no <rail>_w columns")
        try:
            times = [float(r["time"]) for r in rows]
            watts = [{rail: float(r[rail + "_w"] or "nan") for rail in rails} for r in rows]
        except (TypeError, ValueError) as exc:
            raise SensorError(f"{path}: bad number: {exc}") from None
        kind = rows[0].get("kind") or "measured"
        nxt = times[1:] + [math.nan]

        def mean(idx: list[int]) -> dict[str, float]:
            dur = [max(nxt[i] - times[i], 0.0) if math.isfinite(nxt[i]) else 0.0 for i in idx]
            total = sum(dur)
            if total <= 0:
                return {rail: sum(watts[i][rail] for i in idx) / len(idx) for rail in rails}
            return {rail: sum(d * watts[i][rail] for d, i in zip(dur, idx, strict=True)) / total for rail in rails}

        idle_rows = [i for i, r in enumerate(rows) if r["phase"] == "idle"]
        if not idle_rows:
            raise SensorError(f"{path} has no idle rows")
        groups: list[list[int]] = []
        last = None
        for i, r in enumerate(rows):
            key = r["token"] if r["phase"] == "token" else None
            if key is not None and key == last:
                groups[-1].append(i)
            elif key is not None:
                groups.append([i])
            last = key
        tokens = []
        for g in groups:
            end = g[-1] + 1
            if end >= len(rows):
                continue
            duration = times[end] - times[g[0]]
            if duration > 0:
                tokens.append((duration, mean(g)))
        if not tokens:
            raise SensorError(f"{path} has no complete token rows")
        return cls(tokens, mean(idle_rows), kind="estimate" if kind == "estimate" else "measured", origin=str(path))
