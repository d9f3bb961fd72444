"""The epilogue's shared pieces: its configuration, the micro-op decode, the micro-op stage and the reducer.

Both forms of the epilogue (:class:`hw.epilogue_pipelined.PipelinedEpilogue`, :data:`~hw.isa.MAX_OPS`
stages in a row, and :class:`hw.epilogue_folded.FoldedEpilogue`, one stage closed into a ring) are built
from these: :func:`decode` (the registered decode of one micro-op slot of :class:`EpilogueConfig`),
:func:`stage` (one micro-op in :data:`STAGE_LATENCY` cycles), :func:`reducer` (an SSQ/AMAX accumulator),
and the element and delay helpers (:class:`Elem`, :func:`load`, :func:`delay_line`, :func:`last_true`).
The arithmetic is that of :mod:`hw.numerics` (through :mod:`hw.epilogue_arith`) and of
``_Executor._epilogue`` in :mod:`host.devices.golden`, bit for bit.

Only the register file, the index and the ``last`` flag move through the stages' pipeline registers. The
pipeline advances in lockstep (one global enable ``adv``); data registers load only when the element moving
in is valid (a clock enable, :func:`load`): bubbles leave them alone. No intermediate is wider than 64 bits.
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data
from amaranth.lib.memory import Memory

from hw import numerics as nx
from hw.epilogue_arith import I32_MAX, INT32, add_cin, mul_parts, mul_sum, sat32, sat32_inc
from hw.isa import MAX_OPS, Buffer, MicroOp, MicroOpcode

__all__ = ["EpilogueConfig", "input_layout", "READ_BUFFERS", "WRITE_BUFFERS", "ENTRY_LATENCY", "STAGE_LATENCY",
           "DELAY_DEPTH", "Elem", "load", "delay_line", "last_true", "decode", "reducer", "stage"]

M = MicroOpcode

#: Buffers with a read port (``rd_<name>``), in port order.
READ_BUFFERS = (Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_OLD, Buffer.STATE_NEW,
                Buffer.C0, Buffer.C1, Buffer.C2, Buffer.C3)
#: Buffers with a write port (``wr_<name>``), in port order (the ST targets).
WRITE_BUFFERS = (Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_NEW)

#: Cycles of the entry, from an element's input transfer to its register file at stage 0's ``c0``: input
#: register, dequant product (+ buffer data), dequant shift in two steps (multiples of 8, then 0-7), dequant
#: rounding and sat32, register file
ENTRY_LATENCY = 6
#: Cycles of one micro-op stage (``c0..c9``): operands and adder ALU; clamp and LUT address; LUT data; product A
#: (partial products, sum); shift; rounding, sat32 or sigmoid sum; product B (partial products, sum); result and
#: reductions
STAGE_LATENCY = 10
#: Words of each delay memory (a power of two above the longest delay, exit - stage 0 = 78 advances)
DELAY_DEPTH = 128

class EpilogueConfig(data.Struct):
    """Per-instruction configuration (stable from ``start`` until ``done``).

    ``ops``/``n_ops`` are the instruction header's (:class:`hw.isa.InstrHeader`); ``s_mant``/``s_shift``
    the scalar unit's dequantization scale (:func:`hw.numerics.dequant_scale`, ``ScalarUnit.o``);
    ``raw`` selects LOAD_TOKEN's ``r0 = r1 = value``.
    """

    ops: data.ArrayLayout(MicroOp, MAX_OPS)
    n_ops: unsigned(4)
    s_mant: unsigned(27)
    s_shift: signed(8)
    raw: unsigned(1)


def input_layout(index_bits: int) -> data.StructLayout:
    """Input element: ``value`` (GEMV accumulator, sign-extended, or the raw int32), ``index`` (element
    number n, the buffer address) and ``last`` (the instruction's last element)."""
    return data.StructLayout({"value": INT32, "index": unsigned(index_bits), "last": unsigned(1)})


class Elem:
    """An element in flight between two stages: the register file ``r0..r3`` and its ``index``/``last``, as
    separate signals (no wide record: every field is a word of its own in simulation, and an operand select
    is a 4-way multiplexer, not a shift of a wide vector)."""

    def __init__(self, name: str, index_bits: int, folded: bool = False):
        self.r = [Signal(INT32, name=f"{name}_r{k}", reset_less=True) for k in range(4)]
        self.index = Signal(index_bits, name=f"{name}_index", reset_less=True)
        self.last = Signal(name=f"{name}_last", reset_less=True)
        #: folded epilogue: the micro-op slot the element executes in this pass (None otherwise)
        self.k = Signal(range(MAX_OPS), name=f"{name}_k", reset_less=True) if folded else None

    def pairs(self, other: "Elem") -> list:
        """(destination, source) pairs of a copy from ``other``, for :func:`_load`."""
        ks = [(self.k, other.k)] if self.k is not None else []
        return [*zip(self.r, other.r, strict=True), (self.index, other.index), (self.last, other.last), *ks]


def load(en, pairs) -> list:
    """Registers loaded while ``en`` (the valid bit of the element that would move in) and held otherwise:
    the statements ``dst.eq(Mux(en, src, dst))`` (a clock enable; written as a multiplexer rather than
    ``with m.If(en)`` so that Verilator keeps one conditional block per enable instead of a next-state
    variable per register). Bubbles leave the data registers alone, which saves their evaluation in
    simulation and their toggling in hardware."""
    return [dst.eq(Mux(en, src, dst)) for dst, src in pairs]


def delay_line(m: Module, name: str, wp, adv, offset, data_in, shape=INT32):
    """A delay of ``offset`` advances (a value constant from the configuration, 1..:data:`DELAY_DEPTH` - 1)
    through a small memory instead of a chain of registers: ``data_in`` is written at every advance (``adv``)
    at the shared write pointer ``wp``; the returned register is loaded, also at every advance, with the word
    written ``offset`` advances earlier, so it holds the value that ``data_in`` had when the element now
    ``offset`` registers further down the lockstep pipeline was where ``data_in`` was sampled."""
    mem = Memory(shape=shape, depth=DELAY_DEPTH, init=[])
    m.submodules[name] = mem
    w, r = mem.write_port(), mem.read_port()
    m.d.comb += [w.addr.eq(wp), w.data.eq(data_in), w.en.eq(adv),
                 r.addr.eq(wp - offset), r.en.eq(adv)]
    return r.data


def last_true(m: Module, name: str, conds) -> tuple[Signal, Signal]:
    """Combinational: the index of the last of ``conds`` (one per micro-op slot) that holds, and whether any
    does (the program's last OUT, ARGMAX or ST to a buffer, as the golden device's in-order semantics keep)."""
    sel, any_ = Signal(range(MAX_OPS), name=f"{name}_c"), Signal(name=f"{name}_en_c")
    for s, c in enumerate(conds):
        with m.If(c):
            m.d.comb += [sel.eq(s), any_.eq(1)]
    return sel, any_


def decode(m: Module, cfg, s: int, seg: int) -> dict:
    """Registered decode of micro-op slot ``s`` of ``cfg`` (an :class:`EpilogueConfig`; slots at or beyond
    ``cfg.n_ops`` decode as NOP) for a sigmoid LUT of ``2**seg`` segments, built in ``m``. The configuration
    is stable, so a cycle or two of lag costs nothing and keeps the decoders, the operand selects and the
    shifters' controls off the datapath.

    Returns a dict of registers named ``s<s>_<field>``: ``op`` (:class:`hw.isa.MicroOpcode`); one-bit flags
    ``sig`` (SIG, SIGNEG, SILU), ``neg``, ``silu``, ``mul``, ``ssq``, ``amax``, ``st``, ``argmax``, ``out``,
    ``wnone`` (``buf`` is NONE), ``rs_big`` (RSUB1 with ``shift >= 32``); the fields ``asel``, ``bsel``,
    ``dst``, ``reg``, ``buf``; the sigmoid's clamp (``clamp``, bounds ``lo``/``hi``, ``hmask``, their LUT
    addresses ``idx_lo``/``idx_hi``), segment step (``step``, ``mask``, ``big``), product A's rounding shift
    (``sh0``, ``shm1``) and RSUB1's ``rs_one = 2**shift``.
    """
    mo = cfg.ops[s]
    op_c = Signal(MicroOpcode, name=f"s{s}_op_c")
    m.d.comb += op_c.eq(Mux(s < cfg.n_ops, mo.op, M.NOP))
    op = Signal(MicroOpcode, name=f"s{s}_op", reset_less=True)
    m.d.sync += op.eq(op_c)
    dc = {"op": op}
    for name, cond in (("sig", (op_c == M.SIG) | (op_c == M.SIGNEG) | (op_c == M.SILU)),
                       ("neg", op_c == M.SIGNEG), ("silu", op_c == M.SILU), ("mul", op_c == M.MUL),
                       ("ssq", op_c == M.SSQ), ("amax", op_c == M.AMAX), ("st", op_c == M.ST),
                       ("argmax", op_c == M.ARGMAX), ("out", op_c == M.OUT),
                       ("wnone", mo.buf == Buffer.NONE), ("rs_big", (op_c == M.RSUB1) & (mo.shift >= 32))):
        sig = Signal(name=f"s{s}_{name}", reset_less=True)
        m.d.sync += sig.eq(cond)
        dc[name] = sig
    for name, field in (("asel", mo.a), ("bsel", mo.b), ("dst", mo.dst), ("reg", mo.reg), ("buf", mo.buf)):
        sel = Signal(field.shape(), name=f"s{s}_{name}", reset_less=True)
        m.d.sync += sel.eq(field)
        dc[name] = sel
    shift = mo.shift
    # sigmoid: clamp to [-2**(4+shift), 2**(4+shift)) when that is inside int32; ``hmask``: the bits above
    # the range (an input is inside iff its bits under ``hmask`` are all sign bits)
    lim = Signal(range(64 + 5), name=f"s{s}_lim")
    clamp = Signal(name=f"s{s}_clamp", reset_less=True)
    lo = Signal(INT32, name=f"s{s}_lo", reset_less=True)
    hi = Signal(INT32, name=f"s{s}_hi", reset_less=True)
    hmask = Signal(32, name=f"s{s}_hmask", reset_less=True)
    m.d.comb += lim.eq(shift + nx.LUT_RANGE_LOG2)
    m.d.sync += [clamp.eq(lim <= 30), lo.eq(-(Const(1, 32) << lim[:5])), hi.eq((Const(1, 32) << lim[:5]) - 1),
                 hmask.eq(~((Const(1, 32) << lim[:5]) - 1))]
    # segment step = shift + 5 - lut_segments_log2, kept in 1..62
    step_raw = Signal(signed(8), name=f"s{s}_step_raw")
    step = Signal(range(63), name=f"s{s}_step", reset_less=True)
    m.d.comb += step_raw.eq(shift + (nx.LUT_RANGE_LOG2 + 1 - seg))
    m.d.sync += step.eq(Mux(step_raw < 1, 1, step_raw))
    mask = Signal(32, name=f"s{s}_mask", reset_less=True)
    big = Signal(name=f"s{s}_big", reset_less=True)
    m.d.sync += [big.eq(step >= 32), mask.eq(Mux(step >= 32, 0xFFFF_FFFF, (Const(1, 33) << step[:5]) - 1))]
    # product A's rounding shift: the segment step (sigmoid) or the shift field (MUL, MULV, SSQ, AMAX); as
    # "is zero" and "minus one"
    sh = Signal(range(64), name=f"s{s}_sh_c")
    sh0 = Signal(name=f"s{s}_sh0", reset_less=True)
    shm1 = Signal(range(63), name=f"s{s}_shm1", reset_less=True)
    m.d.comb += sh.eq(Mux(dc["sig"], step, shift))
    m.d.sync += [sh0.eq(sh == 0), shm1.eq(Mux(sh == 0, 0, sh - 1))]
    # RSUB1: 2**shift - a (2**shift >= 2**32 always saturates: rs_big)
    rs_one = Signal(unsigned(32), name=f"s{s}_rs_one", reset_less=True)
    m.d.sync += rs_one.eq(Const(1, 32) << shift[:5])
    # the LUT addresses of the clamp bounds
    idx_lo = Signal(seg, name=f"s{s}_idx_lo", reset_less=True)
    idx_hi = Signal(seg, name=f"s{s}_idx_hi", reset_less=True)
    m.d.sync += [idx_lo.eq((lo >> step) + (1 << (seg - 1))), idx_hi.eq((hi >> step) + (1 << (seg - 1)))]
    dc.update(clamp=clamp, lo=lo, hi=hi, hmask=hmask, step=step, mask=mask, big=big, sh0=sh0, shm1=shm1,
              rs_one=rs_one, idx_lo=idx_lo, idx_hi=idx_hi)
    return dc


def reducer(m: Module, name: str, start, ssq_take, pb, amax_take, mag):
    """A reduction accumulator (unsigned 64, registers ``<name>_acc``, ``_cy``, ``_sat`` in ``m``): SSQ adds
    ``pb >> SSQ_SHIFT`` (``pb``: product B, signed 64) while ``ssq_take``, AMAX takes ``max(acc, mag)``
    (``mag``: ``|w|``, unsigned 32) while ``amax_take``; cleared by ``start``. Returns ``(acc, sat, cy)``.

    SSQ adds in two 32-bit halves, the low half's carry entering the high half one cycle later (a pending
    carry ``cy`` is added in the next cycle, with or without a new term); an overflow of the high half sets
    ``sat`` (the sum only grows, so the golden device's saturated sum is ``2**64 - 1`` from then on). AMAX:
    ``acc < 2**32`` whenever the program has written it.
    """
    acc = Signal(unsigned(64), name=f"{name}_acc")
    cy, sat = Signal(name=f"{name}_cy"), Signal(name=f"{name}_sat")
    term = pb[nx.SSQ_SHIFT:63]
    lo_sum = acc[:32] + Mux(ssq_take, term[:32], 0)
    hi_sum = add_cin(acc[32:], Mux(ssq_take, term[32:], 0), cy)
    with m.If(ssq_take | cy):
        m.d.sync += [acc.eq(Cat(lo_sum[:32], hi_sum[:32])), cy.eq(lo_sum[32])]
        with m.If(hi_sum[32]):
            m.d.sync += sat.eq(1)
    with m.If(amax_take & (acc[32:] == 0) & (mag > acc[:32])):
        m.d.sync += acc.eq(mag)
    with m.If(start):
        m.d.sync += [acc.eq(0), cy.eq(0), sat.eq(0)]
    return acc, sat, cy


def stage(m: Module, s: int, dcs: list, e_in: Elem, v_in, val, rom_port, adv, *, seg: int, index_bits: int,
          k_in=None) -> SimpleNamespace:
    """Stage ``s``, built in ``m``: executes a micro-op in :data:`STAGE_LATENCY` cycles ``c0..c9`` on the element
    ``e_in`` (valid ``v_in``), advancing while ``adv``; ``val`` is its buffer operand (a register holding it
    while the element is at ``e_in``); ``rom_port`` a synchronous read port of the sigmoid ROM (``2**seg``
    words ``{t0, d}``); ``index_bits`` the width of the element index.

    Unfolded (``k_in`` None) the stage executes ``cfg.ops[s]``, decoded in ``dcs[s]``. Folded, the element
    carries the slot ``k`` it executes in this pass (``e_in.k``, loaded from ``k_in``), and every decoded
    field a cycle ``c_j`` uses is a register loaded, as the element moves into ``c_j``, from
    ``dcs[k][field]`` (an 8-way multiplexer before the register, never on the datapath).

    Returns a namespace: ``eo``/``vo`` the output element (the next stage's input, or the folded ring's
    last register ``c10``) and its valid bit; ``es``/``vs`` the elements of ``c0..c10``; ``a1`` operand
    ``a`` in ``c1`` (the value of ST, OUT and ARGMAX); ``pb`` product B and ``mag`` ``|w|`` in ``c9`` (the
    reductions' terms); ``field(j, name)`` the decoded field of the element in ``c_j``.
    """
    ib = index_bits
    folded = k_in is not None
    n = STAGE_LATENCY

    def reg(shape, name):
        return Signal(shape, name=f"s{s}_{name}", reset_less=True)

    # es[j], vs[j]: the element in cycle c_j and its valid bit (es[0] = e_in; es[n]: the stage's output)
    es = [e_in] + [Elem(f"s{s}_e{j}", ib, folded) for j in range(1, n + 1)]
    vs = [v_in] + [Signal(name=f"s{s}_v{j}") for j in range(1, n + 1)]
    fields = {}
    if folded:
        # the field registers' loads live in a module of their own: a field first used inside a Switch
        # case must not load only in that case
        m.submodules.fields = fm = Module()

    def field(j, name):
        """The decoded field ``name`` of the micro-op the element in ``c_j`` executes."""
        if not folded:
            return dcs[s][name]
        if (j, name) not in fields:
            src = Array([Value.cast(dc[name]) for dc in dcs])[k_in if j == 0 else es[j - 1].k]
            r = Signal(Value.cast(dcs[0][name]).shape(), name=f"s{s}_{name}_c{j}", reset_less=True)
            with fm.If(adv):
                fm.d.sync += r.eq(src)
            fields[j, name] = r
        return fields[j, name]

    def advance(j, pairs, elem=True):
        """End of cycle c_j: the element (if ``elem``) and ``pairs`` move into c_{j+1}'s registers."""
        with m.If(adv):
            m.d.sync += vs[j + 1].eq(vs[j])
            m.d.sync += load(vs[j], [*(es[j + 1].pairs(es[j]) if elem else []), *pairs])

    def regs(j, **values):
        """Registers of cycle c_j (named ``<name><j>``) and their (register, value) pairs."""
        out = {k: reg(Value.cast(v).shape(), f"{k}{j}") for k, v in values.items()}
        return out, [(out[k], v) for k, v in values.items()]

    # ---- c0: operands; negation (SIGNEG); the adder ALU's exact sum (ADD, SUB, ADDV, RSUB1; LD passes val)
    a, b = Signal(INT32, name=f"s{s}_a"), Signal(INT32, name=f"s{s}_b")
    m.d.comb += [a.eq(Array(e_in.r)[field(0, "asel")]), b.eq(Array(e_in.r)[field(0, "bsel")])]
    alu = Signal(signed(34), name=f"s{s}_alu")
    with m.Switch(field(0, "op")):
        with m.Case(M.ADD):
            m.d.comb += alu.eq(a + b)
        with m.Case(M.SUB):
            m.d.comb += alu.eq(a - b)
        with m.Case(M.ADDV):
            m.d.comb += alu.eq(a + val)
        with m.Case(M.RSUB1):
            m.d.comb += alu.eq(field(0, "rs_one") - a)
        with m.Default():
            m.d.comb += alu.eq(val)
    r1, p = regs(1, a=a, x=Mux(field(0, "neg"), sat32(-a), a), bm=Mux(field(0, "mul"), b, val), alu=alu)
    advance(0, p)
    a1 = r1["a"]

    # ---- c1: sigmoid input clamp -> LUT address and fraction; sat32 of the ALU sum
    x1 = r1["x"]
    below = field(1, "clamp") & x1[31] & (~x1 & field(1, "hmask")).any()
    above = field(1, "clamp") & ~x1[31] & (x1 & field(1, "hmask")).any()
    u = Signal(INT32, name=f"s{s}_u")
    m.d.comb += u.eq(Mux(below, field(1, "lo"), Mux(above, field(1, "hi"), x1)))
    # the LUT address of u (clamped inputs: the precomputed addresses of the bounds, so that the shifter
    # works on x in parallel with the clamp test)
    idx = Signal(seg, name=f"s{s}_idx")
    m.d.comb += idx.eq(Mux(below, field(1, "idx_lo"),
                           Mux(above, field(1, "idx_hi"), (x1 >> field(1, "step")) + (1 << (seg - 1)))))
    m.d.comb += [rom_port.addr.eq(idx), rom_port.en.eq(adv & vs[1])]
    simple = Signal(INT32, name=f"s{s}_simple")
    m.d.comb += simple.eq(Mux(field(1, "rs_big"), I32_MAX, sat32(r1["alu"])))
    r2, p = regs(2, a=a1, bm=r1["bm"], f=(u & field(1, "mask"))[:32].as_signed(),
                 bigneg=field(1, "big") & u[31], simple=simple)
    advance(1, p)

    # ---- c2: LUT data {t0, d}; operands of product A; the sigmoid base t0 (+ d for the wrapped fraction)
    t0, d = rom_port.data.t0, rom_port.data.d
    sig2 = field(2, "sig")
    r3, p = regs(3, a=r2["a"], ma=Mux(sig2, d, r2["a"]), mb=Mux(sig2, r2["f"], r2["bm"]),
                 tb=t0 + Mux(r2["bigneg"], d, 0), simple=r2["simple"])
    advance(2, p)

    # ---- c3, c4: product A = ma * mb (64 bits): partial products, then their sum
    low, high, mid = mul_parts(r3["ma"].as_signed(), r3["mb"].as_signed())
    r4, p = regs(4, a=r3["a"], tb=r3["tb"], simple=r3["simple"], pl=low, ph=high, pm=mid)
    advance(3, p)
    r5, p = regs(5, a=r4["a"], tb=r4["tb"], simple=r4["simple"], pa=mul_sum(r4["pl"], r4["ph"], r4["pm"]))
    advance(4, p)

    # ---- c5: round half up and shift, (pa + 2**(sh - 1)) >> sh: the shift (pa >> sh) and the rounding bit
    # below it (bit sh - 1; none for sh = 0); |pa| <= 2**62, so the quotient fits 64 bits
    pa = r5["pa"].as_signed()
    t = Signal(signed(64), name=f"s{s}_t")
    m.d.comb += t.eq(pa >> field(5, "shm1"))
    sh0 = field(5, "sh0")
    r6, p = regs(6, a=r5["a"], tb=r5["tb"], simple=r5["simple"],
                 q=Mux(sh0, pa, t[1:].as_signed()).as_signed(), inc=~sh0 & t[0])
    advance(5, p)

    # ---- c6: the rounding increment; sigmoid: tb + correction (mod 2**32, the increment as carry in); else
    # sat32; operands of product B (SiLU's a * sigmoid(a), SSQ's w * w)
    q6, a6 = r6["q"].as_signed(), r6["a"].as_signed()
    y = Signal(INT32, name=f"s{s}_y")
    wnone, silu = field(6, "wnone"), field(6, "silu")
    m.d.comb += y.eq(Mux(field(6, "sig"), add_cin(r6["tb"], q6[:32], r6["inc"])[:32], sat32_inc(q6, r6["inc"])))
    r7, p = regs(7, y=y, w=Mux(wnone, a6, y), bx=Mux(silu | wnone, a6, y), by=Mux(~silu & wnone, a6, y),
                 simple=r6["simple"])
    advance(6, p)

    # ---- c7, c8: product B (partial products, then their sum); |w| for AMAX
    low, high, mid = mul_parts(r7["bx"].as_signed(), r7["by"].as_signed())
    w7 = r7["w"].as_signed()
    r8, p = regs(8, y=r7["y"], simple=r7["simple"], mag=Mux(w7[31], -w7, w7)[:32], pl=low, ph=high, pm=mid)
    advance(7, p)
    r9, p = regs(9, y=r8["y"], simple=r8["simple"], mag=r8["mag"], pb=mul_sum(r8["pl"], r8["ph"], r8["pm"]))
    advance(8, p)

    # ---- c9: result into r[dst] (the reductions' terms go to the caller's accumulators)
    e9, pb = es[9], r9["pb"].as_signed()
    res = Signal(INT32, name=f"s{s}_res")
    wdst = Signal(name=f"s{s}_wdst")
    with m.Switch(field(9, "op")):
        with m.Case(M.LD, M.ADD, M.SUB, M.ADDV, M.RSUB1):
            m.d.comb += [res.eq(r9["simple"]), wdst.eq(1)]
        with m.Case(M.MUL, M.MULV, M.SIG, M.SIGNEG):
            m.d.comb += [res.eq(r9["y"]), wdst.eq(1)]
        with m.Case(M.SILU):
            # (pb + 2**(GATE_FRAC - 1)) >> GATE_FRAC, rounded as in c5
            m.d.comb += [res.eq(sat32_inc(pb[nx.GATE_FRAC:].as_signed(), pb[nx.GATE_FRAC - 1])), wdst.eq(1)]
    eo = es[n]
    advance(9, [(eo.index, e9.index), (eo.last, e9.last), *([(eo.k, e9.k)] if folded else []),
                *((eo.r[j], Mux(wdst & (field(9, "dst") == j), res, e9.r[j])) for j in range(4))], elem=False)

    return SimpleNamespace(eo=eo, vo=vs[n], es=es, vs=vs, a1=a1, pb=pb, mag=r9["mag"], field=field)
