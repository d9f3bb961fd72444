# amaranth: UnusedElaboratable=no
"""hw.wishbone_cdc.WishboneCDC in the Amaranth simulator, with two clocks of unrelated periods.

In ``sync`` a manager (as ``DRAMBoard``'s control-bus engine: one Wishbone classic transfer at a time, random
reads and writes over a few word addresses, withdrawn after a time-out without ``ack``); in ``dram`` a register
file that acknowledges after a random number of cycles (or, at one address, never). The checks: every transfer
reaches the register file once with its address, direction and data (a withdrawn one at most once), every
acknowledged read returns the register's value, ``ack`` comes only while the manager presents a transfer, the
subordinate's bus holds still until its ``ack``, and after a subordinate that never answers the manager's
time-out frees the bridge for the next transfer.
"""

import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from hw.wishbone_cdc import WishboneCDC

#: the word address at which the fake subordinate never acknowledges
HANG = 0x3FF_FFFF


class Bench:
    def __init__(self, *, period_sync, period_dram, n_ops=120, max_delay=3, timeout=None, p_hang=0.0,
                 addresses=6, seed=0):
        self.dut = WishboneCDC()
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.domains.dram = ClockDomain("dram")
        m.submodules.dut = self.dut
        self.top, self.periods = m, (period_sync, period_dram)
        self.rng = np.random.default_rng(seed)
        self.n_ops, self.max_delay, self.timeout, self.p_hang, self.addresses = (n_ops, max_delay, timeout, p_hang,
                                                                                  addresses)
        self.issued = []        # manager: (we, adr, dat_w, outcome) per transfer; outcome "ack" or "withdrawn"
        self.read_back = []     # manager: (index into issued, dat_r) per acknowledged read
        self.done_at_sub = []   # subordinate: (we, adr, dat_w, dat_r) per transfer it acknowledged
        self.withdrawn_at_sub = 0   # transfers the subordinate saw dropped before its ack
        self.errors = []
        self.finished = False
        self.busy_after_hang = []   # sync cycles from each withdrawal of a hung transfer to the bridge idle

    async def manager(self, ctx):
        bus, rng = self.dut.bus, self.rng
        for i in range(self.n_ops):
            for _ in range(int(rng.integers(0, 3))):          # idle cycles between transfers
                ctx.set(bus.cyc, 0)
                ctx.set(bus.stb, 0)
                _, _, ack = await ctx.tick().sample(bus.ack)
                if ack:
                    self.errors.append(f"ack while idle before transfer {i}")
            we = int(rng.integers(2))
            adr = HANG if rng.random() < self.p_hang else int(rng.integers(self.addresses))
            data = int(rng.integers(1 << 32))
            ctx.set(bus.adr, adr)
            ctx.set(bus.we, we)
            ctx.set(bus.dat_w, data if we else int(rng.integers(1 << 32)))      # garbage on reads
            ctx.set(bus.cyc, 1)
            ctx.set(bus.stb, 1)
            waited = 0
            while True:
                _, _, ack, dat_r = await ctx.tick().sample(bus.ack, bus.dat_r)
                if ack:
                    self.issued.append((we, adr, data if we else None, "ack"))
                    if not we:
                        self.read_back.append((len(self.issued) - 1, dat_r))
                    break
                waited += 1
                if self.timeout is not None and waited >= self.timeout:
                    self.issued.append((we, adr, data if we else None, "withdrawn"))
                    break
            ctx.set(bus.cyc, 0)
            ctx.set(bus.stb, 0)
            if self.issued[-1][3] == "withdrawn":     # a withdrawal is cyc low for a cycle at least (Wishbone)
                _, _, ack = await ctx.tick().sample(bus.ack)
                if ack:
                    self.errors.append(f"ack after transfer {i} was withdrawn")
            if adr == HANG:             # the bridge frees itself once the cancel has been answered
                n = 0
                while ctx.get(self.dut.busy) and n < 200:
                    await ctx.tick()
                    n += 1
                self.busy_after_hang.append(n)
        for _ in range(40):                                 # a stray ack after the last transfer would show here
            _, _, ack = await ctx.tick().sample(bus.ack)
            if ack:
                self.errors.append("ack after the last transfer")
        self.finished = True

    async def subordinate(self, ctx):
        sub, rng = self.dut.sub, self.rng
        mem = {}
        ack_now, data_now, wait, held = 0, 0, None, None
        while True:
            ctx.set(sub.ack, ack_now)
            ctx.set(sub.dat_r, data_now)
            _, _, cyc, stb, we, adr, dat_w = await ctx.tick("dram").sample(sub.cyc, sub.stb, sub.we, sub.adr,
                                                                           sub.dat_w)
            if cyc != stb:
                self.errors.append("sub.cyc and sub.stb differ")
            req = (we, adr, dat_w if we else None)
            if ack_now and cyc and stb:                      # the transfer ends at this edge
                self.done_at_sub.append((*req, None if we else data_now))
                if we:
                    mem[adr] = dat_w
                ack_now, wait, held = 0, None, None
                continue
            ack_now = 0
            if not (cyc and stb):
                if held is not None:
                    self.withdrawn_at_sub += 1
                wait, held = None, None
                continue
            if held is None:
                held = req
                wait = None if adr == HANG else int(rng.integers(0, self.max_delay + 1))
            elif req != held:
                self.errors.append(f"sub bus changed during a transfer: {held} -> {req}")
            if wait is not None:
                if wait == 0:
                    ack_now, data_now = 1, mem.get(adr, 0)
                else:
                    wait -= 1

    def run(self):
        sim = Simulator(self.top)
        sim.add_clock(self.periods[0] * 1e-9, domain="sync")
        sim.add_clock(self.periods[1] * 1e-9, domain="dram", phase=self.periods[1] * 0.37e-9)
        sim.add_testbench(self.manager)
        sim.add_testbench(self.subordinate, background=True)
        sim.run()
        assert self.finished
        return self

    def check(self):
        assert not self.errors, self.errors[:5]
        # the subordinate saw the manager's transfers in order: every acknowledged one once, a withdrawn one at
        # most once (it may have ended before the cancel arrived); where = issued index -> subordinate index
        where, j = {}, 0
        for i, (we, adr, data, outcome) in enumerate(self.issued):
            if j < len(self.done_at_sub) and self.done_at_sub[j][:3] == (we, adr, data):
                where[i], j = j, j + 1
            elif outcome == "ack":
                raise AssertionError(f"acknowledged transfer {i} {(we, adr, data)} never reached the subordinate")
        assert j == len(self.done_at_sub), f"the subordinate saw a transfer the manager did not make: " \
                                           f"{self.done_at_sub[j]}"
        # every acknowledged read returned the register's value at the subordinate then (the last write there)
        mem, value_at = {}, []
        for we, adr, data, _ in self.done_at_sub:
            value_at.append(mem.get(adr, 0))
            if we:
                mem[adr] = data
        for i, dat_r in self.read_back:
            k = where[i]
            assert dat_r == self.done_at_sub[k][3] == value_at[k], (i, dat_r, self.done_at_sub[k], value_at[k])
        return self


@pytest.mark.parametrize("period_sync,period_dram", [(10.0, 13.3), (13.3, 10.0), (4.1, 13.3), (13.3, 4.1)])
def test_every_transfer_arrives_once_and_reads_return_their_data(period_sync, period_dram):
    b = Bench(period_sync=period_sync, period_dram=period_dram, n_ops=150, seed=int(period_sync * 10)).run().check()
    assert all(x[3] == "ack" for x in b.issued) and len(b.issued) == 150
    # without withdrawals the subordinate saw exactly the manager's transfers, in order
    assert [s[:3] for s in b.done_at_sub] == [x[:3] for x in b.issued]
    assert sum(1 for x in b.issued if x[0] == 0) == len(b.read_back) > 30
    assert b.withdrawn_at_sub == 0


@pytest.mark.parametrize("period_sync,period_dram", [(10.0, 13.3), (4.1, 13.3), (13.3, 4.1)])
def test_withdrawn_transfers_reach_the_subordinate_at_most_once(period_sync, period_dram):
    """A time-out shorter than some of the subordinate's delays: some transfers are withdrawn, each of them
    either ended at the subordinate before the cancel or never reached it; none is acknowledged to the manager
    late, and the acknowledged ones still carry the right data."""
    timeout = round(4 + 11 * period_dram / period_sync)      # about a delay of 7 of the 0-14 dram cycles
    b = Bench(period_sync=period_sync, period_dram=period_dram, n_ops=200, max_delay=14, timeout=timeout,
              seed=7).run().check()
    outcomes = [x[3] for x in b.issued]
    assert outcomes.count("withdrawn") > 10 and outcomes.count("ack") > 50, outcomes.count("withdrawn")
    assert b.withdrawn_at_sub > 0          # some were withdrawn at the subordinate while it was still waiting


@pytest.mark.parametrize("period_sync,period_dram", [(10.0, 13.3), (13.3, 4.1)])
def test_a_subordinate_that_never_acknowledges_leaves_the_manager_its_time_out(period_sync, period_dram):
    b = Bench(period_sync=period_sync, period_dram=period_dram, n_ops=80, timeout=60, p_hang=0.15,
              seed=3).run().check()
    hung = [x for x in b.issued if x[1] == HANG]
    assert len(hung) >= 5 and all(x[3] == "withdrawn" for x in hung)
    assert all(x[3] == "ack" for x in b.issued if x[1] != HANG)       # everything else still gets through
    assert HANG not in {s[1] for s in b.done_at_sub}
    assert b.withdrawn_at_sub == len(hung)
    # the bridge is idle a few cycles after each withdrawal (the cancel there and its answer back)
    assert max(b.busy_after_hang) <= 4 + 4 * max(1.0, period_dram / period_sync), b.busy_after_hang


def test_wishbone_cdc_checks_its_domains():
    with pytest.raises(ValueError, match="no crossing"):
        WishboneCDC(from_domain="dram", to_domain="dram")
    with pytest.raises(TypeError, match="to_domain must be a str"):
        WishboneCDC(to_domain=1)
