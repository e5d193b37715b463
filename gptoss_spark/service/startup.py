"""Where an engine start's time goes, and whether it compiled anything: read from the engine's own output.

The supervisor feeds every line the engine prints (engine.py passes them to the journal anyway) and
the two milestones only it sees (/health answered, the canary passed). A phase runs from one
milestone to the next that occurred, so the phases of a start add up to its time from spawn to
ready. The markers are vLLM 0.32.0's own log lines (file named beside each); a start whose lines
lack one simply has no such phase (an --enforce-eager start has no compile, a CPU one no graphs).

Compiles are recognised in two ways:
- log lines that say a compile happened (Inductor's "Compiling a graph ...", FlashInfer's "Building
  JIT module", our CuTe-DSL cache's "compiled", vLLM's jit_monitor warnings after warm-up, the
  ll_bf16 warmup) or that a cache served it (counted as hits);
- new entries in the kernel caches (CacheCensus): Triton's cache logs nothing when it compiles
  during start-up, but every kernel it compiles is a new directory under TRITON_CACHE_DIR.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

# Phases in the order vLLM goes through them; each ends at its milestone.
#   process  spawn -> the worker starts loading the model (imports, config, engine core, workers)
#   weights  -> the weights are on the GPU
#   compile  -> torch.compile done (compiled, or loaded from the compile cache)
#   warmup   -> CUDA-graph capture begins (KV cache, kernel warm-up, FlashInfer autotune)
#   graphs   -> capture done (its length is the one vLLM logs)
#   engine   -> vLLM's engine core reports its start-up over
#   api      -> the OpenAI server listens
#   health   -> the supervisor's first /health 200
#   canary   -> the supervisor's one-token completion passed: ready
PHASES = ("process", "weights", "compile", "warmup", "graphs", "engine", "api", "health", "canary")

# (milestone this line sets, pattern). Only the first match of each counts.
MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # v1/worker/gpu_model_runner.py, cpu_model_runner.py
    ("process", re.compile(r"Starting to load model ")),
    # model_loader/default_loader.py "Loading weights took"; gpu_model_runner.py "Model loading took"
    ("weights", re.compile(r"Loading weights took|Model loading took")),
    # compilation/monitor.py: total torch.compile time, whether compiled or loaded from the cache; where
    # torch's AOT compile runs the model (the CPU runner logs no total), the profiling run that follows
    # it; the CPU runner without AOT logs only its own compile warm-up's end (cpu_model_runner.py)
    ("compile", re.compile(r"torch\.compile takes [\d.]+ s in total|Initial profiling/warmup run took"
                           r"|Warming up done\.")),
    # v1/worker/gpu_model_runner.py, gpu/model_runner.py; "in N secs" is the capture's own length
    ("graphs", re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs")),
    # v1/engine/core.py
    ("engine", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    # uvicorn, once the API server listens
    ("api", re.compile(r"Application startup complete")),
)

# A compile happened: (what, pattern with an optional "seconds" group).
COMPILE_LINES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("inductor", re.compile(r"Compiling a graph for compile range (?P<what>.+?) takes (?P<s>[\d.]+) s")),
    # compilation/decorators.py: torch's AOT compile of the whole model stored (a compile happened;
    # a warm start logs "Directly load AOT compilation" instead).
    ("aot-compile", re.compile(r"(?:\[(?P<what>[\w.-]+)\] )?saved AOT compiled function to")),
    ("flashinfer-jit", re.compile(r"Building JIT module (?P<what>\S+?);")),
    ("cute-dsl", re.compile(r"gptoss-spark cute-dsl compiled: (?P<what>\S+) \S+ in (?P<s>[\d.]+) s")),
    ("ll_bf16", re.compile(r"Warming up ll_bf16 router GEMM kernels for shapes: (?P<what>.+?)\.?$")),
    # vLLM's jit_monitor (utils/jit_monitor.py), active after warm-up: any compile at serving time.
    ("jit-after-warmup", re.compile(r"(?P<what>(?:Triton|CuTeDSL|TileLang)\b.*?(?:JIT compilation|compilation)"
                                    r" during inference: \S+)")),
    ("triton-autotune", re.compile(r"Triton autotuning for function (?P<what>\S+) finished after (?P<s>[\d.]+)s")),
)
# vLLM's platform line (platforms/__init__.py): a CPU engine captures no CUDA graphs.
PLATFORM_LINE = re.compile(r"Automatically detected platform (?P<platform>\w+)")
# Phases a start cannot have: --enforce-eager runs the model eagerly (no torch.compile, no CUDA graphs);
# a CPU engine has no graphs. Their markers' lines, if any (the CPU runner's "Warming up done." under
# --enforce-eager), are then no milestone: a start that compiled nothing shows no compile phase.
EAGER_ABSENT = frozenset({"compile", "warmup", "graphs"})
CPU_ABSENT = frozenset({"warmup", "graphs"})


def absent_phases(argv: list[str] | tuple[str, ...]) -> frozenset[str]:
    """The phases an engine started with this argv will not go through."""
    return EAGER_ABSENT if "--enforce-eager" in argv else frozenset()


CACHE_HIT_LINES = (
    re.compile(r"Directly load the compiled graph\(s\) for compile range"),
    re.compile(r"Directly load AOT compilation from path"),
    re.compile(r"gptoss-spark cute-dsl cache hit:"),
)


@dataclass(frozen=True)
class CompileEvent:
    kind: str
    what: str
    seconds: float | None = None

    def describe(self) -> str:
        took = f" ({self.seconds:.1f} s)" if self.seconds is not None else ""
        return f"{self.kind} {self.what}{took}"


class CacheCensus:
    """Entries of the kernel caches, to tell what a start added (Triton logs nothing when it compiles).

    Counts Triton's kernel directories (<cache>/<hash>/), the files under vLLM's cache root but its
    model-info cache (modelinfos/, written at a model's first load: no kernel) and vLLM's own Inductor
    scratch, FlashInfer's built .so files and our exported .o files. Cheap: a few hundred entries."""

    def __init__(self, dirs: dict[str, Path]):
        self.dirs = dirs

    def snapshot(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for name, d in self.dirs.items():
            entries: set[str] = set()
            try:
                if name == "triton":
                    entries = {p.name for p in d.iterdir() if p.is_dir()}
                elif name == "flashinfer":
                    entries = {str(p.relative_to(d)) for p in d.rglob("*.so")}
                elif name == "cute-dsl":
                    entries = {p.name for p in d.glob("*.o")}
                else:  # vLLM's: compile artifacts, autotune results; not its model-info cache
                    entries = {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()
                               and "inductor_cache" not in p.parts and "modelinfos" not in p.parts}
            except OSError:
                pass
            out[name] = entries
        return out

    @staticmethod
    def added(before: dict[str, set[str]], after: dict[str, set[str]]) -> dict[str, int]:
        return {k: len(after.get(k, set()) - before.get(k, set())) for k in after
                if after.get(k, set()) - before.get(k, set())}


@dataclass
class StartupRecord:
    """One engine start: milestones (seconds after spawn), compiles, cache hits."""

    profile: str
    spawned_at: float = field(default_factory=time.monotonic)
    spawned_wall: float = field(default_factory=time.time)
    milestones: dict[str, float] = field(default_factory=dict)
    compiles: list[CompileEvent] = field(default_factory=list)
    cache_hits: int = 0
    cache_added: dict[str, int] = field(default_factory=dict)
    ready_seconds: float | None = None
    absent: frozenset[str] = frozenset()  # phases this start does not have (absent_phases)

    def feed(self, line: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if (p := PLATFORM_LINE.search(line)) and p.group("platform") == "cpu":
            self.absent |= CPU_ABSENT
        for phase, pat in MARKERS:
            if phase not in self.milestones and phase not in self.absent and (m := pat.search(line)):
                self.milestones[phase] = now - self.spawned_at
                if phase == "graphs":  # capture began its own length before this line
                    self.milestones["warmup"] = max(0.0, self.milestones[phase] - float(m.group("s")))
        for kind, pat in COMPILE_LINES:
            m = pat.search(line)
            if m:
                s = m.groupdict().get("s")
                self.compiles.append(CompileEvent(kind, (m.group("what") or "model").strip(), float(s) if s else None))
                break
        if any(p.search(line) for p in CACHE_HIT_LINES):
            self.cache_hits += 1

    def mark(self, phase: str, now: float | None = None) -> None:
        """A milestone only the supervisor sees: 'health' (first /health 200), 'canary' (it passed)."""
        now = time.monotonic() if now is None else now
        self.milestones.setdefault(phase, now - self.spawned_at)
        if phase == "canary":
            self.ready_seconds = self.milestones[phase]

    def current_phase(self, now: float | None = None) -> str:
        """The phase a start is in now: the one after the last milestone seen."""
        seen = [p for p in PHASES if p in self.milestones]
        after = PHASES.index(seen[-1]) + 1 if seen else 0
        ahead = [p for p in PHASES[after:] if p not in self.absent]
        return ahead[0] if ahead else "ready"

    def phase_began(self) -> float:
        """Seconds after spawn at which the current phase began (its predecessor's milestone)."""
        return max(self.milestones.values(), default=0.0)

    def phases(self) -> dict[str, float]:
        """Seconds per phase that occurred, in order; they add up to the last milestone's time."""
        out: dict[str, float] = {}
        prev = 0.0
        for p in PHASES:
            if p in self.milestones:
                t = max(self.milestones[p], prev)
                out[p] = round(t - prev, 3)
                prev = t
        return out

    def compiled_anything(self) -> list[str]:
        """What this start compiled: log events, then cache entries it added that no event explains."""
        what = [c.describe() for c in self.compiles]
        what += [f"{n} new {name} cache entr{'y' if n == 1 else 'ies'}" for name, n in self.cache_added.items()]
        return what

    def progress_line(self, now: float | None = None) -> str:
        """Where the start is now: `weights for 12 s, 40 s since spawn` (both as of now)."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.spawned_at
        return f"{self.current_phase(now)} for {max(0.0, elapsed - self.phase_began()):.0f} s, {elapsed:.0f} s since spawn"

    def to_json(self) -> dict:
        return {
            "profile": self.profile,
            "started": self.spawned_wall,
            "ready_seconds": self.ready_seconds,
            "phases": self.phases(),
            "compiled": self.compiled_anything(),
            "cache_hits": self.cache_hits,
        }


# Histogram bounds for phase and start times (seconds): a CPU demo start is ~20-60 s, a Spark's
# cold load minutes; the top buckets catch a first start that compiles.
BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)


@dataclass
class PhaseHistogram:
    """Cumulative counts per bucket (Prometheus histogram semantics) of one phase, since the supervisor started."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
        self.counts[-1] += 1  # +Inf
        self.total += seconds
        self.n += 1


class StartupHistory:
    """The starts of this supervisor: the last ones whole, and every ready start's phases in histograms."""

    def __init__(self, keep: int = 20):
        self.keep = keep
        self.records: list[StartupRecord] = []
        self.histograms: dict[str, PhaseHistogram] = {}

    def finish(self, record: StartupRecord) -> None:
        self.records = (self.records + [record])[-self.keep:]
        if record.ready_seconds is None:
            return
        for phase, seconds in record.phases().items():
            self.histograms.setdefault(phase, PhaseHistogram()).observe(seconds)
        self.histograms.setdefault("total", PhaseHistogram()).observe(record.ready_seconds)

    @property
    def last(self) -> StartupRecord | None:
        return self.records[-1] if self.records else None

    def histograms_view(self) -> dict[str, tuple[tuple[float, ...], tuple[int, ...], float, int]]:
        """A copy for a status snapshot: phase -> (bounds, cumulative counts incl. +Inf, sum, count)."""
        return {p: (BUCKETS, tuple(h.counts), round(h.total, 3), h.n) for p, h in self.histograms.items()}
