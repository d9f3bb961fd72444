"""bench/bench_rtl.py's helpers that need no Verilator build (the benchmark itself runs in bench/)."""

import pytest

from bench.bench_rtl import _instruction_bytes, main
from host.compiler import CompileOptions, compile_model
from host.image import parse_image
from host.model import HGRNBitConfig, random_weights
from host.perf import instruction_bytes


@pytest.mark.parametrize("channels", [1, 4])
def test_instruction_bytes_match_the_cycle_models(channels):
    """The layer efficiency's bytes (image offsets) are the cycle model's per-instruction bytes."""
    w = random_weights(HGRNBitConfig(vocab_size=37, hidden_size=40, num_hidden_layers=2, intermediate_size=72),
                       seed=3)
    image = parse_image(compile_model(w, CompileOptions(channels=channels)))
    got = _instruction_bytes(image)
    assert got == [instruction_bytes(i, image.info.packing, channels) for i in image.instructions]
    assert sum(got) == len(image.raw) - image.instructions[0].offset


def test_unknown_layer_build_is_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["--layer-370m", "--builds", "128x2x64"])
    assert "unknown build '128x2x64'" in capsys.readouterr().err
