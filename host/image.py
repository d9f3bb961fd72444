"""Model images as bytes: assemble a program, parse and validate an image, disassemble it.

The byte format is defined by :mod:`hw.isa` (header, instruction headers, micro-ops, packings, CRCs);
this module only lays instructions out and reads them back. A parsed image keeps the packed weights as
views into the image's own buffer, so a device holding a parsed image holds the image once
(the golden device's resident weights are the image).

Weight section of a GEMV: ``channels`` blocks, block ``c`` holding rows ``c, c + channels, ...`` packed
continuously across rows (:func:`hw.isa.pack_trits`), then zero bytes and a CRC word: a whole number of
64-byte sections (:data:`hw.isa.SECTION_BYTES`) whose last 4 bytes are the CRC-32 (:func:`hw.isa.crc32_words`)
of the block's bytes before them (:func:`channel_block_bytes`, :func:`seal_block`). A channel with no rows has
an empty block (no bytes, no CRC).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from hw import isa
from hw.isa import (
    Buffer,
    ErrorCause,
    ImageHeader,
    InstrFlags,
    InstrHeader,
    MicroOpcode,
    Opcode,
    TritPacking,
)
from hw.numerics import GATE_FRAC, INT32_MAX, INT32_MIN, LUT_RANGE_LOG2

__all__ = [
    "ImageError", "Instruction", "MicroOpSpec", "ImageInfo", "ParsedImage",
    "assemble", "parse_image", "disassemble", "channel_block_bytes", "channel_rows", "const_section_bytes",
    "vector_words", "seal_block", "check_block_crcs", "check_block_trits", "BuildLimits", "check_image_header",
    "iter_instructions",
]

HEADER_BYTES = isa.layout_bytes(ImageHeader)
INSTR_BYTES = isa.layout_bytes(InstrHeader)


class ImageError(ValueError):
    """A bad model image: says what (:class:`hw.isa.ErrorCause`) and where (byte offset, instruction).

    Attributes
    ----------
    cause : ErrorCause
    offset : int or None
        Byte offset in the image.
    instruction : int or None
        Index of the instruction.
    """

    def __init__(self, cause: ErrorCause, message: str, *, offset: int | None = None,
                 instruction: int | None = None):
        where = []
        if instruction is not None:
            where.append(f"instruction {instruction}")
        if offset is not None:
            where.append(f"byte {offset}")
        super().__init__(f"{cause.name}: {message}" + (f" (at {', '.join(where)})" if where else ""))
        self.cause = cause
        self.offset = offset
        self.instruction = instruction


@dataclass(frozen=True)
class MicroOpSpec:
    """One epilogue micro-op (fields of :class:`hw.isa.MicroOp`)."""

    op: MicroOpcode
    dst: int = 0
    a: int = 0
    b: int = 0
    buf: Buffer = Buffer.NONE
    shift: int = 0
    reg: int = 0

    def fields(self) -> dict:
        return {"op": self.op, "dst": self.dst, "a": self.a, "b": self.b, "buf": self.buf,
                "shift": self.shift, "reg": self.reg}

    def __str__(self) -> str:
        o = self.op
        r = "r{}".format
        if o is MicroOpcode.LD:
            return f"LD     {r(self.dst)}, {self.buf.name}"
        if o is MicroOpcode.ST:
            return f"ST     {self.buf.name}, {r(self.a)}"
        if o in (MicroOpcode.ADD, MicroOpcode.SUB):
            return f"{o.name:<6} {r(self.dst)}, {r(self.a)}, {r(self.b)}"
        if o is MicroOpcode.MUL:
            return f"MUL    {r(self.dst)}, {r(self.a)}, {r(self.b)} >> {self.shift}"
        if o is MicroOpcode.MULV:
            return f"MULV   {r(self.dst)}, {r(self.a)}, {self.buf.name} >> {self.shift}"
        if o is MicroOpcode.ADDV:
            return f"ADDV   {r(self.dst)}, {r(self.a)}, {self.buf.name}"
        if o in (MicroOpcode.SIG, MicroOpcode.SIGNEG, MicroOpcode.SILU):
            return f"{o.name:<6} {r(self.dst)}, {r(self.a)} (Q.{self.shift})"
        if o is MicroOpcode.RSUB1:
            return f"RSUB1  {r(self.dst)}, {r(self.a)} (1 = 2^{self.shift})"
        if o in (MicroOpcode.SSQ, MicroOpcode.AMAX):
            w = r(self.a) if self.buf is Buffer.NONE else f"{r(self.a)} * {self.buf.name} >> {self.shift}"
            return f"{o.name:<6} R{self.reg}, {w}"
        if o in (MicroOpcode.ARGMAX, MicroOpcode.OUT):
            return f"{o.name:<6} {r(self.a)}"
        return o.name


@dataclass
class Instruction:
    """One instruction before assembly (or after parsing).

    Attributes
    ----------
    opcode : Opcode
    name : str
        What it computes (e.g. ``"layers.3.attn.f_proj"``); not stored in the image.
    trits : ndarray [n, k] int8 or None
        GEMV weights (assemble); after parsing, ``blocks`` holds the packed channel blocks instead.
    qconst : ndarray [k] int64 or None
        Quantize-prologue constant (``QCONST``).
    consts : list of ndarray [n] int64
        C0.. constant vectors.
    """

    opcode: Opcode
    name: str = ""
    flags: InstrFlags = InstrFlags(0)
    layer: int = 0
    n: int = 0
    k: int = 0
    src: Buffer = Buffer.X
    q_shift: int = 0
    amax_reg: int = 0
    ssq_reg: int = 0
    cb_mant: int = 0
    cb_shift: int = 0
    ssq_bias: int = 0
    ssq_bias_shift: int = 0
    out_frac: int = 0
    ops: list[MicroOpSpec] = field(default_factory=list)
    qconst: np.ndarray | None = None
    consts: list[np.ndarray] = field(default_factory=list)
    trits: np.ndarray | None = None
    blocks: list[np.ndarray] = field(default_factory=list)
    offset: int = 0          #: byte offset of the header in the image (parsed images)
    weight_offset: int = 0   #: byte offset of the weight section (parsed images)

    def header_fields(self, weight_bytes: int, const_crc: int) -> dict:
        return {
            "opcode": self.opcode, "flags": self.flags, "layer": self.layer, "n_ops": len(self.ops),
            "n": self.n, "k": self.k, "src": self.src, "q_shift": self.q_shift,
            "amax_reg": self.amax_reg, "ssq_reg": self.ssq_reg, "n_consts": len(self.consts),
            "out_frac": self.out_frac,
            "cb_mant": self.cb_mant, "cb_shift": self.cb_shift, "ssq_bias": self.ssq_bias,
            "ssq_bias_shift": self.ssq_bias_shift, "weight_bytes": weight_bytes,
            "const_crc": const_crc,
            "ops": [op.fields() for op in self.ops] + [{}] * (isa.MAX_OPS - len(self.ops)),
        }


@dataclass(frozen=True)
class ImageInfo:
    """Decoded image header."""

    packing: TritPacking
    channels: int
    n_layers: int
    hidden: int
    intermediate: int
    vocab: int
    n_instructions: int
    image_bytes: int
    residual_frac: int
    state_frac: int
    gate_frac: int
    lut_segments_log2: int


@dataclass
class ParsedImage:
    """A validated image: header info and instructions (weights as views of ``raw``)."""

    info: ImageInfo
    instructions: list[Instruction]
    raw: memoryview


def channel_rows(n: int, channels: int, c: int) -> int:
    """Rows of an n-row GEMV that channel ``c`` carries (rows c, c + channels, ...)."""
    return len(range(c, n, channels))


def channel_block_bytes(n: int, k: int, channels: int, packing: TritPacking) -> list[int]:
    """Bytes of each channel's weight block: its packed trits, zero padding and the CRC word, a whole number
    of sections, ``round_up(packed + 4, 64)``; 0 for a channel without rows (the one place that sizes a
    block: the compiler, the devices, the cycle model and the core's fetcher and gearboxes follow it)."""
    out = []
    for c in range(channels):
        b = isa.packed_trit_bytes(channel_rows(n, channels, c) * k, packing)
        out.append(b + 4 + isa.section_pad(b + 4) if b else 0)
    return out


def seal_block(packed: bytes) -> bytes:
    """A channel's weight block from its packed trits: zero padding, then the CRC word of all bytes before it
    (``hw.isa.crc32_words``), the whole a multiple of :data:`hw.isa.SECTION_BYTES` (empty stays empty)."""
    if not packed:
        return b""
    body = bytes(packed) + bytes(isa.section_pad(len(packed) + 4))
    return body + isa.crc32_words(body).to_bytes(4, "little")


def vector_words(n: int) -> int:
    """Words a constant vector of ``n`` elements occupies: padded to a whole 64-byte section."""
    return n + (-n) % (isa.SECTION_BYTES // 4)


def const_section_bytes(ins: Instruction) -> int:
    """Bytes of an instruction's constants section: QC (K elements, with QCONST) then C0.. (N each), each
    vector zero-padded to a whole 64-byte section so every vector starts on a beat boundary."""
    words = (vector_words(ins.k) if InstrFlags.QCONST in ins.flags else 0) + len(ins.consts) * vector_words(ins.n)
    return 4 * words


def _const_bytes(ins: Instruction) -> bytes:
    parts = ([ins.qconst] if ins.qconst is not None else []) + list(ins.consts)
    out = bytearray()
    for p in parts:
        v = np.asarray(p, dtype=np.int64)
        if v.size and (v.min() < INT32_MIN or v.max() > INT32_MAX):
            raise ValueError(f"{ins.name}: a constant does not fit int32")
        out += v.astype("<i4").tobytes() + bytes(4 * (vector_words(v.size) - v.size))
    return bytes(out)


def assemble(instructions: Sequence[Instruction], *, packing: TritPacking, channels: int, n_layers: int,
             hidden: int, intermediate: int, vocab: int, residual_frac: int, state_frac: int,
             gate_frac: int, lut_segments_log2: int) -> bytes:
    """Lay out a program as image bytes (deterministic: same instructions, same bytes).

    Raises
    ------
    ValueError
        On a field out of range (from Amaranth's packing), a constant outside int32, or a GEMV whose
        trits do not have shape [n, k].
    """
    packing = TritPacking(packing)
    body = bytearray()
    for ins in instructions:
        consts = _const_bytes(ins)
        weights = b""
        if ins.opcode is Opcode.GEMV:
            t = np.asarray(ins.trits)
            if t.shape != (ins.n, ins.k):
                raise ValueError(f"{ins.name}: trits have shape {t.shape}, expected {(ins.n, ins.k)}")
            weights = b"".join(seal_block(isa.pack_trits(t[c::channels], packing)) for c in range(channels))
        fields = ins.header_fields(len(weights), isa.crc32_words(consts) if consts else 0)
        head = isa.pack(InstrHeader, fields)
        head = head[:-4] + isa.crc32_words(head[:-4]).to_bytes(4, "little")
        body += head + consts + weights
    total = HEADER_BYTES + len(body)
    header = isa.pack(ImageHeader, {
        "magic": isa.IMAGE_MAGIC, "version": isa.ISA_VERSION, "header_words": HEADER_BYTES // 4,
        "packing": packing, "channels": channels, "n_layers": n_layers, "hidden": hidden,
        "intermediate": intermediate, "vocab": vocab, "n_instructions": len(instructions),
        "image_words": total // 4, "residual_frac": residual_frac, "state_frac": state_frac,
        "gate_frac": gate_frac, "lut_segments_log2": lut_segments_log2,
    })
    header = header[:-4] + isa.crc32_words(header[:-4]).to_bytes(4, "little")
    return bytes(header) + bytes(body)


def _member(view: isa.Unpacked, layout, path: tuple, cause: ErrorCause, what: str, **where):
    """The enum or flag member in field ``path`` of ``view`` (``layout`` unpacked by :func:`hw.isa.unpack`);
    :class:`ImageError` with ``cause`` naming the field's bits when they are no member."""
    try:
        value = view
        for key in path:
            value = value[key]
        return value
    except ValueError:
        bit, width = isa.field_span(layout, path)
        raise ImageError(cause, f"unknown {what} {(view.as_bits() >> bit) & ((1 << width) - 1)}",
                         **where) from None


def _byte(layout, name: str) -> int:
    """Byte offset of field ``name`` of ``layout`` (where an error message points)."""
    return isa.field_span(layout, (name,))[0] // 8


@dataclass(frozen=True)
class BuildLimits:
    """What one build of the core accepts beyond the ISA's limits (its ID block): the image header is checked
    against it (``BAD_SHAPE``). ``None``: any value the ISA allows.

    Attributes
    ----------
    packing : TritPacking or None
    channels : int or None
    max_hidden, max_intermediate, max_layers : int
    lut_segments_log2 : int or None
    token_tlast, image_tlast : bool
        Which ends the stream marks with ``tlast`` (the build's ``hw.top.Accelerator`` parameters): unmarked,
        a token packet's size is its ``length`` field's, and bytes after END_TOKEN are the next token's.
    """

    packing: TritPacking | None = None
    channels: int | None = None
    max_hidden: int = isa.MAX_HIDDEN
    max_intermediate: int = isa.MAX_INTERMEDIATE
    max_layers: int = isa.MAX_LAYERS
    lut_segments_log2: int | None = None
    token_tlast: bool = True     #: the stream marks the token packet's end (``hw.top.Accelerator`` token_tlast)
    image_tlast: bool = True     #: ... and the image's (image_tlast)


def check_image_header(raw: bytes | bytearray | memoryview, limits: BuildLimits | None = None) -> ImageInfo:
    """The image header's checks, in the hardware's order (docs/ISA.md section 5): magic, version, CRC, the
    fields against the ISA and the build (``BAD_SHAPE``; ``gate_frac`` is fixed by the ISA,
    :data:`hw.numerics.GATE_FRAC`), then an image that ends with its header (``TRUNCATED``).

    Raises
    ------
    ImageError
        With no instruction (``ERROR_WHERE`` is :data:`hw.isa.NO_INSTRUCTION`).
    """
    lim = limits or BuildLimits()
    mv = memoryview(bytes(raw)) if not isinstance(raw, memoryview) else raw
    size = len(mv)
    if size < HEADER_BYTES:
        raise ImageError(ErrorCause.TRUNCATED, f"image of {size} bytes is shorter than its {HEADER_BYTES}-byte "
                         "header", offset=size)
    h = isa.unpack(ImageHeader, mv[:HEADER_BYTES])
    if h.magic != isa.IMAGE_MAGIC:
        raise ImageError(ErrorCause.BAD_MAGIC, f"image magic 0x{h.magic:08x}, expected 0x{isa.IMAGE_MAGIC:08x} "
                         "('MMFI'): not a model image", offset=0)
    if h.version != isa.ISA_VERSION:
        raise ImageError(ErrorCause.BAD_VERSION, f"image ISA version {h.version}, this build runs version "
                         f"{isa.ISA_VERSION}: recompile the model", offset=_byte(ImageHeader, "version"))
    crc = isa.crc32_words(mv[:_byte(ImageHeader, "crc")])
    if crc != h.crc:
        raise ImageError(ErrorCause.HEADER_CRC, f"image header CRC 0x{h.crc:08x}, computed 0x{crc:08x}",
                         offset=_byte(ImageHeader, "crc"))
    packing = _member(h, ImageHeader, ("packing",), ErrorCause.BAD_SHAPE, "trit packing",
                      offset=_byte(ImageHeader, "packing"))
    info = ImageInfo(packing=packing, channels=h.channels, n_layers=h.n_layers, hidden=h.hidden,
                     intermediate=h.intermediate, vocab=h.vocab, n_instructions=h.n_instructions,
                     image_bytes=4 * h.image_words, residual_frac=h.residual_frac, state_frac=h.state_frac,
                     gate_frac=h.gate_frac, lut_segments_log2=h.lut_segments_log2)
    if lim.packing is not None and packing is not TritPacking(lim.packing):
        raise ImageError(ErrorCause.BAD_SHAPE, f"{packing.name} trits, the build decodes "
                         f"{TritPacking(lim.packing).name}", offset=_byte(ImageHeader, "packing"))
    if not (1 <= info.channels <= 16) or (lim.channels is not None and info.channels != lim.channels):
        raise ImageError(ErrorCause.BAD_SHAPE, f"{info.channels} weight channels (1-16, the build has "
                         f"{lim.channels or 'any'})", offset=_byte(ImageHeader, "channels"))
    limits_ = (("hidden", info.hidden, lim.max_hidden), ("intermediate", info.intermediate, lim.max_intermediate),
               ("n_layers", info.n_layers, lim.max_layers), ("vocab", info.vocab, isa.MAX_VOCAB))
    for name, v, most in limits_:
        if not 1 <= v <= most:
            raise ImageError(ErrorCause.BAD_SHAPE, f"{name} {v} outside 1..{most}", offset=0)
    if info.gate_frac != GATE_FRAC:
        raise ImageError(ErrorCause.BAD_SHAPE, f"gate_frac {info.gate_frac}: the ISA fixes sigmoid outputs at "
                         f"Q.{GATE_FRAC}", offset=_byte(ImageHeader, "gate_frac"))
    if lim.lut_segments_log2 is not None and info.lut_segments_log2 != lim.lut_segments_log2:
        raise ImageError(ErrorCause.BAD_SHAPE, f"a sigmoid LUT of 2^{info.lut_segments_log2} segments, the build "
                         f"has 2^{lim.lut_segments_log2}", offset=_byte(ImageHeader, "lut_segments_log2"))
    if size == HEADER_BYTES:
        raise ImageError(ErrorCause.TRUNCATED, "the image ends with its header", offset=size)
    return info


def iter_instructions(raw: bytes | bytearray | memoryview, info: ImageInfo, *,
                      check_trits: bool = True, image_tlast: bool = True) -> Iterator[Instruction]:
    """The instructions of an image whose header passed :func:`check_image_header`, each checked in the
    hardware's order before it is yielded (docs/ISA.md section 5): header truncated, ``INSTR_CRC``, opcode
    and flags, micro-ops, shapes (``END_TOKEN`` also: its position, ``image_words``, nothing after it), the
    stream ending with the header, the constants (truncated, CRC), the weights (truncated, then with
    ``check_trits`` every channel's trits and then their CRC words). The last one yielded is END_TOKEN.

    Raises
    ------
    ImageError
        At the first failed check (``instruction`` = its index; ``NO_END`` names index ``n_instructions``).
    """
    mv = memoryview(bytes(raw)) if not isinstance(raw, memoryview) else raw
    size = len(mv)
    pos = HEADER_BYTES
    codes_k = 0                       # k of the codes a REUSE_CODES GEMV would reuse (0: none yet)
    vmax = max(info.hidden, info.intermediate)
    written = Written()
    for idx in range(info.n_instructions + 1):
        if idx == info.n_instructions:
            raise ImageError(ErrorCause.NO_END, f"the program's {info.n_instructions} instruction(s) hold no "
                             "END_TOKEN", offset=pos, instruction=idx)
        where = {"offset": pos, "instruction": idx}
        if pos + INSTR_BYTES > size:
            raise ImageError(ErrorCause.TRUNCATED, "the image ends inside an instruction header", **where)
        head = mv[pos:pos + INSTR_BYTES]
        ih = isa.unpack(InstrHeader, head)
        crc = isa.crc32_words(head[:_byte(InstrHeader, "crc")])
        if crc != ih.crc:
            raise ImageError(ErrorCause.INSTR_CRC, f"instruction header CRC 0x{ih.crc:08x}, computed 0x{crc:08x}",
                             offset=pos + _byte(InstrHeader, "crc"), instruction=idx)
        opcode = _member(ih, InstrHeader, ("opcode",), ErrorCause.UNKNOWN_OPCODE, "opcode", **where)
        flags = _member(ih, InstrHeader, ("flags",), ErrorCause.UNKNOWN_OPCODE, "instruction flags", **where)
        ins = Instruction(opcode=opcode, flags=flags, layer=ih.layer, n=ih.n,
                          k=ih.k, q_shift=ih.q_shift, amax_reg=ih.amax_reg, ssq_reg=ih.ssq_reg,
                          cb_mant=ih.cb_mant, cb_shift=ih.cb_shift, ssq_bias=ih.ssq_bias,
                          ssq_bias_shift=ih.ssq_bias_shift, out_frac=ih.out_frac, offset=pos)
        # micro-ops (BAD_MICROOP), then shapes (BAD_SHAPE): the core's instruction check has this precedence
        ins.src = _member(ih, InstrHeader, ("src",), ErrorCause.BAD_MICROOP, "source buffer", **where)
        n_ops = ih.n_ops
        if n_ops > isa.MAX_OPS:
            raise ImageError(ErrorCause.BAD_MICROOP, f"{n_ops} micro-ops (at most {isa.MAX_OPS})", **where)
        ins.ops = [_decode_op(ih, j, where) for j in range(n_ops)]
        n_consts = ih.n_consts
        if n_consts > isa.MAX_CONSTS:
            raise ImageError(ErrorCause.BAD_MICROOP, f"{n_consts} constant vectors (at most {isa.MAX_CONSTS})",
                             **where)
        _check_microops(ins, info, n_consts, where)
        _check_shape(ins, info, vmax, codes_k, where)
        if opcode is not Opcode.END_TOKEN:
            written.check_and_update(ins, info, where)
        wb = ih.weight_bytes
        expect = channel_block_bytes(ins.n, ins.k, info.channels, info.packing) if opcode is Opcode.GEMV else []
        if wb != sum(expect):
            raise ImageError(ErrorCause.BAD_SHAPE, f"{opcode.name} with a weight section of {wb} bytes, "
                             f"{sum(expect)} expected" + (f" for a {ins.n}x{ins.k} GEMV over {info.channels} "
                                                          "channel(s)" if expect else ""), **where)
        if opcode is Opcode.END_TOKEN:
            if idx != info.n_instructions - 1:
                raise ImageError(ErrorCause.BAD_SHAPE, f"END_TOKEN at instruction {idx} of "
                                 f"{info.n_instructions}", **where)
            if pos + INSTR_BYTES != info.image_bytes:
                raise ImageError(ErrorCause.BAD_SHAPE, f"the header says {info.image_bytes} bytes, the program "
                                 f"ends at {pos + INSTR_BYTES}", **where)
            if pos + INSTR_BYTES != size and image_tlast:
                raise ImageError(ErrorCause.BAD_SHAPE, f"{size - pos - INSTR_BYTES} bytes after the last "
                                 "instruction", offset=pos + INSTR_BYTES, instruction=idx)
            written.check_and_update(ins, info, where)
            yield ins           # END_TOKEN: a header only (its constants and weights are not read)
            return
        if opcode is Opcode.GEMV and InstrFlags.REUSE_CODES not in flags:
            codes_k = ins.k
        pos += INSTR_BYTES
        q_len = ins.k if InstrFlags.QCONST in ins.flags else 0
        q_words = vector_words(q_len) if q_len else 0
        const_words = q_words + n_consts * vector_words(ins.n)
        section = 4 * const_words
        # the stream ends with END_TOKEN: a header, constants or weights that reach its end are truncated
        if pos >= size:
            raise ImageError(ErrorCause.TRUNCATED, "the image ends with an instruction header that is not "
                             "END_TOKEN", offset=pos, instruction=idx)
        if section and pos + section >= size:
            raise ImageError(ErrorCause.TRUNCATED, "the image ends inside the constants", offset=pos,
                             instruction=idx)
        cbytes = mv[pos:pos + section]
        if const_words:
            crc = isa.crc32_words(cbytes)
            if crc != ih.const_crc:
                raise ImageError(ErrorCause.CONST_CRC, f"constants CRC 0x{ih.const_crc:08x}, computed 0x{crc:08x}",
                                 offset=pos, instruction=idx)
        if wb and pos + section + wb >= size:
            raise ImageError(ErrorCause.TRUNCATED, "the image ends inside the weights", offset=pos + section,
                             instruction=idx)
        words = np.frombuffer(cbytes, dtype="<i4").astype(np.int64)
        if q_len:
            ins.qconst = words[:q_len]
        vw = vector_words(ins.n)
        ins.consts = [words[q_words + c * vw: q_words + c * vw + ins.n] for c in range(n_consts)]
        pos += section
        if opcode is Opcode.GEMV:
            ins.weight_offset = pos
            start = pos
            for c, nb in enumerate(expect):
                block = np.frombuffer(mv[start:start + nb], dtype=np.uint8)
                if check_trits:
                    check_block_trits(block, channel_rows(ins.n, info.channels, c) * ins.k, info.packing,
                                 start, idx)
                ins.blocks.append(block)
                start += nb
            if check_trits:    # every channel's trits first (found while decoding), then the CRC words
                check_block_crcs(mv[pos:pos + wb], expect, pos, idx)
        pos += wb
        yield ins


def parse_image(raw: bytes | bytearray | memoryview, *, check_trits: bool = True,
                limits: BuildLimits | None = None) -> ParsedImage:
    """Validate and decode an image: every check the hardware makes while streaming it, all up front and in
    its order (:func:`check_image_header`, then :func:`iter_instructions`), so the first error is the one the
    hardware reports for this image (docs/ISA.md section 5).

    Checks magic, version, header CRC, the header's fields, every instruction header CRC and constant CRC,
    opcodes and micro-ops, shapes against :mod:`hw.isa`'s limits and the header's dimensions, truncation, the
    final END_TOKEN and ``image_words``, and (``check_trits``) that every packed byte is a valid trit code and
    every weight block's CRC word matches (all channels' trits before the CRC words: ``BAD_TRIT`` before
    ``WEIGHT_CRC``).

    Raises
    ------
    ImageError
        Naming the :class:`~hw.isa.ErrorCause`, the byte offset and the instruction.
    """
    mv = memoryview(bytes(raw)) if not isinstance(raw, memoryview) else raw
    info = check_image_header(mv, limits)
    instructions = list(iter_instructions(mv, info, check_trits=check_trits,
                                          image_tlast=limits is None or limits.image_tlast))
    return ParsedImage(info=info, instructions=instructions, raw=mv)


def _decode_op(ih: isa.Unpacked, j: int, where: dict) -> MicroOpSpec:
    """Micro-op ``j`` of an unpacked instruction header (``BAD_MICROOP`` for an unknown opcode or buffer)."""
    op = _member(ih, InstrHeader, ("ops", j, "op"), ErrorCause.BAD_MICROOP, f"micro-op {j} opcode", **where)
    buf = _member(ih, InstrHeader, ("ops", j, "buf"), ErrorCause.BAD_MICROOP, f"micro-op {j} buffer", **where)
    u = ih.ops[j]
    return MicroOpSpec(op=op, dst=u.dst, a=u.a, b=u.b, buf=buf, shift=u.shift, reg=u.reg)


_WRITABLE = (Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_NEW)
_H_SIZED = (Buffer.X, Buffer.STATE_OLD, Buffer.STATE_NEW, Buffer.TOKEN)   #: hidden elements; A and P: max(H, I)


def _check_microops(ins: Instruction, info: ImageInfo, n_consts: int, where: dict) -> None:
    if ins.opcode is Opcode.GEMV and ins.src not in (Buffer.X, Buffer.A, Buffer.P):
        raise ImageError(ErrorCause.BAD_MICROOP, f"GEMV source {ins.src.name} (X, A or P)", **where)
    for j, op in enumerate(ins.ops):
        if op.shift > 62:
            raise ImageError(ErrorCause.BAD_MICROOP, f"micro-op {j}: shift {op.shift} (at most 62)", **where)
        if Buffer.C0.value <= op.buf.value <= Buffer.C3.value and op.buf.value - Buffer.C0.value >= n_consts:
            raise ImageError(ErrorCause.BAD_MICROOP, f"micro-op {j} reads {op.buf.name}, the instruction has "
                             f"{n_consts} constant vector(s)", **where)
        if op.op in (MicroOpcode.SIG, MicroOpcode.SIGNEG, MicroOpcode.SILU) and \
                op.shift < info.lut_segments_log2 - LUT_RANGE_LOG2:
            raise ImageError(ErrorCause.BAD_MICROOP, f"micro-op {j}: sigmoid input Q.{op.shift} is coarser than "
                             "the LUT's segments", **where)
        if op.op is MicroOpcode.ST and op.buf not in _WRITABLE:
            raise ImageError(ErrorCause.BAD_MICROOP, f"micro-op {j} writes read-only {op.buf.name}", **where)
        if op.op in (MicroOpcode.LD, MicroOpcode.MULV, MicroOpcode.ADDV) and op.buf is Buffer.NONE:
            raise ImageError(ErrorCause.BAD_MICROOP, f"micro-op {j} reads buffer NONE", **where)
    # The epilogue reads every buffer as an element enters and writes as it leaves: a program may not
    # read a buffer after storing to it (docs/ISA.md, "hazard rule").
    stored: set[Buffer] = set()
    for j, op in enumerate(ins.ops):
        if op.op in _READS_BUF and op.buf in stored:
            raise ImageError(ErrorCause.BAD_MICROOP, f"micro-op {j} reads {op.buf.name} after a store to it in the "
                             "same program", **where)
        if op.op is MicroOpcode.ST:
            stored.add(op.buf)


@dataclass
class Written:
    """What the program has written so far in a token (program order): the elements of X, A, P (a prefix each)
    and the layers of STATE_NEW written whole. The core does not clear its buffers at a token's start, so an
    instruction may read only what an earlier one of the same token wrote (``BAD_SHAPE``; ``STATE_OLD``,
    ``TOKEN`` and constants are always defined), and END_TOKEN commits only a STATE_NEW written in every layer."""

    x: int = 0
    a: int = 0
    p: int = 0
    layers: set[int] = field(default_factory=set)

    def check_and_update(self, ins: Instruction, info: ImageInfo, where: dict) -> None:
        have = {Buffer.X: self.x, Buffer.A: self.a, Buffer.P: self.p}
        if ins.opcode is Opcode.END_TOKEN:
            missing = sorted(set(range(info.n_layers)) - self.layers)
            if missing:
                raise ImageError(ErrorCause.BAD_SHAPE, f"END_TOKEN commits STATE_NEW of layer {missing[0]}, which "
                                 "the program did not write", **where)
            return
        if ins.opcode is Opcode.GEMV and InstrFlags.REUSE_CODES not in ins.flags and ins.k > have[ins.src]:
            raise ImageError(ErrorCause.BAD_SHAPE, f"GEMV reads {ins.k} elements of {ins.src.name}, the program "
                             f"wrote {have[ins.src]}", **where)
        for j, op in enumerate(ins.ops):
            if op.op in _READS_BUF:
                if op.buf in have and ins.n > have[op.buf]:
                    raise ImageError(ErrorCause.BAD_SHAPE, f"micro-op {j} reads {ins.n} elements of {op.buf.name}, "
                                     f"the program wrote {have[op.buf]}", **where)
                if op.buf is Buffer.STATE_NEW and ins.layer not in self.layers:
                    raise ImageError(ErrorCause.BAD_SHAPE, f"micro-op {j} reads STATE_NEW of layer {ins.layer} "
                                     "before the program wrote it", **where)
        for op in ins.ops:
            if op.op is MicroOpcode.ST:
                if op.buf is Buffer.X:
                    self.x = max(self.x, ins.n)
                elif op.buf is Buffer.A:
                    self.a = max(self.a, ins.n)
                elif op.buf is Buffer.P:
                    self.p = max(self.p, ins.n)
                elif op.buf is Buffer.STATE_NEW and ins.n >= info.hidden:
                    self.layers.add(ins.layer)


def _check_shape(ins: Instruction, info: ImageInfo, vmax: int, codes_k: int, where: dict) -> None:
    if ins.opcode is Opcode.GEMV:
        if not (1 <= ins.k <= isa.MAX_K and 1 <= ins.n <= isa.MAX_N):
            raise ImageError(ErrorCause.BAD_SHAPE, f"GEMV {ins.n}x{ins.k} beyond the limits", **where)
        if ins.k not in (info.hidden, info.intermediate):
            raise ImageError(ErrorCause.BAD_SHAPE, f"GEMV input of {ins.k}: neither hidden ({info.hidden}) nor "
                             f"intermediate ({info.intermediate})", **where)
        if ins.n not in (info.hidden, info.intermediate, info.vocab):
            raise ImageError(ErrorCause.BAD_SHAPE, f"GEMV output of {ins.n}: not hidden, intermediate or vocab",
                             **where)
        if ins.src is Buffer.X and ins.k > info.hidden:
            raise ImageError(ErrorCause.BAD_SHAPE, f"GEMV reads {ins.k} elements of X ({info.hidden})", **where)
        if InstrFlags.REUSE_CODES in ins.flags and codes_k != ins.k:
            raise ImageError(ErrorCause.BAD_SHAPE, f"REUSE_CODES of {ins.k} codes, the previous GEMV formed "
                             f"{codes_k}", **where)
    elif ins.opcode is Opcode.LOAD_TOKEN and ins.n != info.hidden:
        raise ImageError(ErrorCause.BAD_SHAPE, f"LOAD_TOKEN of {ins.n} elements, hidden is {info.hidden}",
                         **where)
    if ins.opcode is not Opcode.END_TOKEN:
        if ins.layer >= info.n_layers:
            raise ImageError(ErrorCause.BAD_SHAPE, f"layer {ins.layer} of a {info.n_layers}-layer model", **where)
        for j, op in enumerate(ins.ops):
            if op.op in _ACCESSES_BUF and op.buf is not Buffer.NONE and \
                    ins.n > (info.hidden if op.buf in _H_SIZED else vmax if op.buf in (Buffer.A, Buffer.P)
                             else ins.n):
                raise ImageError(ErrorCause.BAD_SHAPE, f"micro-op {j}: {ins.n} elements of {op.buf.name}", **where)


_READS_BUF = (MicroOpcode.LD, MicroOpcode.MULV, MicroOpcode.ADDV, MicroOpcode.SSQ, MicroOpcode.AMAX)
_ACCESSES_BUF = _READS_BUF + (MicroOpcode.ST,)


def check_block_crcs(weights: bytes | memoryview, sizes: Sequence[int], offset: int, idx: int) -> None:
    """Check each channel block's CRC word (its last 4 bytes: CRC-32 of the bytes before them).

    Raises
    ------
    ImageError
        ``WEIGHT_CRC`` at the first bad block's CRC word (``offset`` is the weight section's byte offset).
    """
    start = 0
    for nb in sizes:
        if nb:
            body = weights[start:start + nb - 4]
            want = int.from_bytes(bytes(weights[start + nb - 4:start + nb]), "little")
            got = isa.crc32_words(body)
            if got != want:
                raise ImageError(ErrorCause.WEIGHT_CRC, f"weight block CRC 0x{want:08x}, computed 0x{got:08x}",
                                 offset=offset + start + nb - 4, instruction=idx)
        start += nb


def check_block_trits(block: np.ndarray, n_trits: int, packing: TritPacking, offset: int, idx: int) -> None:
    """Every code of a block's ``n_trits`` trits is valid (``BAD_TRIT`` at the first bad byte otherwise; the
    padding and the CRC word are not trits)."""
    nbytes = isa.packed_trit_bytes(n_trits, packing)
    body = block[:nbytes]
    if packing is TritPacking.BASE3:
        bad = np.flatnonzero(body > 242)
    else:
        codes = np.stack([(body >> s) & 3 for s in (0, 2, 4, 6)], axis=1).reshape(-1)[:n_trits]
        bad = np.flatnonzero(codes == 2) // 4
    if bad.size:
        raise ImageError(ErrorCause.BAD_TRIT, f"invalid {packing.name} trit byte 0x{int(body[bad[0]]):02x}",
                         offset=offset + int(bad[0]), instruction=idx)


def disassemble(image: ParsedImage | bytes, *, names: Sequence[str] | None = None) -> str:
    """A readable listing of an image: one block per instruction with its micro-ops."""
    img = image if isinstance(image, ParsedImage) else parse_image(image, check_trits=False)
    i = img.info
    lines = [f"; image: {i.n_layers} layers, hidden {i.hidden}, intermediate {i.intermediate}, vocab {i.vocab}, "
             f"{i.packing.name}, {i.channels} channel(s), {i.image_bytes} bytes, {i.n_instructions} instructions",
             f"; formats: residual Q.{i.residual_frac}, state Q.{i.state_frac}, gates Q.{i.gate_frac}, "
             f"sigmoid LUT 2^{i.lut_segments_log2} segments"]
    for idx, ins in enumerate(img.instructions):
        label = f"  ; {names[idx]}" if names and idx < len(names) and names[idx] else ""
        if ins.opcode is Opcode.GEMV:
            flags = "|".join(f.name for f in InstrFlags if f in ins.flags) or "-"
            bias = "" if not ins.ssq_bias else \
                f"+{ins.ssq_bias}" + (f"<<{ins.ssq_bias_shift}" if ins.ssq_bias_shift else "")
            lines.append(f"{idx:4d}: GEMV  layer {ins.layer}  {ins.n}x{ins.k}  src {ins.src.name}  "
                         f"A=R{ins.amax_reg} SSQ=R{ins.ssq_reg}{bias}  Cb={ins.cb_mant}*2^-{ins.cb_shift}  "
                         f"out Q.{ins.out_frac}  "
                         f"flags {flags}  consts {len(ins.consts)}{label}")
        else:
            lines.append(f"{idx:4d}: {ins.opcode.name}  n {ins.n}  consts {len(ins.consts)}{label}")
        lines.extend(f"        {op}" for op in ins.ops)
    return "\n".join(lines)
