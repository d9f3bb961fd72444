"""Fakes for the power tests: exactly what each source reads, and a device that counts.

* :func:`fake_pynq_module`: a ``pynq`` module with ``get_rails()`` (``Rail`` objects with ``voltage``,
  ``current``, ``power`` sensors whose ``value`` is read on access) and ``DataRecorder`` (a thread
  sampling ``time.time()`` and the sensors, ``frame`` with a datetime index and one column per sensor
  name), as in ``pynq/pmbus.py``.
* :class:`FakeSMBus`: ``smbus2.SMBus``'s ``read_word_data`` over a register file of big-endian words,
  returned in SMBus byte order (first byte received = low byte), with the errors a real bus gives.
* :class:`FakeClock`: a clock whose ``sleep`` advances ``now``.
* :class:`CountingToyDevice`: the toy device of ``host_fakes`` with fixed ``hw_*`` activity per token.
* :class:`FakeDevice`: the three methods a power session calls.

(This module has no tests; its name puts it in the power tests' namespace.)
"""

from __future__ import annotations

import errno
import threading
import time
import types
from typing import Any

import numpy as np
from host_fakes import ToyDevice

ACTIVITY = {"hw_cycles": 100_000, "hw_trits": 6_000_000, "hw_nonzero_trits": 4_000_000,
            "hw_epilogue_elements": 20_000, "hw_stream_beats": 150_000}


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)


class FakeDevice:
    """counters / step / prefill, advancing a clock by ``token_s`` per token (a real device's time)."""

    name = "fake"

    def __init__(self, clock: FakeClock | None = None, token_s: float = 0.0, activity: dict | None = None) -> None:
        self.clock = clock
        self.token_s = token_s
        self.activity = dict(ACTIVITY if activity is None else activity)
        self._c = {k: 0 for k in self.activity}

    def counters(self) -> dict[str, int]:
        return dict(self._c)

    def _tick(self, n: int = 1) -> np.ndarray:
        for k, v in self.activity.items():
            self._c[k] += v * n
        if self.clock is not None:
            self.clock.sleep(self.token_s * n)
        return np.zeros(4, dtype=np.float32)

    def step(self, token_id: int) -> np.ndarray:
        return self._tick()

    def prefill(self, ids) -> np.ndarray:
        return self._tick(len(ids))


class CountingToyDevice(ToyDevice):
    """ToyDevice that reports fixed accelerator activity (``hw_*`` counters) for every token."""

    name = "counting-toy"

    def _step(self, token_id: int) -> np.ndarray:
        for k, v in ACTIVITY.items():
            self._counters[k] = self._counters.get(k, 0) + v
        return super()._step(token_id)


# ---------------------------------------------------------------------------------------------- pynq
class FakeSensor:
    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self._value = value
        self.reads = 0

    @property
    def value(self) -> float:
        self.reads += 1
        return float(self._value() if callable(self._value) else self._value)


class FakeRail:
    def __init__(self, name: str, voltage=None, current=None, power=None) -> None:
        self.name = name
        self.voltage = FakeSensor(f"{name}_voltage", voltage) if voltage is not None else None
        self.current = FakeSensor(f"{name}_current", current) if current is not None else None
        self.power = FakeSensor(f"{name}_power", power) if power is not None else None


class FakeFrame:
    def __init__(self, times: list[float], columns: list[str], rows: list[list[float]]) -> None:
        self.index = np.array([int(round(t * 1e9)) for t in times], dtype="datetime64[ns]")
        self._cols = {c: [r[j] for r in rows] for j, c in enumerate(columns)}
        self.columns = columns

    def __getitem__(self, name: str) -> list[float]:
        return self._cols[name]


class FakeDataRecorder:
    """pynq.DataRecorder: record(interval) samples from a thread, stop() joins, frame returns the data."""

    instances: list[FakeDataRecorder] = []

    def __init__(self, *sensors: FakeSensor) -> None:
        self._sensors = sensors
        self._columns = ["Mark", *[s.name for s in sensors]]
        self._times: list[float] = []
        self._data: list[list[float]] = []
        self._thread: threading.Thread | None = None
        self._done = False
        self.intervals: list[float] = []
        FakeDataRecorder.instances.append(self)

    def record(self, interval: float) -> FakeDataRecorder:
        self.intervals.append(interval)
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()
        return self

    def _run(self, interval: float) -> None:
        while not self._done:
            row = [0, *[s.value for s in self._sensors]]
            self._times.append(time.time())
            self._data.append(row)
            time.sleep(interval)

    def stop(self) -> None:
        self._done = True
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def frame(self) -> FakeFrame:
        n = min(len(self._times), len(self._data))
        return FakeFrame(self._times[:n], self._columns, self._data[:n])


def fake_pynq_module(rails: dict[str, FakeRail]) -> types.ModuleType:
    mod = types.ModuleType("pynq")
    mod.get_rails = lambda config_file=None: dict(rails)
    FakeDataRecorder.instances = []
    mod.DataRecorder = FakeDataRecorder
    return mod


# ---------------------------------------------------------------------------------------------- smbus2
class FakeSMBus:
    """smbus2.SMBus over a register file (big-endian words as the INA260 holds them)."""

    def __init__(self, bus: int, *, registers: dict[int, int] | None = None, address: int = 0x40,
                 claimed: bool = False, buses: tuple[int, ...] = (1,)) -> None:
        if bus not in buses:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", f"/dev/i2c-{bus}")
        self.bus = bus
        self.registers = dict(registers or {})
        self.address = address
        self.claimed = claimed
        self.reads: list[tuple[int, int, Any]] = []
        self.closed = False

    def read_word_data(self, i2c_addr: int, register: int, force: Any = None) -> int:
        self.reads.append((i2c_addr, register, force))
        if self.claimed and not force:
            raise OSError(errno.EBUSY, "Device or resource busy")
        if i2c_addr != self.address or register not in self.registers:
            raise OSError(errno.ENXIO, "No such device or address")
        word = self.registers[register]
        return ((word & 0xFF) << 8) | (word >> 8)  # SMBus read-word: first byte (MSB on the wire) is the low byte

    def close(self) -> None:
        self.closed = True


INA260_REGISTERS = {0x00: 0x6127, 0x01: 0x0320, 0x02: 0x0FA0, 0x03: 0x01F4, 0xFE: 0x5449, 0xFF: 0x2270}


def fake_smbus2_module(**bus_kwargs: Any) -> types.ModuleType:
    mod = types.ModuleType("smbus2")
    mod.buses = []

    def smbus(bus: int) -> FakeSMBus:
        b = FakeSMBus(bus, **{"registers": INA260_REGISTERS, **bus_kwargs})
        mod.buses.append(b)
        return b

    mod.SMBus = smbus
    return mod
