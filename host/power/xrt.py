"""Alveo card power from XRT's electrical report: ``pyxrt``, ``xrt-smi``, or a saved JSON report.

XRT reports electrical data as JSON (``src/runtime_src/core/tools/common/reports/ReportElectrical.cpp``,
``xrt_core::sensor::read_electrical``)::

    {"power_consumption_max_watts": "150", "power_consumption_watts": "23.414",
     "power_consumption_warning": "false",
     "power_rails": [{"id": "12v_pex", "description": "12 Volts PCI Express",
                      "voltage": {"volts": "12.137", "is_present": "true"},
                      "current": {"amps": "1.105", "is_present": "true"}}, ...]}

``pyxrt.device(i).get_info(pyxrt.xrt_info_device.electrical)`` returns that object as a JSON string;
``xrt-smi examine -d BDF -r electrical -f JSON -o FILE`` writes it under
``{"devices": [{"device_id": BDF, "electrical": {...}}]}``. Values are strings; "N/A" means absent.

Rails: ``card`` (``power_consumption_watts``, the card's input power) and one rail per power-rail id
whose voltage and current are both present (volts times amperes).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from host.power.base import PolledSource, SensorError

__all__ = ["XrtSource", "electrical_section", "parse_electrical"]


def _num(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x


def _present(node: Any) -> bool:
    return isinstance(node, dict) and str(node.get("is_present", "true")).lower() == "true"


def electrical_section(report: Any, device: str | None = None) -> dict:
    """The electrical object of a report: the object itself, ``{"electrical": ...}``, or xrt-smi's
    ``{"devices": [...]}`` (the device whose ``device_id`` is ``device``, else the first with one).

    Raises
    ------
    SensorError
        If there is no electrical section (or not for ``device``).
    """
    if isinstance(report, dict):
        if "power_rails" in report or "power_consumption_watts" in report:
            return report
        if isinstance(report.get("electrical"), dict):
            return report["electrical"]
        devices = report.get("devices")
        if isinstance(devices, list):
            for d in devices:
                if isinstance(d, dict) and isinstance(d.get("electrical"), dict):
                    if device is None or str(d.get("device_id", "")) == str(device):
                        return d["electrical"]
            ids = [str(d.get("device_id")) for d in devices if isinstance(d, dict)]
            if device is not None:
                raise SensorError(f"the XRT report has no electrical section for device {device} (devices: "
                                  f"{', '.join(ids) or 'none'})")
    raise SensorError("the XRT report has no electrical section (expected xrt-smi examine -r electrical "
                      "-f JSON output or pyxrt's electrical info)")


def parse_electrical(report: Any, device: str | None = None) -> dict[str, float]:
    """Watts per rail of an XRT electrical report (see the module docstring).

    Raises
    ------
    SensorError
        If the report holds no power reading.
    """
    el = electrical_section(report, device)
    out: dict[str, float] = {}
    card = _num(el.get("power_consumption_watts"))
    if card is not None:
        out["card"] = card
    for rail in el.get("power_rails", []) or []:
        if not isinstance(rail, dict):
            continue
        v, i = rail.get("voltage"), rail.get("current")
        if not (_present(v) and _present(i)):
            continue
        volts, amps = _num(v.get("volts")), _num(i.get("amps"))
        rid = str(rail.get("id") or rail.get("description") or "").strip()
        if volts is None or amps is None or not rid or rid == "card":
            continue
        out[rid] = volts * amps
    if not out:
        raise SensorError("the XRT electrical report holds no power reading (power_consumption_watts is N/A and no "
                          "rail reports both voltage and current): is an xclbin loaded?")
    return out


class XrtSource(PolledSource):
    """Power of an Alveo card from XRT.

    Parameters
    ----------
    json_path : path, optional
        Read this saved report (``xrt-smi examine -r electrical -f JSON -o FILE``, or pyxrt's JSON) at
        every sample instead of a live card: offline use, or a file another process keeps rewriting.
    device : str or int, optional
        Card index (pyxrt) or BDF (``0000:c1:00.1``); default the first card.
    smi : str, optional
        Path of ``xrt-smi`` (or ``xbutil``) to use when ``pyxrt`` is not importable; default: found on
        ``PATH``.

    Notes
    -----
    Modes, in order: a JSON file when given; ``pyxrt`` when importable (``device.get_info``, fast);
    ``xrt-smi`` otherwise (one process per sample: slow, so the default period is then 1 s).
    """

    name = "xrt"
    default_period_s = 0.1

    def __init__(self, *, json_path: str | Path | None = None, device: str | int | None = None,
                 smi: str | None = None) -> None:
        super().__init__()
        self.json_path = Path(json_path) if json_path is not None else None
        self.device = device
        self.smi = smi
        self.mode = ""
        self._dev: Any = None
        self._pyxrt: Any = None

    def _bdf(self) -> str | None:
        return None if self.device is None or isinstance(self.device, int) else str(self.device)

    def _open(self) -> tuple[str, ...]:
        if self.json_path is not None:
            if not self.json_path.is_file():
                raise SensorError(f"XRT report not found: {self.json_path}")
            self.mode = "file"
        else:
            try:
                import pyxrt
            except ImportError:
                pyxrt = None
            if pyxrt is not None:
                try:
                    self._dev = pyxrt.device(self.device if self.device is not None else 0)
                except Exception as exc:  # noqa: BLE001 - pyxrt raises RuntimeError and others
                    raise SensorError(f"pyxrt cannot open Alveo device {self.device or 0}: {exc}") from exc
                self._pyxrt = pyxrt
                self.mode = "pyxrt"
            else:
                smi = self.smi or shutil.which("xrt-smi") or shutil.which("xbutil")
                if smi is None:
                    raise SensorError("the xrt power source needs XRT: neither pyxrt nor xrt-smi was found (source "
                                      "/opt/xilinx/xrt/setup.sh), or read a saved xrt-smi electrical JSON report "
                                      "with --source xrt:FILE")
                self.smi = smi
                self.mode = "smi"
        return tuple(self.read())

    def start(self, period_s: float | None = None) -> None:
        if period_s is None and self.mode == "smi":
            period_s = 1.0  # one xrt-smi process per sample
        super().start(period_s)

    def _report(self) -> Any:
        if self.mode == "file":
            try:
                return json.loads(self.json_path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                raise SensorError(f"cannot read the XRT report {self.json_path}: {exc}") from None
            except json.JSONDecodeError as exc:
                raise SensorError(f"the XRT report {self.json_path} is not JSON: {exc}") from None
        if self.mode == "pyxrt":
            text = self._dev.get_info(self._pyxrt.xrt_info_device.electrical)
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise SensorError(f"pyxrt returned electrical info that is not JSON: {exc}") from None
        with tempfile.TemporaryDirectory(prefix="mmfree-xrt-") as tmp:
            out = Path(tmp) / "electrical.json"
            cmd = [str(self.smi), "examine", "-r", "electrical", "-f", "JSON", "-o", str(out), "--force"]
            if self._bdf() is not None:
                cmd[2:2] = ["-d", self._bdf()]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SensorError(f"running {' '.join(cmd)} failed: {exc}") from None
            if proc.returncode != 0 or not out.is_file():
                msg = " ".join((proc.stderr or proc.stdout or "").split())[:200]
                raise SensorError(f"{Path(str(self.smi)).name} examine -r electrical failed (exit {proc.returncode})"
                                  f"{': ' + msg if msg else ''}")
            try:
                return json.loads(out.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise SensorError(f"{Path(str(self.smi)).name} wrote a report that is not JSON: {exc}") from None

    def read(self) -> dict[str, float]:
        return parse_electrical(self._report(), self._bdf())

    def describe(self) -> dict:
        return {**super().describe(), "mode": self.mode, "device": self.device,
                "json_path": str(self.json_path) if self.json_path else None}
