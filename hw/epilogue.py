"""The epilogue: dequantization and the micro-op program, one element per cycle (docs/RTL.md, ``hw/epilogue.py``).

Every output element of a GEMV (or every token word of LOAD_TOKEN) enters with its index; the unit forms
the register file ``r0..r3`` (``hw.isa`` module docstring: ``r0 = acc * S``, ``r1 = acc``, ``r2 = r3 = 0``,
or ``r0 = r1 = x[n]`` for ``raw`` inputs), runs the instruction's :data:`hw.isa.MAX_OPS` micro-ops in a
pipeline of as many stages (stage ``s`` executes ``ops[s]``; NOP beyond ``n_ops``) and leaves with its
buffer writes, reductions, argmax and logit. The arithmetic is that of :mod:`hw.numerics` and of
``GoldenMachine._epilogue`` in :mod:`host.devices.golden`, bit for bit.

Buffer operands are read once, at the entry (one read port per buffer, address = element index), and
travel with the element; ST values travel to the exit, where the write ports are driven. The compiler
guarantees that each buffer is read by at most one micro-op and written by at most one, so this is
equivalent to the golden device's in-order semantics (docs/RTL.md).
"""

import numpy as np
from amaranth.hdl import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory, ReadPort, WritePort
from amaranth.lib.wiring import In, Out

from hw import isa
from hw import numerics as nx
from hw.isa import MAX_OPS, Buffer, MicroOp, MicroOpcode

__all__ = ["Epilogue", "EpilogueConfig", "input_layout", "READ_BUFFERS", "WRITE_BUFFERS",
           "ENTRY_LATENCY", "STAGE_LATENCY"]

M = MicroOpcode
INT32 = signed(32)
_I32_MIN = Const(nx.INT32_MIN, INT32)
_I32_MAX = Const(nx.INT32_MAX, INT32)
_U64_MAX = Const(nx.UINT64_MAX, unsigned(64))

#: Buffers with a read port (``rd_<name>``), in port order.
READ_BUFFERS = (Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_OLD, Buffer.STATE_NEW,
                Buffer.C0, Buffer.C1, Buffer.C2, Buffer.C3)
#: Buffers with a write port (``wr_<name>``), in port order (the ST targets).
WRITE_BUFFERS = (Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_NEW)

ENTRY_LATENCY = 4   #: input register, dequant product (+ buffer data), dequant shift, register-file init
STAGE_LATENCY = 6   #: decode/LUT address, operands, product A, round/shift, product B, result
_ROM_COPIES = (MAX_OPS + 1) // 2   #: sigmoid ROM copies, two read ports each


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


def _elem_layout(index_bits: int, n_rd: int) -> data.StructLayout:
    """An element in flight: register file, the buffer operands of the stages still ahead (``rd[0]`` is
    the next stage's), the ST values per :data:`WRITE_BUFFERS` slot, the OUT and ARGMAX values."""
    return data.StructLayout({
        "index": unsigned(index_bits), "last": unsigned(1),
        "r": data.ArrayLayout(INT32, 4),
        "rd": data.ArrayLayout(INT32, n_rd),
        "wr": data.ArrayLayout(INT32, len(WRITE_BUFFERS)), "wr_en": unsigned(len(WRITE_BUFFERS)),
        "out": INT32, "out_en": unsigned(1),
        "am": INT32, "am_en": unsigned(1),
    })


def _sat32(v):
    """``hw.numerics.sat32`` of a signed expression (to be assigned to a 32-bit signal)."""
    return Mux(v > _I32_MAX, _I32_MAX, Mux(v < _I32_MIN, _I32_MIN, v))


class Epilogue(wiring.Component):
    """Dequantization and the :data:`~hw.isa.MAX_OPS`-stage micro-op pipeline of one instruction.

    Parameters
    ----------
    lut_segments_log2 : int, 6..14
        Sigmoid LUT resolution (the image's ``lut_segments_log2``; :func:`hw.numerics.sigmoid_table`).
    acc_bits : int, 2..32
        Width of the GEMV accumulator (``hw.isa.ACC_BITS``): the dequantization multiplier is
        ``acc_bits x 27`` bits; a non-raw ``value`` must lie in the signed ``acc_bits`` range.
    index_bits : int, 1..32
        Width of element indices and buffer addresses.

    Raises
    ------
    TypeError
        If a parameter is not an int.
    ValueError
        If a parameter is out of range.

    Ports
    -----
    cfg : In(:class:`EpilogueConfig`)
        Stable from ``start`` (inclusive) to ``done``.
    start : In(1)
        One-cycle strobe before (or with) the first element: clears the reduction registers the
        program's SSQ/AMAX micro-ops write (``regs[op.reg] = 0``, as the golden device does at their
        first write) and the argmax search. The pipeline must be idle (after ``done``).
    i : In(stream.Signature(:func:`input_layout`))
        Elements, ``last`` on the instruction's last (``n >= 1`` elements per instruction).
    rd_x, rd_a, rd_p, rd_state_old, rd_state_new, rd_c0..rd_c3 : In(lib.memory.ReadPort.Signature)
        Buffer read ports (``addr`` and ``en`` out, int32 ``data`` in, one cycle after ``addr`` while
        ``en``): ``connect`` them to ``Memory.read_port()`` (the sequencer adds the state banks' layer
        offset). Address = element index, read once per element at the entry.
    wr_x, wr_a, wr_p, wr_state_new : In(lib.memory.WritePort.Signature)
        Buffer write ports (``addr``, ``data``, ``en`` out) of ST, driven at the exit.
    regs : Out(ArrayLayout(unsigned(64), 8))
        Reduction registers R0..R7 (SSQ: ``hw.numerics.ssq_accumulate``, saturating at ``2**64 - 1``;
        AMAX: max of ``|w|``). Registers the program does not write keep their value; the written
        ones are final at ``done``.
    argmax_index : Out(index_bits), argmax_value : Out(signed(32))
        ARGMAX: first index of the largest ``a`` over the instruction (strictly greater replaces).
    logits : Out(stream.Signature(signed(32)))
        OUT values in element order; backpressure stalls the whole pipeline (and ``i``) without loss.
    done : Out(1)
        One-cycle strobe once the ``last`` element has left the exit (writes, logit, argmax) and every
        reduction is folded into ``regs``.

    Notes
    -----
    Structure: entry (input register; ``value * s_mant`` with the buffer reads in flight; the rounding
    shift of :func:`hw.numerics.dequant`; the register file), then one submodule per micro-op stage of
    :data:`STAGE_LATENCY` cycles: (c0) operand and buffer-operand select, the adder ALU (ADD, SUB, ADDV,
    RSUB1, LD), the sigmoid input clamp and LUT address; (c1) LUT data ``{t0, d = t1 - t0}``, operands of
    product A; (c2) product A (``a*b``, ``a*buf`` or ``d*frac``); (c3) round half up and shift
    (``shift`` or the segment step), ``sat32`` or ``t0 + correction``; (c4) product B (SiLU's
    ``a*sigmoid(a)``, SSQ's ``w*w``); (c5) result into ``r[dst]``, SSQ/AMAX into the stage's 64-bit
    accumulator. The accumulators are folded into ``regs`` (one per cycle, as soon as the last element
    has passed each stage), so two micro-ops may reduce into one register.

    Latency :attr:`latency` = ``ENTRY_LATENCY + MAX_OPS * STAGE_LATENCY`` = 52 cycles from an element's
    input transfer to the exit cycle where its writes and logit are presented; throughput one element
    per cycle; a logits stall freezes the whole pipeline (one global enable, which also drives the read
    ports' ``en``). ``done`` follows the last element's exit by one to two cycles.

    Resources: :attr:`multipliers` (17: one ``acc_bits x 27``, two ``32 x 32`` per stage; 68 DSP48E1 in
    Yosys ``synth_xilinx``) and :attr:`lut_rom`: four copies of the sigmoid ROM (``2**lut_segments_log2``
    words of ``{t0, d}``, 53 bits for the default: 3 RAMB18E1 each), two stages sharing a copy's two read
    ports.

    Sigmoid: :func:`hw.numerics.sigmoid` exactly. For inputs with so many fraction bits that the segment
    step reaches 32 bits the interpolation uses the signed input and adds ``d`` for negative inputs
    (``t0 + ((d * (2**step + x) + h) >> step) = t0 + d + ((d * x + h) >> step)``), which keeps product A at
    32 x 32 bits and is exact where the golden device's int64 product is (and beyond, where it wraps).

    Micro-op semantics are those of :class:`hw.isa.MicroOpcode`. Outside what the image checks accept:
    opcodes 16..31 act as NOP, ST to a read-only buffer writes nothing, a buffer operand without a read
    port (``TOKEN``; ``NONE`` for LD/MULV/ADDV) reads 0, and sigmoid inputs with ``shift <
    lut_segments_log2 - 4`` use a segment step of 1. Not supported (the compiler emits neither): more
    than one OUT per program (only the last one's values are streamed; the golden device appends one
    vector per OUT), and one register reduced by both SSQ and AMAX in a program. ``start`` requires the
    pipeline to be idle, and the configuration must be stable from ``start`` to ``done``.
    """

    def __init__(self, *, lut_segments_log2: int = nx.LUT_SEGMENTS_LOG2, acc_bits: int = isa.ACC_BITS,
                 index_bits: int = 16):
        for name, value, lo, hi in (("lut_segments_log2", lut_segments_log2, 6, 14),
                                    ("acc_bits", acc_bits, 2, 32), ("index_bits", index_bits, 1, 32)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if not lo <= value <= hi:
                raise ValueError(f"{name} must be in {lo}..{hi}, got {value}")
        self._seg = lut_segments_log2
        self._acc_bits = acc_bits
        self._index_bits = index_bits
        table = nx.sigmoid_table(lut_segments_log2)
        diff = np.diff(table)
        assert diff.min() >= 0 and table.min() >= 0
        self._rom_layout = data.StructLayout({"t0": unsigned(int(table.max()).bit_length()),
                                              "d": unsigned(max(1, int(diff.max()).bit_length()))})
        self._rom_init = [{"t0": int(t), "d": int(d)} for t, d in zip(table[:-1], diff, strict=True)]
        rd = ReadPort.Signature(addr_width=index_bits, shape=INT32)
        wr = WritePort.Signature(addr_width=index_bits, shape=INT32)
        members = {
            "cfg": In(EpilogueConfig),
            "start": In(1),
            "i": In(stream.Signature(input_layout(index_bits))),
            **{f"rd_{b.name.lower()}": In(rd) for b in READ_BUFFERS},
            **{f"wr_{b.name.lower()}": In(wr) for b in WRITE_BUFFERS},
            "regs": Out(data.ArrayLayout(unsigned(64), 8)),
            "argmax_index": Out(index_bits),
            "argmax_value": Out(INT32),
            "logits": Out(stream.Signature(INT32)),
            "done": Out(1),
        }
        super().__init__(members)

    # ------------------------------------------------------------------------------------ properties
    @property
    def lut_segments_log2(self) -> int:
        return self._seg

    @property
    def acc_bits(self) -> int:
        return self._acc_bits

    @property
    def index_bits(self) -> int:
        return self._index_bits

    @property
    def latency(self) -> int:
        """Cycles from an element's input transfer to its exit (writes and logit presented), unstalled."""
        return ENTRY_LATENCY + MAX_OPS * STAGE_LATENCY

    @property
    def multipliers(self) -> int:
        """Hardware multipliers: one ``acc_bits x 27`` (dequantization) and two ``32 x 32`` signed per
        stage (A: ``a*b``, ``a*buf`` or the LUT interpolation ``d*frac``; B: SiLU's ``x*sigmoid(x)`` or
        SSQ's ``w*w``)."""
        return 1 + 2 * MAX_OPS

    @property
    def lut_rom(self) -> tuple[int, int, int]:
        """The sigmoid ROMs: (copies, depth ``2**lut_segments_log2``, width of ``{t0, d}`` in bits); each copy
        has two synchronous read ports (stages ``2j`` and ``2j + 1``)."""
        return _ROM_COPIES, 1 << self._seg, self._rom_layout.size

    def read_port_name(self, buf: Buffer) -> str:
        """Name of the read port of ``buf`` (``"rd_x"``, ...)."""
        if buf not in READ_BUFFERS:
            raise ValueError(f"buffer {buf!r} has no read port")
        return f"rd_{Buffer(buf).name.lower()}"

    # ----------------------------------------------------------------------------------- elaborate
    def elaborate(self, platform):
        m = Module()
        # the sigmoid LUT: one copy per two stages (a dual-port block RAM; Yosys turns a ROM with more read
        # ports into logic)
        roms = [Memory(shape=self._rom_layout, depth=1 << self._seg, init=self._rom_init)
                for _ in range(_ROM_COPIES)]
        for j, rom in enumerate(roms):
            m.submodules[f"sigmoid_rom{j}"] = rom
        ib = self._index_bits
        cfg = self.cfg
        rd_ports = [getattr(self, f"rd_{b.name.lower()}") for b in READ_BUFFERS]
        wr_ports = [getattr(self, f"wr_{b.name.lower()}") for b in WRITE_BUFFERS]

        adv = Signal()  # the whole pipeline moves (no logits backpressure at the exit)

        # ------------------------------------------------------ decoded configuration (registered)
        stage_mods = [Module() for _ in range(MAX_OPS)]
        for s, sm in enumerate(stage_mods):
            m.submodules[f"stage{s}"] = sm
        dcs = [self._decode(sm, s) for s, sm in enumerate(stage_mods)]
        dq_zero, dq_neg = Signal(), Signal()
        dq_lsh, dq_rsh = Signal(range(33)), Signal(range(63))
        dq_rnd = Signal(unsigned(62))
        sh = cfg.s_shift
        m.d.sync += [dq_zero.eq(sh > 62), dq_neg.eq(sh < 0),
                     dq_lsh.eq(Mux(-sh > 32, 32, -sh)), dq_rsh.eq(Mux((sh > 0) & (sh <= 62), sh, 0))]
        m.d.comb += dq_rnd.eq((Const(1, 1) << dq_rsh) >> 1)

        # ------------------------------------------------------------------------------- entry
        in_lay = input_layout(ib)
        e0, v0 = Signal(in_lay, reset_less=True), Signal()
        m.d.comb += self.i.ready.eq(adv)
        with m.If(adv):
            m.d.sync += [e0.eq(self.i.payload), v0.eq(self.i.valid)]
        for p in rd_ports:
            m.d.comb += [p.addr.eq(e0.index), p.en.eq(adv)]

        # E1: dequantization product; buffer data arrives
        e1, v1 = Signal(in_lay, reset_less=True), Signal()
        p1 = Signal(signed(self._acc_bits + 28), reset_less=True)
        with m.If(adv):
            m.d.sync += [e1.eq(e0), v1.eq(v0), p1.eq(e0.value[:self._acc_bits].as_signed() * cfg.s_mant)]

        # E2: dequantization shift; each stage's buffer operand selected from the read ports
        e2, v2 = Signal(in_lay, reset_less=True), Signal()
        q2 = Signal(signed(64), reset_less=True)
        rd2 = Signal(data.ArrayLayout(INT32, MAX_OPS), reset_less=True)
        q_next = Signal(signed(64))
        with m.If(dq_zero):
            m.d.comb += q_next.eq(0)
        with m.Elif(dq_neg):
            p1s = Signal(INT32)
            m.d.comb += [p1s.eq(_sat32(p1)), q_next.eq(p1s << dq_lsh)]
        with m.Else():
            m.d.comb += q_next.eq((p1 + dq_rnd) >> dq_rsh)
        with m.If(adv):
            m.d.sync += [e2.eq(e1), v2.eq(v1), q2.eq(q_next)]
            for s in range(MAX_OPS):
                with m.Switch(cfg.ops[s].buf):
                    for j, b in enumerate(READ_BUFFERS):
                        with m.Case(b):
                            m.d.sync += rd2[s].eq(rd_ports[j].data)
                    with m.Default():
                        m.d.sync += rd2[s].eq(0)

        # stage 0 input: the register file
        e_in, v_in = Signal(_elem_layout(ib, MAX_OPS), reset_less=True), Signal()
        r0 = Signal(INT32)
        m.d.comb += r0.eq(Mux(cfg.raw, e2.value, _sat32(q2)))
        with m.If(adv):
            m.d.sync += [v_in.eq(v2), e_in.index.eq(e2.index), e_in.last.eq(e2.last),
                         e_in.r[0].eq(r0), e_in.r[1].eq(e2.value), e_in.r[2].eq(0), e_in.r[3].eq(0),
                         e_in.rd.eq(rd2), e_in.wr_en.eq(0), e_in.out_en.eq(0), e_in.am_en.eq(0)]

        # -------------------------------------------------------------------------------- stages
        accs, fins = [], []
        for s in range(MAX_OPS):
            e_in, v_in, acc, fin = self._stage(stage_mods[s], s, dcs[s], e_in, v_in, roms[s // 2].read_port(), adv)
            accs.append(acc)
            fins.append(fin)
        ex, vx = e_in, v_in  # the exit register
        self._stage_accs = accs  # white-box access for the saturation test (tests/hw/test_epilogue.py)

        # ---------------------------------------------------------------------------------- exit
        stall = vx & ex.out_en & ~self.logits.ready
        fire = Signal()
        m.d.comb += [adv.eq(~stall), fire.eq(vx & adv),
                     self.logits.valid.eq(vx & ex.out_en), self.logits.payload.eq(ex.out)]
        for k, p in enumerate(wr_ports):
            m.d.comb += [p.addr.eq(ex.index), p.data.eq(ex.wr[k]), p.en.eq(fire & ex.wr_en[k])]

        am_seen = Signal()
        with m.If(fire & ex.am_en):
            m.d.sync += am_seen.eq(1)
            with m.If(~am_seen | (ex.am > self.argmax_value)):
                m.d.sync += [self.argmax_index.eq(ex.index), self.argmax_value.eq(ex.am)]

        # --------------------------------------------------- reductions: fold the stage accumulators
        busy, last_out = Signal(), Signal()
        k = Signal(range(MAX_OPS + 1))
        fin_k = Array(fins)[k]
        acc_k = Array(accs)[k]
        ssq_k = Array([dc["ssq"] for dc in dcs])[k]
        amax_k = Array([dc["amax"] for dc in dcs])[k]
        reg_k = Array([cfg.ops[s].reg for s in range(MAX_OPS)])[k]
        cur = Signal(unsigned(64))
        total = Signal(unsigned(65))
        m.d.comb += [cur.eq(self.regs[reg_k]), total.eq(cur + acc_k)]
        with m.If(fire & ex.last):
            m.d.sync += last_out.eq(1)
        with m.If(busy & (k < MAX_OPS) & fin_k):
            m.d.sync += k.eq(k + 1)
            with m.If(ssq_k):
                m.d.sync += self.regs[reg_k].eq(Mux(total[64], _U64_MAX, total[:64]))
            with m.Elif(amax_k):
                m.d.sync += self.regs[reg_k].eq(Mux(acc_k > cur, acc_k, cur))
        m.d.comb += self.done.eq(busy & (k == MAX_OPS) & last_out)
        with m.If(self.done):
            m.d.sync += busy.eq(0)

        with m.If(self.start):
            m.d.sync += [busy.eq(1), last_out.eq(0), k.eq(0), am_seen.eq(0)]
            for s in range(MAX_OPS):
                op = cfg.ops[s]
                with m.If((s < cfg.n_ops) & ((op.op == M.SSQ) | (op.op == M.AMAX))):
                    m.d.sync += self.regs[op.reg].eq(0)
        return m

    # ------------------------------------------------------------------------------------ helpers
    def _decode(self, m: Module, s: int) -> dict:
        """Registered per-stage decode of ``cfg.ops[s]`` (the configuration is stable, so a cycle of
        lag costs nothing and keeps the shifters' controls off the datapath)."""
        mo = self.cfg.ops[s]
        op = Signal(MicroOpcode, name=f"s{s}_op")
        m.d.sync += op.eq(Mux(s < self.cfg.n_ops, mo.op, M.NOP))
        dc = {"op": op}
        for name, cond in (("sig", (op == M.SIG) | (op == M.SIGNEG) | (op == M.SILU)),
                           ("neg", op == M.SIGNEG), ("silu", op == M.SILU), ("mul", op == M.MUL),
                           ("ssq", op == M.SSQ), ("amax", op == M.AMAX), ("st", op == M.ST),
                           ("argmax", op == M.ARGMAX), ("out", op == M.OUT),
                           ("wnone", mo.buf == Buffer.NONE)):
            sig = Signal(name=f"s{s}_{name}")
            m.d.comb += sig.eq(cond)
            dc[name] = sig
        shift = mo.shift
        # sigmoid: clamp to [-2**(4+shift), 2**(4+shift)) when that is inside int32
        lim = Signal(range(64 + 5), name=f"s{s}_lim")
        clamp = Signal(name=f"s{s}_clamp")
        lo = Signal(INT32, name=f"s{s}_lo")
        hi = Signal(INT32, name=f"s{s}_hi")
        m.d.comb += lim.eq(shift + nx.LUT_RANGE_LOG2)
        m.d.sync += [clamp.eq(lim <= 30), lo.eq(-(Const(1, 32) << lim[:5])), hi.eq((Const(1, 32) << lim[:5]) - 1)]
        # segment step = shift + 5 - lut_segments_log2, kept in 1..62
        step_raw = Signal(signed(8), name=f"s{s}_step_raw")
        step = Signal(range(63), name=f"s{s}_step")
        m.d.comb += step_raw.eq(shift + (nx.LUT_RANGE_LOG2 + 1 - self._seg))
        m.d.sync += step.eq(Mux(step_raw < 1, 1, step_raw))
        mask = Signal(32, name=f"s{s}_mask")
        big = Signal(name=f"s{s}_big")
        m.d.comb += [big.eq(step >= 32), mask.eq(Mux(big, 0xFFFF_FFFF, (Const(1, 33) << step[:5]) - 1))]
        # product A's rounding shift: the segment step (sigmoid) or the shift field (MUL, MULV, SSQ, AMAX)
        sh = Signal(range(64), name=f"s{s}_sh")
        rnd = Signal(unsigned(63), name=f"s{s}_rnd")
        m.d.sync += sh.eq(Mux(dc["sig"], step, shift))
        m.d.comb += rnd.eq((Const(1, 1) << sh) >> 1)
        # RSUB1: 2**shift - a; 2**shift >= 2**32 always saturates
        rs_big = Signal(name=f"s{s}_rs_big")
        rs_one = Signal(unsigned(32), name=f"s{s}_rs_one")
        m.d.sync += [rs_big.eq(shift >= 32), rs_one.eq(Const(1, 32) << shift[:5])]
        dc.update(clamp=clamp, lo=lo, hi=hi, step=step, mask=mask, big=big, sh=sh, rnd=rnd,
                  rs_big=rs_big, rs_one=rs_one)
        return dc

    def _stage(self, m: Module, s: int, dc: dict, e_in, v_in, rom_port, adv):
        """Stage ``s``: executes ``cfg.ops[s]`` in :data:`STAGE_LATENCY` cycles.

        Returns the output element register (the next stage's input), its valid bit, the stage's
        reduction accumulator (unsigned 64) and its ``fin`` flag (the last element has passed).
        """
        ib = self._index_bits
        lay = _elem_layout(ib, MAX_OPS - 1 - s)
        mo = self.cfg.ops[s]
        op = dc["op"]

        def reg(shape, name):
            return Signal(shape, name=f"s{s}_{name}", reset_less=True)

        def stage_regs(n):
            return ([reg(lay, f"e{j}") for j in range(1, n + 1)],
                    [Signal(name=f"s{s}_v{j}") for j in range(1, n + 1)])

        (e1, e2, e3, e4, e5, eo), (v1, v2, v3, v4, v5, vo) = stage_regs(6)

        # ---- c0: operands, simple ALU, sigmoid input -> LUT address; ST/OUT/ARGMAX capture a
        a, b, val = Signal(INT32, name=f"s{s}_a"), Signal(INT32, name=f"s{s}_b"), Signal(INT32, name=f"s{s}_val")
        m.d.comb += [a.eq(e_in.r[mo.a]), b.eq(e_in.r[mo.b]), val.eq(e_in.rd[0])]
        x, u = Signal(INT32, name=f"s{s}_x"), Signal(INT32, name=f"s{s}_u")
        m.d.comb += x.eq(Mux(dc["neg"], _sat32(-a), a))
        m.d.comb += u.eq(Mux(dc["clamp"] & (x < dc["lo"]), dc["lo"], Mux(dc["clamp"] & (x > dc["hi"]), dc["hi"], x)))
        idx = Signal(self._seg, name=f"s{s}_idx")
        m.d.comb += idx.eq((u >> dc["step"]) + (1 << (self._seg - 1)))
        m.d.comb += [rom_port.addr.eq(idx), rom_port.en.eq(adv)]
        frac = Signal(INT32, name=f"s{s}_frac")
        m.d.comb += frac.eq(u & dc["mask"])
        simple = Signal(INT32, name=f"s{s}_simple")
        with m.Switch(op):
            with m.Case(M.LD):
                m.d.comb += simple.eq(val)
            with m.Case(M.ADD):
                m.d.comb += simple.eq(_sat32(a + b))
            with m.Case(M.SUB):
                m.d.comb += simple.eq(_sat32(a - b))
            with m.Case(M.ADDV):
                m.d.comb += simple.eq(_sat32(a + val))
            with m.Case(M.RSUB1):
                m.d.comb += simple.eq(Mux(dc["rs_big"], _I32_MAX, _sat32(dc["rs_one"] - a)))
        ec = Signal(lay, name=f"s{s}_ec")
        m.d.comb += [ec.index.eq(e_in.index), ec.last.eq(e_in.last), ec.r.eq(e_in.r),
                     ec.wr.eq(e_in.wr), ec.wr_en.eq(e_in.wr_en), ec.out.eq(e_in.out), ec.out_en.eq(e_in.out_en),
                     ec.am.eq(e_in.am), ec.am_en.eq(e_in.am_en)]
        for j in range(MAX_OPS - 1 - s):
            m.d.comb += ec.rd[j].eq(e_in.rd[j + 1])
        with m.If(dc["st"]):
            for slot, buf in enumerate(WRITE_BUFFERS):
                with m.If(mo.buf == buf):
                    m.d.comb += [ec.wr[slot].eq(a), ec.wr_en[slot].eq(1)]
        with m.If(dc["out"]):
            m.d.comb += [ec.out.eq(a), ec.out_en.eq(1)]
        with m.If(dc["argmax"]):
            m.d.comb += [ec.am.eq(a), ec.am_en.eq(1)]

        a1, bm1, f1, simple1 = reg(INT32, "a1"), reg(INT32, "bm1"), reg(INT32, "f1"), reg(INT32, "simple1")
        bigneg1 = reg(1, "bigneg1")
        with m.If(adv):
            m.d.sync += [e1.eq(ec), v1.eq(v_in), a1.eq(a), bm1.eq(Mux(dc["mul"], b, val)), f1.eq(frac),
                         bigneg1.eq(dc["big"] & u[31]), simple1.eq(simple)]

        # ---- c1: LUT data; operands of product A
        t0, d = rom_port.data.t0, rom_port.data.d
        ma, mb = reg(INT32, "ma"), reg(INT32, "mb")
        t02, d2 = reg(unsigned(len(t0)), "t02"), reg(unsigned(len(d)), "d2")
        a2, simple2, bigneg2 = reg(INT32, "a2"), reg(INT32, "simple2"), reg(1, "bigneg2")
        with m.If(adv):
            m.d.sync += [e2.eq(e1), v2.eq(v1), ma.eq(Mux(dc["sig"], d, a1)), mb.eq(Mux(dc["sig"], f1, bm1)),
                         t02.eq(t0), d2.eq(d), a2.eq(a1), simple2.eq(simple1), bigneg2.eq(bigneg1)]

        # ---- c2: product A (64 bits)
        pa = reg(signed(64), "pa")
        t03, d3 = reg(unsigned(len(t0)), "t03"), reg(unsigned(len(d)), "d3")
        a3, simple3, bigneg3 = reg(INT32, "a3"), reg(INT32, "simple3"), reg(1, "bigneg3")
        with m.If(adv):
            m.d.sync += [e3.eq(e2), v3.eq(v2), pa.eq(ma * mb), t03.eq(t02), d3.eq(d2), a3.eq(a2),
                         simple3.eq(simple2), bigneg3.eq(bigneg2)]

        # ---- c3: round half up and shift; sigmoid: t0 (+ d for the wrapped fraction) + correction; else sat32
        q = Signal(signed(66), name=f"s{s}_q")
        m.d.comb += q.eq((pa + dc["rnd"]) >> dc["sh"])
        y4, a4, simple4 = reg(INT32, "y4"), reg(INT32, "a4"), reg(INT32, "simple4")
        y = Signal(INT32, name=f"s{s}_y")
        m.d.comb += y.eq(Mux(dc["sig"], t03 + Mux(bigneg3, d3, 0) + q, _sat32(q)))
        with m.If(adv):
            m.d.sync += [e4.eq(e3), v4.eq(v3), y4.eq(y), a4.eq(a3), simple4.eq(simple3)]

        # ---- c4: product B: SiLU's a * sigmoid(a), SSQ's w * w
        w = Signal(INT32, name=f"s{s}_w")
        m.d.comb += w.eq(Mux(dc["wnone"], a4, y4))
        pb, w5, y5, simple5 = reg(signed(64), "pb"), reg(INT32, "w5"), reg(INT32, "y5"), reg(INT32, "simple5")
        with m.If(adv):
            m.d.sync += [e5.eq(e4), v5.eq(v4), pb.eq(Mux(dc["silu"], a4, w) * Mux(dc["silu"], y4, w)),
                         w5.eq(w), y5.eq(y4), simple5.eq(simple4)]

        # ---- c5: result into r[dst]; reductions into the stage accumulator
        res = Signal(INT32, name=f"s{s}_res")
        wdst = Signal(name=f"s{s}_wdst")
        with m.Switch(op):
            with m.Case(M.LD, M.ADD, M.SUB, M.ADDV, M.RSUB1):
                m.d.comb += [res.eq(simple5), wdst.eq(1)]
            with m.Case(M.MUL, M.MULV, M.SIG, M.SIGNEG):
                m.d.comb += [res.eq(y5), wdst.eq(1)]
            with m.Case(M.SILU):
                m.d.comb += [res.eq(_sat32((pb + (1 << (nx.GATE_FRAC - 1))) >> nx.GATE_FRAC)), wdst.eq(1)]
        with m.If(adv):
            m.d.sync += [eo.eq(e5), vo.eq(v5)]
            with m.If(wdst):
                m.d.sync += eo.r[mo.dst].eq(res)

        acc = Signal(unsigned(64), name=f"s{s}_acc")
        fin = Signal(name=f"s{s}_fin")
        term = Signal(unsigned(65), name=f"s{s}_term")
        mag = Signal(unsigned(32), name=f"s{s}_mag")
        m.d.comb += [term.eq(acc + pb[nx.SSQ_SHIFT:63]), mag.eq(Mux(w5 < 0, -w5, w5))]
        with m.If(adv & v5):
            with m.If(dc["ssq"]):
                m.d.sync += acc.eq(Mux(term[64], _U64_MAX, term[:64]))
            with m.Elif(dc["amax"]):
                m.d.sync += acc.eq(Mux(mag > acc, mag, acc))
            with m.If(e5.last):
                m.d.sync += fin.eq(1)
        with m.If(self.start):
            m.d.sync += [acc.eq(0), fin.eq(0)]
        return eo, vo, acc, fin
