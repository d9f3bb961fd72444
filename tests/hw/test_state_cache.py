"""hw.state_cache.StateCache on its own: the swaps a program's layer order asks for, against a dict of DRAM rows
(the whole core with the state in DRAM: tests/hw/test_top.py::test_state_in_dram_bit_exact), and the layout of
hw.state_layout."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from hw.state_cache import StateCache
from hw.state_layout import StateGeometry, state_beats

H, L = 5, 4     # an odd row: its last beat carries one element and a zero


def _run(script):
    """Run ``script(ctx, dut, rows, log)`` against a StateCache served from ``rows`` ({(bank, layer): [int32]}),
    ``log`` collecting every command as (write, bank, layer)."""
    dut = StateCache(max_hidden=H, max_layers=L)
    rows: dict[tuple[int, int], list[int]] = {}
    log: list[tuple[int, int, int]] = []
    beats = state_beats(H)

    async def serve(ctx):
        ctx.set(dut.cmd.ready, 1)
        while True:
            _, _, valid, write, bank, layer = await ctx.tick().sample(
                dut.cmd.valid, dut.cmd.payload.write, dut.cmd.payload.bank, dut.cmd.payload.layer)
            if not valid:
                continue
            ctx.set(dut.cmd.ready, 0)
            log.append((write, bank, layer))
            if write:
                got = []
                ctx.set(dut.wb.tready, 1)
                while len(got) < beats:
                    _, _, v, d = await ctx.tick().sample(dut.wb.tvalid, dut.wb.tdata)
                    if v:
                        got.append(d)
                ctx.set(dut.wb.tready, 0)
                elems = [(d >> (32 * k)) & 0xFFFFFFFF for d in got for k in (0, 1)]
                rows[(bank, layer)] = [e - (1 << 32) if e >> 31 else e for e in elems[:H]]
            else:
                row = rows[(bank, layer)] + [0] * (2 * beats - H)
                for j in range(beats):
                    ctx.set(dut.fill.tdata, (row[2 * j] & 0xFFFFFFFF) | (row[2 * j + 1] & 0xFFFFFFFF) << 32)
                    ctx.set(dut.fill.tvalid, 1)
                    await ctx.tick().until(dut.fill.tready)
                ctx.set(dut.fill.tvalid, 0)
            ctx.set(dut.cmd.ready, 1)

    async def bench(ctx):
        await script(ctx, dut, rows, log)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(serve, background=True)
    sim.add_testbench(bench)
    sim.run()
    return rows, log


async def _enter(ctx, dut, layer, *, end=False, uses_state=True):
    """The sequencer's side: present the next instruction, swap if the cache asks, wait until it is done."""
    ctx.set(dut.layer, layer)
    ctx.set(dut.end, end)
    ctx.set(dut.uses_state, uses_state)
    if ctx.get(dut.need):
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        await ctx.tick().until(~dut.busy)
    assert not ctx.get(dut.need)


async def _write_row(ctx, dut, values):
    for i, v in enumerate(values):
        ctx.set(dut.wr_new.addr, i)
        ctx.set(dut.wr_new.data, v)
        ctx.set(dut.wr_new.en, 1)
        await ctx.tick()
    ctx.set(dut.wr_new.en, 0)


async def _read(ctx, port, n):
    out = []
    for i in range(n):
        ctx.set(port.addr, i)
        ctx.set(port.en, 1)
        await ctx.tick()
        out.append(ctx.get(port.data))
    ctx.set(port.en, 0)
    return out


def test_swaps_follow_the_layers():
    """Two tokens. Token 0 (state invalid: no STATE_OLD fills) writes layers 0 and 1, returns to layer 0 (its
    STATE_NEW row comes back from bank 1, what it wrote), and ends (the dirty row written back). Token 1, bank 1
    committed: layer 0's STATE_OLD row is filled from bank 1 and reads what token 0 wrote."""
    rng = np.random.default_rng(2)
    r0, r1, r0b = (rng.integers(-2**31, 2**31, H).tolist() for _ in range(3))
    seen = {}

    async def script(ctx, dut, rows, log):
        ctx.set(dut.bank, 0)
        ctx.set(dut.state_valid, 0)
        await _enter(ctx, dut, 0)
        assert log == []                               # nothing to write back, nothing valid to fill
        assert await _read(ctx, dut.rd_old, H) == [0] * H   # the state reads as zero
        await _write_row(ctx, dut, r0)
        await _enter(ctx, dut, 1, uses_state=False)    # an instruction that does not touch the state: no swap
        assert log == []
        await _enter(ctx, dut, 1)
        assert log == [(1, 1, 0)] and rows[(1, 0)] == r0
        await _write_row(ctx, dut, r1)
        await _enter(ctx, dut, 0)                      # back to layer 0: layer 1 out, layer 0's STATE_NEW in
        assert log[1:] == [(1, 1, 1), (0, 1, 0)]
        seen["new0"] = await _read(ctx, dut.rd_new, H)
        await _write_row(ctx, dut, r0b)
        await _enter(ctx, dut, 0, end=True)            # END_TOKEN: the dirty row out, no fill
        assert log[3:] == [(1, 1, 0)] and rows[(1, 0)] == r0b
        # the commit: bank 1 current, the state valid, the cache flushed
        ctx.set(dut.flush, 1)
        await ctx.tick()
        ctx.set(dut.flush, 0)
        ctx.set(dut.bank, 1)
        ctx.set(dut.state_valid, 1)
        await _enter(ctx, dut, 0)
        assert log[4:] == [(0, 1, 0)]                  # STATE_OLD from the committed bank; STATE_NEW not yet written
        seen["old0"] = await _read(ctx, dut.rd_old, H)

    _run(script)
    assert seen["new0"] == r0
    assert seen["old0"] == r0b


def test_swap_cycles():
    """A swap's length with a board that answers at once (the server above): the constants host.perf's
    state_swap_cycles reads (StateCache.SWAP_CYCLES, WRITE_BACK_CYCLES, FILL_CYCLES), at 2 cycles a beat."""
    two = 2 * state_beats(H)
    took = {}

    async def timed(ctx, dut, layer, name):
        ctx.set(dut.layer, layer)
        ctx.set(dut.uses_state, 1)
        assert ctx.get(dut.need)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        n = 1
        while True:
            _, _, busy = await ctx.tick().sample(dut.busy)
            n += 1
            if not busy:
                break
        took[name] = n             # the sequencer, in STATE_SWAP, sees busy low in the last: DISPATCH next

    async def script(ctx, dut, rows, log):
        ctx.set(dut.bank, 1)
        ctx.set(dut.state_valid, 0)
        await timed(ctx, dut, 0, "none")
        await _write_row(ctx, dut, [1] * H)
        await timed(ctx, dut, 1, "write_back")
        ctx.set(dut.state_valid, 1)
        rows[(1, 2)] = [2] * H
        await timed(ctx, dut, 2, "fill")
        await _write_row(ctx, dut, [3] * H)
        rows[(1, 3)] = [4] * H
        await timed(ctx, dut, 3, "both")

    _run(script)
    base, wb, fill = StateCache.SWAP_CYCLES, StateCache.WRITE_BACK_CYCLES, StateCache.FILL_CYCLES
    assert took == {"none": base, "write_back": base + two + wb, "fill": base + two + fill,
                    "both": base + 2 * two + wb + fill}


def test_geometry():
    g = StateGeometry(max_hidden=1024, max_layers=24)
    assert (g.row_bytes, g.row_stride, g.bank_stride, g.region_bytes) == (4096, 4096, 32 * 4096, 2 * 32 * 4096)
    assert g.base(512 << 20) == (512 << 20) - g.region_bytes
    assert g.offset(1, 3) == g.bank_stride + 3 * 4096
    odd = StateGeometry(max_hidden=H, max_layers=L)
    assert (state_beats(H), odd.row_bytes, odd.row_stride) == (3, 24, 32)
    with pytest.raises(ValueError, match="cannot hold"):
        g.base(g.region_bytes - 1)


def test_too_many_layers_is_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)   # the refused instance is never elaborated
        with pytest.raises(ValueError, match="max_layers"):
            StateCache(max_hidden=8, max_layers=512)
        gc.collect()
