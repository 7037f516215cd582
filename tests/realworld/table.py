"""Rewrite the case table of tests/realworld/README.md from every case's expected.json.

    python tests/realworld/table.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "<!-- cases: written by tests/realworld/table.py -->"


def rows() -> list[str]:
    out = ["| case | source | project | framework | torch | root cause (culprits) |",
           "| --- | --- | --- | --- | --- | --- |"]
    for path in sorted(HERE.glob("*/expected.json")):
        e = json.loads(path.read_text())
        label = e["root_cause"] or "none (benign)"
        if e.get("culprit_ranks"):
            label += f" ({', '.join(map(str, e['culprit_ranks']))})"
        cells = [f"`{e['scenario']}`", e["source"], e.get("project") or "", e.get("framework") or "",
                 e.get("torch") or "", label]
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return out


def main() -> None:
    readme = HERE / "README.md"
    head = readme.read_text().split(MARK)[0]
    readme.write_text(head + MARK + "\n\n" + "\n".join(rows()) + "\n")


if __name__ == "__main__":
    main()
