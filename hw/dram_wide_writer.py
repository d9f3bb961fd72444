"""Writes a stream of beats into board DRAM through a LiteDRAM native port whose word holds several beats (the
ECPIX-5 DDR3 core's 128-bit port and the link's 64-bit beats: two beats a word).

:class:`DRAMWideWriter` is :class:`hw.dram_writer.DRAMStreamWriter` for a port wider than a beat. It gathers the
beats of one port word (the lower-addressed beat in the word's low bits, little-endian as the rest of the
board) and writes the word with one command whose byte enables (``wdata.we``) cover only the beats it holds:
a range that starts or ends mid-word leaves the word's other bytes as they were. The data contract is the
stream writer's: a word enters the data FIFO in the cycle its command is accepted and leaves it on
``wdata.ready`` (:class:`hw.dram.NativePortSignature`).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.utils import ceil_log2

from hw.dram_reader import check_port_widths
from hw.dram_writer import serve_wdata, writer_members

__all__ = ["DRAMWideWriter"]


class DRAMWideWriter(wiring.Component):
    """Writes ``length`` bytes from ``i`` to DRAM at ``base``, through a port of ``n`` beats a word.

    Parameters
    ----------
    addr_width : int, >= 1
        The port's word address bits (25 for the ECPIX-5's DDR3 core: 512 MiB of 128-bit words).
    port_width : int
        The port's word bits (128 for the ECPIX-5's DDR3 core): a power-of-two multiple of ``beat_width``
        other than 1 (a port no wider than a beat is :class:`hw.dram_writer.DRAMStreamWriter`'s).
    beat_width : int
        Input beat bits (64: the link's ``'L'`` beats), a power-of-two multiple of 8; byte ``k`` of a beat in
        bits ``8k ..``.
    depth : int, >= 2
        Words whose command is accepted but whose data the controller has not yet taken (default 16).

    Members
    -------
    req : In(stream.Signature(dram_request_layout(addr_width + log2(port_width / 8))))
        Accepted while idle. ``base``'s bits below the beat and ``length``'s bits below the beat are ignored
        (whole beats at beat-aligned addresses).
    i : In(stream.Signature(beat_width))
        ``length // (beat_width / 8)`` beats, taken at up to one a cycle.
    port : Out(NativePortSignature(addr_width=addr_width, data_width=port_width))
        To the controller's native port (writes only): ``ceil((first + beats) / n)`` commands for a request of
        ``beats`` beats whose first is beat ``first`` of its word, each word's byte enables set for the beats
        of the request it holds and clear for the others.
    busy : Out(1)
        A request is in progress (until the controller has taken the last word's data).
    error : Out(1)
        The controller asked for data the writer did not have (``wdata.ready`` with the data FIFO empty: the
        controller contract this writer relies on was broken); sticky until reset.

    Raises
    ------
    TypeError, ValueError
        On a parameter of the wrong type or out of range (a port no wider than a beat included).
    """

    def __init__(self, *, addr_width: int, port_width: int = 128, beat_width: int = 64, depth: int = 16):
        check_port_widths(addr_width=addr_width, port_width=port_width, beat_width=beat_width, depth=depth,
                          wider_port=True)
        if port_width <= beat_width:
            raise ValueError(f"port_width ({port_width}) must be wider than beat_width ({beat_width}); a port "
                             "no wider than a beat is hw.dram_writer.DRAMStreamWriter's")
        self._addr_width, self._port_width, self._beat_width, self._depth = addr_width, port_width, beat_width, depth
        super().__init__(writer_members(addr_width=addr_width, port_width=port_width, beat_width=beat_width))

    def elaborate(self, platform):
        m = Module()
        pw, bw = self._port_width, self._beat_width
        n = pw // bw
        word_shift = ceil_log2(pw // 8)
        beat_shift = ceil_log2(bw // 8)
        byte_addr_width = self._addr_width + word_shift
        beats_width = byte_addr_width + 2 - beat_shift
        words_width = byte_addr_width + 3 - word_shift

        # a FIFO entry: the word's data, then its byte enables
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=pw + pw // 8, depth=self._depth)
        addr = Signal(self._addr_width)     # the word being gathered (or offered)
        pos = Signal(range(n))              # the beat of that word the next input beat fills
        beats_left = Signal(beats_width)    # input beats still to take
        to_take = Signal(words_width)       # words whose data the controller has not taken
        word = Signal(pw)
        mask = Signal(n)                    # the beats of `word` that hold the request's data
        ready_word = Signal()               # `word` is complete (its last beat, or the request's) and offered
        error = Signal()

        m.d.comb += self.req.ready.eq((to_take == 0) & ~error)
        with m.If(self.req.valid & self.req.ready):
            first = self.req.payload.base[beat_shift:word_shift]
            beats = self.req.payload.length >> beat_shift
            m.d.sync += [addr.eq(self.req.payload.base >> word_shift), pos.eq(first), beats_left.eq(beats),
                         to_take.eq(Mux(beats == 0, 0, (first + beats + n - 1) >> (word_shift - beat_shift))),
                         mask.eq(0), ready_word.eq(0)]

        # a command for each complete word, its data into the FIFO in the same cycle
        cmd = self.port.cmd
        m.d.comb += [cmd.valid.eq(ready_word & fifo.w_rdy & ~error), cmd.payload.we.eq(1),
                     cmd.payload.addr.eq(addr)]
        issued = cmd.valid & cmd.ready
        byte_enables = Cat(*(mask[j].replicate(bw // 8) for j in range(n)))
        m.d.comb += [fifo.w_data.eq(Cat(word, byte_enables)), fifo.w_en.eq(issued)]

        # beats in: into the word being gathered, or the next one in the cycle the complete one is issued
        m.d.comb += self.i.ready.eq((beats_left != 0) & (~ready_word | issued))
        taken = self.i.valid & self.i.ready
        with m.If(issued):
            m.d.sync += [addr.eq(addr + 1), ready_word.eq(0), mask.eq(0)]
        with m.If(taken):
            m.d.sync += [word.word_select(pos, bw).eq(self.i.payload), pos.eq(pos + 1),   # wraps at n
                         beats_left.eq(beats_left - 1),
                         mask.eq(Mux(issued, 0, mask) | (Const(1, n) << pos))]
            with m.If((pos == n - 1) | (beats_left == 1)):
                m.d.sync += ready_word.eq(1)

        serve_wdata(m, self, fifo.r_data[:pw], fifo.r_data[pw:], fifo, to_take, error)   # on the controller's demand
        return m
