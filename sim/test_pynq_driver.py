"""The PYNQ driver (host/devices/pynq.py), unchanged, against the core under cocotb (issue 6).

The Verilog of the PYNQ-Z2 flow (``hw/boards/xilinx.py``: ``mmfree_top`` around the shell and the core) is
built for a small core and simulated; ``sim/pynq_driver_tests.py`` installs a ``pynq`` stand-in backed by
cocotbext-axi (AXI4-Lite for MMIO, one AXI4-Stream source per DMA, a sink for the S2MM output) and runs the
driver on a tiny random model: its logits must equal the golden device's bit for bit, token after token,
with 4 KiB DMA chunks, after a soft reset and after a state restore (a replay). Slow: a Verilator build.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest

from host.model import HGRNBitConfig, random_weights

pytestmark = [pytest.mark.sim, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {"lanes": 16, "channels": 2, "bus_bits": 64, "quant_lanes": 4, "max_hidden": 32, "max_intermediate": 64,
          "max_layers": 2}


def test_pynq_driver_on_the_simulated_core(tmp_path):
    if os.environ.get("SIM", "verilator").lower() != "verilator":
        pytest.skip("this test is written for Verilator")
    from test_accelerator import _check_simulator, _environ  # the regression's simulator set-up

    from hw.boards import xilinx
    from hw.export import source_digest

    env = _check_simulator()
    shell = (ROOT / "hw" / "boards" / "xilinx_shell.py").read_text()
    blob = [PARAMS, source_digest(), shell, xilinx.verilog_top("pynq-z2", xilinx.core_params("pynq-z2", **PARAMS))]
    key = hashlib.sha256(json.dumps(blob).encode()).hexdigest()[:16]
    root = ROOT / "sim_build" / f"pynq-{key}"
    vdir = root / "verilog"
    if not (vdir / "mmfree_shell.v").is_file():
        xilinx.generate("pynq-z2", vdir, **PARAMS)
    from cocotb_tools.runner import get_runner

    runner = get_runner("verilator")
    sim_dir = root / "verilator"
    with _environ(**env):
        if not (sim_dir / ".built").is_file():
            runner.build(sources=[vdir / "mmfree_top.v", vdir / "mmfree_shell.v"], hdl_toplevel="mmfree_top",
                         build_dir=sim_dir, build_args=["-Wno-fatal", "-Wno-lint", "-Wno-style", "-O2"],
                         timescale=("1ns", "1ps"))
            (sim_dir / ".built").write_text("ok\n")
        w = random_weights(HGRNBitConfig(vocab_size=37, hidden_size=20, num_hidden_layers=2, intermediate_size=28),
                           seed=11)
        wfile = tmp_path / "weights.pkl"
        wfile.write_bytes(pickle.dumps(w))
        extra = {"MMFREE_WEIGHTS": str(wfile), "MMFREE_CHANNELS": str(PARAMS["channels"]),
                 "MMFREE_LANES": str(PARAMS["lanes"]), "MMFREE_TOKENS": "1,30,30,7"}
        try:
            runner.test(test_module="pynq_driver_tests", hdl_toplevel="mmfree_top", build_dir=sim_dir,
                        test_dir=tmp_path, hdl_toplevel_lang="verilog", extra_env=extra, timescale=("1ns", "1ps"))
        except SystemExit as e:
            pytest.fail(f"cocotb pynq_driver_bit_exact failed (exit {e.code}), see {tmp_path}", pytrace=False)
    import xml.etree.ElementTree as ET

    results = list(tmp_path.glob("*.xml"))
    assert results, "no cocotb results file"
    fails = [f for x in results for f in ET.parse(x).getroot().iter("failure")]
    assert not fails, "\n".join((f.get("message") or "") + (f.text or "") for f in fails)
