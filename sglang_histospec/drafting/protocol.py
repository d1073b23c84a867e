"""``Drafter``: what the engine, the plugin and the replay drive; ``HistoSpecDrafter`` implements it.

A request's life: ``start`` (prompt id and prompt), then per verify step ``draft_batch`` and ``extend`` /
``extend_batch`` with the committed tokens, then ``finish`` (the whole response) or ``abort``. History arrives per
training step: ``add`` (a prompt's group of responses, the trainer's push), then ``end_step``; ``open_step`` is the
step being generated, ``calibration`` what accepted drafts taught, ``stats`` the counters.

Example::

    d: Drafter = HistoSpecDrafter()
    d.add("p", 0, [[7, 1, 2, 3]]); d.end_step(0)
    d.start("r", "p", [5, 7]); d.draft_batch(["r"], [2])[0].token_ids   # [1, 2]
"""

from __future__ import annotations

from typing import Protocol

from sglang_histospec.drafting.calibration import DraftCalibration
from sglang_histospec.drafting.types import Draft

Group = list[list[int]]
"""A prompt's responses of one step, one token list per sample."""
Rewards = list[float] | None
"""One reward per response, or None."""
PromptTokens = list[int] | None
"""The prompt's token ids, or None."""


class Drafter(Protocol):
    """The drafter contract (the module docstring has the request life and an example)."""

    calibration: DraftCalibration
    """Acceptance learnt from verified drafts; the engine's draft-size policy and the plugin share it."""

    @property
    def open_step(self) -> int:
        """The training step being generated; it changes when ``end_step`` closes one (new history)."""
        ...

    def start(self, req_id: str, prompt_id: str | None, prompt_tokens: list[int]) -> None: ...
    def extend(self, req_id: str, tokens: list[int]) -> None: ...
    def extend_batch(self, req_ids: list[str], tokens: list[list[int]]) -> None: ...
    def draft_batch(self, req_ids: list[str], budgets: list[int]) -> list[Draft]: ...
    def finish(self, req_id: str, response: list[int]) -> None: ...
    def abort(self, req_id: str) -> None: ...
    def add(
        self, prompt_id: str, step: int, responses: Group, rewards: Rewards = None, prompt_tokens: PromptTokens = None
    ) -> int:
        """Push a step's group of responses for a prompt; returns how many were stored."""
        ...

    def end_step(self, step: int | None = None) -> None: ...
    def stats(self) -> dict: ...
