"""The plugin's names: the algorithm SGLang dispatches on and the SGLang releases it was tested with.

Example: ``sglang serve ... --speculative-algorithm HISTOSPEC`` (``ALGORITHM_NAME``).
"""

ALGORITHM_NAME = "HISTOSPEC"
TESTED_SGLANG_VERSIONS = ("0.5.23",)
