"""The whole core in the Amaranth simulator: tokens of a tiny model, bit-exact against the golden device
(also low-energy tokens, where the epsilon terms move the scales, quantize ties in both signs, and random
``ssq_bias`` values of every magnitude: ``tests/hw/stimulus.py``)."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from host.compiler import CompileOptions, calibrate, compile_model
from host.devices.golden import GoldenMachine
from host.model import HGRNBitConfig, random_weights
from host.protocol import make_token_packet, parse_output_packet
from hw import numerics as nx
from hw.isa import TritPacking
from hw.params import BuildParams
from hw.state_cache import state_beats
from hw.top import Accelerator
from tests.hw.stimulus import biased_image, low_energy, tie_token

pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.slow]

TINY = HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28)


def _beats(raw: bytes, bus_bits: int) -> list[int]:
    bb = bus_bits // 8
    assert len(raw) % bb == 0
    return [int.from_bytes(raw[i:i + bb], "little") for i in range(0, len(raw), bb)]


def run_tokens(packing, lanes, bus_bits, ids, *, cfg=TINY, max_layers=2, timeout_cycles=400_000, numerics=False,
               biased=False, transfers=None, **build):
    """Tokens ``ids`` (consecutive, state carried) through the core and the golden device: (outputs, expected).

    ``numerics``: after the ``ids``, a low-energy token and a token with quantize ties (:func:`low_energy`,
    :func:`tie_token`); ``biased``: the image with random ``ssq_bias`` values (:func:`biased_image`).
    With ``state_in_dram=True`` a testbench serves the core's state rows from a dict of (bank, layer) rows, as
    the DRAM board does (rows never written read as random words), and appends each command's
    ``(write, bank, layer)`` to ``transfers``."""
    w = random_weights(cfg, seed=3, gamma_spread=1.0)
    fm = calibrate(w)
    options = CompileOptions(formats=fm, packing=packing)
    image = biased_image(w, options, seed=4) if biased else compile_model(w, options)
    vectors = [nx.to_fixed(w.embeddings[t], fm.residual) for t in ids]
    if numerics:
        vectors += [low_energy(w.embeddings[ids[0]], fm.residual), tie_token(image, vectors[-1])]
    gold = GoldenMachine(image)
    state = gold.init_state()
    packets, expected = [], []
    for pos, x in enumerate(vectors):
        pk = make_token_packet(x, position=pos)
        res = gold.run_token(pk, state)
        state = res.state
        packets.append(pk)
        expected.append(res.output)
    build = {"quant_lanes": 4, **build}
    dut = Accelerator(BuildParams(lanes=lanes, channels=1, bus_bits=bus_bits, packing=packing,
                                  max_hidden=32, max_intermediate=32, max_layers=max_layers, **build))
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

    async def serve_state(ctx):
        rng = np.random.default_rng(11)
        rows: dict[tuple[int, int], list[int]] = {}
        beats = state_beats(dut.build.max_hidden)
        cmd, wb, fill = dut.state_cmd, dut.m_axis_state, dut.s_axis_state
        ctx.set(cmd.ready, 1)
        while True:     # a plain tick while idle: a background testbench left inside `until` fails at the end
            _, _, valid, write, bank, layer = await ctx.tick().sample(
                cmd.valid, cmd.payload.write, cmd.payload.bank, cmd.payload.layer)
            if not valid:
                continue
            ctx.set(cmd.ready, 0)
            if transfers is not None:
                transfers.append((write, bank, layer))
            if write:
                row = []
                while len(row) < beats:      # tready low a third of the cycles: the write-back holds its beats
                    ready = bool(rng.random() < 0.67)
                    ctx.set(wb.tready, ready)
                    _, _, valid, data, last = await ctx.tick().sample(wb.tvalid, wb.tdata, wb.tlast)
                    if valid and ready:
                        assert last == (len(row) == beats - 1)
                        row.append(data)
                ctx.set(wb.tready, 0)
                rows[(bank, layer)] = row
            else:
                row = rows.get((bank, layer)) or [int(v) for v in rng.integers(0, 1 << 63, beats)]
                for j, data in enumerate(row):
                    ctx.set(fill.tdata, data)
                    ctx.set(fill.tlast, j == beats - 1)
                    ctx.set(fill.tvalid, 1)
                    await ctx.tick().until(fill.tready)
                ctx.set(fill.tvalid, 0)
            ctx.set(cmd.ready, 1)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(feed, background=True)
    if dut.build.state_in_dram:
        sim.add_testbench(serve_state, background=True)
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


@pytest.mark.parametrize("biased", [False, True], ids=["compiled", "biased"])
@pytest.mark.parametrize("folded", [False, True], ids=["pipelined", "folded"])
def test_numerics_bit_exact(folded, biased):
    """ISA version 2's numerics through the whole core: a low-energy token (mean square 1e-4 of the usual,
    where the compiler's epsilon terms move the scales), a token whose first GEMV quantizes exact ties in
    both signs, with the compiler's image and with random ssq_bias/ssq_bias_shift (up to ~2**63) in every
    quantizing GEMV; both epilogue forms (the released gate's g_proj reduces twice into R4)."""
    got, expected = run_tokens(TritPacking.BASE3, lanes=16, bus_bits=64, ids=[5, 17], numerics=True,
                               biased=biased, epilogue_folded=folded)
    assert len(got) == 4
    for g, e in zip(got, expected, strict=True):
        assert g == e


@pytest.mark.parametrize("quant_lanes", [1, 2])
def test_narrow_quantizer_bit_exact(quant_lanes):
    """One or two quantize lanes (the quantizer reads X, A, P and QC through wide ports of one or two elements):
    a one-lane core once read its sources as zero and returned all-zero logits."""
    got, expected = run_tokens(TritPacking.BASE3, lanes=16, bus_bits=64, ids=[5, 17], numerics=True,
                               quant_lanes=quant_lanes, epilogue_folded=True)
    assert len(got) == 4
    for g, e in zip(got, expected, strict=True):
        assert g == e


@pytest.mark.parametrize("max_layers", [2, 3])
def test_state_in_dram_bit_exact(max_layers):
    """The recurrent state in board DRAM (``state_in_dram``): one layer's rows on chip, swapped through the
    state ports, three tokens bit-exact. Per token every layer's STATE_NEW row is written back to the bank the
    commit makes current, and from the second token on every layer's STATE_OLD row is filled from the
    committed bank first."""
    transfers = []
    got, expected = run_tokens(TritPacking.BASE3, lanes=16, bus_bits=64, ids=[5, 17, 23], state_in_dram=True,
                               max_layers=max_layers, transfers=transfers)
    assert got == expected
    n = TINY.num_hidden_layers
    want = [(1, 1, layer) for layer in range(n)]                                        # token 0: bank 0
    want += [x for layer in range(n) for x in ((0, 1, layer), (1, 0, layer))]           # token 1: bank 1
    want += [x for layer in range(n) for x in ((0, 0, layer), (1, 1, layer))]           # token 2: bank 0
    assert transfers == want


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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)  # the rejected instance is never elaborated
        with pytest.raises((TypeError, ValueError), match="weight_fifo_beats"):
            Accelerator(**kw)
        gc.collect()   # here, not in a later test (whose setup would report the warning as an error)
