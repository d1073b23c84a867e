"""Subcommands of the ``histospec`` CLI, one module each.

Each module defines ``COMMAND`` (the words after ``histospec``, e.g. ``("bench", "index")``), ``HELP`` (one
line), ``add_arguments(parser)`` and ``run(args) -> int``. ``sglang_histospec.cli`` lists the modules.
"""
