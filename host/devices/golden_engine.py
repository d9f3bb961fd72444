"""The golden device's arithmetic as one compiled function per token: bit-exact, at CPU-engine speed.

:class:`GoldenEngine` runs a validated :class:`host.image.ParsedImage` on a token vector and a recurrent state
and returns what :class:`host.devices.golden.GoldenMachine` returns (the output packet and the new state), bit
for bit: the quantize prologue, the scalar unit's scales (:func:`hw.numerics.quant_recip`,
:func:`~hw.numerics.ssq_with_bias`, :func:`~hw.numerics.dequant_scale`), the ternary GEMV and every epilogue
micro-op of :class:`hw.isa.MicroOpcode` with the integer definitions of :mod:`hw.numerics`. It does not check
input (only :func:`host.image.parse_image`'s well-formed images reach it; malformed input, token packet checks,
traces and counters stay with ``GoldenMachine``), and it refuses an image outside its envelope with
:class:`UnsupportedImage` so that the caller can fall back to ``GoldenMachine``.

How (docs/PERFORMANCE.md, "Golden engine"; measured on a 2-core Intel Xeon, ``bench/results/cpu.json``):

* **Whole token in one numba function** (the ``run_token`` kernel): the program is flattened at load into integer
  tables (instruction fields, micro-ops, one constant pool) and executed without returning to Python; one
  int64 scratch memory holds X, A, P, TOKEN and both state copies, so every buffer is an offset.
* **T-MAC table-lookup GEMV**: the weights are re-laid out once, at load, into *row-aligned* base-3 bytes
  (``ceil(K/5)`` bytes per row, five trits per byte, both image packings and every channel split converted to
  the same layout; only the ``packed_trit_bytes`` prefix of each channel block is read, so a trailing CRC word
  is ignored). Per quantize prologue one table ``T[g, b] = sum_i trit_i(b) * q[5g + i]`` (int32, 243 used
  entries of 256 per group of five codes) is built; a row is then ``sum_g T[g, byte[r, g]]``: one load and one
  add per five trits. Integer sums are exact in any order, so the result equals the trit-by-trit sum.
* **Few, large parallel regions**: GEMVs that share one quantize prologue (``REUSE_CODES``: the two halves of
  ``gate_proj``) have their rows next to each other and run as one GEMV; a GEMV (group) runs in one parallel
  region (``numba.prange`` over rows) only when it has at least :data:`PARALLEL_MIN_TRITS` trits and the thread
  pool has been measured faster lately (``parallel=None``); small ones, the tables and the epilogues run on the
  calling thread. The 370M shape has six regions a layer (i, f, g, o, gate, down), the shipped model one a
  token (its LM head).

The GEMV kernel has a batch dimension (:func:`gemv_batch`): B code vectors against one pass over the weights,
bit-identical to B separate calls.
"""

from __future__ import annotations

import os
import time

import numpy as np

from host.image import ParsedImage, channel_rows
from host.protocol import make_output_packet
from hw import isa
from hw import numerics as nx
from hw.isa import Buffer, InstrFlags, MicroOpcode, Opcode

__all__ = ["GoldenEngine", "UnsupportedImage", "PARALLEL_MIN_TRITS", "build_table", "build_table_batch",
           "gemv_batch", "pack_rows", "quantize_codes", "scalar_scales"]

#: A GEMV (or group of GEMVs sharing codes) of at least this many trits is split over threads; smaller ones run
#: on the calling thread. 2**20 trits take about 60 us on one core here: the shipped model's only parallel region
#: is then its LM head; the 370M shape has six a layer. With 2**18 and two threads the shipped
#: model ran at 1189 tokens/s under OMP_WAIT_POLICY=PASSIVE and at 17 under libgomp's default spin policy while
#: another process held the second core (alternating runs, one process each; docs/PERFORMANCE.md).
PARALLEL_MIN_TRITS = 1 << 20

#: The OpenMP wait policy for numba's ``omp`` threading layer (read once, when its pool starts; a user's own
#: setting wins), as host/devices/golden.py sets it: with libgomp's default (spin, then sleep) a parallel region
#: waits for a time slice whenever another process holds a core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# instruction table columns
(_OPC, _FLAGS, _LAYER, _N, _K, _SRC, _QSHIFT, _AMAX, _SSQ, _CBM, _CBS, _BIAS, _BIASS, _OFRAC, _QC, _C0, _C1, _C2,
 _C3, _OP0, _NOPS, _W, _G, _AOFF, _GROWS) = range(25)
_NCOL = 25
# memory layout: buffer id -> region; consts and state are placed by the engine
_REUSE, _LOGITS = InstrFlags.REUSE_CODES.value, InstrFlags.LOGITS.value
_INT32_MIN, _INT32_MAX = nx.INT32_MIN, nx.INT32_MAX
_U64_MAX = np.uint64(nx.UINT64_MAX)


class UnsupportedImage(ValueError):
    """The image uses something the engine does not implement (the caller runs ``GoldenMachine`` instead)."""


# ----------------------------------------------------------------------------------------------- kernels
def _define():
    from host.extras import require_extra

    numba = require_extra("numba", "the golden device's engine")
    njit, prange = numba.njit, numba.prange

    @njit(cache=True, nogil=True)
    def bit_length(x):
        n = 0
        while x > 0:
            x >>= 1
            n += 1
        return n

    @njit(cache=True, nogil=True)
    def isqrt_u64(x):
        """Exact floor(sqrt(x)) of a uint64."""
        r = np.uint64(np.sqrt(np.float64(x)))
        lim = np.uint64(4294967295)
        if r > lim:
            r = lim
        while r * r > x:
            r -= np.uint64(1)
        while r < lim and (r + np.uint64(1)) * (r + np.uint64(1)) <= x:
            r += np.uint64(1)
        return r

    @njit(cache=True, nogil=True)
    def scalar_scales(amax_u, ssq_u, bias, bias_shift, cb_mant, cb_shift, out_frac):
        """quant_recip, ssq_with_bias and dequant_scale: (r_mant, r_shift, s_mant, s_shift)."""
        a = np.int64(amax_u)
        if a < 1:
            a = 1
        r_shift = bit_length(a) + 17
        r_mant = ((np.int64(127) << r_shift) + (a >> 1)) // a
        add = np.uint64(bias) << np.uint64(bias_shift)
        ssq = ssq_u + add if add <= _U64_MAX - ssq_u else _U64_MAX
        root = np.int64(isqrt_u64(ssq))
        if root < 1:
            root = 1
        num = np.int64(cb_mant) * a
        t = 24 - (bit_length(num) - bit_length(root))
        if t >= 0:
            s_mant = (num << t) // root
        else:
            s_mant = (num >> -t) // root
        return r_mant, r_shift, s_mant, t + cb_shift - out_frac + nx.SSQ_SHIFT // 2

    @njit(cache=True, nogil=True)
    def quantize_codes(mem, src, k, qc, q_shift, r_mant, r_shift, codes):
        """codes[:k] = quantize(mul(src, qconst, q_shift) or src); qc < 0: no QCONST."""
        half = np.int64(1) << (r_shift - 1)
        vs = mem[src:src + k]
        vq = mem[max(qc, 0):max(qc, 0) + k]
        for j in range(k):
            w = vs[j]
            if qc >= 0:
                w = w * vq[j]
                if q_shift > 0:
                    w = (w + (np.int64(1) << (q_shift - 1))) >> q_shift
                w = min(max(w, _INT32_MIN), _INT32_MAX)
            p = w * r_mant
            p += half - (1 if p < 0 else 0)
            p >>= r_shift
            codes[j] = min(max(p, -128), 127)

    @njit(cache=True, nogil=True)
    def build_table(codes, k, table):
        """table[256 g + b] = sum_i trit_i(b) * codes[5 g + i] for base-3 bytes b (codes beyond k count 0)."""
        ng = (k + 4) // 5
        c = np.zeros(5, np.int32)
        for g in range(ng):
            for i in range(5):
                j = 5 * g + i
                c[i] = codes[j] if j < k else 0
            tg = table[256 * g: 256 * g + 243]
            for d4 in range(3):
                s4 = (d4 - 1) * c[4]
                for d3 in range(3):
                    s3 = s4 + (d3 - 1) * c[3]
                    for d2 in range(3):
                        s2 = s3 + (d2 - 1) * c[2]
                        for d1 in range(3):
                            s1 = s2 + (d1 - 1) * c[1]
                            b = d4 * 81 + d3 * 27 + d2 * 9 + d1 * 3
                            tg[b] = s1 - c[0]
                            tg[b + 1] = s1
                            tg[b + 2] = s1 + c[0]

    @njit(cache=True, nogil=True)
    def gemv_row(row, ng, table):
        # slices indexed by range variables: no negative-index wraparound per load (3x faster than w[base + g])
        s = 0
        tb = 0
        for g in range(ng):
            s += table[tb + row[g]]
            tb += 256
        return s

    @njit(cache=True, nogil=True)
    def gemv_rows(w, woff, ng, table, r0, r1, acc):
        for r in range(r0, r1):
            acc[r] = gemv_row(w[woff + r * ng: woff + (r + 1) * ng], ng, table)

    @njit(cache=True, nogil=True, parallel=True)
    def gemv_parallel(w, woff, n, ng, table, acc):
        for r in prange(n):
            acc[r] = gemv_row(w[woff + r * ng: woff + (r + 1) * ng], ng, table)

    @njit(cache=True, nogil=True)
    def build_table_batch(codes, k, table):
        """Batched :func:`build_table`: codes int32 [B, k] -> table int32 [G, 256, B]."""
        nb = codes.shape[0]
        one = np.zeros(((k + 4) // 5) * 256, np.int32)
        for q in range(nb):
            build_table(codes[q], k, one)
            for g in range(table.shape[0]):
                for b in range(256):
                    table[g, b, q] = one[256 * g + b]

    @njit(cache=True, nogil=True, parallel=True)
    def gemv_batch(w, woff, n, ng, table, nb, acc):
        """acc[q, r] = sum_g table[(256 g + w[woff + r ng + g]) nb + q] for the nb code vectors q: one pass over
        the weights from memory (a row's bytes stay in L1 while the nb sums run over them; the table of
        :func:`build_table_batch`, flattened)."""
        for r in prange(n):
            row = w[woff + r * ng: woff + (r + 1) * ng]
            for q in range(nb):
                s = 0
                tb = q
                for g in range(ng):
                    s += table[tb + row[g] * nb]
                    tb += 256 * nb
                acc[q, r] = s

    @njit(cache=True, nogil=True)
    def sigmoid1(x, in_frac, sig, seg):
        step = in_frac + nx.LUT_RANGE_LOG2 + 1 - seg
        lo = -(np.int64(1) << (nx.LUT_RANGE_LOG2 + in_frac))
        xc = min(max(x, lo), -lo - 1) - lo
        idx = xc >> step
        fr = xc & ((np.int64(1) << step) - 1)
        t0 = sig[idx]
        d = sig[idx + 1] - t0
        return t0 + ((d * fr + (np.int64(1) << (step - 1))) >> step)

    @njit(cache=True, nogil=True)
    def mul1(a, b, shift):
        p = a * b
        if shift > 0:
            p = (p + (np.int64(1) << (shift - 1))) >> shift
        return min(max(p, _INT32_MIN), _INT32_MAX)

    @njit(cache=True, nogil=True)
    def sat(x):
        return min(max(x, _INT32_MIN), _INT32_MAX)

    @njit(cache=True, nogil=True)
    def run_token(prog, ops, w, sig, seg, gate_frac, mem, buf_base, layer_stride, regs, r, codes, table, acc,
                  logits, threads_min):
        """Run the whole program; returns (argmax, max_acc, out_mant, out_shift, n_logits).

        ``mem`` holds X, A, P, TOKEN, STATE_OLD [L H], STATE_NEW [L H] and the constants; ``buf_base[b]``
        is buffer ``b``'s offset (state buffers: layer 0's).
        """
        argmax = 0
        max_acc = np.int64(0)
        out_mant = np.int64(0)
        out_shift = np.int64(0)
        n_logits = 0
        s_mant = np.int64(0)
        s_shift = np.int64(0)
        cleared = np.zeros(8, np.bool_)
        for ii in range(prog.shape[0]):
            ins = prog[ii]
            opc = ins[_OPC]
            if opc == 3:       # END_TOKEN
                break
            n = ins[_N]
            layer = ins[_LAYER]
            if opc == 1:       # GEMV
                k = ins[_K]
                ng = ins[_G]
                if (ins[_FLAGS] & _REUSE) == 0:
                    r_mant, r_shift, s_mant, s_shift = scalar_scales(
                        regs[ins[_AMAX]], regs[ins[_SSQ]], ins[_BIAS], ins[_BIASS], ins[_CBM], ins[_CBS],
                        ins[_OFRAC])
                    quantize_codes(mem, buf_base[ins[_SRC]], k, ins[_QC], ins[_QSHIFT], r_mant, r_shift, codes)
                    build_table(codes, k, table)
                    # the GEMVs that reuse these codes follow with their rows contiguous in w: one pass for all
                    rows = ins[_GROWS]
                    if rows * k >= threads_min:
                        gemv_parallel(w, ins[_W], rows, ng, table, acc)
                    else:
                        gemv_rows(w, ins[_W], ng, table, 0, rows, acc)
                va = acc[ins[_AOFF]:ins[_AOFF] + n]
                r0v, r1v, r2v, r3v = r[0, :n], r[1, :n], r[2, :n], r[3, :n]
                for e in range(n):
                    a = np.int64(va[e])
                    r1v[e] = a
                    p = a * s_mant
                    if s_shift > 62:
                        p = 0
                    elif s_shift > 0:
                        p = (p + (np.int64(1) << (s_shift - 1))) >> s_shift
                    elif s_shift < 0:
                        p = sat(p) << min(-s_shift, 32)
                    r0v[e] = sat(p)
                    r2v[e] = 0
                    r3v[e] = 0
                if ins[_FLAGS] & _LOGITS:
                    out_mant = s_mant
                    out_shift = s_shift + ins[_OFRAC]
            else:              # LOAD_TOKEN
                tv = mem[buf_base[5]:buf_base[5] + n]
                for e in range(n):
                    r[0, e] = tv[e]
                    r[1, e] = tv[e]
                    r[2, e] = 0
                    r[3, e] = 0
            cleared[:] = False
            for oi in range(ins[_OP0], ins[_OP0] + ins[_NOPS]):
                o = ops[oi, 0]
                bid = ops[oi, 4]
                sh = ops[oi, 5]
                rg = ops[oi, 6]
                # views indexed by range variables (no negative-index wraparound per element)
                va = r[ops[oi, 2], :n]
                vb = r[ops[oi, 3], :n]
                vd = r[ops[oi, 1], :n]
                if bid == 3 or bid == 4:
                    base = buf_base[bid] + layer * layer_stride
                elif 8 <= bid <= 11:
                    base = ins[_C0 + bid - 8]
                elif bid != 15:
                    base = buf_base[bid]
                else:
                    base = 0
                vm = mem[base:base + n]
                if o == 0:         # NOP
                    continue
                elif o == 1:       # LD
                    for e in range(n):
                        vd[e] = vm[e]
                elif o == 2:       # ST
                    for e in range(n):
                        vm[e] = va[e]
                elif o == 3:       # ADD
                    for e in range(n):
                        vd[e] = sat(va[e] + vb[e])
                elif o == 4:       # SUB
                    for e in range(n):
                        vd[e] = sat(va[e] - vb[e])
                elif o == 5:       # MUL
                    for e in range(n):
                        vd[e] = mul1(va[e], vb[e], sh)
                elif o == 6:       # MULV
                    for e in range(n):
                        vd[e] = mul1(va[e], vm[e], sh)
                elif o == 7:       # ADDV
                    for e in range(n):
                        vd[e] = sat(va[e] + vm[e])
                elif o == 8:       # SIG
                    for e in range(n):
                        vd[e] = sigmoid1(va[e], sh, sig, seg)
                elif o == 9:       # SIGNEG
                    for e in range(n):
                        vd[e] = sigmoid1(sat(-va[e]), sh, sig, seg)
                elif o == 10:      # SILU
                    for e in range(n):
                        x = va[e]
                        vd[e] = mul1(x, sigmoid1(x, sh, sig, seg), gate_frac)
                elif o == 11:      # RSUB1
                    one = np.int64(1) << sh
                    for e in range(n):
                        vd[e] = sat(one - va[e])
                elif o == 12 or o == 13:   # SSQ, AMAX
                    if not cleared[rg]:
                        regs[rg] = 0
                        cleared[rg] = True
                    if o == 12:
                        s = np.int64(0)
                        if bid == 15:
                            for e in range(n):
                                s += (va[e] * va[e]) >> nx.SSQ_SHIFT
                        else:
                            for e in range(n):
                                x = mul1(va[e], vm[e], sh)
                                s += (x * x) >> nx.SSQ_SHIFT
                        su = np.uint64(s)
                        regs[rg] = regs[rg] + su if su <= _U64_MAX - regs[rg] else _U64_MAX
                    else:
                        m = np.int64(0)
                        if bid == 15:
                            for e in range(n):
                                m = max(m, abs(va[e]))
                        else:
                            for e in range(n):
                                m = max(m, abs(mul1(va[e], vm[e], sh)))
                        if np.uint64(m) > regs[rg]:
                            regs[rg] = np.uint64(m)
                elif o == 14:      # ARGMAX
                    best = 0
                    for e in range(1, n):
                        if va[e] > va[best]:
                            best = e
                    argmax = best
                    max_acc = va[best]
                elif o == 15:      # OUT
                    lv = logits[n_logits:n_logits + n]
                    for e in range(n):
                        lv[e] = va[e]
                    n_logits += n
        return argmax, max_acc, out_mant, out_shift, n_logits

    @njit(cache=True, nogil=True)
    def pack_rows(block, per_byte, decode, n_rows, k, row0, row_step, ng, w, woff):
        """Row-aligned base-3 bytes from one channel block (continuous rows, ``per_byte`` trits a byte)."""
        pos = 0
        for i in range(n_rows):
            base = woff + (row0 + i * row_step) * ng
            for g in range(ng):
                byte = 0
                mult = 1
                for t in range(5):
                    j = 5 * g + t
                    d = 1
                    if j < k:
                        p = pos + j
                        bi = p // per_byte
                        d = decode[block[bi], p - bi * per_byte] + 1
                    byte += d * mult
                    mult *= 3
                w[base + g] = byte
            pos += k

    return dict(scalar_scales=scalar_scales, quantize_codes=quantize_codes, build_table=build_table,
                build_table_batch=build_table_batch, gemv_rows=gemv_rows, gemv_parallel=gemv_parallel,
                gemv_batch=gemv_batch, run_token=run_token, pack_rows=pack_rows)


_KERNELS: dict | None = None


def _kernels() -> dict:
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = _define()
    return _KERNELS


def scalar_scales(amax: int, ssq: int, bias: int, bias_shift: int, cb_mant: int, cb_shift: int,
                  out_frac: int) -> tuple[int, int, int, int]:
    """The scalar unit, compiled: ``quant_recip(amax) + dequant_scale(ssq_with_bias(ssq, bias, bias_shift), amax,
    cb_mant, cb_shift, out_frac)`` of :mod:`hw.numerics` (``amax``, ``ssq``: the uint64 registers)."""
    out = _kernels()["scalar_scales"](np.uint64(amax), np.uint64(ssq), np.int64(bias), np.int64(bias_shift),
                                      np.int64(cb_mant), np.int64(cb_shift), np.int64(out_frac))
    return tuple(int(v) for v in out)


def quantize_codes(w: np.ndarray, r_mant: int, r_shift: int) -> np.ndarray:
    """:func:`hw.numerics.quantize` compiled (no QCONST): int64 [K] -> int32 codes [K]."""
    w = np.ascontiguousarray(w, dtype=np.int64)
    codes = np.zeros(w.size, np.int32)
    _kernels()["quantize_codes"](w, 0, w.size, -1, 0, np.int64(r_mant), np.int64(r_shift), codes)
    return codes


def pack_rows(trits: np.ndarray) -> np.ndarray:
    """Row-aligned base-3 bytes of a trit matrix int8 [N, K] -> uint8 [N, ceil(K/5)] (padding trits 0)."""
    t = np.asarray(trits, dtype=np.int8)
    n, k = t.shape
    ng = (k + 4) // 5
    block = np.frombuffer(isa.pack_trits(t, isa.TritPacking.BASE3), np.uint8)
    w = np.zeros(n * ng, np.uint8)
    _kernels()["pack_rows"](block, 5, isa.BASE3_DECODE.astype(np.int32), n, k, 0, 1, ng, w, 0)
    return w.reshape(n, ng)


def build_table(codes: np.ndarray) -> np.ndarray:
    """The T-MAC table of one code vector int32 [K]: int32 [ceil(K/5), 256]."""
    codes = np.ascontiguousarray(codes, dtype=np.int32)
    t = np.zeros(((codes.size + 4) // 5) * 256, np.int32)
    _kernels()["build_table"](codes, codes.size, t)
    return t.reshape(-1, 256)


def build_table_batch(codes: np.ndarray) -> np.ndarray:
    """Tables of B code vectors int32 [B, K] at once: int32 [ceil(K/5), 256, B] (``[..., q]`` is
    :func:`build_table` of ``codes[q]``)."""
    codes = np.ascontiguousarray(codes, dtype=np.int32)
    t = np.zeros(((codes.shape[1] + 4) // 5, 256, codes.shape[0]), np.int32)
    _kernels()["build_table_batch"](codes, codes.shape[1], t)
    return t


def gemv_batch(rows: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The ternary GEMV of B code vectors in one pass over the weights.

    Parameters
    ----------
    rows : ndarray, uint8 [N, ceil(K/5)]
        Row-aligned base-3 weight bytes (:func:`pack_rows`).
    codes : ndarray, int [B, K]
        int8-range codes, one vector per row.

    Returns
    -------
    ndarray, int64 [B, N]: ``acc[q, n] = sum_k W[n, k] codes[q, k]``, bit-identical to B separate GEMVs.
    """
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    codes = np.atleast_2d(np.asarray(codes))
    n, ng = rows.shape
    if (codes.shape[1] + 4) // 5 != ng:
        raise ValueError(f"{codes.shape[1]} codes for rows of {ng} bytes")
    table = build_table_batch(codes)
    acc = np.zeros((codes.shape[0], n), np.int32)
    _kernels()["gemv_batch"](rows.reshape(-1), 0, n, ng, table.reshape(-1), codes.shape[0], acc)
    return acc.astype(np.int64)


# ------------------------------------------------------------------------------------------------ engine
class GoldenEngine:
    """A validated image flattened for the compiled token function: ``run(token, flags, position, state)``.

    Parameters
    ----------
    image : ParsedImage
        From :func:`host.image.parse_image` (validated: shapes, buffers, shifts and trits are not checked again).
    parallel_min_trits : int
        GEMVs of at least this many trits use the numba thread pool (:data:`PARALLEL_MIN_TRITS`) when
        ``numba.get_num_threads() > 1`` at the call.
    parallel : bool or None
        ``True``: always split those GEMVs over the threads; ``False``: never; ``None`` (default): whichever
        has been faster lately. The engine times every token (a moving average per mode) and runs one token in
        the other mode every :attr:`probe_every` tokens, so a second core that another process holds (where
        the thread pool only adds waiting) turns the pool off until the core is free again. The results do not
        depend on it.

    Raises
    ------
    UnsupportedImage
        A program the engine does not run (a quantize prologue whose AMAX or SSQ register was last written by
        the other reduction).
    """

    probe_every = 16

    def __init__(self, image: ParsedImage, *, parallel_min_trits: int = PARALLEL_MIN_TRITS,
                 parallel: bool | None = None) -> None:
        info = image.info
        self.info = info
        self.parallel_min_trits = int(parallel_min_trits)
        self.parallel = parallel
        self._seconds = {False: None, True: None}    # moving average of a token's seconds, per mode
        self._tokens = 0
        kern = _kernels()
        h, layers = info.hidden, info.n_layers
        vmax = max(info.hidden, info.intermediate)
        # memory: X | A | P | TOKEN | STATE_OLD | STATE_NEW | constants
        base = {Buffer.X: 0, Buffer.A: h, Buffer.P: h + vmax, Buffer.TOKEN: h + 2 * vmax}
        base[Buffer.STATE_OLD] = base[Buffer.TOKEN] + h
        base[Buffer.STATE_NEW] = base[Buffer.STATE_OLD] + layers * h
        cursor = base[Buffer.STATE_NEW] + layers * h
        self._state_slice = (base[Buffer.STATE_OLD], base[Buffer.STATE_NEW], layers * h)
        buf_base = np.full(16, -1, np.int64)
        for b, off in base.items():
            buf_base[b.value] = off
        consts: list[np.ndarray] = []
        prog = np.zeros((len(image.instructions), _NCOL), np.int64)
        ops: list[list[int]] = []
        wsizes, kmax, accmax, head = 0, 1, 1, -1
        last_reduce: dict[int, MicroOpcode] = {}
        for i, ins in enumerate(image.instructions):
            row = prog[i]
            row[_OPC] = ins.opcode.value
            if ins.opcode is Opcode.END_TOKEN:
                prog = prog[: i + 1]
                break
            row[[_FLAGS, _LAYER, _N, _K, _SRC, _QSHIFT, _AMAX, _SSQ, _CBM, _CBS, _BIAS, _BIASS, _OFRAC]] = [
                ins.flags.value, ins.layer, ins.n, ins.k, ins.src.value, ins.q_shift, ins.amax_reg, ins.ssq_reg,
                ins.cb_mant, ins.cb_shift, ins.ssq_bias, ins.ssq_bias_shift, ins.out_frac]
            if ins.opcode is Opcode.GEMV and InstrFlags.REUSE_CODES not in ins.flags:
                for reg, want in ((ins.amax_reg, MicroOpcode.AMAX), (ins.ssq_reg, MicroOpcode.SSQ)):
                    if last_reduce.get(reg, want) is not want:
                        raise UnsupportedImage(f"instruction {i}: register {reg} was last written by "
                                               f"{last_reduce[reg].name}, the prologue reads it as {want.name}")
            row[_QC] = -1
            row[_C0:_C3 + 1] = -1
            if ins.qconst is not None:
                row[_QC] = cursor
                consts.append(np.asarray(ins.qconst, np.int64))
                cursor += consts[-1].size
            for j, c in enumerate(ins.consts):
                row[_C0 + j] = cursor
                consts.append(np.asarray(c, np.int64))
                cursor += consts[-1].size
            row[_OP0], row[_NOPS] = len(ops), len(ins.ops)
            for op in ins.ops:
                ops.append([op.op.value, op.dst, op.a, op.b, op.buf.value, op.shift, op.reg])
                if op.op in (MicroOpcode.SSQ, MicroOpcode.AMAX):
                    last_reduce[op.reg] = op.op
            if ins.opcode is Opcode.GEMV:
                row[_G] = (ins.k + 4) // 5
                row[_W] = wsizes
                wsizes += ins.n * int(row[_G])
                kmax = max(kmax, ins.k)
                if InstrFlags.REUSE_CODES in ins.flags:   # rows follow the group head's (same K, same codes)
                    row[_AOFF] = prog[head, _GROWS]
                    prog[head, _GROWS] += ins.n
                else:
                    head = i
                    row[_AOFF], row[_GROWS] = 0, ins.n
                accmax = max(accmax, int(prog[head, _GROWS]))
        else:
            raise UnsupportedImage("the program has no END_TOKEN")
        self._prog = prog
        self._ops = np.asarray(ops, np.int64).reshape(-1, 7)
        # weights: every GEMV's rows, row-aligned base-3 bytes
        self._w = np.zeros(max(wsizes, 1), np.uint8)
        if info.packing is isa.TritPacking.BASE3:
            per, decode = 5, isa.BASE3_DECODE.astype(np.int32)
        else:
            per = 4
            decode = np.stack([isa.BITS2_DECODE[(np.arange(256) >> s) & 3] for s in (0, 2, 4, 6)],
                              axis=1).astype(np.int32)
        for i, ins in enumerate(image.instructions[: prog.shape[0]]):
            if ins.opcode is not Opcode.GEMV:
                continue
            for c, blk in enumerate(ins.blocks):
                rows = channel_rows(ins.n, info.channels, c)
                if rows == 0:
                    continue
                used = isa.packed_trit_bytes(rows * ins.k, info.packing)
                kern["pack_rows"](np.asarray(blk[:used], np.uint8), per, decode, rows, ins.k, c, info.channels,
                                  int(prog[i, _G]), self._w, int(prog[i, _W]))
        self._mem0 = np.zeros(cursor, np.int64)
        if consts:
            self._mem0[base[Buffer.STATE_NEW] + layers * h:] = np.concatenate(consts)
        self._buf_base = buf_base
        self._sig = nx.sigmoid_table(info.lut_segments_log2, info.gate_frac).astype(np.int64)
        nmax = int(max((ins.n for ins in image.instructions[: prog.shape[0]]), default=1))
        self._nmax = max(nmax, vmax)
        self._kmax = kmax
        self._accmax = accmax
        n_out = sum(ins.n for ins in image.instructions[: prog.shape[0]]
                    for op in ins.ops if op.op is MicroOpcode.OUT)
        self._n_out = max(n_out, 1)

    def _use_threads(self, threads: int) -> bool | None:
        """This token's mode: True (thread pool), False (calling thread), None (one thread: nothing to time)."""
        if threads <= 1 or self.parallel is False:
            return None if threads <= 1 else False
        if self.parallel is True:
            return True
        self._tokens += 1
        fast, slow = self._seconds[False], self._seconds[True]
        if fast is None or slow is None:
            return fast is not None          # time each mode once
        best = slow < fast
        return (not best) if self._tokens % self.probe_every == 0 else best

    @property
    def threads_in_use(self) -> bool | None:
        """Whether the adaptive mode currently prefers the thread pool (None until both modes were timed)."""
        a, b = self._seconds[False], self._seconds[True]
        return None if a is None or b is None else b < a

    @property
    def weight_bytes(self) -> int:
        """Bytes of the engine's row-aligned weight copy."""
        return int(self._w.nbytes)

    def run(self, token: np.ndarray, flags: int, position: int, state: np.ndarray) -> tuple[bytes, np.ndarray]:
        """One token, as ``GoldenMachine`` runs it after the token packet's checks.

        Parameters
        ----------
        token : ndarray, int [H]
            The token packet's vector (residual format).
        flags : int
            The token packet's flags (bit 0: send the logits).
        position : int
            The token packet's position.
        state : ndarray, int64 [L, H]
            Committed recurrent state (not modified).

        Returns
        -------
        output : bytes
            The output packet (:func:`host.protocol.make_output_packet`).
        state : ndarray, int64 [L, H]
            The new state.
        """
        out = self.run_raw(token, state)
        acc = out["logits"] if (flags & 1) else np.zeros(0, np.int64)
        packet = make_output_packet(acc, position=position, argmax=out["argmax"], max_acc=out["max_acc"],
                                    scale_mant=out["scale_mant"], scale_shift=out["scale_shift"])
        return packet, out["state"]

    def run_raw(self, token: np.ndarray, state: np.ndarray) -> dict:
        """One token without the output packet: ``logits`` (int64 accumulators of every OUT micro-op, in order),
        ``argmax``, ``max_acc``, ``scale_mant``, ``scale_shift`` and the new ``state`` (int64 [L, H])."""
        info = self.info
        import numba

        mem = self._mem0.copy()
        h = info.hidden
        s_old, s_new, size = self._state_slice
        st = np.asarray(state, dtype=np.int64).reshape(-1)
        mem[s_old:s_old + size] = st
        mem[s_new:s_new + size] = st
        t0 = int(self._buf_base[Buffer.TOKEN.value])
        mem[t0:t0 + h] = np.asarray(token, dtype=np.int64)
        regs = np.zeros(8, np.uint64)
        r = np.zeros((4, self._nmax), np.int64)
        codes = np.zeros(self._kmax, np.int32)
        table = np.zeros(((self._kmax + 4) // 5) * 256, np.int32)
        acc = np.zeros(self._accmax, np.int32)
        logits = np.zeros(self._n_out, np.int64)
        use = self._use_threads(numba.get_num_threads())
        t0 = time.perf_counter()
        am, mx, sm, ss, nl = _kernels()["run_token"](
            self._prog, self._ops, self._w, self._sig, info.lut_segments_log2, info.gate_frac, mem, self._buf_base,
            h, regs, r, codes, table, acc, logits, self.parallel_min_trits if use else np.iinfo(np.int64).max)
        if use is not None:
            dt = time.perf_counter() - t0
            old = self._seconds[use]
            self._seconds[use] = dt if old is None else 0.75 * old + 0.25 * dt
        return {"logits": logits[:nl].copy(), "argmax": int(am), "max_acc": int(mx), "scale_mant": int(sm),
                "scale_shift": int(ss), "state": mem[s_new:s_new + size].reshape(info.n_layers, h).copy()}
