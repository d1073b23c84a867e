"""Per-prompt response-length prediction from history (HistoPipe's input).

RhymeRL observed that response lengths rank stably across epochs (2-4 % of responses change rank much), so a
prompt's last visits predict its next one. The predictor keeps, per prompt, the lengths of its last ``window``
visits (steps) and answers mean and quantiles over them; a prompt never seen gets a prior pooled over every
length it holds; lengths observed while a step runs (siblings that finished) count at once.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class LengthPredictorConfig:
    window: int = 2
    """How many past visits (steps) of a prompt are kept; the open step counts as one."""
    quantiles: tuple[float, ...] = (0.5, 0.9)
    """Quantiles reported by :meth:`LengthPredictor.predict`, each in [0, 1]."""
    default_length: float = 512.0
    """Prediction when no length at all is known yet (the very first step)."""
    error_window: int = 4096
    """How many recent actual/predicted ratios :meth:`LengthPredictor.error_ratio` keeps."""

    def __post_init__(self) -> None:
        if not (isinstance(self.window, int) and self.window >= 1):
            raise ValueError(f"LengthPredictorConfig.window={self.window!r}: must be an int >= 1")
        self.quantiles = tuple(float(q) for q in self.quantiles)
        if any(not 0.0 <= q <= 1.0 for q in self.quantiles):
            raise ValueError(f"LengthPredictorConfig.quantiles={self.quantiles!r}: each must be in [0, 1]")
        if not (math.isfinite(self.default_length) and self.default_length > 0):
            raise ValueError(f"LengthPredictorConfig.default_length={self.default_length!r}: must be > 0")
        if not (isinstance(self.error_window, int) and self.error_window >= 1):
            raise ValueError(f"LengthPredictorConfig.error_window={self.error_window!r}: must be an int >= 1")


@dataclass(frozen=True, slots=True)
class LengthEstimate:
    """Predicted response length of one prompt."""

    mean: float
    quantiles: dict[float, float] = field(default_factory=dict)
    count: int = 0
    """Responses the estimate rests on (0 = the default, nothing known)."""
    known: bool = False
    """False when the estimate is the prior (the prompt has no history)."""

    def quantile(self, q: float) -> float:
        """A reported quantile; the mean when ``q`` was not configured."""
        return self.quantiles.get(float(q), self.mean)


def _quantile(sorted_values: list[int], q: float) -> float:
    """Linear-interpolation quantile of an ascending non-empty list (numpy's default method)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class LengthPredictor:
    """Length history per prompt; ``add`` a whole visit, ``observe`` one finished response, ``predict``.

    Example::

        p = LengthPredictor(LengthPredictorConfig(window=1))
        p.add("a", step=0, lengths=[100, 300])
        p.predict("a").mean            # 200.0
        p.add("a", step=1, lengths=[50])
        p.predict("a").mean            # 50.0 (window=1 keeps only the last visit)
        p.predict("never-seen").mean   # 50.0, the prior pooled over every prompt held
    """

    def __init__(self, config: LengthPredictorConfig | None = None) -> None:
        self.config = config or LengthPredictorConfig()
        self._visits: dict[str, OrderedDict[int, list[int]]] = {}
        self._prior: LengthEstimate | None = None
        self._ratios: deque[float] = deque(maxlen=self.config.error_window)

    def __len__(self) -> int:
        """Number of prompts with history."""
        return len(self._visits)

    def add(self, prompt_id: str, step: int, lengths: Iterable[int]) -> int:
        """Record the lengths of a visit of ``prompt_id`` at ``step`` (appends when the visit exists); returns n."""
        lengths = list(lengths)
        for n in lengths:
            self._check(prompt_id, step, n)
        if not lengths:
            return 0
        visits = self._visits.setdefault(prompt_id, OrderedDict())
        earlier = [n for st, visit in visits.items() if st < step for n in visit]
        if earlier and (mean := sum(earlier) / len(earlier)) > 0:
            self._ratios.extend(n / mean for n in lengths)
        if step not in visits:
            visits[step] = []
            # Keep visits ordered by step; evict the oldest beyond the window.
            if len(visits) > 1 and step < next(reversed(visits)):
                ordered = sorted(visits.items())
                visits.clear()
                visits.update(ordered)
            while len(visits) > self.config.window:
                visits.popitem(last=False)
        if step in visits:
            visits[step].extend(lengths)
        self._prior = None
        return len(lengths)

    def observe(self, prompt_id: str, step: int, length: int) -> None:
        """One response of ``prompt_id`` finished during ``step`` with ``length`` tokens (online update)."""
        self.add(prompt_id, step, [length])

    def error_ratio(self, q: float) -> float:
        """Quantile ``q`` of recent actual / predicted length ratios (prediction = mean of earlier visits).

        1.0 until a prompt has come back. Example: a prompt at 100 tokens that returns at 150 gives 1.5.
        """
        if not self._ratios:
            return 1.0
        return _quantile(sorted(self._ratios), q)

    def lengths(self, prompt_id: str) -> list[int]:
        """Every length held for ``prompt_id`` (oldest visit first); empty when unknown."""
        return [n for visit in self._visits.get(prompt_id, {}).values() for n in visit]

    def predict(self, prompt_id: str) -> LengthEstimate:
        """Mean and quantiles over the prompt's window; the prior when the prompt has no history."""
        values = self.lengths(prompt_id)
        if not values:
            return self.prior()
        return self._estimate(values, known=True)

    def prior(self) -> LengthEstimate:
        """Estimate for an unknown prompt: mean of the known prompts' means, quantiles pooled over all lengths."""
        if self._prior is None:
            if not self._visits:
                d = self.config.default_length
                self._prior = LengthEstimate(mean=d, quantiles={q: d for q in self.config.quantiles})
            else:
                pooled = [n for pid in self._visits for n in self.lengths(pid)]
                est = self._estimate(pooled, known=False)
                means = [sum(v) / len(v) for v in (self.lengths(pid) for pid in self._visits)]
                self._prior = LengthEstimate(sum(means) / len(means), est.quantiles, est.count, known=False)
        return self._prior

    def _estimate(self, values: list[int], known: bool) -> LengthEstimate:
        ordered = sorted(values)
        quantiles = {q: _quantile(ordered, q) for q in self.config.quantiles}
        return LengthEstimate(sum(values) / len(values), quantiles, len(values), known)

    @staticmethod
    def _check(prompt_id: object, step: object, length: object) -> None:
        if not isinstance(prompt_id, str):
            raise ValueError(f"prompt_id={prompt_id!r}: must be a str")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step={step!r}: must be an int >= 0")
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length={length!r} for prompt {prompt_id!r}: must be an int >= 0")
