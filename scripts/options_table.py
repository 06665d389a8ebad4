"""The options table of README.md, generated from the one source: the docstring of
ms_dynvm/frontend/options.py. `python scripts/options_table.py` rewrites the table between the
README's `<!-- options:begin -->` and `<!-- options:end -->` markers; `--check` only says whether it
is current (exit status 1 if not; tests/test_docs.py runs the same check)."""

from __future__ import annotations

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "ms_dynvm", "frontend", "options.py")
README = os.path.join(ROOT, "README.md")
BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"


def table() -> str:
    """The markdown table of options.py's docstring (its lines that start with '|')."""
    with open(SOURCE) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    return "\n".join(line for line in doc.splitlines() if line.startswith("|"))


def rendered(readme: str) -> str:
    """`readme` with the table between the markers replaced by the current one."""
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    with open(README) as f:
        text = f.read()
    new = rendered(text)
    if "--check" in sys.argv[1:]:
        if new != text:
            print("README.md's options table is stale: run python scripts/options_table.py")
            return 1
        return 0
    if new != text:
        with open(README, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
