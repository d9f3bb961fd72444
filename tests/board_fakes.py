"""Fakes of exactly the ``pynq`` and ``pyxrt`` API subset the board drivers use, backed by the golden device.

:class:`FakeCore` is the accelerator as the host sees it: its AXI4-Lite registers (ID block, CTRL, STATUS,
error registers, 64-bit counters, the shell's soft reset) and its streams. Bytes streamed into a channel
are only collected; once channel 0 holds a whole token packet and every channel holds the stream the image
header and instruction headers announce, the fake **reassembles the model image from the streamed bytes**
(:func:`host.protocol.merge_streams`, the inverse of :func:`host.protocol.channel_streams`), parses it, and runs the
golden device's :meth:`~host.devices.golden.GoldenMachine.run_token` on the streamed token packet with
its own recurrent state. The output packet goes back through the fake S2MM DMA (pynq) or output buffer
(XRT), and the counters advance by the golden device's. So a driver that streams wrong bytes, in the wrong
order or to the wrong channel, gets a core error or wrong logits, exactly as on a board.

Faults for the error-path tests: ``magic`` (ID block magic), ``stall_channel`` (that channel's DMA or
kernel never finishes: a time-out), ``dma_error_channel`` (the DMA's error bit), ``force_error`` (the core
reports an :class:`hw.isa.ErrorCause` instead of running the token).

:class:`FakeEcp5Board` is an ECP5 bitstream seen from its serial port, speaking
:mod:`hw.boards.link_protocol` byte for byte: the stream-only link (version 1: ``'R'``, ``'W'``, ``'S'``,
``'X'``; anything else ``'?'``) or a DRAM board (version 2: board registers, a ``bytearray`` DRAM written with
``'L'`` and checked with ``'C'`` (``zlib.crc32``), and ``'T'``, which builds the token packet with
:func:`host.protocol.make_token_packet` from the table row it reads **from the fake's DRAM** at the layout its
registers describe, and runs the image bytes read from DRAM on the golden machine: so the host's layout and
load are what is tested, not copied). An argmax-only token's output is reduced as
:class:`hw.argmax_tap.ArgmaxTap` does (:func:`argmax_summary`). Version 3 adds the DRAM controller's control bus
(``'K'``/``'J'``) and the port enable; with ``phy`` (a :class:`ScriptedECP5PHY`) the control bus is that PHY's
registers (:class:`CSRWordModel`), the DRAM reads back right only through lanes at a setting the PHY script
calls good, and the leveling's test bursts land in the DRAM's first bytes: so a token runs only after a
leveling that left every lane inside its window.
"""

from __future__ import annotations

import struct
import types
import zlib
from collections import deque
from dataclasses import dataclass

import numpy as np

from host import leveling
from host.devices.board import SOFT_RESET
from host.devices.golden import GoldenMachine
from host.image import ImageError
from host.leveling import ECPIX5_PARAMS, LevelingParams
from host.protocol import make_output_packet, make_token_packet, merge_streams, parse_output_packet, token_packet_bytes
from hw import isa
from hw.boards import link_protocol as lp
from hw.boards.link_protocol import BoardReg, BoardStatus, CtrlStatus, DramStatus, TokenFlags, TokenStatus
from hw.isa import Counter, Ctrl, ErrorCause, Status, TritPacking
from hw.params import BuildParams

R = isa.REGISTER_MAP


@dataclass
class Faults:
    magic: int = isa.ID_MAGIC
    version: int = isa.ISA_VERSION
    stall_channel: int | None = None
    dma_error_channel: int | None = None
    force_error: ErrorCause | None = None
    corrupt_logit: int | None = None    #: add 1 to this logit's accumulator (a well-formed, wrong packet)


class FakeCore:
    """The core's registers and streams, executing what it is sent on the golden device."""

    def __init__(self, *, lanes=64, channels=2, bus_bits=64, quant_lanes=8, packing=TritPacking.BASE3,
                 max_hidden=1024, max_intermediate=2816, max_layers=32, base=0, faults: Faults | None = None):
        self.build = BuildParams(lanes=lanes, channels=channels, bus_bits=bus_bits, quant_lanes=quant_lanes,
                                 packing=packing, max_hidden=max_hidden, max_intermediate=max_intermediate,
                                 max_layers=max_layers)
        self.id = self.build.id_values()
        self.base = base
        self.faults = faults or Faults()
        self.channels = channels
        self.streams = [bytearray() for _ in range(channels)]
        self.state = None
        self.machine: GoldenMachine | None = None
        self.image_bytes: bytes | None = None
        self.counters = {c: 0 for c in Counter}
        self.status = 0
        self.cause = 0
        self.where = 0
        self.argmax = 0
        self.position = 0
        self.output: bytes | None = None
        self.tokens_run = 0
        self.soft_resets = 0
        self.ctrl_writes: list[int] = []

    # ------------------------------------------------------------------ registers
    def read(self, addr: int) -> int:
        off = addr - self.base
        if off == R.ID_MAGIC:
            return self.faults.magic
        if off == R.ID_VERSION:
            return self.faults.version
        if off in self.id:
            return self.id[off]
        if off == R.STATUS:
            return self.status
        if off == R.ERROR_CAUSE:
            return self.cause
        if off == R.ERROR_WHERE:
            return self.where
        if off == R.POSITION:
            return self.position
        if off == R.ARGMAX:
            return self.argmax
        if R.COUNTERS <= off < R.COUNTERS + 8 * len(Counter):
            c = Counter((off - R.COUNTERS) // 8)
            v = self.counters[c]
            return (v >> 32) & 0xFFFFFFFF if off % 8 else v & 0xFFFFFFFF
        return 0

    def write(self, addr: int, value: int) -> None:
        off = addr - self.base
        if off == R.CTRL:
            self.ctrl_writes.append(value)
            if value & Ctrl.CLEAR.value:     # leave the error state, drop what was streamed
                self.status &= ~4
                self.cause = self.where = 0
                self.streams = [bytearray() for _ in range(self.channels)]
            if value & Ctrl.ABORT.value:
                self.status = Status.ERROR.value
                self.cause = ErrorCause.ABORTED.value
        elif off == SOFT_RESET and value & 1:
            self.soft_resets += 1
            self.state = None
            self.counters = {c: 0 for c in Counter}
            self.status = self.cause = self.where = 0
            self.streams = [bytearray() for _ in range(self.channels)]
            self.output = None

    # ------------------------------------------------------------------ streams
    def push(self, channel: int, data: bytes) -> None:
        self.streams[channel] += data
        self._try_run()

    def _fail(self, cause: ErrorCause, where: int = 0) -> None:
        self.status = Status.ERROR.value
        self.cause, self.where = cause.value, where
        self.streams = [bytearray() for _ in range(self.channels)]

    def _try_run(self) -> None:
        if self.status & Status.ERROR.value:
            self.streams = [bytearray() for _ in range(self.channels)]   # drained while in error
            return
        ch0 = bytes(self.streams[0])
        hb = isa.layout_bytes(isa.TokenHeader)
        if len(ch0) < hb:
            return
        n = token_packet_bytes(isa.unpack(isa.TokenHeader, ch0[:hb]).length)
        if len(ch0) < n:
            return
        image = merge_streams([ch0[n:]] + [bytes(s) for s in self.streams[1:]])
        if image is None:
            return
        self.streams = [bytearray() for _ in range(self.channels)]
        if self.faults.force_error is not None:
            self._fail(self.faults.force_error, 3)
            return
        try:
            if self.image_bytes != image:
                self.machine = GoldenMachine(image, self.build)
                self.image_bytes = image
            if self.state is None:
                self.state = self.machine.init_state()
            res = self.machine.run_token(ch0[:n], self.state)
        except ImageError as exc:
            self._fail(exc.cause, getattr(exc, "instruction", 0) or 0)
            return
        self.state = res.state
        if self.faults.corrupt_logit is not None:
            p = parse_output_packet(res.output)
            acc = p.logits_acc.copy()
            acc[self.faults.corrupt_logit] += 1
            res.output = make_output_packet(acc, position=p.position, argmax=p.argmax, max_acc=p.max_acc,
                                            scale_mant=p.scale_mant, scale_shift=p.scale_shift)
        for c, v in res.counters.items():
            self.counters[c] += int(v)
        self.output = res.output
        self.status = Status.DONE.value
        self.tokens_run += 1
        trailer = isa.unpack(isa.OutputTrailer, res.output[-isa.layout_bytes(isa.OutputTrailer):])
        self.position, self.argmax = trailer.position, trailer.argmax


# ---------------------------------------------------------------------------------------------- pynq
class FakeBuffer(np.ndarray):
    """``pynq.allocate``'s buffer: an ndarray with ``flush``, ``invalidate``, ``freebuffer``."""

    def flush(self):
        self.flushed = True

    def invalidate(self):
        pass

    def freebuffer(self):
        self.freed = True

    @property
    def physical_address(self):
        return id(self) & 0xFFFFF000


class FakeSendChannel:
    def __init__(self, core: FakeCore, channel: int):
        self.core, self.channel = core, channel
        self._pending: bytes | None = None
        self._polls = 0
        self.transfers: list[int] = []
        self.running = True

    def transfer(self, array, start=0, nbytes=0):
        if not getattr(array, "flushed", False):
            raise AssertionError("DMA transfer of a buffer that was never flushed")
        if nbytes == 0:
            nbytes = array.nbytes - start
        if nbytes >= 1 << 26:
            raise ValueError(f"Transfer size is {nbytes} bytes, which exceeds the maximum DMA buffer size")
        if self._pending is not None:
            raise RuntimeError("DMA channel not idle")
        self.transfers.append(nbytes)
        self._pending = bytes(np.asarray(array).view(np.uint8).reshape(-1)[start:start + nbytes])
        self._polls = 0

    @property
    def idle(self):
        if self._pending is None:
            return True
        if self.core.faults.stall_channel == self.channel:
            return False
        self._polls += 1
        if self._polls < 2:      # busy for one poll: the driver must not assume a transfer is instant
            return False
        data, self._pending = self._pending, None
        self.core.push(self.channel, data)
        return True

    @property
    def error(self):
        return self.core.faults.dma_error_channel == self.channel and self._pending is not None

    def stop(self):
        self._pending = None
        self.running = False

    def start(self):
        self.running = True

    def wait(self):  # pragma: no cover - the driver must never block
        raise AssertionError("the driver called the blocking DMA wait()")


class FakeRecvChannel:
    def __init__(self, core: FakeCore):
        self.core = core
        self._buf = None
        self._n = 0
        self.running = True

    def transfer(self, array, start=0, nbytes=0):
        self._buf, self._start, self._n = array, start, nbytes or array.nbytes - start
        self.core.output = None

    @property
    def idle(self):
        if self._buf is None:
            return True
        if self.core.output is None:
            return False
        out = self.core.output
        if len(out) > self._n:
            return False
        self._buf.view(np.uint8).reshape(-1)[self._start:self._start + len(out)] = np.frombuffer(out, np.uint8)
        self._buf = None
        return True

    @property
    def error(self):
        return self.core.output is not None and len(self.core.output) > self._n

    def stop(self):
        self._buf = None

    def start(self):
        pass

    def wait(self):  # pragma: no cover
        raise AssertionError("the driver called the blocking DMA wait()")


def fake_pynq(core: FakeCore, *, core_addr=0x4000_0000, dmas: int | None = None, files=None):
    """A module object standing in for ``pynq``: ``Overlay``, ``allocate``, ``MMIO``."""
    mod = types.ModuleType("pynq")
    n_dma = core.channels if dmas is None else dmas
    mod.allocations = []
    mod.overlays = []

    class MMIO:
        def __init__(self, base, length=4):
            self.base, self.length = base, length

        def read(self, offset=0, length=4):
            assert self.base == core_addr, "MMIO on an address that is not the core's"
            assert 0 <= offset < self.length and offset % 4 == 0
            return core.read(offset)

        def write(self, offset, value):
            assert self.base == core_addr
            assert 0 <= offset < self.length and offset % 4 == 0
            core.write(offset, value)

    class DMA:
        def __init__(self, c):
            self.sendchannel = FakeSendChannel(core, c)
            self.recvchannel = FakeRecvChannel(core) if c == 0 else None

    class Overlay:
        def __init__(self, bitfile, download=True):
            self.bitfile, self.download = bitfile, download
            self.ip_dict = {"core": {"phys_addr": core_addr, "addr_range": 0x10000, "type": "mmfree_top"}}
            for c in range(n_dma):
                self.ip_dict[f"dma{c}"] = {"phys_addr": 0x4040_0000 + 0x10000 * c, "addr_range": 0x10000,
                                           "type": "xilinx.com:ip:axi_dma:7.1"}
                setattr(self, f"dma{c}", DMA(c))
            mod.overlays.append(self)

    def allocate(shape, dtype=np.uint8, **kw):
        buf = np.zeros(shape, dtype=dtype).view(FakeBuffer)
        mod.allocations.append(buf)
        return buf

    mod.Overlay, mod.allocate, mod.MMIO = Overlay, allocate, MMIO
    return mod


# ---------------------------------------------------------------------------------------------- pyxrt
def fake_pyxrt(core: FakeCore):
    """A module object standing in for ``pyxrt``: ``device``, ``xclbin``, ``kernel``, ``ip``, ``bo``, ``run``,
    ``ert_cmd_state``, ``xclBOSyncDirection``."""
    mod = types.ModuleType("pyxrt")

    class ert_cmd_state:  # noqa: N801 - pyxrt's name
        ERT_CMD_STATE_NEW = 1
        ERT_CMD_STATE_RUNNING = 3
        ERT_CMD_STATE_COMPLETED = 4
        ERT_CMD_STATE_ERROR = 5
        ERT_CMD_STATE_ABORT = 6
        ERT_CMD_STATE_TIMEOUT = 10

    class xclBOSyncDirection:  # noqa: N801
        XCL_BO_SYNC_BO_TO_DEVICE = 0
        XCL_BO_SYNC_BO_FROM_DEVICE = 1

    class device:  # noqa: N801
        def __init__(self, index=0):
            self.index = index
            self.loaded = None

        def load_xclbin(self, xb):
            self.loaded = xb
            return "uuid-0"

    class xclbin:  # noqa: N801
        def __init__(self, path):
            self.path = path

    class bo:  # noqa: N801
        normal = 0

        def __init__(self, dev, size, flags, group):
            self.data = bytearray(size)
            self.group = group
            self.synced_to = False

        def write(self, buf, seek):
            b = bytes(buf)
            self.data[seek:seek + len(b)] = b
            self.synced_to = False

        def sync(self, direction, size, offset):
            if direction == xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
                self.synced_to = True

        def read(self, size, skip):
            return np.frombuffer(bytes(self.data[skip:skip + size]), dtype=np.uint8)

        def size(self):
            return len(self.data)

    class run:  # noqa: N801
        def __init__(self, k):
            self.k = k
            self.args = {}
            self._state = ert_cmd_state.ERT_CMD_STATE_NEW
            self._fn = None

        def set_arg(self, index, value):
            if index in self.k.stream_args:
                raise RuntimeError(f"argument {index} of {self.k.name} is a stream, connected in the xclbin")
            self.args[index] = value

        def start(self):
            self._fn = self.k.go(self.args)
            self._state = ert_cmd_state.ERT_CMD_STATE_RUNNING
            mod.runs.append(self)
            self.wait()

        def wait(self, timeout_ms=0):
            if self._state == ert_cmd_state.ERT_CMD_STATE_RUNNING:
                self._state = self._fn()
            return self._state

        def state(self):
            return self._state

    class kernel:  # noqa: N801
        def __init__(self, dev, uuid, name):
            self.name = name
            base = name.split(":")[0]
            if base not in ("mmfree_mm2s", "mmfree_s2mm"):
                raise RuntimeError(f"No such kernel {name}")
            self.kind = base
            self.instance = name.split("{")[1].rstrip("}") if "{" in name else None
            self.channel = int(self.instance.split("_")[1]) if base == "mmfree_mm2s" else None
            if self.channel is not None and self.channel >= core.channels:
                raise RuntimeError(f"No such kernel instance {name}")
            self.stream_args = {1} if base == "mmfree_mm2s" else {0}

        def group_id(self, arg):
            if arg in self.stream_args:
                raise RuntimeError("a stream argument has no memory group")
            return 0 if self.kind == "mmfree_mm2s" else 1

        def go(self, args):
            if self.kind == "mmfree_mm2s":
                buf, beats, last = args[0], args[2], args[3]
                c = self.channel
                if not buf.synced_to:
                    raise AssertionError("mm2s started on a buffer not synced to the device")

                def fn():
                    if core.faults.stall_channel == c:
                        return ert_cmd_state.ERT_CMD_STATE_RUNNING
                    mod.streamed.append((c, beats * core.build.beat_bytes, last))
                    core.push(c, bytes(buf.data[:beats * core.build.beat_bytes]))
                    return ert_cmd_state.ERT_CMD_STATE_COMPLETED
                return fn
            out, words, count = args[1], args[2], args[3]

            def fn():
                if core.output is None:
                    return ert_cmd_state.ERT_CMD_STATE_RUNNING
                o = core.output[:4 * words]
                out.data[:len(o)] = o
                count.data[:4] = (len(o) // 4).to_bytes(4, "little")
                core.output = None
                return ert_cmd_state.ERT_CMD_STATE_COMPLETED
            return fn

    class ip:  # noqa: N801
        def __init__(self, dev, uuid, name):
            if not name.startswith("mmfree_core"):
                raise RuntimeError(f"No such IP {name}")

        def read_register(self, offset):
            return core.read(offset)

        def write_register(self, offset, value):
            core.write(offset, value)

    mod.runs = []
    mod.streamed = []   # (channel, bytes, last) per completed mm2s run
    mod.device, mod.xclbin, mod.bo, mod.run, mod.kernel, mod.ip = device, xclbin, bo, run, kernel, ip
    mod.ert_cmd_state, mod.xclBOSyncDirection = ert_cmd_state, xclBOSyncDirection
    return mod


# ---------------------------------------------------------------------------------------------- ECP5 boards
#: csr_registers of the generated ECPIX-5 core (hw.dram.generate_core(ECPIX5_CONFIG): csr.json; the test
#: below checks this copy against a freshly generated core when LiteDRAM is installed)
ECPIX5_CSRS = {
    "ddrctrl_init_done": (0x0, 1, "rw"), "ddrctrl_init_error": (0x4, 1, "rw"),
    "ddrphy_dly_sel": (0x800, 1, "rw"), "ddrphy_rdly_dq_rst": (0x804, 1, "rw"),
    "ddrphy_rdly_dq_inc": (0x808, 1, "rw"), "ddrphy_rdly_dq_bitslip_rst": (0x80C, 1, "rw"),
    "ddrphy_rdly_dq_bitslip": (0x810, 1, "rw"), "ddrphy_burstdet_clr": (0x814, 1, "rw"),
    "ddrphy_burstdet_seen": (0x818, 1, "ro"), "sdram_dfii_control": (0x1000, 1, "rw"),
    **{f"sdram_dfii_pi{p}_{n}": (0x1004 + 0x20 * p + off, size, kind) for p in range(2)
       for n, off, size, kind in (("command", 0x0, 1, "rw"), ("command_issue", 0x4, 1, "rw"),
                                  ("address", 0x8, 1, "rw"), ("baddress", 0xC, 1, "rw"),
                                  ("wrdata", 0x10, 2, "rw"), ("rddata", 0x18, 2, "ro"))},
}


class ScriptedECP5PHY:
    """A register-level model of the ECPIX-5 core for read leveling, by CSR name (``read``/``write``).

    It stands for a LiteDRAM ECP5DDRPHY core behind its CSRs: the DFI injector's software path (control,
    per-phase command/address/bank/wrdata/rddata), a DRAM that stores what is written to an open row, and per
    lane a read delay (3 bits, wraps like ECP5DDRPHY's ``rdly``) and a bitslip (4 positions, wraps), stepped only
    for the lanes whose ``dly_sel`` bit is set, as the PHY does. A lane's read data are right only inside a
    scripted set of (bitslip, delay) settings; elsewhere its byte of every beat comes back inverted. It refuses
    (``AssertionError``, ``KeyError``) what the hardware would not do sensibly: a command outside software
    control, a read or write on the wrong phase or to a closed row, a register the generated core does not have.
    (tests/test_leveling.py; the fake board's control bus, :class:`FakeEcp5Board`.)

    Parameters
    ----------
    good : dict of int to set of (int, int)
        Lane -> the (bitslip, delay) settings at which its read data are right.
    burst : dict of int to set of (int, int), optional
        Lane -> settings at which the burst detector fires (default: every setting).
    flaky : dict of int to set of (int, int), optional
        Lane -> settings that read right only on every other read (marginal taps at a window's edge).
    """

    def __init__(self, good, *, burst=None, flaky=None, params: LevelingParams = ECPIX5_PARAMS):
        self.p = params
        self.good, self.flaky = good, flaky or {}
        self.burst = burst
        self.control = leveling.DFII_CONTROL_SEL
        self.regs = {name: 0 for name in ECPIX5_CSRS}
        self.rdly = [0] * params.modules
        self.bitslip = [0] * params.modules
        self.open_row = {}          # bank -> row
        self.mem = {}               # (bank, row, column) -> tuple of phase words
        self.reads = 0
        self.log = []               # (event, ...) for checks on how the PHY was driven

    # -- the CSR interface
    def read(self, name):
        if name not in ECPIX5_CSRS:
            raise KeyError(name)
        if name == "sdram_dfii_control":
            return self.control
        return self.regs[name]

    def write(self, name, value):
        if name not in ECPIX5_CSRS:
            raise KeyError(name)
        addr, size, kind = ECPIX5_CSRS[name]
        assert kind == "rw", f"write to read-only {name}"
        assert 0 <= value < 1 << (32 * size), (name, value)
        if name == "sdram_dfii_control":
            self.control = value
            self.log.append(("control", value))
            return
        self.regs[name] = value
        sel = self.regs["ddrphy_dly_sel"]
        lanes = [m for m in range(self.p.modules) if sel >> m & 1]
        if name.startswith("ddrphy_rdly") or name == "ddrphy_dly_sel":
            self.log.append((name, value))
        if name == "ddrphy_rdly_dq_rst":
            for m in lanes:
                self.rdly[m] = 0
        elif name == "ddrphy_rdly_dq_inc":
            for m in lanes:
                self.rdly[m] = (self.rdly[m] + 1) % 8
        elif name == "ddrphy_rdly_dq_bitslip_rst":
            for m in lanes:
                self.bitslip[m] = 0
        elif name == "ddrphy_rdly_dq_bitslip":
            for m in lanes:
                self.bitslip[m] = (self.bitslip[m] + 1) % 4
        elif name == "ddrphy_burstdet_clr":
            self.regs["ddrphy_burstdet_seen"] = 0
        elif name.endswith("_command_issue"):
            self._issue(int(name[len("sdram_dfii_pi")]))

    # -- the DFI command a phase issues
    def _issue(self, phase):
        assert self.control == leveling.DFII_CONTROL_SOFTWARE, f"command under control {self.control:#x}"
        pre = f"sdram_dfii_pi{phase}_"
        cmd, a, ba = self.regs[pre + "command"], self.regs[pre + "address"], self.regs[pre + "baddress"]
        ras, cas, we = cmd & leveling.DFII_COMMAND_RAS, cmd & leveling.DFII_COMMAND_CAS, cmd & leveling.DFII_COMMAND_WE
        assert cmd & leveling.DFII_COMMAND_CS
        if ras and not cas and not we:
            assert ba not in self.open_row, "activate of an open bank"
            self.open_row[ba] = a
        elif ras and not cas and we:
            self.open_row.pop(ba, None)
        elif cas and not ras and we:
            assert cmd & leveling.DFII_COMMAND_WRDATA and phase == self.p.wrphase, (phase, cmd)
            assert ba in self.open_row, "write to a closed bank"
            self.mem[(ba, self.open_row[ba], a)] = tuple(self.regs[f"sdram_dfii_pi{q}_wrdata"]
                                                         for q in range(self.p.nphases))
        elif cas and not ras and not we:
            assert cmd & leveling.DFII_COMMAND_RDDATA and phase == self.p.rdphase, (phase, cmd)
            assert ba in self.open_row, "read from a closed bank"
            self._read(self.mem.get((ba, self.open_row[ba], a), (0,) * self.p.nphases))
        else:
            raise AssertionError(f"unexpected command {cmd:#x}")

    def _read(self, stored):
        self.reads += 1
        out = list(stored)
        seen = 0
        for m in range(self.p.modules):
            setting = (self.bitslip[m], self.rdly[m])
            right = setting in self.good.get(m, set())
            if setting in self.flaky.get(m, set()):
                right = self.reads % 2 == 0
            if not right:   # invert lane m's byte of every beat: 8 bit errors a beat, whatever the setting
                for q in range(self.p.nphases):
                    for k in range(self.p.beats):
                        out[q] ^= 0xFF << (k * self.p.databits + 8 * m)
            if self.burst is None or setting in self.burst.get(m, set()):
                seen |= 1 << m
        for q in range(self.p.nphases):
            self.regs[f"sdram_dfii_pi{q}_rddata"] = out[q]
        self.regs["ddrphy_burstdet_seen"] |= seen

    def lane_right(self, m: int) -> bool:
        """Whether lane ``m`` reads right at its current setting (the fake board's DRAM reads use it)."""
        return (self.bitslip[m], self.rdly[m]) in self.good.get(m, set())


class CSRWordModel:
    """:class:`ScriptedECP5PHY` as the core's control bus sees it: 32-bit words at ``csr.json`` byte addresses
    (:data:`ECPIX5_CSRS`), wide registers most significant word first, a wide write taking effect with its last
    word (as LiteX's CSR bank does); unmapped words read 0 and ignore writes (LiteX's CSR bus acknowledges
    every address of its region).

    Attributes
    ----------
    pending : dict
        Wide registers whose first words were written and their last not yet.
    """

    def __init__(self, phy: ScriptedECP5PHY):
        self.phy = phy
        self.by_addr = {addr + 4 * i: (name, size, i) for name, (addr, size, _) in ECPIX5_CSRS.items()
                        for i in range(size)}
        self.pending: dict[str, int] = {}

    def read_word(self, addr: int) -> int:
        if addr not in self.by_addr:
            return 0
        name, size, i = self.by_addr[addr]
        return (self.phy.read(name) >> (32 * (size - 1 - i))) & 0xFFFFFFFF

    def write_word(self, addr: int, value: int) -> None:
        if addr not in self.by_addr:
            return
        name, size, i = self.by_addr[addr]
        if ECPIX5_CSRS[name][2] == "ro":
            return
        self.pending[name] = (self.pending.get(name, 0) << 32) | value if i else value
        if i == size - 1:
            self.phy.write(name, self.pending.pop(name))


def ecp5_id_values(**over) -> dict[int, int]:
    """The ID block of the committed ECP5 builds (hw.boards.ecp5.DEFAULT_PARAMS), with overrides."""
    from hw.boards import ecp5

    p = ecp5.DEFAULT_PARAMS
    kw = dict(lanes=p["lanes"], channels=1, bus_bits=64, packings=[isa.TritPacking[p["packing"].upper()]],
              quant_lanes=p["quant_lanes"], max_hidden=p["max_hidden"], max_intermediate=p["max_intermediate"],
              max_layers=p["max_layers"])
    kw.update(over)
    return isa.id_block_values(**kw)


def argmax_summary(packet: bytes) -> tuple[int, int, int]:
    """(position, argmax, flags) of an output packet as :class:`hw.argmax_tap.ArgmaxTap` reduces it (flags:
    :class:`hw.boards.link_protocol.SummaryFlags`)."""
    words = struct.unpack(f"<{len(packet) // 4}I", packet)
    tw = isa.layout_bytes(isa.OutputTrailer) // 4
    t = isa.unpack(isa.OutputTrailer, packet[-4 * tw:]) if len(words) >= tw else None
    flags = 0
    if isa.crc32_words(packet[:-4]) != words[-1]:
        flags |= 1
    if t is None or t.magic != isa.OUTPUT_MAGIC:
        flags |= 2
    if words[-1] == isa.OUTPUT_ABORT_WORD:
        flags |= 4
    n = t.n_logits if t is not None else 0
    if len(words) != -(-(n + tw) // 16) * 16:
        flags |= 8
    return (0, 0, flags) if t is None else (t.position, t.argmax, flags)


class FakeEcp5Board:
    """An ECP5 bitstream seen from the serial port (module docstring): link protocol, register block, golden core,
    and with ``link_version=2`` the DRAM board's registers, DRAM and token command.

    Parameters
    ----------
    ids : dict, optional
        The core's ID block ``{offset: value}`` (default :func:`ecp5_id_values`).
    link_version : {1, 2, 3}
    dram_bytes, clock_hz : int
        ``BoardReg.DRAM_BYTES`` and ``CLOCK_HZ`` (version 2 and 3).
    hold_port : bool
        Version 3: the DRAM port is held after configuration until ``PORT_ENABLE`` is written 1 (a DDR3 board);
        without it ``PORT_ENABLE`` reads 1 and ignores writes.
    phy : ScriptedECP5PHY, optional
        Version 3: the controller's registers behind ``'K'``/``'J'`` (else a plain word store, ``ctrl_words``),
        and the lanes that decide whether DRAM reads come back right (byte ``a`` of the DRAM is lane ``a % 2``
        of the x16 chip; a lane outside its good settings reads its bytes inverted).

    Attributes
    ----------
    max_unacked : int
        The most ``'S'``/``'L'`` bytes the host had sent whose acknowledgement it had not yet read (the receive
        FIFO the host must not overflow).
    drop_after : int or None
        Bytes from the host after which the port fails (``OSError`` from ``write`` and ``read``: an unplugged
        board) until :meth:`reconnect`.
    force_token_status, force_tap_flags : int
        OR-ed into every ``'t'`` status (a refused token then runs nothing) / argmax summary's flags.
    corrupt_writes_at : int or None
        A DRAM byte address whose byte every ``'L'`` covering it stores inverted (a bad memory cell).
    ctrl_timeout_at : set of int
        Control-bus byte addresses the controller never acknowledges (``CtrlStatus.TIMEOUT``).
    ctrl_log : list of (str, int, int)
        The control-bus accesses that reached the controller: (``"K"`` or ``"J"``, byte address, value).
    board_writes : list of (BoardReg, int)
        The ``'P'`` writes, in order.
    ops : collections.Counter
        Commands taken, by opcode character.
    """

    def __init__(self, ids=None, *, link_version: int = 1, dram_bytes: int = 32 << 20,
                 clock_hz: int = 50_000_000, hold_port: bool = False, phy: ScriptedECP5PHY | None = None):
        import collections

        self.ids = ids if ids is not None else ecp5_id_values()
        self.link_version = link_version
        self.timeout = None
        self.rx = bytearray()            # bytes from the host not yet parsed
        self.tx = deque()                # frames to the host: [bytes left, acknowledges a windowed command]
        self.unacked = deque()           # bytes of each 'S'/'L' command whose reply the host has not read
        self.max_unacked = 0
        self.machines = {}
        self.ops = collections.Counter()
        self.received = 0
        self.drop_after: int | None = None
        self.dead = False
        self.force_token_status = 0
        self.force_tap_flags = 0
        self.corrupt_writes_at: int | None = None
        self.board_writes: list[tuple[BoardReg, int]] = []
        self.tokens_run = 0
        self.dram = bytearray(dram_bytes) if link_version >= 2 else None
        self.regs = dict.fromkeys(BoardReg, 0)
        self.regs.update({BoardReg.MAGIC: lp.BOARD_MAGIC, BoardReg.LINK_VERSION: link_version,
                          BoardReg.DRAM_BYTES: dram_bytes, BoardReg.CLOCK_HZ: clock_hz,
                          BoardReg.STATUS: int(BoardStatus.DRAM_READY)})
        self.hold_port = hold_port and link_version >= 3
        self.phy = phy
        self.words = CSRWordModel(phy) if phy is not None else None
        self.ctrl_words: dict[int, int] = {}
        self.ctrl_timeout_at: set[int] = set()
        self.ctrl_log: list[tuple[str, int, int]] = []
        self._burst0 = None              # the leveling's last test burst mirrored into DRAM
        if link_version >= 3:
            self._set_port(not self.hold_port)
            if self.hold_port:
                self.regs[BoardReg.STATUS] |= int(BoardStatus.PORT_HELD)
        self.reset()

    def _set_port(self, enabled: bool) -> None:
        self.regs[BoardReg.PORT_ENABLE] = int(enabled)
        if enabled:
            self.regs[BoardReg.STATUS] |= int(BoardStatus.PORT_ENABLED)
        else:
            self.regs[BoardReg.STATUS] &= ~int(BoardStatus.PORT_ENABLED)

    def _usable(self) -> bool:
        """The DRAM is initialised and its port enabled (version 2: always enabled)."""
        st = self.regs[BoardReg.STATUS]
        return bool(st & BoardStatus.DRAM_READY) and (self.link_version < 3 or bool(st & BoardStatus.PORT_ENABLED))

    def dram_read(self, addr: int, n: int) -> bytes:
        """DRAM bytes as the controller reads them back: with a :class:`ScriptedECP5PHY`, the bytes of a lane
        outside its good settings come back inverted."""
        data = bytearray(self.dram[addr:addr + n])
        if self.phy is not None:
            for m in range(self.phy.p.modules):
                if not self.phy.lane_right(m):
                    first = (m - addr) % self.phy.p.modules
                    for i in range(first, n, self.phy.p.modules):
                        data[i] ^= 0xFF
        return bytes(data)

    def reset(self):
        """The core's reset (``'X'``): state, registers, counters; board registers and DRAM stay."""
        self.phase, self.packet, self.beats = "token", b"", bytearray()
        self.state = None
        self.counters = dict.fromkeys(isa.Counter, 0)
        self.status, self.cause, self.where = 0, 0, 0
        self.regs[BoardReg.STATUS] &= ~int(BoardStatus.READER_ERROR | BoardStatus.WRITER_ERROR)

    def reconnect(self):
        """The board seen again after the link dropped: what the host had half sent is abandoned (the link's
        byte time-out), nothing else changes."""
        if self.rx:
            self.regs[BoardReg.LINK_TIMEOUTS] += 1
        self.rx.clear()
        self.tx.clear()
        self.unacked.clear()
        self.dead, self.drop_after = False, None

    # ---- pyserial subset
    def write(self, data):
        if self.dead:
            raise OSError("fake ECP5 board: device disconnected")
        data = bytes(data)
        if self.drop_after is not None and self.received + len(data) > self.drop_after:
            keep = max(self.drop_after - self.received, 0)
            self.rx += data[:keep]
            self.received += keep
            self._parse()
            self.dead = True
            raise OSError("fake ECP5 board: device disconnected")
        self.rx += data
        self.received += len(data)
        self._parse()
        return len(data)

    def read(self, n):
        if self.dead:
            raise OSError("fake ECP5 board: device reports readiness to read but returned no data")
        out = bytearray()
        while self.tx and len(out) < n:
            frame = self.tx[0]
            k = min(n - len(out), len(frame[0]))
            out += frame[0][:k]
            del frame[0][:k]
            if not frame[0]:
                self.tx.popleft()
                if frame[1]:
                    self.unacked.popleft()
        return bytes(out)

    def reset_input_buffer(self):
        self.tx.clear()
        self.unacked.clear()

    def close(self):
        pass

    # ---- board
    def _reply(self, *chunks, ack: bool = False):
        frame = bytearray(b"".join(chunks))
        self.tx.append([frame, ack])

    def _output(self, packet: bytes):
        words = struct.unpack(f"<{len(packet) // 4}I", packet)
        for i, w in enumerate(words):
            self._reply(bytes([lp.REP_OUTPUT]), struct.pack("<IB", w, int(i == len(words) - 1)))

    def _reg(self, addr):
        if addr in self.ids:
            return self.ids[addr]
        if addr == R.STATUS:
            return self.status
        if addr == R.ERROR_CAUSE:
            return self.cause
        if addr == R.ERROR_WHERE:
            return self.where
        for c in isa.Counter:
            if addr == R.counter(c):
                return self.counters[c] & 0xFFFFFFFF
            if addr == R.counter(c) + 4:
                return self.counters[c] >> 32
        return 0

    def _parse(self):
        dram_ops = (lp.OP_BOARD_READ, lp.OP_BOARD_WRITE, lp.OP_DRAM_WRITE, lp.OP_DRAM_CRC, lp.OP_TOKEN)
        ctrl_ops = (lp.OP_CTRL_READ, lp.OP_CTRL_WRITE)
        while self.rx:
            op = self.rx[0]
            if op not in lp.COMMAND_BYTES or (op in dram_ops and self.link_version < 2) or \
                    (op in ctrl_ops and self.link_version < 3):
                self._reply(bytes([lp.REP_UNKNOWN]))
                del self.rx[:1]
                continue
            head = 1 + lp.COMMAND_BYTES[op]
            if len(self.rx) < head:
                return
            size = head
            if op in (lp.OP_STREAM, lp.OP_DRAM_WRITE):
                n1 = struct.unpack_from("<H", self.rx, head - 2 if op == lp.OP_DRAM_WRITE else 1)[0]
                size += lp.BEAT_BYTES * (n1 + 1)
            if len(self.rx) < size:
                return
            cmd = bytes(self.rx[:size])
            del self.rx[:size]
            self.ops[chr(op)] += 1
            getattr(self, f"_op_{chr(op)}")(cmd)

    # core registers and stream (every link version)
    def _op_R(self, cmd):
        self._reply(bytes([lp.REP_READ]), struct.pack("<I", self._reg(cmd[1])))

    def _op_W(self, cmd):
        addr, value = cmd[1], struct.unpack_from("<I", cmd, 2)[0]
        if addr == R.CTRL and value & isa.Ctrl.CLEAR.value:
            self.status, self.phase, self.beats = 0, "token", bytearray()
            self.cause = self.where = 0
        self._reply(bytes([lp.REP_WRITE]))

    def _op_S(self, cmd):
        _, flags = struct.unpack_from("<HB", cmd, 1)
        self._window(len(cmd))
        self.beats += cmd[4:]
        self._reply(bytes([lp.REP_STREAM]), ack=True)
        if flags & 1:
            self._packet_end()

    def _op_X(self, cmd):
        self.reset()
        self._reply(bytes([lp.REP_RESET]))

    def _window(self, nbytes):
        self.unacked.append(nbytes)
        self.max_unacked = max(self.max_unacked, sum(self.unacked))

    # board registers, DRAM, tokens (link version 2)
    def _op_G(self, cmd):
        addr = cmd[1]
        value = self.regs.get(BoardReg(addr), 0) if addr in BoardReg._value2member_map_ else 0
        self._reply(bytes([lp.REP_BOARD_READ]), struct.pack("<I", value))

    def _op_P(self, cmd):
        addr, value = cmd[1], struct.unpack_from("<I", cmd, 2)[0]
        if addr in BoardReg._value2member_map_:
            self.board_writes.append((BoardReg(addr), value))
        if addr == BoardReg.PORT_ENABLE:
            if self.hold_port:
                self._set_port(bool(value & 1))
        elif addr in BoardReg._value2member_map_ and BoardReg(addr) in lp.WRITABLE:
            if addr == BoardReg.STATUS:
                keep = self.regs[BoardReg.STATUS] & ~int(BoardStatus.IMAGE_VALID)
                self.regs[BoardReg.STATUS] = keep | (value & int(BoardStatus.IMAGE_VALID))
            else:
                self.regs[BoardReg(addr)] = value
        self._reply(bytes([lp.REP_BOARD_WRITE]))

    def _dram_ok(self, addr, nbytes) -> int:
        st = 0 if self._usable() else int(DramStatus.NOT_READY)
        if addr % lp.BEAT_BYTES or nbytes % lp.BEAT_BYTES or addr + nbytes > len(self.dram):
            st |= int(DramStatus.BAD_ALIGN)
        return st

    def _op_L(self, cmd):
        addr = struct.unpack_from("<I", cmd, 1)[0]
        data = cmd[1 + lp.COMMAND_BYTES[lp.OP_DRAM_WRITE]:]
        self._window(len(cmd))
        st = self._dram_ok(addr, len(data))
        if not st:
            self.dram[addr:addr + len(data)] = data
            bad = self.corrupt_writes_at
            if bad is not None and addr <= bad < addr + len(data):
                self.dram[bad] ^= 0xFF
            self.regs[BoardReg.STATUS] &= ~int(BoardStatus.IMAGE_VALID)
        self._reply(bytes([lp.REP_DRAM_WRITE, st]), ack=True)

    def _op_C(self, cmd):
        addr, nbytes = struct.unpack_from("<II", cmd, 1)
        st = self._dram_ok(addr, nbytes)
        crc = 0 if st else zlib.crc32(self.dram_read(addr, nbytes))
        self._reply(bytes([lp.REP_DRAM_CRC]), struct.pack("<IB", crc, st))

    def _op_T(self, cmd):
        token, pos, flags = struct.unpack_from("<IIB", cmd, 1)
        regs = self.regs
        regs[BoardReg.TOKENS] = (regs[BoardReg.TOKENS] + 1) & 0xFFFFFFFF
        hidden, vocab = regs[BoardReg.EMBED_HIDDEN], regs[BoardReg.EMBED_VOCAB]
        st = self.force_token_status
        if not self._usable():
            st |= TokenStatus.NOT_READY
        elif not regs[BoardReg.STATUS] & BoardStatus.IMAGE_VALID:
            st |= TokenStatus.NO_IMAGE
        elif token >= vocab:
            st |= TokenStatus.BAD_TOKEN
        elif not 1 <= hidden <= self.ids[R.ID_MAX_HIDDEN]:
            st |= TokenStatus.BAD_HIDDEN
        if st:
            self._reply(bytes([lp.REP_TOKEN, int(st)]))
            return
        base = regs[BoardReg.EMBED_BASE] + 4 * token * hidden
        row = np.frombuffer(self.dram_read(base, 4 * hidden), dtype="<i4")
        logits = bool(flags & TokenFlags.LOGITS)
        packet = make_token_packet(row, position=pos, logits=logits)
        image = self.dram_read(regs[BoardReg.IMAGE_BASE], regs[BoardReg.IMAGE_BYTES])
        out = self._execute(packet, image)
        if out is None:
            self._reply(bytes([lp.REP_TOKEN, int(TokenStatus.CORE_ERROR)]))
        elif logits:                     # the LM head's words leave while its weights still stream: before 't'
            self._output(out)
            self._reply(bytes([lp.REP_TOKEN, 0]))
        else:                            # the tap's summary follows the packet's end: after 't'
            position, argmax, tap = argmax_summary(out)
            self._reply(bytes([lp.REP_TOKEN, 0]))
            self._output(struct.pack("<3I", position, argmax, tap | self.force_tap_flags))

    # the DRAM controller's control bus (link version 3)
    def _ctrl_status(self, addr) -> int:
        st = 0
        if not self.regs[BoardReg.STATUS] & (BoardStatus.DRAM_READY | BoardStatus.DRAM_INIT_ERROR):
            st |= int(CtrlStatus.BUSY)
        if addr % 4 or addr >= lp.CTRL_BYTES:
            st |= int(CtrlStatus.BAD_ADDR)
        if not st and addr in self.ctrl_timeout_at:
            st = int(CtrlStatus.TIMEOUT)
        return st

    def _op_K(self, cmd):
        addr = struct.unpack_from("<I", cmd, 1)[0]
        st = self._ctrl_status(addr)
        value = 0
        if not st:
            value = self.words.read_word(addr) if self.words is not None else self.ctrl_words.get(addr, 0)
            self.ctrl_log.append(("K", addr, value))
        self._reply(bytes([lp.REP_CTRL_READ, st]), struct.pack("<I", value))

    def _op_J(self, cmd):
        addr, value = struct.unpack_from("<II", cmd, 1)
        st = self._ctrl_status(addr)
        if not st:
            self.ctrl_log.append(("J", addr, value))
            if self.words is not None:
                self.words.write_word(addr, value)
                self._mirror_burst0()
            else:
                self.ctrl_words[addr] = value
        self._reply(bytes([lp.REP_CTRL_WRITE, st]))

    def _mirror_burst0(self):
        """A burst the DFI injector wrote to bank 0, row 0, column 0 is the user port's word 0: DRAM bytes 0-15
        (phase 0 carries beats 0-3, phase 1 beats 4-7, 16 bits a beat)."""
        burst = self.phy.mem.get((0, 0, 0))
        if burst is None or burst == self._burst0:
            return
        self._burst0 = burst
        p = self.phy.p
        out = bytearray()
        for word in burst:
            for k in range(p.beats):
                out += ((word >> (k * p.databits)) & ((1 << p.databits) - 1)).to_bytes(p.databits // 8, "little")
        self.dram[:len(out)] = out

    # the core
    def _execute(self, packet: bytes, image: bytes) -> bytes | None:
        """One token on the golden machine with the board's state; the output packet, or None after setting the
        core's error registers (the core in its error state drains its input: an error too)."""
        if self.status & isa.Status.ERROR.value:
            return None
        try:
            m = self.machines.get(image)
            if m is None:
                m = self.machines[image] = GoldenMachine(image)
            res = m.run_token(packet, self.state if self.state is not None else m.init_state())
        except ImageError as exc:
            self.status = (isa.Status.ERROR | isa.Status.DONE).value
            self.cause, self.where = exc.cause.value, exc.instruction or 0
            return None
        self.state = res.state
        for c, v in res.counters.items():     # the oracle's activity counts; the beats its bytes make
            self.counters[c] += int(v)
        self.counters[isa.Counter.STREAM_BEATS] += sum(res.stream_bytes) // lp.BEAT_BYTES
        self.status = isa.Status.DONE.value
        self.tokens_run += 1
        return res.output

    def _packet_end(self):
        data, self.beats = bytes(self.beats), bytearray()
        if self.status & isa.Status.ERROR.value:     # error state: inputs are drained
            return
        if self.phase == "token":
            self.packet, self.phase = data, "image"
            return
        self.phase = "token"
        out = self._execute(self.packet, data)
        if out is not None:
            self._output(out)
