"""The scalar unit: once per GEMV, the quantize reciprocal and the dequantization scale, bit-exact.

Computes ``hw.numerics.quant_recip(amax)`` and ``hw.numerics.dequant_scale(ssq, amax, cb_mant, cb_shift,
out_frac)`` (docs/RTL.md, ``hw/scalar.py``; ``hw.isa`` GEMV steps 1 and 3) with sequential restoring
algorithms, one result bit per cycle, and no multiplier:

* ``root = max(isqrt(ssq), 1)``: restoring integer square root of the 64-bit ``ssq``, 32 steps;
* ``num = cb_mant * A`` (``A = max(amax, 1)``): shift-and-add, 32 steps, in parallel with the root;
* ``r_mant``: a 25-step restoring division, in parallel with the root;
* ``s_mant``: a 25-step restoring division after the root (the same divider, reloaded).

Both divisions run on normalized operands, so the divider is one fixed structure (a 32-bit divisor with
its top bit set, a 31-bit initial remainder, 25 dividend bits shifted in, 25 quotient bits):

* ``a_n = A << za`` (``za`` leading zeros of ``A``): ``r_shift = bitlength(A) + 17 = 49 - za`` and
  ``r_mant = ((127 << r_shift) + (A >> 1)) // A = (127 * 2**49 + (a_n >> 1)) // a_n`` (scaling dividend
  and divisor by ``2**za`` keeps the floor: the low bit of ``A`` lands below the scale).
* ``num`` is formed as ``p = (cb_mant << zc) * a_n`` and left-aligned to ``num_n`` (64 bits, top bit
  set; ``p`` needs at most one more shift), ``root_n = root << zr`` (32 bits, top bit set). With
  ``t = 24 - (bitlength(num) - bitlength(root))``, ``dequant_scale`` 's ``s_mant`` (both branches,
  ``(num << t) // root`` and ``(num >> -t) // root``) is ``floor(num * 2**t / root)``, which equals
  ``(num_n >> 8) // root_n``; its shift is ``t + cb_shift - out_frac + SSQ_SHIFT // 2``
  ``= zc + za + e - zr + cb_shift - out_frac`` (``e``: the extra alignment bit; for ``cb_mant = 0``,
  ``s_mant = 0`` and the shift is ``64 - zr + cb_shift - out_frac``).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ScalarRequest", "ScalarResult", "ScalarUnit", "SCALAR_LATENCY", "SsqBias", "SSQ_BIAS_LATENCY"]

_ROOT_STEPS = 32   #: isqrt of a 64-bit value: one root bit per step
_QUOT_STEPS = 25   #: both quotients are < 2**25
#: Cycles from the transfer on ``i`` (cycle 0) to ``o.valid``: 1 input normalization, 32 root steps, 1 root
#: leading-zero count, 1 reload, 25 steps, and ``o.valid`` in the next cycle.
SCALAR_LATENCY = 1 + _ROOT_STEPS + 2 + _QUOT_STEPS + 1
#: Cycles from ``SsqBias.load`` (cycle 0) to the first cycle its ``o`` holds the statistic: the operands and
#: the shifted bias registered, then the low halves' sum.
SSQ_BIAS_LATENCY = 2
_U64_MAX = (1 << 64) - 1


class ScalarRequest(data.Struct):
    """``ScalarUnit.i`` payload: the inputs of a GEMV's scales (the ``InstrHeader`` fields and registers).

    ``ssq``: unsigned(64), the statistic ``hw.numerics.ssq_with_bias(R[ssq_reg], ssq_bias, ssq_bias_shift)``
    (the sum-of-squares reduction register plus the instruction's epsilon term, :class:`SsqBias`);
    ``amax``: unsigned(32), the absmax reduction register (``InstrHeader.amax_reg``; 0 is taken as 1);
    ``cb_mant``: unsigned(32), ``cb_shift``: signed(32), ``out_frac``: unsigned(6) (``InstrHeader``).
    """

    ssq: unsigned(64)
    amax: unsigned(32)
    cb_mant: unsigned(32)
    cb_shift: signed(32)
    out_frac: unsigned(6)


class ScalarResult(data.Struct):
    """``ScalarUnit.o`` payload.

    ``r_mant`` (unsigned(26), ``<= 127 * 2**18 < 2**25``) and ``r_shift`` (unsigned(6), ``18..49``):
    ``hw.numerics.quant_recip``; ``s_mant`` (unsigned(27), ``< 2**25``; 0 only for ``cb_mant = 0``) and
    ``s_shift`` (signed(8)): ``hw.numerics.dequant_scale``. The compiler's ranges (``cb_mant`` a 24-bit
    mantissa in ``[2**23, 2**24)``, ``cb_shift`` in ``[0, 63]``, ``out_frac`` in ``[8, 28]``,
    ``amax < 2**31``) give ``s_shift`` in ``[-50, 95]``; any ``cb_mant < 2**24``, ``amax < 2**32``,
    ``cb_shift`` in ``[0, 63]`` and ``out_frac`` in ``[0, 63]`` keep it in ``[-86, 127]``; beyond that
    ``s_shift`` is the exact value modulo ``2**8``.
    """

    r_mant: unsigned(26)
    r_shift: unsigned(6)
    s_mant: unsigned(27)
    s_shift: signed(8)


def _clz(value):
    """Leading zeros of ``value`` (a power-of-two width ``n``), ``0..n``, as a balanced mux tree."""
    n = len(value)
    if n == 1:
        return ~value[0]
    hi, lo = value[n // 2:], value[:n // 2]
    c_hi, c_lo = _clz(hi), _clz(lo)
    return Mux(hi == 0, n // 2 + c_lo, c_hi)


def _sub(a, b, width):
    """``(a >= b, a - b)`` for unsigned ``a``, ``b`` below ``2**width``: one subtractor, its borrow."""
    diff = Signal(width + 1)
    return ~diff[width], diff, diff.eq(a - b)


class ScalarUnit(wiring.Component):
    """Quantize reciprocal and dequantization scale of one GEMV, sequential and bit-exact.

    No parameters.

    Attributes
    ----------
    i : In(stream.Signature(ScalarRequest))
        One request per GEMV that forms new codes. ``ready`` is 1 exactly while the unit is idle (it
        depends on internal state only).
    o : Out(stream.Signature(ScalarResult))
        The result of each request, in order: ``(r_mant, r_shift) = hw.numerics.quant_recip(amax)``,
        ``(s_mant, s_shift) = hw.numerics.dequant_scale(ssq, amax, cb_mant, cb_shift, out_frac)``
        (payload held until transferred).

    Timing
    ------
    The request transfers in cycle 0 (the operands and their leading-zero counts are registered); cycle 1
    shifts them into normalized form; cycles 2-33 take the 32 square-root steps, the 32 shift-and-add
    steps of ``cb_mant * A`` and the 25 steps of ``r_mant``; cycle 34 counts the root's leading zeros;
    cycle 35 normalizes the root and the product and reloads the divider; cycles 36-60 take the 25 steps
    of ``s_mant``; ``o.valid`` rises in cycle 61 (:data:`SCALAR_LATENCY`, within
    ``host.perf.SCALAR_CYCLES``) and stays until ``o.ready``. A leading-zero count and the shift it
    drives never share a cycle (ECP5 timing: each is several LUT levels deep).
    The next request is accepted in the cycle after the result's transfer.

    Resources: no multipliers, no memories. Adders: one 36-bit (root), one 33-bit (product), one 33-bit
    (divider); three 32-bit leading-zero counters with left normalizers (``A``, ``cb_mant``, root);
    about 530 flip-flops.
    """

    #: Cycles from the transfer on ``i`` (cycle 0) to ``o.valid`` (:data:`SCALAR_LATENCY`, 61)
    LATENCY = SCALAR_LATENCY
    #: Cycles a request occupies the unit when its result is taken as soon as it is valid: the request's
    #: transfer cycle through the result's, ``LATENCY + 1`` = 62 (``host.perf.SCALAR_CYCLES``: the sequencer
    #: counts them, its SCALAR and SCALAR_WAIT states)
    CYCLES = SCALAR_LATENCY + 1

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(ScalarRequest)),
            "o": Out(stream.Signature(ScalarResult)),
        })

    @property
    def latency(self) -> int:
        """Cycles from the transfer on ``i`` to ``o.valid`` (:data:`LATENCY`, 61)."""
        return self.LATENCY

    def elaborate(self, platform):
        m = Module()
        req = self.i.payload

        # ---- square root: x shifts out two bits per step, root gains one bit
        x = Signal(64)
        rem = Signal(34)       # rem <= 2 * root < 2**33
        root = Signal(32)
        # ---- product: prod = {high: partial sum, low: multiplier bits of a_n shifting out}
        prod = Signal(64)
        cn = Signal(32)        # cb_mant << zc
        # ---- divider (shared): 32-bit remainder, 25 dividend bits left, 32-bit divisor, quotient
        dv_r = Signal(32)
        dv_bits = Signal(_QUOT_STEPS)
        dv_d = Signal(32)
        dv_q = Signal(_QUOT_STEPS)
        # ---- results and shift terms
        r_mant = Signal(26)
        r_shift = Signal(6)
        s_shift = Signal(signed(8))
        zcza = Signal(7)       # zc + za
        cb_zero = Signal()
        shift_in = Signal(signed(34))  # cb_shift - out_frac
        cnt = Signal(range(_ROOT_STEPS))

        # ---- step logic (combinational)
        rem2 = Cat(x[62:64], rem)                      # 36 bits
        root_ge, root_diff, root_sub = _sub(rem2, Cat(Const(1, 2), root), 36)
        prod_sum = prod[32:64] + Mux(prod[0], cn, 0)   # 33 bits
        dv_r2 = Cat(dv_bits[-1], dv_r)                 # 33 bits
        div_ge, div_diff, div_sub = _sub(dv_r2, dv_d, 33)
        m.d.comb += [root_sub, div_sub]

        def root_step():
            m.d.sync += [
                x.eq(x << 2),
                rem.eq(Mux(root_ge, root_diff, rem2)),
                root.eq(Cat(root_ge, root)),
                prod.eq(Cat(prod[1:32], prod_sum)),
            ]

        def div_step():
            m.d.sync += [
                dv_r.eq(Mux(div_ge, div_diff, dv_r2)),
                dv_bits.eq(dv_bits << 1),
                dv_q.eq(Cat(div_ge, dv_q)),
            ]

        # ---- operand normalization: the leading-zero counts are registered at the transfer, the shifts
        # by them happen in NORM
        a_in = Mux(req.amax == 0, 1, req.amax)
        a = Signal(32)         # A = max(amax, 1)
        cb = Signal(32)        # cb_mant
        za = Signal(6)
        zc = Signal(6)
        a_n = Signal(32)
        m.d.comb += a_n.eq(a << za)

        # ---- root and product normalization: the root's leading zeros registered in ROOT_CLZ
        root_eff = Signal(32)  # max(root, 1)
        zr = Signal(6)
        root_n = Signal(32)
        num_n = Signal(64)
        m.d.comb += [
            root_n.eq(root_eff << zr),
            num_n.eq(Mux(prod[63], prod, prod << 1)),
        ]

        m.d.comb += [
            self.o.payload.r_mant.eq(r_mant),
            self.o.payload.r_shift.eq(r_shift),
            self.o.payload.s_mant.eq(dv_q),
            self.o.payload.s_shift.eq(s_shift),
        ]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [
                        x.eq(req.ssq),
                        rem.eq(0),
                        root.eq(0),
                        a.eq(a_in),
                        cb.eq(req.cb_mant),
                        za.eq(_clz(a_in)),
                        zc.eq(_clz(req.cb_mant)),
                        cb_zero.eq(req.cb_mant == 0),
                        shift_in.eq(req.cb_shift - req.out_frac),
                    ]
                    m.next = "NORM"
            with m.State("NORM"):
                m.d.sync += [
                    cn.eq(cb << zc),
                    prod.eq(a_n),
                    # r_mant = (127 * 2**49 + (a_n >> 1)) // a_n: the top 31 dividend bits, then 25
                    dv_r.eq(Cat(a_n[26:32], Const(0, 18), Const(127, 7))),
                    dv_bits.eq(a_n[1:26]),
                    dv_d.eq(a_n),
                    r_shift.eq(49 - za),
                    zcza.eq(zc + za),
                    cnt.eq(0),
                ]
                m.next = "ROOT"
            with m.State("ROOT"):
                root_step()
                with m.If(cnt < _QUOT_STEPS):
                    div_step()
                m.d.sync += cnt.eq(cnt + 1)
                with m.If(cnt == _ROOT_STEPS - 1):
                    m.next = "ROOT_CLZ"
            with m.State("ROOT_CLZ"):
                m.d.sync += [root_eff.eq(Mux(root == 0, 1, root)), zr.eq(_clz(Mux(root == 0, 1, root)))]
                m.next = "RELOAD"
            with m.State("RELOAD"):
                # s_mant = (num_n >> 8) // root_n: the top 31 dividend bits num_n[33:], then num_n[8:33]
                m.d.sync += [
                    r_mant.eq(dv_q),
                    dv_r.eq(num_n[33:64]),
                    dv_bits.eq(num_n[8:33]),
                    dv_d.eq(root_n),
                    s_shift.eq(Mux(cb_zero, 64, zcza + ~prod[63]) - zr + shift_in),
                    cnt.eq(0),
                ]
                m.next = "DIVIDE"
            with m.State("DIVIDE"):
                div_step()
                m.d.sync += cnt.eq(cnt + 1)
                with m.If(cnt == _QUOT_STEPS - 1):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    m.next = "IDLE"
        return m


class SsqBias(wiring.Component):
    """The statistic a GEMV's scale is formed from, ``hw.numerics.ssq_with_bias(ssq, bias, bias_shift)``
    ``= min(ssq + (bias << bias_shift), 2**64 - 1)`` (``InstrHeader.ssq_reg``'s register, ``ssq_bias`` and
    ``ssq_bias_shift``; docs/ISA.md, GEMV step 1), for :class:`ScalarRequest`'s ``ssq``.

    No parameters.

    Attributes
    ----------
    load : In(1)
        Takes ``ssq``, ``bias`` and ``bias_shift`` in this cycle.
    ssq : In(64)
        The sum-of-squares register (unsigned).
    bias : In(32), bias_shift : In(5)
        The instruction's epsilon term, ``bias << bias_shift < 2**63``.
    o : Out(64)
        The saturating sum of the last ``load``'s operands.

    Timing
    ------
    ``load`` in cycle 0 registers ``ssq`` and ``bias << bias_shift``; cycle 1 registers the sum of their low
    32-bit halves with its carry; from cycle 2 (:data:`SSQ_BIAS_LATENCY`) ``o`` is the high halves' sum with
    that carry, saturated, over the low half, and it holds up to and including the next ``load``'s cycle. Each
    cycle is one shifter or one adder of at most 33 bits (the ECP5 timing of ``hw.boards``), so the
    sequencer loads it at an instruction's dispatch and the scalar unit's request, two cycles later, carries
    it with no added cycle.

    Resources: a 32-to-63-bit left shifter, two 33-bit adders, about 160 flip-flops; no multipliers.
    """

    #: Cycles from ``load`` (cycle 0) to the first cycle ``o`` holds the statistic (:data:`SSQ_BIAS_LATENCY`, 2)
    LATENCY = SSQ_BIAS_LATENCY

    def __init__(self):
        super().__init__({
            "load": In(1),
            "ssq": In(64),
            "bias": In(32),
            "bias_shift": In(5),
            "o": Out(64),
        })

    @property
    def latency(self) -> int:
        """Cycles from ``load`` to the first cycle ``o`` holds the result (:data:`LATENCY`, 2)."""
        return self.LATENCY

    def elaborate(self, platform):
        m = Module()
        a = Signal(64)         # ssq
        b = Signal(63)         # bias << bias_shift (< 2**63)
        lo = Signal(33)        # a[:32] + b[:32], with the carry on top
        with m.If(self.load):
            m.d.sync += [a.eq(self.ssq), b.eq(self.bias << self.bias_shift)]
        m.d.sync += lo.eq(a[:32] + b[:32])
        hi = Signal(33)
        m.d.comb += [
            hi.eq((Cat(lo[32], a[32:]) + Cat(lo[32], b[32:]))[1:]),   # the carry in as an extra low bit
            self.o.eq(Mux(hi[32], _U64_MAX, Cat(lo[:32], hi[:32]))),
        ]
        return m
