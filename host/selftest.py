"""``mmfree selftest`` and ``mmfree bench``: a device checked bit for bit against the golden device, and measured.

:func:`selftest` runs the first token(s) of a sequence (BOS by default) on the device under test and on the
golden device (:class:`host.devices.golden.GoldenDevice`, the oracle) and compares the logits bit for bit
(float32 arrays from the same integer accumulators: any difference is a failure), the greedy token, and,
where both devices expose it, the raw output packet. :func:`bench` decodes greedily for a number of
tokens and reports tokens/s (wall clock), the weight bytes streamed per second, cycles per token from the
device's counters (the hardware's on rtl, pynq and xrt; the cycle model's on golden) and how close both come
to the roofline of :func:`host.perf.roofline` for a board of :data:`host.perf.BOARDS`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from host.devices.base import Device
from hw.provenance import git_revision, machine_info

__all__ = ["SelftestResult", "selftest", "bench", "build_params_of", "image_of"]


@dataclass
class SelftestResult:
    """Outcome of :func:`selftest`.

    Attributes
    ----------
    passed : bool
    device : str
    tokens : list of int
        Token ids run, in order from a reset.
    mismatches : list of str
        One line per difference (empty when passed).
    details : dict
        Per token: argmax of both devices, max |difference| of the logits, packets compared or not.
    """

    passed: bool
    device: str
    tokens: list[int]
    mismatches: list[str] = field(default_factory=list)
    details: list[dict] = field(default_factory=list)


def _packet(device: Device) -> bytes | None:
    last = getattr(device, "last", None)
    out = getattr(last, "output", None)
    return bytes(out) if isinstance(out, (bytes, bytearray)) else None


def selftest(device: Device, checkpoint: Any, *, tokens: list[int] | None = None,
             golden: Device | None = None) -> SelftestResult:
    """Run ``tokens`` (default: the model's BOS) from a reset on ``device`` and on the golden device.

    Parameters
    ----------
    device : Device
        The device under test, constructed (not necessarily loaded: it is loaded here).
    checkpoint : host.checkpoint.Checkpoint, ModelWeights or host.bundle.Bundle
    tokens : list of int, optional
    golden : Device, optional
        The reference (default: a new :class:`~host.devices.golden.GoldenDevice`).

    Returns
    -------
    SelftestResult
        ``passed`` only when every token's logits are bit-identical and the greedy tokens agree.

    Raises
    ------
    DeviceError
        From the device (a time-out, an error flag): the self-test could not run.
    """
    from host.devices.golden import GoldenDevice

    model = _model(checkpoint)
    cfg = model.config
    ids = list(tokens) if tokens else [int(getattr(cfg, "bos_token_id", 1) or 0) % cfg.vocab_size]
    gold = golden or GoldenDevice()
    gold.load(model)
    device.load(model)
    device.reset()
    gold.reset()
    res = SelftestResult(passed=True, device=device.name, tokens=ids)
    for pos, t in enumerate(ids):
        got = np.asarray(device.step(t), dtype=np.float32)
        want = np.asarray(gold.step(t), dtype=np.float32)
        same = got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
        d = {"position": pos, "token": t, "argmax": int(np.argmax(got)), "golden_argmax": int(np.argmax(want)),
             "bit_exact": bool(same)}
        if not same:
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64)) if got.shape == want.shape else None
            n_bad = int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32))) if diff is not None else -1
            d["max_abs_diff"] = float(diff.max()) if diff is not None else None
            res.mismatches.append(f"token {pos} (id {t}): {n_bad} of {want.size} logits differ"
                                  + (f", max |diff| {d['max_abs_diff']:.6g}" if diff is not None else
                                     f", shape {got.shape} vs {want.shape}"))
        if d["argmax"] != d["golden_argmax"]:
            res.mismatches.append(f"token {pos} (id {t}): greedy token {d['argmax']}, golden {d['golden_argmax']}")
        pa, pb = _packet(device), _packet(gold)
        if pa is not None and pb is not None:
            d["packet_compared"] = True
            if pa != pb:
                res.mismatches.append(f"token {pos} (id {t}): output packets differ ({len(pa)} vs {len(pb)} bytes)")
        res.details.append(d)
    res.passed = not res.mismatches
    return res


def _model(checkpoint: Any) -> Any:
    """A compiled bundle as it is, else the weights of a checkpoint (what ``Device.load`` takes)."""
    from host.bundle import Bundle
    from host.devices.base import weights_of

    return checkpoint if isinstance(checkpoint, Bundle) else weights_of(checkpoint)


def build_params_of(device: Device):
    """The :class:`hw.params.BuildParams` a device runs (golden/rtl: their own; boards: the ID block)."""
    from hw.params import BuildParams

    b = getattr(device, "build", None)
    if isinstance(b, BuildParams):
        return b
    if isinstance(b, dict) and b:
        return BuildParams.from_id_block(b)
    return BuildParams()


def image_of(device: Device):
    """The :class:`host.image.ParsedImage` a loaded device runs, or None (the reference device has none)."""
    img = getattr(device, "image", None)
    if img is not None:
        return img
    m = getattr(device, "machine", None)
    return getattr(m, "image", None)


def bench(device: Device, checkpoint: Any, *, tokens: int = 16, board: str = "kv260",
          fmax_mhz: float | None = None) -> dict:
    """Greedy decode of ``tokens`` tokens from BOS; tokens/s, GB/s, cycles per token, % of the roofline.

    Parameters
    ----------
    device : Device
        Constructed; loaded here.
    checkpoint : Checkpoint, ModelWeights or host.bundle.Bundle
    tokens : int, >= 1
    board : str
        A key of :data:`hw.boards.facts.BOARDS` (:data:`host.perf.BOARDS`): whose roofline the numbers are
        compared with.
    fmax_mhz : float, optional
        Core clock for the cycle-based rate (default: the board's design clock,
        :attr:`hw.boards.facts.BoardFacts.fmax_mhz`).

    Returns
    -------
    dict
        ``tokens_per_s`` (wall clock, the host included), ``achieved_gbs`` (image bytes per token x
        tokens/s: the weight stream's rate), ``cycles_per_token`` (mean, from the counters, and their
        ``cycles_source``), ``cycle_tokens_per_s`` (Fmax / cycles per token), ``roofline`` (tokens/s
        bounds and the binding one), ``pct_of_roofline_wall`` and ``pct_of_roofline_cycles``, the
        stream efficiency where the device reports it, provenance (git revision, machine, load average).

    Raises
    ------
    ValueError
        ``tokens < 1`` or an unknown board.
    """
    from host.perf import BOARDS, roofline

    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be an integer >= 1, got {tokens!r}")
    if board not in BOARDS:
        raise ValueError(f"unknown board {board!r}; known: {', '.join(BOARDS)}")
    model = _model(checkpoint)
    device.load(model)
    device.reset()
    before = device.counters()
    t = int(getattr(model.config, "bos_token_id", 1) or 0) % model.config.vocab_size
    times = []
    for _ in range(tokens):
        t0 = time.perf_counter()
        t = int(device.step_argmax(t))      # a DRAM board sends the argmax alone, not the logits
        times.append(time.perf_counter() - t0)
    after = device.counters()
    wall = float(sum(times))
    img = image_of(device)
    bp = build_params_of(device)
    bd = BOARDS[board]
    fmax = float(fmax_mhz or bd.fmax_mhz)
    out: dict[str, Any] = {"device": device.name, "board": board, "tokens": tokens, "wall_s": wall,
                           "tokens_per_s": tokens / wall if wall else float("inf"),
                           "seconds_per_token": {"mean": wall / tokens, "min": min(times), "max": max(times)},
                           "build": bp.as_dict()}
    if img is not None:
        ib = img.info.image_bytes
        from hw.isa import Opcode

        trits = sum(i.n * i.k for i in img.instructions if i.opcode is Opcode.GEMV)
        rl = roofline(ib, trits, bp.replace(fmax_mhz=fmax), bd)
        out.update({"image_bytes": ib, "trits": trits, "achieved_gbs": ib * out["tokens_per_s"] / 1e9,
                    "roofline": rl, "pct_of_roofline_wall": 100.0 * out["tokens_per_s"] / rl["bound"]})
    n = after.get("hw_tokens", 0) - before.get("hw_tokens", 0)
    if "hw_cycles" in after and n:
        cyc = (after["hw_cycles"] - before.get("hw_cycles", 0)) / n
        src = "cycle model (host.perf)" if device.name == "golden" else "hardware counters"
        out.update({"cycles_per_token": cyc, "cycles_source": src, "fmax_mhz": fmax})
        if cyc <= 0:    # TOKENS advanced and CYCLES did not: no cycle-based rate rather than a division by zero
            out["cycles_note"] = f"the {src}' CYCLES did not advance over {n} token(s): no cycle-based rate"
        else:
            out["cycle_tokens_per_s"] = fmax * 1e6 / cyc
        if "cycle_tokens_per_s" in out and "roofline" in out:
            out["pct_of_roofline_cycles"] = 100.0 * out["cycle_tokens_per_s"] / out["roofline"]["bound"]
    rep = getattr(device, "cycles_report", None)
    r = rep() if callable(rep) else None
    if r:
        out["stream_efficiency"] = r["stream_efficiency"]
        out["cycles_predicted"] = r["predicted"]
    machine = machine_info()
    out["provenance"] = {"git": git_revision(), "machine": machine["platform"], "cpu": machine["cpu"],
                         "python": machine["python"], "cpus": machine["cpu_count"],
                         "load_average": list(os.getloadavg()),
                         "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device.name in ("golden", "rtl", "reference"):
        out["note"] = ("tokens/s and GB/s are this host's simulation speed, not hardware's; cycles per token "
                       "come from " + ("the cycle model" if device.name == "golden" else "the simulated core's "
                                       "counters") + ", and the cycle-based rate assumes the board's Fmax")
    return out

