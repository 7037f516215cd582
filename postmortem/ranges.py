"""Rank sets as people read them: "0, 2-4, 7" (a 512-rank job's list stays one short line).

Used wherever ranks are written for a person: the signatures' templates (engine), the checks'
summaries, the terminal and HTML reports, replay, watch and the multi-node job.
"""

from __future__ import annotations


def rank_ranges(ranks: list[int]) -> str:
    """[0, 2, 3, 4, 7] -> "0, 2-4, 7": a 512-rank job's rank list must stay readable."""
    spans: list[list[int]] = []
    for r in sorted(set(ranks)):
        if spans and spans[-1][1] == r - 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in spans)
