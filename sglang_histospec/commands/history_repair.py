"""``histospec history repair DIR --drop-from OFFSET``: the operator's choice to drop a log's records from a byte on.

Example: ``histospec history repair /tmp/h --drop-from 8`` copies ``history.wal`` to ``history.wal.bak.<time>``
(fsync'd), then cuts the log at byte 8. ``OFFSET`` must be a record start (``histospec history check`` lists
them). Stop the server first. docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import sys

COMMAND = ("history", "repair")
HELP = "back up a history log, then drop its records from --drop-from OFFSET on (stop the server first)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="the server's --history-dir")
    parser.add_argument(
        "--drop-from", type=int, required=True, metavar="OFFSET", help="byte offset of the first record to drop"
    )


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.drafting.history_scan import repair_log

    try:
        result = repair_log(args.directory, args.drop_from)
    except (ValueError, OSError) as exc:
        print(f"histospec history repair: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {"backup": result.backup, "dropped_records": result.dropped_records, "dropped_bytes": result.dropped_bytes}
        )
    )
    return 0
