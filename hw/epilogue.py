"""The epilogue: dequantization and the micro-op program, one element at a time (docs/RTL.md, ``hw/epilogue.py``).

Every output element of a GEMV (or every token word of LOAD_TOKEN) enters with its index; the unit forms
the register file ``r0..r3`` (``hw.isa`` module docstring: ``r0 = acc * S``, ``r1 = acc``, ``r2 = r3 = 0``,
or ``r0 = r1 = x[n]`` for ``raw`` inputs), runs the instruction's :data:`hw.isa.MAX_OPS` micro-ops (NOP
beyond ``n_ops``) and leaves with its buffer writes, reductions, argmax and logit. The arithmetic is that of
:mod:`hw.numerics` and of ``_Executor._epilogue`` in :mod:`host.devices.golden`, bit for bit.

Two forms with one signature (:class:`~hw.epilogue_base.EpilogueBase`), built from the same pieces:

* :class:`~hw.epilogue_pipelined.PipelinedEpilogue`: :data:`~hw.isa.MAX_OPS` stages in a row, an element
  every cycle (``hw/epilogue_pipelined.py``);
* :class:`~hw.epilogue_folded.FoldedEpilogue`: one stage closed into a ring, an element every
  ``max(n_ops, 1)`` cycles, at an eighth of the stages' multipliers and logic (``hw/epilogue_folded.py``).

Shared: the entry, the exit and the reduction fold (``hw/epilogue_base.py``); the configuration, the
micro-op decode, the stage and the reducer (``hw/epilogue_stage.py``); the arithmetic
(``hw/epilogue_arith.py``). :func:`Epilogue` builds either form; :func:`epilogue_class` gives the class,
whose latencies are class attributes and class methods (no instance, no elaboration).
"""

from hw import isa
from hw import numerics as nx
from hw.epilogue_base import EpilogueBase
from hw.epilogue_folded import FoldedEpilogue
from hw.epilogue_pipelined import PipelinedEpilogue
from hw.epilogue_stage import ENTRY_LATENCY, READ_BUFFERS, STAGE_LATENCY, WRITE_BUFFERS, EpilogueConfig, input_layout

__all__ = ["Epilogue", "epilogue_class", "EpilogueBase", "PipelinedEpilogue", "FoldedEpilogue", "EpilogueConfig",
           "input_layout", "READ_BUFFERS", "WRITE_BUFFERS", "ENTRY_LATENCY", "STAGE_LATENCY"]


def epilogue_class(folded: bool) -> type[EpilogueBase]:
    """:class:`FoldedEpilogue` if ``folded`` else :class:`PipelinedEpilogue` (for their class attributes:
    ``latency_for(n_ops)``, ``LATENCY``, ``INTERVAL``, ``DONE_LATENCY``, ``MULTIPLIERS``, ``ROM_COPIES``).

    Raises
    ------
    TypeError
        If ``folded`` is not a bool.
    """
    if not isinstance(folded, bool):
        raise TypeError(f"folded must be a bool, got {folded!r}")
    return FoldedEpilogue if folded else PipelinedEpilogue


def Epilogue(*, lut_segments_log2: int = nx.LUT_SEGMENTS_LOG2, acc_bits: int = isa.ACC_BITS,
             index_bits: int = 16, folded: bool = False) -> EpilogueBase:
    """The epilogue of one instruction, in either form (a :class:`~hw.epilogue_base.EpilogueBase`: its
    parameters, ports and properties).

    Parameters
    ----------
    lut_segments_log2, acc_bits, index_bits : int
        As :class:`~hw.epilogue_base.EpilogueBase`.
    folded : bool
        One micro-op stage that every element passes once per micro-op slot (a ring,
        :class:`FoldedEpilogue`) instead of :data:`~hw.isa.MAX_OPS` stages in a row
        (:class:`PipelinedEpilogue`): an element every ``max(n_ops, 1)`` cycles instead of every cycle, at
        an eighth of the stages' multipliers, registers and logic (the ECP5 builds).

    Raises
    ------
    TypeError
        If ``folded`` is not a bool or another parameter not an int (all are keyword-only).
    ValueError
        If a parameter is out of range.
    """
    # src_loc_at: the caller, not this function, is where the component was made (source locations, and
    # Amaranth's unused-elaboratable warning with its per-file switch)
    return epilogue_class(folded)(lut_segments_log2=lut_segments_log2, acc_bits=acc_bits, index_bits=index_bits,
                                  src_loc_at=1)
