"""sglang-histospec: RhymeRL's HistoSpec (history-based speculative decoding) and HistoPipe (history-driven
rollout balancing) for LLM reinforcement learning.

Layers (imports point down only; docs/architecture.md, checked by tests/test_layering.py): ``drafting`` <-
``pipe``, ``trace`` <- ``replay``, ``models``, ``engine``, ``plugin`` <- ``server`` <- ``router`` <-
``trl_integration`` <- ``demo`` <- ``commands`` <- ``cli``.
"""

__version__ = "0.1.0"
