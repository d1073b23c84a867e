"""The ``HISTOSPEC`` algorithm object for SGLang's dispatch and its server-argument defaults (imports SGLang).

``HistoSpecAlgo`` answers ``is_ngram() -> True``, so every NGRAM branch of SGLang's scheduler applies (verify
input, overlap relay, CUDA-graph capture of the verify width, KV sizing without draft KV). It also defines the
methods SGLang's scheduler calls that the plugin base class ``CustomSpecAlgo`` lacks in 0.5.23
(``create_future_map``, ``carries_draft_hidden_states``, ``need_topk``, ``get_platform_worker_cls``).

Example: ``SpeculativeAlgorithm.from_string("histospec").is_ngram()`` is True once :func:`register_algorithm` ran.
"""

from __future__ import annotations

import logging
import warnings

from sglang_histospec.plugin.constants import ALGORITHM_NAME, TESTED_SGLANG_VERSIONS

logger = logging.getLogger(__name__)

DEFAULT_NUM_DRAFT_TOKENS = 8
"""Draft nodes per request (root included) when ``--speculative-num-draft-tokens`` is not given."""
DEFAULT_MAX_RUNNING_REQUESTS = 256
"""RL batches are large; SGLang's NGRAM default of 48 running requests would throttle a rollout."""
SUPPORTED_DEVICES = ("cuda", "cpu", "xpu")


def check_sglang_version(version: str) -> str | None:
    """A warning text when ``version`` is not a tested SGLang release, else None.

    Example: ``check_sglang_version("0.5.23") is None``; ``check_sglang_version("0.6.0")`` names 0.5.23.
    """
    if version in TESTED_SGLANG_VERSIONS:
        return None
    return (
        f"sglang-histospec's HISTOSPEC plugin was tested with sglang {', '.join(TESTED_SGLANG_VERSIONS)}; "
        f"found sglang {version}. It relies on the NGRAM worker's internals, which may have changed."
    )


def apply_server_arg_defaults(args) -> None:
    """NGRAM-style defaults, by plain assignment (SGLang records the writes), with RL-sized values.

    ``args`` is SGLang's ``ServerArgs`` (or the recording stand-in SGLang passes to plugin hooks).
    """
    if args.device not in SUPPORTED_DEVICES:
        raise ValueError(
            f"--device {args.device}: --speculative-algorithm {ALGORITHM_NAME} needs one of {SUPPORTED_DEVICES}"
        )
    if args.device == "cpu" and not args.disable_overlap_schedule:
        args.disable_overlap_schedule = True  # SGLang has no overlap scheduling for speculative decoding on CPU
    if args.max_running_requests is None:
        args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS
    args.enable_mixed_chunk = False
    args.speculative_eagle_topk = args.speculative_ngram_max_bfs_breadth
    if args.speculative_num_draft_tokens is None:
        args.speculative_num_draft_tokens = DEFAULT_NUM_DRAFT_TOKENS
    if args.speculative_num_draft_tokens < 2:
        raise ValueError(
            f"--speculative-num-draft-tokens {args.speculative_num_draft_tokens}: use >= 2 (the last token + drafts)"
        )
    if args.speculative_num_steps is None:
        args.speculative_num_steps = max(1, args.speculative_num_draft_tokens // args.speculative_eagle_topk)
    if getattr(args, "speculative_ngram_external_corpus_path", None) is not None:
        raise ValueError(
            f"--speculative-ngram-external-corpus-path is an NGRAM option; {ALGORITHM_NAME} drafts from the "
            "per-prompt history (push it with POST /histospec/history)"
        )


def _spec_class():
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class HistoSpecAlgo(CustomSpecAlgo):
        """SGLang's view of HISTOSPEC: an NGRAM look-alike (drafts without a draft model, verified as a tree)."""

        def is_ngram(self) -> bool:
            return True

        def has_draft_kv(self) -> bool:
            return False

        def carries_draft_hidden_states(self) -> bool:
            return False

        def need_topk(self) -> bool:
            return False

        def get_platform_worker_cls(self):
            return None

        def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False):
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

        def handle_server_args(self, server_args) -> None:
            apply_server_arg_defaults(server_args)

    return HistoSpecAlgo


def _worker_factory(server_args):
    from sglang_histospec.plugin.worker import HistoSpecWorker

    return HistoSpecWorker


def register_algorithm() -> None:
    """Register HISTOSPEC with SGLang's speculative registry (no-op if this process already has it)."""
    import sglang
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    message = check_sglang_version(getattr(sglang, "__version__", "unknown"))
    if message:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        logger.warning(message)
    if get_spec(ALGORITHM_NAME) is not None:
        return
    SpeculativeAlgorithm.register(ALGORITHM_NAME, supports_overlap=True, spec_class=_spec_class())(_worker_factory)
