"""Command-line flags generated from a config dataclass: one ``--field-name`` per field, defaults from the class.

Example: ``add_config_flags(parser, SynthConfig)`` then ``config_from_flags(SynthConfig, args)``.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from sglang_histospec.engine.types import ADMISSIONS


def parse_bool(text: str) -> bool:
    """``true/false`` (also 1/0, yes/no, on/off) as a bool; anything else is an argparse error."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_config_flags(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One flag per field of dataclass ``cls`` (its type and default taken from a default instance)."""
    defaults = cls()
    for f in fields(cls):
        if f.name in skip:
            continue
        value = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, type=parse_bool, default=value, metavar="true|false", help=f"default {value}")
        else:
            parser.add_argument(flag, type=type(value), default=value, help=f"default {value}")


def config_from_flags(cls, args: argparse.Namespace, **overrides):
    """An instance of ``cls`` from the parsed flags (``overrides`` win)."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **overrides})


def add_admission_flag(parser: argparse.ArgumentParser) -> None:
    """``--admission`` of the embedded engine (``EngineConfig.admission``), default ``groups``."""
    parser.add_argument(
        "--admission",
        default="groups",
        choices=ADMISSIONS,
        help="groups: a free slot takes the waiting request whose prompt has the fewest running samples (a group's "
        "later samples start with a finished sibling in the history); fifo: arrival order",
    )
