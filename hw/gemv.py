"""The ternary GEMV engine of one weight channel: ``acc[n] = sum_k W[n, k] q[k]`` without multipliers.

Step (2) of a ``GEMV`` instruction (``hw.isa``, "Instructions and the epilogue machine"; docs/RTL.md,
``hw/gemv.py``). Weights arrive as ``TritChunk`` s (:func:`hw.streams.trit_chunk_layout`) from the
channel's ``TritGearbox``; the int8 codes ``q`` come from the code buffer the quantize prologue wrote
(:func:`hw.streams.code_word_layout` words, one per chunk index within a row). Each lane adds, subtracts
or skips its code by its trit (a mux and a negation), a registered adder tree sums the lanes, and a row
accumulator sums a row's chunks. The result is exact: ``|acc| <= 128 K`` fits ``hw.isa.acc_bits_for(K)``
bits, so nothing saturates or wraps.
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import isa
from hw.streams import acc_row_layout, code_word_layout, trit_chunk_layout

__all__ = ["TernaryGemv", "MIN_LANES", "MAX_LANES"]

MIN_LANES = 4
MAX_LANES = 256


class TernaryGemv(wiring.Component):
    """Ternary GEMV: one ``TritChunk`` per cycle in, one ``{acc, last}`` per weight row out.

    Parameters
    ----------
    lanes : int, ``MIN_LANES`` (4) .. ``MAX_LANES`` (256)
        Trits (and codes) per chunk; any value in range, not only powers of two.
    acc_bits : int, default ``hw.isa.ACC_BITS`` (22)
        Width of the signed row accumulator and of ``o.payload.acc``; at least
        ``hw.isa.acc_bits_for(max_k)`` (so no row sum can overflow) and at most 64.
    max_k : int, default ``hw.isa.MAX_K`` (8192)
        Longest row (trits) supported, ``lanes .. 65535``; sets ``code_depth = ceil(max_k / lanes)``,
        the code buffer's depth, and with it the width of ``codes.addr``. (An addition to the
        docs/RTL.md parameters, with the ISA's limit as default.)

    Attributes
    ----------
    i : In(stream.Signature(trit_chunk_layout(lanes)))
        The weight chunks, in row order (``first`` on a row's first chunk, ``last`` on its last, ``end``
        on the block's last chunk). Lanes ``>= count`` are masked to zero whatever their trits; a trit
        of ``-2`` (the invalid code ``0b10``, flagged by the gearbox) counts as 0, as
        ``hw.isa.BITS2_DECODE`` decodes it. ``i.ready`` depends only on internal state (credits for the
        output FIFO); it is 1 whenever fewer than ``fifo_depth`` rows are in flight or unread.
    codes : In(memory.ReadPort.Signature(addr_width=ceil_log2(code_depth), shape=code_word_layout(lanes)))
        A synchronous read port on the code buffer, to be ``connect`` ed to ``Memory.read_port()`` (the
        memory being ``Memory(shape=code_word_layout(lanes), depth=code_depth)``): the component drives
        ``addr`` (the chunk index within the row: 0 for a ``first`` chunk, then +1 per chunk) and ``en``
        (1 exactly in the cycles a chunk is transferred on ``i``), and uses ``data`` in the cycle after
        a transfer, so ``data`` must be the word at the ``addr`` of the previous cycle, as a
        ``lib.memory`` read port (non-transparent, ``domain="sync"``) delivers it. A port that reads
        every cycle regardless of ``en`` works too. Word ``c`` holds codes ``q[c*lanes .. c*lanes +
        lanes-1]``. Rows longer than ``max_k`` trits are not supported (the address wraps).
    o : Out(stream.Signature(acc_row_layout(acc_bits)))
        One payload per row, in row order: ``acc`` (``signed(acc_bits)``) = ``sum_k W[n, k] q[k]``,
        exact, and ``last`` = the ``end`` flag of the row's last chunk. Driven by a ``SyncFIFOBuffered``
        (``valid`` never waits for ``ready``; payload stable until transferred).

    Timing
    ------
    Cycle 0: a chunk transfers on ``i`` (``codes.addr``/``codes.en`` presented). Cycle 1: ``codes.data``
    arrives; per lane ``term = +q``, ``-q`` or 0 (9 bits, no multiplier) is registered. Then one
    register per adder-tree level (``tree_levels = ceil(log2(lanes))``), the accumulator register,
    the FIFO (2 cycles). :attr:`latency` = ``tree_levels + 5`` cycles from the transfer of a row's last
    chunk to ``o.valid`` of that row with an empty FIFO (7 for 4 lanes, 9 for 16, 11 for 64, 13 for 256).
    The pipeline itself never stalls: input acceptance is throttled by credits (rows accepted minus rows
    read from ``o``, at most ``fifo_depth = latency + 1``), which sustains one chunk per cycle, even with
    one-chunk rows, while ``o.ready`` stays 1; backpressure on ``o`` fills the FIFO and then deasserts
    ``i.ready``, and no row is ever lost.

    Resources: no multipliers (``$neg``, ``$add``, muxes only); ``lanes`` 9-bit terms plus a
    registered tree (about ``lanes * (9 + tree_levels)`` flip-flops); one ``fifo_depth - 1`` deep,
    ``acc_bits + 1`` wide memory (FIFO; LUT RAM); the code buffer is outside.

    Raises
    ------
    TypeError
        If a parameter is not an int.
    ValueError
        If a parameter is out of range.
    """

    #: Cycles of :attr:`latency` besides the adder tree's levels: 1 (code read) + 1 (lane terms) + 1
    #: (accumulator) + 2 (``SyncFIFOBuffered``) (``host.perf.GEMV_LATENCY``)
    BASE_LATENCY = 5

    @classmethod
    def latency_for(cls, lanes: int) -> int:
        """:attr:`latency` of a GEMV of ``lanes`` lanes, without an instance: ``ceil(log2(lanes)) +
        BASE_LATENCY`` cycles from the transfer of a row's last chunk on ``i`` to ``o.valid`` for that row
        (empty FIFO).

        Raises
        ------
        TypeError, ValueError
            If ``lanes`` is not an int >= 1.
        """
        if isinstance(lanes, bool) or not isinstance(lanes, int):
            raise TypeError(f"lanes must be an int, not {lanes!r}")
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        return ceil_log2(lanes) + cls.BASE_LATENCY

    def __init__(self, *, lanes: int, acc_bits: int = isa.ACC_BITS, max_k: int = isa.MAX_K):
        for name, value in (("lanes", lanes), ("acc_bits", acc_bits), ("max_k", max_k)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {value!r}")
        if not MIN_LANES <= lanes <= MAX_LANES:
            raise ValueError(f"lanes must be in {MIN_LANES}..{MAX_LANES}, got {lanes}")
        if not lanes <= max_k <= 0xFFFF:
            raise ValueError(f"max_k must be in lanes ({lanes})..65535, got {max_k}")
        need = isa.acc_bits_for(max_k)
        if not need <= acc_bits <= 64:
            raise ValueError(f"acc_bits must be in {need}..64 (hw.isa.acc_bits_for(max_k={max_k}) = {need}), "
                             f"got {acc_bits}")
        self._lanes = lanes
        self._acc_bits = acc_bits
        self._max_k = max_k
        self._code_depth = -(-max_k // lanes)
        self._tree_levels = ceil_log2(lanes)
        super().__init__({
            "i": In(stream.Signature(trit_chunk_layout(lanes))),
            "codes": In(memory.ReadPort.Signature(addr_width=ceil_log2(self._code_depth),
                                                  shape=code_word_layout(lanes))),
            "o": Out(stream.Signature(acc_row_layout(acc_bits))),
        })

    @property
    def lanes(self) -> int:
        """Trits per chunk."""
        return self._lanes

    @property
    def acc_bits(self) -> int:
        """Width of the signed accumulator ``o.payload.acc``."""
        return self._acc_bits

    @property
    def max_k(self) -> int:
        """Longest supported row, in trits."""
        return self._max_k

    @property
    def code_depth(self) -> int:
        """Words of the code buffer ``codes`` addresses: ``ceil(max_k / lanes)``."""
        return self._code_depth

    @property
    def tree_levels(self) -> int:
        """Adder-tree levels, each registered: ``ceil(log2(lanes))``."""
        return self._tree_levels

    @property
    def latency(self) -> int:
        """Cycles from the transfer of a row's last chunk on ``i`` to ``o.valid`` for that row (empty FIFO).

        1 (code read) + 1 (lane terms) + ``tree_levels`` + 1 (accumulator) + 2 (``SyncFIFOBuffered``):
        :meth:`latency_for` ``(lanes)``.
        """
        return self.latency_for(self._lanes)

    @property
    def fifo_depth(self) -> int:
        """Output FIFO entries, and the credits: rows accepted on ``i`` but not yet read from ``o``."""
        return self.latency + 1

    def elaborate(self, platform):
        m = Module()
        lanes = self._lanes
        ctl_layout = data.StructLayout({"valid": 1, "first": 1, "last": 1, "end": 1})

        # ---- stage 0: accept a chunk (credit-throttled), address its code word
        outstanding = Signal(range(self.fifo_depth + 1))
        transfer = Signal()
        m.d.comb += [
            self.i.ready.eq(outstanding != self.fifo_depth),
            transfer.eq(self.i.valid & self.i.ready),
        ]
        row_taken = transfer & self.i.payload.last
        row_given = self.o.valid & self.o.ready
        m.d.sync += outstanding.eq(outstanding + row_taken - row_given)

        idx = Signal.like(self.codes.addr)           # chunk index of the next chunk within its row
        addr = Mux(self.i.payload.first, 0, idx)
        m.d.comb += [
            self.codes.addr.eq(addr),
            self.codes.en.eq(transfer),
        ]
        with m.If(transfer):
            m.d.sync += idx.eq(Mux(self.i.payload.last, 0, addr + 1))

        # ---- stage 1: the chunk waits one cycle for its code word
        s1_ctl = Signal(ctl_layout)
        s1_trits = Signal(self.i.payload.trits.shape())
        s1_count = Signal.like(self.i.payload.count)
        m.d.sync += [
            s1_ctl.valid.eq(transfer),
            s1_ctl.first.eq(self.i.payload.first),
            s1_ctl.last.eq(self.i.payload.last),
            s1_ctl.end.eq(self.i.payload.end),
            s1_trits.eq(self.i.payload.trits),
            s1_count.eq(self.i.payload.count),
        ]

        # ---- stage 2: per lane +q, -q or 0 (9 bits: -(-128) = +128); lanes >= count are zero
        level = []
        for j in range(lanes):
            q = self.codes.data[j]
            trit = s1_trits[j]
            live = s1_count > j
            term = Signal(signed(9), name=f"term{j}")
            m.d.sync += term.eq(Mux(live & (trit == 1), q, Mux(live & (trit == -1), -q, 0)))
            level.append(term)
        ctl = Signal(ctl_layout, name="s2_ctl")
        m.d.sync += ctl.eq(s1_ctl)

        # ---- adder tree: one register per level; level l values are signed(9 + l) (<= 2**l terms)
        for lvl in range(1, self._tree_levels + 1):
            nxt = []
            for j in range(0, len(level), 2):
                s = Signal(signed(9 + lvl), name=f"sum{lvl}_{j // 2}")
                m.d.sync += s.eq(level[j] + level[j + 1] if j + 1 < len(level) else level[j])
                nxt.append(s)
            level = nxt
            ctl_next = Signal(ctl_layout, name=f"tree{lvl}_ctl")
            m.d.sync += ctl_next.eq(ctl)
            ctl = ctl_next
        (chunk_sum,) = level

        # ---- row accumulator: restart on `first`, emit on `last`
        acc = Signal(signed(self._acc_bits))
        acc_next = Mux(ctl.first, 0, acc) + chunk_sum
        with m.If(ctl.valid):
            m.d.sync += acc.eq(acc_next)
        row = stream.Signature(acc_row_layout(self._acc_bits)).create(path=("row",))
        m.d.sync += [
            row.valid.eq(ctl.valid & ctl.last),
            row.payload.acc.eq(acc_next),
            row.payload.last.eq(ctl.end),
        ]

        # ---- output FIFO; the credits guarantee room for every row in flight (row.ready is always 1
        # when row.valid is: fifo_depth >= 3, see SyncFIFOBuffered.w_rdy)
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=row.payload.shape().size, depth=self.fifo_depth)
        wiring.connect(m, row, fifo.w_stream)
        wiring.connect(m, fifo.r_stream, wiring.flipped(self.o))
        return m
