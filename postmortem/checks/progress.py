"""Work a rank was doing, told by its progress bar rather than its stack: tqdm's elapsed time
and item count (parsers/progress.py) show a process that kept working while its peers waited.

A bar is taken as the late rank's only when it can be no one else's: the file or prefix names
that rank, or the bar names none and exactly one rank is late (every other rank of the job is
waiting in the collective, so none of them was drawing it). It proves work, not a hang, only
when it moved (items done) and ran for most of the timeout (an elapsed time of at least ``SPAN``
of it), or, where the logs state no timeout, was still being drawn when a waiting rank failed.
"""

from __future__ import annotations

import duckdb

SPAN = 0.9


def busy_by_progress(con: duckdb.DuckDBPyConnection, run_id: str, late: set[int],
                     timeout_ms: int | None, failed_at: list[tuple[str, int]]) -> dict[int, tuple[str, str]]:
    """{late rank: (what it was doing, where)} from progress bars that ran for most of the timeout,
    or, where no timeout is stated, that were still being drawn when a waiting rank failed: the
    bar shares its terminal line with the start of that rank's error (``failed_at``: file, line)."""
    if not late:
        return {}
    rows = con.execute(
        """
        SELECT rank, attrs->>'desc', CAST(attrs->>'elapsed_s' AS DOUBLE), CAST(attrs->>'n' AS DOUBLE),
               attrs->>'total', attrs->>'unit', file, line_no
        FROM events WHERE run_id = ? AND kind = 'progress' AND CAST(attrs->>'n' AS DOUBLE) > 0
        ORDER BY CAST(attrs->>'elapsed_s' AS DOUBLE) DESC
        """, [run_id]).fetchall()
    at_failure = set(failed_at)
    busy: dict[int, tuple[str, str]] = {}
    for rank, desc, elapsed, done, total, unit, file, line in rows:
        if not (elapsed >= SPAN * timeout_ms / 1000 if timeout_ms else (file, line) in at_failure):
            continue
        owner = rank if rank in late else (next(iter(late)) if rank is None and len(late) == 1 else None)
        if owner is None or owner in busy:
            continue
        minutes, seconds = divmod(int(elapsed), 60)
        items = f"{done:.0f}/{float(total):.0f} {unit.split('/')[0] if unit else 'items'}"
        busy[owner] = (f"in '{desc}' ({items} after {minutes}:{seconds:02d}, its progress bar)", f"{file}:{line}")
    return busy
