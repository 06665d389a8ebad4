"""`ms_dynvm.report(path)`: what ms_dynvm saw and did, as JSON and as one self-contained HTML page.

`collect()` gathers, without MindSpore:
- `stats`: `ms_dynvm.stats()`;
- `steps`: every step the step switch timed (`series.STEPS`: under ms_dynvm or bare, i.e. plain
  MindSpore eager), and per step key (anchor and size classes) the medians of both ways and the way
  the switch chose (`cost.step.switches()`);
- `samples`: the counters over time (compiles, compile seconds, kernel cache hits, pool bytes);
- `compiles`: the compile log (`series.COMPILES`: outcome, seconds, group, signature, IR text);
- `groups`: tier 1's fused groups with their measured eager and served times per size class and the
  time they saved, estimated as (median eager - median served) x served calls, per size class;
- `fallbacks`: the heat table: per op or fused-group reason, the count and its share of the calls it
  is counted against (ops for opaque ops and recording failures; fused-group calls for tier 1's
  fallbacks and guard failures; region calls for region fallbacks);
- `pool`: the memory pool's stats; `events`: the timeline recorder's state; `alarm`: whether the
  fallback alarm fired and what it said.

`render_html(data)` draws the plots with matplotlib (Agg backend, PNGs inlined as base64: the page
loads no file and runs no script). Where matplotlib is missing, the page says so and keeps its tables.
`write(path)` writes `<stem>.json` and `<stem>.html` (a `.json` path: the HTML beside it) and returns
both paths. `python -m ms_dynvm report <file.json>` renders a saved JSON (or a saved `stats()` dict).
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import json
import os
import platform
import statistics
import sys
import time

from ms_dynvm.observe import events, log, series

TOP_GROUPS = 12
TOP_KEYS = 8
MAX_STEP_POINTS = 5000


def _median(xs):
    return statistics.median(xs) if xs else None


# --- collection -------------------------------------------------------------------------------------
def _meta() -> dict:
    ms = sys.modules.get("mindspore")
    from ms_dynvm import __version__

    return {
        "ms_dynvm": __version__,
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "pid": os.getpid(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": _cpu_name(),
        "cores": os.cpu_count(),
        "mindspore": getattr(ms, "__version__", None),
        "series_start": series.T0,
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _steps() -> dict:
    from ms_dynvm.cost import step as step_mod

    per_key: dict = {}
    pts = []
    for t, key, seconds, vm in list(series.STEPS):
        label = series.key_label(key)
        d = per_key.setdefault(label, {"label": label, "vm": [], "bare": [], "way": None})
        d["vm" if vm else "bare"].append(seconds)
        pts.append({"t": t - series.T0, "key": label, "seconds": seconds, "way": "ms_dynvm" if vm else "eager"})
    for sw in step_mod.switches():
        for s in sw.summary():
            label = series.key_label(s["key"])
            d = per_key.get(label)
            if d is None:
                if not (s["vm"] or s["bare"]):
                    continue
                # (steps older than the series holds: the switch's recent samples stand in)
                d = per_key[label] = {"label": label, "vm": s["vm"], "bare": s["bare"], "way": None}
            d["way"] = "ms_dynvm" if s["way"] == "vm" else "eager"
    keys = []
    for d in per_key.values():
        vm, bare = _median(d["vm"]), _median(d["bare"])
        keys.append({"key": d["label"], "steps_ms_dynvm": len(d["vm"]), "steps_eager": len(d["bare"]),
                     "median_ms_dynvm_s": vm, "median_eager_s": bare,
                     "speedup": (bare / vm) if vm and bare else None, "chosen": d["way"]})
    keys.sort(key=lambda k: -(k["steps_ms_dynvm"] + k["steps_eager"]))
    if len(pts) > MAX_STEP_POINTS:
        pts = pts[-MAX_STEP_POINTS:]
    return {"by_key": keys, "series": pts}


def _groups() -> list:
    """Tier 1's fused groups, from the executors `frontend.dispatch` keeps (read only)."""
    disp = sys.modules.get("ms_dynvm.frontend.dispatch")
    if disp is None:
        return []
    out, seen = [], set()
    for t1 in list(getattr(disp, "_tier1_by_opts", {}).values()):
        for t in list(t1.templates.values()):
            if id(t) in seen:
                continue
            seen.add(id(t))
            st = t.stats
            classes, saved = [], None
            total_n = sum(c.n for c in t.switch.classes.values()) or 1
            for cls, c in sorted(t.switch.classes.items()):
                e, s = _median(list(c.eager)), _median(list(c.served))
                served_here = st.served * c.n / total_n
                gain = (e - s) * served_here if e is not None and s is not None else None
                if gain is not None:
                    saved = (saved or 0.0) + gain
                classes.append({"size_class": cls, "calls": c.n, "serving": c.on, "median_eager_s": e,
                                "median_served_s": s, "saved_s": gain})
            if not (st.compiled or st.served or st.failed):
                continue
            out.append({"ops": list(t.names), "n_ops": len(t.names), "calls": st.calls, "served": st.served,
                        "eager_calls": st.eager_calls, "compiled": st.compiled, "failed": st.failed,
                        "kernels": len(t.kernels), "saved_s": saved, "size_classes": classes})
    out.sort(key=lambda g: (g["saved_s"] is None, -(g["saved_s"] or 0.0), -g["served"]))
    return out


def _fallbacks(st: dict) -> list:
    ops = st.get("ops_seen", 0)
    group_calls = (st.get("cache_hits", 0) + sum(st.get("guard_failures", {}).values())
                   + sum(st.get("fallbacks", {}).values()))
    rows = []
    for op, n in st.get("ops_opaque", {}).items():
        rows.append({"op": op, "reason": "opaque: no VM semantics (runs eagerly, ends fusion)", "count": n,
                     "share": n / ops if ops else None, "of": "ops"})
    for k, n in st.get("record_errors", {}).items():
        op, _, why = k.partition(": ")
        rows.append({"op": op, "reason": f"recording failed ({why})", "count": n,
                     "share": n / ops if ops else None, "of": "ops"})
    for k, n in st.get("fallbacks", {}).items():
        where, _, why = k.partition(": ")
        rows.append({"op": f"fused group ({where})", "reason": why or k, "count": n,
                     "share": n / group_calls if group_calls else None, "of": "fused-group calls"})
    for k, n in st.get("guard_failures", {}).items():
        rows.append({"op": "fused group (tier1)", "reason": f"guard failed: {k}", "count": n,
                     "share": n / group_calls if group_calls else None, "of": "fused-group calls"})
    rcalls = st.get("region_calls", 0)
    for k, n in st.get("region_fallbacks", {}).items():
        rows.append({"op": "region", "reason": k, "count": n, "share": n / rcalls if rcalls else None,
                     "of": "region calls"})
    rows.sort(key=lambda r: -r["count"])
    return rows


def collect() -> dict:
    """Everything the report shows, as plain JSON-able data. A part that fails to collect is left
    out and named in `errors`."""
    from ms_dynvm.metrics import METRICS
    from ms_dynvm.observe import alarm

    data: dict = {"errors": []}
    parts = {
        "meta": _meta,
        "stats": METRICS.snapshot,
        "steps": _steps,
        "groups": _groups,
    }
    for name, fn in parts.items():
        try:
            data[name] = fn()
        except Exception as e:  # noqa: BLE001 - a report with a hole beats no report
            data[name] = None
            data["errors"].append(f"{name}: {type(e).__name__}: {e}")
    try:
        series.sample(force=True)
    except Exception as e:  # noqa: BLE001
        data["errors"].append(f"samples: {type(e).__name__}: {e}")
    t0 = series.T0
    data["samples"] = [{**s, "t": s["t"] - t0} for s in list(series.SAMPLES)]
    data["compiles"] = [{**c, "t": c["t"] - t0} for c in list(series.COMPILES)]
    data["fallbacks"] = _fallbacks(data["stats"] or {})
    try:
        mod = sys.modules.get("ms_dynvm.frontend.regions")  # (never imports MindSpore itself)
        data["regions"] = mod.summary() if mod is not None else []
    except Exception as e:  # noqa: BLE001
        data["regions"] = []
        data["errors"].append(f"regions: {type(e).__name__}: {e}")
    data["pool"] = {k[5:]: v for k, v in (data["stats"] or {}).items() if k.startswith("pool_")}
    from ms_dynvm.observe import profiler

    data["events"] = {"recording": events.ON, "emitted": events.emitted, "held": len(events._RING),
                      "capacity": events.CAPACITY, "merged_into": [p for p, _ in profiler.merged]}
    data["alarm"] = {"fired": alarm.fired, "message": alarm.last_message,
                     "threshold": alarm.THRESHOLD}
    data["series_errors"] = series.errors
    return data


# --- rendering --------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _empty(ax, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="#666", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_steps(data: dict) -> str:
    plt = _plt()
    steps = data.get("steps") or {}
    keys = [k for k in steps.get("by_key", [])][:TOP_KEYS]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.3]})
    if not keys:
        _empty(a1, "no timed steps\n(the step switch times steps with jit and step_switch on)")
        _empty(a2, "no timed steps")
        return _png(fig)
    import numpy as np

    x = np.arange(len(keys))
    vm = [1e3 * (k["median_ms_dynvm_s"] or 0) for k in keys]
    bare = [1e3 * (k["median_eager_s"] or 0) for k in keys]
    a1.bar(x - 0.2, bare, 0.4, label="eager (ms_dynvm off the stack)", color="#999")
    a1.bar(x + 0.2, vm, 0.4, label="ms_dynvm", color="#2a7ab9")
    a1.set_xticks(x, [f"{i + 1}" for i in range(len(keys))])
    a1.set_xlabel("step key (see the table below)")
    a1.set_ylabel("median step time (ms)")
    a1.set_title("Time per step, eager vs ms_dynvm, per size class")
    a1.legend(fontsize=8)
    labels = {k["key"]: i for i, k in enumerate(keys)}
    pts = [p for p in steps.get("series", []) if p["key"] in labels]
    for way, color, marker in (("eager", "#777", "o"), ("ms_dynvm", "#2a7ab9", "s")):
        ps = [p for p in pts if p["way"] == way]
        if ps:
            a2.scatter([p["t"] for p in ps], [1e3 * p["seconds"] for p in ps], s=12, c=color, marker=marker,
                       label=way, alpha=0.8)
    a2.set_xlabel("time since import (s)")
    a2.set_ylabel("step time (ms)")
    a2.set_title("Every timed step")
    a2.legend(fontsize=8)
    return _png(fig)


def plot_compiles(data: dict) -> str:
    plt = _plt()
    samples = data.get("samples") or []
    comps = data.get("compiles") or []
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.2))
    if comps:
        for outcome, color in (("built", "#c0392b"), ("disk", "#e69f00"), ("memory", "#2a7ab9"),
                               ("error", "#000"), ("unknown", "#999")):
            cs = [c for c in comps if c["outcome"] == outcome]
            if cs:
                a1.scatter([c["t"] for c in cs], [1e3 * c["seconds"] for c in cs], c=color, s=18,
                           label=f"{outcome} ({len(cs)})")
        a1.set_xlabel("time since import (s)")
        a1.set_ylabel("time to obtain the kernel (ms)")
        a1.set_yscale("log")
        a1.legend(fontsize=8, title="outcome")
    else:
        _empty(a1, "no kernel compiled or loaded")
    a1.set_title("Compiles (gcc), disk-cache and memory loads")
    if samples:
        t = [s["t"] for s in samples]
        a2.plot(t, [s["cache_hits"] for s in samples], label="kernel launches (cache hits)", color="#2a7ab9")
        a2.plot(t, [s["cache_misses"] for s in samples], label="kernels installed (misses)", color="#c0392b")
        a2.set_xlabel("time since import (s)")
        a2.set_ylabel("count (cumulative)")
        b = a2.twinx()
        b.plot(t, [s["compile_seconds"] for s in samples], color="#e69f00", ls="--", label="compile seconds")
        b.set_ylabel("compile seconds (cumulative)")
        h1, l1 = a2.get_legend_handles_labels()
        h2, l2 = b.get_legend_handles_labels()
        a2.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    else:
        _empty(a2, "no samples")
    a2.set_title("Kernel cache over time")
    return _png(fig)


def plot_groups(data: dict) -> str:
    plt = _plt()
    groups = [g for g in (data.get("groups") or []) if g["saved_s"] is not None][:TOP_GROUPS]
    fig, ax = plt.subplots(figsize=(13, 0.6 + 0.45 * max(len(groups), 3)))
    if not groups:
        _empty(ax, "no fused group with measured eager and served times")
        return _png(fig)
    names = [_group_name(g["ops"], 70) for g in groups][::-1]
    vals = [1e3 * g["saved_s"] for g in groups][::-1]
    ax.barh(range(len(groups)), vals, color=["#2a7ab9" if v >= 0 else "#c0392b" for v in vals])
    ax.set_yticks(range(len(groups)), names, fontsize=8)
    ax.axvline(0, color="#333", lw=0.8)
    ax.set_xlabel("time saved (ms, estimated: (median eager - median served) x served calls)")
    ax.set_title("Top fused groups by time saved")
    return _png(fig)


def plot_pool(data: dict) -> str:
    plt = _plt()
    samples = [s for s in (data.get("samples") or []) if "pool_reserved_bytes" in s]
    fig, ax = plt.subplots(figsize=(13, 3.6))
    if not samples:
        _empty(ax, "the memory pool was not used (no fused kernel ran with pool_results on)")
        return _png(fig)
    t = [s["t"] for s in samples]
    ax.plot(t, [s["pool_reserved_bytes"] / 2**20 for s in samples], label="reserved", color="#c0392b")
    ax.plot(t, [s["pool_live_bytes"] / 2**20 for s in samples], label="live", color="#2a7ab9")
    ax.set_xlabel("time since import (s)")
    ax.set_ylabel("MiB")
    ax.set_title("Memory pool: reserved vs live")
    ax.legend(fontsize=8)
    return _png(fig)


def _group_name(ops: list, width: int) -> str:
    s = " > ".join(ops)
    return s if len(s) <= width else s[:width - 1] + "…"


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if unit == "ms":
            return f"{1e3 * v:.2f}"
        if unit == "%":
            return f"{100 * v:.1f}%"
        return f"{v:.4g}"
    return html.escape(str(v))


def _table(head: list, rows: list, cls: str = "") -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


def _heat(share) -> str:
    if share is None:
        return ""
    a = min(max(share, 0.0), 1.0) ** 0.5
    return f' style="background: rgba(192,57,43,{0.08 + 0.6 * a:.2f})"'


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px auto; max-width: 1180px;
       color: #222; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #ddd; }
.meta { color: #555; font-size: 12px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 12.5px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f5f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; min-width: 120px; }
.card b { display: block; font-size: 18px; } .card span { color: #666; font-size: 12px; }
img { max-width: 100%; } .alarm { background: #fdecea; border: 1px solid #c0392b; padding: 8px 12px; }
code, pre { font: 12px ui-monospace, monospace; } pre { background: #f6f8fa; padding: 8px; overflow: auto; }
.note { color: #666; font-size: 12px; }
"""


def render_html(data: dict) -> str:
    st = data.get("stats") or {}
    meta = data.get("meta") or {}
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>ms_dynvm report</title>"
             f"<style>{CSS}</style></head><body>",
             "<h1>ms_dynvm report</h1>",
             "<div class='meta'>" + html.escape(
                 f"written {meta.get('written', '?')} · ms_dynvm {meta.get('ms_dynvm', '?')} · MindSpore "
                 f"{meta.get('mindspore') or 'not imported'} · Python {meta.get('python', '?')} · "
                 f"{meta.get('processor', '?')} ({meta.get('cores', '?')} cores) · pid {meta.get('pid', '?')}")
             + "</div>"]
    alarm = data.get("alarm") or {}
    if alarm.get("fired"):
        parts.append(f"<p class='alarm'><b>Fallback alarm.</b> {html.escape(alarm.get('message', ''))}</p>")
    if data.get("errors"):
        parts.append("<p class='alarm'>Parts of this report could not be collected: "
                     + html.escape("; ".join(data["errors"])) + "</p>")
    sc = st.get("step_calls", {})
    cards = [("ops seen", st.get("ops_seen")), ("fused ops", _fmt(st.get("fusion_rate"), "%")),
             ("opaque ops", _fmt(st.get("opaque_rate"), "%")), ("fused groups", st.get("groups_compiled")),
             ("gcc compiles", st.get("compiles")), ("compile time (s)", _fmt(st.get("compile_seconds"))),
             ("kernel cache hit rate", _fmt(st.get("cache_hit_rate"), "%")),
             ("steps under ms_dynvm / eager", f"{sc.get('vm', 0)} / {sc.get('bare', 0)}"),
             ("tier-1 fallbacks (with probes)", sum((st.get("fallbacks") or {}).values()))]
    parts.append("<div class='cards'>" + "".join(
        f"<div class='card'><b>{v if isinstance(v, str) else _fmt(v)}</b><span>{html.escape(k)}</span></div>"
        for k, v in cards) + "</div>")

    try:
        plots = {"steps": plot_steps(data), "compiles": plot_compiles(data), "groups": plot_groups(data),
                 "pool": plot_pool(data)}
        plot_error = None
    except ImportError as e:
        plots, plot_error = {}, f"plots need matplotlib ({e}); pip install matplotlib"
    except Exception as e:  # noqa: BLE001
        plots, plot_error = {}, f"plotting failed: {type(e).__name__}: {e}"
        log.warn_once("report-plots", "ms_dynvm: report plots failed: %r", "report", e)

    def img(name: str, alt: str) -> str:
        if name in plots:
            return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{plots[name]}'>"
        return f"<p class='note'>{html.escape(plot_error or 'no plot')}</p>"

    parts.append("<h2>Tier 2: region replay</h2>")
    n_rep, n_calls = st.get("regions_replayed", 0), st.get("region_calls", 0)
    host = st.get("region_host_seconds", 0.0) / n_rep * 1e3 if n_rep else None
    per = st.get("region_replay_seconds", 0.0) / n_rep * 1e3 if n_rep else None
    parts.append("<p class='note'>" + html.escape(
        f"{n_rep} of {n_calls} region calls replayed ({_fmt(st.get('region_replay_rate'), '%')}); a replay "
        f"took {_fmt(per)} ms on average, of which {_fmt(host)} ms host cost (guards, views, wrapping); "
        f"learning (recorded calls and planning) {_fmt(st.get('region_learn_seconds'))} s; plans "
        f"{st.get('region_compiles', 0)} ({st.get('region_sizes_derived', 0)} written for a new size from its "
        f"family's recorded sizes, {sum(st.get('region_derive_failures', {}).values())} such failed their check), "
        f"re-verifications {st.get('region_reverifications', 0)}. "
        "A region is a call of a gradient function, an outermost Cell call without gradient, an "
        "optimizer step or a @ms_dynvm.jit function (docs/regions.md); 'eager (recorded)' is the wall "
        "time of its recorded eager calls, an overestimate of plain eager.") + "</p>")
    rrows = [[html.escape(str(r["region"])), r["kind"], html.escape(r["signature"]), r["state"],
              html.escape(r["reason"] or ""), str(r["replays"]), _fmt(r["eager_ms"]), _fmt(r["replay_ms"]),
              _fmt(r["eager_ms"] / r["replay_ms"] if r["eager_ms"] and r["replay_ms"] else None)]
             for r in (data.get("regions") or [])[:60]]
    parts.append(_table(["region", "kind", "signature", "state", "reason", "replays", "eager, recorded (ms)",
                         "replay (ms)", "speed-up"], rrows))

    steps = data.get("steps") or {}
    parts.append("<h2>Time per step: eager vs ms_dynvm, per size class</h2>")
    parts.append("<p class='note'>The step switch (cost/step.py) times whole steps (one call of the anchor "
                 "Cell or differentiated function to the next), per size class of its tensor arguments, "
                 "under ms_dynvm and bare (ms_dynvm's dispatch mode off the stack: plain MindSpore eager), "
                 "and runs each class the faster way. Learning steps are included.</p>")
    parts.append(img("steps", "step times"))
    rows = [[str(i + 1), _fmt(k["key"]), str(k["steps_eager"]),
             _fmt(k["median_eager_s"], "ms"), str(k["steps_ms_dynvm"]), _fmt(k["median_ms_dynvm_s"], "ms"),
             _fmt(k["speedup"]), _fmt(k["chosen"])] for i, k in enumerate(steps.get("by_key", [])[:50])]
    parts.append(_table(["#", "step key", "eager steps", "median eager (ms)", "ms_dynvm steps",
                         "median ms_dynvm (ms)", "speed-up", "chosen way"], rows))

    parts.append("<h2>Compile time and kernel cache over time</h2>")
    parts.append(img("compiles", "compiles"))
    comps = data.get("compiles") or []
    if comps:
        rows = [[_fmt(round(c["t"], 3)), _fmt(c["outcome"]), _fmt(c["seconds"], "ms"),
                 _fmt(_group_name(c["group"], 80)), _fmt(c["signature"]), f"<code>{html.escape(c['key'][:12])}</code>"]
                for c in comps[-40:]]
        parts.append("<details><summary>compile log (last 40 of " + str(len(comps)) + "; `python -m ms_dynvm "
                     "replay` re-runs it)</summary>" + _table(["t (s)", "outcome", "ms", "group", "signature",
                                                                 "key"], rows) + "</details>")

    parts.append("<h2>Top fused groups by time saved</h2>")
    parts.append(img("groups", "fused groups"))
    groups = (data.get("groups") or [])[:TOP_GROUPS]
    if groups:
        rows = []
        for g in groups:
            cls = "; ".join(f"2^{max(c['size_class'] - 1, 0)}: eager {_fmt(c['median_eager_s'], 'ms')} / served "
                            f"{_fmt(c['median_served_s'], 'ms')} ms{'' if c['serving'] else ' (runs eager)'}"
                            for c in g["size_classes"])
            rows.append([_fmt(_group_name(g["ops"], 90)), str(g["n_ops"]), str(g["calls"]), str(g["served"]),
                         str(g["eager_calls"]), _fmt(g["saved_s"], "ms"), html.escape(cls)])
        parts.append(_table(["group (ops)", "ops", "calls", "served", "eager", "saved (ms)",
                             "per size class (median per call)"], rows))

    parts.append("<h2>Fallbacks</h2>")
    fb = data.get("fallbacks") or []
    if fb:
        rows = [[_fmt(r["op"]), _fmt(r["reason"]), str(r["count"]),
                 f"<span{_heat(r['share'])}>{_fmt(r['share'], '%')}</span>", _fmt(r["of"])] for r in fb[:60]]
        parts.append("<p class='note'>Share: of the calls the row is counted against (ops dispatched to ms_dynvm "
                     "for op rows, fused-group calls for tier 1's rows, region calls for regions). Tier 1's "
                     "'eager probe' and 'eager (faster for this size)' rows are its own measured choices.</p>")
        parts.append(_table(["op", "reason", "count", "share", "of"], rows, "heat"))
    else:
        parts.append("<p>No fallback, guard failure or opaque op was counted.</p>")

    parts.append("<h2>Memory pool: reserved vs live</h2>")
    parts.append(img("pool", "memory pool"))
    pool = data.get("pool") or {}
    if pool:
        keys = ("reserved_bytes", "live_bytes", "peak_reserved_bytes", "peak_live_bytes", "reuse_rate",
                "fragmentation", "allocs", "safe_points", "heap_trims")
        parts.append(_table(list(keys), [[_fmt(pool.get(k)) for k in keys]]))

    ev = data.get("events") or {}
    parts.append("<h2>Timeline</h2><p>" + html.escape(
        f"Event recording {'on' if ev.get('recording') else 'off'}; {ev.get('emitted', 0)} events emitted, "
        f"{ev.get('held', 0)} held (ring of {ev.get('capacity', 0)}). Merged into MindSpore profiles: "
        f"{', '.join(ev.get('merged_into') or []) or 'none'}.") + "</p>")
    parts.append("<h2>stats()</h2><details><summary>all counters</summary><pre>"
                 + html.escape(json.dumps(st, indent=1, sort_keys=True, default=str)) + "</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def draw_timeline(doc, png: str, start_ms: float = 0.0, span_ms: float | None = None, width: float = 14.0) -> int:
    """Draw Chrome-trace events (a list, or a dict with "traceEvents") as a PNG: one row per track
    (process / thread names from the metadata), spans as bars, instants as ticks, counters left out.
    Returns the number of events drawn."""
    trace = doc["traceEvents"] if isinstance(doc, dict) else doc
    pname, tname = {}, {}
    for e in trace:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            tname[(e["pid"], e["tid"])] = e["args"]["name"]
    timed = [e for e in trace if e.get("ph") in ("X", "i", "I")]
    if not timed:
        raise ValueError("no timed events")
    t0 = min(float(e["ts"]) for e in timed) + 1e3 * start_ms
    t1 = t0 + 1e3 * span_ms if span_ms else max(float(e["ts"]) + float(e.get("dur", 0)) for e in timed)
    rows: dict = {}
    for e in timed:
        ts = float(e["ts"])
        end = ts + float(e.get("dur", 0) or 0)
        if end < t0 or ts > t1:
            continue
        key = (e.get("pid"), e.get("tid"))
        rows.setdefault(key, []).append(e)
    order = sorted(rows, key=lambda k: (pname.get(k[0]) == "ms_dynvm", str(k[0]), str(k[1])))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(width, 0.5 + 0.42 * len(order)))
    colors = {}
    palette = ["#2a7ab9", "#e69f00", "#009e73", "#c0392b", "#8e44ad", "#56b4e9", "#d55e00", "#7f8c8d"]
    drawn = 0
    for y, key in enumerate(order):
        for e in rows[key]:
            ts = (float(e["ts"]) - t0) / 1e3
            name = str(e.get("name", ""))
            c = colors.setdefault(name.split(":")[0].split(" (")[0], palette[len(colors) % len(palette)])
            if e["ph"] == "X":
                ax.broken_barh([(ts, max(float(e.get("dur", 0)) / 1e3, 0.02))], (y - 0.35, 0.7), color=c, lw=0)
            else:
                ax.plot([ts, ts], [y - 0.38, y + 0.38], color=c, lw=0.8)
            drawn += 1
    labels = [f"{pname.get(k[0], k[0])} / {tname.get(k, k[1])}" for k in order]
    ax.set_yticks(range(len(order)), labels, fontsize=8)
    ax.set_ylim(-0.6, len(order) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("ms")
    ax.grid(axis="x", color="#eee")
    fig.savefig(png, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return drawn


# --- writing ----------------------------------------------------------------------------------------
def paths_for(path: str) -> tuple[str, str]:
    path = os.path.abspath(os.fspath(path))
    stem, ext = os.path.splitext(path)
    if ext.lower() not in (".html", ".htm", ".json"):
        stem = path
    return stem + ".json", stem + ".html"


def _atomic_write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write(path: str = "ms_dynvm_report.html", data: dict | None = None) -> dict:
    """Write the report (JSON and HTML) for `path`; returns {"json": ..., "html": ..., "seconds": ...}."""
    t0 = time.perf_counter()
    data = collect() if data is None else data
    jpath, hpath = paths_for(path)
    _atomic_write(jpath, json.dumps(data, indent=1, default=str))
    _atomic_write(hpath, render_html(data))
    log.get("report").info("report written: %s, %s", hpath, jpath)
    return {"json": jpath, "html": hpath, "seconds": time.perf_counter() - t0}


def from_file(path: str) -> dict:
    """Report data from a saved file: a report's JSON, or a saved `ms_dynvm.stats()` dict (then only the
    counters, fallback table and pool numbers are known)."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a report or stats() JSON object")
    if "stats" in doc and "meta" in doc:
        return doc
    if "ops_seen" in doc:
        return {"meta": {"written": "from a saved stats() file", "source": os.path.abspath(path)},
                "stats": doc, "steps": {"by_key": [], "series": []}, "samples": [], "compiles": [],
                "groups": [], "fallbacks": _fallbacks(doc),
                "pool": {k[5:]: v for k, v in doc.items() if k.startswith("pool_")},
                "events": {}, "alarm": {}, "errors": []}
    raise ValueError(f"{path}: neither a report JSON (meta, stats, ...) nor a stats() dict (ops_seen, ...)")
