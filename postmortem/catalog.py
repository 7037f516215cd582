"""Signature files: loading and checking the TOML definitions in ``signatures/``.

A signature is data: metadata, ``limits`` (what a match does not establish), DuckDB SQL
evidence queries over the run's tables, and summary/remediation templates. The built-in
ones ship inside the package; ``--signatures DIR`` adds a user's own. A file that does not
load is reported with its reason and skipped, never fatal.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .errors import PostmortemError

SEVERITIES = ("info", "warning", "error", "critical")
# The signature ids of the JSON contract (DESIGN.md); more are welcome.
CONTRACT_IDS = (
    "collective-hang", "collective-mismatch", "collective-timeout", "rank-crash", "recompile-storm",
    "recompile-limit", "rank-divergent-compile", "graph-break", "memory-leak", "cuda-oom", "straggler",
    "ddp-unused-parameters", "nccl-error", "hardware-fault", "native-crash", "cuda-device-assert",
    "compile-failure", "checkpoint-key-mismatch", "non-finite-loss", "timeout-misconfigured",
)
ROLES = ("root_cause", "symptom", "context")
REQUIRED = ("id", "title", "severity", "role", "description")


@dataclass
class Signature:
    id: str
    title: str
    severity: str
    role: str
    description: str
    origin: str  # "built-in" or the user's file path
    queries: list[str] = field(default_factory=list)
    check: str | None = None
    summary: str = ""
    # one text, or texts by case: {"sigkill": "...", "default": "..."} picked by the
    # first evidence row's `case` column
    remediation: str | dict[str, str] = ""
    limits: str = ""
    confidence: float = 0.7
    refines: list[str] = field(default_factory=list)  # more specific than these root causes
    explains: list[str] = field(default_factory=list)  # symptoms this root cause accounts for
    references: list[str] = field(default_factory=list)
    replay: str | None = None
    collect: list[str] = field(default_factory=list)  # evidence that would settle a verdict it cannot tell


def parse_signature(text: str, origin: str) -> Signature:
    """A Signature from a TOML document; raises ValueError saying what is wrong."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not valid TOML: {exc}") from exc
    missing = [k for k in REQUIRED if not isinstance(doc.get(k), str) or not doc[k].strip()]
    if missing:
        raise ValueError(f"missing or empty: {', '.join(missing)}")
    if doc["severity"] not in SEVERITIES:
        raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}")
    if doc["role"] not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    queries = doc.get("queries", [])
    if isinstance(queries, str):
        queries = [queries]
    if not all(isinstance(q, str) for q in queries) or not (queries or doc.get("check")):
        raise ValueError("needs `queries` (SQL strings) or a `check`")
    remediation = doc.get("remediation", "")
    if isinstance(remediation, dict):
        if not all(isinstance(v, str) for v in remediation.values()):
            raise ValueError("remediation cases must be strings")
    else:
        remediation = str(remediation)
    confidence = doc.get("confidence", 0.7)
    if not isinstance(confidence, (int, float)) or not 0 <= confidence <= 1:
        raise ValueError("confidence must be a number from 0 to 1")
    lists = {}
    for key in ("refines", "explains", "references", "collect"):
        value = doc.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key} must be a list of strings")
        lists[key] = value
    return Signature(
        id=doc["id"], title=doc["title"], severity=doc["severity"], role=doc["role"],
        description=doc["description"], origin=origin, queries=list(queries), check=doc.get("check"),
        summary=str(doc.get("summary", "")), remediation=remediation,
        limits=str(doc.get("limits", "")), references=lists["references"], replay=doc.get("replay"),
        confidence=float(confidence), refines=lists["refines"], explains=lists["explains"],
        collect=lists["collect"],
    )


def _builtin_files() -> list[tuple[str, str]]:
    root = resources.files("postmortem.signatures")
    # calibration.toml beside them is the fitted confidence table (calibration.py), not a signature
    return sorted((p.name, p.read_text(encoding="utf-8")) for p in root.iterdir()
                  if p.name.endswith(".toml") and p.name != "calibration.toml")


@functools.cache
def builtin() -> tuple[tuple[str, Signature | None, str | None], ...]:
    """Each built-in file: (its name, its signature, or None and why it did not load), parsed once a
    process (~10 ms of TOML, which the matching and then the report read). Callers must not change
    the signatures they get."""
    parsed = []
    for name, text in _builtin_files():
        try:
            parsed.append((name, parse_signature(text, "built-in"), None))
        except ValueError as exc:
            parsed.append((name, None, str(exc)))
    return tuple(parsed)


def load_all(extra: Path | None = None) -> tuple[list[Signature], list[tuple[str, str]]]:
    """(signatures that loaded, [(file, why it did not)]); a user's file overrides a built-in id."""
    loaded: dict[str, Signature] = {}
    broken: list[tuple[str, str]] = []
    for name, sig, why in builtin():
        if sig is None:
            broken.append((name, why))
        else:
            loaded[sig.id] = sig
    if extra is not None:
        if not extra.is_dir():
            raise PostmortemError(f"--signatures: {extra} is not a directory")
        for path in sorted(extra.glob("*.toml")):
            try:
                sig = parse_signature(path.read_text(encoding="utf-8", errors="replace"), str(path))
                loaded[sig.id] = sig
            except (ValueError, OSError) as exc:
                broken.append((str(path), str(exc)))
    return sorted(loaded.values(), key=lambda s: s.id), broken
