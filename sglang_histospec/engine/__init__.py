"""engine layer of sglang-histospec."""
