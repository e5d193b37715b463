"""Result building, human rendering, compare and the CLI's bad-input paths, without a server."""

import json
from datetime import datetime, timezone

import pytest

from gptoss_spark.bench.compare import compare, load_result
from gptoss_spark.bench.load import loadtest_result
from gptoss_spark.bench.render import render_bench, render_compare, render_loadtest
from gptoss_spark.bench.request import RequestRecord, RequestSpec
from gptoss_spark.bench.single import bench_result
from gptoss_spark.bench.target import Target
from gptoss_spark.base.exit_codes import EXIT_UNAVAILABLE
from gptoss_spark.cli import main
from gptoss_spark.base.errors import UserError

TARGET = Target(base_url="http://127.0.0.1:8100", model="gptoss", served_models=("gptoss",), max_model_len=1024,
                server_version="0.32.0")
HOST = {"hostname": "ci", "machine": "x86_64", "is_dgx_spark": False, "gpu": {"gpus": None},
        "active_profile": {"active": None, "reason": "admin API did not answer"}}
NOW = datetime(2026, 11, 29, tzinfo=timezone.utc)


def record(index, tokens, sent, first, last, user=None, error=None):
    r = RequestRecord(index=index, prompt_id=f"p{index}", user=user, sent_at=sent, first_output_at=first,
                      last_output_at=last, ended_at=last, output_chunks=tokens, completion_tokens=tokens,
                      finish_reason="length", saw_done=True, error=error)
    return r


def make_bench(rates_scale=1.0):
    recs = [record(0, 101, 0.0, 0.5, 0.5 + 100 / (50 * rates_scale)),
            record(1, 101, 3.0, 3.4, 3.4 + 100 / (60 * rates_scale)),
            record(2, 101, 6.0, 6.3, 6.3 + 100 / (70 * rates_scale))]
    return bench_result(TARGET, RequestSpec(), "shipped:prompts.jsonl", 3, 1, [], recs, 9.0, HOST, NOW)


def test_bench_summary_is_the_median_of_valid_rates():
    res = make_bench()
    s = res["summary"]
    assert s["valid_requests"] == 3 and s["invalid_requests"] == 0
    assert s["decode_tok_s"]["median"] == pytest.approx(60.0)
    assert s["ttft_s"]["median"] == pytest.approx(0.4)
    json.dumps(res)


def test_invalid_requests_are_listed_with_reason_and_excluded():
    recs = [record(0, 101, 0.0, 0.5, 2.5), record(1, 0, 3.0, None, None, error="HTTP 500: boom")]
    res = bench_result(TARGET, RequestSpec(), "x", 2, 0, [], recs, 4.0, HOST, NOW)
    assert res["summary"]["valid_requests"] == 1
    assert res["invalid"] == [{"index": 1, "reason": "HTTP 500: boom"}]
    assert res["summary"]["decode_tok_s"]["median"] == pytest.approx(100 / 2.0)
    text = render_bench(res)
    assert "INVALID: HTTP 500: boom" in text


def test_render_bench_labels_seed_figures_as_the_seeds():
    text = render_bench(make_bench())
    assert "seed's Spark figure" in text and "not measured here" in text
    assert "64.3" in text and "68.9" in text
    assert "NOT a DGX Spark" in text and "not comparable" in text


def test_loadtest_aggregate_is_tokens_over_makespan():
    recs = [record(0, 50, 0.0, 0.2, 1.0, user=0), record(1, 50, 0.0, 0.3, 1.5, user=1),
            record(2, 50, 0.0, 0.4, 2.0, user=2), record(3, 0, 0.0, None, None, user=3, error="stream cut")]
    res = loadtest_result(TARGET, RequestSpec(), "x", 4, 1, 0, [], recs, 0.0, 2.5, HOST, NOW)
    s = res["summary"]
    assert s["completion_tokens_total"] == 150
    assert s["aggregate_tok_s"] == pytest.approx(150 / 2.5)
    assert s["ttft_s"]["p50"] == pytest.approx(0.3)
    assert s["observed_concurrency"] == 3
    assert s["invalid_requests"] == 1 and res["invalid"][0]["user"] == 3
    assert "stream cut" in render_loadtest(res)


def test_compare_ratios_and_protocol_differences(tmp_path):
    a, b = make_bench(1.0), make_bench(1.1)
    b["protocol"]["max_tokens"] = 256
    cmp = compare(a, b)
    row = next(r for r in cmp["rows"] if r["metric"] == "decode tok/s (median)")
    assert row["ratio_b_over_a"] == pytest.approx(1.1)
    assert cmp["protocol_differences"] == {"max_tokens": {"a": 512, "b": 256}}
    text = render_compare(cmp, "a.json", "b.json")
    assert "B better" in text and "protocol differs" in text


def test_compare_cli_and_its_errors(tmp_path, capsys):
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(make_bench(1.0)))
    fb.write_text(json.dumps(make_bench(2.0)))
    assert main(["bench", "compare", str(fa), str(fb), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"][0]["ratio_b_over_a"] == pytest.approx(2.0)

    (tmp_path / "junk.json").write_text("{}")
    assert main(["bench", "compare", str(fa), str(tmp_path / "junk.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gptoss-spark: error:") and "not a gptoss-spark bench" in err and "\n" not in err
    with pytest.raises(UserError, match="cannot compare"):
        lt = make_bench()
        lt["kind"] = "gptoss-spark.loadtest"
        compare(make_bench(), lt)
    with pytest.raises(UserError, match="cannot read"):
        load_result(tmp_path / "missing.json")


def test_server_down_is_one_line_and_exit_unavailable(capsys):
    assert main(["bench", "--url", "http://127.0.0.1:9", "--no-progress"]) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err.strip()
    assert "cannot reach http://127.0.0.1:9" in err and "systemctl status gptoss-spark" in err and "\n" not in err


def test_bad_arguments_fail_before_any_request(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--requests", "0"])
    assert e.value.code == 2 and "must be at least 1" in capsys.readouterr().err
    assert main(["bench", "--url", "localhost:8100"]) == 2
    assert "not an http(s) URL" in capsys.readouterr().err
