# One install.sh at a time: an flock(1) on fd 9. Sourced by install.sh (and its tests).
#
#   install_lock PATH      take the lock or return 1 (another installer holds it)
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
