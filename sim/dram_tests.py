"""cocotb tests of the DRAM bench (``sim/test_dram.py`` builds it and runs them; parameters in
``MMFREE_DRAM_PARAMS``, results to ``MMFREE_DRAM_RESULT``).

Streams are driven and sampled at the rising edge (a transfer is ``valid & ready`` as seen at the edge); the
payloads are packed with the layouts of ``hw.dram_reader``.
"""

from __future__ import annotations

import json
import os

import cocotb
import numpy as np
from amaranth.lib import data
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge, with_timeout
from cocotb.utils import get_sim_time

from hw.dram import sim_monitor_layout
from hw.dram_reader import beat_layout, dram_request_layout

CLOCK_NS = 20          # 50 MHz, the ULX3S config's controller clock
BYTE_ADDR_WIDTH = 25   # 32 MiB


def monitor(dut) -> dict:
    m = data.Const(sim_monitor_layout(), int(dut.monitor.value))
    return {name: int(m[name]) for name in sim_monitor_layout().members}


async def request(dut, prefix: str, base: int, length: int) -> None:
    getattr(dut, f"{prefix}__payload").value = dram_request_layout(BYTE_ADDR_WIDTH).const(
        {"base": base, "length": length}).as_bits()
    getattr(dut, f"{prefix}__valid").value = 1
    while True:
        await RisingEdge(dut.clk)
        if getattr(dut, f"{prefix}__ready").value:
            break
    getattr(dut, f"{prefix}__valid").value = 0


async def write(dut, base: int, payload: bytes) -> dict:
    beats = [int.from_bytes(payload[i:i + 8], "little") for i in range(0, len(payload), 8)]
    before, t0 = monitor(dut), get_sim_time("ns")
    dut.sel.value = 0
    await request(dut, "wr_req", base, len(payload))
    i = 0
    dut.wr_i__payload.value = beats[0]
    dut.wr_i__valid.value = 1
    while i < len(beats):
        await RisingEdge(dut.clk)
        assert not dut.wr_error.value, "writer: the controller asked for data the writer did not have"
        if dut.wr_i__ready.value:
            i += 1
            if i < len(beats):
                dut.wr_i__payload.value = beats[i]
    dut.wr_i__valid.value = 0
    while dut.wr_busy.value:
        await RisingEdge(dut.clk)
    await ClockCycles(dut.clk, 64)   # the last writes reach the model
    after = monitor(dut)
    return {"bytes": len(payload), "cycles": round((get_sim_time("ns") - t0) / CLOCK_NS),
            "wr": after["wr_count"] - before["wr_count"], "mismatches": 0}


async def read(dut, base: int, payload: bytes, rng, stall: float) -> dict:
    layout = beat_layout(64)
    want = [int.from_bytes(payload[i:i + 8], "little") for i in range(0, len(payload), 8)]
    before = monitor(dut)
    dut.sel.value = 1
    dut.rd_o__ready.value = 0
    await request(dut, "rd_req", base, len(payload))
    got, lasts = [], []
    ready = rng.random() >= stall
    dut.rd_o__ready.value = ready
    while len(got) < len(want):
        await RisingEdge(dut.clk)
        assert not dut.rd_error.value, f"reader timed out after {len(got)} beats"
        if ready and dut.rd_o__valid.value:
            beat = data.Const(layout, int(dut.rd_o__payload.value))
            got.append(int(beat.data))
            lasts.append(bool(beat.last))
        ready = rng.random() >= stall
        dut.rd_o__ready.value = ready
    dut.rd_o__ready.value = 0
    await FallingEdge(dut.clk)
    assert not dut.rd_busy.value, "reader still busy after its last beat"
    cycles = int(dut.rd_cycles.value)
    after = monitor(dut)
    assert lasts == [i == len(want) - 1 for i in range(len(want))], "last not on exactly the final beat"
    return {"bytes": len(payload), "cycles": cycles, "mismatches": sum(g != w for g, w in zip(got, want, strict=True)),
            **{k.removesuffix("_count"): after[k] - before[k] for k in after if k.endswith("_count")}}


@cocotb.test()
async def round_trip(dut):
    p = json.loads(os.environ["MMFREE_DRAM_PARAMS"])
    rng = np.random.default_rng(p["seed"])
    payload = rng.integers(0, 256, size=p["length"], dtype=np.uint8).tobytes()
    Clock(dut.clk, CLOCK_NS, unit="ns").start()
    for name in ("wr_req__valid", "wr_i__valid", "rd_req__valid", "rd_o__ready", "sel"):
        getattr(dut, name).value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 8)
    dut.rst.value = 0
    t0 = get_sim_time("ns")
    await with_timeout(RisingEdge(dut.init_done), 60000 * CLOCK_NS, "ns")
    init_cycles = round((get_sim_time("ns") - t0) / CLOCK_NS)
    assert not dut.init_error.value, "init_error after the power-up sequence"

    result = {"init_cycles": init_cycles}
    result["write"] = await write(dut, p["base"], payload)
    result["read_backpressure"] = await read(dut, p["base"], payload, rng, p["backpressure"])
    result["read_full_rate"] = await read(dut, p["base"], payload, rng, 0.0)
    result["ref_max_gap"] = monitor(dut)["ref_max_gap"]
    result["totals"] = monitor(dut)
    with open(os.environ["MMFREE_DRAM_RESULT"], "w") as f:
        json.dump(result, f, indent=1)
    for phase in ("read_backpressure", "read_full_rate"):
        assert result[phase]["mismatches"] == 0, f"{phase}: {result[phase]['mismatches']} beats differ"
