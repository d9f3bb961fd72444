"""One table of board facts (hw/boards/facts.py): every consumer reads it, so each board has one answer.

``mmfree bench`` and ``mmfree power`` on the golden device model the design point at its clock, the Xilinx flows
build it (and the committed generated files say so), the ECP5 builds' defaults and committed bitstreams are it,
the power estimate's idle draw and families come from it, and the report's rows are it (tests/test_bench_report.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from host import cli, perf
from host.power import boards as power_boards
from host.power.estimate import FAMILIES, IDLE, MEMORIES
from host.power.sources import make_source
from hw.boards import ecp5, facts
from hw.boards.facts import BOARDS

REPO = Path(__file__).resolve().parents[1]


def test_every_consumer_knows_the_same_boards():
    assert perf.BOARDS is BOARDS
    assert list(power_boards.BOARDS) == list(BOARDS) and list(IDLE) == list(BOARDS)
    assert power_boards.DEFAULT_BOARD == facts.DEFAULT_BOARD in BOARDS
    from hw.boards import xilinx
    assert set(xilinx.BOARDS) | set(ecp5.BOARDS) == set(BOARDS) and not set(xilinx.BOARDS) & set(ecp5.BOARDS)


@pytest.mark.parametrize("key", list(BOARDS))
def test_facts_are_complete_and_sourced(key):
    f = BOARDS[key]
    assert f.key == key and f.family in FAMILIES and f.memory in MEMORIES
    assert 0 < f.port_gbs <= f.dram_gbs and f.ports >= 1 and f.dram_mb > 0
    d = f.design
    assert d.lanes % d.channels == 0 and d.bus_bits % 32 == 0 and d.fmax_mhz > 0
    assert 0 < f.idle.pl_w < f.idle.total_w and f.idle.total_source and f.idle.pl_source
    needed = {"part", "dram_mb", "dram_gbs", "port_gbs", "ports", "design"} | ({"port_bits"} if f.port_bits else set())
    assert needed <= {k for k, v in f.sources.items() if v}, key
    assert isinstance(d, perf.BuildParams)    # the one build type (hw.params)
    assert perf.BuildParams(**d.device_kwargs()) == d


@pytest.mark.parametrize("key", list(BOARDS))
def test_power_reads_the_table(key):
    f, pb = BOARDS[key], power_boards.get_board(key)
    assert (pb.title, pb.family, pb.memory) == (f.title, f.family, f.memory)
    assert (IDLE[key]["total"].value, IDLE[key]["pl"].value) == (f.idle.total_w, f.idle.pl_w)
    src = make_source("estimate", pb)   # no device: the board's design point
    assert src.fmax_hz == f.design.fmax_mhz * 1e6 and src.bus_bits == f.design.bus_bits


@pytest.mark.parametrize("key", ["pynq-z2", "kv260", "zcu104", "u55c"])
def test_xilinx_flow_builds_the_design_point(key):
    from hw.boards import xilinx

    f, b = BOARDS[key], xilinx.BOARDS[key]
    d = f.design
    assert (b.title, b.part, b.fclk_mhz, b.hp_bits, b.hp_ports) == (f.title, f.part, d.fmax_mhz, f.port_bits,
                                                                  d.channels)
    core = xilinx.core_params(key)
    assert core.triple == d.triple and core.quant_lanes == d.quant_lanes and core.fmax_mhz == d.fmax_mhz
    # the committed generated files are this build (regenerate with python -m hw.boards.xilinx generate <board>)
    params = json.loads((REPO / "bitstreams" / key / "params.json").read_text())
    assert params["fclk_mhz"] == d.fmax_mhz and params["part"] == f.part and params["title"] == f.title
    assert {k: params["core"][k] for k in ("lanes", "channels", "bus_bits", "quant_lanes")} == {
        k: getattr(core, k) for k in ("lanes", "channels", "bus_bits", "quant_lanes")}


@pytest.mark.parametrize("key", list(ecp5.BOARDS))
def test_ecp5_default_build_and_bitstream_are_the_design_point(key):
    f = BOARDS[key]
    d = f.design
    chosen = ecp5.CHOSEN[key]
    assert (chosen["lanes"], chosen["quant_lanes"], chosen["freq_mhz"]) == (d.lanes, d.quant_lanes, d.fmax_mhz)
    p = ecp5.DEFAULT_PARAMS
    assert (p["channels"], p["bus_bits"], p["epilogue_folded"]) == (d.channels, d.bus_bits, d.epilogue_folded)
    assert ecp5.BOARDS[key].device == f.part
    rep = json.loads((REPO / "bitstreams" / key / "report.json").read_text())
    assert (rep["lanes"], rep["channels"], rep["bus_bits"], rep["target_mhz"], rep["device"]) == (
        d.lanes, d.channels, d.bus_bits, d.fmax_mhz, f.part)
    assert rep["params"]["quant_lanes"] == d.quant_lanes and rep["params"]["epilogue_folded"] == d.epilogue_folded
    assert rep["timing_met"] and rep["fmax_mhz"] >= d.fmax_mhz


@pytest.mark.parametrize("key", ["kv260", "ulx3s-85f"])
def test_bench_and_power_model_the_design_point(key, tmp_path, capsys):
    """The issue's example: on the KV260, ``mmfree bench`` (64 lanes at 300 MHz), ``mmfree power`` (100 MHz)
    and the flow (256 lanes x 4 channels at 200 MHz) disagreed. Now bench's clock and build, the power
    estimate's clock and beat width, and the flow's (above) are the table's design point."""
    pytest.importorskip("matplotlib")
    d = BOARDS[key].design
    out = tmp_path / "bench.json"
    assert cli.main(["bench", "--device", "golden", "--tokens", "2", "--board", key, "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["fmax_mhz"] == d.fmax_mhz
    assert {k: rep["build"][k] for k in d.device_kwargs()} == d.device_kwargs()
    assert cli.main(["power", "--device", "golden", "--board", key, "--tokens", "2", "--prompt", "def",
                     "--no-plot", "--out", str(tmp_path / "power")]) == 0
    capsys.readouterr()
    power = json.loads((tmp_path / "power" / "power.json").read_text())
    assert power["source"]["fmax_mhz"] == rep["fmax_mhz"] and power["source"]["bus_bits"] == d.bus_bits
    # --option still sets the golden device's build
    assert cli.main(["bench", "--device", "golden", "--tokens", "1", "--board", key, "--option", "lanes=32",
                     "--option", "channels=1", "--json", str(out)]) == 0
    capsys.readouterr()
    assert json.loads(out.read_text())["build"]["lanes"] == 32
