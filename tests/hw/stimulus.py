"""Whole-core stimulus for the numerics of ISA version 2, shared by the Amaranth (``tests/hw/test_top.py``),
cocotb (``sim/accelerator_tests.py``) and RTL-device (``tests/test_rtl_device.py``) tests.

* :func:`low_energy`: a token whose mean square is 1e-4 of the usual one, so that the instructions' epsilon
  terms (``InstrHeader.ssq_bias``) move the scales (``hw.numerics.ssq_with_bias``).
* :func:`tie_token`: a token whose first GEMV's quantize prologue meets products exactly half-way between two
  codes, in both signs (``hw.numerics.quantize`` rounds them away from zero).
* :func:`biased_image`: an image whose GEMVs carry random ``ssq_bias``/``ssq_bias_shift`` values of every
  magnitude (the compiler's are small), so that the statistic's sum carries between its 32-bit halves.

Every expectation still comes from the golden device; these only choose inputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from host.compiler import CompileOptions, compile_program
from host.image import assemble, parse_image
from host.model import ModelWeights
from hw import numerics as nx
from hw.isa import Buffer, InstrFlags, MicroOpcode, Opcode

__all__ = ["LOW_ENERGY_GAIN", "low_energy", "tie_token", "biased_image"]

#: Scale of a low-energy token: its mean square is ``LOW_ENERGY_GAIN**2`` = 1e-4 of the embedding's.
LOW_ENERGY_GAIN = 1e-2


def low_energy(embedding: np.ndarray, frac: int) -> np.ndarray:
    """``embedding * LOW_ENERGY_GAIN`` in the residual format (``frac`` fraction bits; int64 array)."""
    return nx.to_fixed(np.asarray(embedding, dtype=np.float64) * LOW_ENERGY_GAIN, frac)


def _solve_mul(target: int, q: int, shift: int) -> int | None:
    """An int32 ``x`` with ``hw.numerics.mul(x, q, shift) == target``, or None (``|q| > 2**shift`` may skip it)."""
    if q == 0:
        return None
    x0 = (target << shift) // q
    for x in range(x0 - 3, x0 + 4):
        if nx.INT32_MIN <= x <= nx.INT32_MAX and int(nx.mul(np.array([x]), np.array([q]), shift)[0]) == target:
            return x
    return None


def tie_token(image: bytes, x: np.ndarray, *, negative: int = 3) -> np.ndarray:
    """``x`` (the residual-format token, shape [H]) with a few channels changed so that the first GEMV's
    quantize prologue meets ties: its absmax ``A`` becomes a power of two ``2**a`` (then ``quant_recip`` gives
    ``r_mant = 127 * 2**18``, ``r_shift = a + 18``), one channel's ``w = mul(x, QC, q_shift)`` is ``+A/2`` and
    up to ``negative`` channels' (at least one) are ``-A/2``: codes exactly +-63.5 (64 and -64; half up
    would give -63 for the negative ones).

    The first GEMV must read X with ``QCONST`` and take its absmax from LOAD_TOKEN's AMAX with the same
    constant vector and shift (the compiler's program); checked.

    Returns
    -------
    ndarray, shape [H], int64
    """
    pi = parse_image(image)
    load, gemv = pi.instructions[0], next(i for i in pi.instructions if i.opcode is Opcode.GEMV)
    assert load.opcode is Opcode.LOAD_TOKEN and gemv.src is Buffer.X and InstrFlags.QCONST in gemv.flags
    amax_op = next(o for o in load.ops if o.op is MicroOpcode.AMAX and o.reg == gemv.amax_reg)
    assert np.array_equal(load.consts[amax_op.buf.value - Buffer.C0.value], gemv.qconst)
    assert amax_op.shift == gemv.q_shift
    qc, s = np.asarray(gemv.qconst, np.int64), gemv.q_shift
    x = np.array(x, dtype=np.int64)
    w = nx.mul(x, qc, s)
    a = max(int(np.abs(w).max()), 4).bit_length()          # 2**a > max|w|: the other channels stay below it
    wanted = [1 << a, -(1 << (a - 1)), 1 << (a - 1)] + [-(1 << (a - 1))] * (negative - 1)
    # channels with the smallest |QC| first: mul's steps are finest there, so every value is reachable
    for j in np.argsort(np.where(qc == 0, np.iinfo(np.int64).max, np.abs(qc)), kind="stable"):
        for t in wanted:
            xj = _solve_mul(t, int(qc[j]), s)
            if xj is not None:
                x[j] = xj
                wanted.remove(t)
                break
        if not wanted:
            break
    # the ties, as the golden device will meet them
    w = nx.mul(x, qc, s)
    amax = int(np.abs(w).max())
    r_mant, r_shift = nx.quant_recip(amax)
    assert amax == 1 << a and r_mant == 127 << 18, "no channel reaches the absmax 2**a"
    p = w.astype(object) * r_mant
    ties = [v for v in p if v % (1 << r_shift) == 1 << (r_shift - 1)]
    assert any(v < 0 for v in ties), "no channel reaches -A/2"
    return x


def biased_image(weights: ModelWeights, options: CompileOptions, seed: int) -> bytes:
    """The image of ``weights`` with every quantizing GEMV's ``ssq_bias`` and ``ssq_bias_shift`` replaced by
    random values: a 32-bit bias shifted by 0..8 (comparable to the registers of a tiny model), by 9..30, or
    by 31 (the largest, ``~2**63``), so the statistic's sum carries between its halves and the scales differ
    from the compiler's."""
    rng = np.random.default_rng(seed)
    cfg = weights.config
    fm = options.formats
    assert fm is not None, "calibrate first: options.formats"
    prog = compile_program(weights, options)
    quantizing = [j for j, ins in enumerate(prog)
                  if ins.opcode is Opcode.GEMV and InstrFlags.REUSE_CODES not in ins.flags]
    for n, j in enumerate(quantizing):
        shift = (int(rng.integers(0, 9)), int(rng.integers(9, 31)), 31)[n % 3]
        prog[j] = dataclasses.replace(prog[j], ssq_bias=int(rng.integers(0, 1 << 32)), ssq_bias_shift=shift)
    return assemble(prog, packing=options.packing, channels=options.channels, n_layers=cfg.num_hidden_layers,
                    hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
                    residual_frac=fm.residual, state_frac=fm.state, gate_frac=nx.GATE_FRAC,
                    lut_segments_log2=options.lut_segments_log2)
