"""The board's embedding lookup: a token id and a position in, the core's token packet out (issue 22, "the
link carries tokens, not vectors").

:class:`TokenBuilder` reads the token's embedding row from the bundle's embedding table in board DRAM (int32
words in the residual format, ``hidden`` words per row, rows contiguous from ``base``) through the image
reader's request/beat interface (:class:`hw.dram_reader.DRAMImageReader`: it does not drive the native port
itself), and emits on a stream of the weight channel's width exactly the bytes of
``host.protocol.make_token_packet(row, position=position, logits=logits)`` (docs/ISA.md section 2.3, "Token
packet"; :class:`hw.isa.TokenHeader`):

===========  ==============================================================================================
words        contents
===========  ==============================================================================================
0 .. 3       ``TOKEN_MAGIC``, ``position``, ``flags`` (bit 0: ``logits``), ``length`` = ``hidden``
4 ..         the row's ``hidden`` int32 words, in order
then         zero words up to the packet's last word
last         CRC-32 (:func:`hw.isa.crc32_words`: IEEE 802.3 / zlib, ``amaranth.lib.crc.catalog.CRC32_ETHERNET``
             over 32-bit little-endian words) of every word before it
===========  ==============================================================================================

The packet is ``16 + 4 hidden + 4`` bytes rounded up to 64-byte sections (:data:`hw.isa.SECTION_BYTES`), so
its words are ``ceil((hidden + 5) / 16) * 16``; word ``j`` of a beat sits in bits ``32 j ..`` (little-endian,
as the weight channel's ``tdata``) and ``last`` marks the packet's last beat. The core cannot tell it from a
packet the host sent.

Timing: the command is taken in one cycle, the row's address (``base + 4 id hidden``) is registered in the
next, the read request is offered in the one after; the four header words follow at once, while the reads
are in flight. The packet is built one 32-bit word per cycle (a 64-bit beat every two cycles, 200 MB/s at
50 MHz, twice the ULX3S SDRAM's peak and at the rate the core's channel-0 reader serializes words), except
that a row beat is taken only in the cycle after the previous one's last word was used: with 64-bit beats
the row's words come at two every three cycles when the reader has its beats ready (a wide DDR3 port; the
ULX3S's 16-bit port delivers a beat every four cycles and is the bound there). The CRC word follows one
cycle after the last padding word; backpressure on ``o`` or a late beat on ``rd`` stalls it without loss.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import crc, data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import isa
from hw.dram_reader import beat_layout, dram_request_layout
from hw.streams import packet_beat_layout

__all__ = ["token_command_layout", "packet_words", "TokenBuilder"]

_HEADER_WORDS = isa.layout_bytes(isa.TokenHeader) // 4
_SECTION_WORDS = isa.SECTION_BYTES // 4


def token_command_layout() -> data.StructLayout:
    """A token command: ``token`` (32 bits, the id; as the output trailer's ``argmax``), ``position``
    (32 bits, echoed in the packet header and the output trailer), ``logits`` (1 bit: ask for the LM head's
    logits, the header's ``flags`` bit 0; 0 is argmax only)."""
    return data.StructLayout({"token": 32, "position": 32, "logits": 1})


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def packet_words(hidden: int) -> int:
    """32-bit words of a token packet of ``hidden`` payload words (header, payload, CRC, padded to sections)."""
    return -(-(hidden + _HEADER_WORDS + 1) // _SECTION_WORDS) * _SECTION_WORDS


class TokenBuilder(wiring.Component):
    """Turns a token command into the core's token packet by reading the token's embedding row from DRAM.

    Parameters
    ----------
    byte_addr_width : int, >= 3
        Byte address bits of the DRAM behind the reader (:attr:`hw.dram_reader.DRAMImageReader.byte_addr_width`:
        25 for the ULX3S's 32 MiB).
    beat_width : int
        Bits of ``rd`` and ``o`` beats: the weight channel's ``bus_bits`` (64 by default), a power-of-two
        multiple of 32.
    max_hidden : int, >= 1
        Largest accepted ``hidden`` (default :data:`hw.isa.MAX_HIDDEN`; the core's own bound is its
        ``ID_MAX_HIDDEN``, which checks the packet's ``length`` again).
    read_align : int
        The reader's base granularity in bytes (:attr:`hw.dram_reader.DRAMImageReader.base_align`: 2 on the
        ULX3S's 16-bit port, 8 on a port wider than the 64-bit beat), a power of two up to
        ``beat_width / 8``; default 4. Up to 4 every row start is honoured as it is; above 4 the row is read
        from its address rounded down to ``read_align`` and the words before it in its first beat are skipped.

    Members
    -------
    cmd : In(stream.Signature(token_command_layout()))
        Taken while idle (one cycle). ``base``, ``hidden`` and ``vocab`` are sampled in the same cycle.
    base : In(byte_addr_width)
        Byte address of row 0 of the embedding table (bits 1:0 ignored: rows are int32 words).
    hidden : In(range(max_hidden + 1))
        Words per row: the image's hidden size (324 for the shipped model).
    vocab : In(32)
        Rows in the table. A command with ``token >= vocab`` reads nothing and emits nothing: it sets
        ``bad_token``.
    rd_req : Out(stream.Signature(dram_request_layout(byte_addr_width)))
        To the image reader's ``req``: one request per good command, ``base + 4 token hidden`` (rounded down to
        ``read_align``), length ``4 hidden`` (plus the bytes that rounding added) rounded up to whole beats
        (the first beat's words before the row and the last beat's after it, other rows', are dropped).
    rd : In(stream.Signature(beat_layout(beat_width)))
        From the image reader's ``o``: the row's beats. Taken only while the packet needs row words, so
        nothing beyond the request is consumed (the reader's ``o`` can be shared with the core's channel 0).
    o : Out(stream.Signature(hw.streams.packet_beat_layout(beat_width)))
        The token packet (``packet_words(hidden) * 32 / beat_width`` beats), ``last`` on its final beat: to
        the core's weight channel 0, ahead of the image.
    busy : Out(1)
        A command is in progress (from the cycle after it was taken to the packet's last beat leaving).
    bad_token : Out(1)
        The last command's ``token`` was ``>= vocab``.
    bad_hidden : Out(1)
        The last command came with ``hidden`` 0 or above ``max_hidden``.
    error : Out(1)
        ``bad_token | bad_hidden``: the last command was refused (no read, no packet). Both flags hold until
        the next command is taken.

    A read that never returns leaves the builder waiting for ``rd``; the reader's own time-out
    (``DRAMImageReader.error``) reports it, and the board top resets both.

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or out of range.
    """

    def __init__(self, *, byte_addr_width: int, beat_width: int = 64, max_hidden: int = isa.MAX_HIDDEN,
                 read_align: int = 4):
        _int("byte_addr_width", byte_addr_width, 3)
        _int("beat_width", beat_width, 32)
        _int("max_hidden", max_hidden, 1)
        _int("read_align", read_align, 1)
        ratio = beat_width // 32
        if beat_width % 32 or ratio & (ratio - 1):
            raise ValueError(f"beat_width must be a power-of-two multiple of 32, got {beat_width}")
        if read_align & (read_align - 1) or read_align > max(4, beat_width // 8):
            raise ValueError(f"read_align must be a power of two up to the beat's {beat_width // 8} bytes, "
                             f"got {read_align}")
        self._addr_width, self._beat_width, self._max_hidden = byte_addr_width, beat_width, max_hidden
        self._read_align = max(4, read_align)
        super().__init__({
            "cmd": In(stream.Signature(token_command_layout())),
            "base": In(byte_addr_width),
            "hidden": In(range(max_hidden + 1)),
            "vocab": In(32),
            "rd_req": Out(stream.Signature(dram_request_layout(byte_addr_width))),
            "rd": In(stream.Signature(beat_layout(beat_width))),
            "o": Out(stream.Signature(packet_beat_layout(beat_width))),
            "busy": Out(1),
            "bad_token": Out(1),
            "bad_hidden": Out(1),
            "error": Out(1),
        })

    @property
    def beat_width(self) -> int:
        return self._beat_width

    @property
    def max_hidden(self) -> int:
        return self._max_hidden

    @property
    def read_align(self) -> int:
        """The row start granularity the builder asks of the reader, bytes (``read_align``, at least 4)."""
        return self._read_align

    def elaborate(self, platform):
        m = Module()
        ratio = self._beat_width // 32
        beat_bytes = self._beat_width // 8
        aw = self._addr_width
        max_words = packet_words(self._max_hidden)

        m.submodules.crc = proc = crc.catalog.CRC32_ETHERNET(data_width=32).create()

        token = Signal(32)
        position = Signal(32)
        logits = Signal()
        hidden = Signal(range(self._max_hidden + 1))
        base = Signal(aw)
        addr = Signal(aw)
        total = Signal(range(max_words + 1))       # words of this packet
        idx = Signal(range(max_words + 1))         # next word to emit
        bad_token, bad_hidden = Signal(), Signal()
        skip_bits = ceil_log2(self._read_align) - 2       # the row's first words before the reader's boundary
        skip = addr[2:2 + skip_bits]

        # ---- command: taken while idle; checked before anything is read
        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    c = self.cmd.payload
                    bt = c.token >= self.vocab
                    bh = (self.hidden == 0) | (self.hidden > self._max_hidden)
                    m.d.sync += [token.eq(c.token), position.eq(c.position), logits.eq(c.logits),
                                 hidden.eq(self.hidden), base.eq(self.base & ~3),
                                 bad_token.eq(bt), bad_hidden.eq(bh)]
                    with m.If(~bt & ~bh):
                        m.next = "ADDR"
            with m.State("ADDR"):
                # the row's byte address; token < vocab, so its bits above the address width cannot matter
                row_bytes = (token[:aw] * hidden)[:aw - 2]
                m.d.sync += [addr.eq(base + (row_bytes << 2)),
                             total.eq(((hidden + _HEADER_WORDS + 1 + _SECTION_WORDS - 1)
                                       >> ceil_log2(_SECTION_WORDS)) << ceil_log2(_SECTION_WORDS)),
                             idx.eq(0)]
                m.next = "REQ"
            with m.State("REQ"):
                if skip_bits:       # from the reader's boundary below the row; the words before it skipped
                    m.d.comb += [self.rd_req.valid.eq(1),
                                 self.rd_req.payload.base.eq(addr & ~(self._read_align - 1)),
                                 self.rd_req.payload.length.eq(
                                     ((hidden << 2) + (skip << 2) + beat_bytes - 1) & ~(beat_bytes - 1))]
                else:
                    m.d.comb += [self.rd_req.valid.eq(1), self.rd_req.payload.base.eq(addr),
                                 self.rd_req.payload.length.eq(
                                     ((hidden << 2) + beat_bytes - 1) & ~(beat_bytes - 1))]
                with m.If(self.rd_req.ready):
                    m.next = "EMIT"
            with m.State("EMIT"):
                # the word source below runs; the packet ends with its last beat's transfer
                with m.If(self.o.valid & self.o.ready & self.o.payload.last):
                    m.next = "IDLE"
        emitting = fsm.ongoing("EMIT") | fsm.ongoing("REQ")

        # ---- the row's words, unpacked from rd's beats (word j of a beat in bits 32 j ..)
        inbuf = Signal(self._beat_width)
        in_have = Signal(range(ratio + 1))     # words of inbuf not yet used (the last ones)
        in_pos = Signal(range(ratio))
        in_word = inbuf if ratio == 1 else inbuf.word_select(in_pos, 32)
        is_header = idx < _HEADER_WORDS
        is_payload = ~is_header & (idx < hidden + _HEADER_WORDS)
        is_crc = idx == total - 1

        # ---- the packet's next word, and whether it can be produced this cycle
        word = Signal(32)
        word_ok = Signal()
        with m.If(is_header):
            with m.Switch(idx[:2]):
                with m.Case(0):
                    m.d.comb += word.eq(isa.TOKEN_MAGIC)
                with m.Case(1):
                    m.d.comb += word.eq(position)
                with m.Case(2):
                    m.d.comb += word.eq(logits)
                with m.Case(3):
                    m.d.comb += word.eq(hidden)
            m.d.comb += word_ok.eq(1)
        with m.Elif(is_payload):
            m.d.comb += [word.eq(in_word), word_ok.eq(in_have != 0)]
        with m.Elif(is_crc):
            m.d.comb += [word.eq(proc.crc), word_ok.eq(1)]
        with m.Else():
            m.d.comb += [word.eq(0), word_ok.eq(1)]

        # ---- beats out: `ratio` words gathered, word j in bits 32 j
        obuf = Signal(self._beat_width)
        opos = Signal(range(ratio))
        ofull = Signal()
        olast = Signal()
        m.d.comb += [self.o.valid.eq(ofull), self.o.payload.data.eq(obuf), self.o.payload.last.eq(olast)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += ofull.eq(0)
        take = Signal()
        m.d.comb += take.eq(emitting & word_ok & (idx != total) & (~ofull | self.o.ready))
        with m.If(take):
            m.d.sync += idx.eq(idx + 1)
            if ratio == 1:
                m.d.sync += [obuf.eq(word), ofull.eq(1), olast.eq(is_crc)]
            else:
                m.d.sync += [obuf.word_select(opos, 32).eq(word), opos.eq(opos + 1)]
                with m.If((opos == ratio - 1) | is_crc):
                    m.d.sync += [ofull.eq(1), olast.eq(is_crc), opos.eq(0)]

        # ---- the CRC of every word before the last, on the fly (its result is read one cycle later)
        m.d.comb += [proc.data.eq(word), proc.valid.eq(take & ~is_crc), proc.start.eq(take & (idx == 0))]

        # ---- row beats in: one when the buffer is empty and row words are still wanted
        m.d.comb += self.rd.ready.eq(fsm.ongoing("EMIT") & is_payload & (in_have == 0))
        if skip_bits:
            first_beat = Signal()      # the row's first beat, whose first `skip` words are not the row's
            with m.If(self.rd_req.valid & self.rd_req.ready):
                m.d.sync += first_beat.eq(1)
            with m.If(self.rd.valid & self.rd.ready):
                m.d.sync += first_beat.eq(0)
        with m.If(self.rd.valid & self.rd.ready):
            if skip_bits:
                m.d.sync += [inbuf.eq(self.rd.payload.data), in_have.eq(ratio - Mux(first_beat, skip, 0)),
                             in_pos.eq(Mux(first_beat, skip, 0))]
            else:
                m.d.sync += [inbuf.eq(self.rd.payload.data), in_have.eq(ratio), in_pos.eq(0)]
        with m.Elif(take & is_payload):
            m.d.sync += in_have.eq(in_have - 1)
            if ratio > 1:
                m.d.sync += in_pos.eq(in_pos + 1)
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += in_have.eq(0)   # the previous row's unused words (past its end) are dropped

        m.d.comb += [self.busy.eq(emitting | fsm.ongoing("ADDR")), self.bad_token.eq(bad_token),
                     self.bad_hidden.eq(bad_hidden), self.error.eq(bad_token | bad_hidden)]
        return m
