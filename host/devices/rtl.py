"""The RTL device: the Verilated ``hw/`` core behind the :class:`~host.devices.base.Device` interface.

:class:`RtlDevice` is the one driver (:class:`host.devices.driver.AcceleratorDevice`: ID block, image,
token packets, errors, counters, state replay) over :class:`RtlTransport`, which builds (once per build
parameters and ``hw/`` source, :func:`host.devices.rtl_harness.build_harness`) and starts the Verilator
harness (``host/devices/rtl_harness/harness.cpp``) for the loaded model's shape. Each
:meth:`~host.devices.base.Device.step` sends one token packet (the host's embedding lookup, exactly the
packet the golden device runs, :func:`host.protocol.embedding_packet`); the harness drives channel 0 with
the packet and then the image, the other channels with their weight blocks
(:func:`host.protocol.channel_streams`), all at full rate, and returns the output packet, which gives the
logits exactly as on the golden device (:func:`host.protocol.parse_output_packet`), and the hardware
counters read through AXI4-Lite.

Why a subprocess with pipes, not a compiled extension
    The stimulus must live inside the simulator (Python-driven beats run at 5-20 k cycles/s); what
    crosses to Python per token is one token packet (about 1.4 kB for the shipped model) and one output
    packet (16 kB of logits) against 10^5-10^6 simulated cycles, so the transport's cost (tens of
    microseconds per token through a pipe) is invisible next to the simulation (tenths of a second).
    A subprocess costs nothing measurable and gives: (1) isolation: a crash or assertion in the
    Verilated model, or a runaway simulation, cannot take the Python process (and a pytest run) down
    with it, and :meth:`close` always reclaims it; (2) no Python C-API build: the harness is a plain
    C++ program linked against Verilator's runtime only, built by Verilator's own makefiles, independent
    of the interpreter's headers, ABI and pybind11/nanobind versions; (3) a debuggable artefact: the
    same executable runs from the shell (``harness ch0.bin < requests``), under gdb or with an FST dump;
    (4) Verilator's global state (``VerilatedContext``, ``$finish``, ``exit`` on fatal errors) stays
    out of the interpreter, so several devices of different builds can run side by side. A compiled
    extension would save only the pipe's microseconds.

Saving and restoring the state
    The recurrent state lives in the core's state memory, which the host cannot read or write (the
    register map has no window onto it, as on a board). :meth:`save_state` therefore returns the
    token ids run since the last reset (a host-side replay log; a tuple, so independent of later
    steps), and :meth:`restore_state` hard-resets the core (``rst``: the core then reads the committed
    state as zero, ``state_valid = 0``) and replays those tokens, which recomputes exactly the same state
    (the core is deterministic and a token's result depends only on the image, the token packet and
    the state). When the saved log extends the current one, only the missing tokens run; when it equals
    it, nothing runs. A replay costs simulated time: ``replayed_tokens`` counts it, and the replayed
    tokens' hardware counters are added like any other (the hardware did the work).

Counters
    ``hw_<name>`` for every :class:`hw.isa.Counter` (increments per token, read through AXI4-Lite after
    each token; the harness keeps the baseline across tokens and resets), ``sim_cycles`` (clock cycles
    the harness ran, register accesses included), ``sim_wall_ns`` and ``sim_cpu_ns`` (wall and CPU time
    of the simulation, pipe I/O excluded), ``replayed_tokens``.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from host.devices.base import DeviceError
from host.devices.driver import AcceleratorDevice, Delivery
from host.image import ImageInfo
from host.perf import token_counters
from host.protocol import CoreError, DeviceTimeout, IdBlock, check_id_block
from hw.isa import Counter, TritPacking
from hw.params import BuildParams

__all__ = ["RtlDevice", "RtlTransport", "TokenRun", "Harness", "HarnessTimeout"]

_COUNTERS = list(Counter)


def _pow2(v: int) -> int:
    return 1 << max(int(v) - 1, 0).bit_length()


@dataclass
class TokenRun:
    """What the harness reported for one token.

    Attributes
    ----------
    output : bytes
        The output packet (empty on a failed token).
    counters : dict[Counter, int]
        Counter increments of this token (AXI4-Lite reads after the token).
    cycles : int
        Clock cycles the harness ran for the token (first beat to the counter reads, included).
    wall_ns : int
        Wall time of the simulation of this token, nanoseconds (pipe I/O excluded).
    cpu_ns : int
        CPU time of the harness process over the same span, nanoseconds (what the simulation costs,
        whatever else runs on the machine).
    per_instruction : list of dict[Counter, int]
        Counter increments per instruction when profiled (see :meth:`Harness.run_token`), else empty.
    end_cycle : int
        Cycles from the token's first cycle to the output word with ``tlast`` (0: none left).
    """

    output: bytes
    counters: dict[Counter, int]
    cycles: int
    wall_ns: int
    cpu_ns: int = 0
    per_instruction: list[dict[Counter, int]] = field(default_factory=list)
    end_cycle: int = 0


class HarnessTimeout(DeviceTimeout):
    """A token the core did not finish within the harness's ``hang_cycles``: the harness reset the core (its
    state is lost)."""


class Harness:
    """A running harness process (one Verilated core with an image loaded).

    Parameters
    ----------
    exe : Path
        The executable of :func:`host.devices.rtl_harness.build_harness`.
    streams : sequence of bytes
        One byte stream per channel (:func:`host.protocol.channel_streams`).
    hang_cycles : int
        Cycles without any stream transfer after which a token is a timeout.
    fst : Path, optional
        Where a token run with ``dump=True`` writes its waveform (needs a trace build).
    """

    def __init__(self, exe: Path, streams: Sequence[bytes], *, hang_cycles: int = 100_000, fst: Path | None = None):
        self._dir = Path(tempfile.mkdtemp(prefix="mmfree-rtl-"))
        files = []
        for c, s in enumerate(streams):
            f = self._dir / f"ch{c}.bin"
            f.write_bytes(s)
            files.append(str(f))
        args = [str(exe), "--hang-cycles", str(int(hang_cycles))]
        if fst is not None:
            args += ["--fst", str(fst)]
        self._stderr = open(self._dir / "stderr.txt", "w+b")
        try:
            self._proc = subprocess.Popen(args + files, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._stderr, bufsize=0)
        except OSError as exc:
            self._stderr.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise DeviceError(f"device 'rtl': cannot start the harness {exe}: {exc}") from exc

    # ------------------------------------------------------------------ transport
    def _request(self, cmd: bytes, payload: bytes = b"") -> tuple[bytes, bytes]:
        proc = self._proc
        try:
            proc.stdin.write(cmd + struct.pack("<I", len(payload)) + payload)
            proc.stdin.flush()
            head = self._read(5)
            code, n = head[:1], struct.unpack("<I", head[1:])[0]
            body = self._read(n)
        except (BrokenPipeError, EOFError, OSError) as exc:
            raise DeviceError(f"device 'rtl': the harness died ({self._died()})") from exc
        if code == b"X":
            raise DeviceError(f"device 'rtl': the harness rejected request {cmd!r}")
        return code, body

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._proc.stdout.read(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def _died(self) -> str:
        try:
            rc = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        self._stderr.seek(0)
        err = self._stderr.read().decode(errors="replace").strip().splitlines()[-5:]
        return f"exit status {rc}" + (f": {' / '.join(err)}" if err else "")

    # ------------------------------------------------------------------ commands
    def read(self, addr: int) -> int:
        """One AXI4-Lite read (32 bits)."""
        _, body = self._request(b"r", struct.pack("<I", addr))
        return struct.unpack("<I", body)[0]

    def write(self, addr: int, value: int) -> None:
        """One AXI4-Lite write (32 bits)."""
        self._request(b"w", struct.pack("<II", addr, value))

    def reset(self) -> None:
        """Hard reset of the core (``rst``): zero state (the committed state reads as zero), zero counters."""
        self._request(b"R")

    def load_streams(self, streams: Sequence[bytes]) -> None:
        """Replace the image's per-channel byte streams (any bytes, whole beats: malformed images too)."""
        self._request(b"I", b"".join(struct.pack("<I", len(s)) + bytes(s) for s in streams))

    def run_token(self, packet: bytes, *, dump: bool = False, profile: bool = False,
                  abort_at: int | None = None, end_cycle: bool = False) -> TokenRun:
        """Run one token packet through the core.

        Parameters
        ----------
        packet : bytes
            A token packet (:func:`host.protocol.make_token_packet`).
        dump : bool
            Write a waveform of this token (trace builds only; FST or VCD as built).
        profile : bool
            Also return counter increments per instruction: the harness snapshots the core's counter
            registers (``counter_*`` of the top module, made readable by ``public.vlt``) whenever the
            INSTRUCTIONS counter moves (an instruction completed; END_TOKEN at its commit), and once more
            after the commit if anything counted since the last boundary (a core that does not count
            END_TOKEN in INSTRUCTIONS).
        abort_at : int, optional
            Start an AXI4-Lite write of ``hw.isa.Ctrl.ABORT`` this many cycles after the token's first cycle
            (the strobe reaches the core about three cycles later).
        end_cycle : bool
            Report :attr:`TokenRun.end_cycle` (always with ``abort_at``); off by default, so that harnesses
            built before it existed still answer (``bench/bench_rtl.py --versus``).

        Raises
        ------
        host.protocol.CoreError
            The core stopped the token (``STATUS.error``: the cause and instruction); the harness has cleared
            the error.
        HarnessTimeout
            The token made no progress for ``hang_cycles``; the harness reset the core.
        """
        want_end = end_cycle or abort_at is not None
        flags = (1 if dump else 0) | (2 if profile else 0) | (4 if abort_at is not None else 0) | (8 if want_end else 0)
        head = struct.pack("<I", flags) + (struct.pack("<I", abort_at) if abort_at is not None else b"")
        code, body = self._request(b"T", head + packet)
        kind, cycles, wall_ns, cpu_ns, status, cause, where, ncnt = struct.unpack_from("<IQQQIIII", body)
        pos = struct.calcsize("<IQQQIIII")
        vals = struct.unpack_from(f"<{ncnt}Q", body, pos)
        pos += 8 * ncnt
        (olen,) = struct.unpack_from("<I", body, pos)
        pos += 4
        out = body[pos:pos + olen]
        pos += olen
        (mlen,) = struct.unpack_from("<I", body, pos)
        pos += 4
        msg = body[pos:pos + mlen].decode(errors="replace")
        pos += mlen
        end_cycle = 0
        if want_end:
            (end_cycle,) = struct.unpack_from("<Q", body, pos)
            pos += 8
        per: list[dict[Counter, int]] = []
        if pos < len(body):
            (ninstr,) = struct.unpack_from("<I", body, pos)
            pos += 4
            flat = struct.unpack_from(f"<{ninstr * ncnt}Q", body, pos)
            per = [dict(zip(_COUNTERS, flat[i * ncnt:(i + 1) * ncnt], strict=True)) for i in range(ninstr)]
        counters = dict(zip(_COUNTERS, vals, strict=True))
        if code != b"K":
            if kind == 1:   # the harness has written CTRL.clear: the core waits for the next token packet
                raise CoreError("rtl", cause, where, detail=msg, output=out, end_cycle=end_cycle)
            raise HarnessTimeout(f"device 'rtl': {msg}")
        return TokenRun(output=out, counters=counters, cycles=cycles, wall_ns=wall_ns, cpu_ns=cpu_ns,
                        per_instruction=per, end_cycle=end_cycle)

    def close(self) -> None:
        """Stop the process and delete its stream files; idempotent."""
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            try:
                self._request(b"Q")
            except DeviceError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for f in (getattr(proc, "stdin", None), getattr(proc, "stdout", None), getattr(self, "_stderr", None)):
            if f is not None:
                f.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        self._proc = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            if getattr(self, "_proc", None) is not None:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class RtlTransport:
    """The Verilated core as a :class:`~host.devices.driver.Transport`: a :class:`Harness` process built for the
    model's shape (:func:`host.devices.rtl_harness.build_harness`), registers through its AXI4-Lite manager.

    Parameters
    ----------
    params : callable
        ``params(info) -> BuildParams``: the build (:class:`hw.params.BuildParams`) of a core for an image of this
        shape.
    waveform_token, waveform_path, hang_cycles, progress
        As :class:`RtlDevice`.
    """

    extra_counters = ("sim_cycles", "sim_wall_ns", "sim_cpu_ns")

    def __init__(self, params, *, waveform_token: int | None = None, waveform_path: Path | None = None,
                 hang_cycles: int = 100_000, progress: bool = True) -> None:
        self._params = params
        self.waveform_token = waveform_token
        self.waveform_path = waveform_path
        self.hang_cycles = hang_cycles
        self.progress = progress
        self.profile = False
        self.harness: Harness | None = None
        self.params: BuildParams | None = None
        self.build_info: dict | None = None
        self.executable: Path | None = None
        self.last: TokenRun | None = None
        self._dumped = False

    def connect(self, info: ImageInfo | None) -> None:
        """Build (once per parameters and ``hw/`` source) and start a harness whose core fits ``info``."""
        from host.devices.rtl_harness import build_harness

        if info is None:
            raise DeviceError("device 'rtl': the Verilated core is built for a model's shape: load a model first")
        self.close()
        params = self._params(info)
        trace = None
        if self.waveform_token is not None:
            trace = "vcd" if self.waveform_path is not None and self.waveform_path.suffix == ".vcd" else "fst"

        def say(line: str) -> None:
            if self.progress:
                print(f"mmfree: {line}", file=sys.stderr, flush=True)

        try:
            exe, build_info = build_harness(params, trace=trace, progress=say)
        except (TypeError, ValueError) as exc:   # the Accelerator's own parameter checks
            raise DeviceError(f"device 'rtl': bad build parameters: {exc}") from exc
        fst = None
        if trace:
            from hw.export import BUILD_ROOT

            fst = self.waveform_path or BUILD_ROOT / "rtl" / "waves" / f"token{self.waveform_token}.{trace}"
            fst.parent.mkdir(parents=True, exist_ok=True)
            self.waveform_path = fst
        # one empty beat per channel until the image is staged ('I')
        blank = [bytes(params.beat_bytes)] * params.channels
        self.harness = Harness(exe, blank, hang_cycles=self.hang_cycles, fst=fst)
        self.params, self.build_info, self.executable = params, build_info, exe
        self._dumped = False

    def check_ident(self, ident: IdBlock) -> None:
        """The ID block must be exactly what the build reports (:meth:`hw.params.BuildParams.id_values`)."""
        check_id_block(ident, "rtl", expect=self.params.id_values())

    def read(self, offset: int) -> int:
        return self.harness.read(offset)

    def write(self, offset: int, value: int) -> None:
        self.harness.write(offset, value)

    def reset(self) -> None:
        self.harness.reset()

    def stage(self, streams: Sequence[bytes], out_bytes: int) -> None:
        self.harness.load_streams(streams)

    def run(self, packet: bytes, deadline: float | None, poll) -> Delivery:
        """One token through the harness (it reports the core's error or its time-out itself)."""
        position = int.from_bytes(packet[4:8], "little") if len(packet) >= 8 else -1
        dump = self.waveform_token is not None and not self._dumped and position == self.waveform_token
        run = self.harness.run_token(packet, dump=dump, profile=self.profile)
        if dump:
            self._dumped = True
        self.last = run
        return Delivery(run.output, run.counters,
                        {"sim_cycles": run.cycles, "sim_wall_ns": run.wall_ns, "sim_cpu_ns": run.cpu_ns})

    def recover(self, timed_out: bool) -> None:
        """Nothing to do: the harness cleared the error (or reset the core after a time-out) before replying."""

    def close(self) -> None:
        if self.harness is not None:
            self.harness.close()
            self.harness = None


class RtlDevice(AcceleratorDevice):
    """The Verilated core (``hw.top.Accelerator``) as a device: the golden device's bits, real cycle counts.

    Parameters
    ----------
    lanes, channels, bus_bits, quant_lanes : int
        Build parameters of the core (:class:`hw.top.Accelerator`); the defaults match the golden
        device's so that their counters compare.
    packing : str or TritPacking
        ``"base3"`` (default) or ``"bits2"``: the packing of the build and of the image.
    max_hidden, max_intermediate, max_layers : int, optional
        Buffer capacities of the build; default: the loaded model's hidden and intermediate sizes and its
        layer count rounded up to a power of two (``max_layers`` must be one: with another value the
        core's second state bank starts past the end of its state memory, a limitation of ``hw/top.py``).
        Each distinct set of values is a separate build.
    output_gate : {"released", "paper"}
        Passed to the compiler, as for the golden device.
    waveform_token : int, optional
        Dump a waveform of the token at this sequence position (0 = the first token after a reset; the
        first time that position runs). Needs the tracing build (built on first use; every token then
        runs somewhat slower). Off by default.
    waveform_path : str or Path, optional
        The waveform file (default ``build/rtl/waves/token<k>.fst``): FST (Verilator's FST writer needs
        ``liblz4-dev``), or VCD when the name ends in ``.vcd``.
    hang_cycles : int
        Cycles without any stream transfer after which a token is reported as a timeout (DeviceError).
    fmax_mhz : float
        Clock for the cycle model's prediction (:attr:`prediction`).
    progress : bool
        Print a line on stderr before a first (slow) build.
    epilogue_folded : bool
        Simulate the core with the folded epilogue (``hw.top.Accelerator`` ``epilogue_folded``, the ECP5
        builds' form) instead of the pipelined one.

    Attributes
    ----------
    build : BuildParams
        The build as set (:class:`hw.params.BuildParams`; the cycle model's); the core is built from
        :meth:`accelerator_params` (this build with the loaded model's buffer capacities, :attr:`params`).
    last : TokenRun or None
        The last token's harness report.
    build_info : dict or None
        The harness build record (:func:`host.devices.rtl_harness.build_harness`).
    executable : Path or None
        The harness executable (a :class:`Harness` of its own can run other streams on the same core).
    image : ParsedImage or None
        The loaded model image.
    profile : bool
        When True, every token also reports its counters per instruction (:attr:`TokenRun.per_instruction`).
    prediction, prediction_per_instruction
        The cycle model's counters of a token of the loaded image on this build.
    """

    name = "rtl"

    def __init__(self, *, lanes: int = 64, channels: int = 1, bus_bits: int = 64, quant_lanes: int = 8,
                 packing: str | TritPacking = "base3", max_hidden: int | None = None,
                 max_intermediate: int | None = None, max_layers: int | None = None, output_gate: str = "released",
                 waveform_token: int | None = None, waveform_path: str | Path | None = None,
                 hang_cycles: int = 100_000, fmax_mhz: float = 100.0, progress: bool = True,
                 epilogue_folded: bool = False) -> None:
        from host.compiler import CompileOptions

        for nm, v, lo in (("max_hidden", max_hidden, 1), ("max_intermediate", max_intermediate, 1),
                          ("max_layers", max_layers, 1), ("waveform_token", waveform_token, 0)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
                raise ValueError(f"{nm} must be an integer >= {lo} or None, got {v!r}")
        if max_layers is not None and max_layers != _pow2(max_layers):
            raise ValueError(f"max_layers must be a power of two (the core's state banks overlap otherwise), got "
                             f"{max_layers}")
        if not isinstance(hang_cycles, int) or hang_cycles < 1000:
            raise ValueError(f"hang_cycles must be an integer >= 1000, got {hang_cycles!r}")
        # validates the sizes and the packing; the gateware's limits (lanes per channel 4-256, power-of-two
        # quant_lanes) are checked when the core is built (BuildParams.check_gateware)
        self._build = BuildParams(lanes=lanes, channels=channels, bus_bits=bus_bits, quant_lanes=quant_lanes,
                                  packing=packing, fmax_mhz=fmax_mhz, epilogue_folded=epilogue_folded)
        self.options = CompileOptions(packing=self._build.packing, channels=channels, output_gate=output_gate)
        self._caps = {"max_hidden": max_hidden, "max_intermediate": max_intermediate, "max_layers": max_layers}
        transport = RtlTransport(lambda info: self.accelerator_params(info.hidden, info.intermediate, info.n_layers),
                                 waveform_token=waveform_token,
                                 waveform_path=Path(waveform_path) if waveform_path is not None else None,
                                 hang_cycles=hang_cycles, progress=progress)
        super().__init__(transport, output_gate=output_gate)
        self.prediction: dict[Counter, int] | None = None
        self.prediction_per_instruction: list[dict[Counter, int]] = []

    # ------------------------------------------------------------------ the transport's state, by name
    harness = property(lambda self: self.transport.harness, doc="The running :class:`Harness` (or None).")
    last = property(lambda self: self.transport.last, doc="The last token's :class:`TokenRun`.")
    params = property(lambda self: self.transport.params,
                      doc="The :class:`~hw.params.BuildParams` the running core was built from (capacities included).")
    build_info = property(lambda self: self.transport.build_info, doc="The harness build record.")
    executable = property(lambda self: self.transport.executable, doc="The harness executable.")
    waveform_token = property(lambda self: self.transport.waveform_token)
    waveform_path = property(lambda self: self.transport.waveform_path)
    hang_cycles = property(lambda self: self.transport.hang_cycles)

    @property
    def build(self) -> BuildParams:
        """The build as set (the driver's ``build`` is the ID block's fields; this device knows its build)."""
        return self._build

    @property
    def profile(self) -> bool:
        return self.transport.profile

    @profile.setter
    def profile(self, on: bool) -> None:
        self.transport.profile = bool(on)

    # ------------------------------------------------------------------ build
    def accelerator_params(self, hidden: int, intermediate: int, n_layers: int) -> BuildParams:
        """The core's build for a model of this shape: :attr:`build` with its buffer capacities (``max_hidden``,
        ``max_intermediate``, ``max_layers``) as given, or else the model's (layers rounded up to a power of two).

        Raises
        ------
        ValueError
            When a given capacity is smaller than the model needs.
        """
        # max_layers a power of two: hw/top.py places the second state bank at 2**ceil_log2(max_layers *
        # hstride), past the end of the state memory unless max_layers is a power of two (layers beyond
        # the memory then read as zero): a known RTL limitation, worked around here
        need = {"max_hidden": hidden, "max_intermediate": intermediate, "max_layers": _pow2(n_layers)}
        caps = {}
        for k, v in need.items():
            given = self._caps[k]
            if given is not None and given < v:
                raise ValueError(f"{k}={given} is smaller than the model needs ({v})")
            caps[k] = given if given is not None else v
        return self.build.replace(**caps)

    def compile_options(self):
        """The build's packing and channel count (the core is built for the model, not read from it)."""
        return self.options

    def build_params(self) -> BuildParams:
        """:attr:`build` (the driver's default reads the ID block; this device knows its build)."""
        return self.build

    def _check_fits(self, config) -> None:
        self.accelerator_params(config.hidden_size, config.intermediate_size, config.num_hidden_layers)

    def _install(self, image, embeddings, frac) -> None:
        super()._install(image, embeddings, frac)
        self.prediction_per_instruction, self.prediction = token_counters(image.instructions, image.info,
                                                                          self.build)
