"""Writes a stream of beats into board DRAM through a LiteDRAM native port (loading the image once).

:class:`DRAMStreamWriter` takes a request (base byte address, byte length) and then ``length`` bytes as beats
on ``i``, splits each beat into port words and issues one write command per word. LiteDRAM takes a write's
data when it raises ``wdata.ready``, without waiting (:class:`hw.dram.NativePortSignature`), so a word enters
the writer's data FIFO in the same cycle as its command is accepted and leaves it on ``wdata.ready``: the
data is there before the controller asks (``LiteDRAMDMAWriter``, ``litedram/frontend/dma.py``, does the same).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw.dram import NativePortSignature
from hw.dram_reader import check_port_widths, dram_request_layout

__all__ = ["DRAMStreamWriter", "serve_wdata", "writer_members"]


def writer_members(*, addr_width: int, port_width: int, beat_width: int) -> dict:
    """The members of a DRAM stream writer (:class:`DRAMStreamWriter`, :class:`hw.dram_wide_writer.DRAMWideWriter`):
    ``req`` (byte address and beats), ``i`` (the beats), ``port`` (the controller's native port), ``busy``,
    ``error``."""
    byte_addr_width = addr_width + ceil_log2(port_width // 8)
    return {
        "req": In(stream.Signature(dram_request_layout(byte_addr_width))),
        "i": In(stream.Signature(beat_width)),
        "port": Out(NativePortSignature(addr_width=addr_width, data_width=port_width)),
        "busy": Out(1),
        "error": Out(1),
    }


def serve_wdata(m: Module, writer, data, we, fifo, to_take: Signal, error: Signal) -> None:
    """A DRAM stream writer's write data on the controller's demand, and its ``busy``/``error`` outputs (both
    writers): each ``wdata.ready`` takes ``data``/``we`` from ``fifo`` and counts down ``to_take`` (the words of
    the commands issued and not yet taken); a demand that finds ``fifo`` empty sets ``error``."""
    wdata = writer.port.wdata
    m.d.comb += [wdata.payload.data.eq(data), wdata.payload.we.eq(we), fifo.r_en.eq(wdata.ready)]
    with m.If(wdata.ready):
        m.d.sync += to_take.eq(to_take - 1)
        with m.If(~fifo.r_rdy):
            m.d.sync += error.eq(1)
    m.d.comb += [writer.busy.eq(to_take != 0), writer.error.eq(error)]


class DRAMStreamWriter(wiring.Component):
    """Writes ``length`` bytes from ``i`` to DRAM at ``base``.

    Parameters
    ----------
    addr_width : int, >= 1
        The port's word address bits (24 for the ULX3S core).
    port_width : int
        The port's word bits (16 for the ULX3S core); a power-of-two multiple of 8 dividing ``beat_width``.
    beat_width : int
        Input beat bits (byte ``k`` of a beat in bits ``8k ..``, little-endian).
    depth : int, >= 2
        Words whose command is accepted but whose data the controller has not yet taken (default 16).

    Members
    -------
    req : In(stream.Signature(dram_request_layout(addr_width + log2(port_width / 8))))
        Accepted while idle; low bits as :class:`hw.dram_reader.DRAMImageReader` (base: below the word;
        length: below the beat).
    i : In(stream.Signature(beat_width))
        ``length // (beat_width / 8)`` beats.
    port : Out(NativePortSignature(addr_width=addr_width, data_width=port_width))
        To the controller's native port (writes only, every byte enabled).
    busy : Out(1)
        A request is in progress (until the controller has taken the last word's data).
    error : Out(1)
        The controller asked for data the writer did not have (``wdata.ready`` with the data FIFO empty:
        a controller contract this writer relies on was broken); sticky until reset.

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or out of range.
    """

    def __init__(self, *, addr_width: int, port_width: int = 16, beat_width: int = 64, depth: int = 16):
        check_port_widths(addr_width=addr_width, port_width=port_width, beat_width=beat_width, depth=depth)
        self._addr_width, self._port_width, self._beat_width, self._depth = addr_width, port_width, beat_width, depth
        super().__init__(writer_members(addr_width=addr_width, port_width=port_width, beat_width=beat_width))

    def elaborate(self, platform):
        m = Module()
        ratio = self._beat_width // self._port_width
        word_shift = ceil_log2(self._port_width // 8)
        beat_shift = ceil_log2(self._beat_width // 8)
        words_width = self._addr_width + 2

        m.submodules.fifo = fifo = SyncFIFOBuffered(width=self._port_width, depth=self._depth)
        addr = Signal(self._addr_width)
        to_issue = Signal(words_width)
        to_take = Signal(words_width)
        beat = Signal(self._beat_width)
        have = Signal(range(ratio + 1))   # words of `beat` still to issue
        error = Signal()

        m.d.comb += self.req.ready.eq((to_take == 0) & ~error)
        with m.If(self.req.valid & self.req.ready):
            words = (self.req.payload.length >> beat_shift) * ratio
            m.d.sync += [addr.eq(self.req.payload.base >> word_shift), to_issue.eq(words), to_take.eq(words)]

        # split beats into words
        cmd = self.port.cmd
        m.d.comb += [cmd.valid.eq((have != 0) & fifo.w_rdy & ~error), cmd.payload.we.eq(1),
                     cmd.payload.addr.eq(addr)]
        issued = cmd.valid & cmd.ready
        # a new beat when the held one is spent (or being spent) and words remain beyond it
        m.d.comb += self.i.ready.eq(((have == 0) & (to_issue != 0)) | (issued & (have == 1) & (to_issue != 1)))
        m.d.comb += [fifo.w_data.eq(beat[:self._port_width]), fifo.w_en.eq(issued)]
        with m.If(issued):
            m.d.sync += [addr.eq(addr + 1), to_issue.eq(to_issue - 1), have.eq(have - 1),
                         beat.eq(beat >> self._port_width)]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [beat.eq(self.i.payload), have.eq(ratio)]

        serve_wdata(m, self, fifo.r_data, (1 << (self._port_width // 8)) - 1, fifo, to_take, error)
        return m
