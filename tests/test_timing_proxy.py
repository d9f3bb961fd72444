"""bench/timing_proxy.py's delay estimate on small hand-made netlists (no Yosys run)."""

import pytest

from bench.timing_proxy import CARRY_NS, CLK_TO_OUT_NS, COMB_NS, ROUTE_NS, SETUP_NS, _hw_line, analyse


def _cell(kind, src="", **ports):
    """A cell: ``ports`` maps a port name to (direction, bits)."""
    return {"type": kind, "parameters": {}, "attributes": {"src": src},
            "port_directions": {p: d for p, (d, _) in ports.items()},
            "connections": {p: b for p, (_, b) in ports.items()}}


def _netlist(cells):
    return {"modules": {"top": {"cells": cells, "netnames": {}}}}


def test_lut_chain_between_flip_flops():
    cells = {
        "ff_a": _cell("TRELLIS_FF", DI=("input", [1]), Q=("output", [2])),
        "lut_1": _cell("LUT4", "/x/hw/top.py:10.1-10.5", A=("input", [2]), Z=("output", [3])),
        "lut_2": _cell("LUT4", "/x/hw/top.py:11.1-11.5", A=("input", [3]), B=("input", [2]), Z=("output", [4])),
        "ff_b": _cell("TRELLIS_FF", "/x/hw/top.py:12.1-12.9", DI=("input", [4]), Q=("output", [5])),
    }
    r = analyse(_netlist(cells), top="top", limit_ns=3.0)
    want = CLK_TO_OUT_NS["TRELLIS_FF"] + 2 * (ROUTE_NS + COMB_NS["LUT4"]) + ROUTE_NS + SETUP_NS
    assert r["worst_ns"] == pytest.approx(want, abs=0.051)   # reported to 0.1 ns
    assert r["endpoints"] == 2 and r["over_limit"] == 1
    (g,) = r["groups"]
    assert g["endpoint"] == "top.py:12" and g["path"] == ["top.py:11", "top.py:10"] and g["endpoints"] == 1


def test_carry_chain_uses_the_dedicated_wire():
    n = 8   # eight CCU2C cells in a chain: one fabric entry, then CIN -> COUT hops
    cells = {"ff_a": _cell("TRELLIS_FF", DI=("input", [1]), Q=("output", [2]))}
    cin = 2
    for i in range(n):
        cells[f"c{i}"] = _cell("CCU2C", A0=("input", [2]), CIN=("input", [cin]), COUT=("output", [100 + i]))
        cin = 100 + i
    cells["ff_b"] = _cell("TRELLIS_FF", DI=("input", [cin]), Q=("output", [3]))
    r = analyse(_netlist(cells), top="top", limit_ns=100.0)
    want = CLK_TO_OUT_NS["TRELLIS_FF"] + ROUTE_NS + COMB_NS["CCU2C"] + (n - 1) * CARRY_NS + ROUTE_NS + SETUP_NS
    assert r["worst_ns"] == pytest.approx(want, abs=0.051)   # reported to 0.1 ns
    assert r["groups"] == []


def test_registered_multiplier_starts_a_path():
    mult = _cell("MULT18X18D", A0=("input", [2]), P0=("output", [3]))
    mult["parameters"]["REG_OUTPUT_CLK"] = "CLK0"
    cells = {"ff_a": _cell("TRELLIS_FF", DI=("input", [1]), Q=("output", [2])), "m": mult,
             "ff_b": _cell("TRELLIS_FF", DI=("input", [3]), Q=("output", [4]))}
    r = analyse(_netlist(cells), top="top")
    # ff_b sees the multiplier's clock-to-out, not ff_a's path through it
    want = CLK_TO_OUT_NS["MULT18X18D"] + ROUTE_NS + SETUP_NS   # not 6.95 ns through a combinational one
    assert r["worst_ns"] == pytest.approx(want, abs=0.051)


def test_hw_line():
    assert _hw_line("/work/main/hw/epilogue.py:534.9-534.40|/x/amaranth/lib/data.py:3") == "epilogue.py:534"
    assert _hw_line("/x/share/techmap.v:339.28-339.64") is None


def test_cli_reads_a_board_netlist(tmp_path):
    """``--netlist`` takes a board build's ``top.json`` (top module ``top``), not only the core's."""
    import json

    from bench.timing_proxy import main

    cells = {
        "ff_a": _cell("TRELLIS_FF", DI=("input", [1]), Q=("output", [2])),
        "lut_1": _cell("LUT4", "/x/hw/top.py:10.1-10.5", A=("input", [2]), Z=("output", [3])),
        "ff_b": _cell("TRELLIS_FF", "/x/hw/top.py:12.1-12.9", DI=("input", [3]), Q=("output", [4])),
    }
    net = tmp_path / "top.json"
    net.write_text(json.dumps(_netlist(cells)))
    out = tmp_path / "proxy.json"
    assert main(["--netlist", str(net), "--limit-ns", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["netlist"] == str(net) and r["endpoints"] == 2 and r["worst_ns"] > 1
    assert r["groups"][0]["endpoint"] == "top.py:12"
