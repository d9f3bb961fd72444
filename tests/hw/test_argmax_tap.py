"""ArgmaxTap (hw/argmax_tap.py) in the Amaranth simulator: output packets built by
``host.protocol.make_output_packet`` (good ones, and ones broken on purpose) in, with idle cycles and
backpressure; packets of tokens that asked for logits must come out unchanged, the others as
(position, argmax, flags)."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from host.protocol import make_output_packet, parse_output_packet
from hw import isa
from hw.argmax_tap import SUMMARY_WORDS, ArgmaxTap, TapFlags
from tests.hw.streams import stream_get, stream_put

pytestmark = pytest.mark.filterwarnings("error")


def words_of(raw: bytes) -> list[int]:
    return [int.from_bytes(raw[i:i + 4], "little") for i in range(0, len(raw), 4)]


def packet(rng, n_logits, *, position, argmax):
    acc = rng.integers(-(1 << 31), 1 << 31, size=n_logits)
    return make_output_packet(acc, position=position, argmax=argmax, max_acc=int(acc.max()) if n_logits else 0,
                              scale_mant=12345, scale_shift=20)


def reseal(raw: bytes) -> bytes:
    """``raw`` with its CRC word recomputed (a packet broken elsewhere than in its CRC)."""
    return raw[:-4] + isa.crc32_words(raw[:-4]).to_bytes(4, "little")


def run_tap(packets, *, idle=0.0, stall=0.0, seed=0):
    """``packets``: (words, argmax_only) each, sent back to back; returns the words that came out, per
    packet (the passed packet, or its summary), as (data, last) lists."""
    rng = np.random.default_rng(seed)
    dut = ArgmaxTap()
    out = []

    async def producer(ctx):
        for words, argmax_only in packets:
            ctx.set(dut.argmax_only, argmax_only)
            for k, w in enumerate(words):
                await stream_put(ctx, dut.i, {"data": w, "last": k == len(words) - 1}, idle=idle, rng=rng)

    async def consumer(ctx):
        for words, argmax_only in packets:
            n = SUMMARY_WORDS if argmax_only else len(words)
            got = []
            for _ in range(n):
                p = await stream_get(ctx, dut.o, stall=stall, rng=rng, timeout=200)
                got.append((int(p.data), bool(p.last)))
            out.append(got)
        for _ in range(20):   # nothing more
            ctx.set(dut.o.ready, 1)
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            assert not valid

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return out


@pytest.mark.parametrize("idle, stall", [(0.0, 0.0), (0.4, 0.0), (0.0, 0.6), (0.5, 0.5)])
def test_pass_and_reduce(idle, stall):
    rng = np.random.default_rng(int(10 * idle + 100 * stall))
    cases = []   # (raw, argmax_only)
    for k, n in enumerate([0, 0, 37, 4, 0, 16, 0]):
        raw = packet(rng, n, position=[0, (1 << 32) - 1, 5, 9, 4000, 2, 3][k], argmax=int(rng.integers(0, 4096)))
        cases.append((raw, k % 3 != 2))   # a logits packet reduced (37), argmax-only ones passed through too
    got = run_tap([(words_of(raw), ao) for raw, ao in cases], idle=idle, stall=stall, seed=1)
    for (raw, argmax_only), words in zip(cases, got, strict=True):
        if argmax_only:
            p = parse_output_packet(raw)
            assert words == [(p.position, False), (p.argmax, False), (0, True)]
        else:
            w = words_of(raw)
            assert words == [(x, k == len(w) - 1) for k, x in enumerate(w)]


def test_flags():
    rng = np.random.default_rng(3)
    good = packet(rng, 0, position=7, argmax=1234)
    bad_crc = good[:-1] + bytes([good[-1] ^ 1])
    bad_magic = reseal(good[:32] + b"MMFX" + good[36:])
    logits = packet(rng, 5, position=8, argmax=3)
    big = packet(rng, 20, position=9, argmax=4)
    assert len(big) == 128
    short = reseal(big[:32] + big[-32:])   # a section of logits missing
    aborted = b"".join(int(x).to_bytes(4, "little") for x in (11, 22, 33, isa.OUTPUT_ABORT_WORD))
    cases = [(bad_crc, TapFlags.CRC), (bad_magic, TapFlags.MAGIC), (good, 0), (short, TapFlags.LENGTH),
             (aborted, TapFlags.ABORT | TapFlags.CRC | TapFlags.MAGIC | TapFlags.LENGTH), (logits, 0)]
    got = run_tap([(words_of(raw), True) for raw, _ in cases], idle=0.2, stall=0.3, seed=2)
    for (_raw, want), words in zip(cases, got, strict=True):
        assert words[2] == (int(want), True), f"flags {TapFlags(words[2][0])!r}, expected {TapFlags(want)!r}"
    assert got[2][:2] == [(7, False), (1234, False)]
    assert got[5][:2] == [(8, False), (3, False)]


def test_pass_through_is_combinational():
    """A passed packet moves a word per cycle with no added latency."""
    dut = ArgmaxTap()

    async def tb(ctx):
        ctx.set(dut.argmax_only, 0)
        ctx.set(dut.o.ready, 1)
        for k in range(5):
            ctx.set(dut.i.payload, {"data": 100 + k, "last": k == 4})
            ctx.set(dut.i.valid, 1)
            assert ctx.get(dut.o.valid) and ctx.get(dut.i.ready) and ctx.get(dut.o.payload.data) == 100 + k
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("kw, exc", [({"count_bits": 4}, ValueError), ({"count_bits": 8.0}, TypeError)])
def test_parameters_are_checked(kw, exc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(exc):
            ArgmaxTap(**kw)
        gc.collect()
