"""``python -m hw.boards BOARD [--out DIR] [options]``: build a board's bitstream (what ``make bitstream`` runs).

ECP5 boards (:data:`hw.boards.ecp5.BOARDS`) build here with the open toolchain; Xilinx boards
(``hw.boards.xilinx.BOARDS``) are handed to ``hw.boards.xilinx.build``. ``--sweep`` builds the ECP5
configurations given by ``--lanes``/``--freq-mhz`` (comma lists) and records them all. ``--dram``/``--no-dram``
choose the ECP5 top (``hw.boards.ecp5.DramEcp5Top`` or ``Ddr3Ecp5Top``, the model in the board's SDRAM or DDR3,
or ``Ecp5Top``, the stream link); the default is the board's chosen build (``hw.boards.ecp5.CHOSEN``: the DRAM
top on the ULX3S 85F). The ECP5 options are refused for a Xilinx board, whose flow takes ``--out`` and one
``--lanes``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path


def _xilinx():
    try:
        return importlib.import_module("hw.boards.xilinx")
    except ImportError as exc:
        if exc.name != "hw.boards.xilinx":
            raise
        return None


def _comma_list(conv, noun: str):
    """An argparse ``type`` reading a comma list of ``conv`` values (``--lanes 16,32``, ``--freq-mhz 50,80``)."""
    def parse(text: str) -> list:
        try:
            return [conv(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun} separated by commas, got {text!r}") from None
    return parse


_ints, _floats = _comma_list(int, "integers"), _comma_list(float, "numbers")


def main(argv: list[str] | None = None) -> int:
    from hw.boards import ecp5

    xil = _xilinx()
    xboards = sorted(getattr(xil, "BOARDS", ())) if xil else []
    known = sorted(ecp5.BOARDS) + xboards
    ap = argparse.ArgumentParser(prog="python -m hw.boards", description=__doc__.split("\n\n")[0])
    ap.add_argument("board", help=f"one of: {', '.join(known) or '(none)'}"
                    + ("" if xil else " (Xilinx boards need hw/boards/xilinx.py)"))
    ap.add_argument("--out", type=Path, help="output folder (default bitstreams/<board>/)")
    ap.add_argument("--lanes", type=_ints, default=None,
                    help="trits per cycle (ECP5: a comma list with --sweep; default: hw.boards.ecp5.CHOSEN)")
    ap.add_argument("--freq-mhz", type=_floats, default=None,
                    help="ECP5: target core clock in MHz (a comma list with --sweep; default: CHOSEN)")
    ap.add_argument("--quant-lanes", type=int, default=None,
                    help="ECP5: codes re-quantized per cycle (default: the board's chosen build, else 8)")
    ap.add_argument("--baud", type=int, default=None,
                    help="ECP5: UART rate (default: the board's chosen build, else 3000000)")
    ap.add_argument("--seed", type=int, default=None,
                    help="ECP5: nextpnr seed (default: the board's chosen build's, else 1)")
    ap.add_argument("--placer", choices=ecp5.PLACERS, default=None,
                    help="ECP5: nextpnr placer (default: the board's chosen build, else heap)")
    ap.add_argument("--router", choices=ecp5.ROUTERS, default=None,
                    help="ECP5: nextpnr router (default: the board's chosen build, else router1)")
    ap.add_argument("--placer-density", type=float, default=None,
                    help="ECP5: nextpnr's maximum placement density (--placer-heap-beta; its default 0.9); "
                         "heap placer only, which it selects when --placer is not given")
    ap.add_argument("--lut-mapper", choices=ecp5.LUT_MAPPERS, default=None,
                    help="ECP5: Yosys's LUT mapper: abc9 (synth_ecp5's, the default) or abc (abc -lut 4:7 in its "
                         "place: Yosys 0.70's abc9 asserts on some netlists of this design, docs/DDR3.md)")
    ap.add_argument("--place-only", action="store_true",
                    help="ECP5: stop after placement (no bitstream); report nextpnr's post-placement Fmax estimate")
    ap.add_argument("--pipelined-epilogue", action="store_true",
                    help="ECP5: the pipelined epilogue (an element a cycle, 8x its stages) instead of the folded one")
    ap.add_argument("--dram", action=argparse.BooleanOptionalAction, default=None,
                    help="ECP5: the DRAM top (the model in the board's SDRAM or DDR3, tokens over the link; boards "
                         "with a LiteDRAM config) or, with --no-dram, the stream top (default: the chosen build)")
    ap.add_argument("--shape", choices=sorted(ecp5.SHAPES), default=None,
                    help="ECP5 DRAM top: the buffer capacities: the shipped model's or the 370M shape's "
                         "(hw.boards.facts.CAPACITY_370M), with the recurrent state in the board's DRAM "
                         "(state_in_dram; its two banks would not fit the block RAM) (default: the chosen build's, "
                         "else shipped)")
    ap.add_argument("--sdram-phase", type=float, default=None, metavar="DEG",
                    help="ECP5 DRAM top: phase of the SDRAM clock against the controller clock, degrees "
                         "(default: hw.boards.ecp5.SDRAM_CLK_PHASE_DEG)")
    ap.add_argument("--sweep", action="store_true", help="ECP5: build every lanes x freq combination")
    ap.add_argument("--publish", metavar="BUILD_DIR", type=Path,
                    help="ECP5: copy a finished build (build/boards/<board>/<config>) that met timing to --out")
    args = ap.parse_args(argv)

    for flag, value in (("--baud", args.baud), ("--quant-lanes", args.quant_lanes)):
        if value is not None and value <= 0:
            ap.error(f"{flag} must be a positive integer, got {value}")
    if args.board in xboards:
        ecp5_only = [flag for flag, given in (
            ("--dram/--no-dram", args.dram is not None), ("--freq-mhz", args.freq_mhz is not None),
            ("--baud", args.baud is not None), ("--quant-lanes", args.quant_lanes is not None),
            ("--placer", args.placer is not None), ("--router", args.router is not None),
            ("--placer-density", args.placer_density is not None), ("--place-only", args.place_only),
            ("--lut-mapper", args.lut_mapper is not None), ("--pipelined-epilogue", args.pipelined_epilogue),
            ("--sdram-phase", args.sdram_phase is not None),
            ("--sweep", args.sweep), ("--publish", args.publish is not None), ("--shape", args.shape is not None),
            ("--seed", args.seed is not None),
            ("several --lanes values", args.lanes is not None and len(args.lanes) > 1)) if given]
        if ecp5_only:
            ap.error(f"{args.board} is a Xilinx board: its flow takes --out and one --lanes value, not "
                     f"{', '.join(ecp5_only)} (ECP5 options)")
    if args.board in ecp5.BOARDS and args.publish:
        try:
            ecp5.publish(args.board, args.publish, args.out)
        except ValueError as exc:
            print(f"python -m hw.boards: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.board in ecp5.BOARDS:
        chosen = ecp5.CHOSEN.get(args.board, {})
        lanes = args.lanes or [chosen.get("lanes", ecp5.DEFAULT_BUILD.lanes)]
        freqs = args.freq_mhz or [chosen.get("freq_mhz", 60.0)]
        if args.quant_lanes is None:
            args.quant_lanes = chosen.get("quant_lanes")
        if args.baud is None:
            args.baud = chosen.get("baud", 3_000_000)
        args.router = args.router or chosen.get("router", "router1")
        args.lut_mapper = args.lut_mapper or chosen.get("lut_mapper", "abc9")
        args.seed = chosen.get("seed", 1) if args.seed is None else args.seed
        # a placement density is the heap placer's: it selects heap unless --placer says otherwise
        args.placer = args.placer or ("heap" if args.placer_density is not None else chosen.get("placer", "heap"))
        if (len(lanes) != 1 or len(freqs) != 1) and not args.sweep:
            ap.error("several --lanes/--freq-mhz values need --sweep")
        dram = chosen.get("dram", False) if args.dram is None else args.dram
        if args.sdram_phase is not None and not dram:
            ap.error("--sdram-phase applies to the DRAM top (--dram)")
        if args.sdram_phase is not None and ecp5.BOARDS[args.board].dram_config is not None \
                and ecp5.dram_top_class(args.board) is ecp5.Ddr3Ecp5Top:
            ap.error(f"--sdram-phase applies to an SDR board's DRAM top; {args.board}'s DDR3 core makes its own clocks")
        extra = {"quant_lanes": args.quant_lanes} if args.quant_lanes is not None else {}
        if args.pipelined_epilogue:
            extra["epilogue_folded"] = False
        extra["dram"] = dram
        shape = args.shape or (chosen.get("shape", "shipped") if dram else "shipped")
        if shape != "shipped":
            if not dram:
                ap.error(f"--shape {shape} needs the DRAM top (--dram): the recurrent state lives in the board's DRAM")
            extra.update(ecp5.SHAPES[shape])
        if args.sdram_phase is not None:
            extra["sdram_phase_deg"] = args.sdram_phase
        try:
            if args.sweep:
                res = ecp5.sweep(args.board, [{"lanes": n, "freq_mhz": f, "seed": args.seed, "baud": args.baud,
                                               "router": args.router, "density": args.placer_density,
                                               "placer": args.placer, "lut_mapper": args.lut_mapper,
                                               "place_only": args.place_only, **extra}
                                              for n in lanes for f in freqs], args.out)
                keys = ("lanes", "target_mhz", "status", "placed_fmax_mhz", "fmax_mhz", "timing_met", "lanes_x_fmax")
                print(json.dumps([{k: r.get(k) for k in keys} for r in res], indent=1))
                return 0
            return ecp5.build(args.board, args.out, freq_mhz=freqs[0], baud=args.baud, seed=args.seed,
                              router=args.router, density=args.placer_density, place_only=args.place_only,
                              placer=args.placer, lut_mapper=args.lut_mapper, lanes=lanes[0], **extra)
        except ValueError as exc:       # a request the build refuses: clock, baud rate, density, placer, lanes
            print(f"python -m hw.boards: {exc}", file=sys.stderr)
            return 2
    if args.board in xboards:
        out = args.out or Path(__file__).resolve().parents[2] / "bitstreams" / args.board
        params = {"lanes": args.lanes[0]} if args.lanes else {}
        return int(xil.build(args.board, out, **params) or 0)
    if xil is None:
        print(f"unknown board {args.board!r}: ECP5 boards are {', '.join(sorted(ecp5.BOARDS))}; the Xilinx flows "
              f"(pynq-z2, kv260, zcu104, u55c) need hw/boards/xilinx.py, which is not in this tree", file=sys.stderr)
    else:
        print(f"unknown board {args.board!r}; known: {', '.join(known)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
