"""Task families in chat form with verifiable rewards, for real instruct models (SmolLM2) under GRPO.

Each family (``arith``, ``sort``, ``units``, and the long-response ``ledger`` and ``report``: ``FAMILIES``) makes a fixed prompt set from a seed (stable
``prompt_id`` s, repeated every epoch), scores a completion by its final ``Answer:`` line, and writes reference
solutions for a short supervised warm-up on problems *outside* the prompt set.

Example:
    >>> fam = make_family("arith", num_prompts=2, seed=0)
    >>> p = fam.prompts[0]
    >>> fam.reward(p, fam.solution(p, random.Random(0)))
    1.0
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

ANSWER_RE = re.compile(r"Answer:\s*(.+?)\s*$", re.S)
WORDS = [
    "apple",
    "banana",
    "cherry",
    "grape",
    "lemon",
    "mango",
    "melon",
    "olive",
    "peach",
    "pear",
    "plum",
    "berry",
    "river",
    "stone",
    "cloud",
    "tiger",
    "zebra",
    "horse",
    "eagle",
    "otter",
    "candle",
    "window",
    "garden",
    "pencil",
    "rocket",
    "silver",
    "forest",
    "island",
    "castle",
    "bridge",
    "meadow",
    "violet",
    "copper",
    "marble",
    "saddle",
    "harbor",
    "lantern",
]
UNITS = (  # (big unit, small unit, factor, smallest unit, factor)
    ("hours", "minutes", 60, "seconds", 60),
    ("kilometers", "meters", 1000, "centimeters", 100),
    ("days", "hours", 24, "minutes", 60),
    ("kilograms", "grams", 1000, "milligrams", 1000),
    ("meters", "centimeters", 100, "millimeters", 10),
)


def plural(word: str) -> str:
    """English plural of one of ``WORDS``. Example: ``plural("peach")`` -> ``"peaches"``."""
    if word.endswith(("ch", "sh", "s", "x")):
        return word + "es"
    return word[:-1] + "ies" if word.endswith("y") and word[-2] not in "aeiou" else word + "s"


@dataclass(frozen=True)
class ChatPrompt:
    """One problem: its id, the user message, and what the answer line must hold."""

    prompt_id: str
    text: str
    """The user message (the chat template is applied by the caller)."""
    answer: str
    """The expected content of the ``Answer:`` line, normalised (see ``ChatFamily.normalise``)."""
    data: tuple
    """The problem's parameters, for reference solutions."""


class ChatFamily:
    """A task family: prompts, a reward in [0, 1], and reference solutions (override ``make`` and ``solution``)."""

    name = ""

    def __init__(self, num_prompts: int = 16, seed: int = 0) -> None:
        if num_prompts < 1:
            raise ValueError(f"num_prompts={num_prompts}: must be >= 1")
        self.seed = seed
        self.prompts = [self.make(i, random.Random(f"{self.name}/{seed}/{i}")) for i in range(num_prompts)]

    def make(self, index: int, rng: random.Random) -> ChatPrompt:
        raise NotImplementedError

    def solution(self, prompt: ChatPrompt, rng: random.Random) -> str:
        raise NotImplementedError

    @staticmethod
    def normalise(answer: str) -> str:
        """Lower case, single spaces, no trailing period. Example: ``" Apple,  pear."`` -> ``"apple, pear"``."""
        return re.sub(r"\s+", " ", answer.strip().lower()).rstrip(".")

    def reward(self, prompt: ChatPrompt, completion: str) -> float:
        """1 for the right final answer, 0.1 for a wrong one on an ``Answer:`` line, 0 without one."""
        m = ANSWER_RE.search(completion.strip().splitlines()[-1] if completion.strip() else "")
        if m is None:
            return 0.0
        return 1.0 if self.normalise(m.group(1)) == prompt.answer else 0.1

    def warmup_examples(self, num: int, seed: int = 1) -> list[tuple[str, str]]:
        """``num`` (user message, reference solution) pairs on problems outside the prompt set."""
        rng = random.Random(f"{self.name}/warmup/{seed}")
        ids = {p.text for p in self.prompts}
        out: list[tuple[str, str]] = []
        i = 0
        while len(out) < num:
            p = self.make(10_000 + i, random.Random(f"{self.name}/warmup/{seed}/{i}"))
            i += 1
            if p.text not in ids:
                out.append((p.text, self.solution(p, rng)))
        return out


class ArithFamily(ChatFamily):
    """``arith``: a chain of four or five operations on a starting number, solved one step per line."""

    name = "arith"
    OPS = (("add", "+"), ("subtract", "-"), ("multiply by", "*"))

    def make(self, index: int, rng: random.Random) -> ChatPrompt:
        value = start = rng.randint(2, 40)
        steps = []
        for _ in range(rng.randint(4, 5)):
            word, op = rng.choice(self.OPS)
            n = rng.randint(2, 5) if op == "*" else rng.randint(3, 60)
            if op == "-" and value - n < 0:
                word, op = "add", "+"
            if op == "*" and value * n > 2000:
                word, op, n = "subtract", "-", min(n, value)
            value = value + n if op == "+" else value - n if op == "-" else value * n
            steps.append((word, op, n))
        said = ", then ".join(f"{w} {n}" for w, _, n in steps)
        text = f"Start with {start}, {said}. Solve it step by step, one step per line, and finish with 'Answer: <number>'."
        return ChatPrompt(f"arith-{index:04d}", text, str(value), (start, tuple(steps)))

    def solution(self, prompt: ChatPrompt, rng: random.Random) -> str:
        start, steps = prompt.data
        style = rng.randrange(3)
        lines = [["We start with {v}.", "Start: {v}", "Our number is {v}."][style].format(v=start)]
        value = start
        for k, (word, op, n) in enumerate(steps, 1):
            new = value + n if op == "+" else value - n if op == "-" else value * n
            sym = {"+": "+", "-": "-", "*": "x"}[op]
            lines.append(
                [f"Step {k}: {value} {sym} {n} = {new}.", f"{word.capitalize()} {n}: {value} {sym} {n} = {new}",
                 f"Then {value} {sym} {n} = {new}."][style]
            )  # fmt: skip
            value = new
        lines.append(f"Answer: {value}")
        return "\n".join(lines)


class SortFamily(ChatFamily):
    """``sort``: five to seven words sorted alphabetically, numbered, then the list on the answer line."""

    name = "sort"

    def make(self, index: int, rng: random.Random) -> ChatPrompt:
        words = rng.sample(WORDS, rng.randint(5, 7))
        text = (
            f"Sort these words in alphabetical order: {', '.join(words)}. List them numbered, one per line, "
            "then finish with 'Answer: ' followed by the sorted words separated by commas."
        )
        return ChatPrompt(f"sort-{index:04d}", text, ", ".join(sorted(words)), tuple(words))

    def solution(self, prompt: ChatPrompt, rng: random.Random) -> str:
        ordered = sorted(prompt.data)
        head = rng.choice(["Here are the words in alphabetical order:", "Sorted alphabetically:", "In order:"])
        lines = [head] + [f"{k}. {w}" for k, w in enumerate(ordered, 1)]
        return "\n".join(lines + [f"Answer: {', '.join(ordered)}"])


class UnitsFamily(ChatFamily):
    """``units``: a two-stage unit conversion (hours and minutes to seconds, km and m to cm, ...), explained."""

    name = "units"

    def make(self, index: int, rng: random.Random) -> ChatPrompt:
        big, mid, f1, small, f2 = rng.choice(UNITS)
        a, b = rng.randint(2, 9), rng.randint(1, f1 - 1)
        total = (a * f1 + b) * f2
        text = (
            f"Convert {a} {big} and {b} {mid} to {small}. Explain each conversion, then finish with "
            f"'Answer: <number> {small}'."
        )
        return ChatPrompt(f"units-{index:04d}", text, f"{total} {small}", (a, big, b, mid, f1, small, f2))

    def solution(self, prompt: ChatPrompt, rng: random.Random) -> str:
        a, big, b, mid, f1, small, f2 = prompt.data
        both = a * f1 + b
        total = both * f2
        one_big, one_mid = big[:-1], mid[:-1]
        if rng.random() < 0.5:
            lines = [
                f"First, 1 {one_big} is {f1} {mid}, so {a} {big} is {a} x {f1} = {a * f1} {mid}.",
                f"Adding {b} {mid} gives {a * f1} + {b} = {both} {mid}.",
                f"Next, 1 {one_mid} is {f2} {small}, so {both} {mid} is {both} x {f2} = {total} {small}.",
            ]
        else:
            lines = [
                f"There are {f1} {mid} in 1 {one_big}: {a} x {f1} = {a * f1} {mid}.",
                f"Plus {b} {mid}: {a * f1} + {b} = {both} {mid}.",
                f"There are {f2} {small} in 1 {one_mid}: {both} x {f2} = {total} {small}.",
            ]
        return "\n".join(lines + [f"Answer: {total} {small}"])


class LedgerFamily(ChatFamily):
    """``ledger``: nine to twelve stock movements, each computed, checked by its inverse and carried forward.

    A long step-by-step solution with checks (a reference solution is 350-550 tokens of SmolLM2's tokenizer).
    """

    name = "ledger"
    MOVES = (("received", "+"), ("shipped", "-"), ("returned", "+"), ("sold", "-"))

    def make(self, index: int, rng: random.Random) -> ChatPrompt:
        stock = start = rng.randint(40, 200)
        moves = []
        for _ in range(rng.randint(9, 12)):
            word, op = rng.choice(self.MOVES)
            n = rng.randint(3, 60)
            if op == "-" and n > stock:
                word, op = "received", "+"
            stock = stock + n if op == "+" else stock - n
            moves.append((word, op, n))
        said = ", ".join(f"{w} {n}" for w, _, n in moves)
        text = (
            f"A warehouse starts the day with {start} boxes. In order: {said}. For each movement write the "
            "calculation, check it by reversing it, and give the new stock, one movement per line. Finish with "
            "'Answer: <number>'."
        )
        return ChatPrompt(f"ledger-{index:04d}", text, str(stock), (start, tuple(moves)))

    def solution(self, prompt: ChatPrompt, rng: random.Random) -> str:
        start, moves = prompt.data
        style = rng.randrange(3)
        lines = [
            ["The warehouse opens with {v} boxes.", "Opening stock: {v} boxes.", "We begin with {v} boxes."][
                style
            ].format(v=start)
        ]
        stock = start
        for k, (word, op, n) in enumerate(moves, 1):
            new = stock + n if op == "+" else stock - n
            inverse = f"{new} - {n} = {stock}" if op == "+" else f"{new} + {n} = {stock}"
            lines.append(
                [f"Step {k}: {word} {n}. {stock} {op} {n} = {new}. Check: {inverse}. Stock: {new}.",
                 f"{k}. {word.capitalize()} {n}: {stock} {op} {n} = {new} (check {inverse}), now {new} boxes.",
                 f"Movement {k}, {word} {n}: {stock} {op} {n} = {new}. Reversed, {inverse}, correct. Stock is {new}."
                 ][style]
            )  # fmt: skip
            stock = new
        lines.append(f"The day ends with {stock} boxes.")
        lines.append(f"Answer: {stock}")
        return "\n".join(lines)


class ReportFamily(ChatFamily):
    """``report``: an inventory report, one section per item (quantity, price, subtotal, running total, a note).

    A structured report (a reference solution is 350-550 tokens of SmolLM2's tokenizer).
    """

    name = "report"
    NOTES = (
        ("Reorder soon: fewer than 10 left.", "Low stock, order more this week.", "Running low; reorder."),
        ("Enough in stock for now.", "Stock is fine.", "No reorder needed."),
    )

    def make(self, index: int, rng: random.Random) -> ChatPrompt:
        names = rng.sample(WORDS, rng.randint(6, 8))
        items = tuple((w, rng.randint(2, 40), rng.randint(2, 25)) for w in names)
        total = sum(q * price for _, q, price in items)
        said = "; ".join(f"{q} {plural(w)} at {price} dollars each" for w, q, price in items)
        text = (
            f"Write an inventory report for: {said}. Give each item its own section with the quantity, the unit "
            "price, the subtotal, the running total and a note on whether to reorder (reorder below 10). Finish "
            "with 'Answer: <total> dollars'."
        )
        return ChatPrompt(f"report-{index:04d}", text, f"{total} dollars", items)

    def solution(self, prompt: ChatPrompt, rng: random.Random) -> str:
        style = rng.randrange(3)
        lines = [["# Inventory report", "Inventory report", "# Stock report"][style], ""]
        running = 0
        for k, (word, q, price) in enumerate(prompt.data, 1):
            sub = q * price
            before, running = running, running + sub
            note = rng.choice(self.NOTES[0] if q < 10 else self.NOTES[1])
            lines += [
                [
                    f"## {k}. {plural(word).capitalize()}",
                    f"Item {k}: {plural(word)}",
                    f"### {plural(word).capitalize()}",
                ][style],
                f"- Quantity: {q}",
                f"- Unit price: {price} dollars",
                f"- Subtotal: {q} x {price} = {sub} dollars",
                f"- Running total: {before} + {sub} = {running} dollars",
                f"- Note: {note}",
                "",
            ]
        lines.append(f"Total value: {running} dollars.")
        lines.append(f"Answer: {running} dollars")
        return "\n".join(lines)


FAMILIES = {f.name: f for f in (ArithFamily, SortFamily, UnitsFamily, LedgerFamily, ReportFamily)}
HELD_OUT = frozenset({"units", "report"})
"""The families kept out of every tuning decision (drafter and engine defaults are tuned on the others): ``units``
among the short ones, ``report`` among the long ones."""


def make_family(name: str, num_prompts: int = 16, seed: int = 0) -> ChatFamily:
    """The task family ``name`` (one of ``FAMILIES``) with ``num_prompts`` prompts."""
    if name not in FAMILIES:
        raise ValueError(f"unknown task family {name!r}; use one of {', '.join(FAMILIES)}")
    return FAMILIES[name](num_prompts=num_prompts, seed=seed)
