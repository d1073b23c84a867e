"""Tests of sglang-histospec; the folders mirror the package, shared helpers are in ``tests.helpers``.

Keep this file free of imports: ``tests/conftest.py`` snapshots ``os.environ`` before anything is imported.
"""
