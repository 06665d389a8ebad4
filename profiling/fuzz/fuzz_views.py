"""Targeted differential fuzz: fused view ops (transpose/permute/.T, expand_dims/
unsqueeze, squeeze) inside served groups, aliasing (in-place writes to a base or a view after the
group), softmax/log_softmax of products with huge logits, and (mode "loop") sync-anchored steps of the
step switch (a plain loop with asnumpy per iteration under the default enable()).

    python profiling/fuzz/fuzz_views.py SEED N [--mode thr|loop|both] [--only i,j] [--src] [--nan]

Each program runs eagerly and under ms_dynvm (mode thr: compiling at first sight, sizes varying;
mode loop: 40 calls under the default enable() with asnumpy() between calls, so the sync-anchored
step switch runs), every tensor compared with fuzz_ops.compare. Mismatches that are MindSpore's own
artefacts are listed in docs/numerics.md.
"""
import argparse
import os
import random
import sys
import traceback

os.environ.setdefault("GLOG_v", "3")
import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import ops, mint  # noqa: E402
import ms_dynvm  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from fuzz_ops import compare  # noqa: E402

ms.runtime.launch_blocking()

ap = argparse.ArgumentParser()
ap.add_argument("seed", type=int)
ap.add_argument("n", type=int)
ap.add_argument("--mode", default="both")
ap.add_argument("--only", default=None)
ap.add_argument("--src", action="store_true")
ap.add_argument("--nan", action="store_true")
A = ap.parse_args()
R = random.Random(A.seed)
ONLY = None if A.only is None else {int(v) for v in A.only.split(",")}

UN = ["ops.exp({a})", "ops.tanh({a})", "ops.relu({a})", "ops.sigmoid({a})", "-{a}", "ops.abs({a})",
      "{a} * {a}", "{a} * 0.5", "{a} + 1.0", "2.0 - {a}", "{a} / 3.0", "ops.clamp({a}, -1.0, 1.0)"]
BIN = ["{a} + {b}", "{a} * {b}", "{a} - {b}", "ops.maximum({a}, {b})", "ops.minimum({a}, {b})",
       "ops.where({a} > {b}, {a}, {b})", "{a} / (ops.abs({b}) + 1.0)"]
SCALES = ["0.07", "3.0", "1e4", "1e9", "1e15", "1e20", "1e30", "-1e12"]


def views_for(shape):
    r = len(shape)
    out = []
    if r >= 2:
        p = list(range(r))
        R.shuffle(p)
        out += [f"ops.transpose({{a}}, {tuple(p)})", f"{{a}}.permute{tuple(p)}",
                f"{{a}}.swapaxes({R.randrange(r)}, {R.randrange(r)})"]
        if r == 2:
            out.append("{a}.T")
    if r < 4:
        d = R.randint(-r - 1, r)
        out += [f"ops.expand_dims({{a}}, {d})", f"{{a}}.unsqueeze({d})"]
    ones = [i for i, s in enumerate(shape) if s == 1]
    if ones:
        d = R.choice(ones)
        out += [f"ops.squeeze({{a}}, {d})", f"{{a}}.squeeze({d})", f"mint.squeeze({{a}}, {d})"]
        if R.random() < 0.3:
            out.append("{a}.squeeze()")
    return out


def softmaxes(shape):
    r = len(shape)
    ax = R.randint(-r, r - 1) if r else -1
    s = R.choice(SCALES)
    return [f"ops.softmax({{a}} * {s}, {ax})", f"ops.log_softmax({{a}} * {s}, {ax})",
            f"mint.nn.functional.softmax({{a}} * {s}, dim={ax})",
            f"mint.nn.functional.log_softmax({{a}} * {s}, dim={ax})",
            f"ops.softmax({{a}}, {ax})", f"{{a}}.sum({ax}, keepdims=True)"]


def gen(ins):
    """A program over the base inputs: list of (src line, kind); validated eagerly."""
    env = {f"x{i}": t for i, t in enumerate(ins)}
    names = list(env)
    lines = []
    nsteps = R.randint(3, 9)
    tries = 0
    while len(lines) < nsteps and tries < 200:
        tries += 1
        a = names[-1] if R.random() < 0.6 else R.choice(names)
        sh = tuple(env[a].shape)
        k = R.random()
        inplace = False
        if k < 0.3:
            cands = views_for(sh)
            if not cands:
                continue
            e = R.choice(cands).format(a=a)
        elif k < 0.5:
            e = R.choice(UN).format(a=a)
        elif k < 0.7:
            b = R.choice(names)
            e = R.choice(BIN).format(a=a, b=b)
        elif k < 0.85:
            if not sh:
                continue
            e = R.choice(softmaxes(sh)).format(a=a)
        else:
            inplace = True
            tgt = R.choice(names[len(ins):] or names)  # a base or a view made by the program
            e = R.choice([f"{tgt}.add_(1.0)", f"{tgt}.mul_(2.0)", f"{tgt}[0] = 7.0" if sh else f"{tgt}.add_(3.0)",
                          f"{tgt}.copy_(ops.ones_like({tgt}) * 4.0)"])
        ns = dict(env, ops=ops, mint=mint, ms=ms)
        try:
            if inplace:
                exec(e, ns)
            else:
                v = eval(e, ns)
                if not isinstance(v, ms.Tensor):
                    continue
                v.asnumpy()
        except Exception:  # noqa: BLE001
            continue
        # re-evaluate env after an in-place write (aliasing): re-run whole program to keep env exact
        if inplace:
            lines.append(e)
            env = run_lines(lines, ins, keep=True)
        else:
            nm = f"v{len(names)}"
            lines.append(f"{nm} = {e}")
            names.append(nm)
            env[nm] = v
    return lines, names


def run_lines(lines, ins, keep=False):
    ns = {f"x{i}": t for i, t in enumerate(ins)}
    ns.update(ops=ops, mint=mint, ms=ms)
    for ln in lines:
        exec(ln, ns)
    if keep:
        return {k: v for k, v in ns.items() if isinstance(v, ms.Tensor)}
    return ns


def make_fn(lines, names, nin):
    args = ", ".join(f"x{i}" for i in range(nin))
    body = "\n".join("    " + ln for ln in lines) or "    pass"
    src = f"def prog({args}):\n{body}\n    return [{', '.join(names)}]\n"
    ns = dict(ops=ops, mint=mint, ms=ms)
    exec(src, ns)
    return ns["prog"], src


def inputs(p, b, shapes, nan):
    out = []
    for i, sh in enumerate(shapes):
        sh = (b,) + tuple(sh[1:])
        rng = np.random.default_rng(p * 100 + b * 7 + i)
        a = rng.standard_normal(sh).astype(np.float32)
        if nan and a.size and rng.random() < 0.3:
            a.reshape(-1)[rng.integers(a.size)] = np.nan
        if a.size and rng.random() < 0.15:
            a.reshape(-1)[rng.integers(a.size)] = [1e30, -1e30, 3e37, np.inf][int(rng.integers(4))]
        out.append(ms.Tensor(a))
    return out


def ev(fn, ins):
    try:
        outs = fn(*ins)
        return [(o.asnumpy().copy(), str(o.dtype).lower()) for o in outs]
    except Exception as e:  # noqa: BLE001
        return e


bad = 0
checked = 0
for p in range(A.n):
    nin = R.randint(1, 2)
    rank = R.choice([1, 2, 2, 3])
    base_shape = tuple(R.choice([1, 1, 3, 4, 8]) for _ in range(rank))
    shapes = [base_shape]
    if nin == 2:
        shapes.append(tuple(s if R.random() < 0.7 else 1 for s in base_shape))
    b0 = base_shape[0]
    alts = [b0] + R.sample([1, 2, 5, 0] if b0 != 1 or True else [1], 2)
    if shapes[-1][0] == 1 and len(shapes) == 2:
        shapes[1] = (b0,) + shapes[1][1:]
    ins0 = inputs(p, b0, shapes, A.nan)
    lines, names = gen(ins0)
    if ONLY is not None and p not in ONLY:
        continue
    fn, src = make_fn(lines, names, nin)
    if A.src:
        print(f"--- program {p}\n{src}", flush=True)
    variants = {b: inputs(p, b, shapes, A.nan) for b in alts}
    refs = {}
    det = True
    for b, ins in variants.items():
        r1 = ev(fn, [ms.Tensor(t.asnumpy()) for t in ins])
        r2 = ev(fn, [ms.Tensor(t.asnumpy()) for t in ins])
        if compare(r1, r2) is not None:
            det = False
        refs[b] = r1
    if not det:
        print(f"[{p}] eager nondeterministic, skipped", flush=True)
        continue
    modes = ["thr", "loop"] if A.mode == "both" else [A.mode]
    for mode in modes:
        st0 = ms_dynvm.stats()
        if mode == "thr":
            ms_dynvm.enable(compile_policy="threshold", compile_threshold=1, compile_async=False)
            order = [alts[0]] * 4 + [alts[1]] * 2 + [alts[2]] * 2 + [alts[0]]
        else:
            ms_dynvm.enable(compile_async=False)
            order = [alts[i % 3] if i % 7 == 6 else alts[0] for i in range(40)]
        try:
            for i, b in enumerate(order):
                got = ev(fn, [ms.Tensor(t.asnumpy()) for t in variants[b]])
                checked += 1
                m = compare(refs[b], got)
                if m:
                    bad += 1
                    print("INPUTS", [t.asnumpy().ravel()[:40].tolist() for t in variants[b]]); print(f"MISMATCH seed {A.seed} prog {p} mode {mode} call {i} b={b}: {m}\n{src}", flush=True)
                    break
        finally:
            st1 = ms_dynvm.stats()
            ms_dynvm.disable()
        re0, re1 = st0.get("record_errors", {}), st1.get("record_errors", {})
        if re1 != re0:
            print(f"RECORD ERRORS seed {A.seed} prog {p} mode {mode}: {re0} -> {re1}\n{src}", flush=True)
        fb = {k: v for k, v in st1.get("fallbacks", {}).items() if "error" in k.lower()}
        if fb:
            pass
print(f"done seed {A.seed}: {A.n} programs, {checked} checked calls, mismatches {bad}; fused ops {ms_dynvm.stats().get('fused_ops')}; step_calls {ms_dynvm.stats().get('step_calls')} flips {ms_dynvm.stats().get('step_flips')} bare {ms_dynvm.stats().get('steps_bare')}; fallbacks {ms_dynvm.stats().get('fallbacks')}", flush=True)
