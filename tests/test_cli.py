"""host.cli: the mmfree command's subcommands, output and error paths (exit 2, one line; Ctrl-C 130)."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest
from host_fakes import ToyDevice, tiny_checkpoint, tiny_tokenizer

import host.cli as cli
from host.devices import DEFAULT_DEVICE, DEVICES, DeviceEntry

TEXT = "def parse(text):\n    return text.split()\n# café 🚀 中文\n" * 4


@pytest.fixture
def fake_model(monkeypatch, tmp_path):
    """``--model`` loads a tiny in-memory checkpoint; device ``toy`` is registered."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    checkpoint = tiny_checkpoint()
    checkpoint.path = model_dir
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: checkpoint)
    monkeypatch.setitem(DEVICES, "toy", DeviceEntry(ToyDevice.__module__, "ToyDevice", "toy model"))
    return model_dir


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mmfree: error: "), err
    return lines[0]


# ---------------------------------------------------------------------- error paths

def test_missing_model_dir(capsys, tmp_path):
    assert cli.main(["info", "--model", str(tmp_path / "nope")]) == 2
    assert "not found" in _error_line(capsys)


def test_missing_default_model_says_pass_model(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "DEFAULT_MODEL", tmp_path / "hgrn-bit-pydoc")
    assert cli.main(["generate", "--prompt", "x"]) == 2
    line = _error_line(capsys)
    assert "shipped model" in line and "--model" in line


def test_model_is_a_file(capsys, tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    assert cli.main(["info", "--model", str(f)]) == 2
    assert "directory" in _error_line(capsys)


@pytest.mark.parametrize(("args", "word"), [
    (["--temperature", "-1"], "--temperature must"),
    (["--top-k", "-3"], "--top-k must"),
    (["--top-p", "0"], "--top-p must"),
    (["--top-p", "1.5"], "--top-p must"),
    (["--repetition-penalty", "0"], "--repetition-penalty must"),
    (["--max-new-tokens", "-1"], "max-new-tokens"),
    (["--seed", "-5"], "seed"),
    (["--device", "nope"], "reference"),
    (["--device", "pynq"], "pynq package"),   # no pynq off the board: a clear error, before the model loads
])
def test_generate_bad_arguments(capsys, tmp_path, args, word):
    # checked before the model is loaded: the model directory does not even exist
    assert cli.main(["generate", "--model", str(tmp_path / "absent"), "--prompt", "x", *args]) == 2
    assert word in _error_line(capsys)


@pytest.mark.parametrize(("cmd", "args", "word"), [
    ("power", ["--top-p", "2"], "--top-p must"),
    ("power", ["--tokens", "0"], "--tokens must"),
    ("bench", ["--tokens", "0"], "--tokens must"),
])
def test_errors_name_the_flags(capsys, tmp_path, cmd, args, word):
    """Messages name the command-line flag the user typed, never the Python parameter (top_p, tokens)."""
    assert cli.main([cmd, "--model", str(tmp_path / "absent"), *args]) == 2
    assert word in _error_line(capsys)


def test_prompt_that_is_not_utf8_is_an_error_not_a_traceback(capsys, fake_model):
    """A command-line argument whose bytes are not UTF-8 reaches Python as lone surrogates."""
    prompt = b"abc\xff\xfe".decode("utf-8", "surrogateescape")
    assert cli.main(["generate", "--model", str(fake_model), "--device", "toy", "--prompt", prompt]) == 2
    line = _error_line(capsys)
    assert "not valid UTF-8" in line and "0xff 0xfe" in line and "character 3" in line


def test_context_warning_past_max_position_embeddings(capsys, fake_model, monkeypatch):
    import dataclasses

    checkpoint = cli._load_checkpoint(fake_model)
    cfg = dataclasses.replace(checkpoint.config, extra={"max_position_embeddings": 8})
    monkeypatch.setattr(checkpoint.weights, "config", cfg)
    monkeypatch.setattr(checkpoint, "config", cfg, raising=False)
    assert cli.main(["generate", "--model", str(fake_model), "--device", "toy", "--prompt", "def parse",
                     "--max-new-tokens", "8", "--seed", "0"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "max_position_embeddings (8)" in err
    assert cli.main(["generate", "--model", str(fake_model), "--device", "toy", "--prompt", "d",
                     "--max-new-tokens", "2", "--seed", "0"]) == 0
    assert "warning:" not in capsys.readouterr().err


def test_eval_missing_text(capsys, fake_model, tmp_path):
    assert cli.main(["eval", "--model", str(fake_model), "--text", str(tmp_path / "none.txt")]) == 2
    assert "text file not found" in _error_line(capsys)


@pytest.mark.parametrize(("args", "word"), [
    (["--context", "0"], "--context"),
    (["--max-tokens", "0"], "--max-tokens"),
])
def test_eval_bad_numbers(capsys, fake_model, tmp_path, args, word):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    assert cli.main(["eval", "--model", str(fake_model), "--text", str(text), *args]) == 2
    assert word in _error_line(capsys)


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if a command gets as far as loading the model (its checks should come first)."""
    def load(path):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(cli, "_load_checkpoint", load)


def test_eval_non_utf8_text(capsys, fake_model, tmp_path):
    text = tmp_path / "t.txt"
    text.write_bytes(b"\xff\xfe bad")
    assert cli.main(["eval", "--model", str(fake_model), "--text", str(text), "--device", "toy"]) == 2
    assert "utf-8" in _error_line(capsys).lower()


def test_eval_non_utf8_text_names_file_and_offset(capsys, fake_model, no_model_load, tmp_path):
    text = tmp_path / "latin1.txt"
    text.write_bytes(b"abc\xa5 def\n")  # 0xa5 is a continuation byte where a character should start
    assert cli.main(["eval", "--model", str(fake_model), "--text", str(text), "--device", "toy"]) == 2
    line = _error_line(capsys)
    assert str(text) in line and "UTF-8" in line
    assert "byte 0xa5 at byte offset 3" in line
    assert "invalid start byte" in line


def test_eval_json_missing_directory_refused_before_running(capsys, fake_model, no_model_load, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    out_json = tmp_path / "missing" / "eval.json"
    argv = ["eval", "--model", str(fake_model), "--device", "toy", "--text", str(text),
            "--json", str(out_json), "--no-progress"]
    assert cli.main(argv) == 2
    line = _error_line(capsys)
    assert str(out_json) in line and f"the directory {out_json.parent} does not exist" in line
    assert not out_json.parent.exists()  # refused, not created


@pytest.mark.parametrize("case", ["directory", "parent is a file"])
def test_eval_json_bad_path_refused_before_running(capsys, fake_model, no_model_load, tmp_path, case):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    if case == "directory":
        out_json, word = tmp_path, "is a directory"
    else:
        out_json, word = text / "eval.json", "is not a directory"
    assert cli.main(["eval", "--model", str(fake_model), "--text", str(text), "--json", str(out_json)]) == 2
    line = _error_line(capsys)
    assert "--json" in line and word in line


def test_eval_json_unwritable_refused_before_running(capsys, monkeypatch, fake_model, no_model_load,
                                                     tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    out_json = tmp_path / "eval.json"

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(cli, "open", denied, raising=False)  # shadows the builtin inside host.cli only
    assert cli.main(["eval", "--model", str(fake_model), "--text", str(text), "--json", str(out_json)]) == 2
    line = _error_line(capsys)
    assert f"cannot write --json {out_json}" in line and os.strerror(errno.EACCES) in line


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="needs file permissions to be enforced (not root)")
def test_eval_json_read_only_directory(capsys, fake_model, no_model_load, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        argv = ["eval", "--model", str(fake_model), "--text", str(text), "--json", str(locked / "e.json")]
        assert cli.main(argv) == 2
    finally:
        locked.chmod(0o700)
    assert "cannot write --json" in _error_line(capsys)


def test_checkpoint_error_is_one_line(capsys, monkeypatch, tmp_path):
    def broken(path):
        # host.checkpoint.CheckpointError is a ValueError
        raise ValueError("config.json: vocab_size must be a positive integer,\n got 0")

    monkeypatch.setattr(cli, "_load_checkpoint", broken)
    assert cli.main(["info", "--model", str(tmp_path)]) == 2
    assert "vocab_size must be a positive integer, got 0" in _error_line(capsys)


def test_no_tokenizer(capsys, monkeypatch, fake_model):
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: tiny_checkpoint(tokenizer=False))
    assert cli.main(["generate", "--model", str(fake_model), "--device", "toy"]) == 2
    assert "tokenizer" in _error_line(capsys)


def test_keyboard_interrupt_exits_130(capsys, monkeypatch, tmp_path):
    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_load_checkpoint", interrupted)
    assert cli.main(["info", "--model", str(tmp_path)]) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_usage_errors_and_help(capsys):
    assert cli.main([]) == 2
    assert cli.main(["generate", "--top-k", "many"]) == 2
    assert cli.main(["frobnicate"]) == 2
    capsys.readouterr()
    assert cli.main(["--help"]) == 0
    assert "generate" in capsys.readouterr().out
    assert cli.main(["generate", "--help"]) == 0
    out = capsys.readouterr().out
    assert DEFAULT_DEVICE in out and "--repetition-penalty" in out


# ---------------------------------------------------------------------- working commands (fake model)

def test_generate_streams_and_reports(capsys, fake_model):
    argv = ["generate", "--model", str(fake_model), "--device", "toy", "--prompt", "def parse(",
            "--max-new-tokens", "12", "--seed", "4", "--ignore-eos"]
    assert cli.main(argv) == 0
    first = capsys.readouterr()
    assert first.out.startswith("def parse(") and first.out.endswith("\n")
    assert re.fullmatch(r"\[12 tokens, [\d.]+ tokens/s, .*device toy\]\n", first.err), first.err
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == first.out  # same seed, same text
    assert cli.main([*argv[:-2], "5", "--ignore-eos"]) == 0
    assert capsys.readouterr().out != first.out


def test_eval_prints_and_writes_json(capsys, fake_model, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    out_json = tmp_path / "out" / "eval.json"
    out_json.parent.mkdir()
    out_json.write_text("stale")  # an existing file is overwritten
    argv = ["eval", "--model", str(fake_model), "--device", "toy", "--text", str(text), "--context", "16",
            "--json", str(out_json), "--no-progress"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    for word in ("perplexity", "bits per byte", "tokens", "bytes", "seconds"):
        assert word in out
    report = json.loads(out_json.read_text())
    assert f" {report['windows']} windows of 16," in out
    assert report["bytes"] == len(TEXT.encode("utf-8"))
    assert report["tokens"] == len(tiny_tokenizer().encode(TEXT, add_special_tokens=False).ids)
    assert report["device"] == "toy" and report["context"] == 16
    assert report["perplexity"] > 1 and report["bits_per_byte"] > 0
    assert report["counters"]["resets"] == report["windows"]


@pytest.mark.parametrize(("context", "phrase"), [("512", "1 window of 512,"), ("4", " windows of 4,")])
def test_eval_window_count_is_pluralized(capsys, fake_model, tmp_path, context, phrase):
    text = tmp_path / "t.txt"
    text.write_text("def parse(text):\n", encoding="utf-8")
    assert cli.main(["eval", "--model", str(fake_model), "--device", "toy", "--text", str(text),
                     "--context", context, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert phrase in out and "1 windows" not in out


def test_generate_report_is_pluralized(capsys, fake_model):
    argv = ["generate", "--model", str(fake_model), "--device", "toy", "--prompt", "",
            "--max-new-tokens", "1", "--ignore-eos"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert err.startswith("[1 token, ") and "prefill 1 token in " in err  # the prompt is BOS alone


def test_info(capsys, fake_model):
    assert cli.main(["info", "--model", str(fake_model)]) == 0
    out = capsys.readouterr().out
    cfg = tiny_checkpoint().config
    assert f"{cfg.n_params:,}" in out and f"{cfg.n_trits:,}" in out
    assert re.search(rf"tokenizer vocab\s+{tiny_tokenizer().get_vocab_size()}\b", out)
    assert re.search(r"hidden_size\s+16\b", out)


# ---------------------------------------------------------------------- end to end: checkpoint on disk

def test_end_to_end_on_disk_checkpoint(capsys, tmp_path):
    pytest.importorskip("host.reference", reason="host/reference.py (ReferenceModel) is not written yet")
    testing = pytest.importorskip("host.testing", reason="host/testing.py (checkpoint writer) is missing")
    tok = tiny_tokenizer()
    model = tmp_path / "tiny"
    config = testing.tiny_config(vocab_size=tok.get_vocab_size())
    testing.write_tiny_checkpoint(model, config, dtype="float32")
    tok.save(str(model / "tokenizer.json"))
    assert cli.main(["info", "--model", str(model)]) == 0
    assert "float32" in capsys.readouterr().out
    assert cli.main(["generate", "--model", str(model), "--device", "reference", "--prompt", "def",
                     "--max-new-tokens", "6", "--ignore-eos"]) == 0
    r = capsys.readouterr()
    assert r.out.startswith("def") and "[6 tokens" in r.err and "device reference]" in r.err
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert cli.main(["eval", "--model", str(model), "--text", str(text), "--context", "32"]) == 0
    assert "bits per byte" in capsys.readouterr().out


class _CountingDevice:
    """Stand-in for a device after a run: its counters and, for the RTL device, its cycles report."""

    def __init__(self, name, counters, report=None):
        self.name, self._counters, self._report = name, counters, report
        if report is not None:
            self.cycles_report = lambda: self._report

    def counters(self):
        return dict(self._counters)


def test_print_cycles_of_the_rtl_device(capsys):
    from host.cli import _print_cycles

    rep = {"measured": 251655.0, "predicted": 251704, "ideal": 243192.0, "stream_efficiency": 243192 / 251655}
    _print_cycles(_CountingDevice("rtl", {"hw_cycles": 2 * 251655, "hw_tokens": 2}, rep))
    err = capsys.readouterr().err
    assert err == ("[251,655 cycles/token (hardware counters), cycle model 251,704 (-0.02%), roofline 243,192 "
                   "(stream efficiency 96.6%), device rtl]\n")
    _print_cycles(_CountingDevice("golden", {"hw_cycles": 500, "hw_tokens": 2}))
    assert capsys.readouterr().err == "[250 cycles/token (cycle model), device golden]\n"
    _print_cycles(_CountingDevice("rtl", {"hw_cycles": 0, "hw_tokens": 0}, None))   # no token yet: silent
    _print_cycles(_CountingDevice("reference", {}))                                  # no cycle counters
    assert capsys.readouterr().err == ""


def test_compile_writes_image_and_reports_density(monkeypatch, capsys, tmp_path):
    from host.image import parse_image

    checkpoint = tiny_checkpoint(tokenizer=False)
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: checkpoint)
    out = tmp_path / "model.img"
    assert cli.main(["compile", "--out", str(out)]) == 0
    image = out.read_bytes()
    parse_image(image)  # a valid image
    assert not (tmp_path / "model.img.partial").exists()
    density = float(re.search(r"([\d.]+) trits/byte overall", capsys.readouterr().err).group(1))
    # trits per byte of the whole image: at most 5 (base-3 packing), headers and constants take the rest
    assert 0 < density <= 5
    assert density == pytest.approx(checkpoint.config.n_trits / len(image), abs=0.01)


def test_compile_out_mmf_writes_a_bundle(monkeypatch, capsys, tmp_path):
    from host.bundle import read_bundle

    checkpoint = tiny_checkpoint()
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: checkpoint)
    out = tmp_path / "model.mmf"
    assert cli.main(["compile", "--out", str(out), "--channels", "2"]) == 0
    b = read_bundle(out)
    assert b.config == checkpoint.config and b.compile_options["channels"] == 2
    assert b.tokenizer.encode("def parse").ids == checkpoint.tokenizer.encode("def parse").ids
    assert "-> " + str(out) in capsys.readouterr().err


def test_golden_runs_a_bundle_as_compiled_without_options(monkeypatch, capsys, tmp_path):
    """``generate --image`` on the default golden device takes the bundle's channel count and packing; ``bench``
    models a board's design point, so a bundle of another channel count is an error that names the fix."""
    from hw.boards.facts import BOARDS

    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: tiny_checkpoint())
    one, two = tmp_path / "one.mmf", tmp_path / "two.mmf"
    assert cli.main(["compile", "--out", str(one)]) == 0
    assert cli.main(["compile", "--out", str(two), "--channels", "2", "--packing", "bits2"]) == 0
    capsys.readouterr()
    args = ["--prompt", "def parse", "--max-new-tokens", "4", "--temperature", "0"]
    assert cli.main(["generate", "--image", str(one), *args]) == 0
    want = capsys.readouterr().out
    assert cli.main(["generate", "--image", str(two), *args]) == 0
    assert capsys.readouterr().out == want
    assert cli.main(["generate", "--image", str(two), "--option", "channels=1", *args]) == 2
    assert "compiled for channels=2, the device is set to channels=1" in _error_line(capsys)

    design = BOARDS["kv260"].design.channels
    assert design != 1
    assert cli.main(["bench", "--image", str(one), "--board", "kv260", "--tokens", "1"]) == 2
    line = _error_line(capsys)
    assert f"design point has {design} weight channel(s)" in line and f"mmfree compile --channels {design}" in line
    assert cli.main(["bench", "--image", str(one), "--board", "kv260", "--tokens", "1", "--option",
                     "channels=1"]) == 0
    assert json.loads(capsys.readouterr().out)["build"]["channels"] == 1


def test_compile_out_is_a_directory_leaves_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: tiny_checkpoint(tokenizer=False))
    target = tmp_path / "dir"
    target.mkdir()
    assert cli.main(["compile", "--out", str(target)]) == 2
    assert "--out is a directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert re.fullmatch(r"mmfree (\d+\.\d+\.\d+\S*|unknown)\n", capsys.readouterr().out)
