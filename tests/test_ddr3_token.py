"""Whole tokens of the ECPIX-5 DDR3 board in Verilator, bit-exact with the golden device (issue 23; sim/ddr3_token).

The harness (:mod:`sim.ddr3_token`) simulates ``Ddr3Ecp5Top``'s logic (``DRAMBoard`` at 128 bits with the core at
the 370M shape's capacities and the recurrent state in DRAM, ``hw.boards.ecp5.DDR3_BUILD``'s lanes and quantize
lanes; ``Ddr3Crossings``; the LiteDRAM DDR3 simulation core) at the ECPIX-5's design clock (68 MHz core, 75 MHz
controller), fills DRAM through a back door and drives the board with the host's ECP5 driver over the link's byte
streams; after each token the state's committed bank in DRAM is compared with the golden device's state.
Opt-in: ``MMFREE_DDR3_TOKEN=1`` (a Verilator build of several minutes and 1 GiB for the DDR3 model); run it under
``flock /tmp/heavy.lock``.
``MMFREE_DDR3_TOKEN_370M=1`` adds the whole 370M shape (random weights, about 2 GB of host memory and minutes of
simulation a token).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = [pytest.mark.sim, pytest.mark.slow]

#: a mid-size random model that fits the harness's core (hidden, intermediate, layers, vocabulary): every kind of
#: instruction, two layers, a 4 KiB-aligned table after an image of several DRAM rows
SMALL = {"vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 704}


@pytest.fixture(scope="module")
def built():
    if os.environ.get("MMFREE_DDR3_TOKEN") != "1":
        pytest.skip("opt-in: MMFREE_DDR3_TOKEN=1 (a Verilator build of the DDR3 token harness, 1 GiB DDR3 model)")
    from hw import dram

    if not dram.litedram_available():
        pytest.skip("LiteDRAM is not installed: pip install -e '.[dram]'")
    from host.devices.base import DeviceError
    from host.devices.rtl_harness import find_toolchain
    from sim.ddr3_token import build

    try:
        find_toolchain()
    except DeviceError as exc:
        pytest.skip(str(exc))
    return build()


def _weights(shape: dict, seed: int):
    from host.model import HGRNBitConfig, random_weights

    return random_weights(HGRNBitConfig(**shape), seed=seed)


def _check(result: dict, n_tokens: int) -> None:
    toks = result["tokens"]
    assert len(toks) == n_tokens
    for pos, t in enumerate(toks):
        assert t["bit_exact"], t
        # the build keeps the state in DRAM: the token's commit made bank (pos + 1) % 2 current, and its rows there
        # (read through the back door) are the golden device's state
        assert t["state_bank"] == (pos + 1) % 2 and t["state_rows_equal"] is True, t
        assert t["argmax"][0] == t["argmax"][1]
        # the core's counter runs inside the harness's window (the 'T' bytes to the output's last byte)
        assert 0 < t["hw_cycles"] <= t["cycles"]
        # the image is read once a token (16-byte bursts), within the board's whole read of the image
        assert t["rd_bursts"] * 16 >= result["layout"]["image_bytes"]
        assert 0 < t["efficiency_read_window"] <= 1.0
        assert t["efficiency_token"] <= t["efficiency_read_window"]
    assert result["harness"]["init_error"] == 0
    assert result["crc_checked"] >= 2


def test_small_random_model_bit_exact(built):
    """The host's read leveling over the link (``level=True``: :meth:`host.devices.ecp5.Ecp5Transport.level` through
    the board's control-bus crossing), then three tokens of a small random model, logits bit-exact with the golden
    device; the back door checked by the board's CRC through the controller, its first block (which the leveling's
    test bursts overwrote) included. The state lives in DRAM: after each token the committed bank's rows equal the
    golden device's state, and the tokens after the first take the cycles of a fill per layer more.

    The simulation model has no delay lines or bitslip (its read data arrive at a fixed latency), so every lane's
    window is all 8 taps at every bitslip and the procedure picks bitslip 0, delay 3: this proves the CSR map, the DFI
    injector's software path (both phases' read registers, ``burstdet``) and the link, not the calibration itself
    (``tests/test_leveling.py`` tests that against a scripted PHY)."""
    from sim.ddr3_token import compile_bundle, run_case

    bundle = compile_bundle(_weights(SMALL, seed=3))
    ids = np.random.default_rng(5).integers(0, SMALL["vocab_size"], 3)
    result = run_case(built, bundle, ids, level=True)
    _check(result, 3)
    # the first token after reset fills no state row (the state reads as zero) and writes every layer's back; the
    # later ones also fill each layer's row first, an element a cycle (max_hidden of them a row: 1024)
    cycles = [t["hw_cycles"] for t in result["tokens"]]      # the same instructions every token
    assert all(c - cycles[0] >= SMALL["num_hidden_layers"] * built.params.max_hidden // 2 for c in cycles[1:]), cycles
    lanes = result["leveling_lanes"]
    assert [ln["module"] for ln in lanes] == [0, 1], lanes
    for ln in lanes:
        assert (ln["bitslip"], ln["delay"], ln["window"]) == (0, 3, [0, 7]), ln
        assert sorted(ln["scans"]) == [0, 1, 2, 3] and all(e == [0] * 8 for e in ln["scans"].values()), ln
    assert "m1: bitslip 0, delay 3 (window 0-7 of 8 taps)" in result["leveling"], result["leveling"]


def test_370m_token_bit_exact(built):
    """One whole token of a random model of the 370M shape (``host.model.random_weights(seed=0)``), logits bit-exact
    with the golden device. Opt-in on top of the build: ``MMFREE_DDR3_TOKEN_370M=1``."""
    if os.environ.get("MMFREE_DDR3_TOKEN_370M") != "1":
        pytest.skip("opt-in: MMFREE_DDR3_TOKEN_370M=1 (the whole 370M shape: minutes of simulation, ~2 GB host "
                    "memory)")
    from sim.ddr3_token import SHAPE_370M, compile_bundle, run_case

    bundle = compile_bundle(_weights(SHAPE_370M, seed=0))
    result = run_case(built, bundle, [int(np.random.default_rng(1).integers(0, SHAPE_370M["vocab_size"]))])
    _check(result, 1)


def test_small_model_weight_fifo_depths():
    """The board as built (``hw.boards.dram_board.W0_FIFO_DEPTH`` entries in the weight stream's FIFO to the core)
    keeps the core within 10 % of the cycle model's full-rate stream (the model's token fills every layer's state
    row, the first token none), and a one-entry FIFO substituted in the harness (``sim.ddr3_token.sim_top``'s
    variant: the board before W0_FIFO_DEPTH) passes a beat every other cycle: at least 0.8 of a cycle more per beat
    of the image than the board as built; both bit-exact."""
    if os.environ.get("MMFREE_DDR3_TOKEN") != "1":
        pytest.skip("opt-in: MMFREE_DDR3_TOKEN=1 (two Verilator builds of the DDR3 token harness)")
    from sim.ddr3_token import as_built_w0_fifo_depth, build, compile_bundle, run_case

    if as_built_w0_fifo_depth() < 3:
        pytest.skip(f"hw/ builds a {as_built_w0_fifo_depth()}-entry w0_fifo: a beat every other cycle at most")
    bundle = compile_bundle(_weights(SMALL, seed=3))
    ids = [7, 11]
    as_built = run_case(build(), bundle, ids)
    one = run_case(build(w0_fifo_depth=1), bundle, ids)
    _check(as_built, 2)
    _check(one, 2)
    beats = len(bundle.image) // 8
    for a, o in zip(as_built["tokens"], one["tokens"], strict=True):
        assert 0.9 * a["model_cycles"] < a["hw_cycles"] < 1.1 * a["model_cycles"]
        assert o["hw_cycles"] - a["hw_cycles"] > 0.8 * beats
