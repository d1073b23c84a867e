"""Configuration, request and result types of the embedded torch engine (no torch import here).

The HTTP server converts a request body into these dataclasses once, without importing torch
(``server/schemas.py``, ``to_generate_requests``); only ``engine/engine.py`` imports torch and transformers. Example::

    from sglang_histospec.engine import EngineConfig, GenerateRequest, SamplingParams
    from sglang_histospec.engine.engine import Engine        # imports torch + transformers
    engine = Engine(EngineConfig(model_path="/tmp/tiny", speculative_algorithm="HISTOSPEC"))
    req = GenerateRequest(rid="r0", input_ids=[1, 5, 7], prompt_id="p0",
                          sampling=SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=16, seed=0))
    [result] = engine.generate([req])
    result.output_ids, result.finish_reason   # e.g. [5, 9, 2], {"type": "stop", "matched": 2}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglang_histospec.drafting.types import MAX_TOKEN_ID

if TYPE_CHECKING:  # the drafting types; imported lazily by the engine
    from sglang_histospec.drafting import BudgetConfig, DrafterConfig
    from sglang_histospec.drafting.draft_cut import StepCostConfig
    from sglang_histospec.engine.governor import GovernorConfig

SPECULATIVE_ALGORITHMS = ("HISTOSPEC", "NONE")
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
ADMISSIONS = ("fifo", "groups")
"""Admission orders of the engine's scheduler (``EngineConfig.admission``)."""
DRAFT_SELECTIONS = ("adaptive", "always")
"""Whether and how much a step drafts (``EngineConfig.draft_selection``)."""


def _check_token_ids(name: str, ids: Any, allow_empty: bool) -> None:
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"{name} must be a list of ints, got {type(ids).__name__}")
    if not ids and not allow_empty:
        raise ValueError(f"{name} is empty; pass at least one token id")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < MAX_TOKEN_ID:
            raise ValueError(f"{name} contains {t!r}; token ids must be ints in [0, 2**31)")


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling parameters (SGLang's names and defaults).

    The processed distribution is ``softmax(logits / temperature)``, then top-k, then top-p (each renormalised),
    the order SGLang uses. ``temperature == 0`` means greedy (argmax).
    """

    temperature: float = 1.0
    """0 = greedy; otherwise logits are divided by it."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1 = off. The smallest set of top tokens whose mass reaches top_p is kept."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 (or 0) = off."""
    max_new_tokens: int = 128
    """Upper bound on generated tokens (the finish reason is "length" when it is reached)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop tokens, on top of the model's EOS ids (unless ``ignore_eos``). The stop token is emitted."""
    ignore_eos: bool = False
    """Do not stop at the model's EOS ids (``stop_token_ids`` still stop)."""
    seed: int | None = None
    """Sampling seed of this request; None = derived from the engine seed and the request counter. With a seed,
    the output depends only on the seed, the prompt and the mode (with / without HistoSpec), not on batching."""
    seed_offset: int = 0
    """Output token j is drawn with the seeded stream's uniform ``seed_offset + j``: a request resumed from
    prompt + its first k output tokens with ``seed_offset=k`` emits the tokens the original would have emitted."""
    skip_special_tokens: bool = True
    """Detokenizing the output (the server's ``text``) drops special tokens; the engine itself ignores it."""

    def __post_init__(self) -> None:
        if (
            not isinstance(self.temperature, (int, float))
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ValueError(f"temperature={self.temperature!r}; use a finite number >= 0 (0 = greedy)")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}; use a number in (0, 1] (1 = off)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k={self.top_k!r}; use an int >= 1, or -1 / 0 for off")
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, int)
            or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}; use an int >= 1")
        _check_token_ids("stop_token_ids", self.stop_token_ids, allow_empty=True)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed={self.seed!r}; use an int >= 0 or None")
        if isinstance(self.seed_offset, bool) or not isinstance(self.seed_offset, int) or self.seed_offset < 0:
            raise ValueError(f"seed_offset={self.seed_offset!r}; use an int >= 0 (0 = a fresh request)")
        if not isinstance(self.skip_special_tokens, bool):
            raise ValueError(f"skip_special_tokens={self.skip_special_tokens!r}; use True or False")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


@dataclass(slots=True)
class GenerateRequest:
    """One generation request. ``rid`` must be unique among the requests the engine holds."""

    rid: str
    input_ids: list[int]
    """Prompt token ids (non-empty, each < the model's vocabulary size)."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_id: str | None = None
    """Stable prompt ID across RL steps (history key); None = no history drafting for this request (the own
    context and the global index may still draft) and the response is not recorded."""
    return_logprob: bool = False
    """Fill ``GenerateResult.output_logprobs``."""

    def __post_init__(self) -> None:
        if not isinstance(self.rid, str) or not self.rid:
            raise ValueError(f"rid={self.rid!r}; use a non-empty string")
        _check_token_ids("input_ids", self.input_ids, allow_empty=False)
        if not isinstance(self.sampling, SamplingParams):
            raise ValueError(f"sampling is a {type(self.sampling).__name__}; pass a SamplingParams")
        if self.prompt_id is not None and (not isinstance(self.prompt_id, str) or not self.prompt_id):
            raise ValueError(f"prompt_id={self.prompt_id!r}; use a non-empty string or None")


@dataclass(slots=True)
class GenerateResult:
    """A finished (or aborted) request.

    ``finish_reason`` uses SGLang's shapes: ``{"type": "length", "length": n}``, ``{"type": "stop", "matched": id}``
    or ``{"type": "abort", "message": str}``.
    """

    rid: str
    output_ids: list[int]
    finish_reason: dict[str, Any]
    output_logprobs: list[float] | None = None
    """[completion_tokens] logprob of each emitted token under the processed distribution (temperature, top-k,
    top-p applied and renormalised; SGLang's default, ``SGLANG_RETURN_ORIGINAL_LOGPROB=0``); for greedy requests
    the log-softmax of the raw logits. None unless ``return_logprob``."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    spec_verify_ct: int = 0
    """Verify steps (forward passes after the prefill) that produced this request's tokens; the prefill covers
    the prompt minus its last token, so even the first output token comes from a verify step."""
    spec_draft_tokens: int = 0
    """Draft nodes proposed for this request (the root excluded)."""
    spec_accepted_tokens: int = 0
    """Draft nodes accepted (bonus tokens excluded); tau = completion_tokens / spec_verify_ct."""
    prompt_id: str | None = None


@dataclass(slots=True)
class DraftPolicyConfig:
    """Knobs of the draft-size policy (``engine/policy.py`` DraftSizePolicy); whether it cuts and guards is
    ``EngineConfig.draft_selection``."""

    budget: BudgetConfig | None = None
    """Per-request budget policy (``drafting.BudgetController``); None = a fixed budget of ``num_draft_tokens`` nodes
    when ``draft_selection`` is "adaptive" (the cut sizes the trees), else the ``drafting`` default (AIMD)."""
    governor: GovernorConfig | None = None
    """With ``draft_selection="adaptive"``: the measured guard that lets steps draft only while drafting steps run at
    least as many tokens/s as plain ones (``engine/governor.py``); None = its defaults."""
    step_cost: StepCostConfig | None = None
    """With ``draft_selection="adaptive"``: the cut's step-time model and its longest pause
    (``drafting/draft_cut.py`` StepCostModel); None = its defaults."""


@dataclass(slots=True)
class EngineConfig:
    """Configuration of the embedded engine (one model, one device)."""

    model_path: str
    """A directory holding a Hugging Face causal LM (config.json + weights), architecture Llama, Qwen2 or Qwen3."""
    device: str = "auto"
    """"cpu", "cuda", "cuda:N" or "auto" (cuda when available)."""
    dtype: str = "auto"
    """"float32", "bfloat16", "float16" or "auto" (float32 on CPU, bfloat16 on CUDA)."""
    max_running_requests: int = 64
    """Requests decoded together; more wait in a queue (``admission``)."""
    admission: str = "groups"
    """Which waiting request a free slot takes: "groups" (the one whose prompt id has the fewest running samples,
    in arrival order among equals: a GRPO group's later samples start once a sibling finished, with its response in
    the history) or "fifo" (arrival order). Tokens do not depend on it: an unseeded request's stream is fixed by
    its arrival (``engine/scheduler.py``)."""
    max_context_len: int | None = None
    """Prompt + generated tokens per request; None = the model's max_position_embeddings."""
    speculative_algorithm: str = "HISTOSPEC"
    """"HISTOSPEC" (draft trees from the history drafter, verified losslessly) or "NONE" (one token per step)."""
    num_draft_tokens: int = 16
    """Hard cap on draft nodes per request and step (the root excluded); budgets never exceed it."""
    draft_selection: str = "adaptive"
    """"adaptive": a step drafts only while drafting steps are measured to run at least as many tokens/s as plain
    ones (``engine/governor.py``), and keeps the most likely draft nodes of the whole batch as long as their expected
    accepted tokens pay for their verify rows, per a step-time model measured online (``drafting/draft_cut.py``);
    whether a request is drafted then depends on step timings. "always": every step with a draft drafts and verifies
    every drafted node within the budgets, so the same greedy request is drafted alike run after run."""
    policy: DraftPolicyConfig = field(default_factory=DraftPolicyConfig)
    """The draft-size policy's knobs (``engine/policy.py`` DraftSizePolicy): budgets, governor, step model."""
    drafter: DrafterConfig | None = None
    """History drafter configuration (``drafting.HistoSpecDrafter``); None = its default."""
    seed: int = 0
    """Seed of requests without their own seed."""
    record_responses: bool = True
    """Record finished (not aborted) responses of requests with a prompt_id into the drafter (siblings now,
    history after ``drafter.end_step``)."""
    trust_remote_code: bool = False
    packed_linears: bool | None = None
    """On CPU in float32: keep a oneDNN-packed copy of every linear weight for passes of a few rows or more
    (``engine/model.py`` TreeForward): faster few-row passes of a model streamed from memory, a row's result
    independent of the pass's other rows, the weights' memory once more; None = for models of at least
    ``PACK_MIN_BYTES`` of linear weights. Ignored elsewhere."""

    def __post_init__(self) -> None:
        if not isinstance(self.model_path, str) or not self.model_path:
            raise ValueError(f"model_path={self.model_path!r}; pass a model directory")
        if not (
            self.device in ("auto", "cpu", "cuda")
            or (isinstance(self.device, str) and self.device.startswith("cuda:"))
        ):
            raise ValueError(f"device={self.device!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={self.dtype!r}; use 'auto', 'float32', 'bfloat16' or 'float16'")
        if self.speculative_algorithm not in SPECULATIVE_ALGORITHMS:
            raise ValueError(
                f"speculative_algorithm={self.speculative_algorithm!r}; use one of {', '.join(SPECULATIVE_ALGORITHMS)}"
            )
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission={self.admission!r}; use one of {', '.join(ADMISSIONS)}")
        if not isinstance(self.max_running_requests, int) or self.max_running_requests < 1:
            raise ValueError(f"max_running_requests={self.max_running_requests!r}; use an int >= 1")
        if self.max_context_len is not None and (
            not isinstance(self.max_context_len, int) or self.max_context_len < 2
        ):
            raise ValueError(f"max_context_len={self.max_context_len!r}; use an int >= 2 or None")
        if self.draft_selection not in DRAFT_SELECTIONS:
            raise ValueError(f"draft_selection={self.draft_selection!r}; use one of {', '.join(DRAFT_SELECTIONS)}")
        if not isinstance(self.policy, DraftPolicyConfig):
            raise ValueError(f"policy is a {type(self.policy).__name__}; pass a DraftPolicyConfig")
        if not isinstance(self.num_draft_tokens, int) or not 0 <= self.num_draft_tokens <= 256:
            raise ValueError(f"num_draft_tokens={self.num_draft_tokens!r}; use an int in [0, 256]")
