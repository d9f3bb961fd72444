"""The core's sequencer: one token from its packet to the commit, and the epilogue's input (docs/RTL.md).

:class:`Sequencer` reads the token packet and the image header word by word (through
:class:`hw.fetch.Channel0Reader`), checks them, then dispatches the instructions that
:class:`hw.fetch.InstructionFetcher` has fetched and checked, driving the datapath for each: ScalarUnit ->
Quantizer -> per channel TritGearbox -> TernaryGemv, rows merged in order into the Epilogue
(:class:`EpilogueFeed`). END_TOKEN has :class:`hw.framer.OutputFramer` send the output trailer, then commits
the recurrent state (a bank flip). An error stops the token: the committed state is untouched, ``STATUS.error``
and ``ERROR_CAUSE``/``ERROR_WHERE`` say why, the datapath is held in reset (``soft_rst``) and every input is
drained (never blocking the host's DMA) until ``CTRL.clear``.
"""

from contextlib import contextmanager

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import isa
from hw import numerics as nx
from hw.crc_pipe import CrcPipe
from hw.epilogue import EpilogueConfig
from hw.fetch import FetchSignature, WordPortSignature, flag
from hw.framer import FramerSignature
from hw.gearbox import GearboxCmd
from hw.isa import Buffer, ErrorCause, InstrFlags, InstrHeader, MicroOp, Opcode, TokenHeader, TritPacking
from hw.quant import QuantCmd
from hw.regs import HostSignature
from hw.scalar import ScalarRequest, ScalarResult, SsqBias
from hw.streams import acc_row_layout

__all__ = ["SEQUENCER_EVENTS", "SequencerEventsSignature", "FeedSignature", "Sequencer", "EpilogueFeed"]

#: word index of each TokenHeader field in the token packet
_TOKEN_WORD = {name: isa.field_span(TokenHeader, (name,))[0] // 32 for name in ("magic", "position", "flags",
                                                                                   "length")}
_TOKEN_HEADER_WORDS = isa.layout_bytes(TokenHeader) // 4
_HEADER_WORDS = isa.layout_bytes(InstrHeader) // 4


#: The counters the sequencer counts (one increment a cycle each), by :class:`hw.isa.Counter` name
SEQUENCER_EVENTS = ("cycles", "instructions", "stream_stalls", "gemv_cycles", "quant_cycles", "scalar_cycles",
                    "tokens")


class SequencerEventsSignature(wiring.Signature):
    """One Out(1) per name of :data:`SEQUENCER_EVENTS`: the counter counts this cycle."""

    def __init__(self):
        super().__init__({name: Out(1) for name in SEQUENCER_EVENTS})


class FeedSignature(wiring.Signature):
    """The sequencer's side of :class:`EpilogueFeed`: ``token`` Out(1): the token's vector feeds the epilogue
    (LOAD_TOKEN); ``rows`` Out(1): the GEMV rows do; ``restart`` Out(1): from element 0; ``kill`` Out(1):
    drop a pending token element; ``n`` Out(16): the instruction's rows; ``hidden`` Out(16): the token's
    elements."""

    def __init__(self):
        super().__init__({"token": Out(1), "rows": Out(1), "restart": Out(1), "kill": Out(1),
                          "n": Out(16), "hidden": Out(16)})


class Sequencer(wiring.Component):
    """The token's state machine (see the module notes; the states in docs/RTL.md).

    Parameters
    ----------
    channels : int
    packing : TritPacking
    max_hidden, max_intermediate, max_layers : int
    lut_segments_log2 : int
    token_tlast : bool
        The token packet's size is checked by ``tlast`` (``TOKEN_LENGTH``), else by its ``length`` alone.
    state_in_dram : bool
        The state cache's handshake (``state_*`` below; default False: no such logic).
    tok_write : memory.WritePort.Signature
        The token buffer's write port (its address width comes from the buffer).

    Attributes
    ----------
    reader : Out(hw.fetch.WordPortSignature())
    fetch : Out(hw.fetch.FetchSignature(max_layers))
    framer : Out(hw.framer.FramerSignature())
    feed : Out(FeedSignature())
    host : Out(hw.regs.HostSignature())
    events : Out(SequencerEventsSignature())
    tok_wr : In(tok_write)
    scalar : Out(stream.Signature(ScalarRequest)); scalar_result : In(stream.Signature(ScalarResult))
    quant : Out(stream.Signature(QuantCmd)); quant_done : In(1)
    gear_cmd : Out(stream.Signature(GearboxCmd)) x channels
    lanes_valid, lanes_ready, lanes_end, bad_trit : In(channels)
        Per channel: the gearbox's chunk stream (valid, ready, ``end`` of the payload) and its invalid-trit flag.
    wcrc_done, wcrc_bad : In(channels); wcrc_clear, wcrc_preset : Out(channels)
        The weight blocks' CRC verdicts (:class:`hw.crc_pipe.BlockCrc`), cleared when a block starts.
    fifo_taken : In(1); gear0_on : Out(1)
        Gearbox 0 took a beat from the weight FIFO; gearbox 0 may take beats.
    epi_start : Out(1); epi_done : In(1); epi_cfg : Out(EpilogueConfig); epi_regs : In(ArrayLayout(64, 8))
    src : Out(Buffer)
        The quantize prologue's source.
    layer : Out(8); state_bank : Out(1); state_valid : Out(1)
        The executing instruction's layer; the bank holding the committed state; 0 while it reads as zero.
    state_need, state_busy : In(1); state_start, state_flush : Out(1)
        With ``state_in_dram`` (:class:`hw.state_cache.StateCache`'s ``need``, ``busy``, ``start``,
        ``flush``): the next instruction waits at its dispatch while the cache swaps rows (STATE_SWAP); the
        commit and an error flush the cache. Unused otherwise.
    soft_rst : Out(1)
        Error recovery: resets the datapath, drains the inputs.
    irq : Out(1)
        Token done or error (level).
    """

    #: Cycles of a CRC check after a header's last word (the CRC takes the word, then the check; ``host.perf``)
    CHECK_CYCLES = 2
    #: A GEMV's sequencing cycles beyond its prologue and rows: GEMV_START and GEMV_DRAIN (``host.perf``)
    GEMV_CYCLES = 2
    #: The cycle the quantizer's command takes (``host.perf``)
    QUANT_CMD_CYCLES = 1

    def __init__(self, *, channels: int, packing: TritPacking, max_hidden: int, max_intermediate: int,
                 max_layers: int, lut_segments_log2: int, token_tlast: bool, tok_write: memory.WritePort.Signature,
                 state_in_dram: bool = False):
        self._state_in_dram = state_in_dram
        self._channels, self._packing = channels, TritPacking(packing)
        self._max_hidden, self._max_intermediate, self._max_layers = max_hidden, max_intermediate, max_layers
        self._lut_segments_log2, self._token_tlast = lut_segments_log2, token_tlast
        C = channels
        super().__init__({
            "reader": Out(WordPortSignature()), "fetch": Out(FetchSignature(max_layers)),
            "framer": Out(FramerSignature()), "feed": Out(FeedSignature()), "host": Out(HostSignature()),
            "events": Out(SequencerEventsSignature()), "tok_wr": In(tok_write),
            "scalar": Out(stream.Signature(ScalarRequest)), "scalar_result": In(stream.Signature(ScalarResult)),
            "quant": Out(stream.Signature(QuantCmd)), "quant_done": In(1),
            "gear_cmd": Out(stream.Signature(GearboxCmd)).array(C),
            "lanes_valid": In(C), "lanes_ready": In(C), "lanes_end": In(C), "bad_trit": In(C),
            "wcrc_done": In(C), "wcrc_bad": In(C), "wcrc_clear": Out(C), "wcrc_preset": Out(C),
            "fifo_taken": In(1), "gear0_on": Out(1),
            "epi_start": Out(1), "epi_done": In(1), "epi_cfg": Out(EpilogueConfig),
            "epi_regs": In(data.ArrayLayout(unsigned(64), 8)),
            "src": Out(Buffer), "layer": Out(8), "state_bank": Out(1), "state_valid": Out(1),
            "state_need": In(1), "state_busy": In(1), "state_start": Out(1), "state_flush": Out(1),
            "soft_rst": Out(1), "irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        s = _SequencerState(self, m)
        s.datapath()

        @contextmanager
        def state(name, *, guarded=True):
            """An FSM state whose transitions yield to a fetcher error in the executing instruction and to a
            host abort (CTRL.abort) while a token is in flight."""
            with m.State(name):
                yield
                if guarded:
                    with m.If(self.fetch.err & self.fetch.err_now):
                        m.d.sync += [self.host.error_cause.eq(self.fetch.err_cause),
                                     self.host.error_where.eq(s.instr_idx), self.host.error.eq(1)]
                        m.next = "ERROR"
                    # an abort in the cycle the output packet's last word leaves is too late: that token commits
                    # (a packet that ends normally always means a committed token)
                    with m.If(self.host.abort & s.busy & ~self.framer.sent):
                        m.d.sync += s.fail(ErrorCause.ABORTED)
                        m.next = "ERROR"

        with m.FSM(init="TOKEN"):
            s.token_states(state)
            s.image_states(state)
            s.exec_states(state)
            s.gemv_states(state)
            s.end_states(state)
        return m


class _SequencerState:
    """The sequencer's registers and the logic that builds its states, in parts."""

    def __init__(self, q: Sequencer, m: Module):
        self.q, self.m = q, m
        self.busy = Signal()
        self.cnt = Signal(32)              # word counter within the current section
        self.instr_idx = Signal(32)
        self.tok_len = Signal(16)
        self.tok_words = Signal(16)        # words of the whole token packet
        self.want_logits = Signal()
        self.image = q.fetch.image         # the image header's facts (registered at IMG_CHECK)
        self.xhr = Signal(InstrHeader)     # the executing instruction's header (copied at dispatch)
        self.xh = self.xhr
        self.scale_m, self.scale_s = Signal(27), Signal(signed(8))
        self.rq_m, self.rq_s = Signal(26), Signal(6)
        self.g0_cnt = Signal(24)           # beats gearbox 0 took from the FIFO in the executing GEMV
        self.gear_cmd_sent = Signal()
        self.lanes_done = Signal(q._channels)   # channel c's block's last chunk taken
        self.instr_done = Signal()         # an instruction completes this cycle (the next one's DISPATCH follows)
        self.clear_pending = Signal()      # CTRL.clear while an aborted output packet was still being closed
        self.cfg_ops = Signal(data.ArrayLayout(MicroOp, isa.MAX_OPS))
        self.cfg_nops = Signal(4)
        self.cfg_raw = Signal()
        m.submodules.crc = self.crc = CrcPipe(32)
        self.words = q.reader.words
        m.d.comb += [self.crc.data.eq(self.words.payload.data),
                     self.crc.valid.eq(self.words.valid & self.words.ready)]

    def fail(self, cause: ErrorCause):
        h = self.q.host
        return [h.error_cause.eq(cause.value), h.error_where.eq(self.instr_idx), h.error.eq(1)]

    def datapath(self):
        """The datapath's commands and the counters' events, from the registers and the executing header."""
        q, m, xh = self.q, self.m, self.xh
        C = q._channels
        ih = q.fetch.instr
        m.d.sync += self.image.n_instructions_m1.eq(self.image.n_instructions - 1)
        m.d.comb += [q.host.busy.eq(self.busy), q.irq.eq(q.host.done | q.host.error),
                     q.events.cycles.eq(self.busy), q.events.instructions.eq(self.instr_done),
                     q.epi_cfg.ops.eq(self.cfg_ops), q.epi_cfg.n_ops.eq(self.cfg_nops),
                     q.epi_cfg.s_mant.eq(self.scale_m), q.epi_cfg.s_shift.eq(self.scale_s),
                     q.epi_cfg.raw.eq(self.cfg_raw),
                     q.feed.n.eq(xh.n), q.feed.hidden.eq(self.image.hidden),
                     q.framer.position.eq(q.host.position), q.framer.scale_mant.eq(self.scale_m),
                     q.framer.scale_shift.eq(self.scale_s), q.framer.out_frac.eq(xh.out_frac),
                     q.soft_rst.eq(q.reader.drain), q.fetch.kill.eq(q.reader.drain)]
        # the scale's statistic ssq_with_bias(R[ssq_reg], ssq_bias, ssq_bias_shift), formed from the dispatch on:
        # the dispatched header is still in the header register and the registers are final in that cycle (the
        # epilogue's done came at least a cycle before, its next start comes after SCALAR); SsqBias takes two
        # cycles (a shift, then the two 33-bit halves of the sum), so it is ready in SCALAR
        m.submodules.ssq_bias = ssqb = SsqBias()
        m.d.comb += [ssqb.load.eq(q.fetch.dispatch), ssqb.bias.eq(ih.ssq_bias),
                     ssqb.bias_shift.eq(ih.ssq_bias_shift), q.scalar.payload.ssq.eq(ssqb.o)]
        with m.Switch(ih.ssq_reg):
            for k in range(8):
                with m.Case(k):
                    m.d.comb += ssqb.ssq.eq(q.epi_regs[k])
        m.d.comb += [q.scalar.payload.cb_mant.eq(xh.cb_mant), q.scalar.payload.cb_shift.eq(xh.cb_shift),
                     q.scalar.payload.out_frac.eq(xh.out_frac)]
        # the scalar unit's absmax operand, selected a cycle ahead (registered): the registers are stable from the
        # previous epilogue's end, and xh from the dispatch, both at least a cycle before SCALAR
        with m.Switch(xh.amax_reg):
            for k in range(8):
                with m.Case(k):
                    m.d.sync += q.scalar.payload.amax.eq(q.epi_regs[k][:32])
        m.d.comb += [q.quant.payload.k.eq(xh.k), q.quant.payload.q_shift.eq(xh.q_shift),
                     q.quant.payload.qconst.eq(flag(xh.flags, InstrFlags.QCONST)), q.quant.payload.r_mant.eq(self.rq_m),
                     q.quant.payload.r_shift.eq(self.rq_s)]
        for c, cmd in enumerate(q.gear_cmd):
            m.d.comb += [cmd.payload.rows.eq((xh.n + (C - 1 - c)) // C if C > 1 else xh.n),
                         cmd.payload.k.eq(xh.k)]
        with m.If(q.fifo_taken):
            m.d.sync += self.g0_cnt.eq(self.g0_cnt + 1)

    # ------------------------------------------------------------------ token packet and image header
    def token_states(self, state):
        q, m, w = self.q, self.m, self.words
        rd, h = q.reader, q.host
        word = w.payload.data
        with state("TOKEN"):
            # token packet, word by word: magic, position, flags, length, payload, padding, CRC
            m.d.comb += [rd.mode.eq(1), rd.more.eq(1), self.busy.eq(w.valid | rd.beat_valid),
                         w.ready.eq(1)]
            with m.If(w.valid):
                m.d.comb += self.crc.start.eq(self.cnt == 0)
                m.d.sync += self.cnt.eq(self.cnt + 1)
                with m.Switch(self.cnt):
                    with m.Case(_TOKEN_WORD["magic"]):
                        # ERROR_WHERE of the token packet's and the image header's errors (and of an abort
                        # before the first dispatch): outside any instruction
                        m.d.sync += [h.done.eq(0), self.instr_idx.eq(isa.NO_INSTRUCTION)]
                        with m.If(word != isa.TOKEN_MAGIC):
                            m.d.sync += self.fail(ErrorCause.TOKEN_MAGIC)
                            m.d.sync += h.error_where.eq(isa.NO_INSTRUCTION)   # instr_idx loads it this cycle
                            m.next = "ERROR"
                    with m.Case(_TOKEN_WORD["position"]):
                        m.d.sync += h.position.eq(word)
                    with m.Case(_TOKEN_WORD["flags"]):
                        m.d.sync += self.want_logits.eq(word[0])   # TokenHeader.flags bit 0: send the logits
                    with m.Case(_TOKEN_WORD["length"]):
                        # header, payload and CRC word, in whole 64-byte sections
                        m.d.sync += [self.tok_len.eq(word),
                                     self.tok_words.eq(((4 * _TOKEN_HEADER_WORDS + 4 + 4 * word[:16] + 63) >> 6)
                                                       << 4)]
                        with m.If((word == 0) | (word > q._max_hidden)):
                            m.d.sync += self.fail(ErrorCause.TOKEN_LENGTH)
                            m.next = "ERROR"
                payload = self.cnt - _TOKEN_HEADER_WORDS
                with m.If((self.cnt >= _TOKEN_HEADER_WORDS) & (self.cnt < _TOKEN_HEADER_WORDS + self.tok_len)):
                    m.d.comb += [q.tok_wr.addr.eq(payload), q.tok_wr.data.eq(word), q.tok_wr.en.eq(1)]
                # the packet's size: tlast on its last word, and on no word before it (TOKEN_LENGTH)
                with m.If((self.cnt >= _TOKEN_HEADER_WORDS) & (self.cnt == self.tok_words - 1)):
                    with m.If(w.payload.last | (not q._token_tlast)):
                        m.d.sync += self.cnt.eq(0)
                        m.next = "TOKEN_WAIT"
                    with m.Else():
                        m.d.sync += self.fail(ErrorCause.TOKEN_LENGTH)
                        m.next = "ERROR"
                if q._token_tlast:
                    with m.Elif(w.payload.last & (self.cnt != 0)):
                        m.d.sync += self.fail(ErrorCause.TOKEN_LENGTH)
                        m.next = "ERROR"
        with state("TOKEN_WAIT"):
            m.d.comb += [rd.mode.eq(1), self.busy.eq(1)]
            m.next = "TOKEN_CRC"      # the CRC takes the packet's last word (a cycle behind the stream)
        with state("TOKEN_CRC"):
            m.d.comb += [rd.mode.eq(1), self.busy.eq(1)]
            with m.If(~self.crc.match):
                m.d.sync += self.fail(ErrorCause.TOKEN_CRC)
                m.next = "ERROR"
            with m.Else():
                m.next = "IMG_HDR"
        with state("IMG_HDR"):
            # never past the image header's last beat: the fetcher reads the program
            last_word = self.cnt == _HEADER_WORDS - 1
            m.d.comb += [rd.mode.eq(1), rd.more.eq(~last_word), self.busy.eq(1), w.ready.eq(1)]
            with m.If(w.valid):
                m.d.comb += [self.crc.start.eq(self.cnt == 0), rd.shift.eq(1)]
                m.d.sync += self.cnt.eq(self.cnt + 1)
                with m.If(w.payload.last & ~last_word):   # tlast inside the image header
                    m.d.sync += self.fail(ErrorCause.TRUNCATED)
                    m.next = "ERROR"
                with m.Elif(last_word):
                    m.d.sync += self.cnt.eq(0)
                    m.next = "IMG_WAIT"

    def image_states(self, state):
        q, m, img = self.q, self.m, self.image
        with state("IMG_WAIT"):
            m.d.comb += self.busy.eq(1)
            m.next = "IMG_CHECK"      # the CRC takes the header's last word (a cycle behind the stream)
        with state("IMG_CHECK"):
            m.d.comb += self.busy.eq(1)
            hv = data.View(isa.ImageHeader, q.reader.header)
            nl = len(img.layer_mask)
            m.d.sync += [img.hidden.eq(hv.hidden), img.intermediate.eq(hv.intermediate),
                         img.n_layers.eq(hv.n_layers), img.vocab.eq(hv.vocab),
                         img.n_instructions.eq(hv.n_instructions), img.image_words.eq(hv.image_words),
                         img.vmax.eq(Mux(hv.hidden > hv.intermediate, hv.hidden, hv.intermediate)),
                         img.layer_mask.eq(_layer_mask(hv.n_layers, nl))]
            with m.If(hv.magic != isa.IMAGE_MAGIC):
                m.d.sync += self.fail(ErrorCause.BAD_MAGIC)
                m.next = "ERROR"
            with m.Elif(hv.version != isa.ISA_VERSION):
                m.d.sync += self.fail(ErrorCause.BAD_VERSION)
                m.next = "ERROR"
            with m.Elif(~self.crc.match):
                m.d.sync += self.fail(ErrorCause.HEADER_CRC)
                m.next = "ERROR"
            with m.Elif((hv.packing != q._packing) | (hv.channels != q._channels)
                        | (hv.hidden == 0) | (hv.hidden > q._max_hidden)
                        | (hv.intermediate == 0) | (hv.intermediate > q._max_intermediate)
                        | (hv.n_layers == 0) | (hv.n_layers > q._max_layers) | (hv.vocab == 0)
                        | (hv.lut_segments_log2 != q._lut_segments_log2) | (hv.gate_frac != nx.GATE_FRAC)):
                m.d.sync += self.fail(ErrorCause.BAD_SHAPE)
                m.next = "ERROR"
            with m.Elif(q.reader.beat_last & ~self.words.valid):   # the image ends with its header
                m.d.sync += self.fail(ErrorCause.TRUNCATED)
                m.next = "ERROR"
            with m.Elif(hv.hidden != self.tok_len):
                m.d.sync += self.fail(ErrorCause.TOKEN_LENGTH)
                m.next = "ERROR"
            with m.Else():
                m.d.comb += q.fetch.start.eq(1)
                m.next = "DISPATCH"
        with state("DISPATCH"):
            # the next instruction, once the fetcher has it (or the error the fetcher found in it)
            f, ih = q.fetch, q.fetch.instr
            m.d.comb += self.busy.eq(1)
            with m.If(f.err):
                m.d.sync += [q.host.error_cause.eq(f.err_cause),
                             q.host.error_where.eq(Mux(f.err_now, self.instr_idx, f.idx)), q.host.error.eq(1)]
                m.next = "ERROR"
            if q._state_in_dram:
                with m.Elif(f.ready & (q.state_need | q.state_busy)):   # its layer's state rows first
                    m.d.comb += q.state_start.eq(q.state_need)
                    m.next = "STATE_SWAP"
            with m.Elif(f.ready):
                m.d.comb += [f.dispatch.eq(1), q.wcrc_clear[0].eq(1)]   # its channel-0 block streams from now
                m.d.sync += [self.xhr.eq(ih), self.instr_idx.eq(f.idx), q.src.eq(ih.src), q.layer.eq(ih.layer),
                             self.cfg_ops.eq(ih.ops), self.cfg_nops.eq(ih.n_ops), self.cnt.eq(0)]
                with m.If(ih.opcode == Opcode.END_TOKEN):
                    m.next = "END"
                with m.Else():
                    m.next = "EXEC"

        if q._state_in_dram:
            with state("STATE_SWAP"):
                # the state cache writes a row back and fills the next layer's
                m.d.comb += self.busy.eq(1)
                with m.If(~q.state_busy):
                    m.next = "DISPATCH"

    # ------------------------------------------------------------------ an instruction
    def exec_states(self, state):
        q, m, xh = self.q, self.m, self.xh
        with state("EXEC"):
            m.d.comb += [self.busy.eq(1), q.fetch.qc_busy.eq(1), q.feed.restart.eq(1)]
            m.d.sync += [self.gear_cmd_sent.eq(0), self.g0_cnt.eq(0)]
            with m.If(xh.opcode == Opcode.LOAD_TOKEN):
                m.d.sync += self.cfg_raw.eq(1)
                m.d.comb += q.epi_start.eq(1)
                m.next = "RUN_TOKEN"
            with m.Elif(flag(xh.flags, InstrFlags.REUSE_CODES)):   # the previous GEMV's codes and scale
                m.d.sync += self.cfg_raw.eq(0)
                m.next = "GEMV_START"
            with m.Else():
                m.d.sync += self.cfg_raw.eq(0)
                m.next = "SCALAR"
        with state("SCALAR"):
            m.d.comb += [self.busy.eq(1), q.fetch.qc_busy.eq(1), q.scalar.valid.eq(1), q.events.scalar_cycles.eq(1)]
            with m.If(q.scalar.ready):
                m.next = "SCALAR_WAIT"
        with state("SCALAR_WAIT"):
            r = q.scalar_result
            m.d.comb += [self.busy.eq(1), q.fetch.qc_busy.eq(1), r.ready.eq(1), q.events.scalar_cycles.eq(1)]
            with m.If(r.valid):
                m.d.sync += [self.rq_m.eq(r.payload.r_mant), self.rq_s.eq(r.payload.r_shift),
                             self.scale_m.eq(r.payload.s_mant), self.scale_s.eq(r.payload.s_shift)]
                m.next = "QUANT"
        with state("QUANT"):
            m.d.comb += [self.busy.eq(1), q.fetch.qc_busy.eq(1), q.quant.valid.eq(1)]
            with m.If(q.quant.ready):
                m.next = "QUANT_WAIT"
        with state("QUANT_WAIT"):
            m.d.comb += [self.busy.eq(1), q.fetch.qc_busy.eq(1), q.events.quant_cycles.eq(1)]
            with m.If(q.quant_done):
                m.next = "GEMV_START"
        with state("RUN_TOKEN"):
            m.d.comb += [self.busy.eq(1), q.feed.token.eq(1)]
            with m.If(q.epi_done):
                m.d.comb += self.instr_done.eq(1)
                m.next = "DISPATCH"

    def gemv_states(self, state):
        q, m, xh = self.q, self.m, self.xh
        C = q._channels
        with state("GEMV_START"):
            m.d.comb += [self.busy.eq(1), q.epi_start.eq(1)]
            m.d.sync += self.lanes_done.eq(0)
            # channels > 0 take their block's beats from the gearbox command on (GEMV); a channel without rows
            # has an empty block (no beats, no CRC word)
            for c in range(1, C):
                m.d.comb += q.wcrc_clear[c].eq(1)
            if C > 1:   # the whole signal in one assignment (bit 0 a constant alone made an empty `always @*`)
                m.d.comb += q.wcrc_preset.eq(Cat(Const(0, 1), *[q.gear_cmd[c].payload.rows == 0 for c in range(1, C)]))
            with m.If(flag(xh.flags, InstrFlags.LOGITS)):  # this is the LM head
                m.d.comb += q.framer.head.eq(1)
            m.next = "GEMV"
        with state("GEMV"):
            m.d.comb += [self.busy.eq(1), q.feed.rows.eq(1), q.gear0_on.eq(1),
                         q.framer.logits.eq(flag(xh.flags, InstrFlags.LOGITS) & self.want_logits)]
            # the lanes are busy (or wait for weights) until every channel's block ended; the adder tree and
            # epilogue drain after that is neither (docs/ISA.md: GEMV_CYCLES, STREAM_STALLS)
            m.d.comb += [q.events.gemv_cycles.eq(~self.lanes_done.all()),
                         q.events.stream_stalls.eq((~q.lanes_valid & q.lanes_ready & ~self.lanes_done).any())]
            for c in range(C):
                with m.If(q.lanes_valid[c] & q.lanes_ready[c] & q.lanes_end[c]):
                    m.d.sync += self.lanes_done[c].eq(1)
            # one command per channel, once
            for cmd in q.gear_cmd:
                m.d.comb += cmd.valid.eq(~self.gear_cmd_sent)
            with m.If(~self.gear_cmd_sent & Cat(*[cmd.ready for cmd in q.gear_cmd]).all()):
                m.d.sync += self.gear_cmd_sent.eq(1)
            with m.If(q.bad_trit.any()):
                m.d.sync += self.fail(ErrorCause.BAD_TRIT)
                m.next = "ERROR"
            with m.Elif(q.epi_done):
                m.next = "GEMV_DRAIN"
        with state("GEMV_DRAIN"):
            # the epilogue is done; the FIFO may still hold the block's padding beats. Every trit was decoded
            # (no BAD_TRIT): the weight blocks' CRC verdicts decide, once every channel's block has ended
            m.d.comb += [self.busy.eq(1), q.gear0_on.eq(1)]
            with m.If((self.g0_cnt >= q.fetch.block_beats) & q.wcrc_done.all()):
                with m.If(q.wcrc_bad.any()):
                    m.d.sync += self.fail(ErrorCause.WEIGHT_CRC)
                    m.next = "ERROR"
                with m.Else():
                    m.d.comb += self.instr_done.eq(1)
                    m.next = "DISPATCH"

    # ------------------------------------------------------------------ the token's end, errors
    def end_states(self, state):
        q, m, h = self.q, self.m, self.q.host
        with state("END"):
            # the output trailer (the logits, if any, went out during the LM head); then the commit
            m.d.comb += [self.busy.eq(1), q.framer.trailer.eq(1)]
            with m.If(q.framer.sent):
                m.next = "COMMIT"
        with state("COMMIT", guarded=False):
            m.d.comb += [self.instr_done.eq(1), q.events.tokens.eq(1)]     # END_TOKEN completes with the commit
            if q._state_in_dram:
                m.d.comb += q.state_flush.eq(1)
            m.d.sync += [q.state_bank.eq(~q.state_bank), q.state_valid.eq(1), h.done.eq(1), self.cnt.eq(0)]
            m.next = "TOKEN"
        with state("ERROR", guarded=False):
            m.d.comb += [q.reader.drain.eq(1), q.feed.kill.eq(1), q.framer.close.eq(1)]
            if q._state_in_dram:
                m.d.comb += q.state_flush.eq(1)
            m.d.sync += self.cnt.eq(0)
            with m.If(h.clear):
                m.d.sync += self.clear_pending.eq(1)
            # an output packet left open (an error while the LM head streamed its logits) is closed first
            with m.If((h.clear | self.clear_pending) & ~q.framer.open):
                m.d.sync += [h.error.eq(0), h.error_cause.eq(0), self.clear_pending.eq(0)]
                m.next = "TOKEN"


def _layer_mask(n_layers, nl: int):
    """``2**n_layers - 1`` in ``nl`` bits (``n_layers <= nl`` after the header checks)."""
    return (Const(1, nl + 1) << n_layers[:ceil_log2(nl + 1)]) - 1


class EpilogueFeed(wiring.Component):
    """The epilogue's input: the token's vector (LOAD_TOKEN: read from the token buffer one element ahead,
    presented when the read data arrives) or the GEMV's rows in row order, channel by channel (row ``r`` from
    channel ``r mod channels``).

    Parameters
    ----------
    channels : int
    acc_bits : int
        The GEMV rows' accumulator width.
    element : data.Layout
        The epilogue's input payload (``value``, ``index``, ``last``: :func:`hw.epilogue.input_layout`).
    tok_read : memory.ReadPort.Signature
        The token buffer's read port.

    Attributes
    ----------
    ctrl : In(FeedSignature())
    rows : In(stream.Signature(acc_row_layout(acc_bits))) x channels
    tok_rd : In(tok_read)
    o : Out(stream.Signature(element))
    """

    def __init__(self, *, channels: int, acc_bits: int, element, tok_read: memory.ReadPort.Signature):
        self._channels = channels
        super().__init__({"ctrl": In(FeedSignature()),
                          "rows": In(stream.Signature(acc_row_layout(acc_bits))).array(channels),
                          "tok_rd": In(tok_read), "o": Out(stream.Signature(element))})

    def elaborate(self, platform):
        m = Module()
        C, ctrl, o, rd = self._channels, self.ctrl, self.o, self.tok_rd
        tok_idx = Signal(16)
        tok_pending = Signal()        # a token element was read last cycle
        tok_pending_idx = Signal(16)
        row = Signal(16)
        rsel = Signal(range(max(C, 2)))
        m.d.comb += rd.en.eq(1)
        with m.If(ctrl.token):
            # read one element ahead; present it when the read data arrives
            m.d.comb += [o.payload.value.eq(rd.data), o.payload.index.eq(tok_pending_idx),
                         o.payload.last.eq(tok_pending_idx == ctrl.hidden - 1), o.valid.eq(tok_pending)]
            m.d.comb += rd.addr.eq(tok_idx)
            with m.If(~tok_pending | o.ready):
                with m.If(tok_idx < ctrl.hidden):
                    m.d.sync += [tok_pending.eq(1), tok_pending_idx.eq(tok_idx), tok_idx.eq(tok_idx + 1)]
                with m.Else():
                    m.d.sync += tok_pending.eq(0)
            with m.Else():
                m.d.comb += rd.addr.eq(tok_pending_idx)
        with m.If(ctrl.rows):
            for c, r in enumerate(self.rows):
                with m.If(rsel == c):
                    m.d.comb += [o.payload.value.eq(r.payload.acc), o.payload.index.eq(row),
                                 o.payload.last.eq(row == ctrl.n - 1), o.valid.eq(r.valid), r.ready.eq(o.ready)]
            with m.If(o.valid & o.ready):
                m.d.sync += row.eq(row + 1)
                if C > 1:
                    with m.If(rsel == C - 1):
                        m.d.sync += rsel.eq(0)
                    with m.Else():
                        m.d.sync += rsel.eq(rsel + 1)
        with m.If(ctrl.restart):
            m.d.sync += [row.eq(0), rsel.eq(0), tok_idx.eq(0), tok_pending.eq(0)]
        with m.If(ctrl.kill):
            m.d.sync += tok_pending.eq(0)
        return m
