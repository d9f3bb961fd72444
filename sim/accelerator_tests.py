"""cocotb 2 tests of the top-level Accelerator (run by ``sim/test_accelerator.py``, not collected by pytest).

The stimulus and the golden expectations come from the files of the run directory named by the JSON
manifest in ``MMFREE_SIM_MANIFEST`` (written by ``test_accelerator.py`` with the host's compiler and the
golden device): this side only drives the streams, reads the registers and compares bytes.

Manifest: ``build`` (Accelerator parameters), ``stress`` (random idle cycles on every input stream and
the AXI4-Lite request channels, random backpressure on the output and the AXI4-Lite responses), ``seed``,
``images`` (per image the files of its channel streams) and ``steps``:

* ``{"op": "reset"}``: hard reset (``rst``): the committed state reads as zero afterwards;
* ``{"op": "token", "image", "packet", "expect", "counters", "cycles", "label"}``: one token, its output
  packet bit-exact with the golden device's, the exact activity counters, STATUS/POSITION/ARGMAX;
* ``{"op": "bad", "case", "image", "packet", "cause", "where", "abort_at"}``: a bad stream (or a good one
  aborted by ``CTRL.abort``: at a fraction of the previous good token's duration, or ``"first-output"``
  when the LM head's first logit leaves): ``STATUS.error``, ``ERROR_CAUSE`` (and ``ERROR_WHERE`` when the
  golden device names the instruction), no stray output (``partial``: the golden output packet whose
  start an error cut short, which must arrive closed by ``OUTPUT_ABORT_WORD``), then ``CTRL.clear``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
import warnings
from collections import deque
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, RisingEdge, with_timeout
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiLiteBus, AxiLiteMaster, AxiStreamBus, AxiStreamSink, AxiStreamSource

from hw import isa
from hw.isa import REGISTER_MAP, Counter, Ctrl, ErrorCause, Status, TritPacking

# cocotbext-axi 0.1.28 still uses cocotb 1.x APIs that cocotb 2 deprecates (Task.kill, Event.data)
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"cocotbext\.")

R = REGISTER_MAP
CLOCK_NS = 10


def load_manifest() -> tuple[dict, Path]:
    path = Path(os.environ["MMFREE_SIM_MANIFEST"])
    return json.loads(path.read_text()), path.parent


def _random_pauses(rng: random.Random, p_idle: float):
    """Pause generator: each cycle paused with probability ``p_idle``, in bursts of 1-4 cycles."""
    while True:
        if rng.random() < p_idle:
            for _ in range(rng.randint(1, 4)):
                yield True
        else:
            yield False


def describe_mismatch(got: bytes, exp: bytes) -> str:
    """Which fields of two output packets differ (bytes compared first; fields help debugging)."""
    from host.protocol import parse_output_packet

    lines = [f"{len(got)} bytes received, {len(exp)} expected"]
    try:
        a = parse_output_packet(got)
    except ValueError as e:
        lines.append(f"received packet does not parse: {e}")
        return "; ".join(lines)
    b = parse_output_packet(exp)
    for f in ("position", "argmax", "max_acc", "scale_mant", "scale_shift"):
        if getattr(a, f) != getattr(b, f):
            lines.append(f"{f}: {getattr(a, f)} != {getattr(b, f)}")
    if a.logits_acc.shape != b.logits_acc.shape:
        lines.append(f"logits: {a.logits_acc.size} != {b.logits_acc.size}")
    else:
        import numpy as np

        bad = np.flatnonzero(a.logits_acc != b.logits_acc)
        if bad.size:
            lines.append(f"{bad.size} logits differ, first at {bad[0]}: {a.logits_acc[bad[0]]} != "
                         f"{b.logits_acc[bad[0]]}")
    return "; ".join(lines)


class OutputChecker:
    """In-order scoreboard of ``m_axis_out``: every received packet must equal the next expected one."""

    def __init__(self, sink: AxiStreamSink, log: logging.Logger):
        self.sink = sink
        self.log = log
        self.expected: deque[tuple[bytes, str]] = deque()
        self.received = 0
        self.changed = Event()
        self.task = cocotb.start_soon(self._run())

    def expect(self, packet: bytes, label: str, *, aborted: bool = False) -> None:
        """The next packet must equal ``packet``; with ``aborted``, it must be a prefix of ``packet`` (the
        logits sent before an error) closed by :data:`hw.isa.OUTPUT_ABORT_WORD`."""
        self.expected.append((packet, label, aborted))

    async def _run(self) -> None:
        while True:
            frame = await self.sink.recv()
            got = bytes(frame.tdata)
            assert self.expected, f"unexpected output packet of {len(got)} bytes"
            exp, label, aborted = self.expected.popleft()
            if aborted:
                closing = isa.OUTPUT_ABORT_WORD.to_bytes(4, "little")
                assert got[-4:] == closing, f"{label}: the cut-short packet does not end with OUTPUT_ABORT_WORD"
                body = got[:-4]
                assert len(body) < len(exp) and body == exp[:len(body)], \
                    f"{label}: the {len(body)} bytes before the closing word are not the golden packet's start"
                self.received += 1
                self.log.info("%s: cut-short output packet closed (%d logit bytes bit-exact)", label, len(body))
                self.changed.set()
                continue
            assert got == exp, f"{label}: output packet differs from golden: {describe_mismatch(got, exp)}"
            self.received += 1
            self.log.info("%s: output packet bit-exact (%d bytes)", label, len(got))
            self.changed.set()

    async def wait_empty(self, timeout_ns: int) -> None:
        async def waiter():
            while self.expected:
                self.changed.clear()
                await self.changed.wait()

        await with_timeout(waiter(), timeout_ns, "ns")


class TB:
    """Clock, reset, one AxiStreamSource per weight channel, an AxiStreamSink on ``m_axis_out``, an
    AxiLiteMaster on ``s_axil``, the golden expectations (files) and the in-order output checker."""

    def __init__(self, dut):
        self.dut = dut
        self.m, self.dir = load_manifest()
        b = self.m["build"]
        self.build = b
        self.channels = b["channels"]
        self.beat_bytes = b["bus_bits"] // 8
        self.log = logging.getLogger("cocotb.tb")
        self.log.setLevel(logging.INFO)
        self.rng = random.Random(self.m.get("seed", 1))
        dut.rst.value = 1
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
        self.src = [AxiStreamSource(AxiStreamBus.from_prefix(dut, f"s_axis_w{c}", bus_separator="__"), dut.clk,
                                    dut.rst) for c in range(self.channels)]
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_out", bus_separator="__"), dut.clk, dut.rst)
        self.axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil", bus_separator="__"), dut.clk, dut.rst)
        for bfm in (*self.src, self.sink):
            bfm.log.setLevel(logging.WARNING)   # (a TX frame's repr is the whole image)
        self.axil.write_if.log.setLevel(logging.WARNING)
        self.axil.read_if.log.setLevel(logging.WARNING)
        self.checker = OutputChecker(self.sink, self.log)
        self._files: dict[str, bytes] = {}
        self.last_token_ns = 0
        self.timings: list[dict] = []
        if self.m.get("stress"):
            self.set_stress(True)

    # ---------------------------------------------------------------------------------- helpers
    def file(self, name: str) -> bytes:
        if name not in self._files:
            self._files[name] = (self.dir / name).read_bytes()
        return self._files[name]

    def _pauses(self, on: bool, p: float = 0.3):
        return _random_pauses(random.Random(self.rng.random()), p) if on else None

    def set_stress(self, on: bool) -> None:
        """Random idle cycles on every weight channel, random backpressure on ``m_axis_out``."""
        for s in self.src:
            s.set_pause_generator(self._pauses(on))
        self.sink.set_pause_generator(self._pauses(on))

    def set_axil_stress(self, on: bool) -> None:
        """Random idle cycles on the AXI4-Lite request channels, backpressure on its responses (five more
        coroutines per cycle: only where the register block is the subject)."""
        for ch in (self.axil.write_if.aw_channel, self.axil.write_if.w_channel, self.axil.read_if.ar_channel,
                   self.axil.write_if.b_channel, self.axil.read_if.r_channel):
            ch.set_pause_generator(self._pauses(on))

    async def reset(self) -> None:
        for s in self.src:
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

    async def counters(self, names) -> dict[str, int]:
        return {n: await self.counter(Counter[n]) for n in names}

    def cycles(self) -> int:
        return int(get_sim_time(unit="ns")) // CLOCK_NS

    def send(self, packet: bytes, image: list[str]) -> None:
        """Queue one token: channel 0 the token packet then its image stream, channel c its weight blocks."""
        assert len(image) == self.channels, f"image with {len(image)} channel streams, the build has {self.channels}"
        for name in image:
            assert len(self.file(name)) % self.beat_bytes == 0, f"{name}: not whole beats"
        self.src[0].send_nowait(packet)
        for c, name in enumerate(image):
            self.src[c].send_nowait(self.file(name))

    async def sources_idle(self, timeout_ns: int) -> None:
        async def waiter():
            for s in self.src:
                await s.wait()

        await with_timeout(waiter(), timeout_ns, "ns")

    def timeout_ns(self, cycles: int) -> int:
        factor = 6 if self.m.get("stress") else 3
        return (factor * int(cycles) + 50_000) * CLOCK_NS

    # ---------------------------------------------------------------------------------- steps
    async def token(self, step: dict) -> None:
        label = step["label"]
        before = await self.counters([c.name for c in Counter])
        t0, w0 = self.cycles(), time.perf_counter()
        self.checker.expect(self.file(step["expect"]), label)
        self.send(self.file(step["packet"]), self.m["images"][step["image"]])
        await self.checker.wait_empty(self.timeout_ns(step["cycles"]))
        t1, w1 = self.cycles(), time.perf_counter()
        self.last_token_ns = (t1 - t0) * CLOCK_NS
        await ClockCycles(self.dut.clk, 2)
        status = await self.read(R.STATUS)
        assert status == Status.DONE.value, f"{label}: STATUS 0x{status:x} after the output packet (done only expected)"
        assert self.dut.irq.value == 1, f"{label}: irq low after a completed token"
        after = await self.counters([c.name for c in Counter])
        for name, exp in step["counters"].items():
            got = after[name] - before[name]
            assert got == exp, f"{label}: counter {name} advanced by {got}, the golden device says {exp}"
        from host.protocol import parse_output_packet

        out = parse_output_packet(self.file(step["expect"]))
        assert await self.read(R.POSITION) == out.position, f"{label}: POSITION register"
        assert await self.read(R.ARGMAX) == out.argmax, f"{label}: ARGMAX register"
        rate = (t1 - t0) / max(w1 - w0, 1e-9) / 1e3
        self.timings.append({"label": label, "cycles": t1 - t0, "golden_cycles": step["cycles"],
                             "wall_s": round(w1 - w0, 2), "kcycles_per_s": round(rate, 1),
                             "counters": {n: after[n] - before[n] for n in after},
                             "golden_counters": step.get("model_counters", {})})
        self.log.info("%s: %d cycles (golden model %d), %.1f s, %.1f kcycles/s", label, t1 - t0, step["cycles"],
                      w1 - w0, rate)

    async def bad(self, step: dict) -> list[str]:
        """One bad stream; returns the problems found (empty: the case passed)."""
        case = step["case"]
        problems = []
        expected_cause = ErrorCause(step["cause"])
        image = self.m["images"][step["image"]]
        total = sum(len(self.file(n)) for n in image) + len(self.file(step["packet"]))
        drain_ns = self.timeout_ns(4 * total // self.beat_bytes)
        t0 = self.cycles()
        self.send(self.file(step["packet"]), image)
        abort_at = step.get("abort_at")
        if step.get("partial"):     # an error while logits stream: the packet must be closed, not left open
            self.checker.expect(self.file(step["partial"]), f"{case}: cut-short output", aborted=True)
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
        except cocotb.triggers.SimTimeoutError:
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
        except cocotb.triggers.SimTimeoutError:
            problems.append(f"STATUS.error not set 20000 cycles after the whole stream was sent "
                            f"(STATUS 0x{status:x}, expected cause {expected_cause.name})")
            return problems
        cause = await self.read(R.ERROR_CAUSE)
        try:
            cause_name = ErrorCause(cause).name
        except ValueError:
            cause_name = f"unknown {cause}"
        if cause != expected_cause.value:
            problems.append(f"ERROR_CAUSE {cause_name}, the golden device reports {expected_cause.name}")
        if step.get("where") is not None:
            where = await self.read(R.ERROR_WHERE)
            if where != step["where"]:
                problems.append(f"ERROR_WHERE {where}, the golden device reports instruction {step['where']}")
        if status & Status.BUSY.value:
            problems.append(f"STATUS 0x{status:x}: busy in error")
        if self.dut.irq.value != 1:
            problems.append("irq low in error")
        if self.checker.expected and step.get("partial"):
            with contextlib.suppress(cocotb.triggers.SimTimeoutError):
                await self.checker.wait_empty(2_000 * CLOCK_NS)
            # the sink clears `active` on the first cycle after a packet's last beat, not on that beat
            await ClockCycles(self.dut.clk, 2)
        if self.sink.active:
            problems.append("a partial output packet (no tlast) was left on m_axis_out")
        if self.checker.expected:
            problems.append("an expected output packet is pending (an open packet was not closed)")
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

    async def reset_mid_token(self, step: dict) -> None:
        """Send a good token and pull ``rst`` half-way through it: the core restarts with a zero state."""
        self.send(self.file(step["packet"]), self.m["images"][step["image"]])
        await ClockCycles(self.dut.clk, max(1, int(step["at"] * self.last_token_ns) // CLOCK_NS))
        status = await self.read(R.STATUS)
        assert status & Status.BUSY.value, f"core not busy when the reset was due (STATUS 0x{status:x})"
        await self.reset()
        status = await self.read(R.STATUS)
        assert status == 0, f"STATUS 0x{status:x} after reset"
        for c in (Counter.TOKENS, Counter.CYCLES):
            assert await self.counter(c) == 0, f"counter {c.name} not cleared by reset"

    def write_timings(self, name: str) -> None:
        (self.dir / f"timings-{name}.json").write_text(json.dumps(self.timings, indent=1) + "\n")


# -------------------------------------------------------------------------------------------- tests
@cocotb.test()
async def id_block(dut):
    """The ID block reports the build parameters; control/status/counters read zero after reset."""
    tb = TB(dut)
    tb.set_axil_stress(bool(tb.m.get("stress")))
    await tb.reset()
    b = tb.build
    want = {
        R.ID_MAGIC: isa.ID_MAGIC, R.ID_VERSION: isa.ISA_VERSION, R.ID_LANES: b["lanes"],
        R.ID_CHANNELS: b["channels"], R.ID_BUS_BITS: b["bus_bits"],
        R.ID_PACKINGS: 1 << TritPacking(b["packing"]).value, R.ID_MAX_HIDDEN: b["max_hidden"],
        R.ID_MAX_INTERMEDIATE: b["max_intermediate"], R.ID_MAX_LAYERS: b["max_layers"],
        R.ID_MAX_VOCAB: isa.MAX_VOCAB, R.ID_QUANT_LANES: b["quant_lanes"], R.ID_ACC_BITS: isa.ACC_BITS,
        R.ID_EPILOGUE: int(bool(b.get("epilogue_folded", False))),
    }
    assert (await tb.read(R.ID_MAGIC)).to_bytes(4, "little") == b"MMFA"
    assert await tb.read(R.ID_VERSION) == 2      # ISA version 2: the epsilon-carrying scale, half-away codes
    for off, v in want.items():
        got = await tb.read(off)
        assert got == v, f"ID register 0x{off:02x}: 0x{got:x}, expected 0x{v:x}"
    # writes to the ID block are ignored
    await tb.write(R.ID_LANES, 0xDEAD)
    assert await tb.read(R.ID_LANES) == b["lanes"]
    for off in (R.STATUS, R.ERROR_CAUSE, R.ERROR_WHERE, R.POSITION, R.ARGMAX, R.CTRL, 0x34, 0x3C, 0x7C, 0xFC):
        got = await tb.read(off)
        assert got == 0, f"register 0x{off:02x} reads 0x{got:x} after reset"
    for c in Counter:
        assert await tb.counter(c) == 0, f"counter {c.name} non-zero after reset"
    assert dut.irq.value == 0
    # CTRL.clear with nothing to clear is harmless
    await tb.write(R.CTRL, Ctrl.CLEAR.value)
    assert await tb.read(R.STATUS) == 0


@cocotb.test()
async def tokens(dut):
    """Tokens (and hard resets) from the manifest, each output packet bit-exact with the golden device."""
    tb = TB(dut)
    n = 0
    for step in tb.m["steps"]:
        if step["op"] == "reset":
            await tb.reset()
        elif step["op"] == "token":
            await tb.token(step)
            n += 1
        else:
            raise ValueError(f"step {step['op']!r} in a token run")
    assert tb.checker.received == n
    tb.write_timings("tokens")


@cocotb.test()
async def bad_input(dut):
    """Bad streams between good tokens: error and cause as the golden device, state unchanged, recovery."""
    tb = TB(dut)
    failures = []
    steps = tb.m["steps"]
    for j, step in enumerate(steps):
        if step["op"] == "reset":
            await tb.reset()
        elif step["op"] == "token":
            await tb.token(step)
        elif step["op"] == "bad":
            problems = await tb.bad(step)
            if problems:
                failures.append(f"{step['case']}: " + "; ".join(problems))
                # recover for the next case: hard reset, then skip to the next reset step
                await tb.reset()
                tb.checker.expected.clear()
                skip = next((k for k in range(j + 1, len(steps)) if steps[k]["op"] == "reset"), len(steps))
                for k in range(j + 1, skip):
                    steps[k]["op"] = "skipped"
        elif step["op"] == "reset_mid_token":
            await tb.reset_mid_token(step)
        elif step["op"] == "skipped":
            continue
        else:
            raise ValueError(f"unknown step {step['op']!r}")
    tb.write_timings("bad")
    assert not failures, "bad-input cases failed:\n  " + "\n  ".join(failures)
