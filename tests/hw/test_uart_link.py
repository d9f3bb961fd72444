# amaranth: UnusedElaboratable=no
"""The UART link (hw.boards.uart_link) in the Amaranth simulator, driven bit by bit by the host protocol
(host.devices.ecp5.UartLink) through a simulated serial port: register reads and writes reach the core's
real RegisterBlock, stream beats come back through the output framer, the parser survives junk and
abandoned commands."""

import pytest

from host.devices.ecp5 import LinkTimeout, UartLink
from hw import isa
from hw.boards import uart_link as ul
from tests.hw.uart_sim import ID_VALUES, SimSerial, link_harness

pytestmark = pytest.mark.filterwarnings("error")
R = isa.REGISTER_MAP
CLEAR, DONE, ERROR = isa.Ctrl.CLEAR.value, isa.Status.DONE.value, isa.Status.ERROR.value


@pytest.fixture
def port():
    return SimSerial()


def test_register_reads_return_the_id_block(port):
    link = UartLink(port, timeout=5.0)
    for off in (R.ID_MAGIC, R.ID_LANES, R.ID_MAX_HIDDEN, R.ID_MAX_INTERMEDIATE, R.ID_QUANT_LANES):
        assert link.read(off) == ID_VALUES[off]
    assert link.read(R.ID_MAGIC) == isa.ID_MAGIC
    assert link.read(0xFC) == 0                   # unmapped
    assert port.framing_errors == 0


def test_register_write_reaches_ctrl(port):
    link = UartLink(port, timeout=5.0)
    assert link.read(R.STATUS) == 0
    link.write(R.CTRL, CLEAR)                      # clear strobe -> the harness sets STATUS.done
    assert link.read(R.STATUS) == DONE
    link.write(R.ID_LANES, 0xDEADBEEF)             # ignored by the register block
    assert link.read(R.ID_LANES) == ID_VALUES[R.ID_LANES]


def test_stream_beats_come_back_as_output_frames(port):
    link = UartLink(port, timeout=5.0)
    data = bytes(range(1, 25))                      # three beats
    link.stream(data, last=True)
    out = link.read_output(timeout=5.0)
    assert out == data                              # two 32-bit words per beat, little-endian, tlast at the end
    link.stream(data[:8], last=False)               # no tlast on this beat: the packet goes on
    link.stream(data[8:16], last=True)
    assert link.read_output(timeout=5.0) == data[:16]


def test_unknown_opcode_reset_and_resync(port):
    port.write(b"Z")
    assert port.read(1) == bytes([ul.REP_UNKNOWN])
    link = UartLink(port, timeout=5.0)
    link.reset_core()
    # an abandoned command: 'W' and two of its five argument bytes, then silence past the byte time-out
    port.write(bytes([ul.OP_WRITE, R.CTRL, CLEAR]))
    port.run(6000)
    assert port.read(1) == b""                      # no reply to an abandoned command
    assert link.read(R.ID_MAGIC) == isa.ID_MAGIC    # the parser is back at the start of a command
    assert link.read(R.STATUS) == 0                 # and the half write never happened



def test_core_reset_reaches_the_core(port):
    """The registered core reset: a cleared STATUS.done after the link's reset command."""
    link = UartLink(port, timeout=5.0)
    link.write(R.CTRL, CLEAR)
    assert link.read(R.STATUS) == DONE
    link.reset_core()
    assert link.read(R.STATUS) == 0
    data = bytes(range(8, 32))                      # the output path works after the reset
    link.stream(data, last=True)
    assert link.read_output(timeout=5.0) == data


def test_long_stream_under_backpressure():
    """40 beats in, 80 words back: the output (a 60-bit frame a word) is slower than the input, so the loopback
    stalls and back-pressure reaches the weight FIFO; nothing is lost, duplicated or reordered."""
    port = SimSerial(link_harness(fifo_depth=1024))
    link = UartLink(port, timeout=20.0)
    data = bytes(i & 0xFF for i in range(8 * 40))
    link.stream(data, last=True)
    assert link.read_output(timeout=10.0) == data


def test_reset_drops_words_in_flight():
    """Output words queued in the core and the output FIFO when the reset comes never reach the host."""
    port = SimSerial()
    link = UartLink(port, timeout=5.0)
    link.stream(bytes(range(1, 25)), last=True)
    link.reset_core()                      # frames before 'x' are dropped by the host
    port.run(5000)
    assert port.read(64) == b""
    new = bytes(range(100, 116))
    link.stream(new, last=True)
    assert link.read_output(timeout=5.0) == new


class Dead:
    """A port with nothing on the other end."""

    timeout = None

    def read(self, n):
        return b""

    def write(self, b):
        return len(b)


def test_no_reply_is_a_timeout_not_a_hang():
    with pytest.raises(LinkTimeout, match="no reply"):
        UartLink(Dead(), timeout=0.05).read(R.ID_MAGIC)


@pytest.mark.parametrize("bad", [3, -1, 0x100])
def test_host_rejects_bad_register_addresses(bad):
    with pytest.raises(ValueError, match="register address"):
        UartLink(Dead(), timeout=1.0).read(bad)


def test_stream_rejects_partial_beats():
    with pytest.raises(ValueError, match="multiple of 8"):
        UartLink(Dead(), timeout=1.0).stream(b"\0" * 12)


@pytest.mark.parametrize("cls", [ul.UARTRx, ul.UARTTx])
def test_divisor_is_validated(cls):
    with pytest.raises(ValueError, match="divisor"):
        cls(divisor=2)


def test_fifo_depth_is_validated():
    with pytest.raises(ValueError, match="fifo_depth"):
        ul.UARTLink(divisor=4, fifo_depth=4)


def test_the_real_core_behind_the_link():
    """The boards' LinkedCore around the real (folded, 8-lane) Accelerator: its ID block over the UART, the
    error the core raises on a stream that is not a token packet, and a core reset that clears it."""
    from hw.boards.ecp5 import DEFAULT_BUILD, LinkedCore
    from hw.top import Accelerator

    core = Accelerator(DEFAULT_BUILD.replace(lanes=8, quant_lanes=4, packing=isa.TritPacking.BASE3))
    port = SimSerial(LinkedCore(core, divisor=4, fifo_depth=64, byte_timeout=4000), cycles_per_read=20000)
    link = UartLink(port, timeout=5.0)
    ids = core.id_values()
    for off in (R.ID_MAGIC, R.ID_LANES, R.ID_EPILOGUE, R.ID_QUANT_LANES):
        assert link.read(off) == ids[off]
    link.stream(bytes(range(8)), last=True)         # not a token packet's magic word
    assert link.read(R.STATUS) & ERROR
    link.reset_core()
    assert link.read(R.STATUS) == 0


def test_stream_only_bridge_has_no_board_commands(port):
    """The boards without DRAM build the stream-only bridge: no board port, and the DRAM boards' opcodes
    are unknown there (each byte of 'G' and its argument answered with '?'); the board bridge has the port."""
    assert "board" not in ul.LinkBridge().signature.members
    assert not ul.LinkBridge().has_board
    assert "board" in ul.LinkBridge(board=True).signature.members
    port.write(bytes([ul.OP_BOARD_READ, 0x00]))
    assert port.read(2) == bytes([ul.REP_UNKNOWN]) * 2
    assert UartLink(port, timeout=5.0).read(R.ID_MAGIC) == isa.ID_MAGIC
    # the control-bus commands of link version 3 too, with argument bytes that are no opcode either
    port.write(bytes([ul.OP_CTRL_READ, 0, 0, 0, 0, ul.OP_CTRL_WRITE, 0, 0, 0, 0, 0, 0, 0, 0]))
    assert port.read(14) == bytes([ul.REP_UNKNOWN]) * 14
    assert UartLink(port, timeout=5.0).read(R.ID_LANES) == ID_VALUES[R.ID_LANES]
    members = ul.LinkBridge(board=True).signature.members["board"].signature.members
    assert {"ctrl_cmd", "ctrl_done"} <= set(members)


def test_constants_are_the_protocol_modules():
    from hw.boards import link_protocol as lp

    for name in ul.__all__:
        if hasattr(lp, name):
            assert getattr(ul, name) is getattr(lp, name), name
