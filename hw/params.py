"""Build parameters: the one description of an accelerator build, used by every layer that needs one.

:class:`BuildParams` is what the gateware is built from (:class:`hw.top.Accelerator` takes it), what the
Verilog export keys its cache on (:func:`hw.export.export_verilog`), what the ID block reports
(:meth:`BuildParams.id_values`, :meth:`BuildParams.from_id_block`), what the cocotb bench, the Verilated RTL
device, the golden device and the benchmarks build or predict, and what the cycle model (:mod:`host.perf`)
schedules. The board facts' design points (:data:`hw.boards.facts.BOARDS`) are instances of it.

It holds three kinds of field, with one set of defaults:

* **gateware parameters** (:data:`GATEWARE_FIELDS`): they change the Verilog, so they (and only they) key the
  export cache, and :meth:`BuildParams.gateware` lists them as plain values;
* **the clock** (``fmax_mhz``): the target a build is timed for. It lives here because a build point is
  quoted with its clock everywhere it is used (a board's design point, the roofline, tokens/s, the power
  estimate), and a second type pairing a build with its clock would be one more form to keep in step. It
  does not change the Verilog, so it is not a gateware field;
* **schedule options** (:data:`SCHEDULE_OPTIONS`): proposed schedule changes that only the cycle model
  knows (``docs/PERFORMANCE_MODEL.md``); all off is the schedule of ``hw/top.py`` as built, and the gateware
  refuses a build with any of them on (:meth:`BuildParams.check_gateware`).

Validation has two levels. Construction checks what every user needs (positive integer sizes, ``lanes`` a
multiple of ``channels``, ``bus_bits`` a multiple of 32, bools that are bools, a known packing), which is
all the cycle model needs: it also evaluates builds the gateware does not build (a 2048-lane roofline, a
32-bit bus, 64 quantize lanes on a 16-lane channel). :meth:`BuildParams.check_gateware` adds the
gateware's limits (1-4 channels, 4-256 lanes per channel, a 64-512-bit bus, power-of-two quantize lanes that
divide the lanes per channel, a FIFO of at least 16 beats, capacities within the ISA limits);
:class:`hw.top.Accelerator` calls it.

This module imports no Amaranth beyond :mod:`hw.isa` (which the host runtime imports on a board too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hw import isa
from hw.isa import TritPacking
from hw.numerics import LUT_SEGMENTS_LOG2

__all__ = ["BuildParams", "GATEWARE_FIELDS", "SCHEDULE_OPTIONS", "DEVICE_FIELDS"]

#: The fields that change the Verilog (:meth:`BuildParams.gateware`), in the export's order.
GATEWARE_FIELDS = ("lanes", "channels", "bus_bits", "quant_lanes", "packing", "max_hidden", "max_intermediate",
                   "max_layers", "lut_segments_log2", "weight_fifo_beats", "epilogue_folded", "token_tlast",
                   "image_tlast", "state_in_dram")
#: The cycle model's proposed schedule options (all False: the schedule of hw/top.py as built).
SCHEDULE_OPTIONS = ("overlap_headers", "stripe_consts", "overlap_prologue", "stream_prologue")
#: The fields the golden, RTL and board devices take as keyword arguments (:meth:`BuildParams.device_kwargs`).
DEVICE_FIELDS = ("lanes", "channels", "bus_bits", "quant_lanes", "fmax_mhz", "epilogue_folded")

_INTS = ("lanes", "channels", "bus_bits", "quant_lanes", "max_hidden", "max_intermediate", "max_layers",
         "lut_segments_log2")
_BOOLS = ("epilogue_folded", "token_tlast", "image_tlast", "state_in_dram", *SCHEDULE_OPTIONS)


def _packing(v: Any) -> TritPacking:
    if isinstance(v, str):
        try:
            return TritPacking[v.upper()]
        except KeyError:
            raise ValueError(f"packing must be 'base3' or 'bits2', got {v!r}") from None
    if isinstance(v, bool):
        raise ValueError(f"packing must be a TritPacking, its value or its name, got {v!r}")
    try:
        return TritPacking(v)
    except ValueError:
        raise ValueError(f"packing must be a TritPacking, its value or its name, got {v!r}") from None


@dataclass(frozen=True)
class BuildParams:
    """One accelerator build: its gateware parameters, its clock and the cycle model's schedule options.

    Attributes
    ----------
    lanes : int
        Trits consumed per cycle, all channels together (a multiple of ``channels``; the gateware: 4-256
        per channel).
    channels : int
        AXI4-Stream weight channels (``s_axis_w0``..; the gateware: 1-4).
    bus_bits : int
        ``tdata`` width of each weight channel (a multiple of 32; the gateware: 64, 128, 256 or 512).
    quant_lanes : int
        Codes formed per cycle by the quantize prologue (the gateware: a power of two dividing the lanes per
        channel).
    packing : TritPacking
        The trit packing the build decodes (the image header must match); a value or name is converted.
    max_hidden, max_intermediate, max_layers : int
        Buffer capacities (``ID_MAX_*``; at most the ISA limits). ``max_layers`` should be a power of two:
        hw/top.py places the second state bank at the next power of two (``host.devices.rtl``).
    lut_segments_log2 : int
        Sigmoid LUT size (images must match; :data:`hw.numerics.LUT_SEGMENTS_LOG2`).
    weight_fifo_beats : int
        Depth in beats of channel 0's weight FIFO (the gateware: >= 16): how far channel 0 may run ahead of
        its lanes, so that the next instruction's header and constants stream while the current GEMV still
        computes. With ``overlap_headers`` the cycle model gives every channel such a FIFO.
    epilogue_folded : bool
        The folded epilogue (``ID_EPILOGUE`` 1; the ECP5 builds): an element every ``max(n_ops, 1)`` cycles,
        and a drain of ``FOLDED_ENTRY_LATENCY + FOLDED_PASS_CYCLES * max(n_ops, 1)`` cycles (host.perf).
    token_tlast, image_tlast : bool
        The token packet's last beat, the image's last beat carry ``tlast`` (default both; the Xilinx shells
        clear them where their data movers do not mark those ends, :mod:`hw.boards.xilinx_shell`).
    state_in_dram : bool
        The recurrent state in board DRAM (default False): the core keeps one layer's ``STATE_OLD`` and
        ``STATE_NEW`` rows (:class:`hw.state_cache.StateCache`) and moves rows through its ``state_cmd``,
        ``m_axis_state`` and ``s_axis_state`` ports, which a DRAM board serves
        (:class:`hw.boards.dram_board.DRAMBoard`); for capacities whose two on-chip banks would not fit the
        block RAM (the 370M shape on the ECPIX-5, docs/DDR3.md).
    fmax_mhz : float
        The clock the build targets, MHz (time, roofline and tokens/s figures; not a gateware parameter).
    overlap_headers : bool
        Proposed (default False). The stream reader runs ahead of the lanes through a weight FIFO of
        ``weight_fifo_beats`` beats per channel, and headers/constants go to a double-buffered header unit:
        the next instruction's header and constants stream while the current GEMV computes (in the channel's
        idle beats) and while its epilogue drains, and a GEMV's first weights stream during its prologue.
    stripe_consts : bool
        Proposed (default False; an image layout change). The constant words are split over all channels
        (``C0..C3`` row ``r`` on the channel that carries row ``r``, ``QC`` word ``k`` on channel
        ``k % channels``); the 64-byte instruction header stays on channel 0.
    overlap_prologue : bool
        Proposed (default False). Double-buffered codes and an epilogue that carries an instruction tag per
        element: a GEMV whose source buffer and reduction registers the previous instruction does not write
        (f_proj, g_proj) forms its codes while the previous GEMV computes, and its body starts when the
        lanes are free, not when the previous epilogue has drained.
    stream_prologue : bool
        Proposed (default False). The quantize pass feeds the lanes directly, one chunk ahead of the first
        row, instead of finishing before the GEMV starts: the barrier costs ``host.perf.RECIP_CYCLES`` +
        ``host.perf.QUANT_LATENCY`` (+ ``ceil(K / quant_lanes) - ceil(K / lanes_per_channel)`` when the
        pass is slower than the first row); the dequantization scale is finished during the first rows.

    Raises
    ------
    ValueError
        A non-positive or non-integer size, ``lanes`` not a multiple of ``channels``, ``bus_bits`` not a
        multiple of 32, a negative FIFO depth, a non-positive clock, a flag that is not a bool, or an
        unknown packing.
    """

    lanes: int = 64
    channels: int = 1
    bus_bits: int = 64
    quant_lanes: int = 8
    packing: TritPacking = TritPacking.BASE3
    max_hidden: int = 512
    max_intermediate: int = 1024
    max_layers: int = 8
    lut_segments_log2: int = LUT_SEGMENTS_LOG2
    weight_fifo_beats: int = 1024
    epilogue_folded: bool = False
    token_tlast: bool = True
    image_tlast: bool = True
    state_in_dram: bool = False
    fmax_mhz: float = 100.0
    overlap_headers: bool = False
    stripe_consts: bool = False
    overlap_prologue: bool = False
    stream_prologue: bool = False

    def __post_init__(self):
        object.__setattr__(self, "packing", _packing(self.packing))
        for name in _INTS:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.lanes % self.channels:
            raise ValueError(f"lanes ({self.lanes}) must be a multiple of channels ({self.channels})")
        if self.bus_bits % 32:
            raise ValueError(f"bus_bits must be a multiple of 32, got {self.bus_bits}")
        v = self.weight_fifo_beats
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"weight_fifo_beats must be a non-negative integer, got {v!r}")
        if isinstance(self.fmax_mhz, bool) or not (isinstance(self.fmax_mhz, (int, float)) and self.fmax_mhz > 0):
            raise ValueError(f"fmax_mhz must be positive, got {self.fmax_mhz!r}")
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")

    # ------------------------------------------------------------------------------------ construction
    @classmethod
    def from_mapping(cls, params: Mapping[str, Any] | BuildParams) -> BuildParams:
        """A build from keyword parameters (``packing`` as a :class:`~hw.isa.TritPacking`, its value or name;
        ``epilogue_folded``/``token_tlast``/``image_tlast`` as bools or 0/1), or ``params`` itself.

        Raises
        ------
        TypeError
            On a name that is not a field.
        """
        if isinstance(params, cls):
            return params
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - names)
        if unknown:
            raise TypeError(f"unknown build parameter(s) {unknown}; known: {sorted(names)}")
        kw = dict(params)
        for name in _BOOLS:
            if name in kw and kw[name] in (0, 1) and not isinstance(kw[name], bool):
                kw[name] = bool(kw[name])
        return cls(**kw)

    @classmethod
    def overlapped(cls, **kw) -> BuildParams:
        """A build with every proposed schedule option on (``kw`` sets the rest)."""
        return cls(**{**{name: True for name in SCHEDULE_OPTIONS}, **kw})

    @classmethod
    def from_id_block(cls, ident: Mapping[str, int], **kw) -> BuildParams:
        """The build a core's ID block describes (``host.devices.board.read_id_block``'s fields by name).

        The capacities and the packing are taken where the block has them (the packing when it reports exactly
        one); ``epilogue_folded`` is absent or 0 on builds before ``ID_EPILOGUE``. ``kw`` sets what the block
        does not report (``fmax_mhz``, the framing flags, schedule options).
        """
        out = {"lanes": ident["lanes"], "channels": ident["channels"], "bus_bits": ident["bus_bits"],
               "quant_lanes": ident["quant_lanes"], "epilogue_folded": bool(ident.get("epilogue_folded", 0))}
        for name in ("max_hidden", "max_intermediate", "max_layers"):
            if ident.get(name):
                out[name] = int(ident[name])
        mask = int(ident.get("packings", 0))
        if mask and mask & (mask - 1) == 0 and mask.bit_length() - 1 in {p.value for p in TritPacking}:
            out["packing"] = TritPacking(mask.bit_length() - 1)
        return cls(**{**out, **kw})

    def replace(self, **kw) -> BuildParams:
        """A copy with ``kw`` changed (validated again)."""
        return dataclasses.replace(self, **kw)

    # ------------------------------------------------------------------------------------ views
    @property
    def beat_bytes(self) -> int:
        """Bytes per beat of one weight channel."""
        return self.bus_bits // 8

    @property
    def lanes_per_channel(self) -> int:
        return self.lanes // self.channels

    @property
    def triple(self) -> tuple[int, int, int]:
        """``(lanes, channels, bus_bits)``."""
        return (self.lanes, self.channels, self.bus_bits)

    @property
    def tag(self) -> str:
        """A short name for build directories and logs, e.g. ``l32c1b64-base3-folded``."""
        return (f"l{self.lanes}c{self.channels}b{self.bus_bits}-{self.packing.name.lower()}"
                + ("-folded" if self.epilogue_folded else ""))

    def gateware(self) -> dict[str, int | bool]:
        """The gateware parameters (:data:`GATEWARE_FIELDS`) as plain values (``packing`` by value), in a fixed
        order: what the Verilog export keys on and records, and what the cocotb bench's manifest carries."""
        return self.as_dict(GATEWARE_FIELDS)

    def as_dict(self, names: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The fields (``names``, default all, in order) as plain values (``packing`` by value): JSON-ready, and
        ``BuildParams(**d)`` gives the build back."""
        names = names if names is not None else tuple(f.name for f in dataclasses.fields(self))
        return {name: (self.packing.value if name == "packing" else getattr(self, name)) for name in names}

    @property
    def serial(self) -> bool:
        """True for the schedule as built (no proposed schedule option on)."""
        return not any(getattr(self, name) for name in SCHEDULE_OPTIONS)

    def device_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the golden, RTL and board devices (:data:`DEVICE_FIELDS`)."""
        return {name: getattr(self, name) for name in DEVICE_FIELDS}


    def id_values(self) -> dict[int, int]:
        """The ID block's register values of this build: ``{offset: value}`` (:func:`hw.isa.id_block_values`)."""
        return isa.id_block_values(lanes=self.lanes, channels=self.channels, bus_bits=self.bus_bits,
                                   packings=[self.packing], quant_lanes=self.quant_lanes, max_hidden=self.max_hidden,
                                   max_intermediate=self.max_intermediate, max_layers=self.max_layers,
                                   max_vocab=isa.MAX_VOCAB, epilogue_folded=self.epilogue_folded)

    # ------------------------------------------------------------------------------------ gateware limits
    def check_gateware(self) -> None:
        """Refuse what :class:`hw.top.Accelerator` cannot build (the module docstring lists the limits).

        Raises
        ------
        ValueError
            Naming the first parameter out of the gateware's range.
        """
        lpc = self.lanes // self.channels
        if not 1 <= self.channels <= 4:
            raise ValueError(f"channels must be 1-4, got {self.channels}")
        if not 4 <= lpc <= 256:
            raise ValueError(f"lanes ({self.lanes}) must be a multiple of channels ({self.channels}) with 4-256 "
                             "per channel")
        if self.bus_bits not in (64, 128, 256, 512):
            raise ValueError(f"bus_bits must be 64, 128, 256 or 512, got {self.bus_bits}")
        q = self.quant_lanes
        if q & (q - 1) or q > lpc:
            raise ValueError(f"quant_lanes ({q}) must be a power of two <= lanes per channel")
        if lpc % q:
            raise ValueError(f"quant_lanes ({q}) must divide lanes per channel ({lpc})")
        if self.weight_fifo_beats < 16:
            raise ValueError(f"weight_fifo_beats must be >= 16, got {self.weight_fifo_beats}")
        if self.max_hidden > isa.MAX_HIDDEN or self.max_intermediate > isa.MAX_INTERMEDIATE or \
                self.max_layers > isa.MAX_LAYERS:
            raise ValueError("buffer capacities exceed the ISA limits")
        on = [name for name in SCHEDULE_OPTIONS if getattr(self, name)]
        if on:
            raise ValueError(f"schedule option(s) {on} are the cycle model's proposals; the gateware has none")
