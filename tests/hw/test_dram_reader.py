"""DRAMImageReader, DRAMStreamWriter (hw/dram_reader.py, hw/dram_writer.py) and DFIIInitSequencer
(hw/dram_init.py) in the Amaranth simulator, against a behavioural LiteDRAM native port.

The port model keeps LiteDRAM's contract (``litedram/core/crossbar.py``): commands accepted when the model
says ``ready`` (random stalls stand for refreshes and bank switches), read data returned in command order at
a latency of several cycles whatever the reader's state (``rdata`` cannot be held back), write data taken in
the cycle the model raises ``wdata.ready``, a few cycles after the command. The real controller and SDRAM
model are exercised by ``sim/test_dram.py``.
"""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.lib import data
from amaranth.sim import Simulator

from hw.dram_init import DFIIInitSequencer
from hw.dram_reader import DRAMImageReader, beat_layout
from hw.dram_writer import DRAMStreamWriter

pytestmark = pytest.mark.filterwarnings("error")

ADDR_WIDTH = 12  # 4096 words of 16 bits: 8 KiB


class NativePortModel:
    """A LiteDRAM native port over ``mem`` (uint16 words) with random command stalls and read latencies.

    ``lose_after``: reads after this many are never answered (a broken controller)."""

    def __init__(self, port, mem, rng, *, cmd_stall=0.0, latency=(3, 10), write_latency=3, lose_after=None):
        self.port, self.mem, self.rng = port, mem, rng
        self.cmd_stall, self.latency, self.write_latency = cmd_stall, latency, write_latency
        self.lose_after = lose_after
        self.reads = 0
        self.writes_taken = 0
        self.max_pending = 0

    async def process(self, ctx):
        cycle, last_due = 0, 0
        reads, writes = [], []   # (due cycle, addr)
        port = self.port
        while True:
            ready = self.rng.random() >= self.cmd_stall
            ctx.set(port.cmd.ready, ready)
            rd = reads and reads[0][0] <= cycle
            ctx.set(port.rdata.valid, bool(rd))
            if rd:
                ctx.set(port.rdata.payload, int(self.mem[reads[0][1]]))
            wr = writes and writes[0][0] <= cycle
            ctx.set(port.wdata.ready, bool(wr))
            _, _, valid, cmd, wdata = await ctx.tick().sample(port.cmd.valid, port.cmd.payload, port.wdata.payload)
            if rd:
                reads.pop(0)
            if wr:
                _, addr = writes.pop(0)
                self.mem[addr] = wdata.data
                self.writes_taken += 1
            if valid and ready:
                if cmd.we:
                    writes.append((cycle + self.write_latency, int(cmd.addr)))
                else:
                    self.reads += 1
                    if self.lose_after is None or self.reads <= self.lose_after:
                        last_due = max(last_due, cycle + int(self.rng.integers(*self.latency, endpoint=True)))
                        reads.append((last_due, int(cmd.addr)))
            self.max_pending = max(self.max_pending, len(reads))
            cycle += 1


def expected_beats(mem: np.ndarray, base: int, length: int, beat_bytes: int) -> list[int]:
    raw = mem.astype("<u2").tobytes()
    start = base & ~1
    n = (length // beat_bytes) * beat_bytes
    chunk = raw[start:start + n]
    return [int.from_bytes(chunk[i:i + beat_bytes], "little") for i in range(0, n, beat_bytes)]


def run_reader(dut, mem, requests, *, seed=0, cmd_stall=0.0, out_stall=0.0, latency=(3, 10), lose_after=None,
               max_cycles=None):
    """Issue ``requests`` one after another; returns (beats per request as (data, last) lists, cycles per
    request from acceptance to the last beat, model, error seen). Checks the stream rules on ``o``."""
    rng = np.random.default_rng(seed)
    model = NativePortModel(dut.port, mem, rng, cmd_stall=cmd_stall, latency=latency, lose_after=lose_after)
    layout = beat_layout(dut.o.payload.shape().size - 1)
    total = sum(length // 8 for _, length in requests)
    max_cycles = max_cycles or 400 + 40 * (total * 4 + len(requests))
    got, cycles, st = [[] for _ in requests], [], {"error": False}

    async def driver(ctx):
        cycle = 0
        for k, (base, length) in enumerate(requests):
            ctx.set(dut.req.payload, {"base": base, "length": length})
            ctx.set(dut.req.valid, 1)
            await ctx.tick().until(dut.req.ready)
            ctx.set(dut.req.valid, 0)
            start = cycle
            n = length // 8
            prev = None
            while len(got[k]) < n:
                cycle += 1
                assert cycle < max_cycles, f"request {k}: {len(got[k])}/{n} beats after {cycle} cycles"
                ready = rng.random() >= out_stall
                ctx.set(dut.o.ready, ready)
                _, _, valid, bits, err = await ctx.tick().sample(dut.o.valid, dut.o.payload.as_value(), dut.error)
                if err:
                    st["error"] = True
                    return
                if prev is not None:
                    assert valid and bits == prev, "o: valid dropped or payload changed before the transfer"
                prev = bits if valid and not ready else None
                if valid and ready:
                    c = data.Const(layout, bits)
                    got[k].append((int(c.data), bool(c.last)))
            cycles.append(cycle - start)
            ctx.set(dut.o.ready, 0)
            for _ in range(5):   # nothing more after the last beat
                _, _, valid = await ctx.tick().sample(dut.o.valid)
                assert not valid, "a beat after the request's last"
            assert not ctx.get(dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(driver)
    sim.run()
    return got, cycles, model, st["error"]


def random_mem(seed=1):
    return np.random.default_rng(seed).integers(0, 1 << 16, size=1 << ADDR_WIDTH, dtype=np.uint16)


REQUESTS = [(0, 64), (2, 8), (4096, 200), (6, 0), (8192 - 64, 64), (10, 7), (1000, 1000)]


@pytest.mark.parametrize("cmd_stall, out_stall, depth", [(0.0, 0.0, 64), (0.3, 0.0, 64), (0.0, 0.6, 64),
                                                         (0.3, 0.6, 8), (0.5, 0.9, 2)])
def test_reader_delivers_every_byte(cmd_stall, out_stall, depth):
    mem = random_mem()
    dut = DRAMImageReader(addr_width=ADDR_WIDTH, depth=depth)
    got, _, model, err = run_reader(dut, mem.copy(), REQUESTS, seed=int(depth + 10 * out_stall),
                                    cmd_stall=cmd_stall, out_stall=out_stall)
    assert not err
    for (base, length), beats in zip(REQUESTS, got, strict=True):
        want = expected_beats(mem, base, length, 8)
        assert [d for d, _ in beats] == want, f"request {(base, length)}"
        assert [last for _, last in beats] == [i == len(want) - 1 for i in range(len(want))]
    assert model.reads == sum((length // 8) * 4 for _, length in REQUESTS)   # no read beyond a request
    assert model.max_pending <= depth                                        # reservations held


def test_reader_keeps_the_port_busy():
    """Without stalls a long read delivers a word per cycle (latency 8 hidden by 64 reservations); with 4
    reservations the same read is latency-bound: the FIFO's depth is what keeps the controller busy."""
    mem = random_mem()
    words = 4 * 512
    _, (deep,), _, _ = run_reader(DRAMImageReader(addr_width=ADDR_WIDTH, depth=64), mem, [(0, words * 2)],
                                  latency=(8, 8))
    _, (shallow,), _, _ = run_reader(DRAMImageReader(addr_width=ADDR_WIDTH, depth=4), mem, [(0, words * 2)],
                                     latency=(8, 8))
    assert words / deep > 0.98, f"{words} words in {deep} cycles"
    assert words / shallow < 0.5, f"{words} words in {shallow} cycles with 4 reservations"


@pytest.mark.parametrize("out_stall", [0.0, 0.7])
def test_reader_times_out_on_a_lost_read(out_stall):
    mem = random_mem()
    dut = DRAMImageReader(addr_width=ADDR_WIDTH, timeout=100)
    got, _, model, err = run_reader(dut, mem, [(0, 512)], lose_after=37, out_stall=out_stall, max_cycles=2000)
    assert err, "no error after a read that never returned"
    assert len(got[0]) < 64
    assert [d for d, _ in got[0]] == expected_beats(mem, 0, 8 * len(got[0]), 8)  # what came is right


def test_reader_stays_stopped_after_error():
    mem = random_mem()
    dut = DRAMImageReader(addr_width=ADDR_WIDTH, timeout=20)
    rng = np.random.default_rng(0)
    model = NativePortModel(dut.port, mem, rng, lose_after=0)

    async def tb(ctx):
        ctx.set(dut.req.payload, {"base": 0, "length": 64})
        ctx.set(dut.req.valid, 1)
        await ctx.tick()
        ctx.set(dut.req.valid, 0)
        ctx.set(dut.o.ready, 1)
        await ctx.tick().repeat(32 + 20 + 10)   # 32 reads issued, then 20 cycles without an answer
        assert ctx.get(dut.error)
        reads = model.reads
        for _ in range(50):
            assert not ctx.get(dut.req.ready) and not ctx.get(dut.o.valid) and not ctx.get(dut.port.cmd.valid)
            await ctx.tick()
        assert ctx.get(dut.error) and model.reads == reads

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("kw, exc", [({"addr_width": 0}, ValueError), ({"addr_width": 8, "port_width": 12}, ValueError),
                                     ({"addr_width": 8, "beat_width": 48}, ValueError),
                                     ({"addr_width": 8, "depth": 1}, ValueError),
                                     ({"addr_width": 8, "timeout": 0}, ValueError),
                                     ({"addr_width": 8.0}, TypeError), ({"addr_width": True}, TypeError)])
def test_reader_parameters(kw, exc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(exc):
            DRAMImageReader(**kw)
        gc.collect()


def test_reader_widths():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        r = DRAMImageReader(addr_width=24, port_width=16, beat_width=64)
        assert r.byte_addr_width == 25
        assert r.req.payload.shape().size == 25 + 26
        assert r.o.payload.shape() == beat_layout(64)
        assert r.port.rdata.signature.always_ready and r.port.wdata.signature.always_valid
        del r
        gc.collect()


# ------------------------------------------------------------------------------------------- writer
@pytest.mark.parametrize("cmd_stall, in_idle", [(0.0, 0.0), (0.4, 0.5)])
def test_writer_then_reader_round_trip(cmd_stall, in_idle):
    rng = np.random.default_rng(3)
    mem = np.zeros(1 << ADDR_WIDTH, dtype=np.uint16)
    payload = rng.integers(0, 256, size=1024, dtype=np.uint8).tobytes()
    base = 512
    beats = [int.from_bytes(payload[i:i + 8], "little") for i in range(0, len(payload), 8)]
    dut = DRAMStreamWriter(addr_width=ADDR_WIDTH)
    model = NativePortModel(dut.port, mem, rng, cmd_stall=cmd_stall)
    st = {"taken": 0}

    async def tb(ctx):
        ctx.set(dut.req.payload, {"base": base, "length": len(payload)})
        ctx.set(dut.req.valid, 1)
        await ctx.tick().until(dut.req.ready)
        ctx.set(dut.req.valid, 0)
        for _ in range(20000):
            idx = st["taken"]
            valid = rng.random() >= in_idle
            ctx.set(dut.i.payload, beats[idx] if idx < len(beats) else 0xDEAD)
            ctx.set(dut.i.valid, valid)
            _, _, ready, busy, err = await ctx.tick().sample(dut.i.ready, dut.busy, dut.error)
            assert not err
            st["taken"] += valid and ready
            if not busy and idx >= len(beats):
                break
        assert not ctx.get(dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(tb)
    sim.run()
    assert st["taken"] == len(beats), "the writer took more or fewer beats than the length"
    assert model.writes_taken == len(payload) // 2
    assert mem.astype("<u2").tobytes()[base:base + len(payload)] == payload
    assert not mem[:base // 2].any() and not mem[(base + len(payload)) // 2:].any()


# ---------------------------------------------------------------------------------------- init sequencer
def run_init(writes, *, ack_delay=(0, 3), never_ack_at=None, timeout=64, seed=0):
    dut = DFIIInitSequencer(writes=writes, timeout=timeout)
    rng = np.random.default_rng(seed)
    log = []   # (cycle, byte address, value)
    st = {"done_at": None, "error_at": None}

    async def sub(ctx):
        cycle, wait = 0, None
        while True:
            cyc, stb = ctx.get(dut.bus.cyc), ctx.get(dut.bus.stb)
            ack = False
            if cyc and stb and len(log) != never_ack_at:
                if wait is None:
                    wait = int(rng.integers(*ack_delay, endpoint=True))
                ack = wait == 0
                wait = None if ack else wait - 1
            ctx.set(dut.bus.ack, ack)
            _, _, adr, dat, done, err = await ctx.tick().sample(dut.bus.adr, dut.bus.dat_w, dut.done, dut.error)
            if ack:
                log.append((cycle, adr * 4, dat))
            if done and st["done_at"] is None:
                st["done_at"] = cycle
            if err and st["error_at"] is None:
                st["error_at"] = cycle
            cycle += 1

    async def tb(ctx):
        await ctx.tick().repeat(sum(d for _, _, d in writes) + 10 * len(writes) + 2 * timeout + 50)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(sub, background=True)
    sim.add_testbench(tb)
    sim.run()
    return log, st


WRITES = ((0x800, 0xE, 0), (0x0, 0, 0), (0x80C, 0x400, 0), (0x804, 0xB, 0), (0x808, 1, 20), (0x80C, 0x20, 5),
          (0x800, 1, 0), (0x0, 1, 0))


def test_init_sequencer_plays_every_write_with_its_delay():
    log, st = run_init(WRITES)
    assert [(a, v) for _, a, v in log] == [(a, v) for a, v, _ in WRITES]
    for (c0, _, _), (c1, _, _), (_, _, d) in zip(log, log[1:], WRITES, strict=False):
        assert c1 - c0 > d, "the next write before the delay was over"
    assert st["done_at"] is not None and st["done_at"] >= log[-1][0] and st["error_at"] is None


def test_init_sequencer_times_out():
    log, st = run_init(WRITES, never_ack_at=3, timeout=30)
    assert len(log) == 3 and st["done_at"] is None and st["error_at"] is not None


@pytest.mark.parametrize("writes, timeout, exc", [((), 8, ValueError), (((2, 0, 0),), 8, ValueError),
                                                  (((0, 1 << 32, 0),), 8, ValueError), (((0, 0, -1),), 8, ValueError),
                                                  (((0, 0, 0),), 0, ValueError), (((0, 0.5, 0),), 8, TypeError)])
def test_init_sequencer_parameters(writes, timeout, exc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(exc):
            DFIIInitSequencer(writes=writes, timeout=timeout)
        gc.collect()
