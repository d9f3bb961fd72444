"""Where a core built with the recurrent state in DRAM keeps it (:mod:`hw.state_cache`): the one home of
that layout, which the board's state engine (:class:`hw.boards.dram_board.DRAMBoard`), the host's DRAM loader
(:mod:`host.devices.ecp5`) and the cycle model read. No Amaranth: the host imports it on a board.
"""

from dataclasses import dataclass

__all__ = ["STATE_BEAT_BITS", "StateGeometry", "state_beats"]

#: the state streams' beat: two int32 elements
STATE_BEAT_BITS = 64


def _pow2(v: int) -> int:
    return 1 << max(v - 1, 0).bit_length()


def state_beats(max_hidden: int) -> int:
    """64-bit beats of one layer's row of the state: ``ceil(max_hidden / 2)`` (an odd ``max_hidden``'s last
    beat carries one element and a zero)."""
    return -(-max_hidden // 2)


@dataclass(frozen=True)
class StateGeometry:
    """Where the two banks of recurrent state lie in a board's DRAM (the one home of that layout).

    Row ``(bank, layer)`` (``max_hidden`` int32, little-endian, :func:`state_beats` x 8 bytes) starts at byte
    ``base + offset(bank, layer)``: rows ``row_stride`` bytes apart, banks ``bank_stride`` bytes apart, the
    region of ``region_bytes`` at the top of the DRAM (``base(dram_bytes)``), where the host puts neither the
    image nor the embedding table.

    Parameters
    ----------
    max_hidden, max_layers : int
        The build's capacities (:class:`hw.params.BuildParams`).
    """

    max_hidden: int
    max_layers: int

    @property
    def row_bytes(self) -> int:
        """Bytes a row transfer moves: ``state_beats(max_hidden) * 8``."""
        return state_beats(self.max_hidden) * STATE_BEAT_BITS // 8

    @property
    def row_stride(self) -> int:
        """Bytes between layers' rows: ``row_bytes`` rounded up to a power of two."""
        return _pow2(self.row_bytes)

    @property
    def bank_stride(self) -> int:
        """Bytes between the banks: ``max_layers`` rounded up to a power of two, times ``row_stride``."""
        return _pow2(self.max_layers) * self.row_stride

    @property
    def region_bytes(self) -> int:
        """Bytes of both banks."""
        return 2 * self.bank_stride

    def base(self, dram_bytes: int) -> int:
        """The region's first byte in a DRAM of ``dram_bytes``.

        Raises
        ------
        ValueError
            The DRAM is smaller than the region.
        """
        if dram_bytes < self.region_bytes:
            raise ValueError(f"a DRAM of {dram_bytes} bytes cannot hold the state's {self.region_bytes}")
        return dram_bytes - self.region_bytes

    @property
    def row_shift(self) -> int:
        """``log2(row_stride)``: where a row's layer starts in its offset."""
        return self.row_stride.bit_length() - 1

    @property
    def bank_shift(self) -> int:
        """``log2(bank_stride)``: the bank's bit in an offset (the layer takes the bits between)."""
        return self.bank_stride.bit_length() - 1

    def offset(self, bank: int, layer: int) -> int:
        """Byte offset of row ``(bank, layer)`` in the region: ``bank << bank_shift | layer << row_shift``."""
        return bank << self.bank_shift | layer << self.row_shift
