"""The vectorised float32 erf of region plans (`ms_dynvm/jit/libm.py`) against the C library's
erff over all 2^32 float32 bit patterns (both signs, NaNs compared as NaN); prints the number that
differ (0 is the claim). About 2 minutes on one core.

    python profiling/tools/check_erf.py [--step 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step", type=int, default=1, help="check every step-th bit pattern")
    a = ap.parse_args()
    from ms_dynvm.jit import libm

    t0 = time.perf_counter()
    bad = libm.check(a.step)
    print(f"{platform.processor() or platform.machine()}, libc {' '.join(platform.libc_ver())}: "
          f"{(1 << 32) // a.step} bit patterns, {bad} differ ({time.perf_counter() - t0:.0f} s)")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
