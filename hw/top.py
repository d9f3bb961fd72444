"""The accelerator core: streams in a token packet and the model image, runs the token, streams out the
output packet; AXI4-Lite registers for the ID block, status and counters.

The sequencer here parses channel 0's token packet and image header (a 32-bit word per cycle); a fetcher
reads the instruction headers and constant sections (a whole beat per cycle) one instruction ahead of
execution, into a second constant bank, while the current GEMV computes (channel 0's weights go through a
FIFO, so that the stream runs ahead of the lanes). Together they check every magic, CRC, opcode, micro-op
and shape the golden device checks (same :class:`hw.isa.ErrorCause`, same precedence), and for each
instruction the sequencer drives the components of ``docs/RTL.md``: ScalarUnit -> Quantizer -> per channel
TritGearbox -> TernaryGemv, rows merged in order into the Epilogue. END_TOKEN commits the recurrent state
(a bank flip) and sends the output trailer. An error stops the token: the committed state is untouched,
``STATUS.error`` and ``ERROR_CAUSE``/``ERROR_WHERE`` say why, every input is drained (never blocking the
host's DMA) until ``CTRL.clear``.

Stream protocol per token: channel 0 carries the token packet (its last beat with ``tlast``) then the
image (``tlast`` on its last beat); channel ``c > 0`` carries its weight blocks (``tlast`` on the last).
"""

from contextlib import contextmanager

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import crc, data, fifo, memory, wiring
from amaranth.lib.wiring import In, Out, connect
from amaranth.utils import ceil_log2

from hw import isa
from hw import numerics as nx
from hw.epilogue import Epilogue
from hw.gearbox import TritGearbox, decode_beat, decoded_beat_bits
from hw.gemv import TernaryGemv
from hw.isa import Buffer, Counter, ErrorCause, InstrHeader, MicroOp, MicroOpcode, Opcode, TritPacking
from hw.params import BuildParams
from hw.quant import Quantizer
from hw.regs import AXI4LiteSignature, RegisterBlock
from hw.scalar import ScalarUnit, SsqBias
from hw.streams import code_word_layout
from hw.vbuf import VectorBuffer

__all__ = ["AXIStreamSignature", "Accelerator"]

INT32 = signed(32)
#: default depth of channel 0's weight FIFO in beats (hw.params.BuildParams.weight_fifo_beats)
WEIGHT_FIFO_BEATS = BuildParams.weight_fifo_beats


class AXIStreamSignature(wiring.Signature):
    """AXI4-Stream (ARM IHI 0051A) with ``tdata``, ``tvalid``, ``tready``, ``tlast``; subordinate view (a
    port of this signature as ``Out`` receives data). cocotbext-axi finds it with
    ``AxiStreamBus.from_prefix(dut, name, bus_separator="__")``."""

    def __init__(self, data_width: int):
        if data_width % 8 or data_width < 8:
            raise ValueError(f"data_width must be a positive multiple of 8, got {data_width}")
        super().__init__({"tdata": In(data_width), "tvalid": In(1), "tready": Out(1), "tlast": In(1)})


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
    s_axis_w0 .. : AXIStreamSignature(bus_bits), subordinate
    m_axis_out : AXIStreamSignature(32), flipped (manager)
    s_axil : AXI4LiteSignature
    irq : Out(1)
        Token done or error (level, until the next token starts or ``CTRL.clear``).
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
        members = {f"s_axis_w{c}": Out(AXIStreamSignature(bus_bits)) for c in range(channels)}
        members["m_axis_out"] = In(AXIStreamSignature(32))
        members["s_axil"] = Out(AXI4LiteSignature(addr_width=8))
        members["irq"] = Out(1)
        super().__init__(members)

    def id_values(self) -> dict:
        """The ID block's values: :meth:`hw.params.BuildParams.id_values`."""
        return self.build.id_values()

    # ------------------------------------------------------------------------------------------------
    def elaborate(self, platform):  # noqa: C901 - one sequencer, read top to bottom
        m = Module()
        C, W = self.channels, self.bus_bits // 32
        lpc = self.lanes // C
        Q = self.quant_lanes
        beat_bytes = self.bus_bits // 8
        vmax = max(self.max_hidden, self.max_intermediate)
        hstride = _pow2(self.max_hidden)
        soft_rst = Signal()  # resets every datapath component (error recovery)

        # ---------------- registers
        m.submodules.regs = regs = RegisterBlock(id_values=self.id_values())
        connect(m, wiring.flipped(self.s_axil), regs.axil)

        # ---------------- components
        def reset(elab):
            return ResetInserter({"sync": soft_rst})(elab)

        scalar = ScalarUnit()
        quant = Quantizer(quant_lanes=Q, lanes=lpc, max_k=self.max_k)
        epi = Epilogue(lut_segments_log2=self.lut_segments_log2, folded=self.epilogue_folded)
        m.submodules.scalar = reset(scalar)
        m.submodules.quant = reset(quant)
        m.submodules.epilogue = reset(epi)
        gear, gemv, codes = [], [], []
        for c in range(C):
            # gearbox 0 reads the weight FIFO, which holds decoded beats (below)
            g = TritGearbox(packing=self.packing, bus_bits=self.bus_bits, lanes=lpc, predecoded=c == 0)
            e = TernaryGemv(lanes=lpc, max_k=max(self.max_k, lpc))
            cm = memory.Memory(shape=code_word_layout(lpc), depth=e.code_depth, init=[])
            m.submodules[f"gearbox{c}"] = reset(g)
            m.submodules[f"gemv{c}"] = reset(e)
            m.submodules[f"codes{c}"] = cm
            connect(m, g.o, e.i)
            connect(m, e.codes, cm.read_port())
            gear.append(g)
            gemv.append(e)
            codes.append(cm)
        # the quantizer's code words go to every channel's code memory
        for cm in codes:
            wp = cm.write_port()
            m.d.comb += [wp.addr.eq(quant.codes.addr), wp.data.eq(quant.codes.data), wp.en.eq(quant.codes.en)]

        # vectors: X, A, P (epilogue one element, quantizer Q); constants (beat-wide writes); token
        bw = max(W, Q)
        m.submodules.buf_x = bx = VectorBuffer(depth=self.max_hidden, banks=Q, read_group=Q)
        m.submodules.buf_a = ba = VectorBuffer(depth=vmax, banks=Q, read_group=Q)
        m.submodules.buf_p = bp = VectorBuffer(depth=vmax, banks=Q, read_group=Q)
        m.submodules.buf_qc = bqc = VectorBuffer(depth=self.max_k, banks=bw, write_group=W, read_group=Q)
        # constants: two banks (the executing instruction's, and the next one's being prefetched), a whole
        # number of 64-byte sections each
        cdepth = -(-max(vmax, 16) // 16) * 16
        bcs = []
        for j in range(isa.MAX_CONSTS):
            b = VectorBuffer(depth=2 * cdepth, banks=W, write_group=W)
            m.submodules[f"buf_c{j}"] = b
            bcs.append(b)
        m.submodules.buf_token = btok = VectorBuffer(depth=self.max_hidden, banks=1)
        state = memory.Memory(shape=INT32, depth=2 * _pow2(self.max_layers) * hstride, init=[])
        m.submodules.state = state

        # ---------------- channel streams
        beats = [getattr(self, f"s_axis_w{c}") for c in range(C)]
        draining = Signal()
        beat_taken = [Signal(name=f"beat_taken{c}") for c in range(C)]
        for c in range(C):
            m.d.comb += beat_taken[c].eq(beats[c].tvalid & beats[c].tready)
        # channels > 0 feed their gearbox (or are drained)
        for c in range(1, C):
            m.d.comb += [gear[c].i.payload.data.eq(beats[c].tdata), gear[c].i.valid.eq(beats[c].tvalid & ~draining),
                         beats[c].tready.eq(gear[c].i.ready | draining)]
        wfirst = [Signal(init=1, name=f"wfirst{c}") for c in range(C)]   # the next beat starts a block

        # channel 0: a word serializer (headers, token) or whole beats (constants, weights)
        ch0 = beats[0]
        beat_reg = Signal(self.bus_bits)
        beat_last = Signal()
        beat_full = Signal()
        widx = Signal(range(W))
        word = Signal(32)
        word_last = Signal()          # the word is the last of a beat with tlast
        word_take = Signal()
        m.d.comb += word.eq(beat_reg.word_select(widx, 32))
        m.d.comb += word_last.eq(beat_last & (widx == W - 1))
        mode_word = Signal()          # 1: serializer owns channel 0; 0: beat consumers
        beat_to_consts = Signal()
        with m.If(word_take):
            m.d.sync += widx.eq(widx + 1)
            with m.If(widx == W - 1):
                m.d.sync += [beat_full.eq(0), widx.eq(0)]
        more_words = Signal()         # the section goes on past the word being taken: the next beat may load
        # (never past a beat with tlast: the sequencer sees where the stream ended, see IMG_CHECK/INSTR_CHECK)
        with m.If(mode_word & (~beat_full | (word_take & (widx == W - 1) & more_words & ~beat_last)) & ~draining):
            m.d.comb += ch0.tready.eq(1)
            with m.If(ch0.tvalid):
                m.d.sync += [beat_reg.eq(ch0.tdata), beat_last.eq(ch0.tlast), beat_full.eq(1), widx.eq(0)]
        with m.If(draining):
            m.d.comb += ch0.tready.eq(1)
            m.d.sync += [beat_full.eq(0), widx.eq(0)]
        # channel 0's weight beats go through a FIFO into gearbox 0 (the stream runs ahead of the lanes). They are
        # decoded into 2-bit codes on the way in, so that the FIFO's block-RAM read (no output register) and the
        # BASE3 decode ROM do not share a cycle (ECP5 timing; 25 % wider FIFO words for BASE3)
        wfifo = fifo.SyncFIFOBuffered(width=decoded_beat_bits(self.packing, self.bus_bits),
                                      depth=self.weight_fifo_beats)
        m.submodules.wfifo = reset(wfifo)
        dec = Module()
        m.submodules.wdecode = dec
        gear0_on = Signal()           # the executing GEMV's gearbox 0 takes beats from the FIFO
        m.d.comb += [gear[0].i.payload.data.eq(wfifo.r_data), gear[0].i.valid.eq(wfifo.r_rdy & gear0_on),
                     wfifo.r_en.eq(gear[0].i.ready & gear0_on),
                     wfifo.w_data.eq(decode_beat(dec, ch0.tdata, self.packing))]
        beat_to_fifo = Signal()       # the fetcher pushes the executing GEMV's channel-0 block into the FIFO
        with m.If(beat_to_fifo):
            m.d.comb += [ch0.tready.eq(wfifo.w_rdy), wfifo.w_en.eq(ch0.tvalid)]

        # ---------------- CRC processors
        crc_w = crc.catalog.CRC32_ETHERNET(data_width=32).create()
        crc_b = crc.catalog.CRC32_ETHERNET(data_width=self.bus_bits).create()
        crc_o = crc.catalog.CRC32_ETHERNET(data_width=32).create()
        m.submodules.crc_w, m.submodules.crc_b, m.submodules.crc_o = crc_w, crc_b, crc_o
        # each CRC runs one cycle behind its stream, on registered copies of the data, valid and start that the
        # state machines drive this cycle (their decodes, or the output word's source muxes, and the CRC's XOR
        # tree would otherwise share a cycle): a check reads the CRC one cycle later than the last word's, and
        # the output trailer leaves a one-cycle gap before its CRC word (docs/RTL.md)
        crc_w_valid, crc_w_start = Signal(), Signal()     # driven by the sequencer
        crc_b_valid, crc_b_start = Signal(), Signal()     # driven by the fetcher
        crc_o_data, crc_o_valid, crc_o_start = Signal(32), Signal(), Signal()   # by the output stream (below)
        for proc, data_now, valid_now, start_now in ((crc_w, word, crc_w_valid, crc_w_start),
                                                     (crc_b, ch0.tdata, crc_b_valid, crc_b_start),
                                                     (crc_o, crc_o_data, crc_o_valid, crc_o_start)):
            d, v, st = Signal.like(proc.data), Signal(), Signal()
            m.d.sync += [d.eq(data_now), v.eq(valid_now), st.eq(start_now)]
            m.d.comb += [proc.data.eq(d), proc.valid.eq(v), proc.start.eq(st)]
        m.d.comb += crc_w_valid.eq(word_take)

        # one CRC pipe per weight channel: each block's CRC word (its last 4 bytes) is checked over the beats as
        # they are taken (channel 0: into the weight FIFO; channel c > 0: into gearbox c), at beat rate, one
        # cycle behind the stream like the others; a block's verdict (wcrc_done, wcrc_bad) is registered two
        # cycles after its last beat, and the sequencer acts on it once every channel's block is complete
        # (GEMV_DRAIN), after every trit of the instruction was decoded: BAD_TRIT first, whatever the channel
        w_valid = [Signal(name=f"wcrc_valid{c}") for c in range(C)]   # driven below (fetcher, gearboxes)
        w_start = [Signal(name=f"wcrc_start{c}") for c in range(C)]
        w_last = [Signal(name=f"wcrc_last{c}") for c in range(C)]     # the block's last beat (its CRC word)
        wcrc_done = [Signal(name=f"wcrc_done{c}") for c in range(C)]
        wcrc_bad = [Signal(name=f"wcrc_bad{c}") for c in range(C)]
        for c in range(C):
            proc = crc.catalog.CRC32_ETHERNET(data_width=self.bus_bits).create()
            m.submodules[f"crc_wt{c}"] = proc
            d, v, st, l1, l2 = Signal(self.bus_bits), Signal(), Signal(), Signal(), Signal()
            m.d.sync += [d.eq(beats[c].tdata), v.eq(w_valid[c]), st.eq(w_start[c]), l1.eq(w_valid[c] & w_last[c]),
                         l2.eq(l1)]
            m.d.comb += [proc.data.eq(d), proc.valid.eq(v), proc.start.eq(st)]
            with m.If(l2):
                m.d.sync += [wcrc_done[c].eq(1), wcrc_bad[c].eq(~proc.match_detected)]
        for c in range(1, C):
            m.d.comb += [w_valid[c].eq(gear[c].i.valid & gear[c].i.ready), w_start[c].eq(wfirst[c]),
                         w_last[c].eq(gear[c].blk_last)]
            with m.If(w_valid[c]):
                m.d.sync += wfirst[c].eq(gear[c].blk_last)
            with m.If(soft_rst):
                m.d.sync += wfirst[c].eq(1)

        # ---------------- sequencer state
        err = Signal()
        err_cause = Signal(8)
        err_where = Signal(32)
        busy = Signal()
        done = Signal()
        position = Signal(32)
        want_logits = Signal()
        tok_len = Signal(16)
        tok_words = Signal(16)        # words of the whole token packet
        cnt = Signal(32)              # word or beat counter within the current section
        img = Signal(512)             # image header (word by word), then the fetched instruction header (beats)
        ih = data.View(InstrHeader, img)          # the instruction being fetched (prefetched)
        xhr = Signal(512)             # the executing instruction's header (copied from img at dispatch)
        xh = data.View(InstrHeader, xhr)
        hidden, inter, n_layers, vocab = Signal(16), Signal(16), Signal(16), Signal(16)
        vmax_img = Signal(16)         # max(hidden, intermediate): the elements of A and P an image may use
        img_words = Signal(32)        # the image header's image_words (checked at END_TOKEN)
        n_instr, instr_idx = Signal(32), Signal(32)
        n_instr_m1 = Signal(32)       # n_instr - 1, registered (END_TOKEN's position check, off the fetcher's path)
        m.d.sync += n_instr_m1.eq(n_instr - 1)
        state_bank = Signal()         # bank holding the committed state
        state_valid = Signal()        # 0: the committed state reads as zero (reset, zero-state request)
        scale_m, scale_s = Signal(27), Signal(signed(8))
        out_scale_m, out_scale_s = Signal(27), Signal(signed(16))
        rq_m, rq_s = Signal(26), Signal(6)
        n_logits = Signal(16)
        pad_words = Signal(4)         # the output trailer's zero padding, registered (see END)
        m.d.sync += pad_words.eq(-(n_logits + 8))
        cvec, cbeat = Signal(3), Signal(16)      # constants: current vector and its beat
        xbank = Signal()              # constant bank of the executing instruction (the fetcher fills ~xbank)
        f_block_beats = Signal(24)    # channel-0 weight beats of the fetched instruction
        x_block_beats = Signal(24)    # ... of the executing one
        g0_cnt = Signal(24)           # beats gearbox 0 took from the FIFO in the executing GEMV
        rows_done = Signal(16)
        gear_cmd_sent = Signal()

        def fail(cause: ErrorCause):
            return [err_cause.eq(cause.value), err_where.eq(instr_idx), err.eq(1)]

        # ---------------- instruction decode helpers
        q_words = Signal(16)
        n_words = Signal(16)
        const_vecs = Signal(3)        # number of constant vectors (QC + C*)
        m.d.comb += [
            q_words.eq(((ih.k + 15) >> 4) << 4),
            n_words.eq(((ih.n + 15) >> 4) << 4),
            const_vecs.eq(ih.n_consts + ih.flags.as_value()[1]),
        ]
        vec_beats = Signal(16)
        is_qc = Signal()
        m.d.comb += is_qc.eq(ih.flags.as_value()[1] & (cvec == 0))
        with m.If(is_qc):
            m.d.comb += vec_beats.eq((q_words * 4) // beat_bytes)
        with m.Else():
            m.d.comb += vec_beats.eq((n_words * 4) // beat_bytes)

        # constant writes (beat-wide) into the bank the executing instruction does not read
        cwaddr = Signal(16)
        m.d.comb += cwaddr.eq(cbeat + Mux(xbank, 0, cdepth // W))
        for j, b in enumerate(bcs):
            cj = Signal(3, name=f"cidx{j}")
            m.d.comb += cj.eq(cvec - ih.flags.as_value()[1])
            m.d.comb += [b.wr_wide.addr.eq(cwaddr), b.wr_wide.data.eq(ch0.tdata),
                         b.wr_wide.en.eq(beat_to_consts & ch0.tvalid & ~is_qc & (cj == j))]
        m.d.comb += [bqc.wr_wide.addr.eq(cbeat), bqc.wr_wide.data.eq(ch0.tdata),
                     bqc.wr_wide.en.eq(beat_to_consts & ch0.tvalid & is_qc)]
        with m.If(beat_to_consts):
            m.d.comb += [ch0.tready.eq(1), crc_b_valid.eq(ch0.tvalid)]

        # ---------------- epilogue wiring: buffers, state banks
        def rd(port, buf):  # an epilogue read port on a buffer (address widths differ: plain assignments)
            m.d.comb += [buf.rd.addr.eq(port.addr), buf.rd.en.eq(port.en), port.data.eq(buf.rd.data)]
        for name, buf in (("rd_x", bx), ("rd_a", ba), ("rd_p", bp)):
            rd(getattr(epi, name), buf)
        for j, b in enumerate(bcs):
            port = getattr(epi, f"rd_c{j}")
            m.d.comb += [b.rd.addr.eq(port.addr + Mux(xbank, cdepth, 0)), b.rd.en.eq(port.en),
                         port.data.eq(b.rd.data)]
        layer = Signal(8)
        so = state.read_port()
        sn = state.read_port()
        sw = state.write_port()
        lstride = _pow2(self.max_layers) * hstride  # a power of two: the bank bit is a plain address bit
        base_old = Signal(range(2 * lstride))
        base_new = Signal(range(2 * lstride))
        hs, ls = ceil_log2(hstride), ceil_log2(lstride)
        m.d.comb += [base_old.eq(Cat(Const(0, hs), layer) + Cat(Const(0, ls), state_bank)),
                     base_new.eq(Cat(Const(0, hs), layer) + Cat(Const(0, ls), ~state_bank))]
        old_valid = Signal()
        m.d.comb += [so.addr.eq(base_old + epi.rd_state_old.addr), so.en.eq(epi.rd_state_old.en),
                     sn.addr.eq(base_new + epi.rd_state_new.addr), sn.en.eq(epi.rd_state_new.en),
                     epi.rd_state_new.data.eq(sn.data),
                     sw.addr.eq(base_new + epi.wr_state_new.addr), sw.data.eq(epi.wr_state_new.data),
                     sw.en.eq(epi.wr_state_new.en)]
        with m.If(old_valid):
            m.d.comb += epi.rd_state_old.data.eq(so.data)
        # writes from the epilogue to X, A, P
        for name, buf in (("wr_x", bx), ("wr_a", ba), ("wr_p", bp)):
            port = getattr(epi, name)
            m.d.comb += [buf.wr.addr.eq(port.addr), buf.wr.data.eq(port.data), buf.wr.en.eq(port.en)]

        # quantizer source: X, A or P by the instruction's src; QC from its buffer
        src = Signal(4)
        for code, buf in ((Buffer.X, bx), (Buffer.A, ba), (Buffer.P, bp)):
            with m.If(src == code.value):
                m.d.comb += [buf.rd_wide.addr.eq(quant.src.addr), buf.rd_wide.en.eq(quant.src.en),
                             quant.src.data.eq(buf.rd_wide.data)]
        m.d.comb += [bqc.rd_wide.addr.eq(quant.qc.addr), bqc.rd_wide.en.eq(quant.qc.en),
                     quant.qc.data.eq(bqc.rd_wide.data)]

        # epilogue configuration (latched per instruction)
        cfg_ops = Signal(data.ArrayLayout(MicroOp, isa.MAX_OPS))
        cfg_nops = Signal(4)
        cfg_raw = Signal()
        m.d.comb += [epi.cfg.ops.eq(cfg_ops), epi.cfg.n_ops.eq(cfg_nops), epi.cfg.s_mant.eq(scale_m),
                     epi.cfg.s_shift.eq(scale_s), epi.cfg.raw.eq(cfg_raw)]

        # ---------------- epilogue input: token elements (LOAD_TOKEN) or GEMV rows in row order
        feed_token = Signal()
        tok_idx = Signal(16)
        tok_pending = Signal()        # a token element was read last cycle
        tok_pending_idx = Signal(16)
        feed_rows = Signal()
        row = Signal(16)
        rsel = Signal(range(max(C, 2)))
        m.d.comb += btok.rd.en.eq(1)
        with m.If(feed_token):
            # read one element ahead; present it when the read data arrives
            m.d.comb += [epi.i.payload.value.eq(btok.rd.data), epi.i.payload.index.eq(tok_pending_idx),
                         epi.i.payload.last.eq(tok_pending_idx == hidden - 1), epi.i.valid.eq(tok_pending)]
            m.d.comb += btok.rd.addr.eq(tok_idx)
            with m.If(~tok_pending | epi.i.ready):
                with m.If(tok_idx < hidden):
                    m.d.sync += [tok_pending.eq(1), tok_pending_idx.eq(tok_idx), tok_idx.eq(tok_idx + 1)]
                with m.Else():
                    m.d.sync += tok_pending.eq(0)
            with m.Else():
                m.d.comb += btok.rd.addr.eq(tok_pending_idx)
        with m.If(feed_rows):
            for c in range(C):
                with m.If(rsel == c):
                    m.d.comb += [epi.i.payload.value.eq(gemv[c].o.payload.acc), epi.i.payload.index.eq(row),
                                 epi.i.payload.last.eq(row == xh.n - 1), epi.i.valid.eq(gemv[c].o.valid),
                                 gemv[c].o.ready.eq(epi.i.ready)]
            with m.If(epi.i.valid & epi.i.ready):
                m.d.sync += row.eq(row + 1)
                if C > 1:
                    with m.If(rsel == C - 1):
                        m.d.sync += rsel.eq(0)
                    with m.Else():
                        m.d.sync += rsel.eq(rsel + 1)

        # ---------------- output stream (32-bit words): logits, then padding and the trailer
        out = self.m_axis_out
        out_word, out_valid, out_last = Signal(32), Signal(), Signal()
        m.d.comb += [out.tdata.eq(out_word), out.tvalid.eq(out_valid), out.tlast.eq(out_last)]
        out_take = Signal()
        m.d.comb += out_take.eq(out_valid & out.tready)
        logits_on = Signal()
        with m.If(logits_on & want_logits):
            m.d.comb += [out_word.eq(epi.logits.payload), out_valid.eq(epi.logits.valid),
                         epi.logits.ready.eq(out.tready)]
            with m.If(epi.logits.valid & out.tready):
                m.d.sync += n_logits.eq(n_logits + 1)
        with m.Else():
            m.d.comb += epi.logits.ready.eq(1)

        # ---------------- counters
        ctr = {c: Signal(64, name=f"ctr_{c.name.lower()}") for c in Counter}
        for c in Counter:
            m.d.comb += getattr(regs, f"counter_{c.name.lower()}").eq(ctr[c])
        m.d.sync += ctr[Counter.CYCLES].eq(ctr[Counter.CYCLES] + busy)
        m.d.sync += ctr[Counter.STREAM_BEATS].eq(ctr[Counter.STREAM_BEATS] + sum(beat_taken))
        # an output stall counts a cycle later (the trailer mux and the 64-bit add would share a cycle); an
        # instruction's last stall is at least two cycles before its end, so per-instruction counts are unchanged
        out_stall = Signal()
        m.d.sync += [out_stall.eq(out_valid & ~out.tready),
                     ctr[Counter.OUT_STALLS].eq(ctr[Counter.OUT_STALLS] + out_stall)]
        chunk_trits = [Signal(range(lpc + 1), name=f"chunk_trits{c}") for c in range(C)]
        chunk_nz = [Signal(range(lpc + 1), name=f"chunk_nz{c}") for c in range(C)]
        for c, g in enumerate(gear):
            m.d.comb += chunk_trits[c].eq(g.o.payload.count)
            nz = [((g.o.payload.trits[j] != 0) & (j < g.o.payload.count)) for j in range(lpc)]
            m.d.comb += chunk_nz[c].eq(sum(nz))
        # this cycle's trits and non-zero trits, registered before the 64-bit counters (they count a cycle late;
        # a GEMV's last chunk is many cycles before its instruction ends)
        trits_now = Signal(32)
        nz_now = Signal(32)
        m.d.sync += [trits_now.eq(sum(Mux3(g.o.valid & g.o.ready, chunk_trits[c]) for c, g in enumerate(gear))),
                     nz_now.eq(sum(Mux3(g.o.valid & g.o.ready, chunk_nz[c]) for c, g in enumerate(gear)))]
        m.d.sync += [ctr[Counter.TRITS].eq(ctr[Counter.TRITS] + trits_now),
                     ctr[Counter.NONZERO_TRITS].eq(ctr[Counter.NONZERO_TRITS] + nz_now),
                     ctr[Counter.EPILOGUE_ELEMENTS].eq(ctr[Counter.EPILOGUE_ELEMENTS] + (epi.i.valid & epi.i.ready))]

        # ---------------- the sequencer
        stalls = Signal()
        first_out = Signal(init=1)    # the next output word starts a packet (the last one ended with tlast)
        # the output CRC covers every word taken but the trailer's last (the CRC word itself)
        m.d.comb += [crc_o_data.eq(out_word), crc_o_valid.eq(out_take & ~out_last),
                     crc_o_start.eq(first_out & out_take)]
        clear_pending = Signal()      # CTRL.clear while an aborted output packet was still being closed
        lanes_done = [Signal(name=f"lanes_done{c}") for c in range(C)]   # channel c's block's last chunk taken
        instr_done = Signal()         # an instruction completes this cycle (the next one's DISPATCH follows)
        m.d.sync += ctr[Counter.INSTRUCTIONS].eq(ctr[Counter.INSTRUCTIONS] + instr_done)
        m.d.sync += ctr[Counter.STREAM_STALLS].eq(ctr[Counter.STREAM_STALLS] + stalls)
        m.d.comb += [regs.busy.eq(busy), regs.done.eq(done), regs.error.eq(err), regs.error_cause.eq(err_cause),
                     regs.error_where.eq(err_where), regs.position.eq(position),
                     regs.argmax.eq(epi.argmax_index), self.irq.eq(done | err)]
        bank_flip = Signal()
        m.d.comb += [scalar.i.payload.cb_mant.eq(xh.cb_mant), scalar.i.payload.cb_shift.eq(xh.cb_shift),
                     scalar.i.payload.out_frac.eq(xh.out_frac)]
        # the scalar unit's absmax operand, selected a cycle ahead (registered): the registers are stable from the
        # previous epilogue's end, and xh from the dispatch, both at least a cycle before SCALAR (its ssq, the
        # statistic, is formed from the dispatch on: SsqBias, below)
        with m.Switch(xh.amax_reg):
            for k in range(8):
                with m.Case(k):
                    m.d.sync += scalar.i.payload.amax.eq(epi.regs[k][:32])
        m.d.comb += [quant.cmd.payload.k.eq(xh.k), quant.cmd.payload.q_shift.eq(xh.q_shift),
                     quant.cmd.payload.qconst.eq(xh.flags.as_value()[1]), quant.cmd.payload.r_mant.eq(rq_m),
                     quant.cmd.payload.r_shift.eq(rq_s)]
        for c, g in enumerate(gear):
            m.d.comb += [g.cmd.payload.rows.eq((xh.n + (C - 1 - c)) // C if C > 1 else xh.n),
                         g.cmd.payload.k.eq(xh.k)]

        # ---------------- the fetcher: channel 0 after the image header, one instruction ahead of execution
        # It reads an instruction's header (whole beats, the CRC over the beats) and checks it, loads the
        # instruction's constants into the bank the executing instruction does not read (QC once the executing
        # instruction's quantize pass is over), and waits for the sequencer to dispatch it; a dispatched GEMV's
        # channel-0 weight block goes into the weight FIFO, and the next header follows at once. So the next
        # instruction's header and constants stream while the current GEMV computes. An error in a prefetched
        # instruction is held until the sequencer would have reached it (same cause and ERROR_WHERE as a serial
        # parse); a weight beat with tlast (TRUNCATED) belongs to the executing GEMV and is raised at once.
        hdr_beats = isa.layout_bytes(InstrHeader) // beat_bytes
        # The header check takes two cycles: F_CHECK registers the checks, F_CHECK2 acts on them (each a short
        # path at the ECP5 clock) and on the header's CRC, final by then.
        chk_opcode, chk_microop, chk_shape, chk_truncated, chk_consts = (
            Signal(name=f"chk_{n}") for n in ("opcode", "microop", "shape", "truncated", "consts"))
        st_x, st_a, st_p, st_sn = (Signal(name=f"st_{n}") for n in ("x", "a", "p", "sn"))
        # Channel 0's weight beats (block_rows, block_sections), without a divider on the path: the rows and k
        # are taken from the header's first beat, their product (plus the rounding) is registered the next
        # cycle, and F_CHECK2 (at least two cycles after the first beat) divides by a constant.
        # Every channel's block is sized the same way (their sum is checked against weight_bytes).
        sz_k = Signal(16)
        sz_rows_c = [Signal(16, name=f"sz_rows{c}") for c in range(C)]
        sz_blk_c = [Signal(33, name=f"sz_blk{c}") for c in range(C)]   # rows * k + (68 * trits per byte - 1)
        sz_blk = sz_blk_c[0]
        per = 5 if self.packing is TritPacking.BASE3 else 4
        for c in range(C):    # round_up(packed + 4, 64): the CRC word
            m.d.sync += sz_blk_c[c].eq(sz_rows_c[c] * sz_k + (68 * per - 1))
        block_beats = Signal(24)
        m.d.comb += block_beats.eq(block_sections(sz_blk, per) * (64 // beat_bytes))
        wb_expect = Signal(40)
        m.d.comb += wb_expect.eq(sum(Mux(sz_rows_c[c] != 0, block_sections(sz_blk_c[c], per), 0) for c in range(C))
                                 * 64)
        f_words = Signal(32)          # image words up to the instruction being fetched
        f_codes_k = Signal(16)        # k of the codes a REUSE_CODES GEMV would reuse (program order)
        # what the program wrote so far in this token (program order): the buffers are not cleared at a token's
        # start, so an instruction may read only what an earlier one wrote (host.image.Written)
        w_x, w_a, w_p = Signal(16), Signal(16), Signal(16)
        nl = _pow2(self.max_layers)
        w_layers = Signal(nl)         # layers of STATE_NEW written whole
        layer_mask = Signal(nl)       # the image's n_layers, as a mask (registered at IMG_CHECK)
        instr_const_words = Signal(20)
        m.d.comb += instr_const_words.eq(Mux(ih.flags.as_value()[1], q_words, 0) + ih.n_consts * n_words)
        f_idx = Signal(32)            # index of the instruction being fetched
        f_at_end = Signal()           # f_idx == n_instr, registered with f_idx (off the fetcher's state path)
        f_cnt = Signal(24)            # header or weight beats of the current section
        f_last = Signal()             # the header's last beat carried tlast
        f_err = Signal()              # an error found by the fetcher ...
        f_err_now = Signal()          # ... in the executing instruction (raised at once, not at dispatch)
        f_err_cause = Signal(8)
        f_start = Signal()            # the image header checked: fetch instruction 0
        f_ready = Signal()            # an instruction is fetched and checked, its constants loaded
        dispatch = Signal()           # the sequencer takes it
        qc_busy = Signal()            # the executing instruction may still read QC
        # the scale's statistic ssq_with_bias(R[ssq_reg], ssq_bias, ssq_bias_shift), formed from the dispatch on:
        # the dispatched header is still in img and the registers are final in that cycle (the epilogue's done
        # came at least a cycle before, its next start comes after SCALAR); SsqBias takes two cycles (a shift,
        # then the two 33-bit halves of the sum), so it is ready in SCALAR, two cycles after the dispatch
        m.submodules.ssq_bias = ssqb = SsqBias()
        m.d.comb += [ssqb.load.eq(dispatch), ssqb.bias.eq(ih.ssq_bias), ssqb.bias_shift.eq(ih.ssq_bias_shift),
                     scalar.i.payload.ssq.eq(ssqb.o)]
        with m.Switch(ih.ssq_reg):
            for k in range(8):
                with m.Case(k):
                    m.d.comb += ssqb.ssq.eq(epi.regs[k])
        f_kill = Signal()
        m.d.comb += f_kill.eq(soft_rst)
        with m.If(f_kill):
            m.d.sync += [f_err.eq(0), f_err_now.eq(0)]

        def f_fail(cause: ErrorCause, now: bool = False):
            return [f_err.eq(1), f_err_now.eq(now), f_err_cause.eq(cause.value)]

        @contextmanager
        def fstate(name):
            with m.State(name):
                yield
                with m.If(f_kill):
                    m.next = "F_IDLE"

        with m.FSM(init="F_IDLE", name="fetch"):
            with fstate("F_IDLE"):
                with m.If(f_start):   # in the sequencer's IMG_CHECK: img holds the image header, n_instr loads
                    n0 = data.View(isa.ImageHeader, img).n_instructions
                    m.d.sync += [f_idx.eq(0), f_cnt.eq(0), f_at_end.eq(n0 == 0), f_words.eq(16), f_codes_k.eq(0),
                                 w_x.eq(0), w_a.eq(0), w_p.eq(0), w_layers.eq(0)]
                    m.next = "F_HDR"
            with fstate("F_HDR"):
                with m.If(f_at_end):
                    m.d.sync += f_fail(ErrorCause.NO_END)
                    m.next = "F_ERR"
                with m.Else():
                    m.d.comb += [ch0.tready.eq(1), crc_b_valid.eq(ch0.tvalid), crc_b_start.eq(f_cnt == 0)]
                    with m.If(ch0.tvalid):
                        m.d.sync += [f_cnt.eq(f_cnt + 1), f_last.eq(ch0.tlast),
                                     img.eq(Cat(img[self.bus_bits:], ch0.tdata))]
                        with m.If(f_cnt == 0):      # header word 1 (n, k) is in the first beat
                            m.d.sync += [sz_rows_c[c].eq(channel_rows(ch0.tdata[32:48], C, c)) for c in range(C)]
                            m.d.sync += sz_k.eq(ch0.tdata[48:64])
                        with m.If(f_cnt == hdr_beats - 1):
                            m.d.sync += f_cnt.eq(0)
                            m.next = "F_CHECK"
                        with m.Elif(ch0.tlast):    # the stream ends inside the header
                            m.d.sync += f_fail(ErrorCause.TRUNCATED)
                            m.next = "F_ERR"
            with fstate("F_CHECK"):
                bad_op = Signal()
                bad_shape = Signal()
                op_ok, cap_bad, stores, store_buf = [], [], [], []
                for j in range(isa.MAX_OPS):
                    u = ih.ops[j]
                    code = u.as_value()[0:5]
                    bufv = u.as_value()[11:15]
                    used = j < ih.n_ops
                    is_const = (bufv >= Buffer.C0.value) & (bufv <= Buffer.C3.value)
                    const_ok = ~is_const | ((bufv - Buffer.C0.value) < ih.n_consts)
                    buf_ok = (bufv <= Buffer.TOKEN.value) | is_const | (bufv == Buffer.NONE.value)
                    sig = (code == MicroOpcode.SIG.value) | (code == MicroOpcode.SIGNEG.value) | \
                        (code == MicroOpcode.SILU.value)
                    sig_ok = ~sig | (u.shift >= self.lut_segments_log2 - nx.LUT_RANGE_LOG2)
                    # a store only to X, A, P, STATE_NEW; LD, MULV, ADDV read a buffer (not NONE)
                    st_ok = (code != MicroOpcode.ST.value) | Cat(*[bufv == b.value for b in (
                        Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_NEW)]).any()
                    rd_ok = ~Cat(*[code == o.value for o in (MicroOpcode.LD, MicroOpcode.MULV, MicroOpcode.ADDV)]
                                 ).any() | (bufv != Buffer.NONE.value)
                    op_ok.append(~used | (buf_ok & (u.shift <= 62) & const_ok & sig_ok & (code <= 15) & st_ok & rd_ok))
                    # the elements the program touches in a buffer: n of them (GEMV, LOAD_TOKEN)
                    acc_buf = Cat(*[code == o.value for o in (MicroOpcode.LD, MicroOpcode.ST, MicroOpcode.MULV,
                                                              MicroOpcode.ADDV, MicroOpcode.SSQ, MicroOpcode.AMAX)]
                                  ).any() & (bufv != Buffer.NONE.value)
                    h_sized = Cat(*[bufv == b.value for b in (Buffer.X, Buffer.STATE_OLD, Buffer.STATE_NEW,
                                                              Buffer.TOKEN)]).any()
                    v_sized = (bufv == Buffer.A.value) | (bufv == Buffer.P.value)
                    cap_bad.append(used & acc_buf & ((h_sized & (ih.n > hidden)) | (v_sized & (ih.n > vmax_img))))
                    reads = Cat(*[code == o.value for o in (MicroOpcode.LD, MicroOpcode.MULV, MicroOpcode.ADDV,
                                                            MicroOpcode.SSQ, MicroOpcode.AMAX)]).any()
                    have = Mux(bufv == Buffer.X.value, w_x, Mux(bufv == Buffer.A.value, w_a, w_p))
                    xap = (bufv == Buffer.X.value) | v_sized
                    cap_bad.append(used & reads & ((xap & (ih.n > have))
                                                   | ((bufv == Buffer.STATE_NEW.value) & ~w_layers.bit_select(
                                                       ih.layer[:ceil_log2(nl) or 1], 1)
                                                      if nl > 1 else ~w_layers[0])))
                    stores.append(used & (code == MicroOpcode.ST.value))
                    store_buf.append(bufv)
                # hazard rule: no read of a buffer after a store to it in the same program (docs/ISA.md)
                hazards = []
                for j in range(isa.MAX_OPS):
                    uj = ih.ops[j].as_value()
                    reads_j = Cat(*[uj[0:5] == o.value for o in (MicroOpcode.LD, MicroOpcode.MULV,
                                                                 MicroOpcode.ADDV, MicroOpcode.SSQ,
                                                                 MicroOpcode.AMAX)]).any()
                    for i in range(j):
                        ui = ih.ops[i].as_value()
                        hazards.append((j < ih.n_ops) & reads_j & (ui[0:5] == MicroOpcode.ST.value)
                                       & (ui[11:15] == uj[11:15]))
                m.d.comb += bad_op.eq(~Cat(*op_ok).all() | (ih.n_ops > isa.MAX_OPS) | Cat(*hazards).any())
                opc = ih.as_value()[0:8]
                is_gemv = opc == Opcode.GEMV.value
                kk, nn = ih.k, ih.n
                is_load = opc == Opcode.LOAD_TOKEN.value
                srcv = ih.as_value()[64:68]
                reuse = ih.flags.as_value()[0]
                m.d.comb += bad_shape.eq(
                    (is_gemv & ((kk == 0) | (kk > self.max_k) | ((kk != hidden) & (kk != inter))
                                | ((nn != hidden) & (nn != inter) & (nn != vocab))
                                | ((srcv == Buffer.X.value) & (kk > hidden)) | (reuse & (f_codes_k != kk))))
                    | (is_load & (nn != hidden))
                    | ((is_gemv | is_load) & ((ih.layer >= n_layers) | Cat(*cap_bad).any()))
                    | (is_gemv & ~reuse & (kk > Mux(srcv == Buffer.X.value, w_x,
                                                    Mux(srcv == Buffer.A.value, w_a, w_p))))
                    | ((opc == Opcode.END_TOKEN.value) & ((w_layers & layer_mask) != layer_mask))
                    # END_TOKEN: the last instruction, where image_words says the image ends, and with tlast
                    | ((opc == Opcode.END_TOKEN.value) & ((f_idx != n_instr_m1) | (f_words + 16 != img_words)
                                                          | (~f_last if self.image_tlast else 0))))
                src_ok = (srcv <= Buffer.TOKEN.value) | ((srcv >= Buffer.C0.value) & (srcv <= Buffer.C3.value)) \
                    | (srcv == Buffer.NONE.value)
                # the checks, registered; F_CHECK2 acts on them in the same order of precedence
                m.d.sync += [chk_opcode.eq((opc < Opcode.GEMV.value) | (opc > Opcode.END_TOKEN.value)
                                           | (ih.flags.as_value()[3:] != 0)),
                             chk_microop.eq(bad_op | (ih.n_consts > isa.MAX_CONSTS) | ~src_ok
                                            | (is_gemv & (srcv != Buffer.X.value) & (srcv != Buffer.A.value)
                                               & (srcv != Buffer.P.value))),
                             chk_shape.eq(bad_shape),
                             chk_truncated.eq(f_last & (opc != Opcode.END_TOKEN.value)),
                             chk_consts.eq((opc != Opcode.END_TOKEN.value) & (const_vecs != 0))]
                # this program's stores, registered for F_CHECK2's update of the written extents
                pairs = list(zip(stores, store_buf, strict=True))
                for b, reg in ((Buffer.X, st_x), (Buffer.A, st_a), (Buffer.P, st_p)):
                    m.d.sync += reg.eq(Cat(*[st & (sb == b.value) for st, sb in pairs]).any())
                m.d.sync += st_sn.eq(Cat(*[st & (sb == Buffer.STATE_NEW.value) for st, sb in pairs]).any()
                                     & (ih.n >= hidden) & (is_gemv | is_load))
                m.next = "F_CHECK2"
            with fstate("F_CHECK2"):
                m.d.sync += [cvec.eq(0), cbeat.eq(0), f_cnt.eq(0), f_block_beats.eq(block_beats)]
                # in precedence order; TRUNCATED: the image ends with this header. The CRC has taken the
                # header's last beat by now (it runs a cycle behind the stream)
                # weight_bytes: every channel's block (F_CHECK2 is at least two cycles after the header's first beat)
                wb_bad = ih.weight_bytes != Mux(ih.as_value()[0:8] == Opcode.GEMV.value, wb_expect, 0)
                failures = ((~crc_b.match_detected, ErrorCause.INSTR_CRC), (chk_opcode, ErrorCause.UNKNOWN_OPCODE),
                            (chk_microop, ErrorCause.BAD_MICROOP), (chk_shape | wb_bad, ErrorCause.BAD_SHAPE),
                            (chk_truncated, ErrorCause.TRUNCATED))
                for i, (flag, cause) in enumerate(failures):
                    with (m.If if i == 0 else m.Elif)(flag):
                        m.d.sync += f_fail(cause)
                        m.next = "F_ERR"
                with m.Elif(chk_consts):
                    m.next = "F_CONSTS"
                with m.Else():
                    m.next = "F_READY"
                # the image's words so far (END_TOKEN compares them with image_words); the codes REUSE_CODES reuses
                m.d.sync += f_words.eq(f_words + 16 + instr_const_words + (ih.weight_bytes >> 2))
                with m.If((ih.as_value()[0:8] == Opcode.GEMV.value) & ~ih.flags.as_value()[0]):
                    m.d.sync += f_codes_k.eq(ih.k)
                for st, reg in ((st_x, w_x), (st_a, w_a), (st_p, w_p)):
                    with m.If(st & (ih.n > reg)):
                        m.d.sync += reg.eq(ih.n)
                with m.If(st_sn):
                    m.d.sync += w_layers.bit_select(ih.layer[:ceil_log2(nl) or 1], 1).eq(1) if nl > 1 else \
                        w_layers[0].eq(1)
            with fstate("F_CONSTS"):
                # into the bank the executing instruction does not read; QC once its quantize pass is over
                with m.If(~qc_busy):
                    m.d.comb += [beat_to_consts.eq(1), crc_b_start.eq((cvec == 0) & (cbeat == 0))]
                    with m.If(ch0.tvalid):
                        m.d.sync += cbeat.eq(cbeat + 1)
                        with m.If(cbeat == vec_beats - 1):
                            m.d.sync += [cbeat.eq(0), cvec.eq(cvec + 1)]
                            with m.If(cvec == const_vecs - 1):
                                m.next = "F_CWAIT"
                        with m.If(ch0.tlast):
                            m.d.sync += f_fail(ErrorCause.TRUNCATED)
                            m.next = "F_ERR"
            with fstate("F_CWAIT"):
                m.next = "F_CCHECK"       # the CRC takes the last constant beat (a cycle behind the stream)
            with fstate("F_CCHECK"):
                with m.If(crc_b.crc != ih.const_crc):
                    m.d.sync += f_fail(ErrorCause.CONST_CRC)
                    m.next = "F_ERR"
                with m.Else():
                    m.next = "F_READY"
            with fstate("F_READY"):
                m.d.comb += f_ready.eq(1)
                with m.If(dispatch):
                    m.d.sync += [f_idx.eq(f_idx + 1), f_cnt.eq(0), f_at_end.eq(f_idx + 1 == n_instr)]
                    with m.If(ih.as_value()[0:8] == Opcode.GEMV.value):
                        m.next = "F_WEIGHTS"
                    with m.Elif(ih.as_value()[0:8] == Opcode.END_TOKEN.value):
                        m.next = "F_IDLE"    # the next token packet belongs to the sequencer's word reader
                    with m.Else():
                        m.next = "F_HDR"
            with fstate("F_WEIGHTS"):
                # the dispatched GEMV's channel-0 block, into the weight FIFO
                m.d.comb += [beat_to_fifo.eq(1), w_valid[0].eq(ch0.tvalid & wfifo.w_rdy), w_start[0].eq(f_cnt == 0),
                             w_last[0].eq(f_cnt == x_block_beats - 1)]
                with m.If(ch0.tvalid & wfifo.w_rdy):
                    m.d.sync += f_cnt.eq(f_cnt + 1)
                    with m.If(ch0.tlast):   # the image ends with END_TOKEN: no weight beat may be last
                        m.d.sync += f_fail(ErrorCause.TRUNCATED, now=True)
                        m.next = "F_ERR"
                    with m.Elif(f_cnt == x_block_beats - 1):
                        m.d.sync += f_cnt.eq(0)
                        m.next = "F_HDR"
            with fstate("F_ERR"):
                pass

        @contextmanager
        def state(name, *, guarded=True):
            """An FSM state whose transitions yield to a fetcher error in the executing instruction and to a host
            abort (CTRL.abort) while a token is in flight."""
            with m.State(name):
                yield
                if guarded:
                    with m.If(f_err & f_err_now):
                        m.d.sync += [err_cause.eq(f_err_cause), err_where.eq(instr_idx), err.eq(1)]
                        m.next = "ERROR"
                    # an abort in the cycle the output packet's last word leaves is too late: that token commits
                    # (a packet that ends normally always means a committed token)
                    with m.If(regs.abort & busy & ~(out_take & out_last)):
                        m.d.sync += fail(ErrorCause.ABORTED)
                        m.next = "ERROR"

        with m.FSM(init="TOKEN") as fsm:
            with state("TOKEN"):
                # token packet, word by word: magic, position, flags, length, payload, padding, CRC
                m.d.comb += [mode_word.eq(1), more_words.eq(1), busy.eq(beat_full | ch0.tvalid)]
                with m.If(beat_full):
                    m.d.comb += [word_take.eq(1), crc_w_start.eq(cnt == 0)]
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.Switch(cnt):
                        with m.Case(0):
                            # ERROR_WHERE of the token packet's and the image header's errors (and of an abort
                            # before the first dispatch): outside any instruction
                            m.d.sync += [done.eq(0), instr_idx.eq(isa.NO_INSTRUCTION)]
                            with m.If(word != isa.TOKEN_MAGIC):
                                m.d.sync += fail(ErrorCause.TOKEN_MAGIC)
                                m.d.sync += err_where.eq(isa.NO_INSTRUCTION)   # instr_idx loads it this cycle
                                m.next = "ERROR"
                        with m.Case(1):
                            m.d.sync += position.eq(word)
                        with m.Case(2):
                            m.d.sync += want_logits.eq(word[0])
                        with m.Case(3):
                            m.d.sync += [tok_len.eq(word),
                                         tok_words.eq(((20 + 4 * word[:16] + 63) >> 6) << 4)]
                            with m.If((word == 0) | (word > self.max_hidden)):
                                m.d.sync += fail(ErrorCause.TOKEN_LENGTH)
                                m.next = "ERROR"
                    with m.If((cnt >= 4) & (cnt < 4 + tok_len)):
                        m.d.comb += [btok.wr.addr.eq(cnt - 4), btok.wr.data.eq(word), btok.wr.en.eq(1)]
                    # the packet's size: tlast on its last word, and on no word before it (TOKEN_LENGTH)
                    with m.If((cnt > 3) & (cnt == tok_words - 1)):
                        with m.If(word_last | (not self.token_tlast)):
                            m.d.sync += cnt.eq(0)
                            m.next = "TOKEN_WAIT"
                        with m.Else():
                            m.d.sync += fail(ErrorCause.TOKEN_LENGTH)
                            m.next = "ERROR"
                    if self.token_tlast:
                        with m.Elif(word_last & (cnt != 0)):
                            m.d.sync += fail(ErrorCause.TOKEN_LENGTH)
                            m.next = "ERROR"
            with state("TOKEN_WAIT"):
                m.d.comb += [mode_word.eq(1), busy.eq(1)]
                m.next = "TOKEN_CRC"      # the CRC takes the packet's last word (a cycle behind the stream)
            with state("TOKEN_CRC"):
                m.d.comb += [mode_word.eq(1), busy.eq(1)]
                with m.If(~crc_w.match_detected):
                    m.d.sync += fail(ErrorCause.TOKEN_CRC)
                    m.next = "ERROR"
                with m.Else():
                    m.next = "IMG_HDR"
            with state("IMG_HDR"):
                # never past the image header's last beat: the fetcher reads the program
                m.d.comb += [mode_word.eq(1), more_words.eq(cnt != 15), busy.eq(1)]
                with m.If(beat_full):
                    m.d.comb += [word_take.eq(1), crc_w_start.eq(cnt == 0)]
                    m.d.sync += [cnt.eq(cnt + 1), img.eq(Cat(img[32:], word))]
                    with m.If(word_last & (cnt != 15)):   # tlast inside the image header
                        m.d.sync += fail(ErrorCause.TRUNCATED)
                        m.next = "ERROR"
                    with m.Elif(cnt == 15):
                        m.d.sync += cnt.eq(0)
                        m.next = "IMG_WAIT"
            with state("IMG_WAIT"):
                m.d.comb += busy.eq(1)
                m.next = "IMG_CHECK"      # the CRC takes the header's last word (a cycle behind the stream)
            with state("IMG_CHECK"):
                m.d.comb += busy.eq(1)
                hv = data.View(isa.ImageHeader, img)
                m.d.sync += [hidden.eq(hv.hidden), inter.eq(hv.intermediate), n_layers.eq(hv.n_layers),
                             vocab.eq(hv.vocab), n_instr.eq(hv.n_instructions), img_words.eq(hv.image_words),
                             vmax_img.eq(Mux(hv.hidden > hv.intermediate, hv.hidden, hv.intermediate)),
                             layer_mask.eq((Const(1, nl + 1) << hv.n_layers[:ceil_log2(nl + 1)]) - 1)]
                with m.If(hv.magic != isa.IMAGE_MAGIC):
                    m.d.sync += fail(ErrorCause.BAD_MAGIC)
                    m.next = "ERROR"
                with m.Elif(hv.version != isa.ISA_VERSION):
                    m.d.sync += fail(ErrorCause.BAD_VERSION)
                    m.next = "ERROR"
                with m.Elif(~crc_w.match_detected):
                    m.d.sync += fail(ErrorCause.HEADER_CRC)
                    m.next = "ERROR"
                with m.Elif((hv.packing.as_value() != self.packing.value) | (hv.channels != C)
                            | (hv.hidden == 0) | (hv.hidden > self.max_hidden)
                            | (hv.intermediate == 0) | (hv.intermediate > self.max_intermediate)
                            | (hv.n_layers == 0) | (hv.n_layers > self.max_layers) | (hv.vocab == 0)
                            | (hv.lut_segments_log2 != self.lut_segments_log2) | (hv.gate_frac != nx.GATE_FRAC)):
                    m.d.sync += fail(ErrorCause.BAD_SHAPE)
                    m.next = "ERROR"
                with m.Elif(beat_last & ~beat_full):   # the image ends with its header
                    m.d.sync += fail(ErrorCause.TRUNCATED)
                    m.next = "ERROR"
                with m.Elif(hv.hidden != tok_len):
                    m.d.sync += fail(ErrorCause.TOKEN_LENGTH)
                    m.next = "ERROR"
                with m.Else():
                    m.d.comb += f_start.eq(1)
                    m.next = "DISPATCH"
            with state("DISPATCH"):
                # the next instruction, once the fetcher has it (or the error the fetcher found in it)
                m.d.comb += busy.eq(1)
                with m.If(f_err):
                    m.d.sync += [err_cause.eq(f_err_cause), err_where.eq(Mux(f_err_now, instr_idx, f_idx)),
                                 err.eq(1)]
                    m.next = "ERROR"
                with m.Elif(f_ready):
                    m.d.comb += dispatch.eq(1)
                    m.d.sync += [wcrc_done[0].eq(0), wcrc_bad[0].eq(0)]   # its channel-0 block streams from now
                    m.d.sync += [xhr.eq(img), instr_idx.eq(f_idx), xbank.eq(~xbank), x_block_beats.eq(f_block_beats),
                                 src.eq(ih.as_value()[64:68]), layer.eq(ih.layer), cfg_ops.eq(ih.ops),
                                 cfg_nops.eq(ih.n_ops), cnt.eq(0)]
                    with m.If(ih.as_value()[0:8] == Opcode.END_TOKEN.value):
                        m.next = "END"
                    with m.Else():
                        m.next = "EXEC"
            with state("EXEC"):
                m.d.comb += [busy.eq(1), qc_busy.eq(1)]
                m.d.sync += [rows_done.eq(0), row.eq(0), rsel.eq(0), tok_idx.eq(0), tok_pending.eq(0),
                             gear_cmd_sent.eq(0), g0_cnt.eq(0)]
                with m.If(xh.as_value()[0:8] == Opcode.LOAD_TOKEN.value):
                    m.d.sync += cfg_raw.eq(1)
                    m.d.comb += epi.start.eq(1)
                    m.next = "RUN_TOKEN"
                with m.Elif(xh.flags.as_value()[0]):   # REUSE_CODES: the previous GEMV's codes and scale
                    m.d.sync += cfg_raw.eq(0)
                    m.next = "GEMV_START"
                with m.Else():
                    m.d.sync += cfg_raw.eq(0)
                    m.next = "SCALAR"
            with state("SCALAR"):
                m.d.comb += [busy.eq(1), qc_busy.eq(1), scalar.i.valid.eq(1)]
                m.d.sync += ctr[Counter.SCALAR_CYCLES].eq(ctr[Counter.SCALAR_CYCLES] + 1)
                with m.If(scalar.i.ready):
                    m.next = "SCALAR_WAIT"
            with state("SCALAR_WAIT"):
                m.d.comb += [busy.eq(1), qc_busy.eq(1), scalar.o.ready.eq(1)]
                m.d.sync += ctr[Counter.SCALAR_CYCLES].eq(ctr[Counter.SCALAR_CYCLES] + 1)
                with m.If(scalar.o.valid):
                    m.d.sync += [rq_m.eq(scalar.o.payload.r_mant), rq_s.eq(scalar.o.payload.r_shift),
                                 scale_m.eq(scalar.o.payload.s_mant), scale_s.eq(scalar.o.payload.s_shift)]
                    m.next = "QUANT"
            with state("QUANT"):
                m.d.comb += [busy.eq(1), qc_busy.eq(1), quant.cmd.valid.eq(1)]
                with m.If(quant.cmd.ready):
                    m.next = "QUANT_WAIT"
            with state("QUANT_WAIT"):
                m.d.comb += [busy.eq(1), qc_busy.eq(1)]
                m.d.sync += ctr[Counter.QUANT_CYCLES].eq(ctr[Counter.QUANT_CYCLES] + 1)
                with m.If(quant.done):
                    m.next = "GEMV_START"
            with state("GEMV_START"):
                m.d.comb += [busy.eq(1), epi.start.eq(1)]
                m.d.sync += [lanes_done[c].eq(0) for c in range(C)]
                # channels > 0 take their block's beats from the gearbox command on (GEMV); a channel without
                # rows has an empty block (no beats, no CRC word)
                m.d.sync += [wcrc_done[c].eq(gear[c].cmd.payload.rows == 0) for c in range(1, C)]
                m.d.sync += [wcrc_bad[c].eq(0) for c in range(1, C)]
                with m.If(xh.flags.as_value()[2]):  # LOGITS: this is the LM head
                    m.d.sync += [out_scale_m.eq(scale_m), out_scale_s.eq(scale_s + xh.out_frac), n_logits.eq(0)]
                m.next = "GEMV"
            with state("GEMV"):
                m.d.comb += [busy.eq(1), feed_rows.eq(1), gear0_on.eq(1)]
                m.d.comb += logits_on.eq(xh.flags.as_value()[2])
                # the lanes are busy (or wait for weights) until every channel's block ended; the adder tree and
                # epilogue drain after that is neither (docs/ISA.md: GEMV_CYCLES, STREAM_STALLS)
                lanes_busy = ~Cat(*lanes_done).all()
                m.d.sync += ctr[Counter.GEMV_CYCLES].eq(ctr[Counter.GEMV_CYCLES] + lanes_busy)
                m.d.comb += stalls.eq(Cat(*[~g.o.valid & g.o.ready & ~lanes_done[c] for c, g in enumerate(gear)]).any())
                for c, g in enumerate(gear):
                    with m.If(g.o.valid & g.o.ready & g.o.payload.end):
                        m.d.sync += lanes_done[c].eq(1)
                # one command per channel, once
                for g in gear:
                    m.d.comb += g.cmd.valid.eq(~gear_cmd_sent)
                with m.If(~gear_cmd_sent & Cat(*[g.cmd.ready for g in gear]).all()):
                    m.d.sync += gear_cmd_sent.eq(1)
                with m.If(Cat(*[g.bad_trit for g in gear]).any()):
                    m.d.sync += fail(ErrorCause.BAD_TRIT)
                    m.next = "ERROR"
                with m.Elif(epi.done):
                    m.next = "GEMV_DRAIN"
            with state("GEMV_DRAIN"):
                # the epilogue is done; the FIFO may still hold the block's padding beats. Every trit was decoded
                # (no BAD_TRIT): the weight blocks' CRC verdicts decide, once every channel's block has ended
                m.d.comb += [busy.eq(1), gear0_on.eq(1)]
                with m.If((g0_cnt >= x_block_beats) & Cat(*wcrc_done).all()):
                    with m.If(Cat(*wcrc_bad).any()):
                        m.d.sync += fail(ErrorCause.WEIGHT_CRC)
                        m.next = "ERROR"
                    with m.Else():
                        m.d.comb += instr_done.eq(1)
                        m.next = "DISPATCH"
            with state("RUN_TOKEN"):
                m.d.comb += [busy.eq(1), feed_token.eq(1)]
                with m.If(epi.done):
                    m.d.comb += instr_done.eq(1)
                    m.next = "DISPATCH"
            with state("END"):
                # padding words, then the trailer; the logits (if any) went out during the LM head
                m.d.comb += busy.eq(1)
                # pad_words = (-(n_logits + 8)) & 15, registered: n_logits is stable for cycles before END
                idx = Signal(5)               # cnt <= pad_words + 8 <= 24 here: five bits (a short trailer mux)
                m.d.comb += idx.eq(cnt[:5])
                crc_gap = Signal()            # the cycle before the CRC word: nothing is sent
                m.d.comb += out_valid.eq(~crc_gap)
                with m.If(idx < pad_words):
                    m.d.comb += out_word.eq(0)
                with m.Else():
                    k = idx - pad_words
                    with m.Switch(k):
                        with m.Case(0):
                            m.d.comb += out_word.eq(isa.OUTPUT_MAGIC)
                        with m.Case(1):
                            m.d.comb += out_word.eq(position)
                        with m.Case(2):
                            m.d.comb += out_word.eq(epi.argmax_index)
                        with m.Case(3):
                            m.d.comb += out_word.eq(epi.argmax_value)
                        with m.Case(4):
                            m.d.comb += out_word.eq(out_scale_m)
                        with m.Case(5):
                            m.d.comb += out_word.eq(out_scale_s.as_signed())
                        with m.Case(6):
                            m.d.comb += out_word.eq(n_logits)
                        with m.Case(7):
                            m.d.comb += crc_gap.eq(1)
                        with m.Case(8):
                            m.d.comb += [out_word.eq(crc_o.crc), out_last.eq(1)]
                with m.If(out_take | crc_gap):
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(out_last):
                        m.d.sync += [cnt.eq(0), bank_flip.eq(1)]
                        m.next = "COMMIT"
            with state("COMMIT", guarded=False):
                m.d.comb += instr_done.eq(1)      # END_TOKEN completes with the commit
                m.d.sync += [state_bank.eq(~state_bank), state_valid.eq(1), bank_flip.eq(0), done.eq(1),
                             position.eq(position), ctr[Counter.TOKENS].eq(ctr[Counter.TOKENS] + 1),
                             cnt.eq(0)]
                m.next = "TOKEN"
            with state("ERROR", guarded=False):
                m.d.comb += [draining.eq(1), soft_rst.eq(1)]
                m.d.sync += [cnt.eq(0), tok_pending.eq(0)]
                # an output packet left open (an error while the LM head streamed its logits) is closed by
                # one word with tlast, so that the next token's packet is not appended to it
                with m.If(~first_out):
                    m.d.comb += [out_valid.eq(1), out_word.eq(isa.OUTPUT_ABORT_WORD), out_last.eq(1)]
                with m.If(regs.clear):
                    m.d.sync += clear_pending.eq(1)
                with m.If((regs.clear | clear_pending) & first_out):
                    m.d.sync += [err.eq(0), err_cause.eq(0), clear_pending.eq(0)]
                    m.next = "TOKEN"
        with m.If(gear0_on & wfifo.r_rdy & gear[0].i.ready):
            m.d.sync += g0_cnt.eq(g0_cnt + 1)
        self._debug = {"fsm": fsm, "ctr": ctr, "cnt": cnt, "instr_idx": instr_idx, "err_cause": err_cause,
                       "beat_full": beat_full, "widx": widx, "word": word}
        # the output CRC restarts with each packet: after the previous trailer
        with m.If(out_take):
            m.d.sync += first_out.eq(out_last)
        m.d.comb += old_valid.eq(state_valid)
        return m


def block_rows(n, channels: int):
    """``ceil(n / channels)`` (channel 0's rows of an ``n``-row GEMV; ``n`` unsigned, below ``2**16``) without a
    divider: a shift, or for 3 channels ``((n + 2) * 43691) >> 17``, exact for ``n + 2 < 2**17`` since
    ``3 * 43691 = 2**17 + 1`` (docs/ISA.md: block ``c`` holds rows ``c, c + C, ...``)."""
    if channels == 3:
        return ((n + 2) * 43691) >> 17
    return (n + channels - 1) >> (channels - 1).bit_length()


def channel_rows(n, channels: int, c: int):
    """Rows of channel ``c`` in an ``n``-row GEMV, ``ceil((n - c) / channels)`` (0 when ``n <= c``), without a
    divider (as :func:`block_rows`, which is channel 0's)."""
    if c == 0:
        return block_rows(n, channels)
    if channels == 3:
        return Mux(n > c, ((n + (2 - c)) * 43691) >> 17, 0)
    return Mux(n > c, (n + (channels - 1 - c)) >> (channels - 1).bit_length(), 0)


def block_sections(blk_plus, trits_per_byte: int):
    """64-byte sections of a weight block, ``ceil((ceil(trits / per) + 4) / 64)`` (its packed trits and CRC word:
    ``host.image.channel_block_bytes``), from ``blk_plus = trits + 68 * trits_per_byte - 1`` (unsigned, below
    ``2**32 + 340``): ``floor(blk_plus / 256)`` for 2-bit packing, ``floor(floor(blk_plus / 64) / 5)`` for
    base-3 as ``(z * 13421773) >> 26``, exact for ``z < 2**26`` since ``5 * 13421773 = 2**26 + 1``."""
    if trits_per_byte == 5:
        return ((blk_plus >> 6) * 13421773) >> 26
    assert trits_per_byte == 4
    return blk_plus >> 8


def Mux3(cond, value):  # noqa: N802 - a value when cond, else 0
    return Mux(cond, value, 0)
