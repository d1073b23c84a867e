"""A trace written while the run goes on (:class:`TraceAppender`): each call appends whole steps in one write,
flushed and fsynced, so a run that dies leaves a trace that loads and replays.

What a crash leaves (docs/replay.md, "Traces written during a run"):

- the process dies (killed, out of memory, an exception): every appended call is whole in the file; the rollouts
  not yet appended are missing;
- the machine dies (power, kernel panic): the last call may be cut short, a prefix of its lines with the last one
  possibly torn (``.gz``: a truncated gzip member). The readers (``trace/format.py``) drop a torn tail with a
  warning and keep every whole line; the next ``TraceAppender`` on the file cuts the tail off.

Opening an existing trace keeps it; the first append then drops the file's records from the first line (``.gz``:
member) holding a step >= the smallest step appended, and all after it: a run resumed from its checkpoint at step
k writes steps k, k+1, ... again, and a fresh run from step 0 starts a fresh trace. Example::

    with TraceAppender("run.jsonl.gz") as trace:
        trace.append([TraceRecord(step=0, prompt_id="p0", sample=0, prompt=[1, 2], response=[3, 4])],
                     number_samples=True)    # sample: the next free index of (step 0, "p0")
"""

from __future__ import annotations

import gzip
import os
import warnings
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from sglang_histospec.trace.format import TraceError, TraceRecord, parse_record


@dataclass(slots=True)
class _Unit:
    """One line (``.jsonl``) or gzip member (``.gz``) of an existing trace: where it starts and what it holds."""

    offset: int
    keys: list[tuple[int, str, int, int]] = field(default_factory=list)
    """(step, prompt_id, sample, hash of the prompt) of each record."""


class TraceAppender:
    """Append-only trace writer of a running job; ``.gz``: one gzip member per step. Module docstring: example."""

    def __init__(self, path: str | os.PathLike, fsync: bool = True) -> None:
        self.path = os.fspath(path)
        self.fsync = fsync
        self.count = 0
        """Records appended by this writer."""
        self._gz = self.path.endswith(".gz")
        self._units = self._scan() if os.path.exists(self.path) else []
        self._started = False
        self._next: dict[tuple[int, str], int] = {}  # (step, prompt_id) -> next free sample
        self._prompts: dict[tuple[int, str], int] = {}  # (step, prompt_id) -> hash of its prompt
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, records: Iterable[TraceRecord], number_samples: bool = False) -> int:
        """Validate ``records`` and append them in one write (then flush and fsync); returns how many.

        ``number_samples``: set each record's ``sample`` to the next free index of its (step, prompt_id), and give a
        prompt id that already names another prompt in the step the suffix ``#2``, ``#3``, ... (the readers refuse
        one id with two prompts in a step)."""
        records = list(records)
        if not records:
            return 0
        if self._fd is None:
            raise ValueError(f"{self.path}: TraceAppender is closed; open a new one to append")
        if not self._started:
            self._resume(min(r.step for r in records))
        lines = []
        for rec in records:
            if number_samples:
                self._number(rec)
            line = rec.to_json()
            parse_record(line, self.path, self.count + len(lines) + 1)
            lines.append(line)
        self._write(self._encode(records, lines))
        self.count += len(records)
        return len(records)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> TraceAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals -------------------------------------------------------------------------------------------
    def _number(self, rec: TraceRecord) -> None:
        """Next free sample of (step, prompt_id); a new suffix for an id naming another prompt in the step."""
        base, digest, n = rec.prompt_id, hash(tuple(rec.prompt)), 1
        while self._prompts.setdefault((rec.step, rec.prompt_id), digest) != digest:
            n += 1
            rec.prompt_id = f"{base}#{n}"
        key = (rec.step, rec.prompt_id)
        rec.sample = self._next.get(key, 0)
        self._next[key] = rec.sample + 1

    def _encode(self, records: list[TraceRecord], lines: list[str]) -> bytes:
        if not self._gz:
            return "".join(line + "\n" for line in lines).encode()
        by_step: dict[int, list[str]] = {}
        for rec, line in zip(records, lines):
            by_step.setdefault(rec.step, []).append(line + "\n")
        return b"".join(gzip.compress("".join(ls).encode(), mtime=0) for ls in by_step.values())

    def _write(self, data: bytes) -> None:
        """All of ``data`` at the end of the file; on an error the file is cut back to where it was."""
        assert self._fd is not None
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if self.fsync:
                os.fsync(self._fd)
        except BaseException:
            os.ftruncate(self._fd, start)
            raise

    def _resume(self, first_step: int) -> None:
        """Drop the file's records from the first unit holding a step >= ``first_step`` on; count the rest."""
        self._started = True
        cut = next((i for i, u in enumerate(self._units) if any(k[0] >= first_step for k in u.keys)), None)
        if cut is not None:
            unit = self._units[cut]
            if any(k[0] < first_step for k in unit.keys):
                raise ValueError(
                    f"{self.path}: the run appends step {first_step}, and one gzip member of the file holds it "
                    "with earlier steps, so it cannot be cut there; give a new trace path or move the file away"
                )
            os.truncate(self.path, unit.offset)
            self._units = self._units[:cut]
        for unit in self._units:
            for step, pid, sample, digest in unit.keys:
                self._prompts.setdefault((step, pid), digest)
                self._next[(step, pid)] = max(self._next.get((step, pid), 0), sample + 1)
        self._units = []

    def _scan(self) -> list[_Unit]:
        """The units of the existing file; a torn tail (an interrupted append) is cut off here, with a warning."""
        with open(self.path, "rb") as f:
            data = f.read()
        units, end = [], 0
        for offset, stop, text in _gz_members(data) if self._gz else _lines(data):
            unit, end = _Unit(offset), stop
            try:
                for line in text.decode().splitlines():
                    if line.strip():
                        rec = parse_record(line, self.path)
                        unit.keys.append((rec.step, rec.prompt_id, rec.sample, hash(tuple(rec.prompt))))
            except (UnicodeDecodeError, TraceError) as exc:
                raise TraceError(f"{self.path}: unreadable record at byte {offset} ({exc}); not appending") from None
            units.append(unit)
        if end < len(data):
            warnings.warn(
                f"{self.path}: cut off {len(data) - end} bytes of a torn last append (a run that died writing it)",
                stacklevel=3,
            )
            os.truncate(self.path, end)
        return units


def _lines(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(start, end, line) of every newline-terminated line; an unterminated tail is not yielded."""
    offset = 0
    while (nl := data.find(b"\n", offset)) >= 0:
        yield offset, nl + 1, data[offset : nl + 1]
        offset = nl + 1


def _gz_members(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(start, end, decompressed text) of every whole gzip member; stops at a truncated or damaged one."""
    offset = 0
    while offset < len(data):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            text = d.decompress(data[offset:])
        except zlib.error:
            return
        if not d.eof:
            return
        end = len(data) - len(d.unused_data)
        yield offset, end, text
        offset = end
