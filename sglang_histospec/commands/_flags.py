"""Command-line flags generated from a config dataclass: one ``--field-name`` per field, defaults from the class.

Example: ``add_config_flags(parser, SynthConfig)`` then ``config_from_flags(SynthConfig, args)``.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from sglang_histospec.engine.types import ADMISSIONS, DRAFT_SELECTIONS


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


def add_draft_selection_flag(parser: argparse.ArgumentParser) -> None:
    """``--draft-selection`` of the embedded engine (``EngineConfig.draft_selection``), default ``adaptive``."""
    parser.add_argument(
        "--draft-selection",
        default="adaptive",
        choices=DRAFT_SELECTIONS,
        help="adaptive: a step drafts only while drafting is measured to pay, and keeps the draft nodes that pay for "
        "their verify rows (timing-dependent); always: every step with a draft verifies every drafted node within "
        "the budgets (the same greedy request is drafted alike in every run)",
    )
