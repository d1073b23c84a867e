"""Request bodies of the HTTP API (SGLang's field names) and their one conversion into the engine's requests.

Pydantic checks types (strictly: ``"5"`` is not a token id) and unknown fields. A /generate body is converted once,
at the boundary, into ``engine.types.GenerateRequest`` (``to_generate_requests``) and validated once on the way:
``check_generate_body`` (no model needed: shapes, client limits, sampling values) and ``check_generate_for_model``
(vocabulary, context length); the SGLang backend applies them too (``sglang_schemas.py``). ``to_history_entries`` checks a history push. Each raises ``FieldError`` naming the
field, e.g. ``input_ids[1][3]: token id 70000 is outside the vocabulary [0, 32000)``.

Example::

    body = GenerateBody.model_validate({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8}})
    [req] = to_generate_requests(body, ModelLimits(vocab_size=100, context_len=64), tokenize=None)
    req.sampling.max_new_tokens  # 8
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from sglang_histospec.drafting.prompt_ids import token_prompt_id
from sglang_histospec.engine.types import GenerateRequest, SamplingParams
from sglang_histospec.server.protocol import HistoryEntry, ModelLimits

DEFAULT_MAX_NEW_TOKENS = 128
"""SGLang's default when ``max_new_tokens`` is absent."""
MAX_PARALLEL_SAMPLES = 1024
"""Default largest ``sampling_params.n`` (and router ``group_size``): samples per prompt, answered prompt-major."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Limits on what a client controls, checked before any heavy work; each refusal is a 400 naming the limit.

    Example: ``RequestLimits(max_text_chars=1000)`` refuses a 1001-character ``text`` before tokenizing it.
    """

    max_text_chars: int = 2**20
    """Characters of ``text`` in one /generate (all prompts together), checked before tokenizing."""
    max_prompts: int = 4096
    """Prompts in one /generate batch or router step."""
    max_n: int = MAX_PARALLEL_SAMPLES
    """``sampling_params.n`` and the router's ``group_size``."""
    max_samples: int = 16384
    """Prompts x samples per prompt in one /generate or router step."""
    max_id_chars: int = 512
    """Length of a ``prompt_id`` or ``rid``."""
    max_history_entries: int = 65536
    """Entries in one history push."""
    max_responses_per_entry: int = 4096
    """Responses of one history entry."""

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RequestLimits.{name}={value!r}: must be an int >= 1")


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode (lone surrogate at position {exc.start}); send UTF-8 text") from None
    return value


Str = Annotated[StrictStr, AfterValidator(_valid_unicode)]
"""A JSON string that encodes as UTF-8 (a lone ``\\ud800`` is refused with a 400, never a 500)."""
Int = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
"""A JSON integer within int64 (larger ones are refused, never overflow later)."""
Step = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]
"""A training step: an int64 >= 0."""


class FieldError(ValueError):
    """Bad input; ``field`` is the JSON path of the offending value (``sampling_params.top_p``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Number = Int | StrictFloat


class CustomParams(BaseModel):
    """``sampling_params.custom_params``: free-form in SGLang; we read ``prompt_id`` and keep the rest."""

    model_config = ConfigDict(extra="allow", strict=True)
    prompt_id: Str | Int | None = None
    seed_offset: Int | None = None
    """histospec extension: output token j uses the seeded stream's draw ``seed_offset + j`` (a request resumed
    from prompt + its first k tokens with ``seed_offset=k`` continues as the original would have; torch backend)."""


class SamplingParamsBody(_Strict):
    """SGLang ``sampling_params``. Fields the torch backend cannot honour are accepted only at their
    neutral value (so SGLang clients that send defaults work) and refused otherwise."""

    max_new_tokens: Int | None = None
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: Int = -1
    min_p: Number = 0.0
    stop: Str | list[Str] | None = None
    stop_token_ids: list[Int] | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    n: Int = 1
    min_new_tokens: Int = 0
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    sampling_seed: Int | None = None
    seed: Int | None = None
    """Alias of ``sampling_seed``."""
    regex: Str | None = None
    json_schema: Str | None = None
    ebnf: Str | None = None
    structural_tag: Str | None = None
    logit_bias: dict[str, Number] | None = None
    stream_interval: Int | None = None
    custom_params: CustomParams | None = None


class GenerateBody(_Strict):
    """SGLang's native /generate body (``GenerateReqInput``), single or batch. Unknown keys are refused."""

    text: Str | list[Str] | None = None
    input_ids: list[Int] | list[list[Int]] | None = None
    sampling_params: SamplingParamsBody | list[SamplingParamsBody] | None = None
    return_logprob: StrictBool | list[StrictBool] = False
    logprob_start_len: Int | list[Int] = -1
    top_logprobs_num: Int | list[Int] = 0
    token_ids_logprob: None = None
    return_text_in_logprobs: StrictBool = False
    rid: Str | list[Str] | None = None
    stream: StrictBool = False
    session_id: Str | None = None
    priority: Int | None = None
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
    prompt_id: Str | Int
    responses: list[list[Int]]
    rewards: list[Number] | None = None
    prompt_tokens: list[Int] | None = None
    """Optional: the prompt, whose last tokens go before each response (else the prompt of the latest request
    with this prompt id)."""


class HistoryPushBody(_Strict):
    """``POST /histospec/history``."""

    step: Step
    entries: list[HistoryEntryBody]


class EndStepBody(_Strict):
    """``POST /histospec/end_step``: close the drafter's open step (optional; weight updates do it too)."""

    step: Step | None = None


class UpdateWeightsFromDiskBody(_Strict):
    """SGLang's ``UpdateWeightFromDiskReqInput`` (fields we cannot honour accepted at their defaults)."""

    model_path: Str
    load_format: Str | None = None
    abort_all_requests: StrictBool = False
    weight_version: Str | Int | None = None
    is_async: StrictBool = False
    torch_empty_cache: StrictBool = False
    keep_pause: StrictBool = False
    recapture_cuda_graph: StrictBool = False
    token_step: Int = 0
    flush_cache: StrictBool = True
    manifest: Any = None


class AbortRequestBody(_Strict):
    """SGLang's ``/abort_request`` body: one ``rid`` (or a list of them), or ``abort_all``."""

    rid: Str | list[Str] = ""
    abort_all: StrictBool = False


class StepPrompt(_Strict):
    """One prompt of a router step."""

    prompt_id: Str | Int
    input_ids: list[Int]


class StepBody(_Strict):
    """The router's ``POST /histopipe/step``: ``group_size`` samples of every prompt (sample j of prompt i at
    ``i * group_size + j``); ``sampling_params.n`` stays 1 (``group_size`` is the number of samples)."""

    step: Step | None = None
    prompts: list[StepPrompt]
    group_size: Int = 1
    sampling_params: SamplingParamsBody | None = None
    return_logprob: StrictBool = False


class AddBackendBody(_Strict):
    """The router's ``POST /histopipe/backends``: a rollout server to add (``http://host:port``)."""

    url: Str


def step_to_generate_body(body: StepBody, limits: RequestLimits) -> GenerateBody:
    """Check a step against ``limits`` and turn it into the equivalent /generate body (all samples expanded).

    Example: a step of 2 prompts with ``group_size=3`` becomes a /generate batch of 6 prompts, prompt-major.
    """
    if not body.prompts:
        raise FieldError("prompts", "empty step")
    if len(body.prompts) > limits.max_prompts:
        raise FieldError(
            "prompts", f"has {len(body.prompts)} prompts; the limit is {limits.max_prompts} (max_prompts)"
        )
    g = body.group_size
    if not 1 <= g <= limits.max_n:
        raise FieldError("group_size", f"must be in [1, {limits.max_n}] (max_n), got {g}")
    if len(body.prompts) * g > limits.max_samples:
        raise FieldError(
            "group_size",
            f"{len(body.prompts)} prompts x group_size {g} is {len(body.prompts) * g} samples; "
            f"the limit is {limits.max_samples} (max_samples)",
        )
    sp = body.sampling_params or SamplingParamsBody()
    if sp.n != 1:
        raise FieldError("sampling_params.n", "must be 1 in a step; group_size sets the samples per prompt")
    base = sp.model_dump(exclude_unset=True)
    params, ids = [], []
    for i, p in enumerate(body.prompts):
        check_id(str(p.prompt_id), f"prompts[{i}].prompt_id", limits)
        if not p.input_ids:
            raise FieldError(f"prompts[{i}].input_ids", "empty prompt")
        custom = {**(base.get("custom_params") or {}), "prompt_id": str(p.prompt_id)}
        params += [{**base, "custom_params": custom}] * g
        ids += [p.input_ids] * g
    return GenerateBody.model_validate(
        {"input_ids": ids, "sampling_params": params, "return_logprob": body.return_logprob}
    )


MODELS = (
    AddBackendBody,
    StepBody,
    StepPrompt,
    AbortRequestBody,
    GenerateBody,
    SamplingParamsBody,
    CustomParams,
    HistoryPushBody,
    HistoryEntryBody,
    EndStepBody,
    UpdateWeightsFromDiskBody,
)
"""Every request model (their field names make up error paths)."""

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


def check_tokens(ids: list[int], limits: ModelLimits, where: str) -> None:
    """Every id in [0, vocab_size); the error names the first bad position (``where[j]``)."""
    if not ids or (min(ids) >= 0 and max(ids) < limits.vocab_size):
        return
    j = next(j for j, tok in enumerate(ids) if not 0 <= tok < limits.vocab_size)
    raise FieldError(f"{where}[{j}]", f"token id {ids[j]} is outside the vocabulary [0, {limits.vocab_size})")


def _check_sampling(sp: SamplingParamsBody, where: str, limits: RequestLimits, sglang_features: bool) -> None:
    """The checks of one item's ``sampling_params`` that need no model (``where``: its JSON path).
    ``sglang_features``: the backend is SGLang, which serves stop strings, penalties and grammars itself."""
    if sp.n < 1 or sp.n > limits.max_n:
        raise FieldError(f"{where}.n", f"must be in [1, {limits.max_n}] (max_n), got {sp.n}")
    if sp.custom_params is not None and sp.custom_params.prompt_id is not None:
        check_id(str(sp.custom_params.prompt_id), f"{where}.custom_params.prompt_id", limits)
    if not sglang_features:
        for name, neutral in _NEUTRAL.items():
            if getattr(sp, name) != neutral:
                raise FieldError(f"{where}.{name}", f"not supported by this server (only {neutral!r})")
        if sp.stop:
            raise FieldError(f"{where}.stop", "stop strings are not supported; use stop_token_ids")
    elif sp.seed is not None:
        raise FieldError(f"{where}.seed", "SGLang's sampling field is sampling_seed; send sampling_seed instead")
    elif sp.top_k == 0:
        raise FieldError(f"{where}.top_k", "must be -1 (off) or >= 1 on SGLang, got 0")
    if not sp.temperature >= 0 or sp.temperature == float("inf"):
        raise FieldError(f"{where}.temperature", f"must be a finite number >= 0, got {sp.temperature}")
    if not 0 < sp.top_p <= 1:
        raise FieldError(f"{where}.top_p", f"must be in (0, 1], got {sp.top_p}")
    if sp.top_k < -1:
        raise FieldError(f"{where}.top_k", f"must be -1 (off), 0 (off) or >= 1, got {sp.top_k}")
    if sp.max_new_tokens is not None and sp.max_new_tokens < 1:
        raise FieldError(f"{where}.max_new_tokens", f"must be >= 1, got {sp.max_new_tokens}")
    if sp.seed is not None and sp.sampling_seed is not None and sp.seed != sp.sampling_seed:
        raise FieldError(f"{where}.seed", "differs from sampling_seed; send one of them")
    seed_name = _seed_field(sp)
    seed = getattr(sp, seed_name)
    if seed is not None and seed < 0:
        raise FieldError(
            f"{where}.{seed_name}", f"must be an int >= 0 (leave it out for an unseeded request), got {seed}"
        )
    offset = _seed_offset(sp)
    if offset < 0:
        raise FieldError(f"{where}.custom_params.seed_offset", f"must be an int >= 0, got {offset}")


def _seed_field(sp: SamplingParamsBody) -> str:
    """Which field carries the seed: ``sampling_seed`` when sent, else ``seed`` (both equal when both are sent)."""
    return "sampling_seed" if sp.sampling_seed is not None else "seed"


def _seed_offset(sp: SamplingParamsBody) -> int:
    return 0 if sp.custom_params is None or sp.custom_params.seed_offset is None else sp.custom_params.seed_offset


def _max_new_tokens(sp: SamplingParamsBody, limits: ModelLimits, prompt_len: int) -> int:
    """As sent, or SGLang's default clipped to the room the context leaves (at least 1)."""
    if sp.max_new_tokens is not None:
        return sp.max_new_tokens
    return max(1, min(DEFAULT_MAX_NEW_TOKENS, limits.context_len - prompt_len))


def _sampling(sp: SamplingParamsBody, limits: ModelLimits, prompt_len: int, sample: int) -> SamplingParams:
    """The engine's sampling parameters of parallel sample ``sample`` (its seed is the body's seed + ``sample``)."""
    seed = getattr(sp, _seed_field(sp))
    return SamplingParams(
        temperature=float(sp.temperature),
        top_p=float(sp.top_p),
        top_k=-1 if sp.top_k == 0 else sp.top_k,
        max_new_tokens=_max_new_tokens(sp, limits, prompt_len),
        stop_token_ids=list(sp.stop_token_ids or []),
        ignore_eos=sp.ignore_eos,
        seed=None if seed is None else seed + sample,
        seed_offset=_seed_offset(sp),
        skip_special_tokens=sp.skip_special_tokens,
    )


def is_batch(body: GenerateBody) -> bool:
    """True when the prompt field is a list of prompts (SGLang then answers a list; also when ``n > 1``)."""
    if body.text is not None:
        return isinstance(body.text, list)
    return bool(body.input_ids) and isinstance(body.input_ids[0], list)


def check_id(value: str, where: str, limits: RequestLimits) -> None:
    if not value:
        raise FieldError(where, "must not be empty")
    if len(value) > limits.max_id_chars:
        raise FieldError(where, f"has {len(value)} characters; the limit is {limits.max_id_chars} (max_id_chars)")


def item_rids(body: GenerateBody) -> list[str | None]:
    """One request id per prompt: a list as sent, or ``"<rid>_<i>"`` derived from one rid string for a batch."""
    n = num_prompts(body)
    if body.rid is None:
        return [None] * n
    if isinstance(body.rid, list):
        return _per_item(body.rid, n, "rid")
    return [f"{body.rid}_{i}" for i in range(n)] if is_batch(body) else [body.rid]


def sample_rid(rid: str | None, j: int, n: int) -> str | None:
    """The rid of parallel sample ``j`` of ``n`` (``"<rid>_<j>"``; unchanged when n == 1)."""
    return rid if n == 1 or rid is None else f"{rid}_{j}"


def num_prompts(body: GenerateBody) -> int:
    """Prompts in a /generate body (before parallel samples); 1 for a single prompt."""
    if body.text is not None:
        return len(body.text) if isinstance(body.text, list) else 1
    if body.input_ids is None:
        return 0
    return len(body.input_ids) if is_batch(body) else 1


def check_generate_body(body: GenerateBody, limits: RequestLimits, sglang_features: bool = False) -> int:
    """Every check of a /generate body that needs no model (shape, client limits, ids, sampling values); returns
    the number of samples it asks for (prompts x n). Cheap: it runs before tokenizing. Shared by the server
    (inside :func:`to_generate_requests`), the SGLang backend (``sglang_schemas.check_sglang_generate``, with
    ``sglang_features``: SGLang's own features such as streaming, stop strings or logprob options are SGLang's to
    check) and the router.

    Example: ``check_generate_body(GenerateBody(input_ids=[[1], [2]], sampling_params={"n": 3}), RequestLimits())``
    returns 6.
    """
    if (body.text is None) == (body.input_ids is None):
        raise FieldError("input_ids", "send exactly one of `text` and `input_ids`")
    if body.stream and not sglang_features:
        raise FieldError("stream", "streaming is not supported; send stream=false")
    if body.return_hidden_states and not sglang_features:
        raise FieldError("return_hidden_states", "not supported")
    n = num_prompts(body)
    _check_prompts(body, n, limits)
    _per_item(body.return_logprob, n, "return_logprob")
    rids = item_rids(body)
    named = [r for r in rids if r is not None]
    if len(set(named)) != len(named):
        raise FieldError("rid", "request ids in one batch must be distinct")
    for r in named:
        check_id(r, "rid", limits)
    logprob_start = _per_item(body.logprob_start_len, n, "logprob_start_len")
    top_logprobs = _per_item(body.top_logprobs_num, n, "top_logprobs_num")
    if any(v != -1 for v in logprob_start) and not sglang_features:
        raise FieldError("logprob_start_len", "input-token logprobs are not supported; leave it at -1")
    if any(v != 0 for v in top_logprobs) and not sglang_features:
        raise FieldError("top_logprobs_num", "top logprobs are not supported; leave it at 0")
    sps = [sp or SamplingParamsBody() for sp in _per_item(body.sampling_params, n, "sampling_params")]
    for i, sp in enumerate(sps):
        where = _sampling_where(body, i)
        _check_sampling(sp, where, limits, sglang_features)
        if sp.n != sps[0].n:
            raise FieldError(f"{where}.n", "must be the same for every prompt of a batch")
    if n * sps[0].n > limits.max_samples:
        raise FieldError(
            "sampling_params.n",
            f"{n} prompts x n={sps[0].n} is {n * sps[0].n} samples; the limit is {limits.max_samples} (max_samples)",
        )
    return n * sps[0].n


def _check_prompts(body: GenerateBody, n: int, limits: RequestLimits) -> None:
    """The prompt field of a body: ``n`` prompts within ``max_prompts``, none empty, ``text`` within its limit."""
    batch = is_batch(body)
    field_name = "text" if body.text is not None else "input_ids"
    if n == 0:
        raise FieldError(field_name, "empty batch")
    if n > limits.max_prompts:
        raise FieldError(field_name, f"has {n} prompts; the limit is {limits.max_prompts} (max_prompts)")
    if body.text is not None:
        texts = body.text if isinstance(body.text, list) else [body.text]
        chars = sum(len(t) for t in texts)
        if chars > limits.max_text_chars:
            raise FieldError("text", f"has {chars} characters; the limit is {limits.max_text_chars} (max_text_chars)")
        for i, t in enumerate(texts):
            if not t:
                raise FieldError(f"text[{i}]" if batch else "text", "empty prompt")
    else:
        prompts = body.input_ids if batch else [body.input_ids]
        for i, ids in enumerate(prompts):  # type: ignore[union-attr]
            if len(ids) == 0:
                raise FieldError(f"input_ids[{i}]" if batch else "input_ids", "empty prompt")


def _sampling_where(body: GenerateBody, i: int) -> str:
    """The JSON path of item ``i``'s sampling params."""
    return f"sampling_params[{i}]" if isinstance(body.sampling_params, list) else "sampling_params"


def check_generate_for_model(
    body: GenerateBody, limits: ModelLimits, prompts: list[list[int]] | None = None, check_context: bool = True
) -> None:
    """The checks of a /generate body that need the model, after :func:`check_generate_body`: every prompt and stop
    token id within the vocabulary, every prompt plus its ``max_new_tokens`` within the context length (unless
    ``check_context`` is False: SGLang with ``--allow-auto-truncate`` cuts them instead).
    ``prompts``: the token ids of each prompt (a ``text`` body's, tokenized); None = the body's ``input_ids``.

    Example: with ``ModelLimits(vocab_size=100, context_len=64)``, ``{"input_ids": [1, 100]}`` raises
    ``FieldError("input_ids[1]", ...)``.
    """
    prompts = _input_ids(body) if prompts is None else prompts
    batch, field_name = is_batch(body), "text" if body.text is not None else "input_ids"
    sps = _per_item(body.sampling_params, len(prompts), "sampling_params")
    for i, ids in enumerate(prompts):
        where = f"{field_name}[{i}]" if batch else field_name
        if len(ids) == 0:
            raise FieldError(where, "empty prompt")
        check_tokens(ids, limits, where)
        sp, sp_where = sps[i] or SamplingParamsBody(), _sampling_where(body, i)
        check_tokens(list(sp.stop_token_ids or []), limits, f"{sp_where}.stop_token_ids")
        if not check_context:
            continue
        if len(ids) >= limits.context_len:
            raise FieldError(where, f"prompt has {len(ids)} tokens; the context length is {limits.context_len}")
        max_new = _max_new_tokens(sp, limits, len(ids))
        if len(ids) + max_new > limits.context_len:
            raise FieldError(
                f"{sp_where}.max_new_tokens",
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new}) exceeds the context length "
                f"{limits.context_len}",
            )


def _input_ids(body: GenerateBody) -> list[list[int]]:
    """The prompts of an ``input_ids`` body, one list per prompt."""
    assert body.input_ids is not None, "a text body: pass its tokenized prompts"
    return body.input_ids if is_batch(body) else [body.input_ids]  # type: ignore[return-value, list-item]


def new_request_id() -> str:
    """A fresh request id (32 hex digits), for a request sent without ``rid``."""
    return uuid.uuid4().hex


def to_generate_requests(
    body: GenerateBody,
    limits: ModelLimits,
    tokenize: Callable[[str], list[int]] | None,
    request_limits: RequestLimits | None = None,
    new_rid: Callable[[], str] = new_request_id,
) -> list[GenerateRequest]:
    """The one conversion of a /generate body into the engine's requests, validated once on the way
    (:func:`check_generate_body`, then ``tokenize`` for ``text``, then :func:`check_generate_for_model`).

    One request per prompt and parallel sample, prompt-major: sample j of n has rid ``"<rid>_<j>"`` and seed
    ``seed + j``. A request sent without ``rid`` gets ``new_rid()``; one without ``custom_params.prompt_id`` the
    history key derived from its tokens (``drafting/prompt_ids.py``).
    """
    check_generate_body(body, request_limits or RequestLimits())
    if body.text is not None:
        if not limits.has_tokenizer or tokenize is None:
            raise FieldError("text", "this model has no tokenizer; send input_ids")
        prompts = [tokenize(t) for t in (body.text if isinstance(body.text, list) else [body.text])]
    else:
        prompts = _input_ids(body)
    check_generate_for_model(body, limits, prompts)
    sps = _per_item(body.sampling_params, len(prompts), "sampling_params")
    logprobs = _per_item(body.return_logprob, len(prompts), "return_logprob")
    out: list[GenerateRequest] = []
    for ids, sp, logprob, rid in zip(prompts, sps, logprobs, item_rids(body)):
        sp = sp or SamplingParamsBody()
        custom = sp.custom_params
        explicit = custom is not None and custom.prompt_id is not None
        prompt_id = str(custom.prompt_id) if explicit else token_prompt_id(ids)  # type: ignore[union-attr]
        for j in range(sp.n):
            out.append(
                GenerateRequest(
                    rid=sample_rid(rid, j, sp.n) or new_rid(),
                    input_ids=list(ids),
                    sampling=_sampling(sp, limits, len(ids), j),
                    prompt_id=prompt_id,
                    return_logprob=logprob,
                )
            )
    return out


def to_history_entries(
    body: HistoryPushBody, limits: ModelLimits | None, request_limits: RequestLimits | None = None
) -> list[HistoryEntry]:
    """Validate a history push completely before anything is applied (a bad entry changes nothing).
    ``limits=None`` skips the vocabulary check (a router that does not know the model)."""
    request_limits = request_limits or RequestLimits()
    if len(body.entries) > request_limits.max_history_entries:
        raise FieldError(
            "entries",
            f"has {len(body.entries)} entries; the limit is {request_limits.max_history_entries} "
            "(max_history_entries); split the push",
        )
    out: list[HistoryEntry] = []
    for i, e in enumerate(body.entries):
        where = f"entries[{i}]"
        pid = str(e.prompt_id)
        check_id(pid, f"{where}.prompt_id", request_limits)
        if len(e.responses) > request_limits.max_responses_per_entry:
            raise FieldError(
                f"{where}.responses",
                f"has {len(e.responses)} responses; the limit is {request_limits.max_responses_per_entry} "
                "(max_responses_per_entry)",
            )
        for r, resp in enumerate(e.responses):
            if limits is not None:
                check_tokens(resp, limits, f"{where}.responses[{r}]")
            elif resp and min(resp) < 0:
                raise FieldError(f"{where}.responses[{r}]", "token ids must be >= 0")
        if e.rewards is not None and len(e.rewards) != len(e.responses):
            raise FieldError(f"{where}.rewards", f"has {len(e.rewards)} values for {len(e.responses)} responses")
        rewards = None if e.rewards is None else [float(x) for x in e.rewards]
        if rewards is not None and any(x != x or x in (float("inf"), float("-inf")) for x in rewards):
            raise FieldError(f"{where}.rewards", "must be finite numbers")
        if e.prompt_tokens is not None:
            if limits is not None:
                check_tokens(e.prompt_tokens, limits, f"{where}.prompt_tokens")
            elif e.prompt_tokens and min(e.prompt_tokens) < 0:
                raise FieldError(f"{where}.prompt_tokens", "token ids must be >= 0")
        out.append(
            HistoryEntry(
                prompt_id=pid, responses=[list(r) for r in e.responses], rewards=rewards, prompt_tokens=e.prompt_tokens
            )
        )
    return out
