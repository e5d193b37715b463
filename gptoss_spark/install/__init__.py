"""The installer's logic, run by install.sh as `python3 -m gptoss_spark.install STEP`
(system interpreter, before any venv exists: stdlib only) and available as
`gptoss-spark install STEP` once installed."""

from .cli import register

__all__ = ["register"]
