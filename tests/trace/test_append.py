"""TraceAppender: steps appended during a run, what a crash mid-append leaves, and a resumed run."""

from __future__ import annotations

import gzip

import pytest

from sglang_histospec.trace.append import TraceAppender
from sglang_histospec.trace.format import TraceRecord, load_steps, read_trace


def _step(step: int, prompts: int = 2, group: int = 2) -> list[TraceRecord]:
    return [
        TraceRecord(step, f"p{p}", s, [1, 2 + p], [5 + step, 6, 7 + s], epoch=step // 2, reward=0.5)
        for p in range(prompts)
        for s in range(group)
    ]


@pytest.fixture(params=["run.jsonl", "run.jsonl.gz"])
def path(request, tmp_path):
    return tmp_path / request.param


def test_steps_appended_one_call_each_load_in_order_with_numbered_samples(path) -> None:
    with TraceAppender(path) as trace:
        for step in range(3):
            assert trace.append(_step(step), number_samples=True) == 4
    steps, was_sorted = load_steps(path)
    assert was_sorted and [s.step for s in steps] == [0, 1, 2]
    assert [(r.prompt_id, r.sample) for r in steps[1].records] == [("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1)]
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:  # multi-member gzip: any gzip reader reads it whole
            assert len(f.read().splitlines()) == 12


def test_a_second_call_for_a_step_continues_its_samples_and_renames_a_reused_id(path) -> None:
    with TraceAppender(path) as trace:
        trace.append(_step(0, prompts=1), number_samples=True)
        other = TraceRecord(0, "p0", 0, [9, 9], [3])  # same id, another prompt, same step
        trace.append([*_step(0, prompts=1), other], number_samples=True)
    recs = list(read_trace(path))
    assert [(r.prompt_id, r.sample) for r in recs] == [("p0", 0), ("p0", 1), ("p0", 2), ("p0", 3), ("p0#2", 0)]
    load_steps(path)  # no duplicate or inconsistent record


def _tear(path, keep: float = 0.6) -> None:
    """What a machine crash mid-append leaves: the last append cut short."""
    data = path.read_bytes()
    with TraceAppender(path, fsync=False) as trace:
        trace.append(_step(9))
    extra = path.read_bytes()[len(data) :]
    path.write_bytes(data + extra[: int(len(extra) * keep)])


def test_a_torn_last_append_is_dropped_by_the_reader_and_cut_by_the_next_appender(path) -> None:
    with TraceAppender(path) as trace:
        trace.append(_step(0))
        trace.append(_step(1))
    _tear(path)
    with pytest.warns(UserWarning, match="torn append"):
        steps, _ = load_steps(path)
    kept = [s.step for s in steps]
    assert kept[:2] == [0, 1] and set(kept) <= {0, 1, 9}  # whole lines of the torn step may stay (.jsonl)
    with pytest.warns(UserWarning, match="torn last append"):
        trace = TraceAppender(path)
    with trace:
        trace.append(_step(2))
    steps, _ = load_steps(path)  # no warning now: the tail was cut off
    assert [s.step for s in steps][:2] == [0, 1] and steps[-1].step == 2


def test_a_resumed_run_rewrites_its_steps_and_a_fresh_run_starts_over(path) -> None:
    with TraceAppender(path) as trace:
        for step in range(4):
            trace.append(_step(step), number_samples=True)
    with TraceAppender(path) as trace:  # resumed from the checkpoint of step 2
        trace.append(_step(2), number_samples=True)
    steps, _ = load_steps(path)
    assert [s.step for s in steps] == [0, 1, 2] and len(steps[2].records) == 4
    with TraceAppender(path) as trace:
        trace.append(_step(0), number_samples=True)
    assert [s.step for s in load_steps(path)[0]] == [0]


def test_an_invalid_record_writes_nothing(path) -> None:
    with TraceAppender(path) as trace:
        trace.append(_step(0))
        bad = TraceRecord(1, "p0", 0, [1], [-1])
        with pytest.raises(ValueError, match="response"):
            trace.append([*_step(1), bad])
    assert [s.step for s in load_steps(path)[0]] == [0]
