"""TritGearbox (hw/gearbox.py) in the Amaranth simulator: every chunk against hw.isa.unpack_trits.

Weight blocks are built as the image builder does (``hw.isa.pack_trits`` of ``rows * K`` trits, zero-padded
to whole 64-byte sections, ``host.image.channel_block_bytes``) and streamed back to back; every chunk,
the number of beats taken and the stream rules on ``o`` are checked, with and without random idle cycles
on ``cmd``/``i`` and random backpressure on ``o``.
"""

import gc
import warnings

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import UnusedElaboratable
from amaranth.lib import data
from amaranth.sim import Simulator

from host.image import channel_block_bytes, seal_block
from hw import isa
from hw.gearbox import TritGearbox, _base3_rom
from hw.isa import TritPacking
from hw.streams import trit_chunk_layout
from tests.hw.streams import stream_get_all, stream_put_all

pytestmark = pytest.mark.filterwarnings("error")

BASE3, BITS2 = TritPacking.BASE3, TritPacking.BITS2


# ----------------------------------------------------------------------------------------------- model
def make_block(rows: int, k: int, packing: TritPacking, rng: np.random.Generator) -> bytes:
    """A channel weight block: random trits packed continuously, zero padding and the CRC word, whole 64-byte
    sections (``host.image.seal_block``)."""
    trits = rng.integers(-1, 2, size=rows * k).astype(np.int8)
    block = seal_block(isa.pack_trits(trits, packing))
    assert len(block) == channel_block_bytes(rows, k, 1, packing)[0]
    return block


def expected_chunks(block: bytes, rows: int, k: int, packing: TritPacking, lanes: int, *, checked=True):
    """(trits, count, first, last, end) per chunk; ``checked``: decode with hw.isa.unpack_trits (raises on an
    invalid code), else with hw.isa's decode tables (an invalid code reads 0, as the gearbox outputs)."""
    n = rows * k
    if checked:
        flat = isa.unpack_trits(block, n, packing)
    elif packing is BASE3:
        flat = isa.BASE3_DECODE[np.frombuffer(block, np.uint8)].reshape(-1)[:n]
    else:
        b = np.frombuffer(block, np.uint8)
        flat = isa.BITS2_DECODE[np.stack([(b >> s) & 3 for s in (0, 2, 4, 6)], axis=1).reshape(-1)[:n]]
    out = []
    for r in range(rows):
        row = flat[r * k:(r + 1) * k]
        for j in range(0, k, lanes):
            part = [int(t) for t in row[j:j + lanes]]
            last = j + lanes >= k
            out.append((tuple(part + [0] * (lanes - len(part))), len(part), j == 0, last, last and r == rows - 1))
    return out


def beats_of(stream: bytes, bus_bits: int) -> list[int]:
    nb = bus_bits // 8
    assert len(stream) % nb == 0
    return [int.from_bytes(stream[i:i + nb], "little") for i in range(0, len(stream), nb)]


def predecode(beat: int, packing: TritPacking, bus_bits: int) -> int:
    """A beat as a ``predecoded`` gearbox takes it: BITS2 unchanged, BASE3 bytes through the decode table (10
    bits each, written out here from hw.isa.BASE3_DECODE independently of the gateware's ROM)."""
    if packing is BITS2:
        return beat
    rom = _base3_rom()
    return sum(rom[(beat >> (8 * b)) & 0xFF] << (10 * b) for b in range(bus_bits // 8))


SENTINEL_BYTE = 0xA5  # beats offered after the last block: must never be taken


def run(dut: TritGearbox, cmds, stream: bytes, n_chunks: int, *, seed=0, cmd_idle=0.0, in_idle=0.0,
        out_stall=0.0, cmd_delay=0, clear=None, block_ends=None):
    """Drive ``cmds`` and the beats of ``stream``; return (chunks, transfer cycles, bad_trit per transfer,
    bad_trit trace, beats taken). Checks the stream rules on ``o`` and that no extra beat is taken, and with
    ``block_ends`` (beat indices) that ``blk_last`` marks exactly those beats."""
    rng = np.random.default_rng(seed)
    beats = beats_of(stream, dut.bus_bits)
    if dut.predecoded:
        beats = [predecode(b, dut.packing, dut.bus_bits) for b in beats]
    layout = trit_chunk_layout(dut.lanes)
    st = {"taken": 0, "extra": 0, "cycle": 0, "ends": []}
    max_cycles = 200 + cmd_delay + 10 * (len(beats) + n_chunks + len(cmds))  # generous even at 30 % idles
    got, cycles, bads, trace = [], [], [], []

    async def cmd_source(ctx):
        await ctx.tick().repeat(cmd_delay + 1)
        if cmd_delay:
            assert st["taken"] == 0, "beats taken before any command"
        await stream_put_all(ctx, dut.cmd, [{"rows": rows, "k": k} for rows, k in cmds], idle=cmd_idle, rng=rng)

    async def beat_source(ctx):
        sentinel = int.from_bytes(bytes([SENTINEL_BYTE]) * (dut.bus_bits // 8), "little")
        if dut.predecoded:
            sentinel = predecode(sentinel, dut.packing, dut.bus_bits)
        while True:
            idx = st["taken"]
            valid = idx >= len(beats) or rng.random() >= in_idle
            ctx.set(dut.i.payload, {"data": beats[idx] if idx < len(beats) else sentinel})
            ctx.set(dut.i.valid, valid)
            _, _, ready, blk_last = await ctx.tick().sample(dut.i.ready, dut.blk_last)
            if blk_last:
                assert valid and ready, "blk_last without a transfer"
                st["ends"].append(idx)
            if valid and ready:
                if idx < len(beats):
                    st["taken"] += 1
                else:
                    st["extra"] += 1

    async def sink(ctx):
        if clear is not None:
            ctx.set(dut.clear, clear)
        prev = None  # payload bits while valid & ~ready
        tail = 0
        while len(got) < n_chunks or tail < 40:
            assert st["cycle"] < max_cycles, f"timeout: {len(got)}/{n_chunks} chunks, {st['taken']} beats"
            tail += len(got) >= n_chunks
            ready = rng.random() >= out_stall
            ctx.set(dut.o.ready, ready)
            _, _, valid, bits, bad = await ctx.tick().sample(dut.o.valid, dut.o.payload.as_value(), dut.bad_trit)
            trace.append(bad)
            st["cycle"] += 1
            if prev is not None:
                assert valid and bits == prev, "o: valid dropped or payload changed before the transfer"
            prev = bits if valid and not ready else None
            if valid and ready:
                assert len(got) < n_chunks, "more chunks than expected"
                c = data.Const(layout, bits)
                got.append((tuple(int(c.trits[j]) for j in range(dut.lanes)), int(c.count), bool(c.first),
                            bool(c.last), bool(c.end)))
                cycles.append(st["cycle"] - 1)  # the cycle (from 0) at whose end the chunk was taken
                bads.append(bad)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(cmd_source, background=True)
    sim.add_testbench(beat_source, background=True)
    sim.add_testbench(sink)
    sim.run()
    assert st["extra"] == 0, "a beat beyond the last block was taken"
    if block_ends is not None:
        assert st["ends"] == block_ends, f"blk_last at beats {st['ends']}, blocks end at {block_ends}"
    return got, cycles, bads, trace, st["taken"]


def shapes(lanes: int, beat_trits: int, per_byte: int):
    """Block shapes covering the corner cases (K < lanes, K = 1, rows = 1, K not a multiple of lanes, 4, 5
    or the beat, empty blocks) and one block of several sections."""
    big_k = 2 * lanes + 3
    big_rows = -(-(3 * 64 * per_byte + 17) // big_k)
    return [
        (1, 1), (3, lanes - 1), (2, lanes + 1), (1, lanes), (4, 5), (0, 9), (2, beat_trits + 3), (5, 3),
        (1, 2 * beat_trits + 7), (3, 0), (big_rows, big_k), (1, 7), (6, 4 * lanes + 1),
        # the CRC word: data filling a section (one more section), ending 1-3 bytes short of it (one more),
        # or exactly 4 short (none)
        (1, 64 * per_byte), (1, 61 * per_byte), (1, 63 * per_byte - 1), (2, 30 * per_byte),
    ]


CASES = [
    (BASE3, 64, 16),
    (BITS2, 64, 16),
    (BASE3, 32, 4),
    (BITS2, 32, 37),    # lanes > beat trits, odd lanes
    (BASE3, 128, 64),
    (BITS2, 256, 24),
    (BASE3, 512, 20),   # one beat per 64-byte section
]


@pytest.mark.parametrize("stress", [False, True], ids=["full-rate", "idles+backpressure"])
@pytest.mark.parametrize(("packing", "bus_bits", "lanes"), CASES, ids=lambda v: getattr(v, "name", v))
def test_random_blocks_back_to_back(packing, bus_bits, lanes, stress, predecoded=False):
    dut = TritGearbox(packing=packing, bus_bits=bus_bits, lanes=lanes, predecoded=predecoded)
    per_byte = 5 if packing is BASE3 else 4
    rng = np.random.default_rng(bus_bits * 1000 + lanes)
    cmds = shapes(lanes, dut.beat_trits, per_byte)
    rng.shuffle(cmds)
    stream, expect, ends = b"", [], []
    for rows, k in cmds:
        block = make_block(rows, k, packing, rng)
        stream += block
        expect += expected_chunks(block, rows, k, packing, lanes)
        if block:
            ends.append(len(stream) // (bus_bits // 8) - 1)
    p = 0.3 if stress else 0.0
    got, _, bads, _, taken = run(dut, cmds, stream, len(expect), seed=lanes, cmd_idle=p, in_idle=p, out_stall=p,
                                 cmd_delay=20 if stress else 0, block_ends=ends)
    assert taken == len(stream) // (bus_bits // 8)
    for n, (g, e) in enumerate(zip(got, expect, strict=False)):
        assert g == e, f"chunk {n}: got {g}, expected {e}"
    assert len(got) == len(expect)
    assert not any(bads)


@pytest.mark.parametrize(("packing", "bus_bits", "lanes"), [(BASE3, 64, 16), (BITS2, 64, 64), (BASE3, 256, 256)],
                         ids=lambda v: getattr(v, "name", v))
def test_predecoded_beats(packing, bus_bits, lanes):
    """``predecoded=True`` (hw/top.py's channel 0: the weight FIFO holds decoded beats): the same chunks from
    beats decoded upstream, under idles and backpressure."""
    test_random_blocks_back_to_back(packing, bus_bits, lanes, True, predecoded=True)


def test_two_commands_back_to_back_at_full_rate():
    """bus 64, lanes 16, BASE3 (40 trits per beat): one chunk per cycle within a block; between blocks only
    the padding beats the input still has to skip."""
    dut = TritGearbox(packing=BASE3, bus_bits=64, lanes=16)
    rng = np.random.default_rng(7)
    cmds = [(12, 37), (9, 71)]  # 444 trits = 89 bytes (+35 padding, CRC), 639 trits = 128 bytes (+60, CRC)
    blocks = [make_block(r, k, BASE3, rng) for r, k in cmds]
    expect = [c for (r, k), b in zip(cmds, blocks, strict=True) for c in expected_chunks(b, r, k, BASE3, 16)]
    got, cycles, _, _, _ = run(dut, cmds, b"".join(blocks), len(expect))
    assert got == expect
    n1 = 12 * 3
    assert cycles[n1 - 1] - cycles[0] == n1 - 1                 # first block: no bubble
    assert cycles[-1] - cycles[n1] == len(expect) - n1 - 1      # second block: no bubble
    pad_beats = (128 - 89) // 8
    assert cycles[n1] - cycles[n1 - 1] <= pad_beats + 1
    # command taken in cycle 1 (data waiting): first chunk in cycle 5
    assert cycles[0] == 1 + TritGearbox.CMD_LATENCY and TritGearbox.CMD_LATENCY == 4


@pytest.mark.parametrize(("packing", "bus_bits", "lanes", "rows", "k"),
                         [(BASE3, 32, 20, 6, 41), (BITS2, 64, 30, 8, 37), (BITS2, 64, 32, 8, 33)],
                         ids=["base3-32-20", "bits2-64-30", "bits2-64-32"])
def test_full_rate_with_lanes_near_the_beat(packing, bus_bits, lanes, rows, k):
    """Chunks of about a beat that straddle two beats (needs the window's spare slot): still one per cycle,
    since the rows' average chunk (K / ceil(K / lanes) trits) is below the beat's trits."""
    dut = TritGearbox(packing=packing, bus_bits=bus_bits, lanes=lanes)
    block = make_block(rows, k, packing, np.random.default_rng(5))
    expect = expected_chunks(block, rows, k, packing, lanes)
    got, cycles, _, _, _ = run(dut, [(rows, k)], block, len(expect))
    assert got == expect
    assert cycles[-1] - cycles[0] == len(expect) - 1


def test_input_bound_rate():
    """BITS2 on a 32-bit bus (16 trits per beat) with 64 lanes: the input is the limit, one beat per cycle."""
    dut = TritGearbox(packing=BITS2, bus_bits=32, lanes=64)
    rng = np.random.default_rng(3)
    rows, k = 4, 160                      # 640 trits = 160 bytes + 32 padding = 48 beats
    block = make_block(rows, k, BITS2, rng)
    expect = expected_chunks(block, rows, k, BITS2, 64)
    got, cycles, _, _, _ = run(dut, [(rows, k)], block, len(expect))
    assert got == expect
    # data beats in cycles 3..42 (one per cycle), the last chunk on o BEAT_LATENCY = 2 cycles after the last
    assert cycles[-1] == 3 + 39 + TritGearbox.BEAT_LATENCY and TritGearbox.BEAT_LATENCY == 2


@pytest.mark.parametrize("packing", [BASE3, BITS2], ids=lambda p: p.name)
def test_bad_trit_sticky_and_clear(packing):
    """An invalid code among a chunk's trits sets bad_trit in the cycle that chunk is first valid on ``o``
    (the lane reads 0); invalid codes outside the data trits (BITS2 codes after the last trit, padding
    bytes) do not; ``clear`` drops the flag the next cycle."""
    lanes, rows, k = 16, 3, 37            # 111 trits
    dut = TritGearbox(packing=packing, bus_bits=64, lanes=lanes)
    rng = np.random.default_rng(11)
    block = bytearray(make_block(rows, k, packing, rng))
    nbody = isa.packed_trit_bytes(rows * k, packing)
    bad_byte = 9                          # trits 45..49 (BASE3) or 36..39 (BITS2): row 1
    if packing is BASE3:
        block[bad_byte] = 250
        bad_trit_index = 45
    else:
        block[bad_byte] = (block[bad_byte] & ~(3 << 4)) | (0b10 << 4)   # third code of byte 9 = trit 38
        bad_trit_index = 38
        used = rows * k % 4               # 111 % 4 = 3: the last code of the last byte is not a trit
        block[nbody - 1] = (block[nbody - 1] & ~(3 << (2 * used))) | (0b10 << (2 * used))
    for i in range(nbody, len(block)):
        block[i] = 0xFF if packing is BASE3 else 0xAA   # invalid codes in the padding: ignored
    with pytest.raises(ValueError):
        isa.unpack_trits(bytes(block), rows * k, packing)
    expect = expected_chunks(bytes(block), rows, k, packing, lanes, checked=False)
    bad_chunk = (bad_trit_index // k) * 3 + (bad_trit_index % k) // lanes
    assert bad_chunk == 3

    # clear held high: the flag is high for exactly the cycle after the bad chunk was loaded (set wins)
    got, cycles, bads, trace, _ = run(dut, [(rows, k)], bytes(block), len(expect), clear=1)
    assert got == expect
    assert bads == [n == bad_chunk for n in range(len(expect))]
    assert sum(trace) == 1

    # clear low: sticky from the bad chunk on, with backpressure too
    dut = TritGearbox(packing=packing, bus_bits=64, lanes=lanes)
    got, cycles, bads, trace, _ = run(dut, [(rows, k)], bytes(block), len(expect), out_stall=0.4, seed=5)
    assert got == expect
    assert bads == [n >= bad_chunk for n in range(len(expect))]
    first_high = trace.index(1)
    assert all(trace[first_high:])
    assert cycles[bad_chunk - 1] < first_high <= cycles[bad_chunk]

    # a clear pulse after the block drops the flag the next cycle; a good block leaves it low
    dut = TritGearbox(packing=packing, bus_bits=64, lanes=lanes)
    good = make_block(2, 5, packing, rng)
    expect2 = expect + expected_chunks(good, 2, 5, packing, lanes)
    st = {}

    async def pulse(ctx):
        await ctx.tick().until(dut.bad_trit)
        await ctx.tick().repeat(3)
        assert ctx.get(dut.bad_trit)
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        assert not ctx.get(dut.bad_trit)
        st["pulsed"] = True

    beats = bytes(block) + good
    rng2 = np.random.default_rng(1)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(pulse, background=True)
    got2 = []

    async def drive(ctx):
        await stream_put_all(ctx, dut.cmd, [{"rows": rows, "k": k}, {"rows": 2, "k": 5}])

    async def feed(ctx):
        await stream_put_all(ctx, dut.i, [{"data": b} for b in beats_of(beats, 64)])

    async def collect(ctx):
        for c in await stream_get_all(ctx, dut.o, len(expect2), stall=0.5, rng=rng2, timeout=500):
            got2.append((tuple(int(c.trits[j]) for j in range(lanes)), int(c.count), bool(c.first),
                         bool(c.last), bool(c.end)))
        await ctx.tick().repeat(5)
        assert st.get("pulsed") and not ctx.get(dut.bad_trit)

    sim.add_testbench(drive, background=True)
    sim.add_testbench(feed, background=True)
    sim.add_testbench(collect)
    sim.run()
    assert got2 == expect2


def test_base3_last_byte_invalid_is_flagged():
    """BASE3: a body byte above 242 is invalid even when only its first digit is a data trit
    (host.image checks whole body bytes)."""
    rows, k = 1, 6                        # 6 trits: byte 1 holds trit 5 and four padding digits
    dut = TritGearbox(packing=BASE3, bus_bits=32, lanes=4)
    block = bytearray(make_block(rows, k, BASE3, np.random.default_rng(2)))
    block[1] = 255
    expect = expected_chunks(bytes(block), rows, k, BASE3, 4, checked=False)
    _, _, bads, _, _ = run(dut, [(rows, k)], bytes(block), len(expect), clear=0)
    assert bads == [False, True]


def test_parameters_are_validated():
    bad = [
        (TypeError, "packing", dict(packing=1, bus_bits=64, lanes=16)),
        (ValueError, "96", dict(packing=BASE3, bus_bits=96, lanes=16)),
        (TypeError, "bus_bits", dict(packing=BASE3, bus_bits=64.0, lanes=16)),
        (ValueError, "lanes.*3", dict(packing=BITS2, bus_bits=64, lanes=3)),
        (ValueError, "257", dict(packing=BITS2, bus_bits=64, lanes=257)),
        (TypeError, "lanes", dict(packing=BITS2, bus_bits=64, lanes=True)),
    ]
    # rejected (and the inspected) instances are never elaborated: collect them while that warning is ignored
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        for exc, match, kwargs in bad:
            with pytest.raises(exc, match=match):
                TritGearbox(**kwargs)
        g = TritGearbox(packing=BASE3, bus_bits=64, lanes=16)
        assert (g.packing, g.bus_bits, g.lanes, g.beat_trits, g.window_beats) == (BASE3, 64, 16, 40, 3)
        with pytest.raises(AttributeError):
            g.lanes = 8
        del g
        gc.collect()


@pytest.mark.parametrize(("packing", "bus_bits", "lanes"), [(BASE3, 128, 64), (BITS2, 512, 256)],
                         ids=["base3-128-64", "bits2-512-256"])
def test_converts_to_verilog(packing, bus_bits, lanes):
    text = verilog.convert(TritGearbox(packing=packing, bus_bits=bus_bits, lanes=lanes),
                           name=f"mmfree_gearbox_{packing.name.lower()}_{bus_bits}_{lanes}")
    assert "i__payload" in text and "o__payload" in text and "bad_trit" in text
