"""cocotb 2 scenarios of the top-level Accelerator (launched by ``sim/test_accelerator.py``; pytest does not
collect ``*_tests.py``).

The testbench :class:`TB` owns the clock, the reset, one ``AxiStreamSource`` per weight channel, an
``AxiStreamSink`` on ``m_axis_out``, an ``AxiLiteMaster`` on ``s_axil`` and the in-order output checker. Each
scenario is an ``async def run_*(tb)`` coroutine that makes its own stimulus and expectations with the host
code: models from :mod:`host.compiler` (tiny random ones, or the shipped checkpoint), token packets and channel
streams from :mod:`host.protocol`, output packets, activity counters and error causes from the golden device
(:class:`host.devices.golden.GoldenMachine`, the one oracle). :func:`matrix` registers a scenario as cocotb
tests over idle cycles on the inputs × backpressure on the output (``None`` or :func:`random_pause` each;
Alex Forencich's verilog-axis ``tb/`` style, with cocotb 2's :func:`cocotb.parametrize`):
``<scenario>/idle_inserter=<..>/backpressure_inserter=<..>``.

The build under test (what the simulator was built from and what the golden device predicts counters for)
comes from ``MMFREE_SIM_PARAMS`` (``hw.params.BuildParams.gateware()`` as JSON); the pytest side picks the
scenario with a test filter. Per test a ``timings-*.json`` (cycles, wall time and counters per token) is
written to the working directory (the run directory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import random
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, RisingEdge, SimTimeoutError, with_timeout
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamSink, AxiStreamSource

from host.compiler import CompileOptions, calibrate, compile_model
from host.devices.golden import GoldenMachine, TokenResult
from host.image import ImageError, parse_image
from host.model import HGRNBitConfig, ModelWeights, random_weights
from host.protocol import channel_streams, make_token_packet, parse_output_packet
from hw import isa
from hw import numerics as nx
from hw.isa import REGISTER_MAP, Counter, Ctrl, ErrorCause, InstrFlags, Opcode, Status, TritPacking
from hw.params import BuildParams
from tests.hw.stimulus import biased_image, low_energy, tie_token

# cocotbext-axi 0.1.28 still uses cocotb 1.x APIs that cocotb 2 deprecates (Task.kill, Event.data)
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"cocotbext\.")

R = REGISTER_MAP
CLOCK_NS = 10
ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "models" / "hgrn-bit-pydoc"
#: the environment variable naming the build under test (``BuildParams.gateware()`` as JSON)
BUILD_ENV = "MMFREE_SIM_PARAMS"

#: Activity counters that are exact (not the cycle model's prediction) and compared per token.
EXACT_COUNTERS = (Counter.TRITS, Counter.NONZERO_TRITS, Counter.EPILOGUE_ELEMENTS, Counter.TOKENS)


def build_under_test() -> BuildParams:
    return BuildParams(**json.loads(os.environ[BUILD_ENV]))


# ------------------------------------------------------------------------------------------- inserters
def random_pause(rng: random.Random, p_pause: float = 0.3) -> Iterator[bool]:
    """Pause generator: each cycle paused with probability ``p_pause``, in bursts of 1-4 cycles."""
    while True:
        if rng.random() < p_pause:
            for _ in range(rng.randint(1, 4)):
                yield True
        else:
            yield False


#: A pause inserter: ``None`` (full rate) or a function of a seeded ``random.Random`` giving a pause generator.
Inserter = Callable[[random.Random], Iterator[bool]] | None
INSERTERS = [None, cocotb.Param(random_pause, "random_pause")]


# ------------------------------------------------------------------------------------------- models
@dataclasses.dataclass
class Model:
    weights: ModelWeights
    image: bytes
    residual_frac: int

    def vector(self, token: int) -> np.ndarray:
        """The token's embedding in the residual format."""
        return nx.to_fixed(self.weights.embeddings[token], self.residual_frac)

    def numerics_vectors(self, token: int) -> list[np.ndarray]:
        """A low-energy token and a token with quantize ties, both from ``token``'s embedding."""
        return [low_energy(self.weights.embeddings[token], self.residual_frac),
                tie_token(self.image, self.vector(token))]

    def packet(self, token: int, position: int) -> bytes:
        return make_token_packet(self.vector(token), position=position)


@functools.cache
def shipped_model(packing: TritPacking, channels: int = 1) -> Model:
    """The shipped checkpoint (``models/hgrn-bit-pydoc``) compiled for ``packing`` and ``channels``."""
    from host.checkpoint import load_checkpoint

    w = load_checkpoint(MODEL_DIR).weights
    fm = calibrate(w)
    return Model(w, compile_model(w, CompileOptions(packing=packing, channels=channels, formats=fm)), fm.residual)


@functools.cache
def tiny_model(hidden: int, intermediate: int, layers: int, vocab: int, *, packing: TritPacking,
               channels: int = 1, seed: int = 0, output_gate: str = "released", lower_bound: bool = True,
               biased: bool = False) -> Model:
    """A tiny random model; ``biased``: its GEMVs' ``ssq_bias`` replaced by random values (:func:`biased_image`)."""
    cfg = HGRNBitConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                        intermediate_size=intermediate, use_lower_bound=lower_bound)
    w = random_weights(cfg, seed=seed, gamma_spread=1.0)
    fm = calibrate(w, output_gate=output_gate, n_tokens=16)
    options = CompileOptions(packing=packing, channels=channels, formats=fm, output_gate=output_gate)
    img = biased_image(w, options, seed=seed) if biased else compile_model(w, options)
    return Model(w, img, fm.residual)


# (hidden, intermediate, layers, vocab, output gate, lower bound): sizes not multiples of the lanes (16, 32,
# 64), of 5 (the base-3 byte) or of the beat (8/16 bytes); some below and some above the lanes, some rows of
# one chunk and some of several, a vocabulary smaller and larger than the lanes.
RANDOM_SHAPES = [
    (7, 11, 1, 13, "released", True),
    (21, 38, 2, 67, "paper", True),
    (23, 57, 1, 101, "released", False),
    (37, 83, 2, 29, "paper", False),
    (71, 139, 1, 97, "released", True),
    (20, 28, 2, 61, "released", True),     # test_top's TINY: sizes that are multiples of 4 and 5
]


# ------------------------------------------------------------------------------------------- bad streams
def golden_cause(image: bytes, packet: bytes, state: np.ndarray, build: BuildParams) -> tuple[ErrorCause, int | None]:
    """The cause (and instruction) the golden device reports for these bytes."""
    try:
        GoldenMachine(image, build).run_token(packet, state)
    except ImageError as e:
        return e.cause, e.instruction
    raise AssertionError("the golden device accepts the corrupted stream")


def _reseal_instr(img: bytearray, offset: int) -> None:
    head = bytes(img[offset:offset + 60])
    img[offset + 60:offset + 64] = isa.crc32_words(head).to_bytes(4, "little")


def bad_images(image: bytes, beat: int) -> dict[str, bytes]:
    """Corrupted variants of a good 1-channel image, by case name."""
    pi = parse_image(image)
    ins = pi.instructions
    gemvs = [j for j, i in enumerate(ins) if i.opcode is Opcode.GEMV]
    with_consts = [j for j in gemvs if ins[j].consts or InstrFlags.QCONST in ins[j].flags]
    out = {}

    img = bytearray(image)
    img[0] ^= 0x01
    out["header-magic"] = bytes(img)

    img = bytearray(image)
    img[9] ^= 0x04          # a header field (channels byte) without its CRC
    out["header-crc"] = bytes(img)

    img = bytearray(image)
    img[ins[gemvs[2]].offset + 12] ^= 0x01   # n/k of a GEMV header, CRC not updated
    out["instr-crc"] = bytes(img)

    img = bytearray(image)
    j = gemvs[1]
    img[ins[j].offset] = 0x7E        # opcode, CRC resealed
    _reseal_instr(img, ins[j].offset)
    out["unknown-opcode"] = bytes(img)

    img = bytearray(image)
    img[ins[with_consts[1]].offset + 64] ^= 0x10    # first constant word
    out["const-crc"] = bytes(img)

    img = bytearray(image)
    # an invalid trit byte: base-3 > 242, or a 2-bit code 0b10
    img[ins[gemvs[3]].weight_offset + 1] = 0xFF if pi.info.packing is TritPacking.BASE3 else 0xAA
    out["bad-trit"] = bytes(img)

    # truncated streams (tlast early, on a beat boundary): inside a weight block, inside the constants,
    # right after an instruction header, inside the image header
    j = gemvs[len(gemvs) // 2]
    cut = ins[j].weight_offset + ((len(ins[j].blocks[0]) // 2) // beat) * beat
    out["truncated-weights"] = bytes(image[:max(cut, ins[j].weight_offset + beat)])
    out["truncated-consts"] = bytes(image[:ins[with_consts[-1]].offset + 64 + beat])
    out["truncated-after-header"] = bytes(image[:ins[gemvs[-1]].offset + 64])
    out["truncated-image-header"] = bytes(image[:32])
    return out


BAD_STREAM_CASES = ["header-magic", "header-crc", "instr-crc", "unknown-opcode", "const-crc", "bad-trit",
                    "truncated-weights", "truncated-consts", "truncated-after-header", "truncated-image-header",
                    "token-crc"]


# ------------------------------------------------------------------------------------------- checker
def describe_mismatch(got: bytes, exp: bytes) -> str:
    """Which fields of two output packets differ (bytes compared first; fields help debugging)."""
    lines = [f"{len(got)} bytes received, {len(exp)} expected"]
    try:
        a = parse_output_packet(got)
    except ValueError as e:
        lines.append(f"received packet does not parse: {e}")
        return "; ".join(lines)
    try:
        b = parse_output_packet(exp)
    except ValueError as e:
        lines.append(f"expected packet does not parse: {e}")
        return "; ".join(lines)
    for f in ("position", "argmax", "max_acc", "scale_mant", "scale_shift"):
        if getattr(a, f) != getattr(b, f):
            lines.append(f"{f}: {getattr(a, f)} != {getattr(b, f)}")
    if a.logits_acc.shape != b.logits_acc.shape:
        lines.append(f"logits: {a.logits_acc.size} != {b.logits_acc.size}")
    else:
        bad = np.flatnonzero(a.logits_acc != b.logits_acc)
        if bad.size:
            lines.append(f"{bad.size} logits differ, first at {bad[0]}: {a.logits_acc[bad[0]]} != "
                         f"{b.logits_acc[bad[0]]}")
    return "; ".join(lines)


class OutputChecker:
    """In-order scoreboard of ``m_axis_out``: every received packet must equal the next expected one. A
    mismatch (or a packet nobody expected) is kept in :attr:`errors` and raised by :meth:`wait_empty` and
    :meth:`assert_clean`."""

    def __init__(self, sink: AxiStreamSink, log: logging.Logger):
        self.sink = sink
        self.log = log
        self.expected: deque[tuple[bytes, str, bool]] = deque()
        self.errors: list[str] = []
        self.received = 0
        self.promised = 0
        self.changed = Event()
        self.task = cocotb.start_soon(self._run())

    def expect(self, packet: bytes, label: str, *, aborted: bool = False) -> None:
        """The next packet must equal ``packet``; with ``aborted``, it must be a prefix of ``packet`` (the
        logits sent before an error) closed by :data:`hw.isa.OUTPUT_ABORT_WORD`."""
        self.expected.append((packet, label, aborted))
        self.promised += 1

    def _check(self, got: bytes) -> None:
        if not self.expected:
            raise AssertionError(f"unexpected output packet of {len(got)} bytes")
        exp, label, aborted = self.expected.popleft()
        if aborted:
            closing = isa.OUTPUT_ABORT_WORD.to_bytes(4, "little")
            assert got[-4:] == closing, f"{label}: the cut-short packet does not end with OUTPUT_ABORT_WORD"
            body = got[:-4]
            assert len(body) < len(exp) and body == exp[:len(body)], \
                f"{label}: the {len(body)} bytes before the closing word are not the golden packet's start"
            self.log.info("%s: cut-short output packet closed (%d logit bytes bit-exact)", label, len(body))
        else:
            assert got == exp, f"{label}: output packet differs from golden: {describe_mismatch(got, exp)}"
            self.log.info("%s: output packet bit-exact (%d bytes)", label, len(got))

    async def _run(self) -> None:
        while True:
            frame = await self.sink.recv()
            try:
                self._check(bytes(frame.tdata))
                self.received += 1
            except AssertionError as e:
                self.errors.append(str(e))
            self.changed.set()

    def clear(self) -> None:
        """Forget what is pending and the errors (after a failed error case, whose failure is reported)."""
        self.promised -= len(self.expected)
        self.expected.clear()
        self.errors.clear()

    def assert_clean(self) -> None:
        """No mismatch and no unexpected packet so far."""
        assert not self.errors, "; ".join(self.errors)

    async def wait_empty(self, timeout_ns: int) -> None:
        """Until every expected packet arrived; raises the first mismatch, or ``SimTimeoutError``."""
        async def waiter():
            while self.expected and not self.errors:
                self.changed.clear()
                await self.changed.wait()

        await with_timeout(waiter(), timeout_ns, "ns")
        self.assert_clean()


# ------------------------------------------------------------------------------------------- testbench
class TB:
    """Clock, reset, one AxiStreamSource per weight channel, an AxiStreamSink on ``m_axis_out``, an
    AxiLiteMaster on ``s_axil`` and the in-order output checker, for the build under test."""

    def __init__(self, dut, *, seed: int = 1):
        self.dut = dut
        self.build = build_under_test()
        self.channels = self.build.channels
        self.beat_bytes = self.build.bus_bits // 8
        self.log = logging.getLogger("cocotb.tb")
        self.log.setLevel(logging.INFO)
        self.rng = random.Random(seed)
        dut.rst.value = 1
        Clock(dut.clk, CLOCK_NS, unit="ns").start()
        self.source = [AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_w{c}", bus_separator="__"), dut.clk,
                                       dut.rst) for c in range(self.channels)]
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_out", bus_separator="__"), dut.clk, dut.rst)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil", bus_separator="__"), dut.clk, dut.rst)
        for bfm in (*self.source, self.sink):
            bfm.log.setLevel(logging.WARNING)   # (a TX frame's repr is the whole image)
        self.axil.write_if.log.setLevel(logging.WARNING)
        self.axil.read_if.log.setLevel(logging.WARNING)
        self.checker = OutputChecker(self.sink, self.log)
        self.idle_inserter: Inserter = None
        self.backpressure_inserter: Inserter = None
        self.last_token_ns = 0
        self.timings: list[dict] = []

    # ---------------------------------------------------------------------------------- stalls
    def _pauses(self, generator: Inserter):
        return generator(random.Random(self.rng.random())) if generator is not None else None

    def set_idle_generator(self, generator: Inserter = None) -> None:
        """Idle cycles on every weight channel."""
        self.idle_inserter = generator
        for s in self.source:
            s.set_pause_generator(self._pauses(generator))

    def set_backpressure_generator(self, generator: Inserter = None) -> None:
        """Backpressure on ``m_axis_out``."""
        self.backpressure_inserter = generator
        self.sink.set_pause_generator(self._pauses(generator))

    def set_axil_generators(self, idle: Inserter = None, backpressure: Inserter = None) -> None:
        """Idle cycles on the AXI4-Lite request channels (AW, W, AR), backpressure on its responses (B, R):
        five more coroutines per cycle, so only where the register block is the subject."""
        wr, rd = self.axil.write_if, self.axil.read_if
        for ch in (wr.aw_channel, wr.w_channel, rd.ar_channel):
            ch.set_pause_generator(self._pauses(idle))
        for ch in (wr.b_channel, rd.r_channel):
            ch.set_pause_generator(self._pauses(backpressure))

    @property
    def stalled(self) -> bool:
        return self.idle_inserter is not None or self.backpressure_inserter is not None

    def timeout_ns(self, cycles: int) -> int:
        return ((6 if self.stalled else 3) * int(cycles) + 50_000) * CLOCK_NS

    # ---------------------------------------------------------------------------------- access
    async def reset(self) -> None:
        for s in self.source:
            s.clear()
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 5)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def read(self, addr: int) -> int:
        return await self.axil.read_dword(addr)

    async def write(self, addr: int, value: int) -> None:
        await self.axil.write_dword(addr, value)

    async def counter(self, c: Counter) -> int:
        lo = await self.read(R.counter(c))
        hi = await self.read(R.counter(c) + 4)
        return lo | hi << 32

    async def counters(self) -> dict[Counter, int]:
        return {c: await self.counter(c) for c in Counter}

    def cycles(self) -> int:
        return int(get_sim_time(unit="ns")) // CLOCK_NS

    def send(self, packet: bytes, streams: Sequence[bytes]) -> None:
        """Queue one token: channel 0 the token packet then its image stream, channel c its weight blocks."""
        assert len(streams) == self.channels, \
            f"image with {len(streams)} channel streams, the build has {self.channels}"
        for c, s in enumerate(streams):
            assert len(s) % self.beat_bytes == 0, f"channel {c} stream of {len(s)} bytes: not whole beats"
        self.source[0].send_nowait(packet)
        for c, s in enumerate(streams):
            self.source[c].send_nowait(s)

    async def sources_idle(self, timeout_ns: int) -> None:
        async def waiter():
            for s in self.source:
                await s.wait()

        await with_timeout(waiter(), timeout_ns, "ns")

    # ---------------------------------------------------------------------------------- token
    async def token(self, streams: Sequence[bytes], packet: bytes, gold: TokenResult, label: str) -> None:
        """One token: its output packet bit-exact with the golden device's, the exact activity counters,
        STATUS (done only), ``irq``, POSITION and ARGMAX."""
        before = await self.counters()
        t0, w0 = self.cycles(), time.perf_counter()
        golden_cycles = gold.counters[Counter.CYCLES]
        self.checker.expect(gold.output, label)
        self.send(packet, streams)
        await self.checker.wait_empty(self.timeout_ns(golden_cycles))
        t1, w1 = self.cycles(), time.perf_counter()
        self.last_token_ns = (t1 - t0) * CLOCK_NS
        await ClockCycles(self.dut.clk, 2)
        status = await self.read(R.STATUS)
        assert status == Status.DONE.value, f"{label}: STATUS 0x{status:x} after the output packet (done only expected)"
        assert self.dut.irq.value == 1, f"{label}: irq low after a completed token"
        after = await self.counters()
        for c in EXACT_COUNTERS:
            got = after[c] - before[c]
            assert got == gold.counters[c], \
                f"{label}: counter {c.name} advanced by {got}, the golden device says {gold.counters[c]}"
        out = parse_output_packet(gold.output)
        assert await self.read(R.POSITION) == out.position, f"{label}: POSITION register"
        assert await self.read(R.ARGMAX) == out.argmax, f"{label}: ARGMAX register"
        rate = (t1 - t0) / max(w1 - w0, 1e-9) / 1e3
        self.timings.append({"label": label, "cycles": t1 - t0, "golden_cycles": int(golden_cycles),
                             "wall_s": round(w1 - w0, 2), "kcycles_per_s": round(rate, 1),
                             "counters": {c.name: after[c] - before[c] for c in Counter},
                             "golden_counters": {c.name: int(v) for c, v in gold.counters.items()}})
        self.log.info("%s: %d cycles (golden model %d), %.1f s, %.1f kcycles/s", label, t1 - t0, golden_cycles,
                      w1 - w0, rate)

    async def tokens(self, model: Model, tokens: Sequence[int | np.ndarray], *, state: np.ndarray | None = None,
                     start_pos: int = 0, label: str = "") -> np.ndarray:
        """Consecutive tokens of ``model`` from ``state`` (zero: after reset), each checked by :meth:`token`;
        returns the golden state after them. A token is an id, or a vector already in the residual format."""
        gold = GoldenMachine(model.image, self.build)
        streams = channel_streams(model.image, self.channels)
        state = gold.init_state() if state is None else state
        for j, t in enumerate(tokens):
            vec = isinstance(t, np.ndarray)
            pk = make_token_packet(t, position=start_pos + j) if vec else model.packet(t, start_pos + j)
            res = gold.run_token(pk, state)
            state = res.state
            await self.token(streams, pk, res, f"{label} token {'vector' if vec else t} @ {start_pos + j}")
        return state

    # ---------------------------------------------------------------------------------- errors
    async def bad(self, case: str, streams: Sequence[bytes], packet: bytes, cause: ErrorCause, where: int | None,
                  *, abort_at: float | str | None = None, partial: bytes | None = None) -> list[str]:
        """One bad stream (or a good one aborted by ``CTRL.abort``: at ``abort_at`` of the previous good token's
        duration, or at ``"first-output"``, when the LM head's first logit leaves): the core drains its inputs,
        ``STATUS.error`` (not busy, ``irq``), ``ERROR_CAUSE`` = ``cause``, ``ERROR_WHERE`` = ``where`` (when
        given), no stray output (``partial``: the golden output packet whose start the error cut short, which
        must arrive closed by ``OUTPUT_ABORT_WORD``), then ``CTRL.clear`` clears the error. Returns the
        problems found (empty: the case passed)."""
        problems = []
        total = sum(len(s) for s in streams) + len(packet)
        drain_ns = self.timeout_ns(4 * total // self.beat_bytes)
        t0 = self.cycles()
        self.send(packet, streams)
        if partial is not None:     # an error while logits stream: the packet must be closed, not left open
            self.checker.expect(partial, f"{case}: cut-short output", aborted=True)
        if abort_at == "first-output":
            async def first_output():
                while not (self.dut.m_axis_out__tvalid.value and self.dut.m_axis_out__tready.value):
                    await RisingEdge(self.dut.clk)
            await with_timeout(first_output(), drain_ns, "ns")
            await self.write(R.CTRL, Ctrl.ABORT.value)
        elif abort_at is not None:
            await ClockCycles(self.dut.clk, max(1, int(abort_at * self.last_token_ns) // CLOCK_NS))
            status = await self.read(R.STATUS)
            if not status & Status.BUSY.value:
                problems.append(f"core not busy when the abort was due (STATUS 0x{status:x})")
            await self.write(R.CTRL, Ctrl.ABORT.value)
        try:
            await self.sources_idle(drain_ns)
        except SimTimeoutError:
            problems.append("the core stopped taking the bad stream (it must drain its inputs in error)")
        status = 0

        async def wait_error():
            nonlocal status
            while True:
                status = await self.read(R.STATUS)
                if status & Status.ERROR.value:
                    return
                await ClockCycles(self.dut.clk, 50)

        try:
            await with_timeout(wait_error(), 20_000 * CLOCK_NS, "ns")
        except SimTimeoutError:
            problems.append(f"STATUS.error not set 20000 cycles after the whole stream was sent "
                            f"(STATUS 0x{status:x}, expected cause {cause.name})")
            return problems
        got = await self.read(R.ERROR_CAUSE)
        try:
            cause_name = ErrorCause(got).name
        except ValueError:
            cause_name = f"unknown {got}"
        if got != cause.value:
            problems.append(f"ERROR_CAUSE {cause_name}, the golden device reports {cause.name}")
        if where is not None:
            w = await self.read(R.ERROR_WHERE)
            if w != where:
                problems.append(f"ERROR_WHERE {w}, the golden device reports instruction {where}")
        if status & Status.BUSY.value:
            problems.append(f"STATUS 0x{status:x}: busy in error")
        if self.dut.irq.value != 1:
            problems.append("irq low in error")
        if self.checker.expected and partial is not None:
            with contextlib.suppress(SimTimeoutError, AssertionError):
                await self.checker.wait_empty(2_000 * CLOCK_NS)
            # the sink clears `active` on the first cycle after a packet's last beat, not on that beat
            await ClockCycles(self.dut.clk, 2)
        if self.sink.active:
            problems.append("a partial output packet (no tlast) was left on m_axis_out")
        if self.checker.expected:
            problems.append("an expected output packet is pending (an open packet was not closed)")
        problems += self.checker.errors
        await self.write(R.CTRL, Ctrl.CLEAR.value)
        await ClockCycles(self.dut.clk, 2)
        status = await self.read(R.STATUS)
        if status & Status.ERROR.value:
            problems.append(f"STATUS 0x{status:x} after CTRL.clear (error still set)")
        if await self.read(R.ERROR_CAUSE) != 0:
            problems.append("ERROR_CAUSE not cleared by CTRL.clear")
        self.log.info("bad stream %s: %s after %d cycles%s", case, cause_name, self.cycles() - t0,
                      "" if not problems else f"; PROBLEMS: {problems}")
        return problems

    async def reset_mid_token(self, streams: Sequence[bytes], packet: bytes, at: float) -> None:
        """Send a good token and pull ``rst`` at ``at`` of the previous token's duration: STATUS and the
        counters read zero afterwards."""
        self.send(packet, streams)
        await ClockCycles(self.dut.clk, max(1, int(at * self.last_token_ns) // CLOCK_NS))
        status = await self.read(R.STATUS)
        assert status & Status.BUSY.value, f"core not busy when the reset was due (STATUS 0x{status:x})"
        await self.reset()
        status = await self.read(R.STATUS)
        assert status == 0, f"STATUS 0x{status:x} after reset"
        for c in (Counter.TOKENS, Counter.CYCLES):
            assert await self.counter(c) == 0, f"counter {c.name} not cleared by reset"

    def write_timings(self, name: str) -> None:
        if self.timings:
            Path(f"timings-{name}.json").write_text(json.dumps(self.timings, indent=1) + "\n")


# ------------------------------------------------------------------------------------------- scenarios
async def run_id_block(tb: TB) -> None:
    """The ID block reports the build parameters; control/status/counters read zero after reset; ID writes are
    ignored; CTRL.clear with nothing to clear is harmless. (The AXI4-Lite channels stall too.)"""
    tb.set_axil_generators(tb.idle_inserter, tb.backpressure_inserter)
    await tb.reset()
    b = tb.build
    want = {
        R.ID_MAGIC: isa.ID_MAGIC, R.ID_VERSION: isa.ISA_VERSION, R.ID_LANES: b.lanes,
        R.ID_CHANNELS: b.channels, R.ID_BUS_BITS: b.bus_bits,
        R.ID_PACKINGS: 1 << b.packing.value, R.ID_MAX_HIDDEN: b.max_hidden,
        R.ID_MAX_INTERMEDIATE: b.max_intermediate, R.ID_MAX_LAYERS: b.max_layers,
        R.ID_MAX_VOCAB: isa.MAX_VOCAB, R.ID_QUANT_LANES: b.quant_lanes, R.ID_ACC_BITS: isa.ACC_BITS,
        R.ID_EPILOGUE: int(b.epilogue_folded),
    }
    assert (await tb.read(R.ID_MAGIC)).to_bytes(4, "little") == b"MMFA"
    assert await tb.read(R.ID_VERSION) == 2      # ISA version 2: the epsilon-carrying scale, half-away codes
    for off, v in want.items():
        got = await tb.read(off)
        assert got == v, f"ID register 0x{off:02x}: 0x{got:x}, expected 0x{v:x}"
    await tb.write(R.ID_LANES, 0xDEAD)
    assert await tb.read(R.ID_LANES) == b.lanes
    for off in (R.STATUS, R.ERROR_CAUSE, R.ERROR_WHERE, R.POSITION, R.ARGMAX, R.CTRL, 0x34, 0x3C, 0x7C, 0xFC):
        got = await tb.read(off)
        assert got == 0, f"register 0x{off:02x} reads 0x{got:x} after reset"
    for c in Counter:
        assert await tb.counter(c) == 0, f"counter {c.name} non-zero after reset"
    assert tb.dut.irq.value == 0
    await tb.write(R.CTRL, Ctrl.CLEAR.value)
    assert await tb.read(R.STATUS) == 0


async def run_shipped_two_tokens(tb: TB) -> None:
    """Two consecutive tokens of ``models/hgrn-bit-pydoc`` (state carried), bit-exact."""
    model = shipped_model(tb.build.packing, tb.channels)
    await tb.reset()
    await tb.tokens(model, [5, 17], label=f"shipped, {tb.channels} channel(s)")


async def _random_models(tb: TB, shapes) -> None:
    """Per shape a tiny random model after a hard reset: two token ids, a low-energy token and a token whose
    first GEMV quantizes exact ties in both signs, each bit-exact, state carried."""
    for n, (h, i, layers, v, gate, lb) in enumerate(shapes):
        model = tiny_model(h, i, layers, v, packing=tb.build.packing, channels=tb.channels, seed=10 + n,
                           output_gate=gate, lower_bound=lb)
        await tb.reset()
        rng = np.random.default_rng(n)
        ids = [int(t) for t in rng.integers(0, v, 2)]
        await tb.tokens(model, [*ids, *model.numerics_vectors(ids[0])],
                        label=f"H{h} I{i} L{layers} V{v} {gate}{' lb' if lb else ''}")


async def run_random_models(tb: TB) -> None:
    """Whole tokens of six tiny random models: sizes not multiples of the lanes, of 5 or of the beat, both
    output gates, with and without the lower bound (every epilogue program the compiler emits)."""
    await _random_models(tb, RANDOM_SHAPES)


async def run_two_channels(tb: TB) -> None:
    """Rows split over two weight channels (``s_axis_w0``, ``s_axis_w1``): four tiny random models."""
    assert tb.channels == 2, f"a two-channel scenario on a build of {tb.channels} channel(s)"
    await _random_models(tb, RANDOM_SHAPES[:4])


async def run_numerics(tb: TB) -> None:
    """Random ssq_bias/ssq_bias_shift (up to ~2**63) in every quantizing GEMV of a tiny model: the statistic's
    sum carries between its halves; with a low-energy token and quantize ties."""
    for n, (h, i, layers, v, gate, lb) in enumerate((RANDOM_SHAPES[5], RANDOM_SHAPES[1])):
        model = tiny_model(h, i, layers, v, packing=tb.build.packing, channels=tb.channels, seed=20 + n,
                           output_gate=gate, lower_bound=lb, biased=True)
        await tb.reset()
        await tb.tokens(model, [3, 11, *model.numerics_vectors(3)], label=f"biased H{h} I{i} {gate}")


async def _error_cases(tb: TB, cases: Sequence[str]) -> None:
    """Per case: hard reset, a good token A, the bad stream (checked by :meth:`TB.bad`), a good token B whose
    expected output is the golden run from the state A committed: a bad stream that changed the committed
    state (or left the core unable to take a good image) fails B. ``hard-reset-mid-token`` pulls ``rst``
    instead: B then runs from the zero state."""
    build = tb.build
    assert tb.channels == 1, "the corrupted images are made for one channel"
    model = tiny_model(21, 38, 1, 67, packing=build.packing, seed=5)   # one layer: 9 instructions a token
    gold = GoldenMachine(model.image, build)
    good = channel_streams(model.image, 1)
    pk_a, pk_bad, pk_b = model.packet(11, 0), model.packet(42, 1), model.packet(3, 1)
    res_a = gold.run_token(pk_a, gold.init_state())
    res_b = gold.run_token(pk_b, res_a.state)
    res_b0 = gold.run_token(pk_b, gold.init_state())
    assert res_b.output != res_b0.output   # B's output depends on the state it starts from
    bads = bad_images(model.image, tb.beat_bytes)

    failures = []
    for case in cases:
        await tb.reset()
        await tb.token(good, pk_a, res_a, f"{case}: token A")
        b = res_b
        if case == "hard-reset-mid-token":
            await tb.reset_mid_token(good, pk_bad, at=0.5)
            b = res_b0
            problems = []
        elif case in ("abort-mid-token", "abort-in-lm-head"):
            lm = case == "abort-in-lm-head"
            partial = gold.run_token(pk_bad, res_a.state).output if lm else None
            problems = await tb.bad(case, good, pk_bad, ErrorCause.ABORTED, None,
                                    abort_at="first-output" if lm else 0.5, partial=partial)
        elif case == "token-crc":
            bad = bytearray(pk_bad)
            bad[20] ^= 0x01
            cause, where = golden_cause(model.image, bytes(bad), res_a.state, build)
            problems = await tb.bad(case, good, bytes(bad), cause, where)
        else:
            cause, where = golden_cause(bads[case], pk_bad, res_a.state, build)
            problems = await tb.bad(case, channel_streams(bads[case], 1), pk_bad, cause, where)
        if problems:
            failures.append(f"{case}: " + "; ".join(problems))
            await tb.reset()            # recover for the next case
            tb.checker.clear()
            continue
        await tb.token(good, pk_b, b, f"{case}: token B")
    assert not failures, "error cases failed:\n  " + "\n  ".join(failures)


async def run_bad_input(tb: TB) -> None:
    """Bad header magic/CRC, instruction CRC, unknown opcode, constant CRC, invalid trit, four truncations,
    token CRC: error and cause as the golden device, no stray output, recovery by CTRL.clear, the committed
    state unchanged."""
    await _error_cases(tb, BAD_STREAM_CASES)


async def run_abort(tb: TB) -> None:
    """``CTRL.abort`` half-way through a token: ``ABORTED``, no stray output, the committed state unchanged."""
    await _error_cases(tb, ["abort-mid-token"])


async def run_reset_clears_state(tb: TB) -> None:
    """``rst`` half-way through a token: STATUS and counters zero, the next token runs from the zero state."""
    await _error_cases(tb, ["hard-reset-mid-token"])


async def run_error_during_lm_head_closes_output(tb: TB) -> None:
    """``CTRL.abort`` at the LM head's first logit: the open output packet arrives closed by
    ``OUTPUT_ABORT_WORD`` with ``tlast`` (the logits before it bit-exact), so an AXI4-Stream receiver (S2MM
    DMA) does not append the next token's packet to it; ``ABORTED``; the next token bit-exact from the
    unchanged state."""
    await _error_cases(tb, ["abort-in-lm-head"])


# ------------------------------------------------------------------------------------------- registration
def matrix(scenario: Callable[[TB], object]):
    """cocotb tests named after ``scenario`` (``run_<name>``) over idle_inserter × backpressure_inserter
    (:data:`INSERTERS`); each starts a :class:`TB`, sets the inserters, resets, runs the scenario and asserts
    that the scoreboard saw no mismatch, no unexpected packet and nothing left pending."""
    name = scenario.__name__.removeprefix("run_")

    async def test(dut, idle_inserter: Inserter, backpressure_inserter: Inserter) -> None:
        tb = TB(dut)
        tb.set_idle_generator(idle_inserter)
        tb.set_backpressure_generator(backpressure_inserter)
        await tb.reset()
        await scenario(tb)
        tb.checker.assert_clean()
        assert not tb.checker.expected, f"{len(tb.checker.expected)} expected output packets never arrived"
        assert tb.checker.received == tb.checker.promised, \
            f"{tb.checker.received} output packets checked, {tb.checker.promised} expected"
        tags = ["idle" if idle_inserter else "", "backpressure" if backpressure_inserter else ""]
        tb.write_timings("-".join([name, *filter(None, tags)]))

    test.__name__ = test.__qualname__ = name
    test.__doc__ = scenario.__doc__
    return cocotb.test(cocotb.parametrize(idle_inserter=INSERTERS, backpressure_inserter=INSERTERS)(test))


id_block = matrix(run_id_block)
shipped_two_tokens = matrix(run_shipped_two_tokens)
random_models = matrix(run_random_models)
two_channels = matrix(run_two_channels)
numerics = matrix(run_numerics)
bad_input = matrix(run_bad_input)
abort = matrix(run_abort)
reset_clears_state = matrix(run_reset_clears_state)
error_during_lm_head_closes_output = matrix(run_error_during_lm_head_closes_output)


@cocotb.test()
async def checker_catches_a_wrong_output(dut) -> None:
    """The scoreboard is not vacuous: one logit off by one in the expected packet fails the token."""
    tb = TB(dut)
    await tb.reset()
    model = tiny_model(7, 11, 1, 13, packing=tb.build.packing, channels=tb.channels, seed=10)
    gold = GoldenMachine(model.image, tb.build)
    pk = model.packet(3, 0)
    res = gold.run_token(pk, gold.init_state())
    wrong = bytearray(res.output)
    wrong[4 * 5] ^= 0x01          # logit 5
    try:
        await tb.token(channel_streams(model.image, tb.channels), pk, dataclasses.replace(res, output=bytes(wrong)),
                       "wrong")
    except AssertionError as e:
        assert "differs from golden" in str(e), f"the token failed for another reason: {e}"
    else:
        raise AssertionError("a wrong expected output packet passed the scoreboard")
