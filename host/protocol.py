"""The host side of :mod:`hw.isa`: what crosses between the host and the core, packed, checked and decoded once.

:mod:`hw.isa` is the one home of the bits (layouts, magics, :class:`~hw.isa.Ctrl`/:class:`~hw.isa.Status`
flags, :class:`~hw.isa.ErrorCause`, :class:`~hw.isa.Counter`, :data:`~hw.isa.REGISTER_MAP`); this module is
what every user of the core does with them (FINN's ``data_packing.py``: one module shared by the compiler,
the driver and the testbenches). The golden device, the cocotb bench (``sim/``), the RTL harness device and
every board device import it:

* **Token packet** (docs/ISA.md section 4): :func:`make_token_packet`, :func:`check_token_packet` (the
  core's own checks, in its order), :func:`embedding_packet` (the host's embedding lookup),
  :func:`token_packet_bytes`.
* **Output packet**: :class:`OutputPacket`, :func:`make_output_packet`, :func:`parse_output_packet`,
  :func:`output_packet_bytes`.
* **Channel streams** (``hw/top.py``'s stream protocol): :func:`channel_streams` splits an image into the
  byte stream each weight channel carries; :func:`merge_streams` is its inverse.
* **ID block** (corundum's self-describing register block): :class:`IdBlock`, :func:`read_id_block`,
  :func:`check_id_block` (magic, ISA version: :func:`check_isa_version`), :meth:`IdBlock.check_image`
  (an image against the build).
* **Errors**: :class:`CoreError` (the core's ``STATUS.error``: the :class:`~hw.isa.ErrorCause` by name and
  the instruction), :func:`read_error`; :class:`DeviceTimeout`.
* **Counters**: :func:`read_counters` (the 64-bit counters through 32-bit reads).

Nothing here imports Amaranth beyond what :mod:`hw.isa` exports, nor numba, torch or the compiler: a board
with the runtime dependencies only runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from host.devices.base import DeviceError
from host.image import ImageError, ImageInfo, ParsedImage, channel_block_bytes, const_section_bytes, parse_image
from hw import isa
from hw import numerics as nx
from hw.isa import Counter, Ctrl, ErrorCause, Opcode, OutputTrailer, Status, TokenHeader, TritPacking

__all__ = [
    "TOKEN_HEADER_BYTES", "OUTPUT_TRAILER_BYTES", "token_packet_bytes", "output_packet_bytes",
    "make_token_packet", "check_token_packet", "embedding_packet",
    "OutputPacket", "make_output_packet", "parse_output_packet",
    "channel_streams", "merge_streams",
    "IdBlock", "read_id_block", "check_id_block", "check_isa_version",
    "CoreError", "DeviceTimeout", "core_error", "read_error", "read_counters",
    "Ctrl", "Status", "ErrorCause", "Counter",
]

R = isa.REGISTER_MAP
TOKEN_HEADER_BYTES = isa.layout_bytes(TokenHeader)
OUTPUT_TRAILER_BYTES = isa.layout_bytes(OutputTrailer)


# ------------------------------------------------------------------------------------------ sizes
def _sealed_bytes(payload_words: int, header_bytes: int) -> int:
    """A packet of ``header_bytes`` and ``payload_words`` words with its CRC word, padded to whole sections."""
    n = header_bytes + 4 * payload_words + 4
    return n + isa.section_pad(n)


def token_packet_bytes(hidden: int) -> int:
    """Bytes of a token packet: 16-byte header, ``hidden`` words, CRC word, padded to 64-byte sections."""
    return _sealed_bytes(hidden, TOKEN_HEADER_BYTES)


def output_packet_bytes(n_logits: int) -> int:
    """Bytes of an output packet with ``n_logits`` logits: the logits, padding, the 32-byte trailer (CRC last)."""
    return _sealed_bytes(n_logits, OUTPUT_TRAILER_BYTES - 4)


# ------------------------------------------------------------------------------------------ token packet
def _seal(raw: bytes) -> bytes:
    """Zero-pad to whole sections with room for the CRC word, which goes last."""
    raw = raw + bytes(isa.section_pad(len(raw) + 4))
    return raw + isa.crc32_words(raw).to_bytes(4, "little")


def make_token_packet(x: np.ndarray, *, position: int = 0, logits: bool = True) -> bytes:
    """Token packet: header, the embedding in the residual format (int32 words), CRC.

    Parameters
    ----------
    x : ndarray, shape [H], integer
        Already in the residual format (:func:`hw.numerics.to_fixed`).
    position : int
        Sequence position (taken modulo 2**32).
    logits : bool
        Ask for the logits in the output packet (the ``flags`` bit 0).

    Raises
    ------
    ValueError
        A value outside int32.
    """
    words = np.asarray(x, dtype=np.int64)
    if words.size and (words.min() < nx.INT32_MIN or words.max() > nx.INT32_MAX):
        raise ValueError("token packet values must fit int32")
    head = isa.pack(TokenHeader, {"magic": isa.TOKEN_MAGIC, "position": position & 0xFFFFFFFF,
                                  "flags": int(bool(logits)), "length": words.size})
    return _seal(head + words.astype("<i4").tobytes())


def embedding_packet(embeddings: np.ndarray, token_id: int, *, frac: int | None, position: int = 0,
                     logits: bool = True) -> bytes:
    """The host's embedding lookup for one token: row ``token_id`` as a token packet.

    Parameters
    ----------
    embeddings : ndarray, shape [V, H]
        Float rows (converted with ``frac`` fraction bits, :func:`hw.numerics.to_fixed`), or, with ``frac``
        None, rows already in the residual format (a bundle's int32 embeddings).
    """
    row = embeddings[token_id]
    if frac is not None:
        row = nx.to_fixed(row, frac)
    return make_token_packet(row, position=position, logits=logits)


def check_token_packet(packet: bytes, max_hidden: int = isa.MAX_HIDDEN) -> tuple[np.ndarray, int, int]:
    """A token packet's own checks, in the core's order (docs/ISA.md section 5): magic (word 0), ``length``
    (word 3: 1..``max_hidden``, the build's), the packet's size (``tlast`` on the last word of a packet of
    ``16 + 4 length + 4`` bytes padded to sections), CRC. Its length against the image's hidden size is
    checked after the image header.

    Returns
    -------
    (x, flags, position): int64 [length], int, int

    Raises
    ------
    host.image.ImageError
        TOKEN_MAGIC, TOKEN_LENGTH, TOKEN_CRC (no instruction).
    """
    hb = TOKEN_HEADER_BYTES
    if len(packet) >= 4 and int.from_bytes(packet[:4], "little") != isa.TOKEN_MAGIC:
        raise ImageError(ErrorCause.TOKEN_MAGIC, f"token packet magic 0x{int.from_bytes(packet[:4], 'little'):08x}")
    if len(packet) < hb:
        raise ImageError(ErrorCause.TOKEN_LENGTH, f"token packet of {len(packet)} bytes")
    h = isa.unpack(TokenHeader, packet[:hb])
    if not 1 <= h.length <= max_hidden:
        raise ImageError(ErrorCause.TOKEN_LENGTH, f"token packet of {h.length} words (1..{max_hidden})")
    if len(packet) != token_packet_bytes(h.length):
        raise ImageError(ErrorCause.TOKEN_LENGTH, f"token packet of {len(packet)} bytes, its {h.length} words "
                         f"need {token_packet_bytes(h.length)}")
    if isa.crc32_words(packet[:-4]) != int.from_bytes(packet[-4:], "little"):
        raise ImageError(ErrorCause.TOKEN_CRC, "token packet CRC mismatch")
    x = np.frombuffer(packet[hb:hb + 4 * h.length], dtype="<i4").astype(np.int64)
    return x, h.flags, h.position


# ------------------------------------------------------------------------------------------ output packet
@dataclass(frozen=True)
class OutputPacket:
    """A decoded output packet (:class:`hw.isa.OutputTrailer` and the logits before it)."""

    position: int
    argmax: int
    max_acc: int
    scale_mant: int
    scale_shift: int
    logits_acc: np.ndarray   #: int64 [V] raw accumulators (empty when not requested)

    def logits(self) -> np.ndarray:
        """Dequantized logits, float32 [V]: ``acc * scale_mant * 2**-scale_shift``."""
        return (self.logits_acc.astype(np.float64) * self.scale_mant * 2.0 ** -self.scale_shift).astype(np.float32)


def parse_output_packet(raw: bytes) -> OutputPacket:
    """Decode and check an output packet (logits, padding, :class:`hw.isa.OutputTrailer`).

    Raises
    ------
    ValueError
        Bad length, magic or CRC.
    """
    tb = OUTPUT_TRAILER_BYTES
    if len(raw) < tb or len(raw) % isa.SECTION_BYTES:
        raise ValueError(f"output packet of {len(raw)} bytes (a multiple of {isa.SECTION_BYTES} expected)")
    t = isa.unpack(OutputTrailer, raw[-tb:])
    if t.magic != isa.OUTPUT_MAGIC:
        raise ValueError(f"output packet magic 0x{t.magic:08x}")
    n = t.n_logits
    if len(raw) != output_packet_bytes(n):
        raise ValueError(f"output packet of {len(raw)} bytes, its trailer announces {n} logits")
    if isa.crc32_words(raw[:-4]) != t.crc:
        raise ValueError("output packet CRC mismatch")
    acc = np.frombuffer(raw[:4 * n], dtype="<i4").astype(np.int64)
    return OutputPacket(t.position, t.argmax, t.max_acc, t.scale_mant, t.scale_shift, acc)


def make_output_packet(logits_acc: np.ndarray, *, position: int, argmax: int, max_acc: int, scale_mant: int,
                       scale_shift: int) -> bytes:
    """An output packet as the accelerator sends it (the golden device's, and the RTL's expected bytes)."""
    body = nx.sat32(np.asarray(logits_acc, dtype=np.int64)).astype("<i4").tobytes()
    tb = OUTPUT_TRAILER_BYTES
    body += bytes(isa.section_pad(len(body) + tb))
    trailer = isa.pack(OutputTrailer, {"magic": isa.OUTPUT_MAGIC, "position": position & 0xFFFFFFFF,
                                       "argmax": argmax, "max_acc": int(np.clip(max_acc, nx.INT32_MIN, nx.INT32_MAX)),
                                       "scale_mant": scale_mant, "scale_shift": scale_shift,
                                       "n_logits": int(np.size(logits_acc))})
    raw = body + trailer[:-4]
    return raw + isa.crc32_words(raw).to_bytes(4, "little")


# ------------------------------------------------------------------------------------------ channel streams
def channel_streams(image: ParsedImage | bytes, channels: int | None = None) -> list[bytes]:
    """The byte stream each weight channel carries for one pass over an image (``hw/top.py``'s stream
    protocol; :func:`host.image.channel_block_bytes` sizes the blocks).

    Channel 0: the image header, then per instruction its header, its constants and its weight block 0
    (image order); channel ``c > 0``: weight block ``c`` of every GEMV, in program order. One channel carries
    the image as it is, so raw bytes for one channel are returned unparsed (malformed images included: the
    testbenches stream those on purpose).

    Parameters
    ----------
    image : ParsedImage or bytes
    channels : int, optional
        Must equal the image's channel count when given (not checked for unparsed one-channel bytes).

    Returns
    -------
    list of bytes, one per channel; their lengths sum to the image's.

    Raises
    ------
    ValueError
        On a channel-count mismatch.
    host.image.ImageError
        On an image that does not parse (several channels).
    """
    if channels == 1 and not isinstance(image, ParsedImage):
        return [bytes(image)]
    img = image if isinstance(image, ParsedImage) else parse_image(image)
    c_img = img.info.channels
    if channels is not None and channels != c_img:
        raise ValueError(f"image compiled for {c_img} channel(s), {channels} requested")
    raw = img.raw
    out = [bytearray() for _ in range(c_img)]
    out[0] += raw[:isa.layout_bytes(isa.ImageHeader)]
    for ins in img.instructions:
        head = isa.layout_bytes(isa.InstrHeader) + const_section_bytes(ins)
        out[0] += raw[ins.offset:ins.offset + head]
        if ins.opcode is Opcode.GEMV:
            for c, blk in enumerate(ins.blocks):
                out[c] += blk.tobytes()
    total = sum(len(b) for b in out)
    if total != len(raw):
        raise ValueError(f"channel streams hold {total} bytes, the image {len(raw)}")
    return [bytes(b) for b in out]


def merge_streams(streams: Sequence[bytes]) -> bytes | None:
    """The model image from its channel streams (the inverse of :func:`channel_streams`), read as the core
    reads them: the image header and each instruction header say how many bytes follow on every channel.

    Returns
    -------
    bytes or None
        The image, or None while a channel still lacks bytes the headers announce. Bytes past the image's
        END_TOKEN are left out.
    """
    from host.image import vector_words
    from hw.isa import InstrFlags

    ch0 = bytes(streams[0])
    hb = isa.layout_bytes(isa.ImageHeader)
    ib = isa.layout_bytes(isa.InstrHeader)
    if len(ch0) < hb:
        return None
    h = isa.unpack(isa.ImageHeader, ch0[:hb])
    n_ch = int(h.channels)
    packing = TritPacking(_value(h.packing))
    pos = [hb] + [0] * (n_ch - 1)
    image = bytearray(ch0[:hb])
    for _ in range(h.n_instructions):
        if len(ch0) < pos[0] + ib:
            return None
        ins = isa.unpack(isa.InstrHeader, ch0[pos[0]:pos[0] + ib])
        flags = InstrFlags(_value(ins.flags))
        words = (vector_words(ins.k) if InstrFlags.QCONST in flags else 0) + ins.n_consts * vector_words(ins.n)
        opcode = Opcode(_value(ins.opcode))
        blocks = channel_block_bytes(ins.n, ins.k, n_ch, packing) if opcode is Opcode.GEMV else [0] * n_ch
        size0 = ib + 4 * words + blocks[0]
        if len(ch0) < pos[0] + size0:
            return None
        image += ch0[pos[0]:pos[0] + size0]
        pos[0] += size0
        for c in range(1, n_ch):
            if len(streams[c]) < pos[c] + blocks[c]:
                return None
            image += streams[c][pos[c]:pos[c] + blocks[c]]
            pos[c] += blocks[c]
        if opcode is Opcode.END_TOKEN:
            break
    return bytes(image)


def _value(v) -> int:
    return int(v.value) if hasattr(v, "value") else int(v)


# ------------------------------------------------------------------------------------------ errors
class CoreError(DeviceError):
    """The core stopped a token (``STATUS.error``): its :class:`~hw.isa.ErrorCause` and instruction.

    The core commits the recurrent state at END_TOKEN only, so the committed state is unchanged.

    Attributes
    ----------
    cause : ErrorCause or int
        ``ERROR_CAUSE`` (an int when the value is not a known cause).
    where : int
        ``ERROR_WHERE``: the instruction, :data:`hw.isa.NO_INSTRUCTION` for the token packet and the header.
    output : bytes
        The words the core sent before it stopped, when the transport collects them (a cut packet ends with
        :data:`hw.isa.OUTPUT_ABORT_WORD`).
    end_cycle : int
        Cycles from the token's first cycle to the word with ``tlast`` (simulations that report it; else 0).
    """

    def __init__(self, device: str, cause: ErrorCause | int, where: int, *, detail: str = "", output: bytes = b"",
                 end_cycle: int = 0):
        try:
            self.cause: ErrorCause | int = ErrorCause(cause)
            name = self.cause.name
        except ValueError:
            self.cause, name = int(cause), f"cause {cause}"
        self.where, self.output, self.end_cycle = int(where), output, end_cycle
        extra = f" ({detail})" if detail else ""
        super().__init__(f"device {device!r}: the core stopped the token with {name} at instruction {where}{extra}; "
                         f"its committed state is unchanged")


class DeviceTimeout(DeviceError):
    """A token that did not finish in time (no hang): the transport aborted and reset the core, so the state
    run so far is lost (a replaying device replays it before the next token)."""


def core_error(device: str, status: int, cause: int, where: int, **kw) -> CoreError | None:
    """The :class:`CoreError` that ``STATUS``/``ERROR_CAUSE``/``ERROR_WHERE`` describe, or None when
    ``STATUS.error`` is clear."""
    if not int(status) & Status.ERROR.value:
        return None
    return CoreError(device, cause, where, **kw)


def read_error(read: Callable[[int], int], device: str) -> CoreError | None:
    """Read STATUS (and, on an error, ERROR_CAUSE and ERROR_WHERE) through ``read(offset)``."""
    status = read(R.STATUS)
    if not status & Status.ERROR.value:
        return None
    return CoreError(device, read(R.ERROR_CAUSE), read(R.ERROR_WHERE))


# ------------------------------------------------------------------------------------------ counters
def read_counters(read: Callable[[int], int]) -> dict[Counter, int]:
    """Every :class:`~hw.isa.Counter` (64 bits: low word, then high word) through ``read(offset)``."""
    return {c: (read(R.counter(c)) & 0xFFFFFFFF) | (read(R.counter(c) + 4) & 0xFFFFFFFF) << 32 for c in Counter}


# ------------------------------------------------------------------------------------------ ID block
#: What each ISA version changed, for the message that refuses a bitstream of another version.
_ISA_HISTORY = {
    1: "the arithmetic before the released checkpoints' numerics (no BitLinear eps, codes rounded half up); "
       "bitstreams/ecpix5-85f (and the ULX3S stream bitstream it replaced, in git history) is such a build",
}


def check_isa_version(device: str, found: int, board: str | None = None) -> None:
    """Refuse a core whose ID block reports another ISA version than :data:`hw.isa.ISA_VERSION`.

    Raises
    ------
    DeviceError
        Saying which side is older and what to rebuild (``make bitstream BOARD=<board>`` when the board
        is known).
    """
    if found == isa.ISA_VERSION:
        return
    if found < isa.ISA_VERSION:
        what = _ISA_HISTORY.get(found, "an older instruction set")
        how = f"`make bitstream BOARD={board}`" if board else "`make bitstream BOARD=<board>`"
        raise DeviceError(f"device {device!r}: the bitstream's core implements ISA version {found} ({what}); "
                          f"this host speaks ISA {isa.ISA_VERSION} and its images would compute differently: "
                          f"rebuild the bitstream with {how} and load it")
    raise DeviceError(f"device {device!r}: the bitstream's core implements ISA version {found}, newer than this "
                      f"host's ISA {isa.ISA_VERSION}: update the host (git pull) to the bitstream's revision")


@dataclass(frozen=True)
class IdBlock:
    """The core's ID block (:data:`hw.isa.REGISTER_MAP` ``ID_*``), by field name.

    ``packings`` is the mask of supported :class:`~hw.isa.TritPacking` values (bit ``p.value``).
    """

    magic: int
    version: int
    lanes: int
    channels: int
    bus_bits: int
    packings: int
    max_hidden: int
    max_intermediate: int
    max_layers: int
    max_vocab: int
    quant_lanes: int
    acc_bits: int
    epilogue_folded: int

    #: register offset of each field
    OFFSETS = {"magic": R.ID_MAGIC, "version": R.ID_VERSION, "lanes": R.ID_LANES, "channels": R.ID_CHANNELS,
               "bus_bits": R.ID_BUS_BITS, "packings": R.ID_PACKINGS, "max_hidden": R.ID_MAX_HIDDEN,
               "max_intermediate": R.ID_MAX_INTERMEDIATE, "max_layers": R.ID_MAX_LAYERS,
               "max_vocab": R.ID_MAX_VOCAB, "quant_lanes": R.ID_QUANT_LANES, "acc_bits": R.ID_ACC_BITS,
               "epilogue_folded": R.ID_EPILOGUE}

    @classmethod
    def from_registers(cls, values: dict[int, int]) -> IdBlock:
        """From ``{offset: value}`` (:func:`hw.isa.id_block_values`'s form)."""
        return cls(**{f.name: int(values[cls.OFFSETS[f.name]]) & 0xFFFFFFFF for f in fields(cls)})

    def registers(self) -> dict[int, int]:
        """``{offset: value}``, the inverse of :meth:`from_registers`."""
        return {self.OFFSETS[f.name]: getattr(self, f.name) for f in fields(self)}

    def as_dict(self) -> dict[str, int]:
        """By field name (what :meth:`host.perf.BuildParams.from_id_block` reads)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def packing(self) -> TritPacking | None:
        """The packing an image for this core is compiled with: base-3 where supported, else 2-bit, else None."""
        for p in (TritPacking.BASE3, TritPacking.BITS2):
            if self.packings >> p.value & 1:
                return p
        return None

    def check_image(self, info: ImageInfo, device: str) -> None:
        """Refuse an image this build cannot run: another channel count, a packing it lacks, or a model larger
        than its buffers.

        Raises
        ------
        DeviceError
            Naming what differs (and, for capacities, ``(needed, built)``).
        """
        if info.channels != self.channels:
            raise DeviceError(f"device {device!r}: the image is compiled for {info.channels} channel(s), the core "
                              f"has {self.channels}: recompile it for this build")
        if not self.packings >> info.packing.value & 1:
            raise DeviceError(f"device {device!r}: the image's trits are packed {info.packing.name}, which the core "
                              f"does not read (ID_PACKINGS 0x{self.packings:x}): recompile it for this build")
        need = {"max_hidden": info.hidden, "max_intermediate": info.intermediate, "max_layers": info.n_layers,
                "max_vocab": info.vocab}
        short = {k: (v, getattr(self, k)) for k, v in need.items() if v > getattr(self, k)}
        if short:
            raise DeviceError(f"device {device!r}: the model does not fit this bitstream's buffers "
                              f"(needed, built): {short}; build a bitstream with larger capacities")


def read_id_block(read: Callable[[int], int]) -> IdBlock:
    """The ID block through ``read(offset) -> int`` (core-relative offsets)."""
    return IdBlock.from_registers({off: read(off) for off in IdBlock.OFFSETS.values()})


def check_id_block(ident: IdBlock, device: str, *, board: str | None = None,
                   expect: dict[int, int] | None = None) -> None:
    """Check that an ID block is an mmfree core of this host's ISA (and, with ``expect``, exactly that build).

    Parameters
    ----------
    expect : dict, optional
        ``{offset: value}`` of the build (:func:`hw.isa.id_block_values`): every register must match.

    Raises
    ------
    DeviceError
        No mmfree core (magic), another ISA version (:func:`check_isa_version`), an implausible block, or a
        block other than ``expect``.
    """
    if ident.magic != isa.ID_MAGIC:
        raise DeviceError(f"device {device!r}: no mmfree core at the register block (ID magic 0x{ident.magic:08x}, "
                          f"expected 0x{isa.ID_MAGIC:08x}): wrong bitstream or wrong base address")
    check_isa_version(device, ident.version, board)
    if expect is not None:
        got = ident.registers()
        bad = {f"0x{o:02x}": (got[o], v) for o, v in expect.items() if got.get(o) != v}
        if bad:
            raise DeviceError(f"device {device!r}: the core's ID block differs from its build parameters "
                              f"(offset: (read, expected)): {bad}")
    if not 1 <= ident.channels <= 4 or not ident.packings:
        raise DeviceError(f"device {device!r}: implausible ID block {ident.as_dict()}")
