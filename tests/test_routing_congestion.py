"""bench/routing_congestion.py: nextpnr router2 heatmaps summed by hw/ module."""

import pytest

from bench import routing_congestion as rc


def test_module_of_groups_the_epilogue_stages():
    assert rc.module_of("core.epilogue.stage3.s3_v2_LUT4_C_Z") == "core.epilogue.stage*"
    assert rc.module_of("core.epilogue.rd_delay2.x") == "core.epilogue.rd_delay2"
    assert rc.module_of("core.f_at_end_LUT4_B_Z[3]") == "core"
    assert rc.module_of("core.epilogue.stage3.x", depth=2) == "core.epilogue"
    assert rc.module_of("link.bridge.w_done_TRELLIS_FF_Q_CE") == "link.bridge"
    assert rc.module_of("$PACKER_GND_NET") == "$PACKER_GND_NET"


def test_summary_from_heatmap_files(tmp_path):
    (tmp_path / "h_congestion_by_net_2.csv").write_text(
        "core.epilogue.stage1.a,30\ncore.epilogue.stage7.b,30\ncore.quant.s1.c,20\n$PACKER_GND_NET,20\n")
    (tmp_path / "h_congestion_by_coordinate_2.csv").write_text("0,1,2,\n3,0,0,\n")
    res = rc.summarise(rc.read_by_net(tmp_path / "h_congestion_by_net_2.csv"),
                       rc.read_by_coordinate(tmp_path / "h_congestion_by_coordinate_2.csv"), blocks=2)
    assert res["total_overuse"] == 100 and res["nets"] == 4
    assert res["by_module"][0] == {"module": "core.epilogue.stage*", "overuse": 60, "share": 0.6, "nets": 2}
    assert {m["module"] for m in res["by_module"]} == {"core.epilogue.stage*", "core.quant.s1", "$PACKER_GND_NET"}
    assert res["by_top_module"][0] == {"module": "core.epilogue", "overuse": 60, "share": 0.6}
    assert res["grid"]["total"] == 6 and res["grid"]["tiles_overused"] == 3
    assert res["grid"]["block_sums"] == [[1, 2], [3, 0]]
    out = tmp_path / "r.json"
    assert rc.main([str(tmp_path / "h"), "2", "--out", str(out)]) == 0
    assert out.exists()


def test_bad_rows_and_missing_files_are_clear_errors(tmp_path):
    p = tmp_path / "x_congestion_by_net_1.csv"
    p.write_text("core.a,12\nbroken line without a count\n")
    with pytest.raises(ValueError, match=":2: expected 'net,count'"):
        rc.read_by_net(p)
    p.write_text("core.a,12\ncore.b,-3\n")
    with pytest.raises(ValueError, match=":2: expected"):
        rc.read_by_net(p)
    p.write_text("core.a,12\ncore.a,3\n")
    with pytest.raises(ValueError, match="listed twice"):
        rc.read_by_net(p)
    (tmp_path / "x_congestion_by_coordinate_1.csv").write_text("1,x,2\n")
    with pytest.raises(ValueError, match="coordinate_1.csv:1: expected numbers"):
        rc.read_by_coordinate(tmp_path / "x_congestion_by_coordinate_1.csv")
    p.write_text("core.a,12\n")
    assert rc.main([str(tmp_path / "x"), "1"]) == 2       # the bad coordinate file: a message, not a traceback
    with pytest.raises(SystemExit):
        rc.main([str(tmp_path / "nothing"), "1"])
