"""One driver for every core behind a transport: the RTL harness, the ECP5 UART link, PYNQ's DMAs, XRT's kernels.

Glasgow's applet layering: a typed interface (the :class:`~host.devices.base.Device`) over an abstract
transport (:class:`Transport`) with a simulation implementation (:mod:`host.devices.rtl`). The driver,
:class:`AcceleratorDevice`, does everything that is the same on every core, through :mod:`host.protocol`:

* **open**: the ID block (magic, ISA version, the transport's own requirements), then ``CTRL.clear`` and a
  core reset;
* **load**: :meth:`~host.devices.base.Device.load_image` takes a compiled bundle (no compiler on the host);
  ``load(weights)`` compiles for the core's build (packing and channel count from its ID block) and takes
  the image the same way. The image is checked against the ID block (channels, packing, capacities), split
  into the channel streams and staged once;
* **tokens**: the host's embedding lookup makes the token packet (exactly the golden device's); the
  transport streams it and the image and returns the output packet, decoded into the same logits. A
  transport that holds the model itself (:class:`TokenTransport`, ``runs_token_ids``: the ECP5 DRAM boards)
  gets the image and the embedding table once (``stage_model``) and then only token ids and positions
  (``run_token``); greedy decoding (:meth:`~host.devices.base.Device.step_argmax`) and the prompt tokens
  whose logits nobody reads then come back as the 3-word argmax summary (:func:`parse_argmax_summary`);
* **errors**: the core's ``STATUS.error`` becomes a :class:`~host.protocol.CoreError` naming the
  :class:`~hw.isa.ErrorCause` and the instruction (the committed state is unchanged; the transport leaves the
  core waiting for the next token packet); a token past its deadline is a
  :class:`~host.protocol.DeviceTimeout` (never a hang): the transport aborts and resets the core, and the
  next token first replays the sequence so far;
* **counters**: ``hw_<name>`` per :class:`~hw.isa.Counter` (increments per token), ``replayed_tokens`` and
  the transport's own (:attr:`Transport.extra_counters`). Over a token-id transport the core's counters are
  read when :meth:`~AcceleratorDevice.counters` is called and before a reset, not per token (24 register
  reads would cost more link time than the token);
* **state**: the recurrent state lives in the core, which the host cannot read, so
  :meth:`~host.devices.base.Device.save_state` is the log of token ids since the last reset and restoring
  replays it after a core reset (:class:`~host.devices.base.ReplayLogDevice`).

A transport (:class:`Transport`) only moves bytes and register values: :mod:`host.devices.rtl`,
:mod:`host.devices.ecp5`, :mod:`host.devices.pynq`, :mod:`host.devices.xrt`. Board libraries (``pynq``,
``pyxrt``, ``serial``) are imported inside those modules only.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from host import protocol as pr
from host.devices.base import DeviceError, ReplayLogDevice
from host.image import ImageInfo, ParsedImage, parse_image
from host.model import ModelWeights
from hw import isa
from hw import numerics as nx
from hw.boards.link_protocol import SummaryFlags
from hw.isa import Counter, Ctrl, Opcode

if TYPE_CHECKING:
    from host.bundle import Bundle
    from host.compiler import CompileOptions

__all__ = ["AcceleratorDevice", "ArgmaxSummary", "Delivery", "SummaryFlags", "TokenTransport", "Transport",
           "parse_argmax_summary"]

R = isa.REGISTER_MAP



@dataclass(frozen=True)
class ArgmaxSummary:
    """What a DRAM board's argmax tap (:class:`hw.argmax_tap.ArgmaxTap`) sends for an argmax-only token."""

    position: int
    argmax: int
    flags: SummaryFlags


def parse_argmax_summary(raw: bytes) -> ArgmaxSummary:
    """Decode the :data:`hw.boards.link_protocol.ARGMAX_SUMMARY_WORDS` little-endian words (position, argmax,
    flags) of an argmax-only token's output.

    Raises
    ------
    ValueError
        Not exactly 12 bytes.
    """
    if len(raw) != 12:
        raise ValueError(f"an argmax summary is 3 words (12 bytes), got {len(raw)} bytes")
    pos, arg, flags = struct.unpack("<3I", raw)
    return ArgmaxSummary(pos, arg, SummaryFlags(flags))


@dataclass
class Delivery:
    """What a transport returns for one token.

    Attributes
    ----------
    output : bytes
        The output packet, as the core sent it.
    counters : dict[Counter, int] or None
        Counter increments of this token when the transport has them (the RTL harness reads them itself);
        None: the driver reads the counter registers.
    extra : dict[str, int]
        Increments of the transport's own counters (:attr:`Transport.extra_counters`).
    """

    output: bytes
    counters: dict[Counter, int] | None = None
    extra: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class Transport(Protocol):
    """What the driver needs from a way of reaching a core (register offsets are core-relative).

    Attributes
    ----------
    extra_counters : tuple of str
        Names of the transport's own counters (wire bytes, simulated cycles, ...), reported in
        :attr:`Delivery.extra`.
    """

    extra_counters: tuple[str, ...]

    def connect(self, info: ImageInfo | None) -> None:
        """Make the core's registers reachable, for an image of this shape (None: whatever core is there; a
        board's bitstream is fixed, the RTL builds a core for the shape)."""

    def check_ident(self, ident: pr.IdBlock) -> None:
        """Refuse a build this transport cannot drive (DeviceError); take what it needs (DMA per channel)."""

    def read(self, offset: int) -> int:
        """One 32-bit register read."""

    def write(self, offset: int, value: int) -> None:
        """One 32-bit register write."""

    def reset(self) -> None:
        """Reset the core: recurrent state and counters zero."""

    def stage(self, streams: Sequence[bytes], out_bytes: int) -> None:
        """Take a new image's channel streams (:func:`host.protocol.channel_streams`) and the output packet's
        size in bytes."""

    def run(self, packet: bytes, deadline: float | None, poll: Callable[[], None]) -> Delivery:
        """Stream one token packet and then the image; return the output packet once the core has finished
        (having checked, through ``poll``, that it did not stop the token).

        ``deadline`` is a ``time.monotonic()`` value (None: the transport's own limit). Raise
        :class:`TimeoutError` (or :class:`~host.protocol.DeviceTimeout`) past it; call ``poll()`` while
        waiting (it raises :class:`~host.protocol.CoreError` once the core has stopped the token), or raise
        the CoreError the transport learnt itself; DeviceError for a transport error."""

    def recover(self, timed_out: bool) -> None:
        """After a failed token: leave the core waiting for the next token packet with no transfer of the
        failed one left; after a time-out (``timed_out``) also abort and reset the core."""

    def close(self) -> None:
        """Release buffers, handles, processes; idempotent."""


@runtime_checkable
class TokenTransport(Transport, Protocol):
    """A transport whose far side holds the model and builds token packets itself (the ECP5 DRAM boards): the
    driver checks ``runs_token_ids`` after :meth:`~Transport.connect` and, when it is true, calls
    :meth:`stage_model` instead of :meth:`~Transport.stage` and :meth:`run_token` instead of
    :meth:`~Transport.run` (which stays available for packets the host makes itself).

    Attributes
    ----------
    runs_token_ids : bool
        Whether this connection runs tokens by id (may depend on what answered on connect).
    """

    runs_token_ids: bool

    def stage_model(self, image: ParsedImage, table: np.ndarray, out_bytes: int) -> None:
        """Make the far side hold ``image`` and the embedding table ``table`` (int32 [V, H], the residual format:
        row ``t`` is token ``t``'s packet payload); ``out_bytes`` as for :meth:`~Transport.stage`."""

    def run_token(self, token_id: int, position: int, logits: bool, deadline: float | None,
                  poll: Callable[[], None]) -> Delivery:
        """Run one token by id at ``position``; return the output packet (``logits``) or the 12-byte argmax
        summary (:func:`parse_argmax_summary`). Errors as :meth:`~Transport.run`; a refused token (no model, an
        id beyond the table) is a DeviceError."""


class AcceleratorDevice(ReplayLogDevice):
    """A core behind a :class:`Transport` as a :class:`~host.devices.base.Device` (see the module docstring).

    Parameters
    ----------
    transport : Transport
    timeout_s : float, optional
        Seconds one token may take before it is a :class:`~host.protocol.DeviceTimeout`; None leaves the
        limit to the transport (the RTL harness counts cycles without progress).
    output_gate : {"released", "paper"}
        Passed to the compiler by ``load(weights)``, as for the golden device.

    Attributes
    ----------
    ident : IdBlock or None
        The core's ID block (after opening).
    image : ParsedImage or None
        The loaded model image.
    last_counters : dict[Counter, int]
        Counter increments of the last token.
    """

    name = "accelerator"

    def __init__(self, transport: Transport, *, timeout_s: float | None = None,
                 output_gate: str = "released") -> None:
        super().__init__()
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
                                          and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.transport = transport
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self.output_gate = output_gate
        self.ident: pr.IdBlock | None = None
        self.image: ParsedImage | None = None
        self.last_counters: dict[Counter, int] = {}
        self._emb: np.ndarray | None = None
        self._frac: int | None = None
        self._log: list[int] = []
        self._lost = False
        self._by_id = False       # the transport runs tokens by id (TokenTransport)
        self._base = {c: 0 for c in Counter}
        self._counters.update({f"hw_{c.name.lower()}": 0 for c in Counter})
        self._counters.update({"replayed_tokens": 0, **{k: 0 for k in transport.extra_counters}})

    # ------------------------------------------------------------------ open
    @property
    def build(self) -> dict[str, int]:
        """The core's ID block by field name (empty before the core is opened)."""
        return self.ident.as_dict() if self.ident is not None else {}

    def connect(self, info: ImageInfo | None = None) -> pr.IdBlock:
        """Reach the core (for an image of this shape), check its ID block, clear and reset it.

        Raises
        ------
        DeviceError
            No mmfree core, another ISA version, a build the transport cannot drive.
        """
        self.transport.connect(info)
        self._by_id = bool(getattr(self.transport, "runs_token_ids", False))
        ident = pr.read_id_block(self.transport.read)
        pr.check_id_block(ident, self.name)
        self.transport.check_ident(ident)
        self.ident = ident
        self.transport.write(R.CTRL, Ctrl.CLEAR.value)
        self._reset()
        return ident

    def compile_options(self) -> CompileOptions:
        """How ``load(weights)`` compiles: for the core's build (its packing and channel count)."""
        from host.compiler import CompileOptions

        ident = self.ident if self.ident is not None else self.connect(None)
        if ident.packing is None:
            raise DeviceError(f"device {self.name!r}: the core supports no known trit packing "
                              f"(ID_PACKINGS 0x{ident.packings:x})")
        return CompileOptions(packing=ident.packing, channels=ident.channels, output_gate=self.output_gate)

    # ------------------------------------------------------------------ load
    def _load(self, weights: ModelWeights) -> None:
        from host.compiler import compile_model

        options = self.compile_options()
        self._check_fits(weights.config)
        image = parse_image(compile_model(weights, options))
        self._install(image, weights.embeddings, image.info.residual_frac)

    def _load_image(self, bundle: Bundle) -> None:
        # the bundle's embeddings are already in the residual format: token packets carry them as they are
        self._install(parse_image(bundle.image), np.asarray(bundle.embeddings, dtype=np.int32), None)

    def _check_fits(self, config) -> None:
        """Before compiling for a fixed core: the model's shape against the build's capacities."""
        if self.ident is None:
            return
        need = {"max_hidden": config.hidden_size, "max_intermediate": config.intermediate_size,
                "max_layers": config.num_hidden_layers, "max_vocab": config.vocab_size}
        short = {k: (v, getattr(self.ident, k)) for k, v in need.items() if v > getattr(self.ident, k)}
        if short:
            raise DeviceError(f"device {self.name!r}: the model does not fit this bitstream's buffers "
                              f"(needed, built): {short}; build a bitstream with larger capacities")

    def _install(self, image: ParsedImage, embeddings: np.ndarray, frac: int | None) -> None:
        """Check the image against the core, stage its channel streams, reset the core."""
        ident = self.connect(image.info)
        ident.check_image(image.info, self.name)
        self.image = None
        out_bytes = pr.output_packet_bytes(image.info.vocab)
        if self._by_id:
            table = embeddings if frac is None else nx.to_fixed(embeddings, frac)
            self.transport.stage_model(image, np.ascontiguousarray(table, dtype=np.int32), out_bytes)
        else:
            self.transport.stage(pr.channel_streams(image, ident.channels), out_bytes)
        self.image, self._emb, self._frac = image, embeddings, frac
        self._reset()

    # ------------------------------------------------------------------ tokens
    def token_packet(self, token_id: int, position: int = 0, logits: bool = True) -> bytes:
        """The host's embedding lookup for one token (the golden device's packet, byte for byte)."""
        return pr.embedding_packet(self._emb, token_id, frac=self._frac, position=position, logits=logits)

    def _poll(self) -> None:
        err = pr.read_error(self.transport.read, self.name)
        if err is not None:
            raise err

    def run_packet(self, packet: bytes) -> bytes:
        """Run one token packet through the core; return the output packet (raw bytes).

        Raises
        ------
        CoreError
            The core stopped the token (cause and instruction named); the core waits for the next packet.
        DeviceTimeout
            Past the deadline: the core was aborted and reset, the sequence is replayed before the next token.
        DeviceError
            A transport error.
        """
        return self._transfer(lambda deadline: self.transport.run(packet, deadline, self._poll)).output

    def _transfer(self, run: Callable[[float | None], Delivery]) -> Delivery:
        """One token through the transport (``run(deadline)``): the error paths and the counters."""
        t0 = time.monotonic()
        deadline = None if self.timeout_s is None else t0 + self.timeout_s
        try:
            got = run(deadline)
        except pr.CoreError:
            self.transport.recover(False)
            raise
        except (TimeoutError, pr.DeviceTimeout) as exc:
            self.transport.recover(True)
            self._base = {c: 0 for c in Counter}
            self._lost = True
            if isinstance(exc, pr.DeviceTimeout):
                raise
            raise pr.DeviceTimeout(f"device {self.name!r}: time-out after {self.timeout_s:g} s: {exc}; the core "
                                   f"was aborted and reset (the sequence is replayed before the next token)") from exc
        if got.counters is not None:
            inc = dict(got.counters)
            self._add_counters(inc)
        elif not self._by_id:
            self._sync_counters()
        for k, v in got.extra.items():
            self._counters[k] += int(v)
        return got

    def _add_counters(self, inc: dict[Counter, int]) -> None:
        self.last_counters = inc
        for c, v in inc.items():
            self._counters[f"hw_{c.name.lower()}"] += int(v)

    def _sync_counters(self) -> None:
        """Read the core's counters (one batch where the transport has ``read_many``) and add what they rose by
        since the last read."""
        offsets = [R.counter(c) + k for c in Counter for k in (0, 4)]
        many = getattr(self.transport, "read_many", None)
        values = dict(zip(offsets, many(offsets) if many is not None else map(self.transport.read, offsets),
                          strict=True))
        now = pr.read_counters(values.__getitem__)
        inc = {c: now[c] - self._base[c] for c in Counter}
        self._base = now
        self._add_counters(inc)

    def counters(self) -> dict[str, int]:
        """The counters (:meth:`~host.devices.base.Device.counters`); over a token-id transport the core's are
        read now (when the link fails, the ``hw_*`` values are those of the last read)."""
        if self._by_id and self.image is not None and not self.closed:
            try:
                self._sync_counters()
            except DeviceError:
                pass
        return super().counters()

    def _run_by_id(self, token_id: int, position: int, logits: bool) -> pr.OutputPacket | ArgmaxSummary:
        """One token over a token-id transport: its output packet (``logits``) or its argmax summary, checked
        (parsed, flags, position). An output that fails the checks first asks the core for an error (an error in
        the LM head cuts the packet: the core's CoreError); otherwise it is a DeviceError and, the core's state
        being unknown, the next token replays the sequence."""
        def bad(message: str) -> DeviceError:
            self._poll()
            self._lost = True
            return DeviceError(f"device {self.name!r}: {message}")

        result: list[pr.OutputPacket | ArgmaxSummary] = []

        def run(deadline: float | None) -> Delivery:
            got = self.transport.run_token(token_id, position, logits, deadline, self._poll)
            try:
                out = pr.parse_output_packet(got.output) if logits else parse_argmax_summary(got.output)
            except ValueError as exc:
                raise bad(f"bad {'output packet' if logits else 'argmax summary'} from the board: {exc}") from exc
            if isinstance(out, ArgmaxSummary) and out.flags:
                raise bad(f"the board's argmax tap flagged the output packet of position {position}: "
                          f"{'|'.join(f.name for f in SummaryFlags if f in out.flags)}")
            if out.position != position & 0xFFFFFFFF:
                raise bad(f"{'output packet' if logits else 'argmax summary'} for position {out.position}, "
                          f"expected {position}")
            result.append(out)
            return got

        self._transfer(run)
        return result[0]

    def _run(self, token_id: int, position: int) -> pr.OutputPacket:
        if self._by_id:
            return self._run_by_id(token_id, position, True)
        out = self.run_packet(self.token_packet(token_id, position))
        try:
            pkt = pr.parse_output_packet(out)
        except ValueError as exc:
            raise DeviceError(f"device {self.name!r}: bad output packet from the core: {exc}") from exc
        if pkt.position != position & 0xFFFFFFFF:
            raise DeviceError(f"device {self.name!r}: output packet for position {pkt.position}, expected {position}")
        return pkt

    def _run_argmax(self, token_id: int, position: int) -> int:
        """Over a token-id transport: the argmax summary alone (the core's argmax: the first index of the largest
        accumulator); otherwise the greedy token of the logits."""
        if not self._by_id:
            return super()._run_argmax(token_id, position)
        return self._run_by_id(token_id, position, False).argmax

    def _prefill(self, token_ids: np.ndarray) -> np.ndarray:
        """Over a token-id transport every prompt token but the last runs argmax-only (its logits are not read)."""
        if not self._by_id:
            return super()._prefill(token_ids)
        for t in token_ids[:-1]:
            self._step_argmax(int(t))
        return self._step(int(token_ids[-1]))

    def _logits(self, pkt: pr.OutputPacket) -> np.ndarray:
        return pkt.logits()

    def _reset(self) -> None:
        if self._by_id and self.image is not None:
            self._sync_counters()     # what the core counted since the last read, before the reset zeroes it
        self.transport.reset()
        self._base = {c: 0 for c in Counter}
        self._log = []
        self._lost = False

    def _close(self) -> None:
        self.transport.close()

    # ------------------------------------------------------------------ reports
    def build_params(self):
        """The :class:`hw.params.BuildParams` of the core's ID block."""
        from hw.params import BuildParams

        return BuildParams.from_id_block(self.ident.as_dict())

    def cycles_report(self) -> dict | None:
        """Cycles per token from the hardware counters next to the cycle model and the stream roofline.

        Returns
        -------
        dict or None
            ``measured`` (mean ``hw_cycles`` per token since construction), ``predicted`` (the cycle model for
            this build, :func:`host.perf.token_counters`; None on a host without Amaranth, whose gateware classes
            hold the latencies the model reads), ``ideal`` (the stream/lanes bound ``max(image bytes /
            (channels * beat bytes), trits / lanes)``) and ``stream_efficiency`` (ideal / measured); None
            before any token.
        """
        if self._by_id and self.image is not None and not self.closed:
            self._sync_counters()
        n = self._counters["hw_tokens"]
        if not n or self.image is None:
            return None
        from host.perf import token_counters

        bp = self.build_params()
        measured = self._counters["hw_cycles"] / n
        trits = sum(i.n * i.k for i in self.image.instructions if i.opcode is Opcode.GEMV)
        ideal = max(self.image.info.image_bytes / (bp.channels * bp.beat_bytes), trits / bp.lanes)
        try:
            predicted = token_counters(self.image.instructions, self.image.info, bp)[1][Counter.CYCLES]
        except ModuleNotFoundError:   # a board host with the runtime alone: measured figures only
            predicted = None
        return {"measured": measured, "predicted": predicted, "ideal": ideal,
                "stream_efficiency": ideal / measured if measured else float("nan")}
