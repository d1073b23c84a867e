"""sglang-histospec: RhymeRL's HistoSpec (history-based speculative decoding) and HistoPipe (history-driven
rollout balancing) for LLM reinforcement learning.

Layers (imports point down only): ``core`` (pure) <- ``engine``, ``plugin`` <- ``server``, ``router``, ``cli``
<- ``trl_integration``, ``notebooks``.
"""

__version__ = "0.1.0"
