"""The whole core in the Amaranth simulator: two tokens of a tiny model, bit-exact against the golden device."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from host.compiler import CompileOptions, calibrate, compile_model
from host.devices.golden import GoldenMachine, make_token_packet, parse_output_packet
from host.model import HGRNBitConfig, random_weights
from hw import numerics as nx
from hw.isa import TritPacking
from hw.top import Accelerator

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.slow]

TINY = HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28)


def _beats(raw: bytes, bus_bits: int) -> list[int]:
    bb = bus_bits // 8
    assert len(raw) % bb == 0
    return [int.from_bytes(raw[i:i + bb], "little") for i in range(0, len(raw), bb)]


def run_tokens(packing, lanes, bus_bits, ids, *, cfg=TINY, max_layers=2, timeout_cycles=400_000, **build):
    w = random_weights(cfg, seed=3, gamma_spread=1.0)
    fm = calibrate(w)
    image = compile_model(w, CompileOptions(formats=fm, packing=packing))
    gold = GoldenMachine(image)
    state = gold.init_state()
    packets, expected = [], []
    for pos, t in enumerate(ids):
        pk = make_token_packet(nx.to_fixed(w.embeddings[t], fm.residual), position=pos)
        res = gold.run_token(pk, state)
        state = res.state
        packets.append(pk)
        expected.append(res.output)
    dut = Accelerator(lanes=lanes, channels=1, bus_bits=bus_bits, quant_lanes=4, packing=packing,
                      max_hidden=32, max_intermediate=32, max_layers=max_layers, **build)
    got: list[bytes] = []

    async def feed(ctx):
        port = dut.s_axis_w0
        for pk in packets:
            for part in (pk, image):
                beats = _beats(part, bus_bits)
                for i, b in enumerate(beats):
                    ctx.set(port.tdata, b)
                    ctx.set(port.tlast, i == len(beats) - 1)
                    ctx.set(port.tvalid, 1)
                    await ctx.tick().until(port.tready)
                ctx.set(port.tvalid, 0)

    async def collect(ctx):
        out = dut.m_axis_out
        ctx.set(out.tready, 1)
        words = []
        for _ in range(timeout_cycles):
            await ctx.tick()
            if ctx.get(out.tvalid):
                words.append(ctx.get(out.tdata))
                if ctx.get(out.tlast):
                    got.append(b"".join(x.to_bytes(4, "little") for x in words))
                    words = []
                    if len(got) == len(packets):
                        return
        raise AssertionError(f"timeout: {len(got)} of {len(packets)} output packets")

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(feed, background=True)
    sim.add_testbench(collect)
    sim.run()
    return got, expected


@pytest.mark.parametrize("packing", list(TritPacking))
def test_two_tokens_bit_exact(packing):
    got, expected = run_tokens(packing, lanes=16, bus_bits=64, ids=[5, 17])
    for g, e in zip(got, expected, strict=True):
        a, b = parse_output_packet(g), parse_output_packet(e)
        assert (a.argmax, a.max_acc, a.scale_mant, a.scale_shift) == (b.argmax, b.max_acc, b.scale_mant,
                                                                       b.scale_shift)
        assert np.array_equal(a.logits_acc, b.logits_acc)
        assert g == e


def test_state_banks_with_max_layers_not_a_power_of_two():
    """max_layers = 3 and a 3-layer model: the second token reads the state the first committed in the other
    bank. The banks must be a power of two of layers apart (a stride of 3 layers put bank 1's last layer
    past the end of the state memory, so the second token read garbage)."""
    cfg = HGRNBitConfig(vocab_size=29, hidden_size=12, num_hidden_layers=3, intermediate_size=20)
    got, expected = run_tokens(TritPacking.BASE3, lanes=16, bus_bits=64, ids=[3, 7, 11], cfg=cfg, max_layers=3)
    assert got == expected


def test_shallow_weight_fifo_bit_exact():
    """8 lanes on a 64-bit channel (40 trits a beat) and a 16-beat weight FIFO: channel 0 runs ahead of the
    lanes until the FIFO is full, the fetcher waits for room, and the next instruction's header and constants
    still arrive in order."""
    got, expected = run_tokens(TritPacking.BASE3, lanes=8, bus_bits=64, ids=[5, 17], weight_fifo_beats=16)
    assert got == expected


@pytest.mark.parametrize("kw", [{"weight_fifo_beats": 8}, {"weight_fifo_beats": 0}, {"weight_fifo_beats": 2.0}])
def test_weight_fifo_depth_is_validated(kw):
    with pytest.raises((TypeError, ValueError), match="weight_fifo_beats"):
        Accelerator(**kw)
