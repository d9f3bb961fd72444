"""What both epilogue forms share: parameters, ports, the dequantizing entry, the exit and the reduction fold.

:class:`EpilogueBase` is the signature, the parameter checks and the properties of the epilogue, and the
logic both of its forms build around their micro-op stages (:mod:`hw.epilogue_stage`): the entry (input
register and dequantization, :data:`~hw.epilogue_stage.ENTRY_LATENCY` cycles to the register file), the
exit (buffer writes, logits and argmax, with the one global enable) and the fold of the stage accumulators
into the reduction registers, with ``done``. The forms are :class:`hw.epilogue_pipelined.PipelinedEpilogue`
and :class:`hw.epilogue_folded.FoldedEpilogue`; :func:`hw.epilogue.Epilogue` picks one.
"""

from types import SimpleNamespace

import numpy as np
from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory, ReadPort, WritePort
from amaranth.lib.wiring import In, Out

from hw import isa
from hw import numerics as nx
from hw.epilogue_arith import INT32, U64_MAX, add_cin, sat32, sat32_inc
from hw.epilogue_stage import READ_BUFFERS, WRITE_BUFFERS, EpilogueConfig, input_layout, load
from hw.isa import MAX_OPS, Buffer, MicroOpcode

__all__ = ["EpilogueBase"]

M = MicroOpcode


class EpilogueBase(wiring.Component):
    """Dequantization and the micro-op program of one instruction, one element at a time (abstract: the
    forms :class:`~hw.epilogue_pipelined.PipelinedEpilogue` and :class:`~hw.epilogue_folded.FoldedEpilogue`
    give the stages, the latencies and the resources).

    Parameters
    ----------
    lut_segments_log2 : int, 6..14
        Sigmoid LUT resolution (the image's ``lut_segments_log2``; :func:`hw.numerics.sigmoid_table`).
    acc_bits : int, 2..32
        Width of the GEMV accumulator (``hw.isa.ACC_BITS``): the dequantization multiplier is
        ``acc_bits x 27`` bits; a non-raw ``value`` must lie in the signed ``acc_bits`` range.
    index_bits : int, 1..32
        Width of element indices and buffer addresses.
    src_loc_at : int
        Stack frames between the caller to name in source locations and warnings, and the constructor (as
        Amaranth's own ``src_loc_at``; :func:`hw.epilogue.Epilogue` passes 1).

    Raises
    ------
    TypeError
        If a parameter is not an int.
    ValueError
        If a parameter is out of range.

    Ports
    -----
    cfg : In(:class:`~hw.epilogue_stage.EpilogueConfig`)
        Stable from ``start`` (inclusive) to ``done``.
    start : In(1)
        One-cycle strobe before (or with) the first element: clears the reduction registers the
        program's SSQ/AMAX micro-ops write (``regs[op.reg] = 0``, as the golden device does at their
        first write) and the argmax search. The pipeline must be idle (after ``done``).
    i : In(stream.Signature(:func:`~hw.epilogue_stage.input_layout`))
        Elements, ``last`` on the instruction's last (``n >= 1`` elements per instruction).
    rd_x, rd_a, rd_p, rd_state_old, rd_state_new, rd_c0..rd_c3 : In(lib.memory.ReadPort.Signature)
        Buffer read ports (``addr`` and ``en`` out, int32 ``data`` in, one cycle after ``addr`` while
        ``en``): ``connect`` them to ``Memory.read_port()`` (the sequencer adds the state banks' layer
        offset). Address = element index.
    wr_x, wr_a, wr_p, wr_state_new : In(lib.memory.WritePort.Signature)
        Buffer write ports (``addr``, ``data``, ``en`` out) of ST.
    regs : Out(ArrayLayout(unsigned(64), 8))
        Reduction registers R0..R7 (SSQ: ``hw.numerics.ssq_accumulate``, saturating at ``2**64 - 1``;
        AMAX: max of ``|w|``). Registers the program does not write keep their value; the written
        ones are final at ``done``.
    argmax_index : Out(index_bits), argmax_value : Out(signed(32))
        ARGMAX: first index of the largest ``a`` over the instruction (strictly greater replaces).
    logits : Out(stream.Signature(signed(32)))
        OUT values in element order; backpressure stalls the whole pipeline (and ``i``) without loss.
    done : Out(1)
        One-cycle strobe once the ``last`` element has left (writes, logit, argmax) and every
        reduction is folded into ``regs``: :data:`DONE_LATENCY` cycles after its exit at most (one to two;
        up to four when the last micro-op slot reduces in the folded form: no compiled program does).

    Notes
    -----
    The entry: input register; ``value * s_mant`` with the buffer reads in flight; the shift of
    :func:`hw.numerics.dequant` in two cycles (by the multiple of 8, with ``sat32`` of the product for a left
    shift; then by the rest) and its rounding bit; the rounding increment and ``sat32``; the register file
    (``r0 = dequant(acc)``, ``r1 = acc``, ``r2 = r3 = 0``, or ``r0 = r1 = value`` for ``raw``). Every cycle
    is at most one adder or comparator of 34 bits or a 48-bit adder (product sums), a shifter or a
    multiplier bank deep: the design target is 50 MHz on an ECP5 (speed grade 6). The stage accumulators are
    folded into ``regs`` (three cycles for a reduction, one otherwise, as soon as the last element has passed
    each stage or slot), so two micro-ops may reduce into one register.

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

    #: The form: one stage closed into a ring (True) or one stage per micro-op slot (False).
    FOLDED: bool
    #: Copies of the sigmoid ROM, each with two synchronous read ports.
    ROM_COPIES: int
    #: Hardware multipliers (see :attr:`multipliers`).
    MULTIPLIERS: int
    #: Average cycles per element at full rate for a program of :data:`~hw.isa.MAX_OPS` micro-ops.
    INTERVAL: int
    #: Most cycles from the last element's exit (the cycle :meth:`latency_for` counts to) to ``done``, when the
    #: program's last micro-op slot does not reduce (``host.perf.DONE_LATENCY``).
    DONE_LATENCY = 2

    def __init__(self, *, lut_segments_log2: int = nx.LUT_SEGMENTS_LOG2, acc_bits: int = isa.ACC_BITS,
                 index_bits: int = 16, src_loc_at: int = 0):
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
        super().__init__(members, src_loc_at=1 + src_loc_at)

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
        """One micro-op stage that every element passes once per micro-op slot (:class:`FoldedEpilogue`)."""
        return self.FOLDED

    @classmethod
    def latency_for(cls, n_ops: int) -> int:
        """Cycles from an element's input transfer to its exit (writes and logit presented), unstalled, for a
        program of ``n_ops`` micro-ops; a class method (no instance needed)."""
        raise NotImplementedError

    @property
    def latency(self) -> int:
        """:meth:`latency_for` a program of :data:`~hw.isa.MAX_OPS` micro-ops."""
        return self.latency_for(MAX_OPS)

    @property
    def interval(self) -> int:
        """Average cycles per element at full rate, for a program of :data:`~hw.isa.MAX_OPS` micro-ops
        (:data:`INTERVAL`)."""
        return self.INTERVAL

    @property
    def multipliers(self) -> int:
        """Hardware multipliers: one ``acc_bits x 27`` (dequantization) and two ``32 x 32`` signed per
        stage (A: ``a*b``, ``a*buf`` or the LUT interpolation ``d*frac``; B: SiLU's ``x*sigmoid(x)`` or
        SSQ's ``w*w``) (:data:`MULTIPLIERS`)."""
        return self.MULTIPLIERS

    @property
    def lut_rom(self) -> tuple[int, int, int]:
        """The sigmoid ROMs: (copies, depth ``2**lut_segments_log2``, width of ``{t0, d}`` in bits); each copy
        has two synchronous read ports."""
        return self.ROM_COPIES, 1 << self._seg, self._rom_layout.size

    def read_port_name(self, buf: Buffer) -> str:
        """Name of the read port of ``buf`` (``"rd_x"``, ...)."""
        if buf not in READ_BUFFERS:
            raise ValueError(f"buffer {buf!r} has no read port")
        return f"rd_{Buffer(buf).name.lower()}"

    # ------------------------------------------------------------------------- shared construction
    def _read_ports(self) -> list:
        return [getattr(self, f"rd_{b.name.lower()}") for b in READ_BUFFERS]

    def _write_ports(self) -> list:
        return [getattr(self, f"wr_{b.name.lower()}") for b in WRITE_BUFFERS]

    def _sigmoid_roms(self, m: Module) -> list:
        """:data:`ROM_COPIES` copies of the sigmoid LUT ``{t0, d}`` (a dual-port block RAM each: Yosys turns a
        ROM with more read ports into logic), submodules ``sigmoid_rom<j>``."""
        roms = [Memory(shape=self._rom_layout, depth=1 << self._seg, init=self._rom_init)
                for _ in range(self.ROM_COPIES)]
        for j, rom in enumerate(roms):
            m.submodules[f"sigmoid_rom{j}"] = rom
        return roms

    def _select(self, m: Module, buf, name: str) -> Signal:
        """The read port data of buffer ``buf`` (0 for a buffer without a read port)."""
        rd_ports = self._read_ports()
        out = Signal(INT32, name=name)
        with m.Switch(buf):
            for j, b in enumerate(READ_BUFFERS):
                with m.Case(b):
                    m.d.comb += out.eq(rd_ports[j].data)
        return out

    def _entry(self, m: Module, adv) -> SimpleNamespace:
        """The entry, :data:`~hw.epilogue_stage.ENTRY_LATENCY` - 1 registers ``E0 .. E3`` advancing while
        ``adv``: input register, dequantization product, the shift in two steps, rounding and ``sat32``.

        The caller drives ``admit`` (the input is accepted while ``adv & admit``) and the read ports, and loads
        its stage 0 input from ``entry`` (the values of ``r0..r3``, ``index`` and ``last``, in the order of
        :meth:`~hw.epilogue_stage.Elem.pairs`) when ``v3``. Returns a namespace with ``admit``, the elements
        ``e0`` and ``e2`` (for the read addresses), the valid bits ``v1``, ``v2a``, ``v2``, ``v3`` (of the
        registers after E0, E1, E2a, E2b) and ``entry``.
        """
        cfg = self.cfg
        dq_zero, dq_neg = Signal(reset_less=True), Signal(reset_less=True)
        dq_lsh, dq_rsh0 = Signal(range(33), reset_less=True), Signal(reset_less=True)
        dq_rshm1 = Signal(range(62), reset_less=True)
        sh = cfg.s_shift
        m.d.sync += [dq_zero.eq(sh > 62), dq_neg.eq(sh < 0), dq_lsh.eq(Mux(-sh > 32, 32, -sh)),
                     dq_rsh0.eq(sh <= 0), dq_rshm1.eq(Mux((sh > 0) & (sh <= 62), sh - 1, 0))]

        in_lay = input_layout(self._index_bits)
        e0, v0 = Signal(in_lay, reset_less=True), Signal()
        admit = Signal()  # folded: the ring slot this element will enter is free; pipelined: always
        m.d.comb += self.i.ready.eq(adv & admit)
        with m.If(adv):
            m.d.sync += v0.eq(self.i.valid & admit)
            m.d.sync += load(self.i.valid, [(e0, self.i.payload)])

        # E1: dequantization product; buffer data arrives
        e1, v1 = Signal(in_lay, reset_less=True), Signal()
        p1 = Signal(signed(self._acc_bits + 28), reset_less=True)
        with m.If(adv):
            m.d.sync += v1.eq(v0)
            m.d.sync += load(v0, [(e1, e0), (p1, e0.value[:self._acc_bits].as_signed() * cfg.s_mant)])

        # E2a: the right shift of ``p1 >> s_shift`` by its multiple of 8, and sat32 of ``p1`` for a left shift
        e2a, v2a = Signal(in_lay, reset_less=True), Signal()
        p2a = Signal(signed(len(p1)), reset_less=True)     # p1 >> (dq_rshm1 & ~7)
        p1s = Signal(INT32, reset_less=True)                # sat32(p1); dq_lsh <= 32: no 95-bit shifter
        with m.If(adv):
            m.d.sync += v2a.eq(v1)
            m.d.sync += load(v1, [(e2a, e1), (p2a, p1 >> Cat(Const(0, 3), dq_rshm1[3:])), (p1s, sat32(p1))])

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
        with m.If(adv):
            m.d.sync += v2.eq(v2a)
            m.d.sync += load(v2a, [(e2, e2a), (q2, q_next), (inc2, inc_next)])

        # E3: the rounding increment and sat32
        e3, v3 = Signal(in_lay, reset_less=True), Signal()
        r0_3 = Signal(INT32, reset_less=True)
        with m.If(adv):
            m.d.sync += v3.eq(v2)
            m.d.sync += load(v2, [(e3, e2), (r0_3, Mux(cfg.raw, e2.value, sat32_inc(q2, inc2)))])

        # stage 0 input: the register file (in the order of Elem.pairs: r0..r3, index, last)
        entry = [r0_3, e3.value, 0, 0, e3.index, e3.last]
        return SimpleNamespace(admit=admit, e0=e0, e2=e2, v1=v1, v2a=v2a, v2=v2, v3=v3, entry=entry)

    def _exit(self, m: Module, adv, sink: SimpleNamespace) -> None:
        """Buffer writes, logits and argmax of the element at the sink, and the global enable ``adv`` (no
        logits backpressure). ``sink``: ``v``/``index`` the element's valid bit and index; ``wr_en``,
        ``wr_data`` per write port; ``out``/``out_en`` the logit and whether the program streams one;
        ``am``/``am_en`` the ARGMAX value and whether it counts."""
        stall = sink.v & sink.out_en & ~self.logits.ready
        fire = Signal()
        m.d.comb += [adv.eq(~stall), fire.eq(sink.v & adv),
                     self.logits.valid.eq(sink.v & sink.out_en), self.logits.payload.eq(sink.out)]
        for data_k, en_k, p in zip(sink.wr_data, sink.wr_en, self._write_ports(), strict=True):
            m.d.comb += [p.addr.eq(sink.index), p.data.eq(data_k), p.en.eq(fire & en_k)]

        am_seen = Signal()
        with m.If(fire & sink.am_en):
            m.d.sync += am_seen.eq(1)
            with m.If(~am_seen | (sink.am > self.argmax_value)):
                m.d.sync += [self.argmax_index.eq(sink.index), self.argmax_value.eq(sink.am)]
        with m.If(self.start):
            m.d.sync += am_seen.eq(0)

    def _fold(self, m: Module, adv, leaving, dcs: list, accs: list, sats: list, fins: list, last_k=None) -> None:
        """The fold of the accumulators into ``regs``, ``done`` and ``start``'s clears.

        Slot ``k``'s accumulator ``accs[k]`` (saturated: ``sats[k]``) goes into ``regs[reg]`` once it is final
        (``fins[k]``): a slot without a reduction (decoded in ``dcs[k]``) is passed in a cycle; one with a
        reduction takes three (select; low halves; high halves and the write). ``leaving``: the last element
        leaves (with ``adv``). ``last_k``: the last executed slot (folded; slots beyond it never reduce), or
        None (every slot is folded)."""
        cfg = self.cfg
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
        k_next = k + 1 if last_k is None else Mux(k >= last_k, MAX_OPS, k + 1)
        with m.Switch(ph):
            with m.Case(0):
                with m.If(busy & (k < MAX_OPS) & fin_k):
                    with m.If(ssq_k | amax_k):
                        m.d.sync += [cur.eq(Array(rg)[reg_k]), acc_f.eq(Mux(Array(sats)[k], U64_MAX, Array(accs)[k])),
                                     ssq_f.eq(ssq_k), reg_f.eq(reg_k), ph.eq(1)]
                    with m.Else():
                        m.d.sync += k.eq(k_next)
            with m.Case(1):
                lo = cur[:32] + acc_f[:32]
                m.d.sync += [lo_f.eq(lo[:32]), c_f.eq(lo[32]), hgt_f.eq(acc_f[32:] > cur[32:]),
                             heq_f.eq(acc_f[32:] == cur[32:]), lgt_f.eq(acc_f[:32] > cur[:32]), ph.eq(2)]
            with m.Case(2):
                hi = add_cin(cur[32:], acc_f[32:], c_f)
                new = Mux(ssq_f, Mux(hi[32], U64_MAX, Cat(lo_f, hi[:32])),     # saturating sum (SSQ)
                          Mux(hgt_f | (heq_f & lgt_f), acc_f, cur))              # maximum (AMAX)
                for j in range(8):
                    with m.If(reg_f == j):
                        m.d.sync += rg[j].eq(new)
                m.d.sync += [k.eq(k_next), ph.eq(0)]
        m.d.comb += self.done.eq(busy & (k == MAX_OPS) & last_out)
        with m.If(self.done):
            m.d.sync += busy.eq(0)

        with m.If(self.start):
            m.d.sync += [busy.eq(1), last_out.eq(0), k.eq(0), ph.eq(0)]
            for j in range(8):
                clear = [(s < cfg.n_ops) & ((op.op == M.SSQ) | (op.op == M.AMAX)) & (op.reg == j)
                         for s, op in ((s, cfg.ops[s]) for s in range(MAX_OPS))]
                with m.If(Cat(*clear).any()):
                    m.d.sync += rg[j].eq(0)
