import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hypothesis import settings  # noqa: E402

# 2-core CI machine: keep hypothesis runs modest and deadline-free (MindSpore's first calls are slow).
settings.register_profile("ci", max_examples=40, deadline=None)
settings.load_profile("ci")
