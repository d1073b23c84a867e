"""Side-by-side report of a demo run with and without HistoSpec: per-epoch table, PNG plots, JSON summary.

Example::

    rows = compare_epochs(with_histospec, without)        # lists of EpochStats, same epochs
    print(format_table(rows))
    write_plots(rows, out_dir)                            # rewards.png, rollout.png
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_histospec.demo.rollouts import EpochStats


@dataclass
class EpochComparison:
    """One epoch of the HistoSpec run next to the same epoch of the plain run."""

    epoch: int
    reward_histospec: float
    reward_plain: float
    tau: float
    """Tokens per request-step of the HistoSpec run."""
    accept_rate: float
    """Accepted / drafted tokens of the HistoSpec run."""
    rollout_s_histospec: float
    rollout_s_plain: float

    @property
    def speedup(self) -> float:
        """Plain rollout seconds / HistoSpec rollout seconds (> 1: HistoSpec faster)."""
        return self.rollout_s_plain / self.rollout_s_histospec if self.rollout_s_histospec > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "speedup": self.speedup}


def compare_epochs(histospec: list[EpochStats], plain: list[EpochStats]) -> list[EpochComparison]:
    """Pair the epochs of the two runs; ValueError when they do not cover the same epochs."""
    if [s.epoch for s in histospec] != [s.epoch for s in plain]:
        raise ValueError(
            f"epochs differ: {[s.epoch for s in histospec]} vs {[s.epoch for s in plain]}; run both modes alike"
        )
    return [
        EpochComparison(
            epoch=h.epoch,
            reward_histospec=h.mean_reward,
            reward_plain=p.mean_reward,
            tau=h.tau,
            accept_rate=h.accept_rate,
            rollout_s_histospec=h.seconds,
            rollout_s_plain=p.seconds,
        )
        for h, p in zip(histospec, plain)
    ]


def format_table(rows: list[EpochComparison]) -> str:
    """A fixed-width text table, one line per epoch."""
    head = (
        f"{'epoch':>5}  {'reward HS':>9}  {'reward off':>10}  {'tau':>5}  {'accept':>6}  "
        f"{'rollout s HS':>12}  {'rollout s off':>13}  {'speedup':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.epoch:>5}  {r.reward_histospec:>9.3f}  {r.reward_plain:>10.3f}  {r.tau:>5.2f}  {r.accept_rate:>6.2f}  "
            f"{r.rollout_s_histospec:>12.2f}  {r.rollout_s_plain:>13.2f}  {r.speedup:>7.2f}"
        )
    return "\n".join(lines)


def rollout_speedup(rows: list[EpochComparison], skip_first: bool = True) -> float:
    """Total plain rollout seconds / total HistoSpec rollout seconds, over the epochs after the first (which has
    no history) when there are several and ``skip_first``."""
    use = rows[1:] if skip_first and len(rows) > 1 else rows
    hs = sum(r.rollout_s_histospec for r in use)
    return sum(r.rollout_s_plain for r in use) / hs if hs > 0 else 0.0


def write_plots(rows: list[EpochComparison], out_dir: str | os.PathLike) -> list[str]:
    """``rewards.png`` (mean reward per epoch, both runs) and ``rollout.png`` (rollout seconds per epoch, both
    runs, with tau on a second axis). Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    epochs = [r.epoch for r in rows]
    paths = []

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(epochs, [r.reward_histospec for r in rows], "o-", label="with HistoSpec")
    ax.plot(epochs, [r.reward_plain for r in rows], "s--", label="without")
    ax.set_xlabel("epoch")
    ax.set_xticks(epochs)
    ax.set_ylabel("mean reward")
    ax.set_title("Mean reward per epoch (same distribution)")
    ax.legend()
    fig.tight_layout()
    paths.append(str(out / "rewards.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.2))
    width = 0.38
    ax.bar([e - width / 2 for e in epochs], [r.rollout_s_histospec for r in rows], width, label="with HistoSpec")
    ax.bar([e + width / 2 for e in epochs], [r.rollout_s_plain for r in rows], width, label="without")
    ax.set_xlabel("epoch")
    ax.set_xticks(epochs)
    ax.set_ylabel("rollout seconds")
    ax2 = ax.twinx()
    ax2.plot(epochs, [r.tau for r in rows], "k^-", label="tau (HistoSpec)")
    ax2.set_ylabel("tau (tokens / verify step)")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Rollout time per epoch")
    fig.tight_layout()
    paths.append(str(out / "rollout.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def summary(rows: list[EpochComparison], trace: str, **extra: object) -> dict:
    """The ``histospec demo --json`` object (design.md section 5) plus per-epoch rows and ``extra`` keys."""
    if not rows:
        raise ValueError("no epochs to summarise; run at least one epoch")
    return {
        "epochs": len(rows),
        "reward_first": rows[0].reward_histospec,
        "reward_last": rows[-1].reward_histospec,
        "tau_last": rows[-1].tau,
        "rollout_speedup": rollout_speedup(rows),
        "trace": trace,
        "reward_plain_first": rows[0].reward_plain,
        "reward_plain_last": rows[-1].reward_plain,
        "accept_rate_last": rows[-1].accept_rate,
        "epoch_speedup_median": statistics.median(r.speedup for r in rows),
        "per_epoch": [r.as_dict() for r in rows],
        **extra,
    }
