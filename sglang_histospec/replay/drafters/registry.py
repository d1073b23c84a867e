"""Drafters for ``histospec replay`` by name, with their options (CLI flags, notebooks and benchmarks).

``DRAFTERS``: ``histospec`` (ours; every DrafterConfig knob and the AIMD policy), ``rhymerl`` (RhymeRL's released
policy = ``DrafterConfig.rhymerl()`` + released budgets), ``prompt-lookup`` (vLLM ngram semantics), ``none``,
``sglang-ngram`` (SGLang 0.5.23's NGRAM corpus) and ``suffix`` (ArcticInference SuffixDecoding as vLLM's
``suffix`` method). The last two need ``make install-peers`` and raise ``PeerUnavailable`` otherwise; both
are imported lazily, from their own packages, driven as their engines drive them (docs/replay.md).

Example::

    d = build_drafter("histospec", budget=8, tree=False, window=2, sources=("history", "self"))
    d = build_drafter("prompt-lookup", budget=8, pl_min=2, pl_max=4)
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from sglang_histospec.replay.simulator import NoneDrafter, ReplayDrafter

DRAFTERS = ("histospec", "rhymerl", "prompt-lookup", "none", "sglang-ngram", "suffix")
PEERS = ("sglang-ngram", "suffix")
"""Drafters with a cache shared by every request of a server (the ones ``peer_reset`` applies to)."""
PEER_RESETS = ("never", "step")
"""When a peer's cache is emptied: never (the same corpus as ours) or at every step boundary (as SGLang's flush on
weight update and sleep/wake empties NGRAM's trie in colocated RL)."""

# DrafterConfig fields exposed as flags (name -> argparse type); "tree" and "use_frequency" are switches.
_HS_FIELDS = {
    "window": int,
    "min_match": int,
    "max_match": int,
    "prompt_tail": int,
    "min_prob": float,
    "recency_decay": float,
    "reward_weight": float,
    "capacity_tokens": int,
    "global_capacity_tokens": int,
    "backend": str,
    "scorer": str,
    "draft_threads": int,
}


def build_drafter(name: str, budget: int, **opts) -> ReplayDrafter:
    """A fresh drafter; ``opts`` are the CLI option names (``None`` values mean "the component's default")."""
    opts = {k: v for k, v in opts.items() if v is not None}
    reset = opts.pop("peer_reset", "never")
    if reset not in PEER_RESETS:
        raise ValueError(f"peer_reset={reset!r}: expected one of {PEER_RESETS}")
    if reset != "never" and name not in PEERS:
        raise ValueError(
            f"peer_reset={reset!r} applies to the peers ({', '.join(PEERS)}), not to {name!r}: its history across "
            "steps is what it is measured on; drop --peer-reset"
        )
    if name == "none":
        return NoneDrafter()
    if name == "prompt-lookup":
        from sglang_histospec.replay.drafters.prompt_lookup import PromptLookupDrafter

        return PromptLookupDrafter(min_n=opts.get("pl_min", 5), max_n=opts.get("pl_max", opts.get("pl_min", 5)))
    if name in ("histospec", "rhymerl"):
        from sglang_histospec.drafting.drafter import DrafterConfig
        from sglang_histospec.replay.drafters.histospec import HistoSpecReplayDrafter, rhymerl_drafter

        if name == "rhymerl":
            return rhymerl_drafter(budget, **({"backend": opts["backend"]} if "backend" in opts else {}))
        known = {f.name for f in fields(DrafterConfig)}
        kw = {k: opts[k] for k in _HS_FIELDS if k in opts and k in known}
        if "tree" in opts:
            kw["tree"] = bool(opts["tree"])
            if not kw["tree"]:
                kw.setdefault("scorer", "counts")  # chain drafts are the counts scorer's mode
        if "use_frequency" in opts:
            kw["use_frequency"] = bool(opts["use_frequency"])
        if "sources" in opts:
            src = opts["sources"]
            kw["sources"] = tuple(s.strip() for s in src.split(",") if s.strip()) if isinstance(src, str) else src
        return HistoSpecReplayDrafter(DrafterConfig(**kw), opts.get("aimd", "fixed"), budget)
    if name == "sglang-ngram":
        from sglang_histospec.replay.drafters.sglang_ngram import NgramConfig, SGLangNgramDrafter

        kw = {f.name: opts[f"ngram_{f.name}"] for f in fields(NgramConfig) if f"ngram_{f.name}" in opts}
        return SGLangNgramDrafter(budget, NgramConfig(**kw), reset=reset)
    if name == "suffix":
        from sglang_histospec.replay.drafters.suffix import SuffixConfig, SuffixDrafter

        kw = {f.name: opts[f"suffix_{f.name}"] for f in fields(SuffixConfig) if f"suffix_{f.name}" in opts}
        return SuffixDrafter(SuffixConfig(**kw), reset=reset)
    raise ValueError(f"unknown drafter {name!r}; known: {', '.join(DRAFTERS)}")


def add_drafter_arguments(parser: argparse.ArgumentParser) -> None:
    """The drafter flags of ``histospec replay`` (defaults None = the component's own default)."""
    g = parser.add_argument_group("histospec drafter (DrafterConfig; docs/drafting.md)")
    for name, typ in _HS_FIELDS.items():
        g.add_argument("--" + name.replace("_", "-"), type=typ, default=None, help=f"DrafterConfig.{name}")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--tree", dest="tree", action="store_true", default=None, help="tree drafts (default)")
    mode.add_argument(
        "--chain", dest="tree", action="store_false", help="chain drafts (RhymeRL's released mode; the counts scorer)"
    )
    g.add_argument(
        "--no-frequency", dest="use_frequency", action="store_false", default=None, help="max weight, not sum"
    )
    g.add_argument("--sources", default=None, help="comma list of history,siblings,self,global")
    g.add_argument(
        "--aimd", choices=("fixed", "paper", "released"), default=None,
        help="per-request budget policy, capped by --budget (histospec default fixed)",
    )  # fmt: skip
    g = parser.add_argument_group("prompt-lookup (vLLM ngram proposer)")
    g.add_argument("--pl-min", type=int, default=None, help="prompt_lookup_min (default 5)")
    g.add_argument("--pl-max", type=int, default=None, help="prompt_lookup_max (default = --pl-min)")
    g = parser.add_argument_group("peers (sglang-ngram, suffix)")
    g.add_argument(
        "--peer-reset", choices=PEER_RESETS, default=None,
        help="empty the peer's cache at every step boundary ('step': NGRAM as deployed in colocated RL) or never",
    )  # fmt: skip
    g = parser.add_argument_group("sglang-ngram (SGLang --speculative-ngram-* defaults)")
    g.add_argument("--ngram-max-trie-depth", type=int, default=None, help="default 18")
    g.add_argument("--ngram-min-bfs-breadth", type=int, default=None, help="default 1")
    g.add_argument("--ngram-max-bfs-breadth", type=int, default=None, help="default 10")
    g.add_argument("--ngram-match-type", choices=("BFS", "PROB"), default=None, help="default BFS")
    g.add_argument("--ngram-capacity", type=int, default=None, help="trie nodes, default 10M (about 1.8 GB)")
    g = parser.add_argument_group("suffix (vLLM suffix_decoding_* defaults)")
    g.add_argument("--suffix-max-tree-depth", type=int, default=None, help="default 24")
    g.add_argument("--suffix-max-cached-requests", type=int, default=None, help="default 10000")
    g.add_argument("--suffix-max-spec-factor", type=float, default=None, help="default 1.0")
    g.add_argument("--suffix-max-spec-offset", type=float, default=None, help="default 0.0")
    g.add_argument("--suffix-min-token-prob", type=float, default=None, help="default 0.1")
    g.add_argument("--suffix-use-tree-spec", action="store_true", default=None, help="tree drafts (vLLM: paths)")


def drafter_options(args: argparse.Namespace) -> dict:
    """The drafter options of parsed arguments, for ``build_drafter``."""
    keys = list(_HS_FIELDS) + ["tree", "use_frequency", "sources", "aimd", "pl_min", "pl_max", "peer_reset"]
    keys += [k for k in vars(args) if k.startswith(("ngram_", "suffix_"))]
    return {k: getattr(args, k, None) for k in keys}
