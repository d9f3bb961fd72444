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

from host.devices.base import DeviceError
from host.devices.driver import AcceleratorDevice, Delivery
from host.image import ImageInfo
from host.protocol import DeviceTimeout, IdBlock, token_packet_bytes
from hw import isa
from hw.boards import uart_link as ul
from hw.isa import Ctrl, TritPacking

__all__ = ["Ecp5Device", "Ecp5Transport", "LinkError", "LinkTimeout", "UartLink", "DEFAULT_PORT", "DEFAULT_BAUD",
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


class LinkTimeout(LinkError, DeviceTimeout):
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


class Ecp5Transport:
    """The board's UART link (:class:`UartLink`) as a :class:`~host.devices.driver.Transport`: per token the
    token packet and then the whole image through ``'S'`` (the board has no DRAM for the image yet), the output
    packet from the ``'o'`` frames, registers through ``'R'``/``'W'``, the core reset through ``'X'``.

    Parameters
    ----------
    port_name, baud, timeout, serial
        As :class:`Ecp5Device`.
    """

    extra_counters = ("link_bytes", "link_ns")

    def __init__(self, port_name: str, baud: int, timeout: float, serial: Any = None) -> None:
        self.port_name, self.baud, self.timeout = port_name, baud, timeout
        self._serial = serial
        self.link: UartLink | None = None
        self.stream: bytes = b""

    def connect(self, info: ImageInfo | None) -> None:
        """Open the port (once) and resynchronise the link."""
        if self.link is not None:
            return
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
        except DeviceError:
            self.close()
            raise

    def check_ident(self, ident: IdBlock) -> None:
        """The link drives one 64-bit channel."""
        if ident.channels != 1 or ident.bus_bits != ul.BEAT_BYTES * 8:
            self.close()
            raise DeviceError(f"device 'ecp5': the link drives one 64-bit channel; the board reports "
                              f"{ident.channels} channel(s) of {ident.bus_bits} bits")

    def read(self, offset: int) -> int:
        return self.link.read(offset)

    def write(self, offset: int, value: int) -> None:
        self.link.write(offset, value)

    def reset(self) -> None:
        self.link.reset_core()

    def stage(self, streams, out_bytes: int) -> None:
        (self.stream,) = streams

    def run(self, packet: bytes, deadline: float | None, poll) -> Delivery:
        """The token packet and the image, then the core's STATUS, then its output packet (up to 10 time-outs)."""
        link = self.link
        t0 = time.perf_counter_ns()
        link.stream(packet, last=True)
        link.stream(self.stream, last=True)
        poll()
        out = link.read_output(10 * self.timeout)
        return Delivery(out, None, {"link_bytes": len(packet) + len(self.stream),
                                    "link_ns": time.perf_counter_ns() - t0})

    def recover(self, timed_out: bool) -> None:
        if timed_out:       # the link lost its framing or the board stopped answering: resynchronise, reset
            self.link.resync()
            self.link.reset_core()
        else:               # the core stopped the token: it waits for the next token packet
            self.link.write(_R.CTRL, Ctrl.CLEAR.value)
            self.link.output.clear()

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None


class Ecp5Device(AcceleratorDevice):
    """An ECP5 board (``bitstreams/ulx3s-85f`` or ``bitstreams/ecpix5-85f``) over its serial port: the one driver
    (:class:`~host.devices.driver.AcceleratorDevice`) over :class:`Ecp5Transport`.

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
        port_name = port or os.environ.get("MMFREE_ECP5_PORT", DEFAULT_PORT)
        super().__init__(Ecp5Transport(port_name, baud, float(timeout), serial), output_gate=output_gate)
        self.port_name, self.baud, self.timeout = port_name, baud, float(timeout)

    link = property(lambda self: self.transport.link, doc="The open :class:`UartLink` (or None).")

    @property
    def id_block(self) -> dict[int, int] | None:
        """The ID block's registers, ``{offset: value}`` (None before the board is opened)."""
        return self.ident.registers() if self.ident is not None else None

    @property
    def packing(self) -> TritPacking:
        """The packing images for this board are compiled with."""
        if self.ident is None or self.ident.packing is None:
            mask = self.ident.packings if self.ident is not None else 0
            raise DeviceError(f"device 'ecp5': the ID block names no packing (mask 0x{mask:x})")
        return self.ident.packing

    def seconds_per_token(self) -> float | None:
        """Wire-time lower bound of one token for the loaded image at this baud rate."""
        if self.image is None:
            return None
        return token_seconds(len(self.transport.stream) + token_packet_bytes(self.image.info.hidden), self.baud)
