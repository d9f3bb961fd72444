"""An ESTIMATE of board power from the accelerator's activity counters (no board needed).

Every figure this module produces is an estimate, and is labelled so in every output. It is a
first-order activity model, meant to show where the energy of a token goes and how it scales with the
build, the model and the target family; it is not a substitute for a measurement.

The model
---------
For one token with device counters (``hw_*``, :class:`hw.isa.Counter`) on a build clocked at ``f``::

    duration  = CYCLES / f
    E_pl      = TRITS * e_trit + NONZERO_TRITS * e_add + EPILOGUE_ELEMENTS * e_epilogue
                + STREAM_BEATS * bus_bits * e_stream_bit                       (programmable logic)
    E_mem     = STREAM_BEATS * bus_bits * e_mem_bit                            (DRAM / HBM)
    P_pl      = P_pl_static + E_pl / duration
    P_mem     = E_mem / duration
    P_rest    = P_idle_total - P_pl_static                                     (constant)

Rails ``pl``, ``mem`` and ``rest`` sum to the board's default measured rail set (the SOM input on the
KV260, the board input on the PYNQ-Z2 and the ECP5 boards, the card on the Alveo); the ZCU104's default budget
rail set, its PL rails, is ``pl`` alone. While the accelerator waits, ``pl`` and ``rest`` stay at their
static values and ``mem`` is zero.

Constants and their sources
---------------------------
Per-operation energies are built from published 45 nm, 0.9 V ASIC energies (Horowitz, ISSCC 2014),
multiplied by the published FPGA/ASIC dynamic-power gap for soft logic (Kuon & Rose, TCAD 2007), and
scaled to each family's process and core voltage by first-order CV^2 scaling. What an operation is
made of (how many adds, SRAM accesses, multiplies), the gap for hard blocks, the scaling law, the
DDR4 and SDRAM energies per bit and every board's idle power are ENGINEERING ASSUMPTIONS, labelled
``"assumption"`` with their basis in :data:`ANCHORS`, :data:`FAMILIES`, :data:`MEMORIES` and
:data:`IDLE`. :func:`constants_table` lists every constant with its status and source.

What the estimate does not model: the host CPU's work during the run (on a Zynq its draw lands on
the measured rail), the clock tree and registers of the loaded design (part of the idle draw, not
modelled separately: use a measured idle, ``static_w``), DRAM refresh and background (in ``rest``),
the SoC-side memory controller and PHY, temperature-dependent leakage, regulator losses, and any
cycle the cycle model of :mod:`host.perf` does not predict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from host.power.base import SensorError
from host.power.boards import PowerBoard, get_board
from host.power.model import ModelSource
from hw.boards.facts import BOARDS as FACTS

__all__ = ["ANCHORS", "FAMILIES", "IDLE", "MEMORIES", "Constant", "EstimateSource", "Family", "OpEnergies",
           "constants_table", "op_energies"]

ESTIMATE_LABEL = "ESTIMATE (activity model of host.power.estimate, not a measurement)"

HOROWITZ = ("M. Horowitz, \"Computing's energy problem (and what we can do about it)\", ISSCC 2014, "
            "paper 1.1, energy table (45 nm, 0.9 V)")
KUON_ROSE = ("I. Kuon and J. Rose, \"Measuring the gap between FPGAs and ASICs\", IEEE TCAD 26(2):203-215, "
             "2007 (abstract: dynamic power ratio approximately 14; smaller with hard blocks)")
OCONNOR = ("M. O'Connor et al., \"Fine-Grained DRAM: Energy-Efficient DRAM for Extreme Bandwidth Systems\", "
           "MICRO-50, 2017 (HBM2: approximately 3.97 pJ/bit)")


@dataclass(frozen=True)
class Constant:
    """A number with its provenance.

    Attributes
    ----------
    value : float
    unit : str
    status : str
        ``"published"`` (a figure from a paper), ``"datasheet"`` (a vendor document or standard),
        ``"derived"`` (computed from other constants by the formula given) or ``"assumption"``
        (an engineering assumption: no precise source; the basis is stated).
    source : str
        The citation, or the basis of the assumption.
    """

    value: float
    unit: str
    status: str
    source: str


#: Published anchors and the assumptions that connect them to an FPGA datapath.
ANCHORS: dict[str, Constant] = {
    "add8": Constant(0.03, "pJ", "published", HOROWITZ + ": 8-bit integer add"),
    "add32": Constant(0.1, "pJ", "published", HOROWITZ + ": 32-bit integer add"),
    "mul32": Constant(3.1, "pJ", "published", HOROWITZ + ": 32-bit integer multiply"),
    "sram64": Constant(10.0, "pJ", "published", HOROWITZ + ": 64-bit read of an 8 KB SRAM"),
    "dram_bit": Constant(1300.0 / 64, "pJ/bit", "published",
                         HOROWITZ + ": DRAM access 1.3-2.6 nJ per 64 bits; the low end, 1.3 nJ / 64"),
    "fpga_soft": Constant(14.0, "x", "published", KUON_ROSE + ": soft logic"),
    "fpga_hard": Constant(4.0, "x", "assumption",
                          "FPGA/ASIC dynamic-power gap of hard blocks (DSP, block RAM): Kuon & Rose give no single "
                          "figure, only that the gap becomes smaller; their delay gap (3-4x) is taken as a stand-in"),
}


@dataclass(frozen=True)
class Family:
    """A target family: process and core voltage, for scaling the 45 nm / 0.9 V anchors.

    ``scale = (node_nm / 45) * (vcore / 0.9) ** 2`` (first-order CV^2 scaling: switched capacitance
    proportional to feature size, energy to the square of the voltage) is an assumption.
    """

    key: str
    title: str
    node_nm: float
    vcore: float
    source: str

    @property
    def scale(self) -> float:
        return (self.node_nm / 45.0) * (self.vcore / 0.9) ** 2


FAMILIES: dict[str, Family] = {
    "ecp5": Family("ecp5", "Lattice ECP5", 40.0, 1.1,
                   "Lattice ECP5/ECP5-5G family data sheet (FPGA-DS-02012): 40 nm, core VCC 1.1 V"),
    "zynq7": Family("zynq7", "AMD Zynq-7000", 28.0, 1.0,
                    "AMD DS187 (Zynq-7000 data sheet): 28 nm, VCCINT 1.0 V"),
    "zynqmp": Family("zynqmp", "AMD Zynq UltraScale+ MPSoC", 16.0, 0.85,
                     "AMD DS925 (Zynq UltraScale+ MPSoC data sheet): 16 nm FinFET, VCCINT 0.85 V"),
    "alveo-hbm": Family("alveo-hbm", "AMD Virtex UltraScale+ HBM (Alveo U55C)", 16.0, 0.85,
                        "AMD DS923 (Virtex UltraScale+ data sheet): 16 nm FinFET, VCCINT 0.85 V"),
}

#: Energy to move one bit between the external memory and the FPGA (device side), per memory kind.
MEMORIES: dict[str, Constant] = {
    "ddr3": Constant(ANCHORS["dram_bit"].value, "pJ/bit", "published", ANCHORS["dram_bit"].source),
    "ddr4": Constant(ANCHORS["dram_bit"].value * (1.2 / 1.5) ** 2, "pJ/bit", "assumption",
                     "the DRAM figure of Horowitz (ISSCC 2014) scaled by (VDD 1.2 V of DDR4, JESD79-4 / "
                     "VDD 1.5 V of DDR3, JESD79-3)^2"),
    "hbm2": Constant(3.97, "pJ/bit", "published", OCONNOR),
    "sdram": Constant(ANCHORS["dram_bit"].value * (3.3 / 1.5) ** 2, "pJ/bit", "assumption",
                      "the DRAM figure of Horowitz (ISSCC 2014) scaled by (3.3 V SDR SDRAM I/O / 1.5 V DDR3)^2"),
}

#: Idle draw of each board's default measured rail set (total) and the FPGA's static share of it (pl), from the
#: one table of board facts (:attr:`hw.boards.facts.BoardFacts.idle`).
IDLE: dict[str, dict[str, Constant]] = {
    key: {"total": Constant(f.idle.total_w, "W", f.idle.status, f.idle.total_source),
          "pl": Constant(f.idle.pl_w, "W", f.idle.status, f.idle.pl_source)}
    for key, f in FACTS.items()}

_OPS_BASIS = {
    "trit": "assumption: decoding a trit from the gearbox and selecting +q, -q or 0 switches about as much as one "
            "8-bit add: add8 * fpga_soft * scale",
    "add": "assumption: a non-zero trit costs one ~16-bit adder-tree node (a tree over L lanes has L-1 adders "
           "9 to 8+log2 L bits wide): (add8 + (add32 - add8) * 8/24) * fpga_soft * scale",
    "epilogue": "assumption: an element through the epilogue costs two 32-bit multiplies (DSP) and two 64-bit "
                "SRAM accesses (block RAM: sigmoid LUT, vector buffer) at fpga_hard, and four 32-bit adds at "
                "fpga_soft: ((2 mul32 + 2 sram64) * fpga_hard + 4 add32 * fpga_soft) * scale",
    "stream_bit": "assumption: each 64 bits of the weight stream are written to and read from one block-RAM FIFO "
                  "(fpga_hard) and cross the gearbox and interconnect at about one 8-bit add per byte "
                  "(fpga_soft): (2 sram64 / 64 * fpga_hard + add8 / 8 * fpga_soft) * scale",
}


@dataclass(frozen=True)
class OpEnergies:
    """Dynamic energy per operation of one family, in picojoules (all ESTIMATES)."""

    family: str
    trit_pj: float          #: every trit consumed (decode and select)
    add_pj: float           #: every non-zero trit (add or subtract)
    epilogue_pj: float      #: every element through the epilogue
    stream_bit_pj: float    #: every bit of the weight stream on chip
    mem_bit_pj: float       #: every bit of the weight stream read from DRAM / HBM


def op_energies(family: str, memory: str) -> OpEnergies:
    """Per-operation energies of a family and memory kind (see the module docstring for the formulas).

    Raises
    ------
    KeyError
        For an unknown family or memory kind.
    """
    fam = FAMILIES[family]
    a = {k: c.value for k, c in ANCHORS.items()}
    s = fam.scale
    add16 = a["add8"] + (a["add32"] - a["add8"]) * 8 / 24
    return OpEnergies(
        family=family,
        trit_pj=a["add8"] * a["fpga_soft"] * s,
        add_pj=add16 * a["fpga_soft"] * s,
        epilogue_pj=((2 * a["mul32"] + 2 * a["sram64"]) * a["fpga_hard"] + 4 * a["add32"] * a["fpga_soft"]) * s,
        stream_bit_pj=(2 * a["sram64"] / 64 * a["fpga_hard"] + a["add8"] / 8 * a["fpga_soft"]) * s,
        mem_bit_pj=MEMORIES[memory].value,
    )


def constants_table(board: str | PowerBoard | None = None) -> dict:
    """Every constant of the estimate with its status and source (JSON-ready).

    With a ``board``, also that board's family, memory, derived per-operation energies and idle.
    """
    out: dict = {
        "label": ESTIMATE_LABEL,
        "anchors": {k: asdict(c) for k, c in ANCHORS.items()},
        "families": {k: {**asdict(f), "scale": f.scale,
                         "scale_status": "assumption: (node_nm / 45) * (vcore / 0.9)^2, first-order CV^2 scaling"}
                     for k, f in FAMILIES.items()},
        "memories": {k: asdict(c) for k, c in MEMORIES.items()},
        "operations": dict(_OPS_BASIS),
        "idle": {b: {k: asdict(c) for k, c in v.items()} for b, v in IDLE.items()},
    }
    if board is not None:
        pb = get_board(board) if isinstance(board, str) else board
        out["board"] = {"key": pb.key, "family": pb.family, "memory": pb.memory,
                        "op_energies_pj": asdict(op_energies(pb.family, pb.memory))}
    return out


_NEEDED = ("hw_cycles", "hw_trits", "hw_nonzero_trits", "hw_epilogue_elements", "hw_stream_beats")


class EstimateSource(ModelSource):
    """ESTIMATED power of a board running the accelerator, driven by the device's activity counters.

    Parameters
    ----------
    board : str or PowerBoard
        A key of :data:`host.power.boards.BOARDS`.
    fmax_mhz : float
        Core clock of the build whose counters the device reports (the token lasts ``CYCLES / f``).
    bus_bits : int
        Width of one weight-stream beat.
    static_w : float, optional
        Measured idle of the board's default rail set, replacing the assumed :data:`IDLE` total (the PL
        share keeps its assumed ratio).

    Notes
    -----
    Rails: ``pl``, ``mem``, ``rest`` (see the module docstring). :meth:`on_token` needs the counters
    ``hw_cycles``, ``hw_trits``, ``hw_nonzero_trits``, ``hw_epilogue_elements`` and ``hw_stream_beats``
    (the golden device's, the RTL's). A zero ``hw_nonzero_trits`` with non-zero ``hw_trits`` is taken
    as "not counted" and every trit is costed as non-zero (an upper bound; :attr:`notes` says so).
    """

    name = "estimate"
    kind = "estimate"

    def __init__(self, board: str | PowerBoard, *, fmax_mhz: float, bus_bits: int,
                 static_w: float | None = None) -> None:
        super().__init__()
        self.board = get_board(board) if isinstance(board, str) else board
        if not fmax_mhz > 0:
            raise ValueError(f"fmax_mhz must be > 0, got {fmax_mhz}")
        if not (isinstance(bus_bits, int) and bus_bits > 0):
            raise ValueError(f"bus_bits must be a positive integer, got {bus_bits!r}")
        self.fmax_hz = float(fmax_mhz) * 1e6
        self.bus_bits = bus_bits
        self.ops = op_energies(self.board.family, self.board.memory)
        idle = IDLE[self.board.key]
        total, pl = idle["total"].value, idle["pl"].value
        if static_w is not None:
            if not static_w > 0:
                raise ValueError(f"static_w must be > 0 W, got {static_w}")
            pl, total = pl * static_w / total, float(static_w)
        self.pl_static_w = pl
        self.rest_w = total - pl
        self.static_measured = static_w is not None
        self.notes: list[str] = []
        self.tokens = 0
        self.energy_j = {"pl": 0.0, "mem": 0.0}

    def _open(self) -> tuple[str, ...]:
        return ("pl", "mem", "rest")

    def idle_watts(self) -> dict[str, float]:
        return {"pl": self.pl_static_w, "mem": 0.0, "rest": self.rest_w}

    def describe(self) -> dict:
        return {**super().describe(), "label": ESTIMATE_LABEL, "board": self.board.key,
                "fmax_mhz": self.fmax_hz / 1e6, "bus_bits": self.bus_bits,
                "idle_w": {"pl": self.pl_static_w, "rest": self.rest_w},
                "idle_status": "measured (--static-w)" if self.static_measured else "assumption (IDLE table)",
                "op_energies_pj": asdict(self.ops), "notes": list(self.notes)}

    def token_energy(self, activity: Mapping[str, int]) -> tuple[float, dict[str, float]]:
        """Modelled duration (s) and dynamic energy (J) per rail of one token's counters.

        Raises
        ------
        SensorError
            If a needed counter is missing (the device reports no activity counters).
        """
        missing = [k for k in _NEEDED if k not in activity]
        if missing:
            raise SensorError("the estimate needs the device's activity counters (" + ", ".join(missing)
                              + "); this device reports none: use a device that counts, such as --device golden")
        ops = self.ops
        trits = int(activity["hw_trits"])
        nonzero = int(activity["hw_nonzero_trits"])
        if trits and not nonzero:
            nonzero = trits
            note = "hw_nonzero_trits was 0: every trit costed as non-zero (upper bound)"
            if note not in self.notes:
                self.notes.append(note)
        bits = int(activity["hw_stream_beats"]) * self.bus_bits
        e_pl = (trits * ops.trit_pj + nonzero * ops.add_pj + int(activity["hw_epilogue_elements"]) * ops.epilogue_pj
                + bits * ops.stream_bit_pj) * 1e-12
        e_mem = bits * ops.mem_bit_pj * 1e-12
        return int(activity["hw_cycles"]) / self.fmax_hz, {"pl": e_pl, "mem": e_mem}

    def on_token(self, activity: Mapping[str, int]) -> None:
        duration, energy = self.token_energy(activity)
        self.tokens += 1
        for k, v in energy.items():
            self.energy_j[k] += v
        if duration <= 0:
            return
        self.segment(duration, {"pl": self.pl_static_w + energy["pl"] / duration,
                                "mem": energy["mem"] / duration, "rest": self.rest_w})
