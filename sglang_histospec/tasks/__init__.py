"""Task families with verifiable rewards: the toy arithmetic task (``tasks/arith.py``) and the chat families of
real instruct models (``tasks/chat.py``: arith, sort, units, and the long-response ledger and report).

Pure Python; the submodules import nothing from this package.

Example::

    from sglang_histospec.tasks import ArithTask, make_family
    task = ArithTask()                 # task.prompts: the fixed RL prompt set; task.reward(prompt, completion)
    family = make_family("units", 8)   # family.prompts, family.reward(prompt, completion)
"""

from sglang_histospec.tasks.arith import ArithTask, TaskConfig, TaskPrompt
from sglang_histospec.tasks.chat import FAMILIES, HELD_OUT, ChatFamily, ChatPrompt, make_family

__all__ = [
    "FAMILIES",
    "HELD_OUT",
    "ArithTask",
    "ChatFamily",
    "ChatPrompt",
    "TaskConfig",
    "TaskPrompt",
    "make_family",
]
