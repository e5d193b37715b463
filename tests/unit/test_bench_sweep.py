"""The sweep's pieces without an engine: the --sweep list, the per-range recommendation, the CSV and PNG files,
and loadtest --sweep's exit code against the stand-in server of test_bench_faults.py.

The engine runs are in tests/integration/test_bench_engine.py (loadtest --sweep) and
test_bench_ab_engine.py (bench ab --sweep).
"""

from __future__ import annotations

import csv
import json

import pytest

from gptoss_spark.bench.sweep import parse_concurrencies, recommend_by_range, render_ranges
from gptoss_spark.bench.sweep_plot import draw_png, sibling_paths, write_csv
from gptoss_spark.base.errors import UserError


def sweep(points: dict[int, tuple[float, float]], invalid_at: tuple[int, ...] = ()) -> dict:
    """points: concurrency -> (aggregate tok/s, TTFT p95 s)."""
    return {"points": [{"concurrency": c, "aggregate_tok_s": agg, "per_user_tok_s": agg / c, "ttft_p50_s": p95 / 2,
                        "ttft_p95_s": p95, "requests": c, "valid_requests": c - (c in invalid_at),
                        "invalid_requests": int(c in invalid_at), "completion_tokens_total": 100,
                        "makespan_s": 1.0, "observed_concurrency": c} for c, (agg, p95) in points.items()],
            "host": {"hostname": "box", "is_dgx_spark": False}, "protocol": {"endpoint": "completions"}}


def test_concurrency_lists():
    assert parse_concurrencies("1,2,5,10,32,64,128,256") == [1, 2, 5, 10, 32, 64, 128, 256]
    for bad, says in (("1,x", "whole numbers"), ("0,2", "1 to 1024"), ("4,2", "ascending"), ("2,2", "once"),
                      ("", "1 to 1024")):
        with pytest.raises(UserError, match=says):
            parse_concurrencies(bad)


def test_one_profile_per_load_range_from_three():
    # The shape the profiles are built for (made-up numbers, not measurements): spec leads alone,
    # auto in the middle, throughput at the top; at 10 auto and plain tie and the lower TTFT p95 wins.
    ranges = recommend_by_range({
        "spec": sweep({1: (69, 0.2), 2: (120, 0.3), 10: (150, 1.0), 64: (160, 9.0)}),
        "auto": sweep({1: (66, 0.2), 2: (110, 0.3), 10: (300, 0.8), 64: (300, 3.0)}),
        "throughput": sweep({1: (60, 0.2), 2: (100, 0.3), 10: (295, 0.9), 64: (600, 2.0)}, invalid_at=(2,)),
    })
    assert [(r["from"], r["to"], r["profile"]) for r in ranges] == [(1, 2, "spec"), (10, 10, "auto"),
                                                                      (64, 64, "throughput")]
    assert "within 3%" in ranges[1]["points"][0]["why"]
    assert "throughput" not in ranges[0]["points"][1]["why"]  # invalid requests at 2: not a candidate
    text = render_ranges(ranges)
    assert text[0].startswith("  1-2 users: spec") and text[2].startswith("  64 users: throughput")


def test_no_valid_profile_at_a_point_says_so():
    ranges = recommend_by_range({"a": sweep({1: (10, 1)}, invalid_at=(1,)), "b": None})
    assert ranges[0]["profile"] is None and "no profile served" in ranges[0]["points"][0]["why"]


def test_csv_and_png_beside_the_json(tmp_path):
    image = pytest.importorskip("matplotlib.image")
    sweeps = {"plain": sweep({1: (60, 0.2), 8: (150, 0.5)}), "auto": sweep({1: (68, 0.2), 8: (140, 0.6)})}
    json_path, csv_path, png_path = sibling_paths(tmp_path / "run.json")
    assert (json_path.name, csv_path.name, png_path.name) == ("run.json", "run.csv", "run.png")
    write_csv(sweeps, csv_path)
    rows = list(csv.DictReader(csv_path.open()))
    assert [(r["profile"], r["concurrency"]) for r in rows] == [("plain", "1"), ("plain", "8"), ("auto", "1"),
                                                               ("auto", "8")]
    assert float(rows[3]["aggregate_tok_s"]) == 140
    draw_png(sweeps, png_path, "test")
    pixels = image.imread(png_path)
    assert pixels.shape[0] >= 400 and pixels.shape[1] >= 1200  # 16 x 5 in at 100 dpi
    assert png_path.stat().st_size > 10_000


def test_an_unwritable_path_is_one_line(tmp_path):
    with pytest.raises(UserError, match="cannot write"):
        write_csv({"a": sweep({1: (1, 1)})}, tmp_path / "no" / "such" / "x.csv")


# ---- loadtest --sweep: an invalid request makes the exit code 1 (stand-in server, no engine) ----

@pytest.mark.parametrize("plan, rc", [([], 0), (["ok", "http500"], 1)])
def test_loadtest_sweep_exit_code_follows_its_requests(capsys, tmp_path, plan, rc):
    from gptoss_spark.cli import main
    from tests.unit.test_bench_faults import StandIn

    # --sweep-seconds 0.001: each user sends exactly one request, so 1 + 2 requests in all.
    with StandIn(plan) as srv:
        got = main(["loadtest", "--url", srv.url, "--endpoint", "completions", "--warmup", "0", "--no-progress",
                    "--admin-url", "http://127.0.0.1:9", "--timeout", "10", "--sweep", "1,2",
                    "--sweep-seconds", "0.001", "--out", str(tmp_path / "s.json"), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert got == rc
    assert [p["requests"] for p in res["points"]] == [1, 2]
    assert res["invalid_requests"] == rc
    if rc:
        assert res["points"][1]["invalid_reasons"] == ["HTTP 500: EngineCore died"]
    assert (tmp_path / "s.csv").exists() and (tmp_path / "s.png").exists()  # written either way


# ---- invalid points are marked, and an all-invalid sweep says so first ------------------------

ONE_CHUNK = ("all 37 tokens arrived in one chunk, so per-token timing is impossible "
             "(random-weight models do this on chat; use --endpoint completions)")


def recorded_chat_sweep_on_the_demo() -> dict:
    """The shape `loadtest --sweep 1,2` on chat gives on the random-weight demo: every request one delta."""
    res = sweep({1: (40.0, 0.9), 2: (70.0, 1.1)}, invalid_at=(1, 2))
    for p in res["points"]:
        p.update(valid_requests=0, invalid_requests=p["requests"], per_user_tok_s=None, invalid_reasons=[ONE_CHUNK])
    res.update(kind="gptoss-spark.sweep", invalid_requests=3, target={"base_url": "http://127.0.0.1:8100",
               "model": "gptoss"}, protocol={"endpoint": "chat", "max_tokens": 64, "temperature": 0.0,
                                             "warmup": 0, "ignore_eos": False})
    return res


def test_an_all_invalid_sweep_leads_with_a_warning_and_marks_every_row():
    from gptoss_spark.bench.render import render_sweep

    text = render_sweep(recorded_chat_sweep_on_the_demo(), "s.json", "s.csv", "s.png").splitlines()
    warning = next(i for i, x in enumerate(text) if x.startswith("ALL 3 REQUESTS OF THIS SWEEP WERE INVALID"))
    table = next(i for i, x in enumerate(text) if x.startswith("users"))
    assert warning < table and "--endpoint completions" in text[warning]
    rows = [x for x in text[table + 1:table + 3]]
    assert len(rows) == 2 and all(x.endswith("ALL INVALID: not a measurement") for x in rows)


def test_a_partly_invalid_point_is_marked_and_a_valid_one_is_not():
    from gptoss_spark.bench.render import render_sweep

    res = sweep({1: (40.0, 0.9), 2: (70.0, 1.1)}, invalid_at=(2,))
    for p in res["points"]:
        p["invalid_reasons"] = ["HTTP 500: EngineCore died"] if p["invalid_requests"] else []
    res.update(target={"base_url": "u", "model": "m"}, protocol={"endpoint": "completions", "max_tokens": 8,
                                                                 "temperature": 0.0, "warmup": 0, "ignore_eos": True})
    text = render_sweep(res, "s.json", "s.csv", "s.png")
    assert "WERE INVALID" not in text
    one, two = (next(x for x in text.splitlines() if x.split()[:1] == [c]) for c in ("1", "2"))
    assert "invalid" not in one.lower() and two.endswith("PARTLY INVALID: not a measurement")


def test_the_plot_keeps_invalid_points_off_the_line_and_the_csv_says_which(tmp_path):
    pytest.importorskip("matplotlib")
    from gptoss_spark.bench.sweep_plot import plot_series

    sweeps = {"demo": recorded_chat_sweep_on_the_demo(), "b": sweep({1: (50.0, 0.5), 2: (90.0, 0.6)}, invalid_at=(2,))}
    series = plot_series(sweeps)
    assert series["demo"]["all_invalid"] and series["demo"]["valid"]["aggregate_tok_s"] == []
    assert series["demo"]["invalid"]["aggregate_tok_s"] == [(1, 40.0), (2, 70.0)]
    assert not series["b"]["all_invalid"]
    assert series["b"]["valid"]["aggregate_tok_s"] == [(1, 50.0)] and series["b"]["invalid"]["aggregate_tok_s"] == [(2, 90.0)]
    write_csv(sweeps, tmp_path / "s.csv")
    assert [r["validity"] for r in csv.DictReader((tmp_path / "s.csv").open())] == \
        ["all invalid", "all invalid", "valid", "partly invalid"]
    draw_png(sweeps, tmp_path / "s.png", "test")  # draws with the marks and the banner
    assert (tmp_path / "s.png").stat().st_size > 10_000
