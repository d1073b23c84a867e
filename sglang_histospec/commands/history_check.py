"""``histospec history check DIR``: what a history directory holds, and whether a server would start from it.

Example: ``histospec history check /tmp/h --json``; exit status 0 when a server would start, 1 when it would
refuse (a corrupt snapshot or log record; the report names the offset and the repair command), 2 on a bad argument.
Reads only: nothing is changed (``drafting/history_scan.py``, docs/reliability.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

COMMAND = ("history", "check")
HELP = "report a history directory's snapshot and write-ahead log (read only)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="the server's --history-dir")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    from sglang_histospec.drafting.history_scan import check_directory

    if not os.path.isdir(args.directory):
        print(f"histospec history check: {args.directory} is not a directory", file=sys.stderr)
        return 2
    report = check_directory(args.directory)
    if args.json:
        print(json.dumps(report))
    else:
        print("\n".join(_lines(report)))
    return 0 if report["ok"] else 1


def _lines(report: dict) -> list[str]:
    snap, log = report["snapshot"], report["log"]
    out = [f"history directory {report['directory']}: {'ok' if report['ok'] else 'a server would refuse to start'}"]
    if snap is None:
        out.append("snapshot: none")
    elif snap["ok"]:
        out.append(f"snapshot: ok (holds log records up to seq {snap['log_seq']})")
    else:
        out.append(f"snapshot: CORRUPT: {snap['problem']}")
    if log is None:
        out.append("log: none")
        return out
    out.append(
        f"log: {log['size']} bytes, format {log.get('format')}, {log['records']} intact records "
        f"(seq {log.get('first_seq')}..{log.get('last_seq')})"
    )
    if log.get("torn_tail_bytes"):
        out.append(f"log: a torn last record of {log['torn_tail_bytes']} bytes (never acknowledged; cut at start)")
    if log["problem"]:
        out.append(f"log: CORRUPT: {log['problem']}")
    if log.get("repair"):
        out.append(f"to drop the corrupt record and everything after it (a backup is written first): {log['repair']}")
    return out
