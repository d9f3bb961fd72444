"""The board user's path end to end (issue 20): compile once here, run the bundle with the runtime alone.

Here, in the full environment: the shipped model is compiled into a bundle (``mmfree compile --out m.mmf``)
and the golden device records what it makes of it (logits of a few steps, a sampled generation, the CLI's
``generate`` text and ``eval`` figures). Then ``tests/runtime_only.py`` runs the same bundle in a child
process where Amaranth, numba, torch and ``host.compiler`` cannot be imported, on the fake ``pynq`` and
``pyxrt`` modules of ``tests/board_fakes.py``, through the drivers and the CLI, and everything is compared
bit for bit.

What runs where: the child runs what a board user runs (bundle reader, drivers, token and output packets,
sampling, CLI); the fake core's arithmetic is the golden device, which needs numba, so it runs here in
this process (:class:`HardwareServer`, reached over a Unix socket), as the FPGA is a separate box on a
board. ``test_fresh_venv`` repeats the child's run in a new virtual environment holding only the
package's base dependencies from PyPI (``slow``: about a minute with a warm pip cache, a few minutes
without one). ``test_rtl_device_runs_the_bundle`` runs the bundle on the Verilated core (``sim``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Client, Listener
from pathlib import Path

import board_fakes
import numpy as np
import pytest
from runtime_only import BLOCKED

from host.bundle import read_bundle
from host.cli import main as mmfree
from host.devices import open_device
from host.generate import generate_text
from host.image import ImageError
from hw.isa import Counter

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
MODEL = ROOT / "models" / "hgrn-bit-pydoc"
CHANNELS = 2
#: the fake bitstream: two weight channels, buffers large enough for the shipped model (324 / 868 / 6 layers)
CORE = {"lanes": 16, "channels": CHANNELS, "bus_bits": 64, "quant_lanes": 4, "max_hidden": 512,
        "max_intermediate": 1024, "max_layers": 8}
TOKEN_IDS = [1, 42, 7, 300, 4095, 42, 0, 2]
GENERATE = {"prompt": "def parse(", "max_new_tokens": 12, "temperature": 0.8, "top_k": 50, "top_p": 0.95,
            "repetition_penalty": 1.1, "seed": 3}
CLI_GENERATE = ["--prompt", "The Python interpreter", "--max-new-tokens", "10", "--seed", "0"]
EVAL_KEYS = ("nll", "tokens", "bytes", "perplexity", "bits_per_byte", "windows")


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """``mmfree ARGV`` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = mmfree(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("board_path")


@pytest.fixture(scope="module")
def bundle(work) -> Path:
    """The shipped model compiled here, as a board user receives it."""
    path = work / "m.mmf"
    rc, _, err = _cli(["compile", "--model", str(MODEL), "--out", str(path), "--channels", str(CHANNELS)])
    assert rc == 0, err
    (work / "heldout.txt").write_text((ROOT / "data" / "pydoc" / "heldout.txt").read_text()[:300])
    return path


@pytest.fixture(scope="module")
def recorded(bundle, work) -> dict:
    """What the golden device makes of the bundle (full environment, before any board run)."""
    with open_device("golden", channels=CHANNELS) as dev:
        dev.load_image(read_bundle(bundle))
        logits = np.stack([dev.step(t) for t in TOKEN_IDS])
        g = generate_text(dev, read_bundle(bundle).tokenizer, GENERATE["prompt"],
                          **{k: v for k, v in GENERATE.items() if k != "prompt"})
    image = ["--image", str(bundle), "--option", f"channels={CHANNELS}"]
    rc, text, err = _cli(["generate", *image, *CLI_GENERATE])
    assert rc == 0, err
    rc, _, err = _cli(["eval", *image, "--text", str(work / "heldout.txt"), "--no-progress",
                       "--json", str(work / "golden_eval.json")])
    assert rc == 0, err
    ev = json.loads((work / "golden_eval.json").read_text())
    assert len(g.token_ids) == GENERATE["max_new_tokens"] and ev["tokens"] > 50   # a real run, not an early stop
    return {"logits": logits, "ids": list(g.token_ids), "text": g.text, "cli_text": text,
            "eval": {k: ev[k] for k in EVAL_KEYS}}


class HardwareServer:
    """The fake cores' arithmetic for a runtime-only child (``tests/runtime_only.py``'s ``RemoteMachine``):
    a golden ``GoldenMachine`` per image, recurrent states kept here by handle."""

    def __init__(self):
        self._dir = tempfile.mkdtemp(prefix="mmf-hw-")    # short: a Unix socket path has ~100 bytes
        self.address = os.path.join(self._dir, "hw.sock")
        self.authkey = os.urandom(16)
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self.requests: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:
                return
            with conn:
                self._handle(conn)

    def _handle(self, conn) -> None:
        machines, states = [], {}
        while True:
            try:
                req = conn.recv()
            except EOFError:
                return
            self.requests.append(req[0])
            try:
                if req[0] == "machine":
                    machines.append(board_fakes.GoldenMachine(req[1], board_fakes.BuildParams(**req[2])))
                    conn.send(("ok", len(machines) - 1))
                elif req[0] == "init_state":
                    states[len(states)] = machines[req[1]].init_state()
                    conn.send(("ok", len(states) - 1))
                else:
                    _, mid, packet, sid = req
                    res = machines[mid].run_token(packet, states[sid])
                    states[len(states)] = res.state
                    conn.send(("ok", (res.output, {c.value: int(v) for c, v in res.counters.items()},
                                      len(states) - 1)))
            except ImageError as exc:
                conn.send(("image_error", exc.cause.value, str(exc), getattr(exc, "instruction", None)))

    def close(self) -> None:
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture(scope="module")
def hardware():
    server = HardwareServer()
    yield server
    server.close()


def run_runtime_only(python: str | Path, bundle: Path, work: Path, hardware: HardwareServer, name: str,
                     timeout: float) -> tuple[dict, dict]:
    """Run the board path in ``tests/runtime_only.py`` under ``python``; its JSON results and logits."""
    tmp = work / name
    tmp.mkdir()
    spec = {"bundle": str(bundle), "address": hardware.address, "authkey": hardware.authkey.hex(),
            "tmp": str(tmp), "out": str(tmp / "result"), "core": CORE, "token_ids": TOKEN_IDS,
            "generate": GENERATE, "cli_generate": CLI_GENERATE, "eval_text": str(work / "heldout.txt")}
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run([str(python), str(TESTS / "runtime_only.py"), "board", str(tmp / "spec.json")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"runtime-only run failed:\n{proc.stdout}\n{proc.stderr}"
    with np.load(tmp / "result.npz") as z:
        logits = {k: z[k] for k in z.files}
    result = json.loads((tmp / "result.json").read_text())
    # the golden device (the default) needs numba: one clear error that names the extra, no traceback
    proc = subprocess.run([str(python), str(TESTS / "runtime_only.py"), "cli", "generate", "--image", str(bundle),
                           *CLI_GENERATE], cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    result["golden_generate"] = json.loads(proc.stdout)
    return result, logits


def check_board_run(result: dict, logits: dict, recorded: dict) -> None:
    """The child's runs equal the golden device's recorded ones, bit for bit, on both boards."""
    assert result["amaranth"] is False                  # hw.isa ran on hw._bits
    assert result["blocked_loaded"] == []
    assert not {m.partition(".")[0] for m in BLOCKED if "." not in m} & set(result["modules"])
    for kind in ("pynq", "xrt"):
        got = logits[kind]
        assert got.shape == recorded["logits"].shape and got.dtype == recorded["logits"].dtype
        assert got.tobytes() == recorded["logits"].tobytes(), f"{kind}: logits differ from the golden device's"
        r = result["devices"][kind]
        assert r["generate_ids"] == recorded["ids"] and r["generate_text"] == recorded["text"], kind
        assert r["cli_generate"]["rc"] == 0, r["cli_generate"]["stderr"]
        assert r["cli_generate"]["stdout"] == recorded["cli_text"], kind
        assert f"device {kind}" in r["cli_generate"]["stderr"]
        assert r["cli_eval"]["rc"] == 0, r["cli_eval"]["stderr"]
        assert {k: r["eval"][k] for k in EVAL_KEYS} == recorded["eval"], kind
        # the fake core really ran every token: steps, generation prefill + decode, CLI generate, CLI eval
        assert r["tokens_run"] >= len(TOKEN_IDS) + GENERATE["max_new_tokens"] + recorded["eval"]["tokens"]
    gg = result["golden_generate"]
    assert gg["rc"] == 2 and "Traceback" not in gg["stderr"]
    assert "the golden device needs numba" in gg["stderr"] and "mmfree-fpga[golden]" in gg["stderr"]


def test_board_path_runtime_only(bundle, recorded, hardware, work):
    """The bundle on fake pynq and xrt boards, Amaranth / numba / torch / compiler not importable."""
    result, logits = run_runtime_only(sys.executable, bundle, work, hardware, "runtime_only", timeout=600)
    check_board_run(result, logits, recorded)
    assert {"machine", "run"} <= set(hardware.requests)   # the arithmetic ran here, not in the child


def test_remote_machine_is_the_golden_machine(bundle, hardware):
    """The child's RemoteMachine gives what GoldenMachine gives here: output packet and counters."""
    import runtime_only

    from host.devices.golden import GoldenMachine

    image = read_bundle(bundle).image
    build = board_fakes.BuildParams(**{k: CORE[k] for k in ("lanes", "channels", "bus_bits", "quant_lanes")})
    local = GoldenMachine(image, build)
    with Client(hardware.address, family="AF_UNIX", authkey=hardware.authkey) as conn:
        runtime_only.RemoteMachine.conn = conn
        remote = runtime_only.RemoteMachine(image, build)
        dev = open_device("golden", channels=CHANNELS)
        dev.load_image(read_bundle(bundle))
        packet = dev.token_packet(42)
        got = remote.run_token(packet, remote.init_state())
        want = local.run_token(packet, local.init_state())
        assert got.output == want.output
        assert got.counters == {Counter(c): int(v) for c, v in want.counters.items()}


@pytest.mark.slow
def test_fresh_venv(bundle, recorded, hardware, work):
    """The same run in a new virtual environment with the package and its base dependencies only
    (``pip install`` from PyPI: the ``board`` extra minus ``pynq``, which a board image ships).

    ``MMFREE_BOARD_PYTHON`` names the interpreter of that environment (default: this one); PYNQ's board
    images run Python 3.10."""
    venv = work / "venv"
    subprocess.run([os.environ.get("MMFREE_BOARD_PYTHON", sys.executable), "-m", "venv", str(venv)], check=True,
                   timeout=300)
    py = venv / "bin" / "python"
    src = work / "src"     # a copy: pip builds in the source tree, and the checkout stays clean
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("host", "hw"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    pip = subprocess.run([str(py), "-m", "pip", "install", "--quiet", str(src), "smbus2>=0.4"],
                         env=env, capture_output=True, text=True, timeout=1200)
    if pip.returncode != 0 and ("Could not find a version" in pip.stderr or "NewConnectionError" in pip.stderr):
        pytest.skip(f"PyPI is not reachable: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            check=True, timeout=120)
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"numpy", "safetensors", "tokenizers", "rich", "mmfree-fpga"} <= installed
    assert not installed & {"amaranth", "numba", "torch", "llvmlite"}, installed
    result, logits = run_runtime_only(py, bundle, work, hardware, "fresh_venv", timeout=600)
    check_board_run(result, logits, recorded)


@pytest.mark.sim
def test_rtl_device_runs_the_bundle(bundle, recorded):
    """The same bundle on the Verilated core (full environment): bit-exact with the golden device."""
    pytest.importorskip("amaranth")
    from host.devices.rtl_harness import find_toolchain

    try:
        find_toolchain()
    except Exception as exc:  # noqa: BLE001 - DeviceError naming the missing tool
        pytest.skip(f"no RTL toolchain: {exc}")
    # the build of tests/test_rtl_device.py::test_two_channels_bit_exact (cached in sim_build/)
    with open_device("rtl", lanes=16, channels=CHANNELS, quant_lanes=4) as dev:
        dev.load_image(read_bundle(bundle))
        got = np.stack([dev.step(t) for t in TOKEN_IDS])
    assert got.tobytes() == recorded["logits"].tobytes()
