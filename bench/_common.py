"""Helpers shared by the benchmarks in ``bench/``: provenance (command, git revision, machine, date)
and result files.

Every benchmark writes one JSON file into ``bench/results/`` whose top level carries
:func:`provenance` (the exact command, the git revision with ``-dirty`` when the working tree has
uncommitted changes, the machine and the UTC date) next to its numbers.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

__all__ = ["REPO", "RESULTS", "peak_rss_bytes", "git_info", "machine_info", "command_line", "utc_now",
           "provenance", "write_json"]


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, bytes (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def git_info() -> dict:
    """``{"revision": sha, "dirty": bool, "describe": sha + "-dirty" if dirty}`` of the repository.

    ``revision`` is ``"unknown (no commit)"`` (and ``describe`` the same) outside a git checkout or
    before the first commit; ``dirty`` is None when ``git status`` cannot run.
    """
    def git(*a: str) -> str | None:
        try:
            r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    status = git("status", "--porcelain")
    sha = git("rev-parse", "HEAD")
    dirty = bool(status) if status is not None else None
    describe = (sha + ("-dirty" if dirty else "")) if sha else "unknown (no commit)"
    return {"revision": sha or "unknown (no commit)", "dirty": dirty, "describe": describe}


def machine_info() -> dict:
    """Platform, CPU model (``/proc/cpuinfo``), logical cores, physical memory (bytes), Python, numpy
    and (when installed) numba versions."""
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


#: environment variables that change what a benchmark measures (threads, spin-waiting, BLAS)
ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "NUMBA_", "OPENBLAS_", "MKL_", "PYTHONHASHSEED")


def relevant_env() -> dict:
    """The set environment variables whose names start with :data:`ENV_PREFIXES`."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def command_line() -> str:
    """The command that runs this process, shell-quoted: the :func:`relevant_env` assignments, then the
    interpreter, script and arguments."""
    env = [f"{k}={shlex.quote(v)}" for k, v in relevant_env().items()]
    return " ".join([*env, shlex.join([sys.executable, *sys.argv])])


def utc_now() -> str:
    """The current UTC time, ISO 8601, seconds."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def provenance(benchmark: str) -> dict:
    """The common top-level fields of a result file: benchmark name, command, date, git, machine."""
    return {"benchmark": benchmark, "command": command_line(), "environment": relevant_env(),
            "timestamp": utc_now(), "git": git_info(), "machine": machine_info()}


def write_json(path: Path, report: dict) -> Path:
    """Write ``report`` as indented JSON (creating the directory); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
