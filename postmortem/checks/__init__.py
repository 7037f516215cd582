"""Named Python checks for what a signature's SQL can't say.

A check is ``check(con, run_id) -> list[dict]``: evidence rows (rank, ts, file, line, text,
plus columns the signature's templates use). Checks read tables; they don't render.
"""
