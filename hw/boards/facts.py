"""Board facts: the one table of what each target board is, what it has and what we build on it.

Every module that needs a fact about a board reads it here: the cycle model's roofline and ``mmfree bench``
(:mod:`host.perf`, :mod:`host.selftest`), the power estimate and ``mmfree power`` (:mod:`host.power.boards`,
:mod:`host.power.estimate`), the generated Xilinx flows (:mod:`hw.boards.xilinx`), the ECP5 builds
(:mod:`hw.boards.ecp5`) and the performance report (:mod:`bench.report`). So each board has one answer: the
design point (lanes, channels, bus width, clock) that its flow or bitstream builds is the build that
``mmfree bench``, ``mmfree power`` and the report use by default.

Why here: ``hw/`` must not import ``host/`` (``host`` and ``bench`` import ``hw``), and the flows in
``hw/boards`` need the design points and parts, so the table lives beside them. It is plain dataclasses (no
Amaranth), so the host runtime on a board imports it without the gateware toolchain. What only one module
uses stays with that module: Vivado board parts, tool versions and part capacities (:mod:`hw.boards.xilinx`),
oscillators, PLLs and serial bridges (:mod:`hw.boards.ecp5`), measured sources and budget rail sets
(:mod:`host.power.boards`), process and voltage per family (:mod:`host.power.estimate`).

Each :class:`BoardFacts` names the source of each of its numbers in :attr:`BoardFacts.sources`. Peak
bandwidths are the vendors' (documents named there); design-point clocks are the targets the flows build (on
the ECP5 boards the targets the committed bitstreams met, ``bitstreams/<board>/report.json``; on the Xilinx
boards the targets of the generated Vivado/Vitis flows, not yet timed by Vivado); idle power is an engineering
assumption on every board (no board has been measured; ``mmfree power --static-w`` takes a measurement).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hw.params import BuildParams

__all__ = ["BOARDS", "CAPACITY_370M", "DEFAULT_BOARD", "BoardFacts", "DesignPoint", "Idle", "get"]


#: A board's design point is a :class:`hw.params.BuildParams` (the one build type): lanes, channels, bus width,
#: quantize lanes, the clock the flow targets and the epilogue form; its other fields keep their defaults here
#: (each flow sets the buffer capacities and packing it builds).
DesignPoint = BuildParams


@dataclass(frozen=True)
class Idle:
    """A board's draw at rest (Linux running and the bitstream loaded, where there is a CPU), in watts.

    Attributes
    ----------
    total_w : float
        The board's default measured rail set (:mod:`host.power.boards`: the SOM input on the KV260, the board
        input on the PYNQ-Z2 and ECP5 boards, the 12 V input on the ZCU104, the card on the Alveo).
    pl_w : float
        The FPGA's static share of it.
    total_source, pl_source : str
        Their sources (or the basis of the assumption).
    status : str
        ``"assumption"`` (no board measured yet) or ``"measured"``.
    """

    total_w: float
    pl_w: float
    total_source: str
    pl_source: str
    status: str = "assumption"


@dataclass(frozen=True)
class BoardFacts:
    """One board.

    Attributes
    ----------
    key : str
        Name on the command line (``--board``) and under ``bitstreams/<key>/``.
    title : str
    part : str
        The FPGA part (ordering code).
    family : str
        ``ecp5``, ``zynq7`` (Zynq-7000), ``zynqmp`` (Zynq UltraScale+ MPSoC) or ``alveo-hbm`` (Virtex
        UltraScale+ HBM); keys of :data:`host.power.estimate.FAMILIES`.
    memory : str
        ``sdram``, ``ddr3``, ``ddr4`` or ``hbm2``; keys of :data:`host.power.estimate.MEMORIES`.
    dram_mb : int
        Memory the weights can live in, MB.
    dram_gbs : float
        Its peak bandwidth, GB/s.
    port_gbs : float
        One port between that memory and the core (a PS high-performance port, an HBM pseudo-channel, the
        DRAM controller's user port on the ECP5 boards), peak GB/s.
    ports : int
        Such ports the weight channels can use.
    port_bits : int or None
        Data width of one port (None where the core sits behind the board's own DRAM controller).
    design : hw.params.BuildParams
        The build of this board (its ``fmax_mhz``: the core clock the build targets, the PLL's output on the
        ECP5 boards, the PL or kernel clock on the Xilinx boards).
    idle : Idle
        Its idle draw, with its own sources.
    sources : dict of str to str
        The source of each other fact, by attribute name.
    link_baud : int or None
        The ECP5 boards: the UART rate of the committed bitstream's host link, bits/s (the host's default for the
        board; ``bitstreams/<key>/report.json`` ``baud``). None where the host link is not a UART.
    serial_port : str or None
        The ECP5 boards: the serial device Linux usually gives the bridge's UART (the host's default port).
    """

    key: str
    title: str
    part: str
    family: str
    memory: str
    dram_mb: int
    dram_gbs: float
    port_gbs: float
    ports: int
    port_bits: int | None
    design: BuildParams
    idle: Idle
    sources: dict[str, str] = field(default_factory=dict)
    link_baud: int | None = None
    serial_port: str | None = None

    @property
    def fmax_mhz(self) -> float:
        """The design point's clock, MHz."""
        return self.design.fmax_mhz

    @property
    def name(self) -> str:
        """The title (the name :func:`host.perf.roofline`'s callers print)."""
        return self.title


_IDLE_BASIS = ("engineering assumption, not a measurement: a placeholder for the board at rest with Linux "
               "running and the bitstream loaded; replace it with a measured idle (static_w, --static-w)")
_IDLE_BASIS_ECP5 = ("engineering assumption, not a measurement: a placeholder for the board at rest with the "
                    "bitstream loaded; replace it with a measured idle (static_w, --static-w)")
_XILINX_FLOW = ("the target clock of the generated flow (hw/boards/xilinx.py, bitstreams/{key}/build.tcl); not yet "
                "timed by Vivado")
_ZYNQMP_HP = ("Zynq UltraScale+ MPSoC TRM (UG1085), PS-PL interfaces: four 128-bit S_AXI_HP0..3_FPD ports; "
              "128 bit x 300 MHz = 4.8 GB/s each (PL AXI clock limit of DS925)")

#: Buffer capacities of the 370M shape (hidden 1024, intermediate 2816, 24 layers; ``max_layers`` the next power
#: of two, where the core's state banks are placed), for the builds that take a released-size model
#: (:class:`hw.params.BuildParams` fields)
CAPACITY_370M = {"max_hidden": 1024, "max_intermediate": 2816, "max_layers": 32}

#: Every board, in the order of docs/ARCHITECTURE.md section 4 (small to large).
BOARDS: dict[str, BoardFacts] = {
    "ulx3s-85f": BoardFacts(
        "ulx3s-85f", "Radiona ULX3S 85F (ECP5)", "LFE5U-85F-6BG381C", "ecp5", "sdram", 32, 0.1, 0.1, 1, None,
        BuildParams(lanes=16, channels=1, bus_bits=64, quant_lanes=1, fmax_mhz=50.0, epilogue_folded=True),
        Idle(0.6, 0.08, "ULX3S-85F board input; " + _IDLE_BASIS_ECP5,
             "LFE5U-85F static near 25 C; " + _IDLE_BASIS_ECP5),
        {"part": "ULX3S schematic and amaranth-boards ULX3S_85F_Platform (LFE5U-85F, speed grade 6)",
         "dram_mb": "ULX3S schematic: one 32 MB SDR SDRAM, x16",
         "dram_gbs": "16 bit x 50 MHz (../shared/LITEDRAM.md: the SDR controller closed at its 50 MHz target; "
                     "docs/ARCHITECTURE.md section 4: 100 MB/s @50 MHz)",
         "port_gbs": "one LiteDRAM user port, the SDRAM's rate", "ports": "one DRAM controller",
         "design": "bitstreams/ulx3s-85f/report.json: the DRAM top (LiteDRAM SDR controller and core in one 50 MHz "
                   "domain), 16 lanes, 1 quantize lane, folded epilogue, 50 MHz target (56.44 MHz after routing, "
                   "nextpnr seed 2; hw.boards.ecp5.CHOSEN)",
         "link_baud": "bitstreams/ulx3s-85f/report.json: 2 Mbaud = 50 MHz / 25 (the FT231X's 3 Mbaud has no divisor "
                      "of 50 MHz within 1 %)",
         "serial_port": "the FT231X, the board's only USB serial interface"},
        link_baud=2_000_000, serial_port="/dev/ttyUSB0"),
    "ecpix5-85f": BoardFacts(
        "ecpix5-85f", "LambdaConcept ECPIX-5 85F (ECP5)", "LFE5UM5G-85F-8BG554I", "ecp5", "ddr3", 512, 0.6, 0.6, 1,
        None,
        BuildParams(lanes=40, channels=1, bus_bits=64, quant_lanes=1, fmax_mhz=68.0, epilogue_folded=True),
        Idle(1.5, 0.1, "ECPIX-5 board input; " + _IDLE_BASIS_ECP5,
             "LFE5UM5G-85F static near 25 C; " + _IDLE_BASIS_ECP5),
        {"part": "ECPIX-5 user guide and amaranth-boards ECPIX585Platform (LFE5UM5G-85F, speed grade 8)",
         "dram_mb": "ECPIX-5 user guide: 512 MB DDR3, x16",
         "dram_gbs": "300 MT/s x 2 B at a 75 MHz controller clock (../shared/LITEDRAM.md; docs/ARCHITECTURE.md "
                     "section 4: 600 MB/s @75 MHz)",
         "port_gbs": "one LiteDRAM user port, the DDR3's rate", "ports": "one DRAM controller",
         "design": "bitstreams/ecpix5-85f/report.json: the DDR3 top (LiteDRAM DDR3 controller at 75 MHz, the core in "
                   "its own domain), 40 lanes, 1 quantize lane, folded epilogue, 68 MHz target (70.60 MHz after "
                   "routing; hw.boards.ecp5.CHOSEN)",
         "link_baud": "bitstreams/ecpix5-85f/report.json: 4 Mbaud = 68 MHz / 17, a rate the "
                      "FT2232H makes exactly (hw.boards.ecp5.ftdi_baud)",
         "serial_port": "the FT2232H's second interface (the first is JTAG): usually the second ttyUSB"},
        link_baud=4_000_000, serial_port="/dev/ttyUSB1"),
    "pynq-z2": BoardFacts(
        "pynq-z2", "TUL PYNQ-Z2 (Zynq-7020)", "xc7z020clg400-1", "zynq7", "ddr3", 512, 2.1, 1.2, 4, 64,
        BuildParams(lanes=64, channels=2, bus_bits=64, quant_lanes=8, fmax_mhz=100.0),
        Idle(2.5, 0.12, "PYNQ-Z2 board input at 12 V; " + _IDLE_BASIS,
             "XC7Z020 PL static near 25 C; " + _IDLE_BASIS),
        {"part": "TUL PYNQ-Z2 reference manual: XC7Z020-1CLG400C",
         "dram_mb": "PYNQ-Z2 reference manual: 512 MB DDR3, 16 bit",
         "dram_gbs": "16 bit x 1050 MT/s = 2.1 GB/s (PYNQ-Z2 reference manual; docs/ARCHITECTURE.md section 4)",
         "port_gbs": "Zynq-7000 TRM (UG585) chapter 5: four 64-bit AXI HP ports; 64 bit x 150 MHz = 1.2 GB/s each",
         "ports": "UG585: S_AXI_HP0..3", "port_bits": "UG585: 64-bit HP ports",
         "design": _XILINX_FLOW.format(key="pynq-z2") + "; two weight channels on HP0 and HP1"}),
    "kv260": BoardFacts(
        "kv260", "AMD Kria KV260 (K26 SOM, Zynq UltraScale+)", "xck26-sfvc784-2LV-c", "zynqmp", "ddr4", 4096, 19.2,
        4.8, 4, 128,
        BuildParams(lanes=256, channels=4, bus_bits=128, quant_lanes=16, fmax_mhz=200.0),
        Idle(3.5, 0.35, "K26 SOM 5 V input (VCC_SOM); " + _IDLE_BASIS,
             "K26 (XCK26) PL static near 25 C; " + _IDLE_BASIS),
        {"part": "Kria K26 SOM data sheet (DS987): XCK26-SFVC784-2LV-C",
         "dram_mb": "DS987: 4 GB DDR4, 64 bit",
         "dram_gbs": "DS987: 64-bit DDR4 at 2400 MT/s = 19.2 GB/s", "port_gbs": _ZYNQMP_HP, "ports": _ZYNQMP_HP,
         "port_bits": _ZYNQMP_HP,
         "design": _XILINX_FLOW.format(key="kv260") + "; one weight channel per HP port"}),
    "zcu104": BoardFacts(
        "zcu104", "AMD ZCU104 (XCZU7EV, Zynq UltraScale+)", "xczu7ev-ffvc1156-2-e", "zynqmp", "ddr4", 2048, 19.2,
        4.8, 4, 128,
        BuildParams(lanes=256, channels=4, bus_bits=128, quant_lanes=16, fmax_mhz=200.0),
        Idle(14.0, 0.9, "ZCU104 12 V input; docs/ARCHITECTURE.md section 4: it idles near 14 W; " + _IDLE_BASIS,
             "XCZU7EV PL rails at idle; " + _IDLE_BASIS),
        {"part": "ZCU104 user guide (UG1267): XCZU7EV-2FFVC1156E",
         "dram_mb": "UG1267: 2 GB DDR4 on the PS, 64 bit",
         "dram_gbs": "UG1267: 64-bit PS DDR4 at 2400 MT/s = 19.2 GB/s", "port_gbs": _ZYNQMP_HP, "ports": _ZYNQMP_HP,
         "port_bits": _ZYNQMP_HP,
         "design": _XILINX_FLOW.format(key="zcu104") + "; one weight channel per HP port"}),
    "u55c": BoardFacts(
        "u55c", "AMD Alveo U55C (HBM2)", "xcu55c-fsvh2892-2L-e", "alveo-hbm", "hbm2", 16384, 460.0, 14.4, 32, 256,
        BuildParams(lanes=256, channels=4, bus_bits=256, quant_lanes=16, fmax_mhz=250.0),
        Idle(25.0, 8.0, "Alveo U55C card with its shell loaded; " + _IDLE_BASIS,
             "XCU55C static near 40 C; " + _IDLE_BASIS),
        {"part": "Alveo U55C data sheet (DS978): XCU55C-FSVH2892-2L-E",
         "dram_mb": "DS978: 16 GB HBM2", "dram_gbs": "DS978: 460 GB/s",
         "port_gbs": "DS978: 32 HBM pseudo-channels, 460 / 32 = 14.4 GB/s each",
         "ports": "DS978: 32 pseudo-channels", "port_bits": "HBM AXI ports of the Vitis platform: 256 bit",
         "design": _XILINX_FLOW.format(key="u55c") + " (v++ --kernel_frequency); one weight channel per HBM "
                   "pseudo-channel"}),
}

#: The board ``mmfree bench`` and ``mmfree power`` use when none is named.
DEFAULT_BOARD = "kv260"


def get(key: str) -> BoardFacts:
    """The facts of board ``key``.

    Raises
    ------
    ValueError
        For an unknown board (the message lists the known ones).
    """
    try:
        return BOARDS[key]
    except KeyError:
        raise ValueError(f"unknown board {key!r}; known boards: {', '.join(BOARDS)}") from None
