"""AXI4-Lite register block: ID block, status, counters and CTRL strobes, in the Amaranth simulator."""

import gc
import warnings

import pytest
from amaranth.back import verilog
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from hw import isa
from hw.isa import REGISTER_MAP, Counter, Ctrl, Status
from hw.regs import RegisterBlock

pytestmark = pytest.mark.filterwarnings("error")

ID = isa.id_block_values(lanes=64, channels=2, bus_bits=128, packings=list(isa.TritPacking), quant_lanes=8)


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


async def _write(ctx, bus, addr, data, *, data_first=False):
    if data_first:
        ctx.set(bus.wdata, data)
        ctx.set(bus.wvalid, 1)
        await ctx.tick()
    ctx.set(bus.awaddr, addr)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wdata, data)
    ctx.set(bus.wvalid, 1)
    ctx.set(bus.bready, 1)
    await ctx.tick().until(bus.bvalid)
    ctx.set(bus.awvalid, 0)
    ctx.set(bus.wvalid, 0)
    await ctx.tick()
    ctx.set(bus.bready, 0)


def test_id_block_status_counters_and_ctrl():
    dut = RegisterBlock(id_values=ID)
    seen = {"clear": 0, "abort": 0}

    async def watcher(ctx):
        async for _clk, _rst, clear, abort in ctx.tick().sample(dut.host.clear, dut.host.abort):
            seen["clear"] += clear
            seen["abort"] += abort

    async def bench(ctx):
        bus = dut.axil
        for off, val in ID.items():
            assert await _read(ctx, bus, off) == val
        assert await _read(ctx, bus, REGISTER_MAP.ID_MAGIC) == int.from_bytes(b"MMFA", "little")
        assert await _read(ctx, bus, REGISTER_MAP.ID_VERSION) == 2   # ISA version 2 (hw.isa.ISA_VERSION)
        ctx.set(dut.host.error, 1)
        ctx.set(dut.host.busy, 1)
        ctx.set(dut.host.error_cause, isa.ErrorCause.INSTR_CRC.value)
        ctx.set(dut.host.error_where, 17)
        ctx.set(dut.counters.cycles, (5 << 32) | 7)
        assert await _read(ctx, bus, REGISTER_MAP.STATUS) == (Status.BUSY | Status.ERROR).value
        assert await _read(ctx, bus, REGISTER_MAP.ERROR_CAUSE) == isa.ErrorCause.INSTR_CRC.value
        assert await _read(ctx, bus, REGISTER_MAP.ERROR_WHERE) == 17
        assert await _read(ctx, bus, REGISTER_MAP.counter(Counter.CYCLES)) == 7
        assert await _read(ctx, bus, REGISTER_MAP.counter(Counter.CYCLES) + 4) == 5
        assert await _read(ctx, bus, 0xFC) == 0  # unmapped
        await _write(ctx, bus, REGISTER_MAP.CTRL, Ctrl.CLEAR.value)
        await _write(ctx, bus, REGISTER_MAP.CTRL, Ctrl.ABORT.value, data_first=True)
        await _write(ctx, bus, REGISTER_MAP.ID_MAGIC, 0)  # read-only: ignored
        assert await _read(ctx, bus, REGISTER_MAP.ID_MAGIC) == ID[REGISTER_MAP.ID_MAGIC]
        await ctx.tick().repeat(3)
        assert seen == {"clear": 1, "abort": 1}

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.add_process(watcher)
    sim.run_until(2e-5)


def test_parameters_are_validated():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)  # rejected instances are never elaborated
        with pytest.raises(TypeError):
            RegisterBlock(id_values=[])
        with pytest.raises(ValueError, match="0x42"):
            RegisterBlock(id_values={0x42: 1})
        with pytest.raises(ValueError, match="addr_width"):
            RegisterBlock(id_values=ID, addr_width=6)
        gc.collect()


def test_converts_to_verilog():
    text = verilog.convert(RegisterBlock(id_values=ID), name="mmfree_regs")
    assert "axil__awaddr" in text and "axil__rdata" in text
