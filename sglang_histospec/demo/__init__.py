"""The main job: GRPO with and without HistoSpec on a small task, its rollouts, traces and report.

``grpo.py`` trains through the TRL trainer against a rollout server (``server_process.py``), ``chat_demo.py`` sets
up SmolLM2 on a chat task family, ``rollouts.py`` samples a frozen policy epoch by epoch, ``report.py`` compares
the runs. ``histospec demo`` runs it. The tasks are in ``tasks/``, the toy model in ``models/demo_model.py``, the
trace recorder in ``trace/record.py``.
"""
