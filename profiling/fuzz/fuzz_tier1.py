"""Differential fuzz of tier 1 against eager: random chains of elementwise ops, scalars, broadcasting,
softmax, sums, clamps, casts and masks over random sizes (0 and 1 included), dtypes (f32, f16, i32)
and some +inf inputs, each program run
eagerly, then three times under `ms_dynvm.enable(compile_policy="threshold")` (so groups compile and
are served), results compared (f32: 2e-4, f16: 2e-2, NaN positions must agree).

    python profiling/fuzz/fuzz_tier1.py SEED PROGRAMS [--nan]

With --nan one input element in five programs is NaN. MindSpore's own rules for softmax rows holding
NaN or +inf, which the VM follows, are in docs/numerics.md.
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# Kernels compile synchronously here (inside the call that makes a group hot), so that the
# warm-up ends with every kernel in place; ms_dynvm's default compiles in the background.
os.environ.setdefault("DYNVM_COMPILE_ASYNC", "0")
import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import ops
import ms_dynvm
ms.runtime.launch_blocking()
R=random.Random(int(sys.argv[1]) if len(sys.argv)>1 else 0)
UN=[lambda t: ops.cast(t, ms.float32) * 1.5, lambda t: (t > 0.5).astype(t.dtype) * t, ops.exp, ops.tanh, ops.relu, ops.sigmoid, ops.neg, ops.abs, lambda t: t*t, lambda t: ops.softmax(t,-1), lambda t: t.sum(-1, keepdims=True), lambda t: ops.clamp(t,-1.0,1.0)]
BIN=[lambda a,b: a / (ops.abs(b) + 1.0), lambda a,b: ops.minimum(a, b) * 2, lambda a,b: a+b, lambda a,b: a*b, lambda a,b: a-b, ops.maximum, lambda a,b: ops.where(a>b, a, b)]
SC=[lambda a: a*0.5, lambda a: a-1.0, lambda a: 2.0-a, lambda a: a/3.0, lambda a: a+0.75]
def make_prog():
    steps=[]
    for _ in range(R.randint(2,8)):
        k=R.random()
        if k<0.4: steps.append(("u",R.randrange(len(UN))))
        elif k<0.7: steps.append(("b",R.randrange(len(BIN)), R.random()<0.3))
        else: steps.append(("s",R.randrange(len(SC))))
    return steps
def run(steps, x, y, scal):
    h=x
    for st in steps:
        if st[0]=="u": h=UN[st[1]](h)
        elif st[0]=="b": h=BIN[st[1]](h, y if not st[2] else y[:, :1] if False else y)
        else: h=SC[st[1]](h)
    return h
bad=0
NAN = '--nan' in sys.argv
sys.argv = [a for a in sys.argv if a != '--nan']
ONLY=set(int(v) for v in sys.argv[3].split(',')) if len(sys.argv)>3 else None
for p in range(int(sys.argv[2]) if len(sys.argv)>2 else 30):
    steps=make_prog(); dt=R.choice([np.float32, np.float32, np.float16, np.int32])
    cols=R.choice([1,3,16,33])
    sizes=[R.choice([0,1,2,5,8,13]) for _ in range(6)]
    ins=[]
    for b in sizes:
        x=(np.random.default_rng(p*10+b).standard_normal((b,cols)) * (3 if dt == np.int32 else 1)).astype(dt)
        if R.random()<0.2 and x.size and NAN and dt != np.int32: x.reshape(-1)[0]=np.nan
        if R.random()<0.1 and x.size and dt != np.int32: x.reshape(-1)[-1]=np.inf
        yv=(3 if dt == np.int32 else 1) * np.random.default_rng(p*10+b+1).standard_normal((b,cols) if R.random()<0.7 else (1,cols)).astype(dt)
        yv = yv.astype(dt)
        ins.append((x,yv))
    if ONLY is not None and p not in ONLY: continue
    refs=[]
    for x,yv in ins:
        try: refs.append(run(steps, ms.Tensor(x), ms.Tensor(yv), None).asnumpy())
        except Exception as e: refs.append(e)
    ms_dynvm.enable(compile_policy="threshold")
    try:
        for rep in range(3):
            for (x,yv),ref in zip(ins,refs):
                try: got=run(steps, ms.Tensor(x), ms.Tensor(yv), None).asnumpy()
                except Exception as e: got=e
                if isinstance(ref,Exception) or isinstance(got,Exception):
                    if type(ref)!=type(got): bad+=1; print("EXC MISMATCH", p, steps, ref, got)
                    continue
                tol=2e-2 if dt==np.float16 or got.dtype==np.float16 else 2e-4
                if ref.shape!=got.shape or not np.allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol, equal_nan=True):
                    bad+=1; print("MISMATCH", p, steps, dt, x.shape, yv.shape, np.nanmax(np.abs(got.astype(np.float64)-ref)) if ref.shape==got.shape else (ref.shape,got.shape)); break
    finally:
        st=ms_dynvm.stats(); ms_dynvm.disable()
    if st["record_errors"]: print("RECORD ERRORS", p, st["record_errors"])
    err=[k for k in st["fallbacks"] if "error" in k]
    if err: print("FALLBACK ERRORS", p, {k:st["fallbacks"][k] for k in err})
print("mismatches", bad, "fused ops in the last program", ms_dynvm.stats()["fused_ops"])
sys.exit(1 if bad else 0)
