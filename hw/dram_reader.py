"""Streams a byte range of board DRAM out of a LiteDRAM native port: the model image into the weight channel.

:class:`DRAMImageReader` takes a request (base byte address, byte length), issues one read command per port
word, as fast as the controller accepts them, and delivers the bytes as beats of the weight channel's width,
with ``last`` on the final beat and full backpressure. A port word narrower than a beat (the ULX3S's 16 bits)
is packed into beats; a port word wider than a beat (the ECPIX-5 DDR3's 128 bits: two 64-bit beats) is split
into beats, the lower-addressed beat from the word's low bits, and a range that starts or ends mid-word
delivers only its own beats (the word's other beats are read and dropped). LiteDRAM's read data cannot be held back (the
crossbar ignores ``rdata.ready``: :class:`hw.dram.NativePortSignature`), so the reader reserves a slot in its
word FIFO for every read it issues: up to ``depth`` reads are outstanding or buffered at once (the same
reservation LiteDRAM's own ``LiteDRAMDMAReader`` makes, ``litedram/frontend/dma.py``), enough to keep
the bank machines' command queues (``cmd_buffer_depth``) and the read pipeline full on a sequential read.

A read that never returns does not hang the reader: after ``timeout`` cycles of waiting on the controller
(reads outstanding or a command offered, and neither a command accepted nor a word returned) it stops with
``error`` set.

Another user of the port (the DRAM board's state engine, :class:`hw.boards.dram_board.DRAMBoard`) takes it
from the reader with ``hold``: while ``hold`` is high the reader offers no command (the request goes on
where it stopped when ``hold`` falls), and once ``in_flight`` is low every word it asked for is in, so that
the port's read data belongs to the other user until ``hold`` falls.

An ``abort`` (the DRAM board's ``'X'``) ends the request at once, but the words of reads already taken by the
controller still come afterwards (the native port returns every read, in command order). The count of
outstanding reads therefore survives the abort: the reader drops exactly that many returning words, and
accepts the next request only once they are in, so that all the words a request receives are its own. Reads
that never come are given up after ``timeout`` cycles without a word (no ``error``: lost reads have already
timed out a request, or will time out the next one).
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, ResetInserter, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw.dram import NativePortSignature

__all__ = ["dram_request_layout", "beat_layout", "DRAMImageReader"]


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def check_port_widths(*, addr_width: int, port_width: int, beat_width: int, depth: int,
                      wider_port: bool = False) -> None:
    """The checks every DRAM stream adapter (:class:`DRAMImageReader`, :class:`hw.dram_writer.DRAMStreamWriter`)
    makes of its widths: a native port of ``port_width`` bits (a power-of-two number of bytes), beats of a
    power-of-two number of port words, a FIFO of ``depth`` >= 2 entries. With ``wider_port`` a port word of
    a power-of-two number of beats is allowed as well (``beat_width`` then a power-of-two multiple of 8).

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or out of range.
    """
    _int("addr_width", addr_width, 1)
    _int("port_width", port_width, 8)
    _int("beat_width", beat_width, 8)
    _int("depth", depth, 2)
    if port_width % 8 or port_width & (port_width - 1):
        raise ValueError(f"port_width must be a power-of-two multiple of 8, got {port_width}")
    if wider_port and port_width > beat_width:
        if beat_width % 8 or beat_width & (beat_width - 1):
            raise ValueError(f"beat_width must be a power-of-two multiple of 8, got {beat_width}")
        return
    if beat_width % port_width or (beat_width // port_width) & (beat_width // port_width - 1):
        raise ValueError(f"beat_width must be a power-of-two multiple of port_width ({port_width}), "
                         f"got {beat_width}")


def dram_request_layout(byte_addr_width: int) -> data.StructLayout:
    """A DRAM transfer request: ``base`` (byte address, ``byte_addr_width`` bits) and ``length`` (bytes,
    ``byte_addr_width + 1`` bits: the whole memory fits)."""
    return data.StructLayout({"base": byte_addr_width, "length": byte_addr_width + 1})


def beat_layout(beat_width: int) -> data.StructLayout:
    """A weight-channel beat: ``data`` (``beat_width`` bits; byte ``k`` of the beat, at byte address
    ``base + k`` of its position, in bits ``8k .. 8k+7``: little-endian, as AXI4-Stream orders ``tdata``) and
    ``last`` (the request's final beat)."""
    return data.StructLayout({"data": beat_width, "last": 1})


class DRAMImageReader(wiring.Component):
    """Reads ``length`` bytes from ``base`` through a native port and streams them as ``beat_width`` beats.

    Parameters
    ----------
    addr_width : int, >= 1
        The port's word address bits (24 for the ULX3S core).
    port_width : int
        The port's word bits (16 for the ULX3S core, 128 for the ECPIX-5's DDR3 core): a power-of-two number of
        bytes, dividing ``beat_width`` or a power-of-two multiple of it.
    beat_width : int
        Output beat bits (64: :class:`hw.top.Accelerator`'s default ``bus_bits``), a power-of-two number of
        bytes.
    depth : int, >= 2
        Reads that may be outstanding or buffered (the word FIFO's depth; default 64).
    timeout : int, >= 1
        Cycles of waiting on the controller before ``error`` (default 4096, 82 us at 50 MHz; a refresh
        costs about 10 cycles).

    Members
    -------
    req : In(stream.Signature(dram_request_layout(addr_width + log2(port_width / 8))))
        Accepted while idle and not in error. ``base``'s bits below :attr:`base_align` are ignored (reads
        start at its port word, or its beat of a wider word); ``length``'s bits below the beat are ignored
        (whole beats only). A length below one beat is accepted and delivers nothing.
    port : Out(NativePortSignature(addr_width=addr_width, data_width=port_width))
        To the controller's native port (reads only: ``cmd.we`` is 0, ``wdata`` idle).
    o : Out(stream.Signature(beat_layout(beat_width)))
        ``length // (beat_width / 8)`` beats: the bytes from ``base`` (rounded down to :attr:`base_align`)
        in order, byte ``k`` of a beat in bits ``8k ..`` (port word ``j`` of a beat in bits
        ``j * port_width ..``; beat ``j`` of a wider port word from its bits ``j * beat_width ..``);
        ``last`` on the final one. With a port word of ``n`` beats the reader issues
        ``ceil((first + beats) / n)`` reads (``first`` the beat of ``base`` in its word) and delivers a beat
        a cycle: one port word every ``n`` cycles is enough to keep ``o`` full.
    busy : Out(1)
        A request is in progress.
    error : Out(1)
        A read of a request timed out; the reader has stopped (no more commands or beats) until ``abort`` or
        reset.
    abort : In(1)
        While high: the request in progress ends (no more commands; ``busy`` and ``error`` clear, the word
        FIFO and the beat in progress are dropped) and ``req`` is refused. Reads the controller has taken and
        not answered stay counted: their words, whenever they come, are dropped, and ``req`` is refused
        until the last of them is in (or ``timeout`` cycles pass without one: they are taken as lost).
        The domain's own reset clears that count as well (the controller is reset with it).
    hold : In(1)
        While high: no read command is offered (``port.cmd.valid`` low; one offered and not yet taken is
        withdrawn), and the time-out counts only while reads are outstanding; reads the controller has
        already taken still return into the word FIFO, and are still timed. ``req``, ``o`` and ``abort`` work
        as usual; the request goes on where it stopped when ``hold`` falls.
    in_flight : Out(1)
        Reads taken by the controller and not yet answered (nor given up after an ``abort``). Low with
        ``hold`` high: the reader expects no ``rdata`` until ``hold`` falls, and the port may serve another
        user; ``rdata.valid`` must then stay low at the reader (a word that reached a request in progress
        would enter its FIFO as its own).

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or out of range.
    """

    def __init__(self, *, addr_width: int, port_width: int = 16, beat_width: int = 64, depth: int = 64,
                 timeout: int = 4096):
        check_port_widths(addr_width=addr_width, port_width=port_width, beat_width=beat_width, depth=depth,
                          wider_port=True)
        _int("timeout", timeout, 1)
        self._addr_width, self._port_width, self._beat_width = addr_width, port_width, beat_width
        self._depth, self._timeout = depth, timeout
        super().__init__({
            "req": In(stream.Signature(dram_request_layout(self.byte_addr_width))),
            "port": Out(NativePortSignature(addr_width=addr_width, data_width=port_width)),
            "o": Out(stream.Signature(beat_layout(beat_width))),
            "busy": Out(1),
            "error": Out(1),
            "abort": In(1),
            "hold": In(1),
            "in_flight": Out(1),
        })

    @property
    def byte_addr_width(self) -> int:
        return self._addr_width + ceil_log2(self._port_width // 8)

    @property
    def base_align(self) -> int:
        """The granularity of ``req.base`` in bytes: the port word (``port_width / 8``) when it divides the
        beat, else the beat (``beat_width / 8``)."""
        return min(self._port_width, self._beat_width) // 8

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def timeout(self) -> int:
        return self._timeout

    def elaborate(self, platform):
        m = Module()
        # the request's state (everything but the count of reads in flight) restarts on `abort`
        request = Module()
        outstanding = Signal(range(self._depth + 1))    # reads taken by the controller and not yet answered
        build = self._elaborate_wide if self._port_width > self._beat_width else self._elaborate_narrow
        gave_up = build(request, outstanding)
        m.submodules.request = ResetInserter(self.abort)(request)

        issued = self.port.cmd.valid & self.port.cmd.ready
        returned = self.port.rdata.valid & (outstanding != 0)
        with m.If(gave_up):
            m.d.sync += outstanding.eq(0)
        with m.Else():
            m.d.sync += outstanding.eq(outstanding + issued - returned)
        m.d.comb += self.in_flight.eq(outstanding != 0)
        return m

    def _elaborate_narrow(self, m: Module, outstanding: Signal) -> Signal:
        """A port word of a beat or less: ``ratio`` = ``beat_width / port_width`` words gathered into a beat.
        Builds the request's logic in ``m``; returns the time-out's ``gave_up`` (:meth:`_time_out`)."""
        ratio = self._beat_width // self._port_width
        word_shift = ceil_log2(self._port_width // 8)
        beat_shift = ceil_log2(self._beat_width // 8)
        words_width = self.byte_addr_width + 1 - word_shift + 1

        # one slot beyond the reservations: SyncFIFOBuffered's memory (depth - 1 entries) can refuse a write
        # while its output register is still loading (seen with depth 2); with depth 64 the memory is 64 deep
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=self._port_width, depth=self._depth + 1)

        addr = Signal(self._addr_width)
        to_issue = Signal(words_width)          # read commands still to issue
        beats_left = Signal(words_width)        # beats still to deliver
        credits = Signal(range(self._depth + 1), init=self._depth)  # free reservations in the FIFO
        stopped = Signal()
        busy = Signal()

        # request: accepted when idle with no read of an aborted request in flight
        m.d.comb += self.req.ready.eq(~busy & ~stopped & (outstanding == 0) & ~self.abort)
        with m.If(self.req.valid & self.req.ready):
            beats = self.req.payload.length >> beat_shift
            m.d.sync += [
                addr.eq(self.req.payload.base >> word_shift),
                to_issue.eq(beats * ratio),
                beats_left.eq(beats),
                busy.eq(beats != 0),
            ]

        issued, popped = self._issue_reads(m, fifo, busy=busy, stopped=stopped, to_issue=to_issue, credits=credits,
                                           addr=addr)

        # beats: gather `ratio` words, word j in bits j * port_width
        acc = Signal(self._beat_width)
        have = Signal(range(ratio))
        full = Signal()
        m.d.comb += [self.o.valid.eq(full & ~stopped), self.o.payload.data.eq(acc),
                     self.o.payload.last.eq(beats_left == 1),
                     fifo.r_en.eq((~full | self.o.ready) & ~stopped)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [full.eq(0), beats_left.eq(beats_left - 1)]
            with m.If(beats_left == 1):
                m.d.sync += busy.eq(0)
        with m.If(popped):
            m.d.sync += acc.word_select(have, self._port_width).eq(fifo.r_data)
            if ratio == 1:
                m.d.sync += full.eq(1)
            else:
                m.d.sync += have.eq(have + 1)
                with m.If(have == ratio - 1):
                    m.d.sync += [full.eq(1), have.eq(0)]

        m.d.comb += [self.busy.eq(busy), self.error.eq(stopped)]
        return self._time_out(m, busy=busy, stopped=stopped, outstanding=outstanding, issued=issued)

    def _issue_reads(self, m: Module, fifo, *, busy, stopped, to_issue, credits, addr) -> tuple:
        """The read path both widths share: one read command per port word while a FIFO reservation is free
        (``credits``) and ``hold`` is low, the returned words of the request into ``fifo`` (room reserved at
        issue, so ``w_rdy`` always holds; a word that comes while no request is in progress belongs to an
        aborted one and is dropped), and the reservation count. Returns ``(issued, popped)``: a command taken, a
        word taken from ``fifo``, this cycle."""
        # commands: one read per word while a reservation is free and the port is not held
        cmd = self.port.cmd
        m.d.comb += [cmd.valid.eq(busy & ~stopped & (to_issue != 0) & (credits != 0) & ~self.abort & ~self.hold),
                     cmd.payload.we.eq(0), cmd.payload.addr.eq(addr)]
        issued = cmd.valid & cmd.ready
        with m.If(issued):
            m.d.sync += [addr.eq(addr + 1), to_issue.eq(to_issue - 1)]

        # returned words into the FIFO (room reserved at issue, so w_rdy always holds here); a request is accepted
        # only with no read outstanding, so while one is in progress every word is its own
        rdata = self.port.rdata
        m.d.comb += [fifo.w_data.eq(rdata.payload), fifo.w_en.eq(rdata.valid & busy & ~stopped)]
        popped = fifo.r_en & fifo.r_rdy
        m.d.sync += credits.eq(credits - issued + popped)
        return issued, popped

    def _time_out(self, m: Module, *, busy, stopped, outstanding, issued) -> Signal:
        """The time-out both widths share: ``timeout`` cycles of waiting on the controller (reads outstanding
        or a command offered; a command held back by ``hold`` is not offered) with neither a command taken nor
        a word returned. During a request it sets ``stopped``; with no request in progress (the reads of an
        aborted request, which never came) the returned ``gave_up`` is high for a cycle, and the caller clears
        the outstanding count."""
        cmd, rdata = self.port.cmd, self.port.rdata
        wait = Signal(range(self._timeout + 1))
        gave_up = Signal()
        waiting = (outstanding != 0) | cmd.valid
        with m.If(~waiting | issued | rdata.valid):
            m.d.sync += wait.eq(0)
        with m.Elif(wait == self._timeout - 1):
            with m.If(busy):
                m.d.sync += stopped.eq(1)
            with m.Else():
                m.d.comb += gave_up.eq(1)
        with m.Else():
            m.d.sync += wait.eq(wait + 1)
        return gave_up

    def _elaborate_wide(self, m: Module, outstanding: Signal) -> Signal:
        """A port word of ``n`` = ``port_width / beat_width`` beats: whole words read, split into beats.

        The request, the read commands, the reservations and the time-out are the narrow path's; the FIFO
        holds whole port words and its head word is delivered a beat at a time from beat ``first`` (the
        request's base within its word) to the word's last beat or the request's last beat, then popped.
        Builds the request's logic in ``m``; returns the time-out's ``gave_up`` (:meth:`_time_out`)."""
        n = self._port_width // self._beat_width
        word_shift = ceil_log2(self._port_width // 8)
        beat_shift = ceil_log2(self._beat_width // 8)
        beats_width = self.byte_addr_width + 1 - beat_shift + 1
        words_width = self.byte_addr_width + 1 - word_shift + 2

        # one slot beyond the reservations, as in the narrow path
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=self._port_width, depth=self._depth + 1)

        addr = Signal(self._addr_width)
        to_issue = Signal(words_width)          # read commands still to issue
        beats_left = Signal(beats_width)        # beats still to deliver
        pos = Signal(range(n))                  # the beat of the FIFO's head word delivered next
        credits = Signal(range(self._depth + 1), init=self._depth)  # free reservations in the FIFO
        stopped = Signal()
        busy = Signal()

        # request: accepted when idle with no read of an aborted request in flight; the words that hold beats
        # first .. first + beats - 1 of the first word
        m.d.comb += self.req.ready.eq(~busy & ~stopped & (outstanding == 0) & ~self.abort)
        with m.If(self.req.valid & self.req.ready):
            first = self.req.payload.base[beat_shift:word_shift]
            beats = self.req.payload.length >> beat_shift
            m.d.sync += [
                addr.eq(self.req.payload.base >> word_shift),
                to_issue.eq(Mux(beats == 0, 0, (first + beats + n - 1) >> (word_shift - beat_shift))),
                beats_left.eq(beats),
                pos.eq(first),
                busy.eq(beats != 0),
            ]

        issued, popped = self._issue_reads(m, fifo, busy=busy, stopped=stopped, to_issue=to_issue, credits=credits,
                                           addr=addr)

        # beats: beat `pos` of the head word (beat j in bits j * beat_width); the word leaves after its last
        # beat or the request's
        last = beats_left == 1
        sent = self.o.valid & self.o.ready
        m.d.comb += [self.o.valid.eq(fifo.r_rdy & ~stopped),
                     self.o.payload.data.eq(fifo.r_data.word_select(pos, self._beat_width)),
                     self.o.payload.last.eq(last),
                     fifo.r_en.eq(sent & ((pos == n - 1) | last))]
        with m.If(sent):
            m.d.sync += [beats_left.eq(beats_left - 1), pos.eq(pos + 1)]   # wraps at n, a power of two
            with m.If(last):
                m.d.sync += busy.eq(0)

        m.d.comb += [self.busy.eq(busy), self.error.eq(stopped)]
        return self._time_out(m, busy=busy, stopped=stopped, outstanding=outstanding, issued=issued)
