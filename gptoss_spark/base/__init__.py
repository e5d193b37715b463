"""The ground floor: what every other package of gptoss_spark may import.

  defaults     the default ports, loopback and settings path
  errors       the one-line user errors, and run_command, which every entry point runs commands by
  exit_codes   every exit code in one table
  fsutil       the one atomic file writer, symlink swap and JSON file reader
  net          network-address facts (is_loopback)
  token        the admin token file's one reader

Stdlib only, and nothing else of ours: the installer runs it with the system
interpreter before any venv exists, and every layer above may lean on it without a
cycle. tests/unit/test_layers.py holds both rules.
"""
