"""Checkpoints: which ones the profiles serve, fetching them from the Hugging Face Hub, checking them.

catalog.py names them; pull.py fetches one into place (staged, hash-checked, renamed in whole);
manifest.py records what was fetched and re-checks it offline; gptoss_spark/model_cli.py is
`gptoss-spark model`. Below the service (profiles.py reads the catalog): base and the stdlib only,
plus huggingface_hub for the pull.
"""
