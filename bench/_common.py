"""Helpers shared by the benchmarks in ``bench/``: provenance (command, git revision, machine, date)
and result files.

Every benchmark writes one JSON file into ``bench/results/`` whose top level carries
:func:`provenance` (the exact command, the git revision with ``-dirty`` when the working tree has
uncommitted changes, the machine and the UTC date) next to its numbers. The revision and machine
facts come from :mod:`hw.provenance` (re-exported here as :func:`git_info` and :func:`machine_info`).
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import shlex
import sys
from pathlib import Path

from hw.provenance import REPO, git_info, machine_info

RESULTS = REPO / "bench" / "results"

__all__ = ["REPO", "RESULTS", "peak_rss_bytes", "git_info", "machine_info", "command_line", "utc_now",
           "provenance", "write_json"]


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, bytes (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


#: environment variables that change what a benchmark measures (threads, spin-waiting, BLAS)
ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "NUMBA_", "OPENBLAS_", "MKL_", "PYTHONHASHSEED")


def relevant_env() -> dict:
    """The set environment variables whose names start with :data:`ENV_PREFIXES`."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def command_line() -> str:
    """The command that runs this process, shell-quoted: the :func:`relevant_env` assignments, then the
    interpreter (absolute) and its arguments as given (``-m bench.bench_cpu --runs 3``: ``sys.orig_argv``,
    since under ``-m`` ``sys.argv[0]`` is the module's file, not what was typed)."""
    env = [f"{k}={shlex.quote(v)}" for k, v in relevant_env().items()]
    return " ".join([*env, shlex.join([sys.executable, *sys.orig_argv[1:]])])


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
