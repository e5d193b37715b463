"""Every exit code that gptoss-spark's commands and install.sh end with, in one table.

A code means one thing whichever command returns it, so install.sh, systemd
(`RestartPreventExitStatus=` in the unit) and a user's shell can branch on it.
docs/EXIT_CODES.md is this table for readers; tests/unit/test_exit_codes.py keeps
the two, install.sh's literal codes and the unit in step.

Stdlib only, no imports: install.sh loads it with the system interpreter before
any venv exists.
"""

# ---- any command
EXIT_OK = 0
EXIT_FAILED = 1            # it ran and the answer is no: an operation failed, a check found problems, invalid requests
EXIT_USAGE = 2             # a bad option, settings or profile file (argparse's own code): nothing was done
EXIT_REQUIREMENT = 3       # this host cannot run it: no checkpoint, no Eagle3 head; a retry will not help
EXIT_GAVE_UP = 4           # serve: the engine never became ready (crashed max_crashes times, or in a way retries cannot fix)

# ---- install.sh (gptoss_spark.install), 10-32
EXIT_NOT_ROOT = 10
EXIT_NO_SYSTEMD = 11
EXIT_WRONG_ARCH = 12
EXIT_NO_GPU = 13
EXIT_WRONG_GPU = 14
EXIT_PYTHON = 15           # no Python >= 3.11 for the venv
EXIT_DISK = 16             # not enough free disk for the new version
EXIT_BUSY = 17             # another install.sh holds the lock
EXIT_DRIVER = 18           # NVIDIA driver older than the CUDA 13 torch needs
EXIT_TOOLKIT = 19          # a toolchain is missing: CUDA 13 (nvcc, headers, libraries), g++; kernels build: its packages, a GPU
EXIT_VENV = 20             # building the new environment (venv, pip) failed
EXIT_PATCHES = 21          # the vLLM patches did not apply or verify
EXIT_KERNELS = 22          # the ahead-of-time Triton kernel build failed
EXIT_ASSETS = 23           # the tiktoken file or the demo model could not be prepared
EXIT_START = 24            # the new version did not become ready; switched back, the previous one serves again
EXIT_NO_PREVIOUS = 25      # --rollback with no previous version that served
EXIT_FLASHINFER = 27       # FlashInfer's JIT modules did not build or link
EXIT_LAN = 28              # engine.host/admin.host/--address is not an address of this machine
EXIT_ARGS = 29             # the new version's vLLM rejects an installed profile's engine arguments (nothing changed)
EXIT_NOT_SERVING = 30      # the service does not serve: nothing to switch back to, or that did not start either
EXIT_PEER = 31             # the cluster's other node is not paired with this install (answers, role, venv, token)
EXIT_WARMUP = 32           # the warm-up: a profile's engine did not get ready or answer (nothing switched)

# ---- gptoss-spark patches, 40-46 (install.sh turns any of them into EXIT_PATCHES)
EXIT_PATCH_INPUT = 40      # the venv, its vLLM or the patch directory is missing or wrong
EXIT_PATCH_VERSION = 41    # the venv holds another vLLM than the patches were made for
EXIT_PATCH_DRIFT = 42      # a target file is neither the pinned original nor our result: nothing written
EXIT_PATCH_SET = 43        # the patch set itself is broken
EXIT_PATCH_APPLY = 44      # writing failed part-way; every file written was restored
EXIT_PATCH_NOT_APPLIED = 45  # verify: vLLM is the pristine release
EXIT_PATCH_TAMPERED = 46   # verify: a patched file changed afterwards, or the manifest does not match

# ---- gptoss-spark model, 50-52
EXIT_MODEL_FETCH = 50      # pull: the hub did not answer, refused, or lists no such repository/revision; nothing put in place
EXIT_MODEL_CORRUPT = 51    # pull: a file differs from the hub's hash (deleted); verify: a file differs from the manifest
EXIT_MODEL_SPACE = 52      # pull: not enough free disk for what is still to fetch; nothing was fetched

# ---- talking to the running service (sysexits.h's numbers)
EXIT_UNAVAILABLE = 69      # the service or the endpoint does not answer
EXIT_NOPERM = 77           # the admin token file is unreadable, or the token was refused

# ---- interrupted by a signal: 128 + its number, as shells report it (install.sh's trap exits so)
EXIT_HANGUP = 129          # SIGHUP: install.sh's terminal went away (an ssh session closed)
EXIT_INTERRUPTED = 130     # SIGINT: Ctrl-C
EXIT_BROKEN_PIPE = 141     # SIGPIPE: the reader of a command's output went away (`| head`)
EXIT_TERMINATED = 143      # SIGTERM: install.sh was told to stop (kill, a shutdown)


def table() -> dict[int, str]:
    """code -> constant name, for the docs test and for anyone listing them."""
    return {v: k for k, v in globals().items() if k.startswith("EXIT_") and isinstance(v, int)}
