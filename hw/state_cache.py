"""The recurrent state in board DRAM: a cache of one layer's state in the core, the two banks in DRAM.

At the 370M shape (hidden 1024, 24 layers) the core's two banks of recurrent state (``2 x max_layers x
max_hidden`` int32) would take most of the ECPIX-5's block RAM (docs/DDR3.md). A build with
``state_in_dram`` (:class:`hw.params.BuildParams`) keeps only the layer in flight on chip:
:class:`StateCache` holds its ``STATE_OLD`` row (``h_{t-1}``) and its ``STATE_NEW`` row (``h_t``), and
moves rows to and from the board's DRAM through three streams the board serves (:class:`hw.boards.
dram_board.DRAMBoard`):

- ``cmd`` (:class:`StateCmd`): one transfer of one layer's row, ``write`` (the ``STATE_NEW`` row to DRAM) or
  a fill (a row from DRAM into the cache), of ``bank`` and ``layer``;
- ``wb``: a write's beats, :func:`state_beats` 64-bit beats (elements ``2j`` and ``2j + 1`` in bits 0-31 and
  32-63 of beat ``j``: the int32 row little-endian, as the host reads it), ``tlast`` on the last;
- ``fill``: a fill's beats, the same layout.

The board places row ``(bank, layer)`` at byte ``StateGeometry.offset(bank, layer)`` of a region at the top of
its DRAM (:class:`StateGeometry`). It takes a command's beats in order and finishes a write (every word
accepted by the controller) before it starts the next command, so a fill after a write of the same row reads
what was written.

When a swap happens (:attr:`StateCache.need`, decided by the sequencer at an instruction's dispatch): the next
instruction touches the state (a micro-op with ``buf`` ``STATE_OLD`` or ``STATE_NEW``) of a layer other than
the cached one, or it is ``END_TOKEN`` and the cached ``STATE_NEW`` row was written. A swap writes the cached
``STATE_NEW`` row back to bank ``~bank`` (the bank ``END_TOKEN`` commits) when an instruction wrote it, then,
unless the swap is ``END_TOKEN``'s, fills the ``STATE_OLD`` row from bank ``bank`` (the committed state; no
fill while the state reads as zero, ``state_valid`` low) and the ``STATE_NEW`` row from bank ``~bank`` if the
token wrote that layer back before (a program that returns to a layer). The committed bank is never
written, so a token that stops in error leaves the committed state as it was, as the on-chip banks do.

Cycles (``host.perf``): a write-back reads an element a cycle (:func:`state_beats` x 2 cycles), a fill writes
one a cycle; the board's DRAM latency comes on top.
"""


from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.memory import ReadPort, WritePort
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import isa
from hw.isa import Buffer
from hw.state_layout import STATE_BEAT_BITS, StateGeometry, state_beats
from hw.streams import AXIStreamSignature

__all__ = ["StateCmd", "StateGeometry", "StateCache", "state_beats", "STATE_BEAT_BITS"]

INT32 = signed(32)


class StateCmd(data.Struct):
    """``StateCache.cmd``'s payload: one row transfer.

    ``write``: 1 for a write-back (the ``STATE_NEW`` row to DRAM, its beats on ``wb``), 0 for a fill (the row
    from DRAM, its beats on ``fill``); ``bank``: the DRAM bank (0 or 1); ``layer``: the row's layer.
    """

    write: unsigned(1)
    bank: unsigned(1)
    layer: unsigned(8)


def touches_state(ops, n_ops) -> Signal:
    """1 when one of the first ``n_ops`` micro-ops of ``ops`` (``ArrayLayout(MicroOp, MAX_OPS)``) reads or
    writes ``STATE_OLD`` or ``STATE_NEW``."""
    hits = [((ops[j].buf == Buffer.STATE_OLD) | (ops[j].buf == Buffer.STATE_NEW)) & (n_ops > j)
            for j in range(isa.MAX_OPS)]
    return Cat(*hits).any()


class StateCache(wiring.Component):
    """One layer's ``STATE_OLD`` and ``STATE_NEW`` rows on chip, the rest in DRAM (module notes).

    Parameters
    ----------
    max_hidden, max_layers : int
        The build's capacities: a row holds ``max_hidden`` int32; layers ``0 .. max_layers - 1``.
    index_bits : int
        Address bits of the epilogue's ports (element indices; :class:`hw.epilogue.Epilogue`'s).

    Members
    -------
    rd_old, rd_new : Out(ReadPort.Signature(addr_width=index_bits, shape=signed(32)))
        The epilogue's reads of ``STATE_OLD`` and ``STATE_NEW`` (synchronous, ``data`` a cycle after ``addr``
        with ``en``; ``connect`` to the epilogue's ``rd_state_old``/``rd_state_new``). ``rd_old`` reads 0
        while ``state_valid`` is low.
    wr_new : Out(WritePort.Signature(addr_width=index_bits, shape=signed(32)))
        The epilogue's writes of ``STATE_NEW`` (they mark the row written).
    layer : In(8); uses_state : In(1); end : In(1)
        The next instruction's layer, whether it touches the state (:func:`touches_state`), whether it is
        ``END_TOKEN``: they decide :attr:`need`.
    bank : In(1); state_valid : In(1)
        The committed bank and whether the committed state is valid (the sequencer's).
    need : Out(1)
        The next instruction needs a swap first (0 while :attr:`busy`).
    start : In(1)
        Start the swap :attr:`need` asks for (ignored unless :attr:`need`).
    busy : Out(1)
        A swap is in progress.
    flush : In(1)
        Forget the cached row and the rows written back (``END_TOKEN``'s commit, an error): the next swap
        fills from DRAM. A swap in progress completes its transfers; its row is not kept.
    cmd : Out(stream.Signature(StateCmd))
    wb : Out(AXIStreamSignature(64))
    fill : In(AXIStreamSignature(64))
        To the board (module notes).
    """

    #: Cycles from the dispatch that starts a swap to the instruction's dispatch, beyond its transfers: ``start``,
    #: the cache's NEXT and DONE states, the sequencer's return to DISPATCH (``host.perf.state_swap_cycles``)
    SWAP_CYCLES = 4
    #: A write-back's cycles beyond two a beat (an element read a cycle), with the board taking every beat
    WRITE_BACK_CYCLES = 3
    #: A fill's cycles beyond two a beat (an element written a cycle) and the board's latency to its first beat
    FILL_CYCLES = 1

    def __init__(self, *, max_hidden: int, max_layers: int, index_bits: int = 16):
        if max_layers > 1 << 8:
            raise ValueError(f"max_layers must be <= 256 (StateCmd.layer), got {max_layers}")
        self._max_hidden, self._max_layers, self._index_bits = max_hidden, max_layers, index_bits
        rd = ReadPort.Signature(addr_width=index_bits, shape=INT32)
        wr = WritePort.Signature(addr_width=index_bits, shape=INT32)
        super().__init__({
            "rd_old": Out(rd), "rd_new": Out(rd), "wr_new": Out(wr),
            "layer": In(8), "uses_state": In(1), "end": In(1), "bank": In(1), "state_valid": In(1),
            "need": Out(1), "start": In(1), "busy": Out(1), "flush": In(1),
            "cmd": Out(stream.Signature(StateCmd)),
            "wb": Out(AXIStreamSignature(STATE_BEAT_BITS)),
            "fill": In(AXIStreamSignature(STATE_BEAT_BITS)),
        })

    @property
    def beats(self) -> int:
        """Beats of a row transfer (:func:`state_beats`)."""
        return state_beats(self._max_hidden)

    def elaborate(self, platform):
        m = Module()
        half = 1 << ceil_log2(self._max_hidden)   # a row's elements, rounded up to a power of two
        hb = ceil_log2(half)
        n_el = 2 * self.beats                       # elements a transfer moves
        nl = self._max_layers
        # [STATE_OLD row | STATE_NEW row]: the row bit above the element index
        m.submodules.rows = rows = memory.Memory(shape=INT32, depth=2 * half, init=[])
        p_old, p_new, p_wr = rows.read_port(), rows.read_port(), rows.write_port()

        cur = Signal(8)              # the cached layer
        loaded = Signal()            # the rows hold layer `cur` of this token
        dirty = Signal()             # the STATE_NEW row was written since it was filled
        written = Signal(nl)         # layers whose STATE_NEW row this token wrote back to bank ~bank
        flushed = Signal()           # a flush came during the swap in progress

        def elem(addr):
            return addr[:hb] if hb else Const(0, 0)

        # the epilogue's ports (idle during a swap)
        m.d.comb += [p_old.addr.eq(Cat(elem(self.rd_old.addr), Const(0, 1))), p_old.en.eq(self.rd_old.en),
                     self.rd_old.data.eq(Mux(self.state_valid, p_old.data, 0)),
                     self.rd_new.data.eq(p_new.data)]

        # what the next instruction needs
        other = ~loaded | (self.layer != cur)
        m.d.comb += self.need.eq(~self.busy & Mux(self.end, dirty, self.uses_state & other))

        # a swap's transfers
        idx = Signal(range(n_el + 1))               # element counter of the transfer in progress
        target = Signal()                           # a fill's row: 0 STATE_OLD, 1 STATE_NEW
        lo = Signal(32)                             # write-back: the even element of the beat being formed
        beat_valid = Signal()
        beat = Signal(STATE_BEAT_BITS)
        pending = Signal()                          # write-back: a read was issued last cycle
        pending_odd = Signal()
        hi = Signal(32)                             # fill: the odd element, written the cycle after
        second = Signal()
        nxt_layer, is_end = Signal(8), Signal()
        layer_bit = written.bit_select(nxt_layer[:ceil_log2(nl)], 1) if nl > 1 else written[0]

        with m.FSM(name="state_cache"):
            with m.State("IDLE"):
                m.d.comb += [p_new.addr.eq(Cat(elem(self.rd_new.addr), Const(1, 1))), p_new.en.eq(self.rd_new.en),
                             p_wr.addr.eq(Cat(elem(self.wr_new.addr), Const(1, 1))), p_wr.data.eq(self.wr_new.data),
                             p_wr.en.eq(self.wr_new.en)]
                with m.If(self.wr_new.en):
                    m.d.sync += dirty.eq(1)
                with m.If(self.start & self.need):
                    m.d.sync += [nxt_layer.eq(self.layer), is_end.eq(self.end), flushed.eq(0)]
                    with m.If(dirty):
                        m.next = "WB_CMD"
                    with m.Else():
                        m.next = "NEXT"
            # ---- the STATE_NEW row to bank ~bank
            with m.State("WB_CMD"):
                m.d.comb += [self.busy.eq(1), self.cmd.valid.eq(1), self.cmd.payload.write.eq(1),
                             self.cmd.payload.bank.eq(~self.bank), self.cmd.payload.layer.eq(cur)]
                m.d.sync += [idx.eq(0), pending.eq(0), beat_valid.eq(0)]
                with m.If(self.cmd.ready):
                    m.next = "WB"
            with m.State("WB"):
                m.d.comb += [self.busy.eq(1), self.wb.tdata.eq(beat), self.wb.tvalid.eq(beat_valid),
                             self.wb.tlast.eq(idx == n_el)]
                sent = beat_valid & self.wb.tready
                with m.If(sent):
                    m.d.sync += beat_valid.eq(0)
                # the element read last cycle: an even one into `lo`, an odd one completes the beat
                with m.If(pending):
                    with m.If(pending_odd):
                        m.d.sync += [beat.eq(Cat(lo, p_new.data)), beat_valid.eq(1)]
                    with m.Else():
                        m.d.sync += lo.eq(p_new.data)
                # read element idx: an even one always, an odd one only when its beat's slot is free
                slot_free = ~beat_valid | sent
                odd = idx[0]
                go = (idx != n_el) & (~odd | (slot_free & ~(pending & pending_odd)))
                m.d.comb += [p_new.addr.eq(Cat(idx[:hb] if hb else Const(0, 0), Const(1, 1))), p_new.en.eq(go)]
                m.d.sync += [pending.eq(go), pending_odd.eq(odd)]
                with m.If(go):
                    m.d.sync += idx.eq(idx + 1)
                with m.If(sent & self.wb.tlast):
                    m.d.sync += [dirty.eq(0), written.bit_select(cur[:ceil_log2(nl)], 1).eq(1) if nl > 1
                                 else written[0].eq(1)]
                    m.next = "NEXT"
            # ---- the fills of the next layer
            with m.State("NEXT"):
                m.d.comb += self.busy.eq(1)
                with m.If(is_end):
                    m.next = "DONE"
                with m.Elif(self.state_valid):
                    m.d.sync += target.eq(0)
                    m.next = "FILL_CMD"
                with m.Elif(layer_bit):
                    m.d.sync += target.eq(1)
                    m.next = "FILL_CMD"
                with m.Else():
                    m.next = "DONE"
            with m.State("FILL_CMD"):
                m.d.comb += [self.busy.eq(1), self.cmd.valid.eq(1), self.cmd.payload.write.eq(0),
                             self.cmd.payload.bank.eq(self.bank ^ target), self.cmd.payload.layer.eq(nxt_layer)]
                m.d.sync += [idx.eq(0), second.eq(0)]
                with m.If(self.cmd.ready):
                    m.next = "FILL"
            with m.State("FILL"):
                m.d.comb += [self.busy.eq(1), self.fill.tready.eq(~second),
                             p_wr.addr.eq(Cat(idx[:hb] if hb else Const(0, 0), target))]
                with m.If(second):
                    m.d.comb += [p_wr.data.eq(hi), p_wr.en.eq(idx < self._max_hidden)]
                    m.d.sync += [second.eq(0), idx.eq(idx + 1)]
                    with m.If(idx == n_el - 1):
                        with m.If(~target & layer_bit):
                            m.d.sync += target.eq(1)
                            m.next = "FILL_CMD"
                        with m.Else():
                            m.next = "DONE"
                with m.Elif(self.fill.tvalid):
                    m.d.comb += [p_wr.data.eq(self.fill.tdata[:32]), p_wr.en.eq(idx < self._max_hidden)]
                    m.d.sync += [hi.eq(self.fill.tdata[32:]), second.eq(1), idx.eq(idx + 1)]
            with m.State("DONE"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += [cur.eq(nxt_layer), loaded.eq(~is_end & ~flushed & ~self.flush)]
                with m.If(flushed):     # what the swap wrote back belongs to a token that ended
                    m.d.sync += written.eq(0)
                m.next = "IDLE"

        with m.If(self.flush):
            m.d.sync += [loaded.eq(0), dirty.eq(0), written.eq(0), flushed.eq(1)]
        return m
