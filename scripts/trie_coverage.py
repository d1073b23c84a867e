"""Where the realised path lies in the anchor scorer's trie: exact replay with the reference backend, per draft.

For every draft of ``histospec replay TRACE --drafter histospec --budget N`` (the default drafter, the Python reference
of the anchor scorer, which drafts exactly as the native one) this reads, once the tokens that followed are known:
how deep the realised continuation (its first N tokens) runs in the trie of every candidate anchor found, in the
trie of the ``MAX_ANCHORS`` anchors kept, and in the N nodes drafted (the accepted tokens); the sum of the drafted
nodes' calibrated path probabilities (the accepted tokens the scorer expects), the best first token's probability,
and how many distinct first tokens the kept anchors propose; and where a draft stops short of the kept anchors' trie,
why (``loss_*``, shares of all drafts): ``loss_starved``, the draft did not go below the last accepted node at all
(its budget went to other branches), or ``loss_wrong_branch``, it drafted other children there, not the realised one
(``loss_siblings_1`` .. ``loss_siblings_3``: one, two, three or more of them). Prints one JSON line of per-draft
means. A measuring aid for docs/results.md ("Drafting quality", "Ranking"), not a benchmark: it wraps the reference
backend's methods.

Example::

    python scripts/trie_coverage.py docs/data/smollm2-arith-light.jsonl.gz --budget 8
"""

from __future__ import annotations

import argparse
import collections
import json

import sglang_histospec.drafting.anchors as anchors
from sglang_histospec.drafting.types import accepted_length
from sglang_histospec.replay.drafters.registry import build_drafter
from sglang_histospec.replay.simulator import ReplayConfig, replay
from sglang_histospec.trace.format import load_steps

TALLY: collections.Counter = collections.Counter()


def _common(cont, actual) -> int:
    m = 0
    while m < min(len(cont), len(actual)) and cont[m] == actual[m]:
        m += 1
    return m


def _loss(p, tree, actual) -> None:
    """Tally why the draft stopped short of the kept anchors' trie on ``actual`` (nothing when it did not)."""
    ids: list[int] = []  # the trie node of each drafted node (the draft lists them in BFS order)
    for token, parent in zip(tree[0], tree[1]):
        ids.append(p.kids[0 if parent < 0 else ids[parent]][token])
    drafted = set(ids)
    path, v = [0], 0
    for t in actual:
        v = p.kids[v].get(t, -1)
        if v < 0:
            break
        path.append(v)
    acc = next((i for i, u in enumerate(path[1:]) if u not in drafted), len(path) - 1)
    if acc == len(path) - 1:
        return
    kids = [c for c in p.kids[path[acc]].values() if c in drafted]
    if not kids:
        TALLY["loss_starved"] += 1
        return
    TALLY["loss_wrong_branch"] += 1
    TALLY[f"loss_siblings_{min(len(kids), 3)}"] += 1


def _instrument(budget: int) -> None:
    """Wrap AnchorIndex so each pending draft keeps every candidate's continuation and the drafted tree."""
    index = anchors.AnchorIndex
    find, draft, resolve = index._anchors, index._draft, index._resolve

    def found(self, req, reach):
        out = find(self, req, reach)
        req.candidates = [tuple(seq[j : j + reach]) for _, _, _, _, seq, j, _ in out]
        return out

    def drafted(self, req, n):
        req.candidates = []
        out = draft(self, req, n)
        if out[0]:
            p = req.pending[-1]
            p.candidates, p.tree = req.candidates, out
        return out

    def resolved(self, req, final):
        n = len(req.context)
        for p in req.pending:
            if (min(n - p.pos, anchors.DEPTH_MAX) < anchors.DEPTH_MAX and not final) or not hasattr(p, "tree"):
                continue
            actual = req.context[p.pos : p.pos + budget]
            tokens, parents, probs = p.tree[:3]
            TALLY["drafts"] += 1
            TALLY["depth_all_candidates"] += max((_common(c, actual) for c in p.candidates), default=0)
            TALLY["depth_kept_anchors"] += max((_common(c, actual) for _, c in p.anchors), default=0)
            TALLY["accepted"] += accepted_length(tokens, parents, actual)
            TALLY["expected"] += sum(probs)
            TALLY["best_first_prob"] += max((q for q, par in zip(probs, parents) if par == -1), default=0.0)
            TALLY["first_tokens_proposed"] += len({c[0] for _, c in p.anchors if c})
            TALLY["candidates"] += len(p.candidates)
            _loss(p, p.tree, actual)
        resolve(self, req, final)

    index._anchors, index._draft, index._resolve = found, drafted, resolved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument(
        "--schedule", choices=("sequential", "lockstep"), default="sequential",
        help="replay schedule (default sequential: the schedule of its published figures)",
    )  # fmt: skip
    args = parser.parse_args()
    _instrument(args.budget)
    steps, _ = load_steps(args.trace)
    cfg = ReplayConfig(budget=args.budget, schedule=args.schedule)
    res = replay(steps, build_drafter("histospec", args.budget, backend="python"), cfg)
    k = max(TALLY.pop("drafts"), 1)
    means = {name: round(v / k, 4) for name, v in sorted(TALLY.items())}
    print(json.dumps({"trace": args.trace, "budget": args.budget, "schedule": args.schedule, "tau": res.tau,
                      "oracle_tau": res.oracle_tau, "drafts": k, **means}))  # fmt: skip


if __name__ == "__main__":
    main()
