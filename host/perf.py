"""Cycle model of the accelerator and the decode roofline of docs/ARCHITECTURE.md section 4.

The golden device predicts every counter of :class:`hw.isa.Counter` per instruction from this model;
the RTL's counters are compared against it. The model is the datapath's schedule written down. The
default schedule (every option of :class:`BuildParams` off: the schedule of hw/top.py **as built**) runs
two units side by side. A **fetcher** reads channel 0 one instruction ahead of execution: the next
instruction's 64-byte header at one beat per cycle (``hb = 64 / beat_bytes`` beats) and its check (two
cycles), then its constants (``cb`` beats, into the constant bank the executing instruction does not read,
but not while the executing instruction's quantize pass still reads QC) and their CRC check (a cycle);
once the sequencer has dispatched it, a GEMV's channel-0 weight block goes into a weight FIFO of
``fifo_beats`` beats (from which gearbox 0 reads), and the next header follows at once. The
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
                  waits for gearbox 0 (about start + 2 + (beats_0 - 1 - fifo_beats) * max(1, compute_0 /
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

The options of :class:`BuildParams` (``overlap_headers``, ``stripe_consts``, ``overlap_prologue``,
``stream_prologue``) model proposed schedule changes (docs/PERFORMANCE_MODEL.md says what each needs in
hardware and in the image layout).

Stream efficiency (docs/ARCHITECTURE.md section 3) is
``max(image bytes / (channels * beat bytes), trits / lanes) / cycles`` over a whole token.

Model programs of any shape (the released 370M, 1.3B and 2.7B included) are described without weights
by :func:`program_shapes`: the instruction shapes that :func:`host.compiler.compile_program` emits,
their image size and their counters, exactly as for a compiled image of that shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from hw import isa
from hw.boards import facts as _facts
from hw.isa import Buffer, Counter, InstrFlags, MicroOpcode, Opcode, TritPacking

__all__ = [
    "BuildParams", "Board", "BOARDS", "SCALAR_CYCLES", "RECIP_CYCLES", "CRC_GAP_CYCLES", "QUANT_LATENCY",
    "EPILOGUE_LATENCY", "GEMV_LATENCY", "DONE_LATENCY", "OUTPUT_CYCLES", "SCHEDULE_OPTIONS", "token_counters",
    "schedule", "Step", "stream_efficiency", "roofline", "packing_bits", "InstrShape", "ProgramShape",
    "program_shapes", "instruction_bytes", "header_bytes", "token_packet_bytes", "drain_cycles", "token_prediction",
    "epilogue_passes", "epilogue_latency", "FOLDED_ENTRY_LATENCY", "FOLDED_PASS_CYCLES",
]

#: the scalar unit per prologue: its command handshake (1) + its latency (hw/scalar.py SCALAR_LATENCY: isqrt of
#: the 64-bit sum of squares in parallel with 127/A, then a 25-bit division)
SCALAR_CYCLES = 62
RECIP_CYCLES = 33      #: the part of the scalar unit the quantize pass waits for: 127/A (26-cycle division) + 7
QUANT_LATENCY = 6      #: quantize prologue pipeline (hw/quant.py)
#: Epilogue pipeline, element in to element out: entry (6) + 10 stages per micro-op slot (hw/epilogue.py)
EPILOGUE_LATENCY = 6 + 10 * isa.MAX_OPS
#: The folded epilogue (hw/epilogue.py ``folded``): entry (6), then one pass of its 11-register ring per
#: micro-op, ``max(n_ops, 1)`` passes, the element leaving at its last pass's c9 (two cycles before that pass
#: ends: ``Epilogue.latency_for``); it takes a new element every ``max(n_ops, 1)`` cycles on average
FOLDED_ENTRY_LATENCY = 6 - 2
FOLDED_PASS_CYCLES = 11
#: GEMV engine after the adder tree's ceil(log2(lanes_per_channel)) levels: code read, lane terms,
#: accumulator, output FIFO (hw/gemv.py ``latency = tree_levels + 5``)
GEMV_LATENCY = 5
DONE_LATENCY = 2       #: the epilogue's ``done`` strobe after the last element's exit (hw/epilogue.py: 1-2)
IMAGE_HEADER_BYTES = isa.layout_bytes(isa.ImageHeader)    #: 64
INSTR_HEADER_BYTES = isa.layout_bytes(isa.InstrHeader)    #: 64
#: The output CRC runs on a registered copy of each word (hw/top.py, ECP5 timing): the trailer's CRC word
#: waits one cycle after the word before it
CRC_GAP_CYCLES = 1
#: END_TOKEN after the header: the output packet without logits (one 64-byte section: header, padding, CRC)
#: on a 32-bit output stream, the CRC gap, then the state commit
OUTPUT_CYCLES = isa.SECTION_BYTES // 4 + CRC_GAP_CYCLES + 1
#: The sequencer of hw/top.py: it reads the token packet and the image header one 32-bit word per cycle
#: (16 cycles a header whatever the bus width), then spends two cycles checking each (the CRC runs a cycle
#: behind the stream); its fetcher reads instruction headers and constants at one beat per cycle plus two
#: cycles for each check (module docstring). A GEMV spends one cycle handing the quantizer its command, one
#: starting the rows (GEMV_START) and one after its epilogue finishes (GEMV_DRAIN).
HEADER_WORD_CYCLES = isa.layout_bytes(isa.InstrHeader) // 4
SEQ_CHECK_CYCLES = 2                          #: a CRC check: the CRC takes the last word, then the check
FETCH_CHECK_CYCLES = 2                        #: the fetcher's instruction-header check (F_CHECK, F_CHECK2)
SEQ_DISPATCH_CYCLES = 2                       #: DISPATCH + EXEC
GEMV_SEQ_CYCLES = 2                           #: GEMV_START + GEMV_DRAIN
QUANT_CMD_CYCLES = 1
#: hw/gearbox.py: a command's first chunk 4 cycles after it (compute-bound GEMVs); the last chunk 4-5 cycles
#: after the block's last data beat (stream-bound: 5 measured on most shapes, 4 on some alignments)
GEARBOX_CMD_LATENCY = 4
GEARBOX_STREAM_LATENCY = 5
#: hw/top.py: channel 0's weight FIFO (amaranth.lib.fifo.SyncFIFOBuffered): a beat written in cycle t can be
#: read from cycle t + 2
WEIGHT_FIFO_LATENCY = 2

#: The schedule options of :class:`BuildParams` (all False: the serial schedule, the default).
SCHEDULE_OPTIONS = ("overlap_headers", "stripe_consts", "overlap_prologue", "stream_prologue")


@dataclass(frozen=True)
class BuildParams:
    """Build parameters of an accelerator instance (the ID block reports them) and its schedule.

    Attributes
    ----------
    lanes : int
        Trits consumed per cycle, all channels together (a multiple of ``channels``).
    channels : int
        AXI4-Stream weight channels.
    bus_bits : int
        ``tdata`` width of each weight channel (a multiple of 32).
    quant_lanes : int
        Codes formed per cycle by the quantize prologue.
    fmax_mhz : float
        Clock, for time and roofline figures.
    overlap_headers : bool
        Proposed (default False). The stream reader runs ahead of the lanes through a weight FIFO of
        ``fifo_beats`` beats per channel, and headers/constants go to a double-buffered header unit: the
        next instruction's header and constants stream while the current GEMV computes (in the channel's
        idle beats) and while its epilogue drains, and a GEMV's first weights stream during its prologue.
    stripe_consts : bool
        Proposed (default False; an image layout change). The constant words are split over all channels
        (``C0..C3`` row ``r`` on the channel that carries row ``r``, ``QC`` word ``k`` on channel
        ``k % channels``); the 64-byte instruction header stays on channel 0.
    overlap_prologue : bool
        Proposed (default False). Double-buffered codes and an epilogue that carries an instruction tag per
        element: a GEMV whose source buffer and reduction registers the previous instruction does not write
        (f_proj, g_proj) forms its codes while the previous GEMV computes, and its body starts when the
        lanes are free, not when the previous epilogue has drained.
    stream_prologue : bool
        Proposed (default False). The quantize pass feeds the lanes directly, one chunk ahead of the first
        row, instead of finishing before the GEMV starts: the barrier costs :data:`RECIP_CYCLES` +
        :data:`QUANT_LATENCY` (+ ``ceil(K / quant_lanes) - ceil(K / lanes_per_channel)`` when the pass is
        slower than the first row); the dequantization scale is finished during the first rows.
    fifo_beats : int
        Weight FIFO depth per channel in beats (used with ``overlap_headers``).
    epilogue_folded : bool
        The folded epilogue (``ID_EPILOGUE`` 1; the ECP5 builds): an element every ``max(n_ops, 1)``
        cycles, and a drain of ``FOLDED_ENTRY_LATENCY + FOLDED_PASS_CYCLES * max(n_ops, 1)`` cycles (plus
        two when the last micro-op reduces, not modelled).

    Raises
    ------
    ValueError
        A non-positive or non-integer size, ``lanes`` not a multiple of ``channels``, ``bus_bits`` not a
        multiple of 32, or a schedule option that is not a bool.
    """

    lanes: int = 64
    channels: int = 1
    bus_bits: int = 64
    quant_lanes: int = 8
    fmax_mhz: float = 100.0
    overlap_headers: bool = False
    stripe_consts: bool = False
    overlap_prologue: bool = False
    stream_prologue: bool = False
    fifo_beats: int = 1024
    epilogue_folded: bool = False

    def __post_init__(self):
        for name in ("lanes", "channels", "bus_bits", "quant_lanes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.lanes % self.channels:
            raise ValueError(f"lanes ({self.lanes}) must be a multiple of channels ({self.channels})")
        if self.bus_bits % 32:
            raise ValueError(f"bus_bits must be a multiple of 32, got {self.bus_bits}")
        if not (isinstance(self.fmax_mhz, (int, float)) and self.fmax_mhz > 0):
            raise ValueError(f"fmax_mhz must be positive, got {self.fmax_mhz!r}")
        for name in SCHEDULE_OPTIONS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.epilogue_folded, bool):
            raise ValueError(f"epilogue_folded must be a bool, got {self.epilogue_folded!r}")
        if not isinstance(self.fifo_beats, int) or isinstance(self.fifo_beats, bool) or self.fifo_beats < 0:
            raise ValueError(f"fifo_beats must be a non-negative integer, got {self.fifo_beats!r}")

    @classmethod
    def from_id_block(cls, ident: dict) -> BuildParams:
        """The build a core's ID block describes (``host.devices.board.read_id_block``'s fields by name;
        ``epilogue_folded`` absent or 0 on builds before ``ID_EPILOGUE``)."""
        return cls(lanes=ident["lanes"], channels=ident["channels"], bus_bits=ident["bus_bits"],
                   quant_lanes=ident["quant_lanes"], epilogue_folded=bool(ident.get("epilogue_folded", 0)))

    @classmethod
    def overlapped(cls, **kw) -> BuildParams:
        """A build with every proposed schedule option on (``kw`` sets the rest)."""
        return cls(**{**{name: True for name in SCHEDULE_OPTIONS}, **kw})

    @property
    def beat_bytes(self) -> int:
        return self.bus_bits // 8

    @property
    def lanes_per_channel(self) -> int:
        return self.lanes // self.channels

    @property
    def serial(self) -> bool:
        """True for the default schedule (no proposed option on)."""
        return not any(getattr(self, name) for name in SCHEDULE_OPTIONS)

    def as_dict(self) -> dict:
        return asdict(self)


def _beats(nbytes: int, beat_bytes: int) -> int:
    return -(-nbytes // beat_bytes)


def epilogue_passes(build: BuildParams, n_ops: int) -> int:
    """Cycles per element of the epilogue at full rate for a program of ``n_ops`` micro-ops: 1 pipelined,
    ``max(n_ops, 1)`` folded (its passes)."""
    return max(1, min(n_ops, isa.MAX_OPS)) if build.epilogue_folded else 1


def epilogue_latency(build: BuildParams, n_ops: int = isa.MAX_OPS) -> int:
    """Epilogue cycles from an element's entry to its exit for a program of ``n_ops`` micro-ops
    (:data:`EPILOGUE_LATENCY` pipelined)."""
    if build.epilogue_folded:
        return FOLDED_ENTRY_LATENCY + FOLDED_PASS_CYCLES * epilogue_passes(build, n_ops)
    return EPILOGUE_LATENCY


def drain_cycles(build: BuildParams, n_ops: int = isa.MAX_OPS) -> int:
    """GEMV pipeline (adder tree included) plus epilogue pipeline plus ``done``: cycles from a GEMV's last
    lane cycle to the end of its last epilogue write (``n_ops``: the program's micro-ops, for the folded
    epilogue)."""
    return GEMV_LATENCY + (build.lanes_per_channel - 1).bit_length() + epilogue_latency(build, n_ops) + DONE_LATENCY


def _n_ops(ins) -> int:
    return ins.n_ops if isinstance(ins, InstrShape) else len(ins.ops)


# ------------------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class InstrShape:
    """The shape of one instruction: every field the cycle model reads, without weights or constants.

    Attributes match :class:`host.image.Instruction`; ``n_consts`` replaces the ``consts`` list,
    ``stores`` and ``reduces`` replace the micro-ops (the buffers and reduction registers the epilogue
    writes), with their number ``n_ops`` (the folded epilogue's passes): all the schedule needs to know
    about them.
    """

    opcode: Opcode
    name: str = ""
    flags: InstrFlags = InstrFlags(0)
    layer: int = 0
    n: int = 0
    k: int = 0
    n_consts: int = 0
    src: Buffer = Buffer.X
    amax_reg: int = 0
    ssq_reg: int = 0
    stores: frozenset[Buffer] = frozenset()
    reduces: frozenset[int] = frozenset()
    n_ops: int = 0

    @property
    def consts(self) -> tuple[None, ...]:
        """Placeholders for the constant vectors: without weights only their number is known (enough
        for :func:`host.image.const_section_bytes` and the cycle model)."""
        return (None,) * self.n_consts


def _n_consts(ins) -> int:
    n = getattr(ins, "n_consts", None)
    return len(ins.consts) if n is None else n


def _writes(ins) -> tuple[frozenset[Buffer], frozenset[int]]:
    """Buffers and reduction registers an instruction's epilogue writes."""
    if isinstance(ins, InstrShape):
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


def token_packet_bytes(hidden: int) -> int:
    """Bytes of a token packet: 16-byte header, ``hidden`` words, CRC word, padded to 64-byte sections."""
    n = isa.layout_bytes(isa.TokenHeader) + 4 * hidden + 4
    return n + isa.section_pad(n)


@dataclass(frozen=True)
class ProgramShape:
    """A whole model program as shapes: what :func:`host.compiler.compile_model` would emit for a model of
    this shape, without weights. It also serves as the ``info`` argument of the cycle model (it has
    ``packing`` and ``channels``).

    Attributes
    ----------
    hidden, intermediate, n_layers, vocab : int
    packing : TritPacking
    channels : int
    instructions : tuple of InstrShape
    """

    hidden: int
    intermediate: int
    n_layers: int
    vocab: int
    packing: TritPacking
    channels: int
    instructions: tuple[InstrShape, ...] = field(repr=False)

    @property
    def image_bytes(self) -> int:
        """Exactly ``len(compile_model(...))`` for a model of this shape, packing and channel count."""
        return IMAGE_HEADER_BYTES + sum(instruction_bytes(i, self.packing, self.channels) for i in self.instructions)

    @property
    def trits(self) -> int:
        return sum(i.n * i.k for i in self.instructions if i.opcode is Opcode.GEMV)

    @property
    def weight_bytes(self) -> int:
        from host.image import channel_block_bytes

        return sum(sum(channel_block_bytes(i.n, i.k, self.channels, self.packing))
                   for i in self.instructions if i.opcode is Opcode.GEMV)

    def layer_slice(self, layer: int) -> slice:
        """Indices of layer ``layer``'s seven GEMVs in :attr:`instructions`."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer} of a {self.n_layers}-layer program")
        return slice(1 + 7 * layer, 1 + 7 * (layer + 1))


def program_shapes(hidden: int, intermediate: int, n_layers: int, vocab: int, *,
                   packing: TritPacking = TritPacking.BASE3, channels: int = 1,
                   output_gate: str = "released") -> ProgramShape:
    """The instruction shapes of a model program, as :func:`host.compiler.compile_program` emits them.

    ``LOAD_TOKEN`` (the first layer's reductions: SSQ + three AMAX constants), then per layer the GEMVs
    i, f, g, o (H x H), gate_proj as two halves (I x H, the second with ``REUSE_CODES``) and down_proj
    (H x I), then the LM head (V x H, ``LOGITS``) and ``END_TOKEN``; flags, constant-vector counts, source
    buffers, reduction registers and written buffers are the compiler's. Nothing of size ``H x H`` is
    allocated: the 2.7B program is a few hundred small objects.

    Parameters
    ----------
    hidden, intermediate, n_layers, vocab : int
        Model shape (``HGRNBitConfig`` fields ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
        ``vocab_size``).
    packing : TritPacking
    channels : int
        Weight channels (1-16).
    output_gate : {"released", "paper"}
        g_proj carries three constant vectors with the released output gate (``gamma_g``, ``sqrt(eps)`` for the
        gate norm's statistic, ``gamma_o``), one with the paper's.

    Raises
    ------
    ValueError
        On a non-positive dimension, a shape beyond :mod:`hw.isa`'s limits, or a bad option.
    """
    for name, v, lim in (("hidden", hidden, isa.MAX_HIDDEN), ("intermediate", intermediate, isa.MAX_INTERMEDIATE),
                         ("n_layers", n_layers, isa.MAX_LAYERS), ("vocab", vocab, isa.MAX_VOCAB)):
        if not isinstance(v, int) or not 1 <= v <= lim:
            raise ValueError(f"{name} must be an integer in 1..{lim}, got {v!r}")
    if not 1 <= channels <= 16:
        raise ValueError(f"channels must be in 1..16, got {channels}")
    if output_gate not in ("released", "paper"):
        raise ValueError(f"output_gate must be 'released' or 'paper', got {output_gate!r}")
    H, inter, V = hidden, intermediate, vocab
    G, Q, R, L = Opcode.GEMV, InstrFlags.QCONST, InstrFlags.REUSE_CODES, InstrFlags.LOGITS
    X, A, P, SN = Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_NEW
    fs = frozenset

    def next_consumers(idx: int) -> int:
        return 3 if idx < n_layers else 1

    c0 = next_consumers(0)
    prog = [InstrShape(Opcode.LOAD_TOKEN, "load_token", n=H, n_consts=1 + c0, stores=fs({X}),
                       reduces=fs(range(1 + c0)), n_ops=2 + c0)]
    for li in range(n_layers):
        pre = f"layers.{li}"
        cn = next_consumers(li + 1)
        prog += [
            InstrShape(G, f"{pre}.attn.i_proj", Q, li, H, H, 0, X, 1, 0, fs({A}), fs(), n_ops=2),
            InstrShape(G, f"{pre}.attn.f_proj", Q, li, H, H, 1, X, 2, 0, fs({SN}), fs(), n_ops=7),
            InstrShape(G, f"{pre}.attn.g_proj", Q, li, H, H, 3 if output_gate == "released" else 1, X, 3, 0,
                       fs({P}), fs({4, 5}), n_ops=8 if output_gate == "released" else 5),
            InstrShape(G, f"{pre}.attn.o_proj", Q, li, H, H, 2, P, 5, 4, fs({X}), fs({6, 7}), n_ops=4),
            InstrShape(G, f"{pre}.mlp.gate_proj[:I]", Q, li, inter, H, 0, X, 7, 6, fs({A}), fs(), n_ops=2),
            InstrShape(G, f"{pre}.mlp.gate_proj[I:]", R, li, inter, H, 1, X, 7, 6, fs({P}), fs({4, 5}), n_ops=4),
            InstrShape(G, f"{pre}.mlp.down_proj", Q, li, H, inter, 1 + cn, P, 5, 4, fs({X}), fs(range(1 + cn)),
                       n_ops=3 + cn),
        ]
    prog += [InstrShape(G, "lm_head", Q | L, 0, V, H, 0, X, 1, 0, fs(), fs(), n_ops=2),
             InstrShape(Opcode.END_TOKEN, "end_token")]
    return ProgramShape(hidden=H, intermediate=inter, n_layers=n_layers, vocab=V, packing=TritPacking(packing),
                        channels=channels, instructions=tuple(prog))


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

    def __post_init__(self):
        if not self.ch_free:
            self.ch_free = [0] * self.channels


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
            h0 = t0 + 1 + tok_words + SEQ_CHECK_CYCLES + HEADER_WORD_CYCLES + SEQ_CHECK_CYCLES + 1
            ready = h0
        else:
            h0 = tl.fetch_free
            ready = t0 + 1
        c0 = max(h0 + hb + FETCH_CHECK_CYCLES, tl.qc_free)     # first constant beat
        r = c0 + cb + SEQ_CHECK_CYCLES if cb else h0 + hb + FETCH_CHECK_CYCLES
        # striped constants on channels > 0 (a proposed layout): they precede the weights there
        dispatch = max(ready, r, *(t0 + 1 + h for h in head[1:]))
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
        head_done_ch = [max(tl.ch_free[ch], tl.done_before) + h for ch, h in enumerate(head)]
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
            seq = GEMV_SEQ_CYCLES
        if InstrFlags.REUSE_CODES in ins.flags:
            codes_at = head_done
        else:
            bank = 1 - tl.bank if build.overlap_prologue else 0   # double-buffered codes
            qc = math.ceil(ins.k / build.quant_lanes) + QUANT_LATENCY
            c[Counter.SCALAR_CYCLES] = SCALAR_CYCLES
            c[Counter.QUANT_CYCLES] = qc
            ready = tl.done if (dependent or not build.overlap_prologue) else 0
            pro_start = max(head_done, ready, tl.quant_free, tl.bank_free[bank])
            if build.stream_prologue:
                codes_at = pro_start + RECIP_CYCLES + QUANT_LATENCY
                ext = max(0, math.ceil(ins.k / build.quant_lanes) - per_row)
                quant_free = pro_start + RECIP_CYCLES + qc
            else:
                codes_at = pro_start + SCALAR_CYCLES + qc + (0 if build.overlap_headers else QUANT_CMD_CYCLES)
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
                behind = math.ceil(compute * max(0, beats - build.fifo_beats) / beats) if beats else 0
                s_end = max(max(head_done_ch[ch], start - build.fifo_beats) + beats, start + behind)
                lanes_end = max(start + compute, s_end)
            else:
                # hw/gearbox.py: the first chunk comes GEARBOX_CMD_LATENCY cycles after the command (sent as
                # the rows start); with the stream binding, the last chunk GEARBOX_STREAM_LATENCY cycles after
                # the block's last data beat (the section padding after it goes while the pipeline drains)
                s_end = start + beats
                data_beats = _beats(isa.packed_trit_bytes(channel_rows(ins.n, info.channels, ch) * ins.k,
                                                          info.packing), beat)
                lanes_end = max(start + GEARBOX_CMD_LATENCY + compute, start + data_beats + GEARBOX_STREAM_LATENCY)
                if ch == 0:
                    # channel 0's block goes into the weight FIFO from the cycle after the dispatch, a beat per
                    # cycle, at most fifo_beats ahead of gearbox 0 (which reads from the cycle after the rows
                    # start, at the lanes' pace); the next instruction's header follows the block's last beat
                    w_end = fetch + beats - 1
                    if beats > build.fifo_beats:
                        pace = max(1.0, compute / beats)
                        w_end = max(w_end, start + WEIGHT_FIFO_LATENCY
                                    + math.ceil((beats - 1 - build.fifo_beats) * pace))
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
        done = end + epilogue_latency(build, _n_ops(ins)) + DONE_LATENCY
        new_ch[0] = max(new_ch[0], start + tok)
        tl.lanes_free = done
        tl.qc_free = head_done + 1
    elif ins.opcode is Opcode.END_TOKEN:
        c[Counter.TOKENS] = 1
        start = end = max(head_done, tl.done)
        if build.overlap_headers:
            done = end + OUTPUT_CYCLES
        else:
            # the logits left during the LM head: the padding to a whole section and the 8-word trailer
            # (word by word) with the CRC gap, then the commit (not a busy cycle)
            trailer = isa.layout_bytes(isa.OutputTrailer) // 4
            done = end + (-(info.vocab + trailer)) % (isa.SECTION_BYTES // 4) + trailer + CRC_GAP_CYCLES
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
    instructions : sequence of host.image.Instruction or InstrShape
        A parsed image's instructions (:attr:`host.image.ParsedImage.instructions`) or
        :attr:`ProgramShape.instructions`.
    info : host.image.ImageInfo or ProgramShape
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


def token_prediction(program: ProgramShape, build: BuildParams) -> dict:
    """Predicted cycles, stream efficiency and their breakdown for one token of a shape program.

    Parameters
    ----------
    program : ProgramShape
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

