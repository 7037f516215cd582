"""Confidence that means something: each finding's confidence is the fraction of times a
verdict of its signature, made from the same kind of evidence, was right on scenarios whose
answer is known (our samples and the real-world corpus), not a number a check's author chose.

The table lives in ``signatures/calibration.toml``, written by
``postmortem eval sample_logs/ tests/realworld/ --fit-confidence signatures/calibration.toml``:

    [[fit]]
    signature = "collective-timeout"
    evidence = "text_log"
    right = 9
    seen = 13

A finding's *evidence kind* is the strongest kind of file its evidence rows come from
(a flight-recorder dump says more than a py-spy stack, which says more than a line of text),
and whether any of them names a rank ("text_log, no rank": a pasted excerpt's lines).
The fitted confidence is a Beta-smoothed fraction: the signature's own rate (Laplace:
(right + 1) / (seen + 2)) is the prior of each of its evidence kinds, worth PRIOR_WEIGHT
scenarios. A signature no scenario has judged keeps its check's own figure.

A verdict under CANNOT_TELL is not a guess worth acting on: the report says "cannot tell"
and what to collect next (the signature's ``collect`` list) instead.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# Strongest first: what a finding's evidence is called is the first of these its files hold.
EVIDENCE_ORDER = ("flight_recorder", "pyspy", "memory_snapshot", "torch_trace", "kineto_trace", "error_file",
                  "text_log")
PRIOR_WEIGHT = 2.0
CANNOT_TELL = 0.5
BUCKETS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.01))


@dataclass(frozen=True)
class Outcome:
    """One scenario's verdict: its signature, evidence kind, and whether it was right."""

    scenario: str
    signature: str
    evidence: str
    right: bool


def evidence_kind(files: Iterable[str | None], kind_of: dict[str, str], ranked: bool = True) -> str:
    """The strongest kind among the files a finding's evidence names ("text_log" if none is known),
    marked ", no rank" when no evidence row names a rank (an excerpt's unattributed lines)."""
    kinds = {kind_of.get(f) for f in files if f}
    kind = next((k for k in EVIDENCE_ORDER if k in kinds), None) or min((k for k in kinds if k), default="text_log")
    return kind if ranked else f"{kind}, no rank"


def load(path: Path | None = None) -> dict[tuple[str, str], tuple[int, int]]:
    """{(signature, evidence kind): (right, seen)} from the fitted table."""
    text = (Path(path).read_text(encoding="utf-8") if path
            else resources.files("postmortem.signatures").joinpath("calibration.toml").read_text(encoding="utf-8"))
    return {(f["signature"], f["evidence"]): (int(f["right"]), int(f["seen"])) for f in tomllib.loads(text)["fit"]}


def fitted(table: dict[tuple[str, str], tuple[int, int]], signature: str, evidence: str,
           fallback: float) -> float:
    """The smoothed fraction right for (signature, evidence kind); ``fallback`` if never judged."""
    right_s = sum(r for (s, _), (r, _n) in table.items() if s == signature)
    seen_s = sum(n for (s, _), (_r, n) in table.items() if s == signature)
    if not seen_s:
        return fallback
    prior = (right_s + 1) / (seen_s + 2)
    right, seen = table.get((signature, evidence), (0, 0))
    return (right + PRIOR_WEIGHT * prior) / (seen + PRIOR_WEIGHT)


def tally(outcomes: Iterable[Outcome]) -> dict[tuple[str, str], tuple[int, int]]:
    table: dict[tuple[str, str], tuple[int, int]] = {}
    for o in outcomes:
        right, seen = table.get((o.signature, o.evidence), (0, 0))
        table[(o.signature, o.evidence)] = (right + o.right, seen + 1)
    return table


def to_toml(table: dict[tuple[str, str], tuple[int, int]], corpus: list[str]) -> str:
    # a scenario folder given by itself is named by the corpus folder holding it
    roots = sorted({str(Path(d).parent) if (Path(d) / "expected.json").is_file() else str(d) for d in corpus})
    lines = ["# Fitted by `postmortem eval " + " ".join(roots) + " --fit-confidence <this file>`:",
             "# per signature and evidence kind, how many verdicts were right of those seen. Do not edit by hand.",
             ""]
    for (signature, evidence), (right, seen) in sorted(table.items()):
        lines += ["[[fit]]", f'signature = "{signature}"', f'evidence = "{evidence}"', f"right = {right}",
                  f"seen = {seen}", ""]
    return "\n".join(lines)


def leave_one_out(outcomes: list[Outcome], fallback: dict[str, float]) -> list[tuple[float, bool]]:
    """(confidence fitted without the scenario, whether its verdict was right) for each outcome:
    the honest test of a fit is on scenarios it did not see."""
    full = tally(outcomes)
    out = []
    for o in outcomes:
        table = dict(full)
        right, seen = table[(o.signature, o.evidence)]
        table[(o.signature, o.evidence)] = (right - o.right, seen - 1)
        out.append((fitted(table, o.signature, o.evidence, fallback.get(o.signature, 0.7)), o.right))
    return out


def reliability(pairs: list[tuple[float, bool]]) -> list[dict]:
    """Per confidence bucket: how many verdicts, and the fraction of them right."""
    rows = []
    for low, high in BUCKETS:
        inside = [right for conf, right in pairs if low <= conf < high]
        rows.append({"bucket": f"{low:.0%}-{min(high, 1):.0%}", "verdicts": len(inside),
                     "right": sum(inside), "fraction_right": round(sum(inside) / len(inside), 2) if inside else None,
                     "mean_confidence": round(sum(c for c, _ in pairs if low <= c < high) / len(inside), 2)
                     if inside else None})
    return rows
