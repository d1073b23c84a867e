"""Record a real RL trace: GRPO on a chat model through the embedded engine, one trace line per response.

:func:`record_trace` samples, scores, pushes to the live history drafter, writes the trace and takes one GRPO step
per epoch, resuming from its work directory; the traces in ``docs/data/`` were recorded with it (format:
docs/replay.md section 1).

Example::

    cfg = RecordConfig(family="arith", epochs=8, num_prompts=16, group_size=8)
    stats = record_trace(resolve_model("smollm2-135m-instruct"), cfg, "docs/data/arith.jsonl.gz", "work/arith")
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_histospec.tasks.chat import ChatFamily, make_family
from sglang_histospec.trace.seeding import epoch_requests

PROMPT_ROOM = 512
"""Context tokens the recording engine keeps for a prompt beside ``max_new_tokens`` (at least 1024 in all)."""


@dataclass(frozen=True)
class RecordConfig:
    """Shape of a trace recording (GRPO on one task family)."""

    family: str = "arith"
    """Task family (``tasks.chat.FAMILIES``)."""
    epochs: int = 8
    """Epochs; one GRPO step each, every prompt visited once per epoch."""
    num_prompts: int = 16
    """Prompts in the fixed set."""
    group_size: int = 8
    """Responses per prompt and epoch (GRPO's G)."""
    max_new_tokens: int = 192
    """Cap on response tokens."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    learning_rate: float = 2e-5
    """AdamW learning rate of the GRPO steps."""
    train_layers: int = 8
    """Decoder layers trained (the top ones, plus the final norm); the rest stay frozen."""
    warmup_examples: int = 128
    """Reference solutions of the supervised warm-up (0 = none: the untouched instruct model)."""
    warmup_epochs: int = 3
    """Passes over the warm-up examples."""
    warmup_lr: float = 2e-4
    """AdamW learning rate of the warm-up."""
    micro_batch: int = 8
    """Sequences per forward/backward of a training step."""
    speculative_algorithm: str = "HISTOSPEC"
    """The engine's algorithm during rollouts ("NONE" samples the same tokens, without drafting)."""
    max_running_requests: int = 128
    """Requests the engine decodes together."""
    seed: int = 0
    """Seed of the prompt set, the request seeds and torch."""

    def __post_init__(self) -> None:
        for name in ("epochs", "num_prompts", "max_new_tokens", "train_layers", "micro_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size}: GRPO needs >= 2 samples per prompt")
        if self.warmup_examples < 0 or self.warmup_epochs < 0:
            raise ValueError("warmup_examples and warmup_epochs must be >= 0")


@dataclass
class RecordEpoch:
    """What one recorded epoch did."""

    epoch: int
    mean_reward: float
    mean_entropy: float
    """Mean negative log-probability of the sampled tokens (an estimate of the per-token entropy, nats)."""
    mean_response_tokens: float
    tau: float
    """Tokens per verify step of the live engine (1.0 with ``NONE``)."""
    rollout_seconds: float
    train_seconds: float


def chat_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a one-turn chat prompt with the generation prompt appended (plain ids without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer(text).input_ids)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in newer transformers


def trainable_params(model, train_layers: int) -> list:
    """Unfreeze the top ``train_layers`` decoder layers and the final norm; freeze everything else."""
    layers = model.model.layers
    if train_layers > len(layers):
        raise ValueError(f"train_layers={train_layers}: the model has {len(layers)} layers")
    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for layer in layers[len(layers) - train_layers :] for p in layer.parameters()]
    params += list(model.model.norm.parameters())
    for p in params:
        p.requires_grad_(True)
    return params


def token_logprobs(model, seqs: list[list[int]], starts: list[int]):
    """Log-probabilities of ``seq[start:]`` under ``model`` for each sequence, as one flat tensor [sum(len - start)]."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)  # [B, L] right-padded
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, : len(s)] = 1
    hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # [B, L, H]
    rows = torch.cat([torch.full((len(s) - st,), b) for b, (s, st) in enumerate(zip(seqs, starts))])
    cols = torch.cat([torch.arange(st - 1, len(s) - 1) for s, st in zip(seqs, starts)])
    targets = torch.cat([torch.tensor(s[st:]) for s, st in zip(seqs, starts)])
    logits = model.lm_head(hidden[rows, cols]).float()  # [T, V] only where a target token is predicted
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


def train_step(model, optimizer, params, batch: list[tuple[list[int], int, float]], micro_batch: int) -> float:
    """One optimizer step on (sequence, response start, weight) rows: minimise -sum(weight * logp) / tokens."""
    import torch

    total = sum(len(s) - st for s, st, _ in batch)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for i in range(0, len(batch), micro_batch):
        chunk = batch[i : i + micro_batch]
        lp = token_logprobs(model, [c[0] for c in chunk], [c[1] for c in chunk])
        weights = torch.cat([torch.full((len(s) - st,), w) for s, st, w in chunk])
        loss = -(weights * lp).sum() / total
        loss.backward()
        loss_sum += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    return loss_sum


def grpo_rows(groups: dict[str, list[tuple[list[int], list[int], float]]]) -> list[tuple[list[int], int, float]]:
    """Training rows of a step: each response weighted by its group-normalised advantage (flat groups drop out).

    Example: rewards [1, 0] in one group give advantages [+1, -1] (mean 0.5, std 0.5)."""
    rows = []
    for samples in groups.values():
        rewards = [r for _, _, r in samples]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        if std < 1e-6:
            continue
        rows += [(p + resp, len(p), (r - mean) / std) for p, resp, r in samples if resp]
    return rows


def warmup(model, tokenizer, family: ChatFamily, cfg: RecordConfig, progress: bool) -> None:
    """Supervised warm-up on reference solutions (problems outside the prompt set)."""
    import torch
    from tqdm.auto import tqdm

    eos = tokenizer.eos_token_id
    examples = family.warmup_examples(cfg.warmup_examples, seed=cfg.seed + 1)
    rows = [(chat_ids(tokenizer, q), tokenizer(a).input_ids + [eos]) for q, a in examples]
    params = trainable_params(model, cfg.train_layers)
    opt = torch.optim.AdamW(params, lr=cfg.warmup_lr)
    rng = random.Random(cfg.seed)
    steps = cfg.warmup_epochs * math.ceil(len(rows) / 16)
    bar = tqdm(total=steps, desc="warm-up", disable=not progress, unit="step")
    for _ in range(cfg.warmup_epochs):
        rng.shuffle(rows)
        for i in range(0, len(rows), 16):
            batch = [(p + a, len(p), 1.0) for p, a in rows[i : i + 16]]
            bar.set_postfix(loss=f"{train_step(model, opt, params, batch, cfg.micro_batch):.3f}")
            bar.update(1)
    bar.close()


def rollout_epoch(engine, family: ChatFamily, prompt_ids: dict[str, list[int]], cfg: RecordConfig, epoch: int,
                  progress: bool) -> tuple[list[dict], dict]:  # fmt: skip
    """Sample one epoch; returns the trace records (as dicts) and the engine-stat deltas plus the summed NLL."""
    from tqdm.auto import tqdm

    pairs = [(p.prompt_id, prompt_ids[p.prompt_id]) for p in family.prompts]
    requests = epoch_requests(pairs, cfg.group_size, cfg.temperature, cfg.max_new_tokens, cfg.seed, epoch, True)
    before = engine.stats()
    for r in requests:
        engine.add_request(r)
    results = {}
    bar = tqdm(total=len(requests), desc=f"rollouts epoch {epoch}", disable=not progress, unit="resp", leave=False)
    while engine.has_unfinished():
        for res in engine.step():
            results[res.rid] = res
            bar.update(1)
    bar.close()
    after = engine.stats()
    records, nll = [], 0.0
    for p in family.prompts:
        group = [results[f"e{epoch}-{p.prompt_id}-{k}"] for k in range(cfg.group_size)]
        texts = engine.tokenizer.batch_decode([g.output_ids for g in group], skip_special_tokens=True)
        rewards = [family.reward(p, t) for t in texts]
        engine.drafter.add(p.prompt_id, epoch, [g.output_ids for g in group], rewards=rewards)
        for k, (g, r) in enumerate(zip(group, rewards)):
            nll -= sum(g.output_logprobs or [])
            records.append(dict(step=epoch, epoch=epoch, prompt_id=p.prompt_id, sample=k,
                                prompt=prompt_ids[p.prompt_id], response=list(g.output_ids), reward=r,
                                logprobs=[round(float(x), 4) for x in g.output_logprobs or []]))  # fmt: skip
    engine.drafter.end_step(epoch)
    delta = {k: after[k] - before[k] for k in ("generated_tokens", "verify_steps")}
    return records, {**delta, "nll": nll}


WARMUP_CHECKPOINT = "warmup.pt"
"""The trained layers after the warm-up, in the work directory: a resumed run that finished no epoch skips it."""


def _check_room(prompt_ids: dict[str, list[int]], cfg: RecordConfig, max_context_len: int) -> None:
    """Refuse, before any training, a prompt set whose longest prompt + ``max_new_tokens`` overflows the context."""
    longest = max(len(ids) for ids in prompt_ids.values())
    if longest + cfg.max_new_tokens > max_context_len:
        raise ValueError(
            f"the longest prompt ({longest} tokens) + max_new_tokens={cfg.max_new_tokens} exceeds the engine's "
            f"max_context_len {max_context_len}; lower max_new_tokens"
        )


def _save_params(path: Path, model, params, **extra) -> None:
    """Write the trained ``params`` by name (plus ``extra`` entries, e.g. the optimizer's state) to ``path``."""
    import torch

    names = {id(p): n for n, p in model.named_parameters()}
    state = {names[id(p)]: p.detach().clone() for p in params}
    torch.save({"params": state, **extra}, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)


def _load_params(path: Path, model) -> bool:
    """Copy the parameters saved at ``path`` into ``model``; False when there is no such file."""
    import torch

    if not path.is_file():
        return False
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in torch.load(path, weights_only=True)["params"].items():
            named[name].copy_(tensor)
    return True


def _checkpoint(work: Path, epoch: int) -> Path:
    return work / f"epoch-{epoch:03d}.pt"


def _save_epoch(work: Path, epoch: int, records: list[dict], stats: RecordEpoch, model, optimizer, params) -> None:
    _save_params(_checkpoint(work, epoch), model, params, optimizer=optimizer.state_dict())
    tmp = work / f"epoch-{epoch:03d}.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
    (work / f"epoch-{epoch:03d}.json").write_text(json.dumps(asdict(stats)))
    os.replace(tmp, work / f"epoch-{epoch:03d}.jsonl")  # last: an epoch counts as done once this exists


def _resume(work: Path, engine, optimizer, params, model) -> list[RecordEpoch]:
    """Reload the finished epochs of an interrupted run (history, trained layers, optimizer)."""
    import torch

    done: list[RecordEpoch] = []
    while (work / f"epoch-{len(done):03d}.jsonl").is_file() and _checkpoint(work, len(done)).is_file():
        e = len(done)
        groups: dict[str, list] = {}
        for line in (work / f"epoch-{e:03d}.jsonl").read_text().splitlines():
            r = json.loads(line)
            groups.setdefault(r["prompt_id"], []).append(r)
        for pid, recs in groups.items():
            engine.drafter.add(pid, e, [r["response"] for r in recs], rewards=[r["reward"] for r in recs])
        engine.drafter.end_step(e)
        done.append(RecordEpoch(**json.loads((work / f"epoch-{e:03d}.json").read_text())))
    if done:
        _load_params(_checkpoint(work, len(done) - 1), model)
        optimizer.load_state_dict(torch.load(_checkpoint(work, len(done) - 1), weights_only=True)["optimizer"])
    return done


def _engine(model_dir: str, cfg: RecordConfig):
    from sglang_histospec.engine import EngineConfig
    from sglang_histospec.engine.engine import Engine

    return Engine(
        EngineConfig(
            model_path=str(model_dir),
            device="cpu",
            speculative_algorithm=cfg.speculative_algorithm,
            max_running_requests=cfg.max_running_requests,
            max_context_len=max(1024, cfg.max_new_tokens + PROMPT_ROOM),
            seed=cfg.seed,
        )
    )


def record_trace(model_dir: str | os.PathLike, cfg: RecordConfig, out: str | os.PathLike,
                 work_dir: str | os.PathLike, progress: bool = True) -> list[RecordEpoch]:  # fmt: skip
    """Run the recording (resuming from ``work_dir``), write the trace to ``out``, return per-epoch stats.

    Each epoch samples ``group_size`` responses per prompt at temperature 1 (with per-request seeds), scores them,
    pushes them into the engine's history drafter (so drafting is live, and lossless), writes them to the trace, and
    takes one GRPO step: group-normalised advantages, a token-level policy-gradient loss (on-policy, so PPO's ratio
    is 1 and its clip inactive), AdamW on the top ``train_layers`` decoder layers. An optional supervised warm-up on
    reference solutions of problems outside the prompt set first brings the policy to the answer format and to a
    realistic (lower) entropy, as many GRPO recipes do.

    Resumable: every finished epoch leaves ``work_dir/epoch-NNN.jsonl`` and a checkpoint of the trained layers; a
    rerun with the same arguments skips them. The final trace (``out``) is the epochs concatenated.
    """
    import torch

    torch.manual_seed(cfg.seed)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    _check_same_config(work, cfg)
    family = make_family(cfg.family, cfg.num_prompts, cfg.seed)
    engine = _engine(str(model_dir), cfg)
    model, tok = engine.model, engine.tokenizer
    prompt_ids = {p.prompt_id: chat_ids(tok, p.text) for p in family.prompts}
    _check_room(prompt_ids, cfg, engine.max_context_len)
    params = trainable_params(model, cfg.train_layers)
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate)
    done = _resume(work, engine, opt, params, model)
    warm = not done and cfg.warmup_examples and cfg.warmup_epochs
    if warm and not _load_params(work / WARMUP_CHECKPOINT, model):
        warmup(model, tok, family, cfg, progress)  # trains the same parameters, with its own optimizer
        _save_params(work / WARMUP_CHECKPOINT, model, params)
    engine.weights_changed()  # the engine samples from packed copies of the weights: rebuild them
    for epoch in range(len(done), cfg.epochs):
        t0 = time.perf_counter()
        records, delta = rollout_epoch(engine, family, prompt_ids, cfg, epoch, progress)
        t1 = time.perf_counter()
        groups: dict[str, list] = {}
        for r in records:
            groups.setdefault(r["prompt_id"], []).append((r["prompt"], r["response"], r["reward"]))
        rows = grpo_rows(groups)
        if rows:
            train_step(model, opt, params, rows, cfg.micro_batch)
            engine.weights_changed()
        engine.flush_cache()
        tokens = max(1, delta["generated_tokens"])
        stats = RecordEpoch(
            epoch=epoch,
            mean_reward=sum(r["reward"] for r in records) / len(records),
            mean_entropy=delta["nll"] / tokens,
            mean_response_tokens=tokens / len(records),
            tau=tokens / max(1, delta["verify_steps"]),
            rollout_seconds=t1 - t0,
            train_seconds=time.perf_counter() - t1,
        )
        _save_epoch(work, epoch, records, stats, model, opt, params)
        done.append(stats)
        if progress:
            print(json.dumps(asdict(stats)), flush=True)
    _concat(work, cfg.epochs, Path(out))
    model.save_pretrained(work / "policy")  # the trained policy, e.g. for `histospec bench engine --model`
    tok.save_pretrained(work / "policy")
    return done


def export_policy(model_dir: str | os.PathLike, work_dir: str | os.PathLike, out: str | os.PathLike) -> str:
    """Write the policy of a recording's last finished epoch (base model + trained layers) as an HF directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = Path(work_dir)
    epochs = sorted(work.glob("epoch-*.pt"))
    if not epochs:
        raise ValueError(f"{work} holds no finished epoch")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    _load_params(epochs[-1], model)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return str(out)


def _check_same_config(work: Path, cfg: RecordConfig) -> None:
    path = work / "config.json"
    mine = asdict(cfg)
    if path.is_file():
        theirs = json.loads(path.read_text())
        if {k: v for k, v in theirs.items() if k != "epochs"} != {k: v for k, v in mine.items() if k != "epochs"}:
            raise ValueError(f"{work} holds a recording with other settings ({path}); use another --work-dir")
    path.write_text(json.dumps(mine, indent=2))


def _concat(work: Path, epochs: int, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    opener = gzip.open if out.suffix == ".gz" else open
    with opener(tmp, "wb") as f:
        for e in range(epochs):
            with open(work / f"epoch-{e:03d}.jsonl", "rb") as src:
                shutil.copyfileobj(src, f)
    os.replace(tmp, out)
