"""The user's documents stay what they promise: the README is short, its options table is the one
generated from ms_dynvm/frontend/options.py, its links resolve, and no file numbers past rounds of
work (history lives in the git log and CHANGELOG.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import options_table  # noqa: E402


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


def test_readme_is_short_and_its_options_table_is_generated():
    text = _read("README.md")
    assert len(text.splitlines()) <= 300
    assert options_table.rendered(text) == text, "run python scripts/options_table.py"
    # every option of the dataclass is in the table
    from ms_dynvm.frontend.options import Options
    rows = {line.split("|")[1].strip() for line in options_table.table().splitlines()[2:]}
    assert rows == set(Options.__dataclass_fields__)


def test_readme_shows_both_setup_commands_and_its_local_links_exist():
    text = _read("README.md")
    assert "scripts/demo.sh" in text and "scripts/test.sh" in text
    for doc in ("README.md", "docs/architecture.md", "docs/numerics.md", "docs/measurements.md",
                "profiling/README.md"):
        base = os.path.dirname(os.path.join(ROOT, doc))
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _read(doc)):
            if "://" in target or target == "docs/gpu.md":  # gpu.md comes with the GPU backend
                continue
            assert os.path.exists(os.path.join(base, target)), f"{doc}: broken link {target}"


def test_no_file_numbers_past_rounds_of_work():
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        import pytest
        pytest.skip("not a git checkout")
    pattern = re.compile(r"\b[Ss]ession[s]? [0-9]+|\b[Ss]ession-[0-9]+")
    hits = []
    for rel in files:
        path = os.path.join(ROOT, rel)
        if rel == "tests/test_docs.py" or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if pattern.search(line):
                        hits.append(f"{rel}:{n}: {line.strip()[:80]}")
        except UnicodeDecodeError:
            continue
    assert not hits, "\n".join(hits)
