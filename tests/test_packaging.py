"""Installed, the wheel puts nothing at the top of site-packages but `postmortem`; where no C
compiler is, it installs without its C part (parsers/_lines.c) and analyzes a job the same."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _wheel(out: Path, source: Path = ROOT, **env: str) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        check=True, capture_output=True, timeout=300, env={**os.environ, **env},
    )
    (wheel,) = out.glob("postmortem-*.whl")
    return wheel


_EXTENSION = "postmortem/parsers/_lines" + sysconfig.get_config_var("EXT_SUFFIX")


def test_wheel_holds_only_the_postmortem_package_with_parsers_and_signature_files(tmp_path):
    names = zipfile.ZipFile(_wheel(tmp_path)).namelist()
    assert _EXTENSION in names  # (built: this machine has a compiler)
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"postmortem"}
    assert "postmortem/schema/report-1.json" in names
    modules = {f"postmortem/{p.relative_to(ROOT / 'postmortem').as_posix()}" for p in (ROOT / "postmortem").rglob("*.py")}
    modules |= {f"postmortem/parsers/{p.name}" for p in (ROOT / "parsers").glob("*.py")}
    assert modules <= set(names), sorted(modules - set(names))  # every subpackage ships (checks/, replay/)
    signature_files = {Path(n).name for n in names if n.startswith("postmortem/signatures/") and n.endswith(".toml")}
    assert signature_files == {p.name for p in (ROOT / "signatures").glob("*.toml")}


def test_without_a_compiler_the_wheel_has_no_c_part_and_analyzes_a_job_the_same(tmp_path):
    """The C part is optional: a build whose compiler fails leaves it out, and lines.py and
    textlog.py split and take headers apart with Polars alone, to the same report."""
    source = tmp_path / "source"  # (what the build reads, and no extension built before it)
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("postmortem", "parsers", "signatures"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    wheel = _wheel(tmp_path / "wheel", source, CC="false", LDSHARED="false")
    assert _EXTENSION not in zipfile.ZipFile(wheel).namelist()
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    report = ("import json, sys; from postmortem import api, parsers; from postmortem.parsers import lines; "
              "r = api.analyze(sys.argv[1]); print(json.dumps([lines._split_c is None, parsers.__file__, "
              "[(f['signature'], f['ranks']) for f in r['findings']]]))")
    # (the checkout's editable install finds the modules the wheel lacks in the checkout: left out,
    # as on a machine where only the wheel is installed)
    wheel_only = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]; "
    job = str(ROOT / "sample_logs" / "hang_dataloader_nccl")
    without = json.loads(subprocess.run([sys.executable, "-c", wheel_only + report, job], check=True, capture_output=True,
                                        text=True, timeout=300, cwd=tmp_path,
                                        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}).stdout)
    assert without[0] is True and without[1].startswith(str(tmp_path / "site"))
    with_c = json.loads(subprocess.run([sys.executable, "-c", report, job], check=True, capture_output=True, text=True,
                                       timeout=300, cwd=tmp_path).stdout)
    assert with_c[0] is False
    assert without[2] == with_c[2] and without[2]
