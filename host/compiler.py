"""Compiler: quantized HGRN-Bit weights -> GEMV + epilogue program -> model image bytes.

Every BitLinear becomes one ternary GEMV whose epilogue program runs on each output element while it is
on chip (the CODA GEMM-plus-epilogue abstraction, docs/ARCHITECTURE.md section 3). The algebra that makes it work
(docs/ARCHITECTURE.md section 2, facts 1-3):

* Absmax codes ignore a positive per-vector scale, so a BitLinear fed by ``RMSNorm(x) * gamma_b`` needs
  only the codes of ``x * gamma_b * gamma_own`` and, for its output scale, the absmax of that product
  and the sum of squares of ``x * gamma_b``: the block norm's ``rstd`` cancels and is never computed.
* The output gate's ``RMSNorm(g)`` is a positive scalar on ``o`` and cancels in ``o_proj``'s own norm
  the same way, so the g_proj epilogue forms ``p = g * gamma_g * SiLU(h)`` directly.
* The reductions each BitLinear needs are produced by the epilogue of the instruction that writes its
  input (sum of squares into one reduction register, one absmax per consumer), so the quantize
  prologue (the barrier) only re-reads the on-chip vector.

Program of one layer (``R0..R7`` reduction registers; ``Q.f`` formats of :mod:`hw.numerics`)::

    i_proj  GEMV X -> SILU -> A                                   codes: X*g_attn*g_i,   A=R1 SSQ=R0
    f_proj  GEMV X -> sigma(-f)*(1-lb) = 1-f, f; h = f*h_old + (1-f)*A -> STATE_NEW   A=R2 SSQ=R0
    g_proj  GEMV X -> p = g*g_gnorm*SiLU(h) -> P; SSQ(p)->R4, AMAX(p*g_o)->R5        A=R3 SSQ=R0
    o_proj  GEMV P -> X += o; SSQ(X*g_mlp)->R6, AMAX(X*g_mlp*g_gate)->R7            A=R5 SSQ=R4
    gate_a  GEMV X -> SILU -> A                        (rows 0..I-1 of gate_proj)   A=R7 SSQ=R6
    gate_b  GEMV X -> m = A*b -> P; SSQ(m)->R4, AMAX(m*g_down)->R5   (rows I..2I-1, codes reused)
    down    GEMV P -> X += d; SSQ(X*g_attn')->R0, AMAX(X*g_attn'*g_{i,f,g}')->R1..R3 A=R5 SSQ=R4

``LOAD_TOKEN`` stores the token's embedding into X with the first layer's reductions; the LM head is a
GEMV with ARGMAX and OUT of the raw accumulators; ``END_TOKEN`` commits the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from host.image import Instruction, MicroOpSpec, assemble
from host.model import BitLinearWeights, ModelWeights
from hw import isa
from hw import numerics as nx
from hw.isa import Buffer, InstrFlags, MicroOpcode, Opcode, TritPacking

__all__ = ["CompileOptions", "Formats", "LayerFormats", "calibrate", "frac_for", "compile_program",
           "compile_model", "OUTPUT_GATES"]

OUTPUT_GATES = ("released", "paper")
M = MicroOpcode
R0, R1, R2, R3, R4, R5, R6, R7 = range(8)


MIN_FRAC, MAX_FRAC = 8, 28
HEADROOM_BITS = 3  # random-token calibration must also cover real text (bench_numerics: the GLU product of
#                   layer 3 of the shipped model reached 1.07x its 2-bit-headroom range on held-out text)


def frac_for(maxabs: float, headroom_bits: int = HEADROOM_BITS) -> int:
    """Fraction bits of an int32 format for values up to ``maxabs``, keeping ``headroom_bits`` spare
    (``2**(31 - frac) > maxabs * 2**headroom_bits``), clamped to [8, 28]."""
    if not (maxabs > 0 and math.isfinite(maxabs)):
        return MAX_FRAC
    return max(MIN_FRAC, min(MAX_FRAC, 31 - headroom_bits - max(1, math.ceil(math.log2(maxabs) + 1e-12)) - 0))


@dataclass(frozen=True)
class LayerFormats:
    """Fraction bits of one layer's epilogue values (dequantized outputs and stored vectors)."""

    i: int      #: i_proj output and SiLU(i) (buffer A)
    f: int      #: f_proj output (sigmoid input)
    g: int      #: g_proj output
    p: int      #: o_proj input (buffer P)
    gate: int   #: gate_proj outputs and SiLU(a) (buffer A)
    m: int      #: GLU product (buffer P)


@dataclass(frozen=True)
class Formats:
    """Every fixed-point format of an image: the residual (and token packets), the recurrent state, and
    per-layer epilogue values. :func:`calibrate` chooses them from a float reference run."""

    residual: int
    state: int
    layers: tuple[LayerFormats, ...]

    @classmethod
    def uniform(cls, n_layers: int, residual: int = nx.RESIDUAL_FRAC, state: int = nx.STATE_FRAC) -> Formats:
        lf = LayerFormats(residual, residual, residual, residual, residual, residual)
        return cls(residual, state, (lf,) * n_layers)


def calibrate(weights: ModelWeights, token_ids=None, *, n_tokens: int = 64, seed: int = 0,
              output_gate: str = "released", headroom_bits: int = HEADROOM_BITS) -> Formats:
    """Choose every format from the float reference's value ranges on calibration tokens.

    Each vector gets :func:`frac_for` of the largest magnitude it (and every product the hardware forms
    from it, such as ``x * gamma_b * gamma_own`` for an absmax) reached; int32 saturation is the safety
    net beyond the headroom.

    Parameters
    ----------
    weights : ModelWeights
    token_ids : sequence of int, optional
        Calibration text; default ``n_tokens`` random tokens (``seed``).
    """
    from host.reference import ReferenceModel

    cfg = weights.config
    if token_ids is None:
        token_ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, n_tokens)
    trace: dict = {}
    ReferenceModel(weights, output_gate=output_gate).forward(np.asarray(token_ids), trace=trace)

    def mx(v) -> float:
        return float(np.max(np.abs(v))) if np.size(v) else 0.0

    x_max = mx(weights.embeddings[np.asarray(token_ids)])
    h_max = 0.0
    layers = []
    for li, lw in enumerate(weights.layers):
        x_in = weights.embeddings[np.asarray(token_ids)] if li == 0 else trace["x"][li - 1]
        ga = lw.attn_norm
        x_max = max(x_max, mx(trace["x"][li]),
                    *(mx(x_in * ga * bl.norm) for bl in (lw.i_proj, lw.f_proj, lw.g_proj)),
                    mx(trace["x"][li] * lw.mlp_norm * lw.gate_proj.norm), mx(x_in * ga))
        h_max = max(h_max, mx(trace["h"][li]))
        p = trace["p"][li]
        layers.append(LayerFormats(
            i=frac_for(max(mx(trace["i"][li]), 1.0), headroom_bits),
            f=frac_for(max(mx(trace["f"][li]), 1.0), headroom_bits),
            g=frac_for(max(mx(trace["g"][li]), 1.0), headroom_bits),
            p=frac_for(max(mx(p), mx(p * lw.o_proj.norm)), headroom_bits),
            gate=frac_for(max(mx(trace["gate"][li]), 1.0), headroom_bits),
            m=frac_for(max(mx(trace["m"][li]), mx(trace["m"][li] * lw.down_proj.norm)), headroom_bits)))
    x_max = max(x_max, mx(trace["x"][-1] * weights.norm * weights.lm_head.norm)) if layers else x_max
    return Formats(residual=frac_for(x_max, headroom_bits), state=frac_for(max(h_max, 1.0), headroom_bits),
                   layers=tuple(layers))


@dataclass(frozen=True)
class CompileOptions:
    """Image build options.

    Attributes
    ----------
    packing : TritPacking
        ``BASE3`` (1.6 bits per trit, default) or ``BITS2``.
    channels : int
        Weight channels the rows are split over (must match the accelerator build).
    formats : Formats or None
        Fixed-point formats; None (default) calibrates them per model (:func:`calibrate`).
    lut_segments_log2 : int
        Sigmoid LUT resolution (:mod:`hw.numerics`); the default is the measured choice.
    output_gate : {"released", "paper"}
        ``RMSNorm(g) gamma * SiLU(h)`` (released code) or ``sigmoid(g) * h`` (the paper's eq. 6).
    """

    packing: TritPacking = TritPacking.BASE3
    channels: int = 1
    formats: Formats | None = None
    lut_segments_log2: int = nx.LUT_SEGMENTS_LOG2
    output_gate: str = "released"

    def __post_init__(self):
        object.__setattr__(self, "packing", TritPacking(self.packing))
        if not 1 <= self.channels <= 16:
            raise ValueError(f"channels must be in 1..16, got {self.channels}")
        if self.output_gate not in OUTPUT_GATES:
            raise ValueError(f"output_gate must be one of {OUTPUT_GATES}, got {self.output_gate!r}")
        if not 6 <= self.lut_segments_log2 <= 14:
            raise ValueError(f"lut_segments_log2 must be in 6..14, got {self.lut_segments_log2}")


def _op(op: MicroOpcode, **kw) -> MicroOpSpec:
    return MicroOpSpec(op=op, **kw)


def _cb(bl: BitLinearWeights) -> tuple[int, int]:
    """``Cb = beta * sqrt(K) / 127`` as a 24-bit mantissa and shift."""
    return nx.float_mant_shift(float(bl.scale) * math.sqrt(bl.in_features) / 127.0, 24)


class _Consts:
    """Block-floating-point constant vectors, memoized so producer and consumer use identical words."""

    def __init__(self):
        self._cache: dict[bytes, tuple[np.ndarray, int]] = {}

    def __call__(self, v: np.ndarray) -> tuple[np.ndarray, int]:
        v = np.asarray(v, dtype=np.float32)
        key = v.tobytes()
        if key not in self._cache:
            self._cache[key] = nx.block_float(v)
        return self._cache[key]


def _reductions(consts: _Consts, block_gamma: np.ndarray, consumers: list[np.ndarray], ssq_reg: int,
                amax_regs: list[int], first_const: int = 0) -> tuple[list[MicroOpSpec], list[np.ndarray]]:
    """SSQ of ``x * block_gamma`` and AMAX of ``x * block_gamma * gamma_c`` for each consumer."""
    ops, vecs = [], []
    mant, frac = consts(block_gamma)
    vecs.append(mant)
    ops.append(_op(M.SSQ, a=0, buf=Buffer(Buffer.C0.value + first_const), shift=frac, reg=ssq_reg))
    for j, (g, reg) in enumerate(zip(consumers, amax_regs, strict=True)):
        mant, frac = consts(block_gamma * g)
        vecs.append(mant)
        ops.append(_op(M.AMAX, a=0, buf=Buffer(Buffer.C0.value + first_const + 1 + j), shift=frac, reg=reg))
    return ops, vecs


def compile_program(weights: ModelWeights, options: CompileOptions = CompileOptions(),
                    formats: Formats | None = None) -> list[Instruction]:
    """The whole per-token program of a model (one instruction per GEMV, plus LOAD_TOKEN and END_TOKEN).

    Parameters
    ----------
    weights : ModelWeights
    options : CompileOptions
    formats : Formats, optional
        Overrides ``options.formats``; None with ``options.formats`` None calibrates (:func:`calibrate`).

    Returns
    -------
    list of Instruction, each with ``name`` set (e.g. ``"layers.0.attn.f_proj"``).
    """
    cfg = weights.config
    fm = formats or options.formats or calibrate(weights, output_gate=options.output_gate)
    if len(fm.layers) != cfg.num_hidden_layers:
        raise ValueError(f"formats cover {len(fm.layers)} layers, the model has {cfg.num_hidden_layers}")
    X, S, G = fm.residual, fm.state, nx.GATE_FRAC
    inter = cfg.intermediate_size
    consts = _Consts()
    prog: list[Instruction] = []

    def next_reductions(idx: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """Block gamma and consuming BitLinears of the vector X after layer ``idx - 1``."""
        if idx < cfg.num_hidden_layers:
            lw = weights.layers[idx]
            return lw.attn_norm, [lw.i_proj.norm, lw.f_proj.norm, lw.g_proj.norm]
        return weights.norm, [weights.lm_head.norm]

    def gemv(name: str, layer: int, bl: BitLinearWeights, rows: slice | None, src: Buffer, block_gamma,
             amax_reg: int, ssq_reg: int, out_frac: int, ops: list[MicroOpSpec], cvecs: list[np.ndarray],
             flags: InstrFlags | None = None, reuse: bool = False) -> Instruction:
        trits = bl.trits if rows is None else bl.trits[rows]
        cb_mant, cb_shift = _cb(bl)
        ins = Instruction(opcode=Opcode.GEMV, name=name, layer=layer, n=trits.shape[0], k=trits.shape[1],
                          src=src, amax_reg=amax_reg, ssq_reg=ssq_reg, cb_mant=cb_mant, cb_shift=cb_shift,
                          out_frac=out_frac, ops=ops, consts=cvecs, trits=np.ascontiguousarray(trits),
                          flags=flags or InstrFlags(0))
        if reuse:
            ins.flags |= InstrFlags.REUSE_CODES
        else:
            qmant, qfrac = consts(bl.norm if block_gamma is None else block_gamma * bl.norm)
            ins.qconst, ins.q_shift = qmant, qfrac
            ins.flags |= InstrFlags.QCONST
        return ins

    # LOAD_TOKEN: X = embedding, first layer's reductions
    bg, cons = next_reductions(0)
    red_ops, red_vecs = _reductions(consts, bg, cons, R0, [R1, R2, R3][: len(cons)])
    prog.append(Instruction(opcode=Opcode.LOAD_TOKEN, name="load_token", n=cfg.hidden_size, out_frac=X,
                            ops=[_op(M.ST, a=0, buf=Buffer.X), *red_ops], consts=red_vecs))

    for li, lw in enumerate(weights.layers):
        pre, lf = f"layers.{li}", fm.layers[li]
        ga = lw.attn_norm
        # i_proj: A = SiLU(i)                                                          (Q.i)
        prog.append(gemv(f"{pre}.attn.i_proj", li, lw.i_proj, None, Buffer.X, ga, R1, R0, lf.i,
                         [_op(M.SILU, dst=0, a=0, shift=lf.i), _op(M.ST, a=0, buf=Buffer.A)], []))
        # f_proj: 1 - f = (1 - lb) sigmoid(-f_hat); f = 1 - (1 - f); h = f h_old + (1 - f) SiLU(i)
        omlb = nx.to_fixed(1.0 - weights.lower_bound(li).astype(np.float64), G)
        prog.append(gemv(f"{pre}.attn.f_proj", li, lw.f_proj, None, Buffer.X, ga, R2, R0, lf.f, [
            _op(M.SIGNEG, dst=1, a=0, shift=lf.f),                       # r1 = sigma(-f_hat)   Q.G
            _op(M.MULV, dst=1, a=1, buf=Buffer.C0, shift=G),             # r1 = 1 - f           Q.G
            _op(M.RSUB1, dst=2, a=1, shift=G),                           # r2 = f               Q.G
            _op(M.MULV, dst=3, a=1, buf=Buffer.A, shift=lf.i + G - S),   # r3 = (1 - f) SiLU(i) Q.S
            _op(M.MULV, dst=1, a=2, buf=Buffer.STATE_OLD, shift=G),      # r1 = f h_old         Q.S
            _op(M.ADD, dst=1, a=1, b=3),                                 # r1 = h               Q.S
            _op(M.ST, a=1, buf=Buffer.STATE_NEW),
        ], [omlb]))
        # g_proj: P = p, the o_proj input; its reductions for o_proj                    (Q.p)
        go_m, go_f = consts(lw.o_proj.norm)
        if options.output_gate == "released":
            gg_m, gg_f = consts(lw.g_norm)
            gops = [
                _op(M.LD, dst=1, buf=Buffer.STATE_NEW),                      # r1 = h           Q.S
                _op(M.SILU, dst=1, a=1, shift=S),                            # r1 = SiLU(h)     Q.S
                _op(M.MULV, dst=0, a=0, buf=Buffer.C0, shift=gg_f + lf.g - lf.p),  # g gamma_g  Q.p
                _op(M.MUL, dst=0, a=0, b=1, shift=S),                        # r0 = p           Q.p
            ]
            gvecs = [gg_m, go_m]
        else:
            gops = [
                _op(M.SIG, dst=0, a=0, shift=lf.g),                          # r0 = sigma(g)    Q.G
                _op(M.MULV, dst=0, a=0, buf=Buffer.STATE_NEW, shift=G + S - lf.p),  # p = sigma(g) h Q.p
            ]
            gvecs = [go_m]
        gops += [_op(M.ST, a=0, buf=Buffer.P), _op(M.SSQ, a=0, buf=Buffer.NONE, reg=R4),
                 _op(M.AMAX, a=0, buf=Buffer(Buffer.C0.value + len(gvecs) - 1), shift=go_f, reg=R5)]
        prog.append(gemv(f"{pre}.attn.g_proj", li, lw.g_proj, None, Buffer.X, ga, R3, R0, lf.g, gops, gvecs))
        # o_proj: X += o; reductions for gate_proj                                      (Q.X)
        red_ops, red_vecs = _reductions(consts, lw.mlp_norm, [lw.gate_proj.norm], R6, [R7])
        prog.append(gemv(f"{pre}.attn.o_proj", li, lw.o_proj, None, Buffer.P, None, R5, R4, X,
                         [_op(M.ADDV, dst=0, a=0, buf=Buffer.X), _op(M.ST, a=0, buf=Buffer.X), *red_ops],
                         red_vecs))
        # gate_proj in two halves: A = SiLU(a); P = m = A * b with down_proj's reductions (Q.gate, Q.m)
        gm = lw.mlp_norm
        prog.append(gemv(f"{pre}.mlp.gate_proj[:I]", li, lw.gate_proj, slice(0, inter), Buffer.X, gm, R7, R6,
                         lf.gate, [_op(M.SILU, dst=0, a=0, shift=lf.gate), _op(M.ST, a=0, buf=Buffer.A)], []))
        gd_m, gd_f = consts(lw.down_proj.norm)
        prog.append(gemv(f"{pre}.mlp.gate_proj[I:]", li, lw.gate_proj, slice(inter, 2 * inter), Buffer.X, gm,
                         R7, R6, lf.gate, [
                             _op(M.MULV, dst=0, a=0, buf=Buffer.A, shift=2 * lf.gate - lf.m),  # m    Q.m
                             _op(M.ST, a=0, buf=Buffer.P),
                             _op(M.SSQ, a=0, buf=Buffer.NONE, reg=R4),
                             _op(M.AMAX, a=0, buf=Buffer.C0, shift=gd_f, reg=R5),
                         ], [gd_m], reuse=True))
        # down_proj: X += d; reductions for the next layer (or the final norm and LM head)  (Q.X)
        bg, cons = next_reductions(li + 1)
        red_ops, red_vecs = _reductions(consts, bg, cons, R0, [R1, R2, R3][: len(cons)])
        prog.append(gemv(f"{pre}.mlp.down_proj", li, lw.down_proj, None, Buffer.P, None, R5, R4, X,
                         [_op(M.ADDV, dst=0, a=0, buf=Buffer.X), _op(M.ST, a=0, buf=Buffer.X), *red_ops],
                         red_vecs))

    prog.append(gemv("lm_head", 0, weights.lm_head, None, Buffer.X, weights.norm, R1, R0, X,
                     [_op(M.ARGMAX, a=1), _op(M.OUT, a=1)], [], flags=InstrFlags.LOGITS))
    prog.append(Instruction(opcode=Opcode.END_TOKEN, name="end_token"))
    for ins in prog:
        for op in ins.ops:
            if not 0 <= op.shift <= 62:
                raise ValueError(f"{ins.name}: {op.op.name} needs a shift of {op.shift}; the formats are "
                                 "inconsistent (see host.compiler.calibrate)")
    return prog


def compile_model(weights: ModelWeights, options: CompileOptions = CompileOptions()) -> bytes:
    """Compile a model into image bytes (deterministic: same weights and options, same bytes)."""
    cfg = weights.config
    if cfg.hidden_size > isa.MAX_HIDDEN or cfg.intermediate_size > isa.MAX_INTERMEDIATE or \
            cfg.num_hidden_layers > isa.MAX_LAYERS or cfg.vocab_size > isa.MAX_VOCAB:
        raise ValueError(f"model shape (hidden {cfg.hidden_size}, intermediate {cfg.intermediate_size}, "
                         f"{cfg.num_hidden_layers} layers, vocab {cfg.vocab_size}) exceeds the ISA limits")
    fm = options.formats or calibrate(weights, output_gate=options.output_gate)
    prog = compile_program(weights, options, fm)
    return assemble(prog, packing=options.packing, channels=options.channels, n_layers=cfg.num_hidden_layers,
                    hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
                    residual_frac=fm.residual, state_frac=fm.state, gate_frac=nx.GATE_FRAC,
                    lut_segments_log2=options.lut_segments_log2)
