"""The epilogue: dequantization and the micro-op program, one element per cycle (docs/RTL.md, ``hw/epilogue.py``).

Every output element of a GEMV (or every token word of LOAD_TOKEN) enters with its index; the unit forms
the register file ``r0..r3`` (``hw.isa`` module docstring: ``r0 = acc * S``, ``r1 = acc``, ``r2 = r3 = 0``,
or ``r0 = r1 = x[n]`` for ``raw`` inputs), runs the instruction's :data:`hw.isa.MAX_OPS` micro-ops in a
pipeline of as many stages (stage ``s`` executes ``ops[s]``; NOP beyond ``n_ops``) and leaves with its
buffer writes, reductions, argmax and logit. The arithmetic is that of :mod:`hw.numerics` and of
``_Executor._epilogue`` in :mod:`host.devices.golden`, bit for bit.

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

from types import SimpleNamespace

import numpy as np
from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
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

#: input register, dequant product (+ buffer data), dequant shift in two steps (multiples of 8, then 0-7),
#: dequant rounding and sat32, register file
ENTRY_LATENCY = 6
#: operands and adder ALU; clamp and LUT address; LUT data; product A (partial products, sum); shift; rounding,
#: sat32 or sigmoid sum; product B (partial products, sum); result and reductions
STAGE_LATENCY = 10
_ROM_COPIES = (MAX_OPS + 1) // 2   #: sigmoid ROM copies, two read ports each
#: words of each delay memory (a power of two above the longest delay, exit - stage 0 = 78 advances)
_DELAY_DEPTH = 128


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

    def __init__(self, name: str, index_bits: int, folded: bool = False):
        self.r = [Signal(INT32, name=f"{name}_r{k}", reset_less=True) for k in range(4)]
        self.index = Signal(index_bits, name=f"{name}_index", reset_less=True)
        self.last = Signal(name=f"{name}_last", reset_less=True)
        #: folded epilogue: the micro-op slot the element executes in this pass (None otherwise)
        self.k = Signal(range(MAX_OPS), name=f"{name}_k", reset_less=True) if folded else None

    def pairs(self, other: "_Elem") -> list:
        """(destination, source) pairs of a copy from ``other``, for :func:`_load`."""
        ks = [(self.k, other.k)] if self.k is not None else []
        return [*zip(self.r, other.r, strict=True), (self.index, other.index), (self.last, other.last), *ks]


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


def _last_true(m: Module, name: str, conds) -> tuple[Signal, Signal]:
    """Combinational: the index of the last of ``conds`` (one per micro-op slot) that holds, and whether any
    does (the program's last OUT, ARGMAX or ST to a buffer, as the golden device's in-order semantics keep)."""
    sel, any_ = Signal(range(MAX_OPS), name=f"{name}_c"), Signal(name=f"{name}_en_c")
    for s, c in enumerate(conds):
        with m.If(c):
            m.d.comb += [sel.eq(s), any_.eq(1)]
    return sel, any_


def _add_cin(x, y, cin):
    """``x + y + cin`` (unsigned ``x``, ``y``; ``cin`` one bit) as one adder, ``max(len(x), len(y)) + 1`` bits
    wide with the carry out on top: the carry in enters as an extra low bit of both operands."""
    return (Cat(cin, x) + Cat(cin, y))[1:]


def _sat32(v):
    """``hw.numerics.sat32`` of an expression (to be assigned to a 32-bit signal), from its bits: an overflow is
    a word above bit 30 that is not all sign bits (no comparator, no carry chain)."""
    v = Value.cast(v)
    width = len(v)
    if not v.shape().signed:
        return v if width <= 31 else Mux(v[31:].any(), _I32_MAX, v[:32].as_signed())
    if width <= 32:
        return v
    top = v[31:width - 1]
    return Mux(~v[width - 1] & top.any(), _I32_MAX, Mux(v[width - 1] & ~top.all(), _I32_MIN, v[:32].as_signed()))


def _sat32_inc(t, inc):
    """``sat32(t + inc)`` for a signed ``t`` (33..64 bits) and a one-bit ``inc`` (the rounding increment) with a
    32-bit increment only: ``t + inc`` fits int32 iff ``t``'s bits above bit 30, plus the carry out of its low
    31 bits, make all zeros or all ones (``t >> 31 = -2`` with the carry gives ``INT32_MIN``, which the
    saturation gives too); otherwise it saturates to ``t``'s sign."""
    t = Value.cast(t)
    width = len(t)
    assert t.shape().signed and 33 <= width <= 64
    low = t[:32] + inc
    carry = inc & t[:31].all()
    top = t[31:]                      # width - 31 >= 2 bits
    fits = (~top.any() & ~carry) | top.all()
    return Mux(fits, low[:32].as_signed(), Mux(t[width - 1], _I32_MIN, _I32_MAX))


def _mul_parts(x, y):
    """First cycle of a 32 x 32 signed product: the four 16 x 16 partial products (one 18 x 18 multiplier each),
    the two middle ones already summed: ``(low, high, mid)`` with ``x * y = (high << 32) + (mid << 16) + low``."""
    xl, xh, yl, yh = x[:16], x[16:32].as_signed(), y[:16], y[16:32].as_signed()
    return xl * yl, xh * yh, xl * yh + xh * yl


def _mul_sum(low, high, mid):
    """Second cycle: ``x * y`` (signed 64) from :func:`_mul_parts`'s registers, one 48-bit adder (the low 16 bits
    of ``low`` pass)."""
    return Cat(low[:16], (Cat(low[16:32], high).as_signed() + mid)[:48]).as_signed()


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
    folded : bool
        One micro-op stage that every element passes once per micro-op slot (a ring), instead of
        :data:`~hw.isa.MAX_OPS` stages in a row: an element every ``max(n_ops, 1)`` cycles instead of every
        cycle, at an eighth of the stages' multipliers, registers and logic (the ECP5 builds; see the notes).

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
    Structure: entry (input register; ``value * s_mant`` with the buffer reads in flight; the shift of
    :func:`hw.numerics.dequant` in two cycles (by the multiple of 8, with ``sat32`` of the product for a left
    shift; then by the rest) and its rounding bit; the rounding increment and ``sat32``; the register
    file), then one submodule per micro-op stage of :data:`STAGE_LATENCY` cycles: (c0) operand and
    buffer-operand select, SIGNEG's negation, the adder ALU's exact sum (ADD, SUB, ADDV, RSUB1; LD); (c1) the
    sigmoid input clamp and LUT address, ``sat32`` of the sum; (c2) LUT data ``{t0, d = t1 - t0}``, operands of
    product A, ``t0`` (+ ``d``); (c3, c4) product A (``a*b``, ``a*buf`` or ``d*frac``): four 16 x 16 partial
    products, then their sum; (c5) the rounding shift (``shift`` or the segment step) and the rounding bit;
    (c6) the increment with ``sat32``, or ``t0 + correction``; operands of product B; (c7, c8) product B
    (SiLU's ``a*sigmoid(a)``, SSQ's ``w*w``) likewise; (c9) result into ``r[dst]``, SSQ/AMAX into the stage's
    64-bit accumulator (SSQ in two 32-bit halves, the carry between them one cycle later). Every cycle is at
    most one adder or comparator of 34 bits or a 48-bit adder (product sums), a shifter or a multiplier bank
    deep: the design target is 50 MHz on an ECP5 (speed grade 6). The accumulators are folded into ``regs``
    (three cycles for a reduction, one otherwise, as soon as the last element has passed each stage), so two
    micro-ops may reduce into one register. Delay memories (128 words of 32 bits): one per stage 1..7 for its
    buffer operand, one per write port, one for OUT and one for ARGMAX.

    Latency :attr:`latency` = ``ENTRY_LATENCY + MAX_OPS * STAGE_LATENCY`` = 86 cycles from an element's
    input transfer to the exit cycle where its writes and logit are presented; throughput one element
    per cycle; a logits stall freezes the whole pipeline (one global enable, which also drives the read
    ports' ``en``). ``done`` follows the last element's exit by one to two cycles (up to four when the
    last micro-op slot reduces: no compiled program uses it).

    Resources: :attr:`multipliers` (17: one ``acc_bits x 27``, two ``32 x 32`` per stage, each of those as
    four 16 x 16 partial products: 68 MULT18X18D in Yosys ``synth_ecp5``) and :attr:`lut_rom`: four copies
    of the sigmoid ROM (``2**lut_segments_log2`` words of ``{t0, d}``, 53 bits for the default: 3 RAMB18E1
    each in Yosys ``synth_xilinx``), two stages sharing a copy's two read ports.

    Sigmoid: :func:`hw.numerics.sigmoid` exactly. For inputs with so many fraction bits that the segment
    step reaches 32 bits the interpolation uses the signed input and adds ``d`` for negative inputs
    (``t0 + ((d * (2**step + x) + h) >> step) = t0 + d + ((d * x + h) >> step)``), which keeps product A at
    32 x 32 bits and is exact where the golden device's int64 product is (and beyond, where it wraps).

    Folded (``folded=True``): the entry as above, then one stage closed into a ring of ``STAGE_LATENCY + 1``
    registers (c0..c9 and the stage's output c10). An element in c10 with slots left re-enters c0 for slot
    ``k + 1``; otherwise c0 takes the entry's element. The input is accepted only when the ring slot it will
    reach after the entry's six advances (the one now in c5) is empty or in its last pass, so the two never
    meet. Each cycle's decoded fields are registers loaded from slot ``k``'s decode as the element moves in.
    Buffers are read in the cycle before c10 (looping) or before E3 (entering), ST/OUT/ARGMAX act in c1 (a
    read after a store is rejected by the image checks either way, docs/ISA.md); only the program's last OUT
    streams and its last ARGMAX counts, as in the pipelined form. One accumulator per slot, folded into
    ``regs`` as soon as the last element has left that slot's pass. Latency :meth:`latency_for` (``done``
    follows as above), interval ``max(n_ops, 1)`` on average, :attr:`multipliers` 3, one ROM copy.

    Micro-op semantics are those of :class:`hw.isa.MicroOpcode`. Outside what the image checks accept:
    opcodes 16..31 act as NOP, ST to a read-only buffer writes nothing, a buffer operand without a read
    port (``TOKEN``; ``NONE`` for LD/MULV/ADDV) reads 0, and sigmoid inputs with ``shift <
    lut_segments_log2 - 4`` use a segment step of 1. Not supported (the compiler emits neither): more
    than one OUT per program (only the last one's values are streamed; the golden device appends one
    vector per OUT), and one register reduced by both SSQ and AMAX in a program. ``start`` requires the
    pipeline to be idle, and the configuration must be stable from ``start`` to ``done``.
    """

    def __init__(self, *, lut_segments_log2: int = nx.LUT_SEGMENTS_LOG2, acc_bits: int = isa.ACC_BITS,
                 index_bits: int = 16, folded: bool = False):
        if not isinstance(folded, bool):
            raise TypeError(f"folded must be a bool, got {folded!r}")
        self._folded = folded
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
    def folded(self) -> bool:
        """One micro-op stage that every element passes once per micro-op slot (see the class notes)."""
        return self._folded

    @property
    def latency(self) -> int:
        """Cycles from an element's input transfer to its exit (writes and logit presented), unstalled; folded,
        for a program of :data:`~hw.isa.MAX_OPS` micro-ops (:meth:`latency_for`)."""
        return self.latency_for(MAX_OPS)

    def latency_for(self, n_ops: int) -> int:
        """:attr:`latency` of a program of ``n_ops`` micro-ops: ``ENTRY_LATENCY + MAX_OPS * STAGE_LATENCY``
        unfolded; folded ``ENTRY_LATENCY - 2 + max(n_ops, 1) * (STAGE_LATENCY + 1)``, to the last pass's c9,
        where the element leaves (its c0 is ``ENTRY_LATENCY`` cycles after the transfer, each pass 11)."""
        if self._folded:
            return ENTRY_LATENCY - 2 + max(min(n_ops, MAX_OPS), 1) * (STAGE_LATENCY + 1)
        return ENTRY_LATENCY + MAX_OPS * STAGE_LATENCY

    @property
    def interval(self) -> int:
        """Average cycles per element at full rate, for a program of :data:`~hw.isa.MAX_OPS` micro-ops: 1
        unfolded; folded ``max(n_ops, 1)`` (the ring holds ``STAGE_LATENCY + 1`` elements, each for
        ``max(n_ops, 1)`` passes: up to 11 enter back to back, then the ring is full for the rest of their
        passes)."""
        return MAX_OPS if self._folded else 1

    @property
    def multipliers(self) -> int:
        """Hardware multipliers: one ``acc_bits x 27`` (dequantization) and two ``32 x 32`` signed per
        stage (A: ``a*b``, ``a*buf`` or the LUT interpolation ``d*frac``; B: SiLU's ``x*sigmoid(x)`` or
        SSQ's ``w*w``); folded, two in the one stage."""
        return 1 + 2 * (1 if self._folded else MAX_OPS)

    @property
    def lut_rom(self) -> tuple[int, int, int]:
        """The sigmoid ROMs: (copies, depth ``2**lut_segments_log2``, width of ``{t0, d}`` in bits); each copy
        has two synchronous read ports (stages ``2j`` and ``2j + 1``); folded, one copy."""
        return 1 if self._folded else _ROM_COPIES, 1 << self._seg, self._rom_layout.size

    def read_port_name(self, buf: Buffer) -> str:
        """Name of the read port of ``buf`` (``"rd_x"``, ...)."""
        if buf not in READ_BUFFERS:
            raise ValueError(f"buffer {buf!r} has no read port")
        return f"rd_{Buffer(buf).name.lower()}"

    # ----------------------------------------------------------------------------------- elaborate
    def elaborate(self, platform):  # noqa: C901 - one pipeline, two shapes, read top to bottom
        m = Module()
        folded = self._folded
        # the sigmoid LUT: one copy per two stages (a dual-port block RAM; Yosys turns a ROM with more read
        # ports into logic)
        roms = [Memory(shape=self._rom_layout, depth=1 << self._seg, init=self._rom_init)
                for _ in range(self.lut_rom[0])]
        for j, rom in enumerate(roms):
            m.submodules[f"sigmoid_rom{j}"] = rom
        ib = self._index_bits
        cfg = self.cfg
        rd_ports = [getattr(self, f"rd_{b.name.lower()}") for b in READ_BUFFERS]
        wr_ports = [getattr(self, f"wr_{b.name.lower()}") for b in WRITE_BUFFERS]

        adv = Signal()  # the whole pipeline moves (no logits backpressure)
        if not folded:
            # the delay memories' write pointer: one step per advance of the lockstep pipeline
            wp = Signal(range(_DELAY_DEPTH))
            with m.If(adv):
                m.d.sync += wp.eq(wp + 1)

        # ------------------------------------------------------ decoded configuration (registered)
        stage_mods = [Module() for _ in range(1 if folded else MAX_OPS)]
        for s, sm in enumerate(stage_mods):
            m.submodules[f"stage{s}"] = sm
        if folded:
            m.submodules.decode = dec = Module()
            dcs = [self._decode(dec, s) for s in range(MAX_OPS)]
        else:
            dcs = [self._decode(sm, s) for s, sm in enumerate(stage_mods)]
        dq_zero, dq_neg = Signal(reset_less=True), Signal(reset_less=True)
        dq_lsh, dq_rsh0 = Signal(range(33), reset_less=True), Signal(reset_less=True)
        dq_rshm1 = Signal(range(62), reset_less=True)
        sh = cfg.s_shift
        m.d.sync += [dq_zero.eq(sh > 62), dq_neg.eq(sh < 0), dq_lsh.eq(Mux(-sh > 32, 32, -sh)),
                     dq_rsh0.eq(sh <= 0), dq_rshm1.eq(Mux((sh > 0) & (sh <= 62), sh - 1, 0))]

        # ------------------------------------------------------------------------------- entry
        in_lay = input_layout(ib)
        e0, v0 = Signal(in_lay, reset_less=True), Signal()
        admit = Signal()  # folded: the ring slot this element will enter is free; unfolded: always
        m.d.comb += self.i.ready.eq(adv & admit)
        with m.If(adv):
            m.d.sync += v0.eq(self.i.valid & admit)
            m.d.sync += _load(self.i.valid, [(e0, self.i.payload)])
        if not folded:
            m.d.comb += admit.eq(1)
            for p in rd_ports:
                m.d.comb += [p.addr.eq(e0.index), p.en.eq(adv)]

        # E1: dequantization product; buffer data arrives
        e1, v1 = Signal(in_lay, reset_less=True), Signal()
        p1 = Signal(signed(self._acc_bits + 28), reset_less=True)
        with m.If(adv):
            m.d.sync += v1.eq(v0)
            m.d.sync += _load(v0, [(e1, e0), (p1, e0.value[:self._acc_bits].as_signed() * cfg.s_mant)])

        def select(buf, name):
            """The read port data of buffer ``buf`` (0 for a buffer without a read port)."""
            out = Signal(INT32, name=name)
            with m.Switch(buf):
                for j, b in enumerate(READ_BUFFERS):
                    with m.Case(b):
                        m.d.comb += out.eq(rd_ports[j].data)
            return out

        # E2a: the right shift of ``p1 >> s_shift`` by its multiple of 8, and sat32 of ``p1`` for a left shift;
        # unfolded, each stage's buffer operand selected from the read ports: stage 0's into a register, the
        # others' into their delay memories (read as the element enters the stage)
        rd_sel = [] if folded else [select(dcs[s]["buf"], f"rd_sel{s}") for s in range(MAX_OPS)]
        e2a, v2a = Signal(in_lay, reset_less=True), Signal()
        p2a = Signal(signed(len(p1)), reset_less=True)     # p1 >> (dq_rshm1 & ~7)
        p1s = Signal(INT32, reset_less=True)                # sat32(p1); dq_lsh <= 32: no 95-bit shifter
        rd2a = Signal(INT32, reset_less=True)
        with m.If(adv):
            m.d.sync += v2a.eq(v1)
            m.d.sync += _load(v1, [(e2a, e1), (p2a, p1 >> Cat(Const(0, 3), dq_rshm1[3:])), (p1s, _sat32(p1)),
                                   *([] if folded else [(rd2a, rd_sel[0])])])

        # E2b: the rest of the right shift (0-7) and the rounding bit below it, or the saturated left shift
        e2, v2 = Signal(in_lay, reset_less=True), Signal()
        q2 = Signal(signed(64), reset_less=True)
        inc2 = Signal(reset_less=True)
        q_next, inc_next = Signal(signed(64)), Signal()
        t1 = Signal(signed(len(p1)))
        m.d.comb += t1.eq(p2a >> dq_rshm1[:3])             # p1 >> dq_rshm1
        with m.If(dq_zero):
            m.d.comb += q_next.eq(0)
        with m.Elif(dq_neg):
            m.d.comb += q_next.eq(Mux(dq_lsh[5], Cat(Const(0, 32), p1s).as_signed(), p1s << dq_lsh[:5]))
        with m.Elif(dq_rsh0):
            m.d.comb += q_next.eq(p2a)                      # dq_rshm1 = 0 here: p2a = p1
        with m.Else():
            # (p1 + 2**(sh - 1)) >> sh = (p1 >> sh) + bit sh - 1 of p1
            m.d.comb += [q_next.eq(t1[1:].as_signed()), inc_next.eq(t1[0])]
        rd2 = Signal(INT32, reset_less=True)
        with m.If(adv):
            m.d.sync += v2.eq(v2a)
            m.d.sync += _load(v2a, [(e2, e2a), (q2, q_next), (inc2, inc_next), *([] if folded else [(rd2, rd2a)])])

        # E3: the rounding increment and sat32
        e3, v3 = Signal(in_lay, reset_less=True), Signal()
        r0_3 = Signal(INT32, reset_less=True)
        rd3 = Signal(INT32, reset_less=True)
        with m.If(adv):
            m.d.sync += v3.eq(v2)
            m.d.sync += _load(v2, [(e3, e2), (r0_3, Mux(cfg.raw, e2.value, _sat32_inc(q2, inc2))),
                                   *([] if folded else [(rd3, rd2)])])

        # stage 0 input: the register file
        e_in, v_in = _Elem("e_in", ib, folded), Signal()
        val0 = Signal(INT32, reset_less=True)
        entry = [(e_in.r[0], r0_3), (e_in.r[1], e3.value), (e_in.r[2], 0), (e_in.r[3], 0),
                 (e_in.index, e3.index), (e_in.last, e3.last)]   # the order of _Elem.pairs
        accs, sats, fins = [], [], []
        if not folded:
            with m.If(adv):
                m.d.sync += v_in.eq(v3)
                m.d.sync += _load(v3, [*entry, (val0, rd3)])
            # stage s's operand, selected at E2, arrives STAGE_LATENCY * s advances after stage 0's
            vals = [val0] + [_delay_line(m, f"rd_delay{s}", wp, adv, 3 + STAGE_LATENCY * s, rd_sel[s])
                             for s in range(1, MAX_OPS)]

            # ---------------------------------------------------------------------------- stages
            avals = []
            for s in range(MAX_OPS):
                sm = stage_mods[s]
                st = self._stage(sm, s, dcs, e_in, v_in, vals[s], roms[s // 2].read_port(), adv)
                e9, v9, f = st.es[9], st.vs[9], st.field
                acc, sat, cy = self._reducer(sm, f"s{s}", adv & v9 & f(9, "ssq"), st.pb, adv & v9 & f(9, "amax"),
                                             st.mag)
                fin0 = Signal(name=f"s{s}_fin0")
                with sm.If(adv & v9 & e9.last):
                    sm.d.sync += fin0.eq(1)
                with sm.If(self.start):
                    sm.d.sync += fin0.eq(0)
                fin = Signal(name=f"s{s}_fin")
                sm.d.comb += fin.eq(fin0 & ~cy)
                avals.append(st.a1)
                accs.append(acc)
                sats.append(sat)
                fins.append(fin)
                e_in, v_in = st.eo, st.vo
            ex, vx = e_in, v_in  # the exit register

            # -------------------------------------- ST, OUT and ARGMAX values: delay memories to the exit
            def sink(name, conds):
                """The value of operand ``a`` of the last stage whose ``conds`` holds, delayed from that
                stage's second cycle (its register ``a1``) to the exit; and whether any stage's holds (a
                property of the program)."""
                sel_c, en_c = _last_true(m, f"{name}_stage", conds)
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

            wr = [sink(f"wr_{buf.name.lower()}", [dc["st"] & (dc["buf"] == buf) for dc in dcs])
                  for buf in WRITE_BUFFERS]
            out, out_en = sink("out", [dc["out"] for dc in dcs])
            am, am_en = sink("am", [dc["argmax"] for dc in dcs])
            # the exit: writes, logit and argmax of the element leaving the last stage
            sink_v, sink_index = vx, ex.index
            wr_en = [en_k for _, en_k in wr]
            wr_data = [data_k for data_k, _ in wr]
            leaving = vx & ex.last                      # the last element leaves (with ``adv``)
        else:
            # ----------------------------------------------------------------- the ring (folded)
            # One stage; an element leaving its c9 (into c10, ``eo``) re-enters c0 for its next micro-op slot
            # while it has one (``loop``); otherwise c0 takes the entry's element. The ring has
            # STAGE_LATENCY + 1 = 11 registers; an element accepted now reaches c0 after ENTRY_LATENCY = 6
            # advances, when the ring slot now in c5 gets there: it is admitted only if that slot is empty
            # or its element is in its last pass (it leaves at c10 instead of looping).
            last_k = Signal(range(MAX_OPS), reset_less=True)   # the last slot: max(n_ops, 1) - 1 (NOPs beyond 8)
            m.d.sync += last_k.eq(Mux(cfg.n_ops == 0, 0, Mux(cfg.n_ops > MAX_OPS, MAX_OPS - 1, cfg.n_ops - 1)))
            loop, k_in = Signal(), Signal(range(MAX_OPS))
            sm = stage_mods[0]
            st = self._stage(sm, 0, dcs, e_in, v_in, val0, roms[0].read_port(), adv, k_in=k_in)
            es, vs, eo, vo = st.es, st.vs, st.eo, st.vo
            m.d.comb += [loop.eq(vo & (eo.k != last_k)), k_in.eq(Mux(loop, eo.k + 1, 0)),
                         admit.eq(~(vs[5] & (es[5].k != last_k)))]
            with m.If(adv):
                m.d.sync += v_in.eq(loop | v3)
                m.d.sync += [dst.eq(Mux(loop, src_l, Mux(v3, src_e, dst)))
                             for (dst, src_l), (_, src_e) in zip(e_in.pairs(eo)[:6], entry, strict=True)]
                m.d.sync += e_in.k.eq(k_in)
            # buffer operands: every pass reads the buffer of the slot it executes, at the element's index,
            # as the element moves into the ring's c10 (looping) or into E3 (entering), one cycle ahead of
            # c0; the two never both enter c0
            loop9 = Signal()
            m.d.comb += loop9.eq(vs[9] & (es[9].k != last_k))
            bufs = [Value.cast(dc["buf"]) for dc in dcs]
            nbuf = Signal(len(bufs[0]), name="next_buf", reset_less=True)
            with m.If(adv):
                m.d.sync += nbuf.eq(Mux(loop9, Array([*bufs[1:], Const(Buffer.NONE.value, len(nbuf))])[es[9].k],
                                        bufs[0]))
            for p in rd_ports:
                m.d.comb += [p.addr.eq(Mux(loop9, es[9].index, e2.index)), p.en.eq(adv)]
            with m.If(adv):
                m.d.sync += val0.eq(select(nbuf, "rd_next"))
            # reductions: one accumulator per micro-op slot, fed by the passes that execute it
            e9, v9, f = es[9], vs[9], st.field
            # reductions: one accumulator per micro-op slot, fed by the passes that execute it; final (``fin``)
            # once the last element has left that slot's pass (elements pass every slot in order)
            for s in range(MAX_OPS):
                here = adv & v9 & (e9.k == s)
                acc, sat, cy = self._reducer(sm, f"slot{s}", here & f(9, "ssq"), st.pb, here & f(9, "amax"),
                                             st.mag)
                fin0 = Signal(name=f"slot{s}_fin0")
                with sm.If(here & e9.last):
                    sm.d.sync += fin0.eq(1)
                with sm.If(self.start):
                    sm.d.sync += fin0.eq(0)
                accs.append(acc)
                sats.append(sat)
                fins.append(fin0 & ~cy)

            def last_slot(name, cond):
                """The last slot whose decoded ``cond`` holds (as the pipelined form's exit takes the last
                stage's value: only the program's last OUT streams, only its last ARGMAX counts)."""
                sel_c, _ = _last_true(m, f"{name}_slot", [dc[cond] for dc in dcs])
                sel = Signal(range(MAX_OPS), name=f"{name}_slot")
                m.d.sync += sel.eq(sel_c)
                return sel

            # ST, OUT and ARGMAX act in the pass's c1
            f1 = st.field
            sink_v, sink_index = vs[1], es[1].index
            wr_en = [f1(1, "st") & (f1(1, "buf") == buf) for buf in WRITE_BUFFERS]
            wr_data = [st.a1] * len(WRITE_BUFFERS)
            out, out_en = st.a1, f1(1, "out") & (es[1].k == last_slot("out", "out"))
            am, am_en = st.a1, f1(1, "argmax") & (es[1].k == last_slot("am", "argmax"))
            leaving = v9 & e9.last & (e9.k == last_k)
        self._stage_accs = accs  # white-box access for the saturation test (tests/hw/test_epilogue.py)

        # ----------------------------------------------------- writes, logits and argmax (the exit or c1)
        stall = sink_v & out_en & ~self.logits.ready
        fire = Signal()
        m.d.comb += [adv.eq(~stall), fire.eq(sink_v & adv),
                     self.logits.valid.eq(sink_v & out_en), self.logits.payload.eq(out)]
        for data_k, en_k, p in zip(wr_data, wr_en, wr_ports, strict=True):
            m.d.comb += [p.addr.eq(sink_index), p.data.eq(data_k), p.en.eq(fire & en_k)]

        am_seen = Signal()
        with m.If(fire & am_en):
            m.d.sync += am_seen.eq(1)
            with m.If(~am_seen | (am > self.argmax_value)):
                m.d.sync += [self.argmax_index.eq(sink_index), self.argmax_value.eq(am)]

        # --------------------------------------------------- reductions: fold the stage accumulators
        # stage k's accumulator into regs[reg] once it is final: a stage without a reduction is passed in a
        # cycle; one with a reduction takes three (select; low halves; high halves and the write)
        busy, last_out = Signal(), Signal()
        k = Signal(range(MAX_OPS + 1))
        ph = Signal(range(3))
        fin_k = Array(fins)[k]
        ssq_k = Array([dc["ssq"] for dc in dcs])[k]
        amax_k = Array([dc["amax"] for dc in dcs])[k]
        reg_k = Array([dc["reg"] for dc in dcs])[k]
        rg = [Signal(unsigned(64), name=f"reg{j}") for j in range(8)]   # R0..R7 (a word each, not one vector)
        m.d.comb += [self.regs[j].eq(rg[j]) for j in range(8)]
        cur, acc_f = Signal(unsigned(64), reset_less=True), Signal(unsigned(64), reset_less=True)
        ssq_f, reg_f = Signal(reset_less=True), Signal(3, reset_less=True)
        lo_f, c_f = Signal(32, reset_less=True), Signal(reset_less=True)
        hgt_f, heq_f, lgt_f = Signal(reset_less=True), Signal(reset_less=True), Signal(reset_less=True)
        with m.If(adv & leaving):
            m.d.sync += last_out.eq(1)
        # the next slot to fold: folded, none after the last executed one (slots beyond it never reduce)
        k_next = Mux(k >= last_k, MAX_OPS, k + 1) if folded else k + 1
        with m.Switch(ph):
            with m.Case(0):
                with m.If(busy & (k < MAX_OPS) & fin_k):
                    with m.If(ssq_k | amax_k):
                        m.d.sync += [cur.eq(Array(rg)[reg_k]), acc_f.eq(Mux(Array(sats)[k], _U64_MAX, Array(accs)[k])),
                                     ssq_f.eq(ssq_k), reg_f.eq(reg_k), ph.eq(1)]
                    with m.Else():
                        m.d.sync += k.eq(k_next)
            with m.Case(1):
                lo = cur[:32] + acc_f[:32]
                m.d.sync += [lo_f.eq(lo[:32]), c_f.eq(lo[32]), hgt_f.eq(acc_f[32:] > cur[32:]),
                             heq_f.eq(acc_f[32:] == cur[32:]), lgt_f.eq(acc_f[:32] > cur[:32]), ph.eq(2)]
            with m.Case(2):
                hi = _add_cin(cur[32:], acc_f[32:], c_f)
                new = Mux(ssq_f, Mux(hi[32], _U64_MAX, Cat(lo_f, hi[:32])),     # saturating sum (SSQ)
                          Mux(hgt_f | (heq_f & lgt_f), acc_f, cur))              # maximum (AMAX)
                for j in range(8):
                    with m.If(reg_f == j):
                        m.d.sync += rg[j].eq(new)
                m.d.sync += [k.eq(k_next), ph.eq(0)]
        m.d.comb += self.done.eq(busy & (k == MAX_OPS) & last_out)
        with m.If(self.done):
            m.d.sync += busy.eq(0)

        with m.If(self.start):
            m.d.sync += [busy.eq(1), last_out.eq(0), k.eq(0), ph.eq(0), am_seen.eq(0)]
            for j in range(8):
                clear = [(s < cfg.n_ops) & ((op.op == M.SSQ) | (op.op == M.AMAX)) & (op.reg == j)
                         for s, op in ((s, cfg.ops[s]) for s in range(MAX_OPS))]
                with m.If(Cat(*clear).any()):
                    m.d.sync += rg[j].eq(0)
        return m

    # ------------------------------------------------------------------------------------ helpers
    def _decode(self, m: Module, s: int) -> dict:
        """Registered per-stage decode of ``cfg.ops[s]`` (the configuration is stable, so a cycle or two of
        lag costs nothing and keeps the decoders, the operand selects and the shifters' controls off the
        datapath)."""
        mo = self.cfg.ops[s]
        op_c = Signal(MicroOpcode, name=f"s{s}_op_c")
        m.d.comb += op_c.eq(Mux(s < self.cfg.n_ops, mo.op, M.NOP))
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
        m.d.comb += step_raw.eq(shift + (nx.LUT_RANGE_LOG2 + 1 - self._seg))
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
        idx_lo = Signal(self._seg, name=f"s{s}_idx_lo", reset_less=True)
        idx_hi = Signal(self._seg, name=f"s{s}_idx_hi", reset_less=True)
        m.d.sync += [idx_lo.eq((lo >> step) + (1 << (self._seg - 1))), idx_hi.eq((hi >> step) + (1 << (self._seg - 1)))]
        dc.update(clamp=clamp, lo=lo, hi=hi, hmask=hmask, step=step, mask=mask, big=big, sh0=sh0, shm1=shm1,
                  rs_one=rs_one, idx_lo=idx_lo, idx_hi=idx_hi)
        return dc

    def _reducer(self, m: Module, name: str, ssq_take, pb, amax_take, mag):
        """A reduction accumulator (unsigned 64): SSQ adds ``pb >> SSQ_SHIFT`` while ``ssq_take``, AMAX takes
        ``max(acc, mag)`` while ``amax_take``; cleared by ``start``. Returns ``(acc, sat, cy)``.

        SSQ adds in two 32-bit halves, the low half's carry entering the high half one cycle later (a pending
        carry ``cy`` is added in the next cycle, with or without a new term); an overflow of the high half sets
        ``sat`` (the sum only grows, so the golden device's saturated sum is ``2**64 - 1`` from then on). AMAX:
        ``acc < 2**32`` whenever the program has written it.
        """
        acc = Signal(unsigned(64), name=f"{name}_acc")
        cy, sat = Signal(name=f"{name}_cy"), Signal(name=f"{name}_sat")
        term = pb[nx.SSQ_SHIFT:63]
        lo_sum = acc[:32] + Mux(ssq_take, term[:32], 0)
        hi_sum = _add_cin(acc[32:], Mux(ssq_take, term[32:], 0), cy)
        with m.If(ssq_take | cy):
            m.d.sync += [acc.eq(Cat(lo_sum[:32], hi_sum[:32])), cy.eq(lo_sum[32])]
            with m.If(hi_sum[32]):
                m.d.sync += sat.eq(1)
        with m.If(amax_take & (acc[32:] == 0) & (mag > acc[:32])):
            m.d.sync += acc.eq(mag)
        with m.If(self.start):
            m.d.sync += [acc.eq(0), cy.eq(0), sat.eq(0)]
        return acc, sat, cy

    def _stage(self, m: Module, s: int, dcs: list, e_in: _Elem, v_in, val, rom_port, adv, k_in=None):
        """Stage ``s``: executes a micro-op in :data:`STAGE_LATENCY` cycles ``c0..c9``; ``val`` is its buffer
        operand (a register holding it while the element is at ``e_in``).

        Unfolded (``k_in`` None) the stage executes ``cfg.ops[s]``, decoded in ``dcs[s]``. Folded, the element
        carries the slot ``k`` it executes in this pass (``e_in.k``, loaded from ``k_in``), and every decoded
        field a cycle ``c_j`` uses is a register loaded, as the element moves into ``c_j``, from
        ``dcs[k][field]`` (an 8-way multiplexer before the register, never on the datapath).

        Returns a namespace: ``eo``/``vo`` the output element (the next stage's input, or the folded ring's
        last register ``c10``) and its valid bit; ``es``/``vs`` the elements of ``c0..c10``; ``a1`` operand
        ``a`` in ``c1`` (the value of ST, OUT and ARGMAX); ``pb`` product B and ``mag`` ``|w|`` in ``c9`` (the
        reductions' terms); ``field(j, name)`` the decoded field of the element in ``c_j``.
        """
        ib = self._index_bits
        folded = k_in is not None
        n = STAGE_LATENCY

        def reg(shape, name):
            return Signal(shape, name=f"s{s}_{name}", reset_less=True)

        # es[j], vs[j]: the element in cycle c_j and its valid bit (es[0] = e_in; es[n]: the stage's output)
        es = [e_in] + [_Elem(f"s{s}_e{j}", ib, folded) for j in range(1, n + 1)]
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
                m.d.sync += _load(vs[j], [*(es[j + 1].pairs(es[j]) if elem else []), *pairs])

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
        r1, p = regs(1, a=a, x=Mux(field(0, "neg"), _sat32(-a), a), bm=Mux(field(0, "mul"), b, val), alu=alu)
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
        idx = Signal(self._seg, name=f"s{s}_idx")
        m.d.comb += idx.eq(Mux(below, field(1, "idx_lo"),
                               Mux(above, field(1, "idx_hi"), (x1 >> field(1, "step")) + (1 << (self._seg - 1)))))
        m.d.comb += [rom_port.addr.eq(idx), rom_port.en.eq(adv & vs[1])]
        simple = Signal(INT32, name=f"s{s}_simple")
        m.d.comb += simple.eq(Mux(field(1, "rs_big"), _I32_MAX, _sat32(r1["alu"])))
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
        low, high, mid = _mul_parts(r3["ma"].as_signed(), r3["mb"].as_signed())
        r4, p = regs(4, a=r3["a"], tb=r3["tb"], simple=r3["simple"], pl=low, ph=high, pm=mid)
        advance(3, p)
        r5, p = regs(5, a=r4["a"], tb=r4["tb"], simple=r4["simple"], pa=_mul_sum(r4["pl"], r4["ph"], r4["pm"]))
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
        m.d.comb += y.eq(Mux(field(6, "sig"), _add_cin(r6["tb"], q6[:32], r6["inc"])[:32], _sat32_inc(q6, r6["inc"])))
        r7, p = regs(7, y=y, w=Mux(wnone, a6, y), bx=Mux(silu | wnone, a6, y), by=Mux(~silu & wnone, a6, y),
                     simple=r6["simple"])
        advance(6, p)

        # ---- c7, c8: product B (partial products, then their sum); |w| for AMAX
        low, high, mid = _mul_parts(r7["bx"].as_signed(), r7["by"].as_signed())
        w7 = r7["w"].as_signed()
        r8, p = regs(8, y=r7["y"], simple=r7["simple"], mag=Mux(w7[31], -w7, w7)[:32], pl=low, ph=high, pm=mid)
        advance(7, p)
        r9, p = regs(9, y=r8["y"], simple=r8["simple"], mag=r8["mag"], pb=_mul_sum(r8["pl"], r8["ph"], r8["pm"]))
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
                m.d.comb += [res.eq(_sat32_inc(pb[nx.GATE_FRAC:].as_signed(), pb[nx.GATE_FRAC - 1])), wdst.eq(1)]
        eo = es[n]
        advance(9, [(eo.index, e9.index), (eo.last, e9.last), *([(eo.k, e9.k)] if folded else []),
                    *((eo.r[j], Mux(wdst & (field(9, "dst") == j), res, e9.r[j])) for j in range(4))], elem=False)

        return SimpleNamespace(eo=eo, vo=vs[n], es=es, vs=vs, a1=a1, pb=pb, mag=r9["mag"], field=field)
