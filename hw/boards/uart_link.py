"""A UART host link for boards without a DMA engine: register reads and writes, the weight stream in and
the output stream back, over one 8N1 serial line (the FTDI bridge of the ULX3S and ECPIX-5 boards).

Protocol (bytes, multi-byte fields little-endian). Every command starts with an opcode byte and gets
exactly one reply frame; output frames of the core's ``m_axis_out`` stream are interleaved with the
replies whenever the core emits words (the host tells them apart by the first byte, each frame's length
is fixed by it):

=============================  ==========================================  ====================================
host -> board                  meaning                                     board -> host
=============================  ==========================================  ====================================
``'R'`` addr:u8                AXI4-Lite read of the register at addr      ``'r'`` data:u32
``'W'`` addr:u8 data:u32       AXI4-Lite write                             ``'w'``
``'S'`` n-1:u16 flags:u8       n beats of 8 bytes to ``s_axis_w0``          ``'s'`` once the n-th beat left
  then 8*n bytes               (flags bit 0: ``tlast`` on the n-th beat)   the link (``w0`` took it)
``'X'``                        reset the core (16 cycles, registers and    ``'x'``
                               state included); the link itself stays
other                          ignored                                     ``'?'``
(core output word)                                                         ``'o'`` data:u32 flags:u8
                                                                           (flags bit 0: ``tlast``)
=============================  ==========================================  ====================================

Received bytes go through a FIFO (:data:`RX_FIFO_BYTES`): the host keeps at most that many stream bytes
unacknowledged (:data:`CHUNK_BEATS` beats per ``'S'`` and :data:`WINDOW_CHUNKS` chunks in flight), so
the FIFO never overflows even while the core stalls the stream (an overflow still sets a sticky flag,
``overflow``). A command whose bytes stop arriving for ``byte_timeout`` cycles is abandoned (the parser
returns to idle, ``timeouts`` counts it): a host that gave up mid-command resynchronises by waiting for
longer than that and flushing its input.

UART (8N1, LSB first): the receiver synchronises ``rx`` through two flip-flops, samples each bit at its
middle (``divisor`` clock cycles per bit) and drops bytes without a stop bit (counted in ``framing``).
"""

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from hw.regs import AXI4LiteSignature
from hw.top import AXIStreamSignature

__all__ = ["UARTRx", "UARTTx", "LinkBridge", "UARTLink", "OP_READ", "OP_WRITE", "OP_STREAM", "OP_RESET",
           "REP_READ", "REP_WRITE", "REP_STREAM", "REP_RESET", "REP_UNKNOWN", "REP_OUTPUT", "REPLY_BYTES",
           "RX_FIFO_BYTES", "CHUNK_BEATS", "WINDOW_CHUNKS", "BEAT_BYTES"]

OP_READ, OP_WRITE, OP_STREAM, OP_RESET = b"R"[0], b"W"[0], b"S"[0], b"X"[0]
REP_READ, REP_WRITE, REP_STREAM, REP_RESET, REP_UNKNOWN, REP_OUTPUT = (b"r"[0], b"w"[0], b"s"[0], b"x"[0],
                                                                      b"?"[0], b"o"[0])
#: bytes of each reply frame after its first byte
REPLY_BYTES = {REP_READ: 4, REP_WRITE: 0, REP_STREAM: 0, REP_RESET: 0, REP_UNKNOWN: 0, REP_OUTPUT: 5}
#: bytes of one stream beat (the weight channel's 64-bit ``tdata``)
BEAT_BYTES = 8
#: receive FIFO (two DP16KD block RAMs hold 4096 bytes each on ECP5)
RX_FIFO_BYTES = 8192
#: beats per 'S' command the host sends, and chunks it keeps unacknowledged: 8 * (4 + 8 * 127) <= 8192
CHUNK_BEATS = 127
WINDOW_CHUNKS = 8
_RESET_CYCLES = 16


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


class LinkBridge(wiring.Component):
    """The command parser and reply framer of the protocol in this module's docstring.

    Parameters
    ----------
    byte_timeout : int
        Clock cycles a command may wait for its next byte before it is abandoned.

    Attributes
    ----------
    rx : In(stream.Signature(8))
        Received bytes (from the FIFO).
    tx : Out(stream.Signature(8))
        Bytes to send.
    axil : In(AXI4LiteSignature(addr_width=8))
        AXI4-Lite manager (connect to the core's ``s_axil``).
    w0 : Out(AXIStreamSignature(64))
        Weight stream, sent (connect to the core's ``s_axis_w0``).
    out : In(AXIStreamSignature(32))
        Output stream, received (connect to the core's ``m_axis_out``).
    core_rst : Out(1)
        High for 16 cycles on ``'X'``.
    timeouts : Out(16)
        Commands abandoned for lack of bytes (wraps).
    """

    rx: In(stream.Signature(8))
    tx: Out(stream.Signature(8))
    axil: In(AXI4LiteSignature(addr_width=8))
    w0: Out(AXIStreamSignature(64))
    out: In(AXIStreamSignature(32))
    core_rst: Out(1)
    timeouts: Out(16)

    def __init__(self, *, byte_timeout: int = 1 << 24):
        if not isinstance(byte_timeout, int) or isinstance(byte_timeout, bool) or byte_timeout < 16:
            raise ValueError(f"byte_timeout must be an integer >= 16 cycles, got {byte_timeout!r}")
        self._byte_timeout = byte_timeout
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        bus, w0, out = self.axil, self.w0, self.out

        # ---------------- reply framer: a parser reply (priority) or a core output word, sent byte by byte
        rep = Signal(40)            # the reply's bytes, first byte lowest
        rep_len = Signal(range(7))
        rep_valid = Signal()
        rep_ack = Signal()
        frame = Signal(48)
        left = Signal(range(7))
        m.d.comb += [self.tx.payload.eq(frame[:8]), self.tx.valid.eq(left != 0)]
        with m.If(self.tx.valid & self.tx.ready):
            m.d.sync += [frame.eq(frame[8:]), left.eq(left - 1)]
        with m.Elif(left == 0):
            with m.If(rep_valid):
                m.d.comb += rep_ack.eq(1)
                m.d.sync += [frame.eq(rep), left.eq(rep_len)]
            with m.Elif(out.tvalid):
                m.d.comb += out.tready.eq(1)
                m.d.sync += [frame.eq(Cat(Const(REP_OUTPUT, 8), out.tdata, out.tlast, Const(0, 7))), left.eq(6)]

        # ---------------- command parser
        sh = Signal(64)             # received bytes shift in from the top: after n bytes they sit in sh[64-8n:]
        need = Signal(range(9))     # bytes still to receive for the current field
        idle = Signal(range(self._byte_timeout + 1))
        opcode = Signal(8)
        beats = Signal(16)          # beats left after the current one
        flags = Signal(8)
        rst_count = Signal(range(_RESET_CYCLES + 1))
        aw_done, w_done = Signal(), Signal()

        def reply(*fields, length):
            m.d.comb += [rep_valid.eq(1), rep.eq(Cat(*fields)), rep_len.eq(length)]
            with m.If(rep_ack):
                m.next = "IDLE"

        def receive(then):
            """Take ``need`` bytes into ``sh`` (the state before sets ``need``), then go to ``then``."""
            m.d.comb += self.rx.ready.eq(need != 0)
            with m.If(need == 0):
                m.next = then
            with m.Elif(self.rx.valid):
                m.d.sync += [sh.eq(Cat(sh[8:], self.rx.payload)), need.eq(need - 1), idle.eq(0)]
            with m.Elif(idle == self._byte_timeout):
                m.d.sync += [idle.eq(0), self.timeouts.eq(self.timeouts + 1)]
                m.next = "IDLE"
            with m.Else():
                m.d.sync += idle.eq(idle + 1)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.rx.ready.eq(1)
                m.d.sync += idle.eq(0)
                with m.If(self.rx.valid):
                    m.d.sync += opcode.eq(self.rx.payload)
                    with m.Switch(self.rx.payload):
                        with m.Case(OP_READ):
                            m.d.sync += need.eq(1)
                            m.next = "READ_ARGS"
                        with m.Case(OP_WRITE):
                            m.d.sync += need.eq(5)
                            m.next = "WRITE_ARGS"
                        with m.Case(OP_STREAM):
                            m.d.sync += need.eq(3)
                            m.next = "STREAM_ARGS"
                        with m.Case(OP_RESET):
                            m.d.sync += rst_count.eq(_RESET_CYCLES)
                            m.next = "RESET"
                        with m.Default():
                            m.next = "UNKNOWN"

            with m.State("READ_ARGS"):
                receive("READ_AR")
            with m.State("READ_AR"):
                m.d.comb += [bus.araddr.eq(sh[56:64]), bus.arvalid.eq(1)]
                with m.If(bus.arready):
                    m.next = "READ_R"
            with m.State("READ_R"):
                m.d.comb += bus.rready.eq(1)
                with m.If(bus.rvalid):
                    m.d.sync += sh[32:].eq(bus.rdata)
                    m.next = "READ_REPLY"
            with m.State("READ_REPLY"):
                reply(Const(REP_READ, 8), sh[32:], length=5)

            with m.State("WRITE_ARGS"):
                receive("WRITE_AW")
                m.d.sync += [aw_done.eq(0), w_done.eq(0)]
            with m.State("WRITE_AW"):    # address sh[24:32], data sh[32:64]
                m.d.comb += [bus.awaddr.eq(sh[24:32]), bus.awvalid.eq(~aw_done), bus.wdata.eq(sh[32:]),
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
                reply(Const(REP_WRITE, 8), length=1)

            with m.State("STREAM_ARGS"):    # n-1 in sh[40:56], flags in sh[56:64]
                receive("STREAM_SETUP")
            with m.State("STREAM_SETUP"):
                m.d.sync += [beats.eq(sh[40:56]), flags.eq(sh[56:64]), need.eq(8)]
                m.next = "STREAM_DATA"
            with m.State("STREAM_DATA"):
                receive("STREAM_BEAT")
            with m.State("STREAM_BEAT"):
                m.d.comb += [w0.tdata.eq(sh), w0.tvalid.eq(1), w0.tlast.eq((beats == 0) & flags[0])]
                with m.If(w0.tready):
                    with m.If(beats == 0):
                        m.next = "STREAM_REPLY"
                    with m.Else():
                        m.d.sync += [beats.eq(beats - 1), need.eq(8)]
                        m.next = "STREAM_DATA"
            with m.State("STREAM_REPLY"):
                reply(Const(REP_STREAM, 8), length=1)

            with m.State("RESET"):
                m.d.comb += self.core_rst.eq(1)
                m.d.sync += rst_count.eq(rst_count - 1)
                with m.If(rst_count == 1):
                    m.next = "RESET_REPLY"
            with m.State("RESET_REPLY"):
                reply(Const(REP_RESET, 8), length=1)

            with m.State("UNKNOWN"):
                reply(Const(REP_UNKNOWN, 8), length=1)
        return m


class UARTLink(wiring.Component):
    """UART receiver, receive FIFO, :class:`LinkBridge` and transmitter: the whole host link.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (clock frequency / baud rate), >= 4.
    fifo_depth : int
        Receive FIFO bytes (:data:`RX_FIFO_BYTES`; the host's window must fit in it).
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
        if not isinstance(fifo_depth, int) or fifo_depth < 16:
            raise ValueError(f"fifo_depth must be an integer >= 16, got {fifo_depth!r}")
        self._divisor, self._fifo_depth, self._byte_timeout = divisor, fifo_depth, byte_timeout
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.uart_rx = urx = UARTRx(divisor=self._divisor)
        m.submodules.uart_tx = utx = UARTTx(divisor=self._divisor)
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=8, depth=self._fifo_depth)
        m.submodules.bridge = br = LinkBridge(byte_timeout=self._byte_timeout)
        m.d.comb += [urx.rx.eq(self.rx), self.tx.eq(utx.tx), self.framing.eq(urx.framing),
                     self.core_rst.eq(br.core_rst), self.timeouts.eq(br.timeouts)]
        m.d.comb += [q.w_data.eq(urx.data), q.w_en.eq(urx.valid)]
        with m.If(urx.valid & ~q.w_rdy):
            m.d.sync += self.overflow.eq(1)
        wiring.connect(m, q.r_stream, br.rx)
        wiring.connect(m, br.tx, utx.i)
        wiring.connect(m, wiring.flipped(self.axil), br.axil)
        wiring.connect(m, wiring.flipped(self.w0), br.w0)
        wiring.connect(m, wiring.flipped(self.out), br.out)
        return m
