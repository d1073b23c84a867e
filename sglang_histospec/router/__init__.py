"""router layer of sglang-histospec."""
