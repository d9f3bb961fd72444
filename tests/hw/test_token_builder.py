"""TokenBuilder (hw/token_builder.py) in the Amaranth simulator: token commands in, through the image reader
(hw/dram_reader.py) and a behavioural LiteDRAM native port (tests/hw/test_dram_reader.py's model, random
command stalls and read latencies) over an embedding table, token packets out. Every packet must equal
``host.protocol.make_token_packet`` of the table's row bit for bit, with idle cycles between commands and
backpressure on the output, through the ULX3S's 16-bit port and the ECPIX-5 DDR3's 128-bit one (rows that
start in either half of a 16-byte word, at any 4-byte boundary).
"""

import gc
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import Module, UnusedElaboratable
from amaranth.lib import data
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator

from host.protocol import check_token_packet, make_token_packet, token_packet_bytes
from hw import isa
from hw.dram_reader import DRAMImageReader
from hw.token_builder import TokenBuilder, packet_words, token_command_layout
from tests.hw.test_dram_reader import PORT_WIDTHS, NativePortModel, addr_width_for, words_touched

pytestmark = pytest.mark.filterwarnings("error")

ADDR_WIDTH = 14   # 16384 words of 16 bits: 32 KiB
CONFIG = Path(__file__).resolve().parents[2] / "models" / "hgrn-bit-pydoc" / "config.json"
SHIPPED = json.loads(CONFIG.read_text())
SHIPPED_HIDDEN = SHIPPED["hidden_size"]   # 324
SHIPPED_VOCAB = SHIPPED["vocab_size"]     # 4096


def table_memory(rng, vocab, hidden, base, *, addr_width=ADDR_WIDTH):
    """A random memory (uint16 words) holding a random int32 table [vocab, hidden] from byte ``base``."""
    mem = rng.integers(0, 1 << 16, size=1 << addr_width, dtype=np.uint16)
    table = rng.integers(-(1 << 31), 1 << 31, size=(vocab, hidden), dtype=np.int64)
    table[0, :min(hidden, 4)] = [-(1 << 31), (1 << 31) - 1, 0, -1][:min(hidden, 4)]   # the extremes
    raw = table.astype("<i4").tobytes()
    assert base % 4 == 0 and base + len(raw) <= 2 * mem.size
    view = mem.view(np.uint8)
    view[base:base + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return mem, table


def builder_and_reader(port_width, *, beat_width=64, depth=64, max_hidden=isa.MAX_HIDDEN):
    """A builder on a reader of a ``port_width`` port over the 32 KiB test memory (the builder's
    ``read_align`` the reader's ``base_align``, as the board joins them)."""
    reader = DRAMImageReader(addr_width=addr_width_for(port_width, ADDR_WIDTH), port_width=port_width,
                             beat_width=beat_width, depth=depth)
    dut = TokenBuilder(byte_addr_width=ADDR_WIDTH + 1, beat_width=beat_width, max_hidden=max_hidden,
                       read_align=reader.base_align)
    return dut, reader


def row_reads(port_width, base, token, hidden, *, beat_width=64):
    """Port reads for one row: from its start rounded down to the reader's granularity, whole beats."""
    beat = beat_width // 8
    align = max(4, min(port_width, beat_width) // 8)
    start = base + 4 * token * hidden
    first = start & ~(align - 1)
    n = -(-(4 * hidden + start - first) // beat) * beat
    return words_touched(first, n, port_width // 8)


def run_builder(commands, mem, *, port_width=16, beat_width=64, seed=0, cmd_idle=0.0, out_stall=0.0,
                cmd_stall=0.0, latency=(3, 10), max_hidden=isa.MAX_HIDDEN, max_cycles=200_000):
    """Send ``commands`` ((token, position, logits, base, hidden, vocab) each) one by one; returns, per
    command, (packet bytes, bad_token, bad_hidden) and the port model. The stream rules of ``o`` are
    checked (valid held, payload stable until the transfer) and nothing may come out between packets."""
    rng = np.random.default_rng(seed)
    dut, reader = builder_and_reader(port_width, beat_width=beat_width, depth=16, max_hidden=max_hidden)
    m = Module()
    m.submodules.dut, m.submodules.reader = dut, reader
    connect(m, dut.rd_req, reader.req)
    connect(m, reader.o, dut.rd)
    model = NativePortModel(reader.port, mem, rng, cmd_stall=cmd_stall, latency=latency)
    beat_bytes = beat_width // 8
    results = []

    async def driver(ctx):
        cycles = 0
        for token, position, logits, base, hidden, vocab in commands:
            while rng.random() < cmd_idle:
                await ctx.tick()
            ctx.set(dut.cmd.payload, {"token": token, "position": position, "logits": logits})
            ctx.set(dut.base, base)
            ctx.set(dut.hidden, hidden)
            ctx.set(dut.vocab, vocab)
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.cmd.ready)
            ctx.set(dut.cmd.valid, 0)
            ctx.set(dut.base, 0)     # sampled with the command only
            ctx.set(dut.hidden, 0)
            ctx.set(dut.vocab, 0)
            await ctx.tick()
            if ctx.get(dut.error):
                assert not ctx.get(dut.busy)
                for _ in range(30):  # a refused command reads nothing and emits nothing
                    _, _, valid, req = await ctx.tick().sample(dut.o.valid, reader.req.valid)
                    assert not valid and not req
                results.append((b"", bool(ctx.get(dut.bad_token)), bool(ctx.get(dut.bad_hidden))))
                continue
            packet, prev = bytearray(), None
            while True:
                cycles += 1
                assert cycles < max_cycles, f"{len(packet)} bytes after {cycles} cycles"
                ready = not (out_stall and rng.random() < out_stall)
                ctx.set(dut.o.ready, ready)
                _, _, valid, bits = await ctx.tick().sample(dut.o.valid, dut.o.payload.as_value())
                if prev is not None:
                    assert valid and bits == prev, "o: valid dropped or payload changed before the transfer"
                prev = bits if valid and not ready else None
                if valid and ready:
                    beat = data.Const(dut.o.payload.shape(), bits)
                    packet += int(beat.data).to_bytes(beat_bytes, "little")
                    if beat.last:
                        break
            ctx.set(dut.o.ready, 1)
            for _ in range(3):   # nothing after the packet's last beat
                _, _, valid = await ctx.tick().sample(dut.o.valid)
                assert not valid, "a beat after the packet's last"
            ctx.set(dut.o.ready, 0)
            assert not ctx.get(dut.busy) and not ctx.get(reader.busy)
            results.append((bytes(packet), bool(ctx.get(dut.bad_token)), bool(ctx.get(dut.bad_hidden))))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(driver)
    sim.run()
    return results, model


def first_difference(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def expected(table, token, position, logits):
    return make_token_packet(table[token], position=position, logits=bool(logits))


def test_packet_words_match_the_host():
    for hidden in (1, 2, 11, 12, 43, 44, SHIPPED_HIDDEN, isa.MAX_HIDDEN):
        assert 4 * packet_words(hidden) == token_packet_bytes(hidden)


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
@pytest.mark.parametrize("hidden, vocab, base", [(SHIPPED_HIDDEN, 9, 0x400), (1, 17, 0x24), (7, 13, 0x1004),
                                                 (11, 6, 0x40), (12, 5, 0x8)])
@pytest.mark.parametrize("cmd_idle, out_stall, cmd_stall", [(0.0, 0.0, 0.0), (0.5, 0.6, 0.3)])
def test_packets_equal_make_token_packet(port_width, hidden, vocab, base, cmd_idle, out_stall, cmd_stall):
    rng = np.random.default_rng(hidden * 7 + int(10 * out_stall))
    mem, table = table_memory(rng, vocab, hidden, base)
    positions = [0, 1, (1 << 32) - 1, int(rng.integers(0, 1 << 32))]
    tokens = [0, vocab - 1, int(rng.integers(0, vocab)), 1 % vocab]
    commands = [(t, p, k % 2, base, hidden, vocab) for k, (t, p) in enumerate(zip(tokens, positions, strict=True))]
    results, model = run_builder(commands, mem.copy(), port_width=port_width, seed=hidden, cmd_idle=cmd_idle,
                                 out_stall=out_stall, cmd_stall=cmd_stall)
    # the row (from the reader's boundary below it), rounded to beats, and nothing else
    assert model.reads == sum(row_reads(port_width, base, t, hidden) for t, *_ in commands)
    if port_width == 16:
        assert model.reads == len(commands) * -(-4 * hidden // 8) * 4
    for (t, p, lg, *_), (packet, bt, bh) in zip(commands, results, strict=True):
        assert not bt and not bh
        want = expected(table, t, p, lg)
        assert packet == want, f"token {t} position {p}: first difference at byte {first_difference(packet, want)}"
        x, flags, position = check_token_packet(packet)       # the core's own checks pass
        assert np.array_equal(x, table[t]) and flags == lg and position == p


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
@pytest.mark.parametrize("beat_width", [32, 128])
def test_other_beat_widths(port_width, beat_width):
    """Beats of 32 and 128 bits; with the 128-bit port and 128-bit beats the reader's granularity is 16
    bytes, so a row may start 1, 2 or 3 words into its first beat (hidden 13: rows at every 4 mod 16)."""
    rng = np.random.default_rng(beat_width)
    hidden, vocab, base = 13, 10, 0x200
    mem, table = table_memory(rng, vocab, hidden, base)
    commands = [(t, 1000 + t, t % 2, base, hidden, vocab) for t in (9, 0, 4, 1, 2, 3)]
    results, model = run_builder(commands, mem, port_width=port_width, beat_width=beat_width, seed=3,
                                 out_stall=0.4, cmd_stall=0.2)
    for (t, p, lg, *_), (packet, _, _) in zip(commands, results, strict=True):
        assert packet == expected(table, t, p, lg)
    assert model.reads == sum(row_reads(port_width, base, t, hidden, beat_width=beat_width)
                              for t, *_ in commands)


@pytest.mark.parametrize("port_width", [64, 128])
@pytest.mark.parametrize("base", [0x108, 0x10C, 0x104])
def test_rows_in_either_half_of_a_wide_word(port_width, base):
    """128-bit port: the table at 8, 12 and 4 mod 16, hidden 3 (12-byte rows), so rows start at every 4-byte
    offset of a 16-byte word, in its lower and its upper 64-bit half; every packet right, each row read
    from the 8-byte boundary at or below it, the words touched once. The same on a 64-bit port (a word a
    beat: rows at 4 mod 8 read from the beat below)."""
    rng = np.random.default_rng(base)
    hidden, vocab = 3, 8
    mem, table = table_memory(rng, vocab, hidden, base)
    commands = [(t, t, 1, base, hidden, vocab) for t in range(vocab)]
    results, model = run_builder(commands, mem, port_width=port_width, seed=4, out_stall=0.3, cmd_stall=0.2)
    for (t, p, lg, *_), (packet, bt, bh) in zip(commands, results, strict=True):
        assert not bt and not bh
        assert packet == expected(table, t, p, lg), f"row {t} at {base + 12 * t:#x}"
    assert model.reads == sum(row_reads(port_width, base, t, hidden) for t in range(vocab))


def test_token_out_of_range_is_refused():
    """An id >= vocab (the shipped model's vocab, and the last row + 1 of a small table) sets ``bad_token``
    and reads nothing; the next good command is right and clears the flag."""
    rng = np.random.default_rng(5)
    hidden, vocab, base = SHIPPED_HIDDEN, 4, 0x100
    mem, table = table_memory(rng, vocab, hidden, base)
    commands = [(SHIPPED_VOCAB, 3, 0, base, hidden, SHIPPED_VOCAB),
                ((1 << 32) - 1, 4, 1, base, hidden, SHIPPED_VOCAB),
                (vocab, 5, 0, base, hidden, vocab),
                (vocab - 1, 6, 0, base, hidden, vocab),
                (0, 7, 1, base, hidden, 0),                 # an empty table: every id is out of range
                (2, 8, 1, base, hidden, vocab)]
    results, model = run_builder(commands, mem, seed=1, out_stall=0.3)
    assert [(bool(p), bt, bh) for p, bt, bh in results] == [
        (False, True, False), (False, True, False), (False, True, False), (True, False, False),
        (False, True, False), (True, False, False)]
    assert results[3][0] == expected(table, vocab - 1, 6, 0)
    assert results[5][0] == expected(table, 2, 8, 1)
    assert model.reads == 2 * (4 * hidden // 2)                 # the two good rows only


def test_token_out_of_range_reads_nothing_on_a_wide_port():
    rng = np.random.default_rng(5)
    hidden, vocab, base = 5, 4, 0x108
    mem, table = table_memory(rng, vocab, hidden, base)
    commands = [(vocab, 3, 0, base, hidden, vocab), (vocab - 1, 6, 1, base, hidden, vocab),
                (1, 7, 0, base, 0, vocab)]
    results, model = run_builder(commands, mem, port_width=128, seed=1, out_stall=0.3)
    assert [(bool(p), bt, bh) for p, bt, bh in results] == [(False, True, False), (True, False, False),
                                                           (False, False, True)]
    assert results[1][0] == expected(table, vocab - 1, 6, 1)
    assert model.reads == row_reads(128, base, vocab - 1, hidden)


def test_hidden_out_of_range_is_refused():
    rng = np.random.default_rng(6)
    hidden, vocab, base = 16, 3, 0x80
    mem, table = table_memory(rng, vocab, hidden, base)
    commands = [(1, 0, 0, base, 0, vocab), (1, 0, 0, base, 17, vocab), (1, 9, 0, base, hidden, vocab)]
    results, model = run_builder(commands, mem, max_hidden=16)
    assert [(bool(p), bt, bh) for p, bt, bh in results] == [(False, False, True), (False, False, True),
                                                           (True, False, False)]
    assert results[2][0] == expected(table, 1, 9, 0)
    assert model.reads == 4 * hidden // 2


def test_a_corrupted_builder_would_be_caught():
    """The comparison is strict: one flipped bit in the table changes the packet, the CRC word included."""
    rng = np.random.default_rng(8)
    hidden, vocab, base = 5, 2, 0x40
    mem, table = table_memory(rng, vocab, hidden, base)
    mem[base // 2 + 2 * hidden + 3] ^= 0x10     # row 1, word 1, high half
    (packet, _, _), = run_builder([(1, 2, 1, base, hidden, vocab)], mem)[0]
    want = expected(table, 1, 2, 1)
    assert packet != want and packet[-4:] != want[-4:]
    assert check_token_packet(packet)[0][1] == table[1, 1] ^ (0x10 << 16)


@pytest.mark.parametrize("kw, exc", [({"beat_width": 96}, ValueError), ({"beat_width": 16}, ValueError),
                                     ({"max_hidden": 0}, ValueError), ({"byte_addr_width": 25.0}, TypeError),
                                     ({"byte_addr_width": 2}, ValueError), ({"read_align": 16}, ValueError),
                                     ({"read_align": 12}, ValueError), ({"read_align": 0}, ValueError),
                                     ({"read_align": 8.0}, TypeError)])
def test_parameters_are_checked(kw, exc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(exc):
            TokenBuilder(**{"byte_addr_width": 25, **kw})
        gc.collect()


def test_widths():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        b = TokenBuilder(byte_addr_width=25)
        assert token_command_layout().size == 65
        assert b.o.payload.shape().size == 65 and b.rd.payload.shape().size == 65
        assert b.rd_req.payload.shape().size == 25 + 26
        assert b.hidden.shape().width == 13 and b.beat_width == 64 and b.max_hidden == isa.MAX_HIDDEN
        assert b.read_align == 4 and TokenBuilder(byte_addr_width=25, read_align=2).read_align == 4
        assert TokenBuilder(byte_addr_width=29, read_align=8).read_align == 8
        del b
        gc.collect()


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
def test_the_shipped_row_at_the_dram_rate(port_width):
    """Without stalls the header leaves before the row's reads return, and the shipped model's packet (hidden
    324, 168 beats) takes little more than the row's 648 port words on the 16-bit port: the builder does not
    slow the SDRAM. On the 128-bit port the row is 81 words and the builder is the bound: two row words
    every three cycles (a beat is taken the cycle after its last word was used), about 486 cycles for the
    row and the packet's 12 other words at one a cycle."""
    hidden, vocab, base = SHIPPED_HIDDEN, 3, 0
    mem, table = table_memory(np.random.default_rng(2), vocab, hidden, base)
    dut, reader = builder_and_reader(port_width)
    m = Module()
    m.submodules.dut, m.submodules.reader = dut, reader
    connect(m, dut.rd_req, reader.req)
    connect(m, reader.o, dut.rd)
    model = NativePortModel(reader.port, mem, np.random.default_rng(0), latency=(8, 8))
    seen = {}

    async def driver(ctx):
        ctx.set(dut.cmd.payload, {"token": 2, "position": 77, "logits": 0})
        ctx.set(dut.hidden, hidden)
        ctx.set(dut.vocab, vocab)
        ctx.set(dut.cmd.valid, 1)
        ctx.set(dut.o.ready, 1)
        await ctx.tick()
        ctx.set(dut.cmd.valid, 0)
        cycle, packet = 0, bytearray()
        while True:
            _, _, valid, bits = await ctx.tick().sample(dut.o.valid, dut.o.payload.as_value())
            cycle += 1
            if valid:
                beat = data.Const(dut.o.payload.shape(), bits)
                packet += int(beat.data).to_bytes(8, "little")
                seen.setdefault("first", cycle)
                if beat.last:
                    break
            assert cycle < 5000
        seen.update(total=cycle, packet=bytes(packet))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(driver)
    sim.run()
    assert seen["packet"] == expected(table, 2, 77, 0)
    assert seen["first"] <= 4, f"first beat {seen['first']} cycles after the command"
    bound = 648 if port_width == 16 else 3 * hidden // 2 + packet_words(hidden) - hidden
    assert bound <= seen["total"] <= bound + 30, f"{seen['total']} cycles, bound {bound}"
