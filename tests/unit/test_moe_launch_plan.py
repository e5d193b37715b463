"""moe.launch_plan: which kernel variants a call with m tokens runs (host logic, no GPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from gptoss_spark.kernels.moe import DEFAULT_CONFIG, distinct_plans, launch_plan  # noqa: E402
from gptoss_spark.kernel_tools.variants import GPT_OSS_120B, token_counts  # noqa: E402


def test_one_token_halves_gate_up_rows_and_shares_down_k():
    """One token, top-4: 4 experts for a down split of 8, so each expert's K is shared by 2 down
    programs; gate_up's programs take 32 features each (twice the programs)."""
    p = launch_plan(1, 4)
    assert (p.m_pad, p.gate_up_half_rows, p.down_k_parts) == (16, True, 2)


def test_enough_experts_for_the_split_means_the_plain_plan():
    for m in (2, 3, 16):
        p = launch_plan(m, 4)
        assert (p.gate_up_half_rows, p.down_k_parts) == (False, 1), m
    assert launch_plan(32, 4).m_pad == 32


def test_topk_rows_hold_the_tokens_in_whole_rows_per_warp():
    assert [launch_plan(m, 4).topk_rows for m in (1, 4, 5, 8, 9, 17, 32)] == [4, 4, 8, 8, 16, 32, 32]
    assert launch_plan(1, 4, replace(DEFAULT_CONFIG, router_topk_min_rows=16)).topk_rows == 16


def test_k_shares_are_a_power_of_two_dividing_the_split():
    assert launch_plan(1, 2).down_k_parts == 4            # 2 experts, split 8
    assert launch_plan(1, 1, replace(DEFAULT_CONFIG, down_split=6)).down_k_parts == 2  # 6 = 2 x 3
    assert launch_plan(1, 4, replace(DEFAULT_CONFIG, down_split=1)).down_k_parts == 1
    assert launch_plan(1, 4, replace(DEFAULT_CONFIG, down_k_parts=False)).down_k_parts == 1


def test_half_rows_follow_the_token_limit():
    cfg = replace(DEFAULT_CONFIG, gate_up_half_rows_max=2)
    assert [launch_plan(m, 4, cfg).gate_up_half_rows for m in (1, 2, 3)] == [True, True, False]
    assert not launch_plan(1, 4, replace(DEFAULT_CONFIG, gate_up_half_rows_max=0)).gate_up_half_rows


def test_mma_sync_layout_takes_8_token_columns_up_to_8_tokens():
    """Layout 2 (mma.sync, GB10's): the expert kernels' tile is mma.sync's n8 up to 8 tokens; the
    router's stays 16 (it is not the expert kernels' layout); layout 3 (wgmma) never goes below 16."""
    assert [launch_plan(m, 4, mma=2).m_pad for m in (1, 2, 8, 9, 16, 17, 32)] == [8, 8, 8, 16, 16, 32, 32]
    assert [launch_plan(m, 4, mma=2).router_m_pad for m in (1, 8, 9, 17)] == [16, 16, 16, 32]
    assert [launch_plan(m, 4, mma=3).m_pad for m in (1, 8, 9, 17)] == [16, 16, 16, 32]
    assert launch_plan(1, 4, replace(DEFAULT_CONFIG, mma_sync_m_pad=16), mma=2).m_pad == 16
    assert launch_plan(1, 4, replace(DEFAULT_CONFIG, router_m_pad=8), mma=3).router_m_pad == 8


def test_topk_runs_in_gate_up_up_to_its_token_limit():
    assert [launch_plan(m, 4).topk_in_gate_up for m in (1, 2, 3, 32)] == [True, True, False, False]
    cfg = replace(DEFAULT_CONFIG, topk_in_gate_up_max=0)
    assert not any(launch_plan(m, 4, cfg).topk_in_gate_up for m in (1, 2))


def test_slots_follow_the_picks_at_one_token_only():
    """Slot s = the token's pick s needs one token (distinct picks) and the top-k in gate_up."""
    assert [launch_plan(m, 4).slots_by_pick for m in (1, 2, 3)] == [True, False, False]
    assert not launch_plan(1, 4, replace(DEFAULT_CONFIG, topk_in_gate_up_max=0)).slots_by_pick
    assert not launch_plan(1, 4, replace(DEFAULT_CONFIG, slots_by_pick=False)).slots_by_pick


@pytest.mark.parametrize("mma", [2, 3])
def test_aot_token_counts_cover_every_plan(mma):
    """The AOT build launches one token count per distinct plan; every m in 1..32 maps to one of them."""
    counts = token_counts(GPT_OSS_120B, mma)
    # K shares at 1; the top-k in gate_up up to 2; top-k rows 4, 8, 16, 32 from 2, 5, 9, 17 (and on
    # layout 2 the 8-column tile up to 8)
    assert counts == [1, 2, 3, 5, 9, 17]
    plans = distinct_plans(4, mma=mma)
    assert {launch_plan(m, 4, mma=mma) for m in range(1, 33)} == set(plans)
    assert sorted(plans.values()) == counts


@pytest.mark.parametrize("split", [0, 16])
def test_down_split_beyond_what_a_counted_sum_counts_is_refused(split):
    """down's shares meet in counted_sum's words, whose 4 count bits count up to 15 adds."""
    with pytest.raises(ValueError, match=f"down_split {split}: must be 1..15"):
        replace(DEFAULT_CONFIG, down_split=split)
    assert replace(DEFAULT_CONFIG, down_split=15).down_split == 15


def test_counted_sums_up_to_the_token_limit():
    """down sums its split's shares by counted atomics at one token (config.down_counted_max), by
    partials from two; with no split there is nothing to sum."""
    assert [launch_plan(m, 4).down_counted for m in (1, 2, 8)] == [True, False, False]
    assert [launch_plan(m, 4, replace(DEFAULT_CONFIG, down_counted_max=8)).down_counted for m in (8, 9)] == [True, False]
    assert not launch_plan(1, 4, replace(DEFAULT_CONFIG, down_split=1)).down_counted
    assert not launch_plan(1, 4, replace(DEFAULT_CONFIG, down_counted_max=0)).down_counted
