#!/usr/bin/env python3
"""Build the training corpus and BPE tokenizer of the shipped model.

Corpus: the reStructuredText sources of the Python 3.11 documentation as Debian packages them
(``python3.11-doc``, ``/usr/share/doc/python3.11/html/_sources/**/*.rst.txt``; PSF License
Version 2, an open licence). Documents are split into train and held-out sets by a hash of their path
(about 5 % held out), so the split is stable and independent of file order.

Tokenizer: byte-level BPE trained with Hugging Face ``tokenizers`` on the training split only, with the
special tokens ``<unk>`` = 0, ``<s>`` = 1 (BOS) and ``</s>`` = 2 (EOS), as the released checkpoints
number them.

Usage::

    python scripts/prepare_corpus.py            # fetch the .deb with apt-get download, write data/pydoc/
    python scripts/prepare_corpus.py --sources /usr/share/doc/python3.11/html/_sources

Outputs ``data/pydoc/train.txt`` (not committed: rebuilt by this script), ``data/pydoc/heldout.txt``
(committed), ``data/pydoc/manifest.json`` (which document went where) and ``--tokenizer-out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC_SEPARATOR = "\n\n"
HELDOUT_MODULUS = 20  # one document in twenty (by path hash) is held out


def fetch_sources(workdir: Path) -> Path:
    """Download and unpack ``python3.11-doc`` with apt; return its ``_sources`` folder."""
    subprocess.run(["apt-get", "download", "python3.11-doc"], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL)
    deb = next(workdir.glob("python3.11-doc_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(workdir / "x")], check=True)
    return workdir / "x/usr/share/doc/python3.11/html/_sources"


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % HELDOUT_MODULUS == 0


def build(sources: Path, out_dir: Path) -> dict:
    files = sorted(p for p in sources.rglob("*.rst.txt"))
    if not files:
        raise SystemExit(f"no *.rst.txt files under {sources}")
    train, held, manifest = [], [], {"train": [], "heldout": []}
    for p in files:
        rel = p.relative_to(sources).as_posix()
        text = p.read_text(encoding="utf-8").replace("\r\n", "\n").strip()
        if not text:
            continue
        (held if is_heldout(rel) else train).append(text)
        manifest["heldout" if is_heldout(rel) else "train"].append(rel)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train.txt").write_text(DOC_SEPARATOR.join(train) + "\n", encoding="utf-8")
    (out_dir / "heldout.txt").write_text(DOC_SEPARATOR.join(held) + "\n", encoding="utf-8")
    manifest["source"] = "Debian python3.11-doc, html/_sources/**/*.rst.txt (PSF License Version 2)"
    manifest["separator"] = DOC_SEPARATOR
    manifest["train_bytes"] = (out_dir / "train.txt").stat().st_size
    manifest["heldout_bytes"] = (out_dir / "heldout.txt").stat().st_size
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def train_tokenizer(train_txt: Path, out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(train_txt)], trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=Path,
                    help="an existing html/_sources folder (default: apt-get download)")
    ap.add_argument("--out", type=Path, default=ROOT / "data/pydoc")
    ap.add_argument("--tokenizer-out", type=Path, default=ROOT / "models/hgrn-bit-pydoc/tokenizer.json")
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        sources = args.sources or fetch_sources(Path(tmp))
        manifest = build(sources, args.out)
    train_tokenizer(args.out / "train.txt", args.tokenizer_out, args.vocab_size)
    print(f"train: {len(manifest['train'])} documents, {manifest['train_bytes']} bytes; "
          f"held-out: {len(manifest['heldout'])} documents, {manifest['heldout_bytes']} bytes; "
          f"tokenizer: {args.tokenizer_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
