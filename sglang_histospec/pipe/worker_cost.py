"""Cost model of one rollout worker that decodes with continuous batching (HistoPipe's clock).

One decode iteration advances every running request by ``tau`` tokens (tau = 1 for plain decoding, the mean
acceptance length with HistoSpec) and takes

    iteration_s + per_request_s * running + per_context_token_s * (sum of the running requests' context lengths)

seconds: a fixed part (reading the weights, launching kernels), a part per running request and a part per token
of KV cache read by attention. A request joining the batch first pays ``prefill_token_s`` per token of context it
brings (its prompt, plus its partial output after a migration). At most ``max_running`` requests decode at once;
the rest wait in the worker's queue. The parameters can be given or fitted from measured iterations
(:meth:`CostModel.fit`, e.g. the per-batch timings of ``histospec bench engine``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class CostModelConfig:
    """Parameters of :class:`CostModel`; the defaults are of the order of an 8B model in bf16 on one H100."""

    iteration_s: float = 0.010
    """Fixed time of one decode iteration, whatever the batch."""
    per_request_s: float = 5e-5
    """Extra time per running request per iteration."""
    per_context_token_s: float = 8e-8
    """Extra time per token of context (prompt + output so far) of each running request per iteration."""
    prefill_token_s: float = 4e-5
    """Time per token of context prefilled when a request joins a worker."""
    max_running: int = 256
    """At most this many requests decode at once on a worker; the others queue."""
    tau: float = 1.0
    """Tokens emitted per request per iteration (1 = plain decoding; HistoSpec's mean acceptance length)."""

    def __post_init__(self) -> None:
        for name in ("iteration_s", "per_request_s", "per_context_token_s", "prefill_token_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"CostModelConfig.{name}={value!r}: must be a finite number >= 0")
        if self.iteration_s + self.per_request_s + self.per_context_token_s <= 0:
            raise ValueError("CostModelConfig: an iteration must take some time; set iteration_s > 0")
        if not (isinstance(self.max_running, int) and self.max_running >= 1):
            raise ValueError(f"CostModelConfig.max_running={self.max_running!r}: must be an int >= 1")
        if not (isinstance(self.tau, (int, float)) and math.isfinite(self.tau) and self.tau >= 1.0):
            raise ValueError(f"CostModelConfig.tau={self.tau!r}: must be >= 1 (1 = no speculation)")


class CostModel:
    """Closed-form pieces of the worker clock; :class:`~sglang_histospec.pipe.worker_sim.WorkerSim` runs it.

    Example: with ``CostModelConfig(iteration_s=1, per_request_s=0, per_context_token_s=0, prefill_token_s=0)``
    a request of 10 tokens alone takes ``solo_time(0, 10) == 10.0`` s; with ``tau=2`` it takes 5.0 s.
    """

    def __init__(self, config: CostModelConfig | None = None) -> None:
        self.config = config or CostModelConfig()

    def iterations(self, length: float) -> int:
        """Decode iterations needed to emit ``length`` tokens (at least 1 for a non-empty response)."""
        if length <= 0:
            return 0
        return max(1, math.ceil(length / self.config.tau - 1e-9))

    def iteration_time(self, running: int, context_tokens: float) -> float:
        """Time of one decode iteration with ``running`` requests holding ``context_tokens`` tokens in all."""
        c = self.config
        return c.iteration_s + c.per_request_s * running + c.per_context_token_s * context_tokens

    def span_time(self, running: int, context_tokens: float, iterations: int) -> float:
        """Time of ``iterations`` consecutive iterations while the batch does not change (contexts grow by tau)."""
        c = self.config
        k = iterations
        growth = running * c.tau
        return k * self.iteration_time(running, context_tokens) + c.per_context_token_s * growth * k * (k - 1) / 2

    def iterations_within(self, running: int, context_tokens: float, budget_s: float, cap: int) -> int:
        """Largest k <= cap whose :meth:`span_time` fits in ``budget_s`` (whole iterations only)."""
        if budget_s <= 0 or cap <= 0:
            return 0
        c = self.config
        a = self.iteration_time(running, context_tokens)
        q = c.per_context_token_s * running * c.tau / 2  # span = q k^2 + (a - q) k
        if q > 0:
            b = a - q
            k = int((-b + math.sqrt(b * b + 4 * q * budget_s)) / (2 * q))
        else:
            k = int(budget_s / a)
        k = max(0, min(cap, k))
        while k > 0 and self.span_time(running, context_tokens, k) > budget_s:
            k -= 1
        while k < cap and self.span_time(running, context_tokens, k + 1) <= budget_s:
            k += 1
        return k

    def prefill_time(self, context_tokens: float) -> float:
        return self.config.prefill_token_s * context_tokens

    def solo_time(self, prompt_len: int, length: int) -> float:
        """Time for one request alone on an idle worker: no schedule can finish it sooner."""
        return self.prefill_time(prompt_len) + self.span_time(1, prompt_len, self.iterations(length))

    def work(self, prompt_len: int, length: int) -> float:
        """Worker-time a request needs even when batched as well as possible (a lower bound on its share).

        Its prefill, its own per-request and context terms over all its iterations, and its 1/max_running share
        of the fixed iteration cost. Summed over a step and divided by the workers it gives a makespan bound.
        """
        k = self.iterations(length)
        return (
            self.prefill_time(prompt_len)
            + self.own_time(prompt_len, length)
            + self.config.iteration_s * k / self.config.max_running
        )

    def own_time(self, prompt_len: int, length: int) -> float:
        """The request's own per-request and context terms summed over its iterations (no fixed part)."""
        c = self.config
        k = self.iterations(length)
        return (
            k * (c.per_request_s + c.per_context_token_s * prompt_len)
            + c.per_context_token_s * c.tau * k * (k - 1) / 2
        )

    def same_time(self, prompt_len: int, length: int, count: int) -> float:
        """:meth:`batch_time` of ``count`` identical requests, in O(1)."""
        if count <= 0:
            return 0.0
        c = self.config
        k = self.iterations(length)
        fixed = max(k, math.ceil(count * k / c.max_running))
        return count * (self.prefill_time(prompt_len) + self.own_time(prompt_len, length)) + c.iteration_s * fixed

    def batch_time(self, requests: Sequence[tuple[int, int]]) -> float:
        """Time for a worker to run ``requests`` (``(prompt_len, length)``) submitted together, in closed form.

        Exact when they all fit in the batch (``len(requests) <= max_running``): every iteration pays the fixed
        part once and each running request its own terms, so the time is the prefills, plus
        ``iteration_s * (longest request's iterations)``, plus the requests' :meth:`own_time`. Beyond the batch
        cap the fixed part is counted for ``max(longest, total iterations / max_running)`` iterations (an
        estimate).

        Example: 1 s per iteration, nothing else costs: requests of 3 and 5 tokens take ``5.0`` s together.
        """
        if not requests:
            return 0.0
        c = self.config
        iters = [self.iterations(n) for _, n in requests]
        fixed = max(max(iters), math.ceil(sum(iters) / c.max_running))
        return (
            sum(self.prefill_time(p) for p, _ in requests)
            + c.iteration_s * fixed
            + sum(self.own_time(p, n) for p, n in requests)
        )

    def lower_bound(self, requests: Sequence[tuple[int, int]], workers: int) -> float:
        """Makespan no placement can beat: max(longest request alone, total work / workers).

        ``requests`` is a list of ``(prompt_len, length)``. Example: 4 requests of 10 tokens at 1 s per iteration
        (nothing else costs, ``max_running=1``) on 2 workers: ``max(10, 40 / 2) == 20``.
        """
        if workers < 1:
            raise ValueError(f"workers={workers!r}: must be >= 1")
        if not requests:
            return 0.0
        longest = max(self.solo_time(p, n) for p, n in requests)
        total = sum(self.work(p, n) for p, n in requests)
        return max(longest, total / workers)

    @staticmethod
    def fit(samples: Sequence[tuple[int, float, float]], **fixed: float) -> CostModelConfig:
        """Least-squares fit of the iteration parameters from ``(running, context_tokens, seconds)`` samples.

        Other fields (``prefill_token_s``, ``max_running``, ``tau``) are taken from ``fixed``. Negative fitted
        coefficients are clipped to 0. Example: samples of ``t = 0.01 + 0.001 * running`` give
        ``iteration_s ~= 0.01, per_request_s ~= 0.001``.
        """
        import numpy as np

        if len(samples) < 3:
            raise ValueError(f"fit needs at least 3 (running, context_tokens, seconds) samples, got {len(samples)}")
        arr = np.asarray(samples, dtype=np.float64)  # [n, 3]
        if arr.ndim != 2 or arr.shape[1] != 3 or not np.isfinite(arr).all():
            raise ValueError("fit samples must be finite (running, context_tokens, seconds) triples")
        design = np.column_stack([np.ones(len(arr)), arr[:, 0], arr[:, 1]])  # [n, 3]
        coef, *_ = np.linalg.lstsq(design, arr[:, 2], rcond=None)
        coef = np.clip(coef, 0.0, None)
        return CostModelConfig(
            iteration_s=float(coef[0]), per_request_s=float(coef[1]), per_context_token_s=float(coef[2]), **fixed
        )
