"""The SGLang backend's view of generation bodies: the torch backend's checks (``schemas.py``) applied to bodies that
SGLang serves, before SGLang's tokenizer manager sees them (``sglang_limits.GenerateGuard``); no SGLang or torch.

SGLang's own fields pass (``extra="allow"``); the fields both backends share are typed as in ``schemas.py`` and
checked by the same functions. Example::

    check_sglang_generate({"input_ids": [1, 5, 64]}, RequestLimits(), ModelLimits(vocab_size=64, context_len=512))
    # FieldError("input_ids[2]", "token id 64 is outside the vocabulary [0, 64)")
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from sglang_histospec.server.protocol import ModelLimits
from sglang_histospec.server.schemas import (
    CustomParams,
    FieldError,
    GenerateBody,
    Int,
    Number,
    RequestLimits,
    SamplingParamsBody,
    check_generate_body,
    check_generate_for_model,
    check_id,
    check_tokens,
)


class SGLangSamplingParamsBody(SamplingParamsBody):
    """``sampling_params`` as the SGLang backend receives them: the shared fields are typed and checked as on the torch
    backend; SGLang's other fields (and those the torch backend refuses) pass to SGLang, which checks them itself."""

    model_config = ConfigDict(extra="allow", strict=True)


class SGLangGenerateBody(GenerateBody):
    """A /generate body as the SGLang backend receives it: the shared fields as :class:`GenerateBody` types them,
    every other field left to SGLang (multimodal inputs, LoRA, logprob options and so on)."""

    model_config = ConfigDict(extra="allow", strict=True)
    sampling_params: SGLangSamplingParamsBody | list[SGLangSamplingParamsBody] | None = None
    token_ids_logprob: Any = None
    lora_path: Any = None
    custom_logit_processor: Any = None
    input_embeds: Any = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None


class CompletionBody(BaseModel):
    """The fields of an OpenAI ``/v1/completions`` or ``/v1/chat/completions`` body that the SGLang backend checks
    before SGLang sees them (the rest is SGLang's): token-id prompts, samples, seed, lengths and sampling values."""

    model_config = ConfigDict(extra="allow", strict=True)
    prompt: Any = None
    n: Int | None = None
    seed: Int | None = None
    max_tokens: Int | None = None
    max_completion_tokens: Int | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: Int | None = None
    stop_token_ids: list[Int] | None = None
    custom_params: CustomParams | None = None


SGLANG_MODELS = (SGLangGenerateBody, SGLangSamplingParamsBody, CompletionBody)
"""The request models of this module (their field names make up error paths)."""


def check_sglang_generate(
    raw: Any, limits: RequestLimits, model: ModelLimits | None, check_context: bool = True
) -> SGLangGenerateBody | None:
    """The torch backend's checks of a /generate body, applied to one that SGLang will serve (the SGLang backend
    runs them before SGLang's tokenizer manager sees the body): types, batch shapes, client limits, seeds, prompt
    ids, sampling values, and with ``model`` every ``input_ids`` and stop token id inside the vocabulary and within
    the context (``check_context``). SGLang's own features pass; ``text`` is tokenized by SGLang. Raises
    ``pydantic.ValidationError`` for a wrong type, FieldError otherwise; returns the parsed body (None for a body
    that is not a JSON object, or one with ``input_embeds``, which SGLang checks itself).

    Example: with ``ModelLimits(vocab_size=64, context_len=512)``, ``{"input_ids": [1, 5, 64]}`` raises
    ``FieldError("input_ids[2]", "token id 64 is outside the vocabulary [0, 64)")``.
    """
    if not isinstance(raw, dict) or raw.get("input_embeds") is not None:
        return None
    body = SGLangGenerateBody.model_validate(raw)
    check_generate_body(body, limits, sglang_features=True)
    if model is not None and body.input_ids is not None:
        check_generate_for_model(body, model, check_context=check_context)
    elif model is not None and check_context:  # text: SGLang tokenizes it; a prompt has at least one token
        sps = body.sampling_params if isinstance(body.sampling_params, list) else [body.sampling_params]
        for i, sp in enumerate(sps):
            if sp is not None and sp.max_new_tokens is not None and sp.max_new_tokens >= model.context_len:
                where = f"sampling_params[{i}]" if isinstance(body.sampling_params, list) else "sampling_params"
                raise FieldError(
                    f"{where}.max_new_tokens",
                    f"max_new_tokens ({sp.max_new_tokens}) leaves no room for the prompt in the context length "
                    f"{model.context_len}",
                )
    return body


def check_completion(raw: Any, limits: RequestLimits, model: ModelLimits | None) -> None:
    """The shared checks of an OpenAI ``/v1/completions`` or ``/v1/chat/completions`` body on the SGLang backend:
    token-id prompts inside the vocabulary (``prompt[j]``, ``prompt[i][j]``), ``n``, ``seed``, the token counts,
    ``temperature``, ``top_p``, ``top_k``, ``custom_params.prompt_id`` and ``stop_token_ids``. Raises
    ``pydantic.ValidationError`` for a wrong type, FieldError otherwise.

    Example: ``check_completion({"prompt": [1, 64]}, RequestLimits(), ModelLimits(64, 512))`` raises
    ``FieldError("prompt[1]", "token id 64 is outside the vocabulary [0, 64)")``.
    """
    if not isinstance(raw, dict):
        return
    body = CompletionBody.model_validate(raw)
    if body.n is not None and not 1 <= body.n <= limits.max_n:
        raise FieldError("n", f"must be in [1, {limits.max_n}] (max_n), got {body.n}")
    if body.seed is not None and body.seed < 0:
        raise FieldError("seed", f"must be an int >= 0 (leave it out for an unseeded request), got {body.seed}")
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(body, name)
        if value is not None and value < 1:
            raise FieldError(name, f"must be >= 1, got {value}")
    if body.temperature is not None and (not body.temperature >= 0 or body.temperature == float("inf")):
        raise FieldError("temperature", f"must be a finite number >= 0, got {body.temperature}")
    if body.top_p is not None and not 0 < body.top_p <= 1:
        raise FieldError("top_p", f"must be in (0, 1], got {body.top_p}")
    if body.top_k is not None and (body.top_k == 0 or body.top_k < -1):
        raise FieldError("top_k", f"must be -1 (off) or >= 1, got {body.top_k}")
    if body.custom_params is not None and body.custom_params.prompt_id is not None:
        check_id(str(body.custom_params.prompt_id), "custom_params.prompt_id", limits)
    if model is None:
        return
    check_tokens(list(body.stop_token_ids or []), model, "stop_token_ids")
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        check_tokens(prompt, model, "prompt")
    elif isinstance(prompt, list):
        for i, item in enumerate(prompt):
            if isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                check_tokens(item, model, f"prompt[{i}]")
