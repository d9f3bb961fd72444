"""The shipped model end to end: it loads, generates pinned text, and meets its held-out quality."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from host.checkpoint import load_checkpoint
from host.devices import open_device
from host.evaluate import evaluate_file
from host.generate import generate_text

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "hgrn-bit-pydoc"
HELDOUT = ROOT / "data" / "pydoc" / "heldout.txt"

# `make run` (mmfree generate --prompt "The Python interpreter" --max-new-tokens 80 --seed 0, CLI sampling
# defaults: temperature 0.8, top-k 50, top-p 0.95, repetition penalty 1.1) on the default, golden device:
# integer arithmetic end to end, so the text is the same on every machine.
PINNED_SAMPLED = (
    " can be in\nannouncement that wasn't.  The following example demonstrates the standard C\nextension"
    "s::\n\n   >>> import sys\n   >>> sys.maxsize\n   'a'\n\nFor more information about a strongly funct"
    'ional error, you can reliably detect them\nincrease anywhere on the interpreter itself or by'
)
# The same on the float reference (float32 numpy: the same text on this machine family; another libm or
# SIMD path may round a sigmoid differently and take another branch).
PINNED_SAMPLED_REFERENCE = (
    ' can be in\n      order to write Python programs or a simple browser to standard library.  The\n   '
    "   standard library will probably ignore this exception and do the same\n      system's own ``propa"
    'gate`` error.  (Note that the latter is the only affected\n      value in Python).\n\n.. _windows-p'
    'ython_exporting_interpreter:'
)
# Greedy from "def main():". The two devices part at the second token, where the reference's top two
# logits are 0.025 apart (the golden device's fixed point is within 0.2 of the reference's logits, so it
# picks the other one: docs/NUMERICS.md, the noise floor).
PINNED_GREEDY = (
    "\n            print('Close the connection')\n            print('Close the connection')\n           "
    " print('Close the connection')\n\n   (The :meth:`loop.create_connection"
)
PINNED_GREEDY_REFERENCE = (
    "\n    ...     print(elem.getvalue())\n    ...\n    >>> print(ast.dump(ast.parse('a, b, c'), indent="
    '4))\n'
)


@pytest.fixture(scope="module")
def checkpoint():
    return load_checkpoint(MODEL)


@pytest.fixture(scope="module", params=["golden", "reference"])
def device(request, checkpoint):
    dev = open_device(request.param)
    dev.load(checkpoint)
    yield dev
    dev.close()


def test_shipped_model_shape(checkpoint):
    cfg = checkpoint.config
    assert cfg.num_hidden_layers >= 4 and cfg.use_lower_bound
    assert cfg.hidden_size % 5 and cfg.hidden_size % 64
    assert 5_000_000 <= cfg.n_params <= 20_000_000
    assert checkpoint.dtype == "bfloat16"
    assert (MODEL / "model.safetensors.index.json").exists(), "the shipped model is sharded"
    assert checkpoint.tokenizer.get_vocab_size() == cfg.vocab_size
    lb = checkpoint.weights.lower_bounds
    assert lb is not None and not lb[0].any() and lb[-1].mean() > lb[1].mean()


def test_pinned_seeded_generation(checkpoint, device):
    r = generate_text(device, checkpoint.tokenizer, "The Python interpreter", max_new_tokens=80,
                      temperature=0.8, top_k=50, top_p=0.95, repetition_penalty=1.1, seed=0)
    assert r.text == (PINNED_SAMPLED if device.name == "golden" else PINNED_SAMPLED_REFERENCE)


def test_pinned_greedy_generation(checkpoint, device):
    r = generate_text(device, checkpoint.tokenizer, "def main():", max_new_tokens=40, temperature=0.0)
    assert r.text == (PINNED_GREEDY if device.name == "golden" else PINNED_GREEDY_REFERENCE)


def test_heldout_bits_per_byte_prefix(checkpoint, device):
    """A 1,024-token prefix of the held-out text; the whole file (1.360 bits/byte) runs in `make eval`."""
    r = evaluate_file(device, checkpoint.tokenizer, HELDOUT, context=512, max_tokens=1024, progress=False)
    assert r.tokens == 1024
    assert r.bits_per_byte < 2.0
    card = json.loads((MODEL / "train_log.json").read_text())
    assert card["heldout_bits_per_byte"] <= 2.0
    # a prefix is not the whole file, but the two should be close for a model that generalises
    assert abs(r.bits_per_byte - card["heldout_bits_per_byte"]) < 0.3


@pytest.mark.slow
def test_heldout_bits_per_byte_whole_file_matches_training(checkpoint, device):
    r = evaluate_file(device, checkpoint.tokenizer, HELDOUT, context=512, progress=False)
    card = json.loads((MODEL / "train_log.json").read_text())
    assert r.bytes == len(HELDOUT.read_bytes())
    assert r.bits_per_byte == pytest.approx(card["heldout_bits_per_byte"], rel=0.01)
    assert r.bits_per_byte <= 2.0


def test_make_run_command_line_prints_the_pinned_text():
    out = subprocess.run(
        [sys.executable, "-m", "host.cli", "generate", "--prompt", "The Python interpreter",
         "--max-new-tokens", "80", "--seed", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.startswith("The Python interpreter" + PINNED_SAMPLED)
    assert "tokens/s" in out.stderr


def test_decode_after_restore_matches_uninterrupted(checkpoint, device):
    tok = checkpoint.tokenizer
    ids = [1, *tok.encode("import os\nimport sys\n").ids]
    device.reset()
    device.prefill(ids[:5])
    saved = device.save_state()
    a = [device.step(t) for t in ids[5:]]
    device.restore_state(saved)
    b = [device.step(t) for t in ids[5:]]
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
