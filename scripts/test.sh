#!/usr/bin/env bash
# The test command (README.md; .ci/run calls it): set up .venv, then run the
# whole suite — unit, integration (real vLLM on the CPU) and system (real
# systemd in a private namespace; needs root). Extra args go to pytest.
#
# Given only options (what CI passes), the unit tier runs in a second pytest
# beside the engine tiers: it is pure CPU for ~10 min, while the engine tiers
# mostly wait on one engine at a time (load average 1-2 on a 2-core box), so
# side by side the whole run is about that much shorter. Its output follows the
# engine tiers' output, then one line per tier. Given a path, a test id or a
# -m/-k filter: one pytest, exactly as asked.
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
trap 'rm -rf "$work"' EXIT
# Its own --basetemp: two pytest runs must not number (or clean up) each other's tmp dirs.
.venv/bin/python -m pytest "$@" --basetemp="$work/unit-tmp" tests/unit > "$work/unit.log" 2>&1 &
unit_pid=$!
engine_rc=0
.venv/bin/python -m pytest "$@" tests/gpu tests/integration tests/system 2>&1 | tee "$work/engine.log" \
    || engine_rc=${PIPESTATUS[0]}
unit_rc=0
wait "$unit_pid" || unit_rc=$?
echo "==================== tests/unit (ran beside the engine tiers) ===================="
cat "$work/unit.log"
echo "engine tiers (gpu, integration, system): $(tail -n 1 "$work/engine.log") [exit $engine_rc]"
echo "unit tier: $(tail -n 1 "$work/unit.log") [exit $unit_rc]"
[ "$engine_rc" -eq 0 ] || exit "$engine_rc"
exit "$unit_rc"
