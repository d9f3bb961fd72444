"""The DRAM boards' gateware between the link's bytes and the DRAM's native port: the model and its embedding
table live in board DRAM, and the link carries tokens, not vectors (issue 22; docs/DRAM.md).

:class:`DRAMBoard` joins, in one clock domain:

- :class:`hw.boards.uart_link.LinkBridge` (``board=True``): the link protocol of
  :mod:`hw.boards.link_protocol` on byte streams (``rx``/``tx``; the board top puts
  :class:`hw.boards.uart_link.UARTPhy` in front);
- the board registers (:class:`~hw.boards.link_protocol.BoardReg`, ``'G'``/``'P'``);
- the DRAM engine (``'L'``, ``'C'``): :class:`hw.dram_writer.DRAMStreamWriter` for ``'L'``'s beats
  (:class:`hw.dram_wide_writer.DRAMWideWriter`, with byte enables, on a port wider than a beat), and
  :class:`hw.dram_reader.DRAMImageReader` into a CRC-32 (``zlib.crc32``'s, 64 bits a beat) for ``'C'``;
- the control-bus engine (``'K'``, ``'J'``): one Wishbone access of the DRAM controller's CSRs (``ctrl``, to
  :class:`hw.dram.LiteDRAMCore`'s ``ctrl``) per command, refused while the power-up sequencer owns the bus and
  abandoned after ``ctrl_timeout`` cycles without ``ack``; and the port enable (``BoardReg.PORT_ENABLE``,
  ``port_enable``) of a board built with ``hold_port`` (a DRAM that needs read leveling);
- the token engine (``'T'``): :class:`hw.token_builder.TokenBuilder` makes the token packet from the
  embedding row in DRAM, then the reader streams the image ``[IMAGE_BASE, IMAGE_BASE + IMAGE_BYTES)``; both
  go into the core's channel 0, and the core's output packets come back through
  :class:`hw.argmax_tap.ArgmaxTap` (the whole packet for a token with ``TokenFlags.LOGITS``, else
  its (position, argmax, flags) summary);
- the core (:class:`hw.top.Accelerator`), behind FIFOs on both streams
  (:func:`hw.boards.uart_link.stream_register`: :data:`W0_FIFO_DEPTH` entries on the weight stream, one on the
  output) and a registered core reset, as on the boards without DRAM (:class:`hw.boards.ecp5.LinkedCore`);
- with a build's ``state_in_dram``, the state engine (:class:`StateEngine`): the core's recurrent-state row
  transfers (``state_cmd``, ``m_axis_state``, ``s_axis_state``; :class:`hw.state_cache.StateCache`), one
  command at a time, in order. Row ``(bank, layer)`` lies at byte ``StateGeometry.base(DRAM_BYTES) +
  StateGeometry.offset(bank, layer)`` (:class:`hw.state_cache.StateGeometry`: a region at the top of the
  DRAM; the int32 row little-endian, as the host reads it). A write-back's beats go to the writer, and the
  command ends only once the controller has taken every word, so that a later fill of the row reads what
  was written; a fill's row comes through a second reader (the image reader streams the image meanwhile).

One reader and one writer share the one native port: the bridge runs one command at a time, so at most one
of them is active (the writer owns the port during an ``'L'``, the reader otherwise). With the state engine,
the image reader streams ahead during a token while the core swaps state rows: before each of its commands the
engine holds the image reader (``DRAMImageReader.hold``: no new read), waits until its reads in flight are
in, and then owns the port (commands from the writer or the state reader, read data to the state reader)
until the command ends; the image request then goes on where it stopped. A ``'T'`` replies only once the
engine is idle, so the token's last write-back is in DRAM before the next command; an ``'L'`` waits for a
transfer in progress (one an ``'S'`` stream's core asked for), and the engine waits for an ``'L'``.
A state read that times out, or a write-back that waits on the controller ``dram_timeout`` cycles without
progress, ends the token with ``READ_TIMEOUT`` and stops the engine (``BoardStatus.READER_ERROR``; the next
``'T'`` is refused with ``READ_TIMEOUT``) until ``'X'``, which resets the engine and aborts its reader as it
does the image reader's. The image must end below the state region (else ``NO_IMAGE``); the host keeps the
embedding table below it too.

The port's word may be narrower than the link's and the core's 64-bit beat (the ULX3S SDRAM's 16 bits: four
words a beat) or wider (the ECPIX-5 DDR3's 128 bits: two beats a word). The DRAM is byte-addressed either
way, little-endian: byte ``a`` is byte ``a mod (port_width / 8)`` of word ``a // (port_width / 8)``, so an
image or a table lands at the same byte addresses whatever the port. On a wide port the reader splits words
into beats and the writer sets byte enables, so ranges at 8-byte boundaries that are not word boundaries
read and write only their own bytes.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import crc, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped
from amaranth.utils import ceil_log2

from hw.argmax_tap import ArgmaxTap
from hw.boards.link_protocol import (
    BOARD_MAGIC,
    CTRL_BYTES,
    LINK_VERSION,
    BoardReg,
    BoardStatus,
    CtrlStatus,
    DramStatus,
    TokenFlags,
    TokenStatus,
)
from hw.boards.uart_link import LinkBridge, stream_register
from hw.dram import NativePortSignature
from hw.dram_init import WishboneSignature
from hw.dram_reader import DRAMImageReader, beat_layout, dram_request_layout
from hw.dram_wide_writer import DRAMWideWriter
from hw.dram_writer import DRAMStreamWriter
from hw.isa import REGISTER_MAP, Status, register_base
from hw.params import BuildParams
from hw.state_cache import STATE_BEAT_BITS, StateCmd, StateGeometry, state_beats
from hw.streams import AXIStreamSignature
from hw.token_builder import TokenBuilder

__all__ = ["DRAMBoard", "StateEngine"]

BEAT_BITS = 64
#: entries of the weight stream's FIFO between the token engine and the core. A one-entry FIFO (a register with
#: a registered ``ready``) passes a beat every other cycle; a deeper one can pass a beat every cycle, which a
#: port wider than the beat can supply (the ECPIX-5's 128-bit DDR3 port: two beats a word). Three are the fewest
#: that keep it: ``SyncFIFOBuffered`` puts ``depth - 1`` entries before its output register, and one entry there
#: cannot be written and read in one cycle (two entries still pass a beat every other cycle: measured by
#: ``tests/hw/test_dram_board.py::test_weights_reach_the_core_a_beat_a_cycle``).
W0_FIFO_DEPTH = 3
#: the core's ``STATUS`` on its AXI4-Lite port, which the token engine reads at a token's end
STATUS_ADDR = register_base("ecp5") + REGISTER_MAP.STATUS
#: ``Status.ERROR``'s bit in that register
ERROR_BIT = Status.ERROR.value.bit_length() - 1


def _int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be in [{low}, {high if high is not None else 'inf'}], got {value}")
    return value


class DRAMBoard(wiring.Component):
    """The link, the board registers, the DRAM and token engines and the core of a DRAM board.

    Parameters
    ----------
    build : hw.params.BuildParams
        The core's build (``channels`` 1, ``bus_bits`` 64: the link's and the reader's beats).
    addr_width : int
        The native port's word address bits (24 on the ULX3S: 16 M words; 25 on the ECPIX-5: 32 M words).
    port_width : int
        The native port's word bits (16 on the ULX3S, 128 on the ECPIX-5's DDR3: one BL8 burst of its x16
        chip), a power-of-two number of bytes: a divisor of the 64-bit beat or a multiple of it.
    clock_hz : int
        The board clock, Hz (``BoardReg.CLOCK_HZ``; the core and the controller run at it).
    byte_timeout : int
        :class:`~hw.boards.uart_link.LinkBridge`'s, clock cycles.
    core : wiring.Component, optional
        The core (default ``hw.top.Accelerator(build)``); a stand-in needs its members ``s_axil``,
        ``s_axis_w0`` (64 bits), ``m_axis_out`` (32 bits) and ``irq``, and a ``'T'`` replies only once
        ``irq`` is high after its image went in, with ``STATUS`` (:class:`hw.isa.Status`) saying done or error,
        and (with ``state_in_dram``) the state engine idle with no command offered; with ``build.state_in_dram``
        also ``state_cmd``, ``m_axis_state`` and ``s_axis_state`` (:class:`hw.top.Accelerator`'s).
    dram_timeout : int
        Cycles of waiting on the controller without progress before a read (the readers' ``timeout``) or a
        write gives up (``DramStatus.TIMEOUT``, ``TokenStatus.READ_TIMEOUT``; default 4096, 82 us at 50 MHz).
    reader_depth : int
        The readers' outstanding reads (:class:`~hw.dram_reader.DRAMImageReader`'s ``depth``; the image reader's
        and, with ``state_in_dram``, the state reader's).
    hold_port : bool
        The DRAM needs read leveling (the ECPIX-5's DDR3; build :class:`hw.dram.LiteDRAMCore` with
        ``hold_port=True`` too): ``port_enable`` is low after configuration until the host writes 1 to
        ``BoardReg.PORT_ENABLE``, and until then no DRAM command runs (``DramStatus.NOT_READY``,
        ``TokenStatus.NOT_READY``). Default False (the ULX3S's SDRAM): ``port_enable`` is 1 and
        ``PORT_ENABLE`` reads 1 and ignores writes.
    ctrl_timeout : int
        Cycles a ``'K'``/``'J'`` access waits for ``ctrl.ack`` before it is abandoned (``CtrlStatus.TIMEOUT``;
        default 1024).

    Members
    -------
    rx : In(stream.Signature(8))
        Received link bytes (from the UART's FIFO).
    tx : Out(stream.Signature(8))
        Link bytes to send.
    port : Out(hw.dram.NativePortSignature(addr_width=addr_width, data_width=port_width))
        To :class:`hw.dram.LiteDRAMCore`'s ``port``.
    dram_ready, dram_error : In(1)
        The controller's ``init_done`` and ``init_error`` (``BoardStatus``; no DRAM command runs before
        ``dram_ready``: ``DramStatus.NOT_READY``).
    rx_overflow : In(1)
        The UART's sticky receive-overflow flag (``BoardStatus.RX_OVERFLOW``).
    framing : In(16)
        The UART's count of bytes without a stop bit (``BoardReg.LINK_FRAMING``).
    irq : Out(1)
        The core's interrupt (token done or error, a level).
    ctrl : Out(hw.dram_init.WishboneSignature())
        To :class:`hw.dram.LiteDRAMCore`'s ``ctrl`` (the controller's CSRs; word addresses).
    port_enable : Out(1)
        To :class:`hw.dram.LiteDRAMCore`'s ``port_enable`` (a core built with ``hold_port``).

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or out of range (a build with another channel count or bus width,
        a ``port_width`` that is neither a power-of-two divisor nor a power-of-two multiple of 64, a DRAM of
        4 GiB or more, with ``state_in_dram`` a DRAM smaller than the state region or a core without the state
        ports).
    """

    def __init__(self, *, build: BuildParams, addr_width: int = 24, port_width: int = 16, clock_hz: int,
                 byte_timeout: int = 1 << 24, core: wiring.Component | None = None, dram_timeout: int = 4096,
                 reader_depth: int = 64, hold_port: bool = False, ctrl_timeout: int = 1024):
        if not isinstance(build, BuildParams):
            raise TypeError(f"build must be a hw.params.BuildParams, got {build!r}")
        if build.channels != 1 or build.bus_bits != BEAT_BITS:
            raise ValueError(f"a DRAM board feeds one {BEAT_BITS}-bit weight channel: channels=1, bus_bits=64, "
                             f"got channels={build.channels}, bus_bits={build.bus_bits}")
        _int("addr_width", addr_width, 1)
        _int("port_width", port_width, 8)
        if port_width % 8 or port_width & (port_width - 1):
            raise ValueError(f"port_width must be a power-of-two number of bytes: a divisor of the {BEAT_BITS}-bit "
                             f"beat (8, 16, 32, 64) or a power-of-two multiple of it (128, 256, ...), got "
                             f"{port_width}")
        if (1 << addr_width) * (port_width // 8) >= 1 << 32:
            raise ValueError(f"a DRAM of 2**{addr_width} words of {port_width} bits does not fit DRAM_BYTES "
                             "(32 bits)")
        _int("clock_hz", clock_hz, 1, (1 << 32) - 1)
        _int("dram_timeout", dram_timeout, 1)
        _int("reader_depth", reader_depth, 2)
        _int("ctrl_timeout", ctrl_timeout, 1)
        if not isinstance(hold_port, bool):
            raise TypeError(f"hold_port must be a bool, not {hold_port!r}")
        self._hold_port, self._ctrl_timeout = hold_port, ctrl_timeout
        self._build, self._addr_width, self._port_width = build, addr_width, port_width
        self._clock_hz, self._byte_timeout = clock_hz, byte_timeout
        self._dram_timeout, self._reader_depth = dram_timeout, reader_depth
        #: the image must end here: below the state region at the top of the DRAM (ValueError if it does not fit)
        self._image_limit = self.dram_bytes
        if build.state_in_dram:
            self._image_limit = StateGeometry(build.max_hidden, build.max_layers).base(self.dram_bytes)
        if core is None:
            from hw.top import Accelerator

            core = Accelerator(build)
        elif build.state_in_dram and not all(hasattr(core, n) for n in ("state_cmd", "m_axis_state",
                                                                        "s_axis_state")):
            raise TypeError("a build with state_in_dram needs a core with state_cmd, m_axis_state and "
                            f"s_axis_state, got {core!r}")
        self._core = core
        super().__init__({
            "rx": In(stream.Signature(8)), "tx": Out(stream.Signature(8)),
            "port": Out(NativePortSignature(addr_width=addr_width, data_width=port_width)),
            "dram_ready": In(1), "dram_error": In(1), "rx_overflow": In(1), "framing": In(16),
            "irq": Out(1), "ctrl": Out(WishboneSignature()), "port_enable": Out(1),
        })

    @property
    def build(self) -> BuildParams:
        return self._build

    @property
    def core(self) -> wiring.Component:
        return self._core

    @property
    def hold_port(self) -> bool:
        return self._hold_port

    @property
    def dram_bytes(self) -> int:
        """``BoardReg.DRAM_BYTES``: ``2**addr_width`` words of ``port_width / 8`` bytes."""
        return (1 << self._addr_width) * (self._port_width // 8)

    @property
    def byte_addr_width(self) -> int:
        """Bits of a byte address in the DRAM."""
        return self._addr_width + ceil_log2(self._port_width // 8)

    # ------------------------------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        aw, pw, baw = self._addr_width, self._port_width, self.byte_addr_width
        m.submodules.bridge = br = LinkBridge(byte_timeout=self._byte_timeout, board=True)
        connect(m, flipped(self.rx), br.rx)
        connect(m, br.tx, flipped(self.tx))

        # 'X': the core reset, registered (LinkedCore's), resets the core, the writer, the token builder, the
        # tap and the stream FIFOs, and aborts the reader (which keeps counting the reads in flight, so that
        # their words, arriving after the reset, are dropped); the board registers stay
        core_rst = Signal()
        m.d.sync += core_rst.eq(br.core_rst)

        def reset(elaboratable):
            return ResetInserter({"sync": core_rst})(elaboratable)

        core = self._core
        reader = DRAMImageReader(addr_width=aw, port_width=pw, beat_width=BEAT_BITS, depth=self._reader_depth,
                                 timeout=self._dram_timeout)
        if pw <= BEAT_BITS:
            writer = DRAMStreamWriter(addr_width=aw, port_width=pw, beat_width=BEAT_BITS)
        else:       # a word of several beats: byte enables for the beats an 'L' writes
            writer = DRAMWideWriter(addr_width=aw, port_width=pw, beat_width=BEAT_BITS)
        builder = TokenBuilder(byte_addr_width=baw, beat_width=BEAT_BITS, max_hidden=self._build.max_hidden,
                               read_align=reader.base_align)
        tap = ArgmaxTap()
        m.submodules.core = reset(core)
        m.submodules.reader = reader
        reader_abort = Signal()     # the token engine's, after the state engine stopped mid-token
        m.d.comb += reader.abort.eq(core_rst | reader_abort)
        m.submodules.writer = reset(writer)
        m.submodules.builder = reset(builder)
        m.submodules.tap = reset(tap)
        m.d.comb += self.irq.eq(core.irq)

        # the streams: w0_in (the mux's output) -> FIFO -> core; core -> FIFO -> tap -> bridge
        w0_in = AXIStreamSignature(BEAT_BITS).create(path=("w0_in",))
        w0_fifo = stream_register(m, "w0_fifo", w0_in, core.s_axis_w0, rst=core_rst, depth=W0_FIFO_DEPTH)
        stream_register(m, "out_fifo", core.m_axis_out, tap.i, rst=core_rst)
        m.d.comb += [br.out.tdata.eq(tap.o.payload.data), br.out.tlast.eq(tap.o.payload.last),
                     br.out.tvalid.eq(tap.o.valid), tap.o.ready.eq(br.out.tready)]

        u = SimpleNamespace(bridge=br, core=core, reader=reader, writer=writer, builder=builder, tap=tap,
                            w0_in=w0_in, w0_fifo=w0_fifo, core_rst=core_rst, reader_abort=reader_abort)
        u.state = u.state_reader = None
        u.state_busy = u.state_error = Const(0, 1)
        if self._build.state_in_dram:
            self._state_engine(m, u)
        u.tokens = Signal(32)
        u.load_started = Signal()
        u.regs = self._registers(m, u)
        m.d.comb += self.port_enable.eq(u.regs.port_enabled)
        u.usable = Signal()      # the DRAM is initialised and its port enabled: DRAM commands may run
        m.d.comb += u.usable.eq(self.dram_ready & u.regs.port_enabled)
        u.write_owner = self._dram_engine(m, u)
        if u.state is not None:
            self._state_writer(m, u)
        self._ctrl_engine(m, u)
        status_read = self._token_engine(m, u)
        self._core_bus(m, u, status_read)
        self._port_mux(m, u)
        return m

    def _registers(self, m, u) -> SimpleNamespace:
        """The board registers behind ``'G'``/``'P'`` (:class:`~hw.boards.link_protocol.BoardReg`; addresses
        with their two low bits ignored, unmapped ones read 0; writes to read-only registers are ignored).
        Returns the writable ones (``image_valid``, ``image_base``, ``image_bytes``, ``image_checksum``,
        ``embed_base``, ``embed_hidden``, ``embed_vocab``; 32 bits each, ``image_valid`` 1) and
        ``port_enabled`` (1 bit: a register with ``hold_port``, else the constant 1)."""
        bp = u.bridge.board
        r = SimpleNamespace(image_valid=Signal(), **{name: Signal(32, name=name) for name in (
            "image_base", "image_bytes", "image_checksum", "embed_base", "embed_hidden", "embed_vocab")})
        r.port_enabled = Signal(name="port_enabled") if self._hold_port else Const(1, 1)
        status = Signal(8)
        # READER_ERROR: the image reader stopped after a time-out, or the state engine stopped (state_in_dram)
        m.d.comb += status.eq(Cat(self.dram_ready, self.dram_error, r.image_valid, u.reader.error | u.state_error,
                                  u.writer.error, self.rx_overflow, r.port_enabled, Const(self._hold_port, 1)))
        assert [int(f) for f in BoardStatus] == [1 << k for k in range(8)]   # the bit order above

        values = {
            BoardReg.MAGIC: Const(BOARD_MAGIC, 32), BoardReg.LINK_VERSION: Const(LINK_VERSION, 32),
            BoardReg.DRAM_BYTES: Const(self.dram_bytes, 32), BoardReg.CLOCK_HZ: Const(self._clock_hz, 32),
            BoardReg.STATUS: status, BoardReg.IMAGE_BASE: r.image_base, BoardReg.IMAGE_BYTES: r.image_bytes,
            BoardReg.IMAGE_CHECKSUM: r.image_checksum, BoardReg.EMBED_BASE: r.embed_base,
            BoardReg.EMBED_HIDDEN: r.embed_hidden, BoardReg.EMBED_VOCAB: r.embed_vocab,
            BoardReg.LINK_TIMEOUTS: u.bridge.timeouts, BoardReg.LINK_FRAMING: self.framing,
            BoardReg.TOKENS: u.tokens, BoardReg.PORT_ENABLE: r.port_enabled,
        }
        assert set(values) == set(BoardReg)
        word = bp.reg_addr[2:]
        with m.Switch(word):
            for reg, value in values.items():
                with m.Case(reg >> 2):
                    m.d.comb += bp.reg_rdata.eq(value)
        writable = {BoardReg.IMAGE_BASE: r.image_base, BoardReg.IMAGE_BYTES: r.image_bytes,
                    BoardReg.IMAGE_CHECKSUM: r.image_checksum, BoardReg.EMBED_BASE: r.embed_base,
                    BoardReg.EMBED_HIDDEN: r.embed_hidden, BoardReg.EMBED_VOCAB: r.embed_vocab}
        with m.If(bp.reg_we):
            with m.Switch(word):
                with m.Case(BoardReg.STATUS >> 2):     # only IMAGE_VALID is writable
                    m.d.sync += r.image_valid.eq((bp.reg_wdata & BoardStatus.IMAGE_VALID) != 0)
                for reg, sig in writable.items():
                    with m.Case(reg >> 2):
                        m.d.sync += sig.eq(bp.reg_wdata)
                if self._hold_port:
                    with m.Case(BoardReg.PORT_ENABLE >> 2):
                        m.d.sync += r.port_enabled.eq(bp.reg_wdata[0])
        with m.If(u.load_started):   # any 'L' clears IMAGE_VALID
            m.d.sync += r.image_valid.eq(0)
        return r

    def _dram_engine(self, m, u):
        """``'L'`` and ``'C'``: the bridge's DRAM commands through the writer, or the reader into a CRC-32.

        A command is checked first (``DramStatus.NOT_READY`` before ``dram_ready`` or while the port is not
        enabled; ``BAD_ALIGN`` for an
        address or a length that is not a multiple of 8 or a range beyond ``DRAM_BYTES``); a refused
        ``'L'``'s beats are taken and dropped. A write that waits on the controller for ``dram_timeout``
        cycles without progress ends with ``TIMEOUT`` (its remaining beats dropped; the writer stays stuck
        until ``'X'``); a read that times out (the reader's ``error``) likewise. The CRC is
        ``CRC32_ETHERNET`` (``zlib.crc32``'s) over the beats, 64 bits a cycle, byte 0 of a beat first.
        On a port wider than a beat the writer writes the words an ``'L'`` starts or ends in with the byte
        enables of its own beats only, and ``'C'`` reads whole words and hands the CRC only the range's beats
        (:class:`~hw.dram_reader.DRAMImageReader`).

        With ``state_in_dram`` an ``'L'`` offers its request to the writer only while the state engine is not
        busy (:meth:`_state_writer`); the writer, the engine's meanwhile, is checked (in error, or stuck) once
        the engine is done.

        Returns the writer's port ownership (high from the write request until its last word was taken)."""
        bp, reader, writer = u.bridge.board, u.reader, u.writer
        baw = self.byte_addr_width
        m.submodules.dram_crc = proc = crc.catalog.CRC32_ETHERNET(data_width=BEAT_BITS).create()
        write = Signal()
        addr = Signal(32)
        length = Signal(32)
        beats = Signal(30)               # 'L' beats still to take from the bridge
        status = Signal(8)
        result_crc = Signal(32)
        stall = Signal(range(self._dram_timeout + 1))
        write_owner = Signal()

        with m.FSM(name="dram_engine"):
            with m.State("IDLE"):
                m.d.comb += bp.dram_cmd.ready.eq(1)
                with m.If(bp.dram_cmd.valid):
                    c = bp.dram_cmd.payload
                    m.d.sync += [write.eq(c.write), addr.eq(c.addr), length.eq(c.length),
                                 beats.eq(c.length >> 3), result_crc.eq(0), stall.eq(0)]
                    m.d.comb += u.load_started.eq(c.write)
                    m.next = "CHECK"
            with m.State("CHECK"):
                bad = (addr[:3] != 0) | (length[:3] != 0) | ((addr + length) > self.dram_bytes)
                refused = Signal(8)
                m.d.comb += refused.eq(Mux(~u.usable, DramStatus.NOT_READY, 0)
                                       | Mux(bad, DramStatus.BAD_ALIGN, 0))
                m.d.sync += status.eq(refused)
                with m.If(write):
                    with m.If(refused != 0):
                        m.next = "DISCARD"
                    with m.Elif(writer.error):
                        m.d.sync += status.eq(DramStatus.WRITER_ERROR)
                        m.next = "DISCARD"
                    with m.Elif(~writer.req.ready & ~u.state_busy):   # still stuck after a time-out
                        m.d.sync += status.eq(DramStatus.TIMEOUT)
                        m.next = "DISCARD"
                    with m.Else():
                        m.next = "WRITE_REQ"
                with m.Else():
                    with m.If(refused != 0):
                        m.next = "DONE"
                    with m.Elif(reader.error):
                        m.d.sync += status.eq(DramStatus.TIMEOUT)
                        m.next = "DONE"
                    with m.Elif(length == 0):     # zlib.crc32(b"") == 0
                        m.next = "DONE"
                    with m.Else():
                        m.next = "CRC_REQ"

            with m.State("WRITE_REQ"):      # (after the state engine's transfer in progress, if any)
                m.d.comb += [write_owner.eq(1), writer.req.valid.eq(~u.state_busy),
                             writer.req.payload.base.eq(addr[:baw]), writer.req.payload.length.eq(length[:baw + 1])]
                with m.If(writer.req.ready & ~u.state_busy):
                    m.next = "WRITE"
                if u.state is not None:     # the writer was the state engine's at CHECK: the checks now
                    with m.Elif(~u.state_busy):
                        m.d.sync += status.eq(Mux(writer.error, DramStatus.WRITER_ERROR, DramStatus.TIMEOUT))
                        m.next = "DISCARD"
            with m.State("WRITE"):
                m.d.comb += [write_owner.eq(1), writer.i.payload.eq(bp.dram_data.payload),
                             writer.i.valid.eq(bp.dram_data.valid & (beats != 0)),
                             bp.dram_data.ready.eq(writer.i.ready & (beats != 0))]
                with m.If(bp.dram_data.valid & bp.dram_data.ready):
                    m.d.sync += beats.eq(beats - 1)
                port = self.port
                progress = (port.cmd.valid & port.cmd.ready) | port.wdata.ready
                waiting = (writer.port.cmd.valid & ~port.cmd.ready) | ((beats == 0) & writer.busy)
                with m.If(progress | ~waiting):
                    m.d.sync += stall.eq(0)
                with m.Else():
                    m.d.sync += stall.eq(stall + 1)
                with m.If(writer.error):
                    m.d.sync += status.eq(DramStatus.WRITER_ERROR)
                    m.next = "DISCARD"
                with m.Elif(stall == self._dram_timeout):
                    m.d.sync += status.eq(DramStatus.TIMEOUT)
                    m.next = "DISCARD"
                with m.Elif((beats == 0) & ~writer.busy):
                    m.next = "DONE"
            with m.State("DISCARD"):        # a refused or failed 'L': its (remaining) beats are dropped
                m.d.comb += bp.dram_data.ready.eq(1)
                with m.If(beats == 0):
                    m.next = "DONE"
                with m.Elif(bp.dram_data.valid):
                    m.d.sync += beats.eq(beats - 1)

            with m.State("CRC_REQ"):
                m.d.comb += [reader.req.valid.eq(1), reader.req.payload.base.eq(addr[:baw]),
                             reader.req.payload.length.eq(length[:baw + 1]), proc.start.eq(1)]
                with m.If(reader.req.ready):
                    m.next = "CRC_READ"
            with m.State("CRC_READ"):
                m.d.comb += [reader.o.ready.eq(1), proc.data.eq(reader.o.payload.data),
                             proc.valid.eq(reader.o.valid)]
                with m.If(reader.o.valid & reader.o.payload.last):
                    m.next = "CRC_END"
                with m.Elif(reader.error):
                    m.d.sync += status.eq(DramStatus.TIMEOUT)
                    m.next = "DONE"
            with m.State("CRC_END"):        # the CRC register took the last beat
                m.d.sync += result_crc.eq(proc.crc)
                m.next = "DONE"

            with m.State("DONE"):
                m.d.comb += [bp.dram_done.valid.eq(1), bp.dram_done.payload.status.eq(status),
                             bp.dram_done.payload.crc.eq(result_crc)]
                with m.If(bp.dram_done.ready):
                    m.next = "IDLE"
        return write_owner

    def _ctrl_engine(self, m, u):
        """``'K'`` and ``'J'``: one Wishbone classic transfer on ``ctrl`` per command.

        Checked first, touching nothing when refused: ``CtrlStatus.BAD_ADDR`` for a byte address that is not a
        multiple of 4 or not below :data:`~hw.boards.link_protocol.CTRL_BYTES`; ``BUSY`` while the power-up
        sequencer owns the bus (neither ``dram_ready`` nor ``dram_error``). Then ``cyc``/``stb`` stay high until
        ``ack`` (a read takes ``dat_r`` then) or for ``ctrl_timeout`` cycles, after which the transfer is
        withdrawn (``cyc`` low) with ``TIMEOUT``. The data of a write or a failed access is 0."""
        bp, bus = u.bridge.board, self.ctrl
        write, addr, wdata = Signal(), Signal(32), Signal(32)
        status, rdata = Signal(8), Signal(32)
        wait = Signal(range(self._ctrl_timeout + 1))
        with m.FSM(name="ctrl_engine"):
            with m.State("IDLE"):
                m.d.comb += bp.ctrl_cmd.ready.eq(1)
                with m.If(bp.ctrl_cmd.valid):
                    c = bp.ctrl_cmd.payload
                    m.d.sync += [write.eq(c.write), addr.eq(c.addr), wdata.eq(c.data), rdata.eq(0), wait.eq(0)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                bad = (addr[:2] != 0) | (addr >= CTRL_BYTES)
                busy = ~self.dram_ready & ~self.dram_error
                refused = Signal(8)
                m.d.comb += refused.eq(Mux(bad, CtrlStatus.BAD_ADDR, 0) | Mux(busy, CtrlStatus.BUSY, 0))
                m.d.sync += status.eq(refused)
                with m.If(refused != 0):
                    m.next = "DONE"
                with m.Else():
                    m.next = "BUS"
            with m.State("BUS"):
                m.d.comb += [bus.adr.eq(addr[2:]), bus.dat_w.eq(wdata), bus.we.eq(write), bus.cyc.eq(1),
                             bus.stb.eq(1)]
                with m.If(bus.ack):
                    m.d.sync += rdata.eq(Mux(write, 0, bus.dat_r))
                    m.next = "DONE"
                with m.Elif(wait == self._ctrl_timeout):
                    m.d.sync += status.eq(CtrlStatus.TIMEOUT)
                    m.next = "DONE"
                with m.Else():
                    m.d.sync += wait.eq(wait + 1)
            with m.State("DONE"):
                m.d.comb += [bp.ctrl_done.valid.eq(1), bp.ctrl_done.payload.status.eq(status),
                             bp.ctrl_done.payload.data.eq(rdata)]
                with m.If(bp.ctrl_done.ready):
                    m.next = "IDLE"

    def _token_engine(self, m, u):
        """``'T'``: check, build the token packet, stream it and the image into channel 0, report.

        Refusals come first and send nothing to the core: ``NOT_READY`` (the DRAM not initialised or its port
        not enabled), ``NO_IMAGE`` (``IMAGE_VALID`` clear, or an image of
        fewer than 8 bytes or reaching beyond ``DRAM_BYTES``, which the reader could not stream whole; on a port
        of 32 bits or more also an ``IMAGE_BASE`` that is not a multiple of the reader's granularity
        (``DRAMImageReader.base_align``: the port word up to the 8-byte beat), which it would round down; the
        16-bit port's reader rounds an odd one down to its word, as it always has),
        ``READ_TIMEOUT`` (the reader stopped after an earlier time-out), then the
        builder's ``BAD_TOKEN``/``BAD_HIDDEN`` (``EMBED_HIDDEN`` above ``max_hidden`` reaches the builder as
        0). A read that times out mid-token ends it with ``READ_TIMEOUT`` (the core waits for the rest of
        its stream until ``'X'``). While in error the core takes and drops its input, so the image stream
        always finishes.

        Once the image's last beat has entered the core (taken from the stream FIFO), the engine waits for the
        core's ``irq`` (``STATUS.DONE | ERROR``, a level), then reads ``STATUS`` on the core's AXI4-Lite read
        channels (:meth:`_core_bus`) and replies ``CORE_ERROR`` if it has ``ERROR``, else 0. The core checks a
        weight block's CRC word (``ErrorCause.WEIGHT_CRC``) only when it reaches the block, which for the last
        block can be thousands of cycles after it took the image's last beat (its own weight FIFO holds up to
        ``weight_fifo_beats`` beats), so ``irq`` low at that beat does not mean success. ``irq`` describes this
        token then: the previous ``'T'`` replied only once the core was done or in error, so the core read
        this token packet's magic, which clears ``DONE``, as it arrived, long before the image behind it (a
        DRAM read later) has entered; an ``ERROR`` still standing (no ``CTRL.clear`` since) is this token's
        too, whose stream the core dropped. (A host that streams tokens with ``'S'`` reads their output
        before it sends a ``'T'``.)

        The wait ends: with its image in, the core finishes the token, ``DONE``, or ``ERROR`` for any fault (an
        image cut short: ``TRUNCATED``, as the image's last beat carries ``tlast``); its output words leave
        meanwhile, as ``'o'`` frames (the bridge sends them whenever no reply waits) or into the tap, so
        its output cannot hold it up for good. A core reset ends the wait with ``READ_TIMEOUT`` (the token
        cut short); the bridge takes no ``'X'`` while it waits for this reply, so that is only a guard. The
        bridge issues no register access either then, so the engine's read cannot collide with one.
        ``'S'`` beats pass to the core while no token runs.

        With ``state_in_dram`` the reply also waits (``STATE_WAIT``, after the ``STATUS`` read) until the
        state engine is idle and the core offers no state command: the token's last write-back is then in
        DRAM. The state engine stopped in error refuses a token with ``READ_TIMEOUT`` (as the image reader
        stopped in error does) and ends one in progress with ``READ_TIMEOUT``; that end also aborts the image
        reader, which may be mid-request, so that a ``'C'`` finds it idle. A ``READ_TIMEOUT`` reply waits for a
        state transfer in progress to end. The image must end below the state region (``NO_IMAGE``).

        Returns the engine's side of the core's read channels (``owner``, ``arvalid``, ``rready``: 1 bit
        each) for :meth:`_core_bus`."""
        bp, reader, builder, core = u.bridge.board, u.reader, u.builder, u.core
        bus = core.s_axil
        # the engine's STATUS read: ownership, arvalid and rready as flops set and cleared with the state changes
        # (they equal decodes of STATUS_AR/STATUS_R; that decoded form made Yosys 0.70's ABC9 assert in
        # synth_ecp5 of the 40-lane DDR3 top, docs/DDR3.md)
        sr = SimpleNamespace(owner=Signal(), arvalid=Signal(), rready=Signal())
        regs, w0_in, w0 = u.regs, u.w0_in, u.bridge.w0
        token, position, logits = Signal(32), Signal(32), Signal()
        status = Signal(8)
        start = Signal()        # a token's stream starts (its flags decide the tap's mode)
        streaming = Signal()    # from then until its status is known
        max_hidden = self._build.max_hidden
        hidden_in = Signal(range(max_hidden + 1))
        m.d.comb += hidden_in.eq(Mux(regs.embed_hidden > max_hidden, 0, regs.embed_hidden))

        # channel 0's source: 'S' beats from the bridge unless a token's packet or image streams
        src = Signal(range(3))  # 0: the bridge, 1: the builder's packet, 2: the reader's image
        with m.Switch(src):
            with m.Case(0):
                m.d.comb += [w0_in.tdata.eq(w0.tdata), w0_in.tlast.eq(w0.tlast), w0_in.tvalid.eq(w0.tvalid),
                             w0.tready.eq(w0_in.tready)]
            with m.Case(1):
                m.d.comb += [w0_in.tdata.eq(builder.o.payload.data), w0_in.tlast.eq(builder.o.payload.last),
                             w0_in.tvalid.eq(builder.o.valid), builder.o.ready.eq(w0_in.tready)]
            with m.Case(2):
                m.d.comb += [w0_in.tdata.eq(reader.o.payload.data), w0_in.tlast.eq(reader.o.payload.last),
                             w0_in.tvalid.eq(reader.o.valid), reader.o.ready.eq(w0_in.tready)]
        taken = w0_in.tvalid & w0_in.tready

        with m.FSM(name="token_engine"):
            with m.State("IDLE"):
                m.d.comb += bp.token.ready.eq(1)
                with m.If(bp.token.valid):
                    p = bp.token.payload
                    m.d.sync += [token.eq(p.token), position.eq(p.position),
                                 logits.eq((p.flags & TokenFlags.LOGITS) != 0), u.tokens.eq(u.tokens + 1)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                no_image = (~regs.image_valid | (regs.image_bytes[3:] == 0)
                            | ((regs.image_base + regs.image_bytes) > self._image_limit))
                if reader.base_align > 2:   # the reader would ignore IMAGE_BASE's bits below its granularity
                    no_image = no_image | (regs.image_base[:ceil_log2(reader.base_align)] != 0)
                with m.If(~u.usable):
                    m.d.sync += status.eq(TokenStatus.NOT_READY)
                    m.next = "REPLY"
                with m.Elif(no_image):
                    m.d.sync += status.eq(TokenStatus.NO_IMAGE)
                    m.next = "REPLY"
                with m.Elif(reader.error | u.state_error):
                    m.d.sync += status.eq(TokenStatus.READ_TIMEOUT)
                    m.next = "REPLY"
                with m.Else():
                    m.next = "BUILD"
            with m.State("BUILD"):
                m.d.comb += [builder.cmd.valid.eq(1), builder.cmd.payload.token.eq(token),
                             builder.cmd.payload.position.eq(position), builder.cmd.payload.logits.eq(logits),
                             builder.base.eq(regs.embed_base), builder.hidden.eq(hidden_in),
                             builder.vocab.eq(regs.embed_vocab)]
                with m.If(builder.cmd.ready):
                    m.next = "BUILD_CHECK"
            with m.State("BUILD_CHECK"):     # the builder's verdict, a cycle after it took the command
                with m.If(builder.error):
                    m.d.sync += status.eq(Mux(builder.bad_token, TokenStatus.BAD_TOKEN, 0)
                                          | Mux(builder.bad_hidden, TokenStatus.BAD_HIDDEN, 0))
                    m.next = "REPLY"
                with m.Else():
                    m.d.comb += start.eq(1)
                    m.next = "PACKET"
            with m.State("PACKET"):          # the reader belongs to the builder; its packet goes to the core
                m.d.comb += [src.eq(1), streaming.eq(1)]
                connect(m, builder.rd_req, reader.req)
                connect(m, reader.o, builder.rd)
                with m.If(taken & w0_in.tlast):
                    m.next = "IMAGE_REQ"
                with m.Elif(reader.error | u.state_error):
                    m.next = "FAIL"
            with m.State("IMAGE_REQ"):
                m.d.comb += [streaming.eq(1), reader.req.valid.eq(1),
                             reader.req.payload.base.eq(regs.image_base),
                             reader.req.payload.length.eq(regs.image_bytes)]
                with m.If(reader.req.ready):
                    m.next = "IMAGE"
                with m.Elif(reader.error | u.state_error):
                    m.next = "FAIL"
            with m.State("IMAGE"):
                m.d.comb += [src.eq(2), streaming.eq(1)]
                with m.If(taken & w0_in.tlast):
                    m.next = "DRAIN"
                with m.Elif(reader.error | u.state_error):
                    m.next = "FAIL"
            with m.State("DRAIN"):           # until the core took the last beat from the FIFO
                m.d.comb += streaming.eq(1)
                with m.If(u.w0_fifo.level == 0):     # not r_rdy: a beat written into an empty FIFO is in it
                                                     # a cycle before r_rdy shows it (SyncFIFOBuffered, depth > 1)
                    m.next = "CORE_WAIT"
                with m.Elif(u.state_error):          # the core waits for a row that will not come
                    m.next = "FAIL"
            with m.State("CORE_WAIT"):       # until the core is done or in error
                m.d.comb += streaming.eq(1)
                with m.If(u.core_rst | u.state_error):
                    m.next = "FAIL"
                with m.Elif(core.irq):       # the engine takes the read channels and asks for STATUS
                    m.d.sync += [sr.owner.eq(1), sr.arvalid.eq(1)]
                    m.next = "STATUS_AR"
            with m.State("STATUS_AR"):       # the core's STATUS, on the read channels the engine owns now
                m.d.comb += streaming.eq(1)
                with m.If(u.core_rst):
                    m.next = "FAIL"
                with m.Elif(bus.arready):
                    m.d.sync += [sr.arvalid.eq(0), sr.rready.eq(1)]
                    m.next = "STATUS_R"
            with m.State("STATUS_R"):
                m.d.comb += streaming.eq(1)
                with m.If(u.core_rst):
                    m.next = "FAIL"
                with m.Elif(bus.rvalid):
                    m.d.sync += [status.eq(Mux(bus.rdata[ERROR_BIT], TokenStatus.CORE_ERROR, 0)),
                                 sr.owner.eq(0), sr.rready.eq(0)]
                    m.next = "STATE_WAIT" if u.state is not None else "REPLY"
            if u.state is not None:
                with m.State("STATE_WAIT"):  # the last write-back in DRAM (the core offers no more commands)
                    m.d.comb += streaming.eq(1)
                    with m.If(u.core_rst | u.state_error):
                        m.next = "FAIL"
                    with m.Elif(~u.state_busy & ~core.state_cmd.valid):
                        m.next = "REPLY"
            with m.State("FAIL"):
                m.d.sync += status.eq(TokenStatus.READ_TIMEOUT)
                # after the state engine stopped the image reader may be mid-request: it ends here, so that a
                # 'C' finds it idle (after an image read's time-out it stays stopped, in error, as before); a
                # state transfer in progress ends first (the core completes the swap it started, or the engine
                # stops), so that no write-back is cut short by an 'X' after the reply
                m.d.comb += u.reader_abort.eq(u.state_error)
                with m.If(~u.state_busy):
                    m.next = "REPLY"
            with m.State("REPLY"):
                m.d.comb += [bp.token_done.valid.eq(1), bp.token_done.payload.eq(status)]
                with m.If(bp.token_done.ready):
                    m.next = "IDLE"

        with m.If(u.core_rst):  # the read abandoned (the engine goes to FAIL): the channels back to the bridge
            m.d.sync += [sr.owner.eq(0), sr.arvalid.eq(0), sr.rready.eq(0)]

        s_start = Signal()      # an 'S' stream after a token: the tap passes its output through
        after_token = Signal()
        with m.If(start):
            m.d.sync += after_token.eq(1)
        with m.Elif((src == 0) & taken):
            m.d.comb += s_start.eq(after_token)
            m.d.sync += after_token.eq(0)
        with m.If(u.core_rst):
            m.d.sync += after_token.eq(0)
        self._tap_mode(m, u, start=start | s_start, argmax_only=start & ~logits, owes=start,
                       quiet_allowed=~streaming)
        return sr

    def _core_bus(self, m, u, sr):
        """The core's AXI4-Lite port: the write channels from the bridge; the read channels from the bridge,
        or from the token engine while ``sr.owner`` (one read of ``STATUS``; the bridge, then waiting for the
        token's reply, issues no access, and sees ``arready`` and ``rvalid`` low)."""
        bus, mgr = u.core.s_axil, u.bridge.axil
        m.d.comb += [bus.awaddr.eq(mgr.awaddr), bus.awprot.eq(mgr.awprot), bus.awvalid.eq(mgr.awvalid),
                     mgr.awready.eq(bus.awready), bus.wdata.eq(mgr.wdata), bus.wstrb.eq(mgr.wstrb),
                     bus.wvalid.eq(mgr.wvalid), mgr.wready.eq(bus.wready), mgr.bresp.eq(bus.bresp),
                     mgr.bvalid.eq(bus.bvalid), bus.bready.eq(mgr.bready),
                     mgr.rdata.eq(bus.rdata), mgr.rresp.eq(bus.rresp)]
        with m.If(sr.owner):
            m.d.comb += [bus.araddr.eq(STATUS_ADDR), bus.arvalid.eq(sr.arvalid), bus.rready.eq(sr.rready)]
        with m.Else():
            m.d.comb += [bus.araddr.eq(mgr.araddr), bus.arprot.eq(mgr.arprot), bus.arvalid.eq(mgr.arvalid),
                         mgr.arready.eq(bus.arready), bus.rready.eq(mgr.rready), mgr.rvalid.eq(bus.rvalid)]

    def _tap_mode(self, m, u, *, start, argmax_only, owes, quiet_allowed):
        """The tap's ``argmax_only``, which it samples with each output packet's first word, must be the
        flag of the token that packet belongs to. A ``'T'`` replies only once the core's ``irq`` is high, by
        when that token's packet has left the core (or the core stopped in error), so the next token's
        stream starts after it; as a guard all the same (a reply that came as soon as the image had entered
        the core, which the core's weight FIFO can hold whole, let it start earlier), a new token's flag waits
        while an earlier token still owes its packet.

        A token owes its packet from its start until the packet's first word passed the tap, or until the
        core is quiet with nothing to send: ``irq`` high (done or error), no packet open at the core's output
        and no word offered. The core sends nothing more then until it takes another token, and that is
        counted only while no token is streaming (``quiet_allowed``), because until a token's image has
        entered the core, ``irq`` may still be the previous token's ``DONE``. ``'S'`` streams start with
        ``argmax_only`` 0 and owe nothing (a host that streams tokens itself reads their output before it
        sends a ``'T'``).

        Parameters: ``start`` (a stream starts this cycle), ``argmax_only`` (its flag), ``owes`` (it is a
        ``'T'`` token, which owes a packet), ``quiet_allowed`` (the core's quiet may be counted)."""
        core, tap = u.core, u.tap
        out = core.m_axis_out
        core_open = Signal()     # a packet has started at the core's output and not ended
        with m.If(out.tvalid & out.tready):
            m.d.sync += core_open.eq(~out.tlast)
        tap_first = Signal(init=1)
        with m.If(tap.i.valid & tap.i.ready):
            m.d.sync += tap_first.eq(tap.i.payload.last)

        cur, owed = Signal(), Signal()                    # the flag the tap reads; its token owes a packet
        nxt, nxt_owes, wait = Signal(), Signal(), Signal()  # a flag waiting for the owed packet
        m.d.comb += tap.argmax_only.eq(cur)
        settled = (tap.i.valid & tap.i.ready & tap_first) | \
                  (quiet_allowed & core.irq & ~core_open & ~out.tvalid)
        r_cur, r_owed, r_wait = Signal(), Signal(), Signal()   # after this cycle's settling
        m.d.comb += [r_cur.eq(cur), r_owed.eq(owed), r_wait.eq(wait)]
        with m.If(settled):
            with m.If(wait):
                m.d.comb += [r_cur.eq(nxt), r_owed.eq(nxt_owes), r_wait.eq(0)]
            with m.Else():
                m.d.comb += r_owed.eq(0)
        with m.If(start & r_owed):
            m.d.sync += [cur.eq(r_cur), owed.eq(r_owed), nxt.eq(argmax_only), nxt_owes.eq(owes), wait.eq(1)]
        with m.Elif(start):
            m.d.sync += [cur.eq(argmax_only), owed.eq(owes), wait.eq(0)]
        with m.Else():
            m.d.sync += [cur.eq(r_cur), owed.eq(r_owed), wait.eq(r_wait)]
        with m.If(u.core_rst):
            m.d.sync += [core_open.eq(0), tap_first.eq(1), cur.eq(0), owed.eq(0), wait.eq(0)]

    def _state_engine(self, m, u):
        """A build with ``state_in_dram``: the :class:`StateEngine` between the core's state ports and the port
        (:meth:`_port_mux`), with a second :class:`~hw.dram_reader.DRAMImageReader` for its fills (the image
        reader streams the image meanwhile) and the writer for its write-backs (:meth:`_state_writer`); the
        core reset resets the engine and aborts its reader, as it aborts the image reader. The image reader is
        held while the engine takes the port and while reads of the state reader are in flight (the words of
        a fill cut short by an error or ``'X'``, which the state reader drops)."""
        aw, pw, baw = self._addr_width, self._port_width, self.byte_addr_width
        core, reader, writer, port = u.core, u.reader, u.writer, self.port
        se = StateEngine(byte_addr_width=baw, base=self._image_limit, max_hidden=self._build.max_hidden,
                         max_layers=self._build.max_layers, timeout=self._dram_timeout)
        sreader = DRAMImageReader(addr_width=aw, port_width=pw, beat_width=BEAT_BITS, depth=self._reader_depth,
                                  timeout=self._dram_timeout)
        m.submodules.state_engine = ResetInserter({"sync": u.core_rst})(se)
        m.submodules.state_reader = sreader
        connect(m, core.state_cmd, se.cmd)
        connect(m, core.m_axis_state, se.wb)
        connect(m, se.fill, core.s_axis_state)
        connect(m, se.rd_req, sreader.req)
        connect(m, sreader.o, se.rd)
        m.d.comb += [sreader.abort.eq(u.core_rst | se.abort), reader.hold.eq(se.hold | sreader.in_flight),
                     se.quiet.eq(~reader.in_flight), se.held_error.eq(reader.error),
                     se.reader_error.eq(sreader.error), se.writer_busy.eq(writer.busy),
                     se.writer_error.eq(writer.error),
                     se.wr_stalled.eq(writer.port.cmd.valid & ~port.cmd.ready),
                     se.wr_progress.eq((port.cmd.valid & port.cmd.ready) | port.wdata.ready)]
        u.state, u.state_reader, u.state_busy, u.state_error = se, sreader, se.busy, se.error

    def _state_writer(self, m, u):
        """The writer's request and beats from the state engine during its write-backs (the bridge runs one
        command at a time, so an ``'L'`` and a token never overlap; an ``'L'`` after an ``'S'`` whose core
        still swaps rows waits in ``WRITE_REQ`` while the engine is busy, and the engine takes no command
        while an ``'L'`` owns the writer). Comes after :meth:`_dram_engine`: these assignments win."""
        se, writer = u.state, u.writer
        m.d.comb += se.blocked.eq(u.write_owner)
        with m.If(se.write):
            m.d.comb += [writer.req.valid.eq(se.wr_req.valid), writer.req.payload.eq(se.wr_req.payload),
                         se.wr_req.ready.eq(writer.req.ready),
                         writer.i.valid.eq(se.wr.valid), writer.i.payload.eq(se.wr.payload),
                         se.wr.ready.eq(writer.i.ready)]

    def _port_mux(self, m, u):
        """The native port: commands from the writer while it owns the port (an ``'L'``), else from the
        reader; write data from the writer; read data to the reader.

        With ``state_in_dram`` the state engine's grant comes first: while it owns the port, commands come
        from the writer (a write-back) or the state reader (a fill), and read data goes to the state reader,
        also afterwards while that reader has reads in flight; the image reader, held meanwhile with no read
        in flight, sees no ``rdata.valid``."""
        port, reader, writer, se, sreader = self.port, u.reader, u.writer, u.state, u.state_reader

        def commands(src):
            m.d.comb += [port.cmd.valid.eq(src.port.cmd.valid), port.cmd.payload.eq(src.port.cmd.payload),
                         src.port.cmd.ready.eq(port.cmd.ready)]

        to_reader = port.rdata.valid
        if se is None:
            with m.If(u.write_owner):
                commands(writer)
            with m.Else():
                commands(reader)
        else:
            with m.If(se.write):
                commands(writer)
            with m.Elif(se.grant):
                commands(sreader)
            with m.Elif(u.write_owner):
                commands(writer)
            with m.Else():
                commands(reader)
            to_state = se.grant | sreader.in_flight
            to_reader = port.rdata.valid & ~to_state
            m.d.comb += [sreader.port.rdata.payload.eq(port.rdata.payload),
                         sreader.port.rdata.valid.eq(port.rdata.valid & to_state)]
        m.d.comb += [port.wdata.payload.eq(writer.port.wdata.payload), writer.port.wdata.ready.eq(port.wdata.ready),
                     reader.port.rdata.payload.eq(port.rdata.payload), reader.port.rdata.valid.eq(to_reader)]


class StateEngine(wiring.Component):
    """Serves a core's recurrent-state row transfers (:class:`hw.state_cache.StateCache`: ``cmd``, ``wb``,
    ``fill``) on a DRAM board's native port, one command at a time, in order (module notes).

    A command's row ``(bank, layer)`` lies at byte ``base + StateGeometry.offset(bank, layer)``
    (:class:`hw.state_cache.StateGeometry`; ``layer`` taken modulo ``max_layers`` rounded up to a power of
    two, so that a row never leaves the region), ``row_bytes`` long. The engine first takes the port: it
    raises ``hold`` (the image reader's) and waits for ``quiet`` (no image read in flight), then owns the port
    (``grant``) until the transfer is over:

    - a write (``StateCmd.write`` 1): one request to the DRAM writer (``wr_req``), the core's ``wb`` beats to
      its ``wr``, and the command ends once the writer has handed the controller every word (``writer_busy``
      low), so that a later fill of the row reads what was written;
    - a fill: one request to the state reader (``rd_req``), whose beats go to ``fill`` (``tlast`` on the
      last); the command ends with the last beat taken.

    It stops with ``error`` (until reset: the board's ``'X'``) when a fill's read times out (``reader_error``),
    a write waits on the controller ``timeout`` cycles without progress, the writer is in error or still
    stuck from an earlier time-out when a write starts, or the image reader stopped in error with reads
    outstanding (the port cannot be had). Stopping, it pulses ``abort`` for the state reader (so that it
    gives up reads that will never come), drops ``hold`` and ``grant``, and takes no more commands.

    Parameters
    ----------
    byte_addr_width : int
        The DRAM's byte address bits.
    base : int
        The state region's first byte (``StateGeometry.base(dram_bytes)``).
    max_hidden, max_layers : int
        The core's build (the row's length, the region's layout).
    timeout : int, >= 1
        Cycles a write may wait on the controller without progress (the board's ``dram_timeout``).

    Members
    -------
    cmd : In(stream.Signature(hw.state_cache.StateCmd))
        From the core's ``state_cmd``; taken while idle and ``blocked`` is low.
    wb : In(AXIStreamSignature(64))
        From the core's ``m_axis_state``: a write's ``state_beats(max_hidden)`` beats (``tlast`` not checked).
    fill : Out(AXIStreamSignature(64))
        To the core's ``s_axis_state``: a fill's beats.
    wr_req : Out(stream.Signature(hw.dram_reader.dram_request_layout(byte_addr_width)))
    wr : Out(stream.Signature(64))
        To the DRAM writer's ``req`` and ``i`` while ``write``.
    writer_busy, writer_error : In(1)
        The writer's ``busy`` and ``error``.
    wr_stalled, wr_progress : In(1)
        The writer offers a command the controller does not take; the controller took a command or write
        data (the write's time-out).
    rd_req : Out(stream.Signature(hw.dram_reader.dram_request_layout(byte_addr_width)))
    rd : In(stream.Signature(hw.dram_reader.beat_layout(64)))
        To and from the state reader (:class:`hw.dram_reader.DRAMImageReader`).
    reader_error : In(1)
        The state reader's ``error``.
    blocked : In(1)
        The writer is another engine's (an ``'L'``): no command is taken.
    hold : Out(1)
        To the image reader's ``hold``: from a command's acceptance until its end.
    quiet : In(1)
        The image reader has no read in flight (``~in_flight``).
    held_error : In(1)
        The image reader's ``error``.
    grant : Out(1)
        The engine owns the port: commands from the writer (``write``) or the state reader, read data to the
        state reader.
    write : Out(1)
        The command owning the port is a write (``grant`` is high too).
    busy : Out(1)
        A command is in progress (not while in error).
    error : Out(1)
        Stopped (above).
    abort : Out(1)
        High for the first cycle in error.

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or out of range (``max_layers`` above 256: ``StateCmd.layer``'s 8
        bits; a region beyond ``byte_addr_width``).
    """

    def __init__(self, *, byte_addr_width: int, base: int, max_hidden: int, max_layers: int, timeout: int):
        _int("byte_addr_width", byte_addr_width, 3)
        _int("max_hidden", max_hidden, 1)
        _int("max_layers", max_layers, 1, 1 << 8)
        _int("timeout", timeout, 1)
        self._geometry = geo = StateGeometry(max_hidden, max_layers)
        _int("base", base, 0, (1 << byte_addr_width) - geo.region_bytes)
        if base % geo.region_bytes:
            raise ValueError(f"base must be a multiple of the region's {geo.region_bytes} bytes, got {base}")
        self._baw, self._base, self._timeout = byte_addr_width, base, timeout
        request = stream.Signature(dram_request_layout(byte_addr_width))
        super().__init__({
            "cmd": In(stream.Signature(StateCmd)),
            "wb": In(AXIStreamSignature(STATE_BEAT_BITS)), "fill": Out(AXIStreamSignature(STATE_BEAT_BITS)),
            "wr_req": Out(request), "wr": Out(stream.Signature(STATE_BEAT_BITS)),
            "writer_busy": In(1), "writer_error": In(1), "wr_stalled": In(1), "wr_progress": In(1),
            "rd_req": Out(request), "rd": In(stream.Signature(beat_layout(STATE_BEAT_BITS))),
            "reader_error": In(1), "blocked": In(1),
            "hold": Out(1), "quiet": In(1), "held_error": In(1),
            "grant": Out(1), "write": Out(1), "busy": Out(1), "error": Out(1), "abort": Out(1),
        })

    @property
    def geometry(self) -> StateGeometry:
        return self._geometry

    def elaborate(self, platform):
        m = Module()
        geo = self._geometry
        beats = state_beats(geo.max_hidden)
        write = Signal()
        addr = Signal(self._baw)
        left = Signal(range(beats + 1))         # a write's beats still to take from the core
        stall = Signal(range(self._timeout + 1))
        aborted = Signal()

        def request(req):
            m.d.comb += [req.valid.eq(1), req.payload.base.eq(addr), req.payload.length.eq(geo.row_bytes)]

        with m.FSM(name="state_engine"):
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(~self.blocked)
                with m.If(self.cmd.valid & self.cmd.ready):
                    c = self.cmd.payload
                    offset = (c.layer[:geo.bank_shift - geo.row_shift] << geo.row_shift) | (c.bank << geo.bank_shift)
                    m.d.sync += [write.eq(c.write), addr.eq(self._base + offset), left.eq(beats), stall.eq(0)]
                    m.next = "HOLD"
            with m.State("HOLD"):           # the image reader offers no more reads; those in flight come in
                m.d.comb += [self.hold.eq(1), self.busy.eq(1)]
                with m.If(self.quiet & write):
                    m.next = "WRITE_REQ"
                with m.Elif(self.quiet):
                    m.next = "FILL_REQ"
                with m.Elif(self.held_error):   # stopped with reads outstanding: they may never come
                    m.next = "ERROR"
            with m.State("WRITE_REQ"):
                m.d.comb += [self.hold.eq(1), self.busy.eq(1), self.grant.eq(1), self.write.eq(1)]
                request(self.wr_req)
                with m.If(self.writer_error | ~self.wr_req.ready):   # stuck since an earlier time-out
                    m.next = "ERROR"
                with m.Else():
                    m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += [self.hold.eq(1), self.busy.eq(1), self.grant.eq(1), self.write.eq(1),
                             self.wr.payload.eq(self.wb.tdata), self.wr.valid.eq(self.wb.tvalid & (left != 0)),
                             self.wb.tready.eq(self.wr.ready & (left != 0))]
                with m.If(self.wb.tvalid & self.wb.tready):
                    m.d.sync += left.eq(left - 1)
                waiting = self.wr_stalled | ((left == 0) & self.writer_busy)
                with m.If(self.wr_progress | ~waiting):
                    m.d.sync += stall.eq(0)
                with m.Else():
                    m.d.sync += stall.eq(stall + 1)
                with m.If(self.writer_error | (stall == self._timeout)):
                    m.next = "ERROR"
                with m.Elif((left == 0) & ~self.writer_busy):
                    m.next = "IDLE"
            with m.State("FILL_REQ"):
                m.d.comb += [self.hold.eq(1), self.busy.eq(1), self.grant.eq(1)]
                request(self.rd_req)
                with m.If(self.reader_error):
                    m.next = "ERROR"
                with m.Elif(self.rd_req.ready):
                    m.next = "FILL"
            with m.State("FILL"):
                m.d.comb += [self.hold.eq(1), self.busy.eq(1), self.grant.eq(1),
                             self.fill.tdata.eq(self.rd.payload.data), self.fill.tlast.eq(self.rd.payload.last),
                             self.fill.tvalid.eq(self.rd.valid), self.rd.ready.eq(self.fill.tready)]
                with m.If(self.rd.valid & self.rd.ready & self.rd.payload.last):
                    m.next = "IDLE"
                with m.Elif(self.reader_error):
                    m.next = "ERROR"
            with m.State("ERROR"):
                m.d.comb += [self.error.eq(1), self.abort.eq(~aborted)]
                m.d.sync += aborted.eq(1)
        return m
