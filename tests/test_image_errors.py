"""Bad images and bad token packets: each raises :class:`host.image.ImageError` saying what
(:class:`hw.isa.ErrorCause`) and where (instruction, byte offset), and a failed token leaves the recurrent
state as it was (DESIGN.md section 3)."""

from __future__ import annotations

import numpy as np
import pytest

from host.compiler import CompileOptions, calibrate, compile_model
from host.devices.golden import GoldenMachine, run_stream
from host.image import BuildLimits, ImageError, channel_block_bytes, parse_image
from host.model import HGRNBitConfig, random_weights
from host.protocol import make_token_packet
from hw import isa
from hw import numerics as nx
from hw.isa import Buffer, ErrorCause, ImageHeader, InstrHeader, MicroOp, MicroOpcode, Opcode, TritPacking

HDR = isa.layout_bytes(ImageHeader)
INS = isa.layout_bytes(InstrHeader)

#: hidden 38 < intermediate 54, neither a multiple of 4 or 5
TINY = HGRNBitConfig(vocab_size=53, hidden_size=38, num_hidden_layers=2, intermediate_size=54)
# program: 0 LOAD_TOKEN, per layer i_proj f_proj g_proj o_proj gate[:I] gate[I:] down_proj, lm_head, END_TOKEN
I_PROJ, F_PROJ, G_PROJ, O_PROJ = 1, 2, 3, 4
GATE_B_LAST = 1 + 7 * (TINY.num_hidden_layers - 1) + 5


@pytest.fixture(scope="module")
def model():
    w = random_weights(TINY, seed=11, gamma_spread=1.0)
    return w, calibrate(w)


def _image(model, **options) -> bytes:
    w, fm = model
    return compile_model(w, CompileOptions(formats=fm, **options))


@pytest.fixture(scope="module")
def image(model) -> bytes:
    return _image(model)


@pytest.fixture(scope="module")
def parsed(image):
    return parse_image(image)


# ----------------------------------------------------------------------------------- byte surgery
def _field(layout, path: tuple) -> tuple[int, int]:
    return isa.field_span(layout, path)


def _set(raw: bytearray, base: int, layout, path: tuple, value: int, *, recrc: bool = True) -> bytearray:
    """Write ``value`` (any bits, valid or not) into a header field at byte ``base``; optionally re-CRC the
    header so that the field is the only thing wrong."""
    bit, width = _field(layout, path)
    n = isa.layout_bytes(layout)
    word = int.from_bytes(raw[base:base + n], "little")
    word = (word & ~(((1 << width) - 1) << bit)) | ((value & ((1 << width) - 1)) << bit)
    raw[base:base + n] = word.to_bytes(n, "little")
    if recrc:
        crc_bit, _ = _field(layout, ("crc",))
        raw[base + crc_bit // 8:base + crc_bit // 8 + 4] = isa.crc32_words(raw[base:base + crc_bit // 8]) \
            .to_bytes(4, "little")
    return raw


def _get(raw, base: int, layout, path: tuple) -> int:
    bit, width = _field(layout, path)
    return (int.from_bytes(raw[base:base + isa.layout_bytes(layout)], "little") >> bit) & ((1 << width) - 1)


def _resize(raw: bytearray, size: int, n_instructions: int | None = None) -> bytearray:
    """Make the header agree with a new image size (and instruction count), so the header is consistent."""
    _set(raw, 0, ImageHeader, ("image_words",), size // 4)
    if n_instructions is not None:
        _set(raw, 0, ImageHeader, ("n_instructions",), n_instructions)
    return raw


def _op(j: int, name: str) -> tuple:
    return ("ops", j, name)


def _fails(raw, cause: ErrorCause, *, instruction: int | None = None, offset: int | None = None,
           match: str | None = None) -> ImageError:
    with pytest.raises(ImageError) as info:
        parse_image(bytes(raw))
    e = info.value
    msg = str(e)
    assert e.cause is cause, msg
    assert msg.startswith(cause.name), msg
    if instruction is not None:
        assert e.instruction == instruction and f"instruction {instruction}" in msg, msg
    if offset is not None:
        assert e.offset == offset and f"byte {offset}" in msg, msg
    if match is not None:
        assert match in msg, msg
    return e


def test_the_good_image_parses_and_surgery_alone_changes_nothing(image, parsed):
    assert bytes(_set(bytearray(image), 0, ImageHeader, ("hidden",), TINY.hidden_size)) == image
    ins = parsed.instructions
    assert ins[-1].opcode is Opcode.END_TOKEN and ins[F_PROJ].qconst is not None and len(ins[O_PROJ].consts) == 2
    assert ins[GATE_B_LAST].opcode is Opcode.GEMV and ins[GATE_B_LAST].n == TINY.intermediate_size > TINY.hidden_size


# ------------------------------------------------------------------------------------- the header
def test_wrong_magic(image):
    raw = bytearray(image)
    raw[0:4] = b"ELF\x7f"
    _fails(raw, ErrorCause.BAD_MAGIC, offset=0, match="magic")


def test_wrong_version(image):
    raw = _set(bytearray(image), 0, ImageHeader, ("version",), isa.ISA_VERSION + 1)
    _fails(raw, ErrorCause.BAD_VERSION, offset=4, match=f"version {isa.ISA_VERSION + 1}")


def test_header_crc(image):
    raw = bytearray(image)
    bit, _ = _field(ImageHeader, ("hidden",))
    raw[bit // 8] ^= 0x01
    _fails(raw, ErrorCause.HEADER_CRC, offset=HDR - 4, match="CRC")


@pytest.mark.parametrize("path, value, match", [
    (("packing",), 7, "packing 7"),
    (("channels",), 0, "0 weight channels"),
    (("hidden",), isa.MAX_HIDDEN + 1, "hidden"),
    (("n_layers",), 0, "n_layers"),
    (("gate_frac",), nx.GATE_FRAC - 1, f"gate_frac {nx.GATE_FRAC - 1}"),     # fixed by the ISA
])
def test_bad_header_fields(image, path, value, match):
    e = _fails(_set(bytearray(image), 0, ImageHeader, path, value), ErrorCause.BAD_SHAPE, match=match)
    assert e.instruction is None        # ERROR_WHERE: outside any instruction


@pytest.mark.parametrize("limits, match", [
    ({"packing": TritPacking.BITS2}, "the build decodes BITS2"),
    ({"channels": 2}, "the build has 2"),
    ({"max_hidden": TINY.hidden_size - 1}, "hidden 38 outside 1..37"),
    ({"max_intermediate": 32}, "intermediate 54 outside 1..32"),
    ({"max_layers": 1}, "n_layers 2 outside 1..1"),
    ({"lut_segments_log2": nx.LUT_SEGMENTS_LOG2 + 1}, "sigmoid LUT"),
])
def test_header_against_the_build(image, limits, match):
    """The ID block's limits (host.image.BuildLimits): what the core's image-header check refuses."""
    with pytest.raises(ImageError, match=match) as info:
        parse_image(image, limits=BuildLimits(**limits))
    assert info.value.cause is ErrorCause.BAD_SHAPE and info.value.instruction is None
    parse_image(image, limits=BuildLimits(packing=TritPacking.BASE3, channels=1, max_hidden=TINY.hidden_size,
                                          max_intermediate=TINY.intermediate_size, max_layers=2,
                                          lut_segments_log2=nx.LUT_SEGMENTS_LOG2))


def test_image_of_a_header_only(image):
    raw = _resize(bytearray(image[:HDR]), HDR)
    _fails(raw, ErrorCause.TRUNCATED, offset=HDR, match="ends with its header")


# --------------------------------------------------------------------------------- instructions
def test_instruction_header_crc(image, parsed):
    ins = parsed.instructions[3]
    raw = bytearray(image)
    bit, _ = _field(InstrHeader, ("cb_mant",))
    raw[ins.offset + bit // 8] ^= 0x10
    _fails(raw, ErrorCause.INSTR_CRC, instruction=3, offset=ins.offset + INS - 4, match="CRC")


def test_constants_crc(image, parsed):
    ins = parsed.instructions[F_PROJ]
    assert ins.qconst is not None and ins.consts
    raw = bytearray(image)
    raw[ins.offset + INS + 1] ^= 0x80        # the first QC word
    _fails(raw, ErrorCause.CONST_CRC, instruction=F_PROJ, offset=ins.offset + INS, match="constants CRC")


def test_unknown_opcode(image, parsed):
    raw = _set(bytearray(image), parsed.instructions[2].offset, InstrHeader, ("opcode",), 0x7F)
    _fails(raw, ErrorCause.UNKNOWN_OPCODE, instruction=2, offset=parsed.instructions[2].offset, match="opcode 127")


def test_unknown_instruction_flags(image, parsed):
    ins = parsed.instructions[I_PROJ]
    raw = _set(bytearray(image), ins.offset, InstrHeader, ("flags",), 0x80 | _get(image, ins.offset, InstrHeader,
                                                                                   ("flags",)))
    _fails(raw, ErrorCause.UNKNOWN_OPCODE, instruction=I_PROJ, offset=ins.offset, match="flags")


@pytest.mark.parametrize("path, value, match", [
    (_op(0, "op"), 31, "micro-op 0 opcode 31"),
    (_op(1, "buf"), 7, "micro-op 1 buffer 7"),
    (_op(1, "shift"), 63, "micro-op 1: shift 63"),
    (_op(0, "shift"), 2, "sigmoid input Q.2"),               # f_proj's first micro-op is SIGNEG
    (("n_ops",), isa.MAX_OPS + 1, f"{isa.MAX_OPS + 1} micro-ops"),
    (("n_consts",), isa.MAX_CONSTS + 1, "constant vectors"),
    (("src",), 13, "source buffer 13"),
    (("src",), Buffer.TOKEN.value, "GEMV source TOKEN"),
])
def test_bad_micro_ops(image, parsed, path, value, match):
    ins = parsed.instructions[F_PROJ]
    _fails(_set(bytearray(image), ins.offset, InstrHeader, path, value), ErrorCause.BAD_MICROOP,
           instruction=F_PROJ, offset=ins.offset, match=match)


@pytest.mark.parametrize("op, buf, match", [
    (MicroOpcode.ST, Buffer.TOKEN, "writes read-only TOKEN"),
    (MicroOpcode.ST, Buffer.C0, "writes read-only C0"),
    (MicroOpcode.LD, Buffer.NONE, "reads buffer NONE"),
    (MicroOpcode.ADDV, Buffer.NONE, "reads buffer NONE"),
])
def test_micro_op_buffer_use(image, parsed, op, buf, match):
    """Static: a store to a read-only buffer, a read of NONE (the core checks the header, not the run)."""
    ins = parsed.instructions[O_PROJ]
    raw = _set(bytearray(image), ins.offset, InstrHeader, _op(len(ins.ops) - 1, "op"), op.value)
    raw = _set(raw, ins.offset, InstrHeader, _op(len(ins.ops) - 1, "buf"), buf.value)
    _fails(raw, ErrorCause.BAD_MICROOP, instruction=O_PROJ, offset=ins.offset, match=match)


def test_micro_op_reads_a_missing_constant_vector(image, parsed):
    ins = parsed.instructions[O_PROJ]
    j = next(j for j, op in enumerate(ins.ops) if op.buf in (Buffer.C0, Buffer.C1, Buffer.C2, Buffer.C3))
    missing = Buffer(Buffer.C0.value + len(ins.consts))
    raw = _set(bytearray(image), ins.offset, InstrHeader, _op(j, "buf"), missing.value)
    _fails(raw, ErrorCause.BAD_MICROOP, instruction=O_PROJ, offset=ins.offset,
           match=f"micro-op {j} reads {missing.name}, the instruction has {len(ins.consts)} constant vector")


@pytest.mark.parametrize("index, path, value, match", [
    (I_PROJ, ("n",), TINY.hidden_size + 1, "GEMV output of 39"),
    (I_PROJ, ("k",), TINY.vocab_size, "GEMV input of 53"),
    (I_PROJ, ("k",), 0, "beyond the limits"),
    (I_PROJ, ("n",), TINY.intermediate_size, "weight section"),      # a valid size, but not this section's
    (I_PROJ, ("weight_bytes",), 64, "weight section of 64 bytes"),
    (I_PROJ, ("layer",), TINY.num_hidden_layers, "layer 2 of a 2-layer model"),
    (0, ("n",), TINY.hidden_size - 1, "LOAD_TOKEN of 37 elements"),
    (0, ("layer",), TINY.num_hidden_layers, "layer 2 of a 2-layer model"),
    (0, ("weight_bytes",), 64, "LOAD_TOKEN with a weight section of 64 bytes"),
    (I_PROJ, ("flags",), 1, "REUSE_CODES of 38 codes, the previous GEMV formed 0"),   # the first GEMV
    (I_PROJ, ("k",), TINY.intermediate_size, "GEMV reads 54 elements of X"),
    (O_PROJ, ("n",), TINY.vocab_size, "53 elements of X"),
])
def test_inconsistent_shapes(image, parsed, index, path, value, match):
    ins = parsed.instructions[index]
    _fails(_set(bytearray(image), ins.offset, InstrHeader, path, value), ErrorCause.BAD_SHAPE, instruction=index,
           offset=ins.offset, match=match)


def test_end_token_before_the_end(image, parsed):
    ins = parsed.instructions[0]      # LOAD_TOKEN carries constants but no weights: it still parses as END
    raw = _set(bytearray(image), ins.offset, InstrHeader, ("opcode",), Opcode.END_TOKEN.value)
    _fails(raw, ErrorCause.BAD_SHAPE, instruction=0, offset=ins.offset, match="END_TOKEN at instruction 0 of")


# ------------------------------------------------------------------------------------- truncation
@pytest.mark.parametrize("cut", [0, 10, HDR - 4])
def test_truncated_inside_the_header(image, cut):
    _fails(image[:cut], ErrorCause.TRUNCATED, offset=cut, match=f"image of {cut} bytes")


def _cuts(parsed) -> dict[str, tuple[int, int, int]]:
    """Where to cut: (cut offset, instruction, offset the error names)."""
    ins = parsed.instructions
    f = ins[F_PROJ]
    return {
        "an instruction header": (ins[3].offset + INS // 2, 3, ins[3].offset),
        "the constants": (f.offset + INS + 4, F_PROJ, f.offset + INS),
        "the weights": (f.weight_offset + 4, F_PROJ, f.weight_offset),
        "the last weights": (ins[-1].offset - 4, len(ins) - 2, ins[-2].weight_offset),
    }


@pytest.mark.parametrize("where", ["an instruction header", "the constants", "the weights", "the last weights"])
def test_truncated_stream(image, parsed, where):
    cut, idx, off = _cuts(parsed)[where]
    # the header still announces the whole image: the stream's end inside the instruction decides (the core
    # compares image_words only at END_TOKEN)
    _fails(image[:cut], ErrorCause.TRUNCATED, instruction=idx, offset=off,
           match=f"ends inside {where.replace('last ', '')}")
    # a header that agrees with the short image: the same
    raw = _resize(bytearray(image[:cut]), cut)
    _fails(raw, ErrorCause.TRUNCATED, instruction=idx, offset=off, match=f"ends inside {where.replace('last ', '')}")


# ---------------------------------------------------------------------------------------- trits
@pytest.mark.parametrize("packing, bad", [(TritPacking.BASE3, 0xFA), (TritPacking.BASE3, 0xF3),
                                          (TritPacking.BITS2, 0b10_01_00_01)])
def test_bad_trit_byte(model, packing, bad):
    """A bad byte in the second channel's block (channels = 2) is reported at its own byte offset."""
    image = _image(model, packing=packing, channels=2)
    ins = parse_image(image).instructions[G_PROJ]
    at = ins.weight_offset + channel_block_bytes(ins.n, ins.k, 2, packing)[0] + 5
    raw = bytearray(image)
    raw[at] = bad
    _fails(raw, ErrorCause.BAD_TRIT, instruction=G_PROJ, offset=at, match=f"0x{bad:02x}")
    parse_image(bytes(raw), check_trits=False)   # the weight checks can be skipped


def _valid_other_byte(packing: TritPacking, b: int) -> int:
    """Another byte that is still a valid trit code (a corruption that BAD_TRIT cannot see)."""
    if packing is TritPacking.BASE3:
        return (b + 1) % 243
    for s in (0, 2, 4, 6):   # +1 <-> -1 (0b01 <-> 0b11) in the first non-zero code
        if (b >> s) & 3:
            return b ^ (0b10 << s)
    return b | 0b01


@pytest.mark.parametrize("packing", [TritPacking.BASE3, TritPacking.BITS2])
@pytest.mark.parametrize("part", ["trits", "padding", "crc"])
@pytest.mark.parametrize("channel", [0, 1])
def test_weight_crc(model, packing, part, channel):
    """Each channel block ends with the CRC word of its bytes: a valid-looking trit byte, a padding byte or the
    CRC word itself changed is WEIGHT_CRC at that block's CRC word."""
    image = _image(model, packing=packing, channels=2)
    ins = parse_image(image).instructions[G_PROJ]
    sizes = channel_block_bytes(ins.n, ins.k, 2, packing)
    start = ins.weight_offset + sum(sizes[:channel])
    packed = isa.packed_trit_bytes(len(range(channel, ins.n, 2)) * ins.k, packing)
    assert sizes[channel] % isa.SECTION_BYTES == 0 and sizes[channel] >= packed + 4
    crc_at = start + sizes[channel] - 4
    body = bytes(image[start:crc_at])
    assert int.from_bytes(image[crc_at:crc_at + 4], "little") == isa.crc32_words(body)
    raw = bytearray(image)
    if part == "trits":
        raw[start + 7] = _valid_other_byte(packing, raw[start + 7])
    elif part == "padding":
        if packed == sizes[channel] - 4:
            pytest.skip("no padding in this block")
        raw[crc_at - 1] ^= 0x01
    else:
        raw[crc_at + 2] ^= 0x80
    _fails(raw, ErrorCause.WEIGHT_CRC, instruction=G_PROJ, offset=crc_at, match="weight block CRC")
    parse_image(bytes(raw), check_trits=False)


def test_bad_trit_before_weight_crc(model):
    """In one instruction, an invalid trit in channel 1 comes before a bad CRC in channel 0 (docs/ISA.md 5)."""
    image = _image(model, packing=TritPacking.BASE3, channels=2)
    ins = parse_image(image).instructions[G_PROJ]
    sizes = channel_block_bytes(ins.n, ins.k, 2, TritPacking.BASE3)
    raw = bytearray(image)
    raw[ins.weight_offset + 3] = _valid_other_byte(TritPacking.BASE3, raw[ins.weight_offset + 3])
    raw[ins.weight_offset + sizes[0] + 2] = 0xF5
    _fails(raw, ErrorCause.BAD_TRIT, instruction=G_PROJ, offset=ins.weight_offset + sizes[0] + 2)


def test_block_sizes_hold_the_crc_word():
    """round_up(packed + 4, 64): a block whose trits fill whole sections gets one more for its CRC word."""
    assert channel_block_bytes(1, 256, 1, TritPacking.BITS2) == [128]      # 64 packed bytes
    assert channel_block_bytes(1, 240, 1, TritPacking.BITS2) == [64]       # 60 packed bytes
    assert channel_block_bytes(1, 244, 1, TritPacking.BITS2) == [128]      # 61 packed bytes
    assert channel_block_bytes(1, 300, 1, TritPacking.BASE3) == [64]       # 60 packed bytes: 64 with its CRC
    assert channel_block_bytes(1, 305, 1, TritPacking.BASE3) == [128]      # 61 packed bytes
    assert channel_block_bytes(2, 5, 3, TritPacking.BASE3) == [64, 64, 0]  # a channel without rows: no block


# ------------------------------------------------------------------------------------- the end
def test_missing_end_token(image, parsed):
    """n_instructions one short of END_TOKEN: NO_END names the instruction that would follow the last (the
    core stops before reading END_TOKEN's header); an image cut before END_TOKEN ends inside the LM head."""
    end = parsed.instructions[-1]
    n = len(parsed.instructions)
    assert end.opcode is Opcode.END_TOKEN and end.offset + INS == len(image)
    raw = _resize(bytearray(image), len(image), n - 1)
    _fails(raw, ErrorCause.NO_END, instruction=n - 1, offset=end.offset, match="END_TOKEN")
    raw = _resize(bytearray(image[:end.offset]), end.offset, n - 1)
    _fails(raw, ErrorCause.TRUNCATED, instruction=n - 2, offset=parsed.instructions[-2].weight_offset,
           match="ends inside the weights")


def test_bytes_after_the_end(image):
    """Found at END_TOKEN (the core's fetcher sees no tlast on its header, or sums the program's bytes)."""
    extra = bytes(isa.SECTION_BYTES)
    end = len(image) - INS
    idx = len(parse_image(image).instructions) - 1
    _fails(image + extra, ErrorCause.BAD_SHAPE, instruction=idx, offset=len(image),
           match=f"{len(extra)} bytes after the last instruction")
    raw = _resize(bytearray(image + extra), len(image) + len(extra))
    _fails(raw, ErrorCause.BAD_SHAPE, instruction=idx, offset=end,
           match=f"the header says {len(image) + len(extra)} bytes, the program ends at {len(image)}")


def test_every_cause_of_a_bad_image_is_tested():
    tested = {ErrorCause.BAD_MAGIC, ErrorCause.BAD_VERSION, ErrorCause.HEADER_CRC, ErrorCause.INSTR_CRC,
              ErrorCause.CONST_CRC, ErrorCause.UNKNOWN_OPCODE, ErrorCause.BAD_MICROOP, ErrorCause.BAD_SHAPE,
              ErrorCause.TRUNCATED, ErrorCause.BAD_TRIT, ErrorCause.NO_END, ErrorCause.TOKEN_MAGIC,
              ErrorCause.TOKEN_LENGTH, ErrorCause.TOKEN_CRC, ErrorCause.WEIGHT_CRC}
    assert set(ErrorCause) - tested == {ErrorCause.NONE, ErrorCause.ABORTED}   # ABORTED is the host's reset


# ---------------------------------------------------------------------------- the golden device
@pytest.fixture(scope="module")
def machine(image):
    return GoldenMachine(image)


def _packet(model, token: int, position: int = 0) -> bytes:
    w, fm = model
    return make_token_packet(nx.to_fixed(w.embeddings[token], fm.residual), position=position)


def _crc_fix(pk: bytearray) -> bytearray:
    pk[-4:] = isa.crc32_words(pk[:-4]).to_bytes(4, "little")
    return pk


def _bad_packets(model) -> dict[str, tuple[bytes, ErrorCause]]:
    w, fm = model
    good = _packet(model, 5)
    x = nx.to_fixed(w.embeddings[5], fm.residual)
    magic = bytearray(good)
    magic[0:4] = b"MMFX"
    length = bytearray(good)
    _set(length, 0, isa.TokenHeader, ("length",), TINY.hidden_size + 1, recrc=False)
    payload = bytearray(good)
    payload[isa.layout_bytes(isa.TokenHeader) + 2] ^= 0x04
    crc = bytearray(good)
    crc[-1] ^= 0x01
    return {
        "magic": (bytes(magic), ErrorCause.TOKEN_MAGIC),
        "magic, CRC fixed": (bytes(_crc_fix(bytearray(magic))), ErrorCause.TOKEN_MAGIC),
        "short vector": (make_token_packet(x[:-1]), ErrorCause.TOKEN_LENGTH),
        "long vector": (make_token_packet(np.concatenate([x, x[:1]])), ErrorCause.TOKEN_LENGTH),
        "length field": (bytes(_crc_fix(length)), ErrorCause.TOKEN_LENGTH),
        "truncated": (good[:-isa.SECTION_BYTES], ErrorCause.TOKEN_LENGTH),
        "tiny": (good[:8], ErrorCause.TOKEN_LENGTH),
        "extra section": (good + bytes(isa.SECTION_BYTES), ErrorCause.TOKEN_LENGTH),
        "payload bit": (bytes(payload), ErrorCause.TOKEN_CRC),
        "CRC word": (bytes(crc), ErrorCause.TOKEN_CRC),
    }


BAD_PACKETS = ["magic", "magic, CRC fixed", "short vector", "long vector", "length field", "truncated", "tiny",
               "extra section", "payload bit", "CRC word"]


@pytest.fixture(scope="module")
def warm(model, machine):
    """A non-zero committed state, and what the next good token gives from it."""
    state = machine.run_token(_packet(model, 3), machine.init_state()).state
    assert state.any()
    return state, GoldenMachine(machine.image).run_token(_packet(model, 4), state).output


@pytest.mark.parametrize("kind", BAD_PACKETS)
def test_bad_token_packet_leaves_the_state(model, machine, warm, kind):
    state, expect = warm[0].copy(), warm[1]
    packet, cause = _bad_packets(model)[kind]
    with pytest.raises(ImageError) as info:
        machine.run_token(packet, state)
    assert info.value.cause is cause and str(info.value).startswith(cause.name)
    assert np.array_equal(state, warm[0])
    # and the machine is unharmed: the next good packet gives what it gives from that state
    assert machine.run_token(_packet(model, 4), state).output == expect


def _append_op(image: bytes, ins, op: MicroOpcode, buf: Buffer) -> bytes:
    """The instruction with one more micro-op (its CRC recomputed)."""
    j = len(ins.ops)
    raw = _set(bytearray(image), ins.offset, InstrHeader, ("n_ops",), j + 1)
    raw = _set(raw, ins.offset, InstrHeader, _op(j, "op"), op.value)
    return bytes(_set(raw, ins.offset, InstrHeader, _op(j, "buf"), buf.value))


@pytest.mark.parametrize("index, op, buf, cause", [
    (GATE_B_LAST, MicroOpcode.LD, Buffer.X, ErrorCause.BAD_SHAPE),      # n = I elements of an H-element buffer
    (-2, MicroOpcode.ST, Buffer.TOKEN, ErrorCause.BAD_MICROOP),          # the LM head stores to a read-only buffer
])
def test_former_run_time_faults_are_instruction_checks(model, image, parsed, index, op, buf, cause):
    """ISA 1's golden device found these while running, after the earlier instructions had run; they are checks
    of the instruction header now (the core makes them), so the image is refused, and a token streamed with
    it (host.devices.golden.run_stream) stops at that instruction with the committed state as it was."""
    ins = parsed.instructions[index]
    idx = index % len(parsed.instructions)
    raw = _append_op(image, ins, op, buf)
    _fails(raw, cause, instruction=idx, offset=ins.offset)
    m = GoldenMachine(image)
    state = m.run_token(_packet(model, 9), m.init_state()).state
    frozen = state.copy()
    out = run_stream(raw, _packet(model, 1), state, BuildLimits())
    assert (out.cause, out.where, out.output) == (cause, idx, b"")
    assert np.array_equal(out.state, frozen) and np.array_equal(state, frozen)
    good = run_stream(image, _packet(model, 1), state, BuildLimits())
    assert good.cause is ErrorCause.NONE and good.output == m.run_token(_packet(model, 1), frozen).output


def test_golden_machine_rejects_a_bad_image(image):
    raw = bytearray(image)
    raw[0] ^= 0xFF
    with pytest.raises(ImageError) as info:
        GoldenMachine(bytes(raw))
    assert info.value.cause is ErrorCause.BAD_MAGIC


def test_micro_op_layout_matches_the_raw_decoder():
    """host.image decodes opcode and buffer from raw bits (to report undefined values): same bits as the layout."""
    assert _field(MicroOp, ("op",)) == (0, 5)
    bit, width = _field(MicroOp, ("buf",))
    assert (bit, width) == (11, 4)
    assert _field(InstrHeader, ("ops",))[0] == 224 and _field(InstrHeader, _op(1, "op")) == (256, 5)
