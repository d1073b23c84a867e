"""HistoSpecDrafter facade: steps and dedupe, LRU capacity, snapshots, bad input, concurrency."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from sglang_histospec.drafting import DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.drafter import visit_weights
from sglang_histospec.drafting.snapshot import FORMAT_VERSION, MAGIC


def drafter(**kw) -> HistoSpecDrafter:
    return HistoSpecDrafter(
        DrafterConfig(**{"backend": "python", "prompt_tail": 0, "scorer": "counts", "window": 1, **kw})
    )


def test_push_and_recorded_never_counted_twice():
    d = drafter(prompt_tail=1)
    d.start("r", "p", [1])
    d.finish("r", [3, 4])  # recorded for the open step 0
    assert d.add("p", 0, [[3, 4], [3, 5]], prompt_tokens=[1]) == 2  # the trainer's push for step 0
    d.end_step(0)  # covered by the push: the recorded response is not added again
    assert d.prompt_sizes() == {"p": 2 * 3}
    assert d.add("p", 0, [[3, 4], [3, 5]]) == 2  # a repeated push replaces, never doubles
    assert d.prompt_sizes() == {"p": 2 * 3}
    d.start("s", "p", [1])
    d.finish("s", [9])
    d.end_step()  # open step is 1 now: a new visit, the old one falls out of the window (K=1)
    assert d.prompt_sizes() == {"p": 2} and d.open_step == 2
    assert d.check_integrity() is None


def test_add_return_values_and_window():
    d = drafter(window=2)
    assert d.add("p", 5, [[1, 2], [], [3]], rewards=[1.0, 0.0, 0.5]) == 2  # empty response skipped
    assert d.add("p", 7, [[1]]) == 1
    assert d.add("p", 3, [[1]]) == 0  # older than both kept visits
    assert d.add("p", 6, [[]]) == 0
    assert d.add("p", 6, [[4, 4]]) == 1  # evicts step 5
    assert d.prompt_sizes() == {"p": 3}
    assert d.check_integrity() is None


@pytest.mark.parametrize(
    "rewards, age, decay, rw, expected",
    [
        (None, 0, 0.5, 0.0, [65536, 65536]),
        ([0.0, 1.0], 1, 0.5, 1.0, [32768, 65536]),
        ([2.0, 2.0], 0, 0.5, 3.0, [65536, 65536]),  # equal rewards: no bonus
        ([0.0, 0.5, 1.0], 2, 0.5, 1.0, [16384, 24576, 32768]),
        (None, 40, 0.5, 0.0, [1, 1]),  # never below 1
    ],
)
def test_visit_weights(rewards, age, decay, rw, expected):
    cfg = DrafterConfig(recency_decay=decay, reward_weight=rw, backend="python", scorer="counts")
    assert visit_weights(rewards, len(expected), age, cfg) == expected


def test_lru_eviction_of_whole_prompts():
    d = drafter(capacity_tokens=10, sources=("history", "siblings", "self"))  # global keeps evicted prompts (§7.2)
    d.add("a", 0, [[1, 2, 3, 4, 5]])
    d.add("b", 0, [[1, 2, 3, 4, 5]])
    d.start("r", "a", [1])  # a is now more recently used than b
    d.add("c", 0, [[1, 2, 3, 4, 5]])
    assert d.prompt_sizes() == {"a": 5, "c": 5}
    d.start("x", "b", [1])
    assert d.draft("x", 4).token_ids == []  # b's history is gone
    d.add("big", 0, [list(range(11))])  # larger than the capacity: evicts everything, itself included
    assert d.prompt_sizes() == {} and d.stats()["history_tokens"] == 0
    assert d.stats()["evicted_prompts"] == 4
    assert d.check_integrity() is None


def test_stats_and_memory():
    d = drafter()
    d.add("a", 0, [[1, 2, 3]])
    s = d.stats()
    assert (s["prompts"], s["history_tokens"], s["requests"]) == (1, 3, 0)
    assert s["memory_bytes"] == d.memory_bytes() > 0


def _populated(tmp_kw=None) -> HistoSpecDrafter:
    d = drafter(prompt_tail=2, window=2, sources=("history", "siblings", "self", "global"), **(tmp_kw or {}))
    d.add("p", 0, [[5, 6, 7], [5, 6, 8]], rewards=[1.0, 0.0], prompt_tokens=[1, 2])
    d.add("p", 1, [[5, 6, 9]], prompt_tokens=[1, 2])
    d.add("q", 1, [[7, 7, 7]], prompt_tokens=[3, 4])
    d.start("s", "q", [3, 4])
    d.finish("s", [7, 8])  # recorded sibling of the open step
    return d


def _drafts(d: HistoSpecDrafter) -> list:
    out = []
    for i, (pid, prompt) in enumerate([("p", [1, 2]), ("q", [3, 4]), ("zz", [1, 2])]):
        d.start(f"t{i}", pid, prompt)
        out.append(d.draft(f"t{i}", 8))
        d.abort(f"t{i}")
    return out


def test_snapshot_round_trip(tmp_path):
    d = _populated()
    path = tmp_path / "h.snap"
    d.snapshot(path)
    e = HistoSpecDrafter.load(path, d.cfg)
    assert e.prompt_sizes() == d.prompt_sizes()
    assert _drafts(e) == _drafts(d)
    for key in ("prompts", "history_tokens", "open_step", "siblings", "global_tokens"):
        assert e.stats()[key] == d.stats()[key]
    assert e.check_integrity() is None
    e.end_step()  # the recorded sibling survived the round trip and becomes history
    assert e.prompt_sizes()["q"] == 5 + 4  # visit 1 ([3, 4] + 3 tokens) and the new visit 0 ([3, 4] + 2)


def _corrupt_cases(raw: bytes):
    flipped = bytearray(raw)
    flipped[-3] ^= 0x40
    other_version = bytearray(raw)
    other_version[8] = FORMAT_VERSION + 1
    return [
        ("truncated", raw[: len(raw) - 5], "truncated"),
        ("header-only", raw[:20], "truncated"),
        ("flipped", bytes(flipped), "checksum"),
        ("magic", b"XXXXXXXX" + raw[len(MAGIC) :], "not a histospec snapshot"),
        ("version", bytes(other_version), "version"),
        ("trailing", raw + b"\0", "trailing"),
    ]


def test_snapshot_corruption_refused(tmp_path):
    d = _populated()
    path = tmp_path / "h.snap"
    d.snapshot(path)
    raw = path.read_bytes()
    for name, data, message in _corrupt_cases(raw):
        bad = tmp_path / f"{name}.snap"
        bad.write_bytes(data)
        with pytest.raises(ValueError, match=message):
            HistoSpecDrafter.load(bad, d.cfg)


def test_snapshot_smaller_window_and_capacity(tmp_path):
    d = _populated()
    d.snapshot(tmp_path / "h.snap")
    e = HistoSpecDrafter.load(
        tmp_path / "h.snap", DrafterConfig(backend="python", prompt_tail=2, window=1, scorer="counts")
    )
    assert e.prompt_sizes() == {"p": 5, "q": 5}
    assert e.check_integrity() is None


BAD_CALLS = [
    (lambda d: d.add(3, 0, [[1]]), "prompt_id"),
    (lambda d: d.add("p", -1, [[1]]), "step"),
    (lambda d: d.add("p", 0, [[1, -2]]), "-2"),
    (lambda d: d.add("p", 0, [[1, 2**31]]), "2147483648"),
    (lambda d: d.add("p", 0, [[1, 1.5]]), "1.5"),
    (lambda d: d.add("p", 0, [[True]]), "True"),
    (lambda d: d.add("p", 0, "abc"), "responses"),
    (lambda d: d.add("p", 0, [[1], [2]], rewards=[1.0]), "rewards"),
    (lambda d: d.add("p", 0, [[1]], rewards=[float("nan")]), "nan"),
    (lambda d: d.add("p", 0, [np.array([[1]])]), "1-D"),
    (lambda d: d.draft("nope", 4), "nope"),
    (lambda d: d.extend("nope", [1]), "nope"),
    (lambda d: d.finish("nope", [1]), "nope"),
    (lambda d: d.abort("nope"), "nope"),
    (lambda d: d.draft("r", -1), "budget=-1"),
    (lambda d: d.draft("r", 10**6), "budget=1000000"),
    (lambda d: d.draft_batch(["r"], [1, 2]), "budgets"),
    (lambda d: d.extend("r", [None]), "None"),
    (lambda d: d.extend_batch(["r", "nope"], [[1], [2]]), "nope"),
    (lambda d: d.extend_batch(["r"], [[1], [2]]), "token lists"),
    (lambda d: d.extend_batch(["r"], [[-1]]), "-1"),
    (lambda d: d.extend_batch(["r"], [[2**31]]), "2147483648"),
    (lambda d: d.start("r", "p", [1]), "already started"),
    (lambda d: d.start("r2", "p", None), "prompt_tokens"),
    (lambda d: d.end_step(-3), "step"),
]


@pytest.mark.parametrize("call, message", BAD_CALLS)
def test_bad_input_raises_value_error(call, message):
    d = drafter()
    d.start("r", "p", [1, 2])
    with pytest.raises(ValueError, match=message):
        call(d)
    assert d.check_integrity() is None


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"window": 0}, "window"),
        ({"min_match": 3, "max_match": 2}, "max_match"),
        ({"min_prob": 0.0}, "min_prob"),
        ({"recency_decay": 1.5}, "recency_decay"),
        ({"reward_weight": -1.0}, "reward_weight"),
        ({"sources": ("history", "nope")}, "sources"),
        ({"backend": "gpu"}, "backend"),
        ({"capacity_tokens": 2**40}, "2\\*\\*53"),
    ],
)
def test_bad_config(kw, message):
    with pytest.raises(ValueError, match=message):
        DrafterConfig(**kw)


def test_rhymerl_preset():
    cfg = DrafterConfig.rhymerl()
    assert (cfg.tree, cfg.min_match, cfg.max_match, cfg.min_prob, cfg.window, cfg.prompt_tail, cfg.sources) == (
        False,
        4,
        7,
        0.1,
        1,
        5,
        ("history",),
    )
    d = HistoSpecDrafter(DrafterConfig.rhymerl(backend="python"))
    prompt = [10, 11, 12, 13, 14, 15, 16]
    d.add("p", 0, [[1, 2, 3], [1, 2, 4], [1, 2, 3]], prompt_tokens=prompt)
    d.start("r", "p", prompt)  # step 0: matches the 5-token tail before each response
    draft = d.draft("r", 16)
    assert (draft.token_ids, draft.parents, draft.match_len) == ([1, 2, 3], [-1, 0, 1], 5)


def test_concurrent_add_and_draft():
    d = drafter(prompt_tail=1, window=2)
    d.add("p", 0, [[5, 6, 7]], prompt_tokens=[1])
    for i in range(4):
        d.start(f"r{i}", "p", [1])
    errors: list[str] = []
    stop = threading.Event()

    def reader(rid: str) -> None:
        while not stop.is_set():
            draft = d.draft(rid, 4)
            problem = draft.check()
            if problem or (draft.token_ids and draft.token_ids[0] not in (5, 8)):
                errors.append(problem or str(draft))

    threads = [threading.Thread(target=reader, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for step in range(1, 60):
        d.add("p", step, [[5 if step % 2 else 8, 6, step]])
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert d.check_integrity() is None


@pytest.mark.parametrize(
    "state, message",
    [
        ({"prompts": [("p", [1], [(0, [np.array([5, 6], np.int32)], [1.0, 2.0])])]}, "rewards"),
        ({"prompts": [("p", [1], [(0, [np.array([5, 6], np.int32)], [float("inf")])])]}, "non-finite"),
        ({"prompts": [("p", [-4], [(0, [np.array([5, 6], np.int32)], None)])]}, "tail"),
    ],
)
def test_snapshot_bad_structure_refused(tmp_path, state, message):
    from sglang_histospec.drafting.snapshot import write_snapshot

    write_snapshot(tmp_path / "s.snap", {"open_step": 0, "recorded": [], "global": [], **state})
    with pytest.raises(ValueError, match=f"corrupt structure.*{message}"):
        HistoSpecDrafter.load(tmp_path / "s.snap", DrafterConfig(backend="python"))


@pytest.mark.parametrize("backend", ["python", "native"])
def test_extend_batch_is_extend_per_request(backend):
    one, batch = drafter(backend=backend), drafter(backend=backend)
    for d in (one, batch):
        d.add("p", 0, [[5, 6, 7, 8, 9], [5, 6, 1, 2]])
        d.end_step(0)
        d.start("a", "p", [1, 2])
        d.start("b", "p", [3])
    steps = [(["a", "b"], [[5], [5, 6]]), (["b"], [[7]]), (["a", "b"], [[6, 1], [8]])]
    for rids, toks in steps:
        for r, t in zip(rids, toks):
            one.extend(r, t)
        batch.extend_batch(rids, toks)
        assert [one.draft(r, 4) for r in ("a", "b")] == [batch.draft(r, 4) for r in ("a", "b")]


def test_active_requests():
    d = drafter()
    d.start("a", "p", [1])
    d.start("b", None, [1])
    d.finish("a", [2])
    assert d.active_requests() == {"b"}
