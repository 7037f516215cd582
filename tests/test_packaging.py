"""Installed, the wheel puts nothing at the top of site-packages but `postmortem`."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_holds_only_the_postmortem_package_with_parsers_and_signature_files(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("postmortem-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"postmortem"}
    assert "postmortem/schema/report-1.json" in names
    modules = {f"postmortem/{p.relative_to(ROOT / 'postmortem').as_posix()}" for p in (ROOT / "postmortem").rglob("*.py")}
    modules |= {f"postmortem/parsers/{p.name}" for p in (ROOT / "parsers").glob("*.py")}
    assert modules <= set(names), sorted(modules - set(names))  # every subpackage ships (checks/, replay/)
    signature_files = {Path(n).name for n in names if n.startswith("postmortem/signatures/") and n.endswith(".toml")}
    assert signature_files == {p.name for p in (ROOT / "signatures").glob("*.toml")}
