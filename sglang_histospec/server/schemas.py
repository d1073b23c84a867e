"""Request bodies of the HTTP API (SGLang's field names) and their conversion to validated backend inputs.

Pydantic checks types (strictly: ``"5"`` is not a token id) and unknown fields; ``to_generation_inputs`` and
``to_history_entries`` check what needs the model (vocabulary, context length) and raise ``FieldError``
naming the field, e.g. ``input_ids[1][3]: token id 70000 is outside the vocabulary [0, 32000)``.

Example::

    body = GenerateBody.model_validate({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8}})
    [req] = to_generation_inputs(body, ModelLimits(vocab_size=100, context_len=64), tokenize=None)
    req.max_new_tokens  # 8
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from sglang_histospec.server.protocol import GenerationInput, HistoryEntry, ModelLimits

DEFAULT_MAX_NEW_TOKENS = 128
"""SGLang's default when ``max_new_tokens`` is absent."""
MAX_PARALLEL_SAMPLES = 1024
"""Largest ``sampling_params.n``: samples per prompt, answered prompt-major as one list."""


class FieldError(ValueError):
    """Bad input; ``field`` is the JSON path of the offending value (``sampling_params.top_p``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Number = StrictInt | StrictFloat


class CustomParams(BaseModel):
    """``sampling_params.custom_params``: free-form in SGLang; we read ``prompt_id`` and keep the rest."""

    model_config = ConfigDict(extra="allow", strict=True)
    prompt_id: StrictStr | StrictInt | None = None
    seed_offset: StrictInt | None = None
    """histospec extension: output token j uses the seeded stream's draw ``seed_offset + j`` (a request resumed
    from prompt + its first k tokens with ``seed_offset=k`` continues as the original would have; torch backend)."""


class SamplingParamsBody(_Strict):
    """SGLang ``sampling_params``. Fields the torch backend cannot honour are accepted only at their
    neutral value (so SGLang clients that send defaults work) and refused otherwise."""

    max_new_tokens: StrictInt | None = None
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: StrictInt = -1
    min_p: Number = 0.0
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    n: StrictInt = 1
    min_new_tokens: StrictInt = 0
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    sampling_seed: StrictInt | None = None
    seed: StrictInt | None = None
    """Alias of ``sampling_seed``."""
    regex: StrictStr | None = None
    json_schema: StrictStr | None = None
    ebnf: StrictStr | None = None
    structural_tag: StrictStr | None = None
    logit_bias: dict[str, Number] | None = None
    stream_interval: StrictInt | None = None
    custom_params: CustomParams | None = None


class AbortBody(_Strict):
    """SGLang's ``/abort_request`` body: abort request ``rid`` (or every request with ``abort_all``)."""

    rid: StrictStr = ""
    abort_all: StrictBool = False


class GenerateBody(_Strict):
    """SGLang's native /generate body (``GenerateReqInput``), single or batch. Unknown keys are refused."""

    text: StrictStr | list[StrictStr] | None = None
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    sampling_params: SamplingParamsBody | list[SamplingParamsBody] | None = None
    return_logprob: StrictBool | list[StrictBool] = False
    logprob_start_len: StrictInt | list[StrictInt] = -1
    top_logprobs_num: StrictInt | list[StrictInt] = 0
    token_ids_logprob: None = None
    return_text_in_logprobs: StrictBool = False
    rid: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    session_id: StrictStr | None = None
    priority: StrictInt | None = None
    lora_path: None = None
    custom_logit_processor: None = None
    return_hidden_states: StrictBool = False
    # SGLang fields accepted and ignored (routing, caching and logging hints that do not change the output)
    extra_key: Any = None
    routing_key: Any = None
    cache_salt: Any = None
    custom_labels: Any = None
    log_metrics: Any = None
    no_logs: Any = None
    session_params: Any = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    data_parallel_rank: Any = None
    routed_dp_rank: Any = None
    # SGLang inputs this server cannot serve: accepted only when null
    input_embeds: None = None
    image_data: None = None
    video_data: None = None
    audio_data: None = None


class HistoryEntryBody(_Strict):
    prompt_id: StrictStr | StrictInt
    responses: list[list[StrictInt]]
    rewards: list[Number] | None = None
    prompt_tokens: list[StrictInt] | None = None
    """Optional: the prompt, whose last tokens go before each response (else the prompt of the latest request
    with this prompt id)."""


class HistoryPushBody(_Strict):
    """``POST /histospec/history``."""

    step: StrictInt = Field(ge=0)
    entries: list[HistoryEntryBody]


class EndStepBody(_Strict):
    """``POST /histospec/end_step``: close the drafter's open step (optional; weight updates do it too)."""

    step: StrictInt | None = None


class UpdateWeightsFromDiskBody(_Strict):
    """SGLang's ``UpdateWeightFromDiskReqInput`` (fields we cannot honour accepted at their defaults)."""

    model_path: StrictStr
    load_format: StrictStr | None = None
    abort_all_requests: StrictBool = False
    weight_version: StrictStr | StrictInt | None = None
    is_async: StrictBool = False
    torch_empty_cache: StrictBool = False
    keep_pause: StrictBool = False
    recapture_cuda_graph: StrictBool = False
    token_step: StrictInt = 0
    flush_cache: StrictBool = True
    manifest: Any = None


# Sampling fields accepted only at their neutral value, with the value they must have.
_NEUTRAL: dict[str, Any] = {
    "min_p": 0.0,
    "min_new_tokens": 0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "regex": None,
    "json_schema": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
}


def _per_item(value: Any, n: int, name: str) -> list[Any]:
    """Broadcast a scalar-or-list field to one value per batch item."""
    if isinstance(value, list):
        if len(value) != n:
            raise FieldError(name, f"has {len(value)} items but the batch has {n} prompts")
        return value
    return [value] * n


def _check_tokens(ids: list[int], limits: ModelLimits, where: str) -> None:
    """Every id in [0, vocab_size); the error names the first bad position (``where[j]``)."""
    if not ids or (min(ids) >= 0 and max(ids) < limits.vocab_size):
        return
    j = next(j for j, tok in enumerate(ids) if not 0 <= tok < limits.vocab_size)
    raise FieldError(f"{where}[{j}]", f"token id {ids[j]} is outside the vocabulary [0, {limits.vocab_size})")


def _sampling_to_kwargs(sp: SamplingParamsBody, where: str, limits: ModelLimits, prompt_len: int) -> dict[str, Any]:
    for name, neutral in _NEUTRAL.items():
        if getattr(sp, name) != neutral:
            raise FieldError(f"{where}.{name}", f"not supported by this server (only {neutral!r})")
    if sp.stop:
        raise FieldError(f"{where}.stop", "stop strings are not supported; use stop_token_ids")
    if not sp.temperature >= 0 or sp.temperature == float("inf"):
        raise FieldError(f"{where}.temperature", f"must be a finite number >= 0, got {sp.temperature}")
    if not 0 < sp.top_p <= 1:
        raise FieldError(f"{where}.top_p", f"must be in (0, 1], got {sp.top_p}")
    if sp.top_k < -1:
        raise FieldError(f"{where}.top_k", f"must be -1 (off), 0 (off) or >= 1, got {sp.top_k}")
    max_new = DEFAULT_MAX_NEW_TOKENS if sp.max_new_tokens is None else sp.max_new_tokens
    if sp.max_new_tokens is None:
        max_new = max(1, min(max_new, limits.context_len - prompt_len))
    if max_new < 1:
        raise FieldError(f"{where}.max_new_tokens", f"must be >= 1, got {max_new}")
    if prompt_len + max_new > limits.context_len:
        raise FieldError(
            f"{where}.max_new_tokens",
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new}) exceeds the context length "
            f"{limits.context_len}",
        )
    stops = list(sp.stop_token_ids or [])
    _check_tokens(stops, limits, f"{where}.stop_token_ids")
    if sp.seed is not None and sp.sampling_seed is not None and sp.seed != sp.sampling_seed:
        raise FieldError(f"{where}.seed", "differs from sampling_seed; send one of them")
    seed = sp.sampling_seed if sp.sampling_seed is not None else sp.seed
    prompt_id = None
    offset = 0 if sp.custom_params is None or sp.custom_params.seed_offset is None else sp.custom_params.seed_offset
    if offset < 0:
        raise FieldError(f"{where}.custom_params.seed_offset", f"must be an int >= 0, got {offset}")
    if sp.custom_params is not None and sp.custom_params.prompt_id is not None:
        prompt_id = str(sp.custom_params.prompt_id)
        if not prompt_id:
            raise FieldError(f"{where}.custom_params.prompt_id", "must not be empty")
    return dict(
        max_new_tokens=max_new,
        temperature=float(sp.temperature),
        top_p=float(sp.top_p),
        top_k=-1 if sp.top_k == 0 else sp.top_k,
        stop_token_ids=stops,
        ignore_eos=sp.ignore_eos,
        seed=seed,
        seed_offset=offset,
        prompt_id=prompt_id,
        skip_special_tokens=sp.skip_special_tokens,
    )


def is_batch(body: GenerateBody) -> bool:
    """True when the prompt field is a list of prompts (SGLang then answers a list; also when ``n > 1``)."""
    if body.text is not None:
        return isinstance(body.text, list)
    return bool(body.input_ids) and isinstance(body.input_ids[0], list)


def to_generation_inputs(
    body: GenerateBody, limits: ModelLimits, tokenize: Callable[[str], list[int]] | None
) -> list[GenerationInput]:
    """Validate a /generate body against the model and split it into one input per prompt."""
    if (body.text is None) == (body.input_ids is None):
        raise FieldError("input_ids", "send exactly one of `text` and `input_ids`")
    if body.stream:
        raise FieldError("stream", "streaming is not supported; send stream=false")
    if body.return_hidden_states:
        raise FieldError("return_hidden_states", "not supported")
    if body.text is not None:
        if not limits.has_tokenizer or tokenize is None:
            raise FieldError("text", "this model has no tokenizer; send input_ids")
        texts = body.text if isinstance(body.text, list) else [body.text]
        prompts, field_name = [], "text"
        for i, t in enumerate(texts):
            if not t:
                raise FieldError(f"text[{i}]" if is_batch(body) else "text", "empty prompt")
            prompts.append(tokenize(t))
    else:
        assert body.input_ids is not None
        prompts = body.input_ids if is_batch(body) else [body.input_ids]  # type: ignore[list-item]
        field_name = "input_ids"
    n = len(prompts)
    if n == 0:
        raise FieldError(field_name, "empty batch")
    batch = is_batch(body)
    sps = _per_item(body.sampling_params, n, "sampling_params")
    logprobs = _per_item(body.return_logprob, n, "return_logprob")
    if body.rid is None:
        rids: list[str | None] = [None] * n
    elif isinstance(body.rid, list):
        rids = _per_item(body.rid, n, "rid")
    else:  # one rid string for a batch: one id per item, derived from it
        rids = [f"{body.rid}_{i}" for i in range(n)] if batch else [body.rid]
    named = [r for r in rids if r is not None]
    if len(set(named)) != len(named):
        raise FieldError("rid", "request ids in one batch must be distinct")
    if any(v != -1 for v in _per_item(body.logprob_start_len, n, "logprob_start_len")):
        raise FieldError("logprob_start_len", "input-token logprobs are not supported; leave it at -1")
    if any(v != 0 for v in _per_item(body.top_logprobs_num, n, "top_logprobs_num")):
        raise FieldError("top_logprobs_num", "top logprobs are not supported; leave it at 0")
    out: list[GenerationInput] = []
    for i, ids in enumerate(prompts):
        where = f"{field_name}[{i}]" if batch else field_name
        if len(ids) == 0:
            raise FieldError(where, "empty prompt")
        _check_tokens(ids, limits, where)
        if len(ids) >= limits.context_len:
            raise FieldError(where, f"prompt has {len(ids)} tokens; the context length is {limits.context_len}")
        sp_where = f"sampling_params[{i}]" if isinstance(body.sampling_params, list) else "sampling_params"
        sp = sps[i] or SamplingParamsBody()
        kwargs = _sampling_to_kwargs(sp, sp_where, limits, len(ids))
        if sp.n < 1 or sp.n > MAX_PARALLEL_SAMPLES:
            raise FieldError(f"{sp_where}.n", f"must be in [1, {MAX_PARALLEL_SAMPLES}], got {sp.n}")
        if sp.n != (sps[0] or SamplingParamsBody()).n:
            raise FieldError(f"{sp_where}.n", "must be the same for every prompt of a batch")
        for j in range(sp.n):  # parallel samples: prompt-major, rid "<rid>_<j>", seed + j
            item = GenerationInput(input_ids=list(ids), return_logprob=logprobs[i], rid=rids[i], **kwargs)
            if sp.n > 1:
                item.rid = None if rids[i] is None else f"{rids[i]}_{j}"
                item.seed = None if item.seed is None else item.seed + j
            out.append(item)
    return out


def to_history_entries(body: HistoryPushBody, limits: ModelLimits) -> list[HistoryEntry]:
    """Validate a history push completely before anything is applied (a bad entry changes nothing)."""
    out: list[HistoryEntry] = []
    for i, e in enumerate(body.entries):
        where = f"entries[{i}]"
        pid = str(e.prompt_id)
        if not pid:
            raise FieldError(f"{where}.prompt_id", "must not be empty")
        for r, resp in enumerate(e.responses):
            _check_tokens(resp, limits, f"{where}.responses[{r}]")
        if e.rewards is not None and len(e.rewards) != len(e.responses):
            raise FieldError(f"{where}.rewards", f"has {len(e.rewards)} values for {len(e.responses)} responses")
        rewards = None if e.rewards is None else [float(x) for x in e.rewards]
        if rewards is not None and any(x != x or x in (float("inf"), float("-inf")) for x in rewards):
            raise FieldError(f"{where}.rewards", "must be finite numbers")
        if e.prompt_tokens is not None:
            _check_tokens(e.prompt_tokens, limits, f"{where}.prompt_tokens")
        out.append(
            HistoryEntry(
                prompt_id=pid, responses=[list(r) for r in e.responses], rewards=rewards, prompt_tokens=e.prompt_tokens
            )
        )
    return out
