"""hw.isa, the one definition of the bits: every pack has an unpack (hypothesis round trips), the trit
packings, the CRC, the accumulator width, the register map, and the images the compiler lays out with them
(DESIGN.md section 3; STYLE.md point 7)."""

from __future__ import annotations

import functools
import json
import math
import operator
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import runtime_only
from amaranth.hdl import Shape
from amaranth.lib import data
from amaranth.lib import enum as aenum
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from host.compiler import CompileOptions, Formats, calibrate, compile_model, compile_program
from host.devices import golden
from host.devices.golden import GoldenMachine, _kernels
from host.image import ImageError, Instruction, MicroOpSpec, assemble, channel_rows, parse_image
from host.model import HGRNBitConfig, random_weights
from host.protocol import make_token_packet, parse_output_packet
from hw import isa
from hw import numerics as nx
from hw.isa import (
    ACC_BITS,
    MAX_K,
    REGISTER_MAP,
    Buffer,
    Counter,
    ErrorCause,
    ImageHeader,
    InstrHeader,
    MicroOp,
    MicroOpcode,
    Opcode,
    OutputTrailer,
    TokenHeader,
    TritPacking,
)

FAST = settings(max_examples=60, deadline=None)


# ------------------------------------------------------------------------ strategies from the layouts
def _leaf(shape) -> st.SearchStrategy:
    """Any valid value of a field: enum members, flag combinations, the whole range of an int."""
    if isinstance(shape, type) and issubclass(shape, aenum.Flag):
        return st.sets(st.sampled_from(list(shape))).map(lambda s: functools.reduce(operator.or_, s, shape(0)))
    if isinstance(shape, type) and issubclass(shape, aenum.Enum):
        return st.sampled_from(list(shape))
    s = Shape.cast(shape)
    if s.signed:
        return st.integers(-(1 << (s.width - 1)), (1 << (s.width - 1)) - 1)
    return st.integers(0, (1 << s.width) - 1)


def fields_of(layout) -> st.SearchStrategy:
    """A strategy of complete field dictionaries (nested dicts and lists) for ``layout``."""
    lay = data.Layout.cast(layout)
    if isinstance(lay, data.ArrayLayout):
        return st.lists(fields_of(lay.elem_shape), min_size=lay.length, max_size=lay.length)
    parts = {}
    for name, f in lay:
        nested = isinstance(f.shape, data.Layout) or (isinstance(f.shape, type) and issubclass(f.shape, data.Struct))
        parts[name] = fields_of(f.shape) if nested else _leaf(f.shape)
    return st.fixed_dictionaries(parts)


def decode(layout, view) -> dict | list:
    """A :func:`hw.isa.unpack` result as plain dicts, lists, ints and enum members."""
    lay = data.Layout.cast(layout)
    if isinstance(lay, data.ArrayLayout):
        return [decode(lay.elem_shape, view[i]) for i in range(lay.length)]
    out = {}
    for name, f in lay:
        v = view[name]
        out[name] = decode(f.shape, v) if isinstance(v, isa.Unpacked) else v
    return out


def _round_trip(layout, fields) -> None:
    raw = isa.pack(layout, fields)
    assert len(raw) == isa.layout_bytes(layout)
    back = decode(layout, isa.unpack(layout, raw))
    assert back == fields
    assert isa.pack(layout, back) == raw
    # unpack reads only its own bytes
    assert decode(layout, isa.unpack(layout, raw + b"\xff" * 8)) == fields


@FAST
@given(fields_of(ImageHeader))
def test_image_header_round_trip(fields):
    _round_trip(ImageHeader, fields)


@FAST
@given(fields_of(TokenHeader))
def test_token_header_round_trip(fields):
    _round_trip(TokenHeader, fields)


@FAST
@given(fields_of(OutputTrailer))
def test_output_header_round_trip(fields):
    _round_trip(OutputTrailer, fields)


@FAST
@given(fields_of(MicroOp))
def test_micro_op_round_trip(fields):
    _round_trip(MicroOp, fields)
    word = int.from_bytes(isa.pack(MicroOp, fields), "little")
    assert word & 0x1F == fields["op"].value  # the opcode is the low 5 bits (host.image decodes it raw)


_ZERO_OP = decode(MicroOp, isa.unpack(MicroOp, bytes(4)))


@st.composite
def instr_headers(draw):
    """Instruction headers with 0..MAX_OPS valid micro-ops; unused slots are zero, as the assembler writes."""
    fields = draw(fields_of(InstrHeader))
    n_ops = draw(st.integers(0, isa.MAX_OPS))
    ops = draw(st.lists(fields_of(MicroOp), min_size=n_ops, max_size=n_ops))
    fields["n_ops"] = n_ops
    fields["ops"] = ops + [dict(_ZERO_OP) for _ in range(isa.MAX_OPS - n_ops)]
    return fields


@FAST
@given(instr_headers())
def test_instr_header_round_trip(fields):
    _round_trip(InstrHeader, fields)
    back = isa.unpack(InstrHeader, isa.pack(InstrHeader, fields))
    for j in range(back.n_ops):
        assert decode(MicroOp, back.ops[j]) == fields["ops"][j]


def test_layout_sizes_and_unnamed_fields_are_zero():
    assert [isa.layout_bytes(x) for x in (ImageHeader, InstrHeader, TokenHeader, OutputTrailer)] == [64, 64, 16, 32]
    assert data.Layout.cast(MicroOp).size == 32
    assert isa.pack(ImageHeader, {}) == bytes(64)
    # the CRC is the last word of both 64-byte headers
    for lay in (ImageHeader, InstrHeader):
        f = data.Layout.cast(lay)["crc"]
        assert (f.offset, f.width) == (480, 32)


@pytest.mark.parametrize("layout, fields", [
    (InstrHeader, {"n": 1 << 16}),
    (InstrHeader, {"cb_shift": 1 << 31}),
    (InstrHeader, {"cb_shift": -(1 << 31) - 1}),
    (MicroOp, {"shift": 64}),
    (MicroOp, {"dst": -1}),
    (InstrHeader, {"ops": [{"reg": 8}] + [{}] * (isa.MAX_OPS - 1)}),
    (ImageHeader, {"bogus": 1}),
    (InstrHeader, {"opcode": 99}),
])
def test_pack_rejects_values_out_of_range(layout, fields):
    with pytest.raises(ValueError):
        isa.pack(layout, fields)


def test_unpack_rejects_short_input():
    with pytest.raises(ValueError, match="need 64 bytes"):
        isa.unpack(InstrHeader, bytes(63))


# --------------------------------------------------------------------------------------- trit packings
PER_BYTE = {TritPacking.BITS2: 4, TritPacking.BASE3: 5}

trit_arrays = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 19, 21, 101]).flatmap(
        lambda n: st.lists(st.integers(-1, 1), min_size=n, max_size=n)),
    st.lists(st.integers(-1, 1), max_size=300),
).map(lambda v: np.array(v, dtype=np.int8))


@FAST
@given(trits=trit_arrays, packing=st.sampled_from(list(TritPacking)))
@example(trits=np.zeros(0, np.int8), packing=TritPacking.BASE3)
@example(trits=np.zeros(0, np.int8), packing=TritPacking.BITS2)
def test_trit_packing_round_trip(trits, packing):
    n = trits.size
    raw = isa.pack_trits(trits, packing)
    assert len(raw) == isa.packed_trit_bytes(n, packing) == math.ceil(n / PER_BYTE[packing])
    back = isa.unpack_trits(raw, n, packing)
    assert back.dtype == np.int8 and np.array_equal(back, trits)
    # padding trits are zero, and the ndarray input path agrees
    padded = isa.unpack_trits(np.frombuffer(raw, np.uint8), len(raw) * PER_BYTE[packing], packing)
    assert np.array_equal(padded[:n], trits) and not padded[n:].any()
    # longer input: only the first packed_trit_bytes bytes are read
    assert np.array_equal(isa.unpack_trits(raw + b"\x00\xff", n, packing), trits)


@pytest.mark.parametrize("packing", list(TritPacking))
def test_trit_packing_byte_example_and_shapes(packing):
    t = np.array([[1, -1, 0, 1, 1], [-1, -1, 0, 0, 1]], np.int8)   # rows packed back to back (C order)
    raw = isa.pack_trits(t, packing)
    if packing is TritPacking.BITS2:
        # 4 trits a byte, first trit in bits 1:0: (1, -1, 0, 1) -> codes 01 11 00 01 -> 0b01_00_11_01
        assert raw == bytes([0b01_00_11_01, 0b00_11_11_01, 0b00_00_01_00])
    else:
        # 5 trits a byte: sum (t_i + 1) 3**i; row 0 = 2 + 0*3 + 1*9 + 2*27 + 2*81 = 227
        assert raw == bytes([227, 0 + 0 + 9 + 27 + 2 * 81])
    assert np.array_equal(isa.unpack_trits(raw, 10, packing).reshape(2, 5), t)


@pytest.mark.parametrize("packing", list(TritPacking))
def test_pack_trits_rejects_non_trits(packing):
    with pytest.raises(ValueError, match="trits"):
        isa.pack_trits(np.array([0, 2, 1]), packing)
    with pytest.raises(ValueError, match="trits"):
        isa.pack_trits(np.array([-2]), packing)


@FAST
@given(st.integers(1, 200), st.data())
def test_invalid_2bit_code_is_rejected_with_its_position(n, data_):
    trits = np.array(data_.draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n)), np.int8)
    pos = data_.draw(st.integers(0, n - 1))
    raw = bytearray(isa.pack_trits(trits, TritPacking.BITS2))
    byte, slot = divmod(pos, 4)
    raw[byte] = (raw[byte] & ~(0b11 << 2 * slot)) | (0b10 << 2 * slot)
    with pytest.raises(ValueError, match=rf"0b10 at trit {pos}\b"):
        isa.unpack_trits(bytes(raw), n, TritPacking.BITS2)


@FAST
@given(st.integers(1, 200), st.integers(243, 255), st.data())
def test_invalid_base3_byte_is_rejected_with_its_position(n, bad, data_):
    trits = np.array(data_.draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n)), np.int8)
    raw = bytearray(isa.pack_trits(trits, TritPacking.BASE3))
    pos = data_.draw(st.integers(0, len(raw) - 1))
    raw[pos] = bad
    with pytest.raises(ValueError, match=rf"byte {bad} at byte {pos}\b"):
        isa.unpack_trits(bytes(raw), n, TritPacking.BASE3)


@pytest.mark.parametrize("packing", list(TritPacking))
def test_unpack_trits_rejects_short_input(packing):
    with pytest.raises(ValueError, match="bytes needed"):
        isa.unpack_trits(b"\x00", 11, packing)


# ------------------------------------------------------------------------------------------------- CRC
@FAST
@given(st.lists(st.binary(max_size=64).map(lambda b: b[: len(b) // 4 * 4]), max_size=5))
def test_crc32_words_is_amaranths_crc32_ethernet(chunks):
    from amaranth.lib.crc.catalog import CRC32_ETHERNET

    whole = b"".join(chunks)
    crc = isa.crc32_words(*chunks)
    assert crc == CRC32_ETHERNET(data_width=8).compute(whole) == zlib.crc32(whole)
    # the hardware's word-wide CRC over little-endian 32-bit words gives the same value
    words = [int.from_bytes(whole[i:i + 4], "little") for i in range(0, len(whole), 4)]
    assert crc == CRC32_ETHERNET(data_width=32).compute(words)


def test_crc32_check_value():
    assert isa.crc32_words(b"123456789") == 0xCBF43926   # CRC-32/ISO-HDLC check value


# --------------------------------------------------------------------------------- accumulator width
@given(st.integers(1, 1 << 20))
def test_acc_bits_for_is_the_smallest_width(k):
    bits = isa.acc_bits_for(k)
    assert -(1 << (bits - 1)) <= -128 * k and 128 * k <= (1 << (bits - 1)) - 1
    assert 128 * k > (1 << (bits - 2)) - 1   # one bit fewer cannot hold +128 K


def test_acc_bits_for_rejects_empty():
    with pytest.raises(ValueError):
        isa.acc_bits_for(0)


@pytest.mark.parametrize("packing", list(TritPacking))
def test_extreme_accumulator_fits_acc_bits(packing):
    """K = MAX_K, codes all -128: trits -1 give +128 K, trits +1 give -128 K, computed by the golden GEMV
    kernel on a packed block (3 rows, so rows start inside a byte: MAX_K is not a multiple of 5)."""
    gemv, _ = _kernels()
    k = MAX_K
    trits = np.stack([np.full(k, -1), np.full(k, 1), np.full(k, -1)]).astype(np.int8)
    block = np.frombuffer(isa.pack_trits(trits, packing), np.uint8)
    lut = golden._BASE3 if packing is TritPacking.BASE3 else golden._BITS2   # the device's decode tables
    codes = np.full(k, -128, np.int32)
    out = np.zeros(3, np.int64)
    gemv(block, 3, k, codes, lut, PER_BYTE[packing], out, 0, 1)
    assert out.tolist() == [128 * k, -128 * k, 128 * k]
    lo, hi = -(1 << (ACC_BITS - 1)), (1 << (ACC_BITS - 1)) - 1
    assert lo <= out.min() and out.max() <= hi
    assert out.max() > (1 << (ACC_BITS - 2)) - 1, "ACC_BITS - 1 bits would overflow"
    assert ACC_BITS == isa.acc_bits_for(MAX_K) == 22


def test_limits_hold_the_27b_shape():
    assert isa.MAX_HIDDEN >= 2560 and isa.MAX_INTERMEDIATE >= 6912 and isa.MAX_LAYERS >= 32
    assert isa.MAX_VOCAB >= 32000 and isa.MAX_K >= max(isa.MAX_HIDDEN, isa.MAX_INTERMEDIATE)
    assert isa.MAX_N >= isa.MAX_VOCAB and isa.MAX_N < 1 << data.Layout.cast(InstrHeader)["n"].width


# -------------------------------------------------------------------------------------- register map
def _registers() -> dict[str, int]:
    return {f: getattr(REGISTER_MAP, f) for f in REGISTER_MAP.__dataclass_fields__}


def test_register_map_offsets():
    regs = _registers()
    size = regs.pop("SIZE")
    offsets = list(regs.values())
    assert len(set(offsets)) == len(offsets), "register offsets must be unique"
    assert all(o % 4 == 0 and 0 <= o < size for o in offsets)
    # the ID block comes first, control and status after it, the counters last
    ids = [o for n, o in regs.items() if n.startswith("ID_")]
    assert REGISTER_MAP.ID_MAGIC == 0 and max(ids) < REGISTER_MAP.CTRL
    assert max(o for n, o in regs.items() if n != "COUNTERS") < REGISTER_MAP.COUNTERS


def test_counters_fit_the_register_map():
    words = set()
    for c in Counter:
        off = REGISTER_MAP.counter(c)
        assert off % 8 == 0 and off + 8 <= REGISTER_MAP.SIZE
        words |= {off, off + 4}
    assert len(words) == 2 * len(Counter)
    others = set(_registers().values()) - {REGISTER_MAP.COUNTERS, REGISTER_MAP.SIZE}
    assert not words & others


def test_register_base_per_platform():
    assert {p: isa.register_base(p) for p in ("zynq", "ecp5", "sim", "alveo")} == \
        {"zynq": 0, "ecp5": 0, "sim": 0, "alveo": 0x10}
    assert isa.register_base("alveo") > 0x0C  # above XRT's ap_ctrl registers 0x00-0x0C
    with pytest.raises(ValueError, match="unknown platform"):
        isa.register_base("vu9p")


@FAST
@given(lanes=st.integers(1, 4096), channels=st.integers(1, 16), bus_bits=st.sampled_from([32, 64, 128, 256, 512]),
       packings=st.sets(st.sampled_from(list(TritPacking)), min_size=1), quant_lanes=st.integers(1, 64))
def test_id_block_values_round_trip(lanes, channels, bus_bits, packings, quant_lanes):
    values = isa.id_block_values(lanes=lanes, channels=channels, bus_bits=bus_bits, packings=sorted(packings,
                                 key=lambda p: p.value), quant_lanes=quant_lanes)
    by_name = {name: values[off] for name, off in _registers().items() if off in values and name.startswith("ID_")}
    assert len(by_name) == len(values)   # every value sits on an ID_ register
    assert all(0 <= v < 1 << 32 for v in values.values())
    assert by_name["ID_MAGIC"] == isa.ID_MAGIC and by_name["ID_VERSION"] == isa.ISA_VERSION
    assert (by_name["ID_LANES"], by_name["ID_CHANNELS"], by_name["ID_BUS_BITS"], by_name["ID_QUANT_LANES"]) == \
        (lanes, channels, bus_bits, quant_lanes)
    assert {p for p in TritPacking if by_name["ID_PACKINGS"] >> p.value & 1} == packings
    assert (by_name["ID_MAX_HIDDEN"], by_name["ID_MAX_INTERMEDIATE"], by_name["ID_MAX_LAYERS"],
            by_name["ID_MAX_VOCAB"], by_name["ID_ACC_BITS"]) == \
        (isa.MAX_HIDDEN, isa.MAX_INTERMEDIATE, isa.MAX_LAYERS, isa.MAX_VOCAB, ACC_BITS)


# ---------------------------------------------------------------------------- images of the compiler
def test_base3_image_of_the_370m_shape_is_18_percent_smaller():
    """The 370M shape (hidden 1024, intermediate 2816, vocabulary 32000) with 2 layers. Fixed formats
    skip calibration (they do not change the size); the whole test takes a few seconds."""
    t0 = time.perf_counter()
    cfg = HGRNBitConfig(vocab_size=32000, hidden_size=1024, num_hidden_layers=2, intermediate_size=2816)
    w = random_weights(cfg)
    fm = Formats.uniform(cfg.num_hidden_layers)
    size = {p: len(compile_model(w, CompileOptions(packing=p, formats=fm))) for p in TritPacking}
    assert size[TritPacking.BASE3] <= 0.82 * size[TritPacking.BITS2], size
    assert time.perf_counter() - t0 < 20


TINY = HGRNBitConfig(vocab_size=53, hidden_size=38, num_hidden_layers=2, intermediate_size=54)


@pytest.fixture(scope="module")
def tiny():
    w = random_weights(TINY, seed=3, gamma_spread=1.0)
    return w, calibrate(w)


def test_compile_model_is_deterministic(tiny):
    w, fm = tiny
    assert compile_model(w) == compile_model(w)    # calibrated formats: deterministic too
    opts = CompileOptions(formats=fm)
    a = compile_model(w, opts)
    assert a == compile_model(w, opts) == compile_model(random_weights(TINY, seed=3, gamma_spread=1.0), opts)


@pytest.mark.parametrize("packing", list(TritPacking))
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_compile_model_depends_on_packing_and_channels(tiny, packing, channels):
    w, fm = tiny
    base = parse_image(compile_model(w, CompileOptions(formats=fm)))
    img = compile_model(w, CompileOptions(formats=fm, packing=packing, channels=channels))
    p = parse_image(img)
    assert (p.info.packing, p.info.channels) == (packing, channels)
    if (packing, channels) != (TritPacking.BASE3, 1):
        assert img != bytes(base.raw)
    # the program is the same; only the weight sections differ, and they hold the same trits
    assert len(p.instructions) == len(base.instructions)
    for a, b in zip(p.instructions, base.instructions, strict=True):
        assert (a.opcode, a.flags, a.n, a.k, a.ops, a.cb_mant, a.cb_shift) == \
            (b.opcode, b.flags, b.n, b.k, b.ops, b.cb_mant, b.cb_shift)
        if a.opcode is Opcode.GEMV:
            assert len(a.blocks) == channels
            assert np.array_equal(_trits(a, p.info), _trits(b, base.info))


def _trits(ins: Instruction, info) -> np.ndarray:
    """The [n, k] trits of a parsed GEMV, de-interleaved from its channel blocks."""
    t = np.zeros((ins.n, ins.k), np.int8)
    for c, blk in enumerate(ins.blocks):
        rows = channel_rows(ins.n, info.channels, c)
        t[c::info.channels] = isa.unpack_trits(blk, rows * ins.k, info.packing).reshape(rows, ins.k)
    return t


@pytest.mark.parametrize("packing", list(TritPacking))
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_parse_image_inverts_assemble(tiny, packing, channels):
    """hidden 38 and intermediate 54 are multiples of neither 4 nor 5: rows start inside bytes."""
    w, fm = tiny
    opts = CompileOptions(formats=fm, packing=packing, channels=channels)
    prog = compile_program(w, opts)
    kw = dict(packing=packing, channels=channels, n_layers=TINY.num_hidden_layers, hidden=TINY.hidden_size,
              intermediate=TINY.intermediate_size, vocab=TINY.vocab_size, residual_frac=fm.residual,
              state_frac=fm.state, gate_frac=nx.GATE_FRAC, lut_segments_log2=nx.LUT_SEGMENTS_LOG2)
    raw = assemble(prog, **kw)
    assert raw == compile_model(w, opts)
    p = parse_image(raw)
    i = p.info
    assert (i.packing, i.channels, i.n_layers, i.hidden, i.intermediate, i.vocab, i.residual_frac, i.state_frac,
            i.gate_frac, i.lut_segments_log2) == tuple(kw.values())
    assert i.n_instructions == len(prog) and i.image_bytes == len(raw)
    for src, got in zip(prog, p.instructions, strict=True):
        for f in ("opcode", "flags", "layer", "n", "k", "q_shift", "amax_reg", "ssq_reg", "cb_mant", "cb_shift",
                  "out_frac", "ops"):
            assert getattr(got, f) == getattr(src, f), (src.name, f)
        if src.opcode is Opcode.GEMV:
            assert got.src == src.src
            assert np.array_equal(_trits(got, i), src.trits)
        assert (got.qconst is None) == (src.qconst is None)
        if src.qconst is not None:
            assert np.array_equal(got.qconst, src.qconst)
        assert len(got.consts) == len(src.consts)
        for a, b in zip(got.consts, src.consts, strict=True):
            assert np.array_equal(a, b)


# ------------------------------------------------------------------- micro-op semantics (golden device)
H = 7
OPS = list(MicroOpcode)
READABLE = [Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_OLD, Buffer.STATE_NEW, Buffer.TOKEN, Buffer.C0, Buffer.C1]
WRITABLE = [Buffer.X, Buffer.A, Buffer.P, Buffer.STATE_NEW]


@st.composite
def micro_ops(draw):
    op = draw(st.sampled_from(OPS))
    reg = st.integers(0, 3)
    spec = {"op": op, "dst": draw(reg), "a": draw(reg), "b": draw(reg)}
    if op is MicroOpcode.ST:
        spec["buf"] = draw(st.sampled_from(WRITABLE))
    elif op in (MicroOpcode.SSQ, MicroOpcode.AMAX):
        spec["buf"] = draw(st.sampled_from([Buffer.NONE, Buffer.C0, Buffer.C1]))
        spec["reg"] = draw(st.integers(0, 7))
    else:
        spec["buf"] = draw(st.sampled_from(READABLE))
    lo = nx.LUT_SEGMENTS_LOG2 - nx.LUT_RANGE_LOG2 if op in (MicroOpcode.SIG, MicroOpcode.SIGNEG, MicroOpcode.SILU) \
        else 0
    spec["shift"] = draw(st.integers(lo, 40))
    return MicroOpSpec(**spec)


def _element_program(ops, x, consts, state, table):
    """The ISA's per-element semantics (hw/isa.py MicroOpcode, hw/numerics.py), one element at a time."""
    bufs = {Buffer.X: np.zeros(H, np.int64), Buffer.A: np.zeros(H, np.int64), Buffer.P: np.zeros(H, np.int64),
            Buffer.STATE_OLD: state.copy(), Buffer.STATE_NEW: state.copy(), Buffer.TOKEN: x,
            Buffer.C0: consts[0], Buffer.C1: consts[1]}
    outs: dict[int, list[int]] = {}      # OUT micro-op index -> its vector
    argmax: list[int] = []               # the last ARGMAX's vector
    for n in range(H):
        r = [int(x[n]), int(x[n]), 0, 0]

        def one(v):
            return np.array([v], np.int64)

        for idx, op in enumerate(ops):
            o, a = op.op, one(r[op.a])
            if o is MicroOpcode.LD:
                r[op.dst] = int(bufs[op.buf][n])
            elif o is MicroOpcode.ST:
                bufs[op.buf][n] = r[op.a]
            elif o in (MicroOpcode.ADD, MicroOpcode.SUB):
                v = r[op.a] + r[op.b] if o is MicroOpcode.ADD else r[op.a] - r[op.b]
                r[op.dst] = min(max(v, nx.INT32_MIN), nx.INT32_MAX)
            elif o is MicroOpcode.MUL:
                r[op.dst] = int(nx.mul(a, one(r[op.b]), op.shift)[0])
            elif o is MicroOpcode.MULV:
                r[op.dst] = int(nx.mul(a, one(bufs[op.buf][n]), op.shift)[0])
            elif o is MicroOpcode.ADDV:
                r[op.dst] = min(max(r[op.a] + int(bufs[op.buf][n]), nx.INT32_MIN), nx.INT32_MAX)
            elif o is MicroOpcode.SIG:
                r[op.dst] = int(nx.sigmoid(a, op.shift, table)[0])
            elif o is MicroOpcode.SIGNEG:
                r[op.dst] = int(nx.sigmoid(nx.sat32(-a), op.shift, table)[0])
            elif o is MicroOpcode.SILU:
                r[op.dst] = int(nx.silu(a, op.shift, table)[0])
            elif o is MicroOpcode.RSUB1:
                r[op.dst] = min(max((1 << op.shift) - r[op.a], nx.INT32_MIN), nx.INT32_MAX)
            elif o is MicroOpcode.OUT:
                outs.setdefault(idx, []).append(r[op.a])
            elif o is MicroOpcode.ARGMAX:
                last = max(i for i, q in enumerate(ops) if q.op is MicroOpcode.ARGMAX)
                if idx == last:
                    argmax.append(r[op.a])
    # each OUT appends its whole vector to the logits, in program order
    logits = [v for idx in sorted(outs) for v in outs[idx]]
    best = int(np.argmax(argmax)) if argmax else 0    # the first index wins ties
    return np.array(logits, np.int64), bufs, best


def _prelude() -> Instruction:
    """X = A = P = 0 and STATE_NEW = STATE_OLD, written by the program (r2 starts at 0): the core does not clear
    its buffers at a token's start, so a program reads only what it wrote (docs/ISA.md section 5)."""
    return Instruction(Opcode.LOAD_TOKEN, n=H, ops=[
        MicroOpSpec(MicroOpcode.ST, a=2, buf=Buffer.X), MicroOpSpec(MicroOpcode.ST, a=2, buf=Buffer.A),
        MicroOpSpec(MicroOpcode.ST, a=2, buf=Buffer.P), MicroOpSpec(MicroOpcode.LD, dst=1, buf=Buffer.STATE_OLD),
        MicroOpSpec(MicroOpcode.ST, a=1, buf=Buffer.STATE_NEW)])


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(micro_ops(), min_size=1, max_size=isa.MAX_OPS - 4), data_=st.data())
def test_golden_epilogue_follows_the_per_element_semantics(ops, data_):
    """Random LOAD_TOKEN programs on the golden device against a one-element-at-a-time interpreter. The
    second instruction reads back X, A, P (and the state is compared) so every store is observed."""
    i32 = st.integers(nx.INT32_MIN, nx.INT32_MAX)
    small = st.integers(-(1 << 20), 1 << 20)
    vec = lambda s: np.array(data_.draw(st.lists(s, min_size=H, max_size=H)), np.int64)  # noqa: E731
    x, c0, c1, h = vec(st.one_of(small, i32)), vec(i32), vec(small), vec(small)
    outs = [MicroOpSpec(MicroOpcode.OUT, a=j) for j in range(4)]
    read_back = [MicroOpSpec(MicroOpcode.LD, dst=0, buf=Buffer.X), MicroOpSpec(MicroOpcode.LD, dst=1, buf=Buffer.A),
                 MicroOpSpec(MicroOpcode.LD, dst=2, buf=Buffer.P), *outs[:3]]
    prog = [_prelude(), Instruction(Opcode.LOAD_TOKEN, n=H, ops=list(ops) + outs, consts=[c0, c1]),
            Instruction(Opcode.LOAD_TOKEN, n=H, ops=read_back),
            Instruction(Opcode.END_TOKEN)]
    img = assemble(prog, packing=TritPacking.BASE3, channels=1, n_layers=1, hidden=H, intermediate=H, vocab=H,
                   residual_frac=16, state_frac=20, gate_frac=nx.GATE_FRAC, lut_segments_log2=nx.LUT_SEGMENTS_LOG2)
    try:
        m = GoldenMachine(img)
    except ImageError as exc:
        # a program that reads a buffer after storing to it is not an image (the hazard rule, tested below)
        assume("after a store" not in str(exc))
        raise
    state = h[None, :].copy()
    res = m.run_token(make_token_packet(x), state)
    got = parse_output_packet(res.output).logits_acc
    want, bufs, best = _element_program(list(ops) + outs, x, [c0, c1], h, m.table)
    want = np.concatenate([want, bufs[Buffer.X], bufs[Buffer.A], bufs[Buffer.P]])
    assert np.array_equal(got, want)
    assert parse_output_packet(res.output).argmax == best
    assert np.array_equal(res.state[0], bufs[Buffer.STATE_NEW])
    assert np.array_equal(state[0], h), "run_token must not modify the committed state"


def test_registers_start_at_zero_and_ld_keeps_the_loaded_value():
    """Regression (golden device): r2, r3 start at 0 (they were None), and a register loaded by LD keeps the
    value it read when a later ST overwrites that buffer element (LD returned a view of the buffer). X and A
    hold the prelude's zeros."""
    x = np.arange(1, H + 1, dtype=np.int64) * 1000
    ops = [MicroOpSpec(MicroOpcode.LD, dst=2, buf=Buffer.X),        # r2 = X = 0 at the start of a token
           MicroOpSpec(MicroOpcode.ST, a=0, buf=Buffer.X),          # X = x; r2 stays 0
           MicroOpSpec(MicroOpcode.OUT, a=2),
           MicroOpSpec(MicroOpcode.LD, dst=3, buf=Buffer.A),        # A is zero at the start of a token
           MicroOpSpec(MicroOpcode.ADD, dst=1, a=1, b=3),           # r1 = x + 0
           MicroOpSpec(MicroOpcode.OUT, a=1)]
    zero_regs = [MicroOpSpec(MicroOpcode.ADD, dst=0, a=2, b=3), MicroOpSpec(MicroOpcode.OUT, a=0)]
    prog = [_prelude(), Instruction(Opcode.LOAD_TOKEN, n=H, ops=ops),
            Instruction(Opcode.LOAD_TOKEN, n=H, ops=zero_regs), Instruction(Opcode.END_TOKEN)]
    img = assemble(prog, packing=TritPacking.BASE3, channels=1, n_layers=1, hidden=H, intermediate=H, vocab=H,
                   residual_frac=16, state_frac=20, gate_frac=nx.GATE_FRAC, lut_segments_log2=nx.LUT_SEGMENTS_LOG2)
    m = GoldenMachine(img)
    got = parse_output_packet(m.run_token(make_token_packet(x), m.init_state()).output).logits_acc
    assert np.array_equal(got, np.concatenate([np.zeros(H, np.int64), x, np.zeros(H, np.int64)]))


def test_reading_a_buffer_after_storing_to_it_is_rejected():
    """The hazard rule (docs/ISA.md): the pipeline reads at entry and writes at exit."""
    ops = [MicroOpSpec(MicroOpcode.ST, a=0, buf=Buffer.X), MicroOpSpec(MicroOpcode.LD, dst=2, buf=Buffer.X)]
    prog = [Instruction(Opcode.LOAD_TOKEN, n=H, ops=ops), Instruction(Opcode.END_TOKEN)]
    img = assemble(prog, packing=TritPacking.BASE3, channels=1, n_layers=1, hidden=H, intermediate=H, vocab=H,
                   residual_frac=16, state_frac=20, gate_frac=nx.GATE_FRAC, lut_segments_log2=nx.LUT_SEGMENTS_LOG2)
    with pytest.raises(ImageError, match="reads X after a store") as exc:
        parse_image(img)
    assert exc.value.cause is ErrorCause.BAD_MICROOP and exc.value.instruction == 0


@pytest.mark.parametrize("first, match", [
    ([MicroOpSpec(MicroOpcode.LD, dst=1, buf=Buffer.A)], "reads 7 elements of A, the program wrote 0"),
    ([MicroOpSpec(MicroOpcode.ADDV, dst=1, buf=Buffer.X)], "reads 7 elements of X, the program wrote 0"),
    ([MicroOpSpec(MicroOpcode.LD, dst=1, buf=Buffer.STATE_NEW)], "reads STATE_NEW of layer 0 before"),
])
def test_reading_what_the_program_did_not_write_is_rejected(first, match):
    """The core does not clear X, A, P at a token's start, nor copy STATE_OLD to STATE_NEW: an instruction
    reads only what an earlier one of the token wrote, and END_TOKEN commits only a STATE_NEW written in every
    layer (BAD_SHAPE, statically: docs/ISA.md section 5)."""
    def image(prog):
        return assemble(prog, packing=TritPacking.BASE3, channels=1, n_layers=1, hidden=H, intermediate=H, vocab=H,
                        residual_frac=16, state_frac=20, gate_frac=nx.GATE_FRAC, lut_segments_log2=nx.LUT_SEGMENTS_LOG2)
    with pytest.raises(ImageError, match=match) as exc:
        parse_image(image([Instruction(Opcode.LOAD_TOKEN, n=H, ops=first), _prelude(), Instruction(Opcode.END_TOKEN)]))
    assert exc.value.cause is ErrorCause.BAD_SHAPE and exc.value.instruction == 0
    parse_image(image([_prelude(), Instruction(Opcode.LOAD_TOKEN, n=H, ops=first), Instruction(Opcode.END_TOKEN)]))
    with pytest.raises(ImageError, match="commits STATE_NEW of layer 0") as exc:
        parse_image(image([Instruction(Opcode.LOAD_TOKEN, n=H, ops=[MicroOpSpec(MicroOpcode.ST, buf=Buffer.X)]),
                           Instruction(Opcode.END_TOKEN)]))
    assert exc.value.cause is ErrorCause.BAD_SHAPE and exc.value.instruction == 1


# ------------------------------------------------------------------------------------------ docs/ISA.md
def _isa_tables():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "isa_tables.py"
    spec = importlib.util.spec_from_file_location("isa_tables", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, path.parents[1] / "docs" / "ISA.md"


def test_isa_doc_has_the_current_tables_and_example():
    mod, doc = _isa_tables()
    text = doc.read_text()
    hint = "docs/ISA.md is stale: run `python scripts/isa_tables.py --write docs/ISA.md` (and check the prose)"
    assert f"{mod.TABLES_BEGIN}\n{mod.tables()}{mod.TABLES_END}" in text, hint
    if mod.MODEL.exists():
        assert f"{mod.EXAMPLE_BEGIN}\n{mod.example()}{mod.EXAMPLE_END}" in text, hint
    # the worked encodings agree with the packers
    for p in TritPacking:
        assert f"`{isa.pack_trits(list(mod.EXAMPLE_TRITS), p).hex(' ')}`" in text


def test_field_span_reads_the_layout():
    """field_span gives where pack() puts a field: set it alone, find its bits."""
    bit, width = isa.field_span(InstrHeader, ("ops", 2, "shift"))
    raw = int.from_bytes(isa.pack(InstrHeader, {"ops": [{}, {}, {"shift": 0b101101}]}), "little")
    assert width == 6 and raw == 0b101101 << bit
    assert isa.field_span(ImageHeader, ("crc",)) == (480, 32)


# ------------------------------------------------------------------------ without Amaranth (hw._bits)
# A board runs bundles without Amaranth: hw.isa then declares the same layouts on hw._bits. The child of
# tests/runtime_only.py (Amaranth blocked) must give the same layouts, bytes and fields as this process
# (Amaranth's types) and as Amaranth's own Layout.const, for every layout.
def _amaranth_leaves(layout, base=0, path=()) -> dict:
    """Every leaf field's [bit, width, kind] from Amaranth's own layout offsets (no hw.isa code)."""
    out = {}
    for key, f in data.Layout.cast(layout):
        shape = f.shape
        if isinstance(shape, data.Layout) or (isinstance(shape, type) and issubclass(shape, data.Struct)):
            out.update(_amaranth_leaves(shape, base + f.offset, (*path, key)))
            continue
        s = Shape.cast(shape)
        kind = shape.__name__ if isinstance(shape, type) and issubclass(shape, (aenum.Enum, aenum.Flag)) else \
            f"{'signed' if s.signed else 'unsigned'}({s.width})"
        out["/".join(map(str, (*path, key)))] = [base + f.offset, f.width, kind]
    return out


@pytest.fixture(scope="module")
def no_amaranth():
    """``ask(request) -> reply`` of a ``tests/runtime_only.py isa`` child (Amaranth not importable)."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("runtime_only.py")), "isa"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(req: dict) -> dict:
        proc.stdin.write(json.dumps(runtime_only._encode(req)) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"the child exited ({proc.poll()})"
        return json.loads(line)

    yield ask
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


def test_no_amaranth_same_layouts(no_amaranth):
    rep = no_amaranth({"op": "describe"})
    assert rep["amaranth"] is False and rep["blocked_loaded"] == []
    assert isa.AMARANTH is True
    for name in runtime_only.LAYOUTS:
        layout = getattr(isa, name)
        want = _amaranth_leaves(layout)
        assert runtime_only.describe(isa, layout) == want, name     # field_span here, Amaranth's types
        assert rep["layouts"][name] == {"bytes": isa.layout_bytes(layout), "fields": want}, name


def _cases():
    plain = st.sampled_from(["ImageHeader", "TokenHeader", "OutputTrailer", "MicroOp"])
    return st.one_of(plain.flatmap(lambda n: st.tuples(st.just(n), fields_of(getattr(isa, n)))),
                     st.tuples(st.just("InstrHeader"), instr_headers()))


@FAST
@given(_cases())
def test_no_amaranth_same_bytes_and_fields(no_amaranth, case):
    name, fields = case
    layout = getattr(isa, name)
    raw = isa.pack(layout, fields)
    assert raw == data.Layout.cast(layout).const(fields).as_bits().to_bytes(len(raw), "little")
    rep = no_amaranth({"op": "pack", "layout": name, "fields": fields})
    assert bytes.fromhex(rep["raw"]) == raw
    assert rep["back"] == runtime_only._encode(fields)


def test_unpacked_view():
    """What the host reads from an unpack: attributes, items, signed and enum fields, arrays, errors."""
    h = isa.unpack(InstrHeader, isa.pack(InstrHeader, {"opcode": Opcode.GEMV, "cb_shift": -5,
                                                        "ops": [{"op": MicroOpcode.OUT, "shift": 3}]}))
    assert h.opcode is Opcode.GEMV and h["cb_shift"] == h.cb_shift == -5
    assert len(h.ops) == isa.MAX_OPS and h.ops[0].op is MicroOpcode.OUT and h.ops[-isa.MAX_OPS].shift == 3
    assert isa.pack(InstrHeader, {"ops": h.ops}) == isa.pack(InstrHeader, {"ops": [{"op": MicroOpcode.OUT,
                                                                                     "shift": 3}]})
    with pytest.raises(AttributeError, match="no field 'bogus'"):
        _ = h.bogus
    with pytest.raises(IndexError):
        _ = h.ops[isa.MAX_OPS]
    with pytest.raises(ValueError, match="is not a valid Opcode"):
        _ = isa.unpack(InstrHeader, bytes([99]) + bytes(63)).opcode
    with pytest.raises(KeyError):
        isa.field_span(InstrHeader, ("n", "x"))
