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
    tokens_histospec: int = 0
    """Tokens the HistoSpec rollouts generated (0: not recorded)."""
    tokens_plain: int = 0
    """Tokens the plain rollouts generated."""
    entropy: float | None = None
    """Mean negative log-probability of the sampled tokens (nats), an estimate of the policy's per-token entropy."""
    identical: float | None = None
    """Side-by-side runs: fraction of responses the plain replay reproduced token for token."""

    @property
    def speedup(self) -> float:
        """Plain rollout seconds / HistoSpec rollout seconds (> 1: HistoSpec faster)."""
        return self.rollout_s_plain / self.rollout_s_histospec if self.rollout_s_histospec > 0 else 0.0

    @property
    def tokens_per_s_histospec(self) -> float:
        return self.tokens_histospec / self.rollout_s_histospec if self.rollout_s_histospec > 0 else 0.0

    @property
    def tokens_per_s_plain(self) -> float:
        return self.tokens_plain / self.rollout_s_plain if self.rollout_s_plain > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "speedup": self.speedup,
            "tokens_per_s_histospec": self.tokens_per_s_histospec,
            "tokens_per_s_plain": self.tokens_per_s_plain,
        }


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
            tokens_histospec=h.tokens,
            tokens_plain=p.tokens,
            entropy=h.entropy,
        )
        for h, p in zip(histospec, plain)
    ]


def side_by_side_epochs(stats: list[EpochStats]) -> list[EpochComparison]:
    """The epochs of one side-by-side run (``GRPORunConfig.side_by_side``): each HistoSpec rollout next to its plain
    replay on the same weights; ValueError for a run without replays."""
    if any(s.plain_seconds is None for s in stats):
        raise ValueError("these epochs have no plain replay; run with GRPORunConfig(side_by_side=True)")
    return [
        EpochComparison(
            epoch=s.epoch,
            reward_histospec=s.mean_reward,
            reward_plain=s.plain_reward or 0.0,
            tau=s.tau,
            accept_rate=s.accept_rate,
            rollout_s_histospec=s.seconds,
            rollout_s_plain=s.plain_seconds or 0.0,
            tokens_histospec=s.tokens,
            tokens_plain=s.plain_tokens or 0,
            entropy=s.entropy,
            identical=(s.identical or 0) / s.responses if s.responses else None,
        )
        for s in stats
    ]


def format_table(rows: list[EpochComparison]) -> str:
    """A fixed-width text table, one line per epoch."""
    head = (
        f"{'epoch':>5}  {'reward HS':>9}  {'reward off':>10}  {'tau':>5}  {'accept':>6}  "
        f"{'rollout s HS':>12}  {'rollout s off':>13}  {'speedup':>7}"
    )
    wide = any(r.entropy is not None or r.identical is not None for r in rows)
    if wide:
        head += f"  {'tok/s HS':>8}  {'tok/s off':>9}  {'entropy':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r.epoch:>5}  {r.reward_histospec:>9.3f}  {r.reward_plain:>10.3f}  {r.tau:>5.2f}  {r.accept_rate:>6.2f}  "
            f"{r.rollout_s_histospec:>12.2f}  {r.rollout_s_plain:>13.2f}  {r.speedup:>7.2f}"
        )
        if wide:
            ent = "-" if r.entropy is None else f"{r.entropy:.3f}"
            line += f"  {r.tokens_per_s_histospec:>8.1f}  {r.tokens_per_s_plain:>9.1f}  {ent:>7}"
        lines.append(line)
    return "\n".join(lines)


def rollout_speedup(rows: list[EpochComparison], skip_first: bool = True) -> float:
    """Total plain rollout seconds / total HistoSpec rollout seconds, over the epochs after the first (which has
    no history) when there are several and ``skip_first``."""
    use = rows[1:] if skip_first and len(rows) > 1 else rows
    hs = sum(r.rollout_s_histospec for r in use)
    return sum(r.rollout_s_plain for r in use) / hs if hs > 0 else 0.0


def write_plots(rows: list[EpochComparison], out_dir: str | os.PathLike) -> list[str]:
    """``rewards.png`` (mean reward per epoch, both modes; the entropy estimate on a second axis when recorded) and
    ``rollout.png`` (rollout tokens/s per epoch, both modes, or seconds when no tokens were recorded; tau,
    acceptance and speedup on a second axis). Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in (("rewards.png", _reward_plot), ("rollout.png", _rollout_plot)):
        fig, ax = plt.subplots(figsize=(5.5, 4.0))
        draw(ax, rows)
        handles = [h for a in fig.axes for h in a.get_legend_handles_labels()[0]]
        fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        paths.append(str(out / name))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def _reward_plot(ax, rows: list[EpochComparison]) -> None:  # noqa: ANN001 - a matplotlib Axes
    epochs = [r.epoch for r in rows]
    ax.plot(epochs, [r.reward_histospec for r in rows], "o-", label="with HistoSpec")
    ax.plot(epochs, [r.reward_plain for r in rows], "s--", label="without")
    ax.set_xlabel("epoch")
    ax.set_xticks(epochs)
    ax.set_ylabel("mean reward")
    ax.set_title("Mean reward per epoch")
    if all(r.entropy is not None for r in rows):
        ax2 = ax.twinx()
        ax2.plot(epochs, [r.entropy for r in rows], "k:", marker="x", label="entropy estimate (HistoSpec)")
        ax2.set_ylabel("mean -logprob per token (nats)")


def _rollout_plot(ax, rows: list[EpochComparison]) -> None:  # noqa: ANN001 - a matplotlib Axes
    epochs = [r.epoch for r in rows]
    width = 0.38
    speed = all(r.tokens_histospec for r in rows)
    hs = [r.tokens_per_s_histospec if speed else r.rollout_s_histospec for r in rows]
    off = [r.tokens_per_s_plain if speed else r.rollout_s_plain for r in rows]
    ax.bar([e - width / 2 for e in epochs], hs, width, label="with HistoSpec")
    ax.bar([e + width / 2 for e in epochs], off, width, label="without")
    ax.set_xlabel("epoch")
    ax.set_xticks(epochs)
    ax.set_ylabel("rollout tokens / s" if speed else "rollout seconds")
    ax2 = ax.twinx()
    ax2.plot(epochs, [r.tau for r in rows], "k^-", label="tau")
    ax2.plot(epochs, [r.accept_rate for r in rows], "c.-", label="acceptance")
    ax2.plot(epochs, [r.speedup for r in rows], "g*-", label="speedup")
    ax2.set_ylabel("tau, acceptance, speedup")
    ax.set_title("Rollout speed per epoch")


def summary(rows: list[EpochComparison], trace: str, **extra: object) -> dict:
    """The ``histospec demo --json`` object, also its ``summary.json`` (README "Quick start"): the headline figures
    below plus per-epoch rows and ``extra`` keys."""
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
