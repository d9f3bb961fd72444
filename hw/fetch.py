"""Channel 0 of the core: its reader (words for the sequencer, beats for the fetcher), the weight FIFO, and the
instruction fetcher and checker (docs/RTL.md).

Channel 0 carries the token packet, then the image: its header, and per instruction a header, constants and
this channel's weight block. The sequencer reads the token packet and the image header a 32-bit word per
cycle through :class:`Channel0Reader`'s word serializer; :class:`InstructionFetcher` then reads the program a
whole beat per cycle, one instruction ahead of execution: it checks each header (every magic, CRC, opcode,
micro-op and shape the golden device checks, same :class:`hw.isa.ErrorCause` and precedence), loads the
instruction's constants into the bank the executing instruction does not read, and, once the sequencer has
dispatched a GEMV, pushes its channel-0 weight block into :class:`WeightFifo`. Both headers land in the
reader's one header register, viewed through :class:`hw.isa.ImageHeader` and :class:`hw.isa.InstrHeader`.
"""

import functools
import operator
from contextlib import contextmanager

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import isa
from hw import numerics as nx
from hw.crc_pipe import BlockTapSignature, CrcPipe
from hw.gearbox import beat_layout, decode_beat, decoded_beat_bits
from hw.isa import Buffer, ErrorCause, InstrFlags, InstrHeader, MicroOpcode, Opcode, TritPacking
from hw.streams import WORD_LAYOUT, packet_beat_layout

__all__ = ["HEADER_BITS", "image_facts_layout", "WordPortSignature", "BeatPortSignature", "FetchSignature",
           "Channel0Reader", "WeightFifo", "InstructionFetcher", "flag",
           "block_rows", "channel_rows", "block_sections", "const_bank_depth"]

#: Bits of the header register: an image header or an instruction header
HEADER_BITS = data.Layout.cast(InstrHeader).size
assert data.Layout.cast(isa.ImageHeader).size == HEADER_BITS
#: The InstrFlags bits an instruction may set
_KNOWN_FLAGS = functools.reduce(operator.or_, (f.value for f in InstrFlags))


def flag(flags, which: InstrFlags):
    """1 when the flag ``which`` is set in ``flags`` (an :class:`hw.isa.InstrFlags` view)."""
    return (flags.as_value() & which.value).any()


def _pow2(v: int) -> int:
    return 1 << ceil_log2(max(v, 1))


def const_bank_depth(max_hidden: int, max_intermediate: int) -> int:
    """Elements of one constant bank: the longest vector, a whole number of 64-byte sections (16 words)."""
    return -(-max(max_hidden, max_intermediate, 16) // 16) * 16


def image_facts_layout(max_layers: int) -> data.StructLayout:
    """What the sequencer keeps of the image header (registered when it is checked) for the fetcher's checks:
    the dimensions, ``vmax`` = max(hidden, intermediate), the instruction count and that count minus one
    (END_TOKEN's position), the image's words, and ``layer_mask``: the image's ``n_layers`` as a mask of
    ``2**ceil_log2(max_layers)`` bits."""
    return data.StructLayout({
        "hidden": unsigned(16), "intermediate": unsigned(16), "n_layers": unsigned(16), "vocab": unsigned(16),
        "vmax": unsigned(16), "n_instructions": unsigned(32), "n_instructions_m1": unsigned(32),
        "image_words": unsigned(32), "layer_mask": unsigned(_pow2(max_layers)),
    })


class WordPortSignature(wiring.Signature):
    """The sequencer's side of :class:`Channel0Reader`'s word serializer.

    Members (sequencer's view): ``mode`` Out(1): the serializer owns channel 0; ``more`` Out(1): the section
    goes on past the word being taken (the next beat may load; never past a beat with ``tlast``); ``drain``
    Out(1): take and drop every beat; ``shift`` Out(1): shift the word being taken into the header register;
    ``words`` In(stream of :data:`hw.streams.WORD_LAYOUT`): the words, ``last`` on the last word of a beat
    with ``tlast``; ``beat_last`` In(1): the serializer's beat carried ``tlast``; ``beat_valid`` In(1):
    channel 0 offers a beat; ``header`` In(512): the header register.
    """

    def __init__(self):
        super().__init__({"mode": Out(1), "more": Out(1), "drain": Out(1), "shift": Out(1),
                          "words": In(stream.Signature(WORD_LAYOUT)), "beat_last": In(1), "beat_valid": In(1),
                          "header": In(HEADER_BITS)})


class BeatPortSignature(wiring.Signature):
    """The fetcher's side of :class:`Channel0Reader`: ``claim`` Out(1): the fetcher's ``ready`` decides
    channel 0 this cycle; ``shift`` Out(1): shift this beat into the header register; ``beats``
    In(stream of :func:`hw.streams.packet_beat_layout`); ``header`` In(512).

    Parameters
    ----------
    bus_bits : int
    """

    def __init__(self, bus_bits: int):
        super().__init__({"claim": Out(1), "shift": Out(1),
                          "beats": In(stream.Signature(packet_beat_layout(bus_bits))),
                          "header": In(HEADER_BITS)})


class FetchSignature(wiring.Signature):
    """The sequencer's side of :class:`InstructionFetcher`.

    Members (sequencer's view): ``start`` Out(1): the image header is checked (fetch instruction 0);
    ``dispatch`` Out(1): the sequencer takes the fetched instruction; ``qc_busy`` Out(1): the executing
    instruction may still read QC; ``kill`` Out(1): error recovery (back to idle, errors forgotten);
    ``image`` Out(:func:`image_facts_layout`); ``ready`` In(1): an instruction is fetched and checked, its
    constants loaded; ``err`` In(1), ``err_now`` In(1) (in the executing instruction: raise at once),
    ``err_cause`` In(8); ``idx`` In(32): the fetched instruction's index; ``instr`` In(InstrHeader): its
    header; ``block_beats`` In(24): the executing GEMV's channel-0 weight beats.

    Parameters
    ----------
    max_layers : int
    """

    def __init__(self, max_layers: int):
        super().__init__({"start": Out(1), "dispatch": Out(1), "qc_busy": Out(1), "kill": Out(1),
                          "image": Out(image_facts_layout(max_layers)),
                          "ready": In(1), "err": In(1), "err_now": In(1), "err_cause": In(8), "idx": In(32),
                          "instr": In(InstrHeader), "block_beats": In(24)})


class Channel0Reader(wiring.Component):
    """Channel 0's beats to the word serializer (token packet, image header), to the fetcher (instructions,
    constants, weights) or dropped (error recovery), and the 512-bit header register both fill.

    The serializer holds one beat and hands out its ``bus_bits / 32`` words, one per cycle; a beat loads when
    the last one's words are taken (in the cycle of its last word, when the section goes on). Channel 0's
    ``ready`` is the fetcher's while it claims the channel, else the drain's or the serializer's.

    Parameters
    ----------
    bus_bits : int

    Attributes
    ----------
    i : In(stream.Signature(packet_beat_layout(bus_bits)))
        Channel 0.
    seq : In(WordPortSignature())
    fetch : In(BeatPortSignature(bus_bits))
    """

    def __init__(self, *, bus_bits: int):
        self._bus_bits = bus_bits
        super().__init__({"i": In(stream.Signature(packet_beat_layout(bus_bits))),
                          "seq": In(WordPortSignature()), "fetch": In(BeatPortSignature(bus_bits))})

    def elaborate(self, platform):
        m = Module()
        ch0, seq, fetch = self.i, self.seq, self.fetch
        W = self._bus_bits // 32
        beat_reg = Signal(self._bus_bits)
        beat_last = Signal()
        beat_full = Signal()
        widx = Signal(range(W))
        word = Signal(32)
        word_take = Signal()
        m.d.comb += [word.eq(beat_reg.word_select(widx, 32)),
                     seq.words.payload.data.eq(word), seq.words.payload.last.eq(beat_last & (widx == W - 1)),
                     seq.words.valid.eq(beat_full), word_take.eq(beat_full & seq.words.ready),
                     seq.beat_last.eq(beat_last), seq.beat_valid.eq(ch0.valid)]
        with m.If(word_take):
            m.d.sync += widx.eq(widx + 1)
            with m.If(widx == W - 1):
                m.d.sync += [beat_full.eq(0), widx.eq(0)]
        with m.If(seq.mode & (~beat_full | (word_take & (widx == W - 1) & seq.more & ~beat_last)) & ~seq.drain):
            m.d.comb += ch0.ready.eq(1)
            with m.If(ch0.valid):
                m.d.sync += [beat_reg.eq(ch0.payload.data), beat_last.eq(ch0.payload.last), beat_full.eq(1),
                             widx.eq(0)]
        with m.If(seq.drain):
            m.d.comb += ch0.ready.eq(1)
            m.d.sync += [beat_full.eq(0), widx.eq(0)]
        m.d.comb += [fetch.beats.payload.eq(ch0.payload), fetch.beats.valid.eq(ch0.valid)]
        with m.If(fetch.claim):
            m.d.comb += ch0.ready.eq(fetch.beats.ready)
        # the header register: whole beats from the fetcher, words from the sequencer
        header = Signal(HEADER_BITS)
        m.d.comb += [seq.header.eq(header), fetch.header.eq(header)]
        with m.If(fetch.shift):
            m.d.sync += header.eq(Cat(header[self._bus_bits:], ch0.payload.data))
        with m.If(seq.shift):
            m.d.sync += header.eq(Cat(header[32:], word))
        return m


class WeightFifo(wiring.Component):
    """Channel 0's weight beats between the fetcher and gearbox 0, so that the stream runs ahead of the lanes.

    Beats are decoded into 2-bit trit codes on the way in (:func:`hw.gearbox.decode_beat`), so that the
    FIFO's block-RAM read (no output register) and the base-3 decode ROM do not share a cycle (ECP5 timing;
    25 % wider FIFO words for BASE3). ``amaranth.lib.fifo.SyncFIFOBuffered``: a beat pushed in cycle ``t``
    may leave in ``t + 2``.

    Parameters
    ----------
    packing : TritPacking
    bus_bits : int
    depth : int
        Beats (``weight_fifo_beats``).

    Attributes
    ----------
    i : In(stream.Signature(beat_layout(bus_bits)))
    o : Out(stream.Signature(beat_layout(decoded_beat_bits(packing, bus_bits))))
        Gated by ``enable``.
    enable : In(1)
        The executing GEMV's gearbox 0 takes beats.
    taken : Out(1)
        A beat leaves this cycle.
    """

    #: Cycles from a beat's push to the first cycle it may leave (``SyncFIFOBuffered``; ``host.perf``)
    LATENCY = 2

    def __init__(self, *, packing: TritPacking, bus_bits: int, depth: int):
        self._packing, self._bus_bits, self._depth = TritPacking(packing), bus_bits, depth
        super().__init__({"i": In(stream.Signature(beat_layout(bus_bits))),
                          "o": Out(stream.Signature(beat_layout(decoded_beat_bits(packing, bus_bits)))),
                          "enable": In(1), "taken": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=decoded_beat_bits(self._packing, self._bus_bits),
                                                      depth=self._depth)
        dec = Module()
        m.submodules.decode = dec
        m.d.comb += [q.w_data.eq(decode_beat(dec, self.i.payload.data, self._packing)), q.w_en.eq(self.i.valid),
                     self.i.ready.eq(q.w_rdy),
                     self.o.payload.data.eq(q.r_data), self.o.valid.eq(q.r_rdy & self.enable),
                     q.r_en.eq(self.o.ready & self.enable), self.taken.eq(self.enable & q.r_rdy & self.o.ready)]
        return m


def block_rows(n, channels: int):
    """``ceil(n / channels)`` (channel 0's rows of an ``n``-row GEMV; ``n`` unsigned, below ``2**16``) without a
    divider: a shift, or for 3 channels ``((n + 2) * 43691) >> 17``, exact for ``n + 2 < 2**17`` since
    ``3 * 43691 = 2**17 + 1`` (docs/ISA.md: block ``c`` holds rows ``c, c + C, ...``)."""
    if channels == 3:
        return ((n + 2) * 43691) >> 17
    return (n + channels - 1) >> (channels - 1).bit_length()


def channel_rows(n, channels: int, c: int):
    """Rows of channel ``c`` in an ``n``-row GEMV, ``ceil((n - c) / channels)`` (0 when ``n <= c``), without a
    divider (as :func:`block_rows`, which is channel 0's)."""
    if c == 0:
        return block_rows(n, channels)
    if channels == 3:
        return Mux(n > c, ((n + (2 - c)) * 43691) >> 17, 0)
    return Mux(n > c, (n + (channels - 1 - c)) >> (channels - 1).bit_length(), 0)


def block_sections(blk_plus, trits_per_byte: int):
    """64-byte sections of a weight block, ``ceil((ceil(trits / per) + 4) / 64)`` (its packed trits and CRC word:
    ``host.image.channel_block_bytes``), from ``blk_plus = trits + 68 * trits_per_byte - 1`` (unsigned, below
    ``2**32 + 340``): ``floor(blk_plus / 256)`` for 2-bit packing, ``floor(floor(blk_plus / 64) / 5)`` for
    base-3 as ``(z * 13421773) >> 26``, exact for ``z < 2**26`` since ``5 * 13421773 = 2**26 + 1``."""
    if trits_per_byte == 5:
        return ((blk_plus >> 6) * 13421773) >> 26
    assert trits_per_byte == 4
    return blk_plus >> 8


class InstructionFetcher(wiring.Component):
    """Reads channel 0 after the image header, one instruction ahead of execution, and checks it.

    It reads an instruction's header (whole beats, the CRC over the beats, two cycles of checks), loads the
    instruction's constants into the bank the executing instruction does not read (QC once the executing
    instruction's quantize pass is over), and waits for the sequencer to dispatch it; a dispatched GEMV's
    channel-0 weight block goes into the weight FIFO, and the next header follows at once. So the next
    instruction's header and constants stream while the current GEMV computes. An error in a prefetched
    instruction is held until the sequencer would have reached it (same cause and ``ERROR_WHERE`` as a serial
    parse); a weight beat with ``tlast`` (TRUNCATED) belongs to the executing GEMV and is raised at once
    (``err_now``). It also keeps what the program wrote so far in this token (the buffers are not cleared at a
    token's start, so an instruction may read only what an earlier one wrote: ``host.image.Written``).

    Parameters
    ----------
    packing : TritPacking
    channels, bus_bits : int
    max_hidden, max_intermediate, max_layers : int
        Buffer capacities (the build's).
    lut_segments_log2 : int
    image_tlast : bool
        END_TOKEN's header must carry ``tlast``.
    const_write, qc_write : memory.WritePort.Signature
        The constant banks' and the QC buffer's beat-wide write ports (their address widths come from the
        buffers).

    Attributes
    ----------
    reader : Out(BeatPortSignature(bus_bits))
    ctrl : In(FetchSignature(max_layers))
    weights : Out(stream.Signature(beat_layout(bus_bits)))
        The dispatched GEMV's channel-0 weight beats, to :class:`WeightFifo`.
    wcrc : Out(hw.crc_pipe.BlockTapSignature(bus_bits))
        The same beats, for channel 0's :class:`hw.crc_pipe.BlockCrc`.
    const_wr : In(const_write) x MAX_CONSTS
    qc_wr : In(qc_write)
    xbank : Out(1)
        The constant bank of the executing instruction (flips at each dispatch).
    """

    #: Cycles of an instruction header's check after its last beat (F_CHECK, F_CHECK2; ``host.perf``)
    CHECK_CYCLES = 2

    def __init__(self, *, packing: TritPacking, channels: int, bus_bits: int, max_hidden: int,
                 max_intermediate: int, max_layers: int, lut_segments_log2: int, image_tlast: bool,
                 const_write: memory.WritePort.Signature, qc_write: memory.WritePort.Signature):
        self._packing, self._channels, self._bus_bits = TritPacking(packing), channels, bus_bits
        self._max_hidden, self._max_intermediate, self._max_layers = max_hidden, max_intermediate, max_layers
        self._lut_segments_log2, self._image_tlast = lut_segments_log2, image_tlast
        self._cdepth = const_bank_depth(max_hidden, max_intermediate)
        # the header's n and k arrive in its first beat
        assert all(sum(isa.field_span(InstrHeader, (name,))) <= bus_bits for name in ("n", "k"))
        super().__init__({
            "reader": Out(BeatPortSignature(bus_bits)),
            "ctrl": In(FetchSignature(max_layers)),
            "weights": Out(stream.Signature(beat_layout(bus_bits))),
            "wcrc": Out(BlockTapSignature(bus_bits)),
            "const_wr": In(const_write).array(isa.MAX_CONSTS),
            "qc_wr": In(qc_write),
            "xbank": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        s = _FetchState(self, m)
        s.constants()
        s.checks()
        s.fsm()
        return m


class _FetchState:
    """The fetcher's signals, and the logic that builds them in three parts (constants, checks, FSM)."""

    def __init__(self, f: InstructionFetcher, m: Module):
        self.f, self.m = f, m
        C, bus = f._channels, f._bus_bits
        self.W = bus // 32
        self.beat_bytes = bus // 8
        self.b = f.reader.beats
        self.ih = data.View(InstrHeader, f.reader.header)
        self.img = f.ctrl.image
        self.nl = _pow2(f._max_layers)
        m.submodules.crc = self.crc = CrcPipe(bus)
        m.d.comb += [self.crc.data.eq(self.b.payload.data), f.ctrl.instr.eq(self.ih),
                     f.weights.payload.data.eq(self.b.payload.data), f.wcrc.data.eq(self.b.payload.data)]
        self.cvec, self.cbeat = Signal(3), Signal(16)     # constants: current vector and its beat
        self.xbank = f.xbank
        self.f_block_beats = Signal(24)                   # channel-0 weight beats of the fetched instruction
        self.x_block_beats = f.ctrl.block_beats           # ... of the executing one (registered at dispatch)
        self.q_words, self.n_words = Signal(16), Signal(16)
        self.const_vecs = Signal(3)                        # constant vectors (QC + C*)
        self.is_qc = Signal()
        self.vec_beats = Signal(16)
        self.chk = {n: Signal(name=f"chk_{n}") for n in ("opcode", "microop", "shape", "truncated", "consts")}
        self.st = {n: Signal(name=f"st_{n}") for n in ("x", "a", "p", "sn")}
        self.sz_k = Signal(16)
        self.sz_rows = [Signal(16, name=f"sz_rows{c}") for c in range(C)]
        self.sz_blk = [Signal(33, name=f"sz_blk{c}") for c in range(C)]  # rows * k + (68 * per - 1)
        self.per = 5 if f._packing is TritPacking.BASE3 else 4
        self.block_beats = Signal(24)
        self.wb_expect = Signal(40)
        self.f_words = Signal(32)          # image words up to the instruction being fetched
        self.f_codes_k = Signal(16)        # k of the codes a REUSE_CODES GEMV would reuse (program order)
        self.w_x, self.w_a, self.w_p = Signal(16), Signal(16), Signal(16)
        self.w_layers = Signal(self.nl)    # layers of STATE_NEW written whole
        self.instr_const_words = Signal(20)
        self.f_idx = f.ctrl.idx            # index of the instruction being fetched
        self.f_at_end = Signal()           # f_idx == n_instructions, registered with f_idx
        self.f_cnt = Signal(24)            # header or weight beats of the current section
        self.f_last = Signal()             # the header's last beat carried tlast
        self.crc_valid, self.crc_start = Signal(), Signal()
        m.d.comb += [self.crc.valid.eq(self.crc_valid), self.crc.start.eq(self.crc_start)]

    def constants(self):
        """Constant vectors: sizes, beat-wide writes into the bank the executing instruction does not read."""
        f, m, ih = self.f, self.m, self.ih
        qconst = flag(ih.flags, InstrFlags.QCONST)
        m.d.comb += [
            self.q_words.eq(((ih.k + 15) >> 4) << 4),
            self.n_words.eq(((ih.n + 15) >> 4) << 4),
            self.const_vecs.eq(ih.n_consts + qconst),
            self.is_qc.eq(qconst & (self.cvec == 0)),
            self.instr_const_words.eq(Mux(qconst, self.q_words, 0) + ih.n_consts * self.n_words),
        ]
        with m.If(self.is_qc):
            m.d.comb += self.vec_beats.eq((self.q_words * 4) // self.beat_bytes)
        with m.Else():
            m.d.comb += self.vec_beats.eq((self.n_words * 4) // self.beat_bytes)
        self.to_consts = Signal()      # F_CONSTS takes channel 0's beats
        cwaddr = Signal(16)
        m.d.comb += cwaddr.eq(self.cbeat + Mux(self.xbank, 0, self._cdepth_beats()))
        for j, port in enumerate(f.const_wr):
            cj = Signal(3, name=f"cidx{j}")
            m.d.comb += cj.eq(self.cvec - qconst)
            m.d.comb += [port.addr.eq(cwaddr), port.data.eq(self.b.payload.data),
                         port.en.eq(self.to_consts & self.b.valid & ~self.is_qc & (cj == j))]
        m.d.comb += [f.qc_wr.addr.eq(self.cbeat), f.qc_wr.data.eq(self.b.payload.data),
                     f.qc_wr.en.eq(self.to_consts & self.b.valid & self.is_qc)]
        with m.If(self.to_consts):
            m.d.comb += [self.b.ready.eq(1), f.reader.claim.eq(1), self.crc_valid.eq(self.b.valid)]
        # every channel's block sized without a divider on the path: rows and k from the header's first beat,
        # their product (plus the rounding) registered the next cycle, divided by a constant in F_CHECK2
        for c in range(f._channels):    # round_up(packed + 4, 64): the CRC word
            m.d.sync += self.sz_blk[c].eq(self.sz_rows[c] * self.sz_k + (68 * self.per - 1))
        m.d.comb += self.block_beats.eq(block_sections(self.sz_blk[0], self.per) * (64 // self.beat_bytes))
        m.d.comb += self.wb_expect.eq(sum(Mux(self.sz_rows[c] != 0, block_sections(self.sz_blk[c], self.per), 0)
                                          for c in range(f._channels)) * 64)

    def _cdepth_beats(self) -> int:
        return self.f._cdepth // self.W

    def checks(self):
        """F_CHECK's header checks (combinational from the header register; registered by the FSM)."""
        f, m, ih, img = self.f, self.m, self.ih, self.img
        nl = self.nl
        self.bad_op, self.bad_shape = Signal(), Signal()
        op_ok, cap_bad, self.stores = [], [], []
        max_k = max(f._max_hidden, f._max_intermediate)
        layer_bit = (lambda v: v.bit_select(ih.layer[:ceil_log2(nl)], 1)) if nl > 1 else (lambda v: v[0])
        reads_ops = (MicroOpcode.LD, MicroOpcode.MULV, MicroOpcode.ADDV, MicroOpcode.SSQ, MicroOpcode.AMAX)
        for j in range(isa.MAX_OPS):
            u = ih.ops[j]
            code, bufv = u.op.as_value(), u.buf.as_value()
            used = j < ih.n_ops
            is_const = (bufv >= Buffer.C0.value) & (bufv <= Buffer.C3.value)
            const_ok = ~is_const | ((bufv - Buffer.C0.value) < ih.n_consts)
            buf_ok = (bufv <= Buffer.TOKEN.value) | is_const | (bufv == Buffer.NONE.value)
            sig = (code == MicroOpcode.SIG.value) | (code == MicroOpcode.SIGNEG.value) | \
                (code == MicroOpcode.SILU.value)
            sig_ok = ~sig | (u.shift >= f._lut_segments_log2 - nx.LUT_RANGE_LOG2)
            # a store only to X, A, P, STATE_NEW; LD, MULV, ADDV read a buffer (not NONE)
            st_ok = (code != MicroOpcode.ST.value) | Cat(*[bufv == b.value for b in (
                Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_NEW)]).any()
            rd_ok = ~Cat(*[code == o.value for o in (MicroOpcode.LD, MicroOpcode.MULV, MicroOpcode.ADDV)]
                         ).any() | (bufv != Buffer.NONE.value)
            op_ok.append(~used | (buf_ok & (u.shift <= 62) & const_ok & sig_ok & (code <= 15) & st_ok & rd_ok))
            # the elements the program touches in a buffer: n of them (GEMV, LOAD_TOKEN)
            acc_buf = Cat(*[code == o.value for o in (MicroOpcode.LD, MicroOpcode.ST, MicroOpcode.MULV,
                                                      MicroOpcode.ADDV, MicroOpcode.SSQ, MicroOpcode.AMAX)]
                          ).any() & (bufv != Buffer.NONE.value)
            h_sized = Cat(*[bufv == b.value for b in (Buffer.X, Buffer.STATE_OLD, Buffer.STATE_NEW,
                                                      Buffer.TOKEN)]).any()
            v_sized = (bufv == Buffer.A.value) | (bufv == Buffer.P.value)
            cap_bad.append(used & acc_buf & ((h_sized & (ih.n > img.hidden)) | (v_sized & (ih.n > img.vmax))))
            reads = Cat(*[code == o.value for o in reads_ops]).any()
            have = Mux(bufv == Buffer.X.value, self.w_x, Mux(bufv == Buffer.A.value, self.w_a, self.w_p))
            xap = (bufv == Buffer.X.value) | v_sized
            # STATE_NEW of the instruction's layer must have been written whole (a one-layer build checks
            # that layer 0 was written whatever the buffer)
            sn_unwritten = ((bufv == Buffer.STATE_NEW.value) & ~layer_bit(self.w_layers)) if nl > 1 else \
                ~self.w_layers[0]
            cap_bad.append(used & reads & ((xap & (ih.n > have)) | sn_unwritten))
            self.stores.append((used & (code == MicroOpcode.ST.value), bufv))
        # hazard rule: no read of a buffer after a store to it in the same program (docs/ISA.md)
        hazards = []
        for j in range(isa.MAX_OPS):
            uj = ih.ops[j]
            reads_j = Cat(*[uj.op == o for o in reads_ops]).any()
            for i in range(j):
                ui = ih.ops[i]
                hazards.append((j < ih.n_ops) & reads_j & (ui.op == MicroOpcode.ST)
                               & (ui.buf.as_value() == uj.buf.as_value()))
        m.d.comb += self.bad_op.eq(~Cat(*op_ok).all() | (ih.n_ops > isa.MAX_OPS) | Cat(*hazards).any())
        self.opc = ih.opcode.as_value()
        self.is_gemv = is_gemv = ih.opcode == Opcode.GEMV
        self.is_load = is_load = ih.opcode == Opcode.LOAD_TOKEN
        self.is_end = is_end = ih.opcode == Opcode.END_TOKEN
        kk, nn = ih.k, ih.n
        self.srcv = srcv = ih.src.as_value()
        reuse = flag(ih.flags, InstrFlags.REUSE_CODES)
        m.d.comb += self.bad_shape.eq(
            (is_gemv & ((kk == 0) | (kk > max_k) | ((kk != img.hidden) & (kk != img.intermediate))
                        | ((nn != img.hidden) & (nn != img.intermediate) & (nn != img.vocab))
                        | ((srcv == Buffer.X.value) & (kk > img.hidden)) | (reuse & (self.f_codes_k != kk))))
            | (is_load & (nn != img.hidden))
            | ((is_gemv | is_load) & ((ih.layer >= img.n_layers) | Cat(*cap_bad).any()))
            | (is_gemv & ~reuse & (kk > Mux(srcv == Buffer.X.value, self.w_x,
                                            Mux(srcv == Buffer.A.value, self.w_a, self.w_p))))
            | (is_end & ((self.w_layers & img.layer_mask) != img.layer_mask))
            # END_TOKEN: the last instruction, where image_words says the image ends, and with tlast
            | (is_end & ((self.f_idx != img.n_instructions_m1) | (self.f_words + 16 != img.image_words)
                         | (~self.f_last if f._image_tlast else 0))))
        self.src_ok = (srcv <= Buffer.TOKEN.value) | ((srcv >= Buffer.C0.value) & (srcv <= Buffer.C3.value)) \
            | (srcv == Buffer.NONE.value)

    def fail(self, cause: ErrorCause, now: bool = False):
        f = self.f
        return [f.ctrl.err.eq(1), f.ctrl.err_now.eq(now), f.ctrl.err_cause.eq(cause.value)]

    def fsm(self):
        f, m = self.f, self.m
        kill = f.ctrl.kill
        with m.If(kill):
            m.d.sync += [f.ctrl.err.eq(0), f.ctrl.err_now.eq(0)]

        @contextmanager
        def fstate(name):
            with m.State(name):
                yield
                with m.If(kill):
                    m.next = "F_IDLE"

        with m.FSM(init="F_IDLE", name="fetch"):
            self._header_states(fstate)
            self._body_states(fstate)

    def _header_states(self, fstate):
        f, m, ih, b, img = self.f, self.m, self.ih, self.b, self.img
        C = f._channels
        hdr_beats = isa.layout_bytes(InstrHeader) // self.beat_bytes
        with fstate("F_IDLE"):
            with m.If(f.ctrl.start):   # the image header is in the header register, n_instructions loads
                n0 = data.View(isa.ImageHeader, f.reader.header).n_instructions
                m.d.sync += [self.f_idx.eq(0), self.f_cnt.eq(0), self.f_at_end.eq(n0 == 0), self.f_words.eq(16),
                             self.f_codes_k.eq(0), self.w_x.eq(0), self.w_a.eq(0), self.w_p.eq(0),
                             self.w_layers.eq(0)]
                m.next = "F_HDR"
        with fstate("F_HDR"):
            with m.If(self.f_at_end):
                m.d.sync += self.fail(ErrorCause.NO_END)
                m.next = "F_ERR"
            with m.Else():
                m.d.comb += [b.ready.eq(1), f.reader.claim.eq(1), self.crc_valid.eq(b.valid),
                             self.crc_start.eq(self.f_cnt == 0)]
                with m.If(b.valid):
                    m.d.comb += f.reader.shift.eq(1)
                    m.d.sync += [self.f_cnt.eq(self.f_cnt + 1), self.f_last.eq(b.payload.last)]
                    with m.If(self.f_cnt == 0):      # the header's n and k are in the first beat
                        first = data.View(InstrHeader, Cat(b.payload.data, Const(0, HEADER_BITS - f._bus_bits)))
                        m.d.sync += [self.sz_rows[c].eq(channel_rows(first.n, C, c)) for c in range(C)]
                        m.d.sync += self.sz_k.eq(first.k)
                    with m.If(self.f_cnt == hdr_beats - 1):
                        m.d.sync += self.f_cnt.eq(0)
                        m.next = "F_CHECK"
                    with m.Elif(b.payload.last):    # the stream ends inside the header
                        m.d.sync += self.fail(ErrorCause.TRUNCATED)
                        m.next = "F_ERR"
        with fstate("F_CHECK"):
            # the checks, registered; F_CHECK2 acts on them in the same order of precedence
            chk, opc, srcv, is_gemv, is_end = self.chk, self.opc, self.srcv, self.is_gemv, self.is_end
            m.d.sync += [chk["opcode"].eq((opc < Opcode.GEMV.value) | (opc > Opcode.END_TOKEN.value)
                                          | ((ih.flags.as_value() & ~Const(_KNOWN_FLAGS, 8)) != 0)),
                         chk["microop"].eq(self.bad_op | (ih.n_consts > isa.MAX_CONSTS) | ~self.src_ok
                                           | (is_gemv & (srcv != Buffer.X.value) & (srcv != Buffer.A.value)
                                              & (srcv != Buffer.P.value))),
                         chk["shape"].eq(self.bad_shape),
                         chk["truncated"].eq(self.f_last & ~is_end),
                         chk["consts"].eq(~is_end & (self.const_vecs != 0))]
            # this program's stores, registered for F_CHECK2's update of the written extents
            for bb, reg in ((Buffer.X, self.st["x"]), (Buffer.A, self.st["a"]), (Buffer.P, self.st["p"])):
                m.d.sync += reg.eq(Cat(*[st & (sb == bb.value) for st, sb in self.stores]).any())
            m.d.sync += self.st["sn"].eq(Cat(*[st & (sb == Buffer.STATE_NEW.value) for st, sb in self.stores]).any()
                                         & (ih.n >= img.hidden) & (is_gemv | self.is_load))
            m.next = "F_CHECK2"
        with fstate("F_CHECK2"):
            self._check2()

    def _check2(self):
        m, ih, chk = self.m, self.ih, self.chk
        nl = self.nl
        m.d.sync += [self.cvec.eq(0), self.cbeat.eq(0), self.f_cnt.eq(0), self.f_block_beats.eq(self.block_beats)]
        # in precedence order; TRUNCATED: the image ends with this header. The CRC has taken the header's last
        # beat by now (it runs a cycle behind the stream); weight_bytes: every channel's block (F_CHECK2 is at
        # least two cycles after the header's first beat)
        wb_bad = ih.weight_bytes != Mux(self.is_gemv, self.wb_expect, 0)
        failures = ((~self.crc.match, ErrorCause.INSTR_CRC), (chk["opcode"], ErrorCause.UNKNOWN_OPCODE),
                    (chk["microop"], ErrorCause.BAD_MICROOP), (chk["shape"] | wb_bad, ErrorCause.BAD_SHAPE),
                    (chk["truncated"], ErrorCause.TRUNCATED))
        for i, (cond, cause) in enumerate(failures):
            with (m.If if i == 0 else m.Elif)(cond):
                m.d.sync += self.fail(cause)
                m.next = "F_ERR"
        with m.Elif(chk["consts"]):
            m.next = "F_CONSTS"
        with m.Else():
            m.next = "F_READY"
        # the image's words so far (END_TOKEN compares them with image_words); the codes REUSE_CODES reuses
        m.d.sync += self.f_words.eq(self.f_words + 16 + self.instr_const_words + (ih.weight_bytes >> 2))
        with m.If(self.is_gemv & ~flag(ih.flags, InstrFlags.REUSE_CODES)):
            m.d.sync += self.f_codes_k.eq(ih.k)
        for st, reg in ((self.st["x"], self.w_x), (self.st["a"], self.w_a), (self.st["p"], self.w_p)):
            with m.If(st & (ih.n > reg)):
                m.d.sync += reg.eq(ih.n)
        with m.If(self.st["sn"]):
            m.d.sync += self.w_layers.bit_select(ih.layer[:ceil_log2(nl)], 1).eq(1) if nl > 1 else \
                self.w_layers[0].eq(1)

    def _body_states(self, fstate):
        f, m, b = self.f, self.m, self.b
        with fstate("F_CONSTS"):
            # into the bank the executing instruction does not read; QC once its quantize pass is over
            with m.If(~f.ctrl.qc_busy):
                m.d.comb += [self.to_consts.eq(1), self.crc_start.eq((self.cvec == 0) & (self.cbeat == 0))]
                with m.If(b.valid):
                    m.d.sync += self.cbeat.eq(self.cbeat + 1)
                    with m.If(self.cbeat == self.vec_beats - 1):
                        m.d.sync += [self.cbeat.eq(0), self.cvec.eq(self.cvec + 1)]
                        with m.If(self.cvec == self.const_vecs - 1):
                            m.next = "F_CWAIT"
                    with m.If(b.payload.last):
                        m.d.sync += self.fail(ErrorCause.TRUNCATED)
                        m.next = "F_ERR"
        with fstate("F_CWAIT"):
            m.next = "F_CCHECK"       # the CRC takes the last constant beat (a cycle behind the stream)
        with fstate("F_CCHECK"):
            with m.If(self.crc.crc != self.ih.const_crc):
                m.d.sync += self.fail(ErrorCause.CONST_CRC)
                m.next = "F_ERR"
            with m.Else():
                m.next = "F_READY"
        with fstate("F_READY"):
            m.d.comb += f.ctrl.ready.eq(1)
            with m.If(f.ctrl.dispatch):
                m.d.sync += [self.f_idx.eq(self.f_idx + 1), self.f_cnt.eq(0),
                             self.f_at_end.eq(self.f_idx + 1 == f.ctrl.image.n_instructions),
                             self.xbank.eq(~self.xbank), self.x_block_beats.eq(self.f_block_beats)]
                with m.If(self.is_gemv):
                    m.next = "F_WEIGHTS"
                with m.Elif(self.is_end):
                    m.next = "F_IDLE"    # the next token packet belongs to the sequencer's word reader
                with m.Else():
                    m.next = "F_HDR"
        with fstate("F_WEIGHTS"):
            # the dispatched GEMV's channel-0 block, into the weight FIFO
            taken = b.valid & f.weights.ready
            m.d.comb += [f.reader.claim.eq(1), b.ready.eq(f.weights.ready), f.weights.valid.eq(b.valid),
                         f.wcrc.valid.eq(taken), f.wcrc.start.eq(self.f_cnt == 0),
                         f.wcrc.last.eq(self.f_cnt == self.x_block_beats - 1)]
            with m.If(taken):
                m.d.sync += self.f_cnt.eq(self.f_cnt + 1)
                with m.If(b.payload.last):   # the image ends with END_TOKEN: no weight beat may be last
                    m.d.sync += self.fail(ErrorCause.TRUNCATED, now=True)
                    m.next = "F_ERR"
                with m.Elif(self.f_cnt == self.x_block_beats - 1):
                    m.d.sync += self.f_cnt.eq(0)
                    m.next = "F_HDR"
        with fstate("F_ERR"):
            pass
