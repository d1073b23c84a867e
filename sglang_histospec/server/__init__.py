"""server layer of sglang-histospec."""
