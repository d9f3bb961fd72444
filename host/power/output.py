"""Outputs of a power run: the samples CSV, the JSON summary and the PNG plot, each written safely.

Every file is written to a temporary file in the destination directory, flushed to disk and renamed
over the destination (:func:`atomic_write`): an interrupted or failed write leaves the previous file,
or none, never a partial one.

Samples CSV columns: ``t_s`` (seconds since the start of the idle baseline), ``time`` (the source's
clock: epoch seconds when measured, modelled seconds for an estimate), ``phase`` (``before``, ``idle``,
``prefill``, ``token``, ``sleep``, ``between``, ``after``), ``token`` (decode token index during a
token), ``kind`` (``measured`` or ``estimate``), one ``<rail>_w`` column per rail and ``total_w`` (the
sum of the budget rails). A sample's watts hold until the next row.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from host.power.accounting import Trace

__all__ = ["atomic_write", "plot_trace", "write_json", "write_samples_csv"]


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write ``path`` through ``write(binary_file)`` into a temporary file, then rename it into place.

    Raises
    ------
    OSError
        If the directory does not exist or cannot be written (the destination is then untouched).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the result is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fmt(x: float) -> str:
    return "" if not math.isfinite(x) else repr(float(x))


def write_samples_csv(trace: Trace, path: str | Path, budget_rails: tuple[str, ...] | list[str]) -> Path:
    """The trace's samples as CSV (columns in the module docstring), written atomically."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["t_s", "time", "phase", "token", "kind", *[f"{r}_w" for r in trace.rails], "total_w"])
    origin = trace.idle[0]
    totals = trace.total(list(budget_rails))
    for i, t in enumerate(trace.times):
        phase, token = trace.phase_of(float(t))
        w.writerow([_fmt(t - origin), _fmt(t), phase, "" if token is None else token, trace.kind,
                    *[_fmt(v) for v in trace.watts[i]], _fmt(totals[i])])
    data = buf.getvalue().encode("utf-8")
    return atomic_write(path, lambda f: f.write(data))


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(obj: Any, path: str | Path) -> Path:
    """``obj`` as indented JSON (NaN and infinities become null), written atomically."""
    data = (json.dumps(_clean(obj), indent=2, allow_nan=False) + "\n").encode("utf-8")
    return atomic_write(path, lambda f: f.write(data))


def plot_trace(trace: Trace, summary: dict, path: str | Path, *, title: str) -> Path:
    """PNG of power over time: budget rails and their total, budget and idle lines, token boundaries.

    Top panel: watts on the budget rails (each rail thin, their total thick), the budget (red dashed)
    and the idle baseline (grey dotted); shaded: the idle window, the prefill, governor sleeps. Bottom
    panel: the total's draw above idle, zoomed. Vertical ticks: token boundaries.

    Raises
    ------
    ImportError
        If matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budget = summary["budget"]
    rails = list(budget["rails"])
    idle_w = summary["total"]["idle_w"] or 0.0
    limit = budget["limit_w"]
    t0 = trace.idle[0]
    end = max(trace.run[1], float(trace.times[-1]) if trace.times.size else t0)
    span = end - t0
    scale, unit = (1e3, "ms") if span < 2 else (1.0, "s")

    def x(t: Any) -> Any:
        return (t - t0) * scale

    times = list(trace.times) + [end]
    total = list(trace.total(rails)) + [trace.total(rails)[-1]]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, height_ratios=[3, 1.3],
                                  constrained_layout=True)
    xs = [x(t) for t in times]
    if len(rails) > 1:
        for r in rails[:8]:
            col = list(trace.column(r)) + [trace.column(r)[-1]]
            ax.step(xs, col, where="post", lw=1.0, alpha=0.8, label=f"{r}")
    ax.step(xs, total, where="post", lw=2.2, color="black",
            label="total of " + ("+".join(rails) if len(rails) <= 4 else f"{len(rails)} rails"))
    ax.axhline(limit, color="tab:red", ls="--", lw=1.5,
               label=f"budget {budget['watts']:g} W" + (" above idle" if budget["basis"] == "above-idle" else ""))
    ax.axhline(idle_w, color="0.4", ls=":", lw=1.5, label=f"idle {idle_w:.3g} W")
    for a in (ax, ax2):
        a.axvspan(x(trace.idle[0]), x(trace.idle[1]), color="tab:blue", alpha=0.08)
        if trace.prefill is not None:
            a.axvspan(x(trace.prefill[0]), x(trace.prefill[1]), color="tab:olive", alpha=0.12)
        for s, e in trace.sleeps:
            a.axvspan(x(s), x(e), color="tab:red", alpha=0.10, lw=0)
    n = len(trace.tokens)
    every = max(1, math.ceil(n / 200))
    bounds = [trace.tokens[i][0] for i in range(0, n, every)] + [trace.tokens[-1][1]]
    for a in (ax, ax2):
        for b in bounds:
            a.axvline(x(b), color="tab:green", lw=0.5, alpha=0.35)
    ymax = max(limit, float(max(v for v in total if math.isfinite(v))) if any(map(math.isfinite, total)) else 0)
    ax.set_ylim(0, ymax * 1.12)
    ax.set_ylabel("watts")
    from matplotlib.patches import Patch

    handles, labels = ax.get_legend_handles_labels()
    handles += [Patch(color="tab:blue", alpha=0.2), Patch(color="tab:olive", alpha=0.25),
                Patch(color="tab:green", alpha=0.5)]
    labels += ["idle baseline window", "prompt prefill (not in the figures)",
               "token boundaries" + (f" (every {every}th)" if every > 1 else "")]
    if trace.sleeps:
        handles.append(Patch(color="tab:red", alpha=0.2))
        labels.append("governor sleeps")
    ax.legend(handles, labels, loc="best", fontsize=8, ncol=2, framealpha=0.9)
    pt, tot = summary["per_token"], summary["total"]
    verdict = "PASS" if budget["pass"] else "FAIL"
    est = " (estimate)" if summary.get("estimate") else ""
    text = ("ESTIMATE, not a measurement\n" if summary.get("estimate") else "") + (
            f"{n} tokens in {summary['run']['seconds'] * scale:.4g} {unit}\n"
            f"mean {tot['mean_w']:.4g} W, peak {tot['peak_w']:.4g} W{est}\n"
            f"above idle {tot['above_idle_w']:.3g} W\n"
            f"{(pt['j_per_token'] or math.nan) * 1e3:.4g} mJ/token, {pt['tokens_per_j'] or math.nan:.4g} tokens/J\n"
            f"budget: {verdict} (mean {budget['mean_w']:.4g} W vs {budget['watts']:g} W {budget['basis']})")
    high = ymax > 0 and max((v for v in total if math.isfinite(v)), default=0.0) > 0.55 * ymax * 1.12
    ax.text(0.99, 0.03 if high else 0.97, text, transform=ax.transAxes, ha="right", va="bottom" if high else "top",
            fontsize=8.5, family="monospace",
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.9,
                  "edgecolor": "tab:red" if not budget["pass"] else "0.6"})
    above = [v - idle_w for v in total]
    ax2.step(xs, above, where="post", lw=1.5, color="black")
    if budget["basis"] == "above-idle":
        ax2.axhline(budget["watts"], color="tab:red", ls="--", lw=1.2)
    ax2.axhline(0, color="0.4", ls=":", lw=1)
    ax2.set_ylabel("above idle, W")
    ax2.set_xlabel(f"time since the idle baseline started ({unit})" + (", modelled" if summary.get("estimate") else ""))
    ax.set_title(title, fontsize=11)
    for a in (ax, ax2):
        a.grid(alpha=0.25)
        a.set_xlim(0, x(end))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    data = buf.getvalue()
    return atomic_write(path, lambda f: f.write(data))
