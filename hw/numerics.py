"""Every arithmetic step of the accelerator, in integer numpy: the definition the RTL matches bit for bit.

The golden device (:mod:`host.devices.golden`) executes images with these functions; the gateware
takes its LUT contents from :func:`sigmoid_table`. Everything is exact integer arithmetic on int64
arrays or Python ints; nothing here rounds through floating point.

Formats (``Qm.f``: a signed integer with ``f`` fraction bits; chosen by measurement, see
``docs/NUMERICS.md`` and ``bench/results/numerics.json``)

====================  ==========================  ==============================================
value                 format                      why
====================  ==========================  ==============================================
int8 codes            [-128, 127]                 BitLinear's absmax activation quantization
GEMV accumulator      :data:`hw.isa.ACC_BITS`     ``|acc| <= 128 K``
residual, epilogue    int32, RESIDUAL_FRAC = 16   the residual stream, dequantized GEMV outputs
recurrent state h     int32, STATE_FRAC = 20      h integrates ~1/(1-f) tokens; extra bits for f ~ 1
gates                 int32, GATE_FRAC = 30       sigmoid outputs, 1 - lb, 1 - f: Q1.30
per-channel consts    int32, block floating point the gammas: one shift per vector (compiler)
sum of squares        uint64                      ``sum (w**2 >> 16)``: never overflows for K <= 2**17
scales                24-25-bit mantissa + shift  quantize reciprocal, dequantization scale
====================  ==========================  ==============================================

Rounding: products round half up (``+ 2**(s-1)`` then an arithmetic shift); the quantize step rounds
half away from zero, as the released Triton kernel rounds the codes (:func:`quantize`); every int32 result
saturates. The host converts embeddings to the residual format with round-half-even (:func:`to_fixed`).
"""

import math

import numpy as np

__all__ = [
    "RESIDUAL_FRAC", "STATE_FRAC", "SSQ_SHIFT", "GATE_FRAC", "LUT_SEGMENTS_LOG2", "LUT_RANGE_LOG2",
    "INT32_MIN", "INT32_MAX", "UINT64_MAX",
    "sat32", "mul", "to_fixed", "from_fixed", "block_float",
    "sigmoid_table", "sigmoid", "silu",
    "quant_recip", "quantize", "ssq_with_bias", "dequant_scale", "dequant", "ssq_accumulate", "float_mant_shift",
]

RESIDUAL_FRAC = 16       #: default; the compiler calibrates every vector's format per model
STATE_FRAC = 20
SSQ_SHIFT = 16           #: each square is truncated by 16 bits before it is accumulated
GATE_FRAC = 30
LUT_SEGMENTS_LOG2 = 10   #: sigmoid LUT: 2**10 linear segments ...
LUT_RANGE_LOG2 = 4       #: ... over [-2**4, 2**4); outside, the end values

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
UINT64_MAX = (1 << 64) - 1


def sat32(x: np.ndarray) -> np.ndarray:
    """Saturate int64 values to the int32 range (returns int64)."""
    x = np.array(x, dtype=np.int64, copy=True)
    np.maximum(x, INT32_MIN, out=x)
    return np.minimum(x, INT32_MAX, out=x)


def mul(a: np.ndarray, b: np.ndarray, shift: int) -> np.ndarray:
    """``sat32((a * b + 2**(shift-1)) >> shift)`` for int32-range ``a``, ``b`` (``shift = 0``: no rounding).

    ``|a * b| < 2**62``, so the int64 product is exact.
    """
    p = np.multiply(a, b, dtype=np.int64)
    if shift > 0:
        p += 1 << (shift - 1)
        p >>= shift
    np.maximum(p, INT32_MIN, out=p)
    return np.minimum(p, INT32_MAX, out=p)


def to_fixed(x: np.ndarray, frac: int) -> np.ndarray:
    """Float to int32 with ``frac`` fraction bits: round half to even, saturate (host side only)."""
    y = np.rint(np.asarray(x, dtype=np.float64) * float(1 << frac))
    return np.clip(y, INT32_MIN, INT32_MAX).astype(np.int64)


def from_fixed(x: np.ndarray, frac: int) -> np.ndarray:
    """int with ``frac`` fraction bits to float64."""
    return np.asarray(x, dtype=np.float64) / float(1 << frac)


def block_float(v: np.ndarray, *, max_frac: int = 40) -> tuple[np.ndarray, int]:
    """A per-channel constant vector as int32 mantissas with one shared fraction-bit count.

    The largest ``|v|`` lands in ``[2**29, 2**30)`` (one bit of headroom), unless that would need more
    than ``max_frac`` fraction bits (tiny vectors) or the vector is all zero.

    Returns
    -------
    mant : ndarray, int64 (int32 range)
    frac : int, 0 <= frac <= max_frac
        ``v ~= mant * 2**-frac``.
    """
    v = np.asarray(v, dtype=np.float64)
    m = float(np.max(np.abs(v))) if v.size else 0.0
    if m == 0.0 or not math.isfinite(m):
        frac = 0 if m == 0.0 else 0
    else:
        frac = 29 - math.floor(math.log2(m))
        frac = max(0, min(max_frac, frac))
    return to_fixed(v, frac), frac


def float_mant_shift(x: float, bits: int = 24) -> tuple[int, int]:
    """A positive float as ``mant * 2**-shift`` with ``mant`` in ``[2**(bits-1), 2**bits)`` (round half even)."""
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"expected a positive finite number, got {x!r}")
    e = math.frexp(x)[1]  # x = f * 2**e, f in [0.5, 1)
    shift = bits - e
    mant = round(x * 2.0 ** shift)
    if mant >= 1 << bits:  # rounding carried out
        mant >>= 1
        shift -= 1
    return int(mant), int(shift)


# ------------------------------------------------------------------------------------------- sigmoid
def sigmoid_table(segments_log2: int = LUT_SEGMENTS_LOG2, gate_frac: int = GATE_FRAC) -> np.ndarray:
    """Sigmoid LUT: ``2**segments_log2 + 1`` int values ``round(sigma(x_i) * 2**gate_frac)`` at the
    equally spaced points ``x_i`` of ``[-16, 16]`` (the ROM contents of the epilogue's sigmoid unit)."""
    n = 1 << segments_log2
    lim = 1 << LUT_RANGE_LOG2
    x = np.linspace(-lim, lim, n + 1, dtype=np.float64)
    return np.rint(float(1 << gate_frac) / (1.0 + np.exp(-x))).astype(np.int64)


def sigmoid(x: np.ndarray, in_frac: int, table: np.ndarray, segments_log2: int = LUT_SEGMENTS_LOG2) -> np.ndarray:
    """Piecewise-linear sigmoid of ``x`` (``in_frac`` fraction bits) from ``table`` (:func:`sigmoid_table`).

    ``x`` is clamped to ``[-16, 16)``; segment ``i = (x + 16) >> step`` and the ``step`` low bits
    interpolate between ``table[i]`` and ``table[i+1]`` (``(d * frac + 2**(step-1)) >> step``).

    Raises
    ------
    ValueError
        If ``in_frac`` is too small for the segment width (``step < 1``).
    """
    step = in_frac + LUT_RANGE_LOG2 + 1 - segments_log2
    if step < 1:
        raise ValueError(f"sigmoid input needs at least {segments_log2 - LUT_RANGE_LOG2} fraction bits, "
                         f"got {in_frac}")
    lo = -(1 << (LUT_RANGE_LOG2 + in_frac))
    xc = np.clip(np.asarray(x, dtype=np.int64), lo, -lo - 1) - lo
    idx = xc >> step
    frac = xc & ((1 << step) - 1)
    t0 = table[idx]
    d = table[idx + 1] - t0
    return t0 + ((d * frac + (1 << (step - 1))) >> step)


def silu(x: np.ndarray, in_frac: int, table: np.ndarray, segments_log2: int = LUT_SEGMENTS_LOG2,
         gate_frac: int = GATE_FRAC) -> np.ndarray:
    """``mul(x, sigmoid(x), gate_frac)``: SiLU in the format of ``x``."""
    return mul(x, sigmoid(x, in_frac, table, segments_log2), gate_frac)


# ------------------------------------------------------------------------------- quantize and scales
def quant_recip(amax: int) -> tuple[int, int]:
    """The quantize prologue's reciprocal of the absmax: ``127 / A ~= r_mant * 2**-r_shift``.

    ``A = max(amax, 1)`` (one LSB: the fixed-point form of the released ``clamp(min=1e-5)``),
    ``r_shift = bitlength(A) + 17`` and ``r_mant = round(127 * 2**r_shift / A) < 2**25``; an exact
    integer division, done once per GEMV by the scalar unit.
    """
    a = max(int(amax), 1)
    r_shift = a.bit_length() + 17
    r_mant = ((127 << r_shift) + (a >> 1)) // a
    return r_mant, r_shift


def quantize(w: np.ndarray, r_mant: int, r_shift: int) -> np.ndarray:
    """int8 codes: ``w * r_mant * 2**-r_shift`` rounded half away from zero, clamped to [-128, 127].

    ``p = w * r_mant``; ``(p + 2**(r_shift-1) - [p < 0]) >> r_shift`` (the arithmetic shift floors, so the
    ``- 1`` for negative products turns half up into half away from zero: ``-2.5 -> -3``, ``2.5 -> 3``),
    the rule of the released kernel's libdevice ``round`` (docs/NUMERICS.md). ``|w| < 2**31``.
    """
    p = np.multiply(w, np.int64(r_mant), dtype=np.int64)
    p += (1 << (r_shift - 1)) - (p < 0)
    p >>= r_shift
    np.maximum(p, -128, out=p)
    return np.minimum(p, 127, out=p)


def ssq_with_bias(ssq: int, bias: int, bias_shift: int) -> int:
    """The statistic the scale is formed from: ``min(ssq + (bias << bias_shift), 2**64 - 1)``.

    ``ssq`` is the sum-of-squares register (``InstrHeader.ssq_reg``), ``bias`` and ``bias_shift`` the
    instruction's ``ssq_bias`` (unsigned 32) and ``ssq_bias_shift`` (0..31): the RMSNorm epsilons' constant
    part in the register's units (docs/NUMERICS.md, "Epsilons"). The sum of a 64-bit and a 63-bit value
    saturates at ``2**64 - 1``.
    """
    return min(int(ssq) + (int(bias) << int(bias_shift)), UINT64_MAX)


def dequant_scale(ssq: int, amax: int, cb_mant: int, cb_shift: int,
                  out_frac: int = RESIDUAL_FRAC) -> tuple[int, int]:
    """Per-token dequantization scale of a GEMV: ``v = acc * s_mant * 2**-s_shift``.

    BitLinear's output is ``acc * max|u| / 127 / s_w`` with ``u`` the RMS-normalized input; since
    absmax codes ignore a positive scale (docs/ARCHITECTURE.md section 2, facts 1 and 2), this equals
    ``acc * Cb * A / sqrt(ssq)`` with ``Cb = sqrt(K) / 127 / s_w`` (``cb_mant * 2**-cb_shift``), ``A``
    the absmax and ``ssq`` the epsilon-carrying sum of squares (:func:`ssq_with_bias`; same units: the
    register holds squares shifted right by :data:`SSQ_SHIFT`, hence the ``+ SSQ_SHIFT / 2`` in the shift).
    The scalar unit computes ``root = isqrt(ssq)`` (at least 1) and one integer division with a 25-bit
    quotient.

    Returns
    -------
    s_mant : int, < 2**26
    s_shift : int
        Result has ``out_frac`` fraction bits.
    """
    root = max(math.isqrt(int(ssq)), 1)
    num = int(cb_mant) * max(int(amax), 1)
    t = 24 - (num.bit_length() - root.bit_length())
    s_mant = (num << t) // root if t >= 0 else (num >> -t) // root
    return s_mant, t + int(cb_shift) - out_frac + SSQ_SHIFT // 2


def dequant(acc: np.ndarray, s_mant: int, s_shift: int) -> np.ndarray:
    """``sat32(round(acc * s_mant * 2**-s_shift))`` (round half up; ``|acc| <= 2**21``, ``s_mant < 2**26``)."""
    p = np.multiply(acc, np.int64(s_mant), dtype=np.int64)
    if s_shift > 62:
        return np.zeros_like(p)
    if s_shift > 0:
        p += 1 << (s_shift - 1)
        p >>= s_shift
    elif s_shift < 0:
        p = sat32(p) << min(-s_shift, 32)
    return sat32(p)


def ssq_accumulate(reg: int, w: np.ndarray) -> int:
    """``reg + sum(w**2 >> SSQ_SHIFT)``, exact (``|w| <= 2**31``: each term < 2**46, so 2**17 terms fit
    64 bits; saturates at ``2**64 - 1`` all the same)."""
    w2 = np.asarray(w, dtype=np.int64) ** 2 >> SSQ_SHIFT
    return min(int(reg) + int(np.sum(w2)), UINT64_MAX)
