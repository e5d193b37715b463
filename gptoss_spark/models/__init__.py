"""Checkpoints: which ones the profiles serve, fetching them from the Hugging Face Hub, checking them.

catalog.py names them; pull.py fetches one into place (staged, hash-checked, renamed in whole);
manifest.py records what was fetched and re-checks it offline; cli.py is `gptoss-spark model`.
"""
