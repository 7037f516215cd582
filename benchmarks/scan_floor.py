"""The scan floor: the block scan postmortem runs before parsing (parsers/scan.py: Hyperscan, every
line parser's triggers) over files, alone, in blocks as the text parser reads them.

    python benchmarks/scan_floor.py FILES.lst      # NUL-separated paths, as benchmarks/run.py writes them

benchmarks/run.py times it beside `cat` of the same files: what reading and scanning every byte
costs, below which no parse of these files can go.
"""

from __future__ import annotations

import sys
from pathlib import Path

from postmortem.parsers import lines, textlog  # noqa: F401  (textlog declares the parsers' triggers)
from postmortem.parsers.scan import block_scanner


def scan_files(paths: list[Path]) -> int:
    """Scan every file in blocks of ``lines.CHUNK_BYTES``; how many triggers were found, in all."""
    scanner = block_scanner()
    found = 0
    for path in paths:
        with open(path, "rb") as fh:
            while block := fh.read(lines.CHUNK_BYTES):
                found += len(scanner.present(block) or ())
    return found


def main() -> None:
    paths = [Path(p) for p in Path(sys.argv[1]).read_text().split("\0") if p]
    print(scan_files(paths))


if __name__ == "__main__":
    main()
