"""The ``mmfree`` command: generate text, score a text file, describe a checkpoint, drive an ECP5 DRAM board.

::

    mmfree generate --prompt "def parse(" --max-new-tokens 64 --seed 0
    mmfree eval --text data/pydoc/heldout.txt --context 512 --json eval.json
    mmfree info --model ~/models/MMfreeLM-370M
    mmfree board info                      # an ECP5 board on $MMFREE_ECP5_PORT: registers, core ID block
    mmfree board load --image m.mmf        # the bundle into the board's DRAM, once
    mmfree board level --csr csr.json      # a DDR3 board: read leveling over the link, then the DRAM port enabled

``--model`` defaults to the shipped model (:data:`DEFAULT_MODEL`), ``--device`` to
:data:`host.devices.DEFAULT_DEVICE`. Errors the user can fix (a missing file, a bad argument, a
checkpoint or device problem) print one line, ``mmfree: error: ...``, on stderr and exit with status 2;
Ctrl-C exits with status 130.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from host.devices import DEFAULT_DEVICE, DEVICES, PLANNED_DEVICES, DeviceError, open_device
from host.extras import MissingExtra

__all__ = ["DEFAULT_MODEL", "build_parser", "main"]

#: The shipped small model (``models/hgrn-bit-pydoc`` at the repository root).
DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "models" / "hgrn-bit-pydoc"

PROG = "mmfree"

# Generation defaults of the CLI (the library functions default to plain sampling).
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 50
DEFAULT_TOP_P = 0.95
DEFAULT_REPETITION_PENALTY = 1.1
DEFAULT_SEED = 0


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _load_checkpoint(path: Path) -> Any:
    """``host.checkpoint.load_checkpoint(path)`` with a clear error for a missing directory."""
    if not path.exists():
        if path == DEFAULT_MODEL:
            raise FileNotFoundError(f"the shipped model is missing: {path} does not exist; "
                                    "pass --model DIR (an HGRN-Bit checkpoint directory)")
        raise FileNotFoundError(f"model directory not found: {path}")
    if not path.is_dir():
        raise NotADirectoryError(f"--model must be a checkpoint directory, got the file {path}")
    from host.checkpoint import load_checkpoint  # the loader is only needed once a model is used

    return load_checkpoint(path, progress=_stderr_is_tty())


def _load_model(args: argparse.Namespace) -> Any:
    """What ``--image FILE.mmf`` (a compiled bundle, :mod:`host.bundle`) or else ``--model DIR`` names: a
    :class:`host.bundle.Bundle` or a checkpoint, either of which ``Device.load`` takes."""
    image = getattr(args, "image", None)
    if image is None:
        return _load_checkpoint(args.model)
    from host.bundle import read_bundle

    return read_bundle(image)


def _tokenizer_of(checkpoint: Any) -> Any:
    tokenizer = getattr(checkpoint, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(f"model {getattr(checkpoint, 'path', '?')} has no tokenizer (tokenizer.json in a "
                         "checkpoint, or in the bundle it was compiled from; needed to turn text into tokens)")
    return tokenizer


def _check_file(path: Path, what: str) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{what} not found: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{what} is a directory: {path}")


def _check_writable(path: Path, what: str) -> None:
    """Fail now, before any work, if ``path`` cannot be written later (its directory is not created)."""
    if path.is_dir():
        raise IsADirectoryError(f"{what} is a directory: {path}")
    parent = path.parent
    if not parent.is_dir():
        problem = "is not a directory" if parent.exists() else "does not exist"
        raise FileNotFoundError(f"cannot write {what} {path}: the directory {parent} {problem}")
    existed = path.exists()
    try:  # a real probe: permissions, read-only file systems and root's rights all answer truthfully
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise OSError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _fmt_rate(rate: float) -> str:
    return "-" if math.isnan(rate) else f"{rate:.1f}"


# ---------------------------------------------------------------------- subcommands

def _cmd_generate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.text import Text

    from host.generate import encode_prompt, generate
    from host.sampling import validate_sampling

    # Everything checkable without the model first: a typo should not cost a checkpoint load.
    validate_sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                      repetition_penalty=args.repetition_penalty, cli=True)
    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.seed is not None and args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    with open_device(args.device, **_device_options(args.option)) as device:
        checkpoint = _load_model(args)
        tokenizer = _tokenizer_of(checkpoint)
        device.load(checkpoint)
        n_prompt = len(encode_prompt(tokenizer, args.prompt, device.config.bos_token_id))
        _warn_context(device.config, n_prompt, args.max_new_tokens)
        with _prefill_bar(n_prompt, device.name) as bar:
            stream = generate(device, tokenizer, args.prompt, max_new_tokens=args.max_new_tokens,
                              temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              repetition_penalty=args.repetition_penalty, seed=args.seed,
                              stop_at_eos=not args.ignore_eos, prefill_progress=bar)
            first = next(stream, None)   # the prefill runs here, under its progress bar
        out = Console(file=sys.stdout, highlight=False, soft_wrap=True, emoji=False, markup=False)
        out.print(Text(args.prompt, style="dim"), end="")
        if first is not None:
            out.print(Text(first), end="")
        for piece in stream:
            out.print(Text(piece), end="")
        out.print()
        r = stream.result
        print(f"[{_plural(r.n_tokens, 'token')}, {_fmt_rate(r.decode_tokens_per_s)} tokens/s, "
              f"prefill {_plural(len(r.prompt_ids), 'token')} in {r.prefill_seconds:.3f} s, "
              f"stop {r.stop_reason}, device {device.name}]", file=sys.stderr)
        _print_cycles(device)
    return 0


#: Prompts longer than this many tokens show a prefill progress bar (on a terminal).
PREFILL_BAR_TOKENS = 64


@contextlib.contextmanager
def _prefill_bar(n_tokens: int, device: str):
    """A transient rich progress bar on stderr for a long prefill; yields the ``(done, total)`` callback
    (None for short prompts or when stderr is not a terminal)."""
    if n_tokens <= PREFILL_BAR_TOKENS or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(f"prefill on {device}"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                  TimeRemainingColumn(), transient=True, console=None) as progress:
        task = progress.add_task("prefill", total=n_tokens)
        yield lambda done, total: progress.update(task, completed=done, total=total)


def _warn_context(config: Any, n_prompt: int, n_new: int) -> None:
    """Warn (stderr) when a sequence (``n_prompt`` tokens then ``n_new``; an eval window is ``n_prompt``)
    runs past the context the model was trained on (``max_position_embeddings`` of its config.json):
    HGRN-Bit has no positions, so it runs, but the model never saw such lengths."""
    limit = getattr(config, "extra", {}).get("max_position_embeddings")
    if isinstance(limit, int) and n_prompt + n_new > limit:
        print(f"mmfree: warning: {n_prompt} + {n_new} tokens exceed the model's "
              f"max_position_embeddings ({limit}), the context it was trained on; it runs (no positions), "
              f"but quality past that length is untested", file=sys.stderr)


def _print_cycles(device: Any) -> None:
    """One stderr line of cycles per token when the device counts them (``hw_cycles``): the golden device's
    come from its cycle model; a device with ``cycles_report()`` (rtl) measures them, and the line adds
    the cycle model's prediction and the stream roofline."""
    counters = device.counters()
    tokens = counters.get("hw_tokens", 0)
    if "hw_cycles" not in counters or not tokens:
        return
    report = getattr(device, "cycles_report", None)
    rep = report() if callable(report) else None
    if rep is None:
        print(f"[{counters['hw_cycles'] / tokens:,.0f} cycles/token (cycle model), device {device.name}]",
              file=sys.stderr)
        return
    model = ("" if rep["predicted"] is None else
             f", cycle model {rep['predicted']:,} ({rep['measured'] / rep['predicted'] - 1:+.2%})")
    print(f"[{rep['measured']:,.0f} cycles/token (hardware counters){model}, roofline {rep['ideal']:,.0f} "
          f"(stream efficiency {rep['stream_efficiency']:.1%}), device {device.name}]", file=sys.stderr)


def _cmd_eval(args: argparse.Namespace) -> int:
    from host.evaluate import evaluate, read_text_file

    # Everything checkable without the model first: a bad file should not cost a checkpoint load or a run.
    _check_file(args.text, "text file")
    if args.context < 1:
        raise ValueError(f"--context must be >= 1, got {args.context}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.json is not None:
        _check_writable(args.json, "--json")
    text = read_text_file(args.text)
    with open_device(args.device, **_device_options(args.option)) as device:
        checkpoint = _load_model(args)
        tokenizer = _tokenizer_of(checkpoint)
        device.load(checkpoint)
        _warn_context(device.config, args.context, 0)
        result = evaluate(device, tokenizer, text, context=args.context, max_tokens=args.max_tokens,
                          progress=args.progress if args.progress is not None else _stderr_is_tty())
        counters = device.counters()
    print(f"perplexity     {result.perplexity:.4f}")
    print(f"bits per byte  {result.bits_per_byte:.4f}")
    print(f"tokens         {result.tokens}")
    print(f"bytes          {result.bytes}")
    print(f"seconds        {result.seconds:.2f}  ({_fmt_rate(result.tokens_per_s)} tokens/s, "
          f"{_plural(result.windows, 'window')} of {result.context}, device {args.device})")
    if args.json is not None:
        report = {"model": str(args.image or args.model), "text": str(args.text), "device": args.device,
                  "max_tokens": args.max_tokens, **result.to_dict(), "counters": counters}
        args.json.write_text(json.dumps(report, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    checkpoint = _load_checkpoint(args.model)
    cfg = checkpoint.config
    tokenizer = getattr(checkpoint, "tokenizer", None)
    rows: list[tuple[str, str]] = [
        ("model", str(getattr(checkpoint, "path", args.model))),
        ("dtype", str(getattr(checkpoint, "dtype", "?"))),
    ]
    for key, value in cfg.to_dict().items():
        rows.append((key, str(value)))
    n_trits = cfg.n_trits
    rows += [
        ("parameters", f"{cfg.n_params:,} ({cfg.n_params / 1e6:.1f} M)"),
        ("trits per token", f"{n_trits:,} ({n_trits / 1e6:.1f} M)"),
        ("weights per token", f"{_fmt_bytes(n_trits * 1.6 / 8)} at 1.6 bit/trit, "
                              f"{_fmt_bytes(n_trits * 2 / 8)} at 2 bit/trit"),
        ("tokenizer vocab", "none (no tokenizer.json)" if tokenizer is None
         else str(tokenizer.get_vocab_size(with_added_tokens=True))),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def _cmd_compile(args: argparse.Namespace) -> int:
    from host.bundle import BUNDLE_SUFFIX, write_bundle
    from host.compiler import CompileOptions, compile_model, compile_program
    from host.image import disassemble, parse_image
    from hw.isa import TritPacking

    if args.out is not None:
        _check_writable(args.out, "--out")
    checkpoint = _load_checkpoint(args.model)
    options = CompileOptions(packing=TritPacking[args.packing.upper()], channels=args.channels,
                             output_gate=args.output_gate)
    image = compile_model(checkpoint.weights, options)
    if args.out is not None and args.out.suffix == BUNDLE_SUFFIX:
        tok = checkpoint.tokenizer
        write_bundle(args.out, image, config=checkpoint.config, embeddings=checkpoint.weights.embeddings,
                     tokenizer_json=tok.to_str() if tok is not None else None,
                     compile_options={"packing": options.packing.name.lower(), "channels": options.channels,
                                      "output_gate": options.output_gate,
                                      "lut_segments_log2": options.lut_segments_log2})
    elif args.out is not None:
        tmp = args.out.with_name(args.out.name + ".partial")
        try:
            tmp.write_bytes(image)
            tmp.replace(args.out)
        finally:
            tmp.unlink(missing_ok=True)
    parsed = parse_image(image)
    info = parsed.info
    if args.listing:
        names = [ins.name for ins in compile_program(checkpoint.weights, options)]
        print(disassemble(parsed, names=names))
    cfg = checkpoint.config
    print(f"image {_fmt_bytes(len(image))} ({len(image):,} bytes), {info.n_instructions} instructions, "
          f"{info.packing.name}, {info.channels} channel(s), {cfg.n_trits / len(image):.2f} trits/byte overall"
          + (f" -> {args.out}" if args.out is not None else ""), file=sys.stderr)
    return 0


def _version() -> str:
    """The installed distribution's version (``mmfree-fpga``), or ``unknown`` when run from a bare checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mmfree-fpga")
    except PackageNotFoundError:
        return "unknown"


def _device_options(pairs: list[str] | None) -> dict:
    """``KEY=VALUE`` pairs of ``--option`` as keyword options of the device (ints, floats, bools parsed)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--option must be KEY=VALUE with a Python identifier as KEY, got {pair!r}")
        v: Any = value
        for conv in (int, float):
            try:
                v = conv(value)
                break
            except ValueError:
                continue
        if value.lower() in ("true", "false"):
            v = value.lower() == "true"
        out[key] = v
    return out


def _default_board(device: str, options: dict, default: str) -> str:
    """The ``--board`` of ``bench`` and ``power`` when none is given: on the ``ecp5`` device the board it talks to
    (``--option board=``, else ``$MMFREE_ECP5_BOARD``, else :data:`host.devices.ecp5.DEFAULT_BOARD`), so the
    roofline, rails and serial port are one board's; on other devices ``default``."""
    if device != "ecp5":
        return default
    from host.devices.ecp5 import DEFAULT_BOARD as ECP5_DEFAULT_BOARD

    return str(options.get("board") or os.environ.get("MMFREE_ECP5_BOARD") or ECP5_DEFAULT_BOARD)


def _board_options(device: str, board: str, options: dict, image: Path | None = None) -> dict:
    """Device options of ``bench`` and ``power``: the golden device models ``board``'s design point
    (:attr:`hw.boards.facts.BoardFacts.design`: lanes, channels, bus width, quantize lanes, clock) unless
    ``--option`` sets a parameter; the ``ecp5`` device is told the board (``board=``: its serial port, link rate
    and DRAM facts) unless ``--option board=`` names one; other devices report their own build.

    Raises
    ------
    ValueError
        The bundle ``image`` (``--image``) is compiled for another channel count than the design point's (that
        board could not run it) and ``--option channels`` does not choose one.
    """
    from hw.boards.facts import BOARDS

    if device == "ecp5" and board in BOARDS and BOARDS[board].family == "ecp5":
        return {"board": board, **options}
    if device != "golden" or board not in BOARDS:
        return options
    out = {**BOARDS[board].design.device_kwargs(), **options}
    if image is not None and "channels" not in options:
        from host.bundle import read_bundle
        from hw import isa

        have = isa.unpack(isa.ImageHeader, read_bundle(image).image).channels
        if have != out["channels"]:
            raise ValueError(f"board {board}'s design point has {out['channels']} weight channel(s), {image} is "
                             f"compiled for {have}: compile it for the board (mmfree compile --channels "
                             f"{out['channels']} --out FILE.mmf), or model {have} (--option channels={have})")
    return out


def _cmd_selftest(args: argparse.Namespace) -> int:
    from host.selftest import selftest

    if args.device == "reference":
        raise ValueError("selftest compares an accelerator bit for bit with the golden device; 'reference' is the "
                         "float32 model of the paper, not bit-exact by design (docs/NUMERICS.md): compare it with "
                         "`mmfree eval` instead")
    ids = None
    if args.token_ids:
        try:
            ids = [int(x) for x in args.token_ids.split(",")]
        except ValueError:
            raise ValueError(f"--token-ids must be comma-separated integers, got {args.token_ids!r}") from None
    options = _device_options(args.option)
    with open_device(args.device, **options) as device:
        checkpoint = _load_model(args)
        res = selftest(device, checkpoint, tokens=ids)
    for d in res.details:
        print(f"token {d['position']} (id {d['token']}): {'bit-exact' if d['bit_exact'] else 'DIFFERENT'}, "
              f"greedy {d['argmax']} (golden {d['golden_argmax']})"
              + (", output packet compared" if d.get("packet_compared") else ""))
    for line in res.mismatches:
        print(f"  mismatch: {line}")
    print(f"selftest {'PASS' if res.passed else 'FAIL'}: device {res.device} against golden, "
          f"{_plural(len(res.tokens), 'token')} from a reset")
    return 0 if res.passed else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    from host.selftest import bench

    if args.json is not None:
        _check_writable(args.json, "--json")
    if args.fmax_mhz is not None and not args.fmax_mhz > 0:
        raise ValueError(f"--fmax-mhz must be positive, not {args.fmax_mhz}")
    if args.tokens < 1:
        raise ValueError(f"--tokens must be >= 1, got {args.tokens}")
    options = _device_options(args.option)
    if args.board is None:
        from hw.boards.facts import DEFAULT_BOARD

        args.board = _default_board(args.device, options, DEFAULT_BOARD)
    options = _board_options(args.device, args.board, options, args.image)
    with open_device(args.device, **options) as device:
        checkpoint = _load_model(args)
        rep = bench(device, checkpoint, tokens=args.tokens, board=args.board, fmax_mhz=args.fmax_mhz)
    rep["model"] = str(args.image or args.model)
    rep["device_options"] = options
    rep["command"] = " ".join(["mmfree", *getattr(args, "argv", [])])
    text = json.dumps(rep, indent=2, sort_keys=True, default=str)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(text)
    return 0


def _cmd_board(args: argparse.Namespace) -> int:
    """``mmfree board info|status|load|memtest|level``: an ECP5 board over its serial port (host/devices/ecp5.py)."""
    from host.devices.ecp5 import Ecp5Device

    if args.timeout is not None and not args.timeout > 0:
        raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.baud is not None and args.baud <= 0:
        raise ValueError(f"--baud must be a positive rate in bits/s, got {args.baud}")
    image = getattr(args, "image", None)
    if image is not None:
        _check_file(image, "bundle")
    if args.board_command == "memtest" and (args.bytes <= 0 or args.bytes % 8):
        raise ValueError(f"--bytes must be a positive multiple of 8, got {args.bytes}")
    regs = None
    if args.board_command == "level":
        # the CSR map is read before the board is opened: a missing or malformed map fails without touching it
        from host.leveling import load_csr_map

        csr = args.csr if args.csr is not None else os.environ.get("MMFREE_ECP5_CSR") or None
        if not csr:
            raise ValueError("mmfree board level needs the CSR map of the bitstream's LiteDRAM core: --csr FILE "
                             "(the bitstream's report.json, which carries it as litedram.csr_registers, or the "
                             "generated core's csr.json) or MMFREE_ECP5_CSR")
        _check_file(Path(csr), "CSR map")
        regs = load_csr_map(csr)
    progress = args.progress if args.progress is not None else _stderr_is_tty()
    with Ecp5Device(port=args.port, baud=args.baud, board=args.board, timeout=args.timeout,
                    reload=getattr(args, "force", False), progress=progress) as dev:
        dev.connect()
        if args.board_command == "level":
            return _board_level(dev, regs)
        return {"info": _board_info, "status": _board_status, "load": _board_load,
                "memtest": _board_memtest}[args.board_command](dev, args)


def _rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _flags(value: int, cls: Any) -> str:
    return "|".join(f.name for f in cls if f.value and value & f.value) or "none"


def _board_info(dev: Any, args: argparse.Namespace) -> int:
    from hw.boards.link_protocol import BoardReg, BoardStatus
    from hw.isa import TritPacking

    rows = [("port", f"{dev.port_name} at {dev.baud:,} baud")]
    if dev.mode == "dram":
        regs = dev.transport.read_board()
        magic = regs[BoardReg.MAGIC]
        rows += [("link", f"version {regs[BoardReg.LINK_VERSION]} (DRAM board: the model loads once, tokens go by "
                          f"id), magic 0x{magic:08x} ({magic.to_bytes(4, 'little').decode('ascii', 'replace')})"),
                 ("DRAM", f"{regs[BoardReg.DRAM_BYTES]:,} bytes ({regs[BoardReg.DRAM_BYTES] / 2**20:g} MiB)"),
                 ("clock", f"{regs[BoardReg.CLOCK_HZ] / 1e6:.3f} MHz"),
                 ("status", _flags(regs[BoardReg.STATUS], BoardStatus))]
    else:
        rows.append(("link", "version 1 (stream-only: no board registers, no DRAM; the image is streamed every "
                             "token)"))
    ident = dev.ident
    packings = [p.name for p in TritPacking if ident.packings >> p.value & 1]
    rows += [("core", f"ID magic 0x{ident.magic:08x}, ISA version {ident.version}"),
             ("core build", f"{ident.lanes} lanes, {ident.channels} channel(s) of {ident.bus_bits} bits, "
                            f"{ident.quant_lanes} quantize lanes, {ident.acc_bits}-bit accumulators, packings "
                            f"{', '.join(packings) or 'none'}"),
             ("core capacities", f"hidden {ident.max_hidden}, intermediate {ident.max_intermediate}, layers "
                                 f"{ident.max_layers}, vocab {ident.max_vocab}")]
    _rows(rows)
    return 0


def _board_status(dev: Any, args: argparse.Namespace) -> int:
    from host.devices.ecp5 import dram_contents
    from hw.boards.link_protocol import BoardReg, BoardStatus

    regs = dev.transport.read_board()      # DeviceError on a stream-only board
    status = regs[BoardReg.STATUS]
    valid = bool(status & BoardStatus.IMAGE_VALID)
    hidden, vocab = regs[BoardReg.EMBED_HIDDEN], regs[BoardReg.EMBED_VOCAB]
    end = regs[BoardReg.EMBED_BASE] + 4 * hidden * vocab
    rows = [("image", "valid (IMAGE_VALID)" if valid else "none valid (IMAGE_VALID clear: `mmfree board load`)"),
            ("checksum", f"0x{regs[BoardReg.IMAGE_CHECKSUM]:08x} (the identifier of the bundle it holds)"),
            ("layout", f"image {regs[BoardReg.IMAGE_BYTES]:,} bytes at 0x{regs[BoardReg.IMAGE_BASE]:x}, embedding "
                       f"table {vocab} x {hidden} int32 at 0x{regs[BoardReg.EMBED_BASE]:x}, {end:,} bytes in all")]
    held = None
    if args.image is not None:
        from host.bundle import read_bundle

        bundle = read_bundle(args.image)
        layout, _ = dram_contents(bundle.image, bundle.embeddings)
        held = dev.transport.holds(layout) and dev.link.dram_crc(0, layout.total_bytes) == layout.checksum
        rows.append(("bundle", f"{args.image}: identifier 0x{layout.checksum:08x}, "
                               + ("held by the board (registers and DRAM CRC match)" if held else
                                  "not held by the board (`mmfree board load --image " f"{args.image}`)")))
    errors = status & (BoardStatus.READER_ERROR | BoardStatus.WRITER_ERROR | BoardStatus.RX_OVERFLOW)
    if BoardReg.PORT_ENABLE not in regs:
        port = "enabled (link version 2: the port is never held; no read leveling)"
    elif status & BoardStatus.PORT_ENABLED:
        port = "enabled" + (" (read leveling has run)" if status & BoardStatus.PORT_HELD else
                            " (this DRAM needs no read leveling)")
    else:
        port = "held until read leveling has run (`mmfree board level --csr CSR.json`): no load, memtest or token"
    rows += [("DRAM port", port),
             ("link", f"{regs[BoardReg.LINK_TIMEOUTS]} commands timed out, {regs[BoardReg.LINK_FRAMING]} bytes "
                      f"with framing errors, {regs[BoardReg.TOKENS]} tokens since configuration"),
             ("errors", _flags(errors, BoardStatus))]
    _rows(rows)
    return 0 if held is None or held else 1


def _board_load(dev: Any, args: argparse.Namespace) -> int:
    dev.transport.require_dram("load a bundle into DRAM")
    dev.load_image(args.image)
    r = dev.last_load
    lay = r.layout
    what = (f"{lay.total_bytes:,} bytes (image {lay.image_bytes:,}, embedding table {lay.vocab} x {lay.hidden} "
            f"int32 at 0x{lay.embed_base:x}), identifier 0x{lay.checksum:08x}")
    if r.skipped:
        print(f"skipped: the board already holds {args.image}: {what}; CRC verified in {r.seconds:.2f} s "
              f"(--force rewrites it)")
    else:
        rest = ", the others already matched" if r.blocks_written < r.blocks_total else ""
        print(f"loaded {args.image}: {what}; {r.blocks_written} of {r.blocks_total} blocks of 64 KiB written "
              f"({r.bytes_written:,} bytes{rest}) in {r.seconds:.1f} s, {r.write_rate / 1e6:.3f} MB/s; DRAM CRC "
              f"verified, IMAGE_VALID set")
    return 0


def _board_memtest(dev: Any, args: argparse.Namespace) -> int:
    r = dev.transport.memtest(args.bytes, seed=args.seed, progress=args.progress)
    print(f"memtest: {r.nbytes:,} bytes of pseudo-random data (seed {args.seed}) in {r.blocks} blocks from address 0: "
          f"written and checked ('L', then 'C' per block) at {r.write_mb_s:.3f} MB/s, all blocks checked again at "
          f"{r.check_mb_s:.1f} MB/s")
    if r.bad_blocks:
        print(f"memtest FAIL: {len(r.bad_blocks)} block(s) differ, at "
              + ", ".join(f"0x{a:08x}" for a in r.bad_blocks[:16]) + (" ..." if len(r.bad_blocks) > 16 else ""))
    else:
        print("memtest PASS: every block's CRC matched")
    print("the board's image is overwritten and IMAGE_VALID cleared: `mmfree board load --image FILE.mmf` rewrites "
          "the blocks that differ", file=sys.stderr)
    return 1 if r.bad_blocks else 0


def _board_level(dev: Any, regs: dict) -> int:
    """``mmfree board level``: the host's read leveling of a DDR3 board (host/leveling.py) with the CSR map
    ``regs`` (:func:`host.leveling.load_csr_map`), its report, and the DRAM port enabled; exit status 1 when a
    lane has no working setting (the port then stays held)."""
    from host.leveling import LevelingError

    dev.transport.require_ctrl("read leveling")
    try:
        result = dev.level(regs)
    except LevelingError as exc:
        print(f"read leveling FAILED (host-driven port of LiteX's procedure; not run on hardware): module "
              f"{exc.module}")
        for b, errs in sorted(exc.scans.items()):
            print(f"  m{exc.module} b{b}: |{''.join('.' if e == 0 else 'x' for e in errs)}| bit errors "
                  + " ".join(str(e) for e in errs))
        print(f"{PROG}: error: {_one_line(exc)}; the DRAM port stays held", file=sys.stderr)
        return 1
    print(result.format())
    print(f"DRAM port enabled ({dev.transport.stats['ctrl_reads']:,} control-bus reads, "
          f"{dev.transport.stats['ctrl_writes']:,} writes)")
    print("IMAGE_VALID cleared: the leveling's test bursts overwrite the DRAM's first bytes; `mmfree board load "
          "--image FILE.mmf` rewrites that block", file=sys.stderr)
    return 0


def _cmd_power(args: argparse.Namespace) -> int:
    import importlib.util
    import platform

    from host.power import Budget, PowerError, PowerSession, get_board, make_source, select_rails, summarize
    from host.power.boards import DEFAULT_BOARD as POWER_DEFAULT_BOARD
    from host.power.output import plot_trace, write_json, write_samples_csv
    from host.power.run import run_generation
    from host.power.sources import parse_spec
    from host.sampling import validate_sampling
    from hw.provenance import git_revision, machine_info

    # Everything checkable without a sensor or the model first.
    validate_sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                      repetition_penalty=args.repetition_penalty, cli=True)
    if args.tokens < 1:
        raise ValueError(f"--tokens must be >= 1, got {args.tokens}")
    if not (math.isfinite(args.budget) and args.budget > 0):
        raise ValueError(f"--budget must be a positive number of watts, got {args.budget}")
    if args.seed is not None and args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.device not in DEVICES:   # the device's own error (unknown or planned) before any other
        open_device(args.device)
    if not args.no_plot and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("the plot needs matplotlib (pip install matplotlib, or the dev extra); pass --no-plot to "
                         "write only the CSV and JSON")
    if args.out.exists() and not args.out.is_dir():
        raise NotADirectoryError(f"--out must be a directory, got the file {args.out}")
    args.out.mkdir(parents=True, exist_ok=True)
    paths = {k: args.out / f"power.{k}" for k in ("csv", "json", "png")}
    for key, path in paths.items():
        if key != "png" or not args.no_plot:
            _check_writable(path, f"the {key.upper()} output")
    xrt_device = int(args.xrt_device) if args.xrt_device is not None and args.xrt_device.isdigit() else args.xrt_device
    try:
        options = _device_options(args.option)
        board = get_board(args.board if args.board is not None
                          else _default_board(args.device, options, POWER_DEFAULT_BOARD))
        kind, _ = parse_spec(args.source)
        options = _board_options(args.device, board.key, options, args.image)
        with open_device(args.device, **options) as device:
            source = make_source(args.source, board, device=device, i2c_bus=args.i2c_bus,
                                 i2c_address=args.i2c_address, i2c_force=args.i2c_force, xrt_device=xrt_device,
                                 csv_offset_s=args.csv_offset, static_w=args.static_w)
            with source:
                available = source.open()  # a missing sensor fails here, before the model is loaded
                if args.rails:
                    rails = select_rails(available, args.rails.split(","), what="--rails")
                else:
                    defaults = board.rails_for(kind)
                    if defaults is None:
                        raise PowerError(f"board {board.key} names no default rails for source {kind}; pass --rails "
                                         f"(rails found: {', '.join(available)})")
                    rails = select_rails(available, defaults, what=f"default {board.key} rails ({board.rail_set})")
                budget = Budget(args.budget, rails, args.budget_basis)
                checkpoint = _load_model(args)
                tokenizer = _tokenizer_of(checkpoint)
                device.load(checkpoint)
                with PowerSession(source, budget, governor=args.governor, governor_window_s=args.governor_window,
                                  period_s=args.period, idle_s=args.idle) as session:
                    gen = run_generation(device, tokenizer, args.prompt, session, tokens=args.tokens,
                                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                         repetition_penalty=args.repetition_penalty, seed=args.seed)
                summary = summarize(gen.trace, budget)
                described = source.describe()
        estimate = source.is_estimate
        report = {
            "schema": "mmfree-power/1",
            "label": described.get("label", "ESTIMATE") if estimate else "measured",
            **summary,
            "board": {"key": board.key, "title": board.title, "rail_set": board.rail_set},
            "source": described,
            "governor": {"enabled": bool(args.governor), "window_s": args.governor_window},
            "device": args.device, "model": str(args.image or args.model), "prompt": args.prompt,
            "prompt_tokens": len(gen.prompt_ids), "token_ids": gen.token_ids, "text": gen.text,
            "command": ["mmfree", *sys.argv[1:]] if sys.argv and Path(sys.argv[0]).name == PROG else None,
            "git_revision": git_revision(),
            "machine": {"node": platform.node(), **machine_info()},
        }
        if estimate:
            from host.power.estimate import constants_table

            report["estimate_constants"] = constants_table(board)
        written = [write_samples_csv(gen.trace, paths["csv"], budget.rails), write_json(report, paths["json"])]
        if not args.no_plot:
            what = "ESTIMATE (activity model, not a measurement)" if estimate else f"measured ({source.name})"
            written.append(plot_trace(gen.trace, summary, paths["png"],
                                      title=f"{board.title}: power over {len(gen.token_ids)} tokens, {what}"))
    except PowerError as exc:  # a missing or bad sensor, no samples, a budget the governor cannot meet
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    _print_power(summary, board.key, source.name, args, written)
    return 0


def _print_power(summary: dict, board: str, source: str, args: argparse.Namespace, written: list) -> None:
    est = summary["estimate"]
    tag = " (estimate)" if est else ""
    run, tot, pt, bud = summary["run"], summary["total"], summary["per_token"], summary["budget"]

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.4g}"

    lines = [f"power: board {board}, source {source}, device {args.device}, {_plural(run['tokens'], 'token')}"]
    if est:
        lines.append("ESTIMATE: activity model of host.power.estimate, not a measurement; every figure is an estimate")
    lines += [
        f"budget rails  {', '.join(bud['rails'])}",
        f"idle          {f(tot['idle_w'])} W{tag}",
        f"mean          {f(tot['mean_w'])} W, peak {f(tot['peak_w'])} W, above idle {f(tot['above_idle_w'])} W{tag}",
        f"run           {f(run['seconds'])} s, {f(run['tokens_per_s'])} tokens/s{tag}",
        f"energy        {f(tot['energy_j'])} J, above idle {f(tot['energy_above_idle_j'])} J{tag}",
        f"per token     {f(pt['j_per_token'])} J/token, {f(pt['tokens_per_j'])} tokens/J; above idle "
        f"{f(pt['j_per_token_above_idle'])} J/token, {f(pt['tokens_per_j_above_idle'])} tokens/J{tag}",
        f"budget        {'PASS' if bud['pass'] else 'FAIL'}: mean {f(bud['mean_w'])} W vs {bud['watts']:g} W "
        f"({bud['basis']}); over for {f(bud['time_over_s'])} s, {f(bud['energy_over_j'])} J{tag}",
        "governor      " + (f"on: {run['governor_sleeps']} sleeps, {f(run['governor_sleep_s'])} s" if args.governor
                             else "off"),
        "wrote         " + ", ".join(str(p) for p in written),
    ]
    print("\n".join(lines))


# ---------------------------------------------------------------------- parser

def _device_help() -> str:
    known = ", ".join(f"{n} ({e.summary})" for n, e in DEVICES.items())
    planned = ", ".join(PLANNED_DEVICES)
    return (f"device to run on (default: {DEFAULT_DEVICE}); available: {known}"
            + (f"; planned: {planned}" if planned else ""))


def build_parser() -> argparse.ArgumentParser:
    """The ``mmfree`` argument parser (subcommands ``generate``, ``eval``, ``compile``, ``info``, ``power``,
    ``selftest``, ``bench``, ``board``)."""
    parser = argparse.ArgumentParser(prog=PROG, description="Host runtime of the MatMul-free LM accelerator.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser, *, device: bool = True) -> None:
        p.add_argument("--model", type=Path, default=DEFAULT_MODEL, metavar="DIR",
                       help=f"checkpoint directory (config.json, *.safetensors, tokenizer.json); "
                            f"default: {DEFAULT_MODEL}")
        if device:
            p.add_argument("--image", type=Path, default=None, metavar="FILE.mmf",
                           help="a compiled model bundle (mmfree compile --out FILE.mmf) instead of --model: runs "
                                "with no compiler on the host (devices that run images: golden, rtl, pynq, xrt, "
                                "ecp5)")
            p.add_argument("--device", default=DEFAULT_DEVICE, metavar="NAME", help=_device_help())
            p.add_argument("--option", action="append", metavar="KEY=VALUE",
                           help="a device option, repeatable, e.g. lanes=16 (rtl), bitstream=mmfree.bit (pynq), "
                                "xclbin=mmfree.xclbin (xrt)")

    g = sub.add_parser("generate", help="generate text after a prompt, streamed as it is produced")
    common(g)
    g.add_argument("--prompt", default="", help="prompt text (default: empty, start from BOS)")
    g.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
                   help=f"tokens to generate at most (default: {DEFAULT_MAX_NEW_TOKENS})")
    g.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE, metavar="T",
                   help=f"softmax temperature, 0 = greedy (default: {DEFAULT_TEMPERATURE})")
    g.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, metavar="K",
                   help=f"sample among the K most likely tokens, 0 = off (default: {DEFAULT_TOP_K})")
    g.add_argument("--top-p", type=float, default=DEFAULT_TOP_P, metavar="P",
                   help=f"nucleus sampling mass in (0, 1], 1 = off (default: {DEFAULT_TOP_P})")
    g.add_argument("--repetition-penalty", type=float, default=DEFAULT_REPETITION_PENALTY, metavar="R",
                   help=f"CTRL repetition penalty, 1 = off (default: {DEFAULT_REPETITION_PENALTY})")
    g.add_argument("--seed", type=int, default=DEFAULT_SEED, metavar="S",
                   help=f"random seed: the same seed gives the same tokens (default: {DEFAULT_SEED})")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating after the EOS token")
    g.set_defaults(func=_cmd_generate)

    e = sub.add_parser("eval", help="perplexity and bits per byte of a UTF-8 text file")
    common(e)
    e.add_argument("--text", type=Path, required=True, metavar="FILE", help="UTF-8 text file to score")
    e.add_argument("--context", type=int, default=512, metavar="N",
                   help="tokens per window; each window starts from a zero state after BOS (default: 512)")
    e.add_argument("--max-tokens", type=int, default=None, metavar="N", help="score only the first N tokens")
    e.add_argument("--json", type=Path, default=None, metavar="OUT",
                   help="also write the results as JSON to OUT (its directory must exist)")
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar over windows (default: when stderr is a terminal)")
    e.set_defaults(func=_cmd_eval)

    c = sub.add_parser("compile", help="compile a checkpoint into the accelerator's model image")
    common(c, device=False)
    c.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="write FILE: a deployable model bundle when it ends in .mmf (image, embeddings, tokenizer "
                        "and config under one checksum: host/bundle.py), the bare model image otherwise")
    c.add_argument("--packing", choices=("base3", "bits2"), default="base3",
                   help="5 trits per byte (1.6 bit, default) or 2 bits per trit")
    c.add_argument("--channels", type=int, default=1, metavar="N", help="weight channels of the build (default 1)")
    c.add_argument("--output-gate", choices=("released", "paper"), default="released",
                   help="RMSNorm(g)*SiLU(h) as released (default) or the paper's sigmoid(g)*h")
    c.add_argument("--listing", action="store_true", help="print the disassembled program")
    c.set_defaults(func=_cmd_compile)

    i = sub.add_parser("info", help="describe a checkpoint: config, parameters, trits per token, tokenizer")
    common(i, device=False)
    i.set_defaults(func=_cmd_info)

    from host.power.boards import BOARDS as POWER_BOARDS
    from host.power.boards import DEFAULT_BOARD as POWER_DEFAULT_BOARD

    p = sub.add_parser("power", help="power during a generation: watts, joules per token and the budget "
                                     "(writes a CSV of samples, a JSON summary and a PNG plot)")
    common(p)
    p.add_argument("--source", default="estimate", metavar="SOURCE",
                   help="estimate (default: activity model, no board), pynq, ina260, xrt, xrt:FILE (saved xrt-smi "
                        "electrical JSON), csv:FILE (external meter log: timestamp, watts), replay:FILE")
    p.add_argument("--board", default=None, metavar="BOARD",
                   help=f"board whose default rails and estimate apply and, on the golden device, whose design "
                        f"point to model: {', '.join(POWER_BOARDS)} (default: {POWER_DEFAULT_BOARD}; on the ecp5 "
                        f"device the board it talks to: --option board=, $MMFREE_ECP5_BOARD or ulx3s-85f)")
    p.add_argument("--budget", type=float, default=13.0, metavar="W", help="power budget in watts (default: 13)")
    p.add_argument("--budget-basis", choices=("total", "above-idle"), default="total",
                   help="the budget bounds the watts on the budget rails (default) or their draw above idle")
    p.add_argument("--rails", default=None, metavar="LIST",
                   help="budget rails: comma-separated names or shell patterns, or 'all' (default: the board's set)")
    p.add_argument("--tokens", type=int, default=32, metavar="N", help="decode tokens to run (default: 32)")
    p.add_argument("--prompt", default="The Python interpreter", help="prompt text")
    p.add_argument("--out", type=Path, default=Path("out/power"), metavar="DIR",
                   help="directory for power.csv, power.json and power.png (created; default: out/power)")
    p.add_argument("--no-plot", action="store_true", help="write the CSV and JSON only")
    p.add_argument("--governor", action="store_true",
                   help="sleep between tokens whenever the mean power exceeds the budget")
    p.add_argument("--governor-window", type=float, default=None, metavar="S",
                   help="govern the mean of the last S seconds (default: of the whole run)")
    p.add_argument("--idle", type=float, default=None, metavar="S",
                   help="idle baseline before the run, in seconds (default: 2; modelled 0.02 for the estimate)")
    p.add_argument("--period", type=float, default=None, metavar="S", help="sampling period (default: the source's)")
    p.add_argument("--static-w", type=float, default=None, metavar="W",
                   help="estimate: a measured idle of the board's rail set, replacing the assumed one")
    p.add_argument("--i2c-bus", type=int, default=1, metavar="N", help="ina260: I2C bus (default: 1)")
    p.add_argument("--i2c-address", type=lambda s: int(s, 0), default=0x40, metavar="ADDR",
                   help="ina260: I2C address (default: 0x40)")
    p.add_argument("--i2c-force", action="store_true",
                   help="ina260: read the address even though a kernel driver owns it")
    p.add_argument("--xrt-device", default=None, metavar="ID", help="xrt: card index or BDF (default: the first)")
    p.add_argument("--csv-offset", type=float, default=0.0, metavar="S",
                   help="csv: seconds added to the meter's timestamps to match the host clock")
    p.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE, metavar="T",
                   help=f"softmax temperature, 0 = greedy (default: {DEFAULT_TEMPERATURE})")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, metavar="K",
                   help=f"sample among the K most likely tokens, 0 = off (default: {DEFAULT_TOP_K})")
    p.add_argument("--top-p", type=float, default=DEFAULT_TOP_P, metavar="P",
                   help=f"nucleus sampling mass in (0, 1], 1 = off (default: {DEFAULT_TOP_P})")
    p.add_argument("--repetition-penalty", type=float, default=DEFAULT_REPETITION_PENALTY, metavar="R",
                   help=f"CTRL repetition penalty, 1 = off (default: {DEFAULT_REPETITION_PENALTY})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, metavar="S",
                   help=f"random seed (default: {DEFAULT_SEED})")
    p.set_defaults(func=_cmd_power)

    st = sub.add_parser("selftest", help="one token through the device, compared bit for bit with the golden device "
                                         "(PASS: exit 0, FAIL: exit 1)")
    common(st)
    st.add_argument("--token-ids", default=None, metavar="IDS",
                    help="comma-separated token ids to run from a reset (default: the model's BOS)")
    st.set_defaults(func=_cmd_selftest)

    from hw.boards.facts import BOARDS as BOARD_FACTS
    from hw.boards.facts import DEFAULT_BOARD
    ecp5_boards = [k for k, b in BOARD_FACTS.items() if b.family == "ecp5"]

    bn = sub.add_parser("bench", help="greedy decode on the device: tokens/s, GB/s, cycles per token, %% of the "
                                      "roofline (JSON)")
    common(bn)
    bn.add_argument("--tokens", type=int, default=16, metavar="N", help="tokens to decode (default: 16)")
    bn.add_argument("--board", choices=list(BOARD_FACTS), default=None,
                    help=f"whose roofline to compare with and, on the golden device, whose design point to model "
                         f"(default: {DEFAULT_BOARD}; on the ecp5 device the board it talks to: --option board=, "
                         f"$MMFREE_ECP5_BOARD or ulx3s-85f)")
    bn.add_argument("--fmax-mhz", type=float, default=None, metavar="MHZ",
                    help="core clock for the cycle-based rate (default: the board's design clock)")
    bn.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the JSON to OUT")
    bn.set_defaults(func=_cmd_bench)

    bd = sub.add_parser("board", help="an ECP5 DRAM board over its serial port: registers, the image it holds, "
                                      "loading a bundle once, a memory test, read leveling")
    bsub = bd.add_subparsers(dest="board_command", required=True, metavar="ACTION")

    def board_common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--board", default=None, choices=ecp5_boards,
                       help="the board, for the defaults of --port and --baud (default: $MMFREE_ECP5_BOARD or "
                            "ulx3s-85f)")
        q.add_argument("--port", default=None, metavar="TTY",
                       help="serial port (default: $MMFREE_ECP5_PORT or the board's: /dev/ttyUSB0 on the ULX3S, "
                            "/dev/ttyUSB1 on the ECPIX-5)")
        q.add_argument("--baud", type=int, default=None, metavar="BAUD",
                       help="the bitstream's link rate (default: $MMFREE_ECP5_BAUD or the board's committed "
                            "bitstream's rate, hw/boards/facts.py)")
        q.add_argument("--timeout", type=float, default=2.0, metavar="S",
                       help="seconds to wait for any reply (default: 2)")
        q.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="progress bar while writing DRAM (default: when stderr is a terminal)")

    q = bsub.add_parser("info", help="board registers (magic, link version, DRAM, clock, status) and the core's ID "
                                     "block")
    board_common(q)
    q = bsub.add_parser("status", help="the image the board holds: checksum, layout, link counters; with --image, "
                                       "whether it is that bundle (exit 1 when not)")
    board_common(q)
    q.add_argument("--image", type=Path, default=None, metavar="FILE.mmf", help="a bundle to compare with")
    q = bsub.add_parser("load", help="write a bundle's image and embedding table into the board's DRAM, once: "
                                     "skipped when the board holds it, else only the blocks that differ")
    board_common(q)
    q.add_argument("--image", type=Path, required=True, metavar="FILE.mmf",
                   help="the bundle (mmfree compile --out FILE.mmf)")
    q.add_argument("--force", action="store_true", help="write every block even when the board holds the bundle")
    q = bsub.add_parser("memtest", help="write pseudo-random blocks to DRAM and check their CRCs (MB/s, errors); "
                                        "overwrites the image and clears IMAGE_VALID")
    board_common(q)
    q.add_argument("--bytes", type=int, default=1 << 20, metavar="N",
                   help="bytes to test from address 0, a multiple of 8 (default: 1 MiB, about 5 s at 2 Mbaud)")
    q.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the data (default: 0)")
    q = bsub.add_parser("level", help="a DDR3 board (link version 3): read leveling of the PHY over the link, the "
                                      "report, then the DRAM port enabled (not run on hardware)")
    board_common(q)
    q.add_argument("--csr", type=Path, default=None, metavar="CSR.json",
                   help="the CSR map of the bitstream's LiteDRAM core: its csr.json, or a report.json carrying it "
                        "(default: $MMFREE_ECP5_CSR)")
    bd.set_defaults(func=_cmd_board)
    return parser


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mmfree`` (``host.cli:main``); returns the exit status.

    Returns
    -------
    int
        0 on success; 2 on a usage, file, checkpoint, device or argument error (one line on stderr);
        130 on Ctrl-C; 1 when stdout is closed early (a broken pipe).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): return it instead of exiting
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        try:  # stop Python's exit-time flush from failing again on the closed pipe
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 1
    except (DeviceError, ValueError, OSError, MissingExtra) as exc:  # CheckpointError, ConfigError: ValueErrors
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
