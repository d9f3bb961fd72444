"""Cycle model of the accelerator and the decode roofline of docs/ARCHITECTURE.md section 4.

The golden device predicts every counter of :class:`hw.isa.Counter` per instruction from this model;
the RTL's counters are compared against it. The model is the datapath's schedule written down. The
default schedule (every option of :class:`BuildParams` off: the schedule of hw/top.py **as built**) runs
two units side by side. A **fetcher** reads channel 0 one instruction ahead of execution: the next
instruction's 64-byte header at one beat per cycle (``hb = 64 / beat_bytes`` beats) and its check (two
cycles), then its constants (``cb`` beats, into the constant bank the executing instruction does not read,
but not while the executing instruction's quantize pass still reads QC) and their CRC check (a cycle);
once the sequencer has dispatched it, a GEMV's channel-0 weight block goes into a weight FIFO of
``weight_fifo_beats`` beats (from which gearbox 0 reads), and the next header follows at once. The
**sequencer** dispatches an instruction (a cycle) once the previous one is done and the fetcher has it,
and executes it. Per instruction ``i`` (``X[i-1]``: the previous instruction's last cycle; ``F``: the cycle
the fetcher starts this header, the cycle after the previous dispatch or after the previous GEMV's last
channel-0 weight beat entered the FIFO; ``Q``: the first cycle the previous instruction no longer reads
QC, its GEMV_START, or for LOAD_TOKEN its first epilogue cycle)::

    c0 = max(F + hb + 2, Q)                               first constant beat
    R  = c0 + cb + 1   (F + hb + 2 without constants)     fetched and checked
    D  = max(X[i-1] + 1, R)                               dispatch
    GEMV        X[i] = D + 1 + prologue + 1 + body + drain        EXEC, ..., GEMV_START, ...
      prologue  = SCALAR_CYCLES + 1 + ceil(K / quant_lanes) + QUANT_LATENCY       0 with REUSE_CODES
      body      = max(N, max over channels c of max(4 + rows_c * ceil(K / lanes_per_channel),
                                                    ceil(block_data_bytes_c / beat_bytes) + 5))
      drain     = GEMV_LATENCY + ceil(log2(lanes_per_channel)) + EPILOGUE_LATENCY + DONE_LATENCY + 1
      next F    = D + beats_0 + 1, or later when the block is deeper than the FIFO: the FIFO then
                  waits for gearbox 0 (about start + 2 + (beats_0 - 1 - weight_fifo_beats) * max(1, compute_0 /
                  beats_0), ``start`` the GEMV_START cycle)
    LOAD_TOKEN  F = 1 + token_packet_words + 2 + (16 + 2) + 1     (token packet and image header, word by word)
                X = D + 1 + H + EPILOGUE_LATENCY + DONE_LATENCY;   next F = D + 1
    END_TOKEN   X = D + ((-(V + 8)) mod 16) + 8 + 1  padding, the 8-word trailer and the CRC gap (then the commit)

(``cb``: ``ceil(const_section_bytes / beat_bytes)``; ``const_section_bytes``,
:func:`host.image.const_section_bytes`: the QC vector (K words) and n_consts vectors of N words, each padded
to a whole 64-byte section; weight blocks and packets are padded to 64-byte sections too,
:data:`hw.isa.SECTION_BYTES`.) In words:

* the token packet and the image header are read one 32-bit word per cycle, each then checked in a cycle;
  instruction headers and constants at one beat per cycle, while the previous GEMV computes (in the
  cycles channel 0 does not need for weights, thanks to the weight FIFO) and while it drains: when they
  fit there, an instruction costs two sequencer cycles (DISPATCH, EXEC) before its prologue;
* a GEMV that forms new codes pays the scalar unit (:data:`SCALAR_CYCLES`: ``127/A`` and the integer
  square root in parallel, then one division), one command cycle and the quantize prologue: together the
  absmax barrier (its source vector is written by the previous instruction's epilogue, so it waits);
* each channel's lane group (``lanes / channels`` lanes) computes its rows, one row at a time, in
  ``ceil(K / lanes_per_channel)`` cycles per row, while its weight stream delivers one beat per cycle;
  the slower of the two binds (the gearbox adds :data:`GEARBOX_CMD_LATENCY` before the first chunk, or
  :data:`GEARBOX_STREAM_LATENCY` after the block's last data beat, its section padding excluded); the
  epilogue accepts one element per cycle (so ``N`` is a floor on the body); the adder tree and the
  epilogue pipeline add a fixed drain latency; a cycle starts the rows and one follows the epilogue's end;
* LOAD_TOKEN streams the token (read into its buffer with the packet) through its epilogue (one element
  per cycle); END_TOKEN sends the output packet's padding and trailer (the logits left during the LM
  head) and commits the state.

Counters (:class:`hw.isa.Counter`) are attributed to the instruction that is running: an instruction's
counters run from the end of the previous one to its own end (END_TOKEN: its commit). So the beats of an
instruction's header and constants that the fetcher takes while the previous instruction still runs are
counted in the previous instruction's ``STREAM_BEATS``, and an instruction's cost depends on the one
before it: a token is scheduled as a timeline (:func:`schedule`, :func:`token_counters`).

The build is a :class:`hw.params.BuildParams` (the one build type; imported here, ``host.perf.BuildParams``
is the same class): the model reads :data:`MODEL_FIELDS`. Its options ``overlap_headers``, ``stripe_consts``,
``overlap_prologue`` and ``stream_prologue`` model proposed schedule changes (docs/PERFORMANCE_MODEL.md says
what each needs in hardware and in the image layout).

Stream efficiency (docs/ARCHITECTURE.md section 3) is
``max(image bytes / (channels * beat bytes), trits / lanes) / cycles`` over a whole token.

Model programs of any shape (the released 370M, 1.3B and 2.7B included) come without weights from the
compiler (:func:`host.compiler.plan_model`, :func:`host.compiler.plan_shape`): the instructions
:func:`host.compiler.compile_program` emits, with their image size, so their counters are exactly those of a
compiled image of that shape.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from host.protocol import token_packet_bytes
from hw import isa
from hw.boards import facts as _facts
from hw.isa import Counter, InstrFlags, MicroOpcode, Opcode, TritPacking
from hw.params import SCHEDULE_OPTIONS, BuildParams
from hw.state_layout import state_beats

__all__ = [
    "BuildParams", "Board", "BOARDS", "LATENCY_SOURCES", "latency", "RECIP_CYCLES",
    "output_cycles", "SCHEDULE_OPTIONS", "token_counters", "schedule", "Step", "stream_efficiency", "roofline",
    "packing_bits", "MODEL_FIELDS", "instruction_bytes", "header_bytes", "drain_cycles",
    "token_prediction", "epilogue_passes", "epilogue_latency",
]

#: The latencies the cycle model reads, each from the component that has it (as FINN keeps a cycle estimate on
#: the op that generates the hardware): ``perf.<NAME>`` reads ``<module>:<attribute>`` when first asked, so this
#: module imports without Amaranth (a board host) and nothing here is a hand copy of a gateware fact.
LATENCY_SOURCES = {
    "SCALAR_CYCLES": "hw.scalar:ScalarUnit.CYCLES",            # command transfer + isqrt / 127/A / division (62)
    "QUANT_LATENCY": "hw.quant:Quantizer.LATENCY",             # quantize pipeline after the last source word (7)
    "EPILOGUE_LATENCY": "hw.epilogue:PipelinedEpilogue.LATENCY",  # entry + 10 stages per micro-op slot (86)
    "FOLDED_ENTRY_LATENCY": "hw.epilogue:FoldedEpilogue.LATENCY_BASE",  # folded: entry to the first pass (4)
    "FOLDED_PASS_CYCLES": "hw.epilogue:FoldedEpilogue.PASS_CYCLES",     # folded: one pass of the ring (11)
    "GEMV_LATENCY": "hw.gemv:TernaryGemv.BASE_LATENCY",        # after the adder tree's levels (5)
    "DONE_LATENCY": "hw.epilogue:PipelinedEpilogue.DONE_LATENCY",  # ``done`` after the last element's exit (2)
    "GEARBOX_CMD_LATENCY": "hw.gearbox:TritGearbox.CMD_LATENCY",   # a command to its first chunk (4)
    "WEIGHT_FIFO_LATENCY": "hw.fetch:WeightFifo.LATENCY",      # channel 0's weight FIFO, push to pop (2)
    "FETCH_CHECK_CYCLES": "hw.fetch:InstructionFetcher.CHECK_CYCLES",  # an instruction header's check (2)
    "SEQ_CHECK_CYCLES": "hw.sequencer:Sequencer.CHECK_CYCLES",  # a token packet's / image header's check (2)
    "GEMV_SEQ_CYCLES": "hw.sequencer:Sequencer.GEMV_CYCLES",    # GEMV_START + GEMV_DRAIN (2)
    "QUANT_CMD_CYCLES": "hw.sequencer:Sequencer.QUANT_CMD_CYCLES",  # the quantizer's command (1)
    "CRC_GAP_CYCLES": "hw.framer:OutputFramer.CRC_GAP_CYCLES",  # the output trailer's CRC word waits (1)
    "STATE_SWAP_CYCLES": "hw.state_cache:StateCache.SWAP_CYCLES",  # state in DRAM: a swap's own cycles (4)
    "STATE_WRITE_BACK_CYCLES": "hw.state_cache:StateCache.WRITE_BACK_CYCLES",  # a write-back, beyond 2 a beat (3)
    "STATE_FILL_CYCLES": "hw.state_cache:StateCache.FILL_CYCLES",  # a fill, beyond 2 a beat and the board (1)
}
#: State in DRAM (``BuildParams.state_in_dram``): cycles from a fill's command to its first beat on a DRAM board
#: (the board lends its port to the state engine once the image reader's reads are in, finishes a write-back
#: before the next command, and the read crosses to the controller's clock and back). A model, not a component
#: latency: the board's DRAM sets it.
STATE_FILL_LATENCY = 40


@functools.cache
def latency(name: str) -> int:
    """The latency ``name`` (a key of :data:`LATENCY_SOURCES`) read from its component, in core clock cycles.

    Raises
    ------
    KeyError
        For a name the table does not have.
    ModuleNotFoundError
        Without Amaranth (the gateware modules need it: ``pip install 'mmfree-fpga[hw]'``).
    """
    module, attr = LATENCY_SOURCES[name].split(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return int(obj)


def __getattr__(name: str) -> int:  # PEP 562: ``perf.SCALAR_CYCLES`` and the rest, from the components
    if name in LATENCY_SOURCES:
        return latency(name)
    if name == "OUTPUT_CYCLES":
        return output_cycles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


RECIP_CYCLES = 33      #: the part of the scalar unit the quantize pass waits for: 127/A (26-cycle division) + 7
IMAGE_HEADER_BYTES = isa.layout_bytes(isa.ImageHeader)    #: 64
INSTR_HEADER_BYTES = isa.layout_bytes(isa.InstrHeader)    #: 64
#: The sequencer reads the token packet and the image header one 32-bit word per cycle (16 cycles a header
#: whatever the bus width), then checks each (SEQ_CHECK_CYCLES); the fetcher reads instruction headers and
#: constants at one beat per cycle plus FETCH_CHECK_CYCLES for each check (hw/sequencer.py, hw/fetch.py)
HEADER_WORD_CYCLES = isa.layout_bytes(isa.InstrHeader) // 4
#: hw/top.py feeding hw/gearbox.py: the last chunk 4-5 cycles after the block's last data beat (stream-bound:
#: 5 measured on most shapes, 4 on some alignments): a measured figure of the composition, not one component's
GEARBOX_STREAM_LATENCY = 5


def output_cycles() -> int:
    """END_TOKEN after its header with ``overlap_headers``: the output packet without logits (one 64-byte
    section: header, padding, CRC) on the 32-bit output stream, the CRC gap, then the state commit."""
    return isa.SECTION_BYTES // 4 + latency("CRC_GAP_CYCLES") + 1


#: The fields of a :class:`~hw.params.BuildParams` the cycle model reads (:meth:`~hw.params.BuildParams.as_dict`
#: of them is how the benchmarks record a build).
MODEL_FIELDS = ("lanes", "channels", "bus_bits", "quant_lanes", "fmax_mhz", *SCHEDULE_OPTIONS, "weight_fifo_beats",
                "epilogue_folded")


def _beats(nbytes: int, beat_bytes: int) -> int:
    return -(-nbytes // beat_bytes)


def epilogue_passes(build: BuildParams, n_ops: int) -> int:
    """Cycles per element of the epilogue at full rate for a program of ``n_ops`` micro-ops: 1 pipelined,
    ``max(n_ops, 1)`` folded (its passes)."""
    from hw.epilogue import FoldedEpilogue, PipelinedEpilogue

    return FoldedEpilogue.passes(n_ops) if build.epilogue_folded else PipelinedEpilogue.INTERVAL


def epilogue_latency(build: BuildParams, n_ops: int = isa.MAX_OPS) -> int:
    """Epilogue cycles from an element's entry to its exit for a program of ``n_ops`` micro-ops
    (:data:`EPILOGUE_LATENCY` pipelined)."""
    from hw.epilogue import epilogue_class

    return epilogue_class(build.epilogue_folded).latency_for(n_ops)


def drain_cycles(build: BuildParams, n_ops: int = isa.MAX_OPS) -> int:
    """GEMV pipeline (adder tree included) plus epilogue pipeline plus ``done``: cycles from a GEMV's last
    lane cycle to the end of its last epilogue write (``n_ops``: the program's micro-ops, for the folded
    epilogue)."""
    from hw.gemv import TernaryGemv

    return (TernaryGemv.latency_for(build.lanes_per_channel) + epilogue_latency(build, n_ops)
            + latency("DONE_LATENCY"))


def _n_ops(ins) -> int:
    """Micro-ops of an instruction (:class:`host.compiler.InstrPlan` ``n_ops``, else its ``ops``)."""
    n = getattr(ins, "n_ops", None)
    return len(ins.ops) if n is None else n


# ------------------------------------------------------------------------------------------- bytes
def _n_consts(ins) -> int:
    n = getattr(ins, "n_consts", None)
    return len(ins.consts) if n is None else n


def _writes(ins) -> tuple[frozenset[isa.Buffer], frozenset[int]]:
    """Buffers and reduction registers an instruction's epilogue writes."""
    if hasattr(ins, "stores"):     # a host.compiler.InstrPlan
        return ins.stores, ins.reduces
    stores = frozenset(op.buf for op in ins.ops if op.op is MicroOpcode.ST)
    regs = frozenset(op.reg for op in ins.ops if op.op in (MicroOpcode.SSQ, MicroOpcode.AMAX))
    return stores, regs


def header_bytes(ins, channels: int, stripe: bool = False) -> list[int]:
    """Bytes of an instruction's header and constants section on each channel.

    Image layout today (:func:`host.image.const_section_bytes`): the 64-byte header and the constants
    section (``QC`` then ``C0..``, each vector padded to whole 64-byte sections) on channel 0. With
    ``stripe`` (:attr:`BuildParams.stripe_consts`, a proposed layout): the header on channel 0, ``QC``
    word ``k`` on channel ``k % channels`` and constant rows on the channel carrying that row, each
    channel's share of each vector padded to whole sections.
    """
    from host.image import channel_rows, const_section_bytes

    if not stripe or channels == 1:
        return [INSTR_HEADER_BYTES + const_section_bytes(ins)] + [0] * (channels - 1)

    def vector(n: int) -> int:
        return 4 * n + isa.section_pad(4 * n)

    q = InstrFlags.QCONST in ins.flags
    nc = _n_consts(ins)
    return [(INSTR_HEADER_BYTES if c == 0 else 0) + (vector(len(range(c, ins.k, channels))) if q else 0)
            + nc * vector(channel_rows(ins.n, channels, c)) for c in range(channels)]


def instruction_bytes(ins, packing: TritPacking, channels: int) -> int:
    """Image bytes of one instruction: 64-byte header, constants section, weight blocks (all padded to
    64-byte sections, as :func:`host.image.assemble` lays them out)."""
    from host.image import channel_block_bytes

    total = sum(header_bytes(ins, channels))
    if ins.opcode is Opcode.GEMV:
        total += sum(channel_block_bytes(ins.n, ins.k, channels, packing))
    return total


# ------------------------------------------------------------------------------------------- schedule
@dataclass(frozen=True)
class Step:
    """One instruction in the token's timeline (cycles from the token packet's first beat).

    ``header + prologue + body + drain == counters[Counter.CYCLES]``: the critical-path cycles this
    instruction adds after the previous one finished, split by cause (``header``: waiting for the header
    and constants; ``prologue``: the scalar unit and quantize barrier; ``body``: the lanes or the weight
    stream; ``drain``: adder tree and epilogue pipeline, or the output packet).
    """

    counters: dict[Counter, int]
    start: int        #: first lane cycle (GEMV) or epilogue start
    done: int         #: last epilogue write (the instruction is complete)
    header: int
    prologue: int
    body: int
    drain: int


@dataclass
class _Timeline:
    channels: int
    done: int = 0
    lanes_free: int = 0
    quant_free: int = 0
    done_before: int = 0        #: completion of the instruction before the previous one
    bank: int = 0               #: code buffer the previous GEMV used
    bank_free: list[int] = field(default_factory=lambda: [0, 0])
    ch_free: list[int] = field(default_factory=list)
    prev: object = None
    fetch_free: int = 0         #: as built: the cycle the fetcher starts the next header
    qc_free: int = 0            #: as built: the first cycle the executing instruction no longer reads QC
    prev_counters: dict | None = None   #: the previous instruction's counters (beats prefetched during it)
    state_layer: int | None = None      #: state in DRAM: the layer whose rows the cache holds
    state_dirty: bool = False           #: state in DRAM: its STATE_NEW row was written

    def __post_init__(self):
        if not self.ch_free:
            self.ch_free = [0] * self.channels


def _touches_state(ins) -> bool:
    """An instruction reads or writes STATE_OLD or STATE_NEW. A :class:`host.compiler.InstrPlan` lists only its
    stores: a compiled program's first instruction to touch a layer's state stores its STATE_NEW row (the MLGRU
    recurrence), and the later ones read the same layer's."""
    if hasattr(ins, "stores"):
        return isa.Buffer.STATE_NEW in ins.stores
    return any(op.buf in (isa.Buffer.STATE_OLD, isa.Buffer.STATE_NEW) for op in ins.ops[:_n_ops(ins)])


def state_swap_cycles(build: BuildParams, *, write_back: bool, fills: int) -> int:
    """Cycles an instruction waits at its dispatch while the state cache swaps rows (a build with
    ``state_in_dram``; :class:`hw.state_cache.StateCache`): the swap's own cycles, a write-back (an element a
    cycle), and ``fills`` fills (an element a cycle after :data:`STATE_FILL_LATENCY`)."""
    two_per_beat = 2 * state_beats(build.max_hidden)
    return (latency("STATE_SWAP_CYCLES")
            + (two_per_beat + latency("STATE_WRITE_BACK_CYCLES") if write_back else 0)
            + fills * (two_per_beat + latency("STATE_FILL_CYCLES") + STATE_FILL_LATENCY))


def _state_swap(ins, build: BuildParams, tl: _Timeline) -> int:
    """The swap before ``ins``'s dispatch, and the cache's new state in ``tl``. The model's token is a steady
    one: the committed state valid (a STATE_OLD fill for every layer; the first token after a reset has none),
    and no layer returned to (no STATE_NEW fill)."""
    if not build.state_in_dram:
        return 0
    if ins.opcode is Opcode.END_TOKEN:
        swap = state_swap_cycles(build, write_back=True, fills=0) if tl.state_dirty else 0
        tl.state_layer, tl.state_dirty = None, False
        return swap
    if not _touches_state(ins):
        return 0
    swap = 0
    if ins.layer != tl.state_layer:
        swap = state_swap_cycles(build, write_back=tl.state_dirty, fills=1)
        tl.state_layer, tl.state_dirty = ins.layer, False
    tl.state_dirty = tl.state_dirty or isa.Buffer.STATE_NEW in _writes(ins)[0]
    return swap


def _depends(ins, prev) -> bool:
    """True when ``ins``'s prologue needs the previous instruction's epilogue to have finished."""
    if prev is None or prev.opcode is not Opcode.GEMV:
        return True
    stores, regs = _writes(prev)
    return ins.src in stores or ins.amax_reg in regs or ins.ssq_reg in regs


def _step(ins, info, build: BuildParams, tl: _Timeline) -> Step:
    from host.image import channel_block_bytes, channel_rows

    if info.channels != build.channels:
        raise ValueError(f"image has {info.channels} channel(s), the build {build.channels}")
    c = {k: 0 for k in Counter}
    c[Counter.INSTRUCTIONS] = 1
    beat = build.beat_bytes
    hbytes = header_bytes(ins, build.channels, build.stripe_consts)
    if ins.opcode is Opcode.LOAD_TOKEN:
        hbytes[0] += IMAGE_HEADER_BYTES   # the image header precedes the program's first instruction
    head = [_beats(b, beat) for b in hbytes]
    c[Counter.STREAM_BEATS] += sum(head)
    seq = 0                    # sequencer cycles outside the header (as built: hw/top.py)
    t0 = tl.done
    fetch = None
    if not build.overlap_headers:
        # hw/top.py's fetcher reads this instruction's header at beat rate (hb beats), checks it (a cycle), loads
        # its constants (cb beats, once the executing instruction no longer reads QC) and checks their CRC (a
        # cycle); the sequencer dispatches it (a cycle, not before the previous instruction is done) and
        # executes it from EXEC (a cycle; END_TOKEN goes straight to its output packet). LOAD_TOKEN's fetch
        # follows the token packet and the image header, read word by word.
        hb = _beats(INSTR_HEADER_BYTES, beat)
        cb = _beats(hbytes[0] - INSTR_HEADER_BYTES
                    - (IMAGE_HEADER_BYTES if ins.opcode is Opcode.LOAD_TOKEN else 0), beat)
        if ins.opcode is Opcode.LOAD_TOKEN:
            tok_words = token_packet_bytes(ins.n) // 4
            h0 = t0 + 1 + tok_words + 2 * latency("SEQ_CHECK_CYCLES") + HEADER_WORD_CYCLES + 1
            ready = h0
        else:
            h0 = tl.fetch_free
            ready = t0 + 1
        c0 = max(h0 + hb + latency("FETCH_CHECK_CYCLES"), tl.qc_free)     # first constant beat
        r = c0 + cb + latency("SEQ_CHECK_CYCLES") if cb else h0 + hb + latency("FETCH_CHECK_CYCLES")
        # striped constants on channels > 0 (a proposed layout): they precede the weights there
        dispatch = max(ready, r, *(t0 + 1 + h for h in head[1:])) + _state_swap(ins, build, tl)
        head_done = dispatch + (0 if ins.opcode is Opcode.END_TOKEN else 1)
        # this instruction's header and constant beats taken while the previous instruction still ran
        early = min(max(t0 - h0 + 1, 0), hb) + (min(max(t0 - c0 + 1, 0), cb) if cb else 0)
        if early and tl.prev_counters is not None:
            tl.prev_counters[Counter.STREAM_BEATS] += early
            c[Counter.STREAM_BEATS] -= early
        fetch = dispatch + 1   # the next header: after this one's dispatch (and a GEMV's channel-0 block)
        head_done_ch = [head_done] * build.channels
    else:
        # double-buffered header unit: this header replaces the one of the instruction before the previous
        swap = _state_swap(ins, build, tl)
        head_done_ch = [max(tl.ch_free[ch], tl.done_before) + h + swap for ch, h in enumerate(head)]
    head_done = max(head_done_ch)
    new_ch = [max(t, d) for t, d in zip(tl.ch_free, head_done_ch, strict=True)]

    if ins.opcode is Opcode.GEMV:
        lpc = build.lanes_per_channel
        per_row = math.ceil(ins.k / lpc)
        dependent = _depends(ins, tl.prev)
        quant_free = tl.quant_free
        ext = 0
        bank = tl.bank
        if not build.overlap_headers:
            seq = latency("GEMV_SEQ_CYCLES")
        if InstrFlags.REUSE_CODES in ins.flags:
            codes_at = head_done
        else:
            bank = 1 - tl.bank if build.overlap_prologue else 0   # double-buffered codes
            qc = math.ceil(ins.k / build.quant_lanes) + latency("QUANT_LATENCY")
            c[Counter.SCALAR_CYCLES] = latency("SCALAR_CYCLES")
            c[Counter.QUANT_CYCLES] = qc
            ready = tl.done if (dependent or not build.overlap_prologue) else 0
            pro_start = max(head_done, ready, tl.quant_free, tl.bank_free[bank])
            if build.stream_prologue:
                codes_at = pro_start + RECIP_CYCLES + latency("QUANT_LATENCY")
                ext = max(0, math.ceil(ins.k / build.quant_lanes) - per_row)
                quant_free = pro_start + RECIP_CYCLES + qc
            else:
                codes_at = (pro_start + latency("SCALAR_CYCLES") + qc
                            + (0 if build.overlap_headers else latency("QUANT_CMD_CYCLES")))
                quant_free = codes_at
        start = max(codes_at, tl.lanes_free if build.overlap_prologue else tl.done) + (seq // 2)
        passes = epilogue_passes(build, _n_ops(ins))
        end = start + ins.n * passes   # the epilogue takes an element per cycle (folded: per pass count)
        stall = 0
        for ch, nb in enumerate(channel_block_bytes(ins.n, ins.k, info.channels, info.packing)):
            beats = _beats(nb, beat)
            c[Counter.STREAM_BEATS] += beats
            compute = channel_rows(ins.n, info.channels, ch) * per_row + ext
            if build.overlap_headers:
                # the stream may run ahead of the lanes by the FIFO, never further
                behind = math.ceil(compute * max(0, beats - build.weight_fifo_beats) / beats) if beats else 0
                s_end = max(max(head_done_ch[ch], start - build.weight_fifo_beats) + beats, start + behind)
                lanes_end = max(start + compute, s_end)
            else:
                # hw/gearbox.py: the first chunk comes GEARBOX_CMD_LATENCY cycles after the command (sent as
                # the rows start); with the stream binding, the last chunk GEARBOX_STREAM_LATENCY cycles after
                # the block's last data beat (the section padding after it goes while the pipeline drains)
                s_end = start + beats
                data_beats = _beats(isa.packed_trit_bytes(channel_rows(ins.n, info.channels, ch) * ins.k,
                                                          info.packing), beat)
                lanes_end = max(start + latency("GEARBOX_CMD_LATENCY") + compute,
                                start + data_beats + GEARBOX_STREAM_LATENCY)
                if ch == 0:
                    # channel 0's block goes into the weight FIFO from the cycle after the dispatch, a beat per
                    # cycle, at most weight_fifo_beats ahead of gearbox 0 (which reads from the cycle after the rows
                    # start, at the lanes' pace); the next instruction's header follows the block's last beat
                    w_end = fetch + beats - 1
                    if beats > build.weight_fifo_beats:
                        pace = max(1.0, compute / beats)
                        w_end = max(w_end, start + latency("WEIGHT_FIFO_LATENCY")
                                    + math.ceil((beats - 1 - build.weight_fifo_beats) * pace))
                    fetch = w_end + 1
            stall = max(stall, lanes_end - start - compute)
            new_ch[ch] = s_end
            end = max(end, lanes_end)
        c[Counter.GEMV_CYCLES] = end - start
        c[Counter.STREAM_STALLS] = stall
        c[Counter.TRITS] = ins.n * ins.k
        c[Counter.EPILOGUE_ELEMENTS] = ins.n
        done = end + drain_cycles(build, _n_ops(ins)) + (seq - seq // 2)
        tl.qc_free = start
        tl.quant_free = quant_free
        tl.lanes_free = end
        tl.bank = bank
        tl.bank_free[bank] = end
    elif ins.opcode is Opcode.LOAD_TOKEN:
        tok = _beats(token_packet_bytes(ins.n), beat)
        c[Counter.STREAM_BEATS] += tok   # the token packet comes on channel 0 too
        start = max(head_done, tl.done)
        elements = ins.n * epilogue_passes(build, _n_ops(ins))
        if build.overlap_headers:
            end = start + max(tok, elements)   # the token streams through the epilogue, one element per cycle
        else:
            end = start + elements             # read in with the packet (the header time): one element per cycle
        c[Counter.EPILOGUE_ELEMENTS] = ins.n
        done = end + epilogue_latency(build, _n_ops(ins)) + latency("DONE_LATENCY")
        new_ch[0] = max(new_ch[0], start + tok)
        tl.lanes_free = done
        tl.qc_free = head_done + 1
    elif ins.opcode is Opcode.END_TOKEN:
        c[Counter.TOKENS] = 1
        start = end = max(head_done, tl.done)
        if build.overlap_headers:
            done = end + output_cycles()
        else:
            # the logits left during the LM head: the padding to a whole section and the 8-word trailer
            # (word by word) with the CRC gap, then the commit (not a busy cycle)
            trailer = isa.layout_bytes(isa.OutputTrailer) // 4
            done = (end + (-(info.vocab + trailer)) % (isa.SECTION_BYTES // 4) + trailer
                    + latency("CRC_GAP_CYCLES"))
        tl.lanes_free = done
    else:
        raise ValueError(f"no cycle model for opcode {ins.opcode!r}")
    c[Counter.CYCLES] = done - t0
    if fetch is not None:
        tl.fetch_free = fetch
    tl.prev_counters = c
    tl.done_before = tl.done
    tl.ch_free = new_ch
    tl.done = done
    tl.prev = ins
    t1 = max(t0, head_done)
    t2 = max(t1, start)
    return Step(counters=c, start=start, done=done, header=t1 - t0, prologue=t2 - t1, body=max(0, end - t2),
                drain=done - max(end, t2))


def schedule(instructions: Sequence, info, build: BuildParams) -> list[Step]:
    """The timeline of one token: one :class:`Step` per instruction, in program order.

    Parameters
    ----------
    instructions : sequence of host.image.Instruction or host.compiler.InstrPlan
        A parsed image's instructions (:attr:`host.image.ParsedImage.instructions`), a compiled program, or
        a plan's (:attr:`host.compiler.ProgramPlan.instructions`).
    info : host.image.ImageInfo or host.compiler.ProgramPlan
        Supplies ``packing`` and ``channels``.
    build : BuildParams
        Must have ``build.channels == info.channels``.

    Raises
    ------
    ValueError
        Channel mismatch, or an instruction without a cycle model.
    """
    tl = _Timeline(build.channels)
    return [_step(ins, info, build, tl) for ins in instructions]


def token_counters(instructions: Sequence, info, build: BuildParams) -> tuple[list[dict[Counter, int]],
                                                                              dict[Counter, int]]:
    """Predicted counters of a whole token: ``(per instruction, totals)``; valid for every schedule option."""
    per = [s.counters for s in schedule(instructions, info, build)]
    return per, {k: sum(c[k] for c in per) for k in Counter}


def stream_efficiency(image_bytes: int, trits: int, cycles: int, build: BuildParams) -> float:
    """docs/ARCHITECTURE.md section 3: share of the cycles in which the binding resource did useful work."""
    return max(image_bytes / (build.channels * build.beat_bytes), trits / build.lanes) / cycles


def token_prediction(program, build: BuildParams) -> dict:
    """Predicted cycles, stream efficiency and their breakdown for one token of a program plan.

    Parameters
    ----------
    program : host.compiler.ProgramPlan
        :func:`host.compiler.plan_model` or :func:`host.compiler.plan_shape`.
    build : BuildParams

    Returns
    -------
    dict
        ``cycles``, ``image_bytes``, ``trits``, ``ideal_cycles`` (the efficiency's numerator),
        ``stream_efficiency``, ``binding`` (``"stream"`` or ``"lanes"``: the larger numerator term),
        ``parts`` (header/prologue/body/drain cycles over the token, see :class:`Step`), and ``layer``:
        the same for one steady-state layer, the mean of layers 1..L-2 (all of them when L < 3), whose
        efficiency uses the layers' own bytes (headers, constants, weights) and trits, plus
        ``per_instruction`` (name and parts of each GEMV of layer 1, or 0 when L = 1).
    """
    steps = schedule(program.instructions, program, build)
    beat_all = build.channels * build.beat_bytes
    parts = ("header", "prologue", "body", "drain")

    def summary(idx: range, extra_bytes: int = 0) -> dict:
        ins = [program.instructions[i] for i in idx]
        nbytes = extra_bytes + sum(instruction_bytes(i, program.packing, program.channels) for i in ins)
        trits = sum(i.n * i.k for i in ins if i.opcode is Opcode.GEMV)
        cyc = sum(steps[i].counters[Counter.CYCLES] for i in idx)
        stream, lanes = nbytes / beat_all, trits / build.lanes
        return {"cycles": cyc, "bytes": nbytes, "trits": trits, "ideal_cycles": max(stream, lanes),
                "binding": "stream" if stream >= lanes else "lanes",
                "stream_efficiency": stream_efficiency(nbytes, trits, cyc, build),
                "parts": {p: sum(getattr(steps[i], p) for i in idx) for p in parts}}

    whole = summary(range(len(steps)), IMAGE_HEADER_BYTES)
    out = {"cycles": whole["cycles"], "image_bytes": whole["bytes"],
           **{k: v for k, v in whole.items() if k not in ("cycles", "bytes")}}
    if program.n_layers:
        L = program.n_layers
        first, last = (1, L - 2) if L >= 3 else (0, L - 1)
        count = last - first + 1
        lay = summary(range(program.layer_slice(first).start, program.layer_slice(last).stop))
        lay = {"layers": [first, last], "stream_efficiency": lay["stream_efficiency"], "binding": lay["binding"],
               **{k: lay[k] / count for k in ("cycles", "bytes", "trits", "ideal_cycles")},
               "parts": {p: v / count for p, v in lay["parts"].items()}}
        one = program.layer_slice(first)
        lay["per_instruction"] = [
            {"name": program.instructions[i].name, "cycles": steps[i].counters[Counter.CYCLES],
             **{p: getattr(steps[i], p) for p in parts}} for i in range(one.start, one.stop)]
        out["layer"] = lay
    return out


# ------------------------------------------------------------------------------------------- roofline
#: The boards of docs/ARCHITECTURE.md section 4: :data:`hw.boards.facts.BOARDS` (peak bandwidths from the vendors'
#: documents, the design point each board's flow builds), the one table of board facts.
BOARDS = _facts.BOARDS
Board = _facts.BoardFacts


def roofline(image_bytes: int, trits: int, build: BuildParams, board: Board) -> dict[str, float]:
    """Decode tokens/s bounds (docs/ARCHITECTURE.md section 4): the smallest of four rates binds.

    Returns a dict with ``dram``, ``ports``, ``channels`` (bus x Fmax) and ``lanes`` (trits x Fmax)
    in tokens/s, ``bound`` (their minimum) and ``binding`` (its name). Fmax is the smaller of the
    build's and the board's design clock (:attr:`hw.boards.facts.BoardFacts.fmax_mhz`).
    """
    fmax = min(build.fmax_mhz, board.fmax_mhz) * 1e6
    rates = {
        "dram": board.dram_gbs * 1e9 / image_bytes,
        "ports": min(build.channels, board.ports) * board.port_gbs * 1e9 / image_bytes,
        "channels": build.channels * build.beat_bytes * fmax / image_bytes,
        "lanes": build.lanes * fmax / trits,
    }
    name = min(rates, key=rates.get)
    return {**rates, "bound": rates[name], "binding": name}


def packing_bits(packing: TritPacking) -> float:
    """Bits per trit of a packing."""
    return 2.0 if TritPacking(packing) is TritPacking.BITS2 else 1.6

