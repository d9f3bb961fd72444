"""The accelerator core: streams in a token packet and the model image, runs the token, streams out the
output packet; AXI4-Lite registers for the ID block, status and counters.

:class:`Accelerator` is a composition of components joined by ``connect`` (docs/RTL.md, "Composition"):
channel 0's reader (:class:`hw.fetch.Channel0Reader`: a word serializer for the token packet and the image
header, whole beats for the program), the instruction fetcher and checker (:class:`hw.fetch.InstructionFetcher`,
one instruction ahead of execution), the sequencer (:class:`hw.sequencer.Sequencer`, with
:class:`hw.sequencer.EpilogueFeed`), the output framer (:class:`hw.framer.OutputFramer`), the counters
(:class:`hw.counters.Counters`) and the register block (:class:`hw.regs.RegisterBlock`), around the datapath:
ScalarUnit -> Quantizer -> per channel TritGearbox -> TernaryGemv, rows merged in order into the Epilogue,
with its vector buffers. Every width comes from the build (:class:`hw.params.BuildParams`). The AXI names
(``tdata``/``tvalid``/``tready``/``tlast``) appear only at the boundary (:class:`hw.streams.AXIStreamReceiver`,
:class:`hw.streams.AXIStreamSender`); inside, streams are ``lib.stream``.

Stream protocol per token: channel 0 carries the token packet (its last beat with ``tlast``) then the
image (``tlast`` on its last beat); channel ``c > 0`` carries its weight blocks (``tlast`` on the last).
"""

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out, connect
from amaranth.utils import ceil_log2

from hw import isa
from hw.counters import Counters
from hw.crc_pipe import BlockCrc
from hw.epilogue import Epilogue
from hw.fetch import (
    Channel0Reader,
    InstructionFetcher,
    WeightFifo,
    block_rows,
    block_sections,
    channel_rows,
    const_bank_depth,
)
from hw.framer import OutputFramer
from hw.gearbox import TritGearbox
from hw.gemv import TernaryGemv
from hw.isa import Buffer
from hw.params import BuildParams
from hw.quant import Quantizer
from hw.regs import AXI4LiteSignature, RegisterBlock
from hw.scalar import ScalarUnit
from hw.sequencer import EpilogueFeed, Sequencer
from hw.state_cache import STATE_BEAT_BITS, StateCache, StateCmd, touches_state
from hw.streams import AXIStreamReceiver, AXIStreamSender, AXIStreamSignature, code_word_layout
from hw.vbuf import VectorBuffer

__all__ = ["AXIStreamSignature", "Accelerator", "block_rows", "channel_rows", "block_sections"]

INT32 = signed(32)
#: default depth of channel 0's weight FIFO in beats (hw.params.BuildParams.weight_fifo_beats)
WEIGHT_FIFO_BEATS = BuildParams.weight_fifo_beats


def _pow2(v: int) -> int:
    return 1 << ceil_log2(max(v, 1))


class Accelerator(wiring.Component):
    """The whole core (one token per pass over the image).

    Parameters
    ----------
    build : hw.params.BuildParams, optional
        The build (default ``BuildParams()``): its gateware parameters (:data:`hw.params.GATEWARE_FIELDS`:
        lanes, channels, bus width, quantize lanes, packing, buffer capacities, sigmoid LUT size, channel 0's
        weight FIFO depth, the folded epilogue, ``token_tlast``/``image_tlast`` framing) and their limits
        (:meth:`hw.params.BuildParams.check_gateware`) are documented there. ``epilogue_folded``: one
        micro-op stage that each element passes once per micro-op (:class:`hw.epilogue.Epilogue` ``folded``,
        the ECP5 builds), bit-identical results, ``ID_EPILOGUE`` says which form a build has. With
        ``token_tlast`` the token packet's size is checked by ``tlast`` (``TOKEN_LENGTH``), else by its
        ``length`` field alone; with ``image_tlast`` END_TOKEN's header must carry it (``BAD_SHAPE``: bytes
        after the program); docs/ISA.md section 5.
    **kw
        Instead of ``build``: its fields as keywords (``Accelerator(lanes=32, quant_lanes=4)`` is
        ``Accelerator(BuildParams(lanes=32, quant_lanes=4))``).

    Attributes
    ----------
    s_axis_w0 .. : In(AXIStreamSignature(bus_bits))
        Weight channels (received).
    m_axis_out : Out(AXIStreamSignature(32))
        Output packets (sent).
    s_axil : AXI4LiteSignature
    irq : Out(1)
        Token done or error (level, until the next token starts or ``CTRL.clear``).
    state_cmd : Out(stream.Signature(hw.state_cache.StateCmd)); m_axis_state : Out(AXIStreamSignature(64));
    s_axis_state : In(AXIStreamSignature(64))
        Only with ``state_in_dram``: the recurrent state's row transfers to and from board DRAM
        (:class:`hw.state_cache.StateCache`, served by :class:`hw.boards.dram_board.DRAMBoard`).
    """

    def __init__(self, build: BuildParams | None = None, **kw):
        if build is not None and kw:
            raise TypeError("pass a BuildParams or keyword parameters, not both")
        if build is None:
            build = BuildParams.from_mapping(kw)
        elif not isinstance(build, BuildParams):
            raise TypeError(f"build must be a hw.params.BuildParams, got {build!r}")
        build.check_gateware()
        self.build = build
        # the parameters elaborate() reads, as attributes
        self.lanes, self.channels, self.bus_bits = build.lanes, build.channels, build.bus_bits
        self.quant_lanes, self.packing = build.quant_lanes, build.packing
        self.max_hidden, self.max_intermediate, self.max_layers = \
            build.max_hidden, build.max_intermediate, build.max_layers
        self.lut_segments_log2 = build.lut_segments_log2
        self.weight_fifo_beats = build.weight_fifo_beats
        self.epilogue_folded = build.epilogue_folded
        self.token_tlast, self.image_tlast = build.token_tlast, build.image_tlast
        self.max_k = max(build.max_hidden, build.max_intermediate)
        bus_bits, channels = build.bus_bits, build.channels
        members = {f"s_axis_w{c}": In(AXIStreamSignature(bus_bits)) for c in range(channels)}
        members["m_axis_out"] = Out(AXIStreamSignature(32))
        members["s_axil"] = Out(AXI4LiteSignature(addr_width=8))
        members["irq"] = Out(1)
        self.state_in_dram = build.state_in_dram
        if build.state_in_dram:
            members["state_cmd"] = Out(stream.Signature(StateCmd))
            members["m_axis_state"] = Out(AXIStreamSignature(STATE_BEAT_BITS))
            members["s_axis_state"] = In(AXIStreamSignature(STATE_BEAT_BITS))
        super().__init__(members)

    def id_values(self) -> dict:
        """The ID block's values: :meth:`hw.params.BuildParams.id_values`."""
        return self.build.id_values()

    # ------------------------------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        C = self.channels
        lpc = self.lanes // C
        # ---- the AXI boundary: streams inside
        rx = []
        for c in range(C):
            m.submodules[f"axis_w{c}"] = r = AXIStreamReceiver(self.bus_bits)
            connect(m, wiring.flipped(getattr(self, f"s_axis_w{c}")), r.axis)
            rx.append(r.o)
        m.submodules.axis_out = tx = AXIStreamSender(32)
        connect(m, tx.axis, wiring.flipped(self.m_axis_out))
        m.submodules.regs = regs = RegisterBlock(id_values=self.id_values())
        connect(m, wiring.flipped(self.s_axil), regs.axil)

        buf = self._buffers(m)
        # ---- control: channel 0's reader, the fetcher, the sequencer, the output framer, the counters
        m.submodules.reader = reader = Channel0Reader(bus_bits=self.bus_bits)
        m.submodules.fetcher = fetcher = InstructionFetcher(
            packing=self.packing, channels=C, bus_bits=self.bus_bits, max_hidden=self.max_hidden,
            max_intermediate=self.max_intermediate, max_layers=self.max_layers,
            lut_segments_log2=self.lut_segments_log2, image_tlast=self.image_tlast,
            const_write=buf["c"][0].wr_wide.signature, qc_write=buf["qc"].wr_wide.signature)
        m.submodules.sequencer = seq = Sequencer(
            channels=C, packing=self.packing, max_hidden=self.max_hidden, max_intermediate=self.max_intermediate,
            max_layers=self.max_layers, lut_segments_log2=self.lut_segments_log2, token_tlast=self.token_tlast,
            tok_write=buf["token"].wr.signature, state_in_dram=self.state_in_dram)
        m.submodules.counters = counters = Counters(channels=C, lanes=lpc)
        connect(m, rx[0], reader.i)
        connect(m, seq.reader, reader.seq)
        connect(m, fetcher.reader, reader.fetch)
        connect(m, seq.fetch, fetcher.ctrl)
        connect(m, seq.host, regs.host)
        connect(m, seq.events, counters.events)
        connect(m, counters.values, regs.counters)
        # the counters under the names the Verilated harness reads (host/devices/rtl_harness/public.vlt)
        for c in isa.Counter:
            tap = Signal(64, name=f"counter_{c.name.lower()}")
            m.d.comb += tap.eq(getattr(counters.values, c.name.lower()))
        connect(m, seq.tok_wr, buf["token"].wr)
        for j, b in enumerate(buf["c"]):
            connect(m, fetcher.const_wr[j], b.wr_wide)
        connect(m, fetcher.qc_wr, buf["qc"].wr_wide)
        m.d.comb += [self.irq.eq(seq.irq), counters.beats.eq(sum(s.valid & s.ready for s in rx))]

        dp = self._datapath(m, seq.soft_rst)
        epi, gear, gemv = dp["epilogue"], dp["gear"], dp["gemv"]
        m.submodules.feed = feed = EpilogueFeed(channels=C, acc_bits=gemv[0].o.payload.acc.shape().width,
                                                element=epi.i.payload.shape(), tok_read=buf["token"].rd.signature)
        m.submodules.framer = framer = OutputFramer(index_bits=len(epi.argmax_index))
        connect(m, seq.feed, feed.ctrl)
        connect(m, feed.tok_rd, buf["token"].rd)
        connect(m, feed.o, epi.i)
        for c in range(C):
            connect(m, gemv[c].o, feed.rows[c])
            connect(m, seq.gear_cmd[c], gear[c].cmd)
        connect(m, seq.framer, framer.ctrl)
        connect(m, epi.logits, framer.logits)
        connect(m, framer.o, tx.i)
        connect(m, seq.scalar, dp["scalar"].i)
        connect(m, dp["scalar"].o, seq.scalar_result)
        connect(m, seq.quant, dp["quant"].cmd)
        m.d.comb += [seq.quant_done.eq(dp["quant"].done), seq.epi_done.eq(epi.done), seq.epi_regs.eq(epi.regs),
                     epi.start.eq(seq.epi_start), epi.cfg.eq(seq.epi_cfg),
                     framer.argmax_index.eq(epi.argmax_index), framer.argmax_value.eq(epi.argmax_value),
                     regs.argmax.eq(epi.argmax_index),
                     counters.out_stall.eq(framer.stall), counters.elements.eq(epi.i.valid & epi.i.ready)]
        for c, g in enumerate(gear):
            tap = counters.chunks[c]
            m.d.comb += [tap.taken.eq(g.o.valid & g.o.ready), tap.trits.eq(g.o.payload.trits),
                         tap.count.eq(g.o.payload.count),
                         seq.lanes_valid[c].eq(g.o.valid), seq.lanes_ready[c].eq(g.o.ready),
                         seq.lanes_end[c].eq(g.o.payload.end), seq.bad_trit[c].eq(g.bad_trit)]

        self._weight_channels(m, rx, seq, fetcher, gear)
        self._buffer_ports(m, buf, seq, fetcher, dp)
        return m

    def _buffers(self, m) -> dict:
        """The vector buffers (X, A, P: the epilogue an element a cycle, the quantizer ``quant_lanes``), QC, the
        constant banks (beat-wide writes; two banks each, the executing instruction's and the next one's being
        prefetched, a whole number of 64-byte sections each), the token's vector, and the recurrent state (two
        banks; with ``state_in_dram`` one layer's rows, :class:`hw.state_cache.StateCache`)."""
        W, Q = self.bus_bits // 32, self.quant_lanes
        vmax = max(self.max_hidden, self.max_intermediate)
        buf = {"x": VectorBuffer(depth=self.max_hidden, banks=Q, read_group=Q),
               "a": VectorBuffer(depth=vmax, banks=Q, read_group=Q),
               "p": VectorBuffer(depth=vmax, banks=Q, read_group=Q),
               "qc": VectorBuffer(depth=self.max_k, banks=max(W, Q), write_group=W, read_group=Q)}
        for name, b in buf.items():
            m.submodules[f"buf_{name}"] = b
        cdepth = const_bank_depth(self.max_hidden, self.max_intermediate)
        buf["c"] = []
        for j in range(isa.MAX_CONSTS):
            m.submodules[f"buf_c{j}"] = b = VectorBuffer(depth=2 * cdepth, banks=W, write_group=W)
            buf["c"].append(b)
        m.submodules.buf_token = buf["token"] = VectorBuffer(depth=self.max_hidden, banks=1)
        if self.state_in_dram:
            m.submodules.state = buf["state"] = StateCache(max_hidden=self.max_hidden, max_layers=self.max_layers)
        else:
            m.submodules.state = buf["state"] = memory.Memory(
                shape=INT32, depth=2 * _pow2(self.max_layers) * _pow2(self.max_hidden), init=[])
        return buf

    def _datapath(self, m, soft_rst) -> dict:
        """ScalarUnit, Quantizer, Epilogue, and per channel TritGearbox -> TernaryGemv with its code memory (the
        quantizer's code words go to every channel's), each reset by ``soft_rst`` (error recovery)."""
        C, lpc = self.channels, self.lanes // self.channels

        def reset(elab):
            return ResetInserter({"sync": soft_rst})(elab)

        dp = {"scalar": ScalarUnit(), "quant": Quantizer(quant_lanes=self.quant_lanes, lanes=lpc, max_k=self.max_k),
              "epilogue": Epilogue(lut_segments_log2=self.lut_segments_log2, folded=self.epilogue_folded),
              "gear": [], "gemv": []}
        for name in ("scalar", "quant", "epilogue"):
            m.submodules[name] = reset(dp[name])
        code_writes = []
        for c in range(C):
            # gearbox 0 reads the weight FIFO, which holds decoded beats
            g = TritGearbox(packing=self.packing, bus_bits=self.bus_bits, lanes=lpc, predecoded=c == 0)
            e = TernaryGemv(lanes=lpc, max_k=max(self.max_k, lpc))
            cm = memory.Memory(shape=code_word_layout(lpc), depth=e.code_depth, init=[])
            m.submodules[f"gearbox{c}"] = reset(g)
            m.submodules[f"gemv{c}"] = reset(e)
            m.submodules[f"codes{c}"] = cm
            connect(m, g.o, e.i)
            connect(m, e.codes, cm.read_port())
            code_writes.append(cm.write_port())
            dp["gear"].append(g)
            dp["gemv"].append(e)
        connect(m, dp["quant"].codes, *code_writes)
        dp["wfifo"] = WeightFifo(packing=self.packing, bus_bits=self.bus_bits, depth=self.weight_fifo_beats)
        m.submodules.wfifo = reset(dp["wfifo"])
        return dp

    def _weight_channels(self, m, rx, seq, fetcher, gear):
        """Channel 0's weights: the fetcher -> the weight FIFO -> gearbox 0; channels > 0 feed their gearbox
        (or are drained). One CRC check per channel's weight block (:class:`hw.crc_pipe.BlockCrc`), at beat
        rate as the beats are taken (channel 0: into the FIFO; channel c > 0: into gearbox c); the sequencer acts
        on the verdicts once every channel's block is complete, after every trit was decoded (BAD_TRIT first)."""
        soft_rst = seq.soft_rst
        for c in range(self.channels):
            m.submodules[f"crc_wt{c}"] = chk = BlockCrc(self.bus_bits)
            m.d.comb += [chk.clear.eq(seq.wcrc_clear[c]), chk.preset.eq(seq.wcrc_preset[c]),
                         seq.wcrc_done[c].eq(chk.done), seq.wcrc_bad[c].eq(chk.bad)]
            if c == 0:
                connect(m, fetcher.wcrc, chk.i)
                continue
            # channel c > 0: its beats go to gearbox c (dropped while the sequencer drains the inputs)
            s, g = rx[c], gear[c]
            first = Signal(init=1, name=f"wfirst{c}")   # the next beat starts a block
            m.d.comb += [g.i.payload.data.eq(s.payload.data), g.i.valid.eq(s.valid & ~soft_rst),
                         s.ready.eq(g.i.ready | soft_rst),
                         chk.i.data.eq(s.payload.data), chk.i.valid.eq(g.i.valid & g.i.ready),
                         chk.i.start.eq(first), chk.i.last.eq(g.blk_last)]
            with m.If(chk.i.valid):
                m.d.sync += first.eq(g.blk_last)
            with m.If(soft_rst):
                m.d.sync += first.eq(1)

    def _buffer_ports(self, m, buf, seq, fetcher, dp):
        """The buffers' ports to the epilogue (an element a cycle; its read ports' addresses are element indices
        of the epilogue's ``index_bits``), to the quantizer (groups of ``quant_lanes``, the source selected by
        the instruction's ``src``), and the weight FIFO between the fetcher and gearbox 0."""
        epi, quant, wfifo = dp["epilogue"], dp["quant"], dp["wfifo"]
        connect(m, fetcher.weights, wfifo.i)
        connect(m, wfifo.o, dp["gear"][0].i)
        m.d.comb += [wfifo.enable.eq(seq.gear0_on), seq.fifo_taken.eq(wfifo.taken)]

        def read(port, b, offset=0):
            m.d.comb += [b.rd.addr.eq(port.addr + offset), b.rd.en.eq(port.en), port.data.eq(b.rd.data)]

        for name in ("x", "a", "p"):
            read(getattr(epi, f"rd_{name}"), buf[name])
            port, b = getattr(epi, f"wr_{name}"), buf[name]
            m.d.comb += [b.wr.addr.eq(port.addr), b.wr.data.eq(port.data), b.wr.en.eq(port.en)]
        cdepth = const_bank_depth(self.max_hidden, self.max_intermediate)
        for j, b in enumerate(buf["c"]):
            read(getattr(epi, f"rd_c{j}"), b, Mux(fetcher.xbank, cdepth, 0))
        self._state_ports(m, buf["state"], seq, fetcher, epi)
        # the quantizer's source: X, A or P by the instruction's src; QC from its buffer
        for code, b in ((Buffer.X, buf["x"]), (Buffer.A, buf["a"]), (Buffer.P, buf["p"])):
            with m.If(seq.src == code):
                m.d.comb += [b.rd_wide.addr.eq(quant.src.addr), b.rd_wide.en.eq(quant.src.en),
                             quant.src.data.eq(b.rd_wide.data)]
        connect(m, quant.qc, buf["qc"].rd_wide)

    def _state_ports(self, m, state, seq, fetcher, epi):
        """The recurrent state's ports to the epilogue: two banks of ``max_layers x max_hidden`` (the bank bit a
        plain address bit), or with ``state_in_dram`` the :class:`~hw.state_cache.StateCache` of one layer,
        which swaps rows at the dispatch of an instruction that touches another layer's state, through the
        ``state_cmd``/``m_axis_state``/``s_axis_state`` ports."""
        if self.state_in_dram:
            ih = seq.fetch.instr
            connect(m, epi.rd_state_old, state.rd_old)
            connect(m, epi.rd_state_new, state.rd_new)
            connect(m, epi.wr_state_new, state.wr_new)
            m.d.comb += [state.layer.eq(ih.layer), state.uses_state.eq(touches_state(ih.ops, ih.n_ops)),
                         state.end.eq(ih.opcode == isa.Opcode.END_TOKEN), state.bank.eq(seq.state_bank),
                         state.state_valid.eq(seq.state_valid), seq.state_need.eq(state.need),
                         seq.state_busy.eq(state.busy), state.start.eq(seq.state_start),
                         state.flush.eq(seq.state_flush)]
            connect(m, state.cmd, wiring.flipped(self.state_cmd))
            connect(m, state.wb, wiring.flipped(self.m_axis_state))
            connect(m, wiring.flipped(self.s_axis_state), state.fill)
        else:
            # the recurrent state: two banks of max_layers x max_hidden, the bank bit a plain address bit
            hstride = _pow2(self.max_hidden)
            lstride = _pow2(self.max_layers) * hstride
            so, sn, sw = state.read_port(), state.read_port(), state.write_port()
            base_old, base_new = Signal(range(2 * lstride)), Signal(range(2 * lstride))
            hs, ls = ceil_log2(hstride), ceil_log2(lstride)
            m.d.comb += [base_old.eq(Cat(Const(0, hs), seq.layer) + Cat(Const(0, ls), seq.state_bank)),
                         base_new.eq(Cat(Const(0, hs), seq.layer) + Cat(Const(0, ls), ~seq.state_bank))]
            m.d.comb += [so.addr.eq(base_old + epi.rd_state_old.addr), so.en.eq(epi.rd_state_old.en),
                         sn.addr.eq(base_new + epi.rd_state_new.addr), sn.en.eq(epi.rd_state_new.en),
                         epi.rd_state_new.data.eq(sn.data),
                         sw.addr.eq(base_new + epi.wr_state_new.addr), sw.data.eq(epi.wr_state_new.data),
                         sw.en.eq(epi.wr_state_new.en)]
            with m.If(seq.state_valid):   # the committed state reads as zero after a reset or a zero-state request
                m.d.comb += epi.rd_state_old.data.eq(so.data)
