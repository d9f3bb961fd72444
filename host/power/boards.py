"""Boards for power work: their family, memory, default measured source and default budget rails.

docs/ARCHITECTURE.md section 4: a power budget means something only on a named set of rails (or as draw above
idle), so each board names the rails its budget is checked on by default, for each source:

* KV260: the SOM's 5 V input (``VCC_SOM``), measured by the INA260 (U14, I2C address 0x40 on the
  carrier card's I2C1 bus; Linux device tree ``zynqmp-sck-kv-g-rev*.dtso``);
* ZCU104: the programmable-logic rails reported by ``pynq.get_rails()`` (names matched by pattern,
  :data:`ZYNQMP_PL_RAILS`; the board's labels come from its sensor configuration, so the command lists
  the rails it found when none match);
* Alveo U55C: the card (XRT's ``power_consumption_watts``);
* PYNQ-Z2, ULX3S and ECPIX-5 (no on-board sensors): whatever the external meter logs (every column).

The estimate (:mod:`host.power.estimate`) reports rails ``pl`` (programmable logic: static plus the
accelerator's dynamic power), ``mem`` (dynamic power of moving the weights through DRAM/HBM) and
``rest`` (the rest of what the board's measured rail set draws at idle). Its default budget rails are
those that stand for the board's measured default (``pl`` alone for the ZCU104's PL rails, all three
elsewhere).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field

from host.power.base import PowerError
from hw.boards.facts import BOARDS as FACTS
from hw.boards.facts import DEFAULT_BOARD as DEFAULT_FACTS_BOARD
from hw.boards.facts import BoardFacts

__all__ = ["BOARDS", "DEFAULT_BOARD", "PowerBoard", "ZYNQMP_PL_RAILS", "get_board", "select_rails"]

#: Programmable-logic supplies of a Zynq UltraScale+ MPSoC (DS925 supply names). Matched against the
#: sensor labels case-insensitively, as shell patterns.
ZYNQMP_PL_RAILS = ("VCCINT", "VCCINT_IO", "VCCBRAM", "VCCAUX", "VCCAUX_IO", "MGTAVCC", "MGTAVTT", "MGTVCCAUX")

ALL = ("*",)


@dataclass(frozen=True)
class PowerBoard:
    """A board's power facts: its measured source and default budget rails (the rest, title, family, memory and
    idle draw, from the one table of board facts, :data:`hw.boards.facts.BOARDS`).

    Attributes
    ----------
    key : str
        Name used on the command line (``--board``); a key of :data:`hw.boards.facts.BOARDS`.
    source : str
        The measured source to use on this board (``csv``, ``ina260``, ``pynq``, ``xrt``).
    rail_set : str
        What the default budget rails are, in words.
    default_rails : dict of str to tuple of str
        Default budget rails (shell patterns) per source name; ``("*",)`` is every rail.
    """

    key: str
    source: str
    rail_set: str
    default_rails: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def facts(self) -> BoardFacts:
        """The board's entry of :data:`hw.boards.facts.BOARDS`."""
        return FACTS[self.key]

    @property
    def title(self) -> str:
        return self.facts.title

    @property
    def family(self) -> str:
        """Key of :data:`host.power.estimate.FAMILIES` (``ecp5``, ``zynq7``, ``zynqmp``, ``alveo-hbm``)."""
        return self.facts.family

    @property
    def memory(self) -> str:
        """Key of :data:`host.power.estimate.MEMORIES` (``ddr3``, ``ddr4``, ``hbm2``, ``sdram``)."""
        return self.facts.memory

    def rails_for(self, source: str) -> tuple[str, ...] | None:
        """Default budget rail patterns for ``source`` (None: the board names none for it)."""
        return self.default_rails.get(source)


_METER = "the board's input, as logged by an external meter"

#: One entry per board of :data:`hw.boards.facts.BOARDS`, in its order.
BOARDS: dict[str, PowerBoard] = {b.key: b for b in (
    PowerBoard("ulx3s-85f", "csv", _METER, {"csv": ALL, "replay": ALL, "estimate": ALL}),
    PowerBoard("ecpix5-85f", "csv", _METER, {"csv": ALL, "replay": ALL, "estimate": ALL}),
    PowerBoard("pynq-z2", "csv", _METER, {"csv": ALL, "replay": ALL, "estimate": ALL}),
    PowerBoard("kv260", "ina260", "the SOM's 5 V input (VCC_SOM, INA260 U14)",
               {"ina260": ("som_5v",), "pynq": ("*ina260*",), "csv": ALL, "replay": ALL, "estimate": ALL}),
    PowerBoard("zcu104", "pynq", "the programmable-logic rails (VCCINT, VCCBRAM, VCCAUX, MGT...)",
               {"pynq": ZYNQMP_PL_RAILS, "csv": ALL, "replay": ALL, "estimate": ("pl",)}),
    PowerBoard("u55c", "xrt", "the card (XRT power_consumption_watts)",
               {"xrt": ("card",), "csv": ALL, "replay": ALL, "estimate": ALL}),
)}

#: Board used when none is named (:data:`hw.boards.facts.DEFAULT_BOARD`).
DEFAULT_BOARD = DEFAULT_FACTS_BOARD


def get_board(key: str) -> PowerBoard:
    """The :class:`PowerBoard` named ``key``.

    Raises
    ------
    PowerError
        If ``key`` is unknown (the message lists the boards).
    """
    board = BOARDS.get(key)
    if board is None:
        raise PowerError(f"unknown board {key!r}; known boards: {', '.join(BOARDS)}")
    return board


def select_rails(available: Sequence[str], patterns: Sequence[str], *, what: str = "--rails") -> tuple[str, ...]:
    """The rails of ``available`` matched by ``patterns`` (exact names or shell patterns, any case).

    Parameters
    ----------
    available : sequence of str
        Rails the source reports.
    patterns : sequence of str
        Names or patterns (``"*"`` or ``"all"``: every rail). Each explicit pattern must match a rail;
        for default sets (``what`` not ``"--rails"``) matching at least one rail is enough.
    what : str
        Where the patterns come from, for messages.

    Returns
    -------
    tuple of str
        Matched rails in the order of ``available``.

    Raises
    ------
    PowerError
        If a pattern of ``--rails`` matches nothing, or a default set matches nothing (the message lists
        the available rails and says to pass ``--rails``).
    """
    pats = [("*" if p.strip().lower() == "all" else p.strip()) for p in patterns if p.strip()]
    if not pats:
        raise PowerError(f"{what}: no rails named")
    lowered = {r: r.lower() for r in available}
    chosen: set[str] = set()
    for p in pats:
        hit = {r for r, low in lowered.items() if fnmatch.fnmatchcase(low, p.lower())}
        if not hit and what == "--rails":
            raise PowerError(f"--rails: no rail matches {p!r}; rails found: {', '.join(available)}")
        chosen |= hit
    if not chosen:
        raise PowerError(f"none of the {what} ({', '.join(pats)}) were found; rails found: "
                         f"{', '.join(available)}; pass --rails NAME[,NAME...]")
    return tuple(r for r in available if r in chosen)
