# amaranth: UnusedElaboratable=no
"""Banked vector buffer: narrow and wide writes and reads agree with a flat array model."""

import random

import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator

from hw.vbuf import VectorBuffer

pytestmark = pytest.mark.filterwarnings("error")


@pytest.mark.parametrize("depth,banks,wg,rg", [(37, 8, 8, 4), (20, 4, 2, 4), (16, 2, 1, 2), (9, 1, 1, 1),
                                               (12, 4, 4, 1), (10, 2, None, None)])
def test_model(depth, banks, wg, rg):
    """Groups of one are ports too (a one-lane quantizer reads its source through ``rd_wide`` of one element;
    a 32-bit bus writes constants through ``wr_wide`` of one); a group of None is no port."""
    dut = VectorBuffer(depth=depth, banks=banks, write_group=wg, read_group=rg)
    assert hasattr(dut, "wr_wide") == (wg is not None) and hasattr(dut, "rd_wide") == (rg is not None)
    rng = random.Random(depth * banks)
    model = [0] * depth

    async def bench(ctx):
        for _ in range(60):
            op = rng.randrange(4)
            if op == 0:
                a, v = rng.randrange(depth), rng.randrange(-2**31, 2**31)
                ctx.set(dut.wr.addr, a)
                ctx.set(dut.wr.data, v)
                ctx.set(dut.wr.en, 1)
                await ctx.tick()
                ctx.set(dut.wr.en, 0)
                model[a] = v
            elif op == 1 and wg is not None:
                g = rng.randrange(-(-depth // wg))
                vals = [rng.randrange(-2**31, 2**31) for _ in range(wg)]
                ctx.set(dut.wr_wide.addr, g)
                ctx.set(dut.wr_wide.data, vals)
                ctx.set(dut.wr_wide.en, 1)
                await ctx.tick()
                ctx.set(dut.wr_wide.en, 0)
                for j, v in enumerate(vals):
                    if g * wg + j < depth:
                        model[g * wg + j] = v
            elif op == 2:
                a = rng.randrange(depth)
                ctx.set(dut.rd.addr, a)
                await ctx.tick().repeat(VectorBuffer.READ_LATENCY)
                assert ctx.get(dut.rd.data) == model[a]
            elif op == 3 and rg is not None:
                g = rng.randrange(-(-depth // rg))
                ctx.set(dut.rd_wide.addr, g)
                await ctx.tick().repeat(VectorBuffer.READ_LATENCY)
                got = [ctx.get(dut.rd_wide.data[j]) for j in range(rg)]
                want = [model[g * rg + j] if g * rg + j < depth else got[j] for j in range(rg)]
                assert got == want

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("depth,wg,rg", [(37, 8, 4), (2560, 4, 8), (1, 1, 1), (32000, 16, 2)])
def test_port_widths(depth, wg, rg):
    """The ports' address widths are what ``addr_width_for`` says without an instance (element index:
    ``ceil(log2(depth))``, at least 1; group index: ``ceil(log2(ceil(depth / group)))``), and the read
    latency is one cycle (a read in the cycle after its address is checked by ``test_model``)."""
    dut = VectorBuffer(depth=depth, banks=max(wg, rg), write_group=wg, read_group=rg)
    assert len(dut.rd.addr) == len(dut.wr.addr) == dut.addr_width == VectorBuffer.addr_width_for(depth)
    assert dut.addr_width == max(1, (depth - 1).bit_length())
    assert len(dut.wr_wide.addr) == VectorBuffer.addr_width_for(depth, wg) == max(1, (-(-depth // wg) - 1).bit_length())
    assert len(dut.rd_wide.addr) == VectorBuffer.addr_width_for(depth, rg)
    assert VectorBuffer.READ_LATENCY == 1


def test_verilog():
    assert "rd_wide__data" in verilog.convert(VectorBuffer(depth=100, banks=8, write_group=4, read_group=8))
