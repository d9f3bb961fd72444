"""Run host code as a board user's Python would: with the runtime's dependencies only.

Before anything else it installs an import blocker (:class:`Blocker`, first on ``sys.meta_path``) under
which every import of :data:`BLOCKED` (Amaranth, numba, torch and the compiler) fails exactly as if the
package were not installed, and it takes its own directory off ``sys.path`` so that ``host`` and ``hw``
come from the installed package (the editable checkout, or a fresh virtual environment's copy).

    python tests/runtime_only.py isa             JSON lines on stdin/stdout: hw.isa without Amaranth
    python tests/runtime_only.py board SPEC      the board user's path (tests/test_board_path.py)
    python tests/runtime_only.py cli ARGS...     ``mmfree ARGS`` as on a board, printing {rc, stdout, stderr}

``cli`` blocks only :data:`NOT_INSTALLED` (on a board ``host.compiler`` is installed, merely unused by
the bundle path), so that what needs an extra fails as it would there.

``isa`` answers one request per line: ``{"op": "describe"}`` (every layout's size and every leaf
field's span and kind) or ``{"op": "pack", "layout": NAME, "fields": F}`` (the bytes of
``hw.isa.pack`` and the fields ``hw.isa.unpack`` reads back). Enum members travel as
``{"enum": CLASS, "value": INT}``.

``board`` runs a compiled bundle on the fake ``pynq`` and ``pyxrt`` modules of ``tests/board_fakes.py``.
The fake core's arithmetic (the golden device, which needs numba) does not run here: it runs in the
*hardware process* (the pytest process, full environment) that SPEC's ``address`` names, the way an FPGA
is a separate box. What runs here is everything a board user runs: reading the bundle, the drivers
(registers, DMA / kernel runs, ID check, token packets from the bundle's embeddings, output packets),
sampling, the CLI. The results go to SPEC's ``out`` (``.npz`` of logits, ``.json`` of the rest).
"""

from __future__ import annotations

import importlib.abc
import sys
from pathlib import Path

#: what a board user does not install: the gateware's HDL, numba (golden device), torch
NOT_INSTALLED = ("amaranth", "numba", "torch")
#: what the bundle path must not import: the above and the compiler
BLOCKED = (*NOT_INSTALLED, "host.compiler")
TESTS = Path(__file__).resolve().parent


class Blocker(importlib.abc.MetaPathFinder):
    """Makes an import of one of ``blocked`` (or of a submodule) raise ``ModuleNotFoundError``."""

    def __init__(self, blocked: tuple[str, ...]):
        self.blocked = blocked

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in self.blocked):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by tests/runtime_only.py)", name=name)
        return None


def install_blocker(blocked: tuple[str, ...] = BLOCKED) -> None:
    loaded = [m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in blocked)]
    assert not loaded, f"already imported before the blocker: {loaded}"
    sys.meta_path.insert(0, Blocker(blocked))
    if sys.path and Path(sys.path[0] or ".").resolve() == TESTS:
        del sys.path[0]   # tests/hw must not shadow the hw package


def blocked_modules_loaded() -> list[str]:
    return sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))


# ------------------------------------------------------------------------------------------------ isa
def _encode(v):
    import enum

    if isinstance(v, enum.Enum):
        return {"enum": type(v).__name__, "value": v.value}
    if isinstance(v, dict):
        return {k: _encode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_encode(x) for x in v]
    return v


def _decode(v, isa):
    if isinstance(v, dict) and set(v) == {"enum", "value"}:
        return getattr(isa, v["enum"])(v["value"])
    if isinstance(v, dict):
        return {k: _decode(x, isa) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x, isa) for x in v]
    return v


def describe(isa, layout) -> dict:
    """Every leaf field of ``layout``: ``{"path/...": [bit, width, kind]}`` (kind: an enum class name, or
    ``signed(w)`` / ``unsigned(w)``), through ``hw.isa.field_span`` and the layout's own iteration."""
    out = {}

    def walk(lay, path):
        for key, f in isa.data.Layout.cast(lay):
            shape = f.shape
            if isinstance(shape, isa.data.Layout) or (isinstance(shape, type) and issubclass(shape, isa.data.Struct)):
                walk(shape, (*path, key))
                continue
            if isinstance(shape, type) and issubclass(shape, __import__("enum").Enum):
                kind = shape.__name__
            else:
                s = isa.Shape.cast(shape)
                kind = f"{'signed' if s.signed else 'unsigned'}({s.width})"
            out["/".join(map(str, (*path, key)))] = [*isa.field_span(layout, (*path, key)), kind]

    walk(layout, ())
    return out


def decode_view(isa, layout, view):
    """An :class:`hw.isa.Unpacked` as plain dicts / lists / ints / enum members, through its attributes."""
    lay = isa.data.Layout.cast(layout)
    if isinstance(lay, isa.data.ArrayLayout):
        return [decode_view(isa, lay.elem_shape, view[i]) for i in range(len(view))]
    return {name: decode_view(isa, f.shape, getattr(view, name)) if isinstance(getattr(view, name), isa.Unpacked)
            else getattr(view, name) for name, f in lay}


LAYOUTS = ("ImageHeader", "InstrHeader", "TokenHeader", "OutputTrailer", "MicroOp")


def serve_isa() -> None:
    import json

    from hw import isa

    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "describe":
            rep = {"amaranth": isa.AMARANTH, "blocked_loaded": blocked_modules_loaded(),
                   "layouts": {n: {"bytes": isa.layout_bytes(getattr(isa, n)), "fields": describe(isa, getattr(isa, n))}
                               for n in LAYOUTS}}
        else:
            layout = getattr(isa, req["layout"])
            raw = isa.pack(layout, _decode(req["fields"], isa))
            rep = {"raw": raw.hex(), "back": _encode(decode_view(isa, layout, isa.unpack(layout, raw)))}
        print(json.dumps(rep), flush=True)


# ---------------------------------------------------------------------------------------------- board
class RemoteMachine:
    """``GoldenMachine``'s interface as ``FakeCore`` uses it, computed by the hardware process.

    Images, packets and outputs travel as bytes, counters as ``{index: count}``; the recurrent state
    stays in the hardware process (this side holds its handle).
    """

    conn = None  #: the connection to the hardware process (one per run)

    def __init__(self, image: bytes, build) -> None:
        import dataclasses

        self._id = self._call("machine", bytes(image), dataclasses.asdict(build))

    def _call(self, *req):
        self.conn.send(req)
        rep = self.conn.recv()
        if rep[0] == "image_error":
            from host.image import ImageError
            from hw.isa import ErrorCause

            _, cause, message, instruction = rep
            raise ImageError(ErrorCause(cause), message, instruction=instruction)
        return rep[1]

    def init_state(self):
        return self._call("init_state", self._id)

    def run_token(self, packet: bytes, state):
        import types

        from hw.isa import Counter

        output, counters, new_state = self._call("run", self._id, bytes(packet), state)
        return types.SimpleNamespace(output=output, state=new_state,
                                     counters={Counter(c): v for c, v in counters.items()})


def _load_board_fakes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("board_fakes", TESTS / "board_fakes.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["board_fakes"] = mod
    spec.loader.exec_module(mod)
    return mod


def _cli(argv: list[str]) -> dict:
    """``mmfree ARGV`` in this process: exit status, stdout, stderr."""
    import contextlib
    import io

    from host.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def run_board(spec_path: str) -> None:
    import json
    from multiprocessing.connection import Client

    import numpy as np

    spec = json.loads(Path(spec_path).read_text())
    fakes = _load_board_fakes()
    RemoteMachine.conn = Client(spec["address"], family="AF_UNIX", authkey=bytes.fromhex(spec["authkey"]))
    fakes.GoldenMachine = RemoteMachine      # the fake core's arithmetic runs in the hardware process

    from host.bundle import read_bundle
    from host.devices import open_device
    from host.generate import generate_text
    from hw import isa

    tmp = Path(spec["tmp"])
    bundle = read_bundle(spec["bundle"])
    gen = spec["generate"]
    logits, result = {}, {"amaranth": isa.AMARANTH, "devices": {}}
    for kind in ("pynq", "xrt"):
        core_kw = dict(spec["core"])
        if kind == "xrt":
            core_kw["base"] = isa.register_base("alveo")
        core = fakes.FakeCore(**core_kw)
        if kind == "pynq":
            sys.modules["pynq"] = fakes.fake_pynq(core)
            bit = tmp / "mmfree.bit"
            bit.write_bytes(b"bit")
            bit.with_suffix(".hwh").write_text("<hwh/>")
            option = f"bitstream={bit}"
        else:
            sys.modules["pyxrt"] = fakes.fake_pyxrt(core)
            bit = tmp / "mmfree.xclbin"
            bit.write_bytes(b"xclbin")
            option = f"xclbin={bit}"
        key, value = option.split("=", 1)
        with open_device(kind, **{key: value}) as dev:
            dev.load_image(bundle)
            logits[kind] = np.stack([dev.step(t) for t in spec["token_ids"]])
            g = generate_text(dev, bundle.tokenizer, gen["prompt"], max_new_tokens=gen["max_new_tokens"],
                              temperature=gen["temperature"], top_k=gen["top_k"], top_p=gen["top_p"],
                              repetition_penalty=gen["repetition_penalty"], seed=gen["seed"])
        image = ["--image", spec["bundle"], "--device", kind, "--option", option]
        result["devices"][kind] = {
            "generate_ids": list(map(int, g.token_ids)), "generate_text": g.text,
            "cli_generate": _cli(["generate", *image, *spec["cli_generate"]]),
            "cli_eval": _cli(["eval", *image, "--text", spec["eval_text"], "--no-progress",
                              "--json", str(tmp / f"eval_{kind}.json")]),
            "tokens_run": core.tokens_run,
        }
        if result["devices"][kind]["cli_eval"]["rc"] == 0:
            result["devices"][kind]["eval"] = json.loads((tmp / f"eval_{kind}.json").read_text())
    result["blocked_loaded"] = blocked_modules_loaded()
    result["modules"] = sorted({m.partition(".")[0] for m in sys.modules})
    np.savez(spec["out"] + ".npz", **logits)
    Path(spec["out"] + ".json").write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1:2] == ["cli"]:
        import json

        install_blocker(NOT_INSTALLED)
        print(json.dumps(_cli(sys.argv[2:])))
        sys.exit()
    install_blocker()
    if sys.argv[1:2] == ["isa"]:
        serve_isa()
    elif sys.argv[1:2] == ["board"] and len(sys.argv) == 3:
        run_board(sys.argv[2])
    else:
        sys.exit(__doc__)
