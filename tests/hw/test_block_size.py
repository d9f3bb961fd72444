"""The fetcher's channel-0 block-size arithmetic (``hw.top.block_rows``, ``block_sections``): no divider on
the path, the same sizes as the divider form (fast: a combinational module in Amaranth's simulator)."""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from hw.top import block_rows, block_sections


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("per", [4, 5])
def test_block_size_without_divider(channels, per):
    """The fetcher's channel-0 block size (hw.top.block_rows, block_sections, as the core wires them: 16-bit
    fields, a 33-bit registered sum) equals the divider form ceil(ceil(ceil(n / C) * k / per) / 64) on edge and
    random (n, k); the bus width only scales it by 64 // beat_bytes."""
    n, k = Signal(16), Signal(16)
    blk = Signal(33)
    sections = Signal(32)
    m = Module()
    m.d.comb += [blk.eq(block_rows(n, channels) * k + (64 * per - 1)), sections.eq(block_sections(blk, per))]
    rng = np.random.default_rng(channels * 10 + per)
    cases = [(0, 0), (1, 1), (65535, 65535), (65535, 1), (1, 65535), (3, 8192), (2816, 1024), (1024, 2816)]
    cases += [tuple(int(v) for v in rng.integers(0, 65536, 2)) for _ in range(300)]
    cases += [tuple(int(v) for v in rng.integers(0, 4096, 2)) for _ in range(300)]
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

    for (a, b), s in zip(cases, got, strict=True):
        trits = ceil(a, channels) * b
        assert s == ceil(ceil(trits, per), 64) == ceil(trits, 64 * per), (a, b)
