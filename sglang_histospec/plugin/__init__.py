"""plugin layer of sglang-histospec."""
