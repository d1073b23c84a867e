"""Per-method wall-clock seconds of the HistoSpec engine against the plain engine inside ``histospec bench engine``.

Wraps the engine's per-step methods (and the selector's and commit's) with ``perf_counter`` and prints, after each
epoch, each method's total on both engines and the difference per HistoSpec step. Every argument after the batch
and the prompt count is passed to ``bench engine``. A profiling aid, not a benchmark: the wrappers add their own
microseconds to both engines alike.

Example::

    python scripts/profile_engine.py 16 64 > build/profile.json 2> build/profile.txt
"""

from __future__ import annotations

import collections
import contextlib
import sys
import time

import sglang_histospec.commands.bench_engine as bench_engine
import sglang_histospec.engine.commit as commit
import sglang_histospec.engine.engine as engine
import sglang_histospec.engine.policy as policy
import sglang_histospec.engine.selector as selector
from sglang_histospec.cli import main as cli_main

SECONDS: dict[tuple[str, str], float] = collections.defaultdict(float)
CALLS: dict[tuple[str, str], int] = collections.defaultdict(int)
ENGINE_METHODS = ("step", "_admit", "_retire", "_decode", "_forward", "_ensure_cache")
PARTS = ("selector", "policy", "commit", "drafter", "scheduler")


def _tag(obj) -> str:
    """'spec' or 'plain': the engine an object belongs to (bench engine builds the HistoSpec engine first)."""
    return getattr(obj, "_prof_tag", None) or getattr(getattr(obj, "_prof_engine", None), "_prof_tag", "?")


def _wrap(cls: type, name: str, label: str) -> None:
    inner = getattr(cls, name)

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        out = inner(self, *args, **kwargs)
        key = (_tag(self), label)
        SECONDS[key] += time.perf_counter() - start
        CALLS[key] += 1
        return out

    setattr(cls, name, timed)


def _tag_engines() -> None:
    inner = engine.Engine.__init__
    built = [0]

    def init(self, *args, **kwargs):
        inner(self, *args, **kwargs)
        self._prof_tag = "spec" if built[0] % 2 == 0 else "plain"
        built[0] += 1
        for part in PARTS:
            obj = getattr(self, part, None)
            if obj is not None:
                with contextlib.suppress(AttributeError):  # a slotted part is left untagged
                    obj._prof_engine = self

    engine.Engine.__init__ = init


def _wrap_module(module, methods: tuple[str, ...]) -> None:
    for cls in vars(module).values():
        if isinstance(cls, type) and cls.__module__ == module.__name__:
            for name in methods:
                if name in cls.__dict__:
                    _wrap(cls, name, f"{cls.__name__}.{name}")


def _report_epochs() -> None:
    inner = bench_engine._engines_epoch

    def epoch(*args, **kwargs):
        SECONDS.clear()
        CALLS.clear()
        out = inner(*args, **kwargs)
        steps = max(CALLS[("spec", "step")], 1)
        print(f"--- epoch {args[4]}", file=sys.stderr)
        for label in sorted({key[1] for key in SECONDS}):
            spec, plain = SECONDS[("spec", label)], SECONDS[("plain", label)]
            print(
                f"{label:28s} spec {spec * 1e3:9.1f} ms  plain {plain * 1e3:9.1f} ms  "
                f"diff/step {(spec - plain) / steps * 1e6:7.1f} us  "
                f"n {CALLS[('spec', label)]} {CALLS[('plain', label)]}",
                file=sys.stderr,
            )
        return out

    bench_engine._engines_epoch = epoch


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python scripts/profile_engine.py BATCH NUM_PROMPTS [bench engine args...]")
    batch, num_prompts, extra = argv[0], argv[1], argv[2:]
    _tag_engines()
    for name in ENGINE_METHODS:
        _wrap(engine.Engine, name, name)
    _wrap_module(selector, ("select",))
    _wrap_module(policy, ("step_budgets", "cut", "observe"))
    _wrap_module(commit, ("step", "finish"))
    _report_epochs()
    sys.argv = ["histospec", "bench", "engine", "--quick-model", "--batch", batch, "--epochs", "3"]
    sys.argv += ["--group-size", "8", "--num-prompts", num_prompts, "--threads", "1", "--no-hf", "--json", *extra]
    cli_main()


if __name__ == "__main__":
    main(sys.argv[1:])
