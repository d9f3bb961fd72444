"""cocotb side of sim/test_pynq_driver.py: the PYNQ driver, unchanged, against the Zynq top under simulation.

A ``pynq`` stand-in (:class:`SimPynq`) gives the driver the calls it makes on a board (``Overlay`` and its
``ip_dict`` and DMA attributes, ``allocate``, ``MMIO``), implemented with cocotbext-axi bus functional
models on the ports of ``mmfree_top`` (the Verilog top of ``hw/boards/xilinx.py``: the AXI DMAs' MM2S
streams, the S2MM output stream, the AXI4-Lite port): an MMIO read or write is an AXI4-Lite transaction, a
DMA transfer is an AXI4-Stream frame, and every ``idle`` poll lets the simulation run a few cycles. The
driver itself runs in a bridge thread (``cocotb.task.bridge``) and reaches the simulator through
``cocotb.task.resume``, so its code is exactly the board's.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import tempfile
import types
from pathlib import Path

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.task import bridge, resume
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

CORE_ADDR = 0x4000_0000
POLL_CYCLES = 8


async def _cycles(clk, n: int) -> None:
    await ClockCycles(clk, n)


class SimBuffer(np.ndarray):
    def flush(self):
        pass

    def invalidate(self):
        pass

    def freebuffer(self):
        pass


class SimSend:
    def __init__(self, dut, source: AxiStreamSource):
        self.dut, self.source = dut, source
        self.transfers = 0

    def transfer(self, array, start=0, nbytes=0):
        nbytes = nbytes or array.nbytes - start
        data = bytes(np.asarray(array).view(np.uint8).reshape(-1)[start:start + nbytes])
        resume(self.source.send)(AxiStreamFrame(data))
        self.transfers += 1

    @property
    def idle(self):
        resume(_cycles)(self.dut.aclk, POLL_CYCLES)
        return self.source.empty() and self.source.idle()

    error = False

    def stop(self):
        self.source.clear()

    def start(self):
        pass


class SimRecv:
    def __init__(self, dut, sink: AxiStreamSink):
        self.dut, self.sink = dut, sink
        self.task = None

    async def _recv(self, array, start, nbytes):
        frame = await self.sink.recv()
        data = bytes(frame.tdata)
        if len(data) > nbytes:
            raise AssertionError(f"output packet of {len(data)} bytes into a {nbytes}-byte transfer")
        array.view(np.uint8).reshape(-1)[start:start + len(data)] = np.frombuffer(data, np.uint8)

    async def _start(self, array, start, nbytes):
        self.task = cocotb.start_soon(self._recv(array, start, nbytes))

    def transfer(self, array, start=0, nbytes=0):
        resume(self._start)(array, start, nbytes or array.nbytes - start)

    @property
    def idle(self):
        resume(_cycles)(self.dut.aclk, POLL_CYCLES)
        return self.task is None or self.task.done()

    error = False

    def stop(self):
        pass

    def start(self):
        pass


def sim_pynq(dut, channels: int) -> types.ModuleType:
    """A ``pynq`` module backed by cocotbext-axi models of the overlay's DMAs and the core's AXI4-Lite."""
    axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.aclk, dut.aresetn, reset_active_level=False)
    sources = [AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_w{c}"), dut.aclk, dut.aresetn,
                               reset_active_level=False) for c in range(channels)]
    sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_out"), dut.aclk, dut.aresetn,
                         reset_active_level=False)
    for prefix in ("s_axil", "m_axis_out", *(f"s_axis_w{c}" for c in range(channels))):
        # a line per transaction would dominate the run
        logging.getLogger(f"cocotb.{dut._name}.{prefix}").setLevel(logging.WARNING)
    mod = types.ModuleType("pynq")

    class MMIO:
        def __init__(self, base, length=4):
            assert base == CORE_ADDR
            self.length = length

        def read(self, offset=0, length=4):
            return int.from_bytes(resume(axil.read)(offset, 4).data, "little")

        def write(self, offset, value):
            resume(axil.write)(offset, int(value).to_bytes(4, "little"))

    class DMA:
        def __init__(self, c):
            self.sendchannel = SimSend(dut, sources[c])
            self.recvchannel = SimRecv(dut, sink) if c == 0 else None

    class Overlay:
        def __init__(self, bitfile, download=True):
            self.ip_dict = {"core": {"phys_addr": CORE_ADDR, "addr_range": 0x10000}}
            for c in range(channels):
                self.ip_dict[f"dma{c}"] = {"phys_addr": 0x4040_0000 + 0x10000 * c, "addr_range": 0x10000}
                setattr(self, f"dma{c}", DMA(c))

    def allocate(shape, dtype=np.uint8, **kw):
        return np.zeros(shape, dtype=dtype).view(SimBuffer)

    mod.Overlay, mod.MMIO, mod.allocate = Overlay, MMIO, allocate
    return mod


@cocotb.test()
async def pynq_driver_bit_exact(dut):
    """The unchanged PYNQ driver: ID check, load, tokens bit-exact with the golden device, reset, restore."""
    channels = int(os.environ["MMFREE_CHANNELS"])
    weights = pickle.loads(Path(os.environ["MMFREE_WEIGHTS"]).read_bytes())
    ids = [int(x) for x in os.environ["MMFREE_TOKENS"].split(",")]
    cocotb.start_soon(Clock(dut.aclk, 10, unit="ns").start())
    dut.aresetn.value = 0
    await ClockCycles(dut.aclk, 10)
    dut.aresetn.value = 1
    await ClockCycles(dut.aclk, 5)
    sys.modules["pynq"] = sim_pynq(dut, channels)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "mmfree.bit").write_bytes(b"sim")
    (tmp / "mmfree.hwh").write_text("<sim/>")

    def run_driver():
        from host.devices import open_device
        from host.devices.golden import GoldenDevice

        gold = GoldenDevice(lanes=int(os.environ["MMFREE_LANES"]), channels=channels)
        gold.load(weights)
        dev = open_device("pynq", bitstream=tmp / "mmfree.bit", timeout_s=300.0, chunk_bytes=4096)
        dev.load(weights)
        out = []
        for t in ids:
            a, b = dev.step(t), gold.step(t)
            out.append(bool(np.array_equal(a.view(np.uint32), b.view(np.uint32))))
        saved, gsaved = dev.save_state(), gold.save_state()
        dev.reset()
        gold.reset()
        out.append(bool(np.array_equal(dev.step(ids[0]), gold.step(ids[0]))))
        dev.restore_state(saved)
        gold.restore_state(gsaved)
        out.append(bool(np.array_equal(dev.step(ids[-1]), gold.step(ids[-1]))))
        counters = dev.counters()
        dev.close()
        return out, counters

    results, counters = await bridge(run_driver)()
    dut._log.info("bit-exact per token: %s; counters %s", results,
                  {k: v for k, v in counters.items() if k in ("hw_cycles", "hw_tokens", "replayed_tokens")})
    assert all(results), f"logits differ from the golden device: {results}"
    assert counters["hw_tokens"] >= len(ids) + 2
