"""The ECP5 device: an ULX3S 85F or ECPIX-5 85F board driven over its FTDI serial port through the UART link
protocol (:mod:`hw.boards.link_protocol`, pure Python: this module imports without Amaranth).

Two kinds of bitstream answer on the port, told apart on connect by a board-register read (``'G'``):

* **DRAM boards** (link version 2 or 3, :mod:`hw.boards.dram_board`; the committed ULX3S and ECPIX-5 bitstreams,
  ``bitstreams/<board>/<board>.bit``, speak version 3): the model image and the embedding table live in the board's
  DRAM, **loaded once** (:meth:`Ecp5Transport.load_model`: block CRCs compared, only differing blocks written,
  so a load interrupted by a dropped link restarts where it stopped; a reconnect finds the board's
  ``IMAGE_CHECKSUM`` naming the bundle and skips the load). Per token the link carries a ``'T'`` command
  (token id and position, 10 bytes) and its ``'t'`` reply, then either the whole output packet (``'o'``
  frames, when the logits are asked for) or, for greedy decoding, the 3-word argmax summary
  (:meth:`~host.devices.base.Device.step_argmax`): 30 bytes on the wire per token, 12 of them the summary.
  Version 3 adds the DRAM controller's control bus (``'K'``/``'J'``: :meth:`UartLink.ctrl_read`,
  :class:`ControlBus`) and the port enable, for the host's read leveling of a DDR3 board
  (:meth:`Ecp5Transport.level`, :mod:`host.leveling`; **not run on hardware**).
* **Stream-only boards** (link version 1: the first ECP5 builds, and ``python -m hw.boards BOARD --no-dram``): they
  answer ``'?'`` to ``'G'``. Per token the
  host sends the token packet (the golden device's, byte for byte) and then the whole model image through ``'S'``,
  10 line bits per byte: for the shipped model (1.95 MB image) at 2 Mbaud about 9.8 s per token (0.10 tokens/s).

:class:`UartLink` is the protocol (any object with pyserial's ``read``/``write``/``reset_input_buffer``/
``close`` and a ``timeout`` attribute will do: the tests use a port backed by the link's gateware in the
Amaranth simulator, and a protocol-level board model); :class:`Ecp5Transport` the
:class:`~host.devices.driver.Transport`; :class:`Ecp5Device` the :class:`~host.devices.base.Device`.
``pyserial`` is imported only when a port is opened by name (:func:`open_port`, which also sets the FTDI
latency timer to 1 ms: :func:`set_ftdi_latency`).

Saving and restoring the state works as on the RTL device (:mod:`host.devices.rtl`): the state lives in
the core's memory, so :meth:`~host.devices.base.Device.save_state` keeps the token ids since the last reset
and restoring replays them after a core reset (``'X'``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from host.devices.base import DeviceError
from host.devices.driver import AcceleratorDevice, Delivery
from host.image import ImageInfo, ParsedImage
from host.protocol import DeviceTimeout, IdBlock, token_packet_bytes
from hw import isa
from hw.boards import link_protocol as lp
from hw.boards.facts import BOARDS
from hw.boards.link_protocol import BoardReg, BoardStatus, CtrlStatus, DramStatus, TokenFlags, TokenStatus
from hw.isa import Ctrl, TritPacking
from hw.state_layout import StateGeometry

__all__ = ["Ecp5Device", "Ecp5Transport", "LinkError", "LinkTimeout", "UartLink", "ControlBus", "DramLayout",
           "LoadReport",
           "MemtestReport", "dram_contents", "bundle_checksum", "open_port", "set_ftdi_latency", "DEFAULT_PORT",
           "DEFAULT_BAUD", "DEFAULT_BOARD", "ECP5_BOARDS", "board_link", "DRAM_BLOCK_BYTES", "TABLE_ALIGN",
           "TOKEN_WIRE_BYTES", "token_seconds"]

log = logging.getLogger(__name__)

#: the ECP5 boards (:data:`hw.boards.facts.BOARDS`, the one table of their link rates and serial ports)
ECP5_BOARDS = tuple(k for k, b in BOARDS.items() if b.family == "ecp5")
#: the board assumed when none is named (``MMFREE_ECP5_BOARD`` or ``board=`` names another)
DEFAULT_BOARD = "ulx3s-85f"
#: serial port used when neither a port nor a board is given (``MMFREE_ECP5_PORT`` overrides)
DEFAULT_PORT = BOARDS[DEFAULT_BOARD].serial_port
#: the link rate of :data:`DEFAULT_BOARD`'s committed bitstream, bits/s (``MMFREE_ECP5_BAUD`` overrides, for a
#: bitstream built with another ``--baud``)
DEFAULT_BAUD = BOARDS[DEFAULT_BOARD].link_baud
#: DRAM load granularity: each block's CRC is compared with the board's (``'C'``) and only differing blocks are
#: written (``'L'``), so an interrupted load restarts where it stopped
DRAM_BLOCK_BYTES = 64 * 1024
#: the embedding table starts at the first multiple of this after the image
TABLE_ALIGN = 4096
#: ``'C'`` commands the host keeps unanswered (9 bytes each: far below the receive FIFO)
CRC_WINDOW = 64
#: wire bytes of one argmax-only token in DRAM mode: ``'T'`` (10), ``'t'`` (2), 3 ``'o'`` frames (6 each)
TOKEN_WIRE_BYTES = 1 + lp.COMMAND_BYTES[lp.OP_TOKEN] + 1 + lp.REPLY_BYTES[lp.REP_TOKEN] \
    + lp.ARGMAX_SUMMARY_WORDS * (1 + lp.REPLY_BYTES[lp.REP_OUTPUT])
#: ``'J'`` commands the host keeps unanswered on the control bus (9 bytes each: far below the receive FIFO)
CTRL_WINDOW = 64
#: where Linux exposes the FTDI driver's latency timer (``<tty>/latency_timer``, milliseconds)
SYSFS_USB_SERIAL = Path("/sys/bus/usb-serial/devices")
_R = isa.REGISTER_MAP
_LATENCY_WARNED: set[str] = set()


def board_link(board: str | None = None, baud: int | None = None) -> tuple[str, str, int]:
    """``(board, port, baud)``: the serial port and link rate the host uses for ``board`` (default
    ``$MMFREE_ECP5_BOARD`` or :data:`DEFAULT_BOARD`): ``$MMFREE_ECP5_PORT`` or the board's usual port, and
    ``baud`` when given, else ``$MMFREE_ECP5_BAUD`` or the board's committed bitstream's rate
    (:attr:`hw.boards.facts.BoardFacts.link_baud`).

    Raises
    ------
    ValueError
        A board that is not an ECP5 board of :data:`hw.boards.facts.BOARDS`, or a ``MMFREE_ECP5_BAUD`` that is
        not a positive integer.
    """
    board = board or os.environ.get("MMFREE_ECP5_BOARD") or DEFAULT_BOARD
    if board not in ECP5_BOARDS:
        raise ValueError(f"unknown ECP5 board {board!r} (--board or MMFREE_ECP5_BOARD); known: "
                         f"{', '.join(ECP5_BOARDS)}")
    facts = BOARDS[board]
    port = os.environ.get("MMFREE_ECP5_PORT") or facts.serial_port
    if baud is not None:
        return board, port, baud
    env = os.environ.get("MMFREE_ECP5_BAUD", "")
    try:
        baud = int(env) if env else facts.link_baud
    except ValueError:
        baud = 0
    if baud <= 0:
        raise ValueError(f"MMFREE_ECP5_BAUD must be a positive integer rate in bits/s, got {env!r}")
    return board, port, baud


def token_seconds(stream_bytes: int, baud: int = DEFAULT_BAUD) -> float:
    """Lower bound of the wire time of one stream-mode token: ``stream_bytes`` (token packet + image) plus the
    ``'S'`` headers (4 bytes per :data:`~hw.boards.link_protocol.CHUNK_BEATS` beats), 10 bits per byte."""
    beats = -(-stream_bytes // lp.BEAT_BYTES)
    chunks = -(-beats // lp.CHUNK_BEATS)
    return (stream_bytes + 4 * chunks) * 10 / baud


class LinkError(DeviceError):
    """The link returned something the protocol does not allow (lost framing, a wrong reply), or the serial
    port failed."""


class LinkTimeout(LinkError, DeviceTimeout):
    """No reply within the time-out: no board, a board without the bitstream, or a hung link."""


# ------------------------------------------------------------------------------------------------ the port
def set_ftdi_latency(port_name: str, ms: int = 1, *, sysfs: Path | None = None) -> bool | None:
    """Set the FTDI driver's latency timer of ``port_name`` to ``ms`` milliseconds through sysfs.

    The timer (16 ms by default) is how long the FT231X / FT2232H holds a partly filled USB packet before
    sending it: every reply shorter than a packet waits that long, which would dominate a token of the DRAM
    boards (30 bytes on the wire). Linux only; elsewhere nothing is done.

    Returns
    -------
    True when the timer is ``ms`` now, None when the port has no such attribute (not an FTDI port, not
    Linux), False when it could not be written (a warning, once per port, gives the command that does it).
    ``sysfs`` defaults to :data:`SYSFS_USB_SERIAL`.
    """
    tty = Path(os.path.realpath(port_name)).name
    attr = Path(SYSFS_USB_SERIAL if sysfs is None else sysfs) / tty / "latency_timer"
    try:
        if int(attr.read_text().strip()) == ms:
            return True
    except (OSError, ValueError):
        return None
    try:
        attr.write_text(f"{ms}\n")
        return True
    except OSError:
        if tty not in _LATENCY_WARNED:
            _LATENCY_WARNED.add(tty)
            log.warning("ECP5 link: cannot set the FTDI latency timer of %s to %d ms (it adds up to 16 ms per "
                        "reply); run once: echo %d | sudo tee %s", port_name, ms, ms, attr)
        return False


def open_port(port_name: str, baud: int, timeout: float) -> Any:
    """Open a serial port by name with pyserial (8N1, no flow control) and set its FTDI latency timer to 1 ms.

    Raises
    ------
    DeviceError
        pyserial missing, or the port cannot be opened.
    """
    try:
        import serial  # pyserial, imported only for a real port
    except ImportError as exc:
        raise DeviceError("device 'ecp5' needs pyserial: pip install 'mmfree-fpga[ecp5]'") from exc
    try:
        port = serial.Serial(port_name, baud, timeout=timeout)
    except (OSError, serial.SerialException) as exc:
        raise DeviceError(f"device 'ecp5': cannot open {port_name} at {baud} baud: {exc} "
                          f"(is the board plugged in? name its serial port with MMFREE_ECP5_PORT, `mmfree board "
                          f"ACTION --port TTY` or, for generate/selftest/bench/power, `--option port=TTY`; the board "
                          f"with MMFREE_ECP5_BOARD, `mmfree board ACTION --board B` or `--option board=B` (bench "
                          f"and power: `--board B`): "
                          f"{', '.join(f'{k} {BOARDS[k].serial_port}' for k in ECP5_BOARDS)} usually)") from exc
    set_ftdi_latency(port_name)
    return port


# ------------------------------------------------------------------------------------------------ the link
def _flag_names(flags: int, cls: type) -> str:
    try:
        f = cls(flags)
        return "|".join(m.name for m in cls if m in f and m.value) or "0"
    except ValueError:
        return f"0x{flags:x}"


class UartLink:
    """Host side of the UART link protocol (:mod:`hw.boards.link_protocol`).

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
    bytes_out, bytes_in : int
        Bytes written to and read from the port since construction (the wire's bytes; 10 line bits each).

    Raises
    ------
    LinkError
        (from every command) a reply the protocol does not allow, or the port failing (``OSError``, pyserial's
        ``SerialException``: a board unplugged mid-command); :class:`LinkTimeout` when a reply does not come.
    """

    def __init__(self, port: Any, *, timeout: float = 2.0):
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.port = port
        self.timeout = float(timeout)
        self.port.timeout = min(self.timeout, 0.1)
        self.output: deque[tuple[int, bool]] = deque()
        self.bytes_out = 0
        self.bytes_in = 0

    # ---------------------------------------------------------------- bytes
    def _write(self, data: bytes) -> None:
        try:
            self.port.write(data)
        except OSError as exc:      # pyserial's SerialException is an OSError
            raise LinkError(f"ECP5 link: the serial port failed while writing ({exc}); a DRAM load that stopped "
                            f"here restarts where it stopped on the next load") from exc
        self.bytes_out += len(data)

    def _read(self, n: int) -> bytes:
        try:
            got = self.port.read(n)
        except OSError as exc:
            raise LinkError(f"ECP5 link: the serial port failed while reading ({exc})") from exc
        self.bytes_in += len(got)
        return got

    def _read_exact(self, n: int, what: str, timeout: float | None = None) -> bytes:
        buf = b""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while len(buf) < n:
            got = self._read(n - len(buf))
            if got:
                buf += got
            elif time.monotonic() >= deadline:
                baud = getattr(self.port, "baudrate", None)
                rate = f" ({baud:,} baud)" if isinstance(baud, int) else ""
                raise LinkTimeout(f"ECP5 link: no {what} within {wait:g} s ({len(buf)} of {n} bytes): is the "
                                  f"board connected, powered and loaded with the bitstream, is this its UART (on an "
                                  f"ECPIX-5 the FT2232H's second interface, e.g. /dev/ttyUSB1, not the JTAG one), "
                                  f"and is the port's rate{rate} the bitstream's (its report.json 'baud'; "
                                  f"--baud, `--option baud=` or MMFREE_ECP5_BAUD)?")
        return buf

    def _frame(self, want: str, timeout: float | None = None) -> tuple[int, bytes]:
        """The next frame that is not a core output word (those are queued in :attr:`output`)."""
        while True:
            head = self._read_exact(1, want, timeout)[0]
            if head not in lp.REPLY_BYTES:
                raise LinkError(f"ECP5 link: lost framing (byte 0x{head:02x} where a frame starts; a port rate "
                                f"other than the bitstream's looks like this: MMFREE_ECP5_BAUD)")
            body = self._read_exact(lp.REPLY_BYTES[head], f"body of frame {chr(head)!r}", timeout)
            if head == lp.REP_OUTPUT:
                self.output.append((int.from_bytes(body[:4], "little"), bool(body[4] & 1)))
                continue
            return head, body

    def _reply(self, want: int, timeout: float | None = None) -> bytes:
        """The next reply frame, which must be ``want`` (output frames on the way are queued)."""
        head, body = self._frame(f"reply {chr(want)!r}", timeout)
        if head != want:
            if head == lp.REP_UNKNOWN and want in (lp.REP_CTRL_READ, lp.REP_CTRL_WRITE):
                raise LinkError(f"ECP5 link: the board does not know the command of reply {chr(want)!r} (it "
                                f"answered '?'): a bitstream of link version 2 or older has no control bus")
            if head == lp.REP_UNKNOWN:
                raise LinkError(f"ECP5 link: the board does not know the command of reply {chr(want)!r} (it "
                                f"answered '?'): a stream-only bitstream (link version 1) has no board registers, "
                                f"DRAM or token command")
            raise LinkError(f"ECP5 link: reply {chr(head)!r} where {chr(want)!r} was due")
        return body

    def _pipelined(self, commands: Sequence[bytes], want: int, window: int,
                   done: Callable[[int, bytes], None] | None = None, timeout: float | None = None) -> list[bytes]:
        """Send ``commands`` keeping at most ``window`` unanswered; return their ``want`` replies in order
        (``done(i, reply)`` is called as each arrives)."""
        replies: list[bytes] = []

        def take() -> None:
            replies.append(self._reply(want, timeout))
            if done is not None:
                done(len(replies) - 1, replies[-1])

        for i, cmd in enumerate(commands):
            if i - len(replies) == window:
                take()
            self._write(cmd)
        while len(replies) < len(commands):
            take()
        return replies

    # ---------------------------------------------------------------- core registers and stream
    def read(self, addr: int) -> int:
        """One core register read (byte address, 32-bit value)."""
        self._check_addr(addr)
        self._write(bytes([lp.OP_READ, addr]))
        return int.from_bytes(self._reply(lp.REP_READ), "little")

    def read_many(self, addrs: Sequence[int]) -> list[int]:
        """Core register reads sent back to back (one round trip instead of one per register)."""
        for a in addrs:
            self._check_addr(a)
        got = self._pipelined([bytes([lp.OP_READ, a]) for a in addrs], lp.REP_READ, 256)
        return [int.from_bytes(b, "little") for b in got]

    def write(self, addr: int, value: int) -> None:
        """One core register write."""
        self._check_addr(addr)
        self._check_value(value)
        self._write(bytes([lp.OP_WRITE, addr]) + value.to_bytes(4, "little"))
        self._reply(lp.REP_WRITE)

    def reset_core(self) -> None:
        """Reset the core (state, registers, counters; on a DRAM board also the reader, the token builder and
        the argmax tap); the queued output is dropped. Board registers and DRAM keep their contents."""
        self._write(bytes([lp.OP_RESET]))
        self._reply(lp.REP_RESET)
        self.output.clear()

    def stream(self, data: bytes, *, last: bool = True) -> None:
        """Send ``data`` (a multiple of 8 bytes) as beats of the weight stream, ``tlast`` on the final beat
        when ``last``; at most :data:`~hw.boards.link_protocol.WINDOW_CHUNKS` commands are unacknowledged, so
        the board's receive FIFO never overflows.

        Raises
        ------
        ValueError
            On an empty stream or one that is not a whole number of beats.
        LinkTimeout
            When the core stops taking beats for longer than the time-out.
        """
        if not data or len(data) % lp.BEAT_BYTES:
            raise ValueError(f"a stream is a non-empty multiple of {lp.BEAT_BYTES} bytes, got {len(data)}")
        step = lp.CHUNK_BEATS * lp.BEAT_BYTES
        starts = range(0, len(data), step)
        cmds = []
        for i, s in enumerate(starts):
            chunk = data[s:s + step]
            flags = 1 if (last and i == len(starts) - 1) else 0
            cmds.append(bytes([lp.OP_STREAM]) + struct.pack("<HB", len(chunk) // lp.BEAT_BYTES - 1, flags) + chunk)
        self._pipelined(cmds, lp.REP_STREAM, lp.WINDOW_CHUNKS)

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
            got = self._read(1)
            if not got:
                continue
            head = got[0]
            if head != lp.REP_OUTPUT:
                raise LinkError(f"ECP5 link: frame {chr(head)!r} while waiting for output")
            body = self._read_exact(5, "output word")
            self.output.append((int.from_bytes(body[:4], "little"), bool(body[4] & 1)))

    # ---------------------------------------------------------------- board registers (link version 2)
    def probe(self) -> int | None:
        """Read ``BoardReg.MAGIC``; None when the board answers ``'?'`` (a stream-only, link-version-1 board,
        which also answers ``'?'`` to the address byte that follows the unknown opcode)."""
        self._write(bytes([lp.OP_BOARD_READ, BoardReg.MAGIC]))
        head, body = self._frame("reply 'g'")
        if head == lp.REP_UNKNOWN:
            self._reply(lp.REP_UNKNOWN)     # the address byte, 0x00: not an opcode of link version 1 either
            return None
        if head != lp.REP_BOARD_READ:
            raise LinkError(f"ECP5 link: reply {chr(head)!r} where 'g' was due")
        return int.from_bytes(body, "little")

    def board_read(self, addr: int) -> int:
        """One board register read (:class:`~hw.boards.link_protocol.BoardReg`)."""
        self._check_board_addr(addr)
        self._write(bytes([lp.OP_BOARD_READ, addr]))
        return int.from_bytes(self._reply(lp.REP_BOARD_READ), "little")

    def board_read_many(self, addrs: Sequence[int]) -> list[int]:
        """Board register reads sent back to back."""
        for a in addrs:
            self._check_board_addr(a)
        got = self._pipelined([bytes([lp.OP_BOARD_READ, a]) for a in addrs], lp.REP_BOARD_READ, 256)
        return [int.from_bytes(b, "little") for b in got]

    def board_write(self, addr: int, value: int) -> None:
        """One board register write (those of :data:`~hw.boards.link_protocol.WRITABLE` take it)."""
        self._check_board_addr(addr)
        self._check_value(value)
        self._write(bytes([lp.OP_BOARD_WRITE, addr]) + value.to_bytes(4, "little"))
        self._reply(lp.REP_BOARD_WRITE)

    # ---------------------------------------------------------------- DRAM (link version 2)
    def dram_write(self, addr: int, data: bytes, progress: Callable[[int], None] | None = None) -> None:
        """Write ``data`` to DRAM at byte address ``addr`` (both multiples of 8) with ``'L'`` commands of at
        most :data:`~hw.boards.link_protocol.CHUNK_BEATS` beats, :data:`~hw.boards.link_protocol.WINDOW_CHUNKS`
        of them unacknowledged. The board clears ``BoardStatus.IMAGE_VALID``.

        Parameters
        ----------
        progress : callable, optional
            Called with the bytes of each chunk once the board acknowledged it.

        Raises
        ------
        ValueError
            Misaligned or empty.
        DeviceError
            A ``'l'`` status other than 0 (:class:`~hw.boards.link_protocol.DramStatus`, named).
        """
        self._check_dram(addr, len(data))
        if not data:
            raise ValueError("a DRAM write needs at least one beat")
        step = lp.CHUNK_BEATS * lp.BEAT_BYTES
        cmds = [bytes([lp.OP_DRAM_WRITE]) + struct.pack("<IH", addr + s, len(data[s:s + step]) // lp.BEAT_BYTES - 1)
                + data[s:s + step] for s in range(0, len(data), step)]

        def done(i: int, body: bytes) -> None:
            if body[0]:
                raise DeviceError(f"ECP5 board: DRAM write at 0x{addr + i * step:08x} failed: "
                                  f"{_flag_names(body[0], DramStatus)}{_dram_hint(body[0])}")
            if progress is not None:
                progress(len(cmds[i]) - 1 - lp.COMMAND_BYTES[lp.OP_DRAM_WRITE])

        self._pipelined(cmds, lp.REP_DRAM_WRITE, lp.WINDOW_CHUNKS, done)

    def dram_crcs(self, ranges: Sequence[tuple[int, int]]) -> list[int]:
        """``zlib.crc32`` of each DRAM range ``(addr, nbytes)`` as the board computes it (``'C'``), at most
        :data:`CRC_WINDOW` commands unanswered.

        Raises
        ------
        DeviceError
            A ``'c'`` status other than 0.
        """
        for a, n in ranges:
            self._check_dram(a, n)
        # the board reads DRAM for each range: allow it 10 MB/s at least beyond the link's time-out
        wait = self.timeout + max((n for _, n in ranges), default=0) / 10e6
        cmds = [bytes([lp.OP_DRAM_CRC]) + struct.pack("<II", a, n) for a, n in ranges]
        got = self._pipelined(cmds, lp.REP_DRAM_CRC, CRC_WINDOW, timeout=wait)
        return [self._crc_reply(body, rng) for body, rng in zip(got, ranges, strict=True)]

    def dram_crc(self, addr: int, nbytes: int) -> int:
        """``zlib.crc32`` of DRAM ``[addr, addr + nbytes)`` as the board computes it."""
        return self.dram_crcs([(addr, nbytes)])[0]

    @staticmethod
    def _crc_reply(body: bytes, rng: tuple[int, int]) -> int:
        if body[4]:
            raise DeviceError(f"ECP5 board: DRAM CRC of 0x{rng[0]:08x}+{rng[1]} failed: "
                              f"{_flag_names(body[4], DramStatus)}{_dram_hint(body[4])}")
        return int.from_bytes(body[:4], "little")

    def token(self, token_id: int, position: int, *, logits: bool, timeout: float | None = None) -> TokenStatus:
        """Send ``'T'`` (run one token from DRAM) and wait for its ``'t'`` status (output frames that arrive
        before it are queued in :attr:`output`; the rest follow: :meth:`read_output`)."""
        if not 0 <= token_id < 1 << 32:
            raise ValueError(f"token id must fit 32 bits, got {token_id}")
        flags = TokenFlags.LOGITS if logits else TokenFlags(0)
        self._write(bytes([lp.OP_TOKEN]) + struct.pack("<IIB", token_id, position & 0xFFFFFFFF, int(flags)))
        return TokenStatus(self._reply(lp.REP_TOKEN, timeout)[0])

    # ---------------------------------------------------------------- the DRAM controller's control bus (version 3)
    def ctrl_read(self, addr: int) -> int:
        """One 32-bit word of the DRAM controller's control bus (``'K'``; byte address, a multiple of 4 below
        :data:`~hw.boards.link_protocol.CTRL_BYTES`).

        Raises
        ------
        ValueError
            A misaligned or out-of-range address (nothing sent).
        DeviceError
            A ``'k'`` status other than 0 (:class:`~hw.boards.link_protocol.CtrlStatus`, named).

        Only for a board of link version 3 (:attr:`Ecp5Transport.has_ctrl` checks): an older one answers ``'?'``
        and then takes the address bytes as commands of their own.
        """
        self._check_ctrl_addr(addr)
        self._write(struct.pack("<BI", lp.OP_CTRL_READ, addr))
        body = self._reply(lp.REP_CTRL_READ)
        _check_ctrl_status(body[0], "read", addr)
        return int.from_bytes(body[1:5], "little")

    def ctrl_write(self, addr: int, value: int) -> None:
        """Write one 32-bit word of the DRAM controller's control bus (``'J'``) and wait for its ``'j'``.

        Raises
        ------
        ValueError, DeviceError
            As :meth:`ctrl_read`.
        """
        self._send_ctrl_write(addr, value)
        _check_ctrl_status(self._reply(lp.REP_CTRL_WRITE)[0], "write", addr)

    def _send_ctrl_write(self, addr: int, value: int) -> None:
        self._check_ctrl_addr(addr)
        self._check_value(value)
        self._write(struct.pack("<BII", lp.OP_CTRL_WRITE, addr, value))

    # ---------------------------------------------------------------- housekeeping
    def resync(self, quiet: float = 0.5) -> None:
        """After a time-out: wait past the board's byte time-out (2^24 cycles: about 0.34 s at 50 MHz), drop what
        arrived."""
        time.sleep(quiet)
        try:
            self.port.reset_input_buffer()
        except OSError as exc:
            raise LinkError(f"ECP5 link: the serial port failed ({exc})") from exc
        self.output.clear()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.port.close()

    @staticmethod
    def _check_addr(addr: int) -> None:
        if not 0 <= addr < _R.SIZE or addr % 4:
            raise ValueError(f"register address must be a word in 0..0x{_R.SIZE - 4:x}, got {addr!r}")

    @staticmethod
    def _check_ctrl_addr(addr: int) -> None:
        if not isinstance(addr, int) or not 0 <= addr < lp.CTRL_BYTES or addr % 4:
            raise ValueError(f"control-bus address must be a word in 0..0x{lp.CTRL_BYTES - 4:x}, got {addr!r}")

    @staticmethod
    def _check_board_addr(addr: int) -> None:
        if not 0 <= addr < 256 or addr % 4:
            raise ValueError(f"board register address must be a word in 0..0xfc, got {addr!r}")

    @staticmethod
    def _check_value(value: int) -> None:
        if not 0 <= value < 1 << 32:
            raise ValueError(f"register value must fit 32 bits, got {value}")

    @staticmethod
    def _check_dram(addr: int, nbytes: int) -> None:
        if addr < 0 or nbytes < 0 or addr % lp.BEAT_BYTES or nbytes % lp.BEAT_BYTES or addr + nbytes > 1 << 32:
            raise ValueError(f"DRAM address and length must be multiples of {lp.BEAT_BYTES} within 4 GiB, got "
                             f"0x{addr:x}+{nbytes}")


def _dram_hint(status: int) -> str:
    s = DramStatus(status)
    if DramStatus.NOT_READY in s:
        return (" (the DRAM is not initialised, or the board holds its port until read leveling has run: "
                "`mmfree board status`, `mmfree board level`)")
    if DramStatus.TIMEOUT in s or DramStatus.WRITER_ERROR in s:
        return " (the controller did not complete an access; `mmfree board memtest` checks the DRAM)"
    return ""


def _check_ctrl_status(status: int, what: str, addr: int) -> None:
    """Raise DeviceError naming a control-bus access's failure (:class:`~hw.boards.link_protocol.CtrlStatus`)."""
    if not status:
        return
    s = CtrlStatus(status)
    hint = ""
    if CtrlStatus.BUSY in s:
        hint = " (the DRAM's power-up sequence still owns the bus: wait for BoardStatus.DRAM_READY)"
    elif CtrlStatus.TIMEOUT in s:
        hint = (" (the DRAM controller did not acknowledge within the board's time-out: a bitstream whose control "
                "bus is not connected to the controller answers so)")
    raise DeviceError(f"ECP5 board: control-bus {what} at 0x{addr:04x} failed: {_flag_names(status, CtrlStatus)}{hint}")


class ControlBus:
    """The DRAM controller's control bus (LiteDRAM ``wb_ctrl``) over a :class:`UartLink`, as the word accesses
    :class:`host.leveling.CSRBus` takes: :meth:`read_word` waits for its ``'k'``; :meth:`write_word` is posted
    (at most :data:`CTRL_WINDOW` ``'J'`` commands unanswered, checked in order before the next read and by
    :meth:`flush`), so a write costs the wire time of its 9 bytes and not a round trip. The board runs commands
    in order, so a read sees every write before it.

    Use it alone on its link until :meth:`flush` (a context manager: ``with ControlBus(link) as bus``), and
    flush before any other command.

    Attributes
    ----------
    reads, writes : int
        Accesses so far.

    Raises
    ------
    DeviceError
        (from :meth:`read_word`, :meth:`write_word` or :meth:`flush`) an access the board refused or that timed
        out, named with its address; ValueError for an address or value the protocol cannot carry.
    """

    def __init__(self, link: UartLink, *, window: int = CTRL_WINDOW):
        if not 1 <= window <= 256:
            raise ValueError(f"window must be 1..256 commands, got {window}")
        self.link, self.window = link, window
        self._posted: deque[int] = deque()
        self.reads = 0
        self.writes = 0

    def _take(self) -> None:
        addr = self._posted.popleft()
        try:
            status = self.link._reply(lp.REP_CTRL_WRITE)[0]
        except LinkError:       # the link is gone: the other replies will not come either
            self._posted.clear()
            raise
        _check_ctrl_status(status, "write", addr)

    def flush(self) -> None:
        """Wait for every posted write's ``'j'``; raise the first failure once all are in."""
        first: DeviceError | None = None
        while self._posted:
            try:
                self._take()
            except LinkError:
                raise
            except DeviceError as exc:
                first = first or exc
        if first is not None:
            raise first

    def read_word(self, addr: int) -> int:
        self.flush()
        self.reads += 1
        return self.link.ctrl_read(addr)

    def write_word(self, addr: int, value: int) -> None:
        if len(self._posted) >= self.window:
            self._take()
        self.link._send_ctrl_write(addr, value)
        self._posted.append(addr)
        self.writes += 1

    def __enter__(self) -> ControlBus:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.flush()
            return
        with contextlib.suppress(DeviceError):    # the error on its way out is the one to report
            self.flush()


# ------------------------------------------------------------------------------------------------ DRAM layout
@dataclass(frozen=True)
class DramLayout:
    """Where a bundle lives in a DRAM board's memory (byte addresses; the board registers of the same names).

    ``image_base`` is 0; the embedding table (``vocab`` rows of ``hidden`` little-endian int32 words, row-major,
    the residual format) starts at ``embed_base``, the first multiple of :data:`TABLE_ALIGN` after the image;
    ``total_bytes`` (a multiple of 8) ends the table. ``checksum`` is the bundle's identifier: ``zlib.crc32``
    of the whole region ``[0, total_bytes)`` as laid out (zero gap included), so it is also what the board's
    ``'C'`` returns for that region when it holds the bundle (:func:`dram_contents`).
    """

    image_base: int
    image_bytes: int
    embed_base: int
    hidden: int
    vocab: int
    total_bytes: int
    checksum: int

    def registers(self) -> dict[BoardReg, int]:
        """The board registers that describe this layout, in the order the host writes them."""
        return {BoardReg.IMAGE_BASE: self.image_base, BoardReg.IMAGE_BYTES: self.image_bytes,
                BoardReg.EMBED_BASE: self.embed_base, BoardReg.EMBED_HIDDEN: self.hidden,
                BoardReg.EMBED_VOCAB: self.vocab, BoardReg.IMAGE_CHECKSUM: self.checksum}


def dram_contents(image: bytes, table: np.ndarray) -> tuple[DramLayout, bytes]:
    """The DRAM contents of a bundle and their layout.

    Parameters
    ----------
    image : bytes
        The model image (a multiple of 8 bytes: images are whole 64-byte sections).
    table : ndarray, shape [V, H], int32
        The embedding rows in the residual format (a bundle's ``embeddings``).

    Returns
    -------
    (DramLayout, bytes)
        The layout and the ``total_bytes`` bytes to place at address 0.

    Raises
    ------
    ValueError
        An image that is not whole beats, or a table that is not 2-D int32.
    """
    if len(image) % lp.BEAT_BYTES or not image:
        raise ValueError(f"the image must be a non-empty multiple of {lp.BEAT_BYTES} bytes, got {len(image)}")
    t = np.asarray(table)
    if t.ndim != 2 or t.dtype != np.int32:
        raise ValueError(f"the embedding table must be int32 [vocab, hidden], got {t.dtype} {t.shape}")
    rows = np.ascontiguousarray(t, dtype="<i4").tobytes()
    base = -(-len(image) // TABLE_ALIGN) * TABLE_ALIGN
    total = base + len(rows)
    total += -total % lp.BEAT_BYTES
    data = bytearray(total)
    data[:len(image)] = image
    data[base:base + len(rows)] = rows
    data = bytes(data)
    return DramLayout(0, len(image), base, int(t.shape[1]), int(t.shape[0]), total, zlib.crc32(data)), data


def bundle_checksum(image: bytes, table: np.ndarray) -> int:
    """The identifier of a bundle on a DRAM board (``BoardReg.IMAGE_CHECKSUM``): :attr:`DramLayout.checksum`."""
    return dram_contents(image, table)[0].checksum


@dataclass
class LoadReport:
    """What one :meth:`Ecp5Transport.load_model` did.

    Attributes
    ----------
    skipped : bool
        The board already held the bundle (``IMAGE_VALID``, ``IMAGE_CHECKSUM`` and the layout registers name
        it, and the board's CRC of the region matches): nothing was written.
    layout : DramLayout
    blocks_total, blocks_written : int
        :data:`DRAM_BLOCK_BYTES` blocks of the region, and those written (their CRC differed, or ``force``).
    bytes_written : int
    seconds : float
        Wall time of the whole load (CRCs, writes, verification, registers).
    """

    skipped: bool
    layout: DramLayout
    blocks_total: int
    blocks_written: int = 0
    bytes_written: int = 0
    seconds: float = 0.0

    @property
    def write_rate(self) -> float:
        """Bytes written per second of the load (NaN when nothing was written)."""
        return self.bytes_written / self.seconds if self.bytes_written and self.seconds > 0 else float("nan")


@dataclass
class MemtestReport:
    """What :meth:`Ecp5Transport.memtest` found.

    Attributes
    ----------
    nbytes, blocks : int
        Bytes of pseudo-random data written from address 0, in blocks of :data:`DRAM_BLOCK_BYTES`.
    write_seconds, check_seconds : float
        Wall time of the writes (each block checked with ``'C'`` right after it) and of the second pass that
        checks every block again once all are written (finding address lines that alias).
    bad_blocks : list of int
        Addresses of blocks whose CRC did not match, in either pass.
    """

    nbytes: int
    blocks: int
    write_seconds: float
    check_seconds: float
    bad_blocks: list[int] = field(default_factory=list)

    @property
    def write_mb_s(self) -> float:
        return self.nbytes / self.write_seconds / 1e6 if self.write_seconds > 0 else float("nan")

    @property
    def check_mb_s(self) -> float:
        return self.nbytes / self.check_seconds / 1e6 if self.check_seconds > 0 else float("nan")


@contextlib.contextmanager
def _progress(total: int, what: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A transient rich progress bar on stderr (bytes and rate); yields ``advance(nbytes)``."""
    if not enabled or total <= 0:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    with Progress(TextColumn(what), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                  transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


def _stderr_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


# ------------------------------------------------------------------------------------------------ transport
class Ecp5Transport:
    """The board's UART link (:class:`UartLink`) as a :class:`~host.devices.driver.Transport`.

    On connect it tells the two kinds of bitstream apart (:attr:`mode`): ``"dram"`` (``'G'`` answers
    :data:`~hw.boards.link_protocol.BOARD_MAGIC` and a link version of
    :data:`~hw.boards.link_protocol.DRAM_LINK_VERSIONS`: the DRAM is checked ready) runs tokens by
    id (:attr:`runs_token_ids`: :meth:`stage_model` loads the bundle once, :meth:`run_token` sends ``'T'``);
    ``"stream"`` (a link-version-1 board answering ``'?'``) streams the token packet and the whole image through
    ``'S'`` every token (:meth:`run`). Registers go through ``'R'``/``'W'``, the core reset through ``'X'``.

    Parameters
    ----------
    port_name, baud, timeout, serial
        As :class:`Ecp5Device`.
    reload : bool
        Write every block of the bundle on :meth:`stage_model` even when the board holds it.
    progress : bool or None
        A progress bar for DRAM loads (None: when stderr is a terminal).

    Attributes
    ----------
    board : dict of BoardReg to int
        The board's read-only registers as read on connect (DRAM mode; empty in stream mode).
    link_version : int or None
        ``BoardReg.LINK_VERSION`` of a DRAM board (2 or 3; None in stream mode).
    last_load : LoadReport or None
    last_leveling : host.leveling.LevelingResult or None
    stats : dict of str to int
        ``dram_loads`` (loads that wrote), ``dram_loads_skipped`` (loads found already on the board),
        ``dram_blocks_written``, ``dram_bytes_written``.
    """

    extra_counters = ("link_bytes", "link_ns")

    def __init__(self, port_name: str, baud: int, timeout: float, serial: Any = None, *, reload: bool = False,
                 progress: bool | None = None) -> None:
        self.port_name, self.baud, self.timeout = port_name, baud, timeout
        self._serial = serial
        self.reload = bool(reload)
        self.progress = progress
        self.link: UartLink | None = None
        self.mode: str | None = None
        self.board: dict[BoardReg, int] = {}
        self.link_version: int | None = None
        self.last_leveling = None
        self.stream: bytes = b""
        self.layout: DramLayout | None = None
        self.last_load: LoadReport | None = None
        #: bytes at the top of the DRAM kept for the recurrent state (hw.state_cache.StateGeometry of the core's
        #: capacities, from its ID block): a core built with the state in DRAM keeps its two banks there
        self.state_reserve = 0
        self.stats = {"dram_loads": 0, "dram_loads_skipped": 0, "dram_blocks_written": 0, "dram_bytes_written": 0,
                      "ctrl_reads": 0, "ctrl_writes": 0}

    @property
    def runs_token_ids(self) -> bool:
        """Whether tokens go by id (``'T'``): a DRAM board."""
        return self.mode == "dram"

    # ---------------------------------------------------------------- open
    def connect(self, info: ImageInfo | None) -> None:
        """Open the port (once), resynchronise the link, tell the board's kind, reset the core.

        Raises
        ------
        LinkTimeout
            No board answering (the message says what to check).
        DeviceError
            A DRAM board of another link version, or whose DRAM failed to initialise or is not ready.
        """
        if self.link is not None:
            return
        port = self._serial if self._serial is not None else open_port(self.port_name, self.baud, self.timeout)
        self.link = UartLink(port, timeout=self.timeout)
        try:
            self.link.resync(0.0)
            try:
                magic = self.link.probe()
            except LinkError:       # a command of a host that gave up is still open on the board: time it out
                self.link.resync()
                magic = self.link.probe()
            self._detect(magic)
            self.link.reset_core()
        except DeviceError:
            self.close()
            raise

    def _detect(self, magic: int | None) -> None:
        if magic is None:
            self.mode = "stream"
            log.info("ECP5 board on %s: stream-only link (version 1): the image is streamed every token",
                     self.port_name)
            return
        if magic != lp.BOARD_MAGIC:
            raise LinkError(f"device 'ecp5': board magic 0x{magic:08x}, expected 0x{lp.BOARD_MAGIC:08x} ('MMDB'): "
                            f"not an mmfree DRAM board, or a port rate other than the bitstream's")
        version = self.link.board_read(BoardReg.LINK_VERSION)
        if version not in lp.DRAM_LINK_VERSIONS:
            raise DeviceError(f"device 'ecp5': the board speaks link protocol version {version}, this host versions "
                              f"{' and '.join(map(str, lp.DRAM_LINK_VERSIONS))}: use the host of the bitstream's "
                              f"revision, or flash the bitstream of this one")
        self.mode, self.link_version = "dram", version
        deadline = time.monotonic() + self.timeout
        while True:
            regs = self.read_board()
            status = BoardStatus(regs[BoardReg.STATUS] & 0xFF)
            if BoardStatus.DRAM_INIT_ERROR in status:
                raise DeviceError("device 'ecp5': the board's DRAM failed to initialise (BoardStatus.DRAM_INIT_ERROR):"
                                  " reconfigure the board (openFPGALoader --board ulx3s <bitstream>) and, if it "
                                  "persists, check the SDRAM")
            if BoardStatus.DRAM_READY in status:
                break
            if time.monotonic() >= deadline:
                raise DeviceError(f"device 'ecp5': the board's DRAM is not ready after {self.timeout:g} s "
                                  f"(BoardStatus.DRAM_READY clear)")
            time.sleep(0.01)
        self.board = {r: regs[r] for r in (BoardReg.MAGIC, BoardReg.LINK_VERSION, BoardReg.DRAM_BYTES,
                                           BoardReg.CLOCK_HZ)}

    def read_board(self) -> dict[BoardReg, int]:
        """Every board register of the board's link version (DRAM mode; version 2 has no ``PORT_ENABLE``), in
        one round trip."""
        self.require_dram("read board registers")
        regs = [r for r in BoardReg if r != BoardReg.PORT_ENABLE or self.has_ctrl]
        return dict(zip(regs, self.link.board_read_many([int(r) for r in regs]), strict=True))

    @property
    def has_ctrl(self) -> bool:
        """Whether the board has the DRAM controller's control bus and the port enable (link version 3)."""
        return self.mode == "dram" and self.link_version is not None and self.link_version >= lp.CTRL_LINK_VERSION

    def port_enabled(self) -> bool:
        """Whether the board's DRAM port is enabled (always on a version-2 board, whose port is never held)."""
        self.require_dram("read the DRAM port's state")
        if not self.has_ctrl:
            return True
        return bool(self.link.board_read(BoardReg.STATUS) & BoardStatus.PORT_ENABLED)

    def require_port(self, what: str) -> None:
        """Raise DeviceError (saying that ``what`` needs it) unless a DRAM board with its port enabled is
        connected."""
        self.require_dram(what)
        if not self.port_enabled():
            raise DeviceError(f"device 'ecp5': cannot {what}: the board holds its DRAM port until read leveling has "
                              f"run (BoardStatus.PORT_HELD: a DDR3 board after configuration, or after a failed "
                              f"leveling): run `mmfree board level --csr CSR.json` first")

    def require_ctrl(self, what: str) -> None:
        """Raise DeviceError (saying that ``what`` needs it) unless the board has the control bus (version 3)."""
        self.require_dram(what)
        if not self.has_ctrl:
            raise DeviceError(f"device 'ecp5': {what} needs a bitstream of link version {lp.CTRL_LINK_VERSION} or "
                              f"later (the DRAM controller's control bus, 'K'/'J'); the board speaks version "
                              f"{self.link_version} (e.g. the committed ULX3S bitstream, whose SDRAM needs no "
                              f"leveling: its port is always enabled)")

    def ctrl_read(self, addr: int) -> int:
        """A 32-bit word of the DRAM controller's control bus (:meth:`UartLink.ctrl_read`; version 3)."""
        self.require_ctrl("control-bus access")
        return self.link.ctrl_read(addr)

    def ctrl_write(self, addr: int, value: int) -> None:
        """Write a 32-bit word of the DRAM controller's control bus (:meth:`UartLink.ctrl_write`; version 3)."""
        self.require_ctrl("control-bus access")
        self.link.ctrl_write(addr, value)

    def level(self, csr: Any, params: Any = None, *, wait: Callable[[int], None] | None = None):
        """Read leveling of the board's DDR3 PHY over the control bus (:func:`host.leveling.read_leveling`;
        **not run on hardware**), then the DRAM port enabled.

        The port is held (``PORT_ENABLE`` 0) and ``IMAGE_VALID`` cleared first: the procedure's test bursts
        overwrite the DRAM's first :data:`host.leveling.CLOBBERED_BYTES` bytes, so the next load rewrites that
        block. The port is enabled only when every lane found its window and passed its check.

        Parameters
        ----------
        csr : mapping
            The bitstream's LiteDRAM CSR map (:func:`host.leveling.load_csr_map`).
        params : host.leveling.LevelingParams, optional
            The PHY (default :data:`host.leveling.ECPIX5_PARAMS`).
        wait : callable, optional
            As :func:`host.leveling.read_leveling`.

        Returns
        -------
        host.leveling.LevelingResult

        Raises
        ------
        DeviceError
            A version-2 board; a CSR map without the PHY's leveling registers; the DRAM not initialised or failed;
            a control-bus access refused or timed out; the port not enabled after the write.
        host.leveling.LevelingError
            A lane without a working setting (named); the port stays held.
        """
        from host.leveling import ECPIX5_PARAMS, CSRBus, read_leveling, required_csrs

        params = ECPIX5_PARAMS if params is None else params
        self.require_ctrl("read leveling")
        missing = sorted(set(required_csrs(params)) - set(csr))
        if missing:
            raise DeviceError(f"device 'ecp5': the CSR map has no {', '.join(missing[:3])}"
                              f"{' ...' if len(missing) > 3 else ''}: not the map of a core whose PHY does read "
                              f"leveling (the ECPIX-5's ECP5DDRPHY); give the csr.json of the bitstream's core")
        status = BoardStatus(self.link.board_read(BoardReg.STATUS) & 0xFF)
        if BoardStatus.DRAM_INIT_ERROR in status:
            raise DeviceError("device 'ecp5': the board's DRAM failed to initialise (BoardStatus.DRAM_INIT_ERROR): "
                              "reconfigure the board")
        if BoardStatus.DRAM_READY not in status:
            raise DeviceError("device 'ecp5': the board's DRAM power-up sequence has not run (BoardStatus.DRAM_READY "
                              "clear)")
        link = self.link
        link.board_write(BoardReg.PORT_ENABLE, 0)
        link.board_write(BoardReg.STATUS, 0)        # the test bursts overwrite DRAM address 0: IMAGE_VALID clear
        self.layout = None
        with ControlBus(link) as bus:
            result = read_leveling(CSRBus(csr, bus.read_word, bus.write_word), params, wait=wait)
        self.stats["ctrl_reads"] += bus.reads
        self.stats["ctrl_writes"] += bus.writes
        link.board_write(BoardReg.PORT_ENABLE, 1)
        if not self.port_enabled():
            raise DeviceError("device 'ecp5': the board did not enable its DRAM port after leveling "
                              "(BoardStatus.PORT_ENABLED clear)")
        self.last_leveling = result
        log.info("ECP5 board on %s: read leveling done (%d control-bus reads, %d writes); DRAM port enabled",
                 self.port_name, bus.reads, bus.writes)
        return result

    def check_ident(self, ident: IdBlock) -> None:
        """The link drives one 64-bit channel. Also keeps the top of the DRAM for the recurrent state
        (:attr:`state_reserve`: the ID block does not say whether the core keeps it there, and the region is
        small: 32 KiB at the shipped model's capacities, 256 KiB at the 370M shape's)."""
        if ident.channels != 1 or ident.bus_bits != lp.BEAT_BYTES * 8:
            self.close()
            raise DeviceError(f"device 'ecp5': the link drives one 64-bit channel; the board reports "
                              f"{ident.channels} channel(s) of {ident.bus_bits} bits")
        self.state_reserve = StateGeometry(max_hidden=ident.max_hidden, max_layers=ident.max_layers).region_bytes

    def read(self, offset: int) -> int:
        return self.link.read(offset)

    def read_many(self, offsets: Sequence[int]) -> list[int]:
        return self.link.read_many(offsets)

    def write(self, offset: int, value: int) -> None:
        self.link.write(offset, value)

    def reset(self) -> None:
        self.link.reset_core()

    # ---------------------------------------------------------------- load
    def stage(self, streams, out_bytes: int) -> None:
        """Stream mode: keep the image's one channel stream for :meth:`run`."""
        (self.stream,) = streams

    def stage_model(self, image: ParsedImage, table: np.ndarray, out_bytes: int) -> None:
        """DRAM mode: make the board hold the image and the embedding table (:meth:`load_model`)."""
        self.stream = bytes(image.raw)
        self.load_model(self.stream, table, force=self.reload)

    def load_model(self, image: bytes, table: np.ndarray, *, force: bool = False,
                   progress: bool | None = None) -> LoadReport:
        """Load once: make the board's DRAM hold ``image`` and ``table`` (:func:`dram_contents`) and its registers
        describe them.

        Skipped (nothing written) when ``STATUS.IMAGE_VALID`` is set, ``IMAGE_CHECKSUM`` and the layout registers
        name this bundle and the board's ``'C'`` of the region equals the identifier. Otherwise: ``IMAGE_VALID``
        cleared, each :data:`DRAM_BLOCK_BYTES` block's CRC compared with the board's and only differing blocks
        written (all with ``force``), the region's CRC verified, then the registers written in
        :mod:`hw.boards.link_protocol`'s order, ``STATUS.IMAGE_VALID`` last.

        Raises
        ------
        DeviceError
            A stream-only board, a bundle larger than the board's DRAM, a DRAM error, or a CRC that still
            differs after the writes; :class:`LinkError` when the link drops (run the load again: it restarts
            where it stopped).
        """
        self.require_port("load a bundle into DRAM")
        link = self.link
        t0 = time.monotonic()
        layout, data = dram_contents(image, table)
        dram = self.board[BoardReg.DRAM_BYTES]
        if layout.total_bytes > dram - self.state_reserve:
            raise DeviceError(f"device 'ecp5': the bundle needs {layout.total_bytes:,} bytes of DRAM (image "
                              f"{layout.image_bytes:,} at 0, embedding table {layout.vocab} x {layout.hidden} int32 "
                              f"at 0x{layout.embed_base:x}), the board has {dram:,} less {self.state_reserve:,} "
                              "kept for the recurrent state")
        blocks = [(a, min(DRAM_BLOCK_BYTES, layout.total_bytes - a))
                  for a in range(0, layout.total_bytes, DRAM_BLOCK_BYTES)]
        report = LoadReport(skipped=False, layout=layout, blocks_total=len(blocks))
        if not force and self.holds(layout):
            if link.dram_crc(0, layout.total_bytes) == layout.checksum:
                report.skipped, report.seconds = True, time.monotonic() - t0
                self.layout, self.last_load = layout, report
                self.stats["dram_loads_skipped"] += 1
                log.info("ECP5 board on %s already holds the bundle 0x%08x (%d bytes, CRC verified): load skipped",
                         self.port_name, layout.checksum, layout.total_bytes)
                return report
            log.warning("ECP5 board on %s: its DRAM no longer matches the bundle 0x%08x it names: rewriting the "
                        "blocks that differ", self.port_name, layout.checksum)
        self.layout = None
        link.board_write(BoardReg.STATUS, 0)     # IMAGE_VALID clear while the contents change
        if force:
            todo = blocks
        else:
            want = [zlib.crc32(data[a:a + n]) for a, n in blocks]
            todo = [b for b, w, c in zip(blocks, want, link.dram_crcs(blocks), strict=True) if w != c]
        want_bar = progress if progress is not None else self.progress
        show = _stderr_tty() if want_bar is None else bool(want_bar)
        with _progress(layout.total_bytes, f"loading {layout.total_bytes / 1e6:.1f} MB into DRAM", show) as advance:
            advance(layout.total_bytes - sum(n for _, n in todo))
            for a, n in todo:
                link.dram_write(a, data[a:a + n], advance)
                report.blocks_written += 1
                report.bytes_written += n
                self.stats["dram_blocks_written"] += 1
                self.stats["dram_bytes_written"] += n
        crc = link.dram_crc(0, layout.total_bytes)
        if crc != layout.checksum:
            raise DeviceError(f"device 'ecp5': after the load the board's DRAM CRC is 0x{crc:08x}, the bundle's "
                              f"0x{layout.checksum:08x}: the DRAM does not keep what was written (`mmfree board "
                              f"memtest`)")
        for reg, value in layout.registers().items():
            link.board_write(reg, value)
        link.board_write(BoardReg.STATUS, int(BoardStatus.IMAGE_VALID))
        status = BoardStatus(link.board_read(BoardReg.STATUS) & 0xFF)
        if BoardStatus.IMAGE_VALID not in status:
            raise DeviceError(f"device 'ecp5': the board did not keep STATUS.IMAGE_VALID (STATUS "
                              f"{_flag_names(int(status), BoardStatus)})")
        report.seconds = time.monotonic() - t0
        self.layout, self.last_load = layout, report
        self.stats["dram_loads"] += 1
        log.info("ECP5 board on %s: loaded the bundle 0x%08x: %d of %d blocks written (%d bytes) in %.1f s",
                 self.port_name, layout.checksum, report.blocks_written, report.blocks_total,
                 report.bytes_written, report.seconds)
        return report

    def holds(self, layout: DramLayout) -> bool:
        """Whether the board's registers say it holds ``layout`` (``IMAGE_VALID`` and every layout register)."""
        regs = self.read_board()
        return bool(regs[BoardReg.STATUS] & BoardStatus.IMAGE_VALID) and all(
            regs[r] == v for r, v in layout.registers().items())

    def memtest(self, nbytes: int, *, seed: int = 0, progress: bool | None = None) -> MemtestReport:
        """Write ``nbytes`` of pseudo-random data (``numpy.random.default_rng(seed)``) from address 0 block by
        block with ``'L'``, check each block with ``'C'`` right after it, then all of them again.

        The image the board held is overwritten and ``IMAGE_VALID`` cleared (the next load rewrites the blocks
        that differ).

        Raises
        ------
        ValueError
            ``nbytes`` not a positive multiple of 8 or beyond the DRAM.
        """
        self.require_port("test the DRAM")
        dram = self.board[BoardReg.DRAM_BYTES]
        if nbytes <= 0 or nbytes % lp.BEAT_BYTES or nbytes > dram:
            raise ValueError(f"memtest bytes must be a positive multiple of {lp.BEAT_BYTES} up to the board's "
                             f"{dram:,}, got {nbytes}")
        link = self.link
        self.layout = None
        data = np.random.default_rng(seed).bytes(nbytes)
        blocks = [(a, min(DRAM_BLOCK_BYTES, nbytes - a)) for a in range(0, nbytes, DRAM_BLOCK_BYTES)]
        want = [zlib.crc32(data[a:a + n]) for a, n in blocks]
        bad: list[int] = []
        show = _stderr_tty() if progress is None else bool(progress)
        t0 = time.monotonic()
        with _progress(nbytes, "memtest", show) as advance:
            for (a, n), w in zip(blocks, want, strict=True):
                link.dram_write(a, data[a:a + n], advance)
                if link.dram_crc(a, n) != w:
                    bad.append(a)
        t1 = time.monotonic()
        for (a, _), w, c in zip(blocks, want, link.dram_crcs(blocks), strict=True):
            if c != w and a not in bad:
                bad.append(a)
        t2 = time.monotonic()
        return MemtestReport(nbytes, len(blocks), t1 - t0, t2 - t1, sorted(bad))

    # ---------------------------------------------------------------- tokens
    def _wait(self, deadline: float | None) -> float:
        if deadline is None:
            return 10 * self.timeout
        return max(deadline - time.monotonic(), 1e-3)

    def run(self, packet: bytes, deadline: float | None, poll) -> Delivery:
        """The token packet and the image through ``'S'``, then the core's STATUS, then its output packet (a DRAM
        board takes ``'S'`` too: the host keeps the image for packets it makes itself)."""
        link = self.link
        t0, b0 = time.perf_counter_ns(), link.bytes_in + link.bytes_out
        link.stream(packet, last=True)
        link.stream(self.stream, last=True)
        poll()
        out = link.read_output(self._wait(deadline))
        return Delivery(out, None, {"link_bytes": link.bytes_in + link.bytes_out - b0,
                                    "link_ns": time.perf_counter_ns() - t0})

    def run_token(self, token_id: int, position: int, logits: bool, deadline: float | None,
                  poll: Callable[[], None]) -> Delivery:
        """DRAM mode: ``'T'`` with the token id and position; the ``'t'`` status, then the output packet (with
        ``logits``) or the argmax summary (:data:`~hw.boards.link_protocol.ARGMAX_SUMMARY_WORDS` words).

        Raises
        ------
        DeviceError
            The board refused the token (no image, a token id beyond the table, a bad hidden size): named.
        CoreError
            (through ``poll``) ``TokenStatus.CORE_ERROR``.
        DeviceTimeout
            ``TokenStatus.READ_TIMEOUT`` or no reply in time.
        """
        link = self.link
        t0, b0 = time.perf_counter_ns(), link.bytes_in + link.bytes_out
        link.output.clear()
        status = link.token(token_id, position, logits=logits, timeout=self._wait(deadline))
        if status:
            self._refused(status, token_id, poll)
        out = link.read_output(self._wait(deadline))
        return Delivery(out, None, {"link_bytes": link.bytes_in + link.bytes_out - b0,
                                    "link_ns": time.perf_counter_ns() - t0})

    def _refused(self, status: TokenStatus, token_id: int, poll: Callable[[], None]) -> None:
        if TokenStatus.NOT_READY in status:
            raise DeviceError("device 'ecp5': the board refused the token: its DRAM port is held until read leveling "
                              "has run (TokenStatus.NOT_READY): `mmfree board level --csr CSR.json`, then load the "
                              "model again")
        if TokenStatus.NO_IMAGE in status:
            raise DeviceError("device 'ecp5': the board holds no verified image (BoardStatus.IMAGE_VALID is clear: "
                              "nothing was loaded since configuration, or DRAM was written since, e.g. by `mmfree "
                              "board memtest`): load the model again (`mmfree board load --image m.mmf`)")
        if TokenStatus.BAD_TOKEN in status:
            raise DeviceError(f"device 'ecp5': the board refused token id {token_id}: beyond its embedding table "
                              f"(BoardReg.EMBED_VOCAB); load the model again")
        if TokenStatus.BAD_HIDDEN in status:
            raise DeviceError("device 'ecp5': the board refused the token: its EMBED_HIDDEN is 0 or above the "
                              "core's max_hidden; load the model again")
        if TokenStatus.CORE_ERROR in status:
            poll()          # raises the core's CoreError (cause and instruction)
            raise LinkError("device 'ecp5': the board reported TokenStatus.CORE_ERROR but the core's STATUS shows "
                            "no error")
        if TokenStatus.READ_TIMEOUT in status:
            raise DeviceTimeout("device 'ecp5': a DRAM read timed out during the token (TokenStatus.READ_TIMEOUT): "
                                "the reader and the core were reset; the sequence is replayed before the next token")
        raise LinkError(f"device 'ecp5': unknown token status 0x{int(status):02x}")

    def recover(self, timed_out: bool) -> None:
        if timed_out:       # the link lost its framing or the board stopped answering: resynchronise, reset
            self.link.resync()
            self.link.reset_core()
        else:               # the core stopped the token: it waits for the next token packet
            self.link.write(_R.CTRL, Ctrl.CLEAR.value)
            # words of a packet an error cut short (an error in the LM head) may still be on their way: let them
            # arrive and drop them, so that the next token's output starts clean
            self.link.resync(0.02)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None
        self.mode = self.link_version = None

    def require_dram(self, what: str) -> None:
        """Raise DeviceError (saying that ``what`` needs one) unless a DRAM board is connected."""
        if self.link is None:
            raise DeviceError("device 'ecp5': the board is not connected")
        if self.mode != "dram":
            raise DeviceError(f"device 'ecp5': cannot {what}: the board runs the stream-only link (version 1), "
                              f"which has no DRAM; flash a DRAM bitstream (docs/BOARDS.md, ULX3S)")


class Ecp5Device(AcceleratorDevice):
    """An ECP5 board over its serial port: the one driver (:class:`~host.devices.driver.AcceleratorDevice`)
    over :class:`Ecp5Transport` (DRAM boards run tokens by id from the bundle loaded once; stream-only boards
    get the image every token).

    Parameters
    ----------
    port : str, optional
        Serial port (default ``$MMFREE_ECP5_PORT`` or the board's usual one: ``/dev/ttyUSB0``, the ULX3S's
        FT231X; on the ECPIX-5 the FT2232H's second interface, usually ``/dev/ttyUSB1``).
    baud : int, optional
        The bitstream's rate, bits/s (default ``$MMFREE_ECP5_BAUD`` or the board's committed bitstream's rate,
        :attr:`hw.boards.facts.BoardFacts.link_baud`; a build's ``report.json`` gives it as ``baud``).
    board : str, optional
        ``ulx3s-85f`` or ``ecpix5-85f`` (default ``$MMFREE_ECP5_BOARD`` or :data:`DEFAULT_BOARD`): the defaults
        of ``port`` and ``baud`` (:func:`board_link`).
    timeout : float
        Seconds to wait for any reply (and, times 10, for a token's output).
    output_gate : {"released", "paper"}
        Passed to the compiler, as for the golden device.
    serial : serial-like, optional
        An already open port (see :class:`UartLink`); ``port`` and ``baud`` are then unused.
    reload : bool
        DRAM boards: write the whole bundle on load even when the board holds it.
    progress : bool, optional
        DRAM boards: a progress bar while loading (default: when stderr is a terminal).

    Raises
    ------
    ValueError
        An unknown board, a baud rate that is not a positive integer, or a ``timeout`` that is not a positive,
        finite number of seconds.
    DeviceError
        (on :meth:`load`) pyserial missing, the port cannot be opened, no reply, a wrong ID block, a model that
        does not fit the build or the board's DRAM.
    """

    name = "ecp5"

    def __init__(self, *, port: str | None = None, baud: int | None = None, board: str | None = None,
                 timeout: float = 2.0, output_gate: str = "released", serial: Any = None, reload: bool = False,
                 progress: bool | None = None) -> None:
        board, default_port, baud = board_link(board, baud)
        if isinstance(baud, bool) or not isinstance(baud, int) or baud <= 0:
            raise ValueError(f"baud must be a positive integer, got {baud!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
        port_name = port or default_port
        self.board = board
        super().__init__(Ecp5Transport(port_name, baud, float(timeout), serial, reload=reload, progress=progress),
                         output_gate=output_gate)
        self.port_name, self.baud, self.timeout = port_name, baud, float(timeout)

    link = property(lambda self: self.transport.link, doc="The open :class:`UartLink` (or None).")
    mode = property(lambda self: self.transport.mode,
                    doc='``"dram"`` or ``"stream"`` once connected (:class:`Ecp5Transport`), else None.')
    last_load = property(lambda self: self.transport.last_load, doc="The last DRAM load's :class:`LoadReport`.")
    link_version = property(lambda self: self.transport.link_version,
                            doc="A DRAM board's link version (2 or 3) once connected, else None.")

    def ctrl_read(self, addr: int) -> int:
        """A 32-bit word of the board's DRAM controller's control bus (link version 3; :class:`UartLink`)."""
        return self.transport.ctrl_read(addr)

    def ctrl_write(self, addr: int, value: int) -> None:
        """Write a 32-bit word of the board's DRAM controller's control bus (link version 3)."""
        self.transport.ctrl_write(addr, value)

    def level(self, csr: Any, params: Any = None, *, wait: Callable[[int], None] | None = None):
        """Read leveling, then the DRAM port enabled (:meth:`Ecp5Transport.level`; **not run on hardware**)."""
        if self.transport.link is None:
            self.connect()
        return self.transport.level(csr, params, wait=wait)

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

    def counters(self) -> dict[str, int]:
        """The driver's counters and the DRAM loads' (:attr:`Ecp5Transport.stats`)."""
        return {**super().counters(), **self.transport.stats}

    def seconds_per_token(self) -> float | None:
        """Wire-time lower bound of one token at this baud rate, 10 line bits per byte: on a DRAM board the
        frames of an argmax-only token (:data:`TOKEN_WIRE_BYTES`; the DRAM's and the core's time are not in
        it), on a stream-only board the token packet and the image."""
        if self.image is None:
            return None
        if self.transport.mode == "dram":
            return TOKEN_WIRE_BYTES * 10 / self.baud
        return token_seconds(len(self.transport.stream) + token_packet_bytes(self.image.info.hidden), self.baud)
