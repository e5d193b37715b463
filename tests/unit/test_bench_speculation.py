"""The spec-decode acceptance a bench run reports, from vLLM's counters (bench/speculation.py)."""

from __future__ import annotations

import pytest

from gptoss_spark.bench import speculation
from gptoss_spark.bench.ab import recommend


def metrics(drafts, tokens, accepted, engines=2):
    """vLLM 0.32.0's exposition, the counts split over `engines` engine indexes."""
    lines = ["# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.", "# TYPE vllm:spec_decode_num_drafts counter"]
    for name, total in ((speculation.DRAFTS, drafts), (speculation.DRAFT_TOKENS, tokens), (speculation.ACCEPTED, accepted)):
        lines += [f'{name}{{engine="{i}",model_name="gptoss"}} {total / engines}' for i in range(engines)]
    return "\n".join(lines) + "\n"


def test_counters_are_summed_over_engines_and_absent_without_speculation():
    assert speculation.parse_counters(metrics(10, 10, 6)) == {speculation.DRAFTS: 10, speculation.DRAFT_TOKENS: 10,
                                                               speculation.ACCEPTED: 6}
    assert speculation.parse_counters('vllm:num_requests_running{engine="0"} 0\n') is None


def test_acceptance_over_the_run_and_whether_it_pays():
    before = speculation.parse_counters(metrics(100, 100, 50))
    good = speculation.acceptance(before, speculation.parse_counters(metrics(1100, 1100, 850)))
    assert good["acceptance_rate"] == pytest.approx(0.8) and good["tokens_per_step"] == pytest.approx(1.8)
    assert good["pays"] is True and good["note"] is None
    poor = speculation.acceptance(before, speculation.parse_counters(metrics(1100, 1100, 150)))
    assert poor["tokens_per_step"] == pytest.approx(1.1) and poor["pays"] is False
    assert "below the ~1.6" in poor["note"] and "draft verify" in poor["note"]
    assert speculation.acceptance(None, None) is None                       # no speculation: no record
    idle = speculation.acceptance(before, before)
    assert idle["tokens_per_step"] is None and idle["note"] == "no drafts during the run"
    assert speculation.render(poor)[1].startswith("speculation: 10.0% of 1000 draft tokens accepted, 1.10 tokens")


def run(rate, spec=None, agg=100.0):
    """One profile's runs; as the baseline, its second run (bench ab measures the baseline twice) is the same."""
    single = {"summary": {"invalid_requests": 0, "decode_tok_s": {"median": rate}}, "speculation": spec}
    load = {"summary": {"invalid_requests": 0, "aggregate_tok_s": agg}}
    return {"single": single, "load": load, "error": None, "repeat": {"single": single, "load": load, "error": None}}


def test_ab_names_speculation_that_is_accepted_too_rarely():
    poor = {"tokens_per_step": 1.12, "pays": False}
    rec = recommend(["plain", "spec"], {"plain": run(60.0), "spec": run(61.0, poor)}, "plain", 30)
    assert "its speculation emits 1.12 tokens per step: too few to pay on a Spark" in rec["text"]
    rec = recommend(["plain", "spec"], {"plain": run(60.0), "spec": run(61.0, {"tokens_per_step": 1.8, "pays": True})},
                    "plain", 30)
    assert "tokens per step" not in rec["text"]
