"""The installer's logic, run by install.sh as `python3 -m gptoss_spark.install STEP`
(system interpreter, before any venv exists: stdlib only) and available as
`gptoss-spark install STEP` once installed.

Also install-time, but run inside the new venv (they need what it has): patching (vLLM's
patches, applied and verified), demo_model (the --cpu model; torch, imported lazily) and
tiktoken_file (the tokenizer file the first start must not download)."""
