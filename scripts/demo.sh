#!/usr/bin/env bash
# Installs what is needed (scripts/setup.sh), then runs a small MindSpore training loop with batch size
# and sequence length changing every step under ms_dynvm, and prints what ms_dynvm saw and did.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
exec "$PY" scripts/demo.py "$@"
