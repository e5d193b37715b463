#!/usr/bin/env bash
# The test command (README.md; .ci/run calls it): set up .venv, then run the
# whole suite — unit, integration (real vLLM on the CPU) and system (real
# systemd in a private namespace; needs root). Extra args go to pytest.
#
# Given only options (what CI passes), the three tiers run side by side, each
# in its own pytest: unit (pure CPU, ~10 min), gpu + integration (one engine at
# a time, mostly) and system (its own namespaced systemd, host ports
# 8100/8101, which no integration test uses: they take free ports). The two
# engine tiers each keep a 2-core box at a load of about 1, so side by side
# the run takes about as long as the longer of them instead of their sum.
# gpu + integration prints as it runs; the other two follow it, then one line
# per tier. Given a path, a test id or a -m/-k filter: one pytest, exactly as
# asked.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/dev-setup.sh
for arg in "$@"; do
    case "$arg" in
        -m|-k|-m?*|-k?*|*::*) exec .venv/bin/python -m pytest "$@" ;;
        -*) ;;
        *) [ ! -e "$arg" ] || exec .venv/bin/python -m pytest "$@" ;;  # a path (an option's value is not)
    esac
done

work="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
# Each its own --basetemp: two pytest runs must not number (or clean up) each other's tmp dirs.
.venv/bin/python -m pytest "$@" --basetemp="$work/unit-tmp" tests/unit > "$work/unit.log" 2>&1 &
unit_pid=$!; pids+=("$unit_pid")
.venv/bin/python -m pytest "$@" --basetemp="$work/system-tmp" tests/system > "$work/system.log" 2>&1 &
system_pid=$!; pids+=("$system_pid")
engine_rc=0
.venv/bin/python -m pytest "$@" --basetemp="$work/engine-tmp" tests/gpu tests/integration 2>&1 \
    | tee "$work/engine.log" || engine_rc=${PIPESTATUS[0]}
system_rc=0
wait "$system_pid" || system_rc=$?
unit_rc=0
wait "$unit_pid" || unit_rc=$?
pids=()
echo "==================== tests/system (ran beside the other tiers) ===================="
cat "$work/system.log"
echo "==================== tests/unit (ran beside the other tiers) ===================="
cat "$work/unit.log"
echo "gpu + integration tiers: $(tail -n 1 "$work/engine.log") [exit $engine_rc]"
echo "system tier: $(tail -n 1 "$work/system.log") [exit $system_rc]"
echo "unit tier: $(tail -n 1 "$work/unit.log") [exit $unit_rc]"
for rc in "$engine_rc" "$system_rc" "$unit_rc"; do
    [ "$rc" -eq 0 ] || exit "$rc"
done
