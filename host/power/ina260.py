"""The KV260's INA260 on the K26 SOM's 5 V input, read over I2C with smbus2.

Hardware: the KV260 carrier card's INA260 (U14) sits at address 0x40 on the I2C bus the SOM's PS I2C1
drives (Linux device tree ``arch/arm64/boot/dts/xilinx/zynqmp-sck-kv-g-revB.dtso``: ``u14: ina260@40``
on ``&i2c1``, label ``ina260-u14``); it measures ``VCC_SOM``, the SOM's single 5 V input (AMD UG1089,
"Power Telemetry": "the total power consumed by the SOM module"). On the Kria Ubuntu / PetaLinux
images it appears as ``/dev/i2c-1``.

Registers (TI INA260 data sheet, SBOS656C, section 8.6 "Register Maps"): every register is a 16-bit
word sent most significant byte first.

=======  =====================  ========================================================
pointer  register               meaning
=======  =====================  ========================================================
0x00     Configuration          averaging, conversion times, mode (reset value 0x6127)
0x01     Current                two's complement, 1.25 mA per LSB (section 8.6.2)
0x02     Bus Voltage            unsigned, 1.25 mV per LSB (section 8.6.3)
0x03     Power                  unsigned, 10 mW per LSB (section 8.6.4)
0xFE     Manufacturer ID        0x5449, "TI" in ASCII (section 8.6.7)
0xFF     Die ID                 bits 15-4 device ID 0x227, bits 3-0 revision (section 8.6.8)
=======  =====================  ========================================================

SMBus "read word" (which ``smbus2.SMBus.read_word_data`` issues) assembles the first byte received as
the low byte, so the INA260's big-endian words arrive byte-swapped: :func:`swap16` puts them right.

The Kria device tree binds the kernel's ``ina2xx`` driver to 0x40, so opening the address normally
fails with EBUSY; ``force=True`` (``I2C_SLAVE_FORCE``) reads it alongside the driver, which only reads
these registers too. ``smbus2`` is imported in :meth:`Ina260Source._open` only.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from host.power.base import PolledSource, SensorError

__all__ = ["ADDRESS", "Ina260Source", "decode_current", "swap16"]

ADDRESS = 0x40               #: the KV260's INA260 (U14)
REG_CONFIG = 0x00
REG_CURRENT = 0x01
REG_BUS_VOLTAGE = 0x02
REG_POWER = 0x03
REG_MANUFACTURER_ID = 0xFE
REG_DIE_ID = 0xFF
CURRENT_LSB_A = 1.25e-3      #: SBOS656C 8.6.2
BUS_VOLTAGE_LSB_V = 1.25e-3  #: SBOS656C 8.6.3
POWER_LSB_W = 10e-3          #: SBOS656C 8.6.4
MANUFACTURER_ID = 0x5449     #: "TI", SBOS656C 8.6.7
DIE_ID = 0x2270              #: device ID 0x227 in bits 15-4, SBOS656C 8.6.8
DIE_ID_MASK = 0xFFF0         #: bits 3-0 are the die revision


def swap16(word: int) -> int:
    """Swap the bytes of a 16-bit word (SMBus read-word order to the INA260's big-endian order)."""
    return ((word & 0xFF) << 8) | ((word >> 8) & 0xFF)


def decode_current(raw: int) -> float:
    """Current register (two's complement) to amperes."""
    return (raw - 0x10000 if raw & 0x8000 else raw) * CURRENT_LSB_A


class Ina260Source(PolledSource):
    """Power on the KV260 SOM's 5 V input from its INA260 (one rail, default ``som_5v``).

    Parameters
    ----------
    bus : int
        I2C bus number (``/dev/i2c-<bus>``); 1 on the KV260.
    address : int
        7-bit I2C address; 0x40 on the KV260.
    force : bool
        Read even though a kernel driver owns the address (``I2C_SLAVE_FORCE``).
    rail : str
        Name of the rail in the samples.
    smbus_factory : callable, optional
        ``bus -> SMBus``-like object (``read_word_data(addr, register, force=...)``, ``close()``);
        default ``smbus2.SMBus``. For tests.

    Notes
    -----
    Watts are the Power register (10 mW resolution; the device multiplies its own current and voltage
    conversions). :meth:`measure` returns volts, amperes and watts. The default configuration converts
    each quantity in 1.1 ms without averaging, so sampling faster than about every 2.2 ms repeats values.
    """

    name = "ina260"
    default_period_s = 0.01

    def __init__(self, *, bus: int = 1, address: int = ADDRESS, force: bool = False, rail: str = "som_5v",
                 smbus_factory: Callable[[int], Any] | None = None) -> None:
        super().__init__()
        if not 0x03 <= address <= 0x77:
            raise ValueError(f"I2C address must be a 7-bit address in 0x03..0x77, got 0x{address:x}")
        self.bus_number = bus
        self.address = address
        self.force = force
        self.rail = rail
        self._factory = smbus_factory
        self._bus: Any = None
        self.die_revision: int | None = None

    def _where(self) -> str:
        return f"address 0x{self.address:02x} on I2C bus {self.bus_number}"

    def _open(self) -> tuple[str, ...]:
        factory = self._factory
        if factory is None:
            try:
                import smbus2
            except ImportError as exc:
                raise SensorError(f"the ina260 power source needs smbus2 (pip install smbus2; import failed: "
                                  f"{exc})") from None
            factory = smbus2.SMBus
        try:
            self._bus = factory(self.bus_number)
        except FileNotFoundError:
            raise SensorError(f"no I2C bus {self.bus_number}: /dev/i2c-{self.bus_number} does not exist (on a "
                              "KV260 the INA260 is on bus 1; is i2c-dev loaded? pass --i2c-bus N)") from None
        except PermissionError:
            raise SensorError(f"cannot open /dev/i2c-{self.bus_number}: permission denied (run as root or join "
                              "the i2c group)") from None
        except OSError as exc:
            raise SensorError(f"cannot open I2C bus {self.bus_number}: {exc}") from None
        try:
            mid = self.read_register(REG_MANUFACTURER_ID)
            did = self.read_register(REG_DIE_ID)
        except SensorError:
            self.close()
            raise
        if mid != MANUFACTURER_ID or (did & DIE_ID_MASK) != DIE_ID:
            self.close()
            raise SensorError(f"the device at {self._where()} is not an INA260 (manufacturer ID 0x{mid:04x}, die ID "
                              f"0x{did:04x}; expected 0x{MANUFACTURER_ID:04x} and 0x{DIE_ID:04x})")
        self.die_revision = did & 0xF
        return (self.rail,)

    def read_register(self, register: int) -> int:
        """One register as the INA260 sends it (big-endian word).

        Raises
        ------
        SensorError
            If the bus transfer fails (no device answers, or a driver owns the address).
        """
        try:
            word = self._bus.read_word_data(self.address, register, force=self.force)
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                raise SensorError(f"{self._where()} is claimed by a kernel driver (the Kria device tree binds "
                                  "ti,ina260 there): pass --i2c-force to read it alongside the driver") from None
            if exc.errno in (errno.ENXIO, errno.EREMOTEIO, errno.EIO, errno.ETIMEDOUT):
                raise SensorError(f"no device answers at {self._where()} (errno {exc.errno}: {exc.strerror}); "
                                  "pass --i2c-bus / --i2c-address") from None
            raise SensorError(f"reading register 0x{register:02x} at {self._where()} failed: {exc}") from None
        return swap16(int(word) & 0xFFFF)

    def measure(self) -> tuple[float, float, float]:
        """Bus volts, amperes and watts now."""
        volts = self.read_register(REG_BUS_VOLTAGE) * BUS_VOLTAGE_LSB_V
        amps = decode_current(self.read_register(REG_CURRENT))
        watts = self.read_register(REG_POWER) * POWER_LSB_W
        return volts, amps, watts

    def read(self) -> dict[str, float]:
        return {self.rail: self.read_register(REG_POWER) * POWER_LSB_W}

    def describe(self) -> dict:
        return {**super().describe(), "bus": self.bus_number, "address": f"0x{self.address:02x}",
                "force": self.force, "die_revision": self.die_revision}

    def close(self) -> None:
        super().close()
        if self._bus is not None:
            try:
                self._bus.close()
            finally:
                self._bus = None
