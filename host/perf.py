"""Cycle model of the accelerator and the decode roofline of DESIGN.md section 4.

The golden device predicts every counter of :class:`hw.isa.Counter` per instruction from this model;
the RTL's counters are compared against it. The model is the datapath's schedule written down:

* the instruction header and its constants arrive on channel 0 at one beat per cycle;
* a GEMV that forms new codes pays the scalar unit (:data:`SCALAR_CYCLES`: integer square root and one
  division) and the quantize prologue (``ceil(K / quant_lanes)`` cycles plus :data:`QUANT_LATENCY`):
  together the absmax barrier;
* each channel's lane group (``lanes / channels`` lanes) computes its rows, one row at a time, in
  ``ceil(K / lanes_per_channel)`` cycles per row, while its weight stream delivers one beat per cycle;
  the slower of the two binds; the adder tree and the epilogue pipeline add a fixed drain latency;
* LOAD_TOKEN streams the token packet; END_TOKEN sends the output packet.

Stream efficiency (DESIGN.md section 3) is
``max(image bytes / (channels * beat bytes), trits / lanes) / cycles`` over a whole token.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from hw import isa
from hw.isa import Counter, InstrFlags, Opcode, TritPacking

__all__ = ["BuildParams", "Board", "BOARDS", "SCALAR_CYCLES", "QUANT_LATENCY", "instruction_counters",
           "stream_efficiency", "roofline"]

SCALAR_CYCLES = 64     #: isqrt of the 64-bit sum of squares (32) + a 25-bit quotient division (26) + 6
QUANT_LATENCY = 4      #: quantize prologue pipeline
EPILOGUE_LATENCY = 2 * isa.MAX_OPS + 4  #: two pipeline stages per micro-op, plus dequantization


@dataclass(frozen=True)
class BuildParams:
    """Build parameters of an accelerator instance (the ID block reports them).

    Attributes
    ----------
    lanes : int
        Trits consumed per cycle, all channels together (a multiple of ``channels``).
    channels : int
        AXI4-Stream weight channels.
    bus_bits : int
        ``tdata`` width of each weight channel (64-512).
    quant_lanes : int
        Codes formed per cycle by the quantize prologue.
    fmax_mhz : float
        Clock, for time and roofline figures.
    """

    lanes: int = 64
    channels: int = 1
    bus_bits: int = 64
    quant_lanes: int = 8
    fmax_mhz: float = 100.0

    def __post_init__(self):
        for name in ("lanes", "channels", "bus_bits", "quant_lanes"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.lanes % self.channels:
            raise ValueError(f"lanes ({self.lanes}) must be a multiple of channels ({self.channels})")
        if self.bus_bits % 32:
            raise ValueError(f"bus_bits must be a multiple of 32, got {self.bus_bits}")

    @property
    def beat_bytes(self) -> int:
        return self.bus_bits // 8

    @property
    def lanes_per_channel(self) -> int:
        return self.lanes // self.channels

    def as_dict(self) -> dict:
        return asdict(self)


def _beats(nbytes: int, beat_bytes: int) -> int:
    return -(-nbytes // beat_bytes)


def instruction_counters(ins, info, build: BuildParams) -> dict[Counter, int]:
    """Predicted counters of one parsed instruction (:class:`host.image.Instruction`).

    Parameters
    ----------
    ins : host.image.Instruction
    info : host.image.ImageInfo
    build : BuildParams
    """
    from host.image import channel_block_bytes, channel_rows, const_section_bytes

    c = {k: 0 for k in Counter}
    c[Counter.INSTRUCTIONS] = 1
    head_beats = _beats(64 + const_section_bytes(ins), build.beat_bytes)
    c[Counter.STREAM_BEATS] += head_beats
    cycles = head_beats
    if ins.opcode is Opcode.GEMV:
        if InstrFlags.REUSE_CODES not in ins.flags:
            c[Counter.SCALAR_CYCLES] = SCALAR_CYCLES
            c[Counter.QUANT_CYCLES] = math.ceil(ins.k / build.quant_lanes) + QUANT_LATENCY
            cycles += SCALAR_CYCLES + c[Counter.QUANT_CYCLES]
        blocks = channel_block_bytes(ins.n, ins.k, info.channels, info.packing)
        per_row = math.ceil(ins.k / build.lanes_per_channel)
        body, stall = 0, 0
        for ch, nb in enumerate(blocks):
            compute = channel_rows(ins.n, info.channels, ch) * per_row
            beats = _beats(nb, build.beat_bytes)
            c[Counter.STREAM_BEATS] += beats
            body = max(body, compute, beats)
            stall = max(stall, beats - compute)
        c[Counter.GEMV_CYCLES] = body
        c[Counter.STREAM_STALLS] = max(stall, 0)
        c[Counter.TRITS] = ins.n * ins.k
        c[Counter.EPILOGUE_ELEMENTS] = ins.n
        cycles += body + EPILOGUE_LATENCY + math.ceil(math.log2(max(build.lanes_per_channel, 2)))
    elif ins.opcode is Opcode.LOAD_TOKEN:
        tok_bytes = 16 + 4 * ins.n + 4
        tok = _beats(tok_bytes + isa.section_pad(tok_bytes), build.beat_bytes)
        c[Counter.EPILOGUE_ELEMENTS] = ins.n
        cycles += tok + EPILOGUE_LATENCY
    elif ins.opcode is Opcode.END_TOKEN:
        c[Counter.TOKENS] = 1
        cycles += 8 + 1 + 1  # output header, CRC, commit
    c[Counter.CYCLES] = cycles
    return c


def stream_efficiency(image_bytes: int, trits: int, cycles: int, build: BuildParams) -> float:
    """DESIGN.md section 3: share of the cycles in which the binding resource did useful work."""
    return max(image_bytes / (build.channels * build.beat_bytes), trits / build.lanes) / cycles


@dataclass(frozen=True)
class Board:
    """A target of DESIGN.md section 4 (peak figures from the vendors' datasheets, as cited there)."""

    name: str
    dram_gbs: float       #: DRAM peak bandwidth, GB/s
    port_gbs: float       #: one PL-PS port (or HBM pseudo-channel), GB/s
    ports: int            #: ports usable by the weight channels
    fmax_mhz: float       #: a realistic clock for the core on this part
    power_w: float        #: typical board power, for tokens/J projections (estimate)


BOARDS = {
    "pynq-z2": Board("PYNQ-Z2 (Zynq-7020)", 2.1, 1.2, 4, 100.0, 3.0),
    "kv260": Board("KV260 (Zynq US+ K26)", 19.2, 4.8, 4, 300.0, 7.0),
    "zcu104": Board("ZCU104 (Zynq US+ XCZU7EV)", 19.2, 4.8, 4, 300.0, 14.0),
    "u55c": Board("Alveo U55C (HBM2)", 460.0, 14.4, 32, 300.0, 60.0),
    "ulx3s-85f": Board("ULX3S-85F (ECP5)", 0.2, 0.2, 1, 60.0, 1.0),
}


def roofline(image_bytes: int, trits: int, build: BuildParams, board: Board) -> dict[str, float]:
    """Decode tokens/s bounds (DESIGN.md section 4): the smallest of four rates binds.

    Returns a dict with ``dram``, ``ports``, ``channels`` (bus x Fmax) and ``lanes`` (trits x Fmax)
    in tokens/s, ``bound`` (their minimum) and ``binding`` (its name).
    """
    fmax = min(build.fmax_mhz, board.fmax_mhz) * 1e6
    rates = {
        "dram": board.dram_gbs * 1e9 / image_bytes,
        "ports": min(build.channels, board.ports) * board.port_gbs * 1e9 / image_bytes,
        "channels": build.channels * build.beat_bytes * fmax / image_bytes,
        "lanes": build.lanes * fmax / trits,
    }
    name = min(rates, key=rates.get)
    return {**rates, "bound": rates[name], "binding": name}


def packing_bits(packing: TritPacking) -> float:
    """Bits per trit of a packing."""
    return 2.0 if TritPacking(packing) is TritPacking.BITS2 else 1.6
