"""host.evaluate: windows, float64 cross-entropy, perplexity and bits-per-byte arithmetic."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from host_fakes import BOS, FixedDistDevice, ToyDevice, UniformDevice, tiny_checkpoint, tiny_tokenizer
from rich.console import Console

from host.evaluate import cross_entropy, evaluate, evaluate_file, read_text_file, token_byte_lengths

TEXT = ("def parse(text):\n    return text.split()\n# naïve café → 🚀, 中文字符 和 日本語\n"
        "class Foo:\n    pass\n") * 3


def _load(dev):
    dev.load(tiny_checkpoint())
    return dev


def _ids(text: str = TEXT) -> list[int]:
    return tiny_tokenizer().encode(text, add_special_tokens=False).ids


def test_token_byte_lengths_cover_the_text_exactly():
    tok = tiny_tokenizer()
    lengths = token_byte_lengths(tok)
    assert lengths.shape == (tok.get_vocab_size(),)
    assert lengths[:3].tolist() == [0, 0, 0]  # special tokens
    ids = _ids()
    assert int(lengths[ids].sum()) == len(TEXT.encode("utf-8"))
    # a prefix ending on a character boundary covers exactly its decoded bytes
    for n in range(1, len(ids)):
        prefix = tok.decode(ids[:n])
        if not prefix.endswith("\ufffd"):
            assert int(lengths[ids[:n]].sum()) == len(prefix.encode("utf-8"))


def test_uniform_logits_give_log_v_per_token():
    dev = _load(UniformDevice())
    v = dev.vocab_size
    r = evaluate(dev, tiny_tokenizer(), TEXT, context=16)
    n = len(_ids())
    assert r.tokens == n
    assert r.bytes == len(TEXT.encode("utf-8"))
    assert r.nll == pytest.approx(n * math.log(v), rel=1e-12)
    assert r.perplexity == pytest.approx(v, rel=1e-9)
    assert r.bits_per_byte == pytest.approx(n * math.log2(v) / len(TEXT.encode("utf-8")), rel=1e-12)
    assert r.windows == math.ceil(n / 16) and r.context == 16
    d = r.to_dict()
    for key in ("nll", "tokens", "bytes", "perplexity", "bits_per_byte", "seconds"):
        assert key in d


def test_fixed_distribution_hand_checked():
    v = tiny_tokenizer().get_vocab_size()
    p = np.full(v, 0.5 / (v - 1))
    p[100] = 0.5
    dev = _load(FixedDistDevice(probs=tuple(p)))
    ids = _ids()
    r = evaluate(dev, tiny_tokenizer(), TEXT, context=7)
    expected = -sum(math.log(p[t]) for t in ids)
    assert r.nll == pytest.approx(expected, rel=1e-6)  # float32 logits of log p


def test_windows_start_from_bos_and_zero_state():
    dev = _load(UniformDevice())
    ids = _ids("def parse(text): return 1")
    assert len(ids) >= 7
    ids = ids[:7]
    r = evaluate(dev, tiny_tokenizer(), "def parse(text): return 1", context=3, max_tokens=7)
    assert dev.calls == [[BOS, ids[0], ids[1]], [BOS, ids[3], ids[4]], [BOS]]
    assert r.windows == 3 and r.tokens == 7
    assert dev.counters()["resets"] == 3


def test_max_tokens_scores_a_prefix_and_counts_its_bytes():
    tok = tiny_tokenizer()
    dev = _load(UniformDevice())
    ids = _ids()
    lengths = token_byte_lengths(tok)
    for n in (1, 10, 37, len(ids) - 1):
        r = evaluate(dev, tok, TEXT, context=8, max_tokens=n)
        assert r.tokens == n
        assert r.bytes == int(lengths[ids[:n]].sum())
    full = evaluate(dev, tok, TEXT, context=8, max_tokens=10**9)
    assert full.tokens == len(ids) and full.bytes == len(TEXT.encode("utf-8"))


def test_without_bos_first_token_of_each_window_is_context_only():
    dev = _load(UniformDevice())
    ids = _ids()[:10]
    r = evaluate(dev, tiny_tokenizer(), TEXT, context=4, max_tokens=10, bos_token_id=None)
    assert dev.calls == [ids[0:3], ids[4:7], ids[8:9]]
    assert r.tokens == 10 - 3
    lengths = token_byte_lengths(tiny_tokenizer())
    assert r.bytes == int(lengths[ids].sum() - lengths[[ids[0], ids[4], ids[8]]].sum())


def test_cross_entropy_float64_and_stable():
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((70, 50)) * 1e3).astype(np.float32)  # large logits: needs the max shift
    t = rng.integers(0, 50, size=70)
    x = z.astype(np.float64)
    expected = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1) - x[np.arange(70), t]
    got = cross_entropy(z, t)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-9)
    with pytest.raises(ValueError):
        cross_entropy(z, t[:-1])
    with pytest.raises(ValueError):
        cross_entropy(z, np.full(70, 50))


def test_invalid_arguments():
    dev = _load(UniformDevice())
    with pytest.raises(ValueError, match="context"):
        evaluate(dev, tiny_tokenizer(), TEXT, context=0)
    with pytest.raises(ValueError, match="context"):
        evaluate(dev, tiny_tokenizer(), TEXT, context=1, bos_token_id=None)
    with pytest.raises(ValueError, match="max_tokens"):
        evaluate(dev, tiny_tokenizer(), TEXT, max_tokens=0)
    with pytest.raises(ValueError, match="nothing to score"):
        evaluate(dev, tiny_tokenizer(), "")


def test_real_device_file_and_progress(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TEXT, encoding="utf-8")
    dev = _load(ToyDevice())
    buf = io.StringIO()
    r = evaluate_file(dev, tiny_tokenizer(), path, context=32, progress=True,
                      console=Console(file=buf, force_terminal=False))
    again = evaluate_file(dev, tiny_tokenizer(), path, context=32)
    assert r.nll == again.nll and np.isfinite(r.nll) and r.perplexity > 1
    assert r.seconds > 0 and r.tokens_per_s > 0


@pytest.mark.parametrize(("data", "where"), [
    (b"abc\xa5 def", "byte 0xa5 at byte offset 3 (line 1): invalid start byte"),
    ("caf\u00e9\nna\u00efve\n".encode() + b"x\xc3(", "byte 0xc3 at byte offset 14 (line 3): "
                                                      "invalid continuation byte"),
    (b"ok\n\xe4\xb8", "bytes 0xe4 0xb8 at byte offset 3 (line 2): unexpected end of data"),
])
def test_non_utf8_file_error_names_file_and_offset(tmp_path, data, where):
    path = tmp_path / "bad.txt"
    path.write_bytes(data)
    with pytest.raises(ValueError) as info:
        read_text_file(path)
    assert str(info.value) == f"{path} is not valid UTF-8: {where}"
    with pytest.raises(ValueError, match="bad.txt is not valid UTF-8"):
        evaluate_file(_load(UniformDevice()), tiny_tokenizer(), path)


def test_read_text_file_reads_like_open(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("\ufeffa\r\nb\rc\n\u4e2d\u6587 \U0001f680\r".encode())
    with open(path, encoding="utf-8") as f:
        expected = f.read()
    assert read_text_file(path) == expected == "\ufeffa\nb\nc\n\u4e2d\u6587 \U0001f680\n"


def test_reference_device_scores_like_stepping():
    pytest.importorskip("host.reference", reason="host/reference.py (ReferenceModel) is not written yet")
    from host.devices import open_device

    with open_device("reference") as dev:
        dev.load(tiny_checkpoint())
        ids = _ids()[:12]
        r = evaluate(dev, tiny_tokenizer(), TEXT, context=12, max_tokens=12)
        dev.reset()
        nll = 0.0
        logits = dev.step(BOS)
        for t in ids:
            nll += float(cross_entropy(logits[None], [t])[0])
            logits = dev.step(t)
    assert r.nll == pytest.approx(nll, rel=1e-5)
