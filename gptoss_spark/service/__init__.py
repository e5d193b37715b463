"""The service at run time: what `gptoss-spark serve` is made of.

  config, profiles   settings and engine profiles (pydantic, one-line errors)
  engine, probes     the vLLM process and its health checks
  memory, states     the memory guard; the state machine and its policies
  store              state persisted across restarts (active profile, counters)
  supervisor         ties them together; systemd (notify, watchdog)
  argcheck, fit      can a profile's argv and memory run here, before it is started
  exit_reason, logs, journal, alerts, api_access   what an exit means, logging, alerts, the API key
  flashinfer_cache   where FlashInfer's prebuilt modules live; the engine's FlashInfer environment

service/ imports only gptoss_spark.base below it (tests/unit/test_layers.py).
"""
