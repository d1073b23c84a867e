"""Engine API: logprobs against a plain transformers forward, stop / length / seeds, continuous batching,
abort, weight updates from disk, cache flushes, bad input, and recording responses into the history."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_histospec.drafting import DrafterConfig
from sglang_histospec.engine import EngineConfig, GenerateRequest, SamplingParams
from sglang_histospec.engine.engine import Engine
from tests.helpers.engine_tools import FixedBudgets, ScriptedDrafter, reference_probs
from tests.helpers.tiny import EOS_ID, make_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")


VOCAB = 48


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    return {
        "a": make_tiny_model_dir(root / "a", arch="qwen2", vocab_size=VOCAB, seed=7),
        "b": make_tiny_model_dir(root / "b", arch="qwen2", vocab_size=VOCAB, seed=8),
    }


def req(rid, prompt, **sampling):
    kw = {k: sampling.pop(k) for k in ("prompt_id", "return_logprob") if k in sampling}
    return GenerateRequest(rid=rid, input_ids=prompt, sampling=SamplingParams(**sampling), **kw)


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.0},
        {"temperature": 1.0},
        {"temperature": 0.8, "top_k": 10, "top_p": 0.9},
    ],
)
@pytest.mark.parametrize("alg", ["NONE", "HISTOSPEC"])
def test_logprobs_match_transformers_forward(paths, sampling, alg):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(paths["a"]).eval()
    prompts = [[1, 5, 6, 7], [1, 9], [1, 20, 21, 22, 23, 24]]
    # drafts: the greedy continuation of each prompt (mostly right at low temperature)
    greedy = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm="NONE")).generate(
        [
            req(f"g{i}", p, temperature=0.0, max_new_tokens=12, ignore_eos=True, prompt_id=f"p{i}")
            for i, p in enumerate(prompts)
        ]
    )
    drafter = ScriptedDrafter({f"p{i}": g.output_ids for i, g in enumerate(greedy)}, vocab_size=VOCAB, branch=2)
    engine = Engine(
        EngineConfig(model_path=paths["a"], speculative_algorithm=alg), drafter=drafter, budgets=FixedBudgets(6)
    )
    results = engine.generate(
        [
            req(
                f"r{i}",
                p,
                max_new_tokens=12,
                ignore_eos=True,
                seed=i,
                prompt_id=f"p{i}",
                return_logprob=True,
                **sampling,
            )
            for i, p in enumerate(prompts)
        ]
    )
    for p, res in zip(prompts, results):
        assert len(res.output_logprobs) == len(res.output_ids) == 12
        with torch.no_grad():
            logits = hf(torch.tensor([p + res.output_ids])).logits[0].double().numpy()
        for k, tok in enumerate(res.output_ids):
            q = reference_probs(
                logits[len(p) - 1 + k], sampling["temperature"], sampling.get("top_k", -1), sampling.get("top_p", 1.0)
            )
            assert res.output_logprobs[k] == pytest.approx(np.log(q[tok]), abs=1e-4)


def test_stop_length_and_seeds(paths):
    engine = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm="NONE"))
    [free] = engine.generate([req("f", [1, 3, 4], max_new_tokens=20, ignore_eos=True, seed=11)])
    assert free.finish_reason == {"type": "length", "length": 20} and free.completion_tokens == 20
    stop_tok = free.output_ids[5]
    first = free.output_ids.index(stop_tok)
    [stopped] = engine.generate(
        [req("s", [1, 3, 4], max_new_tokens=20, ignore_eos=True, seed=11, stop_token_ids=[stop_tok])]
    )
    assert stopped.output_ids == free.output_ids[: first + 1]
    assert stopped.finish_reason == {"type": "stop", "matched": stop_tok}
    # the same seed gives the same output whatever else is in the batch
    batch = engine.generate(
        [req(f"b{i}", [1, 3 + i, 4], max_new_tokens=20, ignore_eos=True, seed=100 + i) for i in range(5)]
        + [req("again", [1, 3, 4], max_new_tokens=20, ignore_eos=True, seed=11)]
    )
    assert batch[-1].output_ids == free.output_ids
    # EOS stops unless ignore_eos
    [eos] = engine.generate([req("e", [1, 3, 4], max_new_tokens=20, seed=11, stop_token_ids=[])])
    if EOS_ID in free.output_ids:
        assert eos.output_ids == free.output_ids[: free.output_ids.index(EOS_ID) + 1]
    else:
        assert eos.output_ids == free.output_ids


@pytest.mark.parametrize("alg", ["NONE", "HISTOSPEC"])
@pytest.mark.parametrize(("sampling", "cut"), [({"temperature": 1.0}, 1), ({"temperature": 1.0}, 9),
                                               ({"temperature": 0.8, "top_k": 10, "top_p": 0.9}, 15)])  # fmt: skip
def test_resumed_request_with_seed_offset_continues_the_same_draws(paths, alg, sampling, cut):
    """A request resumed from prompt + its first ``cut`` tokens with seed_offset=cut emits the original's rest
    (what a router migration relies on); without the offset it draws differently."""
    engine = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm=alg))
    prompt = [1, 3, 4, 5]
    [full] = engine.generate([req("full", prompt, max_new_tokens=24, ignore_eos=True, seed=5, **sampling)])
    head = full.output_ids[:cut]
    [rest] = engine.generate(
        [req("rest", prompt + head, max_new_tokens=24 - cut, ignore_eos=True, seed=5, seed_offset=cut, **sampling)]
    )
    assert head + rest.output_ids == full.output_ids
    [fresh] = engine.generate(
        [req("fresh", prompt + head, max_new_tokens=24 - cut, ignore_eos=True, seed=5, **sampling)]
    )
    assert fresh.output_ids != rest.output_ids


def test_seed_offset_is_validated():
    with pytest.raises(ValueError, match="seed_offset"):
        SamplingParams(seed_offset=-1)


def test_continuous_batching_abort_and_queue(paths):
    engine = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm="NONE", max_running_requests=2))
    for i in range(4):
        engine.add_request(req(f"r{i}", [1, 5 + i], max_new_tokens=6 + 4 * i, ignore_eos=True, temperature=0.0))
    done = engine.step()
    assert engine.stats()["requests_running"] == 2 and engine.stats()["requests_waiting"] == 2
    assert engine.abort("r3") and not engine.abort("nope")
    engine.add_request(req("late", [1, 9], max_new_tokens=3, ignore_eos=True, temperature=0.0))
    assert engine.abort("r1")  # running: its result comes from the next step
    while engine.has_unfinished():
        done += engine.step()
    by_rid = {r.rid: r for r in done}
    assert set(by_rid) == {"r0", "r1", "r2", "r3", "late"}
    assert by_rid["r3"].finish_reason["type"] == "abort" and by_rid["r3"].output_ids == []
    assert by_rid["r1"].finish_reason["type"] == "abort" and 1 <= len(by_rid["r1"].output_ids) < 10
    assert by_rid["r2"].completion_tokens == 14 and by_rid["late"].completion_tokens == 3
    # requests that joined later produce what they produce alone
    alone = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm="NONE")).generate(
        [req("x", [1, 7], max_new_tokens=14, ignore_eos=True, temperature=0.0)]
    )[0]
    assert alone.output_ids == by_rid["r2"].output_ids


def test_update_weights_from_disk_and_flush(paths):
    engine = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm="NONE"))
    prompt = [1, 4, 5, 6]
    a = engine.generate([req("a", prompt, max_new_tokens=10, ignore_eos=True, temperature=0.0, prompt_id="p")])[0]
    engine.add_request(req("mid", prompt, max_new_tokens=10, ignore_eos=True, temperature=0.0))
    engine.step()  # "mid" runs with the old weights for a step, then continues with the new ones
    history_before = engine.drafter.stats()
    engine.update_weights_from_disk(paths["b"], weight_version="v2")
    done = []
    while engine.has_unfinished():
        done += engine.step()
    b_ref = Engine(EngineConfig(model_path=paths["b"], speculative_algorithm="NONE")).generate(
        [req("b", prompt, max_new_tokens=10, ignore_eos=True, temperature=0.0)]
    )[0]
    b = engine.generate([req("b", prompt, max_new_tokens=10, ignore_eos=True, temperature=0.0)])[0]
    assert b.output_ids == b_ref.output_ids != a.output_ids
    # the request that straddled the update: first token from the old weights, the rest from the new ones
    with torch.no_grad():
        from transformers import AutoModelForCausalLM

        hf_b = AutoModelForCausalLM.from_pretrained(paths["b"]).eval()
        mid = done[0].output_ids
        logits = hf_b(torch.tensor([prompt + mid])).logits[0]
    assert mid[0] == a.output_ids[0]
    assert mid[1:] == logits[len(prompt) : -1].argmax(-1).tolist()
    assert engine.stats()["weight_version"] == "v2"
    assert engine.drafter.stats()["prompts"] == history_before["prompts"]  # history kept
    assert engine.flush_cache()
    assert engine.drafter.stats()["prompts"] == history_before["prompts"]
    again = engine.generate([req("c", prompt, max_new_tokens=10, ignore_eos=True, temperature=0.0)])[0]
    assert again.output_ids == b.output_ids
    with pytest.raises(ValueError, match="not a directory"):
        engine.update_weights_from_disk("/nonexistent/dir")


def test_weights_changed_in_place_reach_a_packed_engine(paths):
    """An optimizer step on ``engine.model`` (here: a copy of other weights) is sampled from after
    ``weights_changed``, also when the forward pass reads packed copies of the linears."""
    from transformers import AutoModelForCausalLM

    prompt = [1, 4, 5, 6]
    greedy = dict(max_new_tokens=10, ignore_eos=True, temperature=0.0)
    engine = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm="NONE", packed_linears=True))
    a = engine.generate([req("a", prompt, **greedy)])[0]
    b_ref = Engine(EngineConfig(model_path=paths["b"], speculative_algorithm="NONE")).generate(
        [req("b", prompt, **greedy)]
    )[0]
    assert a.output_ids != b_ref.output_ids
    new = AutoModelForCausalLM.from_pretrained(paths["b"]).state_dict()
    with torch.no_grad():
        for name, tensor in engine.model.state_dict().items():
            tensor.copy_(new[name])
    before = engine.stats()["weight_updates"]
    engine.weights_changed()
    assert engine.generate([req("b", prompt, **greedy)])[0].output_ids == b_ref.output_ids
    assert engine.stats()["weight_updates"] == before + 1


@pytest.mark.parametrize("alg", ["NONE", "HISTOSPEC"])
def test_a_reserved_cache_does_not_grow_while_decoding_and_changes_no_token(paths, alg):
    """``reserve`` sizes the KV cache for the longest request up front (a growth copies every cached token, too
    slow to land in a timed step); the tokens are those of an engine that grew it on demand."""
    outs, growths = [], []
    for reserve in (False, True):
        engine = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm=alg, max_running_requests=3))
        if reserve:
            engine.reserve(3 + 80)
        before = engine.stats()["kv_cache_growths"]
        results = engine.generate([req(f"r{i}", [1, 2, 3], max_new_tokens=80, seed=i) for i in range(3)])
        outs.append([r.output_ids for r in results])
        growths.append(engine.stats()["kv_cache_growths"] - before)
    assert outs[0] == outs[1]
    assert growths[1] == 0
    assert growths[0] > 0 or alg == "HISTOSPEC"  # (the cut's profile passes at the start have grown it already)
    with pytest.raises(ValueError, match="reserve"):
        engine.reserve(0)


def test_flush_refused_while_running(paths):
    engine = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm="NONE"))
    engine.add_request(req("r", [1, 2], max_new_tokens=5))
    engine.step()
    assert engine.flush_cache() is False


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: req("x", [1, VOCAB]), "outside the vocabulary"),
        (lambda: req("x", [1, 2], stop_token_ids=[VOCAB + 3]), "stop_token_ids"),
        (lambda: req("x", [1, 2], max_new_tokens=10_000), "max_context_len"),
    ],
)
def test_bad_requests_name_the_field(paths, make, match):
    engine = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm="NONE"))
    with pytest.raises(ValueError, match=match):
        engine.add_request(make())
    assert not engine.has_unfinished()


def test_duplicate_rid_and_bad_params():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="input_ids"):
        GenerateRequest(rid="r", input_ids=[])
    with pytest.raises(ValueError, match="speculative_algorithm"):
        EngineConfig(model_path="/x", speculative_algorithm="EAGLE")


def test_duplicate_rid(paths):
    engine = Engine(EngineConfig(model_path=paths["a"], speculative_algorithm="NONE"))
    engine.add_request(req("r", [1, 2], max_new_tokens=3))
    with pytest.raises(ValueError, match="already queued"):
        engine.add_request(req("r", [1, 2], max_new_tokens=3))


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not supported by the torch engine"):
        Engine(EngineConfig(model_path=str(tmp_path)))


@pytest.mark.parametrize("alg", ["NONE", "HISTOSPEC"])
def test_finished_responses_recorded_aborted_not(paths, alg):
    """Finished responses become siblings (drafts within the step) and history after end_step; aborted ones and
    requests without a prompt id are never recorded."""
    # draft_selection="always": this test checks that history turns into accepted drafts, not whether drafting pays
    # (the cost-aware cut measures wall time, so a loaded machine may rightly decline to draft); the recorded
    # sources only, so that what the second request accepts comes from the recorded response, not from its own
    # repetitive context (the self source) or other prompts (global)
    drafter = DrafterConfig(sources=("history", "siblings"))
    engine = Engine(
        EngineConfig(model_path=paths["a"], speculative_algorithm=alg, draft_selection="always", drafter=drafter)
    )
    prompt = [1, 30, 31, 32]
    first = engine.generate([req("a", prompt, prompt_id="p", max_new_tokens=16, ignore_eos=True, temperature=0.0)])[0]
    engine.generate([req("anon", [1, 40], max_new_tokens=4, ignore_eos=True, temperature=0.0)])
    engine.add_request(req("ab", [1, 41], prompt_id="q", max_new_tokens=30, ignore_eos=True))
    engine.step()
    engine.abort("ab")
    while engine.has_unfinished():
        engine.step()
    stats = engine.drafter.stats()
    assert stats["siblings"] == 1 and stats["requests"] == 0  # neither the anonymous nor the aborted one
    engine.drafter.end_step(0)
    stats = engine.drafter.stats()
    assert stats["prompts"] == 1 and stats["history_tokens"] >= len(first.output_ids)
    if alg == "HISTOSPEC":
        second = engine.generate(
            [req("b", prompt, prompt_id="p", max_new_tokens=16, ignore_eos=True, temperature=0.0)]
        )[0]
        assert second.output_ids == first.output_ids
        assert second.spec_accepted_tokens >= 10 and second.spec_verify_ct <= 6


def test_admission_order_keeps_each_requests_tokens(paths):
    """Unseeded requests draw the stream of their arrival, so spreading a prompt's samples ("groups") changes which
    request runs when, not what any request emits."""
    out, started = {}, {}
    for admission in ("fifo", "groups"):
        engine = Engine(
            EngineConfig(
                model_path=paths["a"],
                speculative_algorithm="HISTOSPEC",
                max_running_requests=2,
                admission=admission,
                seed=3,
            )
        )
        requests = [
            req(f"{p}{k}", [1, 5 + i, 9], prompt_id=p, max_new_tokens=8 + 3 * k, ignore_eos=True, temperature=1.0)
            for i, p in enumerate("ab")
            for k in range(3)
        ]
        for r in requests:
            engine.add_request(r)
        results = engine.step()
        started[admission] = [st.req.rid for st in engine.scheduler.running]
        while engine.has_unfinished():
            results += engine.step()
        out[admission] = {r.rid: r.output_ids for r in results}
    assert started == {"fifo": ["a0", "a1"], "groups": ["a0", "b0"]}
    assert out["fifo"] == out["groups"] and len(out["fifo"]) == 6
    with pytest.raises(ValueError, match="admission='random'"):
        EngineConfig(model_path=paths["a"], admission="random")
