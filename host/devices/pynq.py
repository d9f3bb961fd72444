"""The PYNQ device: the core on a Zynq-7000 / Zynq UltraScale+ board (PYNQ-Z2, KV260, ZCU104) through ``pynq``.

The overlay is the one ``make bitstream BOARD=<board>`` builds (``hw/boards/xilinx.py``): the core
(``core``, its AXI4-Lite register map at offset 0, the shell's soft reset at 0xF0), one AXI DMA per weight
channel (``dma0``, ``dma1``, ...: MM2S in simple mode, 26-bit lengths) whose stream feeds channel ``c``,
and DMA 0's S2MM taking the output packet. ``pynq`` is imported when the device is constructed, never at
package import (the board's own ``pynq``, PYNQ 3.0 on Python 3.10; nothing newer is needed).

What the driver uses of ``pynq``: ``Overlay(path, download=...)`` and its ``ip_dict`` and DMA attributes;
``allocate(shape=..., dtype=...)`` buffers (``flush``, ``invalidate``, ``freebuffer``); the DMA channels'
``transfer(buffer, start, nbytes)``, ``idle``, ``error``, ``stop()`` and ``start()``; ``MMIO(base,
length)`` ``read``/``write``. It never calls the blocking ``wait()``: it polls ``idle``, ``error`` and
the core's ``STATUS`` until a deadline, so a stuck transfer is a :class:`~host.devices.base.DeviceError`
(a time-out), never a hang.

Per token: the token packet goes to channel 0 as one DMA transfer, then each channel's image stream in
transfers of at most ``chunk_bytes`` (below the AXI DMA's 64 MiB per-transfer limit); DMA 0's S2MM receives
the output packet. The Zynq top ignores the DMAs' ``tlast`` (each transfer ends with one), so chunking is
invisible to the core.
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

__all__ = ["PynqDevice", "PynqTransport", "DMA_MAX_BYTES"]

#: The AXI DMA's largest simple-mode transfer (26-bit length register), rounded down to whole 4 KiB pages.
DMA_MAX_BYTES = ((1 << 26) - 1) & ~0xFFF
#: Register window of the core (the map is 0x100 bytes; the block design gives it 64 KiB).
CORE_WINDOW = 0x1000


def _default_bitstream() -> Path:
    env = os.environ.get("MMFREE_BITSTREAM")
    if env:
        return Path(env)
    return Path("mmfree.bit")


class PynqDevice(AcceleratorDevice):
    """The accelerator on a PYNQ board.

    Parameters
    ----------
    bitstream : str or Path, optional
        The overlay's ``.bit`` (its ``.hwh`` beside it). Default: ``$MMFREE_BITSTREAM``, else
        ``./mmfree.bit``.
    download : bool
        Program the PL (``Overlay(..., download=True)``); False uses what is loaded already.
    timeout_s : float
        Seconds one token may take (DMA transfers and the core) before a time-out DeviceError.
    chunk_bytes : int
        Largest DMA transfer; a multiple of 4096, at most :data:`DMA_MAX_BYTES`.
    core_name, dma_prefix : str
        Names of the core and the DMAs in the overlay's ``ip_dict`` (``core``, ``dma0``...).
    output_gate : {"released", "paper"}

    Raises
    ------
    DeviceError
        ``pynq`` is missing, the bitstream or ``.hwh`` is missing, the overlay lacks the core or a DMA, or
        the core's ID block is wrong (not an mmfree core, another ISA version).
    ValueError
        Bad parameters.
    """

    name = "pynq"

    def __init__(self, *, bitstream: str | Path | None = None, download: bool = True, timeout_s: float = 10.0,
                 chunk_bytes: int = DMA_MAX_BYTES, core_name: str = "core", dma_prefix: str = "dma",
                 output_gate: str = "released") -> None:
        if (not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes <= 0
                or chunk_bytes % 4096 or chunk_bytes > DMA_MAX_BYTES):
            raise ValueError(f"chunk_bytes must be a positive multiple of 4096 up to {DMA_MAX_BYTES}, got "
                             f"{chunk_bytes!r}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        transport = PynqTransport(bitstream, download=download, chunk_bytes=chunk_bytes, core_name=core_name,
                                  dma_prefix=dma_prefix)
        super().__init__(transport, timeout_s=timeout_s, output_gate=output_gate)
        self.connect()

    bitstream = property(lambda self: self.transport.bitstream)
    overlay = property(lambda self: self.transport.overlay)
    dmas = property(lambda self: self.transport.dmas)
    chunk_bytes = property(lambda self: self.transport.chunk_bytes)


class PynqTransport(ShellTransport):
    """The overlay's core registers (MMIO) and AXI DMAs as a :class:`~host.devices.driver.Transport`.

    Parameters
    ----------
    bitstream, download, chunk_bytes, core_name, dma_prefix
        As :class:`PynqDevice`.
    """

    def __init__(self, bitstream: str | Path | None, *, download: bool, chunk_bytes: int, core_name: str,
                 dma_prefix: str) -> None:
        self.chunk_bytes = chunk_bytes
        path = Path(bitstream) if bitstream is not None else _default_bitstream()
        try:
            import pynq
        except ImportError as exc:
            raise DeviceError("device 'pynq' needs the pynq package of a PYNQ board image (pip install "
                              "'mmfree-fpga[board]' on the board)") from exc
        self._pynq = pynq
        if not path.is_file():
            raise DeviceError(f"device 'pynq': bitstream {path} not found (pass bitstream=, or set MMFREE_BITSTREAM; "
                              f"copy mmfree.bit and mmfree.hwh from bitstreams/<board>/)")
        if not path.with_suffix(".hwh").is_file():
            raise DeviceError(f"device 'pynq': {path.with_suffix('.hwh')} not found: PYNQ needs the .hwh beside "
                              f"the .bit")
        self.bitstream = path
        self.overlay = pynq.Overlay(str(path), download=download)
        ips = self.overlay.ip_dict
        if core_name not in ips:
            raise DeviceError(f"device 'pynq': the overlay has no {core_name!r} IP (has: {', '.join(sorted(ips))})")
        core = ips[core_name]
        self._mmio = pynq.MMIO(int(core["phys_addr"]), CORE_WINDOW)
        self._buffers: list = []
        self._chunks: list[list[tuple[object, int, int]]] = []
        self._tok = None
        self._out = None
        self._out_bytes = 0
        self._dma_prefix = dma_prefix
        self.dmas: list = []

    def check_ident(self, ident: IdBlock) -> None:
        """One DMA per channel of the core."""
        dmas = []
        for c in range(ident.channels):
            nm = f"{self._dma_prefix}{c}"
            if nm not in self.overlay.ip_dict:
                raise DeviceError(f"device 'pynq': the core has {ident.channels} channel(s) but the "
                                  f"overlay has no {nm!r} DMA")
            dmas.append(getattr(self.overlay, nm))
        self.dmas = dmas

    # ------------------------------------------------------------------ registers
    def read(self, offset: int) -> int:
        return int(self._mmio.read(offset)) & 0xFFFFFFFF

    def write(self, offset: int, value: int) -> None:
        self._mmio.write(offset, int(value) & 0xFFFFFFFF)

    # ------------------------------------------------------------------ buffers
    def _free(self) -> None:
        for b in self._buffers:
            free = getattr(b, "freebuffer", None)
            if callable(free):
                free()
        self._buffers = []
        self._chunks = []
        self._tok = self._out = None

    def _alloc(self, nbytes: int):
        buf = self._pynq.allocate(shape=(nbytes,), dtype=np.uint8)
        self._buffers.append(buf)
        return buf

    def stage(self, streams, out_bytes: int) -> None:
        self._free()
        try:
            for c, s in enumerate(streams):
                buf = self._alloc(len(s))
                buf[:] = np.frombuffer(s, dtype=np.uint8)
                buf.flush()
                self._chunks.append([(buf, off, min(self.chunk_bytes, len(s) - off))
                                     for off in range(0, len(s), self.chunk_bytes)])
                if not self._chunks[c]:
                    raise DeviceError(f"device 'pynq': channel {c} has an empty stream")
            self._out = self._alloc(out_bytes)
        except MemoryError as exc:
            self._free()
            raise DeviceError(f"device 'pynq': cannot allocate {sum(map(len, streams)):,} bytes of DMA memory "
                              f"({exc}); the model does not fit the board's contiguous memory") from exc
        self._out_bytes = out_bytes

    # ------------------------------------------------------------------ one token
    def transfer(self, packet: bytes, deadline: float, poll) -> bytes:
        n = len(packet)
        if self._tok is None or n > len(self._tok):
            if self._tok is not None:
                self._buffers.remove(self._tok)
                self._tok.freebuffer()
            self._tok = self._alloc(n)
        self._tok[:n] = np.frombuffer(packet, dtype=np.uint8)
        self._tok.flush()
        recv = self.dmas[0].recvchannel
        recv.transfer(self._out, 0, self._out_bytes)
        queues = [list(ch) for ch in self._chunks]
        queues[0].insert(0, (self._tok, 0, n))
        busy = [False] * len(queues)
        while True:
            for c, q in enumerate(queues):
                ch = self.dmas[c].sendchannel
                if ch.error:
                    self._reset_dma()
                    raise DeviceError(f"device 'pynq': DMA {c} (MM2S) reported an error (AXI DMA status "
                                      f"0x{self._dma_status(ch):08x})")
                if busy[c] and ch.idle:
                    busy[c] = False
                if not busy[c] and q:
                    buf, off, nb = q.pop(0)
                    ch.transfer(buf, off, nb)
                    busy[c] = True
            if recv.error:
                self._reset_dma()
                raise DeviceError("device 'pynq': DMA 0 (S2MM) reported an error: the output packet is longer "
                                  "than expected")
            poll()
            if not any(busy) and not any(queues) and recv.idle:
                break
            if time.monotonic() > deadline:
                left = [c for c in range(len(queues)) if busy[c] or queues[c]]
                self._reset_dma()
                raise TimeoutError(f"DMA channel(s) {left} still streaming" if left else
                                   "the output packet did not arrive")
        self._out.invalidate()
        return bytes(np.asarray(self._out[:self._out_bytes], dtype=np.uint8))

    @staticmethod
    def _dma_status(ch) -> int:
        mmio, off = getattr(ch, "_mmio", None), getattr(ch, "_offset", None)
        return int(mmio.read(off + 4)) if mmio is not None and off is not None else 0

    def _reset_dma(self) -> None:
        for d in self.dmas:
            for ch in (d.sendchannel, getattr(d, "recvchannel", None)):
                if ch is not None:
                    ch.stop()
                    ch.start()

    def quiesce(self) -> None:
        self._reset_dma()

    def close(self) -> None:
        self._free()
