import json

from gptoss_spark.bench import snapshot


def test_meminfo_parsed_in_bytes(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24000000 kB\nMemFree: 100 kB\nMemAvailable:   12000000 kB\n"
                 "SwapTotal: 1000 kB\nSwapFree: 400 kB\nHugePages_Total:       0\n")
    m = snapshot.memory_info(f)
    assert m["total_bytes"] == 24000000 * 1024
    assert m["available_bytes"] == 12000000 * 1024
    assert m["swap_used_bytes"] == 600 * 1024


def test_meminfo_unreadable_gives_reason(tmp_path):
    m = snapshot.memory_info(tmp_path / "nope")
    assert m["total_bytes"] is None and "cannot read" in m["reason"]


def test_nvidia_smi_lines_parsed():
    out = "NVIDIA GB10, [N/A], [N/A]\nNVIDIA H200, 1024 MiB, 143771 MiB\n"
    gpus = snapshot.parse_nvidia_smi(out)
    assert gpus == [
        {"name": "NVIDIA GB10", "memory_used": "[N/A]", "memory_total": "[N/A]"},
        {"name": "NVIDIA H200", "memory_used": "1024 MiB", "memory_total": "143771 MiB"},
    ]


def test_patch_manifest_absent_and_present(tmp_path):
    absent = snapshot.patch_manifest(tmp_path)
    assert absent["manifest"] is None and "no patch manifest" in absent["reason"]
    (tmp_path / snapshot.PATCH_MANIFEST_NAME).write_text(json.dumps({"patches": [{"name": "04", "applied": True}]}))
    present = snapshot.patch_manifest(tmp_path)
    assert present["manifest"] == {"patches": [{"name": "04", "applied": True}]}
    # tmp_path is no vLLM venv: the state is not checked, with the reason
    assert present["state"] is None and present["state_detail"].startswith("not checked")


def test_patch_state_of_the_running_venv_is_recorded():
    import sys

    s = snapshot.patch_manifest(snapshot.Path(sys.prefix))
    assert s["state"] in ("patched", "unpatched", "tampered", "stale", None)
    assert s["state_detail"]


def test_admin_api_not_answering_records_null_with_reason():
    # port 9 (discard) has no listener here: connection refused
    p = snapshot.active_profile("http://127.0.0.1:9")
    assert p["active"] is None and "did not answer" in p["reason"]


def test_snapshot_is_json_and_never_claims_a_spark_without_gb10(monkeypatch):
    monkeypatch.setattr(snapshot, "gpu_info", lambda: {"gpus": [{"name": "NVIDIA H200", "memory_used": "1", "memory_total": "2"}]})
    s = snapshot.host_snapshot(admin_url="http://127.0.0.1:9")
    json.dumps(s)
    assert s["is_dgx_spark"] is False
    assert s["packages"]["httpx"] is not None
    monkeypatch.setattr(snapshot, "gpu_info", lambda: {"gpus": [{"name": "NVIDIA GB10", "memory_used": "[N/A]", "memory_total": "[N/A]"}]})
    assert snapshot.host_snapshot(admin_url="http://127.0.0.1:9")["is_dgx_spark"] is True
