#!/usr/bin/env bash
# On the GPU machine (../shared/device/DEVICE.md): install the carried wheels (.whl/: pycuda and its
# needs, hypothesis), run the GPU tests and the GPU benchmark, and write JSON results under
# ${OUT:-gpu_results}/ (pytest's junit XML and summary, the benchmark, the math accuracy table).
# Run from the repository root: bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_results}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:$PWD/.site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export DVM_RESULTS=$OUT DYNVM_CACHE_DIR=$(mktemp -d)/cache
python3 -c "import pycuda._driver" 2>/dev/null || export LD_PRELOAD=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/device.txt" 2>&1
python3 -m pytest -q -p no:cacheprovider tests/gpu --junitxml="$OUT/gpu_tests.xml" -q 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"
test_rc=${PIPESTATUS[0]}
python3 profiling/bench/bench_cuda.py --out "$OUT/bench_cuda.json" > "$OUT/bench_stdout.txt" 2>&1
bench_rc=$?
tail -5 "$OUT/bench_stdout.txt"
python3 - "$OUT" "$test_rc" "$bench_rc" <<'PY'
import json, sys, xml.etree.ElementTree as ET
out, trc, brc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = {"tests_rc": trc, "bench_rc": brc}
try:
    s = ET.parse(f"{out}/gpu_tests.xml").getroot()
    s = s if s.tag == "testsuite" else s[0]
    r["tests"] = {k: int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
except Exception as e:
    r["tests"] = str(e)
json.dump(r, open(f"{out}/gpu_check.json", "w"), indent=1)
print(json.dumps(r))
PY
exit $test_rc
