"""The quantize prologue: int8 codes of a GEMV's input, ``quant_lanes`` per cycle, bit-exact.

The absmax barrier's second read (docs/RTL.md, ``hw/quant.py``; ``hw.isa`` GEMV step 1): for
``k < K``, ``w[k] = hw.numerics.mul(src[k], qc[k], q_shift)`` when the instruction has ``QCONST``
(else ``w[k] = src[k]``) and ``q[k] = hw.numerics.quantize(w[k], r_mant, r_shift)``
``= clamp((p + 2**(r_shift-1) - [p < 0]) >> r_shift, -128, 127)`` with ``p = w * r_mant`` (rounded half
away from zero) and ``(r_mant, r_shift)`` from the scalar unit (``hw.numerics.quant_recip``). The source
and ``QC`` vectors are read through synchronous read ports, ``quant_lanes`` int32 elements per word; the
codes are written as code-buffer words of ``lanes`` codes (:func:`hw.streams.code_word_layout`).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import isa
from hw.streams import code_word_layout

__all__ = ["QuantCmd", "Quantizer", "QUANT_LATENCY", "MIN_QUANT_LANES", "MAX_QUANT_LANES", "MIN_LANES",
           "MAX_LANES", "src_word_layout"]

MIN_QUANT_LANES = 1
MAX_QUANT_LANES = 64
MIN_LANES = 4
MAX_LANES = 256
#: ``done`` comes ``ceil(k / quant_lanes) + QUANT_LATENCY`` cycles after the command's transfer (the last
#: source word is read ``ceil(k / quant_lanes) - 1`` cycles after it); ``host.perf.QUANT_LATENCY``.
QUANT_LATENCY = 7

_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1


class QuantCmd(data.Struct):
    """``Quantizer.cmd`` payload: one quantize prologue.

    ``k``: unsigned(16), elements (``InstrHeader.k``); ``q_shift``: unsigned(6) and ``qconst``: 1
    (``InstrHeader.q_shift``, ``InstrFlags.QCONST``); ``r_mant``: unsigned(26), ``r_shift``: unsigned(6)
    (``ScalarResult``, ``hw.numerics.quant_recip``; ``r_shift >= 1``).
    """

    k: unsigned(16)
    q_shift: unsigned(6)
    qconst: unsigned(1)
    r_mant: unsigned(26)
    r_shift: unsigned(6)


def src_word_layout(quant_lanes: int) -> data.ArrayLayout:
    """A word of the banked source and ``QC`` vectors: ``ArrayLayout(signed(32), quant_lanes)``; word ``a``
    holds elements ``a * quant_lanes .. a * quant_lanes + quant_lanes - 1`` (element ``j`` of the word in
    lane ``j``)."""
    return data.ArrayLayout(signed(32), quant_lanes)


class Quantizer(wiring.Component):
    """Quantize prologue: ``quant_lanes`` codes per cycle, fully pipelined, exact.

    Parameters
    ----------
    quant_lanes : int, ``MIN_QUANT_LANES`` (1) .. ``MAX_QUANT_LANES`` (64)
        Elements read (and codes formed) per cycle; divides ``lanes``.
    lanes : int, ``MIN_LANES`` (4) .. ``MAX_LANES`` (256)
        Codes per code-buffer word (the GEMV's lanes).
    max_k : int, default ``hw.isa.MAX_K`` (8192)
        Longest vector supported, ``lanes .. 65535``: sets ``src_depth = ceil(max_k / quant_lanes)`` and
        ``code_depth = ceil(max_k / lanes)``, hence the address widths (an addition to the docs/RTL.md
        parameters, as in ``TernaryGemv``; a longer ``k`` wraps the addresses).

    Attributes
    ----------
    cmd : In(stream.Signature(QuantCmd))
        One command per prologue. ``ready`` is 1 while no word is being read or is in the pipeline
        (internal state only).
    src, qc : In(memory.ReadPort.Signature(addr_width=ceil_log2(src_depth), shape=src_word_layout(quant_lanes)))
        Synchronous read ports (``connect`` to ``Memory.read_port()``, non-transparent, ``sync``): the
        component drives ``addr`` (word 0, 1, .., ``ceil(k / quant_lanes) - 1``, one per cycle starting in
        the command's transfer cycle) and ``en`` (1 in exactly those cycles; ``qc.en`` only with
        ``qconst``), and uses ``data`` in the next cycle. Elements at or beyond ``k`` are ignored.
    codes : In(memory.WritePort.Signature(addr_width=ceil_log2(code_depth), shape=code_word_layout(lanes)))
        Write port on the code buffer (``connect`` to ``Memory.write_port()``): words ``0 ..
        ceil(k / lanes) - 1`` in order, ``en`` 1 in their write cycles; word ``c`` holds codes
        ``q[c * lanes .. c * lanes + lanes - 1]``, codes at or beyond ``k`` in the last word are 0.
    done : Out(1)
        One-cycle strobe in the cycle of the last word's write (``codes.en`` = 1; the write commits at
        that clock edge, so a reader starting in the next cycle sees it).

    Timing
    ------
    Cycle 0: the command transfers and word 0 is addressed; word ``a`` in cycle ``a``. Per word, cycle
    ``a + 1``: the data arrive and the four 16 x 16 partial products of ``src * qc`` (32 x 32 signed)
    are registered; ``a + 2``: their sum (the exact product) plus the rounding constant; ``a + 3``:
    arithmetic shift by ``q_shift``, saturation to int32 (``w``); ``a + 4``: ``w * r_mant`` (32 x 26)
    registered, with the sign of ``w``; ``a + 5``: plus the rounding constant (``2**(r_shift-1)``, less one
    for a negative ``w``: half away from zero); ``a + 6``: shift by ``r_shift``, clamp to int8, registered
    with the group's slot in its code word, the word's address and whether it completes or ends the
    vector; ``a + 7``: the group gathered from those registers into the code word register; ``a + 8``: the
    word's write (when it completes a code word, or is the last). One multiplier, adder or
    shifter-and-compare per cycle keeps every path short, and the gather into the ``lanes * 8``-bit word
    starts from flip-flops (the ECP5 targets of ``hw.boards``). ``done`` comes ``ceil(k / quant_lanes) + 7``
    cycles after the transfer (:attr:`latency` = 7, ``host.perf.QUANT_LATENCY``). ``k = 0`` is treated as
    one empty word: one all-zero code word written at address 0, then ``done``. Throughput: one source
    word per cycle, no stalls (the write port never pushes back); the next command is accepted 8 cycles
    after the last word's read.

    Resources: ``5 * quant_lanes`` multipliers (per lane the 32 x 32 signed product of ``mul`` as four
    16 x 16 partial products, each one 18 x 18 DSP block, and a signed 32 x unsigned 26 for
    ``quantize``); per lane two variable arithmetic right shifters (64 bits); about
    ``quant_lanes * 379 + lanes * 8`` flip-flops; no memories (the vectors and the code buffer are
    outside).

    Raises
    ------
    TypeError
        If a parameter is not an int.
    ValueError
        If a parameter is out of range, or ``quant_lanes`` does not divide ``lanes``.
    """

    #: ``done`` comes ``ceil(k / quant_lanes) + LATENCY`` cycles after the command's transfer
    #: (:data:`QUANT_LATENCY`, ``host.perf.QUANT_LATENCY``)
    LATENCY = QUANT_LATENCY

    @classmethod
    def done_cycles(cls, k: int, quant_lanes: int) -> int:
        """Cycles from a command's transfer to ``done`` for ``k`` elements at ``quant_lanes`` per cycle, without
        an instance: ``max(ceil(k / quant_lanes), 1) + LATENCY`` (``k = 0`` is one empty word).

        Raises
        ------
        ValueError
            If ``k < 0`` or ``quant_lanes < 1``.
        """
        if k < 0 or quant_lanes < 1:
            raise ValueError(f"need k >= 0 and quant_lanes >= 1, got k={k}, quant_lanes={quant_lanes}")
        return max(-(-k // quant_lanes), 1) + cls.LATENCY

    def __init__(self, *, quant_lanes: int, lanes: int, max_k: int = isa.MAX_K):
        for name, value in (("quant_lanes", quant_lanes), ("lanes", lanes), ("max_k", max_k)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {value!r}")
        if not MIN_QUANT_LANES <= quant_lanes <= MAX_QUANT_LANES:
            raise ValueError(f"quant_lanes must be in {MIN_QUANT_LANES}..{MAX_QUANT_LANES}, got {quant_lanes}")
        if not MIN_LANES <= lanes <= MAX_LANES:
            raise ValueError(f"lanes must be in {MIN_LANES}..{MAX_LANES}, got {lanes}")
        if lanes % quant_lanes:
            raise ValueError(f"quant_lanes ({quant_lanes}) must divide lanes ({lanes})")
        if not lanes <= max_k <= 0xFFFF:
            raise ValueError(f"max_k must be in lanes ({lanes})..65535, got {max_k}")
        self._quant_lanes = quant_lanes
        self._lanes = lanes
        self._max_k = max_k
        self._src_depth = -(-max_k // quant_lanes)
        self._code_depth = -(-max_k // lanes)
        read = memory.ReadPort.Signature(addr_width=ceil_log2(self._src_depth), shape=src_word_layout(quant_lanes))
        super().__init__({
            "cmd": In(stream.Signature(QuantCmd)),
            "src": In(read),
            "qc": In(read),
            "codes": In(memory.WritePort.Signature(addr_width=ceil_log2(self._code_depth),
                                                   shape=code_word_layout(lanes))),
            "done": Out(1),
        })

    @property
    def quant_lanes(self) -> int:
        """Elements read, and codes formed, per cycle."""
        return self._quant_lanes

    @property
    def lanes(self) -> int:
        """Codes per code-buffer word."""
        return self._lanes

    @property
    def max_k(self) -> int:
        """Longest supported vector."""
        return self._max_k

    @property
    def src_depth(self) -> int:
        """Words of the source and ``QC`` vectors the read ports address: ``ceil(max_k / quant_lanes)``."""
        return self._src_depth

    @property
    def code_depth(self) -> int:
        """Words of the code buffer: ``ceil(max_k / lanes)``."""
        return self._code_depth

    @property
    def latency(self) -> int:
        """``done`` comes ``ceil(k / quant_lanes) + latency`` cycles after the command's transfer (:data:`LATENCY`,
        7)."""
        return self.LATENCY

    @property
    def multipliers(self) -> int:
        """Multipliers in the datapath: five per lane (four partial products and one)."""
        return 5 * self._quant_lanes

    def elaborate(self, platform):
        m = Module()
        ql = self._quant_lanes
        groups = self._lanes // ql
        ctl_layout = data.StructLayout({"valid": 1, "last": 1, "count": range(ql + 1)})

        # ---- command registers (stable while the command's words are in flight)
        r_mant = Signal(26)
        r_shift = Signal(6)
        q_shift = Signal(6)      # 0 without QCONST (then w = src * 1)
        qconst = Signal()
        rnd1 = Signal(64)        # 2**(q_shift - 1), 0 for q_shift = 0
        rnd2 = Signal(64)        # 2**(r_shift - 1), 0 for r_shift = 0
        rnd2n = Signal(64)       # 2**(r_shift - 1) - 1, 0 for r_shift = 0: the constant for a negative product
        # saturation thresholds: floor(s / 2**n) >= 2**b  <=>  s >= 2**(b + n), and < -2**b  <=>  s < -2**(b + n);
        # a signed 64-bit s reaches them only for b + n <= 62 (else sat_* is 0 and the shift alone is exact)
        thr1, thr2 = Signal(signed(64)), Signal(signed(64))     # 2**(31 + q_shift), 2**(7 + r_shift)
        nthr1, nthr2 = Signal(signed(64)), Signal(signed(64))   # their negatives
        sat1, sat2 = Signal(), Signal()
        # the second saturation moved before its rounding add (stage 5 instead of 6): sum2 = p2 + rnd2 >= thr2
        # <=> p2 >= thr2 - rnd2 (for p2 >= 0; a negative p2 never reaches it: sum2 <= 2**(r_shift-1) - 1), and
        # sum2 = p2 + rnd2n < -thr2 <=> p2 < nthr2 - rnd2n (for p2 < 0 only); loaded a cycle after the command,
        # stable long before the first word's stage 5
        thr2p, nthr2n = Signal(signed(65)), Signal(signed(65))
        m.d.sync += [thr2p.eq(thr2 - rnd2), nthr2n.eq(nthr2 - rnd2n)]

        # ---- stage 0: address the source words
        busy = Signal()          # words after the first remain to be read
        rd_addr = Signal.like(self.src.addr)
        rd_rem = Signal(16)      # elements from the current word on
        s1 = Signal(ctl_layout)
        s2 = Signal(ctl_layout)
        s3 = Signal(ctl_layout)
        s4 = Signal(ctl_layout)
        s5 = Signal(ctl_layout)
        s6 = Signal(ctl_layout)
        s7 = Signal(ctl_layout)

        m.d.comb += self.cmd.ready.eq(~busy & ~Cat(s.valid for s in (s1, s2, s3, s4, s5, s6, s7)).any())
        start = self.cmd.valid & self.cmd.ready
        issue = start | busy
        cur_rem = Mux(busy, rd_rem, self.cmd.payload.k)
        last = cur_rem <= ql
        addr = Mux(busy, rd_addr, 0)
        m.d.comb += [
            self.src.addr.eq(addr),
            self.qc.addr.eq(addr),
            self.src.en.eq(issue),
            self.qc.en.eq(issue & Mux(busy, qconst, self.cmd.payload.qconst)),
        ]
        m.d.sync += [
            busy.eq(issue & ~last),
            rd_addr.eq(addr + 1),
            rd_rem.eq(cur_rem - ql),
            s1.valid.eq(issue),
            s1.last.eq(last),
            s1.count.eq(Mux(last, cur_rem, ql)),
        ]
        with m.If(start):
            cmd = self.cmd.payload
            m.d.sync += [
                r_mant.eq(cmd.r_mant),
                r_shift.eq(cmd.r_shift),
                qconst.eq(cmd.qconst),
                q_shift.eq(Mux(cmd.qconst, cmd.q_shift, 0)),
                rnd1.eq(Mux(cmd.qconst, (Const(1, 65) << cmd.q_shift)[1:], 0)),
                rnd2.eq((Const(1, 65) << cmd.r_shift)[1:]),
                rnd2n.eq(((Const(1, 65) << cmd.r_shift) - 1)[1:]),
                thr1.eq(Const(1 << 31, 64) << Mux(cmd.qconst, cmd.q_shift, 0)),
                thr2.eq(Const(1 << 7, 64) << cmd.r_shift),
                nthr1.eq(-(Const(1 << 31, 64) << Mux(cmd.qconst, cmd.q_shift, 0))[:64]),
                nthr2.eq(-(Const(1 << 7, 64) << cmd.r_shift)[:64]),
                sat1.eq(Mux(cmd.qconst, cmd.q_shift, 0) <= 31),
                sat2.eq(cmd.r_shift <= 55),
            ]

        # ---- stages 1-6 per lane
        m.d.sync += [s2.eq(s1), s3.eq(s2), s4.eq(s3), s5.eq(s4), s6.eq(s5), s7.eq(s6)]
        codes = Signal(data.ArrayLayout(signed(8), ql))
        for j in range(ql):
            # stage 1: the partial products of src * qc (or src * 1) over 16-bit halves (hi signed, lo
            # unsigned): each fits one 18 x 18 multiplier, and no adder follows them in this cycle
            x, y = self.src.data[j], Mux(qconst, self.qc.data[j], 1)
            pp = [Signal(signed(34), name=f"pp{k}_{j}") for k in range(4)]
            m.d.sync += [pp[0].eq(x[:16] * y[:16]), pp[1].eq(x[16:].as_signed() * y[:16]),
                         pp[2].eq(x[:16] * y[16:].as_signed()), pp[3].eq(x[16:].as_signed() * y[16:].as_signed())]
            # stage 2: p1 + 2**(q_shift-1), p1 = src * qc exact, the sum wrapping in int64 as hw.numerics.mul's
            sum1 = Signal(signed(64), name=f"sum1_{j}")
            m.d.sync += sum1.eq((pp[0] + ((pp[1] + pp[2]) << 16) + (pp[3] << 32) + rnd1)[:64].as_signed())
            # stage 3: w = sat32(sum1 >> q_shift); the saturation compares sum1 with the thresholds in parallel
            # with the shift, which then only needs its low 32 bits
            t1 = Signal(signed(32), name=f"t1_{j}")
            m.d.comb += t1.eq((sum1 >> q_shift)[:32])
            w = Signal(signed(32), name=f"w_{j}")
            m.d.sync += w.eq(Mux(sat1 & (sum1 >= thr1), _INT32_MAX, Mux(sat1 & (sum1 < nthr1), _INT32_MIN, t1)))
            # stage 4: p2 = w * r_mant (|p2| < 2**57), and its sign: p2 < 0 exactly when w < 0 (r_mant >= 0;
            # for r_mant = 0 both constants give code 0)
            p2 = Signal(signed(59), name=f"p2_{j}")
            neg = Signal(name=f"neg_{j}")
            m.d.sync += [p2.eq(w * r_mant), neg.eq(w[31])]
            # stage 5: p2 + 2**(r_shift-1) - [p2 < 0] (exact in int64: |p2| < 2**57, r_shift <= 63): the floor
            # of the shift then rounds half away from zero, as hw.numerics.quantize; beside it the saturation
            # of the sum, compared on p2 (above)
            sum2 = Signal(signed(64), name=f"sum2_{j}")
            hi, lo = Signal(name=f"hi_{j}"), Signal(name=f"lo_{j}")
            m.d.sync += [sum2.eq(p2 + Mux(neg, rnd2n, rnd2)),
                         hi.eq(sat2 & ~neg & (p2 >= thr2p)), lo.eq(sat2 & neg & (p2 < nthr2n))]
            # stage 6: clamp(sum2 >> r_shift, -128, 127); lanes >= count are 0; registered (codes7)
            t2 = Signal(signed(8), name=f"t2_{j}")
            m.d.comb += t2.eq((sum2 >> r_shift)[:8])
            m.d.comb += codes[j].eq(Mux(s6.count <= j, 0, Mux(hi, 127, Mux(lo, -128, t2))))

        # ---- stage 6: the group's slot in its code word and the word's address (counters advanced per valid
        # group), registered with the codes, so that the gather into the lanes * 8-bit word starts from flops
        group = Signal(range(groups))
        word_addr = Signal.like(self.codes.addr)
        full = group == groups - 1
        codes7 = Signal.like(codes)
        slot7 = Signal.like(group)
        addr7 = Signal.like(word_addr)
        full7 = Signal()
        m.d.sync += [codes7.eq(codes), slot7.eq(group), addr7.eq(word_addr), full7.eq(full)]
        with m.If(s6.valid):
            with m.If(s6.last):
                m.d.sync += [group.eq(0), word_addr.eq(0)]
            with m.Elif(full):
                m.d.sync += [group.eq(0), word_addr.eq(word_addr + 1)]
            with m.Else():
                m.d.sync += group.eq(group + 1)

        # ---- stage 7: gather the group of ql codes into the code word; stage 8: write it
        word = Signal(code_word_layout(self._lanes))
        word_view = word.as_value()
        we = Signal()
        done = Signal()
        wr_addr = Signal.like(self.codes.addr)
        m.d.comb += [
            self.codes.addr.eq(wr_addr),
            self.codes.data.eq(word),
            self.codes.en.eq(we),
            self.done.eq(done),
        ]
        m.d.sync += [
            we.eq(s7.valid & (full7 | s7.last)),
            done.eq(s7.valid & s7.last),
        ]
        with m.If(s7.valid):
            for g in range(groups):
                part = word_view[g * ql * 8:(g + 1) * ql * 8]
                with m.If(slot7 == g):
                    m.d.sync += part.eq(codes7.as_value())
                if g:
                    with m.Elif(slot7 == 0):
                        m.d.sync += part.eq(0)      # a new code word: the groups not yet formed are 0
            m.d.sync += wr_addr.eq(addr7)
        return m
