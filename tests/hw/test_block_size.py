"""The fetcher's channel-0 block-size arithmetic (``hw.top.block_rows``, ``block_sections``): no divider on
the path, the same sizes as the divider form (fast: a combinational module in Amaranth's simulator)."""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from host.image import channel_block_bytes
from hw.isa import TritPacking
from hw.top import block_rows, block_sections


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("per", [4, 5])
def test_block_size_without_divider(channels, per):
    """The fetcher's channel-0 block size (hw.top.block_rows, block_sections, as the core wires them: 16-bit
    fields, a 33-bit registered sum) equals host.image.channel_block_bytes / 64, ceil((ceil(ceil(n / C) * k /
    per) + 4) / 64) (the block's CRC word), on edge and random (n, k) with n, k >= 1; the bus width only scales it
    by 64 // beat_bytes."""
    n, k = Signal(16), Signal(16)
    blk = Signal(33)
    sections = Signal(32)
    m = Module()
    m.d.comb += [blk.eq(block_rows(n, channels) * k + (68 * per - 1)), sections.eq(block_sections(blk, per))]
    rng = np.random.default_rng(channels * 10 + per)
    cases = [(1, 1), (1, 64 * per), (1, 60 * per), (1, 61 * per - 1), (2, 30 * per),
             (65535, 65535), (65535, 1), (1, 65535), (3, 8192), (2816, 1024), (1024, 2816)]
    cases += [tuple(int(v) for v in rng.integers(1, 65536, 2)) for _ in range(300)]
    cases += [tuple(int(v) for v in rng.integers(1, 4096, 2)) for _ in range(300)]
    got = []

    async def bench(ctx):
        for a, b in cases:
            ctx.set(n, a)
            ctx.set(k, b)
            got.append(ctx.get(sections))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    def ceil(x, y):
        return -(-x // y)

    packing = TritPacking.BASE3 if per == 5 else TritPacking.BITS2
    for (a, b), s in zip(cases, got, strict=True):
        trits = ceil(a, channels) * b
        assert s == ceil(ceil(trits, per) + 4, 64), (a, b)
        if a < 4096:
            assert 64 * s == channel_block_bytes(a, b, channels, packing)[0], (a, b)
