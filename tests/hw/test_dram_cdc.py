"""hw.dram_cdc.NativePortCDC in the Amaranth simulator, with two clocks of unrelated periods.

In the ``dram`` domain a behavioural controller (random ``cmd.ready`` stalls, a write's data taken a fixed
number of cycles after its command, read data returned a fixed number of cycles after theirs, never held back,
each read returning the last write before it in command order). In ``sync`` a user that issues random reads
and writes over a few addresses, holds each accepted write's data until taken (from two edges after
acceptance, as ``DRAMStreamWriter``), and issues a read only while its own small read buffer, drained at
random, has room for it (the reader's backpressure). Every read must return the data last written at its
address before it, in order, nothing lost or duplicated.
"""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module, UnusedElaboratable
from amaranth.sim import Simulator

from hw.dram_cdc import WDATA_DELAY, NativePortCDC

AW, DW = 5, 32
#: edges after its command's acceptance from which the user presents a write's data: DRAMStreamWriter puts a
#: word into its SyncFIFOBuffered in the accepting cycle, which shows it two edges later
DATA_AFTER = 2


class Bench:
    """The DUT in ``sync`` -> ``dram`` and the two behavioural sides (module docstring)."""

    def __init__(self, *, period_sync, period_dram, depth=8, n_ops=300, p_write=0.5, p_idle=0.2, p_stall=0.3,
                 read_buffer=4, p_drain=0.5, wlat=3, rlat=6, addresses=8, seed=0):
        self.dut = NativePortCDC(AW, DW, depth=depth)
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.domains.dram = ClockDomain("dram")
        m.submodules.dut = self.dut
        self.top = m
        self.periods = (period_sync, period_dram)
        self.rng = np.random.default_rng(seed)
        self.n_ops, self.p_write, self.p_idle, self.p_stall = n_ops, p_write, p_idle, p_stall
        self.read_buffer, self.p_drain, self.wlat, self.rlat, self.addresses = read_buffer, p_drain, wlat, rlat, \
            addresses
        self.errors = []
        self.reads_expected = []   # per read, in issue order: the value last written before it
        self.reads_got = []
        self.writes_taken = 0
        self.ctl = {"cmds": 0, "cycles": 0, "first": None, "last": None, "taken": [], "returned": 0}
        self.done = False

    # ------------------------------------------------------------------ user (sync)
    async def user(self, ctx):
        dut, rng = self.dut.port, self.rng
        model = {}
        wqueue = []          # data of accepted writes, oldest first, not yet taken
        outstanding = 0      # reads issued whose word has not come back
        buffered = 0         # words in the reader's buffer
        ops = 0
        pending = None
        cycle = 0
        while ops < self.n_ops or outstanding or wqueue or buffered:
            if pending is None and ops < self.n_ops and rng.random() >= self.p_idle:
                addr = int(rng.integers(self.addresses))
                if rng.random() < self.p_write:
                    pending = (1, addr, int(rng.integers(1 << DW)))
                elif outstanding + buffered < self.read_buffer:
                    pending = (0, addr, None)
            ctx.set(dut.cmd.valid, pending is not None)
            if pending is not None:
                ctx.set(dut.cmd.payload, {"we": pending[0], "addr": pending[1]})
            # the data of the oldest write not yet taken, from DATA_AFTER edges after its acceptance (before
            # that, garbage)
            ready_data = wqueue and cycle + 1 - wqueue[0][0] >= DATA_AFTER
            ctx.set(dut.wdata.payload, {"data": wqueue[0][1] if ready_data else 0xDEAD0000 | cycle & 0xFFFF,
                                        "we": (1 << DW // 8) - 1})
            _, _, c_ready, w_ready, r_valid, r_data = await ctx.tick().sample(
                dut.cmd.ready, dut.wdata.ready, dut.rdata.valid, dut.rdata.payload)
            cycle += 1
            if w_ready:
                if not wqueue:
                    self.errors.append(f"sync {cycle}: write data taken with no write accepted before")
                else:
                    t_acc, _ = wqueue.pop(0)
                    if cycle - t_acc < DATA_AFTER:
                        self.errors.append(f"sync {cycle}: write data taken {cycle - t_acc} cycles after its "
                                           "command")
                    self.writes_taken += 1
            if r_valid:
                if outstanding == 0:
                    self.errors.append(f"sync {cycle}: read data with no read outstanding")
                else:
                    outstanding -= 1
                    buffered += 1
                    self.reads_got.append(int(r_data))
                    if buffered > self.read_buffer:
                        self.errors.append(f"sync {cycle}: read buffer overflow")
            if buffered and rng.random() < self.p_drain:
                buffered -= 1
            if pending is not None and c_ready:
                we, addr, value = pending
                if we:
                    model[addr] = value
                    wqueue.append((cycle, value))
                else:
                    self.reads_expected.append(model.get(addr, (1 << DW) - 1))   # never written: the fake's all-ones
                    outstanding += 1
                ops += 1
                pending = None
            if cycle > 200 * self.n_ops + 2000:
                self.errors.append("sync: timed out")
                break
        ctx.set(dut.cmd.valid, 0)
        await ctx.tick().repeat(50)   # nothing more may come back
        self.done = True

    # ------------------------------------------------------------------ controller (dram)
    async def controller(self, ctx):
        dut, rng = self.dut.dram_port, self.rng
        history = {}   # addr -> [(command index, value)] in command order
        writes = []    # (cycle to take data, addr, command index)
        reads = []     # (cycle to return, addr, command index)
        cycle = 0

        def value(addr, index):   # the last write to addr before command `index` (all-ones if none)
            return next((v for i, v in reversed(history.get(addr, [])) if i < index), (1 << DW) - 1)

        while True:
            ready = rng.random() >= self.p_stall
            ctx.set(dut.cmd.ready, ready)
            take = bool(writes) and writes[0][0] == cycle
            ctx.set(dut.wdata.ready, take)
            ret = bool(reads) and reads[0][0] == cycle
            ctx.set(dut.rdata.valid, ret)
            if ret:
                ctx.set(dut.rdata.payload, value(reads[0][1], reads[0][2]))
            _, _, valid, payload, wdata = await ctx.tick("dram").sample(dut.cmd.valid, dut.cmd.payload,
                                                                         dut.wdata.payload)
            if take:
                _, addr, index = writes.pop(0)
                history.setdefault(addr, []).append((index, int(wdata.data)))
                self.ctl["taken"].append(int(wdata.data))
                if int(wdata.we) != (1 << DW // 8) - 1:
                    self.errors.append(f"dram {cycle}: write byte enables {int(wdata.we):#x}")
            if ret:
                reads.pop(0)
                self.ctl["returned"] += 1
            if valid and ready:
                # a write's data taken at +wlat, a read's word back at +rlat (wlat <= rlat: the data of every
                # write before a read are in by its return); a read returns the last write before it in command
                # order; each pipeline has at most one event per cycle
                index = self.ctl["cmds"]
                self.ctl["cmds"] += 1
                self.ctl["first"] = cycle if self.ctl["first"] is None else self.ctl["first"]
                self.ctl["last"] = cycle
                if payload.we:
                    writes.append((cycle + 1 + self.wlat, int(payload.addr), index))
                else:
                    reads.append((cycle + 1 + self.rlat, int(payload.addr), index))
            cycle += 1

    def run(self):
        sim = Simulator(self.top)
        sim.add_clock(self.periods[0] * 1e-9, domain="sync")
        sim.add_clock(self.periods[1] * 1e-9, domain="dram", phase=self.periods[1] * 0.37e-9)
        sim.add_testbench(self.controller, background=True)
        sim.add_testbench(self.user)
        sim.run()
        return self


def check(b: Bench):
    assert not b.errors, b.errors[:5]
    assert b.done
    n_reads = len(b.reads_expected)
    assert n_reads > 0 and (b.writes_taken > 0 or b.p_write == 0)
    assert b.ctl["returned"] == n_reads == len(b.reads_got), "a read lost or duplicated"
    assert b.reads_got == b.reads_expected, "a read returned other data than last written, or out of order"
    assert b.ctl["cmds"] == b.n_ops and b.writes_taken == len(b.ctl["taken"]) == b.n_ops - n_reads


@pytest.mark.parametrize("period_sync, period_dram", [(13.3, 10.0), (10.0, 13.3), (4.1, 13.3), (13.3, 4.1)])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_reads_and_writes_cross_unchanged(period_sync, period_dram, seed):
    check(Bench(period_sync=period_sync, period_dram=period_dram, seed=seed).run())


@pytest.mark.parametrize("period_sync, period_dram", [(13.3, 10.0), (10.0, 13.3)])
def test_long_read_latency_and_small_fifos(period_sync, period_dram):
    """Reads outstanding at the controller beyond the FIFO's depth: the CDC must hold reads back."""
    b = Bench(period_sync=period_sync, period_dram=period_dram, depth=4, rlat=20, wlat=2, read_buffer=12,
              p_write=0.3, p_idle=0.0, p_stall=0.1, p_drain=0.9, seed=7).run()
    check(b)


@pytest.mark.parametrize("rlat", [0, 1, 2, 5])
def test_read_data_fifo_never_overflows(rlat):
    """A fast controller clock, a slow user one that drains its read data every cycle, reads back to back and a
    4-entry read-data FIFO: the FIFO fills, and every word the controller returns must still find room."""
    b = Bench(period_sync=13.3, period_dram=4.1, depth=4, rlat=rlat, wlat=0, n_ops=300, p_write=0.1, p_idle=0.0,
              p_stall=0.0, read_buffer=64, p_drain=1.0, seed=11).run()
    check(b)


def test_streaming_reads_run_at_the_slower_clock():
    """No stalls, no idles, a reader that drains every cycle: reads issue at one per cycle of the slower domain
    (here the controller's), with depth 16 covering the latency."""
    b = Bench(period_sync=10.0, period_dram=13.3, depth=16, n_ops=400, p_write=0.0, p_idle=0.0, p_stall=0.0,
              read_buffer=64, p_drain=1.0, rlat=6, seed=3).run()
    check(b)
    span = b.ctl["last"] - b.ctl["first"] + 1
    assert b.ctl["cmds"] / span > 0.95, (b.ctl["cmds"], span)


def test_parameters():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        for kw, exc in (({"depth": 6}, ValueError), ({"depth": 2}, ValueError), ({"depth": 8.0}, TypeError),
                        ({"to_domain": "sync"}, ValueError), ({"from_domain": 1}, TypeError)):
            with pytest.raises(exc):
                NativePortCDC(AW, DW, **kw)
        with pytest.raises(ValueError):
            NativePortCDC(0, DW)
        gc.collect()
        c = NativePortCDC(AW, DW, depth=16)
        assert c.depth == 16 and c.port.signature.flip() == c.dram_port.signature
        assert WDATA_DELAY >= DATA_AFTER
        del c
        gc.collect()
