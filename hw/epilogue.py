"""The epilogue: dequantization and the micro-op program, one element per cycle (docs/RTL.md, ``hw/epilogue.py``).

Every output element of a GEMV (or every token word of LOAD_TOKEN) enters with its index; the unit forms
the register file ``r0..r3`` (``hw.isa`` module docstring: ``r0 = acc * S``, ``r1 = acc``, ``r2 = r3 = 0``,
or ``r0 = r1 = x[n]`` for ``raw`` inputs), runs the instruction's :data:`hw.isa.MAX_OPS` micro-ops in a
pipeline of as many stages (stage ``s`` executes ``ops[s]``; NOP beyond ``n_ops``) and leaves with its
buffer writes, reductions, argmax and logit. The arithmetic is that of :mod:`hw.numerics` and of
``GoldenMachine._epilogue`` in :mod:`host.devices.golden`, bit for bit.

Buffer operands are read once, at the entry (one read port per buffer, address = element index); ST values
are written at the exit. The compiler guarantees that each buffer is read by at most one micro-op and
written by at most one, so this is equivalent to the golden device's in-order semantics (docs/RTL.md).

Only the register file, the index and the ``last`` flag move through the stages' pipeline registers. The
pipeline advances in lockstep (one global enable), so a value needed a fixed number of advances later goes
through a small delay memory instead (written at every advance at a shared pointer, read at a fixed
offset behind it): each stage's buffer operand from the entry to the stage, and the ST, OUT and ARGMAX
values from the stage that produces them (a property of the program) to the exit. Data registers load only
when the element moving in is valid (a clock enable): bubbles, most cycles of a GEMV-bound instruction,
leave them alone. No intermediate is wider than 64 bits.
"""

import numpy as np
from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
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
#: words of each delay memory (a power of two above the longest delay, exit - stage 0 = 47 advances)
_DELAY_DEPTH = 64


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


class _Elem:
    """An element in flight between two stages: the register file ``r0..r3`` and its ``index``/``last``, as
    separate signals (no wide record: every field is a word of its own in simulation, and an operand select
    is a 4-way multiplexer, not a shift of a wide vector)."""

    def __init__(self, name: str, index_bits: int):
        self.r = [Signal(INT32, name=f"{name}_r{k}", reset_less=True) for k in range(4)]
        self.index = Signal(index_bits, name=f"{name}_index", reset_less=True)
        self.last = Signal(name=f"{name}_last", reset_less=True)

    def pairs(self, other: "_Elem") -> list:
        """(destination, source) pairs of a copy from ``other``, for :func:`_load`."""
        return [*zip(self.r, other.r, strict=True), (self.index, other.index), (self.last, other.last)]


def _load(en, pairs) -> list:
    """Registers loaded while ``en`` (the valid bit of the element that would move in) and held otherwise:
    the statements ``dst.eq(Mux(en, src, dst))`` (a clock enable; written as a multiplexer rather than
    ``with m.If(en)`` so that Verilator keeps one conditional block per enable instead of a next-state
    variable per register). Bubbles leave the data registers alone, which saves their evaluation in
    simulation and their toggling in hardware."""
    return [dst.eq(Mux(en, src, dst)) for dst, src in pairs]


def _delay_line(m: Module, name: str, wp, adv, offset, data_in, shape=INT32):
    """A delay of ``offset`` advances (a value constant from the configuration, 1..:data:`_DELAY_DEPTH` - 1)
    through a small memory instead of a chain of registers: ``data_in`` is written at every advance (``adv``)
    at the shared write pointer ``wp``; the returned register is loaded, also at every advance, with the word
    written ``offset`` advances earlier, so it holds the value that ``data_in`` had when the element now
    ``offset`` registers further down the lockstep pipeline was where ``data_in`` was sampled."""
    mem = Memory(shape=shape, depth=_DELAY_DEPTH, init=[])
    m.submodules[name] = mem
    w, r = mem.write_port(), mem.read_port()
    m.d.comb += [w.addr.eq(wp), w.data.eq(data_in), w.en.eq(adv),
                 r.addr.eq(wp - offset), r.en.eq(adv)]
    return r.data


def _add_u64(x, y):
    """``(x + y) mod 2**64`` and its carry for unsigned ``x`` (64 bits) and ``y`` (at most 64 bits), in two
    32-bit halves so that no intermediate is wider than 64 bits (one adder in hardware either way)."""
    lo_expr = x[:32] + y[:32]
    hi_expr = x[32:64] + y[32:64] + lo_expr[32]
    return Cat(lo_expr[:32], hi_expr[:32]), hi_expr[32]


def _round_shift(v, sh0, shm1):
    """``(v + ((1 << sh) >> 1)) >> sh`` (round half up, arithmetic shift) for a signed 64-bit ``v`` with
    ``|v| <= 2**62``, without the 65-bit sum: ``t = v >> (sh - 1)`` then ``(t >> 1) + t[0]`` (``sh0``:
    ``sh == 0``; ``shm1``: ``sh - 1``, or 0). Exact, and never wider than 64 bits."""
    t = v >> shm1
    return Mux(sh0, v, t[1:].as_signed() + t[0])


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
    has passed each stage), so two micro-ops may reduce into one register. Delay memories (64 words of 32
    bits): one per stage 1..7 for its buffer operand, one per write port, one for OUT and one for ARGMAX.

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
        # the delay memories' write pointer: one step per advance of the lockstep pipeline
        wp = Signal(range(_DELAY_DEPTH))
        with m.If(adv):
            m.d.sync += wp.eq(wp + 1)

        # ------------------------------------------------------ decoded configuration (registered)
        stage_mods = [Module() for _ in range(MAX_OPS)]
        for s, sm in enumerate(stage_mods):
            m.submodules[f"stage{s}"] = sm
        dcs = [self._decode(sm, s) for s, sm in enumerate(stage_mods)]
        dq_zero, dq_neg = Signal(reset_less=True), Signal(reset_less=True)
        dq_lsh, dq_rsh = Signal(range(33), reset_less=True), Signal(range(63), reset_less=True)
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
            m.d.sync += v0.eq(self.i.valid)
            m.d.sync += _load(self.i.valid, [(e0, self.i.payload)])
        for p in rd_ports:
            m.d.comb += [p.addr.eq(e0.index), p.en.eq(adv)]

        # E1: dequantization product; buffer data arrives
        e1, v1 = Signal(in_lay, reset_less=True), Signal()
        p1 = Signal(signed(self._acc_bits + 28), reset_less=True)
        with m.If(adv):
            m.d.sync += v1.eq(v0)
            m.d.sync += _load(v0, [(e1, e0), (p1, e0.value[:self._acc_bits].as_signed() * cfg.s_mant)])

        # E2: dequantization shift; each stage's buffer operand selected from the read ports: stage 0's into a
        # register, the others' into their delay memories (read as the element enters the stage)
        e2, v2 = Signal(in_lay, reset_less=True), Signal()
        q2 = Signal(signed(64), reset_less=True)
        q_next = Signal(signed(64))
        with m.If(dq_zero):
            m.d.comb += q_next.eq(0)
        with m.Elif(dq_neg):
            p1s = Signal(INT32)
            # dq_lsh <= 32: no 95-bit shifter
            m.d.comb += [p1s.eq(_sat32(p1)),
                         q_next.eq(Mux(dq_lsh[5], Cat(Const(0, 32), p1s).as_signed(), p1s << dq_lsh[:5]))]
        with m.Else():
            m.d.comb += q_next.eq((p1 + dq_rnd) >> dq_rsh)
        rd_sel = [Signal(INT32, name=f"rd_sel{s}") for s in range(MAX_OPS)]
        for s in range(MAX_OPS):
            with m.Switch(cfg.ops[s].buf):
                for j, b in enumerate(READ_BUFFERS):
                    with m.Case(b):
                        m.d.comb += rd_sel[s].eq(rd_ports[j].data)
        rd2 = Signal(INT32, reset_less=True)
        with m.If(adv):
            m.d.sync += v2.eq(v1)
            m.d.sync += _load(v1, [(e2, e1), (q2, q_next), (rd2, rd_sel[0])])

        # stage 0 input: the register file
        e_in, v_in = _Elem("e_in", ib), Signal()
        val0 = Signal(INT32, reset_less=True)
        r0 = Signal(INT32)
        m.d.comb += r0.eq(Mux(cfg.raw, e2.value, _sat32(q2)))
        with m.If(adv):
            m.d.sync += v_in.eq(v2)
            m.d.sync += _load(v2, [(e_in.index, e2.index), (e_in.last, e2.last), (e_in.r[0], r0),
                                   (e_in.r[1], e2.value), (e_in.r[2], 0), (e_in.r[3], 0), (val0, rd2)])
        # stage s's operand, selected at E2, arrives STAGE_LATENCY * s advances after stage 0's
        vals = [val0] + [_delay_line(m, f"rd_delay{s}", wp, adv, 1 + STAGE_LATENCY * s, rd_sel[s])
                         for s in range(1, MAX_OPS)]

        # -------------------------------------------------------------------------------- stages
        accs, fins, avals = [], [], []
        for s in range(MAX_OPS):
            e_in, v_in, a, acc, fin = self._stage(stage_mods[s], s, dcs[s], e_in, v_in, vals[s],
                                                  roms[s // 2].read_port(), adv)
            avals.append(a)
            accs.append(acc)
            fins.append(fin)
        ex, vx = e_in, v_in  # the exit register
        self._stage_accs = accs  # white-box access for the saturation test (tests/hw/test_epilogue.py)

        # ------------------------------------------ ST, OUT and ARGMAX values: delay memories to the exit
        def sink(name, conds):
            """The value of operand ``a`` of the last stage whose ``conds`` holds, delayed from that stage's
            second cycle (its register ``a1``) to the exit; and whether any stage's holds (a property of the
            program)."""
            sel_c, en_c = Signal(range(MAX_OPS), name=f"{name}_stage_c"), Signal(name=f"{name}_en_c")
            for s, c in enumerate(conds):
                with m.If(c):
                    m.d.comb += [sel_c.eq(s), en_c.eq(1)]
            sel = Signal(range(MAX_OPS), name=f"{name}_stage", reset_less=True)
            en = Signal(name=f"{name}_en", reset_less=True)
            offset = Signal(range(_DELAY_DEPTH), name=f"{name}_delay", reset_less=True)
            # the delay from stage s's a1 to the exit (a table: no multiplier)
            delays = Array([Const(MAX_OPS * STAGE_LATENCY - 2 - s * STAGE_LATENCY, range(_DELAY_DEPTH))
                            for s in range(MAX_OPS)])
            m.d.sync += [sel.eq(sel_c), en.eq(en_c), offset.eq(delays[sel_c])]
            src = Signal(INT32, name=f"{name}_src")
            m.d.comb += src.eq(Array(avals)[sel])
            return _delay_line(m, f"{name}_delay", wp, adv, offset, src), en

        wr = [sink(f"wr_{buf.name.lower()}", [dc["st"] & (cfg.ops[s].buf == buf) for s, dc in enumerate(dcs)])
              for buf in WRITE_BUFFERS]
        out, out_en = sink("out", [dc["out"] for dc in dcs])
        am, am_en = sink("am", [dc["argmax"] for dc in dcs])

        # ---------------------------------------------------------------------------------- exit
        stall = vx & out_en & ~self.logits.ready
        fire = Signal()
        m.d.comb += [adv.eq(~stall), fire.eq(vx & adv),
                     self.logits.valid.eq(vx & out_en), self.logits.payload.eq(out)]
        for (data_k, en_k), p in zip(wr, wr_ports, strict=True):
            m.d.comb += [p.addr.eq(ex.index), p.data.eq(data_k), p.en.eq(fire & en_k)]

        am_seen = Signal()
        with m.If(fire & am_en):
            m.d.sync += am_seen.eq(1)
            with m.If(~am_seen | (am > self.argmax_value)):
                m.d.sync += [self.argmax_index.eq(ex.index), self.argmax_value.eq(am)]

        # --------------------------------------------------- reductions: fold the stage accumulators
        busy, last_out = Signal(), Signal()
        k = Signal(range(MAX_OPS + 1))
        fin_k = Array(fins)[k]
        acc_k = Array(accs)[k]
        ssq_k = Array([dc["ssq"] for dc in dcs])[k]
        amax_k = Array([dc["amax"] for dc in dcs])[k]
        reg_k = Array([cfg.ops[s].reg for s in range(MAX_OPS)])[k]
        rg = [Signal(unsigned(64), name=f"reg{j}") for j in range(8)]   # R0..R7 (a word each, not one vector)
        m.d.comb += [self.regs[j].eq(rg[j]) for j in range(8)]
        cur = Signal(unsigned(64))
        m.d.comb += cur.eq(Array(rg)[reg_k])
        total, carry = _add_u64(cur, acc_k)
        with m.If(fire & ex.last):
            m.d.sync += last_out.eq(1)
        with m.If(busy & (k < MAX_OPS) & fin_k):
            m.d.sync += k.eq(k + 1)
            for j in range(8):
                with m.If(reg_k == j):
                    with m.If(ssq_k):
                        m.d.sync += rg[j].eq(Mux(carry, _U64_MAX, total))
                    with m.Elif(amax_k):
                        m.d.sync += rg[j].eq(Mux(acc_k > cur, acc_k, cur))
        m.d.comb += self.done.eq(busy & (k == MAX_OPS) & last_out)
        with m.If(self.done):
            m.d.sync += busy.eq(0)

        with m.If(self.start):
            m.d.sync += [busy.eq(1), last_out.eq(0), k.eq(0), am_seen.eq(0)]
            for j in range(8):
                clear = [(s < cfg.n_ops) & ((op.op == M.SSQ) | (op.op == M.AMAX)) & (op.reg == j)
                         for s, op in ((s, cfg.ops[s]) for s in range(MAX_OPS))]
                with m.If(Cat(*clear).any()):
                    m.d.sync += rg[j].eq(0)
        return m

    # ------------------------------------------------------------------------------------ helpers
    def _decode(self, m: Module, s: int) -> dict:
        """Registered per-stage decode of ``cfg.ops[s]`` (the configuration is stable, so a cycle of
        lag costs nothing and keeps the shifters' controls off the datapath)."""
        mo = self.cfg.ops[s]
        op = Signal(MicroOpcode, name=f"s{s}_op", reset_less=True)
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
        clamp = Signal(name=f"s{s}_clamp", reset_less=True)
        lo = Signal(INT32, name=f"s{s}_lo", reset_less=True)
        hi = Signal(INT32, name=f"s{s}_hi", reset_less=True)
        m.d.comb += lim.eq(shift + nx.LUT_RANGE_LOG2)
        m.d.sync += [clamp.eq(lim <= 30), lo.eq(-(Const(1, 32) << lim[:5])), hi.eq((Const(1, 32) << lim[:5]) - 1)]
        # segment step = shift + 5 - lut_segments_log2, kept in 1..62
        step_raw = Signal(signed(8), name=f"s{s}_step_raw")
        step = Signal(range(63), name=f"s{s}_step", reset_less=True)
        m.d.comb += step_raw.eq(shift + (nx.LUT_RANGE_LOG2 + 1 - self._seg))
        m.d.sync += step.eq(Mux(step_raw < 1, 1, step_raw))
        mask = Signal(32, name=f"s{s}_mask")
        big = Signal(name=f"s{s}_big")
        m.d.comb += [big.eq(step >= 32), mask.eq(Mux(big, 0xFFFF_FFFF, (Const(1, 33) << step[:5]) - 1))]
        # product A's rounding shift: the segment step (sigmoid) or the shift field (MUL, MULV, SSQ, AMAX); as
        # "is zero" and "minus one" for _round_shift
        sh = Signal(range(64), name=f"s{s}_sh_c")
        sh0 = Signal(name=f"s{s}_sh0", reset_less=True)
        shm1 = Signal(range(63), name=f"s{s}_shm1", reset_less=True)
        m.d.comb += sh.eq(Mux(dc["sig"], step, shift))
        m.d.sync += [sh0.eq(sh == 0), shm1.eq(Mux(sh == 0, 0, sh - 1))]
        # RSUB1: 2**shift - a; 2**shift >= 2**32 always saturates
        rs_big = Signal(name=f"s{s}_rs_big", reset_less=True)
        rs_one = Signal(unsigned(32), name=f"s{s}_rs_one", reset_less=True)
        m.d.sync += [rs_big.eq(shift >= 32), rs_one.eq(Const(1, 32) << shift[:5])]
        dc.update(clamp=clamp, lo=lo, hi=hi, step=step, mask=mask, big=big, sh0=sh0, shm1=shm1,
                  rs_big=rs_big, rs_one=rs_one)
        return dc

    def _stage(self, m: Module, s: int, dc: dict, e_in: _Elem, v_in, val, rom_port, adv):
        """Stage ``s``: executes ``cfg.ops[s]`` in :data:`STAGE_LATENCY` cycles; ``val`` is its buffer operand
        (a register holding it while the element is at ``e_in``).

        Returns the output element (the next stage's input), its valid bit, the register ``a1`` (operand ``a``,
        the value of ST, OUT and ARGMAX, one advance after the element was at ``e_in``), the stage's reduction
        accumulator (unsigned 64) and its ``fin`` flag (the last element has passed).
        """
        ib = self._index_bits
        mo = self.cfg.ops[s]
        op = dc["op"]

        def reg(shape, name):
            return Signal(shape, name=f"s{s}_{name}", reset_less=True)

        e1, e2, e3, e4, e5, eo = (_Elem(f"s{s}_e{j}", ib) for j in range(1, 7))
        v1, v2, v3, v4, v5, vo = (Signal(name=f"s{s}_v{j}") for j in range(1, 7))

        # ---- c0: operands, simple ALU, sigmoid input -> LUT address
        a, b = Signal(INT32, name=f"s{s}_a"), Signal(INT32, name=f"s{s}_b")
        m.d.comb += [a.eq(Array(e_in.r)[mo.a]), b.eq(Array(e_in.r)[mo.b])]
        x, u = Signal(INT32, name=f"s{s}_x"), Signal(INT32, name=f"s{s}_u")
        m.d.comb += x.eq(Mux(dc["neg"], _sat32(-a), a))
        m.d.comb += u.eq(Mux(dc["clamp"] & (x < dc["lo"]), dc["lo"], Mux(dc["clamp"] & (x > dc["hi"]), dc["hi"], x)))
        idx = Signal(self._seg, name=f"s{s}_idx")
        m.d.comb += idx.eq((u >> dc["step"]) + (1 << (self._seg - 1)))
        m.d.comb += [rom_port.addr.eq(idx), rom_port.en.eq(adv & v_in)]
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

        a1, bm1, f1, simple1 = reg(INT32, "a1"), reg(INT32, "bm1"), reg(INT32, "f1"), reg(INT32, "simple1")
        bigneg1 = reg(1, "bigneg1")
        with m.If(adv):
            m.d.sync += v1.eq(v_in)
            m.d.sync += _load(v_in, [*e1.pairs(e_in), (a1, a), (bm1, Mux(dc["mul"], b, val)), (f1, frac),
                                     (bigneg1, dc["big"] & u[31]), (simple1, simple)])

        # ---- c1: LUT data; operands of product A
        t0, d = rom_port.data.t0, rom_port.data.d
        ma, mb = reg(INT32, "ma"), reg(INT32, "mb")
        t02, d2 = reg(unsigned(len(t0)), "t02"), reg(unsigned(len(d)), "d2")
        a2, simple2, bigneg2 = reg(INT32, "a2"), reg(INT32, "simple2"), reg(1, "bigneg2")
        with m.If(adv):
            m.d.sync += v2.eq(v1)
            m.d.sync += _load(v1, [*e2.pairs(e1), (ma, Mux(dc["sig"], d, a1)), (mb, Mux(dc["sig"], f1, bm1)),
                                   (t02, t0), (d2, d), (a2, a1), (simple2, simple1), (bigneg2, bigneg1)])

        # ---- c2: product A (64 bits)
        pa = reg(signed(64), "pa")
        t03, d3 = reg(unsigned(len(t0)), "t03"), reg(unsigned(len(d)), "d3")
        a3, simple3, bigneg3 = reg(INT32, "a3"), reg(INT32, "simple3"), reg(1, "bigneg3")
        with m.If(adv):
            m.d.sync += v3.eq(v2)
            m.d.sync += _load(v2, [*e3.pairs(e2), (pa, ma * mb), (t03, t02), (d3, d2), (a3, a2),
                                   (simple3, simple2), (bigneg3, bigneg2)])

        # ---- c3: round half up and shift; sigmoid: t0 (+ d for the wrapped fraction) + correction; else sat32
        # (|pa| <= 2**62, so the rounded quotient fits 64 bits; the sigmoid sum is taken mod 2**32 anyway)
        q = Signal(signed(64), name=f"s{s}_q")
        m.d.comb += q.eq(_round_shift(pa, dc["sh0"], dc["shm1"]))
        y4, a4, simple4 = reg(INT32, "y4"), reg(INT32, "a4"), reg(INT32, "simple4")
        y = Signal(INT32, name=f"s{s}_y")
        m.d.comb += y.eq(Mux(dc["sig"], t03 + Mux(bigneg3, d3, 0) + q[:32], _sat32(q)))
        with m.If(adv):
            m.d.sync += v4.eq(v3)
            m.d.sync += _load(v3, [*e4.pairs(e3), (y4, y), (a4, a3), (simple4, simple3)])

        # ---- c4: product B: SiLU's a * sigmoid(a), SSQ's w * w
        w = Signal(INT32, name=f"s{s}_w")
        m.d.comb += w.eq(Mux(dc["wnone"], a4, y4))
        pb, w5, y5, simple5 = reg(signed(64), "pb"), reg(INT32, "w5"), reg(INT32, "y5"), reg(INT32, "simple5")
        with m.If(adv):
            m.d.sync += v5.eq(v4)
            m.d.sync += _load(v4, [*e5.pairs(e4), (pb, Mux(dc["silu"], a4, w) * Mux(dc["silu"], y4, w)),
                                   (w5, w), (y5, y4), (simple5, simple4)])

        # ---- c5: result into r[dst]; reductions into the stage accumulator
        res = Signal(INT32, name=f"s{s}_res")
        wdst = Signal(name=f"s{s}_wdst")
        gate = pb[nx.GATE_FRAC - 1:].as_signed()   # SiLU: (pb + 2**(GATE_FRAC - 1)) >> GATE_FRAC, as in _round_shift
        with m.Switch(op):
            with m.Case(M.LD, M.ADD, M.SUB, M.ADDV, M.RSUB1):
                m.d.comb += [res.eq(simple5), wdst.eq(1)]
            with m.Case(M.MUL, M.MULV, M.SIG, M.SIGNEG):
                m.d.comb += [res.eq(y5), wdst.eq(1)]
            with m.Case(M.SILU):
                m.d.comb += [res.eq(_sat32(gate[1:].as_signed() + gate[0])), wdst.eq(1)]
        with m.If(adv):
            m.d.sync += vo.eq(v5)
            m.d.sync += _load(v5, [(eo.index, e5.index), (eo.last, e5.last),
                                   *((eo.r[j], Mux(wdst & (mo.dst == j), res, e5.r[j])) for j in range(4))])

        acc = Signal(unsigned(64), name=f"s{s}_acc")
        fin = Signal(name=f"s{s}_fin")
        mag = Signal(unsigned(32), name=f"s{s}_mag")
        term, carry = _add_u64(acc, pb[nx.SSQ_SHIFT:63])
        m.d.comb += mag.eq(Mux(w5 < 0, -w5, w5))
        with m.If(adv & v5):
            with m.If(dc["ssq"]):
                m.d.sync += acc.eq(Mux(carry, _U64_MAX, term))
            with m.Elif(dc["amax"]):
                m.d.sync += acc.eq(Mux(mag > acc, mag, acc))
            with m.If(e5.last):
                m.d.sync += fin.eq(1)
        with m.If(self.start):
            m.d.sync += [acc.eq(0), fin.eq(0)]
        return eo, vo, a1, acc, fin
