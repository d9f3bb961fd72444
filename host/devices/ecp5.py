"""The ECP5 device: an ULX3S 85F or ECPIX-5 85F board running ``bitstreams/<board>/<board>.bit``, driven
over its FTDI serial port through the UART link (:mod:`hw.boards.uart_link`).

Per token the host sends the token packet (the golden device's packet, byte for byte) and then the whole
model image through the link's ``'S'`` command, collects the core's output packet from the ``'o'``
frames, and reads the counters through ``'R'``. 8N1 framing costs 10 line bits per byte, so a token takes
``(packet + image bytes) * 10 / baud`` seconds at least: for the shipped model (1.95 MB image) at the
builds' 2 Mbaud, about 9.8 s per token (0.10 tokens/s). Slow, but real: the logits are the core's own.

:class:`UartLink` is the protocol (any object with pyserial's ``read``/``write``/``reset_input_buffer``/
``close`` and a ``timeout`` attribute will do: the tests use a port backed by the link's gateware in the
Amaranth simulator, and a protocol-level board model); :class:`Ecp5Device` is the
:class:`~host.devices.base.Device`. ``pyserial`` is imported only when a port is opened by name.

Saving and restoring the state works as on the RTL device (:mod:`host.devices.rtl`): the state lives in
the core's memory, so :meth:`~host.devices.base.Device.save_state` keeps the token ids since the last reset
and restoring replays them after a core reset (``'X'``).
"""

from __future__ import annotations

import os
import struct
import time
from collections import deque
from typing import Any

import numpy as np

from host.devices.base import DeviceError, ReplayLogDevice, check_isa_version
from host.image import ParsedImage, parse_image
from host.model import ModelWeights
from hw import isa
from hw import numerics as nx
from hw.boards import uart_link as ul
from hw.isa import Counter, ErrorCause, TritPacking

__all__ = ["Ecp5Device", "LinkError", "LinkTimeout", "UartLink", "DEFAULT_PORT", "DEFAULT_BAUD",
           "token_seconds"]

#: serial port used when none is given (``MMFREE_ECP5_PORT`` overrides)
DEFAULT_PORT = "/dev/ttyUSB0"
#: the link rate of the boards' default builds (``hw.boards.ecp5.CHOSEN``: 100 MHz / 50 on the ECPIX-5,
#: 50 MHz / 25 on the ULX3S; ``MMFREE_ECP5_BAUD`` overrides, for a bitstream built with another ``--baud``)
DEFAULT_BAUD = 2_000_000
_R = isa.REGISTER_MAP


def token_seconds(stream_bytes: int, baud: int = DEFAULT_BAUD) -> float:
    """Lower bound of the wire time of one token: ``stream_bytes`` (token packet + image) plus the ``'S'``
    headers (4 bytes per :data:`~hw.boards.uart_link.CHUNK_BEATS` beats), 10 bits per byte."""
    beats = -(-stream_bytes // ul.BEAT_BYTES)
    chunks = -(-beats // ul.CHUNK_BEATS)
    return (stream_bytes + 4 * chunks) * 10 / baud


class LinkError(DeviceError):
    """The link returned something the protocol does not allow (lost framing, a wrong reply)."""


class LinkTimeout(LinkError):
    """No reply within the time-out: no board, a board without the bitstream, or a hung link."""


class UartLink:
    """Host side of the UART link protocol (:mod:`hw.boards.uart_link`).

    Parameters
    ----------
    port : serial-like
        ``read(n) -> bytes`` (fewer bytes on time-out), ``write(bytes)``, ``reset_input_buffer()``,
        ``close()``, a settable ``timeout`` (seconds).
    timeout : float
        Seconds to wait for any one reply frame.

    Attributes
    ----------
    output : collections.deque of (int, bool)
        Core output words (``tdata``, ``tlast``) received and not yet taken by :meth:`read_output`.
    """

    def __init__(self, port: Any, *, timeout: float = 2.0):
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.port = port
        self.timeout = float(timeout)
        self.port.timeout = self.timeout
        self.output: deque[tuple[int, bool]] = deque()

    # ---------------------------------------------------------------- frames
    def _read_exact(self, n: int, what: str) -> bytes:
        buf = b""
        deadline = time.monotonic() + self.timeout
        while len(buf) < n:
            got = self.port.read(n - len(buf))
            if got:
                buf += got
            elif time.monotonic() >= deadline:
                raise LinkTimeout(f"ECP5 link: no {what} within {self.timeout:g} s ({len(buf)} of {n} bytes): is the "
                                  f"board connected, powered and loaded with the bitstream, and is the port's rate "
                                  f"the bitstream's (its report.json 'baud'; MMFREE_ECP5_BAUD)?")
        return buf

    def _reply(self, want: int) -> bytes:
        """The next reply frame (output frames on the way are queued in :attr:`output`)."""
        while True:
            head = self._read_exact(1, f"reply {chr(want)!r}")[0]
            if head not in ul.REPLY_BYTES:
                raise LinkError(f"ECP5 link: lost framing (byte 0x{head:02x} where a frame starts; a port rate "
                                f"other than the bitstream's looks like this: MMFREE_ECP5_BAUD)")
            body = self._read_exact(ul.REPLY_BYTES[head], f"body of frame {chr(head)!r}")
            if head == ul.REP_OUTPUT:
                self.output.append((int.from_bytes(body[:4], "little"), bool(body[4] & 1)))
                continue
            if head != want:
                raise LinkError(f"ECP5 link: reply {chr(head)!r} where {chr(want)!r} was due")
            return body

    # ---------------------------------------------------------------- commands
    def read(self, addr: int) -> int:
        """One register read (byte address, 32-bit value)."""
        self._check_addr(addr)
        self.port.write(bytes([ul.OP_READ, addr]))
        return int.from_bytes(self._reply(ul.REP_READ), "little")

    def write(self, addr: int, value: int) -> None:
        """One register write."""
        self._check_addr(addr)
        if not 0 <= value < 1 << 32:
            raise ValueError(f"register value must fit 32 bits, got {value}")
        self.port.write(bytes([ul.OP_WRITE, addr]) + value.to_bytes(4, "little"))
        self._reply(ul.REP_WRITE)

    def reset_core(self) -> None:
        """Reset the core (state, registers, counters); the link and the queued output are cleared too."""
        self.port.write(bytes([ul.OP_RESET]))
        self._reply(ul.REP_RESET)
        self.output.clear()

    def stream(self, data: bytes, *, last: bool = True) -> None:
        """Send ``data`` (a multiple of 8 bytes) as beats of the weight stream, ``tlast`` on the final beat
        when ``last``; at most :data:`~hw.boards.uart_link.WINDOW_CHUNKS` commands are unacknowledged, so
        the board's receive FIFO never overflows.

        Raises
        ------
        ValueError
            On an empty stream or one that is not a whole number of beats.
        LinkTimeout
            When the core stops taking beats for longer than the time-out.
        """
        if not data or len(data) % ul.BEAT_BYTES:
            raise ValueError(f"a stream is a non-empty multiple of {ul.BEAT_BYTES} bytes, got {len(data)}")
        step = ul.CHUNK_BEATS * ul.BEAT_BYTES
        starts = range(0, len(data), step)
        pending = 0
        for i, s in enumerate(starts):
            chunk = data[s:s + step]
            flags = 1 if (last and i == len(starts) - 1) else 0
            if pending == ul.WINDOW_CHUNKS:
                self._reply(ul.REP_STREAM)
                pending -= 1
            self.port.write(bytes([ul.OP_STREAM]) + struct.pack("<HB", len(chunk) // ul.BEAT_BYTES - 1, flags)
                            + chunk)
            pending += 1
        for _ in range(pending):
            self._reply(ul.REP_STREAM)

    def read_output(self, timeout: float | None = None) -> bytes:
        """The next whole output packet (words up to ``tlast``), waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        words: list[int] = []
        while True:
            while self.output:
                w, last = self.output.popleft()
                words.append(w)
                if last:
                    return struct.pack(f"<{len(words)}I", *words)
            if time.monotonic() >= deadline:
                raise LinkTimeout(f"ECP5 link: the output packet did not end within the time-out ({len(words)} words)")
            got = self.port.read(1)
            if not got:
                continue
            head = got[0]
            if head != ul.REP_OUTPUT:
                raise LinkError(f"ECP5 link: frame {chr(head)!r} while waiting for output")
            body = self._read_exact(5, "output word")
            self.output.append((int.from_bytes(body[:4], "little"), bool(body[4] & 1)))

    def resync(self, quiet: float = 0.5) -> None:
        """After a time-out: wait past the board's byte time-out (2^24 cycles: about 0.34 s at 50 MHz), drop what
        arrived."""
        time.sleep(quiet)
        self.port.reset_input_buffer()
        self.output.clear()

    def close(self) -> None:
        self.port.close()

    @staticmethod
    def _check_addr(addr: int) -> None:
        if not 0 <= addr < _R.SIZE or addr % 4:
            raise ValueError(f"register address must be a word in 0..0x{_R.SIZE - 4:x}, got {addr!r}")


class Ecp5Device(ReplayLogDevice):
    """An ECP5 board (``bitstreams/ulx3s-85f`` or ``bitstreams/ecpix5-85f``) over its serial port.

    Parameters
    ----------
    port : str, optional
        Serial port (default ``$MMFREE_ECP5_PORT`` or ``/dev/ttyUSB0``; the ULX3S's FT231X; on the
        ECPIX-5 the FT2232H's second interface, usually ``/dev/ttyUSB1``).
    baud : int, optional
        The bitstream's rate, bits/s (default ``$MMFREE_ECP5_BAUD`` or :data:`DEFAULT_BAUD`, the 2 Mbaud
        of the boards' default builds; a build's ``report.json`` gives it as ``baud``).
    timeout : float
        Seconds to wait for any reply (and, times 10, for a token's output).
    output_gate : {"released", "paper"}
        Passed to the compiler, as for the golden device.
    serial : serial-like, optional
        An already open port (see :class:`UartLink`); ``port`` and ``baud`` are then unused.

    Raises
    ------
    DeviceError
        (on :meth:`load`) pyserial missing, the port cannot be opened, no reply, a wrong ID block, or a
        model that does not fit the build.
    """

    name = "ecp5"

    def __init__(self, *, port: str | None = None, baud: int | None = None, timeout: float = 2.0,
                 output_gate: str = "released", serial: Any = None) -> None:
        super().__init__()
        if baud is None:
            env = os.environ.get("MMFREE_ECP5_BAUD", "")
            try:
                baud = int(env) if env else DEFAULT_BAUD
            except ValueError:
                baud = 0
            if baud <= 0:
                raise ValueError(f"MMFREE_ECP5_BAUD must be a positive integer rate in bits/s, got {env!r}")
        if isinstance(baud, bool) or not isinstance(baud, int) or baud <= 0:
            raise ValueError(f"baud must be a positive integer, got {baud!r}")
        self.port_name = port or os.environ.get("MMFREE_ECP5_PORT", DEFAULT_PORT)
        self.baud, self.timeout, self.output_gate = baud, float(timeout), output_gate
        self._serial = serial
        self.link: UartLink | None = None
        self.id_block: dict[int, int] | None = None
        self.image: ParsedImage | None = None
        self._stream: bytes = b""
        self._emb: np.ndarray | None = None
        self._frac = 0
        self._log: list[int] = []
        self._lost = False
        self._base = {c: 0 for c in Counter}
        self._counters.update({f"hw_{c.name.lower()}": 0 for c in Counter})
        self._counters.update({"link_bytes": 0, "link_ns": 0, "replayed_tokens": 0})

    # ------------------------------------------------------------------ open
    def _open(self) -> UartLink:
        if self.link is not None:
            return self.link
        port = self._serial
        if port is None:
            try:
                import serial  # pyserial, imported only for a real port
            except ImportError as exc:
                raise DeviceError("device 'ecp5' needs pyserial: pip install 'mmfree-fpga[ecp5]'") from exc
            try:
                port = serial.Serial(self.port_name, self.baud, timeout=self.timeout)
            except (OSError, serial.SerialException) as exc:
                raise DeviceError(f"device 'ecp5': cannot open {self.port_name} at {self.baud} baud: {exc} "
                                  f"(set MMFREE_ECP5_PORT to the serial port)") from exc
        self.link = UartLink(port, timeout=self.timeout)
        try:
            self.link.resync(0.0)
            self.link.reset_core()
            self.id_block = self._check_id()
        except DeviceError:
            self.link.close()
            self.link = None
            raise
        return self.link

    def _check_id(self) -> dict[int, int]:
        link = self.link
        magic = link.read(_R.ID_MAGIC)
        if magic != isa.ID_MAGIC:
            raise DeviceError(f"device 'ecp5': ID magic 0x{magic:08x}, expected 0x{isa.ID_MAGIC:08x}: not the mmfree "
                              f"bitstream")
        ids = {off: link.read(off) for off in range(0, _R.CTRL, 4)}
        check_isa_version("ecp5", ids[_R.ID_VERSION])
        if ids[_R.ID_CHANNELS] != 1 or ids[_R.ID_BUS_BITS] != ul.BEAT_BYTES * 8:
            raise DeviceError(f"device 'ecp5': the link drives one 64-bit channel; the board reports "
                              f"{ids[_R.ID_CHANNELS]} channel(s) of {ids[_R.ID_BUS_BITS]} bits")
        return ids

    @property
    def packing(self) -> TritPacking:
        mask = self.id_block[_R.ID_PACKINGS] if self.id_block else 1
        for p in TritPacking:
            if mask >> p.value & 1:
                return p
        raise DeviceError(f"device 'ecp5': the ID block names no packing (mask 0x{mask:x})")

    # ------------------------------------------------------------------ load
    def _load(self, weights: ModelWeights) -> None:
        from host.compiler import CompileOptions, compile_model
        from host.devices.rtl import channel_streams

        self._open()
        cfg = weights.config
        ids = self.id_block
        need = {_R.ID_MAX_HIDDEN: cfg.hidden_size, _R.ID_MAX_INTERMEDIATE: cfg.intermediate_size,
                _R.ID_MAX_LAYERS: 1 << max(cfg.num_hidden_layers - 1, 0).bit_length(), _R.ID_MAX_VOCAB: cfg.vocab_size}
        small = {f"0x{o:02x}": (ids[o], v) for o, v in need.items() if ids[o] < v}
        if small:
            raise DeviceError(f"device 'ecp5': the model does not fit the bitstream's buffers (register: (capacity, "
                              f"needed)): {small}")
        options = CompileOptions(packing=self.packing, channels=1, output_gate=self.output_gate)
        self.image = parse_image(compile_model(weights, options))
        (self._stream,) = channel_streams(self.image, 1)
        self._emb, self._frac = weights.embeddings, self.image.info.residual_frac
        self._reset()

    # ------------------------------------------------------------------ tokens
    def token_packet(self, token_id: int, position: int = 0, logits: bool = True) -> bytes:
        """The host's embedding lookup for one token (the golden device's packet, byte for byte)."""
        from host.devices.golden import make_token_packet

        return make_token_packet(nx.to_fixed(self._emb[token_id], self._frac), position=position, logits=logits)

    def run_packet(self, packet: bytes) -> bytes:
        """Send one token packet and the image, return the core's output packet.

        Raises
        ------
        DeviceError
            The core stopped the token (its cause and instruction; the committed state is unchanged and
            the error is cleared), or the link timed out (the link is resynchronised and the core reset:
            the state must be replayed).
        """
        link = self.link
        t0 = time.perf_counter_ns()
        try:
            link.stream(packet, last=True)
            link.stream(self._stream, last=True)
            status = link.read(_R.STATUS)
            if status & 4:
                cause, where = link.read(_R.ERROR_CAUSE), link.read(_R.ERROR_WHERE)
                link.write(_R.CTRL, isa.Ctrl.CLEAR.value)      # wait for the next token packet
                link.output.clear()
                try:
                    name = ErrorCause(cause).name
                except ValueError:
                    name = f"cause {cause}"
                raise DeviceError(f"device 'ecp5': the core stopped the token with {name} at instruction {where}; "
                                  f"its committed state is unchanged")
            out = link.read_output(10 * self.timeout)
        except LinkTimeout:
            link.resync()
            link.reset_core()
            self._lost = True
            raise
        self._counters["link_bytes"] += len(packet) + len(self._stream)
        self._counters["link_ns"] += time.perf_counter_ns() - t0
        self._read_counters()
        return out

    def _read_counters(self) -> None:
        for c in Counter:
            lo, hi = self.link.read(_R.counter(c)), self.link.read(_R.counter(c) + 4)
            v = lo | hi << 32
            self._counters[f"hw_{c.name.lower()}"] += v - self._base[c]
            self._base[c] = v

    def _run(self, token_id: int, position: int) -> np.ndarray:
        from host.devices.golden import parse_output_packet

        out = self.run_packet(self.token_packet(token_id, position))
        try:
            return parse_output_packet(out).logits()
        except ValueError as exc:
            raise DeviceError(f"device 'ecp5': bad output packet from the core: {exc}") from exc

    def _reset(self) -> None:
        self.link.reset_core()
        self._base = {c: 0 for c in Counter}
        self._log = []
        self._lost = False

    def _close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None

    def seconds_per_token(self) -> float | None:
        """Wire-time lower bound of one token for the loaded image at this baud rate."""
        if self.image is None:
            return None
        return token_seconds(len(self._stream) + len(self.token_packet(0)), self.baud)
