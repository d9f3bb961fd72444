"""Power: measurement on boards, an activity-based estimate without one, accounting, a governor.

Watts, joules per token and tokens per joule the way papers report them, and whether a run stayed
within its power budget (13 W by default) on a named rail set (docs/ARCHITECTURE.md section 4).

* Sources (:mod:`host.power.base`): ``pynq`` (:mod:`~host.power.pynq_rails`), ``ina260``
  (:mod:`~host.power.ina260`), ``xrt`` (:mod:`~host.power.xrt`), ``csv`` (:mod:`~host.power.meter`),
  ``estimate`` (:mod:`~host.power.estimate`), ``replay`` (:mod:`~host.power.replay`); by name through
  :func:`~host.power.sources.make_source`.
* Boards and their default budget rails: :mod:`host.power.boards`.
* Recording a run: :class:`~host.power.session.PowerSession` (idle baseline, token boundaries,
  governor), :func:`~host.power.run.run_generation`.
* Figures: :func:`~host.power.accounting.summarize`; the governor: :mod:`host.power.governor`.
* Files: :mod:`host.power.output` (CSV, JSON, PNG, each written atomically).

Board libraries (``pynq``, ``smbus2``, ``pyxrt``) are imported only when their source is opened;
matplotlib only when a plot is drawn.
"""

from host.power.accounting import Budget, Trace, summarize
from host.power.base import PowerError, PowerSource, Sample, SensorError
from host.power.boards import BOARDS, DEFAULT_BOARD, PowerBoard, get_board, select_rails
from host.power.governor import Governor
from host.power.session import PowerSession
from host.power.sources import SOURCES, make_source

DEFAULT_BUDGET_W = 13.0  #: the MatMul-free LM paper's figure (arXiv 2406.02528), the default budget

__all__ = [
    "BOARDS", "DEFAULT_BOARD", "DEFAULT_BUDGET_W", "SOURCES", "Budget", "Governor", "PowerBoard", "PowerError",
    "PowerSession", "PowerSource", "Sample", "SensorError", "Trace", "get_board", "make_source", "select_rails",
    "summarize",
]
