"""The demo's bundled reasoning task: arithmetic expressions solved step by step, with a verifiable reward.

A prompt is an expression followed by ``=``, e.g. ``3+4*2=``; a completion reduces it one operation at a time, in
any valid order and one of two styles (``STYLES``), and ends with ``#`` and the final value. The prompt set is
fixed by a seed (:class:`ArithTask`). Pure Python (no torch).

Example:
    >>> task = ArithTask(TaskConfig(seed=0, num_prompts=4))
    >>> p = task.prompts[0]
    >>> task.reward(p.text, f"#{p.answer}")
    1.0
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

# An expression tree is an int leaf or a tuple (op, left, right).
OPS = "+-*"
PRECEDENCE = {"+": 1, "-": 1, "*": 2}
STYLES = ("steps", "chain")
"""Solution styles. ``steps``: each reduced operation as an equation, comma-separated: ``4*2=8,3+8=11#11``; the
operands of a ``+`` or ``*`` may be written in either order (``2*4=8,8+3=11#11``). ``chain``: the whole expression
after each reduction, joined by ``=``: ``3+8=11#11``. Whenever several operations can be reduced next
(``2*3+4*5``, ``(1+2)*(3+4)``) any order is valid, so one prompt has several correct solutions and a policy trained
on them keeps real entropy."""
ANSWER_MARK = "#"
STEP_SEP = ","
# Every character a prompt or a solution can contain (the tokenizer's vocabulary, besides special tokens).
ALPHABET = "0123456789+-*()=,#"

_ANSWER_RE = re.compile(r"#(-?\d+)\s*")


@dataclass(frozen=True)
class TaskConfig:
    """Configuration of the arithmetic task (all fields enter the demo model's cache key)."""

    seed: int = 0
    """Seed of the prompt set; the same seed always gives the same prompts, ids and answers."""
    num_prompts: int = 64
    """Size of the fixed RL prompt set (the prompts that repeat every epoch)."""
    min_ops: int = 1
    """Fewest operations per expression."""
    max_ops: int = 3
    """Most operations per expression."""
    max_operand: int = 9
    """Operands are drawn from 1..max_operand."""
    max_value: int = 99
    """Expressions whose value or any intermediate value is negative or above this are rejected."""
    styles: tuple[str, ...] = STYLES
    """Solution styles the supervised data (and hence the policy) uses."""
    format_reward: float = 0.0
    """Reward of a well-formed but wrong final answer (``#<int>`` at the end); a correct one always scores 1."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got min_ops={self.min_ops}, max_ops={self.max_ops}")
        if self.max_operand < 1:
            raise ValueError(f"max_operand={self.max_operand}: must be >= 1")
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts={self.num_prompts}: must be >= 1")
        unknown = set(self.styles) - set(STYLES)
        if not self.styles or unknown:
            raise ValueError(f"styles={self.styles!r}: use a non-empty subset of {STYLES}")
        if not 0.0 <= self.format_reward < 1.0:
            raise ValueError(f"format_reward={self.format_reward}: must be in [0, 1)")


@dataclass(frozen=True)
class TaskPrompt:
    """One prompt of the fixed set."""

    prompt_id: str
    """Stable id (``arith-0007``), the same every epoch."""
    text: str
    """The prompt as text, e.g. ``3+4*2=``."""
    answer: int
    """The expression's value."""
    num_solutions: int = field(default=0, compare=False)
    """How many distinct correct solutions the task's styles and orders give."""


def render(expr) -> str:
    """Text of an expression with the fewest parentheses that keep its tree.

    Example: ``render(("*", ("+", 1, 2), 3)) == "(1+2)*3"``.
    """
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    lt, rt = render(left), render(right)
    if not isinstance(left, int) and PRECEDENCE[left[0]] < PRECEDENCE[op]:
        lt = f"({lt})"
    if not isinstance(right, int) and (
        PRECEDENCE[right[0]] < PRECEDENCE[op] or (PRECEDENCE[right[0]] == PRECEDENCE[op] and op == "-")
    ):
        rt = f"({rt})"
    return f"{lt}{op}{rt}"


def parse(text: str):
    """Parse an expression over non-negative ints, ``+ - *`` and parentheses (left-associative).

    Example: ``parse("3+4*2") == ("+", 3, ("*", 4, 2))``. Raises ValueError on malformed text.
    """
    pos = 0

    def peek() -> str:
        return text[pos] if pos < len(text) else ""

    def atom():
        nonlocal pos
        if peek() == "(":
            pos += 1
            node = additive()
            if peek() != ")":
                raise ValueError(f"expression {text!r}: missing ')' at {pos}")
            pos += 1
            return node
        start = pos
        while peek().isdigit():
            pos += 1
        if start == pos:
            raise ValueError(f"expression {text!r}: expected a number at {pos}")
        return int(text[start:pos])

    def term():
        nonlocal pos
        node = atom()
        while peek() == "*":
            pos += 1
            node = ("*", node, atom())
        return node

    def additive():
        nonlocal pos
        node = term()
        while peek() in ("+", "-"):
            op = peek()
            pos += 1
            node = (op, node, term())
        return node

    tree = additive()
    if pos != len(text):
        raise ValueError(f"expression {text!r}: unexpected {text[pos]!r} at {pos}")
    return tree


def evaluate(expr) -> int:
    """Value of an expression tree. Example: ``evaluate(parse("3+4*2")) == 11``."""
    if isinstance(expr, int):
        return expr
    op, left, right = expr
    a, b = evaluate(left), evaluate(right)
    return a + b if op == "+" else a - b if op == "-" else a * b


def _reducible_paths(expr, path: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Paths (1 = left, 2 = right) to operations whose two operands are numbers, left to right."""
    if isinstance(expr, int):
        return []
    _, left, right = expr
    if isinstance(left, int) and isinstance(right, int):
        return [path]
    return _reducible_paths(left, (*path, 1)) + _reducible_paths(right, (*path, 2))


def _get(expr, path: tuple[int, ...]):
    for i in path:
        expr = expr[i]
    return expr


def _replace(expr, path: tuple[int, ...], value):
    if not path:
        return value
    parts = list(expr)
    parts[path[0]] = _replace(expr[path[0]], path[1:], value)
    return tuple(parts)


def solution_text(expr, order: list[int], style: str, swaps: list[bool] | None = None) -> str:
    """The completion text that reduces ``expr`` in the given order and style.

    ``order[k]`` picks, at reduction k, among the currently reducible operations listed left to right (indices
    beyond the choice count wrap around). In the ``steps`` style, ``swaps[k]`` writes a commutative operation
    (``+``, ``*``) with its operands swapped. Example: ``solution_text(parse("3+4*2"), [0, 0], "steps") ==
    "4*2=8,3+8=11#11"``, with ``swaps=[True, False]``: ``"2*4=8,3+8=11#11"``, and in style ``"chain"``:
    ``"3+8=11#11"``.
    """
    if style not in STYLES:
        raise ValueError(f"style={style!r}: use one of {STYLES}")
    pieces: list[str] = []
    k = 0
    while not isinstance(expr, int):
        paths = _reducible_paths(expr)
        path = paths[order[k] % len(paths)] if k < len(order) else paths[0]
        node = _get(expr, path)
        value = evaluate(node)
        expr = _replace(expr, path, value)
        if style == "chain":
            pieces.append(render(expr))
        elif swaps is not None and k < len(swaps) and swaps[k] and node[0] in "+*":
            pieces.append(f"{node[2]}{node[0]}{node[1]}={value}")
        else:
            pieces.append(f"{render(node)}={value}")
        k += 1
    body = STEP_SEP.join(pieces) if style == "steps" else "=".join(pieces)
    return f"{body}{ANSWER_MARK}{expr}"


def all_solutions(expr, styles: tuple[str, ...] = STYLES) -> list[str]:
    """Every distinct correct completion of ``expr`` (all reduction orders, operand swaps and styles), sorted.

    Example: ``all_solutions(parse("1+2"))`` is ``["1+2=3#3", "2+1=3#3", "3#3"]``.
    """
    orders: list[list[int]] = []

    def walk(e, prefix: list[int]) -> None:
        if isinstance(e, int):
            orders.append(prefix)
            return
        for i, path in enumerate(_reducible_paths(e)):
            walk(_replace(e, path, evaluate(_get(e, path))), [*prefix, i])

    walk(expr, [])
    out = {solution_text(expr, o, "chain") for o in orders} if "chain" in styles else set()
    if "steps" in styles:
        for o in orders:
            for bits in range(2 ** len(o)):
                out.add(solution_text(expr, o, "steps", [bool(bits >> k & 1) for k in range(len(o))]))
    return sorted(out)


def _value_range(expr) -> tuple[int, int]:
    """(min, max) over the values of every sub-expression."""
    if isinstance(expr, int):
        return expr, expr
    lo1, hi1 = _value_range(expr[1])
    lo2, hi2 = _value_range(expr[2])
    v = evaluate(expr)
    return min(lo1, lo2, v), max(hi1, hi2, v)


class ArithTask:
    """The fixed prompt set, a solution sampler and the reward of the demo's arithmetic task.

    The prompt set is fixed by a seed and each prompt has a stable ``prompt_id`` (``arith-0000``, ...), so prompts
    repeat every epoch as in RL training on a fixed data set.

    Example:
        >>> task = ArithTask(TaskConfig(seed=1, num_prompts=8))
        >>> [p.prompt_id for p in task.prompts][:2]
        ['arith-0000', 'arith-0001']
        >>> task.reward("3+4*2=", "4*2=8,3+8=11#11"), task.reward("3+4*2=", "3+4=7#14")
        (1.0, 0.0)
    """

    def __init__(self, config: TaskConfig | None = None) -> None:
        self.config = config or TaskConfig()
        rng = random.Random(f"arith-prompts-{self.config.seed}")
        seen: set[str] = set()
        prompts: list[TaskPrompt] = []
        while len(prompts) < self.config.num_prompts:
            expr = self.random_expression(rng)
            text = render(expr)
            if text in seen:
                continue
            seen.add(text)
            n = len(all_solutions(expr, self.config.styles))
            prompts.append(TaskPrompt(f"arith-{len(prompts):04d}", f"{text}=", evaluate(expr), n))
        self.prompts: list[TaskPrompt] = prompts
        self._by_id = {p.prompt_id: p for p in prompts}

    def random_expression(self, rng: random.Random):
        """Draw one valid expression tree (values within ``[0, max_value]``), re-parsed from its text."""
        cfg = self.config
        while True:
            expr = self._grow(rng, rng.randint(cfg.min_ops, cfg.max_ops))
            expr = parse(render(expr))  # the canonical tree of the text the model sees
            lo, hi = _value_range(expr)
            if lo >= 0 and hi <= cfg.max_value:
                return expr

    def _grow(self, rng: random.Random, num_ops: int):
        if num_ops == 0:
            return rng.randint(1, self.config.max_operand)
        left_ops = rng.randint(0, num_ops - 1)
        op = rng.choice(OPS)
        return (op, self._grow(rng, left_ops), self._grow(rng, num_ops - 1 - left_ops))

    def prompt(self, prompt_id: str) -> TaskPrompt:
        """The prompt with this id; raises ValueError for an unknown id."""
        try:
            return self._by_id[prompt_id]
        except KeyError:
            last = self.prompts[-1].prompt_id
            raise ValueError(f"unknown prompt_id {prompt_id!r}: ids run arith-0000..{last}") from None

    def sample_solution(self, prompt_text: str, rng: random.Random) -> str:
        """One correct completion, style and reduction order drawn uniformly at random.

        Example: ``task.sample_solution("1+2=", random.Random(0))`` is one of ``"1+2=3#3"``, ``"2+1=3#3"``,
        ``"3#3"``; styles are equally likely, and so are both operand orders of a ``+`` or ``*`` step.
        """
        expr = parse(_expression_of(prompt_text))
        style = rng.choice(self.config.styles)
        order = [rng.randrange(1_000_000) for _ in range(self.config.max_ops)]
        swaps = [rng.random() < 0.5 for _ in range(self.config.max_ops)]
        return solution_text(expr, order, style, swaps)

    def training_texts(self, num: int, seed: int, exclude_prompt_set: bool = True) -> list[tuple[str, str]]:
        """``num`` random (prompt, solution) pairs for supervised pretraining, deterministic in ``seed``.

        Expressions of the fixed RL prompt set are left out when ``exclude_prompt_set`` is true, so the RL
        prompts are unseen during pretraining.
        """
        rng = random.Random(f"arith-train-{self.config.seed}-{seed}")
        banned = {p.text for p in self.prompts} if exclude_prompt_set else set()
        pairs: list[tuple[str, str]] = []
        while len(pairs) < num:
            prompt = f"{render(self.random_expression(rng))}="
            if prompt in banned:
                continue
            pairs.append((prompt, self.sample_solution(prompt, rng)))
        return pairs

    def reward(self, prompt: str, completion_text: str) -> float:
        """1.0 when the completion ends with ``#<the expression's value>``, else ``format_reward`` when it ends
        with a well-formed ``#<int>``, else 0.0. Special tokens (``<s>``, ``</s>``, ``<pad>``) are ignored.

        Example: ``task.reward("3+4*2=", "4*2=8,3+8=11#11") == 1.0``.
        """
        expected = evaluate(parse(_expression_of(prompt)))
        text = _strip_special(completion_text).strip()
        hash_at = text.rfind(ANSWER_MARK)
        match = _ANSWER_RE.fullmatch(text, hash_at) if hash_at >= 0 else None
        if match is None:
            return 0.0
        return 1.0 if int(match.group(1)) == expected else self.config.format_reward

    def reward_func(self, prompts: list[str], completions: list[str], **_: object) -> list[float]:
        """TRL reward-function form of :meth:`reward` (``reward_funcs=[task.reward_func]``)."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions: pass one of each per sample")
        return [self.reward(p, c) for p, c in zip(prompts, completions)]

    def rows(self) -> list[dict[str, object]]:
        """The prompt set as data-set rows: ``{"prompt", "prompt_id", "answer"}`` (TRL keeps extra columns)."""
        return [{"prompt": p.text, "prompt_id": p.prompt_id, "answer": p.answer} for p in self.prompts]


def _strip_special(text: str) -> str:
    for tok in ("<s>", "</s>", "<pad>", "<unk>"):
        text = text.replace(tok, "")
    return text


def _expression_of(prompt: str) -> str:
    text = _strip_special(prompt).strip()
    if not text.endswith("="):
        raise ValueError(f"prompt {prompt!r}: a task prompt is an expression followed by '=' (e.g. '3+4*2=')")
    return text[:-1]
