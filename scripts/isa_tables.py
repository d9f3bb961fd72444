#!/usr/bin/env python3
"""Markdown tables of the instruction set, generated from ``hw/isa.py`` so ``docs/ISA.md`` stays in sync.

Field positions and widths come from the ``amaranth.lib.data`` layouts themselves, names and values from
the enums, meanings from the ``#:`` comments next to each field or member in ``hw/isa.py`` (a few fields
without a comment get theirs from :data:`FALLBACK`). ``tests/test_isa.py`` checks that
``docs/ISA.md`` contains the current output.

Usage::

    python scripts/isa_tables.py                    # print the tables
    python scripts/isa_tables.py --example          # print the worked example (the shipped model, layer 0)
    python scripts/isa_tables.py --write docs/ISA.md  # refresh both generated regions of the document
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from amaranth.lib import data  # noqa: E402

from hw import isa  # noqa: E402
from hw import numerics as nx  # noqa: E402

TABLES_BEGIN, TABLES_END = "<!-- BEGIN isa_tables.py -->", "<!-- END isa_tables.py -->"
EXAMPLE_BEGIN, EXAMPLE_END = "<!-- BEGIN isa_tables.py --example -->", "<!-- END isa_tables.py --example -->"
MODEL = ROOT / "models" / "hgrn-bit-pydoc"

#: Meanings of fields and members that carry no ``#:`` comment in hw/isa.py.
FALLBACK = {
    ("ImageHeader", "magic"): "`IMAGE_MAGIC` (ASCII `MMFI`)",
    ("ImageHeader", "version"): "`ISA_VERSION`",
    ("ImageHeader", "header_words"): "16 (words of this header)",
    ("ImageHeader", "packing"): "`TritPacking` of every weight section",
    ("ImageHeader", "channels"): "weight channels the rows are split over (1-16)",
    ("ImageHeader", "n_layers"): "layers",
    ("ImageHeader", "hidden"): "hidden size H",
    ("ImageHeader", "intermediate"): "intermediate size I",
    ("ImageHeader", "vocab"): "vocabulary V",
    ("ImageHeader", "n_instructions"): "instructions, END_TOKEN included",
    ("ImageHeader", "reserved"): "0",
    ("ImageHeader", "crc"): "CRC-32 of words 0-14",
    ("InstrHeader", "opcode"): "`Opcode`",
    ("InstrHeader", "flags"): "`InstrFlags`",
    ("InstrHeader", "layer"): "layer whose STATE_OLD / STATE_NEW the micro-ops address",
    ("InstrHeader", "n_ops"): "micro-ops in `ops` (0-8)",
    ("InstrHeader", "reserved0"): "0",
    ("InstrHeader", "ops"): "`MAX_OPS` micro-ops (`MicroOp`); slot j at bits 224 + 32 j; unused slots 0",
    ("InstrHeader", "cb_shift"): "(see cb_mant)",
    ("InstrHeader", "crc"): "CRC-32 of words 0-14",
    ("TokenHeader", "magic"): "`TOKEN_MAGIC` (ASCII `MMFT`)",
    ("OutputTrailer", "magic"): "`OUTPUT_MAGIC` (ASCII `MMFO`)",
    ("OutputTrailer", "position"): "the token packet's position, echoed",
    ("OutputTrailer", "scale_shift"): "(see scale_mant)",
    ("OutputTrailer", "crc"): "CRC-32 of the whole packet before this word",
    ("MicroOp", "op"): "`MicroOpcode`",
    ("MicroOp", "dst"): "destination register r0-r3",
    ("MicroOp", "a"): "first source register r0-r3",
    ("MicroOp", "b"): "second source register r0-r3",
    ("MicroOp", "buf"): "`Buffer` read or written",
    ("MicroOp", "shift"): "right shift of a product / fraction bits of a sigmoid input / of RSUB1's 1",
    ("MicroOp", "reserved"): "0",
    ("TritPacking", "BITS2"): "4 trits a byte, 2 bits each (`00` = 0, `01` = +1, `11` = -1; `10` invalid)",
    ("TritPacking", "BASE3"): "5 trits a byte, `byte = sum (t_i + 1) 3^i` (243-255 invalid): 1.6 bits a trit",
    ("MicroOpcode", "NOP"): "nothing",
    ("Buffer", "C1"): "constant vector C1",
    ("Buffer", "C2"): "constant vector C2",
    ("Buffer", "C3"): "constant vector C3",
    ("ErrorCause", "NONE"): "no error",
    ("RegisterMap", "ID_MAGIC"): "`ID_MAGIC` (ASCII `MMFA`)",
    ("RegisterMap", "ID_VERSION"): "`ISA_VERSION`",
    ("RegisterMap", "ID_LANES"): "ternary lanes (trits per cycle per channel)",
    ("RegisterMap", "ID_CHANNELS"): "weight channels",
    ("RegisterMap", "ID_BUS_BITS"): "`tdata` width of a weight channel",
    ("RegisterMap", "ID_MAX_HIDDEN"): "`MAX_HIDDEN` of this build",
    ("RegisterMap", "ID_MAX_INTERMEDIATE"): "`MAX_INTERMEDIATE` of this build",
    ("RegisterMap", "ID_MAX_LAYERS"): "`MAX_LAYERS` of this build",
    ("RegisterMap", "ID_MAX_VOCAB"): "`MAX_VOCAB` of this build",
    ("RegisterMap", "ID_ACC_BITS"): "`ACC_BITS`",
    ("RegisterMap", "SIZE"): "bytes of the map",
}

LAYOUTS = ("ImageHeader", "InstrHeader", "MicroOp", "TokenHeader", "OutputTrailer")
ENUMS = ("TritPacking", "Opcode", "InstrFlags", "MicroOpcode", "Buffer", "ErrorCause", "Counter")


def _comments(obj) -> dict[str, str]:
    """``name -> text`` of the ``#:`` comments in the class body of ``obj``."""
    out = {}
    for line in inspect.getsource(obj).splitlines():
        m = re.match(r"\s+(\w+)\s*[:=][^#]*#:\s*(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def _meaning(owner: str, name: str, comments: dict[str, str]) -> str:
    text = comments.get(name) or FALLBACK.get((owner, name), "")
    return text.replace("|", "\\|")


def _type(shape) -> str:
    if isinstance(shape, type):
        return f"`{shape.__name__}`"
    if isinstance(shape, data.ArrayLayout):
        return f"`{shape.elem_shape.__name__}[{shape.length}]`"
    return f"`{shape!r}`".replace("unsigned", "u").replace("signed", "s")


def _bits(lo: int, width: int) -> tuple[str, str]:
    hi = lo + width - 1
    w0, w1 = lo // 32, hi // 32
    word = f"{w0}" if w0 == w1 else f"{w0}-{w1}"
    within = f"[{hi % 32}:{lo % 32}]" if w0 == w1 else "all"
    return word, within


def layout_table(name: str) -> str:
    cls = getattr(isa, name)
    lay = data.Layout.cast(cls)
    com = _comments(cls)
    head = [f"**`{name}`**: {isa.layout_bytes(cls)} bytes" if lay.size % 32 == 0 else f"**`{name}`**",
            "", "| field | bits | word | bits in word | type | meaning |", "|---|---|---|---|---|---|"]
    for fname, f in lay:
        word, within = _bits(f.offset, f.width)
        head.append(f"| `{fname}` | [{f.offset + f.width - 1}:{f.offset}] | {word} | {within} | {_type(f.shape)} "
                    f"| {_meaning(name, fname, com)} |")
    return "\n".join(head)


def enum_table(name: str) -> str:
    cls = getattr(isa, name)
    com = _comments(cls)
    width = cls.as_shape().width
    rows = [f"**`{name}`** ({width} bits)", "", "| value | name | meaning |", "|---|---|---|"]
    for m in cls:
        rows.append(f"| {m.value} | `{m.name}` | {_meaning(name, m.name, com)} |")
    return "\n".join(rows)


def register_table() -> str:
    r = isa.REGISTER_MAP
    com = _comments(isa.RegisterMap)
    rows = ["**Register map** (`REGISTER_MAP`; offsets from `register_base(platform)`: "
            + ", ".join(f"{p} 0x{isa.register_base(p):02X}" for p in ("zynq", "ecp5", "sim", "alveo")) + ")",
            "", "| offset | register | meaning |", "|---|---|---|"]
    for name in r.__dataclass_fields__:
        rows.append(f"| 0x{getattr(r, name):02X} | `{name}` | {_meaning('RegisterMap', name, com)} |")
    rows += ["", "**Counters** (64 bits each, low word first, at `COUNTERS + 8 * index`)", "",
             "| offset | counter | meaning |", "|---|---|---|"]
    ccom = _comments(isa.Counter)
    for c in isa.Counter:
        rows.append(f"| 0x{r.counter(c):02X} | `{c.name}` | {_meaning('Counter', c.name, ccom)} |")
    return "\n".join(rows)


def constants_table() -> str:
    def ascii_(v: int) -> str:
        return v.to_bytes(4, "little").decode("ascii")

    rows = ["| constant | value | meaning |", "|---|---|---|"]
    for name, what in (("IMAGE_MAGIC", "image header"), ("TOKEN_MAGIC", "token packet"),
                       ("OUTPUT_MAGIC", "output packet"), ("ID_MAGIC", "register map ID block")):
        v = getattr(isa, name)
        rows.append(f"| `{name}` | 0x{v:08X} (`{ascii_(v)}`) | {what} |")
    items = [("ISA_VERSION", "image format version"),
             ("SECTION_BYTES", "every stream section is padded to a multiple of this"),
             ("MAX_HIDDEN", "largest hidden size"), ("MAX_INTERMEDIATE", "largest intermediate size"),
             ("MAX_LAYERS", "most layers"), ("MAX_VOCAB", "largest vocabulary"),
             ("MAX_K", "largest GEMV input"), ("MAX_N", "largest GEMV output"),
             ("MAX_OPS", "micro-ops per instruction"), ("MAX_CONSTS", "constant vectors C0.. per instruction"),
             ("ACC_BITS", "signed GEMV accumulator width, `acc_bits_for(MAX_K)`")]
    for name, what in items:
        if hasattr(isa, name):
            rows.append(f"| `{name}` | {getattr(isa, name)} | {what} |")
    for name, what in (("SSQ_SHIFT", "each square is shifted right by this before it is summed"),
                       ("GATE_FRAC", "fraction bits of sigmoid outputs (Q1.30), also `1 - lb`"),
                       ("LUT_SEGMENTS_LOG2", "sigmoid LUT: 2^n linear segments (default; image header)"),
                       ("LUT_RANGE_LOG2", "... over [-2^n, 2^n); end values outside")):
        rows.append(f"| `numerics.{name}` | {getattr(nx, name)} | {what} |")
    return "\n".join(rows)


#: The trits of the packing example (two rows of five, packed back to back).
EXAMPLE_TRITS = (1, -1, 0, 1, 1, -1, -1, 0, 0, 1)


def encodings() -> str:
    """Worked encodings: the packing example in both packings and a few micro-op words."""
    from host.image import MicroOpSpec

    t = EXAMPLE_TRITS
    rows = [f"Trits `{list(t)}` (K = 5, two rows, packed continuously):", "",
            "| packing | bytes | how |", "|---|---|---|"]
    b2 = isa.pack_trits(list(t), isa.TritPacking.BITS2)
    how2 = "; ".join(
        f"byte {j}: trits {list(t[4 * j:4 * j + 4])} -> codes (first in bits 1:0) `0b{b:08b}`"
        for j, b in enumerate(b2))
    rows.append(f"| `BITS2` | `{b2.hex(' ')}` | {how2} (a padding trit is `00`) |")
    b3 = isa.pack_trits(list(t), isa.TritPacking.BASE3)
    how3 = "; ".join(
        f"byte {j}: digits t+1 = {[v + 1 for v in t[5 * j:5 * j + 5]]} -> "
        + " + ".join(f"{v + 1}*{3 ** i}" for i, v in enumerate(t[5 * j:5 * j + 5])) + f" = {b}"
        for j, b in enumerate(b3))
    rows.append(f"| `BASE3` | `{b3.hex(' ')}` | {how3} |")
    M, B = isa.MicroOpcode, isa.Buffer
    ops = [MicroOpSpec(M.SIGNEG, dst=1, a=0, shift=27), MicroOpSpec(M.MULV, dst=3, a=1, buf=B.A, shift=30),
           MicroOpSpec(M.ADD, dst=1, a=1, b=3), MicroOpSpec(M.ST, a=1, buf=B.STATE_NEW),
           MicroOpSpec(M.SSQ, a=0, buf=B.C0, shift=29, reg=0)]
    rows += ["", "| micro-op | fields | 32-bit word |", "|---|---|---|"]
    for op in ops:
        f = op.fields()
        word = int.from_bytes(isa.pack(isa.MicroOp, f), "little")
        desc = ", ".join(f"{k}={v.name if hasattr(v, 'name') else v}" for k, v in f.items())
        rows.append(f"| `{op}` | {desc} | `0x{word:08X}` |")
    return "\n".join(rows)


def tables() -> str:
    """Every generated table, in document order."""
    parts = ["#### Constants", constants_table(), "#### Layouts"]
    parts += [layout_table(n) for n in LAYOUTS]
    parts += ["#### Enumerations"] + [enum_table(n) for n in ENUMS]
    parts += ["#### Worked encodings", encodings()]
    parts += ["#### Registers", register_table()]
    return "\n\n".join(parts) + "\n"


def example(model: Path = MODEL) -> str:
    """The worked example: the shipped model's formats and the listing of LOAD_TOKEN + layer 0."""
    from host.checkpoint import load_checkpoint
    from host.compiler import CompileOptions, calibrate, compile_program
    from host.image import assemble, disassemble, parse_image

    w = load_checkpoint(model).weights
    cfg = w.config
    fm = calibrate(w)
    opts = CompileOptions(formats=fm)
    prog = compile_program(w, opts)
    raw = assemble(prog, packing=opts.packing, channels=opts.channels, n_layers=cfg.num_hidden_layers,
                   hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
                   residual_frac=fm.residual, state_frac=fm.state, gate_frac=nx.GATE_FRAC,
                   lut_segments_log2=opts.lut_segments_log2)
    img = parse_image(raw)
    listing = disassemble(img, names=[i.name for i in prog]).splitlines()
    # the two header lines, then instructions 0..7 (LOAD_TOKEN and layer 0's seven GEMVs)
    starts = [j for j, line in enumerate(listing) if re.match(r"\s*\d+: ", line)]
    keep = listing[:starts[8]]
    lf = fm.layers[0]
    ins = img.instructions
    rows = ["| symbol | value | what |", "|---|---|---|",
            f"| Q.X | Q.{fm.residual} | residual stream X (token packets, o_proj / down_proj outputs) |",
            f"| Q.S | Q.{fm.state} | recurrent state h |",
            f"| Q.G | Q.{nx.GATE_FRAC} | sigmoid outputs, 1 - lb, 1 - f, f |",
            f"| Q.i | Q.{lf.i} | i_proj output and SiLU(i) (buffer A) |",
            f"| Q.f | Q.{lf.f} | f_proj output (sigmoid input) |",
            f"| Q.g | Q.{lf.g} | g_proj output |",
            f"| Q.p | Q.{lf.p} | p = g γ_g SiLU(h), o_proj input (buffer P) |",
            f"| Q.gate | Q.{lf.gate} | gate_proj outputs and SiLU(a) (buffer A) |",
            f"| Q.m | Q.{lf.m} | GLU product m (buffer P) |"]
    consts = ["| instruction | QC | C0.. |", "|---|---|---|"]
    for j in range(8):
        qc = f"{len(ins[j].qconst)} words, Q.{ins[j].q_shift}" if ins[j].qconst is not None else "-"
        cs = ", ".join(f"C{c}: {len(v)} words" for c, v in enumerate(ins[j].consts)) or "-"
        consts.append(f"| {j} `{prog[j].name}` | {qc} | {cs} |")
    return ("Formats chosen by `host.compiler.calibrate` for this model (layer 0):\n\n" + "\n".join(rows)
            + "\n\nConstants carried by each instruction:\n\n" + "\n".join(consts)
            + "\n\n```\n" + "\n".join(keep) + "\n```\n")


def _replace(text: str, begin: str, end: str, body: str) -> str:
    a, b = text.index(begin) + len(begin), text.index(end)
    return text[:a] + "\n" + body + text[b:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", action="store_true", help="print the worked example instead of the tables")
    ap.add_argument("--write", type=Path, help="refresh the generated regions of this Markdown file")
    args = ap.parse_args(argv)
    if args.write:
        text = args.write.read_text()
        text = _replace(text, TABLES_BEGIN, TABLES_END, tables())
        text = _replace(text, EXAMPLE_BEGIN, EXAMPLE_END, example())
        args.write.write_text(text)
        return 0
    sys.stdout.write(example() if args.example else tables())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
