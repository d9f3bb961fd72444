"""Trit gearbox: one weight channel's packed bytes -> row-aligned chunks of ``lanes`` trits.

docs/RTL.md, ``hw/gearbox.py``. A weight block (:func:`host.image.channel_block_bytes`) is ``rows`` rows
of ``K`` trits packed continuously with :func:`hw.isa.pack_trits` (a row may start in the middle of a
byte), zero-padded to whole 64-byte sections (:data:`hw.isa.SECTION_BYTES`) whose last 4 bytes are the block's
CRC word. The gearbox takes one :class:`GearboxCmd` per block, consumes exactly the block's beats (padding and
CRC word included, never decoded as trits: the core checks the CRC beside it) and emits
``rows * ceil(K / lanes)`` chunks (layout :func:`hw.streams.trit_chunk_layout`): chunk ``j`` of a row holds
trits ``[j * lanes, min((j + 1) * lanes, K))`` of that row in lanes ``0 .. count - 1``; other lanes are 0.

Microarchitecture
-----------------
* **Decode** (input side, combinational, before the window): each accepted beat becomes ``beat_trits``
  2-bit codes (:data:`hw.isa.TRIT_2BIT_CODES`: 0 = ``0b00``, +1 = ``0b01``, -1 = ``0b11``; ``0b10`` =
  invalid). ``BITS2`` bytes already are four such codes. ``BASE3`` bytes go through a 256 x 10-bit ROM
  (an ``amaranth.lib.memory.Memory`` with one asynchronous read port per byte lane) built from
  :data:`hw.isa.BASE3_DECODE`; bytes 243-255 decode to five ``0b10`` codes. Why a ROM: each output bit
  is an arbitrary 8-input function, so on LUT6 fabrics a table is 4 LUT6 + MUXF7/F8 per bit (~40 LUTs per
  byte lane, one logic level), no deeper than and as small as a divide-by-3 chain; a block-RAM ROM would
  cost ``bus_bits / 16`` BRAMs per gearbox and a cycle of latency. The invalid marker travels with every
  trit, so the error check applies to exactly the block's data trits (as ``host.image._check_trits``
  does: every body byte for ``BASE3``, the first ``rows * K`` codes for ``BITS2``; never padding).
* **Input side**: the block's trit count ``rows * K`` (< 2**32) is registered with the command (one
  16 x 16 multiply in the command prefetch register; control only, nothing multiplies data). A beat holds
  data while fewer than ``rows * K`` trits were taken (a signed remaining-trits down-counter); data beats
  go into the window; the rest of the last data beat's 64-byte section, and one more section when fewer
  than 4 bytes follow the data in it (the CRC word needs them: ``round_up(packed + 4, 64)`` bytes a block), is
  accepted and dropped at the input (``pad_left``).
  The input side may run one command ahead of the output side.
* **Window**: ``window_beats = ceil((beat_trits - 1 + lanes) / beat_trits) + 1`` slots of decoded beats
  and a trit offset ``off`` into slot 0. A chunk is the window shifted right by ``off`` trits (one barrel
  shifter of ``beat_trits - 1 + lanes`` trits), lanes ``>= count`` zeroed, invalid codes replaced by 0.
  Fully consumed beats leave the head (after a block's last chunk, its last data beat too: the next
  block starts at a beat boundary).
* **Output side**: row/column counters; ``count = min(lanes, trits left in the row)``.

Throughput and latency
----------------------
One chunk per cycle while the input keeps up (``i.ready`` depends on registers only, not on ``o.ready``).
A beat accepted in cycle ``t`` can be part of a chunk valid on ``o`` from cycle ``t + 2``
(:attr:`TritGearbox.BEAT_LATENCY`). A command accepted in cycle ``t`` produces its first chunk no earlier
than ``t + 4`` (:attr:`TritGearbox.CMD_LATENCY`); commands queue (one in a
prefetch register, one per side), so back-to-back blocks stream without bubbles on the output except while
the input spends cycles on padding beats (at most ``64 * 8 / bus_bits - 1`` per block).

Resources: one 16 x 16 multiplier (``rows * K``, once per command), no block RAM. Registers:
``2 * beat_trits * window_beats`` window bits, the ``2 * lanes + ...`` output register, about 200 bits of
commands and counters. Logic: the window barrel shifter (``ceil(log2(beat_trits))`` levels of
``2 * (beat_trits - 1 + lanes)`` 2:1 muxes), the window slot muxes (``window_beats`` inputs), the ``BASE3``
ROM (``bus_bits / 8`` LUT copies), a 34-bit remaining-trits counter.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hw import isa
from hw.isa import SECTION_BYTES, TRIT_2BIT_CODES, TritPacking
from hw.streams import trit_chunk_layout

__all__ = ["GearboxCmd", "beat_layout", "decoded_beat_bits", "decode_beat", "TritGearbox", "BUS_BITS", "MIN_LANES",
           "MAX_LANES", "INVALID_CODE"]

BUS_BITS = (32, 64, 128, 256, 512)  #: supported beat widths (64-byte sections are whole beats)
MIN_LANES = 4
MAX_LANES = 256
INVALID_CODE = 0b10  #: the 2-bit code that marks an invalid trit (2-bit 0b10, or any digit of a byte > 242)


class GearboxCmd(data.Struct):
    """One weight block: ``rows`` rows of ``k`` trits (``host.image.channel_rows(n, channels, c)``, the
    instruction's ``InstrHeader.k``). ``rows == 0`` or ``k == 0``: an empty block (no beats, no chunks)."""

    rows: unsigned(16)
    k: unsigned(16)


def beat_layout(bus_bits: int) -> data.StructLayout:
    """Input beat: ``{data: unsigned(bus_bits)}``, byte ``b`` of the stream in bits ``8b+7 .. 8b``."""
    return data.StructLayout({"data": unsigned(bus_bits)})


def decoded_beat_bits(packing: TritPacking, bus_bits: int) -> int:
    """Bits of a decoded beat: 2 per trit, ``bus_bits / 8 * (4 or 5)`` trits (``BITS2`` or ``BASE3``)."""
    return bus_bits // 8 * (4 if packing is TritPacking.BITS2 else 5) * 2


def decode_beat(m: Module, beat, packing: TritPacking):
    """The 2-bit codes of a beat's trits (:data:`hw.isa.TRIT_2BIT_CODES`, ``0b10`` for an invalid byte),
    combinational: ``BITS2`` bytes are their codes already; ``BASE3`` bytes go through a 256 x 10-bit ROM in
    LUTs, one asynchronous read port per byte (module docstring). Returns a value of
    :func:`decoded_beat_bits` bits, trit ``t`` in bits ``2t+1 .. 2t``."""
    if packing is TritPacking.BITS2:
        return beat
    rom = memory.Memory(shape=unsigned(10), depth=256, init=_base3_rom())
    m.submodules.base3_rom = rom
    words = []
    for b in range(len(beat) // 8):
        port = rom.read_port(domain="comb")
        m.d.comb += port.addr.eq(beat.word_select(b, 8))
        words.append(port.data)
    return Cat(*words)


def _base3_rom() -> list[int]:
    """256 words of 10 bits: the five 2-bit codes of a base-3 byte, digit ``i`` in bits ``2i+1 .. 2i``
    (:data:`hw.isa.BASE3_DECODE`); bytes above 242 give :data:`INVALID_CODE` in all five digits."""
    words = []
    for byte in range(256):
        word = 0
        for i in range(5):
            code = TRIT_2BIT_CODES[int(isa.BASE3_DECODE[byte, i])] if byte <= 242 else INVALID_CODE
            word |= code << (2 * i)
        words.append(word)
    return words


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {value!r}")
    return value


class TritGearbox(wiring.Component):
    """Decodes one channel's weight blocks into row-aligned chunks of ``lanes`` trits.

    Parameters
    ----------
    packing : hw.isa.TritPacking
        ``BITS2`` (4 trits per byte) or ``BASE3`` (5 trits per byte), as ``ImageHeader.packing``.
    bus_bits : int
        Beat width, one of :data:`BUS_BITS`.
    lanes : int
        Trits per chunk, ``MIN_LANES <= lanes <= MAX_LANES`` (any integer).
    predecoded : bool
        The beats arrive decoded (:func:`decode_beat` applied upstream, e.g. in front of a FIFO, so that the
        FIFO's block-RAM read and the ``BASE3`` ROM do not share a cycle): ``i.payload.data`` then has
        :func:`decoded_beat_bits` bits. Default False.

    Attributes
    ----------
    cmd : In(stream.Signature(GearboxCmd))
        One command per weight block, in stream order.
    i : In(stream.Signature(beat_layout(bus_bits)))
        (``beat_layout(decoded_beat_bits(packing, bus_bits))`` when ``predecoded``.)
        The channel's beats; exactly ``host.image.channel_block_bytes(...) / (bus_bits / 8)`` beats are
        taken per command (a block of ``rows * K = 0`` trits takes none), never a beat of a block whose
        command has not been accepted.
    o : Out(stream.Signature(hw.streams.trit_chunk_layout(lanes)))
        ``trits`` (``signed(2)`` per lane, lanes ``>= count`` are 0, an invalid code reads 0), ``count``,
        ``first``, ``last`` (row), ``end`` (block's last chunk). Registered.
    bad_trit : Out(1)
        Sticky: an invalid code was among the ``count`` trits of a chunk. Set in the cycle that chunk is
        loaded into the output register, so it reads 1 from the first cycle the chunk is valid on ``o``.
    clear : In(1)
        ``clear = 1`` in cycle ``t`` makes ``bad_trit`` read 0 from cycle ``t + 1``, unless a bad chunk is
        loaded in cycle ``t`` (setting wins). Affects nothing else.
    blk_last : Out(1)
        The beat transferred on ``i`` this cycle is its block's last (the beat holding the CRC word): the core
        checks each block's CRC over the beats it takes (``hw/top.py``).

    Raises
    ------
    TypeError
        If ``packing`` is not a :class:`hw.isa.TritPacking` or ``bus_bits``/``lanes`` are not ints.
    ValueError
        If ``bus_bits`` or ``lanes`` is out of range.
    """

    #: Cycles from a command's transfer (cycle ``t``, its beats waiting) to its first chunk valid on ``o``
    #: (``t + CMD_LATENCY``; ``host.perf.GEARBOX_CMD_LATENCY``)
    CMD_LATENCY = 4
    #: Cycles from a beat's transfer on ``i`` (cycle ``t``) to the first cycle a chunk holding its trits can be
    #: valid on ``o`` (``t + BEAT_LATENCY``: the window register, then the output register)
    BEAT_LATENCY = 2

    def __init__(self, *, packing: TritPacking, bus_bits: int, lanes: int, predecoded: bool = False):
        if not isinstance(packing, TritPacking):
            raise TypeError(f"packing must be a hw.isa.TritPacking, not {packing!r}")
        bus_bits = _check_int("bus_bits", bus_bits)
        if bus_bits not in BUS_BITS:
            raise ValueError(f"bus_bits must be one of {BUS_BITS}, got {bus_bits}")
        lanes = _check_int("lanes", lanes)
        if not MIN_LANES <= lanes <= MAX_LANES:
            raise ValueError(f"lanes must be in {MIN_LANES}..{MAX_LANES}, got {lanes}")
        self._packing = packing
        self._bus_bits = bus_bits
        self._lanes = lanes
        self._predecoded = bool(predecoded)
        per_byte = 4 if packing is TritPacking.BITS2 else 5
        self._per_byte = per_byte
        self._beat_trits = bus_bits // 8 * per_byte
        self._chunk_beats = -(-(self._beat_trits - 1 + lanes) // self._beat_trits)
        super().__init__({
            "cmd": In(stream.Signature(GearboxCmd)),
            "i": In(stream.Signature(beat_layout(decoded_beat_bits(packing, bus_bits) if predecoded else bus_bits))),
            "o": Out(stream.Signature(trit_chunk_layout(lanes))),
            "bad_trit": Out(1),
            "clear": In(1),
            "blk_last": Out(1),
        })

    @property
    def packing(self) -> TritPacking:
        return self._packing

    @property
    def predecoded(self) -> bool:
        return self._predecoded

    @property
    def bus_bits(self) -> int:
        return self._bus_bits

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def beat_trits(self) -> int:
        """Trits per beat: ``bus_bits / 8`` bytes of 4 (``BITS2``) or 5 (``BASE3``) trits."""
        return self._beat_trits

    @property
    def window_beats(self) -> int:
        """Decoded beats the window holds: the most one chunk can touch, plus one for throughput."""
        return self._chunk_beats + 1

    def elaborate(self, platform):
        m = Module()
        L = self._lanes
        W = self._beat_trits
        M = self._chunk_beats            # beats one chunk may touch (and drop)
        NB = M + 1                        # window slots
        S = SECTION_BYTES * 8 // self._bus_bits  # beats per 64-byte section
        code_beat = data.ArrayLayout(unsigned(2), W)

        # ------------------------------------------------------------------------------ decode
        decoded = Signal(code_beat)
        beat = self.i.payload.data
        m.d.comb += decoded.eq(beat if self._predecoded else decode_beat(m, beat, self._packing))

        # ------------------------------------------------------------------- command prefetch
        # The block's trit count rows * K (< 2**32) is registered with the command: one 16 x 16 multiply.
        pend = Signal(GearboxCmd)
        pend_total = Signal(32)
        pend_valid = Signal()
        m.d.comb += self.cmd.ready.eq(~pend_valid)
        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [pend.eq(self.cmd.payload), pend_total.eq(self.cmd.payload.rows * self.cmd.payload.k),
                         pend_valid.eq(1)]

        outq = Signal(GearboxCmd)        # taken by the input side, waiting for the output side
        outq_valid = Signal()

        # ------------------------------------------------------------------------- input side
        in_active = Signal()
        in_rem = Signal(signed(34))      # data trits of the block not yet taken (<= 0: padding follows)
        nb = Signal(range(NB + 1))       # valid window slots
        in_data = Signal()
        in_pad = Signal()
        # in_rem <= 0, in_rem <= W and in_rem <= T, registered with in_rem: the end-of-block test is a mux of
        # flags, not a 34-bit subtraction and compare in front of the input control (a short path at the ECP5
        # clock). T: the last data beat leaves fewer than 4 bytes for the CRC word when in_rem > T
        T = (self._bus_bits // 8 - 4) * self._per_byte
        rem_le0, rem_le_w, rem_le_t = Signal(init=1), Signal(init=1), Signal(init=1)
        pad_left = Signal(range(2 * S))  # beats after the data: padding, the CRC word's beat (dropped here)
        m.d.comb += in_data.eq(in_active & ~rem_le0)
        m.d.comb += in_pad.eq(in_active & rem_le0)
        bidx = Signal(range(S)) if S > 1 else Const(0, 1)   # beat index within the 64-byte section
        m.d.comb += self.i.ready.eq((in_data & (nb < NB)) | in_pad)
        xfer = self.i.valid & self.i.ready
        wr = Signal()
        m.d.comb += wr.eq(xfer & in_data)

        rem_n = Signal(signed(34))
        in_done_n = Signal()
        last_data = Signal()             # this beat is the block's last data beat
        pad_after = Signal(range(2 * S))  # beats after it: the rest of its section, and one more section when
        # fewer than 4 bytes follow the data in it (the CRC word is the block's last 4 bytes)
        m.d.comb += rem_n.eq(in_rem - Mux(wr, W, 0))
        rem_n_le0 = Mux(wr, rem_le_w, rem_le0)     # rem_n <= 0
        m.d.comb += [last_data.eq(wr & rem_n_le0),
                     pad_after.eq((S - 1 - bidx) + Mux((bidx == S - 1) & ~rem_le_t, S, 0)),
                     in_done_n.eq((last_data & (pad_after == 0)) | (in_pad & xfer & (pad_left == 1)))]
        m.d.comb += self.blk_last.eq(xfer & in_done_n)
        with m.If(in_active):
            m.d.sync += [in_rem.eq(rem_n), rem_le0.eq(rem_n <= 0), rem_le_w.eq(rem_n <= W), rem_le_t.eq(rem_n <= T)]
            if S > 1:
                m.d.sync += bidx.eq(bidx + xfer)
            with m.If(last_data):
                m.d.sync += pad_left.eq(pad_after)
            with m.Elif(in_pad & xfer):
                m.d.sync += pad_left.eq(pad_left - 1)
            with m.If(in_done_n):
                m.d.sync += in_active.eq(0)

        in_load = Signal()
        m.d.comb += in_load.eq(pend_valid & ~outq_valid & (~in_active | in_done_n))
        with m.If(in_load):
            m.d.sync += [
                pend_valid.eq(0),
                outq.eq(pend),
                outq_valid.eq(1),
                in_active.eq(pend_total != 0),
                in_rem.eq(pend_total),
                rem_le0.eq(pend_total == 0),
                rem_le_w.eq(pend_total <= W),
                rem_le_t.eq(pend_total <= T),
            ]

        # ------------------------------------------------------------------------ output side
        out_active = Signal()
        rows_left = Signal(16)
        col_left = Signal(16)            # trits of the row from the current chunk on
        kreg = Signal(16)
        cnt = Signal(range(L + 1))       # min(L, col_left)
        last = Signal()                  # col_left <= L
        last_row = Signal()              # rows_left == 1
        first = Signal()
        first_cnt = Signal(range(L + 1))  # min(L, K)
        first_last = Signal()            # K <= L
        off = Signal(range(W))

        avail = Signal(range(NB * W + 1))  # trits in the window from slot 0, trit 0
        with m.Switch(nb):
            for n in range(NB + 1):
                with m.Case(n):
                    m.d.comb += avail.eq(n * W)
        end_pos = Signal(range(W + L))
        m.d.comb += end_pos.eq(off + cnt)
        take = Signal()
        m.d.comb += take.eq(out_active & (end_pos <= avail) & (~self.o.valid | self.o.ready))
        end = last & last_row

        dc_full = Signal(range(M + 1))   # floor(end_pos / W): beats the chunk consumes entirely
        new_off = Signal(range(W))
        m.d.comb += [dc_full.eq(0), new_off.eq(end_pos)]
        for mm in range(1, (W - 1 + L) // W + 1):
            with m.If(end_pos >= mm * W):
                m.d.comb += [dc_full.eq(mm), new_off.eq(end_pos - mm * W)]
        drop = Signal(range(M + 1))      # beats leaving the window head this cycle
        with m.If(take):
            m.d.comb += drop.eq(Mux(end, dc_full + (new_off != 0), dc_full))
            m.d.sync += off.eq(Mux(end, 0, new_off))

        # window: shift out `drop` slots, write the decoded beat behind the remaining ones
        win = Signal(data.ArrayLayout(code_beat, NB))
        with m.Switch(drop):
            for dv in range(1, M + 1):
                with m.Case(dv):
                    m.d.sync += [win[k].eq(win[k + dv]) for k in range(NB - dv)]
        wpos = Signal(range(NB + 1))
        m.d.comb += wpos.eq(nb - drop)
        for k in range(NB):
            with m.If(wr & (wpos == k)):
                m.d.sync += win[k].eq(decoded)
        m.d.sync += nb.eq(nb - drop + wr)

        # chunk: window >> off trits, mask lanes >= count, invalid codes -> 0
        flat = win.as_value()[:2 * (W - 1 + L)]
        lanes = Signal(data.ArrayLayout(unsigned(2), L))   # a signal: its lanes share one shifter
        m.d.comb += lanes.eq((flat >> Cat(Const(0, 1), off))[:2 * L])
        chunk = Signal(trit_chunk_layout(L))
        bad_lanes = []
        for j in range(L):
            code = lanes[j]
            in_row = cnt > j
            good = code != INVALID_CODE
            m.d.comb += chunk.trits[j].eq(Mux(in_row & good, code, 0))
            bad_lanes.append(in_row & ~good)
        m.d.comb += [chunk.count.eq(cnt), chunk.first.eq(first), chunk.last.eq(last), chunk.end.eq(end)]

        with m.If(take):
            m.d.sync += [self.o.payload.eq(chunk), self.o.valid.eq(1)]
        with m.Elif(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        # bad_trit = bad | hit: the lanes' invalid flags are registered with the chunk and OR-ed in the cycle it
        # is first valid (the shifter and the OR tree would otherwise share a cycle); the same behaviour as
        # setting a sticky bit in the loading cycle, with setting winning over clear
        bad, loaded = Signal(), Signal()
        bad_q = Signal(L)
        m.d.sync += loaded.eq(take)
        with m.If(take):
            m.d.sync += bad_q.eq(Cat(*bad_lanes))
        hit = loaded & bad_q.any()
        m.d.comb += self.bad_trit.eq(bad | hit)
        m.d.sync += bad.eq((bad | hit) & ~self.clear)

        # row / block progress
        col_rest = Signal(16)            # trits of the row after this (non-last) chunk
        m.d.comb += col_rest.eq(col_left - L)
        with m.If(take):
            m.d.sync += first.eq(last)
            with m.If(last):
                m.d.sync += [
                    col_left.eq(kreg), cnt.eq(first_cnt), last.eq(first_last),
                    rows_left.eq(rows_left - 1), last_row.eq(rows_left == 2),
                ]
            with m.Else():
                m.d.sync += [col_left.eq(col_rest), cnt.eq(Mux(col_rest >= L, L, col_rest)),
                             last.eq(col_rest <= L)]
            with m.If(end):
                m.d.sync += out_active.eq(0)

        with m.If(outq_valid & (~out_active | (take & end))):
            k = outq.k
            m.d.sync += [
                outq_valid.eq(0),
                out_active.eq((outq.rows != 0) & (k != 0)),
                rows_left.eq(outq.rows), last_row.eq(outq.rows == 1),
                col_left.eq(k), kreg.eq(k),
                cnt.eq(Mux(k >= L, L, k)), first_cnt.eq(Mux(k >= L, L, k)),
                last.eq(k <= L), first_last.eq(k <= L),
                first.eq(1),
            ]

        return m
