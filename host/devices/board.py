"""What the Xilinx board transports (:mod:`host.devices.pynq`, :mod:`host.devices.xrt`) share: the shell's soft
reset and the recovery of a failed token through the core's registers. Everything else a board device does
(the ID block, loading, token packets, errors, counters, state replay) is the one driver's,
:class:`host.devices.driver.AcceleratorDevice`.

Recovery
    After the core's error flag: let the transport settle (its streams drain into the stopped core, or the
    DMAs are stopped), then ``CTRL.clear`` (the core waits for the next token packet; its committed state is
    unchanged). After a time-out: ``CTRL.abort`` first, and a soft reset last (the state is lost: the driver
    replays the sequence before the next token).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from host.devices.driver import Delivery
from host.image import ImageInfo
from host.protocol import IdBlock
from hw import isa
from hw.isa import Ctrl

__all__ = ["ShellTransport", "SOFT_RESET"]

R = isa.REGISTER_MAP
#: Core-relative offset of the shell's soft reset (hw/boards/xilinx_shell.py, an Amaranth module this one does not
#: import: a board runs without Amaranth; tests/test_pynq_driver.py checks that the two agree).
SOFT_RESET = 0xF0


class ShellTransport:
    """Base of a transport to a core inside the Xilinx shell (``hw/boards/xilinx_shell.py``): the soft reset at
    core-relative :data:`SOFT_RESET`, register recovery, the token's wall time as ``transfer_ns``.

    Subclasses implement :meth:`read`, :meth:`write`, :meth:`stage`, :meth:`transfer`, :meth:`close`, and
    optionally :meth:`quiesce` and :meth:`check_ident`.
    """

    extra_counters = ("transfer_ns",)

    def connect(self, info: ImageInfo | None) -> None:
        """Nothing: the overlay or xclbin was opened with the transport."""

    def check_ident(self, ident: IdBlock) -> None:  # noqa: B027 - optional hook
        """Take the build (default: nothing to take)."""

    def read(self, offset: int) -> int:
        raise NotImplementedError

    def write(self, offset: int, value: int) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        self.write(SOFT_RESET, 1)

    def transfer(self, packet: bytes, deadline: float, poll: Callable[[], None]) -> bytes:
        """Stream ``packet`` then the image; return the output packet (see
        :meth:`host.devices.driver.Transport.run`)."""
        raise NotImplementedError

    def run(self, packet: bytes, deadline: float | None, poll: Callable[[], None]) -> Delivery:
        t0 = time.monotonic()
        out = self.transfer(packet, deadline, poll)
        return Delivery(out, None, {"transfer_ns": int((time.monotonic() - t0) * 1e9)})

    def quiesce(self) -> None:  # noqa: B027 - optional hook
        """Stop or finish every transfer of the failed token (default: nothing to do)."""

    def recover(self, timed_out: bool) -> None:
        if timed_out:
            self.write(R.CTRL, Ctrl.ABORT.value)
        self.quiesce()    # no transfer of the failed token may reach the core after CTRL.clear
        self.write(R.CTRL, Ctrl.CLEAR.value)
        if timed_out:
            self.reset()
