"""The one definition of the bits: model image, token and output packets, instructions, micro-ops,
trit packings, counters and the register map.

Imported by the gateware (``hw/``) and by the host (compiler, golden device, drivers) alike, so there is
exactly one truth about every field (DESIGN.md section 3; the habit of FINN's ``data_packing.py``).
Layouts are ``amaranth.lib.data`` structs and ``amaranth.lib.enum`` enums; the host packs them with
:func:`pack` and reads them back with :func:`unpack`, both driven by the layout's own fields. Without
Amaranth (a board runs a compiled bundle with the runtime's dependencies only) the same definitions
execute on the pure-Python stand-in :mod:`hw._bits`, and :func:`pack`, :func:`unpack`,
:func:`field_span` and :func:`layout_bytes` give the same bytes and fields. Every packing function
here has its inverse, and ``tests/test_isa.py`` round-trips each one (hypothesis), in both modes.

Streams
-------
All multi-byte values are little-endian. Every *section* (image header, instruction header, the
constants of an instruction, each channel's weight block, a whole token or output packet) is padded
with zero bytes to a multiple of :data:`SECTION_BYTES` (64), so with any ``tdata`` width up to 512 bits
every section starts on a beat boundary and no beat mixes two sections.

* **Model image** (the program; loaded once, streamed every token)::

      ImageHeader (64 B)
      Instruction 0: InstrHeader (64 B) | constants | packed weights (channel blocks)
      Instruction 1: ...
      ...                                   (the last instruction is END_TOKEN)

* **Token packet** (host -> accelerator, ahead of the image each token): :class:`TokenHeader`
  (16 B), ``hidden`` words of the embedding in the residual format (int32 with the image's
  ``residual_frac`` fraction bits, saturated), zero padding, and a CRC-32 word (over everything before
  it) as the last word of the last 64-byte section.
* **Output packet** (accelerator -> host, once per token): ``n_logits`` int32 words (the LM head's raw
  accumulators, when the token asked for them, streamed as they are computed), zero padding, then the
  :class:`OutputTrailer` (32 B) whose last word is the CRC of everything before it; the whole packet is
  a multiple of 64 bytes. (A trailer rather than a header: the argmax is known only after the last
  logit has left.)

CRC-32 is the IEEE 802.3 / zlib CRC (``CRC-32/ISO-HDLC``; Amaranth ``lib.crc.catalog.CRC32_ETHERNET``
computes the same), taken over whole little-endian words.

Instructions and the epilogue machine
-------------------------------------
``GEMV`` (DESIGN.md section 3, the CODA abstraction): (1) the *quantize prologue* forms int8 codes of
the source buffer (``q[k] = clamp(round(mul(src[k], QC[k], q_shift) * 127 / A), -128, 127)`` where
``A`` is the reduction register ``amax_reg``; skipped with ``REUSE_CODES``), (2) the ternary GEMV
``acc[n] = sum_k W[n, k] q[k]`` (int, :data:`ACC_BITS` wide), (3) the *epilogue program*: up to
:data:`MAX_OPS` micro-ops run in order on every output element while it is on chip, on a per-element
register file ``r0..r3`` that starts as ``r0 = acc[n] * S`` (dequantized, ``out_frac`` fraction bits),
``r1 = acc[n]``, ``r2 = r3 = 0``. ``S`` is the per-token dequantization scale formed by the
scalar unit from ``amax_reg``, ``ssq_reg`` and the instruction's constant ``Cb = beta sqrt(K) / 127``
(see :mod:`hw.numerics`). ``LOAD_TOKEN`` runs an epilogue program over the token packet's vector
(``r0 = r1 = x[n]``) and ``END_TOKEN`` commits the recurrent state and emits the output packet.

Per-instruction constant vectors (``QC`` of length K when ``QCONST`` is set, then ``C0..C{n-1}`` of
length N) follow the instruction header as int32 words, each vector zero-padded to a whole 64-byte
section (so every vector starts on a beat boundary); ``const_crc`` is the CRC of the whole section.
"""



import enum as _py_enum
import math
import operator
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

try:  # the gateware uses these types as shapes: Amaranth's own whenever it is installed
    from amaranth.hdl import Shape, signed, unsigned
    from amaranth.lib import data, enum
except ModuleNotFoundError as _exc:  # the runtime alone (a board): the pure-Python stand-in
    if (_exc.name or "").partition(".")[0] != "amaranth":
        raise
    from hw._bits import Shape, data, enum, signed, unsigned

#: True when the layouts below are Amaranth's own types (False: :mod:`hw._bits`, no Amaranth installed)
AMARANTH = data.Layout.__module__.startswith("amaranth")

__all__ = [
    "IMAGE_MAGIC", "TOKEN_MAGIC", "OUTPUT_MAGIC", "OUTPUT_ABORT_WORD", "NO_INSTRUCTION", "ID_MAGIC", "ISA_VERSION",
    "SECTION_BYTES", "section_pad",
    "MAX_HIDDEN", "MAX_INTERMEDIATE", "MAX_LAYERS", "MAX_VOCAB", "MAX_K", "MAX_N", "MAX_OPS", "MAX_CONSTS",
    "ACC_BITS", "acc_bits_for",
    "TritPacking", "Opcode", "InstrFlags", "MicroOpcode", "Buffer", "ErrorCause", "Ctrl", "Status", "IRQ_SOURCES",
    "Counter",
    "ImageHeader", "TokenHeader", "OutputTrailer", "MicroOp", "InstrHeader",
    "pack", "unpack", "Unpacked", "crc32_words", "layout_bytes", "field_span", "AMARANTH",
    "pack_trits", "unpack_trits", "packed_trit_bytes", "TRIT_2BIT_CODES",
    "RegisterMap", "REGISTER_MAP", "register_base", "id_block_values",
]

# ----------------------------------------------------------------------------------------------- magics
IMAGE_MAGIC = int.from_bytes(b"MMFI", "little")   #: model image header
TOKEN_MAGIC = int.from_bytes(b"MMFT", "little")   #: token packet header
OUTPUT_MAGIC = int.from_bytes(b"MMFO", "little")  #: output packet header
#: The word (with ``tlast``) that closes an output packet cut short by an error while the LM head's logits
#: were streaming: the packet is then not a whole number of sections and fails to parse; STATUS says why.
OUTPUT_ABORT_WORD = int.from_bytes(b"MMFE", "little")
#: ``ERROR_WHERE`` of an error found outside any instruction (the token packet, the image header)
NO_INSTRUCTION = 0xFFFF_FFFF
ID_MAGIC = int.from_bytes(b"MMFA", "little")      #: register map ID block
#: 2: the released checkpoints' numerics (BitLinear eps through ``InstrHeader.ssq_bias`` and the compiled
#: constants, codes rounded half away from zero) and ``cb_mant``/``cb_shift`` in one word. Version 1 images
#: and bitstreams compute the earlier arithmetic and are refused.
ISA_VERSION = 2
SECTION_BYTES = 64  #: every section of every stream is padded to a multiple of this

# ------------------------------------------------------------------------------------ supported shapes
# At least the 2.7B shape (hidden 2560, intermediate 6912, 32 layers, vocabulary 32000), DESIGN.md section 3.
MAX_HIDDEN = 4096
MAX_INTERMEDIATE = 8192
MAX_LAYERS = 64
MAX_VOCAB = 65535
MAX_K = 8192                 #: largest GEMV input (max of hidden and intermediate)
MAX_N = 65535                #: largest GEMV output (the LM head's vocabulary)
MAX_OPS = 8                  #: micro-ops in one epilogue program
MAX_CONSTS = 4               #: per-channel constant vectors C0..C3 per instruction


def acc_bits_for(max_k: int) -> int:
    """Signed accumulator width that holds every ternary dot product of length ``max_k``.

    Codes are int8 in [-128, 127] and weights in {-1, 0, 1}, so ``|acc| <= 128 * K``; the range
    ``[-128 K, +128 K]`` needs ``bitlength(128 K) + 1`` bits (``+128 K`` from ``-128 * -1`` terms).
    """
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    return (128 * max_k).bit_length() + 1


#: GEMV accumulator width (22 bits for MAX_K = 8192: |acc| <= 2**20).
ACC_BITS = acc_bits_for(MAX_K)


# ------------------------------------------------------------------------------------------------ enums
class TritPacking(enum.Enum, shape=unsigned(8)):
    """How ternary weights are packed in the image, continuously across rows (no per-row padding).

    ``BITS2``: 4 trits per byte, 2 bits each, first trit in the least significant bits, codes
    :data:`TRIT_2BIT_CODES` (``0b10`` is invalid). ``BASE3``: 5 trits per byte (1.6 bits per trit),
    ``byte = sum_i (t_i + 1) * 3**i`` for the five trits ``t_0..t_4`` in order (values 243-255 invalid).
    """

    BITS2 = 0
    BASE3 = 1


class Opcode(enum.Enum, shape=unsigned(8)):
    """Instruction opcodes (``InstrHeader.opcode``)."""

    GEMV = 1         #: quantize prologue + ternary GEMV + epilogue program
    LOAD_TOKEN = 2   #: epilogue program over the token packet's vector (no weights)
    END_TOKEN = 3    #: commit the recurrent state, emit the output packet; ends the program


class InstrFlags(enum.Flag, shape=unsigned(8)):
    """``InstrHeader.flags``."""

    REUSE_CODES = 1   #: GEMV: skip the quantize prologue, reuse the previous GEMV's codes and scale
    QCONST = 2        #: GEMV: a per-input-channel constant vector QC (length K) precedes C0..
    LOGITS = 4        #: this GEMV's OUT micro-ops feed the output packet (LM head)


class MicroOpcode(enum.Enum, shape=unsigned(5)):
    """Epilogue micro-ops; ``mul(a, b, s) = sat32((a * b + 2**(s-1)) >> s)`` (round half up, ``s > 0``).

    ``sat32`` saturates to int32. ``a``, ``b``, ``dst`` name registers ``r0..r3``; ``buf`` a
    :class:`Buffer` (read at, or written to, the element's index n); ``reg`` a reduction register;
    ``shift`` is the 6-bit shift field. Sigmoid is the LUT of :mod:`hw.numerics` (``shift`` = fraction
    bits of its input; output has ``GATE_FRAC`` fraction bits).
    """

    NOP = 0
    LD = 1        #: dst = buf[n]
    ST = 2        #: buf[n] = a
    ADD = 3       #: dst = sat32(a + b)
    SUB = 4       #: dst = sat32(a - b)
    MUL = 5       #: dst = mul(a, b, shift)
    MULV = 6      #: dst = mul(a, buf[n], shift)
    ADDV = 7      #: dst = sat32(a + buf[n])
    SIG = 8       #: dst = sigmoid(a)
    SIGNEG = 9    #: dst = sigmoid(-a)
    SILU = 10     #: dst = mul(a, sigmoid(a), GATE_FRAC): same format as a
    RSUB1 = 11    #: dst = sat32(2**shift - a): "1 - a" with `shift` fraction bits
    SSQ = 12      #: reg += w * w (64-bit, saturating), w = mul(a, buf[n], shift), or w = a for buf NONE
    AMAX = 13     #: reg = max(reg, |w|), w as for SSQ
    ARGMAX = 14   #: running argmax of a over the elements (the first index wins ties)
    OUT = 15      #: append a to the output packet's logits (sent when the token asks for logits)


class Buffer(enum.Enum, shape=unsigned(4)):
    """On-chip vectors addressed by micro-ops and by the quantize prologue."""

    X = 0          #: residual stream (hidden)
    A = 1          #: scratch: SiLU(i), SiLU(first half of gate_proj)
    P = 2          #: next BitLinear input: output-gate product p, GLU product m
    STATE_OLD = 3  #: committed recurrent state h_{t-1} of the instruction's layer (read only)
    STATE_NEW = 4  #: recurrent state h_t of the instruction's layer (committed by END_TOKEN)
    TOKEN = 5      #: the token packet's vector (read only)
    C0 = 8         #: per-instruction constant vectors (read only)
    C1 = 9
    C2 = 10
    C3 = 11
    NONE = 15      #: "no constant": SSQ/AMAX use w = a


class ErrorCause(enum.Enum, shape=unsigned(8)):
    """Why the core stopped a token (``ERROR_CAUSE`` register; the golden device raises the same)."""

    NONE = 0
    BAD_MAGIC = 1        #: image header magic
    BAD_VERSION = 2      #: image ISA version
    HEADER_CRC = 3       #: image header CRC
    INSTR_CRC = 4        #: instruction header CRC
    CONST_CRC = 5        #: constant vectors CRC
    UNKNOWN_OPCODE = 6   #: instruction opcode
    BAD_MICROOP = 7      #: micro-op opcode, register, buffer or shift out of range
    BAD_SHAPE = 8        #: dimensions beyond the build's limits or inconsistent with the header
    TRUNCATED = 9        #: the stream ended inside a header, constants or weights
    BAD_TRIT = 10        #: an invalid trit code (2-bit 0b10, base-3 byte > 242)
    TOKEN_MAGIC = 11     #: token packet magic
    TOKEN_LENGTH = 12    #: token packet length differs from the image's hidden size
    TOKEN_CRC = 13       #: token packet CRC
    ABORTED = 14         #: the host aborted (reset) in the middle of a token
    NO_END = 15          #: the image has no END_TOKEN
    WEIGHT_CRC = 16      #: a weight block's CRC word (the block's last 4 bytes)


class Ctrl(enum.Flag, shape=unsigned(32)):
    """``CTRL`` (write only; each bit a one-cycle strobe, reads back as 0)."""

    CLEAR = 1   #: leave the error state: the core stops dropping input and waits for the next token packet
    ABORT = 2   #: stop the token in flight: ErrorCause.ABORTED, the committed state untouched


class Status(enum.Flag, shape=unsigned(32)):
    """``STATUS`` (read only). The core's ``irq`` output is ``DONE | ERROR`` (a level)."""

    BUSY = 1    #: a token is in flight (from its packet's first beat to the output packet's last word)
    DONE = 2    #: the last token completed and committed (until the next token starts)
    ERROR = 4   #: a token stopped with ERROR_CAUSE / ERROR_WHERE; input is dropped until Ctrl.CLEAR


#: The ``Status`` bits that drive the core's ``irq`` output (level).
IRQ_SOURCES = Status.DONE | Status.ERROR


class Counter(enum.Enum, shape=unsigned(8)):
    """Performance and activity counters (64-bit each; register map ``COUNTERS`` + 8 * index).

    The golden device's cycle model predicts each of them per instruction and per token.
    """

    CYCLES = 0            #: core clock cycles from the token packet's first beat to the output CRC
    STREAM_BEATS = 1      #: input-stream beats accepted, all channels (token packet, headers, constants, weights)
    STREAM_STALLS = 2     #: cycles the GEMV engine waited for weight beats (before its block's last chunk)
    OUT_STALLS = 3        #: cycles the output stream was back-pressured
    GEMV_CYCLES = 4       #: cycles the ternary array was busy: a GEMV's start to its block's last chunk
    QUANT_CYCLES = 5      #: cycles of quantize prologues (the absmax barrier), command handshake excluded
    SCALAR_CYCLES = 6     #: cycles of the scalar unit (isqrt, divisions), its command handshake included
    TRITS = 7             #: ternary weights consumed
    NONZERO_TRITS = 8     #: of which non-zero (add or subtract; zero trits skip)
    EPILOGUE_ELEMENTS = 9  #: elements through the epilogue
    INSTRUCTIONS = 10     #: instructions completed (END_TOKEN with its commit)
    TOKENS = 11           #: tokens completed


TRIT_2BIT_CODES = {0: 0b00, 1: 0b01, -1: 0b11}  #: 2-bit trit codes; 0b10 is invalid


# ---------------------------------------------------------------------------------------------- layouts
class ImageHeader(data.Struct):
    """Model image header, 16 words (64 bytes); ``crc`` covers words 0-14."""

    magic: unsigned(32)
    version: unsigned(16)
    header_words: unsigned(16)
    packing: TritPacking
    channels: unsigned(8)
    flags: unsigned(16)                #: reserved, 0
    n_layers: unsigned(16)
    hidden: unsigned(16)
    intermediate: unsigned(16)
    vocab: unsigned(16)
    n_instructions: unsigned(32)
    image_words: unsigned(32)          #: whole image, this header included
    residual_frac: unsigned(8)         #: fraction bits of the residual format (token packets)
    state_frac: unsigned(8)            #: fraction bits of the recurrent state
    gate_frac: unsigned(8)             #: fraction bits of sigmoid outputs
    lut_segments_log2: unsigned(8)     #: sigmoid LUT: 2**n segments over [-16, 16)
    reserved: unsigned(32 * 7)
    crc: unsigned(32)


class TokenHeader(data.Struct):
    """Token packet header, 4 words; a CRC word over header and payload follows the payload."""

    magic: unsigned(32)
    position: unsigned(32)   #: token index in the sequence (informational, echoed in the output)
    flags: unsigned(32)      #: bit 0: send the LM head's logits in the output packet
    length: unsigned(32)     #: payload words (must equal the image's hidden size)


class OutputTrailer(data.Struct):
    """Output packet trailer, 8 words, the packet's last 32 bytes; ``crc`` covers the whole packet before it."""

    magic: unsigned(32)
    position: unsigned(32)
    argmax: unsigned(32)          #: greedy next token (first index of the largest accumulator)
    max_acc: signed(32)           #: its accumulator
    scale_mant: unsigned(32)      #: LM-head dequantization: logit = acc * scale_mant * 2**-scale_shift
    scale_shift: signed(32)
    n_logits: unsigned(32)        #: logit words at the start of the packet
    crc: unsigned(32)


class MicroOp(data.Struct):
    """One epilogue micro-op, 32 bits."""

    op: MicroOpcode
    dst: unsigned(2)
    a: unsigned(2)
    b: unsigned(2)
    buf: Buffer
    shift: unsigned(6)
    reg: unsigned(3)      #: reduction register (SSQ, AMAX)
    reserved: unsigned(8)


class InstrHeader(data.Struct):
    """Instruction header, 16 words (64 bytes); ``crc`` covers words 0-14."""

    opcode: Opcode
    flags: InstrFlags
    layer: unsigned(8)
    n_ops: unsigned(8)
    n: unsigned(16)               #: outputs (rows of W)
    k: unsigned(16)               #: inputs (columns of W)
    src: Buffer                   #: quantize prologue source vector
    q_shift: unsigned(6)          #: prologue: w[k] = mul(src[k], QC[k], q_shift)
    amax_reg: unsigned(3)         #: prologue and scale: absmax A of w
    ssq_reg: unsigned(3)          #: scale: sum of squares of the pre-norm input
    n_consts: unsigned(3)         #: constant vectors C0.. (length n)
    out_frac: unsigned(6)         #: fraction bits of the dequantized output r0
    ssq_bias_shift: unsigned(5)   #: scale: the sum of squares is ``ssq_reg + (ssq_bias << ssq_bias_shift)``
    reserved0: unsigned(2)
    cb_mant: unsigned(24)         #: Cb = sqrt(K) / 127 / s_w = cb_mant * 2**-cb_shift (s_w = fl32(1/beta))
    cb_shift: signed(8)
    ssq_bias: unsigned(32)        #: the RMSNorm epsilons in the ssq register's units (hw.numerics.ssq_with_bias)
    weight_bytes: unsigned(32)    #: weight blocks of all channels (packed trits, padding, CRC word)
    const_crc: unsigned(32)       #: CRC-32 of the constant words (0 when there are none)
    ops: data.ArrayLayout(MicroOp, MAX_OPS)
    crc: unsigned(32)


def layout_bytes(layout: Any) -> int:
    """Size of a layout in bytes (every layout here is a whole number of 32-bit words).

    Raises
    ------
    TypeError
        If ``layout`` is not a layout or a ``Struct`` class.
    """
    size = _plan(layout).size
    assert size % 32 == 0, f"{layout} is {size} bits, not whole words"
    return size // 8


# ------------------------------------------------------------------------------------ pack and unpack
# One implementation in both modes (Amaranth's types or hw._bits), driven by what every layout states: its
# fields' offsets, widths, signedness, enum classes and nested layouts. Amaranth's Layout.const / data.Const
# are deliberately not used, so the bytes cannot depend on which of the two declared the layout.
@dataclass(frozen=True)
class _Slot:
    """A field of a :class:`_Plan`: bit offset and width; a leaf's signedness and enum class, or a nested plan."""

    offset: int
    width: int
    signed: bool
    enum: type | None
    sub: "_Plan | None"

    def shape_name(self) -> str:
        return f"{'signed' if self.signed else 'unsigned'}({self.width})"


@dataclass(frozen=True)
class _Plan:
    """A layout's fields as plain data (struct: names in declaration order; array: indices 0..length-1)."""

    name: str
    size: int              # bits
    array: bool
    fields: dict

    def slot(self, key: str | int) -> _Slot:
        if self.array:
            if not isinstance(key, int) or isinstance(key, bool):
                raise TypeError(f"{self.name} is indexed with an integer, not {key!r}")
            n = len(self.fields)
            if not -n <= key < n:
                raise IndexError(f"index {key} out of range for {self.name} of length {n}")
            return self.fields[key % n]
        try:
            return self.fields[key]
        except (KeyError, TypeError):
            raise KeyError(f"{self.name} has no field {key!r}") from None


_PLANS: dict[int, tuple[Any, _Plan]] = {}


def _is_layout(shape: Any) -> bool:
    return isinstance(shape, data.Layout) or (isinstance(shape, type) and issubclass(shape, data.Struct))


def _plan(layout: Any) -> _Plan:
    """The :class:`_Plan` of a layout or ``Struct`` class (cached per object)."""
    hit = _PLANS.get(id(layout))
    if hit is not None and hit[0] is layout:
        return hit[1]
    lay = data.Layout.cast(layout)
    fields = {}
    for key, f in lay:
        shape = f.shape
        is_enum = isinstance(shape, type) and issubclass(shape, _py_enum.Enum)
        fields[key] = _Slot(offset=f.offset, width=f.width, signed=Shape.cast(shape).signed,
                            enum=shape if is_enum else None, sub=_plan(shape) if _is_layout(shape) else None)
    plan = _Plan(name=getattr(layout, "__name__", repr(layout)), size=lay.size,
                 array=isinstance(lay, data.ArrayLayout), fields=fields)
    _PLANS[id(layout)] = (layout, plan)
    return plan


def pack(layout: Any, fields: Mapping[str, Any]) -> bytes:
    """Pack ``fields`` into ``layout``'s little-endian bytes (unnamed fields are zero).

    ``fields`` maps field names to values: ints for plain fields, enum members (or their values) for enum
    and flag fields, nested mappings for ``Struct`` fields and sequences for array fields (an
    :class:`Unpacked` view is taken as it is). Later keys overwrite earlier ones where fields overlap.

    Raises
    ------
    ValueError
        On an unknown field, an int outside its field's range, or a value that is not a member of the
        field's enum (or a combination of the flag's bits).
    TypeError
        On a value that is not an int, a member, a mapping or a sequence where one is needed.
    """
    plan = _plan(layout)
    return _encode(plan, fields, plan.name).to_bytes(plan.size // 8, "little")


def _encode(plan: _Plan, fields: Any, where: str) -> int:
    if fields is None:
        return 0
    if isinstance(fields, Unpacked):
        if fields._plan.size != plan.size:
            raise ValueError(f"{where}: a {fields._plan.name} view is not a {plan.name}")
        return fields._value
    if isinstance(fields, Mapping):
        items = fields.items()
    elif isinstance(fields, Sequence) and not isinstance(fields, (str, bytes)):
        items = enumerate(fields)
    else:
        raise TypeError(f"{where} takes a mapping or a sequence of field values, not {fields!r}")
    value = 0
    for key, v in items:
        try:
            slot = plan.slot(key)
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"{where} has no field {key!r}") from exc
        name = f"{where}.{key}"
        if slot.sub is not None:
            bits = _encode(slot.sub, v, name)
        elif slot.enum is not None:
            try:
                bits = slot.enum(v).value
            except ValueError:
                raise ValueError(f"{name} = {v!r} is not a {slot.enum.__name__}") from None
        else:
            try:
                bits = operator.index(v)
            except TypeError:
                raise TypeError(f"{name} = {v!r} is not an integer") from None
            lo, hi = (-(1 << (slot.width - 1)), (1 << (slot.width - 1)) - 1) if slot.signed else \
                (0, (1 << slot.width) - 1)
            if not lo <= bits <= hi:
                raise ValueError(f"{name} = {bits} does not fit {slot.shape_name()} ({lo}..{hi})")
        mask = (1 << slot.width) - 1
        value = (value & ~(mask << slot.offset)) | ((bits & mask) << slot.offset)
    return value


class Unpacked:
    """The fields of a layout read by :func:`unpack`.

    ``view.name`` or ``view["name"]`` of a struct, ``view[i]`` (negative counts from the end) and
    ``len(view)`` of an array. A plain field reads as an int (sign-extended when signed), an enum or flag
    field as its member (``ValueError`` for a bit pattern that is none), a nested layout as another
    :class:`Unpacked`. :meth:`as_bits` is the whole value as an int (bit 0 = the first byte's bit 0).
    Two views are equal when their layouts have the same fields and their bits are equal.
    """

    __slots__ = ("_plan", "_value")

    def __init__(self, plan: _Plan, value: int):
        self._plan, self._value = plan, value

    def __getitem__(self, key: str | int) -> Any:
        slot = self._plan.slot(key)
        bits = (self._value >> slot.offset) & ((1 << slot.width) - 1)
        if slot.sub is not None:
            return Unpacked(slot.sub, bits)
        if slot.enum is not None:
            return slot.enum(bits)
        if slot.signed and bits >> (slot.width - 1):
            bits -= 1 << slot.width
        return bits

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except (KeyError, TypeError):
            raise AttributeError(f"{self._plan.name} has no field {name!r}") from None

    def __len__(self) -> int:
        if not self._plan.array:
            raise TypeError(f"{self._plan.name} is a struct, not an array")
        return len(self._plan.fields)

    def as_bits(self) -> int:
        """The layout's whole value as a non-negative int."""
        return self._value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Unpacked):
            return NotImplemented
        return self._plan == other._plan and self._value == other._value

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Unpacked({self._plan.name}, 0x{self._value:x})"


def unpack(layout: Any, raw: bytes | bytearray | memoryview) -> Unpacked:
    """Read ``layout`` from the first ``layout_bytes(layout)`` bytes of ``raw``.

    Field access on the result (:class:`Unpacked`) returns ints, enum members (``ValueError`` for an
    undefined enum value) and nested views.

    Raises
    ------
    ValueError
        If ``raw`` is shorter than the layout.
    """
    plan = _plan(layout)
    n = plan.size // 8
    if len(raw) < n:
        raise ValueError(f"need {n} bytes for {plan.name}, got {len(raw)}")
    return Unpacked(plan, int.from_bytes(bytes(raw[:n]), "little"))


def field_span(layout: Any, path: Sequence[str | int]) -> tuple[int, int]:
    """Bit offset and width of a (nested) field, read from the layout itself (no hand-written offsets).

    ``field_span(InstrHeader, ("ops", 2, "shift"))`` is where micro-op 2's shift sits in the header.

    Raises
    ------
    KeyError, IndexError
        For a field the layout does not have (``KeyError`` also for a path that goes on past a leaf).
    """
    plan: _Plan | None = _plan(layout)
    bit, width = 0, 0
    for key in path:
        if plan is None:
            raise KeyError(f"{key!r}: the field before it is not a nested layout")
        slot = plan.slot(key)
        bit, width, plan = bit + slot.offset, slot.width, slot.sub
    return bit, width


def section_pad(nbytes: int) -> int:
    """Zero bytes that pad ``nbytes`` to a whole number of :data:`SECTION_BYTES`."""
    return (-int(nbytes)) % SECTION_BYTES


def crc32_words(*chunks: bytes | bytearray | memoryview) -> int:
    """CRC-32 (IEEE 802.3, zlib) over the concatenated chunks (each a whole number of words)."""
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    return crc & 0xFFFFFFFF


# ------------------------------------------------------------------------------------------- packings
_BASE3_POW = np.array([1, 3, 9, 27, 81], dtype=np.int32)
#: base-3 byte -> its five trits (rows 243-255 are invalid and decode to 0)
BASE3_DECODE = np.zeros((256, 5), dtype=np.int8)
BASE3_DECODE[:243] = (np.arange(243)[:, None] // _BASE3_POW[None, :]) % 3 - 1
#: 2-bit code -> trit (0b10 decodes to 0 but is invalid)
BITS2_DECODE = np.array([0, 1, 0, -1], dtype=np.int8)


def packed_trit_bytes(n_trits: int, packing: TritPacking) -> int:
    """Bytes of ``n_trits`` trits packed continuously (the last byte zero-padded)."""
    per = 4 if TritPacking(packing) is TritPacking.BITS2 else 5
    return -(-int(n_trits) // per)


def pack_trits(trits: np.ndarray, packing: TritPacking) -> bytes:
    """Pack a flat sequence of trits continuously (rows back to back, no per-row padding).

    Parameters
    ----------
    trits : ndarray, int8 in {-1, 0, 1}, any shape (flattened in C order)
    packing : TritPacking

    Returns
    -------
    bytes, length :func:`packed_trit_bytes`; padding trits are 0 (code 0b00, base-3 digit 1).

    Raises
    ------
    ValueError
        If a value is not a trit.
    """
    t = np.asarray(trits).reshape(-1)
    if t.size and (t.min() < -1 or t.max() > 1):
        raise ValueError("trits must be in {-1, 0, 1}")
    packing = TritPacking(packing)
    if packing is TritPacking.BITS2:
        codes = (t.astype(np.uint8) & 0b11)  # -1 -> 0b11, 0 -> 0b00, 1 -> 0b01
        pad = (-codes.size) % 4
        codes = np.concatenate([codes, np.zeros(pad, np.uint8)]).reshape(-1, 4)
        out = codes[:, 0] | (codes[:, 1] << 2) | (codes[:, 2] << 4) | (codes[:, 3] << 6)
        return out.astype(np.uint8).tobytes()
    digits = t.astype(np.int32) + 1
    pad = (-digits.size) % 5
    digits = np.concatenate([digits, np.ones(pad, np.int32)]).reshape(-1, 5)
    return (digits @ _BASE3_POW).astype(np.uint8).tobytes()


def unpack_trits(raw: bytes | np.ndarray, n_trits: int, packing: TritPacking) -> np.ndarray:
    """Inverse of :func:`pack_trits`: the first ``n_trits`` trits as int8.

    Raises
    ------
    ValueError
        If ``raw`` is too short, or holds an invalid code (2-bit ``0b10``; base-3 byte above 242).
    """
    b = np.frombuffer(bytes(raw), dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw.view(np.uint8)
    packing = TritPacking(packing)
    need = packed_trit_bytes(n_trits, packing)
    if b.size < need:
        raise ValueError(f"{need} bytes needed for {n_trits} trits, got {b.size}")
    b = b[:need]
    if packing is TritPacking.BITS2:
        codes = np.stack([(b >> s) & 0b11 for s in (0, 2, 4, 6)], axis=1).reshape(-1)[:n_trits]
        if (codes == 0b10).any():
            raise ValueError(f"invalid 2-bit trit code 0b10 at trit {int(np.argmax(codes == 0b10))}")
        return BITS2_DECODE[codes]
    if (b > 242).any():
        raise ValueError(f"invalid base-3 trit byte {int(b[b > 242][0])} at byte {int(np.argmax(b > 242))}")
    return BASE3_DECODE[b].reshape(-1)[:n_trits]


# --------------------------------------------------------------------------------------- register map
@dataclass(frozen=True)
class RegisterMap:
    """AXI4-Lite register map of the core (32-bit registers; offsets relative to :func:`register_base`).

    The ID block comes first (corundum's register blocks; checked by the host on open): magic
    :data:`ID_MAGIC`, ISA version and build parameters. Control and status follow, then the 64-bit
    counters (low word first) in :class:`Counter` order.
    """

    ID_MAGIC: int = 0x00
    ID_VERSION: int = 0x04
    ID_LANES: int = 0x08
    ID_CHANNELS: int = 0x0C
    ID_BUS_BITS: int = 0x10
    ID_PACKINGS: int = 0x14        #: bit i set: TritPacking(i) supported
    ID_MAX_HIDDEN: int = 0x18
    ID_MAX_INTERMEDIATE: int = 0x1C
    ID_MAX_LAYERS: int = 0x20
    ID_MAX_VOCAB: int = 0x24
    ID_QUANT_LANES: int = 0x28     #: codes formed per cycle by the quantize prologue
    ID_ACC_BITS: int = 0x2C
    ID_EPILOGUE: int = 0x30        #: epilogue form: 0 pipelined (an element a cycle), 1 folded (hw/epilogue.py)
    CTRL: int = 0x40               #: :class:`Ctrl` (write): CLEAR, ABORT
    STATUS: int = 0x44             #: :class:`Status` (read): BUSY, DONE, ERROR
    ERROR_CAUSE: int = 0x48        #: ErrorCause
    ERROR_WHERE: int = 0x4C        #: instruction of the error; NO_INSTRUCTION (0xFFFFFFFF): token packet, header
    POSITION: int = 0x50           #: token position of the last output
    ARGMAX: int = 0x54             #: last greedy token
    COUNTERS: int = 0x80           #: Counter(i) at COUNTERS + 8 * i (low word, then high word)
    SIZE: int = 0x100

    def counter(self, c: Counter) -> int:
        return self.COUNTERS + 8 * Counter(c).value


REGISTER_MAP = RegisterMap()

#: Where the register map starts per platform: XRT reserves 0x00-0x0C (ap_ctrl) on Alveo.
_REGISTER_BASE = {"zynq": 0x00, "ecp5": 0x00, "sim": 0x00, "alveo": 0x10}


def register_base(platform: str) -> int:
    """Offset of the register map on ``platform`` ("zynq", "alveo", "ecp5" or "sim")."""
    try:
        return _REGISTER_BASE[platform]
    except KeyError:
        raise ValueError(f"unknown platform {platform!r}; known: {sorted(_REGISTER_BASE)}") from None


def id_block_values(*, lanes: int, channels: int, bus_bits: int, packings: Sequence[TritPacking],
                    quant_lanes: int, max_hidden: int = MAX_HIDDEN,
                    max_intermediate: int = MAX_INTERMEDIATE, max_layers: int = MAX_LAYERS,
                    max_vocab: int = MAX_VOCAB, epilogue_folded: bool = False) -> dict[int, int]:
    """The ID block's register values of a build: ``{offset: value}``."""
    r = REGISTER_MAP
    mask = 0
    for p in packings:
        mask |= 1 << TritPacking(p).value
    return {r.ID_MAGIC: ID_MAGIC, r.ID_VERSION: ISA_VERSION, r.ID_LANES: lanes, r.ID_CHANNELS: channels,
            r.ID_BUS_BITS: bus_bits, r.ID_PACKINGS: mask, r.ID_MAX_HIDDEN: max_hidden,
            r.ID_MAX_INTERMEDIATE: max_intermediate, r.ID_MAX_LAYERS: max_layers,
            r.ID_MAX_VOCAB: max_vocab, r.ID_QUANT_LANES: quant_lanes, r.ID_ACC_BITS: ACC_BITS,
            r.ID_EPILOGUE: int(epilogue_folded)}


def _check_sizes() -> None:
    assert layout_bytes(ImageHeader) == 64
    assert layout_bytes(InstrHeader) == 64
    assert layout_bytes(TokenHeader) == 16
    assert layout_bytes(OutputTrailer) == 32
    assert data.Layout.cast(MicroOp).size == 32
    assert math.ceil(math.log2(MAX_N + 1)) <= 16


_check_sizes()
