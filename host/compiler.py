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
* The epsilons (BitLinear's own ``eps_o``, 1e-6, and the block norm's ``eps_b``) keep the norms from
  cancelling exactly: the scale needs ``sqrt(S + eps_o (M + eps_b))`` with ``S = mean((x gamma_b)**2)`` and
  ``M = mean(x**2)`` (docs/NUMERICS.md, "Epsilons"). ``S + eps_o M = mean(x**2 (gamma_b**2 + eps_o))``, so
  the writer's SSQ constant is ``sqrt(gamma_b**2 + eps_o)`` instead of ``gamma_b``; the output gate's
  ``M = mean(g**2)`` is one more SSQ (of ``g sqrt(eps_o)``) into the same register; the constant part
  (``K eps_o eps_b``, or ``K eps_o`` for down_proj, whose input has no norm) is the instruction's
  ``ssq_bias``.

Program of one layer (``R0..R7`` reduction registers; ``Q.f`` formats of :mod:`hw.numerics`)::

    i_proj  GEMV X -> SILU -> A                                   codes: X*g_attn*g_i,   A=R1 SSQ=R0
    f_proj  GEMV X -> sigma(-f)*(1-lb) = 1-f, f; h = f*h_old + (1-f)*A -> STATE_NEW   A=R2 SSQ=R0
    g_proj  GEMV X -> p = g*g_gnorm*SiLU(h) -> P; SSQ(p)->R4, AMAX(p*g_o)->R5        A=R3 SSQ=R0
    o_proj  GEMV P -> X += o; SSQ(X*g_mlp~)->R6, AMAX(X*g_mlp*g_gate)->R7           A=R5 SSQ=R4
    gate_a  GEMV X -> SILU -> A                        (rows 0..I-1 of gate_proj)   A=R7 SSQ=R6
    gate_b  GEMV X -> m = A*b -> P; SSQ(m)->R4, AMAX(m*g_down)->R5   (rows I..2I-1, codes reused)
    down    GEMV P -> X += d; SSQ(X*g_attn'~)->R0, AMAX(X*g_attn'*g_{i,f,g}')->R1..R3 A=R5 SSQ=R4

(``g~ = sqrt(g**2 + eps_o)``; g_proj's SSQ into R4 also takes ``g sqrt(eps_o)``, before the gate.)

``LOAD_TOKEN`` stores the token's embedding into X with the first layer's reductions; the LM head is a
GEMV with ARGMAX and OUT of the raw accumulators; ``END_TOKEN`` commits the state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from host.image import Instruction, MicroOpSpec, assemble, channel_block_bytes, const_section_bytes
from host.model import BitLinearWeights, HGRNBitConfig, LayerWeights, ModelWeights
from hw import isa
from hw import numerics as nx
from hw.isa import Buffer, InstrFlags, MicroOpcode, Opcode, TritPacking

__all__ = ["CompileOptions", "Formats", "LayerFormats", "calibrate", "check_weights", "frac_for", "ssq_bias",
           "compile_program", "compile_model", "OUTPUT_GATES", "CONST_MAX", "InstrPlan", "ProgramPlan",
           "shape_weights", "plan_instructions", "plan_model", "plan_shape"]

OUTPUT_GATES = ("released", "paper")
M = MicroOpcode
R0, R1, R2, R3, R4, R5, R6, R7 = range(8)


MIN_FRAC, MAX_FRAC = 8, 28
HEADROOM_BITS = 3  # random-token calibration must also cover real text (docs/NUMERICS.md section 2: with 2 bits a
#                   GLU product of the first shipped model saturated on held-out text; the retrained one uses 0.85
#                   of a 2-bit range, 0.43 of the 3-bit one)


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

    check_weights(weights)
    cfg = weights.config
    if token_ids is None:
        token_ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, n_tokens)
    trace: dict = {}
    with np.errstate(over="raise", invalid="raise"):
        try:
            ReferenceModel(weights, output_gate=output_gate).forward(np.asarray(token_ids), trace=trace)
        except FloatingPointError as e:
            raise ValueError(f"calibration: the float reference overflows float32 on this model ({e}); "
                             "its norms or weight scales are out of any usable range") from None

    def mx(v) -> float:
        return float(np.max(np.abs(v))) if np.size(v) else 0.0

    def fmt(name: str, maxabs: float) -> int:
        """:func:`frac_for`, refusing values that no int32 format with >= MIN_FRAC fraction bits holds."""
        if not math.isfinite(maxabs) or maxabs >= 2.0 ** (31 - MIN_FRAC):
            raise ValueError(f"calibration: {name} reaches {maxabs:.6g}, beyond the widest format "
                             f"(int32 with {MIN_FRAC} fraction bits holds |v| < {2.0 ** (31 - MIN_FRAC):.6g})")
        return frac_for(maxabs, headroom_bits)

    eps = float(cfg.bitlinear_norm_eps)
    x_max = mx(weights.embeddings[np.asarray(token_ids)])
    h_max = 0.0
    layers = []
    for li, lw in enumerate(weights.layers):
        x_in = weights.embeddings[np.asarray(token_ids)] if li == 0 else trace["x"][li - 1]
        ga = lw.attn_norm
        x_max = max(x_max, mx(trace["x"][li]),
                    *(mx(x_in * ga * bl.norm) for bl in (lw.i_proj, lw.f_proj, lw.g_proj)),
                    mx(trace["x"][li] * lw.mlp_norm * lw.gate_proj.norm), mx(x_in * np.sqrt(ga * ga + eps)))
        h_max = max(h_max, mx(trace["h"][li]))
        p = trace["p"][li]
        pre = f"model.layers.{li}"
        layers.append(LayerFormats(
            i=fmt(f"{pre}.attn.i_proj output", max(mx(trace["i"][li]), 1.0)),
            f=fmt(f"{pre}.attn.f_proj output", max(mx(trace["f"][li]), 1.0)),
            g=fmt(f"{pre}.attn.g_proj output", max(mx(trace["g"][li]), 1.0)),
            p=fmt(f"{pre} o_proj input", max(mx(p), mx(p * lw.o_proj.norm))),
            gate=fmt(f"{pre}.mlp.gate_proj output", max(mx(trace["gate"][li]), 1.0)),
            m=fmt(f"{pre} down_proj input", max(mx(trace["m"][li]), mx(trace["m"][li] * lw.down_proj.norm)))))
    x_max = max(x_max, mx(trace["x"][-1] * weights.norm * weights.lm_head.norm)) if layers else x_max
    return Formats(residual=fmt("the residual stream", x_max), state=fmt("the recurrent state", max(h_max, 1.0)),
                   layers=tuple(layers))


def check_weights(weights: ModelWeights) -> None:
    """Refuse tensors the accelerator's formats cannot hold, naming the tensor and the value.

    Every norm weight (gamma) must be finite and below :data:`CONST_MAX` in magnitude (it becomes a
    block-floating-point constant), the embeddings and lower bounds finite, and every BitLinear's weight
    scale must give an output scale the scalar unit can express (:func:`_cb`). Products of gammas are
    checked where they are formed (:class:`_Consts`), the value ranges by :func:`calibrate`.

    Raises
    ------
    ValueError
        Naming the first offending tensor (checkpoint name), the value and its index.
    """
    def check(name: str, v: np.ndarray, limit: float = math.inf) -> None:
        v = np.asarray(v)
        bad = ~np.isfinite(v) | (np.abs(v) >= limit)
        if bad.any():
            idx = np.unravel_index(int(np.argmax(bad)), v.shape)
            raise ValueError(f"{name}: value {float(v[idx]):.6g} at index {tuple(int(i) for i in idx)} "
                             f"{'is not finite' if not np.isfinite(v[idx]) else f'exceeds {limit:.6g}'}")

    check("model.embeddings.weight", weights.embeddings, 2.0 ** (31 - MIN_FRAC))
    if weights.lower_bounds is not None:
        check("model.lower_bounds (transformed)", weights.lower_bounds)
    for li, lw in enumerate(weights.layers):
        for part in ("attn_norm", "mlp_norm"):
            check(f"model.layers.{li}.{part}.weight", getattr(lw, part), CONST_MAX)
        check(f"model.layers.{li}.attn.g_norm.weight", lw.g_norm, CONST_MAX)
    check("model.norm.weight", weights.norm, CONST_MAX)
    for name, bl in weights.bitlinears():
        check(f"{name}.norm.weight", bl.norm, CONST_MAX)
        _cb(name, bl)


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


#: Largest magnitude of a per-channel constant: block floating point keeps it in [2**29, 2**30) with a
#: non-negative fraction-bit count, so anything at or above 2**30 cannot be represented.
CONST_MAX = float(1 << 30)


def _cb(name: str, bl: BitLinearWeights) -> tuple[int, int]:
    """``Cb = sqrt(K) / 127 / s_w`` (``s_w = fl32(1 / beta)``, the released dequantization) as a 24-bit
    mantissa and a shift in [0, 63] (the scalar unit's range).

    Raises
    ------
    ValueError
        Naming the tensor, if its scale puts ``Cb`` outside what the scale's shift can express.
    """
    s_w = float(bl.inv_scale)
    cb = math.sqrt(bl.in_features) / 127.0 / s_w if s_w > 0 and math.isfinite(s_w) else math.inf
    if not (cb > 0 and math.isfinite(cb)):
        raise ValueError(f"{name}.weight: weight scale beta = {float(bl.scale)!r} gives no finite output scale")
    mant, shift = nx.float_mant_shift(cb, 24)
    if not 0 <= shift <= 63:
        raise ValueError(f"{name}.weight: weight scale beta = {float(bl.scale):.6g} is outside what the "
                         f"accelerator's output scale holds (Cb = {cb:.6g} needs a shift of {shift}, 0..63)")
    return mant, shift


class _Consts:
    """Block-floating-point constant vectors, memoized so producer and consumer use identical words.

    Each vector is named after the checkpoint tensors it comes from, and refused (``ValueError`` naming
    them and the value) when it is not finite or reaches :data:`CONST_MAX`.
    """

    def __init__(self):
        self._cache: dict[bytes, tuple[np.ndarray, int]] = {}

    def __call__(self, v: np.ndarray, name: str) -> tuple[np.ndarray, int]:
        v = np.asarray(v, dtype=np.float64)
        key = v.tobytes()
        if key not in self._cache:
            with np.errstate(over="ignore", invalid="ignore"):
                m = float(np.max(np.abs(v))) if v.size else 0.0
            if not math.isfinite(m) or m >= CONST_MAX:
                bad = int(np.argmax(~np.isfinite(v) | (np.abs(v) >= CONST_MAX)))
                raise ValueError(f"{name}: value {float(v[bad]):.6g} at channel {bad} does not fit the "
                                 f"accelerator's constant format (finite, |v| < 2**30)")
            self._cache[key] = nx.block_float(v)
        return self._cache[key]


def _prod(*vs: np.ndarray) -> np.ndarray:
    """Element-wise product in float64 (no float32 overflow warning; :class:`_Consts` checks the result)."""
    out = np.ones_like(np.asarray(vs[0], dtype=np.float64))
    for v in vs:
        out = out * np.asarray(v, dtype=np.float64)
    return out


def ssq_bias(eps_term: float, k: int, frac: int, name: str) -> tuple[int, int]:
    """The constant part of a BitLinear's statistic as ``InstrHeader.ssq_bias`` and ``ssq_bias_shift``.

    The scale's sum of squares is ``K (S + eps_o (M + eps_b))`` in the register's units, ``2**(2 frac - 16)``
    per unit of a squared value with ``frac`` fraction bits (:data:`hw.numerics.SSQ_SHIFT`); the epilogue
    accumulates the data-dependent part, and ``eps_term`` (``eps_o eps_b``, or ``eps_o`` where the input has
    no norm of its own) times ``K`` is this constant, rounded half to even, as ``mant << shift`` with a 32-bit
    mantissa.

    Raises
    ------
    ValueError
        If it needs a shift beyond 31 (an epsilon far too large for the format).
    """
    v = round(float(eps_term) * k * 2.0 ** (2 * frac - nx.SSQ_SHIFT))
    shift = max(0, v.bit_length() - 32)
    mant = (v + (1 << shift >> 1)) >> shift if shift else v
    if mant >> 32:
        mant, shift = mant >> 1, shift + 1
    if shift > 31:
        raise ValueError(f"{name}: the RMSNorm epsilon term {v} does not fit ssq_bias (shift {shift} > 31)")
    return mant, shift


def _reductions(consts: _Consts, block_gamma: np.ndarray, consumers: list[np.ndarray], ssq_reg: int,
                amax_regs: list[int], eps: float, name: str, consumer_names: list[str],
                first_const: int = 0) -> tuple[list[MicroOpSpec], list[np.ndarray]]:
    """SSQ of ``x * sqrt(block_gamma**2 + eps)`` (the consumers' statistic with their own eps folded in)
    and AMAX of ``x * block_gamma * gamma_c`` for each consumer."""
    ops, vecs = [], []
    g2 = np.asarray(block_gamma, dtype=np.float64)
    mant, frac = consts(np.sqrt(g2 * g2 + eps), f"sqrt({name}**2 + bitlinear_norm_eps)")
    vecs.append(mant)
    ops.append(_op(M.SSQ, a=0, buf=Buffer(Buffer.C0.value + first_const), shift=frac, reg=ssq_reg))
    for j, (g, reg, cname) in enumerate(zip(consumers, amax_regs, consumer_names, strict=True)):
        mant, frac = consts(_prod(block_gamma, g), f"{name} * {cname}")
        vecs.append(mant)
        ops.append(_op(M.AMAX, a=0, buf=Buffer(Buffer.C0.value + first_const + 1 + j), shift=frac, reg=reg))
    return ops, vecs


def compile_program(weights: ModelWeights, options: CompileOptions = CompileOptions(),
                    formats: Formats | None = None, *, with_trits: bool = True) -> list[Instruction]:
    """The whole per-token program of a model (one instruction per GEMV, plus LOAD_TOKEN and END_TOKEN).

    Parameters
    ----------
    weights : ModelWeights
    options : CompileOptions
    formats : Formats, optional
        Overrides ``options.formats``; None with ``options.formats`` None calibrates (:func:`calibrate`).
    with_trits : bool
        False leaves every GEMV's ``trits`` None (only their shape is read): what :func:`plan_model` needs,
        where the weights are :func:`shape_weights`' stand-ins.

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
    eps_o, eps_b = float(cfg.bitlinear_norm_eps), float(cfg.rms_norm_eps)
    consts = _Consts()
    prog: list[Instruction] = []

    def tensor(li: int | None, part: str) -> str:
        """Checkpoint name of a norm weight (``part`` e.g. ``"attn_norm"``, ``"attn.i_proj.norm"``)."""
        if li is None:
            return f"{part}.weight"
        return f"model.layers.{li}.{part}.weight"

    def next_reductions(idx: int) -> tuple[np.ndarray, list[np.ndarray], str, list[str]]:
        """Block gamma and consuming BitLinears of the vector X after layer ``idx - 1`` (with their names)."""
        if idx < cfg.num_hidden_layers:
            lw = weights.layers[idx]
            return (lw.attn_norm, [lw.i_proj.norm, lw.f_proj.norm, lw.g_proj.norm], tensor(idx, "attn_norm"),
                    [tensor(idx, f"attn.{p}.norm") for p in ("i_proj", "f_proj", "g_proj")])
        return weights.norm, [weights.lm_head.norm], "model.norm.weight", ["lm_head.norm.weight"]

    def gemv(name: str, layer: int, bl: BitLinearWeights, rows: slice | None, src: Buffer, block_gamma,
             amax_reg: int, ssq_reg: int, out_frac: int, ops: list[MicroOpSpec], cvecs: list[np.ndarray],
             *, src_frac: int, eps_term: float, qnames: str, flags: InstrFlags | None = None,
             reuse: bool = False) -> Instruction:
        """One BitLinear (or its ``rows``) reading ``src`` (``src_frac`` fraction bits); ``eps_term`` is the
        constant part of its statistic per element (:func:`ssq_bias`)."""
        trits = bl.trits if rows is None else bl.trits[rows]
        tname = "lm_head" if name == "lm_head" else f"model.{name.split('[')[0]}"
        cb_mant, cb_shift = _cb(tname, bl)
        bias, bias_shift = ssq_bias(eps_term, bl.in_features, src_frac, tname)
        ins = Instruction(opcode=Opcode.GEMV, name=name, layer=layer, n=trits.shape[0], k=trits.shape[1],
                          src=src, amax_reg=amax_reg, ssq_reg=ssq_reg, cb_mant=cb_mant, cb_shift=cb_shift,
                          ssq_bias=bias, ssq_bias_shift=bias_shift,
                          out_frac=out_frac, ops=ops, consts=cvecs,
                          trits=np.ascontiguousarray(trits) if with_trits else None,
                          flags=flags or InstrFlags(0))
        if reuse:
            ins.flags |= InstrFlags.REUSE_CODES
        else:
            qmant, qfrac = consts(bl.norm if block_gamma is None else _prod(block_gamma, bl.norm), qnames)
            ins.qconst, ins.q_shift = qmant, qfrac
            ins.flags |= InstrFlags.QCONST
        return ins

    # LOAD_TOKEN: X = embedding, first layer's reductions
    bg, cons, bname, cnames = next_reductions(0)
    red_ops, red_vecs = _reductions(consts, bg, cons, R0, [R1, R2, R3][: len(cons)], eps_o, bname, cnames)
    prog.append(Instruction(opcode=Opcode.LOAD_TOKEN, name="load_token", n=cfg.hidden_size, out_frac=X,
                            ops=[_op(M.ST, a=0, buf=Buffer.X), *red_ops], consts=red_vecs))

    for li, lw in enumerate(weights.layers):
        pre, lf = f"layers.{li}", fm.layers[li]
        ga, ga_name = lw.attn_norm, tensor(li, "attn_norm")
        block = {"src_frac": X, "eps_term": eps_o * eps_b}  # inputs behind a block norm (Q.X)

        def qn(part: str, norm: str | None = ga_name, _li: int = li) -> str:
            own = tensor(_li, f"{part}.norm")
            return own if norm is None else f"{norm} * {own}"

        # i_proj: A = SiLU(i)                                                          (Q.i)
        prog.append(gemv(f"{pre}.attn.i_proj", li, lw.i_proj, None, Buffer.X, ga, R1, R0, lf.i,
                         [_op(M.SILU, dst=0, a=0, shift=lf.i), _op(M.ST, a=0, buf=Buffer.A)], [],
                         qnames=qn("attn.i_proj"), **block))
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
        ], [omlb], qnames=qn("attn.f_proj"), **block))
        # g_proj: P = p, the o_proj input; its reductions for o_proj                    (Q.p)
        go_m, go_f = consts(lw.o_proj.norm, tensor(li, "attn.o_proj.norm"))
        if options.output_gate == "released":
            # o = RMSNorm(g) gamma_g * SiLU(h): o_proj's statistic is mean(p**2) + eps_o (mean(g**2) + eps_g)
            gg_m, gg_f = consts(lw.g_norm, tensor(li, "attn.g_norm"))
            ge_m, ge_f = consts(np.full(cfg.hidden_size, math.sqrt(eps_o)), "sqrt(bitlinear_norm_eps)")
            gops = [
                _op(M.LD, dst=1, buf=Buffer.STATE_NEW),                      # r1 = h           Q.S
                _op(M.SILU, dst=1, a=1, shift=S),                            # r1 = SiLU(h)     Q.S
                _op(M.SSQ, a=0, buf=Buffer.C1, shift=ge_f + lf.g - lf.p, reg=R4),  # eps_o g**2  Q.2p
                _op(M.MULV, dst=0, a=0, buf=Buffer.C0, shift=gg_f + lf.g - lf.p),  # g gamma_g  Q.p
                _op(M.MUL, dst=0, a=0, b=1, shift=S),                        # r0 = p           Q.p
            ]
            gvecs = [gg_m, ge_m, go_m]
            o_eps = eps_o * eps_b
        else:
            gops = [
                _op(M.SIG, dst=0, a=0, shift=lf.g),                          # r0 = sigma(g)    Q.G
                _op(M.MULV, dst=0, a=0, buf=Buffer.STATE_NEW, shift=G + S - lf.p),  # p = sigma(g) h Q.p
            ]
            gvecs = [go_m]
            o_eps = eps_o
        gops += [_op(M.ST, a=0, buf=Buffer.P), _op(M.SSQ, a=0, buf=Buffer.NONE, reg=R4),
                 _op(M.AMAX, a=0, buf=Buffer(Buffer.C0.value + len(gvecs) - 1), shift=go_f, reg=R5)]
        prog.append(gemv(f"{pre}.attn.g_proj", li, lw.g_proj, None, Buffer.X, ga, R3, R0, lf.g, gops, gvecs,
                         qnames=qn("attn.g_proj"), **block))
        # o_proj: X += o; reductions for gate_proj                                      (Q.X)
        gm, gm_name = lw.mlp_norm, tensor(li, "mlp_norm")
        red_ops, red_vecs = _reductions(consts, gm, [lw.gate_proj.norm], R6, [R7], eps_o, gm_name,
                                        [tensor(li, "mlp.gate_proj.norm")])
        prog.append(gemv(f"{pre}.attn.o_proj", li, lw.o_proj, None, Buffer.P, None, R5, R4, X,
                         [_op(M.ADDV, dst=0, a=0, buf=Buffer.X), _op(M.ST, a=0, buf=Buffer.X), *red_ops],
                         red_vecs, src_frac=lf.p, eps_term=o_eps, qnames=qn("attn.o_proj", None)))
        # gate_proj in two halves: A = SiLU(a); P = m = A * b with down_proj's reductions (Q.gate, Q.m)
        mlp = {"src_frac": X, "eps_term": eps_o * eps_b, "qnames": qn("mlp.gate_proj", gm_name)}
        prog.append(gemv(f"{pre}.mlp.gate_proj[:I]", li, lw.gate_proj, slice(0, inter), Buffer.X, gm, R7, R6,
                         lf.gate, [_op(M.SILU, dst=0, a=0, shift=lf.gate), _op(M.ST, a=0, buf=Buffer.A)], [],
                         **mlp))
        gd_m, gd_f = consts(lw.down_proj.norm, tensor(li, "mlp.down_proj.norm"))
        prog.append(gemv(f"{pre}.mlp.gate_proj[I:]", li, lw.gate_proj, slice(inter, 2 * inter), Buffer.X, gm,
                         R7, R6, lf.gate, [
                             _op(M.MULV, dst=0, a=0, buf=Buffer.A, shift=2 * lf.gate - lf.m),  # m    Q.m
                             _op(M.ST, a=0, buf=Buffer.P),
                             _op(M.SSQ, a=0, buf=Buffer.NONE, reg=R4),
                             _op(M.AMAX, a=0, buf=Buffer.C0, shift=gd_f, reg=R5),
                         ], [gd_m], reuse=True, **mlp))
        # down_proj: X += d; reductions for the next layer (or the final norm and LM head)  (Q.X)
        # (its input m has no norm of its own: the statistic is mean(m**2) + eps_o)
        bg, cons, bname, cnames = next_reductions(li + 1)
        red_ops, red_vecs = _reductions(consts, bg, cons, R0, [R1, R2, R3][: len(cons)], eps_o, bname, cnames)
        prog.append(gemv(f"{pre}.mlp.down_proj", li, lw.down_proj, None, Buffer.P, None, R5, R4, X,
                         [_op(M.ADDV, dst=0, a=0, buf=Buffer.X), _op(M.ST, a=0, buf=Buffer.X), *red_ops],
                         red_vecs, src_frac=lf.m, eps_term=eps_o, qnames=qn("mlp.down_proj", None)))

    prog.append(gemv("lm_head", 0, weights.lm_head, None, Buffer.X, weights.norm, R1, R0, X,
                     [_op(M.ARGMAX, a=1), _op(M.OUT, a=1)], [], flags=InstrFlags.LOGITS, src_frac=X,
                     eps_term=eps_o * eps_b, qnames="model.norm.weight * lm_head.norm.weight"))
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
    _check_shape(cfg)
    check_weights(weights)
    fm = options.formats or calibrate(weights, output_gate=options.output_gate)
    prog = compile_program(weights, options, fm)
    return assemble(prog, packing=options.packing, channels=options.channels, n_layers=cfg.num_hidden_layers,
                    hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
                    residual_frac=fm.residual, state_frac=fm.state, gate_frac=nx.GATE_FRAC,
                    lut_segments_log2=options.lut_segments_log2)


def _check_shape(cfg: HGRNBitConfig) -> None:
    """Refuse a model shape beyond :mod:`hw.isa`'s limits (``ValueError``)."""
    if cfg.hidden_size > isa.MAX_HIDDEN or cfg.intermediate_size > isa.MAX_INTERMEDIATE or \
            cfg.num_hidden_layers > isa.MAX_LAYERS or cfg.vocab_size > isa.MAX_VOCAB:
        raise ValueError(f"model shape (hidden {cfg.hidden_size}, intermediate {cfg.intermediate_size}, "
                         f"{cfg.num_hidden_layers} layers, vocab {cfg.vocab_size}) exceeds the ISA limits")


# ------------------------------------------------------------------------------------------- plans
_INSTR_HEADER_BYTES = isa.layout_bytes(isa.InstrHeader)
_IMAGE_HEADER_BYTES = isa.layout_bytes(isa.ImageHeader)


@dataclass(frozen=True)
class InstrPlan:
    """One instruction of a :class:`ProgramPlan`: what the cycle model and the byte counts need, no data.

    The fields are :class:`host.image.Instruction`'s (``opcode`` .. ``ssq_reg``), then what its micro-ops
    and constants amount to: ``n_ops`` micro-ops (the folded epilogue's passes), ``n_consts`` constant
    vectors C0.., the buffers (``stores``) and reduction registers (``reduces``) its epilogue writes, and
    its bytes in the image: ``weight_bytes`` (each channel's weight block with its padding and CRC word,
    :func:`host.image.channel_block_bytes`) and :attr:`const_bytes` (the constants section after the 64-byte
    header, on channel 0: :func:`host.image.const_section_bytes` of these fields, so that a what-if copy with
    other flags or constant counts sizes itself).
    """

    opcode: Opcode
    name: str
    flags: InstrFlags
    layer: int
    n: int
    k: int
    src: Buffer
    amax_reg: int
    ssq_reg: int
    n_ops: int
    n_consts: int
    stores: frozenset[Buffer]
    reduces: frozenset[int]
    weight_bytes: tuple[int, ...]

    @property
    def consts(self) -> tuple[None, ...]:
        """Placeholders for the constant vectors (their number is what sizes the section)."""
        return (None,) * self.n_consts

    @property
    def const_bytes(self) -> int:
        """Bytes of the constants section (QC with ``QCONST``, then C0..), on channel 0."""
        return const_section_bytes(self)

    @property
    def channel_bytes(self) -> tuple[int, ...]:
        """Bytes on each channel: the header and constants on channel 0, and each channel's weight block."""
        head = _INSTR_HEADER_BYTES + self.const_bytes
        return tuple(w + (head if c == 0 else 0) for c, w in enumerate(self.weight_bytes))

    @property
    def image_bytes(self) -> int:
        return sum(self.channel_bytes)


@dataclass(frozen=True)
class ProgramPlan:
    """A model's program without weights: the instructions :func:`compile_program` emits for a model of this
    shape and these options (:func:`plan_model`), as :class:`InstrPlan` records. It also serves as the
    ``info`` argument of the cycle model (:func:`host.perf.schedule`: it has ``packing``, ``channels`` and
    ``vocab``).

    Attributes
    ----------
    hidden, intermediate, n_layers, vocab : int
    packing : TritPacking
    channels : int
    instructions : tuple of InstrPlan
    """

    hidden: int
    intermediate: int
    n_layers: int
    vocab: int
    packing: TritPacking
    channels: int
    instructions: tuple[InstrPlan, ...] = field(repr=False)

    @property
    def image_bytes(self) -> int:
        """Exactly ``len(compile_model(...))`` for a model of this shape with these options."""
        return _IMAGE_HEADER_BYTES + sum(i.image_bytes for i in self.instructions)

    @property
    def trits(self) -> int:
        return sum(i.n * i.k for i in self.instructions if i.opcode is Opcode.GEMV)

    @property
    def weight_bytes(self) -> int:
        return sum(sum(i.weight_bytes) for i in self.instructions)

    def layer_slice(self, layer: int) -> slice:
        """Indices of layer ``layer``'s GEMVs in :attr:`instructions` (contiguous, in program order)."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer} of a {self.n_layers}-layer program")
        idx = [j for j, i in enumerate(self.instructions) if i.opcode is Opcode.GEMV and i.layer == layer
               and InstrFlags.LOGITS not in i.flags]
        return slice(idx[0], idx[-1] + 1)


def shape_weights(config: HGRNBitConfig) -> ModelWeights:
    """A stand-in for a model of ``config``'s shape without its weights: unit norms and weight scales, no lower
    bounds, and trits and embeddings that are zero-strided views (``numpy.broadcast_to``: nothing of size
    ``H x H`` is allocated, so the 2.7B shape costs a few vectors)."""
    h, inter, v = config.hidden_size, config.intermediate_size, config.vocab_size
    ones = {n: np.broadcast_to(np.float32(1.0), (n,)) for n in {h, inter}}

    def bl(n: int, k: int) -> BitLinearWeights:
        return BitLinearWeights(norm=ones[k], trits=np.broadcast_to(np.int8(0), (n, k)), scale=np.float32(1.0))

    layers = [LayerWeights(attn_norm=ones[h], i_proj=bl(h, h), f_proj=bl(h, h), g_proj=bl(h, h), g_norm=ones[h],
                           o_proj=bl(h, h), mlp_norm=ones[h], gate_proj=bl(2 * inter, h), down_proj=bl(h, inter))
              for _ in range(config.num_hidden_layers)]
    return ModelWeights(config=config, embeddings=np.broadcast_to(np.float32(0.0), (v, h)), lower_bounds=None,
                        layers=layers, norm=ones[h], lm_head=bl(v, h))


def plan_instructions(program: Sequence[Instruction], *, packing: TritPacking,
                      channels: int) -> tuple[InstrPlan, ...]:
    """The :class:`InstrPlan` of each instruction of a program (compiled, planned or parsed from an image)."""
    packing = TritPacking(packing)
    out = []
    for ins in program:
        stores = frozenset(op.buf for op in ins.ops if op.op is M.ST)
        reduces = frozenset(op.reg for op in ins.ops if op.op in (M.SSQ, M.AMAX))
        wb = (channel_block_bytes(ins.n, ins.k, channels, packing) if ins.opcode is Opcode.GEMV
              else [0] * channels)
        out.append(InstrPlan(opcode=ins.opcode, name=ins.name, flags=ins.flags, layer=ins.layer, n=ins.n, k=ins.k,
                             src=ins.src, amax_reg=ins.amax_reg, ssq_reg=ins.ssq_reg, n_ops=len(ins.ops),
                             n_consts=len(ins.consts), stores=stores, reduces=reduces, weight_bytes=tuple(wb)))
    return tuple(out)


def plan_model(config: HGRNBitConfig, options: CompileOptions = CompileOptions()) -> ProgramPlan:
    """The plan of a model of ``config``'s shape compiled with ``options``, without weights.

    :func:`compile_program` itself runs, on :func:`shape_weights`' stand-ins with uniform formats (the formats
    and the weights' values change constants and shifts, not the instructions, their flags, micro-op counts or
    sizes), and each instruction becomes an :class:`InstrPlan`: the same code path that compiles real weights.

    Raises
    ------
    ValueError
        A shape beyond the ISA limits or an invalid config (``host.model.ConfigError``).
    """
    config.validate(source="plan_model")
    _check_shape(config)
    prog = compile_program(shape_weights(config), options, Formats.uniform(config.num_hidden_layers),
                           with_trits=False)
    return ProgramPlan(hidden=config.hidden_size, intermediate=config.intermediate_size,
                       n_layers=config.num_hidden_layers, vocab=config.vocab_size, packing=options.packing,
                       channels=options.channels,
                       instructions=plan_instructions(prog, packing=options.packing, channels=options.channels))


def plan_shape(hidden: int, intermediate: int, n_layers: int, vocab: int, *,
               packing: TritPacking = TritPacking.BASE3, channels: int = 1,
               output_gate: str = "released") -> ProgramPlan:
    """:func:`plan_model` of the shape ``(hidden, intermediate, n_layers, vocab)`` (``HGRNBitConfig``'s
    ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``vocab_size``; the released 370M, 1.3B and
    2.7B shapes included)."""
    cfg = HGRNBitConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=n_layers,
                        intermediate_size=intermediate)
    return plan_model(cfg, CompileOptions(packing=packing, channels=channels, output_gate=output_gate))
