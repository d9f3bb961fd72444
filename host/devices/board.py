"""What the board devices (:mod:`host.devices.pynq`, :mod:`host.devices.xrt`) share: the ID-block check, the
token loop, the counters, errors and the replay log. The transport (DMA or XRT kernels) is theirs.

A board runs exactly what the golden device runs: :meth:`load` compiles the model image for the
bitstream's build (packing and channel count read from the core's ID block), splits it into the
per-channel streams (:func:`host.devices.rtl.channel_streams`) and hands them to the transport once;
every token is the golden device's token packet (the host's embedding lookup,
:func:`host.devices.golden.make_token_packet`) followed by the channel streams, and returns the output
packet, decoded by :func:`host.devices.golden.parse_output_packet` into the same logits.

Errors
    The core's error flag (``STATUS.error``) becomes a :class:`~host.devices.base.DeviceError` naming the
    :class:`hw.isa.ErrorCause` and the instruction; the token's committed state is unchanged (the core
    commits at END_TOKEN only), and the core is cleared for the next token. A transport that does not
    finish within ``timeout_s`` is a DeviceError too (never a hang): the core is aborted and soft-reset,
    and the next token first replays the sequence so far (as :class:`host.devices.rtl.RtlDevice` does).

State
    The recurrent state lives in the core, which the host cannot read: :meth:`save_state` is the log of
    token ids since the last reset and :meth:`restore_state` replays it after a soft reset.
"""

from __future__ import annotations

import abc
import time

import numpy as np

from host.devices.base import DeviceError, ReplayLogDevice, check_isa_version
from host.image import ParsedImage, parse_image
from host.model import ModelWeights
from hw import isa
from hw import numerics as nx
from hw.isa import Counter, Ctrl, ErrorCause, Status, TritPacking

__all__ = ["BoardDevice", "SOFT_RESET", "read_id_block"]

R = isa.REGISTER_MAP
#: Core-relative offset of the shell's soft reset (hw/boards/xilinx_shell.py; kept equal there).
SOFT_RESET = 0xF0


def read_id_block(read) -> dict[str, int]:
    """The ID block through ``read(offset) -> int`` (core-relative offsets), by field name."""
    names = {R.ID_MAGIC: "magic", R.ID_VERSION: "version", R.ID_LANES: "lanes", R.ID_CHANNELS: "channels",
             R.ID_BUS_BITS: "bus_bits", R.ID_PACKINGS: "packings", R.ID_MAX_HIDDEN: "max_hidden",
             R.ID_MAX_INTERMEDIATE: "max_intermediate", R.ID_MAX_LAYERS: "max_layers",
             R.ID_MAX_VOCAB: "max_vocab", R.ID_QUANT_LANES: "quant_lanes", R.ID_ACC_BITS: "acc_bits",
             R.ID_EPILOGUE: "epilogue_folded"}
    return {name: int(read(off)) & 0xFFFFFFFF for off, name in names.items()}


class BoardDevice(ReplayLogDevice):
    """A core on a board behind :class:`~host.devices.base.Device` (see the module docstring).

    Subclasses implement the transport: :meth:`_reg_read`, :meth:`_reg_write` (core-relative offsets),
    :meth:`_stage` (take the channel streams of a new image), :meth:`_transfer` (stream one token packet
    and the image, return the output packet's bytes, raising :class:`TimeoutError` past the deadline)
    and :meth:`_release`. They call :meth:`_open_core` once the registers are reachable.

    Parameters
    ----------
    timeout_s : float
        Seconds one token may take before it is a time-out (DeviceError).
    output_gate : {"released", "paper"}
        Passed to the compiler, as for the golden device.

    Attributes
    ----------
    build : dict
        The core's ID block (after opening).
    image : ParsedImage or None
    last_counters : dict[Counter, int]
        Counter increments of the last token.
    """

    name = "board"

    def __init__(self, *, timeout_s: float = 10.0, output_gate: str = "released") -> None:
        super().__init__()
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.output_gate = output_gate
        self.build: dict[str, int] = {}
        self.image: ParsedImage | None = None
        self.last_counters: dict[Counter, int] = {}
        self._emb: np.ndarray | None = None
        self._frac = 0
        self._log: list[int] = []
        self._lost = False
        self._base_counters = {c: 0 for c in Counter}
        self._counters.update({f"hw_{c.name.lower()}": 0 for c in Counter})
        self._counters.update({"replayed_tokens": 0, "transfer_ns": 0})

    # ------------------------------------------------------------------ transport hooks
    @abc.abstractmethod
    def _reg_read(self, offset: int) -> int:
        """One 32-bit register read at a core-relative offset."""

    @abc.abstractmethod
    def _reg_write(self, offset: int, value: int) -> None:
        """One 32-bit register write at a core-relative offset."""

    @abc.abstractmethod
    def _stage(self, streams: list[bytes], out_bytes: int) -> None:
        """Take a new image's channel streams (device buffers) and the output packet's size."""

    @abc.abstractmethod
    def _transfer(self, packet: bytes, deadline: float) -> bytes:
        """Stream ``packet`` then the image; return the output packet. Raise TimeoutError past ``deadline``
        (``time.monotonic()``), DeviceError on a transport error; poll :meth:`_check_error` while waiting."""

    @abc.abstractmethod
    def _release(self) -> None:
        """Free buffers and handles."""

    # ------------------------------------------------------------------ core
    def _open_core(self) -> None:
        """Check the ID block (magic, ISA version) and clear any error left from before."""
        ident = read_id_block(self._reg_read)
        if ident["magic"] != isa.ID_MAGIC:
            raise DeviceError(f"device {self.name!r}: no mmfree core at the register block (ID magic "
                              f"0x{ident['magic']:08x}, expected 0x{isa.ID_MAGIC:08x}): wrong bitstream or "
                              f"wrong base address")
        check_isa_version(self.name, ident["version"])
        if not 1 <= ident["channels"] <= 4 or not ident["packings"]:
            raise DeviceError(f"device {self.name!r}: implausible ID block {ident}")
        self.build = ident
        self._reg_write(R.CTRL, Ctrl.CLEAR.value)
        self._soft_reset()

    def _soft_reset(self) -> None:
        self._reg_write(SOFT_RESET, 1)
        self._base_counters = {c: 0 for c in Counter}
        self._log = []
        self._lost = False

    def _check_error(self) -> None:
        """Raise DeviceError when the core's STATUS has its error flag (then clear it)."""
        status = self._reg_read(R.STATUS)
        if status & Status.ERROR.value:
            cause = self._reg_read(R.ERROR_CAUSE)
            where = self._reg_read(R.ERROR_WHERE)
            try:
                what = ErrorCause(cause).name
            except ValueError:
                what = f"cause {cause}"
            self._recover(abort=False)
            raise DeviceError(f"device {self.name!r}: the core stopped the token with {what} at instruction "
                              f"{where}; its committed state is unchanged")

    def _recover(self, *, abort: bool) -> None:
        """After an error or a time-out: abort the token (time-out), let the transport settle (its streams
        drain into the stopped core), then clear the core for the next token packet."""
        if abort:
            self._reg_write(R.CTRL, Ctrl.ABORT.value)
        self._quiesce()
        self._reg_write(R.CTRL, Ctrl.CLEAR.value)

    def _quiesce(self) -> None:  # noqa: B027 - optional hook
        """Stop or finish every transfer of the failed token (default: nothing to do)."""

    def _read_counters(self) -> dict[Counter, int]:
        return {c: self._reg_read(R.counter(c)) | (self._reg_read(R.counter(c) + 4) << 32) for c in Counter}

    # ------------------------------------------------------------------ Device hooks
    def _load(self, weights: ModelWeights) -> None:
        from host.compiler import CompileOptions, compile_model
        from host.devices.golden import _packet_bytes
        from host.devices.rtl import channel_streams

        b = self.build
        packing = None
        for p in (TritPacking.BASE3, TritPacking.BITS2):
            if b["packings"] >> p.value & 1:
                packing = p
                break
        if packing is None:
            raise DeviceError(f"device {self.name!r}: the core supports no known trit packing "
                              f"(ID_PACKINGS 0x{b['packings']:x})")
        cfg = weights.config
        need = {"max_hidden": cfg.hidden_size, "max_intermediate": cfg.intermediate_size,
                "max_layers": cfg.num_hidden_layers, "max_vocab": cfg.vocab_size}
        short = {k: (v, b[k]) for k, v in need.items() if v > b[k]}
        if short:
            raise DeviceError(f"device {self.name!r}: the model does not fit this bitstream's buffers "
                              f"(needed, built): {short}; build a bitstream with larger capacities")
        image = parse_image(compile_model(weights, CompileOptions(packing=packing, channels=b["channels"],
                                                                  output_gate=self.output_gate)))
        out_bytes = _packet_bytes(cfg.vocab_size, isa.layout_bytes(isa.OutputTrailer) - 4)
        self._stage(channel_streams(image, b["channels"]), out_bytes)
        self.image = image
        self._emb = weights.embeddings
        self._frac = image.info.residual_frac
        self._soft_reset()

    def token_packet(self, token_id: int, position: int = 0) -> bytes:
        """The host's embedding lookup for one token (the golden device's packet, byte for byte)."""
        from host.devices.golden import make_token_packet

        return make_token_packet(nx.to_fixed(self._emb[token_id], self._frac), position=position, logits=True)

    def run_packet(self, packet: bytes) -> bytes:
        """Run one token packet through the core; return the output packet (raw bytes).

        Raises
        ------
        DeviceError
            The core's error flag (cause and instruction named), a transport error, or a time-out.
        """
        t0 = time.monotonic()
        try:
            out = self._transfer(packet, t0 + self.timeout_s)
        except TimeoutError as exc:
            self._recover(abort=True)
            self._soft_reset_keep_log()
            raise DeviceError(f"device {self.name!r}: time-out after {self.timeout_s:g} s: {exc}; the core was "
                              f"aborted and reset (the sequence is replayed before the next token)") from exc
        self._check_error()
        self._counters["transfer_ns"] += int((time.monotonic() - t0) * 1e9)
        now = self._read_counters()
        self.last_counters = {c: now[c] - self._base_counters[c] for c in Counter}
        self._base_counters = now
        for c, v in self.last_counters.items():
            self._counters[f"hw_{c.name.lower()}"] += int(v)
        return out

    def _soft_reset_keep_log(self) -> None:
        log = list(self._log)
        self._soft_reset()
        self._log = log
        self._lost = True

    def _run(self, token_id: int, position: int) -> np.ndarray:
        from host.devices.golden import parse_output_packet

        raw = self.run_packet(self.token_packet(token_id, position))
        try:
            pkt = parse_output_packet(raw)
        except ValueError as exc:
            raise DeviceError(f"device {self.name!r}: bad output packet from the core: {exc}") from exc
        if pkt.position != position & 0xFFFFFFFF:
            raise DeviceError(f"device {self.name!r}: output packet for position {pkt.position}, expected {position}")
        return pkt.logits()

    def _reset(self) -> None:
        self._soft_reset()

    def _close(self) -> None:
        self._release()

    # ------------------------------------------------------------------ reports
    def cycles_report(self) -> dict | None:
        """Cycles per token from the hardware counters and the stream roofline (as the RTL device's)."""
        n = self._counters["hw_tokens"]
        if not n or self.image is None:
            return None
        from host.perf import BuildParams, token_counters

        bp = BuildParams.from_id_block(self.build)
        measured = self._counters["hw_cycles"] / n
        trits = sum(i.n * i.k for i in self.image.instructions if i.opcode is isa.Opcode.GEMV)
        ideal = max(self.image.info.image_bytes / (bp.channels * bp.beat_bytes), trits / bp.lanes)
        _, pred = token_counters(self.image.instructions, self.image.info, bp)
        return {"measured": measured, "predicted": pred[Counter.CYCLES], "ideal": ideal,
                "stream_efficiency": ideal / measured if measured else float("nan")}
