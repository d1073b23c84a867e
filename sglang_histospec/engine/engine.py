"""The embedded torch engine: continuous batching with lossless HistoSpec tree verification.

Threading contract (for the server): an ``Engine`` is NOT thread-safe. Drive it from ONE thread: that thread calls
``add_request`` / ``abort`` / ``step`` / ``update_weights_from_disk`` / ``flush_cache`` / ``stats`` and the drafter
methods (``engine.drafter.add(...)``, ``engine.drafter.end_step(...)``); other threads hand work to it through a queue.

Life of a request: ``add_request`` queues it; each ``step()`` admits queued requests (up to
``max_running_requests`` running), then runs ONE verify forward for every running request (its last token as the
root plus its draft tree, or just the root with ``speculative_algorithm="NONE"``; a newly admitted request's
prompt minus its last token is prefilled in the same pass, or in a pass of its own when it is longer than the
draft width) and returns the requests that finished in this step (aborted ones included). ``generate`` is the blocking
convenience loop over ``add_request`` + ``step``.

Example::

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
from dataclasses import dataclass, field

import numpy as np
import torch

from sglang_histospec.drafting import ROOT, Draft
from sglang_histospec.drafting.calibration import DraftCalibration
from sglang_histospec.drafting.draft_cut import StepCostModel, best_cut
from sglang_histospec.engine.governor import SpecGovernor
from sglang_histospec.engine.model import TreeForward, check_architecture
from sglang_histospec.engine.profile import profile_verify
from sglang_histospec.engine.sampling import process_logits, sample_rows
from sglang_histospec.engine.treebatch import TreeBatch
from sglang_histospec.engine.types import EngineConfig, GenerateRequest, GenerateResult


@dataclass(slots=True)
class _Req:
    req: GenerateRequest
    rng: np.random.Generator
    tokens: list[int]  # prompt + output; the last one is the root of the next verify step (its KV not cached)
    stop_ids: frozenset[int]
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kv_len: int = 0  # tokens[:kv_len] have their K/V in the cache slot
    uniforms: np.ndarray = field(default_factory=lambda: np.empty(0))  # u[skip + j] draws output token j
    skip: int = 0  # sampling.seed_offset: uniforms used by the tokens emitted before a resumption
    verify_ct: int = 0
    draft_ct: int = 0
    accept_ct: int = 0
    finish: dict | None = None


def _uniforms(st: _Req, offsets: np.ndarray) -> np.ndarray:
    """The uniforms of output positions ``st.skip + len(st.output) + offsets`` (``offsets`` [n] int64, a tree's node depths).

    Output token j is always drawn with the request's j-th uniform, whatever the drafts: every node at depth d of
    a step's tree uses the uniform of position ``len(output) + d`` (only one node per depth is ever on the walked
    path), so a seeded request emits the same tokens with and without speculation.
    """
    base = st.skip + len(st.output)
    need = base + int(offsets.max()) + 1
    if len(st.uniforms) < need:
        st.uniforms = np.concatenate([st.uniforms, st.rng.random(max(64, need - len(st.uniforms)))])
    return st.uniforms[base + offsets]


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available; use device='cpu' or 'auto'")
    return torch.device(name)


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _sanitize(
    draft: Draft, budget: int, vocab_size: int, min_score: float = 0.0, scores: list[float] | None = None
) -> tuple[list[int], list[int], list[int]]:
    """Keep at most ``budget`` nodes whose token is in the vocabulary, whose score (``scores[i]``, default the
    draft's path probability) is at least ``min_score`` and whose parent was kept.

    Returns (tokens, parents, kept) of the packed tree: node 0 = root (token filled in by the caller), kept draft
    node ``kept[j]`` -> node j + 1, parent ROOT -> 0.
    """
    ids = draft.token_ids
    if scores is None:
        scores = draft.probs
    if len(ids) <= budget and min(ids) >= 0 and max(ids) < vocab_size and min(scores) >= min_score:  # keep all
        return [0, *ids], [-1, *(0 if p == ROOT else p + 1 for p in draft.parents)], list(range(len(ids)))
    tokens, parents, kept = [0], [-1], []
    remap: dict[int, int] = {ROOT: 0}
    for i, (tok, par) in enumerate(zip(ids, draft.parents)):
        if len(tokens) > budget:
            break
        if par not in remap or not 0 <= tok < vocab_size or scores[i] < min_score:
            continue
        remap[i] = len(tokens)
        tokens.append(int(tok))
        parents.append(remap[par])
        kept.append(i)
    return tokens, parents, kept


class Engine:
    """Batched generation for one Hugging Face causal LM (Llama, Qwen2, Qwen3) with HistoSpec drafting.

    Attributes: ``config`` (EngineConfig), ``drafter`` (core HistoSpecDrafter; history survives weight updates and
    cache flushes), ``budgets`` (core BudgetController), ``tokenizer`` (the model directory's tokenizer, or None),
    ``vocab_size``, ``max_context_len``, ``eos_token_ids``, ``device`` (torch.device), ``model_path`` (the current
    weights' directory), ``weight_version`` (str | None), ``model`` (the HF model holding the weights).

    ``drafter`` / ``budgets`` may be passed in (any objects with the core API: ``start, extend, draft_batch,
    finish, abort`` and ``step_budgets, update, remove``), e.g. to share a drafter or to verify hand-made drafts.
    """

    def __init__(self, config: EngineConfig, drafter=None, budgets=None) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        if not isinstance(config, EngineConfig):
            raise ValueError(f"config is a {type(config).__name__}; pass an EngineConfig")
        if not os.path.isdir(config.model_path):
            raise ValueError(f"model_path={config.model_path!r} is not a directory")
        self.config = config
        self.device = _resolve_device(config.device)
        self.dtype = _resolve_dtype(config.dtype, self.device)
        hf_config = AutoConfig.from_pretrained(config.model_path, trust_remote_code=config.trust_remote_code)
        check_architecture(hf_config)
        model = AutoModelForCausalLM.from_pretrained(
            config.model_path, dtype=self.dtype, trust_remote_code=config.trust_remote_code
        )
        self.model = model.to(self.device).eval()
        self._fwd = TreeForward(self.model)
        self.model_path = config.model_path
        self.weight_version: str | None = None
        self.vocab_size = int(hf_config.vocab_size)
        max_pos = getattr(hf_config, "max_position_embeddings", None) or 2048
        self.max_context_len = int(config.max_context_len or max_pos)
        self.eos_token_ids = self._eos_ids(model)
        self.tokenizer = self._load_tokenizer(config.model_path)
        if drafter is None or budgets is None:
            from sglang_histospec.drafting import BudgetConfig, BudgetController, DrafterConfig, HistoSpecDrafter

            drafter = drafter if drafter is not None else HistoSpecDrafter(config.drafter or DrafterConfig())
            if budgets is None:
                budget = config.budget
                if budget is None and config.draft_selection == "cost":  # the cut sizes the trees
                    budget = BudgetConfig(policy="fixed", fixed=config.num_draft_tokens, cost_limit=None)
                budgets = BudgetController(budget or BudgetConfig())
        self.drafter = drafter
        self.budgets = budgets
        self._speculate = config.speculative_algorithm == "HISTOSPEC" and config.num_draft_tokens > 0
        self.step_cost = StepCostModel()
        # the drafter's calibration when it has one (HistoSpecDrafter does), so replay and the plugin share it
        self.calibration = getattr(self.drafter, "calibration", None) or DraftCalibration()
        self._pause = 0  # steps left without drafting: the last cut expected drafting to be slower than plain steps
        self._pause_len = 1  # length of the next pause (doubles while drafting keeps not paying)
        self._draft_s = 0.0  # decayed mean host time of a step's drafting work (seconds), saved by a paused step
        self._cut = self._speculate and config.draft_selection == "cost"
        self.governor = SpecGovernor(config.governor) if self._cut else None
        self._history_step = getattr(self.drafter, "open_step", None)
        # fixed budgets learn nothing from a step's outcome; a drafter with only the core API extends one by one
        self._adaptive = self._speculate and getattr(getattr(budgets, "cfg", None), "policy", None) != "fixed"
        self._extend_batch = getattr(drafter, "extend_batch", None)
        self._merge_limit = max(8, config.num_draft_tokens + 1)
        self._cache = self._fwd.new_cache(
            config.max_running_requests, self.max_context_len + config.num_draft_tokens + 1
        )
        if self._cut:  # the cut's step model is fitted before the first drafting step (engine/profile.py)
            points = profile_verify(self._fwd, self._cache, config.max_running_requests, config.num_draft_tokens)
            weight = self.step_cost.cfg.min_steps / len(points)
            for batch, rows, seconds in points:
                self.step_cost.observe(batch, rows, seconds, weight=weight)
        self._waiting: collections.deque[GenerateRequest] = collections.deque()
        self._running: list[_Req] = []
        self._done: list[GenerateResult] = []  # finished outside step() (aborts of queued requests, generate())
        self._rids: set[str] = set()
        self._counter = 0
        self._stats = collections.Counter()
        self._started = time.time()

    # ------------------------------------------------------------------ public API
    def add_request(self, request: GenerateRequest) -> None:
        """Queue a request. Raises ValueError for a duplicate rid, a token id >= vocab_size, or a prompt with
        ``len(input_ids) + max_new_tokens > max_context_len`` (the message names the field)."""
        if not isinstance(request, GenerateRequest):
            raise ValueError(f"request is a {type(request).__name__}; pass a GenerateRequest")
        if request.rid in self._rids:
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
        self._rids.add(request.rid)
        self._waiting.append(request)
        self._stats["requests_total"] += 1

    def has_unfinished(self) -> bool:
        """True while requests are queued or running (or aborted ones not yet returned by ``step``)."""
        return bool(self._waiting or self._running or self._done)

    def abort(self, rid: str) -> bool:
        """Abort a queued or running request; its result (finish type "abort", tokens so far) comes out of the
        next ``step()``. Returns False when the rid is unknown (already finished). Aborted responses are never
        recorded into the history."""
        for r in self._waiting:
            if r.rid == rid:
                self._waiting.remove(r)
                self._rids.discard(rid)
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
        for st in self._running:
            if st.req.rid == rid and st.finish is None:
                st.finish = {"type": "abort", "message": "aborted"}
                return True
        return False

    def step(self) -> list[GenerateResult]:
        """Admit queued requests and run one verify step; return the requests that finished in it."""
        results, self._done = self._done, []
        results += self._retire()  # aborted running requests
        self._admit()
        if self._running:
            pending = max(len(st.tokens) - 1 - st.kv_len for st in self._running)
            if pending > self._merge_limit:  # long prefills get their own forward; short ones join the verify pass
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
        for st in self._running:  # recompute every running request's KV with the new weights
            st.kv_len = 0
        self._stats["weight_updates"] += 1

    def flush_cache(self) -> bool:
        """Drop cached KV state; only when idle (returns False when requests are running). Never drops history."""
        if self._running or self._waiting:
            return False
        self._cache.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return True

    def stats(self) -> dict:
        """Counters: requests_total, requests_finished, requests_aborted, requests_running, requests_waiting,
        prompt_tokens, generated_tokens, verify_steps (request-steps), forward_passes, draft_tokens,
        accepted_tokens, tau (generated tokens per request-step), accept_rate, drafter stats under "drafter", the
        cost-aware cut's models under "step_cost" (ready, row_cost_s, calibration bins, draft_pauses: times the
        cut stopped drafting for ``pause_steps`` steps, paused_steps), speculative_algorithm,
        weight_version, model_path, device."""
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
            )
        }
        out.update(
            requests_running=len(self._running),
            requests_waiting=len(self._waiting),
            tau=(s["step_tokens"] / steps) if steps else 0.0,
            accept_rate=(s["accepted_tokens"] / s["draft_tokens"]) if s["draft_tokens"] else 0.0,
            speculative_algorithm=self.config.speculative_algorithm,
            weight_version=self.weight_version,
            model_path=self.model_path,
            device=str(self.device),
            drafter=self.drafter.stats() if hasattr(self.drafter, "stats") else {},
            step_cost={
                "ready": self.step_cost.ready,
                "row_cost_s": self.step_cost.row_cost(),
                "calibration": self.calibration.table(),
                "draft_pauses": int(self._stats["draft_pauses"]),
                "paused_steps": int(self._stats["paused_steps"]),
                "governor": {} if self.governor is None else dict(self.governor.stats),
            },
        )
        return out

    # ------------------------------------------------------------------ internals
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

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.config.max_running_requests:
            req = self._waiting.popleft()
            seed = req.sampling.seed
            rng = np.random.default_rng(seed if seed is not None else [self.config.seed, self._counter])
            self._counter += 1
            stop = set(req.sampling.stop_token_ids)
            if not req.sampling.ignore_eos:
                stop |= self.eos_token_ids
            st = _Req(req=req, rng=rng, tokens=list(req.input_ids), stop_ids=frozenset(stop))
            st.skip = req.sampling.seed_offset
            self._running.append(st)
            self.drafter.start(req.rid, req.prompt_id, list(req.input_ids))
            self._stats["prompt_tokens"] += len(req.input_ids)

    def _prefill(self) -> None:
        """Compute the K/V of every running request's tokens but the last (new requests and, after a weight
        update, all). Those requests form a suffix of the running list (new ones are appended)."""
        pending = [i for i, st in enumerate(self._running) if st.kv_len < len(st.tokens) - 1]
        if not pending:
            return
        start = pending[0]
        rows = self._running[start:]
        for st in rows:  # after a weight update everything from `start` on is recomputed from scratch
            if st.kv_len >= len(st.tokens) - 1:
                st.kv_len = 0
        lens = [len(st.tokens) - 1 - st.kv_len for st in rows]
        n = max(lens)
        t = max(len(st.tokens) - 1 for st in rows)
        self._cache.ensure(len(self._running), t)
        ids = np.zeros((len(rows), n), dtype=np.int64)
        pos = np.zeros((len(rows), n), dtype=np.int64)
        write = np.full((len(rows), n), -1, dtype=np.int64)
        mask = np.zeros((len(rows), n, t), dtype=bool)
        for b, st in enumerate(rows):
            k, m = st.kv_len, lens[b]
            if m == 0:
                mask[b, :, 0] = True
                continue
            ids[b, :m] = st.tokens[k : k + m]
            pos[b, :m] = np.arange(k, k + m)
            write[b, :m] = pos[b, :m]
            mask[b, :m, : k + m] = np.tril(np.ones((m, k + m), dtype=bool), k)
            mask[b, m:, 0] = True
        self._forward(ids, pos, write, mask, slot_start=start)
        for b, st in enumerate(rows):
            st.kv_len += lens[b]

    def _forward(
        self, ids: np.ndarray, pos: np.ndarray, write: np.ndarray, mask: np.ndarray, slot_start: int
    ) -> torch.Tensor:
        """One counted forward pass on host arrays (``TreeForward.forward``): ids, pos, write [B, Q] int64 (cache
        index written, -1 = padding), mask [B, Q, T] bool (True = may attend); row b is cache slot
        ``slot_start + b``. Returns the hidden states [B, Q, H] after the final norm."""
        dev = self.device
        hidden = self._fwd.forward(
            torch.from_numpy(ids).to(dev),
            torch.from_numpy(pos).to(dev),
            torch.from_numpy(write).to(dev),
            torch.from_numpy(mask).to(dev)[:, None],
            self._cache,
            slot_start=slot_start,
        )
        self._stats["forward_passes"] += 1
        return hidden

    def _budgets(self) -> list[int]:
        running = self._running
        if not self._speculate:
            return [0] * len(running)
        step = getattr(self.drafter, "open_step", None)
        if step != self._history_step:  # new history: whether drafting pays is measured anew
            self._history_step = step
            self._pause, self._pause_len = 0, 1
            if self.governor is not None:
                self.governor.forget_drafting()
        if self._pause > 0 or (self.governor is not None and not self.governor.use_spec(len(running))):
            return [0] * len(running)
        rids = [st.req.rid for st in running]
        raw = self.budgets.step_budgets(rids, len(running))
        out = []
        for st, b in zip(running, raw):
            left = st.req.sampling.max_new_tokens - len(st.output) - 1
            room = self.max_context_len - len(st.tokens)
            out.append(max(0, min(int(b), self.config.num_draft_tokens, left, room)))
        return out

    def _threshold(self, scores: np.ndarray, bsz: int, prefill: int) -> float:
        """Smallest calibrated probability a draft node needs this step: the cost-aware cut over ``scores`` [n], the
        calibrated path probabilities of every request's draft nodes within its budget, for a step that also
        carries ``prefill`` merged prefill tokens (0.0 keeps everything; the best node is always kept, so that
        the calibration keeps learning).

        When even the best cut is expected to emit fewer tokens per second than a step without any drafting work
        (the step's cost minus the measured drafting time), the next steps do not draft: 1, then 2, 4, ... up to
        ``pause_steps`` while that keeps happening (see ``StepCostConfig.pause_steps``)."""
        if not len(scores):
            return 0.0
        desc = np.sort(scores)[::-1]
        model = self.step_cost
        row = model.row_cost()
        base = model.base_cost(bsz) + row * prefill
        k = best_cut(desc, float(bsz), base, row)
        spec_rate = (bsz + float(desc[:k].sum())) / (base + row * k)
        if spec_rate < bsz / max(base - self._draft_s, 1e-9):
            self._pause = min(self._pause_len, model.cfg.pause_steps)
            self._pause_len = min(2 * self._pause_len, max(1, model.cfg.pause_steps))
            self._stats["draft_pauses"] += self._pause > 0
        else:
            self._pause_len = 1
        k = max(k, 1)  # a drafting step verifies at least its best node: how else would the calibration learn
        return 0.0 if k >= len(desc) else float(desc[k - 1])

    def _decode(self) -> None:
        started = time.perf_counter()
        running = list(self._running)
        bsz = len(running)
        budgets = self._budgets()
        ask = [i for i, b in enumerate(budgets) if b > 0]
        # Query layout of row b: pre[b] not yet cached tokens (a newly admitted request's prompt minus its last
        # token: its prefill, merged into this pass), then the root, then the draft nodes. base = where the root goes.
        pre = np.array([len(st.tokens) - 1 - st.kv_len for st in running], dtype=np.int64)
        trees: list[tuple[list[int], list[int]] | None] = [None] * bsz  # None = the root alone
        verified: dict[int, tuple[Draft, list[int]]] = {}  # request -> its draft and the draft nodes kept
        if ask:
            got = self.drafter.draft_batch([running[i].req.rid for i in ask], [budgets[i] for i in ask])
            theta, scores = 0.0, [None] * len(got)
            if self._cut and self.step_cost.ready:
                limits = [budgets[i] for i in ask]
                flat = self.calibration.calibrate_drafts(got, limits)
                theta = self._threshold(flat, bsz, int(pre.sum()))
                if theta > 0.0:
                    sizes = [min(len(d), k) for d, k in zip(got, limits)]
                    scores = [part.tolist() for part in np.split(flat, np.cumsum(sizes)[:-1])]
            for i, d, sc in zip(ask, got, scores):
                if len(d):
                    toks, pars, kept = _sanitize(d, budgets[i], self.vocab_size, theta, sc)
                    if len(toks) > 1:
                        trees[i] = (toks, pars)
                        verified[i] = (d, kept)
        tb = TreeBatch.build(trees, [st.tokens[-1] for st in running])
        if ask:
            self._draft_s = 0.9 * self._draft_s + 0.1 * (time.perf_counter() - started)
        counts = tb.counts
        kv = np.array([st.kv_len for st in running], dtype=np.int64)
        base = kv + pre
        n = int((pre + counts).max())
        t_keys = int((base + counts).max())
        self._cache.ensure(bsz, t_keys)
        rows = np.arange(bsz)
        ids = np.zeros((bsz, n), dtype=np.int64)
        pos = np.repeat(base[:, None], n, axis=1)
        write = np.full((bsz, n), -1, dtype=np.int64)
        mask = np.broadcast_to(np.arange(t_keys)[None, None, :] < base[:, None, None], (bsz, n, t_keys)).copy()
        mask[rows, :, base] = True  # every row sees the root (padding rows see the past and the root only)
        for b in np.flatnonzero(pre):
            k, m = int(kv[b]), int(pre[b])
            ids[b, :m] = running[b].tokens[k : k + m]
            pos[b, :m] = np.arange(k, k + m)
            write[b, :m] = pos[b, :m]
            mask[b, :m, k : k + m + 1] = np.tril(np.ones((m, m + 1), dtype=bool))  # causal; not the root
        # tree rows (roots and draft nodes of every request at once): node i of request b sits at query column
        # pre[b] + i, is written to cache index base[b] + i, has rotary position base[b] + depth(i) and sees its
        # ancestors (and itself) among the tree keys
        owner, local = tb.owner, tb.local
        qcol, at = pre[owner] + local, base[owner]
        ids[owner, qcol] = tb.tokens
        pos[owner, qcol] = at + tb.depth
        write[owner, qcol] = at + local
        if tb.num_rows > bsz:
            r, k = tb.pairs
            mask[owner[r], qcol[r], at[r] + local[k]] = True
        hidden = self._forward(ids, pos, write, mask, slot_start=0)
        dev = self.device
        if n > 1:  # [R, H]: the root and draft rows, in (request, node) order
            col = np.arange(n)[None, :]
            keep = (col >= pre[:, None]) & (col < (pre + counts)[:, None])
            hidden = hidden[torch.from_numpy(keep).to(dev)]
        else:
            hidden = hidden[:, 0]
        logits = self._fwd.logits(hidden)
        sp = [st.req.sampling for st in running]
        greedy = np.array([s.is_greedy for s in sp])
        reps = torch.from_numpy(counts).to(dev)

        def per_row(values, dtype):
            t = torch.tensor(values, device=dev, dtype=dtype)
            return t if n == 1 else t.repeat_interleave(reps)

        probs = process_logits(
            logits,
            per_row([0.0 if g else float(s.temperature) for s, g in zip(sp, greedy)], torch.float32),
            per_row([s.top_k for s in sp], torch.int64),
            per_row([float(s.top_p) for s in sp], torch.float32),
        )
        offsets = tb.offsets
        # one draw from q at every node (the argmax for greedy requests), then a walk per tree: the one-uniform
        # form of the multi-draft rule (see sampling.py); a node at depth d draws with the uniform of output
        # position len(output) + d from the request's own seeded stream (_uniforms)
        picked = probs.argmax(dim=-1) if greedy.any() else None
        sampled = np.flatnonzero(~greedy)
        depth = tb.depth
        if len(sampled) == bsz:  # all requests sample: every row, in order
            u = np.concatenate([_uniforms(st, depth[offsets[b] : offsets[b + 1]]) for b, st in enumerate(running)])
            picked = sample_rows(probs, torch.from_numpy(u).to(dev))
        elif len(sampled):
            row_idx = torch.from_numpy(np.concatenate([np.arange(offsets[b], offsets[b + 1]) for b in sampled]))
            u = np.concatenate([_uniforms(running[b], depth[offsets[b] : offsets[b + 1]]) for b in sampled])
            row_idx = row_idx.to(dev)
            picked[row_idx] = sample_rows(probs[row_idx], torch.from_numpy(u).to(dev))
        picked_np = picked.cpu().numpy()
        outcomes = tb.walk(picked_np)
        depths = np.maximum.reduceat(tb.depth, offsets[:-1]) if self._adaptive else None
        logprobs = None
        if any(st.req.return_logprob for st in running):
            flat_rows = [r for o in outcomes for r in o.rows]
            flat_toks = [t for o in outcomes for t in o.tokens]
            picked = probs[torch.tensor(flat_rows, device=dev), torch.tensor(flat_toks, device=dev)]
            logprobs = torch.log(picked.double()).cpu().tolist()
        lp_at = 0
        step_emitted = 0
        mv_slot, mv_src, mv_dst = [], [], []
        ext_rids, ext_tokens = [], []  # what each running request emitted, for the drafter
        for b, (st, walk) in enumerate(zip(running, outcomes)):
            accepted_nodes, tokens = walk.accepted_nodes, walk.tokens
            drafted = int(counts[b]) - 1
            st.verify_ct += 1
            st.draft_ct += drafted
            self._stats["verify_steps"] += 1
            self._stats["draft_tokens"] += drafted
            accepted = 0
            emitted = 0
            for k, tok in enumerate(tokens):
                st.output.append(tok)
                st.tokens.append(tok)
                if logprobs is not None and st.req.return_logprob:
                    st.logprobs.append(logprobs[lp_at + k])
                emitted += 1
                if k < len(accepted_nodes):
                    accepted += 1
                if tok in st.stop_ids:
                    st.finish = {"type": "stop", "matched": tok}
                elif len(st.output) >= sp[b].max_new_tokens:
                    st.finish = {"type": "length", "length": len(st.output)}
                if st.finish is not None:
                    break
            lp_at += len(tokens)
            st.accept_ct += accepted
            self._stats["accepted_tokens"] += accepted
            self._stats["generated_tokens"] += emitted
            self._stats["step_tokens"] += emitted
            step_emitted += emitted
            if depths is not None:  # the budget controller counts chain depth: the tree's depth, the accepted length
                self.budgets.update(st.req.rid, int(depths[b]), accepted)
            if st.finish is None:
                # compact the accepted path: node i_k's K/V (written at base + i_k) moves to base + k
                root_at = int(base[b])
                for k, node in enumerate(accepted_nodes, start=1):
                    if node != k:
                        mv_slot.append(b)
                        mv_src.append(root_at + node)
                        mv_dst.append(root_at + k)
                st.kv_len = root_at + 1 + len(accepted_nodes)
                if self._speculate:
                    ext_rids.append(st.req.rid)
                    ext_tokens.append(tokens)
        if ext_rids and self._extend_batch is not None:
            self._extend_batch(ext_rids, ext_tokens)
        else:
            for rid, toks in zip(ext_rids, ext_tokens):
                self.drafter.extend(rid, toks)
        if mv_slot:
            self._cache.move_tokens(
                torch.tensor(mv_slot, device=dev), torch.tensor(mv_src, device=dev), torch.tensor(mv_dst, device=dev)
            )
        if self._speculate:
            if verified:  # what was accepted calibrates the drafted probabilities
                self._learn(verified, outcomes)
            if ask:  # steps that drafted: a paused step has no drafting work and would bias the fit
                self.step_cost.observe(bsz, tb.num_rows + int(pre.sum()), time.perf_counter() - started)
            elif self._pause > 0:
                self._pause -= 1
                self._stats["paused_steps"] += 1
            if self.governor is not None:  # measured tokens/s, less the modelled cost of a merged prefill
                elapsed = time.perf_counter() - started - self.step_cost.row_cost() * int(pre.sum())
                self.governor.observe(bsz, bool(ask), step_emitted, max(elapsed, 1e-6))

    def _learn(self, verified: dict[int, tuple[Draft, list[int]]], outcomes: list) -> None:
        """Teach the calibration this step's verified drafts: request b's ``kept`` draft nodes became its tree
        nodes 1.., of which ``outcomes[b].accepted_nodes`` were accepted."""
        drafts, seen, hit = [], [], []
        for b, (d, kept) in verified.items():
            flags = np.zeros((2, len(d)), dtype=bool)
            flags[0, kept] = True
            flags[1, [kept[node - 1] for node in outcomes[b].accepted_nodes]] = True
            drafts.append(d)
            seen.append(flags[0])
            hit.append(flags[1])
        self.calibration.observe_drafts(drafts, np.concatenate(hit), np.concatenate(seen))

    def _retire(self) -> list[GenerateResult]:
        """Remove finished requests from the running list (keeping slots contiguous) and build their results."""
        out = []
        for i in range(len(self._running) - 1, -1, -1):
            st = self._running[i]
            if st.finish is None:
                continue
            last = len(self._running) - 1
            if i != last:
                moved = self._running[last]
                self._cache.move_slot(last, i, moved.kv_len)
                self._running[i] = moved
            self._running.pop()
            out.append(self._finish(st))
        out.reverse()
        return out

    def _finish(self, st: _Req) -> GenerateResult:
        req = st.req
        rid = req.rid
        self._rids.discard(rid)
        aborted = st.finish["type"] == "abort"
        if aborted:
            self.drafter.abort(rid)
            self._stats["requests_aborted"] += 1
        else:
            if self.config.record_responses and req.prompt_id is not None:
                self.drafter.finish(rid, list(st.output))
            else:
                self.drafter.abort(rid)
            self._stats["requests_finished"] += 1
        if self._speculate:
            self.budgets.remove(rid)
        return GenerateResult(
            rid=rid,
            output_ids=list(st.output),
            finish_reason=st.finish,
            output_logprobs=list(st.logprobs) if req.return_logprob else None,
            prompt_tokens=len(req.input_ids),
            completion_tokens=len(st.output),
            spec_verify_ct=st.verify_ct,
            spec_draft_tokens=st.draft_ct,
            spec_accepted_tokens=st.accept_ct,
            prompt_id=req.prompt_id,
        )
