"""Provenance of a build, benchmark or report: the git revision of the sources and the machine it ran on.

The one implementation that ``hw.boards`` (bitstream and project reports), ``host`` (``mmfree bench``,
``mmfree power``) and ``bench/`` (every result file) record. It lives in ``hw`` because ``hw`` must not
import ``host`` while ``host`` and ``bench`` may import ``hw``. The standalone GPU script
``scripts/measure_fp16.py`` keeps its own ``git rev-parse`` so that it runs without this package.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["REPO", "UNKNOWN_REVISION", "git_info", "git_revision", "machine_info"]

#: the repository root (the checkout this module was imported from)
REPO = Path(__file__).resolve().parents[1]

#: ``revision`` and ``describe`` of :func:`git_info` outside a git checkout or before the first commit
UNKNOWN_REVISION = "unknown (no commit)"


def _git(*args: str, cwd: Path = REPO) -> str | None:
    """Stripped stdout of ``git ARGS`` run in ``cwd``; None when git is missing, fails or times out."""
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_info(paths: Sequence[str | os.PathLike] | None = None, *, repo: str | os.PathLike = REPO) -> dict:
    """The commit of the checkout and whether the working tree differs from it.

    Parameters
    ----------
    paths : sequence of str or path-like, optional
        Pathspecs (relative to ``repo``) whose changes count as ``dirty``; by default the whole working
        tree. A bitstream build passes ``("hw",)``: only the gateware sources change what it elaborates.
    repo : str or path-like
        Any directory inside the checkout; by default the repository this module belongs to.

    Returns
    -------
    dict
        ``{"revision": str, "dirty": bool | None, "describe": str}``: ``revision`` is the full SHA-1 of
        ``HEAD``; ``dirty`` is True when ``git status --porcelain`` lists anything (modified, staged or
        untracked files) under ``paths``, None when ``git status`` cannot run; ``describe`` is
        ``revision`` with ``-dirty`` appended when dirty. Outside a git checkout, without git, or before
        the first commit, ``revision`` and ``describe`` are :data:`UNKNOWN_REVISION`. Never raises for
        a missing git.
    """
    spec = ["--", *(os.fspath(p) for p in paths)] if paths else []
    status = _git("status", "--porcelain", *spec, cwd=Path(repo))
    sha = _git("rev-parse", "HEAD", cwd=Path(repo))
    dirty = bool(status) if status is not None else None
    describe = (sha + ("-dirty" if dirty else "")) if sha else UNKNOWN_REVISION
    return {"revision": sha or UNKNOWN_REVISION, "dirty": dirty, "describe": describe}


def git_revision(paths: Sequence[str | os.PathLike] | None = None, *, repo: str | os.PathLike = REPO) -> str | None:
    """``describe`` of :func:`git_info` (the SHA-1 of ``HEAD``, ``-dirty`` appended when the working tree
    under ``paths`` has changes), or None when no revision is known (no git, no checkout, no commit)."""
    info = git_info(paths, repo=repo)
    return None if info["revision"] == UNKNOWN_REVISION else info["describe"]


def machine_info() -> dict:
    """The machine and interpreter a figure was measured on.

    Returns
    -------
    dict
        ``platform`` (:func:`platform.platform`), ``machine`` (architecture, e.g. ``x86_64``), ``cpu``
        (the ``model name`` of ``/proc/cpuinfo``, else :func:`platform.processor`, else None: absolute
        speeds differ by CPU family), ``cpu_count`` (logical cores), ``memory_bytes`` (physical memory,
        bytes; None where ``sysconf`` cannot say), ``python``, ``numpy`` and, when installed, ``numba``
        (version strings).
    """
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    cpu = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numpy as np

    info = {"platform": platform.platform(), "machine": platform.machine(), "cpu": cpu,
            "cpu_count": os.cpu_count(), "memory_bytes": mem, "python": platform.python_version(),
            "numpy": np.__version__}
    try:
        import numba

        info["numba"] = numba.__version__
    except ImportError:
        pass
    return info
