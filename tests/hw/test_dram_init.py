"""hw.dram_init.DRAMControl (the control bus of hw.dram.LiteDRAMCore handed from the power-up sequencer to the
host, and the user port held until the host enables it), in the Amaranth simulator against a fake ``wb_ctrl``
subordinate (a register file that acknowledges after a random wait) and a fake native port."""

import gc
import re
import warnings

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from hw import dram
from hw.dram_init import DRAMControl, WishboneSignature

WRITES = ((0x1000, 0xE, 0), (0x0, 0, 0), (0x4, 0, 0), (0x100C, 0x400, 3), (0x1008, 1, 40), (0x1000, 1, 0),
          (0x0, 1, 0))


def run_control(*, hold_port, host_ops, enable_at=None, never_ack_at=None, timeout=32, seed=0):
    """Simulate DRAMControl with a register-file subordinate on ``bus``.

    ``host_ops``: ``(cycle to start, "w"/"r", byte address, value)`` run in order on ``ctrl`` by the host, each
    from its cycle or after the previous one. A native-port user presents one command from cycle 0; the fake
    core's ``cmd.ready`` is always high. Returns a dict with the subordinate's log ``(cycle, owner, "w"/"r",
    byte address, value)``, the host's results and ack cycles, the sequencer's done/error cycles
    (``never_ack_at``: the index of a sequencer write never acknowledged), the cycles
    where ``ctrl.ack`` was high, and the first cycle a command reached the core.
    """
    dut = DRAMControl(writes=WRITES, addr_width=8, data_width=16, timeout=timeout, hold_port=hold_port)
    rng = np.random.default_rng(seed)
    regs = {}
    st = {"log": [], "host": [], "host_acks": [], "done_at": None, "error_at": None, "cmd_at": None,
          "ready_at": None}
    cycle = [0]

    async def sub(ctx):
        wait, acked = None, False
        while True:
            cyc, stb = ctx.get(dut.bus.cyc), ctx.get(dut.bus.stb)
            host_owns = ctx.get(dut.done) or ctx.get(dut.error)
            ack = False
            # never two acks in a row (as LiteX's Wishbone-to-CSR bridge): the host testbench drops its
            # strobe after the edge of its ack, possibly after this process has looked at it
            if cyc and stb and not acked and (host_owns or len(st["log"]) != never_ack_at):
                if wait is None:
                    wait = int(rng.integers(0, 3, endpoint=True))
                ack = wait == 0
                wait = None if ack else wait - 1
            else:
                wait = None
            adr = ctx.get(dut.bus.adr)
            ctx.set(dut.bus.ack, ack)
            ctx.set(dut.bus.dat_r, regs.get(adr, 0xA5A50000 | adr) if ack else 0)
            we, dat = ctx.get(dut.bus.we), ctx.get(dut.bus.dat_w)
            done, err, cack = ctx.get(dut.done), ctx.get(dut.error), ctx.get(dut.ctrl.ack)
            cmd_v, cmd_r = ctx.get(dut.core_port.cmd.valid), ctx.get(dut.port.cmd.ready)
            if ack:
                owner = "host" if (done or err) else "seq"
                if we:
                    regs[adr] = dat
                st["log"].append((cycle[0], owner, "w" if we else "r", adr * 4, dat if we else regs.get(adr)))
            acked = ack
            if cack:
                st["host_acks"].append(cycle[0])
            if done and st["done_at"] is None:
                st["done_at"] = cycle[0]
            if err and st["error_at"] is None:
                st["error_at"] = cycle[0]
            if cmd_v and st["cmd_at"] is None:
                st["cmd_at"] = cycle[0]
            if cmd_r and st["ready_at"] is None:
                st["ready_at"] = cycle[0]
            await ctx.tick()
            cycle[0] += 1

    async def host(ctx):
        for start, op, addr, value in host_ops:
            while cycle[0] < start:
                await ctx.tick()
            ctx.set(dut.ctrl.adr, addr >> 2)
            ctx.set(dut.ctrl.we, op == "w")
            ctx.set(dut.ctrl.dat_w, value if op == "w" else 0)
            ctx.set(dut.ctrl.cyc, 1)
            ctx.set(dut.ctrl.stb, 1)
            for _ in range(2000):
                _, _, ack, dat_r = await ctx.tick().sample(dut.ctrl.ack, dut.ctrl.dat_r)
                if ack:
                    break
            else:
                st["host"].append((op, addr, "timeout"))
                ctx.set(dut.ctrl.cyc, 0)
                ctx.set(dut.ctrl.stb, 0)
                return
            st["host"].append((op, addr, dat_r if op == "r" else value))
            ctx.set(dut.ctrl.cyc, 0)
            ctx.set(dut.ctrl.stb, 0)
            await ctx.tick()

    async def user(ctx):
        ctx.set(dut.core_port.cmd.ready, 1)
        ctx.set(dut.port.cmd.valid, 1)
        ctx.set(dut.port.cmd.payload, {"we": 1, "addr": 0x42})
        while enable_at is None or cycle[0] < enable_at:
            await ctx.tick()
            if enable_at is None and cycle[0] > 400:
                return
        ctx.set(dut.port_enable, 1)

    async def tb(ctx):
        await ctx.tick().repeat(600)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for proc in (sub, host, user):
        sim.add_testbench(proc, background=True)
    sim.add_testbench(tb)
    sim.run()
    return st


HOST_OPS = ((0, "w", 0x814, 0x3), (0, "r", 0x818, None), (0, "w", 0x1000, 0xE), (0, "r", 0x1000, None),
            (0, "r", 0x4, None))


def test_host_waits_for_the_sequencer_then_owns_the_bus():
    st = run_control(hold_port=False, host_ops=HOST_OPS)
    seq = [x for x in st["log"] if x[1] == "seq"]
    assert [(a, v) for _, _, _, a, v in seq] == [(a, v) for a, v, _ in WRITES], "the sequencer's writes"
    assert st["done_at"] is not None and st["error_at"] is None
    # the host asked from cycle 0: no ack before the sequencer is done, then every transfer reaches the bus
    assert st["host_acks"] and min(st["host_acks"]) >= st["done_at"]
    assert all(c < st["done_at"] for c, *_ in seq)
    host = [x[2:] for x in st["log"] if x[1] == "host"]
    assert host == [("w", 0x814, 3), ("r", 0x818, None), ("w", 0x1000, 0xE), ("r", 0x1000, 0xE), ("r", 0x4, 0)]
    # read data come back to the host: 0x818 never written (the fake's default), 0x1000 as written, init_error 0
    assert st["host"] == [("w", 0x814, 3), ("r", 0x818, 0xA5A50000 | (0x818 >> 2)), ("w", 0x1000, 0xE),
                          ("r", 0x1000, 0xE), ("r", 0x4, 0)]
    assert len(st["host_acks"]) == len(HOST_OPS), "one ack per host transfer"
    # without hold_port the port is passed through from the start (the core itself blocks until init_done)
    # (within a cycle: the testbench processes' order at an edge is not fixed)
    assert st["cmd_at"] <= 1 and st["ready_at"] <= 1


def test_host_owns_the_bus_after_a_sequencer_error():
    st = run_control(hold_port=False, host_ops=((0, "w", 0x808, 7), (0, "r", 0x808, None)), never_ack_at=2)
    assert st["done_at"] is None and st["error_at"] is not None
    assert [x[1] for x in st["log"]] == ["seq", "seq", "host", "host"]
    assert min(st["host_acks"]) >= st["error_at"] and st["host"] == [("w", 0x808, 7), ("r", 0x808, 7)]


def test_hold_port_blocks_commands_until_port_enable():
    st = run_control(hold_port=True, host_ops=HOST_OPS, enable_at=300)
    assert st["done_at"] is not None and st["done_at"] < 300
    assert 300 <= st["cmd_at"] <= 301 and st["ready_at"] == st["cmd_at"]
    never = run_control(hold_port=True, host_ops=(), enable_at=None)
    assert never["cmd_at"] is None and never["ready_at"] is None


def test_wrapper_members_and_parameters():
    core = dram.GeneratedCore(name="core_sim", directory=".", verilog=(), csr={}, addr_width=24, data_width=16,
                              sdram_pins={}, init=WRITES, sim=True)
    w = dram.LiteDRAMCore(core, hold_port=True)
    assert w.ctrl.signature == WishboneSignature().flip() and w.hold_port
    assert {"ctrl", "port_enable", "port", "init_done", "init_error"} <= set(w.signature.members)
    text = verilog.convert(w, ports=[], name="top")
    assert re.search(r"\.wb_ctrl_we\(bus__we\)", text) and re.search(r"\.wb_ctrl_dat_r\(", text)
    assert not dram.LiteDRAMCore(core).hold_port
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(TypeError, match="hold_port"):
            dram.LiteDRAMCore(core, hold_port=1)
        with pytest.raises(TypeError, match="hold_port"):
            DRAMControl(writes=WRITES, addr_width=8, data_width=16, hold_port="yes")
        gc.collect()
