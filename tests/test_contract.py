"""One contract for malformed input (docs/ISA.md section 5): the golden device's :func:`host.devices.golden.run_stream`
and the Verilated core (``host/devices/rtl_harness``) agree on every malformed image and token packet, bit for bit.

A seeded generator changes an image or a token packet the way a bad DMA, a stale file or a bad compiler would:
header and instruction fields changed with their CRCs recomputed, header and instruction bits flipped without,
constant and weight bytes changed at random offsets, the image cut or extended by a section (with and without
a header that agrees), the token packet's length field, size (a section short or long), magic and CRC. Each
case runs on both; they must give the same ``ERROR_CAUSE``, the same ``ERROR_WHERE``, the same output words
(a packet cut by an error ends with ``hw.isa.OUTPUT_ABORT_WORD``; while the LM head streams, the core may have
sent any prefix of its logits), and the same committed state, which the next good token then shows (after
``Ctrl.CLEAR``, which the harness writes after an error). A sweep of ``Ctrl.ABORT`` at every cycle around the
end of the output packet checks the rule that a packet that ends normally means a committed token.

Tiers: the golden-only properties run in the fast suite; the core runs in the ``sim`` tier (a sample of each kind
of case and the abort sweep, one small build) and the long sweep (more cases, two more builds) in ``slow``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from host.compiler import CompileOptions, calibrate, compile_model
from host.devices.golden import GoldenMachine, StreamOutcome, run_stream
from host.image import BuildLimits, ImageError, parse_image
from host.model import HGRNBitConfig, random_weights
from host.protocol import CoreError, make_token_packet
from hw import isa
from hw import numerics as nx
from hw.isa import ErrorCause, ImageHeader, InstrFlags, InstrHeader, Opcode, TokenHeader, TritPacking

#: hidden 38 < intermediate 54, neither a multiple of 4 or 5 (as tests/test_image_errors.py)
TINY = HGRNBitConfig(vocab_size=53, hidden_size=38, num_hidden_layers=2, intermediate_size=54)
HDR = isa.layout_bytes(ImageHeader)
INS = isa.layout_bytes(InstrHeader)
ABORT = isa.OUTPUT_ABORT_WORD.to_bytes(4, "little")

#: builds: the sample's, and two more for the long sweep (2-bit packing on a 128-bit bus; two channels)
SAMPLE = {"lanes": 16, "quant_lanes": 4, "channels": 1, "bus_bits": 64, "packing": "base3"}
MORE = [{"lanes": 16, "quant_lanes": 4, "channels": 1, "bus_bits": 128, "packing": "bits2"},
        {"lanes": 16, "quant_lanes": 4, "channels": 2, "bus_bits": 64, "packing": "base3"}]


# ----------------------------------------------------------------------------------------------- model
@pytest.fixture(scope="module")
def weights():
    return random_weights(TINY, seed=11, gamma_spread=1.0)


def _image(weights, packing: str, channels: int) -> bytes:
    return compile_model(weights, CompileOptions(formats=calibrate(weights), packing=TritPacking[packing.upper()],
                                                 channels=channels))


def _limits(image: bytes, build: dict) -> BuildLimits:
    """The limits of the core the RTL device builds for this model (its capacities are the model's sizes)."""
    info = parse_image(image).info
    return BuildLimits(packing=info.packing, channels=build["channels"], max_hidden=info.hidden,
                       max_intermediate=info.intermediate, max_layers=1 << (info.n_layers - 1).bit_length(),
                       lut_segments_log2=nx.LUT_SEGMENTS_LOG2)


def _packet(weights, image: bytes, token: int, position: int = 0, logits: bool = True) -> bytes:
    frac = parse_image(image).info.residual_frac
    return make_token_packet(nx.to_fixed(weights.embeddings[token], frac), position=position, logits=logits)


# ------------------------------------------------------------------------------------------ byte surgery
def _field(layout, path: tuple) -> tuple[int, int]:
    return isa.field_span(layout, path)


def _get(raw, off: int, layout, path: tuple) -> int:
    bit, width = _field(layout, path)
    return (int.from_bytes(bytes(raw[off:off + 64]), "little") >> bit) & ((1 << width) - 1)


def _set(raw: bytearray, off: int, layout, path: tuple, value: int, *, fix_crc: bool = True) -> None:
    """Set a field of the 64-byte header at ``off``; ``fix_crc``: recompute its CRC word (words 0-14)."""
    bit, width = _field(layout, path)
    v = int.from_bytes(bytes(raw[off:off + 64]), "little")
    v = (v & ~(((1 << width) - 1) << bit)) | ((value & ((1 << width) - 1)) << bit)
    raw[off:off + 64] = v.to_bytes(64, "little")
    if fix_crc:
        raw[off + 60:off + 64] = isa.crc32_words(bytes(raw[off:off + 60])).to_bytes(4, "little")


def _seal_packet(body: bytes) -> bytes:
    """A token packet's CRC word recomputed over ``body`` (everything before it)."""
    return body + isa.crc32_words(body).to_bytes(4, "little")


HEADER_FIELDS = [("hidden",), ("intermediate",), ("vocab",), ("n_layers",), ("n_instructions",), ("image_words",),
                 ("gate_frac",), ("lut_segments_log2",), ("packing",), ("channels",), ("version",), ("magic",),
                 ("residual_frac",)]
INSTR_FIELDS = [("opcode",), ("flags",), ("layer",), ("n_ops",), ("n",), ("k",), ("src",), ("n_consts",),
                ("weight_bytes",), ("out_frac",), ("q_shift",)]
OP_FIELDS = ["op", "buf", "shift", "dst", "a"]


@dataclass
class Case:
    kind: str
    what: str
    image: bytes
    packet: bytes
    same_layout: bool        #: the image keeps the good image's length and section layout (any channel count)


def make_case(rng: np.random.Generator, image: bytes, packet: bytes, kind: str | None = None) -> Case:
    """One malformed (or good) input, chosen by ``rng``."""
    kinds = ["good", "header_field", "header_bit", "instr_field", "op_field", "instr_bit", "const_byte",
             "weight_byte", "weight_byte", "cut", "extend", "token_length", "token_size", "token_magic", "token_crc"]
    kind = kind or str(rng.choice(kinds))
    parsed = parse_image(image)
    ins = parsed.instructions
    raw, pk = bytearray(image), bytearray(packet)
    same = True
    if kind == "good":
        what = "unchanged"
    elif kind == "header_field":
        path = HEADER_FIELDS[rng.integers(len(HEADER_FIELDS))]
        old = _get(raw, 0, ImageHeader, path)
        new = old + int(rng.choice([-16, -1, 1, 16])) if path == ("image_words",) else old + int(rng.choice([-1, 1]))
        _set(raw, 0, ImageHeader, path, new)
        what = f"{path[0]} {old} -> {new}"
    elif kind == "header_bit":
        at = int(rng.integers(HDR - 4))
        raw[at] ^= 1 << int(rng.integers(8))
        what = f"header byte {at} flipped"
    elif kind in ("instr_field", "op_field", "instr_bit"):
        idx = int(rng.integers(len(ins)))
        off = ins[idx].offset
        if kind == "instr_field":
            path = INSTR_FIELDS[rng.integers(len(INSTR_FIELDS))]
        elif kind == "op_field":
            path = ("ops", int(rng.integers(isa.MAX_OPS)), OP_FIELDS[rng.integers(len(OP_FIELDS))])
        if kind == "instr_bit":
            at = int(rng.integers(INS - 4))
            raw[off + at] ^= 1 << int(rng.integers(8))
            what = f"instruction {idx} byte {at} flipped"
        else:
            old = _get(raw, off, InstrHeader, path)
            width = _field(InstrHeader, path)[1]
            new = int(rng.integers(1 << min(width, 16))) if rng.random() < 0.3 else old + int(rng.choice([-1, 1]))
            if path == ("weight_bytes",):
                new = old + int(rng.choice([-64, 64]))
            _set(raw, off, InstrHeader, path, new)
            what = f"instruction {idx} {'.'.join(map(str, path))} {old} -> {new & ((1 << width) - 1)}"
    elif kind == "const_byte":
        cands = [i for i in ins if i.consts or i.qconst is not None]
        i = cands[rng.integers(len(cands))]
        at = i.offset + INS + int(rng.integers(4 * 16))
        raw[at] ^= 1 << int(rng.integers(8))
        what = f"constant byte {at} flipped"
    elif kind == "weight_byte":
        gemvs = [i for i in ins if i.opcode is Opcode.GEMV]
        i = gemvs[rng.integers(len(gemvs))]
        wb = sum(len(b) for b in i.blocks)
        at = i.weight_offset + int(rng.integers(wb))
        old = raw[at]
        raw[at] = int(rng.integers(256)) if rng.random() < 0.5 else old ^ (1 << int(rng.integers(8)))
        what = f"weight byte {at} of instruction {ins.index(i)}: {old:#x} -> {raw[at]:#x}"
    elif kind == "cut":
        same = False
        sections = len(image) // 64
        keep = int(rng.integers(1, sections)) * 64
        raw = raw[:keep]
        if rng.random() < 0.5:
            _set(raw, 0, ImageHeader, ("image_words",), keep // 4)
        what = f"cut to {keep} bytes"
    elif kind == "extend":
        same = False
        raw += bytes(64) if rng.random() < 0.5 else bytes(rng.integers(0, 256, 64, dtype=np.uint8))
        if rng.random() < 0.5:
            _set(raw, 0, ImageHeader, ("image_words",), len(raw) // 4)
        what = "one section more"
    elif kind == "token_length":
        old = _get(pk, 0, TokenHeader, ("length",))
        new = old + int(rng.choice([-1, 1]))
        v = int.from_bytes(bytes(pk[:16]), "little")
        bit, _ = _field(TokenHeader, ("length",))
        v = (v & ~(0xFFFFFFFF << bit)) | (new << bit)
        pk[:16] = v.to_bytes(16, "little")
        pk = bytearray(_seal_packet(bytes(pk[:-4])))
        what = f"token length {old} -> {new}"
    elif kind == "token_size":
        if rng.random() < 0.5 and len(pk) > 64:
            pk = bytearray(_seal_packet(bytes(pk[:-68])))
            what = "token packet a section short"
        else:
            pk = bytearray(_seal_packet(bytes(pk[:-4]) + bytes(64)))
            what = "token packet a section long"
    elif kind == "token_magic":
        pk[int(rng.integers(4))] ^= 1 << int(rng.integers(8))
        pk = bytearray(_seal_packet(bytes(pk[:-4])))
        what = "token magic"
    elif kind == "token_crc":
        at = int(rng.integers(len(pk)))
        pk[at] ^= 1 << int(rng.integers(8))
        what = f"token byte {at} flipped"
    else:
        raise ValueError(kind)
    return Case(kind, what, bytes(raw), bytes(pk), same)


# ------------------------------------------------------------------------------------------ golden only
def test_run_stream_agrees_with_parse_and_run_token(weights):
    """Golden-only properties of the oracle (fast): on a good image it is :meth:`GoldenMachine.run_token`; an
    error found in the image alone is :func:`host.image.parse_image`'s (cause, instruction), with the token
    packet's checks before it; an error never changes the state."""
    image = _image(weights, "base3", 1)
    limits = _limits(image, SAMPLE)
    machine = GoldenMachine(image)
    state = machine.init_state()
    good = _packet(weights, image, 5)
    want = machine.run_token(good, state)
    got = run_stream(image, good, state, limits)
    assert got.cause is ErrorCause.NONE and got.output == want.output and np.array_equal(got.state, want.state)
    rng = np.random.default_rng(19)
    seen = set()
    for n in range(300):
        case = make_case(rng, image, good)
        out = run_stream(case.image, case.packet, want.state, limits)
        seen.add(out.cause)
        if out.cause is not ErrorCause.NONE:
            assert np.array_equal(out.state, want.state), case.what
            assert out.output in (b"",) or out.output.endswith(ABORT), case.what
        if case.packet == good and out.cause not in (ErrorCause.TOKEN_LENGTH,):
            try:
                parse_image(case.image, limits=limits)
                err = None
            except ImageError as e:
                err = e
            if err is None:
                assert out.cause is ErrorCause.NONE, (n, case.what, out.cause)
            else:
                assert (out.cause, out.where) == (err.cause, isa.NO_INSTRUCTION if err.instruction is None
                                                  else err.instruction), (n, case.what)
    # the generator reaches most causes
    assert {ErrorCause.NONE, ErrorCause.BAD_SHAPE, ErrorCause.INSTR_CRC, ErrorCause.WEIGHT_CRC, ErrorCause.TRUNCATED,
            ErrorCause.TOKEN_LENGTH, ErrorCause.TOKEN_CRC, ErrorCause.HEADER_CRC} <= seen, seen


def test_run_stream_orders_token_before_image(weights):
    """A bad token packet in front of a bad image: the token packet's error (the core reads it first); its length
    against ``hidden`` only after the image header (which needs ``hidden``)."""
    image = _image(weights, "base3", 1)
    limits = _limits(image, SAMPLE)
    state = GoldenMachine(image).init_state()
    good = _packet(weights, image, 5)
    bad_img = bytearray(image)
    bad_img[0] ^= 1
    bad_pk = bytearray(good)
    bad_pk[20] ^= 1
    assert run_stream(bytes(bad_img), bytes(bad_pk), state, limits).cause is ErrorCause.TOKEN_CRC
    short = make_token_packet(np.zeros(TINY.hidden_size - 1, np.int64))
    out = run_stream(bytes(bad_img), short, state, limits)
    assert (out.cause, out.where) == (ErrorCause.BAD_MAGIC, isa.NO_INSTRUCTION)
    out = run_stream(image, short, state, limits)
    assert (out.cause, out.where) == (ErrorCause.TOKEN_LENGTH, isa.NO_INSTRUCTION)


def test_run_stream_without_tlast(weights):
    """Builds whose streams do not mark the ends (the Xilinx shells: ``token_tlast``/``image_tlast`` off): the
    token packet ends where its length field says (a section more is read as the image's first), and bytes
    after END_TOKEN belong to the next token."""
    image = _image(weights, "base3", 1)
    framed = _limits(image, SAMPLE)
    bare = BuildLimits(**{**framed.__dict__, "token_tlast": False, "image_tlast": False})
    state = GoldenMachine(image).init_state()
    good = _packet(weights, image, 5)
    want = run_stream(image, good, state, framed)
    assert want.cause is ErrorCause.NONE
    got = run_stream(image, good, state, bare)
    assert got.cause is ErrorCause.NONE and got.output == want.output
    assert run_stream(image + bytes(64), good, state, framed).cause is ErrorCause.BAD_SHAPE
    assert run_stream(image + bytes(64), good, state, bare).output == want.output
    long = _seal_packet(good[:-4] + bytes(64))
    assert run_stream(image, long, state, framed).cause is ErrorCause.TOKEN_LENGTH
    out = run_stream(image, long, state, bare)          # its first sections are taken: their CRC word is wrong
    assert (out.cause, out.where) == (ErrorCause.TOKEN_CRC, isa.NO_INSTRUCTION)


# ------------------------------------------------------------------------------------------ the core
def _toolchain_or_skip():
    from tests.test_rtl_device import _toolchain_or_skip as check

    check()


class Pair:
    """The core (a Verilated build for the tiny model) and the oracle, kept in step."""

    def __init__(self, weights, build: dict):
        from host.devices.rtl import RtlDevice

        _toolchain_or_skip()
        self.weights = weights
        self.rtl = RtlDevice(**build, progress=False, hang_cycles=20_000)
        self.rtl.load(weights)
        self.image = bytes(self.rtl.image.raw)
        self.limits = _limits(self.image, build)
        self.channels = build["channels"]
        self.state = GoldenMachine(self.image).init_state()
        self.harness = self.rtl.harness

    def streams(self, image: bytes, same_layout: bool) -> list[bytes]:
        """The bytes each channel's DMA sends: a malformed image of the good one's layout is split by that layout
        (the bytes in place); other images only on one channel."""
        if self.channels == 1:
            return [image]
        assert same_layout
        good = parse_image(self.image)
        out = [bytearray() for _ in range(self.channels)]
        out[0] += image[:HDR]
        for ins in good.instructions:
            head = ins.weight_offset if ins.opcode is Opcode.GEMV else ins.offset + INS + _const_bytes(ins)
            out[0] += image[ins.offset:head]
            start = ins.weight_offset
            for c, blk in enumerate(ins.blocks):
                out[c] += image[start:start + len(blk)]
                start += len(blk)
        return [bytes(b) for b in out]

    def run(self, image: bytes, packet: bytes, same_layout: bool = True, *, label: str = "",
            abort_at: int | None = None) -> tuple[StreamOutcome | None, object]:
        """Run both; compare; keep the oracle's state in step with the core's committed state."""
        self.harness.load_streams(self.streams(image, same_layout))
        want = run_stream(image, packet, self.state, self.limits)
        try:
            run = self.harness.run_token(packet, abort_at=abort_at)
            got = (ErrorCause.NONE, None, run.output, run)
        except CoreError as e:
            got = (ErrorCause(e.cause), e.where, e.output, e)
        return want, got

    def check(self, image: bytes, packet: bytes, same_layout: bool = True, label: str = "") -> StreamOutcome:
        want, (cause, where, output, _) = self.run(image, packet, same_layout, label=label)
        assert cause is want.cause, f"{label}: core {cause.name} at {where}, golden {want.cause.name} at {want.where}"
        if cause is not ErrorCause.NONE:
            assert where == want.where, f"{label}: {cause.name} at {where}, golden at {want.where}"
        if want.partial:     # cut while the LM head streamed: a prefix of its logits, then the abort word
            assert output == b"" or (output.endswith(ABORT) and want.output.startswith(output[:-4])), label
        else:
            assert output == want.output, f"{label}: {len(output)} output bytes, golden {len(want.output)}"
        self.state = want.state
        return want

    def next_good(self, token: int, label: str = "") -> None:
        """The next good token gives the oracle's packet: the committed state is the same."""
        pk = _packet(self.weights, self.image, token, position=token)
        self.check(self.image, pk, label=f"{label}: the next good token")

    def close(self):
        self.rtl.close()


def _const_bytes(ins) -> int:
    from host.image import const_section_bytes

    return const_section_bytes(ins)


def _sweep(pair: Pair, n: int, seed: int) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    good = _packet(pair.weights, pair.image, 7, position=1)
    kinds: dict[str, int] = {}
    causes: dict[ErrorCause, int] = {}
    for i in range(n):
        case = make_case(rng, pair.image, good)
        if pair.channels > 1 and not case.same_layout:
            continue
        label = f"case {i} ({case.kind}: {case.what})"
        want = pair.check(case.image, case.packet, case.same_layout, label=label)
        pair.next_good(int(rng.integers(TINY.vocab_size)), label=label)
        kinds[case.kind] = kinds.get(case.kind, 0) + 1
        causes[want.cause] = causes.get(want.cause, 0) + 1
    return {"kinds": kinds, "causes": causes}


def _abort_sweep(pair: Pair, before: int, after: int) -> None:
    """Ctrl.ABORT at every cycle from ``before`` cycles before the output packet's last word to ``after`` past it:
    either the packet ends normally and the token committed, or it ends with the abort word (ABORTED, at the
    instruction in flight) and the state is the old one; the two meet at one cycle."""
    pk = _packet(pair.weights, pair.image, 9, position=2)
    pair.harness.load_streams(pair.streams(pair.image, True))
    clean = pair.harness.run_token(pk, end_cycle=True)
    want = run_stream(pair.image, pk, pair.state, pair.limits)
    assert clean.output == want.output
    pair.state = want.state
    end = clean.end_cycle
    end_idx = len(parse_image(pair.image).instructions) - 1
    outcomes = []
    last_where = 0
    for at in range(end - before, end + after):
        want = run_stream(pair.image, pk, pair.state, pair.limits)
        try:
            run = pair.harness.run_token(pk, abort_at=at)
            assert run.output == want.output, f"abort at {at}: a packet that ends normally is the token's"
            pair.state = want.state
            outcomes.append("committed")
        except CoreError as e:
            assert e.cause is ErrorCause.ABORTED, f"abort at {at}: {e}"
            # the instruction in flight: the LM head (its logits lead the packet) or END_TOKEN (the trailer)
            assert e.where in (end_idx - 1, end_idx) and e.where >= last_where, f"abort at {at}: where {e.where}"
            last_where = e.where
            assert e.output.endswith(ABORT) and want.output.startswith(e.output[:-4]), f"abort at {at}: output"
            assert len(e.output) - 4 < len(want.output), f"abort at {at}: a whole packet, then the abort word"
            outcomes.append("aborted")
        pair.next_good(int(at % TINY.vocab_size), label=f"abort at {at}")
    assert "committed" in outcomes and "aborted" in outcomes and last_where == end_idx, outcomes
    first = outcomes.index("committed")
    assert outcomes[:first] == ["aborted"] * first and set(outcomes[first:]) == {"committed"}, outcomes


@pytest.fixture(scope="module")
def sample_pair(weights):
    pair = Pair(weights, SAMPLE)
    yield pair
    pair.close()


@pytest.mark.sim
@pytest.mark.slow
def test_contract_sample(sample_pair):
    """Every kind of case, 12 of each (the sample in ``make sim``)."""
    rng = np.random.default_rng(2026)
    good = _packet(sample_pair.weights, sample_pair.image, 7, position=1)
    for kind in ("good", "header_field", "header_bit", "instr_field", "op_field", "instr_bit", "const_byte",
                 "weight_byte", "cut", "extend", "token_length", "token_size", "token_magic", "token_crc"):
        for i in range(12):
            case = make_case(rng, sample_pair.image, good, kind)
            label = f"{kind} {i}: {case.what}"
            sample_pair.check(case.image, case.packet, case.same_layout, label=label)
            sample_pair.next_good(int(rng.integers(TINY.vocab_size)), label=label)


@pytest.mark.sim
@pytest.mark.slow
def test_weight_corruption_caught_by_both(sample_pair):
    """A changed weight byte that is still a valid trit code runs silently without the CRC: now WEIGHT_CRC in
    both, at that GEMV; an invalid one is BAD_TRIT; the LM head's logits that left are closed by the abort word."""
    image = sample_pair.image
    ins = parse_image(image).instructions
    good = _packet(sample_pair.weights, image, 3, position=0)
    for idx in (1, len(ins) - 2):          # the first GEMV and the LM head
        i = ins[idx]
        assert i.opcode is Opcode.GEMV and (idx == 1 or InstrFlags.LOGITS in i.flags)
        raw = bytearray(image)
        raw[i.weight_offset + 2] = (raw[i.weight_offset + 2] + 1) % 243
        out = sample_pair.check(bytes(raw), good, label=f"valid code changed in instruction {idx}")
        assert (out.cause, out.where) == (ErrorCause.WEIGHT_CRC, idx)
        if idx != 1:
            assert out.output.endswith(ABORT) and len(out.output) == 4 * TINY.vocab_size + 4
        raw[i.weight_offset + 5] = 0xF7
        out = sample_pair.check(bytes(raw), good, label=f"invalid code in instruction {idx}")
        assert (out.cause, out.where) == (ErrorCause.BAD_TRIT, idx)
        sample_pair.next_good(11)


@pytest.mark.sim
@pytest.mark.slow
def test_abort_around_the_end_of_the_output_packet(sample_pair):
    _abort_sweep(sample_pair, before=80, after=4)


@pytest.mark.slow
@pytest.mark.parametrize("build", [SAMPLE] + MORE, ids=["base3-64", "bits2-128", "base3-64-2ch"])
def test_contract_long_sweep(weights, build):
    pair = Pair(weights, build)
    try:
        stats = _sweep(pair, 600, seed=7 + build["bus_bits"] + build["channels"])
        assert len(stats["causes"]) >= 8, stats
        _abort_sweep(pair, before=120, after=4)
    finally:
        pair.close()
