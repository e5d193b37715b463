"""gptoss-spark: gpt-oss on a DGX Spark as a supervised systemd host service."""

__version__ = "0.1.0"
