"""The UART host link for boards without a DMA engine: the serial line, its byte FIFO, and the command parser
and reply framer of the link protocol (:mod:`hw.boards.link_protocol`, the spec: frames, board registers,
the DRAM and token commands, their status bytes).

- :class:`UARTRx`, :class:`UARTTx`: 8N1 (LSB first). The receiver synchronises ``rx`` through two
  flip-flops, samples each bit at its middle (``divisor`` clock cycles per bit) and drops bytes without a
  stop bit (counted in ``framing``).
- :class:`UARTPhy`: receiver, receive FIFO (:data:`~hw.boards.link_protocol.RX_FIFO_BYTES`) and
  transmitter, with byte streams on the inside (the DRAM boards' top puts it in front of
  :class:`hw.boards.dram_board.DRAMBoard`).
- :class:`LinkBridge`: the parser and framer on byte streams (a simulation drives bytes directly, below the
  UART). It always speaks ``'R'``, ``'W'``, ``'S'``, ``'X'`` to a core (AXI4-Lite manager, weight stream
  out, output stream in, core reset); built with ``board=True`` it also speaks ``'G'``, ``'P'``, ``'L'``,
  ``'C'``, ``'T'``, ``'K'``, ``'J'`` over its ``board`` port (:class:`BoardPortSignature`), whose other side (the board
  registers, DRAM and token engines) is :class:`hw.boards.dram_board.DRAMBoard`. Without ``board`` those
  opcodes are unknown (``'?'``) and none of that logic is built.
- :class:`UARTLink`: :class:`UARTPhy`'s parts and a stream-only :class:`LinkBridge`, the whole link of the
  boards without DRAM (:class:`hw.boards.ecp5.LinkedCore`).
- :func:`stream_register`: the one-entry FIFO that stands between the link and a core stream (timing).

Received bytes go through a FIFO: the host keeps at most
:data:`~hw.boards.link_protocol.WINDOW_CHUNKS` chunks of :data:`~hw.boards.link_protocol.CHUNK_BEATS`
beats unacknowledged, so the FIFO never overflows even while the core or the DRAM stalls (an overflow still
sets a sticky flag, ``overflow``). A command whose bytes stop arriving for ``byte_timeout`` cycles is
abandoned (the parser returns to idle, ``timeouts`` counts it; an ``'L'`` abandoned among its data beats
first completes the DRAM write with zero beats, so that the DRAM engine is idle again, and sends no reply):
a host that gave up mid-command resynchronises by waiting for longer than that and flushing its input.

The protocol constants are :mod:`hw.boards.link_protocol`'s; the names below (``ul.OP_READ``, ...) are
those, imported here for modules that read them through this one.
"""

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from hw.boards.link_protocol import (
    BEAT_BYTES,
    CHUNK_BEATS,
    COMMAND_BYTES,
    OP_BOARD_READ,
    OP_BOARD_WRITE,
    OP_CTRL_READ,
    OP_CTRL_WRITE,
    OP_DRAM_CRC,
    OP_DRAM_WRITE,
    OP_READ,
    OP_RESET,
    OP_STREAM,
    OP_TOKEN,
    OP_WRITE,
    REP_BOARD_READ,
    REP_BOARD_WRITE,
    REP_CTRL_READ,
    REP_CTRL_WRITE,
    REP_DRAM_CRC,
    REP_DRAM_WRITE,
    REP_OUTPUT,
    REP_READ,
    REP_RESET,
    REP_STREAM,
    REP_TOKEN,
    REP_UNKNOWN,
    REP_WRITE,
    REPLY_BYTES,
    RESET_CYCLES,
    RX_FIFO_BYTES,
    WINDOW_CHUNKS,
)
from hw.regs import AXI4LiteSignature
from hw.streams import AXIStreamSignature

__all__ = ["UARTRx", "UARTTx", "UARTPhy", "LinkBridge", "UARTLink", "BoardPortSignature", "stream_register",
           "dram_command_layout", "dram_result_layout", "token_request_layout", "ctrl_command_layout",
           "ctrl_result_layout",
           # protocol constants (hw.boards.link_protocol's), for modules that import them from here
           "OP_READ", "OP_WRITE", "OP_STREAM", "OP_RESET", "OP_BOARD_READ", "OP_BOARD_WRITE", "OP_DRAM_WRITE",
           "OP_DRAM_CRC", "OP_TOKEN", "REP_READ", "REP_WRITE", "REP_STREAM", "REP_RESET", "REP_BOARD_READ",
           "REP_BOARD_WRITE", "REP_DRAM_WRITE", "REP_DRAM_CRC", "REP_TOKEN", "REP_UNKNOWN", "REP_OUTPUT",
           "COMMAND_BYTES", "REPLY_BYTES", "RX_FIFO_BYTES", "CHUNK_BEATS", "WINDOW_CHUNKS", "BEAT_BYTES",
           "RESET_CYCLES"]


def _check_divisor(divisor):
    if not isinstance(divisor, int) or isinstance(divisor, bool) or divisor < 4:
        raise ValueError(f"divisor (clock cycles per bit) must be an integer >= 4, got {divisor!r}")


class UARTRx(wiring.Component):
    """8N1 receiver without back-pressure: ``valid`` pulses one cycle with ``data`` per byte.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (clock frequency / baud rate), >= 4.

    Attributes
    ----------
    rx : In(1)
        The serial line (idle high), asynchronous.
    data : Out(8)
    valid : Out(1)
    framing : Out(16)
        Bytes dropped for a missing stop bit (wraps).
    """

    rx: In(1, init=1)
    data: Out(8)
    valid: Out(1)
    framing: Out(16)

    def __init__(self, *, divisor: int):
        _check_divisor(divisor)
        self._divisor = divisor
        super().__init__()

    @property
    def divisor(self) -> int:
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        d = self._divisor
        rx = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, rx, init=1)
        timer = Signal(range(d + d // 2 + 1))
        bit = Signal(range(9))
        shreg = Signal(8)
        m.d.sync += self.valid.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(~rx):
                    m.d.sync += timer.eq(d // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(rx):          # a glitch, not a start bit
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [timer.eq(d - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [timer.eq(d - 1), shreg.eq(Cat(shreg[1:], rx)), bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    with m.If(rx):
                        m.d.sync += [self.data.eq(shreg), self.valid.eq(1)]
                    with m.Else():
                        m.d.sync += self.framing.eq(self.framing + 1)
                    m.next = "WAIT_IDLE"
            with m.State("WAIT_IDLE"):     # a missing stop bit: wait for the line to go idle
                with m.If(rx):
                    m.next = "IDLE"
        return m


class UARTTx(wiring.Component):
    """8N1 transmitter taking bytes from a stream.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, >= 4.

    Attributes
    ----------
    i : In(stream.Signature(8))
    tx : Out(1)
        The serial line (idle high).
    """

    i: In(stream.Signature(8))
    tx: Out(1, init=1)

    def __init__(self, *, divisor: int):
        _check_divisor(divisor)
        self._divisor = divisor
        super().__init__()

    @property
    def divisor(self) -> int:
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        d = self._divisor
        timer = Signal(range(d))
        bits = Signal(10, init=0x3FF)
        count = Signal(range(11))
        m.d.comb += [self.tx.eq(bits[0]), self.i.ready.eq(count == 0)]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [bits.eq(Cat(Const(0, 1), self.i.payload, Const(1, 1))), count.eq(10), timer.eq(d - 1)]
        with m.Elif(count != 0):
            with m.If(timer != 0):
                m.d.sync += timer.eq(timer - 1)
            with m.Else():
                m.d.sync += [bits.eq(Cat(bits[1:], Const(1, 1))), count.eq(count - 1), timer.eq(d - 1)]
        return m


def _stream_parts(s):
    """(data, last, valid, ready) of an AXI4-Stream interface (``tdata``, ``tlast``, ...) or of a
    ``lib.stream`` interface whose payload has ``data`` and ``last`` (:func:`hw.streams.packet_beat_layout`)."""
    if hasattr(s, "tdata"):
        return s.tdata, s.tlast, s.tvalid, s.tready
    return s.payload.data, s.payload.last, s.valid, s.ready


def stream_register(m: Module, name: str, src, dst, *, rst=None, depth: int = 1) -> fifo.SyncFIFOBuffered:
    """Put a ``depth``-entry FIFO between the packet streams ``src`` and ``dst`` (added to ``m`` as ``name``).

    With ``depth`` 1 (the default) it is a register for the data and ``last`` and a registered ``ready``: no
    handshake runs from one side into the other within a cycle, and a beat passes every other cycle. That is
    what stands between the UART link and the core's streams on the boards (before it, the routed critical
    paths of the ECPIX-5 builds ran from the link's parser into the core's fetcher and from the
    transmitter's ``ready`` into the epilogue's enable: bitstreams/README.md).

    Parameters
    ----------
    m : Module
    name : str
        The FIFO's submodule name.
    src, dst
        The sending and the receiving side: AXI4-Stream interfaces (``tdata``, ``tvalid``, ``tready``,
        ``tlast``) or ``lib.stream`` interfaces with a ``{data, last}`` payload, of one data width.
    rst : Value, optional
        Empties the FIFO (a core reset: nothing outlives it).
    depth : int
        Entries (one; a deeper FIFO holds a memory).

    Returns
    -------
    amaranth.lib.fifo.SyncFIFOBuffered
    """
    s_data, s_last, s_valid, s_ready = _stream_parts(src)
    d_data, d_last, d_valid, d_ready = _stream_parts(dst)
    if len(s_data) != len(d_data):
        raise ValueError(f"{name}: {len(s_data)}-bit source, {len(d_data)}-bit sink")
    q = fifo.SyncFIFOBuffered(width=len(s_data) + 1, depth=depth)
    m.submodules[name] = q if rst is None else ResetInserter({"sync": rst})(q)
    m.d.comb += [q.w_data.eq(Cat(s_data, s_last)), q.w_en.eq(s_valid), s_ready.eq(q.w_rdy),
                 d_data.eq(q.r_data[:-1]), d_last.eq(q.r_data[-1]), d_valid.eq(q.r_rdy), q.r_en.eq(d_ready)]
    return q


def dram_command_layout() -> data.StructLayout:
    """A DRAM command of the link (``'L'``: ``write`` 1; ``'C'``: ``write`` 0): ``addr`` (byte address,
    32 bits, as sent), ``length`` (bytes, 32 bits: ``'L'``'s ``8 n``, ``'C'``'s ``bytes``)."""
    return data.StructLayout({"write": 1, "addr": 32, "length": 32})


def dram_result_layout() -> data.StructLayout:
    """A DRAM command's result: ``status`` (8 bits, :class:`~hw.boards.link_protocol.DramStatus`), ``crc``
    (32 bits, ``'C'`` only: ``zlib.crc32`` of the bytes)."""
    return data.StructLayout({"status": 8, "crc": 32})


def token_request_layout() -> data.StructLayout:
    """A ``'T'`` command: ``token`` (32 bits), ``position`` (32 bits), ``flags`` (8 bits,
    :class:`~hw.boards.link_protocol.TokenFlags`)."""
    return data.StructLayout({"token": 32, "position": 32, "flags": 8})


def ctrl_command_layout() -> data.StructLayout:
    """A DRAM controller control-bus access of the link (``'K'``: ``write`` 0; ``'J'``: ``write`` 1): ``addr``
    (byte address, 32 bits, as sent), ``data`` (32 bits, ``'J'`` only)."""
    return data.StructLayout({"write": 1, "addr": 32, "data": 32})


def ctrl_result_layout() -> data.StructLayout:
    """Its result: ``status`` (8 bits, :class:`~hw.boards.link_protocol.CtrlStatus`), ``data`` (32 bits, the word
    read; 0 for a write or a failed access)."""
    return data.StructLayout({"status": 8, "data": 32})


class BoardPortSignature(wiring.Signature):
    """The DRAM board's side of the link's commands, as :class:`LinkBridge` (the manager) sees it.

    Members
    -------
    reg_addr : Out(8)
        Board register byte address (:class:`~hw.boards.link_protocol.BoardReg`) of a ``'G'`` or ``'P'``.
    reg_rdata : In(32)
        That register's value, combinational from ``reg_addr`` (read in the cycle after the address settles).
    reg_wdata : Out(32); reg_we : Out(1)
        A ``'P'``: ``reg_we`` high one cycle with ``reg_addr`` and ``reg_wdata``.
    dram_cmd : Out(stream.Signature(dram_command_layout()))
        ``'L'`` and ``'C'``; exactly one ``dram_done`` answers each.
    dram_data : Out(stream.Signature(64))
        After an ``'L'``'s command, exactly ``length / 8`` beats (byte ``k`` of a beat in bits ``8k ..``),
        whatever the command's fate: the receiver takes (or drops) them all.
    dram_done : In(stream.Signature(dram_result_layout()))
        The command's result (for ``'L'`` after its last beat was taken).
    token : Out(stream.Signature(token_request_layout()))
        ``'T'``; exactly one ``token_done`` answers each.
    token_done : In(stream.Signature(8))
        Its :class:`~hw.boards.link_protocol.TokenStatus`.
    ctrl_cmd : Out(stream.Signature(ctrl_command_layout()))
        ``'K'`` and ``'J'``; exactly one ``ctrl_done`` answers each.
    ctrl_done : In(stream.Signature(ctrl_result_layout()))
        The access's result.
    """

    def __init__(self):
        super().__init__({
            "reg_addr": Out(8), "reg_rdata": In(32), "reg_wdata": Out(32), "reg_we": Out(1),
            "dram_cmd": Out(stream.Signature(dram_command_layout())),
            "dram_data": Out(stream.Signature(64)),
            "dram_done": In(stream.Signature(dram_result_layout())),
            "token": Out(stream.Signature(token_request_layout())),
            "token_done": In(stream.Signature(8)),
            "ctrl_cmd": Out(stream.Signature(ctrl_command_layout())),
            "ctrl_done": In(stream.Signature(ctrl_result_layout())),
        })


class LinkBridge(wiring.Component):
    """The command parser and reply framer of the link protocol (:mod:`hw.boards.link_protocol`).

    Every command gets its reply frame in order; a reply has priority over the core's output words, which
    are sent as ``'o'`` frames whenever no reply waits. Commands run one at a time: the next opcode is read
    once the reply is queued.

    Parameters
    ----------
    byte_timeout : int, >= 16
        Clock cycles a command may wait for its next byte before it is abandoned.
    board : bool
        Also the DRAM boards' commands ``'G'``, ``'P'``, ``'L'``, ``'C'``, ``'T'``, ``'K'``, ``'J'`` (the
        ``board`` port); without it they are unknown opcodes.

    Attributes
    ----------
    rx : In(stream.Signature(8))
        Received bytes (from the FIFO).
    tx : Out(stream.Signature(8))
        Bytes to send.
    axil : In(AXI4LiteSignature(addr_width=8))
        AXI4-Lite manager (connect to the core's ``s_axil``).
    w0 : Out(AXIStreamSignature(64))
        ``'S'`` beats (connect to the core's ``s_axis_w0``).
    out : In(AXIStreamSignature(32))
        Output words to send as ``'o'`` frames (the core's ``m_axis_out``).
    core_rst : Out(1)
        High for :data:`~hw.boards.link_protocol.RESET_CYCLES` cycles on ``'X'``.
    timeouts : Out(16)
        Commands abandoned for lack of bytes (wraps).
    board : Out(BoardPortSignature()), with ``board`` only
        The board's registers, DRAM and token engines.

    Raises
    ------
    ValueError
        On a ``byte_timeout`` that is not an integer >= 16.
    """

    def __init__(self, *, byte_timeout: int = 1 << 24, board: bool = False):
        if not isinstance(byte_timeout, int) or isinstance(byte_timeout, bool) or byte_timeout < 16:
            raise ValueError(f"byte_timeout must be an integer >= 16 cycles, got {byte_timeout!r}")
        self._byte_timeout, self._board = byte_timeout, bool(board)
        members = {"rx": In(stream.Signature(8)), "tx": Out(stream.Signature(8)),
                   "axil": In(AXI4LiteSignature(addr_width=8)), "w0": Out(AXIStreamSignature(64)),
                   "out": In(AXIStreamSignature(32)), "core_rst": Out(1), "timeouts": Out(16)}
        if self._board:
            members["board"] = Out(BoardPortSignature())
        super().__init__(members)

    @property
    def byte_timeout(self) -> int:
        return self._byte_timeout

    @property
    def has_board(self) -> bool:
        return self._board

    def elaborate(self, platform):
        m = Module()
        p = _Parser(m, self)
        self._framer(m, p)
        with m.FSM():
            p.idle_state()
            p.core_states()
            if self._board:
                p.board_states()
            with m.State("UNKNOWN"):
                p.reply(Const(REP_UNKNOWN, 8))
        return m

    def _framer(self, m, p):
        """The reply framer: a parser reply (priority) or an output word as an ``'o'`` frame, byte by byte."""
        out = self.out
        frame = Signal(48)
        left = Signal(range(7))
        m.d.comb += [self.tx.payload.eq(frame[:8]), self.tx.valid.eq(left != 0)]
        with m.If(self.tx.valid & self.tx.ready):
            m.d.sync += [frame.eq(frame[8:]), left.eq(left - 1)]
        with m.Elif(left == 0):
            with m.If(p.rep_valid):
                m.d.comb += p.rep_ack.eq(1)
                m.d.sync += [frame.eq(p.rep), left.eq(p.rep_len)]
            with m.Elif(out.tvalid):
                m.d.comb += out.tready.eq(1)
                m.d.sync += [frame.eq(Cat(Const(REP_OUTPUT, 8), out.tdata, out.tlast, Const(0, 7))),
                             left.eq(1 + REPLY_BYTES[REP_OUTPUT])]


class _Parser:
    """The command parser's registers and FSM states (:meth:`LinkBridge.elaborate` opens the FSM).

    Received bytes shift into ``sh`` from the top: after ``n`` bytes of a field they sit in
    ``sh[-8n:]``, the first lowest (:meth:`arg`). Results read back (register data, DRAM status and CRC)
    are kept in ``sh``'s top bits until the reply is queued."""

    def __init__(self, m: Module, bridge: LinkBridge):
        self.m, self.br = m, bridge
        board = bridge.has_board
        self.sh = Signal(72 if board else 64)            # 'T' has 9 argument bytes
        self.need = Signal(range(10))                     # bytes still to receive for the current field
        self.idle = Signal(range(bridge.byte_timeout + 1))
        self.beats = Signal(16)                           # 'S'/'L' beats left after the current one
        self.tlast = Signal()                             # 'S' flags bit 0
        self.to_dram = Signal()                           # the beats are an 'L''s
        self.rst_count = Signal(range(RESET_CYCLES + 1))
        self.rep = Signal(48 if board else 40)            # the reply's bytes, first byte lowest
        self.rep_len = Signal(range(7))
        self.rep_valid = Signal()
        self.rep_ack = Signal()

    def arg(self, n: int, offset: int, size: int):
        """Bytes ``offset .. offset + size`` of the last ``n`` bytes received (little-endian)."""
        base = len(self.sh) - 8 * n
        return self.sh[base + 8 * offset:base + 8 * (offset + size)]

    def result(self, size: int):
        """The top ``size`` bytes of ``sh``: where a reply's fields wait."""
        return self.sh[len(self.sh) - 8 * size:]

    def reply(self, *fields):
        """Queue the reply frame ``fields`` (opcode byte first) and go back to IDLE once it is taken."""
        m = self.m
        value = Cat(*fields)
        assert len(value) % 8 == 0 and len(value) <= len(self.rep)
        m.d.comb += [self.rep_valid.eq(1), self.rep.eq(value), self.rep_len.eq(len(value) // 8)]
        with m.If(self.rep_ack):
            m.next = "IDLE"

    def receive(self, then, abandon=None):
        """Take ``need`` bytes into ``sh`` (the state before sets ``need``), then go to ``then``. After
        ``byte_timeout`` cycles without a byte the command is abandoned: ``abandon()`` (default: to IDLE)."""
        m, br, need, idle = self.m, self.br, self.need, self.idle
        m.d.comb += br.rx.ready.eq(need != 0)
        with m.If(need == 0):
            m.next = then
        with m.Elif(br.rx.valid):
            m.d.sync += [self.sh.eq(Cat(self.sh[8:], br.rx.payload)), need.eq(need - 1), idle.eq(0)]
        with m.Elif(idle == br.byte_timeout):
            m.d.sync += [idle.eq(0), br.timeouts.eq(br.timeouts + 1)]
            if abandon is None:
                m.next = "IDLE"
            else:
                abandon()
        with m.Else():
            m.d.sync += idle.eq(idle + 1)

    def idle_state(self):
        """IDLE: take an opcode, set the count of its argument bytes, go to its first state."""
        m, br = self.m, self.br
        states = {OP_READ: "READ_ARGS", OP_WRITE: "WRITE_ARGS", OP_STREAM: "STREAM_ARGS"}
        if br.has_board:
            states.update({OP_BOARD_READ: "GET_ARGS", OP_BOARD_WRITE: "PUT_ARGS", OP_DRAM_WRITE: "LOAD_ARGS",
                           OP_DRAM_CRC: "CRC_ARGS", OP_TOKEN: "TOKEN_ARGS", OP_CTRL_READ: "CTRL_READ_ARGS",
                           OP_CTRL_WRITE: "CTRL_WRITE_ARGS"})
        with m.State("IDLE"):
            m.d.comb += br.rx.ready.eq(1)
            m.d.sync += self.idle.eq(0)
            with m.If(br.rx.valid):
                with m.Switch(br.rx.payload):
                    for op, state in states.items():
                        with m.Case(op):
                            m.d.sync += self.need.eq(COMMAND_BYTES[op])
                            m.next = state
                    with m.Case(OP_RESET):
                        m.d.sync += self.rst_count.eq(RESET_CYCLES)
                        m.next = "RESET"
                    with m.Default():
                        m.next = "UNKNOWN"

    def core_states(self):
        """'R', 'W', 'S' (and the beats of 'L'), 'X'."""
        m, br, bus, w0 = self.m, self.br, self.br.axil, self.br.w0
        aw_done, w_done = Signal(), Signal()

        with m.State("READ_ARGS"):
            self.receive("READ_AR")
        with m.State("READ_AR"):
            m.d.comb += [bus.araddr.eq(self.arg(1, 0, 1)), bus.arvalid.eq(1)]
            with m.If(bus.arready):
                m.next = "READ_R"
        with m.State("READ_R"):
            m.d.comb += bus.rready.eq(1)
            with m.If(bus.rvalid):
                m.d.sync += self.result(4).eq(bus.rdata)
                m.next = "READ_REPLY"
        with m.State("READ_REPLY"):
            self.reply(Const(REP_READ, 8), self.result(4))

        with m.State("WRITE_ARGS"):
            self.receive("WRITE_AW")
            m.d.sync += [aw_done.eq(0), w_done.eq(0)]
        with m.State("WRITE_AW"):
            m.d.comb += [bus.awaddr.eq(self.arg(5, 0, 1)), bus.awvalid.eq(~aw_done), bus.wdata.eq(self.arg(5, 1, 4)),
                         bus.wstrb.eq(0xF), bus.wvalid.eq(~w_done)]
            with m.If(bus.awvalid & bus.awready):
                m.d.sync += aw_done.eq(1)
            with m.If(bus.wvalid & bus.wready):
                m.d.sync += w_done.eq(1)
            with m.If((aw_done | bus.awready) & (w_done | bus.wready)):
                m.next = "WRITE_B"
        with m.State("WRITE_B"):
            m.d.comb += bus.bready.eq(1)
            with m.If(bus.bvalid):
                m.next = "WRITE_REPLY"
        with m.State("WRITE_REPLY"):
            self.reply(Const(REP_WRITE, 8))

        with m.State("STREAM_ARGS"):     # n-1 (2 bytes), flags (1 byte)
            self.receive("STREAM_SETUP")
        with m.State("STREAM_SETUP"):
            m.d.sync += [self.beats.eq(self.arg(3, 0, 2)), self.tlast.eq(self.arg(3, 2, 1)[0]),
                         self.need.eq(BEAT_BYTES)]
            if br.has_board:
                m.d.sync += self.to_dram.eq(0)
            m.next = "STREAM_DATA"
        with m.State("STREAM_DATA"):
            self.receive("STREAM_BEAT", self._abandon_beats if br.has_board else None)
        with m.State("STREAM_BEAT"):
            beat = self.arg(BEAT_BYTES, 0, BEAT_BYTES)
            m.d.comb += [w0.tdata.eq(beat), w0.tlast.eq((self.beats == 0) & self.tlast)]
            if br.has_board:     # an 'L''s beats go to the board's DRAM writer, an 'S''s to the core
                dd = br.board.dram_data
                m.d.comb += [dd.payload.eq(beat), dd.valid.eq(self.to_dram), w0.tvalid.eq(~self.to_dram)]
                taken = Mux(self.to_dram, dd.ready, w0.tready)
            else:
                m.d.comb += w0.tvalid.eq(1)
                taken = w0.tready
            with m.If(taken):
                with m.If(self.beats == 0):
                    m.next = "STREAM_REPLY"
                    if br.has_board:
                        with m.If(self.to_dram):
                            m.next = "LOAD_WAIT"
                with m.Else():
                    m.d.sync += [self.beats.eq(self.beats - 1), self.need.eq(BEAT_BYTES)]
                    m.next = "STREAM_DATA"
        with m.State("STREAM_REPLY"):
            self.reply(Const(REP_STREAM, 8))

        with m.State("RESET"):
            m.d.comb += br.core_rst.eq(1)
            m.d.sync += self.rst_count.eq(self.rst_count - 1)
            with m.If(self.rst_count == 1):
                m.next = "RESET_REPLY"
        with m.State("RESET_REPLY"):
            self.reply(Const(REP_RESET, 8))

    def _abandon_beats(self):
        """An 'L' abandoned among its beats completes its DRAM write with zero beats (LOAD_FLUSH); an 'S' just
        stops."""
        m = self.m
        with m.If(self.to_dram):
            m.next = "LOAD_FLUSH"
        with m.Else():
            m.next = "IDLE"

    def board_states(self):
        """'G', 'P', 'L', 'C', 'T', 'K', 'J' over the ``board`` port."""
        m, bp = self.m, self.br.board

        with m.State("GET_ARGS"):
            self.receive("GET")
        with m.State("GET"):
            m.d.comb += bp.reg_addr.eq(self.arg(1, 0, 1))
            m.d.sync += self.result(4).eq(bp.reg_rdata)
            m.next = "GET_REPLY"
        with m.State("GET_REPLY"):
            self.reply(Const(REP_BOARD_READ, 8), self.result(4))

        with m.State("PUT_ARGS"):
            self.receive("PUT")
        with m.State("PUT"):
            m.d.comb += [bp.reg_addr.eq(self.arg(5, 0, 1)), bp.reg_wdata.eq(self.arg(5, 1, 4)), bp.reg_we.eq(1)]
            m.next = "PUT_REPLY"
        with m.State("PUT_REPLY"):
            self.reply(Const(REP_BOARD_WRITE, 8))

        with m.State("LOAD_ARGS"):      # addr (4 bytes), n-1 (2 bytes)
            self.receive("LOAD_CMD")
        with m.State("LOAD_CMD"):
            n1 = self.arg(6, 4, 2)
            m.d.comb += [bp.dram_cmd.valid.eq(1), bp.dram_cmd.payload.write.eq(1),
                         bp.dram_cmd.payload.addr.eq(self.arg(6, 0, 4)),
                         bp.dram_cmd.payload.length.eq((n1 + 1) * BEAT_BYTES)]
            with m.If(bp.dram_cmd.ready):
                m.d.sync += [self.beats.eq(n1), self.tlast.eq(0), self.to_dram.eq(1), self.need.eq(BEAT_BYTES)]
                m.next = "STREAM_DATA"
        with m.State("LOAD_WAIT"):
            m.d.comb += bp.dram_done.ready.eq(1)
            with m.If(bp.dram_done.valid):
                m.d.sync += self.result(1).eq(bp.dram_done.payload.status)
                m.next = "LOAD_REPLY"
        with m.State("LOAD_REPLY"):
            self.reply(Const(REP_DRAM_WRITE, 8), self.result(1))
        with m.State("LOAD_FLUSH"):     # the rest of an abandoned 'L': zero beats, then no reply
            m.d.comb += [bp.dram_data.valid.eq(1), bp.dram_data.payload.eq(0)]
            with m.If(bp.dram_data.ready):
                m.d.sync += self.beats.eq(self.beats - 1)
                with m.If(self.beats == 0):
                    m.next = "LOAD_FLUSH_DONE"
        with m.State("LOAD_FLUSH_DONE"):
            m.d.comb += bp.dram_done.ready.eq(1)
            with m.If(bp.dram_done.valid):
                m.next = "IDLE"

        with m.State("CRC_ARGS"):       # addr (4 bytes), bytes (4 bytes)
            self.receive("CRC_CMD")
        with m.State("CRC_CMD"):
            m.d.comb += [bp.dram_cmd.valid.eq(1), bp.dram_cmd.payload.write.eq(0),
                         bp.dram_cmd.payload.addr.eq(self.arg(8, 0, 4)),
                         bp.dram_cmd.payload.length.eq(self.arg(8, 4, 4))]
            with m.If(bp.dram_cmd.ready):
                m.next = "CRC_WAIT"
        with m.State("CRC_WAIT"):
            m.d.comb += bp.dram_done.ready.eq(1)
            with m.If(bp.dram_done.valid):
                m.d.sync += self.result(5).eq(Cat(bp.dram_done.payload.crc, bp.dram_done.payload.status))
                m.next = "CRC_REPLY"
        with m.State("CRC_REPLY"):
            self.reply(Const(REP_DRAM_CRC, 8), self.result(5))

        with m.State("TOKEN_ARGS"):     # token (4 bytes), position (4 bytes), flags (1 byte)
            self.receive("TOKEN_CMD")
        with m.State("TOKEN_CMD"):
            m.d.comb += [bp.token.valid.eq(1), bp.token.payload.token.eq(self.arg(9, 0, 4)),
                         bp.token.payload.position.eq(self.arg(9, 4, 4)),
                         bp.token.payload.flags.eq(self.arg(9, 8, 1))]
            with m.If(bp.token.ready):
                m.next = "TOKEN_WAIT"
        with m.State("TOKEN_WAIT"):
            m.d.comb += bp.token_done.ready.eq(1)
            with m.If(bp.token_done.valid):
                m.d.sync += self.result(1).eq(bp.token_done.payload)
                m.next = "TOKEN_REPLY"
        with m.State("TOKEN_REPLY"):
            self.reply(Const(REP_TOKEN, 8), self.result(1))

        for write, n, rep in ((0, COMMAND_BYTES[OP_CTRL_READ], REP_CTRL_READ),
                              (1, COMMAND_BYTES[OP_CTRL_WRITE], REP_CTRL_WRITE)):
            name = "CTRL_WRITE" if write else "CTRL_READ"
            with m.State(f"{name}_ARGS"):    # addr (4 bytes)[, data (4 bytes)]
                self.receive(f"{name}_CMD")
            with m.State(f"{name}_CMD"):
                m.d.comb += [bp.ctrl_cmd.valid.eq(1), bp.ctrl_cmd.payload.write.eq(write),
                             bp.ctrl_cmd.payload.addr.eq(self.arg(n, 0, 4))]
                if write:
                    m.d.comb += bp.ctrl_cmd.payload.data.eq(self.arg(n, 4, 4))
                with m.If(bp.ctrl_cmd.ready):
                    m.next = f"{name}_WAIT"
            with m.State(f"{name}_WAIT"):
                m.d.comb += bp.ctrl_done.ready.eq(1)
                with m.If(bp.ctrl_done.valid):
                    res = bp.ctrl_done.payload
                    m.d.sync += self.result(5).eq(Cat(res.status, res.data))
                    m.next = f"{name}_REPLY"
            with m.State(f"{name}_REPLY"):   # 'k' status data / 'j' status
                self.reply(Const(rep, 8), self.result(5)[:8 * REPLY_BYTES[rep]])


def _uart_parts(m, *, divisor: int, fifo_depth: int, rx, tx, overflow, framing):
    """Add a :class:`UARTRx`, a receive FIFO of ``fifo_depth`` bytes and a :class:`UARTTx` to ``m`` (as
    ``uart_rx``, ``fifo``, ``uart_tx``), joined to the pins ``rx``/``tx`` and the flags ``overflow`` (sticky)
    and ``framing``. Returns (the FIFO's read stream: received bytes, the transmitter's ``i``: bytes to send)."""
    m.submodules.uart_rx = urx = UARTRx(divisor=divisor)
    m.submodules.uart_tx = utx = UARTTx(divisor=divisor)
    m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=8, depth=fifo_depth)
    m.d.comb += [urx.rx.eq(rx), tx.eq(utx.tx), framing.eq(urx.framing), q.w_data.eq(urx.data),
                 q.w_en.eq(urx.valid)]
    with m.If(urx.valid & ~q.w_rdy):
        m.d.sync += overflow.eq(1)
    return q.r_stream, utx.i


def _check_fifo_depth(fifo_depth):
    if not isinstance(fifo_depth, int) or isinstance(fifo_depth, bool) or fifo_depth < 16:
        raise ValueError(f"fifo_depth must be an integer >= 16, got {fifo_depth!r}")


class UARTPhy(wiring.Component):
    """The serial line as byte streams: :class:`UARTRx` into a receive FIFO, and :class:`UARTTx`.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (clock frequency / baud rate), >= 4.
    fifo_depth : int
        Receive FIFO bytes (:data:`~hw.boards.link_protocol.RX_FIFO_BYTES`; the host's window must fit in it).

    Attributes
    ----------
    rx : In(1), tx : Out(1)
        The serial lines (idle high).
    o : Out(stream.Signature(8))
        Received bytes, from the FIFO.
    i : In(stream.Signature(8))
        Bytes to send.
    overflow : Out(1)
        Sticky: a received byte found the FIFO full (the host broke the window; reset to clear).
    framing : Out(16)
        As :class:`UARTRx`.
    """

    rx: In(1, init=1)
    tx: Out(1, init=1)
    o: Out(stream.Signature(8))
    i: In(stream.Signature(8))
    overflow: Out(1)
    framing: Out(16)

    def __init__(self, *, divisor: int, fifo_depth: int = RX_FIFO_BYTES):
        _check_divisor(divisor)
        _check_fifo_depth(fifo_depth)
        self._divisor, self._fifo_depth = divisor, fifo_depth
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        received, send = _uart_parts(m, divisor=self._divisor, fifo_depth=self._fifo_depth, rx=self.rx,
                                     tx=self.tx, overflow=self.overflow, framing=self.framing)
        wiring.connect(m, received, wiring.flipped(self.o))
        wiring.connect(m, wiring.flipped(self.i), send)
        return m


class UARTLink(wiring.Component):
    """UART receiver, receive FIFO, a stream-only :class:`LinkBridge` and transmitter: the whole host link of a
    board without DRAM.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (clock frequency / baud rate), >= 4.
    fifo_depth : int
        Receive FIFO bytes (:data:`~hw.boards.link_protocol.RX_FIFO_BYTES`; the host's window must fit in it).
    byte_timeout : int
        See :class:`LinkBridge`.

    Attributes
    ----------
    rx : In(1), tx : Out(1)
        The serial lines.
    axil, w0, out, core_rst, timeouts
        As :class:`LinkBridge`.
    overflow : Out(1)
        Sticky: a received byte found the FIFO full (the host broke the window; reset to clear).
    framing : Out(16)
        As :class:`UARTRx`.
    """

    rx: In(1, init=1)
    tx: Out(1, init=1)
    axil: In(AXI4LiteSignature(addr_width=8))
    w0: Out(AXIStreamSignature(64))
    out: In(AXIStreamSignature(32))
    core_rst: Out(1)
    timeouts: Out(16)
    overflow: Out(1)
    framing: Out(16)

    def __init__(self, *, divisor: int, fifo_depth: int = RX_FIFO_BYTES, byte_timeout: int = 1 << 24):
        _check_divisor(divisor)
        _check_fifo_depth(fifo_depth)
        self._divisor, self._fifo_depth, self._byte_timeout = divisor, fifo_depth, byte_timeout
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        received, send = _uart_parts(m, divisor=self._divisor, fifo_depth=self._fifo_depth, rx=self.rx,
                                     tx=self.tx, overflow=self.overflow, framing=self.framing)
        m.submodules.bridge = br = LinkBridge(byte_timeout=self._byte_timeout)
        m.d.comb += [self.core_rst.eq(br.core_rst), self.timeouts.eq(br.timeouts)]
        wiring.connect(m, received, br.rx)
        wiring.connect(m, br.tx, send)
        wiring.connect(m, wiring.flipped(self.axil), br.axil)
        wiring.connect(m, wiring.flipped(self.w0), br.w0)
        wiring.connect(m, wiring.flipped(self.out), br.out)
        return m
