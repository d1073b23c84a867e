"""The embedded torch engine: continuous batching with lossless HistoSpec tree verification.

``Engine.step`` admits, drafts, verifies every running request in one forward and commits, one part per stage
(docs/architecture.md, "One engine step"); drive an ``Engine`` from one thread (its class docstring). Example::

    engine = Engine(EngineConfig(model_path="/tmp/tiny", device="cpu"))
    engine.add_request(GenerateRequest(rid="a", input_ids=[1, 2, 3], prompt_id="p0"))
    done = []
    while engine.has_unfinished():
        done += engine.step()
    done[0].output_ids      # the generated tokens
"""

from __future__ import annotations

import collections
import os
import time

import numpy as np
import torch

from sglang_histospec.drafting.protocol import Drafter
from sglang_histospec.engine.commit import Commit
from sglang_histospec.engine.governor import critical_progress
from sglang_histospec.engine.inputs import StepInputs, build_inputs
from sglang_histospec.engine.model import TreeForward, check_architecture
from sglang_histospec.engine.policy import DraftSizePolicy
from sglang_histospec.engine.profile import profile_verify
from sglang_histospec.engine.scheduler import Scheduler
from sglang_histospec.engine.selector import DraftSelector
from sglang_histospec.engine.types import EngineConfig, GenerateRequest, GenerateResult
from sglang_histospec.engine.verifier import verify


def resolve_device(name: str) -> torch.device:
    """``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` as a device, checked. Example: ``resolve_device("cpu")``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available; use device='cpu' or 'auto'")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``"auto"`` (bfloat16 on CUDA, float32 elsewhere) or a dtype's name. Example: ``resolve_dtype("auto", cpu)``
    is ``torch.float32``."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


class Engine:
    """Batched generation for one Hugging Face causal LM (Llama, Qwen2, Qwen3) with HistoSpec drafting.

    Attributes: ``config`` (EngineConfig), ``drafter`` (``drafting.HistoSpecDrafter``; history survives weight
    updates and cache flushes), ``policy`` (the draft-size policy, ``engine/policy.py`` DraftSizePolicy: its
    ``budgets``, ``step_cost``, ``calibration`` and ``governor``), ``tokenizer`` (the model directory's tokenizer, or
    None), ``vocab_size``, ``max_context_len``, ``eos_token_ids``, ``device`` (torch.device), ``model_path`` (the
    current weights' directory), ``weight_version`` (str | None), ``model`` (the HF model holding the weights).

    ``drafter`` / ``budgets`` may be passed in (a ``drafting.Drafter``, ``drafting/protocol.py``, and any object
    with ``step_budgets, update, remove``, the policy's per-request budgets), e.g. to share a drafter or to verify
    hand-made drafts.

    Threading contract (for the server): an ``Engine`` is NOT thread-safe. Drive it from ONE thread: that thread
    calls ``add_request`` / ``abort`` / ``step`` / ``update_weights_from_disk`` / ``flush_cache`` / ``stats`` and the
    drafter methods (``engine.drafter.add(...)``, ``engine.drafter.end_step(...)``); other threads hand work to it
    through a queue.

    Life of a request: ``add_request`` queues it; each ``step()`` admits queued requests (up to
    ``max_running_requests`` running), then runs ONE verify forward for every running request (its last token as the
    root plus its draft tree, or just the root with ``speculative_algorithm="NONE"``; a newly admitted request's
    prompt minus its last token is prefilled in the same pass, or in a pass of its own when it is longer than the
    draft width) and returns the requests that finished in this step (aborted ones included). ``generate`` is the
    blocking convenience loop over ``add_request`` + ``step``.
    """

    def __init__(self, config: EngineConfig, drafter: Drafter | None = None, budgets=None) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        if not isinstance(config, EngineConfig):
            raise ValueError(f"config is a {type(config).__name__}; pass an EngineConfig")
        if not os.path.isdir(config.model_path):
            raise ValueError(f"model_path={config.model_path!r} is not a directory")
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        hf_config = AutoConfig.from_pretrained(config.model_path, trust_remote_code=config.trust_remote_code)
        check_architecture(hf_config)
        model = AutoModelForCausalLM.from_pretrained(
            config.model_path, dtype=self.dtype, trust_remote_code=config.trust_remote_code
        )
        self.model = model.to(self.device).eval()
        self._fwd = TreeForward(self.model, packed=config.packed_linears)
        self.model_path = config.model_path
        self.weight_version: str | None = None
        self.vocab_size = int(hf_config.vocab_size)
        max_pos = getattr(hf_config, "max_position_embeddings", None) or 2048
        self.max_context_len = int(config.max_context_len or max_pos)
        self.eos_token_ids = self._eos_ids(model)
        self.tokenizer = self._load_tokenizer(config.model_path)
        self.drafter = drafter if drafter is not None else self._default_drafter(config)
        self._stats = collections.Counter()
        self.policy = DraftSizePolicy(config, self.drafter, self.max_context_len, budgets)
        self.selector = DraftSelector(self.policy, self.drafter, self.vocab_size)
        self._merge_limit = max(8, config.num_draft_tokens + 1)
        self._cache = self._fwd.new_cache(
            config.max_running_requests, self.max_context_len + config.num_draft_tokens + 1
        )
        if self.policy.cut_on:  # the cut's step model is fitted before the first drafting step (engine/profile.py)
            points = profile_verify(self._fwd, self._cache, config.max_running_requests, config.num_draft_tokens)
            self.policy.seed_step_cost(points)
        self.scheduler = Scheduler(config.max_running_requests, config.seed, self.eos_token_ids, config.admission)
        self.commit = Commit(
            self.drafter,
            self.policy,
            self._cache,
            self.device,
            self._stats,
            speculate=self.policy.speculate,
            adaptive=self.policy.learns_depths,
            record_responses=config.record_responses,
        )
        self._done: list[GenerateResult] = []  # finished outside step() (aborts of queued requests, generate())
        self._started = time.time()

    # ------------------------------------------------------------------ public API
    def add_request(self, request: GenerateRequest) -> None:
        """Queue a request. Raises ValueError for a duplicate rid, a token id >= vocab_size, or a prompt with
        ``len(input_ids) + max_new_tokens > max_context_len`` (the message names the field)."""
        if not isinstance(request, GenerateRequest):
            raise ValueError(f"request is a {type(request).__name__}; pass a GenerateRequest")
        if request.rid in self.scheduler.rids:
            raise ValueError(f"rid={request.rid!r} is already queued or running; use a unique rid")
        bad = next((t for t in request.input_ids if t >= self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"input_ids contains {bad}, outside the vocabulary [0, {self.vocab_size})")
        bad = next((t for t in request.sampling.stop_token_ids if t >= self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"stop_token_ids contains {bad}, outside the vocabulary [0, {self.vocab_size})")
        total = len(request.input_ids) + request.sampling.max_new_tokens
        if total > self.max_context_len:
            raise ValueError(
                f"len(input_ids) + max_new_tokens = {len(request.input_ids)} + {request.sampling.max_new_tokens} "
                f"exceeds max_context_len {self.max_context_len}; lower max_new_tokens or shorten the prompt"
            )
        self.scheduler.add(request)
        self._stats["requests_total"] += 1

    def has_unfinished(self) -> bool:
        """True while requests are queued or running (or aborted ones not yet returned by ``step``)."""
        return bool(self.scheduler.waiting or self.scheduler.running or self._done)

    def abort(self, rid: str) -> bool:
        """Abort a queued or running request; its result (finish type "abort", tokens so far) comes out of the
        next ``step()``. Returns False when the rid is unknown (already finished). Aborted responses are never
        recorded into the history."""
        r = self.scheduler.drop_waiting(rid)
        if r is not None:
            self._done.append(
                GenerateResult(
                    rid=rid,
                    output_ids=[],
                    finish_reason={"type": "abort", "message": "aborted"},
                    output_logprobs=[] if r.return_logprob else None,
                    prompt_tokens=len(r.input_ids),
                    prompt_id=r.prompt_id,
                )
            )
            self._stats["requests_aborted"] += 1
            return True
        st = self.scheduler.find_running(rid)
        if st is None:
            return False
        st.finish = {"type": "abort", "message": "aborted"}
        return True

    def step(self) -> list[GenerateResult]:
        """Admit queued requests and run one verify step; return the requests that finished in it."""
        results, self._done = self._done, []
        results += self._retire()  # aborted running requests
        self._admit()
        if self.scheduler.running:
            if (
                self.scheduler.max_pending() > self._merge_limit
            ):  # long prefills get their own forward; short ones join the verify pass
                self._prefill()
            self._decode()
            results += self._retire()
        return results

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """Run the requests to completion (with any already queued); results in the order of ``requests``.

        Results of other requests that finish meanwhile are returned by the next ``step()``.
        """
        for r in requests:
            self.add_request(r)
        wanted = {r.rid for r in requests}
        got: dict[str, GenerateResult] = {}
        others: list[GenerateResult] = []
        while len(got) < len(wanted):
            for res in self.step():
                if res.rid in wanted:
                    got[res.rid] = res
                else:
                    others.append(res)
        self._done = others + self._done
        return [got[r.rid] for r in requests]

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        """Load new weights (same architecture and shapes) from a directory; running requests continue with the
        new weights after their KV cache is recomputed. Never touches the drafter's history. Raises ValueError
        when the directory is missing or the shapes differ (the old weights stay)."""
        from transformers import AutoModelForCausalLM

        if not isinstance(model_path, str) or not os.path.isdir(model_path):
            raise ValueError(f"model_path={model_path!r} is not a directory")
        new = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=self.dtype, trust_remote_code=self.config.trust_remote_code
        )
        check_architecture(new.config)
        old_sd, new_sd = self.model.state_dict(), new.state_dict()
        if old_sd.keys() != new_sd.keys():
            diff = sorted(set(old_sd) ^ set(new_sd))[:3]
            raise ValueError(f"model_path={model_path!r} has different parameters than the loaded model: {diff}")
        for name, tensor in new_sd.items():
            if tensor.shape != old_sd[name].shape:
                raise ValueError(
                    f"model_path={model_path!r}: {name} has shape {tuple(tensor.shape)}, "
                    f"the loaded model {tuple(old_sd[name].shape)}"
                )
        with torch.no_grad():
            for name, tensor in new_sd.items():
                old_sd[name].copy_(tensor.to(old_sd[name].device))
        self.model_path = model_path
        self.weight_version = weight_version
        self.weights_changed()

    def weights_changed(self) -> None:
        """Take up weights of ``self.model`` changed in place (an optimizer step on it, a manual copy): rebuilds the
        packed copies the forward pass reads and recomputes every running request's KV. Without it an engine with
        packed linears keeps sampling from the old weights. Example: ``opt.step(); engine.weights_changed()``."""
        self._fwd.repack()
        for st in self.scheduler.running:  # recompute every running request's KV with the new weights
            st.kv_len = 0
        self._stats["weight_updates"] += 1

    def flush_cache(self) -> bool:
        """Drop cached KV state; only when idle (returns False when requests are running). Never drops history."""
        if self.scheduler.running or self.scheduler.waiting:
            return False
        self._cache.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return True

    def stats(self) -> dict:
        """Counters: requests_total, requests_finished, requests_aborted, requests_running, requests_waiting,
        prompt_tokens, generated_tokens, verify_steps (request-steps), forward_passes, draft_tokens,
        accepted_tokens, weight_updates, kv_cache_growths (times the KV cache grew, ``reserve``), tau (generated
        tokens per request-step), accept_rate, drafter stats under "drafter", the draft-size policy's models under
        "step_cost" (``DraftSizePolicy.stats``: ready, row_cost_s, calibration bins, draft_pauses: times the cut
        stopped drafting for ``pause_steps`` steps, paused_steps, governor), speculative_algorithm, weight_version,
        model_path, device."""
        s = self._stats
        steps = s["verify_steps"]
        out = {
            k: int(s[k])
            for k in (
                "requests_total",
                "requests_finished",
                "requests_aborted",
                "prompt_tokens",
                "generated_tokens",
                "verify_steps",
                "forward_passes",
                "draft_tokens",
                "accepted_tokens",
                "weight_updates",
                "kv_cache_growths",
            )
        }
        out.update(
            requests_running=len(self.scheduler.running),
            requests_waiting=len(self.scheduler.waiting),
            tau=(s["step_tokens"] / steps) if steps else 0.0,
            accept_rate=(s["accepted_tokens"] / s["draft_tokens"]) if s["draft_tokens"] else 0.0,
            speculative_algorithm=self.config.speculative_algorithm,
            weight_version=self.weight_version,
            model_path=self.model_path,
            device=str(self.device),
            drafter=self.drafter.stats(),
            step_cost=self.policy.stats(),
        )
        return out

    @staticmethod
    def _eos_ids(model) -> frozenset[int]:
        ids: set[int] = set()
        for src in (model.config, getattr(model, "generation_config", None)):
            val = getattr(src, "eos_token_id", None) if src is not None else None
            if isinstance(val, int):
                ids.add(val)
            elif isinstance(val, (list, tuple)):
                ids.update(int(v) for v in val)
        return frozenset(ids)

    @staticmethod
    def _load_tokenizer(path: str):
        if not any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
            return None
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(path)
        except Exception:  # a model without a usable tokenizer still serves token ids
            return None

    @staticmethod
    def _default_drafter(config: EngineConfig) -> Drafter:
        """The ``drafting`` history drafter of ``config.drafter`` (its default when None)."""
        from sglang_histospec.drafting import DrafterConfig, HistoSpecDrafter

        return HistoSpecDrafter(config.drafter or DrafterConfig())

    def _admit(self) -> None:
        for st in self.scheduler.admit():
            self.drafter.start(st.req.rid, st.req.prompt_id, list(st.req.input_ids))
            self._stats["prompt_tokens"] += len(st.req.input_ids)

    def _retire(self) -> list[GenerateResult]:
        """Remove finished requests from the running list (keeping slots contiguous) and build their results."""
        out = [self.commit.finish(st) for st in self.scheduler.retire(self._cache)]
        out.reverse()
        return out

    def _prefill(self) -> None:
        """Compute the K/V of every running request's tokens but the last (new requests and, after a weight
        update, all). Those requests form a suffix of the running list (new ones are appended)."""
        running = self.scheduler.running
        pending = [i for i, st in enumerate(running) if st.pending > 0]
        if not pending:
            return
        start = pending[0]
        rows = running[start:]
        for st in rows:  # after a weight update everything from `start` on is recomputed from scratch
            if st.pending <= 0:
                st.kv_len = 0
        kv = np.array([st.kv_len for st in rows], dtype=np.int64)
        pre = np.array([st.pending for st in rows], dtype=np.int64)
        inputs = build_inputs([st.tokens for st in rows], kv, pre)
        self._ensure_cache(len(running), inputs.num_keys)
        self._forward(inputs, slot_start=start)
        for st, m in zip(rows, pre.tolist()):
            st.kv_len += m

    def _decode(self) -> None:
        """One verify step of every running request: select the trees, lay out and run the pass, verify, commit."""
        started = time.perf_counter()
        running = list(self.scheduler.running)
        kv = np.array([st.kv_len for st in running], dtype=np.int64)
        pre = np.array([st.pending for st in running], dtype=np.int64)  # merged prefill tokens of each request
        prefill = int(pre.sum())
        sel = self.selector.select(running, prefill, started)
        inputs = build_inputs([st.tokens for st in running], kv, pre, sel.tb)
        grown = self._ensure_cache(len(running), inputs.num_keys)
        hidden = self._forward(inputs, slot_start=0)
        if inputs.ids.shape[1] > 1:  # [R, H]: the root and draft rows, in (request, node) order
            hidden = hidden[torch.from_numpy(inputs.tree_cols()).to(self.device)]
        else:
            hidden = hidden[:, 0]
        verdict = verify(running, sel.tb, self._fwd.logits(hidden))
        critical = None  # a drafting step of a batch that nothing waits to join: how far it brought the end forward
        if sel.drafted and not self.scheduler.waiting:
            rooms = [st.req.sampling.max_new_tokens - len(st.output) for st in running]
            critical = critical_progress(rooms, [len(w.tokens) for w in verdict.walks])
        emitted = self.commit.step(running, sel.tb, verdict.walks, verdict.logprobs, inputs.base)
        # the step is timed without the cache's growth: a one-off that a plain engine pays at the same capacities
        self.policy.observe(sel, verdict.walks, len(running), prefill, emitted, started + grown, critical)

    def _ensure_cache(self, slots: int, tokens: int) -> float:
        """``KVCache.ensure``; returns the seconds it took when the cache grew (a copy of every cached token), else 0."""
        cache = self._cache
        if slots <= cache.slots and tokens <= cache.capacity:
            return 0.0
        start = time.perf_counter()
        cache.ensure(slots, tokens)
        self._stats["kv_cache_growths"] += 1
        return time.perf_counter() - start

    def reserve(self, tokens: int) -> None:
        """Grow the KV cache now so that every slot holds ``tokens`` tokens and a draft tree: a server (or a
        benchmark) that knows its longest request avoids growing the cache, which copies every cached token, in the
        middle of a step. Example: ``engine.reserve(max_prompt_len + max_new_tokens)``."""
        if tokens < 1:
            raise ValueError(f"reserve(tokens={tokens!r}): give the longest request's prompt plus new tokens, >= 1")
        need = min(tokens + self.config.num_draft_tokens + 1, self._cache.max_capacity)
        self._ensure_cache(self.config.max_running_requests, need)

    def _forward(self, inputs: StepInputs, slot_start: int) -> torch.Tensor:
        """One counted forward pass on host arrays (``TreeForward.forward``); row b is cache slot
        ``slot_start + b``. Returns the hidden states [B, Q, H] after the final norm."""
        dev = self.device
        hidden = self._fwd.forward(
            torch.from_numpy(inputs.ids).to(dev),
            torch.from_numpy(inputs.pos).to(dev),
            torch.from_numpy(inputs.write).to(dev),
            torch.from_numpy(inputs.mask).to(dev)[:, None],
            self._cache,
            slot_start=slot_start,
        )
        self._stats["forward_passes"] += 1
        return hidden
