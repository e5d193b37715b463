"""Benchmark and load test against the served OpenAI-compatible endpoint.

Pure client code: httpx only, never vLLM or torch, so it runs from the
service's venv or from a thin client venv (`bench arena` also needs llama-benchy,
the bench extra).

    prompts   the prompts file (shipped: gptoss_spark/data/prompts.jsonl)
    request   one streamed request -> RequestRecord (timing, usage, validity)
    stats     decode rate, percentiles, summaries
    target    what the server serves (model name, version), reachability
    snapshot  host facts recorded with every result
    single    `bench`: the seed's single-stream protocol
    load      `loadtest`: N concurrent users
    run       one run from the command-line options (shared by bench, loadtest, ab)
    compare   `bench compare A.json B.json`
    ab        `bench ab P1 P2 ...`: switch the service to each profile, run both, switch back
    arena     `bench arena`: the Spark Arena leaderboard's settings, judging llama-benchy's figures
    benchy    runs llama-benchy (the pinned PyPI package) for one point, offline
    benchy_main  llama-benchy's entry point with the API key from the environment
    gate      the correctness gate for `tune`: a shipped prompt set, its recorder, the judge
    render    human tables and the TTY progress line
    seed      the seed project's published Spark figures (the seed's, not ours)
    cli       its commands: register(subparsers)
"""
