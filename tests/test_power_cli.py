"""``mmfree power``: the three outputs from the estimate, the governor, and one-line errors (exit 2)."""

from __future__ import annotations

import csv
import json
import sys

import pytest
from host_fakes import ToyDevice, tiny_checkpoint
from test_power_fakes import CountingToyDevice

import host.cli as cli
from host.devices import DEVICES, DeviceEntry


@pytest.fixture
def fake_model(monkeypatch, tmp_path):
    """``--model`` loads a tiny checkpoint; devices ``counting-toy`` (with hw_* counters) and ``toy`` exist."""
    checkpoint = tiny_checkpoint()
    checkpoint.path = tmp_path / "model"
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: checkpoint)
    monkeypatch.setitem(DEVICES, "counting-toy",
                        DeviceEntry(CountingToyDevice.__module__, "CountingToyDevice", "toy with counters"))
    monkeypatch.setitem(DEVICES, "toy", DeviceEntry(ToyDevice.__module__, "ToyDevice", "toy model"))
    return checkpoint


def power(tmp_path, *args: str) -> int:
    return cli.main(["power", "--device", "counting-toy", "--tokens", "8", "--prompt", "def",
                     "--out", str(tmp_path / "out"), *args])


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mmfree: error: "), err
    return lines[0]


def test_estimate_writes_csv_json_png(capsys, fake_model, tmp_path):
    pytest.importorskip("matplotlib")
    assert power(tmp_path) == 0
    out = capsys.readouterr().out
    assert "ESTIMATE" in out and "(estimate)" in out and "budget        PASS" in out
    d = tmp_path / "out"
    assert sorted(p.name for p in d.iterdir()) == ["power.csv", "power.json", "power.png"]
    report = json.loads((d / "power.json").read_text())
    assert report["estimate"] is True and "ESTIMATE" in report["label"]
    assert report["run"]["tokens"] == 8 and len(report["token_ids"]) == 8
    assert report["budget"]["rails"] == ["pl", "mem", "rest"] and report["budget"]["watts"] == 13.0
    assert report["source"]["fmax_mhz"] == 200.0        # no build on the toy: the KV260's design clock
    assert report["estimate_constants"]["anchors"]["fpga_soft"]["status"] == "published"
    # 100k cycles at 200 MHz per token
    assert report["run"]["seconds"] == pytest.approx(8 * 100_000 / 200e6)
    rows = list(csv.DictReader(open(d / "power.csv", encoding="utf-8")))
    assert {r["kind"] for r in rows} == {"estimate"}
    assert [r["token"] for r in rows if r["phase"] == "token"] == [str(i) for i in range(8)]
    assert (d / "power.png").read_bytes()[:4] == b"\x89PNG"


def test_zcu104_budget_on_pl_and_governor(capsys, fake_model, tmp_path):
    assert power(tmp_path, "--board", "zcu104", "--budget", "0.91", "--governor", "--no-plot") == 0
    report = json.loads((tmp_path / "out" / "power.json").read_text())
    assert report["budget"]["rails"] == ["pl"] and report["budget"]["pass"]
    assert report["run"]["governor_sleeps"] >= 8 and report["budget"]["mean_w"] == pytest.approx(0.91)
    assert not (tmp_path / "out" / "power.png").exists()
    assert "governor      on" in capsys.readouterr().out


def test_rails_and_basis_options(capsys, fake_model, tmp_path):
    assert power(tmp_path, "--rails", "pl,mem", "--budget-basis", "above-idle", "--budget", "1", "--no-plot") == 0
    report = json.loads((tmp_path / "out" / "power.json").read_text())
    assert report["budget"]["rails"] == ["pl", "mem"] and report["budget"]["basis"] == "above-idle"
    assert report["budget"]["limit_w"] == pytest.approx(1.35)


@pytest.mark.parametrize(("args", "words"), [
    (["--board", "zcu102"], "unknown board 'zcu102'; known boards: ulx3s-85f, ecpix5-85f, pynq-z2, kv260"),
    (["--source", "watts"], "unknown power source 'watts'"),
    (["--source", "csv"], "needs a file"),
    (["--rails", "vccint"], "--rails: no rail matches 'vccint'; rails found: pl, mem, rest"),
    (["--budget", "1", "--governor"], "no token rate can meet it"),
    (["--budget", "-3"], "--budget must be a positive number"),
    (["--tokens", "0"], "--tokens must be >= 1"),
])
def test_argument_errors(capsys, fake_model, tmp_path, args, words):
    assert power(tmp_path, "--no-plot", *args) == 2
    assert words in error_line(capsys)


def test_missing_sensors_are_one_line(capsys, fake_model, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "smbus2", None)
    monkeypatch.setitem(sys.modules, "pynq", None)
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    monkeypatch.setattr("shutil.which", lambda name: None)
    cases = [(["--source", "ina260"], "needs smbus2"), (["--source", "pynq"], "needs the pynq package"),
             (["--source", "xrt"], "neither pyxrt nor xrt-smi"),
             (["--source", f"csv:{tmp_path / 'meter.csv'}"], "meter log not found"),
             (["--source", f"xrt:{tmp_path / 'x.json'}"], "XRT report not found")]
    for args, words in cases:
        assert power(tmp_path, "--no-plot", *args) == 2, args
        assert words in error_line(capsys)


def test_device_without_counters(capsys, fake_model, tmp_path):
    assert cli.main(["power", "--device", "toy", "--tokens", "2", "--out", str(tmp_path), "--no-plot"]) == 2
    assert "needs the device's activity counters" in error_line(capsys)


def test_out_is_a_file(capsys, fake_model, tmp_path):
    (tmp_path / "f").write_text("x")
    assert cli.main(["power", "--out", str(tmp_path / "f")]) == 2
    assert "--out must be a directory" in error_line(capsys)


def test_help_lists_power():
    assert cli.main(["power", "--help"]) == 0


def test_measured_meter_log_end_to_end(capsys, fake_model, tmp_path):
    """A meter logging a steady 6 W every 20 ms around now: measured figures, no estimate labels."""
    import time

    now = time.time()
    log = tmp_path / "meter.csv"
    log.write_text("timestamp,board_in\n" + "".join(f"{now - 1 + 0.02 * i:.3f},6.0\n" for i in range(1500)))
    assert power(tmp_path, "--board", "pynq-z2", "--source", f"csv:{log}", "--idle", "0.2", "--no-plot") == 0
    out = capsys.readouterr().out
    assert "estimate" not in out.lower() and "budget        PASS" in out
    report = json.loads((tmp_path / "out" / "power.json").read_text())
    assert report["estimate"] is False and report["label"] == "measured" and "estimate_constants" not in report
    assert report["budget"]["rails"] == ["board_in"]
    assert report["total"]["mean_w"] == pytest.approx(6.0) and report["total"]["above_idle_w"] == pytest.approx(0.0)
    assert report["idle"]["seconds"] == pytest.approx(0.2, abs=0.1)


def test_unknown_device_named_before_the_plot_check(capsys, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert power(tmp_path, "--device", "nope") == 2
    line = error_line(capsys)
    assert "unknown device 'nope'" in line and "matplotlib" not in line
