"""`gptoss-spark kernels bench`'s table and its errors (the timing itself runs on a GPU only)."""

import pytest

from gptoss_spark.cli import main


def _res(peer=True):
    row = {"tokens": 32, "distinct": 81.6, "bytes": 1.08e9, "roofline_us": 252.5, "ours_us": 446.3,
           "ours_err": 2.3e-4, "peer": {"nw8": 484.4, "nw4": 438.0} if peer else {},
           "peer_err": {"nw8": 6.2e-3, "nw4": 6.2e-3} if peer else {}, "cublas_us": 1886.5}
    res = {"device": "GPU", "mma_layout": 2, "time": "now", "layers": 8, "rows": [row],
           "roofline": {"roofline_TBps": 4.28}}
    if peer:
        res["peer"] = {"version": "1.0.0"}
    return res


def test_table_puts_ours_beside_the_best_peer_and_the_roofline():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from gptoss_spark.kernel_tools import benchmark
    md = benchmark.render(_res())
    header, _, row = md.strip().splitlines()[-3:]
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["ours us (of roofline)"] == "446.3 (0.57)"          # 252.5 / 446.3
    assert cells["peer nw4 us (of roofline)"] == "438.0 (0.58)"
    assert cells["ours / best peer"] == "1.02"                        # against nw4, the faster peer config
    assert cells["cuBLAS bf16 us"] == "1886.5"
    no_peer = benchmark.render(_res(peer=False))
    assert "ours / best peer" not in no_peer and "No peer given" in no_peer


def test_bad_peer_path_is_one_line(tmp_path, capsys):
    pytest.importorskip("torch")
    from gptoss_spark.kernel_tools import peer
    with pytest.raises(peer.PeerError, match="no triton_kernels/matmul_ogs.py"):
        peer.load(tmp_path)


def test_bench_without_a_gpu_says_so(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: the no-GPU message is not what runs here")
    assert main(["kernels", "bench", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err


def test_token_list_is_checked(capsys):
    with pytest.raises(SystemExit):
        main(["kernels", "bench", "--out", "x", "--tokens", "1,0"])
    assert "token counts must be >= 1" in capsys.readouterr().err
