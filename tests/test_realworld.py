"""The real-world corpus (tests/realworld/): logs re-rendered from public threads, each with the
verdict its thread establishes. Every case is analyzed as a user would (`postmortem eval`,
strict); a case that is right must stay right, and the few the analyzer still gets wrong are
listed in KNOWN_MISSES.txt with why, so a case that starts passing (or a new miss) fails here
until the list says so."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from postmortem import catalog

from .conftest import evaluated

CORPUS = Path(__file__).resolve().parent / "realworld"
CASES = sorted(p.parent.name for p in CORPUS.glob("*/expected.json"))


def known_misses() -> dict[str, str]:
    out = {}
    for line in (CORPUS / "KNOWN_MISSES.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            case, _, why = line.partition(" ")
            out[case] = why.strip()
    return out


MISSES = known_misses()


def test_every_case_names_its_public_source_and_a_known_signature():
    ids = {s.id for s in catalog.load_all()[0]}
    for case in CASES:
        expected = json.loads((CORPUS / case / "expected.json").read_text())
        assert expected["scenario"] == case
        assert re.match(r"https://(github\.com|discuss\.pytorch\.org|[\w.-]+)/\S+", expected["source"]), case
        assert expected["root_cause"] is None or expected["root_cause"] in ids, case
        assert expected.get("rerendered"), case  # what identifiers were changed, said per case
        assert [p for p in (CORPUS / case).iterdir() if p.name != "expected.json"], case
    assert set(MISSES) <= set(CASES), "KNOWN_MISSES.txt names a case that is gone"
    table = (CORPUS / "README.md").read_text()
    assert all(f"`{case}`" in table for case in CASES), "python tests/realworld/table.py rewrites the table"


@pytest.mark.parametrize("case", CASES)
def test_the_verdict_on_a_real_world_case_is_what_its_thread_establishes(case):
    row = evaluated(CORPUS / case)
    if case in MISSES:
        assert not row["ok"], f"{case} is right now: take it off KNOWN_MISSES.txt"
    else:
        assert row["ok"], row
