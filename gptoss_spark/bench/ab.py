"""`gptoss-spark bench ab PROFILE PROFILE [PROFILE...]`: one benchmark on each profile of the running service.

For each profile: switch the service to it through the admin API (as
`gptoss-spark profile NAME` does), then measure a single stream (as `bench`)
and N users (as `loadtest`) with the same code and settings. At the end, and
also after a failed switch or run and on Ctrl-C, switch back to the profile
that was active at the start. The profile active at the start is measured
first when it is listed (one engine start fewer).

The first profile named is the baseline, and it is measured twice: once in
its turn and once more after the others (A B A; no extra switch when it is the
active profile, which is restored last anyway). The two baseline runs give the
run-to-run spread, each single-stream run's requests give that side's
request-to-request spread, and a difference inside the larger of those (or of
NOISE) never wins: the recommendation follows RULE.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone

from ..admin.client import POLL_SECONDS, ApiError, Client, operation_of, state_of, wait_operation
from ..base.errors import UserError
from ..service.profiles import unknown_profiles
from ..service.states import State
from ..service.status import OpStatus
from .compare import METRICS, compare, dig
from .load import RESULT_KIND_LOADTEST
from .single import RESULT_KIND_BENCH, RESULT_SCHEMA

RESULT_KIND_AB = "gptoss-spark.bench-ab"
# The least difference that can win, even when the measured spread is smaller: two runs that happen to agree
# closely say little about a third.
NOISE = 0.03
SINGLE_METRIC = ("summary", "decode_tok_s", "median")
LOAD_METRIC = ("summary", "aggregate_tok_s")
RULE = (f"baseline = the first profile, measured twice (before and after the others); headline numbers: "
        f"single-stream decode tok/s (median) and N-user aggregate tok/s, the baseline's being the mean of its two "
        f"runs; the noise of each is the largest of {NOISE:.0%}, the baseline's run-to-run spread (|run 1 - run 2| / "
        f"their mean) and, single-stream, each side's request-to-request spread ((max - min) / median of its "
        f"requests); a profile wins when one number is higher by more than its noise and the other not lower by "
        f"more than its noise, all its requests valid (of several winners, the largest product of the two ratios); "
        f"anything closer is no difference beyond the noise")
# States the service stays in until told otherwise: a switch can be asked for.
SETTLED_STATES = frozenset({State.READY, State.FAILED, State.STOPPED})

Say = Callable[[str], None]


def check_profile_names(names: list[str], known: list[str] | None = None) -> None:
    """Two or more distinct names, all known to the service (when `known` is given)."""
    if len(names) < 2:
        raise UserError(f"bench ab compares two profiles or more, got {len(names)}; "
                        f"name them, e.g. `gptoss-spark bench ab plain fast`")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(f"profile(s) {', '.join(repeated)} named twice; name each profile once")
    unknown = [n for n in names if known is not None and n not in known]
    if unknown:
        raise UserError(f"{unknown_profiles(unknown, known)}; pick from those (`gptoss-spark profile` lists them) or add the file to a profile directory")


def measuring_order(names: list[str], original: str) -> list[str]:
    """The active profile first, if listed: it needs no switch."""
    return ([original] if original in names else []) + [n for n in names if n != original]


# ---- the service ------------------------------------------------------------------------------

class Service:
    """The admin API, as a switcher: settle, switch, report. Every failure is a UserError."""

    def __init__(self, client: Client, limit: float, say: Say):
        self.client, self.limit, self.say = client, limit, say

    def profiles(self) -> dict:
        return self.client.json("GET", "/admin/profile")[1]

    def settle(self) -> dict:
        """Wait until no operation runs and the state is final (a rollback may be restarting an engine)."""
        deadline = time.monotonic() + self.limit
        while True:
            body = self.profiles()
            state = state_of(body)
            op = body.get("operation")
            if not (op and operation_of(op).status.in_progress) and state in SETTLED_STATES:
                return body
            if time.monotonic() > deadline:
                raise ApiError(f"the service did not settle within {self.limit:g} s (state {state.value}); "
                               "check `gptoss-spark status`")
            time.sleep(POLL_SECONDS)

    def switch(self, name: str) -> dict:
        """Switch to name and wait until it serves. Returns {ok, seconds, error, rolled_back_to, operation}."""
        started = time.monotonic()
        outcome: dict = {"ok": False, "noop": False, "seconds": None, "error": None, "rolled_back_to": None,
                         "operation": None}
        try:
            self.settle()
            status, body = self.client.json("PUT", "/admin/profile", ok=(200, 202), json={"name": name})
            if status == 200:
                outcome.update(ok=True, noop=True)
            else:
                self.say(f"switching {body.get('from') or '-'} -> {name} (operation {body['id']})")
                op = wait_operation(self.client, body, self.limit)
                view = operation_of(op)
                outcome.update(ok=view.status == OpStatus.SUCCEEDED, error=view.error,
                               rolled_back_to=view.rolled_back_to, operation=op)
        except UserError as e:
            outcome["error"] = str(e)
        outcome["seconds"] = time.monotonic() - started
        return outcome


# ---- the comparison ---------------------------------------------------------------------------

def _empty_run() -> dict:
    return {"switch": None, "single": None, "load": None, "error": None}


def run_ab(names: list[str], original: str, switch: Callable[[str], dict], measure: Callable[[str, dict], None],
           say: Say, remeasure: Callable[[str, dict], None] | None = None) -> dict:
    """Measure each profile, then the baseline once more; always switch back to `original`.
    Returns the runs (the baseline's second run under runs[baseline]["repeat"]), the restore and interruption.

    measure(name, run) fills run["single"], run["load"] (and run["error"]) as each part ends, so a
    failure in the second part keeps the first. remeasure (default: measure) measures the baseline's repeat:
    the headline numbers only, so a caller can leave out what the spread does not need (a sweep).
    """
    runs: dict[str, dict] = {n: _empty_run() for n in names}
    interrupted = False

    def measure_into(name: str, run: dict, how: Callable[[str, dict], None]) -> None:
        run["switch"] = switch(name)
        if not run["switch"]["ok"]:
            say(f"{name}: switch FAILED: {run['switch']['error']}")
            return
        try:
            how(name, run)
        except UserError as e:
            run["error"] = str(e)
            say(f"{name}: run FAILED: {e}")

    try:
        for name in measuring_order(names, original):
            measure_into(name, runs[name], measure)
        base = names[0]
        if _measured(runs[base]):
            say(f"{base}: measured again for the run-to-run spread")
            runs[base]["repeat"] = _empty_run()
            measure_into(base, runs[base]["repeat"], remeasure or measure)
    except KeyboardInterrupt:
        interrupted = True
        say(f"interrupted: switching back to {original} (Ctrl-C again leaves the service where it is)")
    finally:
        try:
            restored = switch(original)
        except KeyboardInterrupt:
            print(f"gptoss-spark: not switched back to {original}; run `sudo gptoss-spark profile {original}`",
                  file=sys.stderr)
            raise
    return {"runs": runs, "restored": {"profile": original, **restored}, "interrupted": interrupted}


def served_profile_problem(name: str, results: dict) -> str | None:
    """A run is only this profile's if the admin API named it while the run's host snapshot was taken."""
    for kind in ("single", "load"):
        served = ((results[kind] or {}).get("host") or {}).get("active_profile", {}).get("active")
        if served != name:
            return f"the service served {served or 'an unknown profile'} during the {kind} run, not {name}"
    return None


def _measured(run: dict) -> bool:
    return run["single"] is not None and run["load"] is not None and run["error"] is None


def _all_valid(run: dict) -> bool:
    return all(run[k]["summary"]["invalid_requests"] == 0 for k in ("single", "load"))


def _number(run: dict | None, kind: str, path: tuple[str, ...]) -> float | None:
    v = dig(run[kind], path) if run and run.get(kind) else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def spread(a: float | None, b: float | None) -> float | None:
    """|a - b| over their mean: how far two runs of the same thing differ."""
    if a is None or b is None or a + b <= 0:
        return None
    return abs(a - b) / ((a + b) / 2)


def request_spread(single: dict | None) -> float | None:
    """(max - min) / median of one single-stream run's per-request decode rates (None with fewer than 2)."""
    d = dig(single or {}, ("summary", "decode_tok_s")) or {}
    if (d.get("n") or 0) < 2 or not d.get("median") or d.get("max") is None or d.get("min") is None:
        return None
    return (d["max"] - d["min"]) / d["median"]


def baseline_noise(base_run: dict) -> dict:
    """The baseline's two runs: each headline number's mean, their run-to-run spread and the noise it sets."""
    repeat = base_run.get("repeat")
    out = {}
    for kind, path in (("single", SINGLE_METRIC), ("load", LOAD_METRIC)):
        first, second = _number(base_run, kind, path), _number(repeat, kind, path)
        runs_spread = spread(first, second)
        within = [x for x in (request_spread(base_run.get(kind)), request_spread((repeat or {}).get(kind)))
                  if kind == "single" and x is not None]
        out[kind] = {"runs": [first, second], "mean": None if runs_spread is None else (first + second) / 2,
                     "run_to_run_spread": runs_spread, "request_spread": max(within, default=None),
                     "noise": None if runs_spread is None else max(NOISE, runs_spread, *within)}
    return out


def ratios(base: dict, other: dict) -> tuple[float | None, float | None]:
    def ratio(path):
        a, b = dig(base, path), dig(other, path)
        return b / a if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None
    return ratio(("single", *SINGLE_METRIC)), ratio(("load", *LOAD_METRIC))


def recommend(names: list[str], runs: dict[str, dict], original: str, users: int) -> dict:
    """RULE applied to the runs: {profile, switch, text, noise}; profile None when there is no baseline to go by."""
    base = names[0]
    if not _measured(runs[base]) or not _all_valid(runs[base]):
        why = "was not measured" if not _measured(runs[base]) else "had invalid requests"
        return {"profile": None, "switch": False, "noise": None,
                "text": f"no recommendation: the baseline {base} {why}; fix that and run again"}
    repeat = runs[base].get("repeat")
    if not repeat or not _measured(repeat) or not _all_valid(repeat):
        why = "its second run was not measured" if not repeat or not _measured(repeat) else \
            "its second run had invalid requests"
        return {"profile": None, "switch": False, "noise": None,
                "text": f"no recommendation: the baseline {base} was measured once ({why}), so the run-to-run "
                        f"spread is unknown; run again"}
    noise = baseline_noise(runs[base])
    winners, reasons = [], []
    for name in names[1:]:
        run = runs[name]
        if not _measured(run):
            reasons.append(f"{name} was not measured")
            continue
        if not _all_valid(run):
            reasons.append(f"{name} had invalid requests")
            continue
        a_single, a_load = _number(run, "single", SINGLE_METRIC), _number(run, "load", LOAD_METRIC)
        if a_single is None or a_load is None or not noise["single"]["mean"] or not noise["load"]["mean"]:
            reasons.append(f"{name} has no rate to compare")
            continue
        single, load = a_single / noise["single"]["mean"], a_load / noise["load"]["mean"]
        n_single = max(noise["single"]["noise"], request_spread(run["single"]) or 0.0)
        n_load = noise["load"]["noise"]
        said = f"{name} is {single:.2f}x {base} single-stream and {load:.2f}x at {users} users"
        if (run["single"].get("speculation") or {}).get("pays") is False:
            said += f" (its speculation emits {run['single']['speculation']['tokens_per_step']:.2f} tokens per step: " \
                    "too few to pay on a Spark)"
        faster = single > 1 + n_single or load > 1 + n_load
        slower = single < 1 - n_single or load < 1 - n_load
        if faster and not slower:
            winners.append((single * load, name, f"{said}, beyond the noise (spread {n_single:.1%} single-stream, "
                                                  f"{n_load:.1%} at {users} users)"))
        elif slower:
            reasons.append(f"{said} (slower beyond the noise: spread {n_single:.1%} single-stream, "
                           f"{n_load:.1%} at {users} users)")
        else:
            reasons.append(f"{said}: no difference beyond the noise (spread {n_single:.1%} single-stream, "
                           f"{n_load:.1%} at {users} users)")
    if winners:
        _, best, said = max(winners)
        return {"profile": best, "switch": best != original, "noise": noise, "text": f"{said}: {_action(best, original)}"}
    lead = f"keep {base}" if base == original else f"use {base}"
    text = f"{lead}: " + "; ".join(reasons)
    if base != original:
        text += f"; {_action(base, original)}"
    return {"profile": base, "switch": base != original, "noise": noise, "text": text}


def _action(name: str, original: str) -> str:
    return "it is the active profile, keep it" if name == original else f"switch with `sudo gptoss-spark profile {name}`"


def comparison_rows(names: list[str], runs: dict[str, dict]) -> list[dict]:
    """Every headline metric of both runs, per profile, and each profile's ratio to the baseline."""
    rows = []
    base = runs[names[0]]
    for kind, result_kind in (("single", RESULT_KIND_BENCH), ("load", RESULT_KIND_LOADTEST)):
        for label, path, higher_better in METRICS[result_kind]:
            values = {n: dig(runs[n][kind], path) if runs[n][kind] else None for n in names}
            ratio = {}
            for n in names[1:]:
                if base[kind] and runs[n][kind]:
                    ratio[n] = next(r["ratio_b_over_a"] for r in compare(base[kind], runs[n][kind])["rows"]
                                    if r["metric"] == label)
                else:
                    ratio[n] = None
            rows.append({"run": kind, "metric": label, "values": values, "ratio_to_baseline": ratio,
                         "higher_is_better": higher_better})
    return rows


def ab_result(names: list[str], original: str, outcome: dict, settings: dict, started: datetime) -> dict:
    runs = outcome["runs"]
    return {
        "kind": RESULT_KIND_AB,
        "schema": RESULT_SCHEMA,
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "profiles": names,
        "baseline": names[0],
        "original_profile": original,
        "measuring_order": measuring_order(names, original),
        "settings": settings,
        "rule": {"text": RULE, "noise": NOISE, "single_metric": ".".join(SINGLE_METRIC),
                 "load_metric": ".".join(LOAD_METRIC)},
        "comparison": comparison_rows(names, runs),
        "recommendation": recommend(names, runs, original, settings["users"]),
        "runs": runs,
        "restored": outcome["restored"],
        "interrupted": outcome["interrupted"],
    }
