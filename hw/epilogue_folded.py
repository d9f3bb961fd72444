"""The folded epilogue: one micro-op stage closed into a ring, an element every ``max(n_ops, 1)`` cycles.

The entry of :class:`hw.epilogue_base.EpilogueBase`, then one stage (:func:`hw.epilogue_stage.stage`) whose
output register feeds its input again: every element passes it once per micro-op slot, at an eighth of the
pipelined form's stage multipliers, registers and logic (the ECP5 builds).
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Const, Module, Mux, Signal, Value

from hw.epilogue_arith import INT32
from hw.epilogue_base import EpilogueBase
from hw.epilogue_stage import ENTRY_LATENCY, STAGE_LATENCY, WRITE_BUFFERS, Elem, decode, last_true, reducer, stage
from hw.isa import MAX_OPS, Buffer

__all__ = ["FoldedEpilogue"]


class FoldedEpilogue(EpilogueBase):
    """The epilogue with one micro-op stage that every element passes once per micro-op slot (a ring).

    Parameters, ports and the entry as :class:`~hw.epilogue_base.EpilogueBase`.

    Notes
    -----
    The entry, then one stage (submodule ``stage0``; the eight slots' decodes in submodule ``decode``) closed
    into a ring of ``STAGE_LATENCY + 1`` registers (c0..c9 and the stage's output c10). An element in c10 with
    slots left re-enters c0 for slot ``k + 1``; otherwise c0 takes the entry's element. The input is accepted
    only when the ring slot it will reach after the entry's six advances (the one now in c5) is empty or in its
    last pass, so the two never meet. Each cycle's decoded fields are registers loaded from slot ``k``'s decode
    as the element moves in. Buffers are read in the cycle before c10 (looping) or before E3 (entering),
    ST/OUT/ARGMAX act in c1 (a read after a store is rejected by the image checks either way, docs/ISA.md);
    only the program's last OUT streams and its last ARGMAX counts, as in the pipelined form. One accumulator
    per slot, folded into ``regs`` as soon as the last element has left that slot's pass.

    Latency :meth:`latency_for` (``done`` follows by one to two cycles, up to four when the last micro-op slot
    reduces), interval ``max(n_ops, 1)`` on average (the ring holds ``STAGE_LATENCY + 1`` elements, each for
    ``max(n_ops, 1)`` passes: up to 11 enter back to back, then the ring is full for the rest of their
    passes), :data:`MULTIPLIERS` 3, one ROM copy.
    """

    FOLDED = True
    ROM_COPIES = 1
    MULTIPLIERS = 3
    INTERVAL = MAX_OPS
    #: Cycles of one pass of the ring, c0..c10 (``host.perf.FOLDED_PASS_CYCLES``)
    PASS_CYCLES = STAGE_LATENCY + 1
    #: The constant part of :meth:`latency_for`: an element's first c0 is ``ENTRY_LATENCY`` cycles after its
    #: transfer, and it leaves at its last pass's c9, two cycles before that pass ends
    #: (``host.perf.FOLDED_ENTRY_LATENCY``)
    LATENCY_BASE = ENTRY_LATENCY - 2
    #: :meth:`latency_for` a program of :data:`~hw.isa.MAX_OPS` micro-ops
    LATENCY = LATENCY_BASE + MAX_OPS * PASS_CYCLES

    @staticmethod
    def passes(n_ops: int) -> int:
        """Passes of an element through the ring for a program of ``n_ops`` micro-ops: ``max(n_ops, 1)``, at
        most :data:`~hw.isa.MAX_OPS` (slots beyond are NOPs); also the average cycles per element."""
        return max(min(n_ops, MAX_OPS), 1)

    @classmethod
    def latency_for(cls, n_ops: int) -> int:
        """``LATENCY_BASE + passes(n_ops) * PASS_CYCLES``: from the input transfer to the last pass's c9, where
        the element leaves (its c0 is ``ENTRY_LATENCY`` cycles after the transfer, each pass 11)."""
        return cls.LATENCY_BASE + cls.passes(n_ops) * cls.PASS_CYCLES

    def elaborate(self, platform):
        m = Module()
        roms = self._sigmoid_roms(m)
        ib = self._index_bits
        cfg = self.cfg
        adv = Signal()  # the whole pipeline moves (no logits backpressure)
        m.submodules.stage0 = sm = Module()
        m.submodules.decode = dec = Module()
        dcs = [decode(dec, cfg, s, self._seg) for s in range(MAX_OPS)]
        ent = self._entry(m, adv)
        e_in, v_in = Elem("e_in", ib, True), Signal()
        val0 = Signal(INT32, reset_less=True)

        # --------------------------------------------------------------------------------- the ring
        # An element leaving its c9 (into c10, ``eo``) re-enters c0 for its next micro-op slot while it has one
        # (``loop``); otherwise c0 takes the entry's element. The ring has STAGE_LATENCY + 1 = 11 registers; an
        # element accepted now reaches c0 after ENTRY_LATENCY = 6 advances, when the ring slot now in c5 gets
        # there: it is admitted only if that slot is empty or its element is in its last pass (it leaves at
        # c10 instead of looping).
        last_k = Signal(range(MAX_OPS), reset_less=True)   # the last slot: max(n_ops, 1) - 1 (NOPs beyond 8)
        m.d.sync += last_k.eq(Mux(cfg.n_ops == 0, 0, Mux(cfg.n_ops > MAX_OPS, MAX_OPS - 1, cfg.n_ops - 1)))
        loop, k_in = Signal(), Signal(range(MAX_OPS))
        st = stage(sm, 0, dcs, e_in, v_in, val0, roms[0].read_port(), adv, seg=self._seg, index_bits=ib, k_in=k_in)
        es, vs, eo, vo = st.es, st.vs, st.eo, st.vo
        m.d.comb += [loop.eq(vo & (eo.k != last_k)), k_in.eq(Mux(loop, eo.k + 1, 0)),
                     ent.admit.eq(~(vs[5] & (es[5].k != last_k)))]
        with m.If(adv):
            m.d.sync += v_in.eq(loop | ent.v3)
            m.d.sync += [dst.eq(Mux(loop, src_l, Mux(ent.v3, src_e, dst)))
                         for (dst, src_l), src_e in zip(e_in.pairs(eo)[:6], ent.entry, strict=True)]
            m.d.sync += e_in.k.eq(k_in)
        # buffer operands: every pass reads the buffer of the slot it executes, at the element's index, as the
        # element moves into the ring's c10 (looping) or into E3 (entering), one cycle ahead of c0; the two
        # never both enter c0
        loop9 = Signal()
        m.d.comb += loop9.eq(vs[9] & (es[9].k != last_k))
        bufs = [Value.cast(dc["buf"]) for dc in dcs]
        nbuf = Signal(len(bufs[0]), name="next_buf", reset_less=True)
        with m.If(adv):
            m.d.sync += nbuf.eq(Mux(loop9, Array([*bufs[1:], Const(Buffer.NONE.value, len(nbuf))])[es[9].k],
                                    bufs[0]))
        for p in self._read_ports():
            m.d.comb += [p.addr.eq(Mux(loop9, es[9].index, ent.e2.index)), p.en.eq(adv)]
        with m.If(adv):
            m.d.sync += val0.eq(self._select(m, nbuf, "rd_next"))

        # reductions: one accumulator per micro-op slot, fed by the passes that execute it; final (``fin``)
        # once the last element has left that slot's pass (elements pass every slot in order)
        e9, v9, f = es[9], vs[9], st.field
        accs, sats, fins = [], [], []
        for s in range(MAX_OPS):
            here = adv & v9 & (e9.k == s)
            acc, sat, cy = reducer(sm, f"slot{s}", self.start, here & f(9, "ssq"), st.pb, here & f(9, "amax"),
                                   st.mag)
            fin0 = Signal(name=f"slot{s}_fin0")
            with sm.If(here & e9.last):
                sm.d.sync += fin0.eq(1)
            with sm.If(self.start):
                sm.d.sync += fin0.eq(0)
            accs.append(acc)
            sats.append(sat)
            fins.append(fin0 & ~cy)
        self._stage_accs = accs  # white-box access for the saturation test (tests/hw/test_epilogue.py)

        def last_slot(name, cond):
            """The last slot whose decoded ``cond`` holds (as the pipelined form's exit takes the last stage's
            value: only the program's last OUT streams, only its last ARGMAX counts)."""
            sel_c, _ = last_true(m, f"{name}_slot", [dc[cond] for dc in dcs])
            sel = Signal(range(MAX_OPS), name=f"{name}_slot")
            m.d.sync += sel.eq(sel_c)
            return sel

        # ST, OUT and ARGMAX act in the pass's c1
        self._exit(m, adv, SimpleNamespace(
            v=vs[1], index=es[1].index, wr_en=[f(1, "st") & (f(1, "buf") == buf) for buf in WRITE_BUFFERS],
            wr_data=[st.a1] * len(WRITE_BUFFERS), out=st.a1, out_en=f(1, "out") & (es[1].k == last_slot("out", "out")),
            am=st.a1, am_en=f(1, "argmax") & (es[1].k == last_slot("am", "argmax"))))
        self._fold(m, adv, v9 & e9.last & (e9.k == last_k), dcs, accs, sats, fins, last_k=last_k)
        return m
