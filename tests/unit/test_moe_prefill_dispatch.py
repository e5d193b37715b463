"""Which kernels and tiles a chunk of N tokens gets (ops.moe_block_any, moe_prefill.prefill_config_for)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from gptoss_spark.kernels.device import moe_prefill  # noqa: E402
from gptoss_spark.kernels.moe import MAX_DECODE_TOKENS  # noqa: E402
from gptoss_spark.kernels.ops import DECODE_DISPATCH_TOKENS  # noqa: E402


@pytest.mark.parametrize("mma,expected", [
    (2, {17: 8, 32: 8, 128: 8, 129: 16, 512: 16, 513: 32, 1024: 32, 1025: 64, 8192: 64}),
    (3, {17: 16, 256: 16, 257: 32, 512: 32, 513: 64, 8192: 64}),
])
def test_block_m_by_token_count(mma, expected):
    got = {m: moe_prefill.prefill_config_for(m, mma).block_m for m in expected}
    assert got == expected


def test_small_blocks_take_two_k_blocks_per_iteration():
    for mma in (2, 3):
        for cfg in moe_prefill.prefill_configs(mma):
            want = 2 if cfg.block_m <= moe_prefill.WIDE_LOOP_MAX_BLOCK_M else 1
            assert (cfg.gate_up_c, cfg.down_c) == (want, want), cfg


def test_configs_list_every_pick_once():
    for mma in (2, 3):
        configs = moe_prefill.prefill_configs(mma)
        picks = {moe_prefill.prefill_config_for(m, mma) for m in range(DECODE_DISPATCH_TOKENS + 1, 10000, 7)}
        assert picks == set(configs) and len(configs) == len(set(configs))


def test_wgmma_layout_refuses_eight_pair_blocks():
    """block_m 8 computed wrong sums on layout 3 (relative error 1.0 on the H200): refused in one line."""
    with pytest.raises(ValueError, match="layout 3"):
        moe_prefill.check_config(moe_prefill.PrefillConfig(block_m=8), 3)
    moe_prefill.check_config(moe_prefill.PrefillConfig(block_m=8), 2)


def test_decode_dispatch_is_within_the_decode_kernels():
    assert 1 <= DECODE_DISPATCH_TOKENS <= MAX_DECODE_TOKENS
