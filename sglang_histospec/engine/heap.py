"""The garbage collector and a long-running engine: freeze what startup built.

A full collection walks every tracked object and pauses the engine loop meanwhile. After startup most of them (the
model's modules, the tokenizer, imported code, the drafter's and scheduler's bookkeeping) live until the process ends
and are never garbage, so each full collection spends its pause on them. ``gc.freeze()`` moves every object alive
now to a permanent generation that collections skip (SGLang freezes its processes after warm-up, vLLM its engine
core after init); reference counting still frees them. Example::

    engine = Engine(EngineConfig(model_path="/tmp/tiny"))
    frozen = freeze_startup_heap()     # once, when the engine is built (and warmed up), before serving
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def freeze_startup_heap() -> int:
    """Collect garbage once, then freeze every object still alive (``gc.freeze``); returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextlib.contextmanager
def frozen_heap() -> Iterator[int]:
    """``freeze_startup_heap`` for the duration of a block (a benchmark inside a longer process), unfrozen after
    (``gc.unfreeze`` unfreezes everything, what was frozen before the block too); yields the count frozen."""
    count = freeze_startup_heap()
    try:
        yield count
    finally:
        gc.unfreeze()
