"""One prompt-id rule on every path: the same prompt gets the same history key from the rule itself, the SGLang
plugin's adapter, the router's placement, the torch backend's records and the trainer (generation and rollout_func).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_histospec.drafting.prompt_ids import prompt_id_for, token_prompt_id
from sglang_histospec.plugin.adapter import prompt_key
from sglang_histospec.router.items import item_prompt_id
from tests.helpers.server_harness import ServerThread, shared_tiny_model_dir
from trl_integration.generation import HistoSpecGeneration
from trl_integration.prompt_ids import resolve_prompt_ids
from trl_integration.rollout import make_rollout_func
from trl_integration.servers import SamplingConfig

CASES = [  # (custom_params, prompt tokens): distinct prompts, so each case adds its own key to a shared server
    ({"prompt_id": "gsm-17"}, [1, 8, 9]),
    ({"prompt_id": 7}, [1, 8, 10]),
    (None, [1, 8, 11]),
    ({}, [1, 8, 12, 13]),
    ({"prompt_id": None}, [1, 8, 14]),
]


class _CapturingServers:
    """Stands in for ``RolloutServers``: remembers the prompt ids it is asked to generate with."""

    def __init__(self) -> None:
        self.pids: list[Any] = []

    def generate(self, input_ids, prompt_ids, sampling, return_logprob=True, fallback_route=0):  # noqa: ANN001
        self.pids += list(prompt_ids)
        return []


def _explicit(custom: dict | None) -> Any:
    return None if custom is None else custom.get("prompt_id")


def via_adapter(custom: dict | None, tokens: list[int]) -> str:
    return prompt_key(custom, tokens)


def via_router(custom: dict | None, tokens: list[int]) -> str:
    item: dict[str, Any] = {"input_ids": tokens}
    if custom is not None:
        item["sampling_params"] = {"custom_params": custom}
    return item_prompt_id(item)


def via_trainer_generation(custom: dict | None, tokens: list[int]) -> str:
    row = {"prompt": "text of the prompt"}
    if _explicit(custom) is not None:
        row["prompt_id"] = _explicit(custom)
    ids = resolve_prompt_ids([row], "prompt_id", hash_missing=True)
    servers = _CapturingServers()
    accelerator = SimpleNamespace(process_index=0)
    gen = HistoSpecGeneration(servers, None, accelerator, lambda: None, lambda: 0, SamplingConfig(), lambda: ids)
    gen.generate([tokens])
    return servers.pids[0]


def via_rollout_func(custom: dict | None, tokens: list[int]) -> str:
    rollout = make_rollout_func("http://127.0.0.1:9", prompt_id_fn=lambda prompt: _explicit(custom))
    captured = _CapturingServers()
    rollout.servers.generate = captured.generate
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(process_index=0, is_main_process=True),
        use_vllm=True,  # the trainer syncs the weights itself: no sync here
        state=SimpleNamespace(global_step=0),
        args=SimpleNamespace(max_completion_length=4, temperature=1.0, top_p=1.0, top_k=None),
        eos_token_ids=[0],
        _tokenize_prompts=lambda prompts: ([tokens for _ in prompts], None, None),
    )
    rollout(["text of the prompt"], trainer)
    rollout.servers.close()
    return captured.pids[0]


PATHS: dict[str, Callable[[dict | None, list[int]], str]] = {
    "adapter": via_adapter,
    "router": via_router,
    "trainer_generation": via_trainer_generation,
    "rollout_func": via_rollout_func,
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(("custom", "tokens"), CASES)
def test_every_path_gives_the_rule_s_id(path, custom, tokens):
    assert PATHS[path](custom, tokens) == prompt_id_for(custom, tokens)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerThread(shared_tiny_model_dir(tmp_path_factory), speculative_algorithm="HISTOSPEC") as srv:
        yield srv


@pytest.mark.parametrize(("custom", "tokens"), CASES)
def test_the_torch_backend_records_under_the_rule_s_id(server, custom, tokens):
    """Every finished response is recorded (a request without an id under the id derived from its tokens)."""
    drafter = server.backend.engine.drafter
    before = set(drafter.prompt_sizes())
    server.client.generate([tokens], prompt_ids=[_explicit(custom)], max_new_tokens=4, temperature=0, ignore_eos=True)
    server.client.end_step()  # the recorded sibling becomes history
    assert set(drafter.prompt_sizes()) - before == {prompt_id_for(custom, tokens)}


def test_a_router_text_item_without_an_id_has_none():
    assert item_prompt_id({"text": "hello"}) is None
    assert item_prompt_id({"text": "hello", "sampling_params": {"custom_params": {"prompt_id": 3}}}) == "3"
    assert item_prompt_id({"input_ids": [4, 5]}) == token_prompt_id([4, 5])
