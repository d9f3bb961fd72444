"""host.power sources, each against a fake of exactly what it reads; the estimate's model and constants."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import pytest
from test_power_fakes import (
    ACTIVITY,
    FakeClock,
    FakeDataRecorder,
    FakeDevice,
    FakeRail,
    fake_pynq_module,
    fake_smbus2_module,
)

from host.power import Budget, PowerError, PowerSession, SensorError, make_source, summarize
from host.power.boards import BOARDS, get_board, select_rails
from host.power.estimate import ANCHORS, FAMILIES, IDLE, MEMORIES, EstimateSource, constants_table, op_energies
from host.power.ina260 import Ina260Source, decode_current, swap16
from host.power.meter import MeterCsvSource, parse_meter_csv, parse_timestamp
from host.power.pynq_rails import PynqRailsSource
from host.power.replay import ReplaySource
from host.power.sources import parse_spec
from host.power.xrt import XrtSource, parse_electrical

FIXTURES = Path(__file__).parent / "fixtures" / "power"


# ---------------------------------------------------------------------------------------------- pynq
def test_pynq_rails_and_datarecorder(monkeypatch):
    rails = {"12V": FakeRail("12V", voltage=12.0, current=0.5, power=6.0),
             "VCCINT": FakeRail("VCCINT", voltage=0.85, current=2.0),      # no power sensor: V * I
             "TEMP": FakeRail("TEMP", voltage=1.0)}                        # neither: left out
    monkeypatch.setitem(sys.modules, "pynq", fake_pynq_module(rails))
    src = PynqRailsSource()
    assert src.open() == ("12V", "VCCINT")
    assert src.read() == pytest.approx({"12V": 6.0, "VCCINT": 1.7})
    src.start(0.002)
    rec = FakeDataRecorder.instances[-1]
    assert rec.intervals == [0.002]
    assert {s.name for s in rec._sensors} == {"12V_power", "VCCINT_voltage", "VCCINT_current"}
    deadline = __import__("time").time() + 2
    got = []
    while len(got) < 3 and __import__("time").time() < deadline:
        got += src.poll()
    got += src.stop()
    assert len(got) >= 3
    assert all(s.watts == pytest.approx({"12V": 6.0, "VCCINT": 1.7}) for s in got)
    times = [s.t for s in got]
    assert times == sorted(times) and abs(times[0] - __import__("time").time()) < 60  # epoch seconds
    assert src.describe()["sensors"]["VCCINT"] == ["VCCINT_voltage", "VCCINT_current"]


def test_pynq_missing_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynq", None)
    with pytest.raises(SensorError, match="needs the pynq package"):
        PynqRailsSource().open()


def test_pynq_no_rails_points_to_a_meter(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynq", fake_pynq_module({}))
    with pytest.raises(SensorError, match=r"found no power rails.*csv:FILE"):
        PynqRailsSource().open()


def test_pynq_rails_without_power(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynq", fake_pynq_module({"T": FakeRail("T", voltage=1.0)}))
    with pytest.raises(SensorError, match="none reports power"):
        PynqRailsSource().open()


def test_zcu104_default_pl_rails_and_missing_ones():
    board = get_board("zcu104")
    found = ["12V", "VCCINT", "VCCBRAM", "VCCAUX", "VCCPSINTFP", "VCCPSAUX", "MGTAVCC"]
    assert select_rails(found, board.rails_for("pynq"), what="default") == ("VCCINT", "VCCBRAM", "VCCAUX", "MGTAVCC")
    with pytest.raises(PowerError, match=r"rails found: 12V, INT.*pass --rails"):
        select_rails(["12V", "INT"], board.rails_for("pynq"), what="default zcu104 rails")


# ---------------------------------------------------------------------------------------------- ina260
def test_ina260_registers_per_datasheet(monkeypatch):
    mod = fake_smbus2_module()
    monkeypatch.setitem(sys.modules, "smbus2", mod)
    src = Ina260Source()
    assert src.open() == ("som_5v",)
    assert src.die_revision == 0
    volts, amps, watts = src.measure()
    assert volts == pytest.approx(5.0)     # 0x0FA0 = 4000 * 1.25 mV
    assert amps == pytest.approx(1.0)      # 0x0320 = 800 * 1.25 mA
    assert watts == pytest.approx(5.0)     # 0x01F4 = 500 * 10 mW
    assert src.read() == {"som_5v": pytest.approx(5.0)}
    bus = mod.buses[-1]
    assert {(a, r) for a, r, _ in bus.reads} >= {(0x40, 0xFE), (0x40, 0xFF), (0x40, 0x03)}
    src.close()
    assert bus.closed


def test_ina260_words_and_signed_current():
    assert swap16(0x3412) == 0x1234
    assert decode_current(0xFFF8) == pytest.approx(-0.010)   # -8 * 1.25 mA
    assert decode_current(0x7FFF) == pytest.approx(32767 * 1.25e-3)


def test_ina260_missing_smbus2(monkeypatch):
    monkeypatch.setitem(sys.modules, "smbus2", None)
    with pytest.raises(SensorError, match="needs smbus2"):
        Ina260Source().open()


def test_ina260_missing_bus(monkeypatch):
    monkeypatch.setitem(sys.modules, "smbus2", fake_smbus2_module())
    with pytest.raises(SensorError, match=r"no I2C bus 3: /dev/i2c-3 does not exist"):
        Ina260Source(bus=3).open()


def test_ina260_nothing_at_address(monkeypatch):
    monkeypatch.setitem(sys.modules, "smbus2", fake_smbus2_module())
    with pytest.raises(SensorError, match="no device answers at address 0x41 on I2C bus 1"):
        Ina260Source(address=0x41).open()


def test_ina260_wrong_chip(monkeypatch):
    regs = {0xFE: 0x5449, 0xFF: 0x2260}  # an INA226
    monkeypatch.setitem(sys.modules, "smbus2", fake_smbus2_module(registers=regs))
    with pytest.raises(SensorError, match=r"not an INA260 \(manufacturer ID 0x5449, die ID 0x2260"):
        Ina260Source().open()


def test_ina260_kernel_driver_needs_force(monkeypatch):
    mod = fake_smbus2_module(claimed=True)
    monkeypatch.setitem(sys.modules, "smbus2", mod)
    with pytest.raises(SensorError, match="claimed by a kernel driver.*--i2c-force"):
        Ina260Source().open()
    src = Ina260Source(force=True)
    assert src.open() == ("som_5v",)
    assert all(force is True for _, _, force in mod.buses[-1].reads)


def test_ina260_polled_in_background(monkeypatch):
    monkeypatch.setitem(sys.modules, "smbus2", fake_smbus2_module())
    src = Ina260Source()
    src.open()
    src.start(0.001)
    samples = src.poll()
    samples += src.stop()
    assert len(samples) >= 2 and all(s.watts == {"som_5v": pytest.approx(5.0)} for s in samples)


# ---------------------------------------------------------------------------------------------- xrt
def test_xrt_saved_report():
    src = XrtSource(json_path=FIXTURES / "xrt_smi_electrical_u55c.json")
    rails = src.open()
    assert rails == ("card", "12v_aux", "12v_pex", "3v3_pex", "vccint")  # 3v3_aux has no current
    w = src.read()
    assert w["card"] == pytest.approx(29.744)
    assert w["12v_pex"] == pytest.approx(21.0) and w["vccint"] == pytest.approx(10.2)
    assert get_board("u55c").rails_for("xrt") == ("card",)


def test_xrt_pyxrt(monkeypatch):
    electrical = json.loads((FIXTURES / "xrt_smi_electrical_u55c.json").read_text())["devices"][0]["electrical"]
    mod = type(sys)("pyxrt")
    mod.xrt_info_device = type("info", (), {"electrical": "ELECTRICAL"})
    opened = []

    class Device:
        def __init__(self, index):
            opened.append(index)

        def get_info(self, key):
            assert key == "ELECTRICAL"
            return json.dumps(electrical)

    mod.device = Device
    monkeypatch.setitem(sys.modules, "pyxrt", mod)
    src = XrtSource()
    assert src.open()[0] == "card" and src.mode == "pyxrt" and opened == [0]
    assert src.read()["card"] == pytest.approx(29.744)


def test_xrt_smi_subprocess(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    fake = tmp_path / "xrt-smi"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import shutil, sys
        args = sys.argv[1:]
        assert args[:1] == ["examine"] and "-r" in args and args[args.index("-r") + 1] == "electrical", args
        assert args[args.index("-d") + 1] == "0000:c1:00.1", args
        shutil.copy({str(FIXTURES / "xrt_smi_electrical_u55c.json")!r}, args[args.index("-o") + 1])
        """))
    fake.chmod(0o755)
    src = XrtSource(device="0000:c1:00.1", smi=str(fake))
    assert src.open()[0] == "card" and src.mode == "smi"
    assert src.read()["card"] == pytest.approx(29.744)


def test_xrt_nothing_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(SensorError, match="neither pyxrt nor xrt-smi") as err:
        XrtSource().open()
    # the remedy it names is a real option: --source xrt:FILE parses (there is no --xrt-json flag)
    assert "--source xrt:FILE" in str(err.value) and "--xrt-json" not in str(err.value)
    assert parse_spec("xrt:saved.json") == ("xrt", "saved.json")


def test_xrt_report_without_power(tmp_path):
    with pytest.raises(SensorError, match="no power reading"):
        parse_electrical({"power_consumption_watts": "N/A", "power_rails": []})
    with pytest.raises(SensorError, match="no electrical section"):
        parse_electrical({"devices": [{"device_id": "x"}]})
    with pytest.raises(SensorError, match="for device 0000:01:00.1"):
        parse_electrical(json.loads((FIXTURES / "xrt_smi_electrical_u55c.json").read_text()), "0000:01:00.1")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SensorError, match="is not JSON"):
        XrtSource(json_path=bad).open()
    with pytest.raises(SensorError, match="XRT report not found"):
        XrtSource(json_path=tmp_path / "nope.json").open()


# ---------------------------------------------------------------------------------------------- csv meter
def test_meter_log_formats():
    rails, samples = parse_meter_csv((FIXTURES / "meter_pynq_z2.csv").read_text())
    assert rails == ("board_in_w",)
    assert [s.watts["board_in_w"] for s in samples] == [2.40, 2.44, 3.10, 3.20, 2.42]
    assert samples[0].t == pytest.approx(1718007200.0)
    assert samples[-1].t - samples[0].t == pytest.approx(2.0)
    rails, samples = parse_meter_csv("10.5,1.0,2.0\n11,3,\n")
    assert rails == ("meter1", "meter2") and math.isnan(samples[1].watts["meter2"])
    assert parse_meter_csv("1,4.5\n")[0] == ("meter",)
    assert parse_timestamp("1718007200.25") == 1718007200.25


@pytest.mark.parametrize(("text", "message"), [
    ("t,w\n1,2\n2\n", "line 3 has 1 columns, expected 2"),
    ("t,w\n1,2\nyesterday,3\n", "line 3: bad timestamp"),
    ("t,w\n1,2\n2,lots\n", "line 3: bad watts 'lots'"),
    ("1\n", "expected a timestamp and watts"),
])
def test_meter_log_bad_rows(text, message):
    with pytest.raises(SensorError, match=message):
        parse_meter_csv(text)


def test_meter_missing_and_empty(tmp_path):
    with pytest.raises(SensorError, match="meter log not found"):
        MeterCsvSource(tmp_path / "nope.csv").open()
    (tmp_path / "empty.csv").write_text("# nothing yet\n")
    with pytest.raises(SensorError, match="is empty"):
        MeterCsvSource(tmp_path / "empty.csv").open()


def test_meter_log_in_a_session(tmp_path):
    """A meter logging 4 W idle then 10 W while 20 tokens of 0.1 s run: the known answers."""
    clock = FakeClock(5000.0)
    log = tmp_path / "meter.csv"
    rows = ["timestamp,watts"] + [f"{4990 + 0.5 * i:.1f},4.0" for i in range(24)]    # 4990 .. 5001.5: idle
    rows += [f"{5002 + 0.1 * i:.1f},10.0" for i in range(20)] + ["5004.0,4.0", "5010.0,4.0"]
    log.write_text("\n".join(rows) + "\n")
    src = MeterCsvSource(log, offset_s=0.0)
    src.clock = clock
    src.open()
    device = FakeDevice(clock, token_s=0.1)
    with PowerSession(src, Budget(13.0, ("watts",)), idle_s=2.0) as s:
        s.begin()                            # idle 5000 .. 5002
        for t in range(20):
            s.step(device, t)                # 5002 .. 5004
        trace = s.finish()
    summary = summarize(trace, Budget(13.0, ("watts",)))
    assert summary["idle"]["total_w"] == pytest.approx(4.0)
    assert summary["total"]["energy_j"] == pytest.approx(20.0)
    assert summary["total"]["energy_above_idle_j"] == pytest.approx(12.0)
    assert trace.times[0] == pytest.approx(5000.0)   # the reading standing at the start, then newer ones


def test_meter_offset_and_no_overlap(tmp_path):
    log = tmp_path / "meter.csv"
    log.write_text("0,4\n1,4\n2,4\n")
    src = MeterCsvSource(log, offset_s=5000.0)
    src.clock = FakeClock(5000.5)
    src.open()
    src.start()
    assert [s.t for s in src.poll()] == [5000.0, 5001.0, 5002.0]
    far = MeterCsvSource(log)
    far.clock = FakeClock(9999.0)
    far.open()
    with PowerSession(far, Budget(13.0, ("meter",)), idle_s=1.0) as s, \
            pytest.raises(PowerError, match="no sample of the csv source covers the idle window"):
        s.begin()
    stale = MeterCsvSource(log, offset_s=5000.0)   # readings up to 5002; the run goes on to 5010
    stale.clock = clock = FakeClock(5000.5)
    stale.open()
    stale.start()
    stale.poll()
    clock.sleep(9.5)
    with pytest.raises(SensorError, match=r"readings from 5000.000 to 5002.000 .* until 5010.000.*--csv-offset"):
        stale.stop()


# ---------------------------------------------------------------------------------------------- estimate
def test_estimate_token_energy_by_hand():
    src = EstimateSource("kv260", fmax_mhz=200.0, bus_bits=128)
    ops = op_energies("zynqmp", "ddr4")
    duration, energy = src.token_energy(ACTIVITY)
    assert duration == pytest.approx(100_000 / 200e6)
    bits = 150_000 * 128
    assert energy["pl"] == pytest.approx((6e6 * ops.trit_pj + 4e6 * ops.add_pj + 20_000 * ops.epilogue_pj
                                          + bits * ops.stream_bit_pj) * 1e-12)
    assert energy["mem"] == pytest.approx(bits * MEMORIES["ddr4"].value * 1e-12)
    assert src.idle_watts() == pytest.approx({"pl": 0.35, "mem": 0.0, "rest": 3.15})
    assert ops.mem_bit_pj == pytest.approx(1300 / 64 * 0.64)
    scale = (16 / 45) * (0.85 / 0.9) ** 2
    assert ops.trit_pj == pytest.approx(0.03 * 14 * scale)


def test_estimate_source_segments_and_static_override():
    src = EstimateSource("zcu104", fmax_mhz=100.0, bus_bits=64, static_w=7.0)
    assert src.pl_static_w == pytest.approx(0.9 * 7.0 / 14.0) and src.rest_w == pytest.approx(7.0 - 0.45)
    src.open()
    src.start()
    src.on_token(ACTIVITY)
    samples = src.stop()
    assert [s.t for s in samples] == [0.0, pytest.approx(1e-3)]
    assert samples[0].watts["mem"] > 0 and samples[1].watts["mem"] == 0.0
    assert src.model_time == pytest.approx(1e-3)


def test_estimate_needs_counters_and_flags_uncounted_nonzero():
    src = EstimateSource("kv260", fmax_mhz=100.0, bus_bits=64)
    with pytest.raises(SensorError, match="needs the device's activity counters.*--device golden"):
        src.token_energy({"hw_cycles": 10})
    src.token_energy({**ACTIVITY, "hw_nonzero_trits": 0})
    assert "upper bound" in src.notes[0]


def test_every_constant_has_a_status_and_a_source():
    table = constants_table("kv260")
    assert "ESTIMATE" in table["label"]
    constants = [*ANCHORS.values(), *MEMORIES.values(), *(c for b in IDLE.values() for c in b.values())]
    for c in constants:
        assert c.status in ("published", "datasheet", "derived", "assumption") and len(c.source) > 20
    assert {c.status for c in IDLE["kv260"].values()} == {"assumption"}
    assert set(IDLE) == set(BOARDS) and {b.family for b in BOARDS.values()} <= set(FAMILIES)
    assert all(f.source for f in FAMILIES.values()) and set(table["operations"]) == {"trit", "add", "epilogue",
                                                                                     "stream_bit"}
    json.dumps(table)


def test_make_source_uses_the_device_build():
    class Build:
        fmax_mhz = 400.0
        bus_bits = 256

    dev = type("D", (), {"build": Build()})()
    src = make_source("estimate", get_board("kv260"), device=dev)
    # capped at the board's design clock (hw.boards.facts: the KV260 flow's 200 MHz)
    assert src.fmax_hz == pytest.approx(200e6) and src.bus_bits == 256
    # without a build: the board's design point (clock and beat width)
    src = make_source("estimate", get_board("kv260"))
    assert src.fmax_hz == pytest.approx(200e6) and src.bus_bits == 128


@pytest.mark.parametrize(("spec", "message"), [
    ("volts", "unknown power source"), ("csv", "needs a file"), ("pynq:x", "takes no file"), ("xrt:", "is empty"),
])
def test_bad_source_specs(spec, message):
    with pytest.raises(PowerError, match=message):
        parse_spec(spec)


# ---------------------------------------------------------------------------------------------- replay
def test_replay_of_the_recorded_estimate():
    src = ReplaySource.from_csv(FIXTURES / "estimate_kv260_golden_32tok.csv")
    assert src.kind == "estimate" and src.open() == ("pl", "mem", "rest")
    assert src.idle_watts() == pytest.approx({"pl": 0.35, "mem": 0.0, "rest": 3.15})
    assert len(src._tokens) == 32
    d, w = src._tokens[0]
    assert d == pytest.approx(0.00250823) and w["mem"] == pytest.approx(0.0806687, rel=1e-5)


def test_replay_bad_files(tmp_path):
    with pytest.raises(SensorError, match="trace not found"):
        ReplaySource.from_csv(tmp_path / "nope.csv")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SensorError, match="not a samples CSV"):
        ReplaySource.from_csv(tmp_path / "x.csv")
