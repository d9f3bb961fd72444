"""Power sources by name: ``estimate``, ``pynq``, ``ina260``, ``xrt``, ``xrt:FILE``, ``csv:FILE``, ``replay:FILE``.

Source modules that need board libraries import them only when the source is opened, so
:func:`make_source` works (and fails with a clear message at ``open``) on any machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from host.power.base import PowerError, PowerSource
from host.power.boards import PowerBoard

__all__ = ["SOURCES", "make_source", "parse_spec"]

#: Source names and what they read.
SOURCES: dict[str, str] = {
    "estimate": "ESTIMATE from the device's activity counters (no board; every figure labelled as an estimate)",
    "pynq": "PYNQ rails: pynq.get_rails() recorded with pynq.DataRecorder (ZCU104, Ultra96, Kria with PYNQ)",
    "ina260": "the KV260 SOM's 5 V input from its INA260 over I2C (smbus2)",
    "xrt": "Alveo card power from XRT (pyxrt or xrt-smi); xrt:FILE reads a saved xrt-smi electrical JSON",
    "csv": "csv:FILE, an external meter's log of timestamp, watts (PYNQ-Z2 and other boards without sensors)",
    "replay": "replay:FILE, a samples CSV of an earlier mmfree power run, replayed token by token",
}


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"csv:meter.csv"`` -> ``("csv", "meter.csv")``; ``"estimate"`` -> ``("estimate", None)``.

    Raises
    ------
    PowerError
        For an unknown source, a missing or unexpected ``:FILE``.
    """
    name, sep, arg = spec.partition(":")
    name = name.strip().lower()
    if name not in SOURCES:
        raise PowerError(f"unknown power source {spec!r}; sources: estimate, pynq, ina260, xrt, xrt:FILE, csv:FILE, "
                         "replay:FILE")
    if name in ("csv", "replay") and not arg:
        raise PowerError(f"--source {name} needs a file: --source {name}:FILE")
    if sep and not arg:
        raise PowerError(f"--source {spec!r}: the file name after ':' is empty")
    if arg and name not in ("csv", "replay", "xrt"):
        raise PowerError(f"--source {name} takes no file (got {spec!r})")
    return name, (arg or None)


def make_source(spec: str, board: PowerBoard, *, device: Any = None, i2c_bus: int = 1, i2c_address: int = 0x40,
                i2c_force: bool = False, xrt_device: str | int | None = None, csv_offset_s: float = 0.0,
                static_w: float | None = None, pynq_config: str | None = None) -> PowerSource:
    """Construct (not open) the source named by ``spec`` for ``board``.

    Parameters
    ----------
    spec : str
        See :func:`parse_spec`.
    board : PowerBoard
    device : host.devices.Device, optional
        For the estimate: its build (``device.build``: ``fmax_mhz``, ``bus_bits``) sets the clock (at most the
        board's design clock) and the beat width; without one, the board's design point
        (:attr:`hw.boards.facts.BoardFacts.design`) does.
    i2c_bus, i2c_address, i2c_force
        For ``ina260``.
    xrt_device
        For ``xrt``: index or BDF.
    csv_offset_s
        For ``csv``: seconds added to the log's timestamps.
    static_w
        For ``estimate``: a measured idle replacing the assumed one.
    pynq_config
        For ``pynq``: a libsensors configuration file.
    """
    name, arg = parse_spec(spec)
    if name == "estimate":
        from host.power.estimate import EstimateSource

        build = getattr(device, "build", None)
        design = board.facts.design
        fmax = min(getattr(build, "fmax_mhz", None) or design.fmax_mhz, design.fmax_mhz)
        return EstimateSource(board, fmax_mhz=float(fmax), bus_bits=int(getattr(build, "bus_bits", design.bus_bits)),
                              static_w=static_w)
    if name == "pynq":
        from host.power.pynq_rails import PynqRailsSource

        return PynqRailsSource(config_file=pynq_config)
    if name == "ina260":
        from host.power.ina260 import Ina260Source

        return Ina260Source(bus=i2c_bus, address=i2c_address, force=i2c_force)
    if name == "xrt":
        from host.power.xrt import XrtSource

        return XrtSource(json_path=Path(arg) if arg else None, device=xrt_device)
    if name == "csv":
        from host.power.meter import MeterCsvSource

        return MeterCsvSource(Path(arg), offset_s=csv_offset_s)
    from host.power.replay import ReplaySource

    return ReplaySource.from_csv(Path(arg))
