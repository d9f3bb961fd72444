"""Optional dependencies: which ``pip install 'mmfree-fpga[EXTRA]'`` brings a missing module.

A board runs a compiled bundle with the runtime's dependencies only (numpy, safetensors, tokenizers,
rich: pyproject.toml's base ``dependencies``). Whatever needs more imports it through
:func:`require_extra` at the point of use, so a missing extra is one clear error that names it, not a
traceback from deep inside an import.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtra", "require_extra"]

#: top-level module -> the pyproject.toml extra that installs it
EXTRAS = {
    "numba": "golden",      # the golden device's ternary GEMV and whole-token engine
    "amaranth": "hw",       # the gateware and its Verilog export (the RTL device)
    "torch": "bench",       # the PyTorch baselines (also in the train extra)
}


class MissingExtra(ImportError):
    """A module of an optional extra is not installed; the message names the extra to install."""


def require_extra(module: str, what: str) -> ModuleType:
    """Import ``module`` (e.g. ``"numba"``), which ``what`` (e.g. ``"the golden device"``) needs.

    Raises
    ------
    MissingExtra
        If ``module`` (or its top-level package) is not installed: the message names the extra of
        :data:`EXTRAS` that installs it. An import that fails for another reason propagates unchanged.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        if (exc.name or "").partition(".")[0] != top:
            raise
        extra = EXTRAS.get(top)
        hint = f"pip install 'mmfree-fpga[{extra}]'" if extra else f"pip install {top}"
        raise MissingExtra(f"{what} needs {top}, which is not installed: {hint}", name=exc.name) from exc
