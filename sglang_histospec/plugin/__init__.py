"""The SGLang plugin: ``--speculative-algorithm HISTOSPEC`` in SGLang's own server, no fork, no monkeypatch.

SGLang (tested with 0.5.23) runs every function of the entry-point group ``sglang.srt.plugins`` in each of its
processes; ours is :func:`register`, declared in pyproject.toml as
``histospec = "sglang_histospec.plugin:register"``. It registers the algorithm ``HISTOSPEC`` through
``SpeculativeAlgorithm.register``: SGLang's NGRAM verify path with drafts from the per-prompt history drafter
(:mod:`sglang_histospec.plugin.worker`, :mod:`sglang_histospec.plugin.adapter`).

Example::

    sglang serve --model-path M --speculative-algorithm HISTOSPEC --speculative-num-draft-tokens 8
    # requests carry "sampling_params": {"custom_params": {"prompt_id": "gsm-17"}}

Nothing here imports SGLang at module import time; :func:`register` imports it lazily. ``histospec serve
--backend sglang`` runs :mod:`sglang_histospec.server.sglang_backend` (SGLang's server plus the /histospec routes).
"""

from __future__ import annotations

ALGORITHM_NAME = "HISTOSPEC"
TESTED_SGLANG_VERSIONS = ("0.5.23",)

_registered = False


def register() -> None:
    """Register ``HISTOSPEC`` with SGLang (idempotent within a process); SGLang calls this in every process."""
    global _registered
    if _registered:
        return
    from sglang_histospec.plugin.algorithm import register_algorithm

    register_algorithm()
    _registered = True


__all__ = ["ALGORITHM_NAME", "TESTED_SGLANG_VERSIONS", "register"]
