"""The status page, GET / on the admin port: one server-rendered HTML page, nothing else to fetch.

Everything on it comes from one status snapshot (service/status.py), the same one /admin/status
and /metrics render: state and its history, the profile with a switch control, tokens/s and
running requests over the last hour (the telemetry sampler's ring, drawn as inline SVG), memory,
the GPU, and the last events. No build step, no external asset, no CDN: it works offline.

The switch control sends PUT /admin/profile with the token the user types; the token lives only
in that password field (never in the page, a cookie or storage) and the page reloads itself only
while the field is empty. A per-response nonce lets the page's own script and style run under a
Content-Security-Policy that allows nothing else.
"""

from __future__ import annotations

import html
import secrets
import time
from datetime import datetime, timezone
from typing import Iterable, Mapping

from .. import __version__
from ..service.status import SupervisorStatus
from ..service.gpu import gpu_line
from ..service.telemetry import EnginePoint, TelemetrySnapshot

REFRESH_SECONDS = 15
CHART_W, CHART_H = 600, 120


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**30:.1f} GiB"


def _ago(at: float, now: float) -> str:
    s = max(0, int(now - at))
    return f"{s}s ago" if s < 120 else f"{s // 60}m ago" if s < 7200 else f"{s // 3600}h ago"


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%H:%M:%S UTC")


def chart(points: Iterable[tuple[float, float]], now: float, label: str, unit: str, live: bool = True) -> str:
    """An SVG line over the last hour; x = time (now at the right edge), y from 0 to the maximum.
    live: an engine runs and was sampled; else the last point is a stopped engine's, never shown as now."""
    pts = [(t, v) for t, v in points if now - t <= 3600]
    if not pts:
        return f'<p class="muted">{esc(label)}: no samples yet (the engine is not running)</p>'
    top = max(v for _, v in pts) or 1.0
    coords = " ".join(f"{CHART_W * (1 - (now - t) / 3600):.1f},{CHART_H * (1 - v / top):.1f}" for t, v in pts)
    current = f"now {pts[-1][1]:.1f} {esc(unit)}" if live else "no engine running now"
    return (f'<figure><figcaption>{esc(label)}: {current}, max {top:.1f} over the last hour'
            f'</figcaption><svg viewBox="0 0 {CHART_W} {CHART_H}" preserveAspectRatio="none" role="img" '
            f'aria-label="{esc(label)}"><rect width="{CHART_W}" height="{CHART_H}" class="bg"/>'
            f'<polyline points="{coords}" class="line"/></svg>'
            f'<div class="axis"><span>-60 min</span><span>now</span></div></figure>')


def _rate_points(history: tuple[EnginePoint, ...]) -> list[tuple[float, float]]:
    return [(p.at, p.tokens_per_second) for p in history if p.tokens_per_second is not None]


def _memory_rows(st: SupervisorStatus, tel: TelemetrySnapshot | None) -> list[tuple[str, str]]:
    rows = []
    mem = st.guard.reading
    if mem is not None:
        rows.append(("available", f"{mem.available_gib:.1f} of {mem.total_bytes / 2**30:.1f} GiB"))
        if mem.psi_some_avg10 is not None:
            rows.append(("pressure (PSI some avg10)", f"{mem.psi_some_avg10:g}%"))
    if tel is not None:
        rows.append(("service cgroup", _gib(tel.memory.cgroup_bytes)))
        rows.append(("engine RSS", _gib(tel.memory.engine_rss_bytes)))
    rows.append(("memory guard trips", str(st.guard.trips)))
    return rows


def _gpu_rows(tel: TelemetrySnapshot | None) -> list[tuple[str, str]]:
    if tel is None:
        return [("GPU", "no sample yet")]
    g = tel.gpu
    if g.unavailable is not None or not g.devices:
        return [("GPU", gpu_line(g).removeprefix("gpu: "))]
    rows = []
    for d in g.devices:
        p = f"GPU {d.index}"
        rows.append((p, d.name or "-"))
        rows.append((f"{p} temperature", "-" if d.temperature_c is None else f"{d.temperature_c:g} °C"))
        clock = "-" if d.sm_clock_mhz is None else f"{d.sm_clock_mhz:g} MHz"
        if d.max_sm_clock_mhz:
            clock += f" (max {d.max_sm_clock_mhz:g})"
        rows.append((f"{p} SM clock", clock))
        power = "-" if d.power_watts is None else f"{d.power_watts:.0f} W"
        if d.power_limit_watts:
            power += f" of {d.power_limit_watts:.0f} W"
        rows.append((f"{p} power", power))
        slow = sorted((d.throttle or frozenset()) - {"idle"})
        rows.append((f"{p} throttle", ", ".join(slow) or "none"))
    for kind, i in tel.episodes:
        sent = "alerted" if kind in tel.alert_kinds else "not alerted: not in gpu.alerts"
        rows.append(("episode", f"{kind} on GPU {i} ({sent})"))
    return rows


def _table(rows: list[tuple[str, str]], cls: str = "kv") -> str:
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="{cls}">{body}</table>'


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;max-width:1300px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 .2em} h2{font-size:15px;margin:1.2em 0 .4em;border-bottom:1px solid #ddd}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:0 2em}
.grid>section{min-width:0} td{overflow-wrap:anywhere} th{white-space:nowrap}
select{max-width:100%;min-width:0;flex:1 1 12em}
.state{display:inline-block;padding:.1em .6em;border-radius:4px;font-weight:600;color:#fff;background:#888}
.state.ready{background:#2a7d2a}.state.failed{background:#b22}.state.loading,.state.starting{background:#c80}
table{border-collapse:collapse} th,td{text-align:left;padding:.15em .8em .15em 0;vertical-align:top}
th{font-weight:500;color:#555} .events td{font-size:13px} .muted{color:#777}
svg{width:100%;height:120px;display:block}
svg .bg{fill:#fff;stroke:#ccc;vector-effect:non-scaling-stroke}
svg .line{fill:none;stroke:#1f5fbf;stroke-width:1.5;vector-effect:non-scaling-stroke}
.axis{display:flex;justify-content:space-between;font-size:11px;color:#777}
figure{margin:.3em 0 1em} figcaption{font-size:13px}
form{display:flex;gap:.5em;align-items:center;flex-wrap:wrap} #result{margin-top:.4em;font-weight:500}
#result.err{color:#b22} #result.ok{color:#2a7d2a}
"""

SCRIPT = """
const form = document.getElementById('switch');
const token = document.getElementById('token');
const result = document.getElementById('result');
function say(text, ok) { result.textContent = text; result.className = ok ? 'ok' : 'err'; }
form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const name = document.getElementById('profile').value;
  say('switching to ' + name + ' ...', true);
  let r, body = {};
  try {
    r = await fetch('/admin/profile', {method: 'PUT', cache: 'no-store',
      headers: {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + token.value},
      body: JSON.stringify({name: name})});
    body = await r.json();
  } catch (e) { say('no answer from the service: ' + e, false); return; }
  if (r.status === 202) say('accepted: switching to ' + name + ' (operation ' + body.id + '); this page follows it', true);
  else if (r.status === 200) say(body.message || 'done', true);
  else say('refused (HTTP ' + r.status + '): ' + (body.message || body.error), false);
  if (r.ok) { token.value = ''; setTimeout(() => location.reload(), 2000); }
});
// Reload for fresh figures, but never while a token is typed (reloading would drop it).
setInterval(() => { if (!token.value && document.activeElement !== token) location.reload(); }, REFRESH_MS);
"""


def _phases(phases: Mapping[str, float]) -> str:
    return ", ".join(f"{p} {v:.1f} s" for p, v in phases.items())


def _start_rows(st: SupervisorStatus) -> list[tuple[str, str]]:
    """The start under way (its phase, how long since spawn, the phases done) and the last one whole."""
    rows = []
    start = st.start
    if start is not None and start.current:
        cur = start.current
        done = _phases(cur.get("phases") or {})
        rows.append(("start now", f"{cur['phase']}, {cur['seconds']:.0f} s since spawn"
                                  + (f" (done: {done})" if done else "")))
    if start is not None and start.last:
        last = start.last
        took = f"ready in {last['ready_seconds']:.1f} s" if last.get("ready_seconds") is not None else "not ready"
        compiled = "; ".join(last.get("compiled") or []) or "nothing"
        rows.append(("last start", f"{last['profile']}: {took}; {_phases(last.get('phases') or {}) or '-'}; "
                                   f"compiled {compiled}"))
    return rows


def _option(name: str, description: str, active: bool, why_not: list[str] | None) -> str:
    """One profile of the switch list; one that cannot run on this host is marked and not selectable."""
    text = name + (" (active)" if active else "") + (f" - {description}" if description else "")
    if why_not:
        text += " - cannot run here: " + "; ".join(why_not)
    attrs = (" selected" if active else "") + (" disabled" if why_not and not active else "")
    return f'<option value="{esc(name)}"{attrs} title="{esc(text)}">{esc(text)}</option>'


def render_page(st: SupervisorStatus, nonce: str, now: float | None = None,
                unrunnable: Mapping[str, list[str]] | None = None) -> str:
    """unrunnable: profile -> why it cannot run on this host (service/fit.why_not), where the caller knows."""
    now = time.time() if now is None else now
    tel = st.telemetry
    state = st.state.value
    op = st.operation
    unrunnable = unrunnable or {}
    options = "".join(_option(n, p.description, n == st.profile, unrunnable.get(n))
                      for n, p in sorted(st.profiles.items()))
    overview = [("profile", st.profile or "-"), ("last good", st.saved.last_good_profile or "-"),
                ("engine", f"pid {st.engine.pid}" if st.engine.pid else "not running"),
                ("uptime", f"{st.uptime_seconds:.0f} s"),
                ("restarts", f"{st.counters.restarts} ({st.counters.recent_failures} recent failures)"),
                ("switches", f"{st.counters.switches_ok} ok, {st.counters.switches_failed} failed"),
                ("last error", st.last_error or "-")]
    overview += _start_rows(st)
    if op is not None:
        overview.append(("operation", f"{op.kind.value} -> {op.target}: {op.status.value}"
                                      + (f" ({op.error})" if op.error else "")))
    seconds = ", ".join(f"{s.value} {v:.0f} s" for s, v in st.state_seconds.items() if v >= 0.5)
    transitions = "".join(
        f"<tr><td>{esc(_clock(t.wall))}</td><td>{esc(t.old.value)} &rarr; <b>{esc(t.new.value)}</b></td>"
        f"<td>{esc(t.profile or '-')}</td><td>{esc(t.reason)}</td></tr>" for t in reversed(st.transitions[-15:]))
    ops = "".join(
        f"<tr><td>{esc(_ago(o.created, now))}</td><td>{esc(o.kind.value)} &rarr; {esc(o.target)}</td>"
        f"<td>{esc(o.status.value)}</td><td>{esc(o.error or '')}</td></tr>"
        for o in list(st.operations.values())[-10:][::-1])
    history = tel.history if tel else ()
    live = tel is not None and tel.engine_live and st.engine.pid is not None
    sampled = f"sampled {_ago(tel.at, now)}" if tel else "no telemetry sample yet"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<link rel="icon" href="data:,"><title>gptoss-spark: {esc(state)}</title><style nonce="{nonce}">{STYLE}</style></head>
<body>
<h1>gptoss-spark <span id="state" class="state {esc(state)}">{esc(state)}</span></h1>
<div class="muted">version {esc(__version__)} &middot; page rendered {esc(_clock(now))} &middot; {esc(sampled)}
&middot; data: <a href="/admin/status">/admin/status</a>, <a href="/metrics">/metrics</a></div>
<div class="grid">
<section><h2>Service</h2>{_table(overview)}
<p class="muted">time in each state: {esc(seconds or '-')}</p>
<h2>Switch profile</h2>
<form id="switch" autocomplete="off">
<select id="profile" name="profile">{options}</select>
<input id="token" type="password" placeholder="admin token" autocomplete="off" spellcheck="false" required>
<button type="submit">Switch</button></form>
<div id="result" role="status"></div>
<p class="muted">The token is sent with this one request only; this page never stores it.</p></section>
<section><h2>Throughput (last hour)</h2>
{chart(_rate_points(history), now, "generated tokens/s", "tokens/s", live)}
{chart([(p.at, p.running) for p in history], now, "running requests", "requests", live)}</section>
<section><h2>Memory</h2>{_table(_memory_rows(st, tel))}</section>
<section><h2>GPU</h2>{_table(_gpu_rows(tel))}</section>
</div>
<h2>State history</h2><table class="events"><tr><th>at</th><th>change</th><th>profile</th><th>reason</th></tr>
{transitions}</table>
<h2>Operations</h2>{('<table class="events">' + ops + '</table>') if ops else '<p class="muted">none yet</p>'}
<script nonce="{nonce}">{SCRIPT.replace("REFRESH_MS", str(REFRESH_SECONDS * 1000))}</script>
</body></html>
"""


def new_nonce() -> str:
    return secrets.token_urlsafe(16)


def csp(nonce: str) -> str:
    """Only this page's own script and style, requests to this origin, nothing framed or loaded
    (img-src data: is the empty favicon, so the browser asks for no /favicon.ico)."""
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
            "img-src data:; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
