"""HISTOSPEC inside a real SGLang 0.5.23 server on CPU (marker ``sglang``; harness: tests/sglang_harness).

Two servers on one tiny random Llama: SGLang without speculation (the reference) and ``histospec serve --backend
sglang`` (SGLang's server with ``--speculative-algorithm HISTOSPEC`` and the /histospec routes). SGLang verifies
greedily on CPU, so outputs must match token for token whatever was drafted.

Skips only when ``.venv-sglang`` is absent (run ``make install-sglang``); under CI (``CI`` set) it fails instead.
"""

from __future__ import annotations

import json
import random

import httpx
import pytest

from tests.sglang_harness import SGLangServer, start_python

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900), pytest.mark.usefixtures("sglang_harness")]

NUM_DRAFT_TOKENS = 6
MAX_NEW_TOKENS = 32
NUM_PROMPTS = 24
VOCAB = 64


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(0)
    return [[1] + [rng.randrange(4, VOCAB) for _ in range(rng.randrange(3, 12))] for _ in range(NUM_PROMPTS)]


CONFORMANCE_CODE = """
import json
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.speculative.ngram_worker import NGRAMWorker
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo, _assert_custom_spec_algo_conforms
from sglang_histospec.plugin import register
register(); register()  # idempotent
algo = SpeculativeAlgorithm.from_string("histospec")
_assert_custom_spec_algo_conforms(type(algo))
enum_methods = {n for n, v in vars(SpeculativeAlgorithm).items()
                if callable(v) and not n.startswith("_") and not isinstance(v, (classmethod, staticmethod))}
missing = sorted(n for n in enum_methods if not hasattr(algo, n))
worker_cls = algo.factory(None)
print(json.dumps({
    "custom": isinstance(algo, CustomSpecAlgo), "name": algo.name, "is_ngram": algo.is_ngram(),
    "has_draft_kv": algo.has_draft_kv(), "need_topk": algo.need_topk(), "overlap": algo.supports_overlap,
    "missing": missing, "worker_is_ngram": issubclass(worker_cls, NGRAMWorker), "worker": worker_cls.__name__,
}))
"""


@pytest.fixture(scope="module", autouse=True)
def conformance(sglang_harness):
    """SGLang's own checks of the registration, run in the background while the servers start."""
    proc = start_python(CONFORMANCE_CODE)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def servers(sglang_model_dir):
    """SGLang without speculation and with HISTOSPEC (``histospec serve --backend sglang``), started side by side."""
    plain = SGLangServer(["--model-path", sglang_model_dir])
    histospec = SGLangServer(
        ["--model-path", sglang_model_dir, "--speculative-num-draft-tokens", str(NUM_DRAFT_TOKENS)],
        module="sglang_histospec.server.sglang_backend",
    )
    try:
        plain.launch()
        histospec.launch()
        plain.wait_ready()
        histospec.wait_ready()
        print(
            f"\n[sglang harness] servers ready: plain {plain.startup_seconds:.1f} s, "
            f"HISTOSPEC {histospec.startup_seconds:.1f} s (started together)"
        )
        yield plain, histospec
    finally:
        plain.stop()
        histospec.stop()


@pytest.fixture(scope="module")
def reference(servers, prompts):
    """Greedy outputs of SGLang without speculation (its server is stopped afterwards)."""
    plain, _ = servers
    outputs = [o["output_ids"] for o in generate(plain, prompts, [None] * len(prompts))]
    plain.stop()
    return outputs


@pytest.fixture(scope="module")
def histospec(servers):
    return servers[1]


def generate(server: SGLangServer, prompts, prompt_ids, max_new_tokens: int = MAX_NEW_TOKENS) -> list[dict]:
    params = []
    for pid in prompt_ids:
        p = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
        if pid is not None:
            p["custom_params"] = {"prompt_id": pid}
        params.append(p)
    r = httpx.post(server.url + "/generate", json={"input_ids": prompts, "sampling_params": params}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def accept_lengths(outputs: list[dict]) -> list[float]:
    return [o["meta_info"]["spec_accept_length"] for o in outputs]


def stats(server: SGLangServer) -> dict:
    r = httpx.get(server.url + "/histospec/stats", timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["history"]


def mean(xs):
    return sum(xs) / len(xs)


def test_epochs_match_no_speculation_and_history_raises_accept_length(histospec, reference, prompts):
    ids = [f"prompt-{i}" for i in range(len(prompts))]
    first = generate(histospec, prompts, ids)
    assert [o["output_ids"] for o in first] == reference
    # A weight update or /flush_cache closes the step: epoch 1's responses become history for their prompt ids.
    assert httpx.post(histospec.url + "/flush_cache", timeout=120).status_code == 200
    second = generate(histospec, prompts, ids)
    assert [o["output_ids"] for o in second] == reference  # lossless with history drafts accepted
    tau1, tau2 = mean(accept_lengths(first)), mean(accept_lengths(second))
    print(f"\n[sglang harness] mean spec_accept_length epoch 1 {tau1:.2f}, epoch 2 {tau2:.2f}")
    assert tau2 > 2.0 and tau2 > tau1
    assert min(accept_lengths(second)) > 1.0
    # Unknown prompt ids: no history of their own, normal output; they still draft from the global source, which
    # now holds these very texts (greedy: every epoch writes the same), so they beat the cold first epoch.
    unknown = generate(histospec, prompts[:4], [f"never-seen-{i}" for i in range(4)])
    assert [o["output_ids"] for o in unknown] == reference[:4]
    assert mean(accept_lengths(unknown)) > tau1


def test_prompt_hash_fallback_without_prompt_id(histospec, reference, prompts):
    first = generate(histospec, prompts[:6], [None] * 6)
    assert httpx.post(histospec.url + "/flush_cache", timeout=120).status_code == 200
    second = generate(histospec, prompts[:6], [None] * 6)
    assert [o["output_ids"] for o in first] == [o["output_ids"] for o in second] == reference[:6]
    assert mean(accept_lengths(second)) > 2.0


def test_push_is_visible_and_survives_flush_and_weight_update(histospec, reference, prompts, sglang_model_dir):
    before = stats(histospec)
    body = {"step": 7, "entries": [{"prompt_id": "pushed-0", "responses": [reference[0]], "rewards": [1.0]}]}
    r = httpx.post(histospec.url + "/histospec/history", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 1}
    after_push = stats(histospec)
    assert after_push["adapter_pushed"] == before.get("adapter_pushed", 0) + 1
    assert after_push["prompts"] == before["prompts"] + 1
    assert after_push["history_tokens"] > before["history_tokens"]

    r = httpx.post(histospec.url + "/update_weights_from_disk", json={"model_path": sglang_model_dir}, timeout=300)
    assert r.status_code == 200 and r.json()["success"], r.text
    assert httpx.post(histospec.url + "/flush_cache", timeout=120).status_code == 200
    kept = stats(histospec)
    assert kept["prompts"] >= after_push["prompts"] and kept["history_tokens"] >= after_push["history_tokens"]

    [out] = generate(histospec, prompts[:1], ["pushed-0"])
    assert out["output_ids"] == reference[0]
    assert out["meta_info"]["spec_accept_length"] > 2.0  # drafted from the pushed response

    bad = httpx.post(histospec.url + "/histospec/history", json={"step": -1, "entries": []}, timeout=60)
    assert bad.status_code in (400, 422)
    step = stats(histospec)["open_step"]
    r = httpx.post(histospec.url + "/histospec/end_step", json={"step": None}, timeout=120)
    assert r.status_code == 200 and r.json() == {"success": True}
    assert stats(histospec)["open_step"] == step + 1


def test_registration_passes_sglang_conformance_checks(conformance):
    stdout, stderr = conformance.communicate(timeout=600)
    assert conformance.returncode == 0, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result == {
        "custom": True,
        "name": "HISTOSPEC",
        "is_ngram": True,
        "has_draft_kv": False,
        "need_topk": False,
        "overlap": True,
        "missing": [],
        "worker_is_ngram": True,
        "worker": "HistoSpecWorker",
    }
