"""host.checkpoint: round trips in every dtype, sharding, bfloat16 rounding, and every error message."""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from host.checkpoint import (
    CONFIG_NAME,
    MAX_HEADER_BYTES,
    TOKENIZER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    Checkpoint,
    CheckpointConfigError,
    CheckpointError,
    SafetensorsFile,
    bf16_bits_to_f32,
    checkpoint_shapes,
    f32_to_bf16_bits,
    load_checkpoint,
    read_config,
    save_checkpoint,
    write_safetensors,
)
from host.model import ConfigError, lower_bounds_per_layer, ternarize
from host.testing import random_tensors, tiny_config, tiny_tokenizer, write_tiny_checkpoint

CFG = tiny_config()


# ------------------------------------------------------------------------------------------------ helpers
def bf16_reference(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (as float32) by choosing the nearer of the two neighbours in float64.

    Independent of the bit trick in host.checkpoint: truncate to get the neighbour towards zero, step one
    bf16 ulp away from zero for the other, compare distances, break ties towards the even mantissa.
    """
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return _bf16_reference(x)


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32)
    lo_bits = bits & np.uint32(0xFFFF0000)
    hi_bits = lo_bits + np.uint32(0x10000)  # one bf16 ulp further from zero (to Inf past the max)
    lo = lo_bits.view(np.float32).astype(np.float64)
    hi = hi_bits.view(np.float32).astype(np.float64)
    xd = x.astype(np.float64)
    d_lo, d_hi = np.abs(xd - lo), np.abs(hi - xd)
    lo_even = ((lo_bits >> 16) & 1) == 0
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ~lo_even)
    out = np.where(take_hi, hi_bits, lo_bits).view(np.float32).copy()
    out[np.isinf(x)] = x[np.isinf(x)]
    # float32 values above the bf16 max that round up: hi is already +-Inf (0x7F80 / 0xFF80)
    out[np.isnan(x)] = np.nan
    return out


def stored(x: np.ndarray, dtype: str) -> np.ndarray:
    """What a float32 tensor becomes after saving in ``dtype`` and loading (independent references)."""
    if dtype == "bfloat16":
        return bf16_reference(x)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    return x


def header_of(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def rewrite_header(path: Path, mutate) -> None:
    """Apply ``mutate(header_dict)`` and rewrite the file with the same data section."""
    header, data = header_of(path)
    mutate(header)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns,
                                        hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*"))}


def assert_same_weights(a, b) -> None:
    np.testing.assert_array_equal(a.embeddings, b.embeddings)
    np.testing.assert_array_equal(a.norm, b.norm)
    if a.lower_bounds is None:
        assert b.lower_bounds is None
    else:
        np.testing.assert_array_equal(a.lower_bounds, b.lower_bounds)
    for (na, x), (nb, y) in zip(a.bitlinears(), b.bitlinears(), strict=True):
        assert na == nb
        np.testing.assert_array_equal(x.trits, y.trits)
        np.testing.assert_array_equal(x.norm, y.norm)
        assert x.scale == y.scale
    for la, lb in zip(a.layers, b.layers, strict=True):
        for name in ("attn_norm", "g_norm", "mlp_norm"):
            np.testing.assert_array_equal(getattr(la, name), getattr(lb, name))


def key_re(path: Path, key: str) -> str:
    """Regex: the message starts with ``path`` and names ``key``."""
    return re.escape(str(path)) + r".*" + re.escape(repr(key))


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path / "ckpt"
    return root, write_tiny_checkpoint(root, dtype="bfloat16")


@pytest.fixture
def sharded(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path / "sharded"
    tensors = write_tiny_checkpoint(root, dtype="bfloat16", shard_size_bytes=1500)
    return root, tensors


# ----------------------------------------------------------------------------------------- key layout
def test_checkpoint_shapes_layout():
    shapes = checkpoint_shapes(CFG)
    h, i, v, n = CFG.hidden_size, CFG.intermediate_size, CFG.vocab_size, CFG.num_hidden_layers
    assert len(shapes) == 1 + 15 * n + 1 + 3
    assert shapes["model.embeddings.weight"] == (v, h)
    assert shapes["model.layers.1.attn.f_proj.weight"] == (h, h)
    assert shapes["model.layers.1.attn.g_norm.weight"] == (h,)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (2 * i, h)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (h, i)
    assert shapes["model.layers.0.mlp.down_proj.norm.weight"] == (i,)
    assert shapes["model.lower_bounds"] == (n, h)
    assert list(shapes)[-3:] == ["model.norm.weight", "lm_head.weight", "lm_head.norm.weight"]
    trits = sum(math.prod(s) for k, s in shapes.items() if k.endswith("proj.weight") or k == "lm_head.weight")
    assert trits == CFG.n_trits
    assert "model.lower_bounds" not in checkpoint_shapes(tiny_config(use_lower_bound=False))


# --------------------------------------------------------------------------------------------- bfloat16
# (float32 bits, expected bfloat16 bits): ties to even, subnormals, overflow, signed zero, NaN payloads.
BF16_CASES = [
    (0x3F800000, 0x3F80),  # 1.0 exact
    (0x3F808000, 0x3F80),  # 1 + 2^-8: tie, mantissa even -> down
    (0x3F818000, 0x3F82),  # 1 + 3*2^-8: tie, mantissa odd -> up
    (0x3F808001, 0x3F81),  # just above the tie -> up
    (0x3F807FFF, 0x3F80),  # just below the tie -> down
    (0xBF818000, 0xBF82),  # negative tie, odd -> away from zero
    (0xBF808000, 0xBF80),  # negative tie, even -> towards zero
    (0x3DCCCCCD, 0x3DCD),  # 0.1 -> 0.10009765625
    (0x00000001, 0x0000),  # smallest float32 subnormal -> +0
    (0x80000001, 0x8000),  # negative -> -0
    (0x00010000, 0x0001),  # smallest bf16 subnormal, exact
    (0x00018000, 0x0002),  # subnormal tie, odd -> up
    (0x00028000, 0x0002),  # subnormal tie, even -> down
    (0x007FFFFF, 0x0080),  # largest float32 subnormal rounds up to the smallest normal
    (0x7F7F0000, 0x7F7F),  # largest bf16, exact
    (0x7F7F8000, 0x7F80),  # tie above the largest bf16 -> +Inf
    (0x7F7FFFFF, 0x7F80),  # largest float32 -> +Inf
    (0xFF7FFFFF, 0xFF80),  # -> -Inf
    (0x7F800000, 0x7F80),  # +Inf
    (0xFF800000, 0xFF80),  # -Inf
    (0x80000000, 0x8000),  # -0.0 keeps its sign
    (0x7FC00000, 0x7FC0),  # quiet NaN
    (0x7F800001, 0x7FC0),  # NaN with payload only in the low bits stays NaN (not Inf)
    (0xFFFFFFFF, 0xFFFF),  # negative NaN, full payload (would wrap without the NaN rule)
]


def test_bf16_encode_hand_values():
    src = np.array([c[0] for c in BF16_CASES], np.uint32).view(np.float32)
    got = f32_to_bf16_bits(src)
    assert got.dtype == np.uint16
    assert [hex(b) for b in got.tolist()] == [hex(c[1]) for c in BF16_CASES]


def test_bf16_decode_hand_values():
    bits = np.array([0x3F80, 0xC000, 0x3DCD, 0x0001, 0x7F7F, 0x7F80, 0xFF80, 0x8000, 0x7FC0], np.uint16)
    got = bf16_bits_to_f32(bits)
    expect = [1.0, -2.0, 0.10009765625, 2.0 ** -133, 3.3895313892515355e38, math.inf, -math.inf, -0.0]
    assert got.dtype == np.float32
    assert got[:8].tolist() == expect
    assert math.copysign(1.0, got[7]) == -1.0 and math.isnan(got[8])
    # big-endian input decodes the same
    np.testing.assert_array_equal(bf16_bits_to_f32(bits.astype(">u2")), got)


def test_bf16_encode_matches_independent_rounding():
    rng = np.random.default_rng(5)
    with np.errstate(over="ignore"):  # the widest magnitudes overflow to +-Inf, which is wanted
        wide = np.ldexp(rng.standard_normal(20000), rng.integers(-150, 129, 20000)).astype(np.float32)
    x = np.concatenate([
        wide, rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),  # any bits
    ])
    x = x[~np.isnan(x)]
    np.testing.assert_array_equal(bf16_bits_to_f32(f32_to_bf16_bits(x)), bf16_reference(x))


def test_bf16_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed (optional reference)")
    rng = np.random.default_rng(6)
    x = rng.integers(0, 2 ** 32, 50000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ours = f32_to_bf16_bits(x)
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on NaN inputs
        theirs = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(ours[finite], theirs[finite])
    assert np.isnan(bf16_bits_to_f32(ours[~finite])).all()


# ------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip(tmp_path: Path, dtype: str):
    root = tmp_path / dtype
    tensors = write_tiny_checkpoint(root, dtype=dtype, seed=1)
    ckpt = load_checkpoint(root)
    assert isinstance(ckpt, Checkpoint)
    assert ckpt.path == root and ckpt.dtype == dtype and ckpt.tokenizer is None
    assert ckpt.config == CFG
    w = ckpt.weights
    assert w.config == CFG

    def exp(key: str) -> np.ndarray:
        return stored(tensors[key], dtype)

    for arr in (w.embeddings, w.norm, w.lower_bounds):
        assert arr.dtype == np.float32
    np.testing.assert_array_equal(w.embeddings, exp("model.embeddings.weight"))
    np.testing.assert_array_equal(w.norm, exp("model.norm.weight"))
    np.testing.assert_array_equal(w.lower_bounds, lower_bounds_per_layer(exp("model.lower_bounds")))
    for prefix, bl in w.bitlinears():
        trits, beta = ternarize(exp(prefix + ".weight"))
        assert bl.trits.dtype == np.int8 and bl.trits.shape == tensors[prefix + ".weight"].shape
        np.testing.assert_array_equal(bl.trits, trits)
        assert bl.scale == beta and isinstance(bl.scale, np.float32)
        np.testing.assert_array_equal(bl.norm, exp(prefix + ".norm.weight"))
        assert set(np.unique(bl.trits)) <= {-1, 0, 1}
    for idx, layer in enumerate(w.layers):
        p = f"model.layers.{idx}."
        np.testing.assert_array_equal(layer.attn_norm, exp(p + "attn_norm.weight"))
        np.testing.assert_array_equal(layer.g_norm, exp(p + "attn.g_norm.weight"))
        np.testing.assert_array_equal(layer.mlp_norm, exp(p + "mlp_norm.weight"))
    if dtype != "float32":  # rounding really happened
        assert not np.array_equal(w.embeddings, tensors["model.embeddings.weight"])


def test_bf16_values_are_exact_bf16(tiny):
    root, tensors = tiny
    emb = load_checkpoint(root).weights.embeddings
    assert not (emb.view(np.uint32) & 0xFFFF).any()
    np.testing.assert_array_equal(emb, bf16_reference(tensors["model.embeddings.weight"]))


def test_lower_bounds_transformed_and_optional(tmp_path: Path):
    write_tiny_checkpoint(tmp_path / "a")
    w = load_checkpoint(tmp_path / "a").weights
    assert w.lower_bounds.shape == (CFG.num_hidden_layers, CFG.hidden_size)
    assert not w.lower_bounds[0].any() and (w.lower_bounds[1] > 0).all()
    np.testing.assert_array_equal(w.lower_bound(1), w.lower_bounds[1])

    cfg = tiny_config(use_lower_bound=False)
    write_tiny_checkpoint(tmp_path / "b", cfg)
    ckpt = load_checkpoint(tmp_path / "b")
    assert ckpt.weights.lower_bounds is None and not ckpt.config.use_lower_bound
    assert not ckpt.weights.lower_bound(1).any()


def test_sharded_loads_like_single_file(tiny, sharded):
    root, tensors = sharded
    shards = sorted(root.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and not (root / WEIGHTS_NAME).exists()
    index = json.loads((root / WEIGHTS_INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(tensors)
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    assert index["metadata"]["total_size"] == 2 * sum(t.size for t in tensors.values())
    for s in shards:  # each shard within the limit unless it is one oversized tensor
        st = SafetensorsFile(s)
        assert sum(t.nbytes for t in st.tensors.values()) <= 1500 or len(st.tensors) == 1
        assert st.metadata == {"format": "pt"}
    a, b = load_checkpoint(tiny[0]), load_checkpoint(root)
    assert b.dtype == "bfloat16" and a.config == b.config
    assert_same_weights(a.weights, b.weights)


def test_single_file_wins_over_index(tiny, sharded):
    # transformers' precedence: model.safetensors is used when both forms are present.
    root, _ = sharded
    (root / WEIGHTS_NAME).write_bytes((tiny[0] / WEIGHTS_NAME).read_bytes())
    for s in root.glob("model-*-of-*.safetensors"):
        s.unlink()
    assert_same_weights(load_checkpoint(root).weights, load_checkpoint(tiny[0]).weights)


def test_progress_bar(tiny, capfd):
    ckpt = load_checkpoint(tiny[0], progress=True)
    assert_same_weights(ckpt.weights, load_checkpoint(tiny[0]).weights)
    assert "35/35" in capfd.readouterr().err


def test_load_does_not_modify_anything(tmp_path: Path):
    root = tmp_path / "ro"
    write_tiny_checkpoint(root, shard_size_bytes=2000, tokenizer=True)
    before = snapshot(root)
    for p in root.iterdir():
        p.chmod(0o444)
    root.chmod(0o555)
    try:
        load_checkpoint(root, progress=True)
        read_config(root)
    finally:
        root.chmod(0o755)
        for p in root.iterdir():
            p.chmod(0o644)
    assert snapshot(root) == before


def test_read_config(tiny):
    root, _ = tiny
    assert read_config(root) == CFG == read_config(root / CONFIG_NAME)
    d = json.loads((root / CONFIG_NAME).read_text())
    assert d["torch_dtype"] == "bfloat16" and d["architectures"] == ["HGRNBitForCausalLM"]
    d.update(intermediate_size=None, hidden_size=48, hidden_ratio=4)  # resolved as HGRNBitMLP does
    (root / CONFIG_NAME).write_text(json.dumps(d))
    assert read_config(root).intermediate_size == 256


# ------------------------------------------------------------------------------------- other formats
def test_reads_files_of_the_safetensors_library(tmp_path: Path):
    """A checkpoint written by safetensors.numpy (F32, F16 and F64 mixed) loads; F64 is narrowed."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    root = tmp_path / "lib"
    save_checkpoint(root, CFG, random_tensors(CFG, seed=2), dtype="float32")
    ref = load_checkpoint(root)
    tensors = random_tensors(CFG, seed=2)
    dtypes = [np.float32, np.float16, np.float64]
    mixed = {k: v.astype(dtypes[n % 3]) for n, (k, v) in enumerate(tensors.items())}
    (root / WEIGHTS_NAME).unlink()
    safetensors_numpy.save_file(mixed, str(root / WEIGHTS_NAME), metadata={"format": "pt"})
    ckpt = load_checkpoint(root)
    assert ckpt.dtype == "mixed"
    emb = mixed["model.embeddings.weight"]
    assert emb.dtype == np.float32
    np.testing.assert_array_equal(ckpt.weights.embeddings, emb)
    for (_, a), (k, b) in zip(ckpt.weights.bitlinears(), ref.weights.bitlinears(), strict=True):
        if mixed[k + ".weight"].dtype != np.float16:
            np.testing.assert_array_equal(a.trits, b.trits)

    all64 = {k: v.astype(np.float64) for k, v in tensors.items()}
    safetensors_numpy.save_file(all64, str(root / WEIGHTS_NAME))
    ckpt = load_checkpoint(root)
    assert ckpt.dtype == "float64"
    assert_same_weights(ckpt.weights, ref.weights)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_safetensors_library_reads_our_files(tmp_path: Path, dtype: str):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    root = tmp_path / dtype
    tensors = write_tiny_checkpoint(root, dtype=dtype)
    back = safetensors_numpy.load_file(str(root / WEIGHTS_NAME))
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(back[k].astype(np.float32), stored(v, dtype))


def test_safetensors_library_reads_our_bf16_header(tiny):
    safetensors = pytest.importorskip("safetensors")
    root, tensors = tiny
    with safetensors.safe_open(str(root / WEIGHTS_NAME), framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        assert set(f.keys()) == set(tensors)
        for k, v in tensors.items():
            sl = f.get_slice(k)
            assert sl.get_dtype() == "BF16" and tuple(sl.get_shape()) == v.shape


# ------------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_loaded_when_present(tmp_path: Path):
    root = tmp_path / "tok"
    write_tiny_checkpoint(root, tokenizer=True)
    tok = load_checkpoint(root).tokenizer
    assert tok is not None
    assert tok.get_vocab_size() <= CFG.vocab_size
    assert tok.token_to_id("<s>") == 1 and tok.token_to_id("</s>") == 2
    enc = tok.encode("the lazy dog")
    assert enc.ids and max(enc.ids) < CFG.vocab_size
    assert tok.decode(enc.ids) == "the lazy dog"


def test_tokenizer_corrupt(tiny):
    root, _ = tiny
    (root / TOKENIZER_NAME).write_text('{"not": "a tokenizer"}')
    with pytest.raises(CheckpointError, match=re.escape(str(root / TOKENIZER_NAME)) + ".*cannot load"):
        load_checkpoint(root)


def test_tokenizer_larger_than_vocab(tiny):
    root, _ = tiny
    tiny_tokenizer(200).save(str(root / TOKENIZER_NAME))
    with pytest.raises(CheckpointError, match=re.escape(str(root / TOKENIZER_NAME)) + ".*vocab_size is 67"):
        load_checkpoint(root)


# ------------------------------------------------------------------------------------------------ writer
def test_save_refuses_to_clobber_and_overwrites(tiny):
    root, tensors = tiny
    with pytest.raises(FileExistsError, match=re.escape(str(root / WEIGHTS_NAME))):
        save_checkpoint(root, CFG, tensors)
    # single file -> shards: the old single file goes, as must the shards when going back
    save_checkpoint(root, CFG, tensors, shard_size_bytes=2000, overwrite=True)
    assert not (root / WEIGHTS_NAME).exists() and (root / WEIGHTS_INDEX_NAME).exists()
    save_checkpoint(root, CFG, tensors, dtype="float32", overwrite=True)
    assert sorted(p.name for p in root.iterdir()) == [CONFIG_NAME, WEIGHTS_NAME]
    assert load_checkpoint(root).dtype == "float32"


def test_save_strict_validation(tmp_path: Path):
    tensors = random_tensors(CFG)
    with pytest.raises(CheckpointError, match="missing 'lm_head.weight'"):
        save_checkpoint(tmp_path / "a", CFG, {k: v for k, v in tensors.items() if k != "lm_head.weight"})
    with pytest.raises(CheckpointError, match="unexpected 'model.extra'"):
        save_checkpoint(tmp_path / "a", CFG, {**tensors, "model.extra": np.zeros(3, np.float32)})
    with pytest.raises(CheckpointError, match=r"'model.norm.weight': shape \[13\], config implies \[12\]"):
        save_checkpoint(tmp_path / "a", CFG, {**tensors, "model.norm.weight": np.ones(13, np.float32)})
    bad = dict(tensors)
    bad["model.layers.1.attn.o_proj.weight"] = tensors["model.layers.1.attn.o_proj.weight"].copy()
    bad["model.layers.1.attn.o_proj.weight"][3, 4] = np.nan
    with pytest.raises(CheckpointError, match=key_re(tmp_path / "b" / WEIGHTS_NAME,
                                                     "model.layers.1.attn.o_proj.weight") + ".*non-finite"):
        save_checkpoint(tmp_path / "b", CFG, bad)
    assert not list((tmp_path / "b").glob("*.safetensors*"))  # no partial file left behind
    big = {**tensors, "model.norm.weight": np.full(12, 1e5, np.float32)}
    with pytest.raises(CheckpointError, match="'model.norm.weight': a value overflows float16"):
        save_checkpoint(tmp_path / "c", CFG, big, dtype="float16")
    huge = {**tensors, "model.norm.weight": np.full(12, 3.4e38, np.float32)}
    with pytest.raises(CheckpointError, match="'model.norm.weight': a value overflows bfloat16"):
        save_checkpoint(tmp_path / "c", CFG, huge, dtype="bfloat16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        save_checkpoint(tmp_path / "d", CFG, tensors, dtype="int8")
    with pytest.raises(ValueError, match="shard_size_bytes"):
        save_checkpoint(tmp_path / "d", CFG, tensors, shard_size_bytes=0)


def test_writer_streams_lazy_tensors(tmp_path: Path):
    lazy = random_tensors(CFG, seed=4, lazy=True)
    save_checkpoint(tmp_path / "lazy", CFG, lazy, shard_size_bytes=3000)
    write_tiny_checkpoint(tmp_path / "eager", seed=4)
    lazy_w, eager_w = load_checkpoint(tmp_path / "lazy").weights, load_checkpoint(tmp_path / "eager").weights
    assert_same_weights(lazy_w, eager_w)


# --------------------------------------------------------------------------------- errors: directory
def test_error_missing_directory(tmp_path: Path):
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / "nope")) + ": checkpoint directory"):
        load_checkpoint(tmp_path / "nope")


def test_error_not_a_directory(tiny):
    path = tiny[0] / CONFIG_NAME
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": not a directory"):
        load_checkpoint(path)


def test_error_missing_config(tiny):
    root, _ = tiny
    (root / CONFIG_NAME).unlink()
    with pytest.raises(CheckpointError, match=re.escape(str(root / CONFIG_NAME)) + ": missing"):
        load_checkpoint(root)


def test_error_config_not_json(tiny):
    root, _ = tiny
    (root / CONFIG_NAME).write_text("{vocab_size: 67")
    with pytest.raises(CheckpointConfigError, match=re.escape(str(root / CONFIG_NAME)) + ": not valid JSON"):
        load_checkpoint(root)


@pytest.mark.parametrize(("field", "value"), [
    ("use_short_conv", True), ("num_heads", 4), ("hidden_act", "gelu"), ("hidden_size", "wide"),
    ("expand_ratio", 2), ("model_type", "llama"), ("vocab_size", -1),
])
def test_error_unsupported_config(tiny, field, value):
    root, _ = tiny
    d = json.loads((root / CONFIG_NAME).read_text())
    d[field] = value
    if field == "hidden_size":
        d["intermediate_size"] = None  # makes from_dict compute int("wide") itself
    (root / CONFIG_NAME).write_text(json.dumps(d))
    with pytest.raises(CheckpointConfigError, match=re.escape(str(root / CONFIG_NAME)) + ".*" + field) as e:
        load_checkpoint(root)
    assert isinstance(e.value, ConfigError) and isinstance(e.value, CheckpointError)


def test_error_missing_config_field(tiny):
    root, _ = tiny
    d = json.loads((root / CONFIG_NAME).read_text())
    del d["num_hidden_layers"]
    (root / CONFIG_NAME).write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=re.escape(str(root / CONFIG_NAME)) + ".*'num_hidden_layers'"):
        read_config(root)


def test_error_no_weights(tiny):
    root, _ = tiny
    (root / WEIGHTS_NAME).unlink()
    with pytest.raises(CheckpointError, match=re.escape(str(root)) + ": no weights: neither model.safet"):
        load_checkpoint(root)
    (root / "pytorch_model.bin").write_bytes(b"\x80\x02")
    with pytest.raises(CheckpointError, match=r"found pytorch_model.bin: PyTorch pickles are not read"):
        load_checkpoint(root)


# ----------------------------------------------------------------------------------- errors: tensors
def _write_raw(root: Path, tensors: dict, config=CFG, dtype="bfloat16") -> Path:
    save_checkpoint(root, config, tensors, dtype=dtype, strict=False)
    return root / WEIGHTS_NAME


def test_error_missing_keys(tmp_path: Path):
    tensors = random_tensors(CFG)
    gone = ["model.layers.1.attn.g_norm.weight", "lm_head.norm.weight"]
    path = _write_raw(tmp_path, {k: v for k, v in tensors.items() if k not in gone})
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": missing 2 tensor.*"
                       + re.escape("'model.layers.1.attn.g_norm.weight', 'lm_head.norm.weight'")):
        load_checkpoint(tmp_path)


def test_error_many_missing_keys_are_abbreviated(tmp_path: Path):
    tensors = random_tensors(CFG)
    path = _write_raw(tmp_path, {"model.embeddings.weight": tensors["model.embeddings.weight"]})
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + r": missing 34 tensor.*\(29 more\)"):
        load_checkpoint(tmp_path)


def test_error_unexpected_keys(tmp_path: Path):
    tensors = {**random_tensors(CFG), "model.layers.2.attn_norm.weight": np.ones(12, np.float32),
               "model.rotary.inv_freq": np.ones(6, np.float32)}
    path = _write_raw(tmp_path, tensors)
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": 2 unexpected tensor.*"
                       r"'model.layers.2.attn_norm.weight \(in model.safetensors\)'.*'model.rotary.inv_freq"):
        load_checkpoint(tmp_path)


def test_error_lower_bounds_without_use_lower_bound(tmp_path: Path):
    path = _write_raw(tmp_path, random_tensors(CFG), config=tiny_config(use_lower_bound=False))
    what = re.escape(str(path)) + ".*use_lower_bound=false.*'model.lower_bounds"
    with pytest.raises(CheckpointError, match=what):
        load_checkpoint(tmp_path)


def test_error_wrong_shape(tmp_path: Path):
    tensors = random_tensors(CFG)
    tensors["model.layers.0.mlp.down_proj.weight"] = tensors["model.layers.0.mlp.down_proj.weight"].T.copy()
    path = _write_raw(tmp_path, tensors)
    with pytest.raises(CheckpointError, match=key_re(path, "model.layers.0.mlp.down_proj.weight")
                       + re.escape(": shape [20, 12] but config.json implies [12, 20]")):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(("dtype", "bad", "what"), [
    ("bfloat16", np.nan, r"1 non-finite value\(s\) \(1 NaN, 0 Inf\), first at index \[5, 7\]"),
    ("float32", np.inf, r"1 non-finite value\(s\) \(0 NaN, 1 Inf\), first at index \[5, 7\]"),
    ("float16", -np.inf, r"1 non-finite value\(s\) \(0 NaN, 1 Inf\)"),
])
def test_error_non_finite(tmp_path: Path, dtype, bad, what):
    tensors = random_tensors(CFG)
    key = "model.layers.1.mlp.gate_proj.weight"
    tensors[key][5, 7] = bad
    path = _write_raw(tmp_path, tensors, dtype=dtype)
    with pytest.raises(CheckpointError, match=key_re(path, key) + ": " + what):
        load_checkpoint(tmp_path)


def test_error_non_finite_norm_and_embeddings(tmp_path: Path):
    for key in ("model.embeddings.weight", "model.layers.0.attn.i_proj.norm.weight", "model.lower_bounds"):
        tensors = random_tensors(CFG)
        tensors[key].reshape(-1)[0] = np.nan
        root = tmp_path / key
        path = _write_raw(root, tensors)
        with pytest.raises(CheckpointError, match=key_re(path, key) + ": 1 non-finite"):
            load_checkpoint(root)


def test_error_f64_overflow(tmp_path: Path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    tensors = {k: v.astype(np.float64) for k, v in random_tensors(CFG).items()}
    tensors["model.norm.weight"][2] = 1e300
    save_checkpoint(tmp_path, CFG, random_tensors(CFG))
    path = tmp_path / WEIGHTS_NAME
    safetensors_numpy.save_file(tensors, str(path))
    what = key_re(path, "model.norm.weight") + r": 1 non-finite value\(s\) after conversion to float32"
    with pytest.raises(CheckpointError, match=what):
        load_checkpoint(tmp_path)


# ----------------------------------------------------------------------------- errors: file format
def test_error_truncated_data(tiny):
    root, _ = tiny
    path = root / WEIGHTS_NAME
    header, _ = header_of(path)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=key_re(path, last) + ".*run past the end.*truncated"):
        load_checkpoint(root)


def test_error_file_shrinks_while_reading(tiny):
    root, _ = tiny
    path = root / WEIGHTS_NAME
    st = SafetensorsFile(path)
    path.write_bytes(path.read_bytes()[:-10])
    key = max(st.tensors.values(), key=lambda t: t.end).name
    with pytest.raises(CheckpointError, match=key_re(path, key) + ": truncated tensor data"):
        st.read(key)
    st.close()


@pytest.mark.parametrize(("cut", "what"), [
    (0, r"truncated safetensors file: 0 bytes"),
    (5, r"truncated safetensors file: 5 bytes"),
    (100, r"truncated safetensors header: the length field says \d+ bytes but only 92 follow"),
])
def test_error_truncated_header(tiny, cut, what):
    root, _ = tiny
    path = root / WEIGHTS_NAME
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": " + what):
        load_checkpoint(root)


def test_error_header_length_absurd(tiny):
    root, _ = tiny
    path = root / WEIGHTS_NAME
    path.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + path.read_bytes()[8:])
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ".*not a safetensors file"):
        load_checkpoint(root)


@pytest.mark.parametrize("garbage", [b"{not json       ", b"\xff\xfe" + b" " * 14, b"[1, 2, 3]       "])
def test_error_header_not_json(tiny, garbage):
    root, _ = tiny
    path = root / WEIGHTS_NAME
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    path.write_bytes(struct.pack("<Q", len(garbage)) + garbage + data[8 + n:])
    what = ": safetensors header (is not valid JSON|must be a JSON object)"
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + what):
        load_checkpoint(root)


KEY = "model.layers.0.attn.o_proj.weight"


@pytest.mark.parametrize(("mutate", "what"), [
    (lambda e: e.update(dtype="I64"), r"unsupported dtype 'I64'"),
    (lambda e: e.update(dtype="F8_E4M3"), r"unsupported dtype 'F8_E4M3'"),
    (lambda e: e.update(dtype=16), r"no string 'dtype'"),
    (lambda e: e.update(shape=[12, 13]), r"span 288 bytes but BF16 shape \(12, 13\) needs 312"),
    (lambda e: e.update(shape=[12, -12]), r"'shape' must be a list of non-negative integers"),
    (lambda e: e.update(data_offsets=[10]), r"'data_offsets' must be \[begin, end\]"),
    (lambda e: e.update(data_offsets=[-2, 286]), r"'data_offsets' must be \[begin, end\]"),
    (lambda e: e.update(data_offsets=[10 ** 9, 10 ** 9 + 288]), r"run past the end of the data section"),
    (lambda e: e.clear(), r"no string 'dtype'"),
])
def test_error_bad_header_entry(tiny, mutate, what):
    root, _ = tiny
    path = root / WEIGHTS_NAME
    rewrite_header(path, lambda h: mutate(h[KEY]))
    with pytest.raises(CheckpointError, match=key_re(path, KEY) + ": .*" + what):
        load_checkpoint(root)


def test_error_integer_tensor_from_safetensors_library(tiny):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    root, _ = tiny
    path = root / "ints.safetensors"
    safetensors_numpy.save_file({"model.step": np.arange(3, dtype=np.int64)}, str(path))
    with pytest.raises(CheckpointError, match=key_re(path, "model.step") + ": unsupported dtype 'I64'"):
        SafetensorsFile(path)


def test_error_overlapping_tensors(tiny):
    root, _ = tiny
    path = root / WEIGHTS_NAME

    def overlap(h):
        b, _ = h["model.norm.weight"]["data_offsets"]
        h["lm_head.norm.weight"]["data_offsets"] = [b + 2, b + 26]

    rewrite_header(path, overlap)
    with pytest.raises(CheckpointError, match=key_re(path, "lm_head.norm.weight") + ".*overlap tensor "
                       + re.escape("'model.norm.weight'")):
        load_checkpoint(root)


def test_error_metadata_not_object(tiny):
    root, _ = tiny
    path = root / WEIGHTS_NAME
    rewrite_header(path, lambda h: h.update(__metadata__=["format", "pt"]))
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": safetensors '__metadata__'"):
        load_checkpoint(root)


# ---------------------------------------------------------------------------------- errors: shards
def test_error_missing_shard(sharded):
    root, _ = sharded
    index = json.loads((root / WEIGHTS_INDEX_NAME).read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (root / victim).unlink()
    first_key = next(k for k, v in index["weight_map"].items() if v == victim)
    with pytest.raises(CheckpointError, match=re.escape(str(root / WEIGHTS_INDEX_NAME))
                       + re.escape(f": shard file {victim!r} (holding tensor {first_key!r}) does not exist")):
        load_checkpoint(root)


def test_error_key_in_two_shards(tmp_path: Path):
    tensors = random_tensors(CFG)
    keys = list(tensors)
    a, b = keys[:10], keys[10:]
    root = tmp_path / "dup"
    save_checkpoint(root, CFG, tensors)  # config.json
    (root / WEIGHTS_NAME).unlink()
    write_safetensors(root / "s1.safetensors", {k: tensors[k] for k in [*a, "lm_head.weight"]})
    write_safetensors(root / "s2.safetensors", {k: tensors[k] for k in b})
    index = {"weight_map": {**dict.fromkeys(a, "s1.safetensors"), **dict.fromkeys(b, "s2.safetensors")}}
    (root / WEIGHTS_INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=key_re(root / "s2.safetensors", "lm_head.weight")
                       + " is also stored in s1.safetensors: a key must be in one shard only"):
        load_checkpoint(root)


@pytest.mark.parametrize("case", ["wrong_shard", "absent", "unlisted", "traversal", "not_json", "no_map"])
def test_error_index_inconsistent(sharded, case):
    root, _ = sharded
    ipath = root / WEIGHTS_INDEX_NAME
    index = json.loads(ipath.read_text())
    wm = index["weight_map"]
    shards = sorted(set(wm.values()), key=lambda s: -list(wm.values()).count(s))  # fullest first
    key = next(k for k, v in wm.items() if v == shards[0])
    if case == "wrong_shard":
        wm[key] = shards[1]
        what = key_re(ipath, key) + f" is mapped to shard '{shards[1]}' but is stored in {shards[0]}"
    elif case == "absent":  # the only key of a shard is remapped: that shard is never opened
        single = next(k for k, v in wm.items() if list(wm.values()).count(v) == 1)
        wm[single] = shards[0]
        what = key_re(ipath, single) + f" is mapped to shard '{shards[0]}', which does not hold it"
    elif case == "unlisted":
        del wm[key]
        what = re.escape(f"{root / shards[0]}: tensor(s) {key!r}") + ".* not listed in the weight_map"
    elif case == "traversal":
        wm[key] = "../" + shards[0]
        what = re.escape(str(ipath)) + re.escape(f": weight_map[{key!r}] must be a file name")
    elif case == "not_json":
        index = None
        what = re.escape(str(ipath)) + ": not valid JSON"
    else:
        index = {"metadata": {}}
        what = re.escape(str(ipath)) + ": needs a non-empty 'weight_map'"
    ipath.write_text("{oops" if index is None else json.dumps(index))
    with pytest.raises(CheckpointError, match=what):
        load_checkpoint(root)


def test_error_sharded_missing_key_names_index(sharded):
    root, _ = sharded
    ipath = root / WEIGHTS_INDEX_NAME
    # drop a whole shard (from the index and disk): its keys are missing, reported against the index
    index = json.loads(ipath.read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    gone = sorted(k for k, v in index["weight_map"].items() if v == victim)
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != victim}
    ipath.write_text(json.dumps(index))
    (root / victim).unlink()
    what = re.escape(str(ipath)) + ": missing .*" + re.escape(repr(gone[0]))
    with pytest.raises(CheckpointError, match=what):
        load_checkpoint(root)

