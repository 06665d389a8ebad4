#!/usr/bin/env bash
# Installs what ms_dynvm needs into the current Python (3.11): MindSpore 2.10 (an ~800 MB wheel,
# downloaded only when it is not installed yet), NumPy < 2 (MindSpore 2.10 fails under NumPy 2),
# the test tools, and ms_dynvm itself in editable mode. Safe to run again: what is there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" - <<'PYEOF' || { echo "ms_dynvm needs Python >= 3.11"; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYEOF
need=()
"$PY" -c "import mindspore, sys; sys.exit(0 if mindspore.__version__ == '2.10.0' else 1)" 2>/dev/null \
    || need+=("mindspore==2.10.0")
"$PY" -c "import numpy, sys; sys.exit(0 if numpy.__version__.startswith('1.') else 1)" 2>/dev/null \
    || need+=("numpy>=1.26,<2")
"$PY" -c "import pytest, hypothesis" 2>/dev/null || need+=("pytest" "hypothesis")
"$PY" -c "import matplotlib" 2>/dev/null || need+=("matplotlib")  # ms_dynvm.report()'s plots
if [ ${#need[@]} -gt 0 ]; then
    echo "[setup] installing: ${need[*]}"
    "$PY" -m pip install -q --disable-pip-version-check "${need[@]}" "numpy>=1.26,<2"
fi
# Headless Chromium for the report test's page check (Debian's package; skipped with its reason where
# it cannot be installed). Tried only as root with apt-get; DYNVM_SETUP_CHROMIUM=0 skips it.
if ! command -v chromium >/dev/null 2>&1 && [ "${DYNVM_SETUP_CHROMIUM:-1}" != 0 ] \
        && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing chromium (apt-get) for the report test"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
        || echo "[setup] chromium could not be installed: the report's browser check will be skipped"
fi
# ms_dynvm itself, editable, pointing at this checkout (checked from / so that the checkout's own
# directory on sys.path does not answer for it).
here=$PWD
installed=$(cd / && "$PY" -c 'import ms_dynvm, os; print(os.path.dirname(os.path.dirname(ms_dynvm.__file__)))' 2>/dev/null || true)
if [ "$installed" != "$here" ]; then
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . 2>&1 \
        | grep -v "Running pip as the 'root' user" || true
fi
echo "[setup] ok: $("$PY" -c 'import mindspore, numpy; print("mindspore", mindspore.__version__, "numpy", numpy.__version__)' 2>/dev/null | tail -1)"
