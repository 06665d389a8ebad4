"""Tier 1's tier-up phase, whole: 150 calls of an LN+GELU block with sizes drawn per call under
`ms_dynvm.enable(regions=False, step_switch=False)` with an empty kernel cache, so its groups are
compiled while the calls run (the background compile thread). Reports the whole run, its first 50
calls (where the compiles happen) and the last 100, per round, each round a fresh process with a
fresh cache directory.

    python profiling/bench/bench_tierup.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, mindspore as ms
from mindspore import nn, ops
import ms_dynvm
ms.runtime.launch_blocking()

class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm((128,))
    def construct(self, x):
        return ops.gelu(self.ln(x) * 1.5 + 0.5) * 2.0 - x

net = Block()
net.set_train(False)
rng = np.random.default_rng(0)
xs = [ms.Tensor(rng.standard_normal((int(rng.choice([2, 4, 8])), int(rng.choice([16, 32, 64])), 128))
                .astype(np.float32)) for _ in range(150)]
ms_dynvm.enable(regions=False, step_switch=False)
ts = []
for x in xs:
    t0 = time.perf_counter()
    net(x).asnumpy()
    ts.append(time.perf_counter() - t0)
st = ms_dynvm.stats()
print(sum(ts), sum(ts[:50]), sum(ts[50:]), st["compiles"])
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows = []
    for _ in range(a.rounds):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, DYNVM_CACHE_DIR=d)
            out = subprocess.run([sys.executable, "-c", _CHILD, ROOT], env=env, capture_output=True, text=True,
                                 check=True).stdout.split()
            rows.append(tuple(float(v) for v in out[-4:]))
    for whole, first, rest, compiles in rows:
        print(f"whole {whole:.3f} s, first 50 calls {first:.3f} s, last 100 {rest:.3f} s, gcc runs {int(compiles)}")
    print(f"median whole {statistics.median(r[0] for r in rows):.3f} s, "
          f"first 50 {statistics.median(r[1] for r in rows):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
