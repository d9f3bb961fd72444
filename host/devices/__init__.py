"""Devices that run an HGRN-Bit model, behind one interface (:class:`~host.devices.base.Device`).

Use :func:`open_device` to get one by name::

    from host.devices import open_device
    with open_device("reference") as dev:
        dev.load(checkpoint)
        logits = dev.prefill(prompt_ids)

The registry :data:`DEVICES` maps a name to the module and class that implement it. Device modules are
imported only when that device is opened, and board libraries (``pynq``, ``pyxrt``, ``serial``) only inside
their transports (:mod:`host.devices.driver`: one driver, thin transports), so they never load on a machine
that does not ask for those devices.

Adding a device
---------------
Write ``host/devices/<name>.py`` with a :class:`~host.devices.base.Device` subclass whose ``name`` is
``<name>``, then move its line from :data:`PLANNED_DEVICES` into :data:`DEVICES`. The default device
is the golden ISS (:data:`DEFAULT_DEVICE`): the CLI and every other default follow it.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from host.devices.base import CheckpointLike, Device, DeviceError, DeviceState, weights_of

__all__ = [
    "DEFAULT_DEVICE",
    "DEVICES",
    "PLANNED_DEVICES",
    "CheckpointLike",
    "Device",
    "DeviceEntry",
    "DeviceError",
    "DeviceState",
    "open_device",
    "weights_of",
]


@dataclass(frozen=True)
class DeviceEntry:
    """Where a device lives, for the lazy import of :func:`open_device`.

    Attributes
    ----------
    module : str
        Dotted module name (imported on first use only).
    attr : str
        Name of the :class:`~host.devices.base.Device` subclass in that module.
    summary : str
        One line for ``--help`` and error messages.
    """

    module: str
    attr: str
    summary: str


#: Registered devices, by name. Never import a device module here: see the module docstring.
DEVICES: dict[str, DeviceEntry] = {
    "golden": DeviceEntry("host.devices.golden", "GoldenDevice",
                          "integer ISS of the accelerator (host.devices.golden): the bit-exact oracle"),
    "reference": DeviceEntry("host.devices.reference", "ReferenceDevice",
                             "float numpy model (host.reference): the accuracy yardstick"),
    "rtl": DeviceEntry("host.devices.rtl", "RtlDevice",
                       "Verilated hw/ core (host.devices.rtl): the golden device's bits, hardware cycle counts"),
    "ecp5": DeviceEntry("host.devices.ecp5", "Ecp5Device",
                        "ULX3S / ECPIX-5 (ECP5) board over its serial port (bitstreams/<board>, pyserial)"),
    "pynq": DeviceEntry("host.devices.pynq", "PynqDevice",
                        "Zynq / Zynq US+ board through pynq (host.devices.pynq: Overlay, AXI DMA, MMIO)"),
    "xrt": DeviceEntry("host.devices.xrt", "XrtDevice",
                       "Alveo card through pyxrt (host.devices.xrt: RTL kernel, HBM buffer objects)"),
}

#: Devices the design names but that are not written yet: opening one gives a clear DeviceError.
PLANNED_DEVICES: dict[str, str] = {}

#: Device used when none is named (the CLI's ``--device`` default). Becomes "golden" once it exists.
DEFAULT_DEVICE = "golden"


def _known() -> str:
    return ", ".join(sorted(DEVICES)) or "(none)"


def open_device(name: str, **options: Any) -> Device:
    """Construct the device registered as ``name`` (not yet loaded: call ``load(checkpoint)``).

    Parameters
    ----------
    name : str
        A key of :data:`DEVICES`.
    **options
        Keyword options of that device's constructor (e.g. ``output_gate`` for ``"reference"``).

    Returns
    -------
    Device

    Raises
    ------
    ValueError
        If ``name`` is unknown (the message lists the known devices) or an option is not accepted by
        the device (the message lists its options).
    DeviceError
        If the device is planned but not written yet, or its module (or a library it needs, such as
        ``pynq``) cannot be imported.
    """
    entry = DEVICES.get(name)
    if entry is None:
        if name in PLANNED_DEVICES:
            raise DeviceError(f"device {name!r} ({PLANNED_DEVICES[name]}) is not implemented yet; "
                              f"available devices: {_known()}")
        raise ValueError(f"unknown device {name!r}; known devices: {_known()}")
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        raise DeviceError(f"device {name!r} is not available: importing {entry.module} failed: {exc}") \
            from exc
    cls = getattr(module, entry.attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Device)):
        raise DeviceError(f"device {name!r}: {entry.module}.{entry.attr} is not a Device subclass")
    try:
        inspect.signature(cls).bind(**options)
    except TypeError:
        params = [p.name for p in inspect.signature(cls).parameters.values()
                  if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        raise ValueError(f"device {name!r} does not accept options {sorted(options)}; "
                         f"its options: {', '.join(params) or '(none)'}") from None
    return cls(**options)
