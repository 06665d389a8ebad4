import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Tier 1 compiles synchronously in the tests (a group is served from the call after it became hot);
# tests of background compiling pass compile_async=True themselves.
os.environ.setdefault("DYNVM_COMPILE_ASYNC", "0")
# The step switch (cost/step.py) decides by wall time; tests that count fused ops or compiles must
# not depend on it, so it is off unless a test turns it on (tests/*/test_step_switch.py).
os.environ.setdefault("DYNVM_STEP_SWITCH", "0")
# Tier 2 (region replay, frontend/regions.py) serves whole calls of grad functions and Cells from a
# NumPy/oneDNN plan: tests that count tier-1 fused ops or compare with eager bit for bit must not
# depend on it, so it is off unless a test turns it on (tests/frontend/test_regions.py).
os.environ.setdefault("DYNVM_REGIONS", "0")

from hypothesis import settings  # noqa: E402

# 2-core CI machine: keep hypothesis runs modest and deadline-free (MindSpore's first calls are slow).
settings.register_profile("ci", max_examples=40, deadline=None)
settings.load_profile("ci")
