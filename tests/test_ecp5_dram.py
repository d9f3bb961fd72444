"""The ECP5 DRAM boards' host side (issue 22): load once, tokens by id, argmax-only greedy decoding, faults, and
``mmfree board``, against :class:`board_fakes.FakeEcp5Board` with ``link_version=2``.

The fake speaks hw/boards/link_protocol.py byte for byte. Its ``'T'`` reads the embedding row and the image from
its own DRAM at the addresses in its board registers, which only the host's load put there, builds the token
packet (host.protocol.make_token_packet) and runs it on the golden machine: a wrong layout, a missing block or
a wrong register gives wrong logits or an error, not a pass. Greedy decoding compares with the golden device
on the shipped model, compiled for the ECP5 builds' one 64-bit channel. Link version 3 (a DDR3 board): read
leveling over the control bus against the fake's scripted PHY (board_fakes.ScriptedECP5PHY), whose lanes decide
whether the fake's DRAM reads back right, so tokens run only after a leveling that found every window. What is
not here: the board's gateware (hw/boards/dram_board.py, its own tests), a real serial port and FTDI chip, link
timing, a real DDR3 PHY.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from board_fakes import ECPIX5_CSRS, FakeEcp5Board, ScriptedECP5PHY, argmax_summary, ecp5_id_values

from host.bundle import read_bundle
from host.cli import main as mmfree
from host.devices import DeviceError, ecp5
from host.devices.driver import SummaryFlags
from host.devices.ecp5 import (
    CTRL_WINDOW,
    DRAM_BLOCK_BYTES,
    TABLE_ALIGN,
    TOKEN_WIRE_BYTES,
    ControlBus,
    Ecp5Device,
    LinkError,
    UartLink,
    bundle_checksum,
    dram_contents,
    set_ftdi_latency,
)
from host.devices.golden import GoldenDevice
from host.generate import generate_text
from host.image import const_section_bytes, parse_image
from host.protocol import CoreError, DeviceTimeout, make_output_packet, parse_output_packet
from hw import isa
from hw.boards import link_protocol as lp
from hw.boards.link_protocol import BoardReg, BoardStatus, CtrlStatus, TokenStatus
from hw.isa import ErrorCause, Opcode

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "hgrn-bit-pydoc"
TOKEN_IDS = [1, 42, 7, 300, 4095]
PROMPT = "def parse("


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = mmfree(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory) -> Path:
    """The shipped model compiled for the ECP5 builds: one 64-bit weight channel, base-3 packing."""
    path = tmp_path_factory.mktemp("ecp5_dram") / "m.mmf"
    rc, _, err = _cli(["compile", "--model", str(MODEL), "--out", str(path), "--channels", "1"])
    assert rc == 0, err
    return path


@pytest.fixture(scope="module")
def bundle(bundle_path):
    return read_bundle(bundle_path)


@pytest.fixture(scope="module")
def golden(bundle):
    """What the golden device makes of the bundle: logits of TOKEN_IDS, a greedy and a sampled generation."""
    g = GoldenDevice()
    g.load(bundle)
    logits = np.stack([g.step(t) for t in TOKEN_IDS])
    greedy = generate_text(g, bundle.tokenizer, PROMPT, max_new_tokens=12, temperature=0, repetition_penalty=1)
    sampled = generate_text(g, bundle.tokenizer, PROMPT, max_new_tokens=8, temperature=0.8, top_k=50, top_p=0.95,
                            repetition_penalty=1.1, seed=3)
    return {"logits": logits, "greedy": greedy, "sampled": sampled}


def _device(board, **kw) -> Ecp5Device:
    return Ecp5Device(serial=board, timeout=kw.pop("timeout", 2.0), progress=False, **kw)


def _blocks(layout):
    return [(a, min(DRAM_BLOCK_BYTES, layout.total_bytes - a)) for a in range(0, layout.total_bytes, DRAM_BLOCK_BYTES)]


# ------------------------------------------------------------------------------------------------ pure parts
def test_summary_flags_and_words_are_the_taps():
    """The host reads the argmax tap's flags and summary size from their one home, hw.boards.link_protocol."""
    from hw import argmax_tap

    assert SummaryFlags is argmax_tap.TapFlags
    assert lp.ARGMAX_SUMMARY_WORDS == argmax_tap.SUMMARY_WORDS
    assert TOKEN_WIRE_BYTES == 30


def test_fake_summary_flags_a_bad_packet():
    """The fake's model of the tap: a good packet has no flags, a corrupted one CRC, a short one LENGTH."""
    good = make_output_packet(np.arange(40), position=7, argmax=39, max_acc=39, scale_mant=1, scale_shift=0)
    assert argmax_summary(good) == (7, 39, 0)
    bad = bytearray(good)
    bad[0] ^= 1
    assert argmax_summary(bytes(bad))[2] == SummaryFlags.CRC
    assert argmax_summary(good[64:])[2] & SummaryFlags.LENGTH


def test_layout_and_identifier(bundle):
    layout, data = dram_contents(bundle.image, bundle.embeddings)
    assert layout.image_base == 0 and data[:len(bundle.image)] == bundle.image
    assert layout.embed_base % TABLE_ALIGN == 0 and 0 <= layout.embed_base - len(bundle.image) < TABLE_ALIGN
    assert not any(data[len(bundle.image):layout.embed_base])
    h = layout.hidden
    assert (layout.vocab, h) == bundle.embeddings.shape
    for t in (0, 1, 4095):     # row t at EMBED_BASE + 4 t H, little-endian int32
        row = data[layout.embed_base + 4 * t * h:layout.embed_base + 4 * (t + 1) * h]
        assert np.array_equal(np.frombuffer(row, "<i4"), bundle.embeddings[t])
    assert layout.total_bytes == len(data) and layout.total_bytes % 8 == 0
    assert layout.checksum == zlib.crc32(data) == bundle_checksum(bundle.image, bundle.embeddings)
    # the order the host writes the registers in: link_protocol.py's
    assert list(layout.registers()) == [BoardReg.IMAGE_BASE, BoardReg.IMAGE_BYTES, BoardReg.EMBED_BASE,
                                        BoardReg.EMBED_HIDDEN, BoardReg.EMBED_VOCAB, BoardReg.IMAGE_CHECKSUM]
    other = bundle.embeddings.copy()
    other[5, 5] += 1
    assert bundle_checksum(bundle.image, other) != layout.checksum


def test_ftdi_latency_timer(tmp_path, monkeypatch, caplog):
    tty = tmp_path / "ttyUSB3"
    tty.mkdir()
    attr = tty / "latency_timer"
    attr.write_text("16\n")
    assert set_ftdi_latency("/dev/ttyUSB3", sysfs=tmp_path) is True
    assert attr.read_text().strip() == "1"
    assert set_ftdi_latency("/dev/ttyACM0", sysfs=tmp_path) is None       # not an FTDI port: nothing done
    attr.write_text("16\n")

    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_text", refuse)
    ecp5._LATENCY_WARNED.discard("ttyUSB3")
    with caplog.at_level(logging.WARNING, logger="host.devices.ecp5"):
        assert set_ftdi_latency("/dev/ttyUSB3", sysfs=tmp_path) is False
        assert set_ftdi_latency("/dev/ttyUSB3", sysfs=tmp_path) is False
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and f"echo 1 | sudo tee {attr}" in warned[0]       # once, with the command


def test_open_port_sets_the_latency_timer(tmp_path, monkeypatch):
    serial = pytest.importorskip("serial")
    (tmp_path / "ttyUSB0").mkdir()
    (tmp_path / "ttyUSB0" / "latency_timer").write_text("16\n")
    opened = []
    monkeypatch.setattr(serial, "Serial", lambda *a, **k: opened.append((a, k)) or object())
    monkeypatch.setattr(ecp5, "SYSFS_USB_SERIAL", tmp_path)
    ecp5.open_port("/dev/ttyUSB0", 2_000_000, 0.5)
    assert opened == [(("/dev/ttyUSB0", 2_000_000), {"timeout": 0.5})]
    assert (tmp_path / "ttyUSB0" / "latency_timer").read_text().strip() == "1"


def test_a_port_that_will_not_open_names_the_options_as_typed(monkeypatch):
    """The option goes after the action (``mmfree board ACTION --port TTY``); generate, selftest, bench and power
    pass it to the device as ``--option port=TTY`` (and the board as ``--option board=B``)."""
    serial = pytest.importorskip("serial")

    def refuse(*a, **k):
        raise serial.SerialException("[Errno 2] could not open port /dev/ttyUSB9")
    monkeypatch.setattr(serial, "Serial", refuse)
    with pytest.raises(DeviceError) as exc:
        ecp5.open_port("/dev/ttyUSB9", 2_000_000, 0.5)
    msg = str(exc.value)
    assert msg.startswith("device 'ecp5': cannot open /dev/ttyUSB9 at 2000000 baud: [Errno 2]")
    for said in ("`mmfree board ACTION --port TTY`", "generate/selftest/bench/power, `--option port=TTY`",
                 "`mmfree board ACTION --board B`", "`--option board=B`", "ulx3s-85f /dev/ttyUSB0"):
        assert said in msg
    assert "`mmfree board --port`" not in msg


@pytest.mark.parametrize("timeout", [-1, 0, -0.5, float("nan"), float("inf"), "soon", True])
def test_device_refuses_a_timeout_that_is_not_positive(timeout):
    with pytest.raises(ValueError, match=r"timeout must be a positive, finite number of seconds, got "):
        Ecp5Device(serial=FakeEcp5Board(link_version=2), timeout=timeout)
    assert Ecp5Device(serial=FakeEcp5Board(link_version=2), timeout=3).timeout == 3.0


def test_cli_refuses_a_device_timeout_that_is_not_positive(monkeypatch, bundle_path):
    """``--option timeout=-1`` is refused when the device is made, as ``mmfree board info --timeout -1`` is,
    before any port is opened (pyserial's "Not a valid timeout" before)."""
    def no_port(*a):
        raise AssertionError("a port was opened")
    monkeypatch.setattr(ecp5, "open_port", no_port)
    rc, out, err = _cli(["generate", "--image", str(bundle_path), "--device", "ecp5", "--option", "timeout=-1",
                         "--prompt", PROMPT, "--max-new-tokens", "1"])
    assert rc == 2 and "timeout must be a positive, finite number of seconds, got -1" in err, err
    rc, out, err = _cli(["board", "info", "--timeout", "-1"])
    assert rc == 2 and "--timeout must be a positive number of seconds, got -1" in err, err


# ------------------------------------------------------------------------------------------------ load once
def test_shipped_model_loads_once_and_matches_the_golden_device(bundle, golden):
    board = FakeEcp5Board(link_version=2)
    layout, data = dram_contents(bundle.image, bundle.embeddings)
    with _device(board) as dev:
        dev.load(bundle)
        assert dev.mode == "dram" and dev.transport.runs_token_ids
        r = dev.last_load
        assert not r.skipped and r.blocks_written == r.blocks_total == len(_blocks(layout))
        assert bytes(board.dram[:layout.total_bytes]) == data
        # IMAGE_VALID cleared first, the layout registers in link_protocol's order, IMAGE_VALID last
        assert board.board_writes == [(BoardReg.STATUS, 0), *layout.registers().items(),
                                      (BoardReg.STATUS, int(BoardStatus.IMAGE_VALID))]
        assert 0 < board.max_unacked <= lp.RX_FIFO_BYTES            # the 'L' window keeps the FIFO from overflowing
        assert dev.counters()["dram_bytes_written"] == layout.total_bytes

        logits = np.stack([dev.step(t) for t in TOKEN_IDS])          # 'T' with LOGITS: the whole output packet
        assert np.array_equal(logits, golden["logits"])

        before = dict(board.ops)
        g = generate_text(dev, bundle.tokenizer, PROMPT, max_new_tokens=12, temperature=0, repetition_penalty=1)
        want = golden["greedy"]
        assert g.token_ids == want.token_ids and g.text == want.text and g.stop_reason == want.stop_reason
        n = len(g.prompt_ids) + g.decode_steps
        assert board.ops["T"] - before.get("T", 0) == n and board.ops["S"] == 0 and board.ops["L"] == before["L"]
        assert g.counters["link_bytes"] == n * TOKEN_WIRE_BYTES           # 30 bytes per greedy token, prompt included
        assert dev.seconds_per_token() == pytest.approx(TOKEN_WIRE_BYTES * 10 / dev.baud)

        s = generate_text(dev, bundle.tokenizer, PROMPT, max_new_tokens=8, temperature=0.8, top_k=50, top_p=0.95,
                          repetition_penalty=1.1, seed=3)
        assert s.token_ids == golden["sampled"].token_ids and s.text == golden["sampled"].text
        # the core's counters, read when asked (not per token): every token the board ran
        assert dev.counters()["hw_tokens"] == board.tokens_run == len(TOKEN_IDS) + n + len(s.prompt_ids) \
            + s.decode_steps


def test_step_argmax_is_the_greedy_token(bundle, golden):
    board = FakeEcp5Board(link_version=2)
    with _device(board) as dev:
        dev.load(bundle)
        got = [dev.step_argmax(t) for t in TOKEN_IDS]
        assert got == [int(np.argmax(row)) for row in golden["logits"]]
        assert dev.position == len(TOKEN_IDS) and dev.counters()["step_calls"] == len(TOKEN_IDS)
        dev.reset()
        assert dev.prefill_argmax(TOKEN_IDS) == got[-1]
        dev.reset()
        assert np.array_equal(dev.prefill(TOKEN_IDS), golden["logits"][-1])   # argmax-only but the last


def test_second_connect_skips_the_load(bundle, golden, caplog):
    board = FakeEcp5Board(link_version=2)
    with _device(board) as dev:
        dev.load(bundle)
    writes = board.ops["L"]
    with caplog.at_level(logging.INFO, logger="host.devices.ecp5"), _device(board) as dev:
        dev.load(bundle)
        r = dev.last_load
        assert r.skipped and r.bytes_written == 0 and board.ops["L"] == writes
        assert dev.counters()["dram_loads_skipped"] == 1 and dev.counters()["dram_loads"] == 0
        assert np.array_equal(dev.step(TOKEN_IDS[0]), golden["logits"][0])
    assert any("load skipped" in rec.getMessage() for rec in caplog.records)
    with _device(board, reload=True) as dev:                      # --force: every block again
        dev.load(bundle)
        assert not dev.last_load.skipped and dev.last_load.blocks_written == dev.last_load.blocks_total


def test_a_load_cut_by_a_dropped_link_restarts_where_it_stopped(bundle, golden):
    board = FakeEcp5Board(link_version=2)
    layout, data = dram_contents(bundle.image, bundle.embeddings)
    board.drop_after = layout.total_bytes // 2
    dev = _device(board)
    with pytest.raises(LinkError, match="serial port failed"):
        dev.load(bundle)
    dev.close()
    assert not board.regs[BoardReg.STATUS] & BoardStatus.IMAGE_VALID
    board.reconnect()
    missing = [(a, n) for a, n in _blocks(layout) if board.dram[a:a + n] != data[a:a + n]]
    assert 0 < len(missing) < len(_blocks(layout))
    with _device(board) as dev:
        dev.load(bundle)
        r = dev.last_load
        assert (r.blocks_written, r.bytes_written) == (len(missing), sum(n for _, n in missing))
        assert bytes(board.dram[:layout.total_bytes]) == data
        assert np.array_equal(dev.step(TOKEN_IDS[0]), golden["logits"][0])


def _weight_byte(image: bytes) -> int:
    """The address of a byte inside the first GEMV's weight block (one channel: header, constants, block)."""
    ins = next(i for i in parse_image(image).instructions if i.opcode is Opcode.GEMV)
    return ins.offset + isa.layout_bytes(isa.InstrHeader) + const_section_bytes(ins) + 10


def test_corrupted_dram_is_a_core_error_and_a_reload_repairs_it(bundle, golden):
    board = FakeEcp5Board(link_version=2)
    with _device(board) as dev:
        dev.load(bundle)
        at = _weight_byte(bundle.image)
        board.dram[at] = (board.dram[at] + 1) % 243          # still a valid base-3 code: only the block CRC sees it
        with pytest.raises(CoreError, match="WEIGHT_CRC") as info:
            dev.step(TOKEN_IDS[0])
        assert info.value.cause is ErrorCause.WEIGHT_CRC
        with pytest.raises(CoreError, match="WEIGHT_CRC"):   # the image is still bad; no hang, the same error
            dev.step_argmax(TOKEN_IDS[0])
        dev.load(bundle)                     # the registers still name it, the DRAM CRC does not: one block rewritten
        assert not dev.last_load.skipped and dev.last_load.blocks_written == 1
        assert np.array_equal(dev.step(TOKEN_IDS[0]), golden["logits"][0])
        assert np.array_equal(dev.step(TOKEN_IDS[1]), golden["logits"][1])


def test_a_token_before_any_image_is_a_clear_error(bundle, golden, monkeypatch):
    board = FakeEcp5Board(link_version=2)
    link = UartLink(board, timeout=1.0)
    assert link.token(1, 0, logits=False) == TokenStatus.NO_IMAGE and not link.output
    with _device(board) as dev:
        dev.load(bundle)
        assert np.array_equal(dev.step(TOKEN_IDS[0]), golden["logits"][0])
        report = dev.transport.memtest(2 * DRAM_BLOCK_BYTES + 8, progress=False)   # clears IMAGE_VALID
        assert report.blocks == 3 and not report.bad_blocks
        with pytest.raises(DeviceError, match="no verified image"):
            dev.step(TOKEN_IDS[1])
        dev.load(bundle)                                    # only what memtest overwrote is written again
        assert dev.last_load.blocks_written == 3
        assert np.array_equal(dev.step(TOKEN_IDS[0]), golden["logits"][0])
        board.regs[BoardReg.EMBED_VOCAB] = 10                # the board's table ends before the id
        with pytest.raises(DeviceError, match="refused token id 42"):
            dev.step(42)


def test_read_timeout_resets_and_replays(bundle, golden, monkeypatch):
    board = FakeEcp5Board(link_version=2)
    monkeypatch.setattr(ecp5.time, "sleep", lambda s: None)       # the resync's quiet time
    with _device(board) as dev:
        dev.load(bundle)
        assert np.array_equal(dev.step(TOKEN_IDS[0]), golden["logits"][0])
        board.force_token_status = int(TokenStatus.READ_TIMEOUT)
        with pytest.raises(DeviceTimeout, match="READ_TIMEOUT"):
            dev.step(TOKEN_IDS[1])
        board.force_token_status = 0
        assert np.array_equal(dev.step(TOKEN_IDS[1]), golden["logits"][1])   # token 0 replayed first
        assert dev.counters()["replayed_tokens"] == 1


def test_a_flagged_summary_is_an_error_and_the_next_token_replays(bundle, golden):
    board = FakeEcp5Board(link_version=2)
    greedy = [int(np.argmax(row)) for row in golden["logits"]]
    with _device(board) as dev:
        dev.load(bundle)
        assert dev.step_argmax(TOKEN_IDS[0]) == greedy[0]
        board.force_tap_flags = int(SummaryFlags.CRC | SummaryFlags.LENGTH)
        with pytest.raises(DeviceError, match="CRC|LENGTH") as info:
            dev.step_argmax(TOKEN_IDS[1])
        assert not isinstance(info.value, CoreError)
        board.force_tap_flags = 0
        assert dev.step_argmax(TOKEN_IDS[1]) == greedy[1]
        assert dev.counters()["replayed_tokens"] == 1


def test_boards_that_cannot_take_the_bundle(bundle):
    with pytest.raises(DeviceError, match="bytes of DRAM"):
        _device(FakeEcp5Board(link_version=2, dram_bytes=4 << 20)).load(bundle)
    failed = FakeEcp5Board(link_version=2)
    failed.regs[BoardReg.STATUS] = int(BoardStatus.DRAM_INIT_ERROR)
    with pytest.raises(DeviceError, match="failed to initialise"):
        _device(failed).load(bundle)
    newer = FakeEcp5Board(link_version=2)
    newer.regs[BoardReg.LINK_VERSION] = lp.LINK_VERSION + 1
    with pytest.raises(DeviceError, match=f"link protocol version {lp.LINK_VERSION + 1}, this host versions 2 and 3"):
        _device(newer).load(bundle)
    with pytest.raises(DeviceError, match="stream-only"):
        dev = _device(FakeEcp5Board(link_version=1))
        dev.connect()
        dev.transport.load_model(bundle.image, bundle.embeddings)


# ------------------------------------------------------------------------------------------------ the CLI
@pytest.fixture
def on_port(monkeypatch):
    """``mmfree`` opening a given fake board by name."""
    def use(board):
        monkeypatch.setattr(ecp5, "open_port", lambda name, baud, timeout: board)
        return board
    monkeypatch.delenv("MMFREE_ECP5_BAUD", raising=False)
    return use


def test_cli_board_names_the_port_and_rate(monkeypatch):
    """``--board`` picks the board's usual port and its committed bitstream's link rate
    (hw/boards/facts.py); ``--port``/``--baud`` still win."""
    from hw.boards.facts import BOARDS

    opened = []
    monkeypatch.setattr(ecp5, "open_port", lambda name, baud, timeout: opened.append((name, baud)) or
                        FakeEcp5Board(link_version=2))
    for var in ("MMFREE_ECP5_BAUD", "MMFREE_ECP5_BOARD", "MMFREE_ECP5_PORT"):
        monkeypatch.delenv(var, raising=False)
    for argv, want in ((["--board", "ecpix5-85f"], ("/dev/ttyUSB1", BOARDS["ecpix5-85f"].link_baud)),
                       ([], ("/dev/ttyUSB0", BOARDS["ulx3s-85f"].link_baud)),
                       (["--board", "ecpix5-85f", "--port", "/dev/ttyUSB5", "--baud", "115200"],
                        ("/dev/ttyUSB5", 115_200))):
        rc, out, err = _cli(["board", "info", *argv])
        assert rc == 0, err
        assert opened[-1] == want and f"{want[0]} at {want[1]:,} baud" in out


def test_cli_board_info_status_load_memtest(bundle_path, bundle, on_port):
    board = on_port(FakeEcp5Board(link_version=2))
    rc, out, err = _cli(["board", "info", "--port", "/dev/ttyUSB7"])
    assert rc == 0, err
    assert "/dev/ttyUSB7 at 2,000,000 baud" in out and "version 2 (DRAM board" in out and "(MMDB)" in out
    assert "33,554,432 bytes (32 MiB)" in out and "50.000 MHz" in out and "DRAM_READY" in out
    assert f"ISA version {isa.ISA_VERSION}" in out and "1 channel(s) of 64 bits" in out

    rc, out, err = _cli(["board", "status", "--image", str(bundle_path)])
    assert rc == 1 and "none valid" in out and "not held by the board" in out      # nothing loaded yet

    rc, out, err = _cli(["board", "load", "--image", str(bundle_path)])
    layout, _ = dram_contents(bundle.image, bundle.embeddings)
    assert rc == 0, err
    n = len(_blocks(layout))
    assert f"{n} of {n} blocks" in out and "IMAGE_VALID set" in out
    rc, out, err = _cli(["board", "load", "--image", str(bundle_path)])
    assert rc == 0 and out.startswith("skipped: the board already holds") and f"0x{layout.checksum:08x}" in out
    rc, out, err = _cli(["board", "status", "--image", str(bundle_path)])
    assert rc == 0 and "valid (IMAGE_VALID)" in out and "held by the board" in out
    assert f"0x{layout.checksum:08x}" in out and f"{layout.vocab} x {layout.hidden} int32" in out
    assert "tokens since configuration" in out

    rc, out, err = _cli(["board", "memtest", "--bytes", str(3 * DRAM_BLOCK_BYTES)])
    assert rc == 0, err
    assert "memtest PASS" in out and "3 blocks" in out and "IMAGE_VALID cleared" in err
    rc, out, err = _cli(["board", "status", "--image", str(bundle_path)])
    assert rc == 1 and "none valid" in out
    board.corrupt_writes_at = DRAM_BLOCK_BYTES + 5                   # a bad cell in the second block
    rc, out, err = _cli(["board", "memtest", "--bytes", str(3 * DRAM_BLOCK_BYTES)])
    assert rc == 1 and "memtest FAIL: 1 block(s) differ, at 0x00010000" in out
    rc, _, err = _cli(["board", "memtest", "--bytes", "12"])
    assert rc == 2 and "multiple of 8" in err


def test_cli_bench_and_power_tell_the_ecp5_device_their_board(monkeypatch, bundle_path, tmp_path):
    """``mmfree bench``/``power`` ``--device ecp5 --board B`` open board B's serial port at its link rate
    (``--board`` names the roofline and the power rails there; the device must talk to that same board)."""
    from hw.boards.facts import BOARDS

    opened = []
    monkeypatch.setattr(ecp5, "open_port", lambda name, baud, timeout: opened.append((name, baud)) or
                        FakeEcp5Board(link_version=2))
    for var in ("MMFREE_ECP5_BAUD", "MMFREE_ECP5_BOARD", "MMFREE_ECP5_PORT"):
        monkeypatch.delenv(var, raising=False)
    want = ("/dev/ttyUSB1", BOARDS["ecpix5-85f"].link_baud)
    rc, out, err = _cli(["bench", "--image", str(bundle_path), "--device", "ecp5", "--board", "ecpix5-85f",
                         "--tokens", "1"])
    assert rc == 0, err
    assert opened and set(opened) == {want}
    rep = json.loads(out)
    assert rep["device"] == "ecp5" and rep["board"] == "ecpix5-85f" and rep["device_options"]["board"] == "ecpix5-85f"
    # the fake's counters are the golden machine's activity counts, without CYCLES: said, not divided by
    assert rep["cycles_per_token"] == 0 and "did not advance" in rep["cycles_note"]
    assert "cycle_tokens_per_s" not in rep
    rc, out, err = _cli(["bench", "--image", str(bundle_path), "--device", "ecp5", "--board", "ecpix5-85f",
                         "--tokens", "1", "--option", "board=ulx3s-85f"])
    assert rc == 0, err
    assert opened[-1] == ("/dev/ttyUSB0", BOARDS["ulx3s-85f"].link_baud)


def test_cli_bench_and_power_default_to_the_ecp5_devices_board(monkeypatch, bundle_path, tmp_path):
    """Without ``--board``, ``bench``/``power --device ecp5`` take the board the device talks to (``--option
    board=``, ``$MMFREE_ECP5_BOARD``, else ulx3s-85f) for the roofline and the rails, not the kv260; the golden
    device keeps the kv260."""
    from hw.boards.facts import BOARDS

    opened = []
    monkeypatch.setattr(ecp5, "open_port", lambda name, baud, timeout: opened.append((name, baud)) or
                        FakeEcp5Board(link_version=2))
    for var in ("MMFREE_ECP5_BAUD", "MMFREE_ECP5_BOARD", "MMFREE_ECP5_PORT"):
        monkeypatch.delenv(var, raising=False)
    bench = ["bench", "--image", str(bundle_path), "--tokens", "1"]
    for extra, env, want in (([], None, "ulx3s-85f"), ([], "ecpix5-85f", "ecpix5-85f"),
                             (["--option", "board=ecpix5-85f"], None, "ecpix5-85f")):
        if env:
            monkeypatch.setenv("MMFREE_ECP5_BOARD", env)
        rc, out, err = _cli([*bench, "--device", "ecp5", *extra])
        monkeypatch.delenv("MMFREE_ECP5_BOARD", raising=False)
        assert rc == 0, err
        rep = json.loads(out)
        assert rep["board"] == want and rep["device_options"]["board"] == want, (extra, env)
        assert opened[-1] == (BOARDS[want].serial_port, BOARDS[want].link_baud)
    rc, out, err = _cli([*bench, "--device", "golden", "--option", "channels=1"])
    assert rc == 0 and json.loads(out)["board"] == "kv260", err

    import host.power
    from host.power import PowerError

    def stop(spec, board, *, device=None, **kw):    # the rails' board and the device's, before any sampling
        made.append((board.key, getattr(device, "board", None)))
        raise PowerError("stopped after choosing the board")
    made = []
    monkeypatch.setattr(host.power, "make_source", stop)
    power = ["power", "--image", str(bundle_path), "--tokens", "1", "--no-plot", "--out", str(tmp_path), "--device"]
    for device, extra, want in (("ecp5", [], ("ulx3s-85f", "ulx3s-85f")),
                                ("ecp5", ["--option", "board=ecpix5-85f"], ("ecpix5-85f", "ecpix5-85f")),
                                ("golden", ["--option", "channels=1"], ("kv260", None))):
        rc, _, err = _cli([*power, device, *extra])
        assert rc == 2 and "stopped after choosing the board" in err, err
        assert made[-1] == want, (device, extra)


def test_cli_generate_on_the_dram_board_is_the_golden_devices(bundle_path, on_port):
    on_port(FakeEcp5Board(link_version=2))
    args = ["generate", "--image", str(bundle_path), "--prompt", PROMPT, "--max-new-tokens", "8", "--temperature",
            "0", "--repetition-penalty", "1"]
    rc, want, err = _cli([*args, "--device", "golden"])
    assert rc == 0, err
    rc, got, err = _cli([*args, "--device", "ecp5"])
    assert rc == 0, err
    assert got == want and "device ecp5" in err
    rc, out, err = _cli(["selftest", "--image", str(bundle_path), "--device", "ecp5", "--token-ids", "1,42,42"])
    assert rc == 0 and "selftest PASS: device ecp5 against golden, 3 tokens" in out, out + err


def test_cli_board_errors(bundle_path, on_port):
    on_port(FakeEcp5Board(link_version=1))
    rc, out, err = _cli(["board", "info"])
    assert rc == 0 and "version 1 (stream-only" in out
    rc, out, err = _cli(["board", "load", "--image", str(bundle_path)])
    assert rc == 2 and "stream-only link (version 1)" in err

    class Silent:
        timeout = None

        def read(self, n):
            return b""

        def write(self, b):
            return len(b)

        def reset_input_buffer(self):
            pass

        def close(self):
            pass

    on_port(Silent())
    ecp5_sleep = ecp5.time.sleep
    try:
        ecp5.time.sleep = lambda s: None
        rc, out, err = _cli(["board", "info", "--timeout", "0.05"])
    finally:
        ecp5.time.sleep = ecp5_sleep
    assert rc == 2 and "is the board connected" in err


# ------------------------------------------------------------------------------------------------ read leveling
def _window(bitslip, lo, hi):
    return {(bitslip, d) for d in range(lo, hi + 1)}


#: the fake DDR3 board's lanes: lane 0 reads right at bitslip 1, taps 2-6; lane 1 at bitslip 2, taps 0-3 (neither
#: at the PHY's reset setting, bitslip 0 and tap 0: before leveling every read comes back wrong)
GOOD = {0: _window(1, 2, 6), 1: _window(2, 0, 3)}


def ddr3_board(good=None, **kw) -> FakeEcp5Board:
    return FakeEcp5Board(link_version=3, hold_port=True, phy=ScriptedECP5PHY(dict(GOOD if good is None else good)),
                         **kw)


@pytest.fixture
def csr_json(tmp_path) -> Path:
    """The ECPIX-5 core's csr.json (the generated core's map: tests/test_leveling.py checks the copy)."""
    path = tmp_path / "csr.json"
    path.write_text(json.dumps({"csr_registers": {k: {"addr": a, "size": n, "type": t}
                                                  for k, (a, n, t) in ECPIX5_CSRS.items()}}))
    return path


def test_control_bus_words_and_refusals():
    board = FakeEcp5Board(link_version=3)
    link = UartLink(board, timeout=1.0)
    link.ctrl_write(0x800, 0xA5A5A5A5)
    assert link.ctrl_read(0x800) == 0xA5A5A5A5 and link.ctrl_read(0x804) == 0
    assert board.ctrl_log == [("J", 0x800, 0xA5A5A5A5), ("K", 0x800, 0xA5A5A5A5), ("K", 0x804, 0)]
    sent = board.received
    for bad in (2, lp.CTRL_BYTES, -4):                              # refused by the host: nothing sent
        with pytest.raises(ValueError, match="control-bus address"):
            link.ctrl_read(bad)
    with pytest.raises(ValueError, match="32 bits"):
        link.ctrl_write(0x800, 1 << 32)
    assert board.received == sent
    board.ctrl_timeout_at = {0x818}
    with pytest.raises(DeviceError, match=r"read at 0x0818 failed: TIMEOUT \(the DRAM controller did not acknowledge"):
        link.ctrl_read(0x818)
    board.regs[BoardReg.STATUS] &= ~int(BoardStatus.DRAM_READY)
    with pytest.raises(DeviceError, match="write at 0x0800 failed: BUSY .*power-up sequence"):
        link.ctrl_write(0x800, 1)
    board.regs[BoardReg.STATUS] |= int(BoardStatus.DRAM_INIT_ERROR)  # the host may inspect a failed power-up
    assert link.ctrl_read(0x800) == 0xA5A5A5A5
    assert link.board_read(BoardReg.MAGIC) == lp.BOARD_MAGIC        # the link goes on
    assert CtrlStatus.BUSY | CtrlStatus.TIMEOUT | CtrlStatus.BAD_ADDR == 7


def test_control_bus_posts_writes_and_reports_the_failed_one():
    board = FakeEcp5Board(link_version=3)
    link = UartLink(board, timeout=1.0)
    unanswered = []
    real_send = link._send_ctrl_write

    def send(addr, value):
        real_send(addr, value)
        unanswered.append(board.received - board.ops["J"] * 9 - board.ops["K"] * 5)

    link._send_ctrl_write = send
    with ControlBus(link, window=8) as bus:
        for i in range(40):
            bus.write_word(0x1000 + 4 * (i % 4), i)
        assert len(bus._posted) == 8                                   # at most the window unanswered
        assert bus.read_word(0x100C) == 39 and not bus._posted        # a read sees every write before it
    assert [v for op, _, v in board.ctrl_log if op == "J"] == list(range(40)) and bus.writes == 40
    board.ctrl_timeout_at = {0x1008}
    bus = ControlBus(link)
    for i in range(6):
        bus.write_word(0x1000 + 4 * (i % 4), 100 + i)
    with pytest.raises(DeviceError, match="write at 0x1008 failed: TIMEOUT"):
        bus.flush()
    assert not bus._posted and link.ctrl_read(0x100C) == 103            # all replies taken: the link is in step
    assert CTRL_WINDOW * (1 + lp.COMMAND_BYTES[lp.OP_CTRL_WRITE]) <= lp.RX_FIFO_BYTES


def test_leveling_enables_the_port_and_tokens_run(bundle, golden, csr_json):
    """A DDR3 board: the port held after configuration (load refused, nothing written), leveling finds each lane's
    window and leaves the PHY at its centre, the port enabled; then the bundle loads and tokens equal the golden
    device's (the fake's DRAM reads back right only through lanes inside their windows)."""
    from host.leveling import load_csr_map

    board = ddr3_board()
    with _device(board) as dev:
        dev.connect()
        assert dev.link_version == 3 and not dev.transport.port_enabled()
        with pytest.raises(DeviceError, match="holds its DRAM port until read leveling has run"):
            dev.load(bundle)
        assert board.ops["L"] == 0 and board.ops["K"] == 0
        result = dev.level(load_csr_map(csr_json))
        assert [(r.bitslip, r.delay, r.window) for r in result.lanes] == [(1, 4, (2, 6)), (2, 1, (0, 3))]
        assert board.phy.bitslip == [1, 2] and board.phy.rdly == [4, 1]
        assert board.phy.control == 1                                  # the DFII back under the controller
        assert board.regs[BoardReg.PORT_ENABLE] == 1 and dev.transport.port_enabled()
        assert dev.counters()["ctrl_writes"] > dev.counters()["ctrl_reads"] > 0            # writes are posted
        dev.load(bundle)
        assert np.array_equal(dev.step(TOKEN_IDS[0]), golden["logits"][0])
        assert dev.step_argmax(TOKEN_IDS[1]) == int(np.argmax(golden["logits"][1]))


def test_without_leveling_the_fake_dram_reads_wrong(bundle):
    """The control for the test above: the same lanes left at their reset setting (a board that does not hold its
    port, so the load runs) do not keep the bundle."""
    board = FakeEcp5Board(link_version=3, phy=ScriptedECP5PHY(dict(GOOD)))
    with _device(board) as dev, pytest.raises(DeviceError, match="does not keep what was written"):
        dev.load(bundle)


def test_cli_board_level(bundle_path, bundle, on_port, csr_json, golden):
    board = on_port(ddr3_board())
    rc, out, err = _cli(["board", "status"])
    assert rc == 0 and "held until read leveling has run" in out
    rc, out, err = _cli(["board", "load", "--image", str(bundle_path)])
    assert rc == 2 and "mmfree board level" in err and board.ops["L"] == 0
    rc, out, err = _cli(["board", "level"])
    assert rc == 2 and "needs the CSR map" in err and board.ops["J"] == 0
    rc, out, err = _cli(["board", "level", "--csr", str(csr_json.parent / "missing.json")])
    assert rc == 2 and "CSR map not found" in err
    rc, out, err = _cli(["board", "level", "--csr", str(csr_json)])
    assert rc == 0, err
    assert "not run on hardware" in out and "m0 b1: |xx.....x| window 2-6" in out
    assert "m0: bitslip 1, delay 4 (window 2-6 of 8 taps)" in out and "m1: bitslip 2, delay 1" in out
    assert "DRAM port enabled" in out and "IMAGE_VALID cleared" in err
    rc, out, err = _cli(["board", "status"])
    assert rc == 0 and "enabled (read leveling has run)" in out
    rc, out, err = _cli(["board", "load", "--image", str(bundle_path)])
    assert rc == 0, err
    rc, out, err = _cli(["selftest", "--image", str(bundle_path), "--device", "ecp5", "--token-ids", "1,42"])
    assert rc == 0 and "selftest PASS" in out, out + err
    # leveling again (from the environment's map) clobbers the DRAM's first burst: the next load rewrites one block
    os.environ["MMFREE_ECP5_CSR"] = str(csr_json)
    try:
        rc, out, err = _cli(["board", "level"])
    finally:
        del os.environ["MMFREE_ECP5_CSR"]
    assert rc == 0, err
    layout, data = dram_contents(bundle.image, bundle.embeddings)
    assert bytes(board.dram[:16]) != data[:16] and bytes(board.dram[16:64]) == data[16:64]
    rc, out, err = _cli(["board", "status", "--image", str(bundle_path)])
    assert rc == 1 and "none valid" in out
    rc, out, err = _cli(["board", "load", "--image", str(bundle_path)])
    n = len(_blocks(layout))
    assert rc == 0 and f"1 of {n} blocks" in out, out + err


def test_cli_board_level_without_a_window(csr_json, on_port, bundle_path):
    """A lane with no working setting: the error names it, the scans are printed, the port stays held; a board
    whose earlier leveling had enabled the port is held again by a failing one."""
    board = on_port(ddr3_board())
    assert _cli(["board", "level", "--csr", str(csr_json)])[0] == 0 and board.regs[BoardReg.PORT_ENABLE] == 1
    board.phy.good[1] = set()                                          # lane 1 lost every window
    rc, out, err = _cli(["board", "level", "--csr", str(csr_json)])
    assert rc == 1
    assert "module 1 has no working read delay at any of 4 bitslips" in err and "port stays held" in err
    assert "read leveling FAILED" in out and "m1 b0: |xxxxxxxx|" in out and "m1 b3: |xxxxxxxx|" in out
    assert board.regs[BoardReg.PORT_ENABLE] == 0 and board.phy.control == 1
    rc, out, err = _cli(["board", "load", "--image", str(bundle_path)])
    assert rc == 2 and "holds its DRAM port" in err


def test_cli_board_level_refuses_a_map_without_the_phy(tmp_path, on_port):
    """The ULX3S core's map (no ddrphy registers): refused before the board is touched."""
    board = on_port(ddr3_board())
    sdr = {k: {"addr": a, "size": n, "type": t} for k, (a, n, t) in ECPIX5_CSRS.items() if not k.startswith("ddrphy")}
    (tmp_path / "sdr.json").write_text(json.dumps({"csr_registers": sdr}))
    rc, out, err = _cli(["board", "level", "--csr", str(tmp_path / "sdr.json")])
    assert rc == 2 and "the CSR map has no ddrphy_burstdet_clr" in err
    assert board.ops["J"] == board.ops["K"] == 0 and (BoardReg.PORT_ENABLE, 0) not in board.board_writes


def test_cli_board_level_reads_the_map_before_opening_the_board(tmp_path, monkeypatch):
    """A malformed CSR map, or none, fails before any port is opened (no board attached here: the port named is
    absent, so an error about it would mean the board was opened first)."""
    monkeypatch.setenv("MMFREE_ECP5_PORT", str(tmp_path / "ttyNOPE"))
    monkeypatch.delenv("MMFREE_ECP5_CSR", raising=False)
    (tmp_path / "bad.json").write_text("{not json")
    rc, out, err = _cli(["board", "level", "--csr", str(tmp_path / "bad.json")])
    assert rc == 2 and "CSR map" in err and "ttyNOPE" not in err, err
    rc, out, err = _cli(["board", "level"])
    assert rc == 2 and "needs the CSR map" in err and "ttyNOPE" not in err, err


def test_a_version_2_board_cannot_level_and_still_runs_tokens(bundle_path, on_port, csr_json):
    board = on_port(FakeEcp5Board(link_version=2))
    rc, out, err = _cli(["board", "level", "--csr", str(csr_json)])
    assert rc == 2 and "read leveling needs a bitstream of link version 3" in err and "speaks version 2" in err
    assert "K" not in board.ops and "J" not in board.ops
    rc, out, err = _cli(["board", "status"])
    assert rc == 0 and "enabled (link version 2" in out
    assert _cli(["board", "load", "--image", str(bundle_path)])[0] == 0
    args = ["generate", "--image", str(bundle_path), "--prompt", PROMPT, "--max-new-tokens", "4", "--temperature",
            "0", "--repetition-penalty", "1"]
    rc, want, err = _cli([*args, "--device", "golden"])
    assert rc == 0, err
    rc, got, err = _cli([*args, "--device", "ecp5"])
    assert rc == 0 and got == want, (got, err)
    with _device(board) as dev:
        dev.connect()
        with pytest.raises(DeviceError, match="link version 3"):
            dev.ctrl_read(0x800)


# ------------------------------------------------------------------------------------------------ no Amaranth
CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import runtime_only
runtime_only.install_blocker()
fakes = runtime_only._load_board_fakes()
spec = json.loads(sys.argv[2])
from host.devices import ecp5
good = {int(m): {tuple(s) for s in v} for m, v in spec["good"].items()}
board = fakes.FakeEcp5Board({int(k): v for k, v in spec["ids"].items()}, link_version=3, hold_port=True,
                            phy=fakes.ScriptedECP5PHY(good))
ecp5.open_port = lambda name, baud, timeout: board
runs = {" ".join(a[:2]): runtime_only._cli(a) for a in (["board", "level", "--csr", spec["csr"]], ["board", "info"],
                                                        ["board", "load", "--image", spec["bundle"]],
                                                        ["board", "status", "--image", spec["bundle"]])}
print(json.dumps({"runs": runs, "blocked_loaded": runtime_only.blocked_modules_loaded(),
                  "valid": bool(board.regs[fakes.BoardReg.STATUS] & fakes.BoardStatus.IMAGE_VALID)}))
"""


def test_the_board_host_path_runs_without_amaranth(bundle_path, csr_json):
    """``mmfree board level/info/load/status`` on a DDR3 board with Amaranth, numba, torch and the compiler blocked
    (tests/runtime_only.py): the DRAM board's host side, leveling included, needs none of them. (Tokens need the
    fake's golden machine, which needs numba.)"""
    spec = {"ids": ecp5_id_values(), "bundle": str(bundle_path), "csr": str(csr_json),
            "good": {m: sorted(v) for m, v in GOOD.items()}}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "tests"), json.dumps(spec)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["blocked_loaded"] == []
    for name, run in res["runs"].items():
        assert run["rc"] == 0, (name, run["stderr"])
    assert "m1: bitslip 2, delay 1" in res["runs"]["board level"]["stdout"]
    assert "version 3 (DRAM board" in res["runs"]["board info"]["stdout"]
    assert "held by the board" in res["runs"]["board status"]["stdout"] and res["valid"]


def test_output_packet_of_a_logits_token_is_checked(bundle, golden):
    """A 'T' with LOGITS returns the core's own output packet (position checked, logits decoded)."""
    board = FakeEcp5Board(link_version=2)
    with _device(board) as dev:
        dev.load(bundle)
        got = dev.transport.run_token(TOKEN_IDS[0], 0, True, None, lambda: None)
        pkt = parse_output_packet(got.output)
        assert pkt.position == 0 and np.array_equal(pkt.logits(), golden["logits"][0])
        assert got.extra["link_bytes"] > 6 * len(got.output) // 4


def test_greedy_is_chosen_only_when_the_logits_are_not_needed(bundle, golden):
    """top-k 1 without a penalty is greedy (argmax-only on the link); temperature 0 with a penalty needs logits."""
    board = FakeEcp5Board(link_version=2)
    with _device(board) as dev:
        dev.load(bundle)
        g = generate_text(dev, bundle.tokenizer, PROMPT, max_new_tokens=12, temperature=0.8, top_k=1,
                          repetition_penalty=1, seed=5)
        assert g.token_ids == golden["greedy"].token_ids
        assert g.counters["link_bytes"] == (len(g.prompt_ids) + g.decode_steps) * TOKEN_WIRE_BYTES
        p = generate_text(dev, bundle.tokenizer, PROMPT, max_new_tokens=3, temperature=0, repetition_penalty=1.1)
        assert p.counters["link_bytes"] > 20_000 * p.decode_steps      # the output packets: 4096 logits each


def test_link_rejects_what_the_protocol_cannot_carry():
    board = FakeEcp5Board(link_version=2, dram_bytes=1 << 16)
    link = UartLink(board, timeout=1.0)
    with pytest.raises(ValueError, match="multiples of 8"):
        link.dram_write(4, bytes(8))
    with pytest.raises(ValueError, match="multiples of 8"):
        link.dram_crc(0, 12)
    with pytest.raises(DeviceError, match="BAD_ALIGN"):               # beyond the board's DRAM: its refusal
        link.dram_write(1 << 16, bytes(8))
    with pytest.raises(ValueError, match="board register address"):
        link.board_read(3)
    assert link.board_read(BoardReg.MAGIC) == lp.BOARD_MAGIC and link.probe() == lp.BOARD_MAGIC
    assert UartLink(FakeEcp5Board(link_version=1), timeout=1.0).probe() is None     # '?' and '?'
