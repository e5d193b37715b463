from __future__ import annotations

import json
import os

import pytest

from gptoss_spark.service.store import PersistedState, StateStore


def test_round_trip_and_defaults(tmp_path):
    store = StateStore(tmp_path / "sub" / "state.json")
    assert store.load() == PersistedState()
    store.save(PersistedState("spec", "plain"))
    assert store.load() == PersistedState("spec", "plain")
    assert json.loads((tmp_path / "sub" / "state.json").read_text())["active_profile"] == "spec"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["state.json"]  # no temp file left


def test_damaged_file_falls_back_to_defaults(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("{not json")
    assert StateStore(path).load() == PersistedState()


def test_failed_write_leaves_old_file_intact(tmp_path, monkeypatch):
    store = StateStore(tmp_path / "state.json")
    store.save(PersistedState("plain", "plain"))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        store.save(PersistedState("spec", "spec"))
    assert store.load() == PersistedState("plain", "plain")
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_current_is_the_last_load_or_save_without_reading_again(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('{"active_profile": "spec", "last_good_profile": "plain"}')
    store = StateStore(path)
    assert store.current() == PersistedState("spec", "plain")   # first call: read from disk
    path.unlink()
    assert store.current() == PersistedState("spec", "plain")   # then no read: the file is gone
    assert store.load() == PersistedState()                     # load still reads
    store.save(PersistedState("fast", "spec"))
    path.write_text('{"active_profile": "edited"}')
    assert store.current() == PersistedState("fast", "spec")    # the last save, not the disk
