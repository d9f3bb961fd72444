"""host.bundle: the deployable model bundle (one file: image, embeddings, tokenizer, config, one checksum)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from host_fakes import tiny_checkpoint

from host.bundle import BundleError, embeddings_fixed, read_bundle, write_bundle
from host.compiler import CompileOptions, compile_model
from host.image import parse_image
from hw import isa


@pytest.fixture(scope="module")
def compiled():
    ck = tiny_checkpoint()
    return ck, compile_model(ck.weights, CompileOptions())


@pytest.fixture
def bundle_path(compiled, tmp_path):
    ck, image = compiled
    return write_bundle(tmp_path / "m.mmf", image, config=ck.config, embeddings=ck.weights.embeddings,
                        tokenizer_json=ck.tokenizer.to_str(), compile_options={"packing": "base3"})


def test_round_trip(compiled, bundle_path):
    ck, image = compiled
    b = read_bundle(bundle_path)
    assert b.image == image and b.config == ck.config and b.compile_options == {"packing": "base3"}
    frac = parse_image(image).info.residual_frac
    assert b.residual_frac == frac
    assert b.embeddings.dtype == np.int32
    np.testing.assert_array_equal(b.embeddings, embeddings_fixed(ck.weights.embeddings, frac))
    assert b.tokenizer.encode("def parse").ids == ck.tokenizer.encode("def parse").ids
    assert not bundle_path.with_name("m.mmf.partial").exists()


@pytest.mark.parametrize("where", ["image", "embeddings", "metadata"])
def test_any_changed_byte_is_caught(bundle_path, where):
    raw = bytearray(bundle_path.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    if where == "metadata":
        head = bytes(raw[8:8 + header_len])
        assert head.count(b"base3") == 1   # the compile options' packing, inside the metadata's JSON string
        raw[8:8 + header_len] = head.replace(b"base3", b"bits2")
    else:
        start, end = header[where]["data_offsets"]
        raw[8 + header_len + (start + end) // 2] ^= 0x10
    bundle_path.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="checksum mismatch"):
        read_bundle(bundle_path)


def test_not_a_bundle(tmp_path, compiled):
    _, image = compiled
    f = tmp_path / "image.bin"
    f.write_bytes(image)
    with pytest.raises(BundleError, match="not a readable bundle"):
        read_bundle(f)
    with pytest.raises(FileNotFoundError, match="bundle not found"):
        read_bundle(tmp_path / "absent.mmf")
    with pytest.raises(IsADirectoryError):
        read_bundle(tmp_path)


def test_truncated(bundle_path):
    raw = bundle_path.read_bytes()
    bundle_path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(BundleError, match="not a readable bundle"):
        read_bundle(bundle_path)


def test_other_isa_version_says_recompile(compiled, tmp_path):
    ck, image = compiled
    old = bytearray(image)
    h = isa.unpack(isa.ImageHeader, image)
    fields = {name: getattr(h, name) for name in ("magic", "header_words", "packing", "channels", "flags",
                                                  "n_layers", "hidden", "intermediate", "vocab",
                                                  "n_instructions", "image_words", "residual_frac",
                                                  "state_frac", "gate_frac", "lut_segments_log2")}
    fields["version"] = isa.ISA_VERSION - 1
    head = isa.pack(isa.ImageHeader, fields)
    old[:60] = head[:60]
    old[60:64] = isa.crc32_words(bytes(old[:60])).to_bytes(4, "little")
    path = write_bundle(tmp_path / "old.mmf", bytes(old), config=ck.config, embeddings=ck.weights.embeddings)
    with pytest.raises(BundleError, match=rf"ISA version {isa.ISA_VERSION - 1}.*recompile"):
        read_bundle(path)


def test_image_of_another_model_is_refused(compiled, tmp_path):
    ck, image = compiled
    with pytest.raises(BundleError, match="embeddings have shape"):
        write_bundle(tmp_path / "x.mmf", image, config=ck.config, embeddings=ck.weights.embeddings[:, :-1])


def test_golden_runs_a_bundle_exactly_as_the_checkpoint(compiled, bundle_path):
    """Device.load_image(bundle) (no compiler on the host) gives the same bits as load(weights)."""
    from host.devices.golden import GoldenDevice

    ck, _ = compiled
    a, b = GoldenDevice(), GoldenDevice()
    a.load(ck.weights)
    b.load_image(bundle_path)          # a path: read and verified
    assert b.config == ck.config
    for t in (1, 5, 17, 5):
        la, lb = a.step(t), b.step(t)
        assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
        assert a.last.output == b.last.output


def test_reference_device_refuses_a_bundle(bundle_path):
    from host.devices import DeviceError
    from host.devices.reference import ReferenceDevice

    with pytest.raises(DeviceError, match="runs checkpoints, not compiled images"):
        ReferenceDevice().load_image(bundle_path)


def test_cli_runs_from_a_bundle(compiled, tmp_path, monkeypatch, capsys):
    """compile --out m.mmf, then generate and selftest with --image only (no --model needed)."""
    import host.cli as cli

    ck, _ = compiled
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: ck)
    out = tmp_path / "m.mmf"
    assert cli.main(["compile", "--out", str(out)]) == 0
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: pytest.fail("the checkpoint was loaded"))
    args = ["--prompt", "def parse", "--max-new-tokens", "6", "--seed", "0"]
    assert cli.main(["generate", "--image", str(out), *args]) == 0
    from_bundle = capsys.readouterr().out
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: ck)
    assert cli.main(["generate", *args]) == 0
    assert capsys.readouterr().out == from_bundle
    monkeypatch.setattr(cli, "_load_checkpoint", lambda path: pytest.fail("the checkpoint was loaded"))
    assert cli.main(["selftest", "--image", str(out), "--device", "golden"]) == 0
    assert "selftest PASS" in capsys.readouterr().out
