"""Rollout traces on disk: JSON Lines (optionally gzip), one object per generated response.

Schema, errors and order rules: docs/replay.md section 1. A malformed line raises ``TraceError`` (a ``ValueError``)
naming the file, the line and the field; ``read_trace`` streams records, ``iter_steps`` the steps of a sorted
trace, ``load_steps`` sorts any order. Example::

    >>> rec = TraceRecord(step=0, prompt_id="p0", sample=0, prompt=[1, 2], response=[3, 4, 5], reward=1.0)
    >>> write_trace("/tmp/t.jsonl", [rec])
    1
    >>> next(read_trace("/tmp/t.jsonl")).response
    [3, 4, 5]
"""

from __future__ import annotations

import gzip
import io
import json
import os
import warnings
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from sglang_histospec.drafting.types import MAX_TOKEN_ID


class TraceError(ValueError):
    """A trace file that cannot be read as specified: names the file, the line and the field at fault."""


@dataclass(slots=True)
class TraceRecord:
    """One generated response of a rollout."""

    step: int
    """Training step whose rollout produced the response (>= 0)."""
    prompt_id: str
    """Stable id of the prompt across epochs."""
    sample: int
    """Index of the response within its group (>= 0)."""
    prompt: list[int]
    """Prompt token ids."""
    response: list[int]
    """Generated token ids, EOS included if generated."""
    epoch: int | None = None
    """Epoch of the step, when the writer knew it."""
    reward: float | None = None
    """Scalar reward of the response, when known."""
    logprobs: list[float] | None = None
    """[len(response)] log-probability of each response token under the policy that sampled it, when recorded."""

    def to_json(self) -> str:
        obj: dict = {"step": self.step}
        if self.epoch is not None:
            obj["epoch"] = self.epoch
        obj.update(prompt_id=self.prompt_id, sample=self.sample, prompt=self.prompt, response=self.response)
        if self.reward is not None:
            obj["reward"] = self.reward
        if self.logprobs is not None:
            obj["logprobs"] = self.logprobs
        return json.dumps(obj, separators=(",", ":"))


@dataclass(slots=True)
class TraceStep:
    """All records of one step, in file order."""

    step: int
    records: list[TraceRecord] = field(default_factory=list)


def _open_text(path: str | os.PathLike, mode: str) -> io.TextIOBase:
    path = os.fspath(path)
    if path.endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _bad(path: str, lineno: int, fld: str, msg: str) -> TraceError:
    return TraceError(f"{path}:{lineno}: field {fld!r}: {msg}")


def _int_field(obj: dict, name: str, path: str, lineno: int, optional: bool = False) -> int | None:
    if name not in obj or obj[name] is None:
        if optional:
            return None
        raise _bad(path, lineno, name, "missing (required int >= 0)")
    v = obj[name]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _bad(path, lineno, name, f"expected an int >= 0, got {v!r}")
    return v


def _tokens_field(obj: dict, name: str, path: str, lineno: int) -> list[int]:
    if name not in obj:
        raise _bad(path, lineno, name, "missing (required list of token ids)")
    v = obj[name]
    if not isinstance(v, list):
        raise _bad(path, lineno, name, f"expected a list of token ids, got {type(v).__name__}")
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < MAX_TOKEN_ID:
            raise _bad(path, lineno, name, f"element {i} is {t!r}, expected an int in [0, 2**31)")
    return v


def parse_record(line: str, path: str = "<trace>", lineno: int = 1) -> TraceRecord:
    """Parse and validate one trace line.

    Example: ``parse_record('{"step":0,"prompt_id":"a","sample":0,"prompt":[1],"response":[2]}').response == [2]``;
    ``parse_record('{"step":-1, ...}')`` raises ``TraceError`` naming field 'step'.
    """
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    step = _int_field(obj, "step", path, lineno)
    pid = obj.get("prompt_id")
    if not isinstance(pid, str) or not pid:
        raise _bad(path, lineno, "prompt_id", f"expected a non-empty string, got {pid!r}")
    sample = _int_field(obj, "sample", path, lineno)
    prompt = _tokens_field(obj, "prompt", path, lineno)
    response = _tokens_field(obj, "response", path, lineno)
    epoch = _int_field(obj, "epoch", path, lineno, optional=True)
    reward = obj.get("reward")
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            raise _bad(path, lineno, "reward", f"expected a number or null, got {reward!r}")
        reward = float(reward)
    return TraceRecord(
        step, pid, sample, prompt, response, epoch, reward, _logprobs_field(obj, len(response), path, lineno)
    )


def _logprobs_field(obj: dict, n: int, path: str, lineno: int) -> list[float] | None:
    v = obj.get("logprobs")
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != n:
        raise _bad(path, lineno, "logprobs", f"expected null or a list of {n} numbers (one per response token)")
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not (x <= 0.0):  # also rejects NaN
            raise _bad(path, lineno, "logprobs", f"element {i} is {x!r}, expected a number <= 0")
    return [float(x) for x in v]


def read_trace(path: str | os.PathLike) -> Iterator[TraceRecord]:
    """Stream the records of a trace in file order; blank lines are skipped."""
    for _, rec in _numbered(os.fspath(path)):
        yield rec


class _StepChecker:
    """Duplicate (prompt_id, sample) and prompt-consistency checks within one step."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: dict[tuple[int, str, int], int] = {}
        self.prompts: dict[tuple[int, str], tuple[list[int], int]] = {}

    def check(self, rec: TraceRecord, lineno: int) -> None:
        key = (rec.step, rec.prompt_id, rec.sample)
        if key in self.seen:
            raise _bad(
                self.path, lineno, "sample", f"duplicate record step={rec.step} prompt_id={rec.prompt_id!r} "
                f"sample={rec.sample} (first on line {self.seen[key]})"
            )  # fmt: skip
        self.seen[key] = lineno
        pkey = (rec.step, rec.prompt_id)
        first = self.prompts.get(pkey)
        if first is None:
            self.prompts[pkey] = (rec.prompt, lineno)
        elif first[0] != rec.prompt:
            raise _bad(
                self.path, lineno, "prompt", f"prompt_id {rec.prompt_id!r} has a different prompt than on line "
                f"{first[1]} in step {rec.step}"
            )  # fmt: skip

    def forget_step(self, step: int) -> None:
        self.seen = {k: v for k, v in self.seen.items() if k[0] != step}
        self.prompts = {k: v for k, v in self.prompts.items() if k[0] != step}


def iter_steps(path: str | os.PathLike) -> Iterator[TraceStep]:
    """Stream a step-sorted trace one step at a time (memory: one step).

    Raises ``TraceError`` at the first record whose step is smaller than an earlier one (use ``load_steps`` for
    unsorted traces), and on duplicate or inconsistent records.
    """
    spath = os.fspath(path)
    checker = _StepChecker(spath)
    cur: TraceStep | None = None
    for lineno, rec in _numbered(spath):
        if cur is not None and rec.step < cur.step:
            raise _bad(
                spath, lineno, "step", f"trace is not sorted by step ({rec.step} after {cur.step}); "
                "load it with load_steps() (replay does) or sort it"
            )  # fmt: skip
        checker.check(rec, lineno)
        if cur is None or rec.step != cur.step:
            if cur is not None:
                checker.forget_step(cur.step)
                yield cur
            cur = TraceStep(rec.step)
        cur.records.append(rec)
    if cur is not None:
        yield cur


def _numbered(spath: str) -> Iterator[tuple[int, TraceRecord]]:
    """(line number, record) of every line; a torn tail (a run that died appending, ``trace/append.py``) is
    dropped with a warning: an unterminated last line that does not parse, or a cut-short last gzip member."""
    if not os.path.exists(spath):
        raise TraceError(f"{spath}: no such trace file")
    lineno = 0
    with _open_text(spath, "r") as f:
        try:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if line.endswith("\n"):
                    yield lineno, parse_record(line, spath, lineno)
                    continue
                try:
                    rec = parse_record(line, spath, lineno)
                except TraceError:
                    _warn_torn(spath, lineno - 1)
                    return
                yield lineno, rec
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            if lineno == 0:
                raise TraceError(f"{spath}: not a readable gzip file ({exc})") from None
            _warn_torn(spath, lineno)


def _warn_torn(spath: str, lineno: int) -> None:
    warnings.warn(
        f"{spath}: ends in a torn append after line {lineno} (a run that died writing it); read up to there",
        stacklevel=3,
    )


def load_steps(path: str | os.PathLike) -> tuple[list[TraceStep], bool]:
    """Read a whole trace, group it by step in increasing order; returns (steps, was_sorted).

    Records of one step keep their file order; an unsorted file gives the same steps as its sorted version.
    Raises ``TraceError`` on malformed, duplicate or inconsistent records and on an empty trace.
    """
    spath = os.fspath(path)
    checker = _StepChecker(spath)
    by_step: dict[int, TraceStep] = {}
    last = -1
    was_sorted = True
    for lineno, rec in _numbered(spath):
        checker.check(rec, lineno)
        if rec.step < last:
            was_sorted = False
        last = max(last, rec.step)
        by_step.setdefault(rec.step, TraceStep(rec.step)).records.append(rec)
    if not by_step:
        raise TraceError(f"{spath}: trace has no records")
    return [by_step[s] for s in sorted(by_step)], was_sorted


def write_trace(path: str | os.PathLike, records: Iterable[TraceRecord]) -> int:
    """Write records (``.gz`` suffix: gzip) in the given order; returns how many were written.

    Each record is validated first, so a writer never produces a trace its reader would reject.
    """
    with TraceWriter(path) as w:
        for rec in records:
            w.write(rec)
    return w.count


class TraceWriter:
    """Streaming writer: ``with TraceWriter(path) as w: w.write(record)``; validates each record."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._f = _open_text(self.path, "w")
        self.count = 0

    def write(self, rec: TraceRecord) -> None:
        line = rec.to_json()
        parse_record(line, self.path, self.count + 1)
        self._f.write(line + "\n")
        self.count += 1

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
