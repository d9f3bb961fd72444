"""cocotb 2 + Verilator: the whole ULX3S DRAM board, driven by the host's own ECP5 driver (issue 22, Verification);
the simulated boards' shared machinery (:class:`BoardSim`, :func:`sim_top`, :func:`build_sim`, :func:`run_case`,
the ``case_*`` checks, :func:`summarise`, :func:`record`), which ``sim/test_board_ddr3.py`` runs on the ECPIX-5's
DDR3 board.

The simulated ULX3S board (:func:`sim_top` of :data:`ULX3S`, top module ``board_dram_sim``) is what
``python -m hw.boards ulx3s-85f`` builds (:class:`hw.boards.ecp5.DramEcp5Top`) less the PLL and the pins:

- :class:`hw.boards.dram_board.DRAMBoard` with the real core (:class:`hw.top.Accelerator`) at the board's design
  point (:func:`ulx3s_design_point`: ``hw.boards.ecp5.CHOSEN`` over ``DEFAULT_PARAMS``, 16 lanes and the buffers the
  bitstream builds), the token builder, the DRAM reader and writer and the argmax tap;
- behind :class:`hw.boards.ecp5.LinkedDramBoard` (the board's UART receiver, receive FIFO and transmitter) at
  8 clock cycles a bit (the design point's ``sim_divisor``; the bitstream: 25 at 2 Mbaud);
- on :class:`hw.dram.LiteDRAMCore` of the ULX3S config's simulation core (``hw.dram.generate_sim_core``: the real
  LiteDRAM controller, ``SDRAMPHYModel`` with GENSDRPHY's settings and the MT48LC16M16 timings, DFI timing checker
  on; the whole 32 MiB modelled);
- clocked at the bitstream's PLL output (``DramEcp5Top.freq_hz``: 50 MHz, 20 ns).

Two simulation-only additions: a **byte port** (``bp_rx``/``bp_tx``) that replaces the UART's byte streams
when ``uart_sel`` is low (the board's link bytes at one a clock cycle, for the cases whose transfers the
UART's 80 cycles a byte make impractical: the tiny model's cases after the first and the faults), and a
**back door** (``backdoor_load``: ``$readmemh`` of a file per bank into the DRAM model's bank arrays,
:meth:`BoardSim.backdoor_verilog`) through which the shipped model's 7.3 MB image and table are put into DRAM (through
the byte port they would take 7.3 M cycles driven from Python; through the UART at 80 cycles a byte about 580 M).
Which case uses which path:

=========================  ==================================================================================
``uart_path``              the real serial line (8N1 bit by bit from the testbench; the board's UART): a token
                           before any image, the tiny model loaded through ``'L'``, two tokens
``tiny_model_load_once``   byte port: the tiny model loaded (load-once, CRC compare), tokens in logits and
                           argmax mode bit-exact with the golden device, a second connect skips the load, the
                           back door checked against ``'C'``, the controller's CSRs read and written over the
                           link (``'K'``/``'J'``, link version 3)
``faults``                 byte port: a corrupted image word (back door) -> the core's weight CRC ->
                           ``CoreError``, reload, next token right; a link dropped mid-load, restart rewrites
                           only the missing blocks; a token before any image
``shipped_model`` (slow)   back door: the shipped model's image and table; the driver connects, finds
                           ``IMAGE_VALID`` and its checksum and skips the load; tokens bit-exact, refresh
                           counted, no DFI timing violation; with ``MMFREE_DRAM_BENCH=1`` the benchmark
                           ``bench/results/board_ulx3s_dram.json``
=========================  ==================================================================================

The host side is the real driver (:mod:`host.devices.ecp5`: :class:`~host.devices.ecp5.Ecp5Device` over
:class:`~host.devices.ecp5.UartLink`) running in a thread (``cocotb.task.bridge``) on a pyserial-like port whose
reads and writes run in the simulator (``cocotb.task.resume``; ``board_dram_tests.SimSerial``); between bytes
Verilator runs free (no per-cycle coroutine). The cocotb tests are in ``sim/board_dram_tests.py``; each pytest
case runs one of them and reads its results JSON. The simulator's output must hold no ``violation`` line of the
DFI timing checker.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import inspect
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_accelerator import _environ, verilator_env  # the regression's simulator set-up
from test_dram import BUILD_ARGS, _runner, _violations  # the DRAM bench's Verilator runner and checker scan

from hw import dram

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
BUILD_ROOT = Path(os.environ.get("MMFREE_SIM_BUILD", ROOT / "sim_build"))
TEST_MODULE = "board_dram_tests"
SIM = Path(__file__).resolve().parent
#: tiny random models (``accelerator_tests.tiny_model``: hidden, intermediate, layers, vocab): the serial-line
#: case's (4.5 KB in DRAM, one block), the byte-port case's (13 KB) and the faults' (a 211 KB embedding table:
#: four 64 KiB blocks, so that a load can stop in the third)
TINY_SHAPES = {"uart_shape": (7, 11, 1, 13), "tiny_shape": (20, 28, 2, 61), "faults_shape": (48, 96, 1, 1100)}
#: the shipped model's tokens: the prompt's first tokens with their logits, then greedy argmax-only tokens (the
#: link's generation mode: each next token is the previous one's argmax)
SHIPPED_TOKENS = {"shipped_logits_tokens": 2, "shipped_greedy_tokens": 3}
MODEL = ROOT / "models" / "hgrn-bit-pydoc"
#: the controller's CSRs the byte-port case reads and writes over the link (``'K'``/``'J'``): the power-up flag,
#: and a read-write register of the DFI injector that issues nothing when written (both cores have them)
CSR_CHECKED = ("ddrctrl_init_done", "sdram_dfii_pi0_address")


@dataclass(frozen=True)
class BoardSim:
    """What differs between the simulated DRAM boards (the rest of this module serves both).

    Attributes
    ----------
    board : str
        The board (a key of ``hw.boards.ecp5.BOARDS`` and ``hw.boards.facts.BOARDS``).
    top : str
        The simulated board's Verilog module (and ``sim_build/<top>/``).
    ports_vlt : Path
        The Verilator control file that makes the top's ports public.
    config : Path
        The LiteDRAM config (``hw.dram.ULX3S_CONFIG``, ``hw.dram.ECPIX5_CONFIG``).
    design_point : callable
        ``() -> dict``: the bitstream's settings (:func:`ulx3s_design_point`; ``sim/test_board_ddr3.py``).
    byte_timeout : int
        The link's byte time-out in the simulation, cycles (the bitstreams' 2**24 is a third of a second: a
        restarted host waits longer than this before it speaks; the testbench waits that long in simulated time).
    bank_arrays : tuple of str
        The DRAM model's bank arrays in the simulation core (``litedram.phy.model.BankModel``'s ``Memory``).
    backdoor_check : dict
        The byte-port case's check of the back door against ``'C'``: ``addr``, ``bytes`` (a span across a row
        boundary), ``patch`` (offset of one port word written over it).
    results : str
        The benchmark's file in ``bench/results/``.
    hold_port : bool
        The board holds its DRAM port until the host levels the reads and enables it (the DDR3 board).
    """

    board: str
    top: str
    ports_vlt: Path
    config: Path
    design_point: Callable[[], dict]
    byte_timeout: int
    bank_arrays: tuple
    backdoor_check: dict
    results: str
    hold_port: bool = False

    @property
    def backdoor_files(self) -> tuple:
        """The back door's ``$readmemh`` files (in the run directory), one per bank."""
        return tuple(f"backdoor_bank{b}.hex" for b in range(len(self.bank_arrays)))

    def backdoor_verilog(self) -> str:
        """Simulation-only Verilog: ``$readmemh`` of the back-door files into the model's banks (hierarchical
        references into the simulation core: the top -> ``dram`` (LiteDRAMCore) -> ``litedram``)."""
        return "\n".join([
            "// Simulation only (sim/test_board_dram.py): the DRAM model's bank arrays loaded from files.",
            f"module {self.top}_backdoor(input clk, input [{len(self.bank_arrays) - 1}:0] load);",
            "  always @(posedge clk) begin",
            *[f'    if (load[{b}]) $readmemh("{f}", {self.top}.dram.litedram.{a});'
              for b, (f, a) in enumerate(zip(self.backdoor_files, self.bank_arrays, strict=True))],
            "  end",
            "endmodule",
            ""])


def _period_ps(hz: float) -> int:
    """The simulated clock period: the nearest even number of ps (cocotb's clock splits it into two halves)."""
    return 2 * round(1e12 / hz / 2)


def ulx3s_design_point() -> dict:
    """The ULX3S DRAM bitstream's core build, clock and UART settings, as ``python -m hw.boards ulx3s-85f`` makes
    them: ``hw.boards.ecp5.CHOSEN["ulx3s-85f"]`` (lanes, quantize lanes, clock, baud) over ``DEFAULT_PARAMS`` (the
    buffers), the clock the PLL makes from the board's oscillator (:class:`hw.boards.ecp5.DramEcp5Top`'s
    ``freq_hz``) and its UART divisor.

    Returns
    -------
    dict
        ``build`` (:class:`hw.params.BuildParams`), ``clock_hz`` (float), ``clock_ps`` (int), ``baud``,
        ``divisor`` (the bitstream's cycles per bit), ``sim_divisor`` (the simulation's: 8, as the bitstream's 25
        would triple the serial-line case), ``pll`` (the ``EHXPLLL`` settings); ``dram_clock_hz`` and
        ``dram_clock_ps`` None (one clock).
    """
    from hw.boards import ecp5

    board = "ulx3s-85f"
    chosen, info = ecp5.CHOSEN[board], ecp5.BOARDS[board]
    assert chosen["dram"], f"{board}'s chosen build is not the DRAM top"
    core = {**ecp5.DEFAULT_PARAMS, "lanes": chosen["lanes"], "quant_lanes": chosen["quant_lanes"]}
    top = ecp5.DramEcp5Top(core_params=core, clk_in_hz=info.clk_hz, freq_hz=chosen["freq_mhz"] * 1e6,
                           baud=chosen["baud"], dram_config=info.dram_config)
    period_ps = 1e12 / top.freq_hz
    assert period_ps == _period_ps(top.freq_hz), f"clock period {period_ps} ps is not a whole even number of ps"
    return {"build": top.build, "clock_hz": top.freq_hz, "clock_ps": _period_ps(top.freq_hz), "baud": top.baud,
            "divisor": top.divisor, "sim_divisor": 8, "pll": dict(top.pll), "dram_clock_hz": None,
            "dram_clock_ps": None}


ULX3S = BoardSim(
    board="ulx3s-85f", top="board_dram_sim", ports_vlt=SIM / "board_dram_ports.vlt", config=dram.ULX3S_CONFIG,
    design_point=ulx3s_design_point, byte_timeout=1 << 14, bank_arrays=("mem", "mem_1", "mem_2", "mem_3"),
    backdoor_check={"addr": (1 << 24) - 2048, "bytes": 4096, "patch": 1002}, results="board_ulx3s_dram.json")


def sim_top(spec: BoardSim):
    """The simulated board's class (built lazily: it needs Amaranth and a generated simulation core)."""
    from amaranth.hdl import ClockSignal, DomainRenamer, Instance, Module, Mux
    from amaranth.lib import fifo, stream, wiring
    from amaranth.lib.wiring import In, Out

    from hw.boards.dram_board import DRAMBoard
    from hw.boards.ecp5 import LinkedDramBoard, cross_ddr3

    class LinkSelect(wiring.Component):
        """What :class:`LinkedDramBoard` takes for the board (``rx``, ``tx``, ``rx_overflow``, ``framing``),
        passed on to the real board (``board_*``) from the UART (``uart_sel`` high) or the byte port."""

        def __init__(self):
            byte = stream.Signature(8)
            super().__init__({
                "rx": In(byte), "tx": Out(byte), "rx_overflow": In(1), "framing": In(16), "uart_sel": In(1),
                "bp_rx": In(byte), "bp_tx": Out(byte), "board_rx": Out(byte), "board_tx": In(byte),
                "board_rx_overflow": Out(1), "board_framing": Out(16)})

        def elaborate(self, platform):
            m = Module()
            sel = self.uart_sel
            m.d.comb += [   # a two-way byte-stream switch (the only hand-written wiring of the simulated board)
                self.board_rx.valid.eq(Mux(sel, self.rx.valid, self.bp_rx.valid)),
                self.board_rx.payload.eq(Mux(sel, self.rx.payload, self.bp_rx.payload)),
                self.rx.ready.eq(sel & self.board_rx.ready), self.bp_rx.ready.eq(~sel & self.board_rx.ready),
                self.tx.valid.eq(sel & self.board_tx.valid), self.bp_tx.valid.eq(~sel & self.board_tx.valid),
                self.tx.payload.eq(self.board_tx.payload), self.bp_tx.payload.eq(self.board_tx.payload),
                self.board_tx.ready.eq(Mux(sel, self.tx.ready, self.bp_tx.ready)),
                self.board_rx_overflow.eq(self.rx_overflow), self.board_framing.eq(self.framing),
            ]
            return m

    class BoardDRAMSim(wiring.Component):
        """A DRAM board less PLLs and pins, with a byte port and a back door (module docstring).

        One clock (the ULX3S, :class:`hw.boards.ecp5.DramEcp5Top`): the board and the controller in ``sync``.
        Two (the DDR3 board, :class:`hw.boards.ecp5.Ddr3Ecp5Top`): the board in ``sync``, the controller in
        ``dram`` (the top's ports ``dram_clk``/``dram_rst``), between them the top's :class:`Ddr3Crossings`,
        the board and the controller holding the port until the host enables it.

        Members
        -------
        uart_rx : In(1), uart_tx : Out(1)
            The serial lines (idle high), the design point's ``sim_divisor`` cycles a bit.
        uart_sel : In(1)
            1: the board's link bytes come from and go to the UART; 0: the byte port.
        bp_rx : In(stream.Signature(8)), bp_tx : Out(stream.Signature(8))
            The byte port, each through a small FIFO (``ready`` and ``valid`` depend on its state only).
        backdoor_load : In(banks)
            Bit ``b`` high for a cycle: ``$readmemh`` of the bank's back-door file into the model's bank ``b``.
        init_done, init_error, irq, overflow : Out(1)
            The controller's power-up status as the board sees it (through the synchronizers where two clocks),
            the board's ``irq``, the UART's receive overflow.
        monitor : Out(hw.dram.sim_monitor_layout())
            DFI command counters of the DRAM model (the controller's clock).
        """

        def __init__(self, core: dram.GeneratedCore, point: dict):
            self._core, self._point = core, point
            byte = stream.Signature(8)
            super().__init__({
                "uart_rx": In(1, init=1), "uart_tx": Out(1, init=1), "uart_sel": In(1), "bp_rx": In(byte),
                "bp_tx": Out(byte), "backdoor_load": In(len(spec.bank_arrays)), "init_done": Out(1),
                "init_error": Out(1), "irq": Out(1), "overflow": Out(1), "monitor": Out(dram.sim_monitor_layout())})

        def elaborate(self, platform):
            m = Module()
            core, point = self._core, self._point
            params = {"build": point["build"], "addr_width": core.addr_width, "port_width": core.data_width,
                      "clock_hz": round(point["clock_hz"]), "byte_timeout": spec.byte_timeout}
            if spec.hold_port:
                params["hold_port"] = True
            m.submodules.board = board = DRAMBoard(**params)
            select = LinkSelect()
            m.submodules.linked = linked = LinkedDramBoard(select, divisor=point["sim_divisor"])
            ctl = dram.LiteDRAMCore(core, hold_port=spec.hold_port)
            if point["dram_clock_hz"] is None:      # one clock: as DramEcp5Top
                m.submodules.dram = ctl
                wiring.connect(m, board.port, ctl.port)
                wiring.connect(m, board.ctrl, ctl.ctrl)     # link version 3
                m.d.comb += [board.dram_ready.eq(ctl.init_done), board.dram_error.eq(ctl.init_error),
                             ctl.port_enable.eq(board.port_enable)]
                done, error = ctl.init_done, ctl.init_error
            else:                                   # two clocks: Ddr3Ecp5Top's crossings, wired by its own code
                m.submodules.dram = DomainRenamer("dram")(ctl)
                x = cross_ddr3(m, board, ctl, addr_width=core.addr_width, data_width=core.data_width,
                               depth=point["cdc_depth"], pll_locked=1)     # the simulation core has no PLL
                done, error = x.dram_ready, x.dram_error
            wiring.connect(m, select.board_rx, board.rx)
            wiring.connect(m, board.tx, select.board_tx)
            m.submodules.bp_rx_fifo = rx_fifo = fifo.SyncFIFOBuffered(width=8, depth=4)
            m.submodules.bp_tx_fifo = tx_fifo = fifo.SyncFIFOBuffered(width=8, depth=4)
            wiring.connect(m, wiring.flipped(self.bp_rx), rx_fifo.w_stream)
            wiring.connect(m, rx_fifo.r_stream, select.bp_rx)
            wiring.connect(m, select.bp_tx, tx_fifo.w_stream)
            wiring.connect(m, tx_fifo.r_stream, wiring.flipped(self.bp_tx))
            clk = ClockSignal("sync" if point["dram_clock_hz"] is None else "dram")
            m.submodules.backdoor = Instance(f"{spec.top}_backdoor", i_clk=clk, i_load=self.backdoor_load)
            m.d.comb += [
                linked.rx.eq(self.uart_rx), self.uart_tx.eq(linked.tx), select.uart_sel.eq(self.uart_sel),
                board.rx_overflow.eq(select.board_rx_overflow), board.framing.eq(select.board_framing),
                self.init_done.eq(done), self.init_error.eq(error), self.irq.eq(board.irq),
                self.overflow.eq(linked.overflow), self.monitor.eq(ctl.monitor),
            ]
            return m

    return BoardDRAMSim


# ------------------------------------------------------------------------------------------- build
def build_root(spec: BoardSim, core: dram.GeneratedCore, point: dict) -> Path:
    """``sim_build/<top>/<key>``: the key hashes every ``hw/**/*.py``, this file's simulated board, the control
    file, the core, the design point, Amaranth's version and the Verilator arguments."""
    import amaranth

    h = hashlib.sha256()
    for p in sorted((ROOT / "hw").rglob("*.py")):
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(inspect.getsource(sim_top).encode())
    h.update(spec.backdoor_verilog().encode())
    h.update(spec.ports_vlt.read_bytes())
    h.update(json.dumps([core.directory.name, amaranth.__version__, BUILD_ARGS, point["build"].gateware(),
                         point["clock_hz"], point["dram_clock_hz"], point["sim_divisor"], spec.byte_timeout,
                         spec.hold_port]).encode())
    return BUILD_ROOT / spec.top / h.hexdigest()[:16]


def built_fixture(spec: BoardSim):
    """The module-scoped ``built`` fixture of a board's test file: :func:`build_sim`, or a skip with the reason."""

    @pytest.fixture(scope="module")
    def built():
        if os.environ.get("SIM", "verilator").lower() != "verilator":
            pytest.skip("the whole-board simulations run under Verilator only (the DRAM models' whole arrays)")
        if not dram.litedram_available():
            pytest.skip("LiteDRAM is not installed: pip install -e '.[dram]'")
        return build_sim(spec, verilator_env())

    return built


built = built_fixture(ULX3S)


def build_sim(spec: BoardSim, env: dict) -> tuple:
    """The simulated board's Verilog and its Verilator build, cached in ``sim_build/<top>/<key>/`` (a lock file
    serialises concurrent sessions on one key); returns (simulator build folder, core, design point,
    environment, spec)."""
    core = dram.generate_sim_core(spec.config)
    point = spec.design_point()
    root = build_root(spec, core, point)
    root.mkdir(parents=True, exist_ok=True)
    sim_dir = root / "verilator"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (sim_dir / ".built").exists():
            meta = {}
            vfile, bfile = root / f"{spec.top}.v", root / f"{spec.top}_backdoor.v"
            if not vfile.exists():
                from amaranth.back import verilog

                t0 = time.perf_counter()
                text = verilog.convert(sim_top(spec)(core, point), name=spec.top)
                vfile.with_suffix(".tmp").write_text(text)
                vfile.with_suffix(".tmp").replace(vfile)
                meta["convert_s"] = round(time.perf_counter() - t0, 1)
            bfile.write_text(spec.backdoor_verilog())
            if sim_dir.exists():
                shutil.rmtree(sim_dir)
            log = root / "build.log"
            t0 = time.perf_counter()
            with _environ(**env):
                try:
                    _runner().build(sources=[vfile, bfile, *core.verilog], hdl_toplevel=spec.top, build_dir=sim_dir,
                                    build_args=[*BUILD_ARGS, str(spec.ports_vlt)], timescale=("1ns", "1ps"),
                                    log_file=log)
                except (RuntimeError, SystemExit) as e:
                    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
                    pytest.fail(f"Verilator build failed ({e}); {log}:\n{tail}", pytrace=False)
            meta["build_s"] = round(time.perf_counter() - t0, 1)
            (root / "build.json").write_text(json.dumps(meta) + "\n")
            (sim_dir / ".built").write_text("ok\n")
    return sim_dir, core, point, env, spec


def run_case(built, testcase: str, **params) -> dict:
    """Run the cocotb test ``testcase`` of ``board_dram_tests``; returns its results JSON
    (``MMFREE_BOARD_RESULT``) with ``wall_s`` and the simulator's log text (``log``)."""
    sim_dir, core, point, env, spec = built
    run_dir = sim_dir / "runs" / testcase
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    result, log = run_dir / "result.json", run_dir / "sim.log"
    params = {"clock_ps": point["clock_ps"], "dram_clock_ps": point["dram_clock_ps"], "divisor": point["sim_divisor"],
              "byte_timeout": spec.byte_timeout, "backdoor_files": spec.backdoor_files,
              "build": point["build"].gateware(), "geom": geometry(spec.config), "hold_port": spec.hold_port,
              "csr_json": str(core.directory / "csr.json"), "backdoor_check": spec.backdoor_check,
              "csr": {k: core.csr[k] for k in CSR_CHECKED}, "init_cycles_max": 100_000, **TINY_SHAPES,
              **params}
    extra = {"MMFREE_BOARD_RESULT": str(result), "MMFREE_BOARD_PARAMS": json.dumps(params),
             "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "INFO")}
    t0 = time.perf_counter()
    with _environ(**env):
        try:
            _runner().test(test_module=TEST_MODULE, hdl_toplevel=spec.top, build_dir=sim_dir, test_dir=run_dir,
                           test_filter=rf"^{TEST_MODULE}\.{testcase}$", hdl_toplevel_lang="verilog", extra_env=extra,
                           timescale=("1ns", "1ps"), log_file=log)
        except SystemExit as e:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-80:]) if log.exists() else ""
            pytest.fail(f"cocotb {testcase} failed (exit {e.code}); {log}:\n{tail}", pytrace=False)
    text = log.read_text(errors="replace")
    assert result.exists(), f"cocotb {testcase} wrote no result; {log}:\n{text[-4000:]}"
    out = json.loads(result.read_text())
    assert out.get("passed"), f"cocotb {testcase} did not finish; {log}:\n{text[-4000:]}"
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["log"] = text
    return out


# ------------------------------------------------------------------------------------------- cases
@functools.cache
def geometry(config: Path) -> dict:
    """The simulation core's geometry for the back door: bank, row and column bits, the port word's bytes, the
    columns a port word spans (``col_align``: log2 of them) and the model's index shift (``model_shift``: its
    bank arrays hold ``rows x columns >> model_shift`` words). The address mapping must be ``ROW_BANK_COL``
    (port word address = row, bank, column word)."""
    s = dram.sim_settings(config)
    mapping = s["controller"].address_mapping
    assert mapping == "ROW_BANK_COL", f"the back door assumes ROW_BANK_COL, the controller maps {mapping}"
    g = s["geom"]
    addr_width, data_width = dram.port_geometry(s["controller"])
    banks, per_bank = 2 ** g.bankbits, s["model_words"] >> g.bankbits
    shift = (g.rowbits + g.colbits) - (per_bank.bit_length() - 1)
    assert per_bank == 1 << (g.rowbits + g.colbits - shift), (banks, per_bank)
    return {"bankbits": g.bankbits, "rowbits": g.rowbits, "colbits": g.colbits, "word_bytes": data_width // 8,
            "col_align": g.colbits - (addr_width - g.rowbits - g.bankbits), "model_shift": shift}


def _no_violation(r: dict) -> None:
    bad = _violations(r["log"])
    assert not bad, "DFI timing checker:\n" + "\n".join(bad[:20])


# ------------------------------------------------------------------------------------------- the cases, per board
def case_uart_path(built) -> dict:
    """The real serial line: a token before any image (NO_IMAGE, the driver's DeviceError, no output), the tiny
    model loaded through it by the driver, a token with logits and an argmax-only one bit-exact."""
    r = run_case(built, "uart_path")
    _no_violation(r)
    assert r["refused"]["status"] == 1
    assert r["load"]["blocks_written"] == r["load"]["blocks_total"] == 1
    assert [t["mode"] for t in r["tokens"]] == ["logits", "argmax"]
    return r


def case_tiny_model_load_once(built) -> dict:
    """Byte port: load once (all blocks, CRC compared), tokens in both modes bit-exact, a second connect skips
    the load and writes nothing, the controller's CSRs read and written over the link, the back door agrees with
    the board's CRC."""
    r = run_case(built, "tiny_model_load_once")
    _no_violation(r)
    assert not r["first"]["load"]["skipped"] and r["second"]["load"]["skipped"]
    assert len(r["first"]["tokens"]) == 6 and len(r["second"]["tokens"]) == 3
    assert r["csr"] == {"init_done": 1, "written": 0x1A5C, "read_back": 0x1A5C}, r["csr"]
    return r


def case_faults(built) -> dict:
    """Byte port: a token before any image; a link dropped mid-load, restarted, only the missing blocks written;
    a corrupted image word caught by the weight CRC (CoreError), reloaded, the next tokens right."""
    r = run_case(built, "faults")
    _no_violation(r)
    assert r["corrupt"]["cause"] == "WEIGHT_CRC"
    assert r["restart"]["load"]["blocks_written"] == r["drop"]["blocks"] - r["drop"]["dropped_in_block"]
    return r


def case_shipped_model(built, tmp_path: Path) -> tuple:
    """The shipped model in DRAM by the back door, the driver skips the load, tokens bit-exact with the golden
    device, refresh during them, no DFI timing violation; returns (the run, :func:`summarise` of it, the load
    average at its start)."""
    load0 = os.getloadavg()
    r = run_case(built, "shipped_model", shipped_bundle=str(shipped_bundle(tmp_path / "shipped.mmf")),
                 **SHIPPED_TOKENS)
    _no_violation(r)
    bench = summarise(r, built)
    assert bench["refresh_commands_during_tokens"] > 0
    return r, bench, load0


def shipped_bundle(out: Path) -> Path:
    """The shipped model compiled for the board (``mmfree compile``: base-3, one channel) into ``out``."""
    from host.cli import main as mmfree

    rc = mmfree(["compile", "--model", str(MODEL), "--out", str(out), "--channels", "1", "--packing", "base3"])
    assert rc == 0, f"mmfree compile failed ({rc})"
    return out


def test_uart_path(built):
    """:func:`case_uart_path` on the ULX3S board."""
    case_uart_path(built)


def test_tiny_model_load_once(built):
    """:func:`case_tiny_model_load_once` on the ULX3S board."""
    case_tiny_model_load_once(built)


def test_faults(built):
    """:func:`case_faults` on the ULX3S board."""
    case_faults(built)


@pytest.mark.slow
def test_shipped_model(built, tmp_path):
    """:func:`case_shipped_model` on the ULX3S board; the read efficiency during tokens >= 85 % (issue 22).
    ``MMFREE_DRAM_BENCH=1`` writes ``bench/results/board_ulx3s_dram.json``."""
    r, bench, load0 = case_shipped_model(built, tmp_path)
    assert bench["dram_read_efficiency"] >= 0.85, f"read efficiency {bench['dram_read_efficiency']:.3f} < 85 %"
    if os.environ.get("MMFREE_DRAM_BENCH"):
        record(bench, r, built, load0)


# ------------------------------------------------------------------------------------------- benchmark
#: the link model (``model``, not simulated): 8N1 at the bitstream's rate, and a USB round trip per reply the host
#: waits for, the FTDI bridge's latency timer at 1 ms (``host.devices.ecp5.set_ftdi_latency``)
USB_LATENCY_S = 1e-3
BITS_PER_BYTE = 10


def peak_bytes_per_cycle(config: Path) -> float:
    """The DRAM's peak, bytes per controller cycle: one port word (one DFI read: a burst) every tCCD cycles:
    2 bytes on the ULX3S's SDRAM (16 bits, tCCD 1), 8 on the ECPIX-5's DDR3 (a 16-byte BL8 burst, tCCD 2 at rate
    1:2: 16 bits x 2 transfers x 2 DRAM clocks a cycle)."""
    s = dram.sim_settings(config)
    return dram.port_geometry(s["controller"])[1] // 8 / s["timing"].tCCD


def summarise(r: dict, built) -> dict:
    """Per-token figures of the shipped-model run: cycles in the board's and the controller's clock, DRAM read
    efficiency (bytes read per controller cycle from ``'T'`` received to ``'t'`` sent, over
    :func:`peak_bytes_per_cycle`), refresh, link bytes and round trips, and tokens/s end to end (simulated cycles at
    the bitstream's clock plus the link model)."""
    _, core, point, _, spec = built
    word = core.data_width // 8
    peak = peak_bytes_per_cycle(spec.config)
    f = point["clock_hz"]
    rows = []
    for t in r["timings"]:
        rd_bytes = t["dfi"]["rd_count"] * word
        wire_s = (t["bytes_out"] + t["bytes_in"]) * BITS_PER_BYTE / point["baud"]
        usb_s = t["round_trips"] * USB_LATENCY_S
        board_s = t["cycles_to_output"] / f
        rows.append({**t, "read_bytes": rd_bytes,
                     "read_efficiency": round(rd_bytes / t["dram_cycles_to_status"] / peak, 4),
                     "board_s": board_s, "link_wire_s": wire_s, "link_usb_s": usb_s,
                     "tokens_per_s": round(1 / (board_s + wire_s + usb_s), 2)})
    greedy = [x for x in rows if x["mode"] == "argmax"]
    logits = [x for x in rows if x["mode"] == "logits"]

    def mean(key: str, xs: list = greedy) -> float:
        return sum(x[key] for x in xs) / len(xs)

    return {
        "tokens": rows,
        "dram_read_efficiency": round(mean("read_efficiency", rows), 4),
        "dram_read_efficiency_min": min(x["read_efficiency"] for x in rows),
        "peak_bytes_per_cycle": peak,
        "refresh_commands_during_tokens": sum(x["dfi"]["ref_count"] for x in rows),
        "cycles_per_token": round(mean("cycles_to_output")),
        "cycles_to_status": round(mean("cycles_to_status")),
        "dram_cycles_per_token": round(mean("dram_cycles_to_output")),
        "dram_cycles_to_status": round(mean("dram_cycles_to_status")),
        "core_cycles_counter": round(mean("hw_cycles")),
        "link_bytes_per_token": round(mean("bytes_out") + mean("bytes_in")),
        "round_trips_per_token": round(mean("round_trips"), 2),
        "link_s_per_token": mean("link_wire_s") + mean("link_usb_s"),
        "board_s_per_token": mean("board_s"),
        "tokens_per_s": round(1 / (mean("board_s") + mean("link_wire_s") + mean("link_usb_s")), 2),
        "tokens_per_s_logits": round(1 / (mean("board_s", logits) + mean("link_wire_s", logits)
                                          + mean("link_usb_s", logits)), 2),
    }


def record(bench: dict, r: dict, built, load0, *, extra: dict | None = None,
           goal_tokens_per_s: float | None = 40.0) -> Path:
    """``bench/results/<spec.results>`` (bench/_common.py conventions); ``extra`` adds or replaces fields (the
    DDR3 board's clocks, its leveling)."""
    import sys

    sys.path.insert(0, str(ROOT))
    from bench._common import RESULTS, provenance, write_json

    _, core, point, _, spec = built
    s = dram.sim_settings(spec.config)
    lay = r["layout"]
    eff, tps = bench["dram_read_efficiency"], bench["tokens_per_s"]
    peak = peak_bytes_per_cycle(spec.config)
    word = core.data_width // 8
    test_file = "sim/test_board_dram.py" if spec is ULX3S else "sim/test_board_ddr3.py"
    name = spec.results.removesuffix(".json")
    goal = {"dram_read_efficiency": 0.85, "met": eff >= 0.85}
    if goal_tokens_per_s is not None:
        goal = {**goal, "tokens_per_s": goal_tokens_per_s, "met": eff >= 0.85 and tps >= goal_tokens_per_s}
    report = {
        **provenance(name),
        "command_short": f"MMFREE_DRAM_BENCH=1 python -m pytest -m sim {test_file} -k shipped_model",
        "source": "whole-board simulation (cocotb + Verilator, LiteDRAM controller + SDRAMPHYModel)",
        "status": "simulated (cycles of the simulated board; the link's time is a model)",
        "test": f"{test_file}::test_shipped_model",
        "loadavg_start": [round(x, 2) for x in load0],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "board": spec.board,
        "design_point": point["build"].gateware(),
        "clock": {"simulated_hz": point["clock_hz"], "period_ps": point["clock_ps"],
                  "bitstream_pll": point["pll"],
                  "source": "hw.boards.ecp5.CHOSEN and DramEcp5Top: the EHXPLLL's CLKOP, core and controller"},
        "config": str(spec.config.relative_to(ROOT)),
        "sim_core": core.directory.name,
        **dram.settings_record(s),
        "timing_checker": s["timing_checker"],
        "timing_violations": len(_violations(r["log"])),
        "link": {"baud": point["baud"], "bitstream_divisor": point["divisor"], "simulated": "byte port beneath the "
                 "UART (one byte a cycle), the image and table put in DRAM by the back door ($readmemh)",
                 "driver": "host.devices.ecp5.Ecp5Device over a simulated serial port (sim/board_dram_tests.py)"},
        "model": {"bundle": "mmfree compile --model models/hgrn-bit-pydoc --channels 1 --packing base3",
                  "image_bytes": lay["image_bytes"], "embed_base": lay["embed_base"], "hidden": lay["hidden"],
                  "vocab": lay["vocab"], "dram_bytes": lay["total_bytes"], "checksum": f"0x{lay['checksum']:08x}"},
        "load": {"skipped": r["load"]["skipped"], "note": "the back door wrote the DRAM; the driver's load found "
                 "IMAGE_VALID, its checksum and the board's CRC of the region (a 'C' over the whole region)"},
        "refresh_commands_during_tokens": bench["refresh_commands_during_tokens"],
        "refresh_interval_max_cycles": r["ref_max_gap"],
        "dram_read_efficiency": eff,
        "dram_read_efficiency_min": bench["dram_read_efficiency_min"],
        "peak_bytes_per_cycle": peak,
        "efficiency_definition": f"DRAM bytes read (DFI read commands x {word} bytes) per controller cycle from the "
                                 f"'T' command's last byte in to the 't' reply's last byte out (the image's last "
                                 f"beat has entered the core), over the peak of {peak:g} bytes per cycle; all tokens",
        "cycles_per_token": bench["cycles_per_token"],
        "cycles_per_token_definition": "argmax-only tokens: 'T' received to the last output frame sent",
        "cycles_to_status": bench["cycles_to_status"],
        "core_cycles_counter": bench["core_cycles_counter"],
        "link_model": {
            "status": "model", "baud": point["baud"], "bits_per_byte": BITS_PER_BYTE,
            "usb_round_trip_s": USB_LATENCY_S,
            "usb_round_trip_basis": "the FTDI bridge's latency timer at 1 ms (host.devices.ecp5.set_ftdi_latency): a "
                                    "reply shorter than a USB packet waits for it",
            "bytes_per_token": bench["link_bytes_per_token"], "round_trips_per_token": bench["round_trips_per_token"],
            "link_s_per_token": round(bench["link_s_per_token"], 6),
        },
        "board_s_per_token": round(bench["board_s_per_token"], 6),
        "tokens_per_s": tps,
        "tokens_per_s_definition": "greedy (argmax-only) tokens: 1 / (cycles per token / clock + link model)",
        "tokens_per_s_logits": bench["tokens_per_s_logits"],
        "tokens": bench["tokens"],
        "goal": goal,
        "sim": {"wall_s": r["wall_s"], "backdoor": r["backdoor"], "load_wall_s": r["load_wall_s"],
                "host_wall_s": r["host_wall_s"], "lscpu_model_name": _lscpu_model(),
                "note": "wall times of this run on its machine (shared); a token's wall time includes the golden "
                        "device's run of it",
                "cycles_per_wall_s": round(sum(x["cycles_to_output"] for x in bench["tokens"])
                                           / sum(x["sim_wall_s"] for x in bench["tokens"]))},
        **(extra or {}),
    }
    return write_json(RESULTS / spec.results, report)


def _lscpu_model() -> str | None:
    """``Model name`` of ``lscpu`` (None without it)."""
    import subprocess

    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), None)
