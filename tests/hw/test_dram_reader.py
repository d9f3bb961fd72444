"""DRAMImageReader, DRAMStreamWriter, DRAMWideWriter (hw/dram_reader.py, hw/dram_writer.py,
hw/dram_wide_writer.py) and DFIIInitSequencer (hw/dram_init.py) in the Amaranth simulator, against a
behavioural LiteDRAM native port, with the ULX3S's 16-bit port and the ECPIX-5 DDR3's 128-bit one (two 64-bit
beats a word: ranges that start or end mid-word, byte enables).

The port model keeps LiteDRAM's contract (``litedram/core/crossbar.py``): commands accepted when the model
says ``ready`` (random stalls stand for refreshes and bank switches), read data returned in command order at
a latency of several cycles whatever the reader's state (``rdata`` cannot be held back), write data taken in
the cycle the model raises ``wdata.ready``, a few cycles after the command, with its byte enables. The reader's
``abort`` is tested with reads in flight (their words come after it and must not reach the next request), after
a time-out, and with reads that never come. The real controller and SDRAM model are exercised by
``sim/test_dram.py``.
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
from hw.dram_wide_writer import DRAMWideWriter
from hw.dram_writer import DRAMStreamWriter

pytestmark = pytest.mark.filterwarnings("error")

ADDR_WIDTH = 12  # 4096 words of 16 bits: 8 KiB
PORT_WIDTHS = (16, 128)


def _take(beats: list, layout, valid, ready, bits, prev):
    """One cycle of the reader's output: a beat offered and not taken must stay offered unchanged (``prev``: its
    bits, or None); a taken beat goes to ``beats`` as (data, last). Returns the beat still offered, or None."""
    if prev is not None:
        assert valid and bits == prev, "o: valid dropped or payload changed before the transfer"
    if valid and ready:
        c = data.Const(layout, bits)
        beats.append((int(c.data), bool(c.last)))
    return bits if valid and not ready else None


def addr_width_for(port_width: int, addr_width_16: int = ADDR_WIDTH) -> int:
    """The word address bits of a ``port_width`` port over the memory of ``addr_width_16`` 16-bit words."""
    return addr_width_16 - (port_width // 16).bit_length() + 1


def words_touched(start: int, n: int, word_bytes: int) -> int:
    """Port words holding bytes ``[start, start + n)`` (0 for an empty range)."""
    return 0 if n <= 0 else (start + n - 1) // word_bytes - start // word_bytes + 1


class NativePortModel:
    """A LiteDRAM native port over ``mem`` (a numpy array, taken as its little-endian bytes: byte ``a`` is byte
    ``a mod w`` of port word ``a // w``, ``w`` the port's bytes) with random command stalls and read
    latencies. Writes honour the byte enables (``wdata.we``): a clear bit leaves its byte as it was.

    ``lose_after``: reads after this many are never answered (a broken controller)."""

    def __init__(self, port, mem, rng, *, cmd_stall=0.0, latency=(3, 10), write_latency=3, lose_after=None):
        self.port, self.mem, self.rng = port, mem, rng
        self.bytes = mem.view(np.uint8)
        self.word_bytes = len(port.rdata.payload) // 8
        self.cmd_stall, self.latency, self.write_latency = cmd_stall, latency, write_latency
        self.lose_after = lose_after
        self.reads = 0
        self.returned = 0        # read words answered
        self.pending = 0         # reads taken and not yet answered, after the last cycle
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
                ctx.set(port.rdata.payload, self.read_word(reads[0][1]))
            wr = writes and writes[0][0] <= cycle
            ctx.set(port.wdata.ready, bool(wr))
            _, _, valid, cmd, wdata = await ctx.tick().sample(port.cmd.valid, port.cmd.payload, port.wdata.payload)
            if rd:
                reads.pop(0)
                self.returned += 1
            if wr:
                _, addr = writes.pop(0)
                self.write_word(addr, int(wdata.data), int(wdata.we))
                self.writes_taken += 1
            if valid and ready:
                if cmd.we:
                    writes.append((cycle + self.write_latency, int(cmd.addr)))
                else:
                    self.reads += 1
                    if self.lose_after is None or self.reads <= self.lose_after:
                        last_due = max(last_due, cycle + int(self.rng.integers(*self.latency, endpoint=True)))
                        reads.append((last_due, int(cmd.addr)))
            self.pending = len(reads)
            self.max_pending = max(self.max_pending, len(reads))
            cycle += 1

    def read_word(self, addr: int) -> int:
        w = self.word_bytes
        return int.from_bytes(self.bytes[addr * w:(addr + 1) * w].tobytes(), "little")

    def write_word(self, addr: int, value: int, we: int):
        w = self.word_bytes
        for k, byte in enumerate(value.to_bytes(w, "little")):
            if we >> k & 1:
                self.bytes[addr * w + k] = byte


def expected_beats(mem: np.ndarray, base: int, length: int, beat_bytes: int, align: int = 2) -> list[int]:
    """The beats a reader whose base granularity is ``align`` bytes delivers for (base, length)."""
    raw = mem.astype("<u2").tobytes()
    start = base & ~(align - 1)
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
                prev = _take(got[k], layout, valid, ready, bits, prev)
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


#: (base, length): word-aligned, mid-beat (16-bit port) or mid-word (128-bit port: 8 mod 16) bases, lengths of
#: odd and even beats, an empty one, one below a beat, the memory's end
REQUESTS = [(0, 64), (2, 8), (4096, 200), (6, 0), (8192 - 64, 64), (10, 7), (1000, 1000), (8, 8), (24, 24),
            (8192 - 8, 8), (0x108, 16)]


def reader(port_width, **kw) -> DRAMImageReader:
    return DRAMImageReader(addr_width=addr_width_for(port_width), port_width=port_width, **kw)


def reads_for(dut: DRAMImageReader, base: int, length: int) -> int:
    """Port reads for a request: the words of its whole beats, from base rounded down to ``base_align``."""
    start = base & ~(dut.base_align - 1)
    return words_touched(start, length // 8 * 8, len(dut.port.rdata.payload) // 8)


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
@pytest.mark.parametrize("cmd_stall, out_stall, depth", [(0.0, 0.0, 64), (0.3, 0.0, 64), (0.0, 0.6, 64),
                                                         (0.3, 0.6, 8), (0.5, 0.9, 2)])
def test_reader_delivers_every_byte(port_width, cmd_stall, out_stall, depth):
    mem = random_mem()
    dut = reader(port_width, depth=depth)
    got, _, model, err = run_reader(dut, mem.copy(), REQUESTS, seed=int(depth + 10 * out_stall),
                                    cmd_stall=cmd_stall, out_stall=out_stall)
    assert not err
    for (base, length), beats in zip(REQUESTS, got, strict=True):
        want = expected_beats(mem, base, length, 8, dut.base_align)
        assert [d for d, _ in beats] == want, f"request {(base, length)}"
        assert [last for _, last in beats] == [i == len(want) - 1 for i in range(len(want))]
    assert model.reads == sum(reads_for(dut, b, n) for b, n in REQUESTS)   # no read beyond a request
    assert model.max_pending <= depth                                      # reservations held


def test_wide_reader_reads_whole_words_and_drops_the_other_half():
    """128-bit port: a one-beat request in a word's upper half reads that one word and delivers its upper 64
    bits; three beats from 8 mod 16 read two words; the base granularity is the beat (bits 2:0 ignored)."""
    mem = random_mem()
    raw = mem.astype("<u2").tobytes()
    dut = reader(128)
    assert dut.base_align == 8
    got, _, model, err = run_reader(dut, mem, [(0x48, 8), (0x48, 24), (0x4C, 8)])
    assert not err and model.reads == 1 + 2 + 1
    assert [d for d, _ in got[0]] == [int.from_bytes(raw[0x48:0x50], "little")]
    assert [d for d, _ in got[1]] == [int.from_bytes(raw[a:a + 8], "little") for a in (0x48, 0x50, 0x58)]
    assert got[2] == got[0]


@pytest.mark.parametrize("port_width, shallow_depth", [(16, 4), (128, 2)])
def test_reader_keeps_the_port_busy(port_width, shallow_depth):
    """Without stalls a long read delivers a beat per cycle (16-bit port: a word per cycle; 128-bit port: a
    word every two cycles, half the port's command rate, enough for the core's one beat a cycle), latency 8
    hidden by 64 reservations; with a few reservations the same read is latency-bound: the FIFO's depth is
    what keeps the controller busy."""
    mem = random_mem()
    beats = 512
    _, (deep,), _, _ = run_reader(reader(port_width, depth=64), mem, [(0, beats * 8)], latency=(8, 8))
    _, (shallow,), _, _ = run_reader(reader(port_width, depth=shallow_depth), mem, [(0, beats * 8)],
                                     latency=(8, 8))
    port_rate = min(1.0, port_width / 64)       # beats a port word can carry per cycle at one word a cycle
    assert beats / deep > 0.98 * port_rate, f"{beats} beats in {deep} cycles"
    assert beats / shallow < 0.5 * port_rate, f"{beats} beats in {shallow} cycles with {shallow_depth} reservations"


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
@pytest.mark.parametrize("out_stall", [0.0, 0.7])
def test_reader_times_out_on_a_lost_read(port_width, out_stall):
    mem = random_mem()
    dut = reader(port_width, timeout=100)
    lose_after = 37 if port_width == 16 else 5
    got, _, model, err = run_reader(dut, mem, [(0, 512)], lose_after=lose_after, out_stall=out_stall,
                                    max_cycles=2000)
    assert err, "no error after a read that never returned"
    assert len(got[0]) < 64
    assert [d for d, _ in got[0]] == expected_beats(mem, 0, 8 * len(got[0]), 8)  # what came is right


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
def test_reader_stays_stopped_after_error(port_width):
    mem = random_mem()
    dut = reader(port_width, timeout=20)
    rng = np.random.default_rng(0)
    model = NativePortModel(dut.port, mem, rng, lose_after=0)

    async def tb(ctx):
        ctx.set(dut.req.payload, {"base": 0, "length": 64})
        ctx.set(dut.req.valid, 1)
        await ctx.tick()
        ctx.set(dut.req.valid, 0)
        ctx.set(dut.o.ready, 1)
        await ctx.tick().repeat(32 + 20 + 10)   # up to 32 reads issued, then 20 cycles without an answer
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


def run_abort(dut, model, first, second, *, abort_after_beats=None, abort_cycles=1, out_stall=0.0, seed=0,
              after_abort=None, max_cycles=3000) -> dict:
    """Start request ``first`` ((base, length)), abort the reader (``abort`` high ``abort_cycles`` cycles)
    after ``abort_after_beats`` of its beats or, with None, once ``error`` is set; call ``after_abort()``
    (to change the model), then run request ``second`` to its last beat. Returns ``beats`` (second's, as
    (data, last)), ``in_flight`` (the model's unanswered reads when the abort began), ``drained`` (words
    answered from then until second's acceptance), ``unanswered`` (reads taken and not answered at that
    acceptance, lost ones included), ``reads`` (read commands taken from the abort's end on), ``wait``
    (cycles from the abort's end to second's acceptance), ``extra`` (beats in the 40 cycles after second's
    last) and ``error`` (seen after the abort). Checks that
    nothing is delivered between the abort and second's acceptance and the stream rules on ``o``."""
    rng = np.random.default_rng(seed)
    layout = beat_layout(dut.o.payload.shape().size - 1)
    st = {"beats": [], "error": False}

    async def tb(ctx):
        ctx.set(dut.req.payload, {"base": first[0], "length": first[1]})
        ctx.set(dut.req.valid, 1)
        await ctx.tick().until(dut.req.ready)
        ctx.set(dut.req.valid, 0)
        taken = 0
        for _ in range(max_cycles):
            if (taken >= abort_after_beats) if abort_after_beats is not None else ctx.get(dut.error):
                break
            ready = rng.random() >= out_stall
            ctx.set(dut.o.ready, ready)
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            taken += valid and ready
        else:
            raise AssertionError("the abort's condition never came")
        ctx.set(dut.o.ready, 0)
        st["in_flight"], returned = model.pending, model.returned
        ctx.set(dut.abort, 1)
        await ctx.tick().repeat(abort_cycles)
        ctx.set(dut.abort, 0)
        assert not ctx.get(dut.busy) and not ctx.get(dut.error), "the abort left the reader busy or in error"
        if after_abort is not None:
            after_abort()
        reads = model.reads
        ctx.set(dut.req.payload, {"base": second[0], "length": second[1]})
        ctx.set(dut.req.valid, 1)
        st["wait"] = 0
        for _ in range(max_cycles):
            ready = rng.random() >= out_stall
            ctx.set(dut.o.ready, ready)
            _, _, accepted, valid, err = await ctx.tick().sample(dut.req.ready, dut.o.valid, dut.error)
            assert not valid, "a beat between the abort and the next request"
            st["error"] |= err
            if accepted:
                break
            st["wait"] += 1
        else:
            raise AssertionError("the next request was never accepted")
        ctx.set(dut.req.valid, 0)
        st["drained"], st["unanswered"] = model.returned - returned, model.reads - model.returned
        prev, n = None, second[1] // 8
        for _ in range(max_cycles):
            if len(st["beats"]) == n:
                break
            ready = rng.random() >= out_stall
            ctx.set(dut.o.ready, ready)
            _, _, valid, bits, err = await ctx.tick().sample(dut.o.valid, dut.o.payload.as_value(), dut.error)
            st["error"] |= err
            if err:
                break
            prev = _take(st["beats"], layout, valid, ready, bits, prev)
        ctx.set(dut.o.ready, 1)
        st["extra"] = 0
        for _ in range(40):   # nothing more: no late word turns into a beat
            _, _, valid = await ctx.tick().sample(dut.o.valid)
            st["extra"] += valid
        st["reads"] = model.reads - reads
        assert model.pending == 0

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(tb)
    sim.run()
    return st


def check_second(dut, mem, second, st):
    """``second``'s beats are exactly its bytes, ``last`` on the final one, read with its own reads only."""
    want = expected_beats(mem, *second, 8, dut.base_align)
    assert [d for d, _ in st["beats"]] == want, "the request after the abort got other bytes (stale words?)"
    assert [last for _, last in st["beats"]] == [i == len(want) - 1 for i in range(len(want))]
    assert st["extra"] == 0, "beats after the request's last"
    assert st["reads"] == reads_for(dut, *second)
    assert not st["error"]


#: after the abort: word-aligned, mid-beat on the 16-bit port, mid-word (8 mod 16) on the 128-bit one
SECOND = (0x1008, 200)


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
@pytest.mark.parametrize("out_stall, abort_cycles", [(0.0, 1), (0.5, 16)])
def test_abort_with_reads_in_flight(port_width, out_stall, abort_cycles):
    """An abort while reads are in flight (taken by the port, their words not yet back): those words still
    come after the abort and are dropped, and the next request's beats are exactly its own bytes (the 16
    cycles are the board's ``'X'``)."""
    mem = random_mem()
    dut = reader(port_width, depth=16)
    model = NativePortModel(dut.port, mem, np.random.default_rng(7), latency=(20, 40))
    st = run_abort(dut, model, (0x100, 512), SECOND, abort_after_beats=3, abort_cycles=abort_cycles,
                   out_stall=out_stall, seed=8)
    assert st["in_flight"] > 0, "no read in flight at the abort: the test proves nothing"
    check_second(dut, mem, SECOND, st)
    assert st["drained"] >= st["in_flight"] and st["unanswered"] == 0   # taken once the stale words were in
    assert model.max_pending <= 16


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
def test_abort_after_a_time_out_drops_the_late_words(port_width):
    """Reads slower than the time-out: ``error``; an abort while they are still in flight, then they come
    (after the abort, within ``timeout`` cycles of it) and are dropped; the next request is exact."""
    mem = random_mem()
    dut = reader(port_width, depth=16, timeout=60)
    model = NativePortModel(dut.port, mem, np.random.default_rng(9), latency=(110, 110))

    def fast():
        model.latency = (3, 10)

    st = run_abort(dut, model, (0, 64), SECOND, abort_cycles=16, after_abort=fast)
    assert st["in_flight"] > 0, "no read in flight at the abort: the test proves nothing"
    check_second(dut, mem, SECOND, st)
    assert st["drained"] >= st["in_flight"] and st["unanswered"] == 0
    assert st["wait"] > 0, "the next request accepted before the late words were in"


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
def test_abort_with_reads_that_never_return(port_width):
    """Reads lost by the controller: after the abort the reader waits ``timeout`` cycles without a word for
    them, takes them as lost (no ``error``: the time-out before the abort reported them) and runs the next
    request exactly."""
    mem = random_mem()
    dut = reader(port_width, depth=16, timeout=60)
    model = NativePortModel(dut.port, mem, np.random.default_rng(10), lose_after=2)

    def mend():
        model.lose_after = None

    st = run_abort(dut, model, (0, 256), SECOND, abort_cycles=16, after_abort=mend)
    check_second(dut, mem, SECOND, st)
    assert st["drained"] == 0 and st["unanswered"] > 0
    assert 60 <= st["wait"] <= 70, f"the next request accepted {st['wait']} cycles after the abort"


def run_hold(dut, model, request, holds, *, out_stall=0.0, seed=0, max_cycles=6000) -> dict:
    """Run ``request`` ((base, length)) to its last beat or to ``error``, raising ``hold`` for ``cycles``
    cycles once ``after`` of its beats were taken, for each ``(after, cycles)`` of ``holds``. Checks, while
    ``hold`` is high, that no command is offered and that once ``in_flight`` is low no read word comes.
    Returns ``beats`` ((data, last) each), ``error`` (and ``error_at``: cycles into the hold it was seen),
    ``quiet_after`` (per hold: cycles from its rise until ``in_flight`` was low, None if never) and
    ``outstanding_at_hold`` (per hold: the model's unanswered reads as it rose)."""
    rng = np.random.default_rng(seed)
    layout = beat_layout(dut.o.payload.shape().size - 1)
    st = {"beats": [], "error": False, "error_at": None, "quiet_after": [], "outstanding_at_hold": []}
    n = request[1] // 8

    async def tb(ctx):
        ctx.set(dut.req.payload, {"base": request[0], "length": request[1]})
        ctx.set(dut.req.valid, 1)
        await ctx.tick().until(dut.req.ready)
        ctx.set(dut.req.valid, 0)
        pending = list(holds)
        left, into, prev = 0, 0, None       # cycles of the current hold left, cycles into it
        for _ in range(max_cycles):
            if len(st["beats"]) == n:
                break
            if not left and pending and len(st["beats"]) >= pending[0][0]:
                left, into = pending.pop(0)[1], 0
                st["outstanding_at_hold"].append(model.reads - model.returned)
                st["quiet_after"].append(None)
            ctx.set(dut.hold, left > 0)
            ready = rng.random() >= out_stall
            ctx.set(dut.o.ready, ready)
            _, _, valid, bits, err, cmd_valid, in_flight, rvalid = await ctx.tick().sample(
                dut.o.valid, dut.o.payload.as_value(), dut.error, dut.port.cmd.valid, dut.in_flight,
                dut.port.rdata.valid)
            if left:
                assert not cmd_valid, "a read command offered while held"
                if st["quiet_after"][-1] is not None:
                    assert not rvalid, "a read word after in_flight fell, while held"
                elif not in_flight:
                    st["quiet_after"][-1] = into
            if err:
                st["error"], st["error_at"] = True, into if left else None
                return
            prev = _take(st["beats"], layout, valid, ready, bits, prev)
            if left:
                left, into = left - 1, into + 1
        else:
            raise AssertionError(f"{len(st['beats'])} of {n} beats in {max_cycles} cycles")
        ctx.set(dut.hold, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(tb)
    sim.run()
    return st


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
@pytest.mark.parametrize("out_stall", [0.0, 0.5])
def test_hold_pauses_the_reads_and_the_request_goes_on(port_width, out_stall):
    """``hold`` three times during a long read, each longer than the time-out: no command is offered while
    held, the reads already taken come in (``in_flight`` falls within their latency, and after that no word
    comes), no ``error``; after each hold the request goes on, and its beats are exactly its bytes, read once
    each."""
    mem = random_mem()
    dut = reader(port_width, depth=16, timeout=60)
    model = NativePortModel(dut.port, mem, np.random.default_rng(12), cmd_stall=0.2, latency=(5, 20))
    request = (0x208, 800)
    st = run_hold(dut, model, request, [(3, 150), (40, 100), (80, 61)], out_stall=out_stall, seed=13)
    assert not st["error"], "a time-out while held with nothing outstanding"
    assert max(st["outstanding_at_hold"]) > 0, "no read in flight as a hold rose: the test proves nothing"
    assert all(q is not None and q <= 20 + 2 for q in st["quiet_after"]), st["quiet_after"]
    want = expected_beats(mem, *request, 8, dut.base_align)
    assert [d for d, _ in st["beats"]] == want
    assert [last for _, last in st["beats"]] == [i == len(want) - 1 for i in range(len(want))]
    assert model.reads == reads_for(dut, *request)


@pytest.mark.parametrize("port_width", PORT_WIDTHS)
def test_hold_still_times_the_reads_outstanding(port_width):
    """Reads taken before ``hold`` rose that never return: ``in_flight`` stays high and the reader still
    stops with ``error`` after ``timeout`` cycles, while held."""
    mem = random_mem()
    dut = reader(port_width, depth=16, timeout=60)
    model = NativePortModel(dut.port, mem, np.random.default_rng(14), lose_after=6 if port_width == 16 else 2)
    st = run_hold(dut, model, (0, 512), [(1, 1000)])
    assert st["outstanding_at_hold"][0] > 0
    assert st["error"] and st["error_at"] is not None and 60 <= st["error_at"] <= 60 + 10 + 5, st["error_at"]
    assert st["quiet_after"] == [None]


@pytest.mark.parametrize("kw, exc", [({"addr_width": 0}, ValueError), ({"addr_width": 8, "port_width": 12}, ValueError),
                                     ({"addr_width": 8, "beat_width": 48}, ValueError),
                                     ({"addr_width": 8, "port_width": 96}, ValueError),
                                     ({"addr_width": 8, "port_width": 128, "beat_width": 48}, ValueError),
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
        assert r.base_align == 2
        w = DRAMImageReader(addr_width=25, port_width=128, beat_width=64)   # the ECPIX-5's DDR3: 512 MiB
        assert w.byte_addr_width == 29 and w.base_align == 8
        assert w.req.payload.shape().size == 29 + 30 and len(w.port.rdata.payload) == 128
        assert w.o.payload.shape() == beat_layout(64)
        assert DRAMImageReader(addr_width=8, port_width=128, beat_width=128).base_align == 16
        del r, w
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


def run_writer(dut, mem, requests, *, seed=0, cmd_stall=0.0, in_idle=0.0):
    """Write ``requests`` ((base, payload bytes) each) one after another through ``dut``; returns the model.
    Checks that each request takes exactly its beats and that the writer ends idle without error."""
    rng = np.random.default_rng(seed)
    model = NativePortModel(dut.port, mem, rng, cmd_stall=cmd_stall)

    async def tb(ctx):
        for base, payload in requests:
            beats = [int.from_bytes(payload[i:i + 8], "little") for i in range(0, len(payload), 8)]
            ctx.set(dut.req.payload, {"base": base, "length": len(payload)})
            ctx.set(dut.req.valid, 1)
            await ctx.tick().until(dut.req.ready)
            ctx.set(dut.req.valid, 0)
            taken = 0
            for _ in range(20000):
                valid = rng.random() >= in_idle
                ctx.set(dut.i.payload, beats[taken] if taken < len(beats) else 0xDEAD)
                ctx.set(dut.i.valid, valid)
                _, _, ready, busy, err = await ctx.tick().sample(dut.i.ready, dut.busy, dut.error)
                assert not err
                assert not (ready and taken >= len(beats)), "a beat beyond the request taken"
                taken += valid and ready
                if not busy and taken >= len(beats):
                    break
            ctx.set(dut.i.valid, 0)
            assert taken == len(beats) and not ctx.get(dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(tb)
    sim.run()
    return model


#: (base, beats): a word's upper half alone, its lower half alone, from mid-word to mid-word (odd and even
#: beats), word-aligned odd and even runs, the memory's last beat
WIDE_WRITES = [(0x108, 1), (0x200, 1), (0x318, 7), (0x428, 4), (0x500, 5), (0x600, 32), (8192 - 8, 1)]


@pytest.mark.parametrize("cmd_stall, in_idle", [(0.0, 0.0), (0.4, 0.5)])
def test_wide_writer_writes_only_its_beats(cmd_stall, in_idle):
    """128-bit port: each write lands at its byte addresses and every other byte, the other half of a word
    it starts or ends in included, keeps its (random) value; one command per word touched."""
    rng = np.random.default_rng(4)
    mem = random_mem(seed=2)
    want = bytearray(mem.view(np.uint8).tobytes())
    requests = [(base, rng.bytes(8 * n)) for base, n in WIDE_WRITES]
    for base, payload in requests:
        want[base:base + len(payload)] = payload
    dut = DRAMWideWriter(addr_width=addr_width_for(128), port_width=128)
    model = run_writer(dut, mem, requests, seed=5, cmd_stall=cmd_stall, in_idle=in_idle)
    assert mem.view(np.uint8).tobytes() == bytes(want)
    assert model.writes_taken == sum(words_touched(b, len(p), 16) for b, p in requests)


def test_wide_writer_single_beat_in_the_upper_half():
    """One beat at 8 mod 16: one write command, byte enables 0xFF00 (the upper 8 bytes), the lower half and
    everything else untouched; the reader then returns it at the same byte address."""
    mem = random_mem(seed=3)
    before = mem.view(np.uint8).copy()
    dut = DRAMWideWriter(addr_width=addr_width_for(128), port_width=128)
    seen = []
    model = NativePortModel(dut.port, mem, np.random.default_rng(0))
    write_word = model.write_word
    model.write_word = lambda addr, value, we: (seen.append((addr, we)), write_word(addr, value, we))
    payload = bytes(range(0xA0, 0xA8))

    async def tb(ctx):
        ctx.set(dut.req.payload, {"base": 0x48, "length": 8})
        ctx.set(dut.req.valid, 1)
        await ctx.tick().until(dut.req.ready)
        ctx.set(dut.req.valid, 0)
        ctx.set(dut.i.payload, int.from_bytes(payload, "little"))
        ctx.set(dut.i.valid, 1)
        await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)
        await ctx.tick().repeat(20)
        assert not ctx.get(dut.busy) and not ctx.get(dut.error)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(tb)
    sim.run()
    assert seen == [(0x48 // 16, 0xFF00)]
    after = mem.view(np.uint8)
    assert after[0x48:0x50].tobytes() == payload
    assert np.array_equal(np.delete(after, np.s_[0x48:0x50]), np.delete(before, np.s_[0x48:0x50]))
    got, _, _, err = run_reader(reader(128), mem, [(0x40, 16), (0x48, 8)])
    assert not err and got[1] == [(int.from_bytes(payload, "little"), True)]
    assert got[0][1] == got[1][0] and got[0][0][0] == int.from_bytes(before[0x40:0x48].tobytes(), "little")


def test_wide_writer_at_full_rate():
    """Without stalls the wide writer takes a beat a cycle: 256 beats (128 words) in under 270 cycles."""
    mem = random_mem()
    dut = DRAMWideWriter(addr_width=addr_width_for(128), port_width=128)
    model = NativePortModel(dut.port, mem, np.random.default_rng(0))
    payload = np.random.default_rng(1).bytes(8 * 256)
    beats = [int.from_bytes(payload[i:i + 8], "little") for i in range(0, len(payload), 8)]
    st = {}

    async def tb(ctx):
        ctx.set(dut.req.payload, {"base": 0, "length": len(payload)})
        ctx.set(dut.req.valid, 1)
        await ctx.tick().until(dut.req.ready)
        ctx.set(dut.req.valid, 0)
        ctx.set(dut.i.valid, 1)
        cycles, taken = 0, 0
        while taken < len(beats):
            ctx.set(dut.i.payload, beats[taken])
            _, _, ready = await ctx.tick().sample(dut.i.ready)
            taken += ready
            cycles += 1
        ctx.set(dut.i.valid, 0)
        st["cycles"] = cycles
        await ctx.tick().until(~dut.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(model.process, background=True)
    sim.add_testbench(tb)
    sim.run()
    assert st["cycles"] < 270, f"256 beats taken in {st['cycles']} cycles"
    assert mem.view(np.uint8)[:len(payload)].tobytes() == payload and model.writes_taken == 128


@pytest.mark.parametrize("kw, exc", [({"port_width": 64}, ValueError), ({"port_width": 16}, ValueError),
                                     ({"port_width": 96}, ValueError), ({"beat_width": 48}, ValueError),
                                     ({"depth": 1}, ValueError), ({"addr_width": 8.0}, TypeError)])
def test_wide_writer_parameters(kw, exc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(exc):
            DRAMWideWriter(**{"addr_width": 8, **kw})
        gc.collect()


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
