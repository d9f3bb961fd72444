"""The UART host link's protocol: command and reply frames, the board registers, the token command.

One home for these facts, in pure Python: the gateware (:mod:`hw.boards.uart_link`,
:mod:`hw.boards.dram_board`) and the host driver (:mod:`host.devices.ecp5`, which must import without Amaranth)
both read them from here.

Frames (bytes; multi-byte fields little-endian). Every command starts with an opcode byte and gets exactly
one reply frame; the core's output words (``'o'`` frames) are interleaved with the replies whenever the core
emits them, and the host tells frames apart by their first byte (each frame's length is fixed by it:
:data:`REPLY_BYTES`).

==================================  ============================================  ================================
host -> board                       meaning                                       board -> host
==================================  ============================================  ================================
``'R'`` addr:u8                     read of the core's register at addr           ``'r'`` data:u32
                                    (:data:`hw.isa.REGISTER_MAP`)
``'W'`` addr:u8 data:u32            write of a core register                      ``'w'``
``'S'`` n-1:u16 flags:u8, 8n bytes  n beats of 8 bytes to the core's weight       ``'s'`` once the n-th beat left
                                    channel 0 (flags bit 0: ``tlast`` on the n-th
                                    beat)
``'X'``                             reset the core (its registers and state; on   ``'x'``
                                    a DRAM board also the reader, the token
                                    builder and the argmax tap). Board registers
                                    and DRAM contents stay
``'G'`` addr:u8                     read of a board register (:class:`BoardReg`)  ``'g'`` data:u32
``'P'`` addr:u8 data:u32            write of a board register (those in           ``'p'``
                                    :data:`WRITABLE`; others ignored)
``'L'`` addr:u32 n-1:u16, 8n bytes  write n beats to DRAM at byte address addr    ``'l'`` status:u8 once the n-th
                                    (a multiple of 8); clears                     beat is in DRAM
                                    ``BoardStatus.IMAGE_VALID``                   (:class:`DramStatus`)
``'C'`` addr:u32 bytes:u32          CRC-32 of DRAM ``[addr, addr + bytes)``       ``'c'`` crc:u32 status:u8
                                    (both multiples of 8): ``zlib.crc32`` of       (:class:`DramStatus`)
                                    those bytes in address order
``'T'`` token:u32 pos:u32 flags:u8  run one token from DRAM (:class:`TokenFlags`; ``'t'`` status:u8
                                    below)                                        (:class:`TokenStatus`)
``'K'`` addr:u32                    read of the DRAM controller's control bus     ``'k'`` status:u8 data:u32
                                    (LiteDRAM ``wb_ctrl``: the 32-bit word at     (:class:`CtrlStatus`; data 0
                                    byte address addr, a multiple of 4 below      unless status is 0)
                                    :data:`CTRL_BYTES`); version 3
``'J'`` addr:u32 data:u32           write of that word; version 3                 ``'j'`` status:u8
                                                                                  (:class:`CtrlStatus`)
other                               ignored                                       ``'?'``
(core output word)                                                                ``'o'`` data:u32 flags:u8
                                                                                  (flags bit 0: ``tlast``)
==================================  ============================================  ================================

**Streams and windows.** ``'S'`` and ``'L'`` carry :data:`CHUNK_BEATS` beats at most each; the host keeps at most
:data:`WINDOW_CHUNKS` of them unacknowledged, so the board's :data:`RX_FIFO_BYTES`-byte receive FIFO never
overflows while the core or the DRAM stalls (an overflow still sets ``BoardStatus.RX_OVERFLOW``, sticky).
A command whose bytes stop arriving for the link's byte time-out is abandoned (counted in
``BoardReg.LINK_TIMEOUTS``): a host that gave up mid-command resynchronises by waiting longer than that
and flushing its input.

**DRAM boards** (:mod:`hw.boards.dram_board`) hold the model image and the embedding table (``int32`` rows
in the residual format, ``hidden`` words each, row ``t`` at ``EMBED_BASE + 4 t hidden``) in the board's
DRAM. The host loads both once with ``'L'``, checks them with ``'C'`` against its own CRC, then writes
``IMAGE_BASE``, ``IMAGE_BYTES``, ``EMBED_*``, its identifier of the loaded bundle in ``IMAGE_CHECKSUM``
and finally ``STATUS`` with ``IMAGE_VALID`` set. A reconnecting host reads ``IMAGE_CHECKSUM`` and
``IMAGE_VALID`` and skips the load when they name its bundle.

**A token** (``'T'``): the board builds the core's token packet (``host.protocol.make_token_packet``) from
the embedding row of ``token`` and ``pos`` (:class:`hw.token_builder.TokenBuilder`), streams it into the
core's channel 0 and then the image ``[IMAGE_BASE, IMAGE_BYTES)`` from DRAM, and sends the core's output
packet back as ``'o'`` frames: the whole packet when ``flags`` has :attr:`TokenFlags.LOGITS`, else its
:data:`ARGMAX_SUMMARY_WORDS`-word summary (:class:`hw.argmax_tap.ArgmaxTap`: position, argmax, tap flags).
The ``'t'`` reply follows once the image's last beat entered the core, or at once when the token was refused
(:class:`TokenStatus`); output words may still follow it (the core finishes the LM head after its last
weight beat). A token refused before the core saw anything (``NO_IMAGE``, ``BAD_TOKEN``, ``BAD_HIDDEN``)
produces no output; after ``CORE_ERROR`` or ``READ_TIMEOUT`` the host reads the core's error registers and
clears or resets it, as after any failed token.

**The DRAM controller's control bus** (``'K'``/``'J'``, version 3): the LiteDRAM core's CSRs (its
``csr.json``: byte addresses, 32-bit words, wide registers most significant word first), for the host's
read leveling of a DDR3 PHY (:mod:`host.leveling`). The core's power-up sequencer owns the bus until it has
run (``DRAM_READY``) or failed (``DRAM_INIT_ERROR``); before that the board answers ``CtrlStatus.BUSY`` and
touches nothing. An access the core does not acknowledge within the board's time-out (a bounded number of
cycles) is abandoned with ``CtrlStatus.TIMEOUT``; the link goes on. **The port enable**: a board whose
DRAM needs read leveling (the ECPIX-5's DDR3) keeps the controller's user port blocked after power-up
(``BoardStatus.PORT_HELD``) until the host writes 1 to ``BoardReg.PORT_ENABLE``; until then ``'L'`` and
``'C'`` answer ``DramStatus.NOT_READY`` and ``'T'`` ``TokenStatus.NOT_READY``. A board whose DRAM needs no
leveling (the ULX3S's SDRAM) reads ``PORT_ENABLE`` as 1 and ignores writes to it. Leveling writes its test
bursts through the controller's DFI injector to bank 0, row 0, column 0: the DRAM's first burst (bytes 0 to
15 on the ECPIX-5) changes, so the host clears ``IMAGE_VALID`` before it levels.

**Versions.** 1: the stream-only link (``'R'``, ``'W'``, ``'S'``, ``'X'``; the first ECP5 builds). 2: the
DRAM boards' board registers, ``'L'``, ``'C'``, ``'T'`` (the committed ULX3S bitstream). 3 (this module):
``'K'``, ``'J'``, ``BoardReg.PORT_ENABLE``, ``BoardStatus.PORT_ENABLED``/``PORT_HELD`` and
``TokenStatus.NOT_READY``; what version 2 has is unchanged. The host speaks :data:`DRAM_LINK_VERSIONS`.
"""

from __future__ import annotations

import enum

__all__ = [
    "LINK_VERSION", "BOARD_MAGIC", "BEAT_BYTES", "RX_FIFO_BYTES", "CHUNK_BEATS", "WINDOW_CHUNKS",
    "OP_READ", "OP_WRITE", "OP_STREAM", "OP_RESET", "OP_BOARD_READ", "OP_BOARD_WRITE", "OP_DRAM_WRITE",
    "OP_DRAM_CRC", "OP_TOKEN", "REP_READ", "REP_WRITE", "REP_STREAM", "REP_RESET", "REP_BOARD_READ",
    "REP_BOARD_WRITE", "REP_DRAM_WRITE", "REP_DRAM_CRC", "REP_TOKEN", "REP_UNKNOWN", "REP_OUTPUT",
    "COMMAND_BYTES", "REPLY_BYTES", "BoardReg", "WRITABLE", "BoardStatus", "DramStatus", "TokenFlags",
    "TokenStatus", "SummaryFlags", "ARGMAX_SUMMARY_WORDS", "RESET_CYCLES", "OP_CTRL_READ", "OP_CTRL_WRITE",
    "REP_CTRL_READ", "REP_CTRL_WRITE", "CtrlStatus", "CTRL_BYTES", "CTRL_LINK_VERSION", "DRAM_LINK_VERSIONS",
]

#: version of this protocol, in ``BoardReg.LINK_VERSION`` (1: the stream-only link of the first ECP5 builds,
#: which had no board registers; 2: the DRAM boards' link without the control bus; module docstring)
LINK_VERSION = 3
#: the first version with the DRAM controller's control bus (``'K'``/``'J'``) and the port enable
CTRL_LINK_VERSION = 3
#: DRAM-board link versions the host speaks (a version-2 board has no control bus: no leveling, its port is
#: always enabled)
DRAM_LINK_VERSIONS = (2, 3)
#: ``BoardReg.MAGIC``: ASCII "MMDB" read little-endian
BOARD_MAGIC = 0x42444D4D

#: bytes of one stream beat (the weight channel's 64-bit ``tdata``)
BEAT_BYTES = 8
#: receive FIFO (two DP16KD block RAMs hold 4096 bytes each on ECP5)
RX_FIFO_BYTES = 8192
#: beats per ``'S'``/``'L'`` command the host sends, and chunks it keeps unacknowledged:
#: 8 * (7 + 8 * 127) <= 8192
CHUNK_BEATS = 127
WINDOW_CHUNKS = 8
#: cycles the ``'X'`` command holds the core in reset
RESET_CYCLES = 16
#: bytes of the control bus ``'K'``/``'J'`` may address: the CSR region of the LiteDRAM cores generated without
#: a CPU (their ``csr.json``: ``memories.csr``, base 0, size 0x10000 = ``csr_paging`` 0x800 x 32 regions);
#: addresses at or above it are refused (``CtrlStatus.BAD_ADDR``) instead of reaching an unmapped decoder slot
CTRL_BYTES = 0x10000

OP_READ, OP_WRITE, OP_STREAM, OP_RESET = b"R"[0], b"W"[0], b"S"[0], b"X"[0]
OP_BOARD_READ, OP_BOARD_WRITE, OP_DRAM_WRITE, OP_DRAM_CRC, OP_TOKEN = b"G"[0], b"P"[0], b"L"[0], b"C"[0], b"T"[0]
OP_CTRL_READ, OP_CTRL_WRITE = b"K"[0], b"J"[0]
REP_READ, REP_WRITE, REP_STREAM, REP_RESET = b"r"[0], b"w"[0], b"s"[0], b"x"[0]
REP_BOARD_READ, REP_BOARD_WRITE, REP_DRAM_WRITE, REP_DRAM_CRC, REP_TOKEN = b"g"[0], b"p"[0], b"l"[0], b"c"[0], b"t"[0]
REP_CTRL_READ, REP_CTRL_WRITE = b"k"[0], b"j"[0]
REP_UNKNOWN, REP_OUTPUT = b"?"[0], b"o"[0]

#: argument bytes after each opcode (``'S'`` and ``'L'``: then ``8 n`` data bytes)
COMMAND_BYTES = {OP_READ: 1, OP_WRITE: 5, OP_STREAM: 3, OP_RESET: 0, OP_BOARD_READ: 1, OP_BOARD_WRITE: 5,
                 OP_DRAM_WRITE: 6, OP_DRAM_CRC: 8, OP_TOKEN: 9, OP_CTRL_READ: 4, OP_CTRL_WRITE: 8}
#: bytes of each reply frame after its first byte
REPLY_BYTES = {REP_READ: 4, REP_WRITE: 0, REP_STREAM: 0, REP_RESET: 0, REP_BOARD_READ: 4, REP_BOARD_WRITE: 0,
               REP_DRAM_WRITE: 1, REP_DRAM_CRC: 5, REP_TOKEN: 1, REP_CTRL_READ: 5, REP_CTRL_WRITE: 1,
               REP_UNKNOWN: 0, REP_OUTPUT: 5}

#: words of an argmax-only token's output (:class:`hw.argmax_tap.ArgmaxTap`): position, argmax,
#: :class:`SummaryFlags`
ARGMAX_SUMMARY_WORDS = 3


class BoardReg(enum.IntEnum):
    """Board registers of a DRAM board (byte addresses of ``'G'``/``'P'``; 32-bit values)."""

    MAGIC = 0x00            #: :data:`BOARD_MAGIC` (read only)
    LINK_VERSION = 0x04     #: :data:`LINK_VERSION` (read only)
    DRAM_BYTES = 0x08       #: bytes of DRAM behind the board's port (read only; 32 MiB on the ULX3S)
    CLOCK_HZ = 0x0C         #: the board clock the core and the controller run at, Hz (read only)
    STATUS = 0x10           #: :class:`BoardStatus` (only ``IMAGE_VALID`` writable)
    IMAGE_BASE = 0x14       #: byte address of the model image in DRAM
    IMAGE_BYTES = 0x18      #: its length in bytes (a multiple of 8)
    IMAGE_CHECKSUM = 0x1C   #: the host's identifier of the loaded bundle (the board only holds it)
    EMBED_BASE = 0x20       #: byte address of the embedding table's row 0
    EMBED_HIDDEN = 0x24     #: words per row
    EMBED_VOCAB = 0x28      #: rows
    LINK_TIMEOUTS = 0x2C    #: commands abandoned for lack of bytes (read only, wraps)
    LINK_FRAMING = 0x30     #: received bytes dropped for a missing stop bit (read only, wraps)
    TOKENS = 0x34           #: ``'T'`` commands taken since configuration (read only, wraps)
    PORT_ENABLE = 0x38      #: bit 0: the DRAM controller's user port is enabled (version 3; module docstring)


#: board registers ``'P'`` writes (the others ignore writes; ``PORT_ENABLE`` only on a board that holds its port)
WRITABLE = frozenset({BoardReg.STATUS, BoardReg.IMAGE_BASE, BoardReg.IMAGE_BYTES, BoardReg.IMAGE_CHECKSUM,
                      BoardReg.EMBED_BASE, BoardReg.EMBED_HIDDEN, BoardReg.EMBED_VOCAB, BoardReg.PORT_ENABLE})


class BoardStatus(enum.IntFlag):
    """``BoardReg.STATUS``."""

    DRAM_READY = 1          #: the DRAM's power-up sequence has run (LiteDRAM ``init_done``)
    DRAM_INIT_ERROR = 2     #: it failed (``init_error``): the board needs a reconfiguration
    IMAGE_VALID = 4         #: the host verified the image and table (set by a ``'P'``; any ``'L'`` clears it)
    READER_ERROR = 8        #: a DRAM read timed out (until ``'X'``)
    WRITER_ERROR = 16       #: the DRAM writer lost a word (controller contract broken; until ``'X'``)
    RX_OVERFLOW = 32        #: a received byte found the FIFO full (sticky until reconfiguration)
    PORT_ENABLED = 64       #: the DRAM's user port is enabled (``BoardReg.PORT_ENABLE``; version 3)
    PORT_HELD = 128         #: the board holds its port until the host enables it: its DRAM needs read leveling
                            #: (version 3; constant per bitstream)


class DramStatus(enum.IntFlag):
    """Status byte of the ``'l'`` and ``'c'`` replies (0: good)."""

    NOT_READY = 1           #: the DRAM is not initialised, or its port not enabled: nothing was written or read
    TIMEOUT = 2             #: a read or write did not complete (the reply's CRC is meaningless; ``'X'`` resets)
    WRITER_ERROR = 4        #: the writer lost a word
    BAD_ALIGN = 8           #: address or length not a multiple of 8, or beyond the DRAM: nothing was done


class TokenFlags(enum.IntFlag):
    """``flags`` of ``'T'``."""

    LOGITS = 1              #: send the whole output packet (else the argmax summary)


class TokenStatus(enum.IntFlag):
    """Status byte of the ``'t'`` reply (0: the token ran and its output follows or has been sent)."""

    NO_IMAGE = 1            #: ``IMAGE_VALID`` is clear: nothing was read, nothing sent to the core
    BAD_TOKEN = 2           #: ``token >= EMBED_VOCAB``: refused, nothing sent to the core
    BAD_HIDDEN = 4          #: ``EMBED_HIDDEN`` is 0 or above the core's ``max_hidden``: refused
    READ_TIMEOUT = 8        #: a DRAM read timed out mid-token (``'X'`` resets the reader and the core)
    CORE_ERROR = 16         #: the core raised ``STATUS.ERROR`` during the token (its error registers say why)
    NOT_READY = 32          #: the DRAM's port is not enabled (leveling not run; version 3): nothing read or sent


class CtrlStatus(enum.IntFlag):
    """Status byte of the ``'k'`` and ``'j'`` replies (0: done; otherwise nothing was read or written)."""

    BUSY = 1                #: the power-up sequencer still owns the control bus (neither ``DRAM_READY`` nor
                            #: ``DRAM_INIT_ERROR`` yet): try again
    TIMEOUT = 2             #: the core did not acknowledge within the board's time-out; the access was abandoned
    BAD_ADDR = 4            #: the address is not a multiple of 4, or not below :data:`CTRL_BYTES`


class SummaryFlags(enum.IntFlag):
    """The flags word of an argmax-only token's summary (:class:`hw.argmax_tap.ArgmaxTap` sets them; 0: good)."""

    CRC = 1                 #: the output packet's CRC word did not match its words
    MAGIC = 2               #: the trailer's magic was not ``OUTPUT_MAGIC``
    ABORT = 4               #: the packet ended with ``OUTPUT_ABORT_WORD`` (an error in the LM head)
    LENGTH = 8              #: the packet's word count was not ``roundup(n_logits + 8, 16)``
