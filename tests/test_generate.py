"""host.generate: streamed generation, incremental UTF-8 decoding, BOS/EOS handling, timing."""

from __future__ import annotations

import numpy as np
import pytest
from host_fakes import BOS, EOS, ScriptedDevice, ToyDevice, tiny_checkpoint, tiny_tokenizer, tiny_weights
from tokenizers import Tokenizer, decoders

from host.devices import DeviceError
from host.generate import IncrementalDecoder, encode_prompt, encode_text, generate, generate_text

MULTIBYTE = "naïve 龍 café → 🚀 ok 中文"


def _toy() -> ToyDevice:
    dev = ToyDevice()
    dev.load(tiny_checkpoint())
    return dev


def _scripted(text: str) -> tuple[ScriptedDevice, list[int]]:
    ids = tiny_tokenizer().encode(text, add_special_tokens=False).ids
    dev = ScriptedDevice(script=tuple(ids))
    dev.load(tiny_checkpoint())
    return dev, ids


def test_split_characters_exist_in_the_test_text():
    """The streaming tests below are only meaningful if some character is split across tokens."""
    tok = tiny_tokenizer()
    ids = tok.encode(MULTIBYTE, add_special_tokens=False).ids
    assert any("\ufffd" in tok.decode([t]) for t in ids)


def test_incremental_decoder_never_emits_broken_utf8():
    tok = tiny_tokenizer()
    ids = tok.encode(MULTIBYTE, add_special_tokens=False).ids
    dec = IncrementalDecoder(tok)
    pieces = [dec.push(t) for t in ids]
    pieces.append(dec.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == MULTIBYTE == dec.text
    assert sum(1 for p in pieces if p == "") > 0  # something was held back at a split character


def test_incremental_decoder_flushes_incomplete_tail():
    tok = tiny_tokenizer()
    ids = tok.encode("ab 龍", add_special_tokens=False).ids
    dec = IncrementalDecoder(tok)
    out = "".join(dec.push(t) for t in ids[:-1])  # stop inside the 3-byte character
    assert "\ufffd" not in out
    tail = dec.flush()
    assert (out + tail).endswith("\ufffd")


def test_incremental_decoder_keeps_space_with_stripping_decoder():
    """A SentencePiece-style decoder strips the leading space of a decode; the prompt prefix keeps it."""
    tok = Tokenizer.from_str(tiny_tokenizer().to_str())
    tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    prompt = tok.encode("def parse", add_special_tokens=False).ids
    gen = tok.encode(" text", add_special_tokens=False).ids
    assert tok.decode(gen) == "text"  # the trap
    dec = IncrementalDecoder(tok, prompt)
    assert "".join(dec.push(t) for t in gen) + dec.flush() == " text"


def test_streamed_pieces_join_to_text():
    dev, ids = _scripted(MULTIBYTE)
    gen = generate(dev, tiny_tokenizer(), "x", max_new_tokens=len(ids) + 5, temperature=0)
    pieces = list(gen)
    r = gen.result
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == r.text == MULTIBYTE
    assert r.token_ids == ids
    assert r.stop_reason == "eos"  # the script ends with EOS, which is not part of the output
    assert EOS not in r.token_ids


def test_eos_ignored_when_asked():
    dev, ids = _scripted("ab")
    r = generate_text(dev, tiny_tokenizer(), "x", max_new_tokens=len(ids) + 3, temperature=0,
                      stop_at_eos=False)
    assert r.token_ids == [*ids, EOS, EOS, EOS] and r.stop_reason == "length"
    assert r.text == "ab"  # special tokens are not decoded


def test_length_stop_and_step_count():
    dev = _toy()
    r = generate_text(dev, tiny_tokenizer(), "def ", max_new_tokens=7, temperature=1.0, seed=0,
                      stop_at_eos=False)
    assert r.n_tokens == 7 and r.stop_reason == "length"
    assert r.decode_steps == 6  # the last token is not run
    assert r.counters["step_calls"] == 6 and r.counters["prefill_calls"] == 1
    assert r.prefill_seconds >= 0 and r.decode_seconds >= 0 and r.total_seconds >= r.decode_seconds
    assert r.decode_tokens_per_s > 0
    assert r.text == tiny_tokenizer().decode(r.token_ids)


def test_seed_gives_identical_tokens():
    dev = _toy()
    kw = dict(max_new_tokens=20, temperature=0.9, top_k=30, top_p=0.95, repetition_penalty=1.1,
              stop_at_eos=False)
    a = generate_text(dev, tiny_tokenizer(), "import", seed=7, **kw)
    b = generate_text(dev, tiny_tokenizer(), "import", seed=7, **kw)  # the device is reset each time
    c = generate_text(dev, tiny_tokenizer(), "import", seed=8, **kw)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.token_ids != c.token_ids


def test_greedy_follows_device_argmax():
    dev = _toy()
    r = generate_text(dev, tiny_tokenizer(), "héllo", max_new_tokens=5, temperature=0, stop_at_eos=False)
    dev.reset()
    logits = dev.prefill(r.prompt_ids)
    expected = []
    for _ in range(5):
        expected.append(int(np.argmax(logits)))
        logits = dev.step(expected[-1])
    assert r.token_ids == expected


def test_prompt_gets_bos():
    tok = tiny_tokenizer()
    dev = _toy()
    r = generate_text(dev, tok, "def", max_new_tokens=0)
    assert r.prompt_ids == [BOS, *tok.encode("def", add_special_tokens=False).ids]
    assert r.token_ids == [] and r.text == ""
    r = generate_text(dev, tok, "def", max_new_tokens=0, bos_token_id=None)
    assert r.prompt_ids == tok.encode("def", add_special_tokens=False).ids
    assert encode_prompt(tok, "", BOS) == [BOS]
    with pytest.raises(ValueError, match="empty prompt"):
        encode_prompt(tok, "", None)


def test_empty_prompt_generates_from_bos():
    r = generate_text(_toy(), tiny_tokenizer(), "", max_new_tokens=3, seed=0, stop_at_eos=False)
    assert r.prompt_ids == [BOS] and r.n_tokens == 3


def test_arguments_validated_eagerly():
    dev = _toy()
    with pytest.raises(ValueError, match="temperature"):
        generate(dev, tiny_tokenizer(), "x", temperature=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(dev, tiny_tokenizer(), "x", max_new_tokens=-1)
    with pytest.raises(DeviceError):
        generate(ToyDevice(), tiny_tokenizer(), "x")
    small = ToyDevice()
    small.load(tiny_weights(vocab_size=10))
    with pytest.raises(ValueError, match="vocabulary size 10"):
        generate(small, tiny_tokenizer(), "def parse")


def test_early_stop_keeps_partial_result():
    dev = _toy()
    gen = generate(dev, tiny_tokenizer(), "def", max_new_tokens=50, temperature=1.0, seed=0,
                   stop_at_eos=False)
    next(gen)
    gen.close()
    assert gen.result.stop_reason == "unfinished"
    assert gen.result.n_tokens >= 1
    assert gen.result.text == tiny_tokenizer().decode(gen.result.token_ids)


def test_generation_on_reference_device():
    pytest.importorskip("host.reference", reason="host/reference.py (ReferenceModel) is not written yet")
    from host.devices import open_device

    with open_device("reference") as dev:
        dev.load(tiny_checkpoint())
        a = generate_text(dev, tiny_tokenizer(), "def parse(", max_new_tokens=8, seed=3, stop_at_eos=False)
        b = generate_text(dev, tiny_tokenizer(), "def parse(", max_new_tokens=8, seed=3, stop_at_eos=False)
    assert a.token_ids == b.token_ids and a.n_tokens == 8


def test_literal_control_tokens_in_text_are_text():
    """A ``<s>`` or ``</s>`` written in a prompt or an eval text is characters, never BOS or EOS."""
    tok = tiny_tokenizer()
    ids = encode_prompt(tok, "a <s> b </s> c", BOS)
    assert ids[0] == BOS and BOS not in ids[1:] and EOS not in ids
    assert tok.decode(ids[1:]) == "a <s> b </s> c"
    assert tok.encode_special_tokens is False   # the tokenizer is left as it was
    assert EOS not in encode_text(tok, "</s>") and tok.decode(encode_text(tok, "</s>")) == "</s>"


def test_prompt_with_invalid_utf8_is_a_value_error():
    with pytest.raises(ValueError, match="not valid UTF-8: 0xff at character 1"):
        encode_prompt(tiny_tokenizer(), "a\udcff", BOS)


def test_prefill_progress_reports_chunks_and_changes_nothing():
    dev = _toy()
    prompt = "def parse(text): return text.split() " * 12
    plain = generate_text(dev, tiny_tokenizer(), prompt, max_new_tokens=6, temperature=0.0)
    calls = []
    chunked = generate_text(dev, tiny_tokenizer(), prompt, max_new_tokens=6, temperature=0.0,
                            prefill_progress=lambda done, total: calls.append((done, total)))
    n = len(plain.prompt_ids)
    assert n > 64 and calls[-1] == (n, n) and len(calls) == -(-n // 32)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert chunked.token_ids == plain.token_ids
