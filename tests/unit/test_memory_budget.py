"""The memory budget of two services on one host: the claims of the others + this start + the floor
must fit in MemTotal (gptoss_spark/service/budget.py), before MemAvailable is even asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from gptoss_spark.service.budget import MemoryBudget
from gptoss_spark.service.config import MemorySettings
from gptoss_spark.service.memory import GIB, MemoryGuard, MemoryReading


class Fixed:
    def __init__(self, available_gib: float, total_gib: float = 119.7):
        self.r = MemoryReading(int(available_gib * GIB), int(total_gib * GIB), 0.0)

    def read(self) -> MemoryReading:
        return self.r


def test_a_second_model_that_would_not_fit_is_refused_with_the_numbers(tmp_path):
    big = MemoryBudget(tmp_path, "gptoss")  # this process stands for the 120b's supervisor
    big.claim("plain", 84)
    small = MemoryBudget(tmp_path, "gptoss-20b")
    guard = MemoryGuard(MemorySettings(start_floor_gib=4), Fixed(available_gib=110), small)
    assert guard.start_refusal(24, profile="plain-20b", claim=True) is None  # 84 + 24 + 4 = 112 <= 119.7
    assert json.loads((tmp_path / "gptoss-20b.json").read_text())["memory_gib"] == 24
    # A third that MemAvailable alone would let in (it is still 110 GiB: the others are loading).
    third = MemoryGuard(MemorySettings(start_floor_gib=4), Fixed(available_gib=110), MemoryBudget(tmp_path, "x"))
    assert third.start_refusal(10, profile="demo", claim=True) == (
        "gptoss-20b holds 24 GiB (plain-20b), gptoss holds 84 GiB (plain); 24 + 84 + 10 (demo) + 4 floor = 122 GiB, "
        "more than the host's 119.7 GiB; stop a service or pick a smaller profile")
    assert not (tmp_path / "x.json").exists()  # refused: no claim


def test_the_own_claim_is_replaced_not_added_on_a_switch(tmp_path):
    MemoryBudget(tmp_path, "gptoss").claim("plain", 84)
    mine = MemoryBudget(tmp_path, "gptoss-20b")
    mine.claim("plain-20b", 24)
    guard = MemoryGuard(MemorySettings(start_floor_gib=4), Fixed(available_gib=50), mine)
    # Switching to spec-20b (25 GiB): 84 + 25 + 4 fits; its own 24 is not counted twice.
    assert guard.start_refusal(1, profile="spec-20b", profile_gib=25) is None


def test_a_claim_of_a_process_that_is_gone_counts_for_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ghost = MemoryBudget(tmp_path, "gone", pid=int(done.stdout))
    (tmp_path / "gone.json").write_text(json.dumps({"instance": "gone", "profile": "plain", "memory_gib": 84,
                                                    "pid": ghost.pid, "start_time": "1"}))
    assert MemoryBudget(tmp_path, "me").others() == []
    # The same pid alive but started at another time (reused after a reboot) counts for nothing either.
    (tmp_path / "reused.json").write_text(json.dumps({"instance": "reused", "profile": "plain", "memory_gib": 84,
                                                      "pid": os.getpid(), "start_time": "0"}))
    assert MemoryBudget(tmp_path, "me").others() == []


def test_without_a_budget_the_guard_asks_memavailable_only(tmp_path):
    guard = MemoryGuard(MemorySettings(start_floor_gib=4), Fixed(available_gib=20))
    assert guard.start_refusal(24, profile="plain-20b", claim=True).startswith("only 20.0 GiB available")
    assert list(tmp_path.iterdir()) == []


def test_release_removes_only_this_process_s_claim(tmp_path):
    mine = MemoryBudget(tmp_path, "gptoss-20b")
    mine.claim("plain-20b", 24)
    assert mine.release() is True and not mine.own_file.exists()
    assert mine.release() is False  # nothing left to release
    # The same file name written by another live process (two services with one served_name) stays.
    MemoryBudget(tmp_path, "gptoss-20b", pid=os.getppid()).claim("plain-20b", 24)
    assert mine.release() is False and mine.own_file.exists()


class ReadThenWait(MemoryBudget):
    """A budget whose reading of the others' claims holds until the other claimer has read too, or
    BARRIER_WAIT passes: without the lock both would read before either wrote, and both start."""

    def __init__(self, claims_dir, instance, barrier: threading.Barrier):
        super().__init__(claims_dir, instance)
        self.barrier = barrier

    def others(self):
        seen = super().others()
        try:
            self.barrier.wait(BARRIER_WAIT)
        except threading.BrokenBarrierError:  # the other claimer waits for the lock this one holds
            pass
        return seen


BARRIER_WAIT = 1.0  # how long a claimer inside the lock waits for the other: bounds the test, asserts nothing


def test_two_claimers_started_together_exactly_one_wins(tmp_path):
    """Two supervisors checking at once where only one fits (84 + 30 + 4 > 100 GiB): the check and the
    claim are one step under the claims directory's flock, so the second sees the first's claim.
    Threads, each with its own open file and so its own flock, exclude each other as processes do."""
    barrier = threading.Barrier(2)
    start = threading.Barrier(2)
    results: dict[str, str | None] = {}

    def claimer(name: str, profile: str, gib: float) -> None:
        guard = MemoryGuard(MemorySettings(start_floor_gib=4), Fixed(available_gib=100, total_gib=100),
                            ReadThenWait(tmp_path, name, barrier))
        start.wait()
        results[name] = guard.start_refusal(gib, profile=profile, claim=True)

    threads = [threading.Thread(target=claimer, args=a) for a in (("gptoss-spark", "plain", 84),
                                                                  ("gptoss-spark@20b", "bigger-20b", 30))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, refusal in results.items() if refusal is None]
    assert len(results) == 2 and len(winners) == 1, results
    loser = next(n for n in results if n not in winners)
    assert "more than the host's 100.0 GiB" in results[loser]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [f"{winners[0]}.json"]


def test_a_claim_named_by_a_state_dir_path_gets_a_file_of_its_own(tmp_path):
    """A service that is no unit (a hand run) is named by its state dir: "/" cannot be in a file name,
    so the name is percent-encoded, one file per name, and the refusal shows the path."""
    a, b = MemoryBudget(tmp_path, "/srv/a/state"), MemoryBudget(tmp_path, "/srv/a-state")
    a.claim("plain", 84)
    b.claim("plain-20b", 24)
    assert a.own_file != b.own_file and a.own_file.name == "%2Fsrv%2Fa%2Fstate.json"
    assert {c.instance for c in MemoryBudget(tmp_path, "me").others()} == {"/srv/a/state", "/srv/a-state"}
