# One install.sh at a time: an flock(1) on fd 9. Sourced by install.sh (and its tests).
#
#   install_lock PATH      take the lock or return 1 (another installer holds it)
#   install_lock_take PATH install_lock; if what holds it is only what a killed install.sh
#                          left running (its steps inherit fd 9: pip, a build), end those
#                          processes (by PID, said on stderr) and take it; else say who holds it
#   install_lock_remove    delete the lock file, then let the lock go; --uninstall's last step
#
# The file is unlinked while still held, never after: once released, another
# installer may have opened and locked that same file, and deleting it then
# would let a third one lock a new file beside it. Unlinked while held, a
# racing installer either fails its flock (it opened the old file) or gets a
# fresh one after this installer is done.

INSTALL_LOCK_PATH=

install_lock() {
    INSTALL_LOCK_PATH="$1"
    exec 9>"$INSTALL_LOCK_PATH"
    flock -n 9
}

install_lock_remove() {
    [ -n "$INSTALL_LOCK_PATH" ] || return 0
    rm -f -- "$INSTALL_LOCK_PATH"
    exec 9>&-
    INSTALL_LOCK_PATH=
}

# "PID COMMAND" of each process other than this shell that has PATH open: the lock's holders.
install_lock_holders() {
    local path="$1" fd pid
    for fd in /proc/[0-9]*/fd/*; do
        case "$(readlink "$fd" 2>/dev/null)" in "$path"|"$path (deleted)") ;; *) continue ;; esac
        pid="${fd#/proc/}"; pid="${pid%%/*}"
        _install_lock_ours "$pid" && continue
        echo "$pid $(tr '\0\n' '  ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-100)"
    done | sort -un
}

# Is PID this shell or one it forked (the scan's own subshells hold fd 9 too)?
_install_lock_ours() {
    local p="$1" _
    for _ in 1 2 3 4 5; do
        [ "$p" = "$$" ] && return 0
        p="$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f2)"
        [ -n "$p" ] && [ "$p" != 0 ] || return 1
    done
    return 1
}

install_lock_take() {
    install_lock "$1" && return 0
    local holders pids _
    holders="$(install_lock_holders "$1")"
    if grep -q 'install\.sh' <<<"$holders"; then
        echo "held by: $(tr '\n' ';' <<<"$holders" | sed 's/;$//')" >&2
        return 1
    fi
    if [ -n "$holders" ]; then
        pids="$(cut -d' ' -f1 <<<"$holders" | tr '\n' ' ')"
        echo "the install lock $1 is held by processes an interrupted install.sh left running," \
             "ending them: $(tr '\n' ';' <<<"$holders" | sed 's/;$//')" >&2
        # shellcheck disable=SC2086  # one argument per PID
        kill -TERM $pids 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do flock -n 9 && return 0; sleep 0.5; done
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
    fi
    flock -w 5 9
}
