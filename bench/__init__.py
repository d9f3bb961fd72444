"""Benchmarks of mmfree-fpga and the generator of ``docs/PERFORMANCE.md``.

A package run from the repository root, one module per benchmark, each writing a JSON file with its
provenance (:mod:`bench._common`) into ``bench/results/``::

    python -m bench.bench_perf        # cycle-model predictions -> bench/results/perf.json
    python -m bench.bench_cpu         # golden vs reference vs PyTorch on this CPU -> bench/results/cpu.json
    python -m bench.report            # docs/PERFORMANCE.md from the committed JSON

Not installed with the ``host`` and ``hw`` packages (``pyproject.toml`` includes only those): it imports
them, and the root of the checkout must be on ``sys.path`` (``python -m`` from the root puts it there).
"""
