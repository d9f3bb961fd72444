"""The XRT device: the core as an RTL kernel on an Alveo U55C, through XRT's Python bindings (``pyxrt``).

The ``.xclbin`` is the one ``make bitstream BOARD=u55c`` links (``hw/boards/xilinx.py``): the core is the
user-managed kernel ``mmfree_core`` (instance ``core_0``; its register map at 0x10, above the 0x00-0x0C
registers XRT reserves, the shell's soft reset at 0x100), fed by one ``mmfree_mm2s`` HLS data mover per
weight channel (``mm2s_<c>``: an AXI4 master reading the channel's stream from its own HBM pseudo-channel)
and drained by ``mmfree_s2mm`` (``s2mm_0``), which writes the output packet to HBM. ``pyxrt`` is imported
when the device is constructed, never at package import (XRT 2022.1's bindings).

What the driver uses of ``pyxrt``: ``device(index)``, ``xclbin(path)``, ``device.load_xclbin``,
``kernel(device, uuid, "name:{instance}")`` and ``kernel.group_id``, ``run(kernel)`` with ``set_arg``,
``start``, ``wait(timeout_ms)``, ``ip(device, uuid, name)`` ``read_register`` /
``write_register``, ``bo(device, size, bo.normal, group)`` ``write``/``read``/``sync`` and
``xclBOSyncDirection``, ``ert_cmd_state``.

Per token: ``s2mm_0`` is started on the output buffer, then ``mm2s_0`` streams the token packet (``last``
= 0) and the channel 0 image (``last`` = 1), and every other ``mm2s_<c>`` its channel's image; the driver
polls the runs (short ``wait`` calls) and the core's ``STATUS`` until all complete or ``timeout_s`` passes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from host.devices.base import DeviceError
from host.devices.board import ShellTransport
from host.devices.driver import AcceleratorDevice
from host.protocol import IdBlock
from hw import isa

__all__ = ["XrtDevice", "XrtTransport"]

BASE = isa.register_base("alveo")
POLL_MS = 5


class XrtDevice(AcceleratorDevice):
    """The accelerator on an Alveo card.

    Parameters
    ----------
    xclbin : str or Path, optional
        The linked ``mmfree.xclbin``. Default: ``$MMFREE_XCLBIN``, else ``./mmfree.xclbin``.
    device_index : int
        XRT device index (``xbutil examine`` lists them).
    timeout_s : float
        Seconds one token may take before a time-out DeviceError.
    output_gate : {"released", "paper"}

    Raises
    ------
    DeviceError
        ``pyxrt`` missing, the ``.xclbin`` missing, a kernel or the core missing in it, or a wrong ID block.
    """

    name = "xrt"

    def __init__(self, *, xclbin: str | Path | None = None, device_index: int = 0, timeout_s: float = 10.0,
                 output_gate: str = "released") -> None:
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        super().__init__(XrtTransport(xclbin, device_index), timeout_s=timeout_s, output_gate=output_gate)
        self.connect()

    xclbin = property(lambda self: self.transport.xclbin)
    device = property(lambda self: self.transport.device)


class XrtTransport(ShellTransport):
    """The ``mmfree_core`` IP's registers and the data-mover kernels as a :class:`~host.devices.driver.Transport`.

    Parameters
    ----------
    xclbin, device_index
        As :class:`XrtDevice`.
    """

    def __init__(self, xclbin: str | Path | None, device_index: int) -> None:
        path = Path(xclbin) if xclbin is not None else Path(os.environ.get("MMFREE_XCLBIN", "mmfree.xclbin"))
        try:
            import pyxrt
        except ImportError as exc:
            raise DeviceError("device 'xrt' needs XRT's Python bindings (pyxrt): source "
                              "/opt/xilinx/xrt/setup.sh first") from exc
        self._x = pyxrt
        if not path.is_file():
            raise DeviceError(f"device 'xrt': {path} not found (pass xclbin=, or set MMFREE_XCLBIN; build it with "
                              f"make bitstream BOARD=u55c)")
        self.xclbin = path
        try:
            self.device = pyxrt.device(int(device_index))
            self.uuid = self.device.load_xclbin(pyxrt.xclbin(str(path)))
            self.core = pyxrt.ip(self.device, self.uuid, "mmfree_core:{core_0}")
            self.s2mm = pyxrt.kernel(self.device, self.uuid, "mmfree_s2mm:{s2mm_0}")
        except RuntimeError as exc:
            raise DeviceError(f"device 'xrt': cannot open the card or the kernels in {path}: {exc}") from exc
        self.mm2s: list = []
        self._beat = 8
        self._img: list = []
        self._s2mm_run = None
        self._mm2s_runs: list = []
        self._tok = None
        self._out = None
        self._count = None
        self._out_bytes = 0

    def check_ident(self, ident: IdBlock) -> None:
        """One ``mm2s`` data mover per channel of the core; its beat."""
        mm2s = []
        for c in range(ident.channels):
            try:
                mm2s.append(self._x.kernel(self.device, self.uuid, f"mmfree_mm2s:{{mm2s_{c}}}"))
            except RuntimeError as exc:
                raise DeviceError(f"device 'xrt': the core has {ident.channels} channel(s) but the xclbin "
                                  f"has no mm2s_{c}: {exc}") from exc
        self.mm2s, self._beat = mm2s, ident.bus_bits // 8

    def read(self, offset: int) -> int:
        return int(self.core.read_register(BASE + offset)) & 0xFFFFFFFF

    def write(self, offset: int, value: int) -> None:
        self.core.write_register(BASE + offset, int(value) & 0xFFFFFFFF)

    def _bo(self, nbytes: int, group: int):
        return self._x.bo(self.device, int(nbytes), self._x.bo.normal, group)

    def stage(self, streams, out_bytes: int) -> None:
        beat = self._beat
        to_dev = self._x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
        self._img = []
        try:
            for c, s in enumerate(streams):
                if len(s) % beat:
                    raise DeviceError(f"device 'xrt': channel {c} stream of {len(s)} bytes is not whole "
                                      f"{beat}-byte beats")
                bo = self._bo(len(s), self.mm2s[c].group_id(0))
                bo.write(s, 0)
                bo.sync(to_dev, len(s), 0)
                self._img.append((bo, len(s) // beat))
            self._out = self._bo(out_bytes, self.s2mm.group_id(1))
            self._count = self._bo(4096, self.s2mm.group_id(3))
        except (RuntimeError, MemoryError) as exc:
            self._img = []
            raise DeviceError(f"device 'xrt': cannot allocate device buffers: {exc}") from exc
        self._out_bytes = out_bytes

    def transfer(self, packet: bytes, deadline: float, poll) -> bytes:
        x = self._x
        beat = self._beat
        if len(packet) % beat:
            raise DeviceError(f"device 'xrt': token packet of {len(packet)} bytes is not whole beats")
        if self._tok is None or self._tok[1] < len(packet):
            self._tok = (self._bo(len(packet), self.mm2s[0].group_id(0)), len(packet))
        tok = self._tok[0]
        tok.write(packet, 0)
        tok.sync(x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE, len(packet), 0)
        # an s2mm run left by a failed token (the core sent no output packet) takes this token's packet
        if self._s2mm_run is None:
            self._s2mm_run = self._start(self.s2mm, {1: self._out, 2: self._out_bytes // 4, 3: self._count})
        runs = [("s2mm", self._s2mm_run),
                ("mm2s_0 (token)", self._start(self.mm2s[0], {0: tok, 2: len(packet) // beat, 3: 0}))]
        for c, (bo, beats) in enumerate(self._img):
            runs.append((f"mm2s_{c}", self._start(self.mm2s[c], {0: bo, 2: beats, 3: 1})))
        done = x.ert_cmd_state.ERT_CMD_STATE_COMPLETED
        bad = {getattr(x.ert_cmd_state, n, None) for n in ("ERT_CMD_STATE_ERROR", "ERT_CMD_STATE_ABORT",
                                                             "ERT_CMD_STATE_TIMEOUT", "ERT_CMD_STATE_NORESPONSE")}
        pending = list(runs)
        self._mm2s_runs = [r for lbl, r in runs if lbl != "s2mm"]
        while pending:
            for item in list(pending):
                label, r = item
                state = r.wait(POLL_MS)
                if state == done:
                    pending.remove(item)
                elif state in bad:
                    raise DeviceError(f"device 'xrt': kernel run {label} ended in state {state}")
            poll()
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"kernel run(s) {[lbl for lbl, _ in pending]} not finished")
        self._s2mm_run = None
        self._mm2s_runs = []
        self._count.sync(x.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, 4, 0)
        words = int(np.asarray(self._count.read(4, 0), dtype=np.uint8).view("<u4")[0])
        n = 4 * words
        if n > self._out_bytes:
            raise DeviceError(f"device 'xrt': the output packet is {n} bytes, expected at most {self._out_bytes}")
        self._out.sync(x.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE, n, 0)
        return bytes(np.asarray(self._out.read(n, 0), dtype=np.uint8))

    def quiesce(self) -> None:
        """Let the failed token's data movers finish (the stopped core drains its inputs), at most 2 s."""
        done = self._x.ert_cmd_state.ERT_CMD_STATE_COMPLETED
        end = time.monotonic() + 2.0
        for r in self._mm2s_runs:
            while r.wait(POLL_MS) != done and time.monotonic() < end:
                pass
        self._mm2s_runs = []

    def _start(self, kernel, args: dict):
        """A run of ``kernel`` with its memory-mapped and scalar arguments set by index (stream arguments,
        connected in the xclbin, are left alone), started."""
        r = self._x.run(kernel)
        for i, v in args.items():
            r.set_arg(i, v)
        r.start()
        return r

    def close(self) -> None:
        self._img = []
        self._tok = self._out = self._count = None
