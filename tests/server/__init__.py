"""Tests of sglang-histospec; the folders mirror the package."""
