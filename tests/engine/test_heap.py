"""engine/heap.py: the startup heap frozen out of garbage collection, in a block or for a server's lifetime."""

from __future__ import annotations

import gc
import weakref

from sglang_histospec.engine.heap import freeze_startup_heap, frozen_heap
from sglang_histospec.engine.types import EngineConfig
from sglang_histospec.server.torch_backend import TorchBackend, TorchBackendConfig
from tests.helpers.tiny import make_tiny_model_dir


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_frozen_block_skips_what_lived_before_and_unfreezes_after():
    gc.unfreeze()
    old = _Cycle()
    with frozen_heap() as count:
        assert count > 0 and gc.get_freeze_count() > 0  # (frozen objects freed by reference counting leave it)
        young = _Cycle()
        assert not any(o is old for o in gc.get_objects())  # frozen: no generation holds it
        assert any(o is young for o in gc.get_objects())  # allocated later: collected as usual
    assert gc.get_freeze_count() == 0
    assert any(o is old for o in gc.get_objects())


def test_freeze_startup_heap_collects_garbage_first():
    gc.unfreeze()
    gc.disable()  # no automatic collection before the one under test
    try:
        garbage = weakref.ref(_Cycle())  # unreachable at once, but only a collection frees a cycle
        assert garbage() is not None
        assert freeze_startup_heap() > 0
        assert garbage() is None  # collected, not frozen
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_server_backend_freezes_its_startup_objects_only_when_asked(tmp_path):
    gc.unfreeze()
    model = make_tiny_model_dir(tmp_path / "m", arch="llama", vocab_size=64, seed=0)
    engine = EngineConfig(model_path=model, device="cpu")
    for freeze in (False, True):
        backend = TorchBackend(TorchBackendConfig(engine=engine, freeze_gc=freeze))
        try:
            assert (gc.get_freeze_count() > 0) == freeze
        finally:
            backend.loop.stop()
            gc.unfreeze()
