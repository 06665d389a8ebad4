#!/usr/bin/env bash
# The test command: installs what is needed (scripts/setup.sh), then runs the CPU test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
exec "$PY" -m pytest -q -p no:cacheprovider tests "$@"
