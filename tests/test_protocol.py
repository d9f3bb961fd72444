"""host.protocol: every pack has its unpack (round trips), the ID block, error decoding, counters; the golden
oracle's activity counts against the cycle model's."""

from __future__ import annotations

import numpy as np
import pytest

from host import protocol as pr
from host.compiler import CompileOptions, compile_model
from host.devices.base import DeviceError
from host.devices.golden import ACTIVITY_COUNTERS, CycleModel, GoldenMachine
from host.image import ImageError, parse_image
from host.model import HGRNBitConfig, random_weights
from hw import isa
from hw.isa import Counter, ErrorCause, TritPacking

CFG = HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28)


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=11)


@pytest.mark.parametrize("channels", [1, 2, 3])
@pytest.mark.parametrize("packing", list(TritPacking))
def test_channel_streams_round_trip(weights, channels, packing):
    image = compile_model(weights, CompileOptions(packing=packing, channels=channels))
    streams = pr.channel_streams(parse_image(image), channels)
    assert len(streams) == channels and sum(map(len, streams)) == len(image)
    assert pr.merge_streams(streams) == image
    assert pr.merge_streams([streams[0][:-8], *streams[1:]]) is None          # a channel short: not yet
    if channels > 1:
        assert pr.merge_streams([streams[0], *streams[1:-1], streams[-1][:-1]]) is None
        with pytest.raises(ValueError, match="channel"):
            pr.channel_streams(image, channels + 1)
    assert pr.channel_streams(b"not an image", 1) == [b"not an image"]     # one channel: the bytes as they are


def test_token_packet_round_trip():
    x = np.array([0, 1, -1, 2**31 - 1, -(2**31)] * 5, dtype=np.int64)
    pk = pr.make_token_packet(x, position=2**32 + 7, logits=False)
    assert len(pk) == pr.token_packet_bytes(x.size) and len(pk) % isa.SECTION_BYTES == 0
    got, flags, position = pr.check_token_packet(pk)
    assert np.array_equal(got, x) and flags == 0 and position == 7
    bad = bytearray(pk)
    bad[20] ^= 1
    with pytest.raises(ImageError) as info:
        pr.check_token_packet(bytes(bad))
    assert info.value.cause is ErrorCause.TOKEN_CRC
    with pytest.raises(ValueError, match="int32"):
        pr.make_token_packet(np.array([2**31]))


def test_output_packet_round_trip():
    acc = np.arange(-30, 31, dtype=np.int64) * 1000
    raw = pr.make_output_packet(acc, position=5, argmax=60, max_acc=30000, scale_mant=3, scale_shift=9)
    assert len(raw) == pr.output_packet_bytes(acc.size)
    p = pr.parse_output_packet(raw)
    assert (p.position, p.argmax, p.max_acc, p.scale_mant, p.scale_shift) == (5, 60, 30000, 3, 9)
    assert np.array_equal(p.logits_acc, acc)
    assert np.array_equal(p.logits(), (acc * 3 / 512).astype(np.float32))
    bad = bytearray(raw)
    bad[0] ^= 1
    with pytest.raises(ValueError, match="CRC"):
        pr.parse_output_packet(bytes(bad))
    with pytest.raises(ValueError, match="multiple"):
        pr.parse_output_packet(raw[:-4])


def test_id_block_registers_and_checks(weights):
    values = isa.id_block_values(lanes=32, channels=2, bus_bits=128, packings=[TritPacking.BITS2], quant_lanes=4,
                                 max_hidden=64, max_intermediate=64, max_layers=2)
    ident = pr.read_id_block(lambda off: values.get(off, 0))
    assert ident.registers() == values and ident == pr.IdBlock.from_registers(values)
    assert ident.packing is TritPacking.BITS2 and ident.channels == 2
    pr.check_id_block(ident, "x", expect=values)
    with pytest.raises(DeviceError, match=r"differs from its build parameters.*0x08"):
        pr.check_id_block(ident, "x", expect={**values, isa.REGISTER_MAP.ID_LANES: 64})
    with pytest.raises(DeviceError, match="ID magic 0x00000000"):
        pr.check_id_block(pr.IdBlock.from_registers({**values, 0: 0}), "x")
    with pytest.raises(DeviceError, match="ISA version 1 "):
        pr.check_id_block(pr.IdBlock.from_registers({**values, 4: 1}), "x")
    info = parse_image(compile_model(weights, CompileOptions(packing=TritPacking.BITS2, channels=2))).info
    ident.check_image(info, "x")
    with pytest.raises(DeviceError, match="packed BASE3"):
        ident.check_image(parse_image(compile_model(weights, CompileOptions(channels=2))).info, "x")
    with pytest.raises(DeviceError, match="for 1 channel.*the core has 2"):
        ident.check_image(parse_image(compile_model(weights, CompileOptions(packing=TritPacking.BITS2))).info, "x")
    small = pr.IdBlock.from_registers({**values, isa.REGISTER_MAP.ID_MAX_HIDDEN: 16})
    with pytest.raises(DeviceError, match=r"does not fit.*'max_hidden': \(20, 16\)"):
        small.check_image(info, "x")


def test_errors_and_counters():
    R = isa.REGISTER_MAP
    regs = {R.STATUS: isa.Status.ERROR.value, R.ERROR_CAUSE: ErrorCause.WEIGHT_CRC.value, R.ERROR_WHERE: 7}
    err = pr.read_error(lambda off: regs.get(off, 0), "pynq")
    assert isinstance(err, pr.CoreError) and isinstance(err, DeviceError)
    assert err.cause is ErrorCause.WEIGHT_CRC and err.where == 7
    assert "WEIGHT_CRC at instruction 7" in str(err) and "state is unchanged" in str(err)
    assert pr.read_error(lambda off: isa.Status.DONE.value if off == R.STATUS else 0, "pynq") is None
    assert pr.CoreError("x", 200, 1).cause == 200 and "cause 200" in str(pr.CoreError("x", 200, 1))
    big = {c: (c.value + 1) << 33 | c.value for c in Counter}
    words = {}
    for c, v in big.items():
        words[R.counter(c)], words[R.counter(c) + 4] = v & 0xFFFFFFFF, v >> 32
    assert pr.read_counters(words.__getitem__) == big


def test_golden_activity_is_the_cycle_models_and_needs_no_build(weights):
    from hw.params import BuildParams

    image = compile_model(weights, CompileOptions(channels=2))
    oracle = GoldenMachine(image)
    res = oracle.run_token(pr.embedding_packet(weights.embeddings, 3, frac=oracle.info.residual_frac),
                           oracle.init_state())
    assert set(res.counters) == set(ACTIVITY_COUNTERS) and res.counters[Counter.TOKENS] == 1
    assert sum(res.stream_bytes) == len(image) + pr.token_packet_bytes(CFG.hidden_size)
    assert res.output_bytes == pr.output_packet_bytes(CFG.vocab_size)
    build = BuildParams(lanes=32, channels=2, bus_bits=64)
    model = CycleModel(oracle.image, build)
    per, total = model.counters(res.per_instruction)
    for c in ACTIVITY_COUNTERS:
        if c is not Counter.NONZERO_TRITS:     # the model has no weights to count non-zero trits in
            assert total[c] == model.totals[c] == res.counters[c], c
    assert total[Counter.CYCLES] == model.totals[Counter.CYCLES] > 0
    assert total[Counter.STREAM_BEATS] == sum(res.stream_bytes) // build.beat_bytes
    timed = GoldenMachine(image, build).run_token(pr.make_token_packet(np.zeros(CFG.hidden_size)),
                                                  oracle.init_state())
    assert timed.counters == total and timed.per_instruction == per
    with pytest.raises(ImageError, match="2 channel"):
        CycleModel(oracle.image, BuildParams(channels=1))
