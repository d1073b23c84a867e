"""The SGLang plugin: ``--speculative-algorithm HISTOSPEC`` in SGLang's own server, no fork, no monkeypatch (one
hook through SGLang's own hook registry: the vocabulary check of :mod:`~sglang_histospec.plugin.input_guard`).

SGLang (tested with 0.5.23) runs every function of the entry-point group ``sglang.srt.plugins`` in each process;
ours is :func:`register` (``histospec = "sglang_histospec.plugin:register"`` in pyproject.toml), which registers
``HISTOSPEC`` (SGLang's NGRAM verify path, drafts from :mod:`~sglang_histospec.plugin.worker`) and the token-id
check, and imports SGLang lazily. ``histospec serve --backend sglang``: :mod:`sglang_histospec.server.sglang_backend`;
docs/sglang.md.

Example::

    sglang serve --model-path M --speculative-algorithm HISTOSPEC --speculative-num-draft-tokens 8
    # requests carry "sampling_params": {"custom_params": {"prompt_id": "gsm-17"}}
"""

from __future__ import annotations

from sglang_histospec.plugin.constants import ALGORITHM_NAME, TESTED_SGLANG_VERSIONS

_registered = False


def register() -> None:
    """Register ``HISTOSPEC`` with SGLang (idempotent within a process); SGLang calls this in every process."""
    global _registered
    if _registered:
        return
    from sglang_histospec.plugin.algorithm import register_algorithm
    from sglang_histospec.plugin.input_guard import register_input_guard

    register_algorithm()
    register_input_guard()  # an id outside the vocabulary gets a 400 instead of crashing the scheduler
    _registered = True


__all__ = ["ALGORITHM_NAME", "TESTED_SGLANG_VERSIONS", "register"]
