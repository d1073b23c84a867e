"""The generation backend the trainer plugs into TRL's ``vllm_generation`` slot: rollout servers instead of vLLM.

:class:`HistoSpecGeneration` honours the interface TRL 1.16 calls there (``sync_weights``, ``generate``; when and
with what: its class docstring); it imports neither TRL nor vLLM.

Example (what TRL does with it)::

    backend = HistoSpecGeneration(servers, weight_sync, accelerator, model_fn, sampling)
    backend.sync_weights()      # save + /update_weights_from_disk, weight_version = global step
    _, completion_ids, logprobs, _ = backend.generate(prompts=[[1, 5, 7]] * 4, images=None, num_generations=4)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_histospec.drafting.prompt_ids import token_prompt_id
from trl_integration.servers import Completion, RolloutServers, SamplingConfig


def sampling_from_trainer(trainer: Any) -> SamplingConfig:
    """TRL's generation settings (``temperature, top_p, top_k, max_completion_length``, EOS ids) as server sampling
    parameters; ValueError for settings the rollout route does not carry (``min_p``, ``repetition_penalty``,
    ``generation_kwargs``)."""
    args = trainer.args
    unsupported = {
        "min_p": (getattr(args, "min_p", None), (None, 0.0)),
        "repetition_penalty": (getattr(args, "repetition_penalty", 1.0), (None, 1.0)),
        "generation_kwargs": (getattr(args, "generation_kwargs", None), (None, {})),
    }
    for name, (value, neutral) in unsupported.items():
        if value not in neutral:
            raise ValueError(
                f"{name}={value!r} is not sent to the rollout servers (only temperature, top_p, top_k and "
                f"max_completion_length are); leave {name} at its default"
            )
    top_k = getattr(args, "top_k", None)
    eos = getattr(trainer, "eos_token_ids", None)
    if eos is None:
        tok_eos = getattr(getattr(trainer, "processing_class", None), "eos_token_id", None)
        eos = [] if tok_eos is None else [tok_eos]
    elif isinstance(eos, int):
        eos = [eos]
    return SamplingConfig(
        max_new_tokens=int(args.max_completion_length),
        temperature=float(args.temperature),
        top_p=float(args.top_p if args.top_p is not None else 1.0),
        top_k=-1 if top_k in (None, 0) else int(top_k),
        stop_token_ids=[int(t) for t in eos],
    )


@dataclass(slots=True)
class GenerationRecord:
    """One ``generate`` call: the prompts (token ids), their history ids and the completions."""

    prompt_token_ids: list[list[int]]
    prompt_ids: list[str | None]
    completions: list[Completion] = field(default_factory=list)


class HistoSpecGeneration:
    """Duck-typed stand-in for TRL's ``VLLMGeneration`` (``sync_weights`` and ``generate``).

    ``prompt_ids_fn()`` returns the history ids of the rows being generated (set by the trainer before TRL's
    generation starts; None for a row = the id derived from its tokens), or None; ids are used only when there is
    one per prompt. ``records`` collects every
    ``generate`` call since the trainer last cleared it.

    TRL 1.16 calls ``backend.sync_weights()`` before a generation whenever ``state.global_step`` changed since the last
    sync (so never during gradient-accumulation micro-steps or ``num_iterations`` reuse), then
    ``backend.generate(prompts=token_ids, images=..., num_generations=G, profiler=...)`` with this rank's prompts (the
    G copies of each prompt included) and keeps ``logprobs[i][t][0]`` as the sampling logprob of token t, which feeds
    its importance-sampling correction. This class honours that interface; it imports neither TRL nor vLLM.
    """

    def __init__(
        self,
        servers: RolloutServers,
        weight_sync: Any,
        accelerator: Any,
        model_fn: Callable[[], Any],
        step_fn: Callable[[], int],
        sampling: SamplingConfig,
        prompt_ids_fn: Callable[[], Sequence[str | None] | None] = lambda: None,
    ) -> None:
        self.servers = servers
        self.weight_sync = weight_sync
        self.accelerator = accelerator
        self.model_fn = model_fn
        self.step_fn = step_fn
        self.sampling = sampling
        self.prompt_ids_fn = prompt_ids_fn
        self.records: list[GenerationRecord] = []
        self.synced_steps: list[int] = []

    def sync_weights(self) -> None:
        step = int(self.step_fn())
        self.weight_sync.sync(self.accelerator, self.model_fn(), step)
        self.synced_steps.append(step)

    def request_args(self, prompts: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[str | None]]:
        """``(prompt_token_ids, prompt_ids)`` that :meth:`generate` sends for ``prompts``: the rows' history ids,
        or the servers' rule on the tokens for a row without one (all None when the trainer set no ids)."""
        prompt_token_ids = [list(p) for p in prompts]
        ids = self.prompt_ids_fn()
        pids: list[str | None] = [None] * len(prompts)
        if ids is not None and len(ids) == len(prompts):  # rows without an id: the servers' rule on the tokens
            pids = [pid if pid is not None else token_prompt_id(p) for pid, p in zip(ids, prompt_token_ids)]
        return prompt_token_ids, pids

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        images: Any = None,
        num_generations: int = 1,
        profiler: Any = None,
    ) -> tuple[list[list[int]], list[list[int]], list[list[list[float]]], None]:
        """``(prompt_ids, completion_ids, logprobs [B][T][1], None)`` for this rank's prompts (token ids)."""
        if images is not None and any(img for img in images):
            raise ValueError("images are not supported by the rollout servers; train text-only prompts")
        prompt_token_ids, pids = self.request_args(prompts)
        with profiler if profiler is not None else contextlib.nullcontext():
            outs = self.servers.generate(
                prompt_token_ids,
                pids,
                self.sampling,
                return_logprob=True,
                fallback_route=self.accelerator.process_index,
            )
        self.records.append(GenerationRecord(prompt_token_ids, pids, outs))
        completion_ids = [o.completion_ids for o in outs]
        logprobs = [[[lp] for lp in (o.logprobs or [])] for o in outs]
        return prompt_token_ids, completion_ids, logprobs, None
