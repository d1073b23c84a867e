"""Hand-computed drafting cases (docs/drafting.md), run on every available backend."""

from __future__ import annotations

import pytest

from sglang_histospec.drafting import Draft, DrafterConfig, HistoSpecDrafter
from sglang_histospec.drafting.reference import merge_drafts

try:
    from sglang_histospec.drafting.native import NativeIndex  # noqa: F401

    BACKENDS = ["python", "native"]
except (ImportError, AttributeError):
    BACKENDS = ["python"]

TAIL2 = [1, 2]
THREE = [[5, 6, 7], [5, 6, 8], [5, 6, 7]]  # after the tail [1, 2]


def run_case(backend, cfg_kw, adds, prompt, budget, prompt_id="p", extend=()):
    cfg = DrafterConfig(backend=backend, scorer="counts", **cfg_kw)
    d = HistoSpecDrafter(cfg)
    for step, responses, rewards in adds:
        d.add("p", step, responses, rewards=rewards, prompt_tokens=prompt)
    d.start("r", prompt_id, prompt)
    if extend:
        d.extend("r", list(extend))
    draft = d.draft("r", budget)
    assert draft.check() is None
    assert d.check_integrity() is None
    return draft


H = {"sources": ("history",)}
CASES = [
    # (name, config, adds [(step, responses, rewards)], prompt, extend, budget, expected (tokens, parents, probs, match_len))
    (
        "tree",
        {**H, "prompt_tail": 2},
        [(0, THREE, None)],
        TAIL2,
        (),
        4,
        ([5, 6, 7, 8], [-1, 0, 1, 1], [1.0, 1.0, 2 / 3, 1 / 3], 2),
    ),
    ("budget-2", {**H, "prompt_tail": 2}, [(0, THREE, None)], TAIL2, (), 2, ([5, 6], [-1, 0], [1.0, 1.0], 2)),
    (
        "min-prob",
        {**H, "prompt_tail": 2, "min_prob": 0.5},
        [(0, THREE, None)],
        TAIL2,
        (),
        8,
        ([5, 6, 7], [-1, 0, 1], [1.0, 1.0, 2 / 3], 2),
    ),
    (
        "chain",
        {**H, "prompt_tail": 2, "tree": False},
        [(0, THREE, None)],
        TAIL2,
        (),
        8,
        ([5, 6, 7], [-1, 0, 1], [1.0, 1.0, 2 / 3], 2),
    ),
    (
        "extend-longer-match",
        {**H, "prompt_tail": 2},
        [(0, THREE, None)],
        TAIL2,
        (5, 6),
        8,
        ([7, 8], [-1, -1], [2 / 3, 1 / 3], 4),
    ),
    # equal probabilities: the smaller token id was pushed first and wins
    (
        "tie-smaller-token",
        {**H, "prompt_tail": 0},
        [(0, [[1, 9], [1, 3]], None)],
        [1],
        (),
        4,
        ([3, 9], [-1, -1], [0.5, 0.5], 1),
    ),
    (
        "tie-chain",
        {**H, "prompt_tail": 0, "tree": False},
        [(0, [[1, 9], [1, 3]], None)],
        [1],
        (),
        4,
        ([3], [-1], [0.5], 1),
    ),
    # siblings are output by pop rank (most likely first)
    (
        "sibling-order",
        {**H, "prompt_tail": 0},
        [(0, [[1, 9], [1, 9], [1, 3]], None)],
        [1],
        (),
        4,
        ([9, 3], [-1, -1], [2 / 3, 1 / 3], 1),
    ),
    # back-off: [8, 5] does not occur, [5] does (3 occurrences)
    (
        "back-off",
        {**H, "prompt_tail": 0},
        [(0, [[4, 5, 1, 2], [6, 5, 3], [7, 5, 3]], None)],
        [8, 5],
        (),
        3,
        ([3, 1, 2], [-1, -1, 1], [2 / 3, 1 / 3, 1 / 3], 1),
    ),
    (
        "longest-match",
        {**H, "prompt_tail": 0},
        [(0, [[4, 5, 1, 2], [6, 5, 3], [7, 5, 3]], None)],
        [4, 5],
        (),
        3,
        ([1, 2], [-1, 0], [1.0, 1.0], 2),
    ),
    # [1, 2] occurs only at a sequence end: counted, no continuation -> back off to [2] whose count includes it
    ("end-occurrence", {**H, "prompt_tail": 0}, [(0, [[1, 2], [2, 4]], None)], [1, 2], (), 3, ([4], [-1], [0.5], 1)),
    (
        "min-match",
        {**H, "prompt_tail": 0, "min_match": 2},
        [(0, [[4, 5, 1, 2], [6, 5, 3]], None)],
        [8, 5],
        (),
        3,
        ([], [], [], 0),
    ),
    (
        "no-frequency",
        {**H, "prompt_tail": 0, "use_frequency": False},
        [(0, [[1, 3], [1, 3], [1, 9]], None)],
        [1],
        (),
        4,
        ([3, 9], [-1, -1], [1.0, 1.0], 1),
    ),
    (
        "recency",
        {**H, "prompt_tail": 0, "window": 2, "recency_decay": 0.5},
        [(0, [[1, 3]], None), (1, [[1, 9]], None)],
        [1],
        (),
        4,
        ([9, 3], [-1, -1], [2 / 3, 1 / 3], 1),
    ),
    (
        "recency-off",
        {**H, "prompt_tail": 0, "window": 2, "recency_decay": 1.0},
        [(0, [[1, 3]], None), (1, [[1, 9]], None)],
        [1],
        (),
        4,
        ([3, 9], [-1, -1], [0.5, 0.5], 1),
    ),
    (
        "window-1",
        {**H, "prompt_tail": 0, "window": 1},
        [(0, [[1, 3]], None), (1, [[1, 9]], None)],
        [1],
        (),
        4,
        ([9], [-1], [1.0], 1),
    ),
    (
        "reward",
        {**H, "prompt_tail": 0, "reward_weight": 1.0},
        [(0, [[1, 3], [1, 9]], [0.0, 1.0])],
        [1],
        (),
        4,
        ([9, 3], [-1, -1], [2 / 3, 1 / 3], 1),
    ),
    (
        "reward-off",
        {**H, "prompt_tail": 0},
        [(0, [[1, 3], [1, 9]], [0.0, 1.0])],
        [1],
        (),
        4,
        ([3, 9], [-1, -1], [0.5, 0.5], 1),
    ),
    ("budget-0", {**H, "prompt_tail": 2}, [(0, THREE, None)], TAIL2, (), 0, ([], [], [], 0)),
    ("unknown-prompt", {**H, "prompt_tail": 2}, [], TAIL2, (), 4, ([], [], [], 0)),
    # the own context: [1, 2] occurs at 0 (the occurrence at the very end is excluded)
    ("self", {"sources": ("self",)}, [], [1, 2, 3, 1, 2], (), 3, ([3, 1, 2], [-1, 0, 1], [1.0, 1.0, 1.0], 2)),
    ("self-nothing", {"sources": ("self",)}, [], [1, 2, 3], (), 3, ([], [], [], 0)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, cfg, adds, prompt, extend, budget, expected", CASES, ids=[c[0] for c in CASES])
def test_hand_computed(backend, name, cfg, adds, prompt, extend, budget, expected):
    draft = run_case(backend, cfg, adds, prompt, budget, extend=extend)
    tokens, parents, probs, match_len = expected
    assert draft.token_ids == tokens
    assert draft.parents == parents
    assert draft.probs == pytest.approx(probs, rel=0, abs=1e-15)
    assert draft.match_len == match_len
    assert draft.source == ("" if not tokens else cfg["sources"][0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "budget, expected",
    [
        # history drafts [9] (p 1), self drafts 7 -> 1 -> 2 (p 1 each): union p = (sum) / 2; ties: smaller token
        (3, ([7, 9, 1], [-1, -1, 0], [0.5, 0.5, 0.5])),
        (1, ([7], [-1], [0.5])),
    ],
)
def test_merge_union(backend, budget, expected):
    d = HistoSpecDrafter(DrafterConfig(backend=backend, prompt_tail=0, sources=("history", "self"), scorer="counts"))
    d.add("p", 0, [[1, 2, 9]])
    d.start("r", "p", [1, 2, 7, 1, 2])
    draft = d.draft("r", budget)
    assert (draft.token_ids, draft.parents, draft.probs) == expected
    assert (draft.source, draft.match_len) == ("mixed", 2)


def test_merge_union_sums_shared_paths():
    # 5 -> 6 in both drafts: (1.0 + 0.5) / 2; 7 only in the second: 0.5 / 2
    cands = [([5, 6], [-1, 0], [1.0, 1.0], 3, "history"), ([5, 7, 6], [-1, -1, 0], [0.5, 0.5, 0.5], 1, "self")]
    assert merge_drafts(cands, 8) == ([5, 7, 6], [-1, -1, 0], [0.75, 0.25, 0.75], 3, "mixed")
    assert merge_drafts(cands, 2) == ([5, 6], [-1, 0], [0.75, 0.75], 3, "mixed")


@pytest.mark.parametrize("backend", BACKENDS)
def test_siblings_global_and_no_prompt(backend):
    d = HistoSpecDrafter(
        DrafterConfig(backend=backend, prompt_tail=1, sources=("history", "siblings", "global"), scorer="counts")
    )
    d.start("a", "p", [1])
    assert d.draft("a", 4) == Draft.empty()
    d.finish("a", [3, 4])  # a sibling of p in the open step: [1, 3, 4]
    d.start("b", "p", [1])
    assert (d.draft("b", 4).token_ids, d.draft("b", 4).source) == ([3, 4], "siblings")
    d.abort("b")
    d.end_step()  # siblings -> history visit of step 0, and into the global FIFO
    d.start("c", "p", [1])  # history and global hold the same [1, 3, 4]: one union tree
    assert (d.draft("c", 4).token_ids, d.draft("c", 4).probs, d.draft("c", 4).source) == ([3, 4], [1.0, 1.0], "mixed")
    d.start("e", "q", [1])  # another prompt: only the global source has [1, 3, 4]
    assert (d.draft("e", 4).token_ids, d.draft("e", 4).source) == ([3, 4], "global")
    d.start("f", None, [1])  # no prompt id: no history/siblings, global still applies
    assert d.draft("f", 4).source == "global"
    assert d.check_integrity() is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_draft_batch_matches_single(backend):
    d = HistoSpecDrafter(DrafterConfig(backend=backend, prompt_tail=2, scorer="counts"))
    d.add("p", 0, THREE, prompt_tokens=TAIL2)
    d.start("r1", "p", TAIL2)
    d.start("r2", "p", TAIL2)
    d.extend("r2", [5, 6])
    batch = d.draft_batch(["r1", "r2"], [4, 1])
    assert batch == [d.draft("r1", 4), d.draft("r2", 1)]
    assert [len(x) for x in batch] == [4, 1]
