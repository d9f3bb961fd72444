"""The golden device: an instruction-set simulator that executes model images exactly as the hardware.

:meth:`GoldenMachine.run_token` is a pure function of (image, token packet, recurrent state) returning
(output packet, new state, activity counts): the oracle of every hardware test (DESIGN.md section 2). All
arithmetic is the integer arithmetic of :mod:`hw.numerics`; the ternary GEMV runs directly on the image's
packed bytes (a numba kernel that decodes trits as the hardware's gearbox does), so the device holds the image
and nothing bigger. The recurrent state is committed only by END_TOKEN: a token that fails leaves it as it
was. Packets are :mod:`host.protocol`'s.

Activity counts (trits, non-zero trits, epilogue elements, instructions, tokens, stream and output bytes)
are the oracle's, exact and independent of any build. Cycle counters (``CYCLES``, stalls, beats...) belong to
a build: :class:`CycleModel`, beside the oracle, predicts them with the cycle model of :mod:`host.perf` for a
:class:`~hw.params.BuildParams`; :class:`GoldenDevice` reports both, as the hardware's counters.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from host.devices.base import Device, DeviceError
from host.image import (
    BuildLimits,
    ImageError,
    ParsedImage,
    channel_block_bytes,
    channel_rows,
    check_block_crcs,
    check_block_trits,
    check_image_header,
    iter_instructions,
    parse_image,
)
from host.model import ModelWeights
from host.protocol import (
    check_token_packet,
    embedding_packet,
    make_output_packet,
    parse_output_packet,
    token_packet_bytes,
)
from hw import isa
from hw import numerics as nx
from hw.isa import Buffer, Counter, ErrorCause, InstrFlags, MicroOpcode, Opcode
from hw.params import BuildParams

__all__ = ["GoldenMachine", "TokenResult", "GoldenDevice", "CycleModel", "ACTIVITY_COUNTERS", "run_stream",
           "StreamOutcome"]

#: The counters the oracle counts exactly (the work done); the others are the cycle model's (:class:`CycleModel`).
ACTIVITY_COUNTERS = (Counter.TRITS, Counter.NONZERO_TRITS, Counter.EPILOGUE_ELEMENTS, Counter.INSTRUCTIONS,
                     Counter.TOKENS)

M = MicroOpcode
_BASE3 = isa.BASE3_DECODE.astype(np.int32)
_BITS2 = np.stack([isa.BITS2_DECODE[(np.arange(256) >> s) & 3] for s in (0, 2, 4, 6)], axis=1).astype(np.int32)


#: OpenMP wait policy of the parallel GEMV (numba's ``omp`` threading layer reads it when it starts; a user's
#: own setting wins). GNU libgomp's default lets idle threads spin, so that when any other process holds one
#: of the cores the GEMV's threads wait on each other's time slices. bench/bench_cpu.py on two cores with one
#: busy gives 107 tokens/s with ``passive`` (bench/results/cpu.json); its earlier result with the default
#: policy, at load 11-13, is in that file's git history: 4.4 tokens/s.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _gemv_kernels():
    from host.extras import require_extra

    numba = require_extra("numba", "the golden device")

    @numba.njit(cache=True, nogil=True, parallel=True)
    def gemv_packed(block, n_rows, k, codes, lut, per_byte, out, out_start, out_step):
        """acc[r] = sum_j trit(r, j) * codes[j] for rows packed continuously, `per_byte` trits a byte."""
        for r in numba.prange(n_rows):
            pos = r * k
            byte = pos // per_byte
            d = pos - byte * per_byte
            acc = 0
            j = 0
            while d != 0 and j < k:
                acc += lut[block[byte], d] * codes[j]
                j += 1
                d += 1
                if d == per_byte:
                    d = 0
                    byte += 1
            if per_byte == 5:
                while j + 5 <= k:
                    b = block[byte]
                    acc += (lut[b, 0] * codes[j] + lut[b, 1] * codes[j + 1] + lut[b, 2] * codes[j + 2]
                            + lut[b, 3] * codes[j + 3] + lut[b, 4] * codes[j + 4])
                    j += 5
                    byte += 1
            else:
                while j + 4 <= k:
                    b = block[byte]
                    acc += (lut[b, 0] * codes[j] + lut[b, 1] * codes[j + 1] + lut[b, 2] * codes[j + 2]
                            + lut[b, 3] * codes[j + 3])
                    j += 4
                    byte += 1
            d = 0
            while j < k:
                acc += lut[block[byte], d] * codes[j]
                j += 1
                d += 1
            out[out_start + r * out_step] = acc

    @numba.njit(cache=True, nogil=True)
    def count_nonzero(block, n_trits, lut, per_byte):
        nz = 0
        for t in range(n_trits):
            b = t // per_byte
            if lut[block[b], t - b * per_byte] != 0:
                nz += 1
        return nz

    return gemv_packed, count_nonzero


_KERNELS: tuple | None = None


def _kernels():
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = _gemv_kernels()
    return _KERNELS


# ------------------------------------------------------------------------------------------ machine
@dataclass
class TokenResult:
    """Everything one token produced.

    Attributes
    ----------
    output : bytes
        The output packet.
    state : ndarray, int64 [L, H]
        New recurrent state (STATE_FRAC).
    counters : dict[Counter, int]
        Whole-token counters: the activity counts (:data:`ACTIVITY_COUNTERS`), and, when a build's
        :class:`CycleModel` is beside the machine, every other counter as that model predicts it.
    per_instruction : list of dict[Counter, int]
        The same per instruction.
    trace : dict or None
        Dequantized outputs per instruction (``run_token(..., trace=True)``).
    stream_bytes : tuple of int
        Bytes each channel carried (channel 0: the token packet and its image stream).
    output_bytes : int
        Bytes of the output packet.
    """

    output: bytes
    state: np.ndarray
    counters: dict[Counter, int]
    per_instruction: list[dict[Counter, int]] = field(default_factory=list)
    trace: dict[str, list[np.ndarray]] | None = None
    stream_bytes: tuple[int, ...] = ()
    output_bytes: int = 0


class CycleModel:
    """The cycle counters of one image on one build (:func:`host.perf.token_counters`), beside the oracle.

    The model predicts every :class:`~hw.isa.Counter`; :meth:`counters` keeps its timing (cycles, stalls, beats)
    and takes the activity counts from the oracle's exact ones.

    Raises
    ------
    host.image.ImageError
        BAD_SHAPE when the image is compiled for another channel count than the build's.
    """

    def __init__(self, image: ParsedImage, build: BuildParams):
        from host.perf import token_counters

        if build.channels != image.info.channels:
            raise ImageError(ErrorCause.BAD_SHAPE, f"image compiled for {image.info.channels} channel(s), the "
                             f"build has {build.channels}")
        self.build = build
        # the sequencer prefetches the next instruction while one runs: counters come from the token's timeline
        self.per_instruction, self.totals = token_counters(image.instructions, image.info, build)

    def counters(self, activity: list[dict[Counter, int]]) -> tuple[list[dict[Counter, int]], dict[Counter, int]]:
        """``(per instruction, whole token)``: the model's timing with the oracle's activity per instruction."""
        per = [{**timing, **act} for timing, act in zip(self.per_instruction, activity, strict=True)]
        return per, {k: sum(c[k] for c in per) for k in Counter}


class GoldenMachine:
    """A parsed image ready to run tokens: the oracle.

    Parameters
    ----------
    image : bytes
        A model image (:func:`host.compiler.compile_model`). Parsed and validated here.
    build : BuildParams, optional
        A build whose cycle counters :meth:`run_token` adds (a :class:`CycleModel` beside the oracle); without
        it a token's counters are the activity counts only, which depend on nothing but the image.
    engine : bool, default True
        Run well-formed tokens with the compiled whole-token engine (:mod:`host.devices.golden_engine`,
        bit-identical, several times faster); False runs this module's interpreter (:class:`_Executor`), the
        readable definition that the engine's tests compare against. Traces always use the interpreter.

    Raises
    ------
    host.image.ImageError
        On a bad image (or one of another channel count than ``build``).
    """

    def __init__(self, image: bytes | ParsedImage, build: BuildParams | None = None, *, engine: bool = True):
        self._use_engine = bool(engine)
        self._engine = None   # built on the first token: tests that never run one stay fast
        self.image = image if isinstance(image, ParsedImage) else parse_image(image)
        self.info = self.image.info
        self.table = nx.sigmoid_table(self.info.lut_segments_log2, self.info.gate_frac)
        packed = self.info.packing is isa.TritPacking.BASE3
        self._lut, self._per_byte = (_BASE3, 5) if packed else (_BITS2, 4)
        self._nonzero: list[int] | None = None
        self.activity = self._activity()
        self.build = build
        self.timing = CycleModel(self.image, build) if build is not None else None
        if self.timing is not None:
            self._counters, self._totals = self.timing.counters(self.activity)
        else:
            self._counters = self.activity
            self._totals = {k: sum(c[k] for c in self.activity) for k in ACTIVITY_COUNTERS}
        self.stream_bytes = self._stream_bytes()

    def _activity(self) -> list[dict[Counter, int]]:
        """The work of each instruction of a token (the same every token: the program has no branches)."""
        out = []
        for ins, nz in zip(self.image.instructions, self.nonzero_trits(), strict=True):
            gemv = ins.opcode is Opcode.GEMV
            out.append({Counter.TRITS: ins.n * ins.k if gemv else 0, Counter.NONZERO_TRITS: nz,
                        Counter.EPILOGUE_ELEMENTS: 0 if ins.opcode is Opcode.END_TOKEN else ins.n,
                        Counter.INSTRUCTIONS: 1, Counter.TOKENS: int(ins.opcode is Opcode.END_TOKEN)})
        return out

    def _stream_bytes(self) -> tuple[int, ...]:
        """Bytes per channel of one token: the image's channel streams, the token packet on channel 0."""
        per = [0] * self.info.channels
        for ins in self.image.instructions:
            for c, blk in enumerate(ins.blocks):
                per[c] += blk.nbytes
        per[0] = self.info.image_bytes - sum(per[1:]) + token_packet_bytes(self.info.hidden)
        return tuple(per)

    @property
    def image_bytes(self) -> int:
        return self.info.image_bytes

    def init_state(self) -> np.ndarray:
        """Zero recurrent state, int64 [L, H]."""
        return np.zeros((self.info.n_layers, self.info.hidden), dtype=np.int64)

    def nonzero_trits(self) -> list[int]:
        """Non-zero trits per instruction (computed once, on first use)."""
        if self._nonzero is None:
            _, count = _kernels()
            out = []
            for ins in self.image.instructions:
                nz = 0
                for c, blk in enumerate(ins.blocks):
                    nz += int(count(blk, channel_rows(ins.n, self.info.channels, c) * ins.k, self._lut,
                                    self._per_byte))
                out.append(nz)
            self._nonzero = out
        return self._nonzero

    def _get_engine(self):
        """The compiled engine of this image, built once; None when disabled or the image is outside what it
        runs (then the interpreter runs every token)."""
        if self._use_engine and self._engine is None:
            from host.devices.golden_engine import GoldenEngine, UnsupportedImage

            try:
                self._engine = GoldenEngine(self.image)
            except UnsupportedImage:
                self._use_engine = False
        return self._engine if self._use_engine else None

    # ------------------------------------------------------------------------------------- run
    def run_token(self, packet: bytes, state: np.ndarray, *, trace: bool = False) -> TokenResult:
        """Execute the image on one token packet.

        Parameters
        ----------
        packet : bytes
            Token packet (:func:`host.protocol.make_token_packet`).
        state : ndarray, int64 [L, H]
            Committed recurrent state (not modified).
        trace : bool
            Keep every instruction's dequantized outputs (``r0`` before the program runs) by name index.

        Raises
        ------
        host.image.ImageError
            TOKEN_MAGIC, TOKEN_LENGTH, TOKEN_CRC, or an error met while executing (BAD_SHAPE).
        """
        info = self.info
        token, flags, position = check_token_packet(packet, isa.MAX_HIDDEN)
        if token.size != info.hidden:
            raise ImageError(ErrorCause.TOKEN_LENGTH, f"token packet of {token.size} words, the image's hidden "
                             f"size is {info.hidden}")
        state = np.asarray(state, dtype=np.int64)
        if state.shape != (info.n_layers, info.hidden):
            raise ValueError(f"state must have shape {(info.n_layers, info.hidden)}, got {state.shape}")
        tr: dict[str, list[np.ndarray]] | None = {"r0": []} if trace else None
        engine = self._get_engine() if tr is None else None
        if engine is not None:
            output, new_state = engine.run(token, flags, position, state)
        else:
            output, new_state = _Executor(info, self.table, self._lut, self._per_byte).run(
                iter(self.image.instructions), token, flags, position, state, tr)
        return TokenResult(output=output, state=new_state, counters=dict(self._totals),
                           per_instruction=[dict(c) for c in self._counters], trace=tr,
                           stream_bytes=self.stream_bytes, output_bytes=len(output))


class _Executor:
    """Runs checked instructions one after the other (the machine of docs/ISA.md section 3), so that an error
    met in instruction ``i`` (raised by the iterator that checks them, or while running) leaves what the core
    would have sent: :attr:`sent` holds the logit vectors already streamed."""

    def __init__(self, info, table, lut, per_byte):
        self.info, self.table, self._lut, self._per_byte = info, table, lut, per_byte
        self.sent: list[np.ndarray] = []
        self.late: dict[int, ImageError] = {}   #: errors of an instruction's weights, by instruction index
        self.want_logits = False
        self.in_logits = False      #: the error came while the LM head's GEMV streamed (its logits are in sent)

    def run(self, instructions, token, flags, position, state, tr=None) -> tuple[bytes, np.ndarray]:
        info = self.info
        vmax = max(info.hidden, info.intermediate)
        bufs = {Buffer.X: np.zeros(info.hidden, np.int64), Buffer.A: np.zeros(vmax, np.int64),
                Buffer.P: np.zeros(vmax, np.int64), Buffer.TOKEN: token}
        new_state = state.copy()
        regs = [0] * 8
        codes = np.zeros(0, np.int32)
        scale = (0, 0)
        argmax, max_acc, logits = 0, 0, self.sent
        self.want_logits = bool(flags & 1)
        out_scale = (0, 0)
        gemv, _ = _kernels()
        for idx, ins in enumerate(instructions):
            where = {"instruction": idx, "offset": ins.offset}
            if ins.opcode is Opcode.END_TOKEN:
                break
            if ins.opcode is Opcode.GEMV:
                if InstrFlags.REUSE_CODES not in ins.flags:
                    src = bufs[ins.src][: ins.k]
                    w = nx.mul(src, ins.qconst, ins.q_shift) if ins.qconst is not None else src
                    a = regs[ins.amax_reg]
                    codes = nx.quantize(w, *nx.quant_recip(a)).astype(np.int32)
                    ssq = nx.ssq_with_bias(regs[ins.ssq_reg], ins.ssq_bias, ins.ssq_bias_shift)
                    scale = nx.dequant_scale(ssq, a, ins.cb_mant, ins.cb_shift, ins.out_frac)
                acc = np.empty(ins.n, np.int64)
                for c, blk in enumerate(ins.blocks):
                    gemv(blk, channel_rows(ins.n, info.channels, c), ins.k, codes, self._lut, self._per_byte,
                         acc, c, info.channels)
                # ISA: r0 = acc * S, r1 = acc, r2 = r3 = 0
                r = [nx.dequant(acc, *scale), acc, np.zeros(ins.n, np.int64), np.zeros(ins.n, np.int64)]
                if InstrFlags.LOGITS in ins.flags:
                    out_scale = (scale[0], scale[1] + ins.out_frac)
            else:  # LOAD_TOKEN
                r = [token, token, np.zeros(ins.n, np.int64), np.zeros(ins.n, np.int64)]
            if tr is not None:
                tr["r0"].append(r[0].copy())
            self.in_logits = InstrFlags.LOGITS in ins.flags
            argmax, max_acc = self._epilogue(ins, r, bufs, state, new_state, regs, logits, (argmax, max_acc),
                                             where)
            self.in_logits = False
            if idx in self.late:
                raise self.late[idx]          # found in its weights: after its epilogue ran (see run_stream)
        else:
            raise ImageError(ErrorCause.NO_END, "the program ran off its end")
        acc_out = np.concatenate(logits) if (logits and self.want_logits) else np.zeros(0, np.int64)
        output = make_output_packet(acc_out, position=position, argmax=argmax, max_acc=max_acc,
                                    scale_mant=out_scale[0], scale_shift=out_scale[1])
        return output, new_state

    def _epilogue(self, ins, r, bufs, state, new_state, regs, logits, best, where) -> tuple[int, int]:
        n = ins.n
        layer = ins.layer
        cleared = set()
        argmax, max_acc = best

        def read(buf: Buffer) -> np.ndarray:
            if buf is Buffer.STATE_OLD:
                v = state[layer]
            elif buf is Buffer.STATE_NEW:
                v = new_state[layer]
            elif Buffer.C0.value <= buf.value <= Buffer.C3.value:
                return ins.consts[buf.value - Buffer.C0.value]
            elif buf in bufs:
                v = bufs[buf]
            else:
                raise ImageError(ErrorCause.BAD_MICROOP, f"micro-op reads buffer {buf.name}", **where)
            if n > v.size:
                raise ImageError(ErrorCause.BAD_SHAPE, f"{n} elements of {buf.name} ({v.size})", **where)
            return v[:n]

        for op in ins.ops:
            o = op.op
            a = r[op.a]
            if o is M.NOP:
                continue
            if o is M.LD:
                # a copy: a later ST to the same buffer must not change the loaded register (per-element
                # semantics: LD reads buf[n] once)
                r[op.dst] = read(op.buf).copy()
            elif o is M.ST:
                if op.buf is Buffer.STATE_NEW:
                    tgt = new_state[layer]
                elif op.buf in (Buffer.X, Buffer.A, Buffer.P):
                    tgt = bufs[op.buf]
                else:
                    raise ImageError(ErrorCause.BAD_MICROOP, f"micro-op writes read-only {op.buf.name}", **where)
                if n > tgt.size:
                    raise ImageError(ErrorCause.BAD_SHAPE, f"{n} elements into {op.buf.name} ({tgt.size})",
                                     **where)
                tgt[:n] = a
            elif o is M.ADD:
                r[op.dst] = nx.sat32(a + r[op.b])
            elif o is M.SUB:
                r[op.dst] = nx.sat32(a - r[op.b])
            elif o is M.MUL:
                r[op.dst] = nx.mul(a, r[op.b], op.shift)
            elif o is M.MULV:
                r[op.dst] = nx.mul(a, read(op.buf), op.shift)
            elif o is M.ADDV:
                r[op.dst] = nx.sat32(a + read(op.buf))
            elif o is M.SIG:
                r[op.dst] = nx.sigmoid(a, op.shift, self.table, self.info.lut_segments_log2)
            elif o is M.SIGNEG:
                r[op.dst] = nx.sigmoid(nx.sat32(-a), op.shift, self.table, self.info.lut_segments_log2)
            elif o is M.SILU:
                r[op.dst] = nx.silu(a, op.shift, self.table, self.info.lut_segments_log2, self.info.gate_frac)
            elif o is M.RSUB1:
                r[op.dst] = nx.sat32((1 << op.shift) - a)
            elif o in (M.SSQ, M.AMAX):
                w = a if op.buf is Buffer.NONE else nx.mul(a, read(op.buf), op.shift)
                if op.reg not in cleared:
                    regs[op.reg] = 0
                    cleared.add(op.reg)
                if o is M.SSQ:
                    regs[op.reg] = nx.ssq_accumulate(regs[op.reg], w)
                else:
                    regs[op.reg] = max(regs[op.reg], int(np.max(np.abs(w))) if n else 0)
            elif o is M.ARGMAX:
                i = int(np.argmax(a))
                argmax, max_acc = i, int(a[i])
            elif o is M.OUT:
                logits.append(np.array(a, copy=True))
        return argmax, max_acc



# ------------------------------------------------------------------------------------------- streams
@dataclass
class StreamOutcome:
    """What the core does with one token packet and one image stream (:func:`run_stream`).

    Attributes
    ----------
    cause : ErrorCause
        ``NONE`` when the token completed.
    where : int
        ``ERROR_WHERE``: the instruction in which the error was found, :data:`hw.isa.NO_INSTRUCTION` for the
        token packet and the image header (meaningless when ``cause`` is ``NONE``).
    output : bytes
        The words the core sends: the output packet; after an error, the logits already streamed and
        :data:`hw.isa.OUTPUT_ABORT_WORD`, or nothing when no word had left.
    state : ndarray, int64 [L, H]
        The committed state afterwards (the one passed in, after an error).
    partial : bool
        The error was found while the LM head streamed its logits (a ``BAD_TRIT`` in its weights): the core
        sends a prefix of ``output``'s logits, then the abort word (how many depends on its pipeline).
    """

    cause: ErrorCause
    where: int
    output: bytes
    state: np.ndarray
    partial: bool = False


def run_stream(image: bytes, packet: bytes, state: np.ndarray, limits: BuildLimits) -> StreamOutcome:
    """The golden device on raw, possibly malformed input: one token packet, one image (all channels' bytes
    in image order), the committed state, in the order the core checks and runs them (docs/ISA.md section 5):
    the token packet (:func:`check_token_packet`), the image header against the build
    (:func:`host.image.check_image_header`), the token's length against ``hidden``, then each instruction's
    checks (:func:`host.image.iter_instructions`) followed by its run; an instruction's invalid trits
    (``BAD_TRIT``) and then its blocks' CRC words (``WEIGHT_CRC``) stop the token once it has run (what an LM
    head streamed has left). A pure function: the oracle of the malformed-input contract
    (``tests/test_contract.py``).
    """
    state = np.asarray(state, dtype=np.int64)
    if not limits.token_tlast and len(packet) >= 16:
        # an unmarked token packet ends where its length field says: the rest of the stream is the image
        n = int.from_bytes(packet[12:16], "little")
        if 1 <= n <= limits.max_hidden:
            stream = bytes(packet) + bytes(image)
            cut = token_packet_bytes(n)
            packet, image = stream[:cut], stream[cut:]
    mv = memoryview(bytes(image))
    ex: _Executor | None = None
    partial: set[int] = set()
    try:
        token, flags, position = check_token_packet(packet, limits.max_hidden)
        info = check_image_header(mv, limits)
        if token.size != info.hidden:
            raise ImageError(ErrorCause.TOKEN_LENGTH, f"token packet of {token.size} words, the image's hidden "
                             f"size is {info.hidden}")
        if state.ndim != 2 or state.shape[1] != info.hidden:
            raise ValueError(f"state must have shape [layers, {info.hidden}], got {state.shape}")
        # the core's state memory holds the build's layers: a header with another n_layers reads the same rows
        rows = state.shape[0]
        work = np.zeros((max(rows, info.n_layers), info.hidden), np.int64)
        work[:rows] = state
        lut, per = (_BASE3, 5) if info.packing is isa.TritPacking.BASE3 else (_BITS2, 4)
        ex = _Executor(info, nx.sigmoid_table(info.lut_segments_log2, info.gate_frac), lut, per)

        def checked():
            for idx, ins in enumerate(iter_instructions(mv, info, check_trits=False,
                                                        image_tlast=limits.image_tlast)):
                if ins.opcode is Opcode.GEMV:
                    sizes = channel_block_bytes(ins.n, ins.k, info.channels, info.packing)
                    try:
                        start = ins.weight_offset
                        for c, blk in enumerate(ins.blocks):
                            check_block_trits(blk, channel_rows(ins.n, info.channels, c) * ins.k, info.packing,
                                              start, idx)
                            start += sizes[c]
                        check_block_crcs(mv[ins.weight_offset:start], sizes, ins.weight_offset, idx)
                    except ImageError as e:
                        ex.late[idx] = e
                        if e.cause is ErrorCause.BAD_TRIT and InstrFlags.LOGITS in ins.flags:
                            partial.add(idx)
                yield ins

        output, new_state = ex.run(checked(), token, flags, position, work)
        return StreamOutcome(ErrorCause.NONE, 0, output, new_state[:rows])
    except ImageError as e:
        where = isa.NO_INSTRUCTION if e.instruction is None else e.instruction
        words = b""
        if ex is not None and ex.want_logits and ex.sent:
            words = nx.sat32(np.concatenate(ex.sent)).astype("<i4").tobytes()
            words += isa.OUTPUT_ABORT_WORD.to_bytes(4, "little")
        return StreamOutcome(e.cause, where, words, state.copy(), partial=where in partial)


# ------------------------------------------------------------------------------------------- device
class GoldenDevice(Device):
    """The bit-exact golden device behind the :class:`~host.devices.base.Device` interface.

    Parameters
    ----------
    packing : str or TritPacking, optional
        ``"base3"`` or ``"bits2"``: how :meth:`load` compiles a checkpoint, and the only packing a bundle may
        have. Unset (None): a checkpoint compiles ``base3``, a bundle runs with its own.
    channels : int, optional
        Weight channels, likewise: unset, a checkpoint compiles for 1 and a bundle runs with its own.
    lanes, bus_bits, quant_lanes, fmax_mhz, epilogue_folded
        The rest of the build whose cycle counters are predicted (:class:`hw.params.BuildParams`, by the
        :class:`CycleModel` beside the oracle).
    output_gate : {"released", "paper"}
    engine : bool, default True
        Tokens run by the compiled whole-token engine (:mod:`host.devices.golden_engine`), bit-identical to
        the interpreter (``engine=False``, ``--option engine=false``).

    Attributes
    ----------
    build : BuildParams
        The build whose cycles are predicted: after a load, its channel count and packing are the image's.
    options : host.compiler.CompileOptions
        How :meth:`load` compiles a checkpoint.

    Raises
    ------
    ValueError
        On a bad build parameter or packing.
    DeviceError
        From :meth:`load_image`: a bundle of another channel count or packing than the one set, or one whose
        channel count does not divide ``lanes``.
    """

    name = "golden"

    def __init__(self, *, packing: str | isa.TritPacking | None = None, channels: int | None = None,
                 lanes: int = 64, bus_bits: int = 64, quant_lanes: int = 8, fmax_mhz: float = 100.0,
                 output_gate: str = "released", epilogue_folded: bool = False, engine: bool = True) -> None:
        super().__init__()
        self.engine = bool(engine)
        from host.compiler import CompileOptions

        self.build = BuildParams(lanes=lanes, channels=1 if channels is None else channels, bus_bits=bus_bits,
                                 quant_lanes=quant_lanes, packing="base3" if packing is None else packing,
                                 fmax_mhz=fmax_mhz, epilogue_folded=epilogue_folded)
        #: what the user set (a bundle must match it); the rest follows the loaded image
        self._fixed = {"channels": None if channels is None else self.build.channels,
                       "packing": None if packing is None else self.build.packing}
        self.options = CompileOptions(packing=self.build.packing, channels=self.build.channels,
                                      output_gate=output_gate)
        self.machine: GoldenMachine | None = None
        self.timing: CycleModel | None = None
        self._state: np.ndarray | None = None
        self._emb: np.ndarray | None = None
        self.last: TokenResult | None = None

    def _load(self, weights: ModelWeights) -> None:
        from host.compiler import compile_model

        self._take(compile_model(weights, self.options), weights.embeddings, None)

    def _load_image(self, bundle) -> None:
        """Run a compiled bundle's image; its embeddings are already in the residual format."""
        self._take(bundle.image, np.asarray(bundle.embeddings, dtype=np.int32), False)

    def _take(self, image: bytes, embeddings: np.ndarray, convert: bool | None) -> None:
        machine = GoldenMachine(image, engine=self.engine)
        build = self._build_for(machine.info)
        self.timing = CycleModel(machine.image, build)
        self.machine, self.build = machine, build
        self._emb = embeddings
        # float rows are converted per token; a bundle's fixed-point rows are carried as they are
        self._frac = machine.info.residual_frac if convert is None else None
        self._reset()

    def _build_for(self, info) -> BuildParams:
        """The build for an image: its channel count and packing, which must be the ones set (if any)."""
        have = {"channels": info.channels, "packing": info.packing}
        for name, want in self._fixed.items():
            if want is not None and want != have[name]:
                shown = [v.name.lower() if isinstance(v, isa.TritPacking) else v for v in (have[name], want)]
                raise DeviceError(f"device 'golden': the image is compiled for {name}={shown[0]}, the device is "
                                  f"set to {name}={shown[1]}: recompile it, or leave {name} unset to run the "
                                  "image's")
        try:
            return self.build.replace(**have)
        except ValueError as exc:
            raise DeviceError(f"device 'golden': {exc}: set lanes to a multiple of {info.channels} "
                              "(--option lanes=N)") from exc

    def _reset(self) -> None:
        self._state = self.machine.init_state()

    def token_packet(self, token_id: int, position: int = 0, logits: bool = True) -> bytes:
        """The host's embedding lookup for one token, as the accelerator receives it."""
        return embedding_packet(self._emb, token_id, frac=self._frac, position=position, logits=logits)

    def _step(self, token_id: int) -> np.ndarray:
        res = self.machine.run_token(self.token_packet(token_id, self.position), self._state)
        self._state = res.state
        # the hardware's counters: the oracle's activity, the build's cycle model for the timing
        res.per_instruction, res.counters = self.timing.counters(res.per_instruction)
        self.last = res
        for k, v in res.counters.items():
            key = f"hw_{k.name.lower()}"
            self._counters[key] = self._counters.get(key, 0) + int(v)
        return parse_output_packet(res.output).logits()

    def _save_state(self) -> Any:
        return self._state.copy()

    def _restore_state(self, payload: Any) -> None:
        self._state = np.array(payload, dtype=np.int64, copy=True)

    def run_sequence(self, token_ids: Sequence[int]) -> list[TokenResult]:
        """Run tokens from the current state, keeping every :class:`TokenResult` (tests, benchmarks)."""
        out = []
        for t in token_ids:
            self.step(int(t))
            out.append(self.last)
        return out
