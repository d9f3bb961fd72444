"""hw.params.BuildParams: the one build type (gateware, export, ID block, devices, cycle model)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from hw import isa
from hw.boards import facts
from hw.isa import TritPacking
from hw.params import DEVICE_FIELDS, GATEWARE_FIELDS, SCHEDULE_OPTIONS, BuildParams


def test_one_definition_everywhere():
    import host.perf

    assert host.perf.BuildParams is BuildParams
    assert all(isinstance(b.design, BuildParams) for b in facts.BOARDS.values())
    names = [f.name for f in dataclasses.fields(BuildParams)]
    assert set(GATEWARE_FIELDS) | set(SCHEDULE_OPTIONS) | {"fmax_mhz"} == set(names)
    assert set(DEVICE_FIELDS) <= set(names)


def test_imports_without_amaranth_beyond_hw_isa():
    """hw.params itself imports no Amaranth module (hw.isa's own dependency is hw.isa's business)."""
    code = ("import sys, hw.isa; before = set(sys.modules); import hw.params; "
            "new = [m for m in set(sys.modules) - before if m.startswith('amaranth')]; assert not new, new")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_coercion_views_and_round_trips():
    b = BuildParams(lanes=32, quant_lanes=4, packing="bits2", epilogue_folded=True, max_layers=4)
    assert b.packing is TritPacking.BITS2 and BuildParams(packing=1).packing is TritPacking.BASE3
    assert b.triple == (32, 1, 64) and b.beat_bytes == 8 and b.lanes_per_channel == 32 and b.serial
    g = b.gateware()
    assert tuple(g) == GATEWARE_FIELDS and g["packing"] == TritPacking.BITS2.value
    assert BuildParams(**b.as_dict()) == b == BuildParams.from_mapping({**g, "fmax_mhz": b.fmax_mhz})
    assert BuildParams.from_mapping({"epilogue_folded": 1}).epilogue_folded is True
    with pytest.raises(TypeError, match="unknown build parameter"):
        BuildParams.from_mapping({"lane": 3})
    assert b.replace(lanes=64).lanes == 64 and not BuildParams.overlapped().serial
    assert b.device_kwargs() == {k: getattr(b, k) for k in DEVICE_FIELDS}


def test_id_block_round_trip():
    b = BuildParams(lanes=64, channels=2, bus_bits=128, quant_lanes=16, packing=TritPacking.BITS2,
                    max_hidden=1024, max_intermediate=2816, max_layers=32, epilogue_folded=True)
    regs = b.id_values()
    names = {"lanes": "ID_LANES", "channels": "ID_CHANNELS", "bus_bits": "ID_BUS_BITS", "packings": "ID_PACKINGS",
             "max_hidden": "ID_MAX_HIDDEN", "max_intermediate": "ID_MAX_INTERMEDIATE",
             "max_layers": "ID_MAX_LAYERS", "quant_lanes": "ID_QUANT_LANES", "epilogue_folded": "ID_EPILOGUE"}
    ident = {k: regs[getattr(isa.REGISTER_MAP, r)] for k, r in names.items()}
    assert BuildParams.from_id_block(ident) == b
    old = {k: v for k, v in ident.items() if k in ("lanes", "channels", "bus_bits", "quant_lanes")}
    assert BuildParams.from_id_block(old, fmax_mhz=50.0) == BuildParams(lanes=64, channels=2, bus_bits=128,
                                                                         quant_lanes=16, fmax_mhz=50.0)


@pytest.mark.parametrize("kw,match", [
    ({"channels": 8, "lanes": 64}, "channels"), ({"lanes": 2048, "channels": 4}, "per channel"),
    ({"bus_bits": 32}, "bus_bits"), ({"quant_lanes": 6}, "power of two"), ({"quant_lanes": 128}, "power of two"),
    ({"weight_fifo_beats": 8}, "weight_fifo_beats"), ({"max_hidden": isa.MAX_HIDDEN + 1}, "capacities"),
    ({"stream_prologue": True}, "schedule option"),
])
def test_gateware_limits(kw, match):
    b = BuildParams(**kw)              # the cycle model takes it
    with pytest.raises(ValueError, match=match):
        b.check_gateware()


def test_design_points_are_buildable_except_the_clock():
    for f in facts.BOARDS.values():
        f.design.check_gateware()
