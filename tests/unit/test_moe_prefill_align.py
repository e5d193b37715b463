"""reference.align_pairs_ref: (token, k) pairs grouped by expert into blocks (torch on the CPU, no kernels).

The kernel that computes the same tables on the GPU (prefill_routing.align) is compared with it
under the interpreter (test_kernels_interpret.py) and on the device (tests/gpu)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gptoss_spark.kernels.reference import align_pairs_ref  # noqa: E402


@pytest.mark.parametrize("m,e,top_k,block_m", [(37, 16, 4, 8), (5, 128, 4, 64), (64, 8, 2, 16)])
def test_every_pair_once_in_its_experts_blocks(m, e, top_k, block_m):
    g = torch.Generator().manual_seed(m + e)
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32)
    pairs, block_expert = align_pairs_ref(ids, e, block_m)
    n = m * top_k
    flat = ids.reshape(-1)
    assert block_expert.numel() == -(-n // block_m) + e and pairs.numel() == block_expert.numel() * block_m
    blocks = pairs.view(-1, block_m)
    valid = blocks < n
    # every pair exactly once; the rest is padding
    assert torch.equal(torch.sort(blocks[valid]).values, torch.arange(n, dtype=torch.int32))
    counts = torch.bincount(flat.long(), minlength=e)
    assert int((block_expert >= 0).sum()) == int(((counts + block_m - 1) // block_m).sum())
    for b in range(blocks.shape[0]):
        got = blocks[b][valid[b]]
        if block_expert[b] < 0:
            assert got.numel() == 0, b
            continue
        assert got.numel() > 0 and bool((flat[got.long()] == block_expert[b]).all()), b
        assert torch.equal(got, torch.sort(got).values), b  # token order inside an expert
    # an expert's blocks are consecutive and only its last one is partly padding
    used = block_expert[block_expert >= 0]
    assert torch.equal(used, torch.sort(used).values)
    for x in used.unique():
        mine = (block_expert == x).nonzero().flatten()
        assert bool(valid[mine[:-1]].all())
