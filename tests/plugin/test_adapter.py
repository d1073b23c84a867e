"""The SGLang plugin's pure parts (no SGLang needed): the drafter adapter, prompt keys, server-argument defaults."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sglang_histospec.drafting import DrafterConfig
from sglang_histospec.plugin import ALGORITHM_NAME, TESTED_SGLANG_VERSIONS
from sglang_histospec.plugin.adapter import AdapterConfig, HistorySpecCorpus, prompt_key
from sglang_histospec.plugin.algorithm import (
    DEFAULT_MAX_RUNNING_REQUESTS,
    DEFAULT_NUM_DRAFT_TOKENS,
    apply_server_arg_defaults,
    check_sglang_version,
)

N = 4


def corpus(n: int = N, **kw) -> HistorySpecCorpus:
    return HistorySpecCorpus(AdapterConfig(num_draft_tokens=n, **kw))


@pytest.mark.parametrize(
    ("custom", "tokens", "expected"),
    [
        ({"prompt_id": "gsm-1"}, [1, 2], "gsm-1"),
        ({"prompt_id": 17}, [1, 2], "17"),
        ({"other": 1}, [1, 2], prompt_key(None, [1, 2])),
        (None, [1, 2], prompt_key({}, [1, 2])),
    ],
)
def test_prompt_key(custom, tokens, expected):
    assert prompt_key(custom, tokens) == expected


def test_prompt_key_hash_depends_on_tokens_and_rejects_bad_ids():
    assert prompt_key(None, [1, 2]).startswith("tokens:")
    assert prompt_key(None, [1, 2]) != prompt_key(None, [2, 1])
    for bad in (True, 1.5, ["a"]):
        with pytest.raises(ValueError, match="prompt_id"):
            prompt_key({"prompt_id": bad}, [1])


def _check_layout(tokens: np.ndarray, mask: np.ndarray, roots: list[int], n: int = N) -> None:
    bs = len(roots)
    assert tokens.dtype == np.int64 and tokens.shape == (bs * n,)
    assert mask.dtype == np.bool_ and mask.shape == (bs * n * n,)
    t, m = tokens.reshape(bs, n), mask.reshape(bs, n, n)
    assert t[:, 0].tolist() == roots
    for b in range(bs):
        assert m[b].diagonal().all() and m[b][:, 0].all()  # every node sees itself and the root
        assert not np.triu(m[b], 1).any()  # ancestors come first


def test_history_push_drafts_the_continuation_in_sglang_layout():
    c = corpus()
    assert c.push(0, [("p", [[5, 6, 7, 8, 9]], None)]) == 1
    c.observe("r", "p", [1, 2], [5])
    tokens, mask = c.draft_batch(["r"])
    _check_layout(tokens, mask, [5])
    assert tokens.tolist() == [5, 6, 7, 8]
    assert mask.reshape(N, N).astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


def test_verified_drafts_teach_the_drafters_calibration():
    c = corpus()
    c.push(0, [("p", [[5, 6, 7, 8, 9]], None)])
    c.observe("r", "p", [1, 2], [5])
    c.draft_batch(["r"])  # drafts 6, 7, 8
    c.observe("r", "p", [1, 2], [5, 6, 7, 3])  # SGLang accepted 6, 7 and sampled 3 instead of 8
    table = c.drafter.calibration.table()
    assert sum(r["nodes"] for r in table) == 3 and sum(r["nodes"] * r["accepted"] for r in table) == 2
    assert sum(v["nodes"] for v in c.stats()["calibration"].values()) == 3
    c.observe("r", "p", [1, 2], [5, 6, 7, 3, 4])  # no draft in between: nothing more to learn
    assert sum(r["nodes"] for r in c.drafter.calibration.table()) == 3


def test_running_samples_of_a_prompt_draft_from_each_other():
    """SGLang's samples of one prompt share its key: a sample drafts what another one emitted while both run."""
    c = corpus(drafter=DrafterConfig(sources=("running",), prompt_tail=1))
    key = prompt_key(None, [1, 2])
    c.observe("a", key, [1, 2], [5, 6, 7])
    c.observe("b", key, [1, 2], [])
    tokens, mask = c.draft_batch(["b"])
    _check_layout(tokens, mask, [2])
    assert tokens.tolist() == [2, 5, 6, 7]
    c.finish("a", [5, 6, 7], aborted=False, truncated=False)  # a finished sibling: not a running one
    assert c.draft_batch(["b"])[0].tolist() == [2, 0, 0, 0]


def test_unknown_prompt_gets_padding_only():
    c = corpus()
    c.push(0, [("p", [[5, 6, 7, 8]], None)])
    c.observe("r", "unknown", [1, 2], [])
    tokens, mask = c.draft_batch(["r"])
    _check_layout(tokens, mask, [2])
    assert tokens.tolist() == [2, 0, 0, 0]  # padding = token 0 hanging off the root
    assert mask.reshape(N, N).sum() == N + (N - 1)


def test_incremental_and_fresh_observation_draft_the_same():
    a, b = corpus(), corpus()
    for x in (a, b):
        x.push(0, [("p", [[5, 6, 7, 8, 9, 10], [5, 6, 3, 4]], None)])
    for step in ([5], [5, 6], [5, 6, 7]):
        a.observe("r", "p", [1, 2], step)
    b.observe("r", "p", [1, 2], [5, 6, 7])
    assert a.draft_batch(["r"])[0].tolist() == b.draft_batch(["r"])[0].tolist()


def test_divergent_output_restarts_the_request():
    c = corpus()
    c.push(0, [("p", [[5, 6, 7, 8, 9]], None)])
    c.observe("r", "p", [1], [5, 6, 7])
    c.observe("r", "p", [1], [5, 6])  # retracted / re-run: fewer tokens than before
    assert c.draft_batch(["r"])[0].tolist() == [6, 7, 8, 9]
    assert c.counters["requests"] == 2


def test_batch_drafting_is_deterministic_and_ordered():
    def run():
        c = corpus()
        c.push(0, [("p", [[5, 6, 7, 8]], None), ("q", [[9, 8, 7, 6]], None)])
        c.observe("a", "p", [1], [5])
        c.observe("b", "q", [1], [9])
        c.observe("c", None, [1, 3], [])
        return c.draft_batch(["b", "a", "c"])

    (t1, m1), (t2, m2) = run(), run()
    assert t1.tolist() == t2.tolist() and m1.tolist() == m2.tolist()  # what TP ranks rely on
    _check_layout(t1, m1, [9, 5, 3])
    assert t1.reshape(3, N)[0].tolist() == [9, 8, 7, 6]


@pytest.mark.parametrize(
    ("aborted", "truncated", "record_truncated", "recorded"),
    [(False, False, True, True), (True, False, True, False), (False, True, True, True), (False, True, False, False)],
)
def test_finish_policy(aborted, truncated, record_truncated, recorded):
    c = corpus(record_truncated=record_truncated)
    c.observe("r", "p", [1], [5, 6, 7])
    assert c.finish("r", [5, 6, 7], aborted=aborted, truncated=truncated) is recorded
    c.end_step()
    c.observe("r2", "p", [1], [5])
    assert (c.draft_batch(["r2"])[0].tolist()[1:3] == [6, 7]) is recorded


def test_flush_keeps_history_and_siblings_become_history():
    c = corpus()
    c.observe("r", "p", [1], [])
    c.finish("r", [5, 6, 7, 8], aborted=False, truncated=False)
    c.observe("live", "p", [1], [5])
    c.forget_requests()  # what a flush does ...
    c.end_step()  # ... then the open step closes
    assert c.stats()["live_requests"] == 0 and c.stats()["prompts"] == 1
    c.observe("r2", "p", [1], [5])
    assert c.draft_batch(["r2"])[0].tolist() == [5, 6, 7, 8]


def test_bad_input_is_named():
    c = corpus()
    with pytest.raises(ValueError, match="never observed"):
        c.draft_batch(["nope"])
    with pytest.raises(ValueError, match="num_draft_tokens"):
        AdapterConfig(num_draft_tokens=1)
    with pytest.raises(ValueError, match="step"):
        c.push(-1, [])
    with pytest.raises(ValueError, match="empty prompt"):
        c.observe("r", "p", [], [])
    assert c.finish("never-seen", [1], aborted=False, truncated=False) is False


def _args(**kw):
    base = dict(
        device="cpu",
        disable_overlap_schedule=False,
        max_running_requests=None,
        enable_mixed_chunk=True,
        speculative_ngram_max_bfs_breadth=10,
        speculative_eagle_topk=None,
        speculative_num_draft_tokens=None,
        speculative_num_steps=None,
        speculative_ngram_external_corpus_path=None,
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_server_arg_defaults():
    a = _args()
    apply_server_arg_defaults(a)
    assert a.disable_overlap_schedule is True  # CPU has no overlap scheduling for speculative decoding
    assert a.max_running_requests == DEFAULT_MAX_RUNNING_REQUESTS
    assert a.speculative_num_draft_tokens == DEFAULT_NUM_DRAFT_TOKENS
    assert a.enable_mixed_chunk is False and a.speculative_eagle_topk == 10 and a.speculative_num_steps == 1
    b = _args(device="cuda", max_running_requests=64, speculative_num_draft_tokens=16)
    apply_server_arg_defaults(b)
    assert (b.disable_overlap_schedule, b.max_running_requests, b.speculative_num_draft_tokens) == (False, 64, 16)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"device": "npu"}, "--device"),
        ({"speculative_num_draft_tokens": 1}, "num-draft-tokens"),
        ({"speculative_ngram_external_corpus_path": "x.jsonl"}, "external-corpus"),
    ],
)
def test_server_arg_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        apply_server_arg_defaults(_args(**kw))


def test_version_check():
    assert ALGORITHM_NAME == "HISTOSPEC"
    assert check_sglang_version(TESTED_SGLANG_VERSIONS[0]) is None
    assert "0.5.23" in check_sglang_version("0.6.0")


def test_histospec_serve_maps_its_arguments_to_sglang():
    import argparse

    from sglang_histospec.commands import serve as serve_command
    from sglang_histospec.server.sglang_backend import _sglang_argv

    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    args = parser.parse_args(["--backend", "sglang", "--model", "/m", "--port", "31000", "--num-draft-tokens", "8"])
    argv = _sglang_argv(args)
    assert argv[:6] == ["--model-path", "/m", "--host", "127.0.0.1", "--port", "31000"]
    assert argv[argv.index("--speculative-algorithm") + 1] == ALGORITHM_NAME
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
    assert "--device" not in argv and "--dtype" not in argv  # "auto" leaves the choice to SGLang
    args = parser.parse_args(["--backend", "sglang", "--model", "/m", "--dtype", "float32"])
    args.sglang_args = ["--max-total-tokens", "4096"]
    argv = _sglang_argv(args)
    assert argv[argv.index("--dtype") + 1] == "float32" and argv[-2:] == ["--max-total-tokens", "4096"]
    plain = _sglang_argv(
        parser.parse_args(["--backend", "sglang", "--model", "/m", "--speculative-algorithm", "NONE"])
    )
    assert "--speculative-algorithm" not in plain
    durable = _sglang_argv(
        parser.parse_args(["--backend", "sglang", "--model", "/m", "--history-dir", "/h", "--max-text-chars", "9"])
    )
    assert durable[durable.index("--histospec-history-dir") + 1] == "/h"  # issue 44: the workers' durable store
    assert durable[durable.index("--histospec-max-text-chars") + 1] == "9"


def test_drafter_config_from_env():
    from sglang_histospec.plugin.adapter import DRAFTER_CONFIG_ENV, drafter_config_from_env

    assert drafter_config_from_env({}) == DrafterConfig()
    raw = '{"window": 2, "tree": false, "scorer": "counts", "sources": ["history"]}'
    cfg = drafter_config_from_env({DRAFTER_CONFIG_ENV: raw})
    assert (cfg.window, cfg.tree, cfg.scorer, cfg.sources) == (2, False, "counts", ("history",))
    for raw, match in (
        ("{", "not JSON"),
        ("[1]", "JSON object"),
        ('{"window": 0}', "window"),
        ('{"tree": false}', "chain mode belongs to the counts scorer"),
        ('{"nope": 1}', "field names"),
    ):
        with pytest.raises(ValueError, match=match):
            drafter_config_from_env({DRAFTER_CONFIG_ENV: raw})
    assert drafter_config_from_env({DRAFTER_CONFIG_ENV: '{"draft_threads": 4}'}).draft_threads == 4
    with pytest.raises(ValueError, match="draft_threads"):
        drafter_config_from_env({DRAFTER_CONFIG_ENV: '{"draft_threads": 0}'})


def test_histospec_serve_passes_draft_threads_to_the_plugin():
    """``histospec serve --backend sglang``'s drafter flags (``--draft-threads N``, ``--scorer``, ...) reach the
    workers through $HISTOSPEC_DRAFTER_CONFIG, merged into the fields already there."""
    import argparse

    from sglang_histospec.commands import serve as serve_command
    from sglang_histospec.plugin.adapter import DRAFTER_CONFIG_ENV, drafter_config_from_env
    from sglang_histospec.server.sglang_backend import drafter_env

    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    env = {DRAFTER_CONFIG_ENV: '{"window": 2}'}
    drafter_env(parser.parse_args(["--backend", "sglang", "--model", "/m"]), env)
    assert env == {DRAFTER_CONFIG_ENV: '{"window": 2}'}  # no flag: untouched
    drafter_env(parser.parse_args(["--backend", "sglang", "--model", "/m", "--draft-threads", "3"]), env)
    cfg = drafter_config_from_env(env)
    assert (cfg.window, cfg.draft_threads) == (2, 3)
    env = {}
    drafter_env(parser.parse_args(["--backend", "sglang", "--model", "/m", "--draft-threads", "2"]), env)
    assert drafter_config_from_env(env).draft_threads == 2
    with pytest.raises(ValueError, match="draft_threads=0"):
        drafter_env(parser.parse_args(["--backend", "sglang", "--model", "/m", "--draft-threads", "0"]), {})
    env = {}
    flags = ["--history-window", "3", "--scorer", "counts", "--draft-mode", "chain"]
    drafter_env(parser.parse_args(["--backend", "sglang", "--model", "/m", *flags]), env)
    cfg = drafter_config_from_env(env)
    assert (cfg.window, cfg.scorer, cfg.tree) == (3, "counts", False)
