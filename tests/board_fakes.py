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
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np

from host.devices.board import SOFT_RESET
from host.devices.golden import GoldenMachine
from host.image import ImageError
from host.protocol import make_output_packet, merge_streams, parse_output_packet, token_packet_bytes
from hw import isa
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
