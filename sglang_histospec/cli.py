"""The ``histospec`` command: one module per subcommand under ``sglang_histospec.commands``.

Example: ``histospec bench index --json`` runs ``sglang_histospec.commands.bench_index.run(args)``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# One entry per subcommand module. Modules are imported to build the parser, so each keeps its heavy imports
# (torch, transformers, uvicorn, ...) inside ``run``.
COMMAND_MODULES: dict[tuple[str, ...], str] = {
    ("replay",): "sglang_histospec.commands.replay",
    ("trace", "stats"): "sglang_histospec.commands.trace_stats",
    ("trace", "synth"): "sglang_histospec.commands.trace_synth",
    ("trace", "record"): "sglang_histospec.commands.trace_record",
    ("model", "prepare"): "sglang_histospec.commands.model_prepare",
    ("serve",): "sglang_histospec.commands.serve",
    ("history", "check"): "sglang_histospec.commands.history_check",
    ("history", "repair"): "sglang_histospec.commands.history_repair",
    ("pipe", "simulate"): "sglang_histospec.commands.pipe_simulate",
    ("route",): "sglang_histospec.commands.route",
    ("bench", "pipe"): "sglang_histospec.commands.bench_pipe",
    ("bench", "pipe-servers"): "sglang_histospec.commands.bench_pipe_servers",
    ("bench", "index"): "sglang_histospec.commands.bench_index",
    ("bench", "draft"): "sglang_histospec.commands.bench_draft",
    ("bench", "engine"): "sglang_histospec.commands.bench_engine",
    ("bench", "verify-cost"): "sglang_histospec.commands.bench_verify_cost",
    ("demo",): "sglang_histospec.commands.demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="histospec", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {(): parser.add_subparsers(dest="command")}
    for path, module_name in sorted(COMMAND_MODULES.items()):
        for depth in range(1, len(path)):
            prefix = path[:depth]
            if prefix not in groups:
                group = groups[path[: depth - 1]].add_parser(prefix[-1], help=f"{' '.join(prefix)} commands")
                groups[prefix] = group.add_subparsers(dest=f"command_{depth}")
        module = importlib.import_module(module_name)
        sub = groups[path[:-1]].add_parser(path[-1], help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run, _allow_extra=getattr(module, "ALLOW_EXTRA_ARGS", False))
    return parser


def _version() -> str:
    from sglang_histospec import __version__

    return f"histospec {__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "_allow_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra_args = extra
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help()
        return 2
    return int(run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
