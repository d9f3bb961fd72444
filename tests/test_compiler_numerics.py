"""The compiler's numerics: the RMSNorm epsilons as the released code has them, and refusals of tensors the
formats cannot hold (docs/NUMERICS.md, "Epsilons")."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from host.compiler import CompileOptions, Formats, check_weights, compile_model, compile_program, ssq_bias
from host.devices.golden import GoldenDevice
from host.model import HGRNBitConfig, random_weights
from host.reference import ReferenceModel
from hw import numerics as nx
from hw.isa import MicroOpcode, Opcode

CFG = HGRNBitConfig(vocab_size=61, hidden_size=40, num_hidden_layers=2, intermediate_size=56)


def _low_energy(weights, scale: float):
    """The same model with every block and gate norm's gamma times ``scale``: each BitLinear then sees an input
    of mean square about ``scale**2`` (the norms' outputs have unit root mean square before gamma)."""
    for lw in weights.layers:
        for v in (lw.attn_norm, lw.mlp_norm, lw.g_norm):
            v *= np.float32(scale)
    weights.norm *= np.float32(scale)
    return weights


def _logits(dev_or_ref, ids):
    if isinstance(dev_or_ref, ReferenceModel):
        return dev_or_ref.forward(ids)[0]
    dev_or_ref.reset()
    return np.stack([dev_or_ref.step(int(t)) for t in ids])


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.std(b))


def test_ssq_bias_is_the_constant_in_register_units():
    # K eps 2**(2 frac - 16): 4096 * 1e-6 * 2**24 = 68719.47 -> 68719, no shift
    assert ssq_bias(1e-6, 4096, 20, "t") == (68719, 0)
    # large: rounded to a 32-bit mantissa with a shift, within half an LSB of the mantissa
    mant, shift = ssq_bias(1e-6, 8192, 28, "t")
    exact = 1e-6 * 8192 * 2.0 ** 40
    assert mant < 1 << 32 and shift == 2 and abs((mant << shift) - exact) <= 2 ** (shift - 1) + 1
    assert nx.ssq_with_bias(2 ** 64 - 5, mant, shift) == 2 ** 64 - 1  # saturates
    with pytest.raises(ValueError, match="does not fit ssq_bias"):
        ssq_bias(0.5, 8192, 60, "model.layers.0.attn.i_proj")


def test_eps_reaches_the_golden_device_on_low_energy_vectors():
    """With BitLinear inputs of mean square about 1e-5 (gammas of 3e-3 after the norms: real layers reach
    1e-4), the BitLinear eps changes the logits by far more than the formats' error: the golden device
    follows the reference with the model's eps, not one without it."""
    w = _low_energy(random_weights(CFG, seed=5, gamma_spread=1.0), 3e-3)
    no_eps = dataclasses.replace(w, config=dataclasses.replace(CFG, bitlinear_norm_eps=1e-30))
    ids = np.random.default_rng(1).integers(0, CFG.vocab_size, 6)
    ref = _logits(ReferenceModel(w), ids)
    ref_no_eps = _logits(ReferenceModel(no_eps), ids)
    gold = GoldenDevice()
    gold.load(w)
    got = _logits(gold, ids)
    effect = _rel(ref_no_eps, ref)
    assert effect > 0.05, "the test vectors must be low-energy enough for eps to matter"
    assert _rel(got, ref) < effect / 5, (_rel(got, ref), effect)


def test_model_eps_is_compiled_into_constants_and_bias():
    w = random_weights(CFG, seed=2)
    prog_a = compile_program(w, CompileOptions())
    w_b = dataclasses.replace(w, config=dataclasses.replace(CFG, bitlinear_norm_eps=1e-4))
    prog_b = compile_program(w_b, CompileOptions())
    down_a = next(i for i in prog_a if i.name.endswith("down_proj"))
    down_b = next(i for i in prog_b if i.name.endswith("down_proj"))
    # down_proj's input has no norm: its bias is K eps in the register's units
    assert (down_b.ssq_bias << down_b.ssq_bias_shift) > 50 * (down_a.ssq_bias << down_a.ssq_bias_shift) > 0
    # the writers' SSQ constants are sqrt(gamma_b**2 + eps): they differ
    assert not np.array_equal(prog_a[0].consts[0], prog_b[0].consts[0])
    # the released output gate adds eps * g**2 to o_proj's statistic: two SSQ into one register
    g = next(i for i in prog_a if i.name.endswith("g_proj"))
    regs = [op.reg for op in g.ops if op.op is MicroOpcode.SSQ]
    assert len(regs) == 2 and regs[0] == regs[1]
    assert all(i.ssq_bias_shift == 0 for i in prog_a if i.opcode is Opcode.GEMV)


@pytest.mark.parametrize("where, value", [
    ("model.layers.1.attn_norm.weight", 3e38),
    ("model.layers.0.mlp.down_proj.norm.weight", float("inf")),
    ("model.norm.weight", 2.0 ** 31),
])
def test_absurd_norm_weights_are_refused_by_name(where, value):
    w = random_weights(CFG, seed=3)
    if where == "model.norm.weight":
        w.norm[7] = value
    elif "down_proj" in where:
        w.layers[0].down_proj.norm[3] = value
    else:
        w.layers[1].attn_norm[0] = value
    with pytest.raises(ValueError, match=rf"{where.replace('.', '[.]')}: value") as err:
        compile_model(w)
    assert "e+" in str(err.value) or "inf" in str(err.value)


def test_products_of_norms_that_overflow_are_refused_by_name():
    w = random_weights(CFG, seed=3)
    w.layers[0].attn_norm[5] = 1e5
    w.layers[0].f_proj.norm[5] = 1e5  # each fits, the product 1e10 does not
    with pytest.raises(ValueError, match=r"model[.]layers[.]0[.]attn_norm[.]weight \* "
                                         r"model[.]layers[.]0[.]attn[.]f_proj[.]norm[.]weight: value 1e\+10"):
        compile_program(w, CompileOptions(formats=Formats.uniform(CFG.num_hidden_layers)))


def test_absurd_weight_scale_is_refused_by_name():
    w = random_weights(CFG, seed=3)
    w.layers[1].o_proj.scale = np.float32(3e38)
    with pytest.raises(ValueError, match=r"model[.]layers[.]1[.]attn[.]o_proj[.]weight: weight scale beta"):
        check_weights(w)


def test_values_beyond_every_format_are_refused_in_calibration():
    w = random_weights(CFG, seed=3)
    w = dataclasses.replace(w, embeddings=(w.embeddings * 1e7).astype(np.float32))
    with pytest.raises(ValueError, match="model.embeddings.weight|calibration"):
        compile_model(w)


def test_shipped_scale_relation():
    """Cb is sqrt(K) / 127 / s_w with the released s_w = fl32(1 / beta)."""
    w = random_weights(CFG, seed=4)
    prog = compile_program(w, CompileOptions())
    ins = next(i for i in prog if i.name == "layers.0.attn.i_proj")
    bl = w.layers[0].i_proj
    cb = ins.cb_mant * 2.0 ** -ins.cb_shift
    assert cb == pytest.approx(math.sqrt(CFG.hidden_size) / 127.0 / float(np.float32(1) / bl.scale), rel=2 ** -23)
