"""Which files a log directory holds, what each one is, and which rank it speaks for.

Files are classified by content (the parsers' sniffers over the first 64 KiB, gunzipped
when gzip), not by name. A file's rank comes from, in order: the single ``[rankN]:`` prefix
its lines carry; torchrun's ``attempt_N/<local_rank>/`` layout; its name (``rank3.log``,
``nccl_trace_rank_3``, ``*_rank_3_*``). torchrun's console holds every rank's lines under
``[defaultN]:`` prefixes: it gets no rank, and its lines are split by prefix when parsed.

Nothing here raises for a bad file: it is recorded with the reason it was skipped.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from postmortem.parsers import BY_KIND, FILE_PARSERS, flight_recorder, memory_snapshot
from postmortem.parsers.lines import open_binary, read_blocks
from postmortem.parsers.source import Source

from .errors import PostmortemError

HEAD_BYTES = 64 << 10

# Where a file's lines come from one rank. A prefix counts mid-line too: one rank's warning glued
# to another rank's progress bar ("  0%|          | 0/10 [00:00<?, ?it/s][rank0]:[W1201 ...",
# both writing one console) makes the file mixed.
_RANK_PREFIX = re.compile(rb"\[rank(\d+)\]:")
# torchrun --tee's "[default0]:" (any word but "rank" before the number) at a line's start. Found
# after each newline, a literal Python's re looks for fast (a "^" in MULTILINE mode is tried at
# every byte: 0.4 ms a 64 KB head); the head's first line is matched apart.
_TEE_WORD = rb"\[(?!rank\d)([A-Za-z_]+?)(\d+)\]:"
_TEE_FIRST, _TEE_NEXT = re.compile(_TEE_WORD), re.compile(b"\n" + _TEE_WORD)
_TORCHRUN_LAYOUT = re.compile(r"(?:^|/)attempt_\d+/(\d+)/(?:stdout|stderr)\.log(?:\.gz)?$|(?:^|/)attempt_\d+/(\d+)/error\.json$")
_NAME_RANK = re.compile(r"(?i)(?:^|[^a-z])rank[_-]?(\d+)(?!\d)")
# A flight-recorder dump is "<TORCH_NCCL_DEBUG_INFO_TEMP_FILE prefix><rank>", e.g. NVRx's "_dump_3".
_NAME_DUMP_RANK = re.compile(r"(?i)(?:^|_)dump_?(\d+)$")
# A full date and time, "2026-11-29 13:33:12" (after no letter, digit or "_": \b). Searched without
# the \b, which keeps Python's re from looking for its literal "20" fast (46 -> 2 ms over 136 heads).
_FULL_DATE = re.compile(rb"(20\d\d)-(\d\d)-(\d\d)[ _T]\d\d:\d\d:\d\d")
_WORD_BYTES = frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz")


def first_full_date(head: bytes) -> re.Match | None:
    """The first full date in ``head`` that starts a word (where a regex word boundary would let it)."""
    at = 0
    while m := _FULL_DATE.search(head, at):
        if m.start() == 0 or head[m.start() - 1] not in _WORD_BYTES:
            return m
        at = m.start() + 1
    return None

# Formats this version recognises but does not read yet: recorded as skipped, by name.
_RECOGNISED_ONLY = {
    # Flight-recorder dumps and CUDA memory snapshots are read; other pickles not.
    "pickle": lambda head: head[:1] == b"\x80" and not flight_recorder.sniff(head, "")
    and not memory_snapshot.sniff(head, ""),
    # An archive of the logs (tar, gzipped tar, zip): not unpacked here, where a hostile archive
    # could write anywhere or expand without bound; the user unpacks it.
    "archive": lambda head: head[257:262] == b"ustar" or head[:4] == b"PK\x03\x04",
}
_WHY_SKIPPED = {"archive": "an archive of files (tar or zip): unpack it and analyze the directory"}


@dataclass
class Discovery:
    root: Path
    sources: list[Source] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # rows for the files table
    year: int = 1970
    total_bytes: int = 0
    fingerprint: str = ""


def walk(root: Path, skipped: list[dict]) -> list[tuple[Path, os.stat_result]]:
    """Every regular file under root, following symlinks but never into a loop."""
    found: list[tuple[Path, os.stat_result]] = []
    seen_dirs: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            st = directory.stat()
        except OSError as exc:
            skipped.append(_skip(root, directory, "unreadable", f"cannot stat directory: {exc.strerror}"))
            continue
        if (st.st_dev, st.st_ino) in seen_dirs:
            continue  # a symlink loop, or a second link to a directory already read
        seen_dirs.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            skipped.append(_skip(root, directory, "unreadable", f"cannot list directory: {exc.strerror}"))
            continue
        for entry in entries:
            path = Path(entry.path)
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError as exc:
                skipped.append(_skip(root, path, "unreadable", f"cannot stat: {exc.strerror or exc}"))
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(path)
            elif stat.S_ISREG(st.st_mode):
                found.append((path, st))
            else:
                skipped.append(_skip(root, path, "special", "not a regular file (pipe, socket or device)"))
    return sorted(found, key=lambda item: str(item[0]))


def _rel(root: Path, path: Path) -> str:
    # (by its text: Path.relative_to parses both paths again, ~30 us a file before the parse of a job can start)
    text, base = str(path), str(root)
    if text == base:
        rel = "."
    else:
        prefix = base if base.endswith(os.sep) else base + os.sep
        rel = (text[len(prefix):] if text.startswith(prefix) else text).replace(os.sep, "/")
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _skip(root: Path, path: Path, kind: str, reason: str, size: int | None = None, rank: int | None = None) -> dict:
    return {"path": _rel(root, path), "kind": kind, "rank": rank, "bytes": size, "lines": None,
            "parser": None, "status": "skipped", "error": reason}


def read_head(path: Path) -> bytes:
    """The first HEAD_BYTES of the file's content; what there is of it if a gzip stream ends early."""
    return _head_and_compression(path)[0]


def _head_and_compression(path: Path) -> tuple[bytes, bool]:
    """read_head's bytes, and whether the file is a gzip stream."""
    head = b""
    with open_binary(path) as fh:
        try:
            for block in read_blocks(fh, HEAD_BYTES):
                head += block
                if len(head) >= HEAD_BYTES:
                    break
        except EOFError:
            pass
        return head[:HEAD_BYTES], isinstance(fh, gzip.GzipFile)


def rank_from_name(rel: str) -> int | None:
    layout = _TORCHRUN_LAYOUT.search(rel)
    if layout:
        return int(layout[1] or layout[2])
    for part in reversed(rel.split("/")):
        m = _NAME_RANK.search(part) or _NAME_DUMP_RANK.search(part)
        if m:
            return int(m[1])
    return None


def rank_from_content(head: bytes) -> tuple[int | None, bool]:
    """(the one rank the lines' prefixes name, whether the file is a torchrun console)."""
    first = _TEE_FIRST.match(head)
    # (each distinct number once: a head holds hundreds of lines' prefixes, most the same)
    tee = {int(n) for n in {n for _, n in _TEE_NEXT.findall(head)}} | ({int(first[2])} if first else set())
    if tee:
        return (next(iter(tee)) if len(tee) == 1 else None), True
    ranks = {int(n) for n in set(_RANK_PREFIX.findall(head))}
    return (next(iter(ranks)) if len(ranks) == 1 else None), False


# A JSON document no parser claimed (a scheduler's metadata, an expected.json) is not a log.
_JSON_START = re.compile(rb'^\s*(?:\{\s*"|\[\s*[\{"\d\]-])')


def is_json_document(head: bytes) -> bool:
    """Whether the file's head is one JSON value (cut short, perhaps, where the head ends): a
    log whose lines open with a bracketed time or number ("[2023-04-14 13:11:27,879] [INFO]",
    "[80746] [rank0]:") starts like JSON but stops being JSON within its first line."""
    if not _JSON_START.match(head):
        return False
    text = head.decode("utf-8", errors="replace")
    start = len(text) - len(text.lstrip())
    try:
        _, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        if len(head) < HEAD_BYTES:  # the head is the whole file: it must all be JSON
            return False
        # cut by the head's end: the error is in its last line (or its last KiB, for minified JSON)
        return exc.pos >= min(text.rfind("\n", 0, len(text) - 1), len(text) - 1024)
    except RecursionError:  # nested deeper than Python's JSON decoder goes: no log looks like that
        return True
    return not text[end:].strip()


def classify(head: bytes, name: str) -> str | None:
    for kind, sniff in _RECOGNISED_ONLY.items():
        if sniff(head):
            return kind
    for parser in FILE_PARSERS:
        if parser.KIND == "text_log" and is_json_document(head):
            return "json"
        if parser.sniff(head, name):
            return parser.KIND
    return None


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass(frozen=True)
class Limits:
    """Guards against pointing the analyzer at the wrong directory (a home, a whole share)."""

    max_files: int | None = None
    max_bytes: int | None = None

    def check(self, root: Path, files: list[tuple[Path, os.stat_result]]) -> None:
        size = sum(st.st_size for _, st in files)
        if self.max_files is not None and len(files) > self.max_files:
            raise PostmortemError(
                f"{root} holds {len(files)} files, more than --max-files {self.max_files}: "
                "point at the job's log directory, or raise the limit."
            )
        if self.max_bytes is not None and size > self.max_bytes:
            raise PostmortemError(
                f"{root} holds {human_bytes(size)}, more than --max-bytes {human_bytes(self.max_bytes)}: "
                "point at the job's log directory, or raise the limit."
            )


def discover(root: Path, limits: Limits = Limits()) -> Discovery:
    root = Path(root)
    if not root.exists():
        raise PostmortemError(f"No such file or directory: {root}")
    if root.is_file():
        # One file handed over alone (a pasted excerpt, one rank's stdout): read as if it were
        # the only file of its directory; the run names the file.
        found = Discovery(root=root.resolve())
        base = found.root.parent
        files = [(found.root, found.root.stat())]
    elif root.is_dir():
        found = Discovery(root=root.resolve())
        base = found.root
        files = walk(found.root, found.skipped)
    else:
        raise PostmortemError(f"Not a directory or a file: {root} (give the job's log directory)")
    limits.check(root, files)
    digest = hashlib.sha256()
    consoles: list[Source] = []
    dedicated: set[int] = set()
    dated: list[int] = []
    undated: list[int] = []
    content_rank: dict[Path, set[int]] = {}
    for path, st in files:
        rel = _rel(base, path)
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        found.total_bytes += st.st_size
        if st.st_size == 0:
            found.skipped.append(_skip(base, path, "empty", "empty file", 0))
            continue
        try:
            head, compressed = _head_and_compression(path)
        except (OSError, EOFError) as exc:
            found.skipped.append(_skip(base, path, "unreadable", f"cannot read: {exc}", st.st_size))
            continue
        kind = classify(head, path.name)
        if kind is None:
            found.skipped.append(_skip(base, path, "binary", "binary data of no known format", st.st_size,
                                       rank_from_name(rel)))
            continue
        if kind == "json":
            found.skipped.append(_skip(base, path, kind, "a JSON document of no format this tool reads",
                                       st.st_size, rank_from_name(rel)))
            continue
        if kind in _RECOGNISED_ONLY:
            why = _WHY_SKIPPED.get(kind, f"a {kind} of no format this tool reads")
            found.skipped.append(_skip(base, path, kind, why, st.st_size, rank_from_name(rel)))
            continue
        rank, console = rank_from_content(head) if kind == "text_log" else (None, False)
        if rank is not None:
            content_rank.setdefault(path.parent, set()).add(rank)
        if rank is None and not console:
            # A format that names its rank inside (Kineto's distributedInfo.rank) says so itself.
            rank = getattr(BY_KIND.get(kind), "rank_from_head", lambda _: None)(head)
        if rank is None and not console:
            rank = rank_from_name(rel)
        source = Source(path=path, name=rel, kind=kind, rank=rank, bytes=st.st_size, compressed=compressed)
        found.sources.append(source)
        if console:
            consoles.append(source)
        date = first_full_date(head)
        (dated if date else undated).append(int(date[1]) if date else datetime.fromtimestamp(st.st_mtime).year)
    # A date printed in a log beats a file's mtime, which copying the logs resets.
    found.year = min(dated or undated or [datetime.now().year])
    for source in found.sources:
        source.year = found.year
    # torchrun's attempt_N/<local_rank>/ names the local rank: on node 3 of 8-GPU nodes,
    # local rank 1 is rank 25. A sibling file whose lines say [rank25]: settles it for the
    # whole directory (error.json and stdout.log carry no prefix).
    # (told by identity: a Source's == compares every field, paths too, ~15 us a pair)
    console_ids = {id(console) for console in consoles}
    for source in found.sources:
        ranks = content_rank.get(source.path.parent, set())
        if len(ranks) == 1 and id(source) not in console_ids and _TORCHRUN_LAYOUT.search(source.name):
            source.rank = next(iter(ranks))
        if source.rank is not None and source.kind == "text_log" and id(source) not in console_ids:
            dedicated.add(source.rank)
    for console in consoles:
        console.tee_ranks_elsewhere = frozenset(dedicated)
    found.fingerprint = digest.hexdigest()[:16]
    return found
