"""The pipelined epilogue: :data:`~hw.isa.MAX_OPS` micro-op stages in a row, one element per cycle.

Stage ``s`` executes ``ops[s]`` (NOP beyond ``n_ops``). Buffer operands are read once, at the entry (one read
port per buffer, address = element index); ST values are written at the exit. The compiler guarantees that
each buffer is read by at most one micro-op and written by at most one, so this is equivalent to the golden
device's in-order semantics (docs/RTL.md).

The pipeline advances in lockstep (one global enable), so a value needed a fixed number of advances later goes
through a small delay memory (:func:`hw.epilogue_stage.delay_line`: written at every advance at a shared
pointer, read at a fixed offset behind it): each stage's buffer operand from the entry to the stage, and the
ST, OUT and ARGMAX values from the stage that produces them (a property of the program) to the exit.
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Const, Module, Signal

from hw.epilogue_arith import INT32
from hw.epilogue_base import EpilogueBase
from hw.epilogue_stage import (
    DELAY_DEPTH,
    ENTRY_LATENCY,
    STAGE_LATENCY,
    WRITE_BUFFERS,
    Elem,
    decode,
    delay_line,
    last_true,
    load,
    reducer,
    stage,
)
from hw.isa import MAX_OPS

__all__ = ["PipelinedEpilogue"]


class PipelinedEpilogue(EpilogueBase):
    """The epilogue with one micro-op stage per slot: an element every cycle.

    Parameters, ports and the entry as :class:`~hw.epilogue_base.EpilogueBase`.

    Notes
    -----
    Structure: the entry, then one submodule ``stage<s>`` per micro-op slot, of
    :data:`~hw.epilogue_stage.STAGE_LATENCY` cycles (:func:`hw.epilogue_stage.stage`): (c0) operand and
    buffer-operand select, SIGNEG's negation, the adder ALU's exact sum (ADD, SUB, ADDV, RSUB1; LD); (c1) the
    sigmoid input clamp and LUT address, ``sat32`` of the sum; (c2) LUT data ``{t0, d = t1 - t0}``, operands of
    product A, ``t0`` (+ ``d``); (c3, c4) product A (``a*b``, ``a*buf`` or ``d*frac``): four 16 x 16 partial
    products, then their sum; (c5) the rounding shift (``shift`` or the segment step) and the rounding bit;
    (c6) the increment with ``sat32``, or ``t0 + correction``; operands of product B; (c7, c8) product B
    (SiLU's ``a*sigmoid(a)``, SSQ's ``w*w``) likewise; (c9) result into ``r[dst]``, SSQ/AMAX into the stage's
    64-bit accumulator (SSQ in two 32-bit halves, the carry between them one cycle later). Delay memories
    (128 words of 32 bits): one per stage 1..7 for its buffer operand, one per write port, one for OUT and
    one for ARGMAX.

    Latency :data:`LATENCY` = ``ENTRY_LATENCY + MAX_OPS * STAGE_LATENCY`` = 86 cycles from an element's
    input transfer to the exit cycle where its writes and logit are presented, whatever ``n_ops``;
    throughput one element per cycle; a logits stall freezes the whole pipeline (one global enable, which
    also drives the read ports' ``en``). ``done`` follows the last element's exit by one to two cycles.

    Resources: :data:`MULTIPLIERS` (17: one ``acc_bits x 27``, two ``32 x 32`` per stage, each of those as
    four 16 x 16 partial products: 68 MULT18X18D in Yosys ``synth_ecp5``) and :attr:`lut_rom`: four copies
    of the sigmoid ROM (``2**lut_segments_log2`` words of ``{t0, d}``, 53 bits for the default: 3 RAMB18E1
    each in Yosys ``synth_xilinx``), two stages sharing a copy's two read ports.
    """

    FOLDED = False
    ROM_COPIES = (MAX_OPS + 1) // 2
    MULTIPLIERS = 1 + 2 * MAX_OPS
    INTERVAL = 1
    #: Cycles from an element's input transfer to its exit (writes and logit presented), unstalled, for any
    #: program: ``ENTRY_LATENCY + MAX_OPS * STAGE_LATENCY`` = 86 (``host.perf.EPILOGUE_LATENCY``)
    LATENCY = ENTRY_LATENCY + MAX_OPS * STAGE_LATENCY

    @classmethod
    def latency_for(cls, n_ops: int) -> int:
        """:data:`LATENCY` whatever ``n_ops`` (every element passes every stage)."""
        return cls.LATENCY

    def elaborate(self, platform):
        m = Module()
        roms = self._sigmoid_roms(m)
        ib = self._index_bits
        adv = Signal()  # the whole pipeline moves (no logits backpressure)
        # the delay memories' write pointer: one step per advance of the lockstep pipeline
        wp = Signal(range(DELAY_DEPTH))
        with m.If(adv):
            m.d.sync += wp.eq(wp + 1)

        stage_mods = [Module() for _ in range(MAX_OPS)]
        for s, sm in enumerate(stage_mods):
            m.submodules[f"stage{s}"] = sm
        dcs = [decode(sm, self.cfg, s, self._seg) for s, sm in enumerate(stage_mods)]

        ent = self._entry(m, adv)
        m.d.comb += ent.admit.eq(1)
        for p in self._read_ports():
            m.d.comb += [p.addr.eq(ent.e0.index), p.en.eq(adv)]
        # each stage's buffer operand, selected from the read ports at E2a: stage 0's into registers along the
        # entry, the others' into their delay memories (read as the element enters the stage)
        rd_sel = [self._select(m, dcs[s]["buf"], f"rd_sel{s}") for s in range(MAX_OPS)]
        rd2a = Signal(INT32, reset_less=True)
        rd2 = Signal(INT32, reset_less=True)
        rd3 = Signal(INT32, reset_less=True)
        e_in, v_in = Elem("e_in", ib), Signal()
        val0 = Signal(INT32, reset_less=True)
        with m.If(adv):
            m.d.sync += load(ent.v1, [(rd2a, rd_sel[0])])
            m.d.sync += load(ent.v2a, [(rd2, rd2a)])
            m.d.sync += load(ent.v2, [(rd3, rd2)])
            m.d.sync += v_in.eq(ent.v3)
            m.d.sync += load(ent.v3, [*zip([*e_in.r, e_in.index, e_in.last], ent.entry, strict=True), (val0, rd3)])
        # stage s's operand, selected at E2, arrives STAGE_LATENCY * s advances after stage 0's
        vals = [val0] + [delay_line(m, f"rd_delay{s}", wp, adv, 3 + STAGE_LATENCY * s, rd_sel[s])
                         for s in range(1, MAX_OPS)]

        # ---------------------------------------------------------------------------------- stages
        avals, accs, sats, fins = [], [], [], []
        for s in range(MAX_OPS):
            sm = stage_mods[s]
            st = stage(sm, s, dcs, e_in, v_in, vals[s], roms[s // 2].read_port(), adv, seg=self._seg, index_bits=ib)
            e9, v9, f = st.es[9], st.vs[9], st.field
            acc, sat, cy = reducer(sm, f"s{s}", self.start, adv & v9 & f(9, "ssq"), st.pb, adv & v9 & f(9, "amax"),
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
        self._stage_accs = accs  # white-box access for the saturation test (tests/hw/test_epilogue.py)

        # ------------------------------------------ ST, OUT and ARGMAX values: delay memories to the exit
        def sink(name, conds):
            """The value of operand ``a`` of the last stage whose ``conds`` holds, delayed from that stage's
            second cycle (its register ``a1``) to the exit; and whether any stage's holds (a property of the
            program)."""
            sel_c, en_c = last_true(m, f"{name}_stage", conds)
            sel = Signal(range(MAX_OPS), name=f"{name}_stage", reset_less=True)
            en = Signal(name=f"{name}_en", reset_less=True)
            offset = Signal(range(DELAY_DEPTH), name=f"{name}_delay", reset_less=True)
            # the delay from stage s's a1 to the exit (a table: no multiplier)
            delays = Array([Const(MAX_OPS * STAGE_LATENCY - 2 - s * STAGE_LATENCY, range(DELAY_DEPTH))
                            for s in range(MAX_OPS)])
            m.d.sync += [sel.eq(sel_c), en.eq(en_c), offset.eq(delays[sel_c])]
            src = Signal(INT32, name=f"{name}_src")
            m.d.comb += src.eq(Array(avals)[sel])
            return delay_line(m, f"{name}_delay", wp, adv, offset, src), en

        wr = [sink(f"wr_{buf.name.lower()}", [dc["st"] & (dc["buf"] == buf) for dc in dcs]) for buf in WRITE_BUFFERS]
        out, out_en = sink("out", [dc["out"] for dc in dcs])
        am, am_en = sink("am", [dc["argmax"] for dc in dcs])
        # the exit: writes, logit and argmax of the element leaving the last stage
        self._exit(m, adv, SimpleNamespace(v=vx, index=ex.index, wr_en=[en_k for _, en_k in wr],
                                           wr_data=[data_k for data_k, _ in wr], out=out, out_en=out_en,
                                           am=am, am_en=am_en))
        self._fold(m, adv, vx & ex.last, dcs, accs, sats, fins)
        return m
