"""`python -m ms_dynvm`: the command line.

  report FILE [-o OUT.html]       render a saved report JSON (ms_dynvm.report) or a saved stats() dict
  dump FILE [--block N]           print a program's text: a saved Program (.dvm, DYNVM_DUMP_DIR), a
                                  group's IR text, or the groups of a compile log / report JSON
  replay LOG [--index I ...]      re-run a compile log offline (DYNVM_COMPILE_LOG's JSON lines, or a
                                  report JSON): compile each group again with its options and compare
                                  its kernel with the NumPy reference interpreter on random inputs
  cache ls|clear|verify [--dir D] the kernel cache on disk (default $DYNVM_CACHE_DIR or ~/.cache/ms_dynvm)
  timeline TRACE -o OUT.png       draw a Chrome trace (a merged trace_view.json) as a PNG, one row per
                                  track, for a quick look without Perfetto

Exit status: 0 when all went well, 1 when a replayed group failed or a cache entry is corrupt, 2 on
bad arguments or unreadable files. Needs no MindSpore.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _die(msg: str) -> int:
    print(f"ms_dynvm: {msg}", file=sys.stderr)
    return 2


# --- report -----------------------------------------------------------------------------------------
def cmd_report(a) -> int:
    from ms_dynvm.observe import report

    try:
        data = report.from_file(a.file)
    except (OSError, ValueError) as e:
        return _die(str(e))
    out = a.output or os.path.splitext(a.file)[0] + ".html"
    if os.path.splitext(out)[1].lower() not in (".html", ".htm"):
        out += ".html"
    html_text = report.render_html(data)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(html_text)
    print(os.path.abspath(out))
    return 0


# --- compile logs -----------------------------------------------------------------------------------
def read_log(path: str) -> list:
    """Compile-log entries (dicts with "ir", "opts", ...) from a JSON-lines log or a report JSON."""
    with open(path) as f:
        text = f.read()
    s = text.lstrip()
    if s.startswith("{") and "\n{" not in s.strip():
        doc = json.loads(s)
        if isinstance(doc, dict) and "compiles" in doc:
            return list(doc["compiles"])
        if isinstance(doc, dict) and "ir" in doc:
            return [doc]
        raise ValueError(f"{path}: a JSON object without a compile log")
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                entries.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e})") from None
    return entries


def cmd_dump(a) -> int:
    from ms_dynvm.bytecode.program import Program
    from ms_dynvm.ir.function import Function

    try:
        with open(a.file) as f:
            text = f.read()
    except OSError as e:
        return _die(str(e))
    s = text.lstrip()
    if s.startswith("func @"):
        print(Function.parse(text).as_text(), end="")
        return 0
    try:
        doc = json.loads(s) if s.startswith("{") and "\n{" not in s.strip() else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "compiles" not in doc and "ir" not in doc:
        try:
            prog = Program.from_json(doc)
        except Exception as e:  # noqa: BLE001
            return _die(f"{a.file}: not a saved program ({e})")
        if a.block is None:
            print(prog.as_text(), end="")
        else:
            from ms_dynvm.ir.function import Function as F

            if not 0 <= a.block < len(prog.blocks):
                return _die(f"block {a.block} out of range (0..{len(prog.blocks) - 1})")
            print(F.from_block(prog, a.block).as_text(), end="")
        return 0
    try:
        entries = read_log(a.file)
    except (OSError, ValueError) as e:
        return _die(str(e))
    for i, e in enumerate(entries):
        print(f"# [{i}] {e.get('outcome', '?')} {e.get('seconds', 0) * 1e3:.1f} ms  key {e.get('key', '?')[:16]}"
              f"  opts {e.get('opts', {})}")
        print(e["ir"])
    return 0


def _inputs(fn, size: int, rng):
    """Random inputs for group `fn`, every symbolic dim's symbol bound to `size`."""
    from ms_dynvm import dtypes
    from ms_dynvm.bytecode.types import eval_dim

    env: dict = {}
    arrs = []
    for r in fn.params:
        t = fn.types[r]
        for d in t.shape:
            if not isinstance(d, int):
                for name in d.names:
                    env.setdefault(name, size)
        shape = tuple(eval_dim(d, env) for d in t.shape)
        npdt = dtypes.to_numpy(t.dtype)
        if npdt.kind == "b":
            a = rng.random(shape) < 0.5
        elif npdt.kind in "iu":
            a = rng.integers(0, 5, shape).astype(npdt)
        else:
            a = rng.uniform(-2.0, 2.0, shape).astype(npdt)
        arrs.append(a)
    return arrs


def _reference(fn, inputs):
    from ms_dynvm.runtime.interpreter import _round_bf16, run_instr

    values, env = {}, {}
    for r, a in zip(fn.params, inputs):
        values[r] = _round_bf16(a) if fn.types[r].dtype == "bf16" else a
    for ins in fn.body:
        run_instr(ins, values, fn.types, env=env)
    return [values[r] for r in fn.outputs]


def replay_entry(e: dict, *, use_cache: bool = False, size: int = 5, seed: int = 0) -> dict:
    """Compile one compile-log entry again and check its kernel against the reference interpreter."""
    import numpy as np

    from ms_dynvm.codegen import compile_group
    from ms_dynvm.ir.function import Function
    from ms_dynvm.runtime.cache import KernelCache, default_cache

    fn = Function.parse(e["ir"])
    opts = {k: bool(v) for k, v in (e.get("opts") or {}).items() if k in ("strict_ieee", "fast_math", "eager_math")}
    cache = default_cache() if use_cache else KernelCache(disk=False)
    res = {"group": [ins.op for ins in fn.body], "opts": opts, "logged": e.get("outcome")}
    t0 = time.perf_counter()
    try:
        kernel = compile_group(fn, cache=cache, **opts)
    except Exception as ex:  # noqa: BLE001 - the point is to report it
        res.update(status="compile error", error=f"{type(ex).__name__}: {ex}", seconds=time.perf_counter() - t0)
        return res
    res["seconds"] = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    inputs = _inputs(fn, size, rng)
    try:
        got = kernel(inputs)
        ref = _reference(fn, inputs)
    except Exception as ex:  # noqa: BLE001
        res.update(status="run error", error=f"{type(ex).__name__}: {ex}")
        return res
    worst = 0.0
    ok = True
    for g, r in zip(got, ref):
        g, r = np.asarray(g), np.asarray(r)
        if g.shape != r.shape:
            ok = False
            res["error"] = f"shape {g.shape} != reference {r.shape}"
            break
        if g.dtype.kind in "fc":
            tol = 2e-2 if g.dtype.itemsize <= 2 else 1e-4
            gf, rf = g.astype(np.float64), np.asarray(r, np.float64)
            fin = np.isfinite(rf)
            if not np.array_equal(np.isfinite(gf), fin) or not np.array_equal(np.isnan(gf), np.isnan(rf)):
                ok = False
                res["error"] = "non-finite values differ from the reference"
            if fin.any():
                err = np.abs(gf[fin] - rf[fin]) / (1e-5 + np.abs(rf[fin]))
                worst = max(worst, float(err.max()))
                ok = ok and worst <= tol
        elif not np.array_equal(g, r):
            ok = False
            res["error"] = "values differ from the reference"
    res["max_rel_err"] = worst
    res["status"] = "ok" if ok else "mismatch"
    return res


def cmd_replay(a) -> int:
    try:
        entries = read_log(a.log)
    except (OSError, ValueError) as e:
        return _die(str(e))
    if a.index:
        try:
            entries = [entries[i] for i in a.index]
        except IndexError:
            return _die(f"index out of range (the log has {len(entries)} entries)")
    seen, bad = set(), 0
    results = []
    for i, e in enumerate(entries):
        dedup = (e.get("ir"), json.dumps(e.get("opts"), sort_keys=True))
        if dedup in seen and not a.all:
            continue
        seen.add(dedup)
        r = replay_entry(e, use_cache=a.use_cache, size=a.size, seed=a.seed)
        r["index"] = i
        results.append(r)
        bad += r["status"] != "ok"
        if not a.json:
            group = " > ".join(r["group"])
            extra = f" max rel err {r['max_rel_err']:.2e}" if "max_rel_err" in r else ""
            print(f"[{i}] {r['status']:<13} {r.get('seconds', 0) * 1e3:8.1f} ms  {group[:90]}{extra}"
                  + (f"\n      {r['error']}" if r.get("error") else ""))
    if a.json:
        print(json.dumps(results, indent=1))
    else:
        print(f"{len(results)} groups replayed, {bad} failed")
    return 1 if bad else 0


# --- cache ------------------------------------------------------------------------------------------
def _entries(d: str):
    if not os.path.isdir(d):
        return
    for sub in sorted(os.listdir(d)):
        p = os.path.join(d, sub)
        if len(sub) == 2 and os.path.isdir(p):
            for name in sorted(os.listdir(p)):
                if name.endswith(".bin") and not name.startswith("."):
                    yield name[:-4], os.path.join(p, name)


def cmd_cache(a) -> int:
    from ms_dynvm.runtime.cache import default_dir, unpack

    d = a.dir or default_dir()
    if a.action == "ls":
        n = total = 0
        for key, p in _entries(d):
            st = os.stat(p)
            n += 1
            total += st.st_size
            if not a.quiet:
                print(f"{key}  {st.st_size:>9}  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(st.st_mtime))}")
        print(f"{n} entries, {total / 2**20:.2f} MiB in {d}")
        return 0
    if a.action == "clear":
        n = 0
        for _key, p in _entries(d):
            os.unlink(p)
            n += 1
        for sub in os.listdir(d) if os.path.isdir(d) else ():
            p = os.path.join(d, sub)
            if len(sub) == 2 and os.path.isdir(p):
                for name in os.listdir(p):
                    if name.startswith(".tmp-"):  # a write interrupted midway
                        os.unlink(os.path.join(p, name))
                try:
                    os.rmdir(p)
                except OSError:
                    pass
        print(f"removed {n} entries from {d}")
        return 0
    # verify
    n = bad = 0
    for key, p in _entries(d):
        n += 1
        with open(p, "rb") as f:
            data = f.read()
        if unpack(key, data) is None:
            bad += 1
            print(f"corrupt: {p}")
            if a.delete:
                os.unlink(p)
    print(f"{n} entries checked, {bad} corrupt" + (" (deleted)" if bad and a.delete else ""))
    return 1 if bad else 0


# --- timeline ---------------------------------------------------------------------------------------
def cmd_timeline(a) -> int:
    try:
        with open(a.trace) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return _die(str(e))
    from ms_dynvm.observe.report import draw_timeline

    try:
        n = draw_timeline(doc, a.output, start_ms=a.start_ms, span_ms=a.span_ms, width=a.width)
    except ValueError as e:
        return _die(f"{a.trace}: {e}")
    print(f"{os.path.abspath(a.output)} ({n} events drawn)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ms_dynvm", description="ms_dynvm's command line")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("report", help="render a saved report JSON or stats() dict as HTML")
    p.add_argument("file")
    p.add_argument("-o", "--output", help="the HTML file (default: FILE with .html)")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("dump", help="print a program's text (.dvm, IR text, compile log)")
    p.add_argument("file")
    p.add_argument("--block", type=int, help="one block of a .dvm program, as IR")
    p.set_defaults(fn=cmd_dump)
    p = sub.add_parser("replay", help="re-run a compile log offline and check each kernel")
    p.add_argument("log", help="DYNVM_COMPILE_LOG file (JSON lines) or a report JSON")
    p.add_argument("--index", type=int, action="append", help="only this entry (repeatable)")
    p.add_argument("--use-cache", action="store_true", help="load kernels from the disk cache (default: rebuild)")
    p.add_argument("--size", type=int, default=5, help="the value of every symbolic dim (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--all", action="store_true", help="replay repeated entries too")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(fn=cmd_replay)
    p = sub.add_parser("cache", help="the kernel cache on disk")
    p.add_argument("action", choices=("ls", "clear", "verify"))
    p.add_argument("--dir", help="cache directory (default: $DYNVM_CACHE_DIR or ~/.cache/ms_dynvm)")
    p.add_argument("--delete", action="store_true", help="verify: delete corrupt entries")
    p.add_argument("-q", "--quiet", action="store_true", help="ls: totals only")
    p.set_defaults(fn=cmd_cache)
    p = sub.add_parser("timeline", help="draw a Chrome trace (e.g. a merged trace_view.json) as a PNG")
    p.add_argument("trace")
    p.add_argument("-o", "--output", default="timeline.png")
    p.add_argument("--start-ms", type=float, default=0.0, help="from this many ms after the first event")
    p.add_argument("--span-ms", type=float, default=None, help="this many ms (default: all)")
    p.add_argument("--width", type=float, default=14.0, help="figure width in inches")
    p.set_defaults(fn=cmd_timeline)
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
