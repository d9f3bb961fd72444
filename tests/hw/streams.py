"""``amaranth.lib.stream`` helpers for the Amaranth testbenches (async, Amaranth 0.5's ``ctx``), written once.

After Glasgow's ``gateware/stream.py`` (``stream_put``, ``stream_get``, ``stream_assert``), with the random idle
cycles (producer side) and backpressure (consumer side) every test runs its scenarios with and without:

* :func:`stream_put` presents a payload until it is transferred; :func:`stream_put_all` a sequence of them.
* :func:`stream_get` takes one payload and checks the transfer rules of the producer under test while it
  waits (once ``valid``, ``valid`` stays and the payload holds until the transfer); :func:`stream_get_all`
  takes several; :func:`stream_assert` takes one and compares it.

Every helper awaits the clock of the testbench's default domain and leaves ``valid`` (put) or ``ready``
(get) low when it returns; ``rng`` is a :class:`numpy.random.Generator` or a :class:`random.Random` (only
``rng.random()`` is used), drawn once per idle or backpressure decision.
"""

from __future__ import annotations

from amaranth.hdl import Value

__all__ = ["stream_put", "stream_put_all", "stream_get", "stream_get_all", "stream_assert"]


def _coin(rng, p: float) -> bool:
    """True with probability ``p`` (no draw for ``p = 0``: the full-rate runs draw nothing)."""
    return p > 0 and rng.random() < p


async def stream_put(ctx, stream, payload, *, idle: float = 0.0, rng=None) -> int:
    """Present ``payload`` on ``stream`` (after idle cycles, each with probability ``idle``) until ``ready``.

    Returns
    -------
    int
        Clock cycles spent: the idle cycles, the cycles waiting for ``ready`` and the transfer cycle (1 for
        a transfer in the first cycle).
    """
    cycles = 0
    while _coin(rng, idle):
        ctx.set(stream.valid, 0)
        await ctx.tick()
        cycles += 1
    ctx.set(stream.payload, payload)
    ctx.set(stream.valid, 1)
    while True:
        _, _, ready = await ctx.tick().sample(stream.ready)
        cycles += 1
        if ready:
            break
    ctx.set(stream.valid, 0)
    return cycles


async def stream_put_all(ctx, stream, payloads, *, idle: float = 0.0, rng=None) -> int:
    """:func:`stream_put` each of ``payloads`` in order, back to back (no bubble without idles); returns the
    cycles spent in all."""
    cycles = 0
    for payload in payloads:
        cycles += await stream_put(ctx, stream, payload, idle=idle, rng=rng)
    return cycles


async def stream_get(ctx, stream, *, stall: float = 0.0, rng=None, timeout: int | None = None):
    """Take one payload from ``stream``: ``ready`` in each cycle except with probability ``stall``, until a
    transfer. While ``valid`` waits for ``ready`` the payload must not change and ``valid`` must not drop
    (asserted: the stream rules of the producer under test).

    Parameters
    ----------
    timeout : int, optional
        Most cycles to wait (``AssertionError`` beyond).

    Returns
    -------
    The payload (a :class:`amaranth.lib.data.Const` for a layout, else an int).
    """
    held = None  # the payload's bits while valid and not ready
    cycles = 0
    while True:
        ready = not _coin(rng, stall)
        ctx.set(stream.ready, ready)
        _, _, valid, bits, payload = await ctx.tick().sample(stream.valid, Value.cast(stream.payload), stream.payload)
        cycles += 1
        if held is not None:
            assert valid, f"{stream}: valid dropped before the transfer"
            assert bits == held, f"{stream}: payload changed before the transfer"
        if valid and ready:
            ctx.set(stream.ready, 0)
            return payload
        held = bits if valid else None
        assert timeout is None or cycles < timeout, f"{stream}: nothing within {timeout} cycles"


async def stream_get_all(ctx, stream, count: int, *, stall: float = 0.0, rng=None, timeout: int | None = None) -> list:
    """:func:`stream_get` ``count`` payloads (``timeout`` applies to each); returns them in order."""
    return [await stream_get(ctx, stream, stall=stall, rng=rng, timeout=timeout) for _ in range(count)]


async def stream_assert(ctx, stream, expected, *, stall: float = 0.0, rng=None, timeout: int | None = None):
    """:func:`stream_get` one payload and assert that it equals ``expected`` (a value or a layout's dict)."""
    payload = await stream_get(ctx, stream, stall=stall, rng=rng, timeout=timeout)
    if isinstance(expected, dict):
        expected = stream.payload.shape().const(expected)
    assert payload == expected, f"{stream}: got {payload!r}, expected {expected!r}"
    return payload
