"""``histospec bench engine``: tokens/s of the embedded engine with HistoSpec, without it, and HF ``generate``.

Rollout epochs of a fixed prompt set (epoch 0 fills the history, the later ones are measured); the JSON holds
medians over the measured epochs and the speedups. Workload and every figure: docs/results.md, "What the bench
commands measure"; measured runs: its "Engine" section.

Example::

    histospec bench engine --json             # the converged demo model (trained and cached on first use)
    histospec bench engine --demo-model grpo --json   # the GRPO demo's high-entropy starting policy
    histospec bench engine --model DIR --epochs 4 --batch 16 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from sglang_histospec.commands._flags import add_admission_flag, add_draft_selection_flag
from sglang_histospec.drafting.types import tau
from sglang_histospec.engine.heap import frozen_heap

COMMAND = ("bench", "engine")
HELP = "Tokens/s of the embedded engine with HistoSpec, without, and of transformers generate (repeated prompts)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="model directory or name (smollm2-135m-instruct); default: the demo model"
    )
    parser.add_argument(
        "--demo-model",
        default="converged",
        choices=["converged", "grpo", "quick"],
        help="demo model when no --model is given: converged (pretrained until the reward plateaus; default), grpo "
        "(the GRPO demo's starting policy: reward 0.35, high entropy) or quick (less trained still)",
    )
    parser.add_argument("--quick-model", action="store_true", help="same as --demo-model quick")
    parser.add_argument("--epochs", type=int, default=6, help="epochs; the first only fills the history")
    parser.add_argument("--num-prompts", type=int, default=64, help="prompts in the repeated set (demo task: all 64)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt and epoch (a GRPO group)")
    parser.add_argument(
        "--batch",
        default="16",
        help="requests decoded together (all three systems); a comma list (1,4,16,64) runs a sweep, one result each",
    )
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-draft-tokens", type=int, default=16, help="draft node cap per request and step")
    parser.add_argument(
        "--budget-policy",
        default=None,
        choices=["paper", "released", "fixed"],
        help="per-request budget policy (default: the engine's: fixed --num-draft-tokens with --draft-selection "
        "adaptive, paper with always)",
    )
    add_draft_selection_flag(parser)
    add_admission_flag(parser)
    parser.add_argument("--budget-fixed", type=int, default=8, help="budget of the fixed policy")
    parser.add_argument(
        "--cost-limit",
        type=float,
        default=None,
        help="per-request verify-cost cap in plain decode steps (default: the drafting default); 0 = no cap",
    )
    parser.add_argument(
        "--task",
        default="demo",
        help="prompts: demo (the tiny model's arithmetic) or a chat family: arith, sort, units",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers generate baseline")
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="run each engine's whole epoch in turn (default: the two engines take decode steps in turn)",
    )
    parser.add_argument(
        "--aa",
        action="store_true",
        help="also step a second plain engine in turn and report its tokens/s over the first's per epoch (an A/A "
        "ratio: the noise floor of this machine's side-by-side timing, beside the speedups)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")


def _prompts(args, tokenizer, vocab_size: int) -> tuple[list[str], list[list[int]], str]:
    """(prompt ids, token ids, description). Demo task prompts when the model has a tokenizer, else random ids;
    with ``--task FAMILY`` the chat task family's prompts through the tokenizer's chat template."""
    if args.task != "demo":
        from sglang_histospec.tasks.chat import make_family
        from sglang_histospec.trace.record import chat_ids

        if tokenizer is None:
            raise SystemExit(f"--task {args.task} needs a model directory with a tokenizer")
        fam = make_family(args.task, num_prompts=args.num_prompts, seed=args.seed)
        return [p.prompt_id for p in fam.prompts], [chat_ids(tokenizer, p.text) for p in fam.prompts], args.task
    if tokenizer is not None:
        try:
            from sglang_histospec.tasks.arith import ArithTask

            task = ArithTask()
            chosen = task.prompts[: args.num_prompts]
            return [p.prompt_id for p in chosen], [tokenizer(p.text).input_ids for p in chosen], "demo arithmetic task"
        except Exception:  # a foreign tokenizer that cannot encode the task still gets random prompts
            pass
    import numpy as np

    rng = np.random.default_rng(args.seed)
    ids = [rng.integers(3, vocab_size, size=8).tolist() for _ in range(args.num_prompts)]
    return [f"rand-{i}" for i in range(args.num_prompts)], ids, "random token prompts"


def _engines_epoch(engines: list, prompt_ids, token_ids, args, epoch: int) -> list[tuple[float, int, dict]]:
    """One epoch's requests on every engine: ``(seconds, tokens, info)`` each. Interleaved (the default), the
    engines take steps in turn, so that a change in the machine's load hits all of them alike, and which goes first
    alternates from round to round and from epoch to epoch (the first of a round runs on colder caches and memory:
    the epoch's first round, its large prefill, costs the first engine a few percent more); with ``--sequential``
    each runs the whole epoch before the next. Seconds are the sums of each engine's step times."""
    wall, cpu = [0.0] * len(engines), [0.0] * len(engines)
    results: list[list] = [[] for _ in engines]
    from sglang_histospec.trace.seeding import epoch_requests

    before = [e.stats() for e in engines]
    for e in engines:
        prompts = list(zip(prompt_ids, token_ids))
        for r in epoch_requests(prompts, args.group_size, args.temperature, args.max_new_tokens, args.seed, epoch,
                                seeding="index"):  # fmt: skip
            e.add_request(r)
    order = [list(range(len(engines)))] if not args.sequential else [[i] for i in range(len(engines))]
    for group in order:
        rounds = epoch
        while any(engines[i].has_unfinished() for i in group):
            rounds += 1
            for i in group if rounds % 2 else group[::-1]:
                if engines[i].has_unfinished():
                    t, c = time.perf_counter(), time.process_time()
                    results[i].extend(engines[i].step())
                    wall[i] += time.perf_counter() - t
                    cpu[i] += time.process_time() - c
    out = []
    for e, res, b, w, c in zip(engines, results, before, wall, cpu):
        after = e.stats()
        e.drafter.end_step(epoch)
        tokens = sum(r.completion_tokens for r in res)
        steps = sum(r.spec_verify_ct for r in res)
        forwards = after["forward_passes"] - b["forward_passes"]
        info = {
            "cpu_s": c,
            "tau": tau(tokens, steps),
            "accepted": after["accepted_tokens"] - b["accepted_tokens"],
            "drafted": after["draft_tokens"] - b["draft_tokens"],
            "forwards": forwards,
            "ms_per_forward": 1e3 * w / forwards if forwards else 0.0,
            "results": res,
        }
        out.append((w, tokens, info))
    return out


def _mean_entropy(model, token_ids, results, group_size: int, temperature: float) -> float | None:
    """Mean entropy (nats) of the model's temperature-scaled next-token distribution at every generated position
    of ``results`` (one HF forward per sequence batch): how predictable the sampled responses are.

    For scale: RL policies of real LLMs sample most tokens at entropy near 0 (about 80% of chain-of-thought tokens
    below 0.67 nats in Wang et al. 2025, arXiv 2506.01939)."""
    import torch

    if temperature <= 0:
        return 0.0
    prompts = [prompt for prompt in token_ids for _ in range(group_size)]  # the requests' order
    seqs = [(prompt, r.output_ids) for prompt, r in zip(prompts, results)]
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for lo in range(0, len(seqs), 64):
        chunk = [(p, o) for p, o in seqs[lo : lo + 64] if o]
        if not chunk:
            continue
        width = max(len(p) + len(o) for p, o in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        keep = torch.zeros((len(chunk), width), dtype=torch.bool)  # positions that predicted a generated token
        for j, (p, o) in enumerate(chunk):
            ids[j, : len(p) + len(o)] = torch.tensor(p + o)
            keep[j, len(p) - 1 : len(p) + len(o) - 1] = True
        with torch.inference_mode():
            logits = model(ids.to(device)).logits.float() / temperature
        logp = torch.log_softmax(logits[keep.to(device)], dim=-1)
        total += float(-(logp.exp() * logp).sum())
        count += int(keep.sum())
    return total / count if count else None


def _hf_epoch(model, token_ids, args, eos_ids, pad_id: int, epoch: int) -> tuple[float, int, float]:
    import torch

    reqs = [toks for toks in token_ids for _ in range(args.group_size)]
    device = next(model.parameters()).device
    tokens = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for lo in range(0, len(reqs), args.batch):
        chunk = reqs[lo : lo + args.batch]
        width = max(len(t) for t in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, t in enumerate(chunk):  # left padding
            ids[j, width - len(t) :] = torch.tensor(t)
            mask[j, width - len(t) :] = 1
        torch.manual_seed(args.seed + epoch * 7919 + lo)
        with torch.inference_mode():
            out = model.generate(
                ids.to(device),
                attention_mask=mask.to(device),
                do_sample=args.temperature > 0,
                temperature=args.temperature if args.temperature > 0 else None,
                top_p=1.0,
                top_k=0,
                max_new_tokens=args.max_new_tokens,
                eos_token_id=sorted(eos_ids) or None,
                pad_token_id=pad_id,
            )
        for row in out[:, width:].tolist():
            n = 0
            for tok in row:
                n += 1
                if tok in eos_ids:
                    break
            tokens += n
    return time.perf_counter() - start, tokens, time.process_time() - cpu_start


def _warm_up(engine, hf_model, token_ids, pad_id: int, args) -> None:
    """Unmeasured generations first, so that no measured epoch pays for the process's first forward passes at the
    workload's shapes (allocations, the KV cache's growth, oneDNN's kernels for each row count, which the engines of
    one process share: without this the engine that meets a shape first pays for both): a full batch of the
    workload's prompts to ``--max-new-tokens`` (a different seed, no prompt id, so no history is recorded), after
    sizing the KV cache for the longest request (``Engine.reserve``; its growth copies the whole cache, seconds at
    batch 64, and would land in whichever epoch first reaches a new length, on one engine and not the other)."""
    import torch

    from sglang_histospec.engine import GenerateRequest, SamplingParams

    engine.reserve(max(len(t) for t in token_ids) + args.max_new_tokens)  # no cache growth in a measured epoch
    n = min(args.batch, len(token_ids) * args.group_size)
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed + 1)
    engine.generate([GenerateRequest(rid=f"warm-{i}", input_ids=token_ids[i % len(token_ids)], sampling=sampling)
                     for i in range(n)])  # fmt: skip
    if hf_model is not None:
        with torch.inference_mode():
            hf_model.generate(torch.tensor([token_ids[0]]), max_new_tokens=4, do_sample=False, pad_token_id=pad_id)


def _make_engine(args, alg: str, batch: int, budget, governor=None):
    """One embedded engine of the benchmark: ``alg`` is ``HISTOSPEC`` or ``NONE``; ``governor`` a GovernorConfig
    (None: the engine's default)."""
    from sglang_histospec.engine import EngineConfig
    from sglang_histospec.engine.engine import Engine
    from sglang_histospec.engine.types import DraftPolicyConfig

    return Engine(
        EngineConfig(
            model_path=args.model,
            device=args.device,
            speculative_algorithm=alg,
            max_running_requests=batch,
            num_draft_tokens=args.num_draft_tokens,
            seed=args.seed,
            draft_selection=args.draft_selection,
            policy=DraftPolicyConfig(budget=budget, governor=governor),
            admission=args.admission,
        )
    )


def _epoch_row(epoch: int, spec: tuple[float, int, dict], plain: tuple[float, int, dict],
               hf: tuple[float, int, float]) -> dict:  # fmt: skip
    """One epoch's figures from ``(wall s, tokens, info)`` of each engine and ``(wall s, tokens, cpu s)`` of HF."""
    (s_wall, s_tok, s_info), (p_wall, p_tok, p_info), (h_wall, h_tok, h_cpu) = spec, plain, hf
    return {
        "epoch": epoch,
        "tokens_per_s_histospec": s_tok / s_wall,
        "tokens_per_s_plain": p_tok / p_wall,
        "tokens_per_s_hf_generate": h_tok / h_wall if h_wall else None,
        "cpu_tokens_per_s_histospec": s_tok / s_info["cpu_s"],
        "cpu_tokens_per_s_plain": p_tok / p_info["cpu_s"],
        "cpu_tokens_per_s_hf_generate": h_tok / h_cpu if h_cpu else None,
        "tau": s_info["tau"],
        "accept_rate": s_info["accepted"] / s_info["drafted"] if s_info["drafted"] else 0.0,
        "ms_per_forward_histospec": s_info["ms_per_forward"],
        "ms_per_forward_plain": p_info["ms_per_forward"],
        "forwards_histospec": s_info["forwards"],
        "forwards_plain": p_info["forwards"],
        "tokens_histospec": s_tok,
        "tokens_plain": p_tok,
    }


def _print_row(row: dict) -> None:
    hf = row["tokens_per_s_hf_generate"]
    print(
        f"epoch {row['epoch']}{' (fills history, not measured)' if row['epoch'] == 0 else ''}: "
        f"histospec {row['tokens_per_s_histospec']:.0f} tok/s (tau {row['tau']:.2f}), "
        f"plain {row['tokens_per_s_plain']:.0f} tok/s"
        + (f", hf generate {hf:.0f} tok/s" if hf is not None else "")
        + (f", plain A/A {row['plain_aa_ratio']:.3f}" if "plain_aa_ratio" in row else ""),
        file=sys.stderr,
        flush=True,
    )


def _speeds(rows: list[dict]) -> dict:
    """The medians over the measured epochs (all but epoch 0) and the speedups of the result's JSON."""
    measured = rows[1:]

    def med(key):
        vals = [r[key] for r in measured if r[key] is not None]
        return statistics.median(vals) if vals else None

    aa = [r["plain_aa_ratio"] for r in rows if "plain_aa_ratio" in r]
    return {
        **({"plain_aa_ratio_min": min(aa), "plain_aa_ratio_max": max(aa)} if aa else {}),
        "tokens_per_s_histospec": med("tokens_per_s_histospec"),
        "tokens_per_s_plain": med("tokens_per_s_plain"),
        "tokens_per_s_hf_generate": med("tokens_per_s_hf_generate"),
        "speedup": statistics.median(r["tokens_per_s_histospec"] / r["tokens_per_s_plain"] for r in measured),
        "speedup_cold": rows[0]["tokens_per_s_histospec"] / rows[0]["tokens_per_s_plain"],
        "speedup_min": min(r["tokens_per_s_histospec"] / r["tokens_per_s_plain"] for r in rows),
        "cpu_tokens_per_s_histospec": med("cpu_tokens_per_s_histospec"),
        "cpu_tokens_per_s_plain": med("cpu_tokens_per_s_plain"),
        "cpu_tokens_per_s_hf_generate": med("cpu_tokens_per_s_hf_generate"),
        "cpu_speedup": statistics.median(
            r["cpu_tokens_per_s_histospec"] / r["cpu_tokens_per_s_plain"] for r in measured
        ),
        "tau": med("tau"),
        "accept_rate": med("accept_rate"),
        "step_cost_ratio": statistics.median(
            r["ms_per_forward_histospec"] / r["ms_per_forward_plain"] for r in measured if r["ms_per_forward_plain"]
        ),
    }


def _setup(args, spec, batch: int, num_prompts: int, model_label: str, workload: str) -> dict:
    """What the result ran: the workload, the engine's settings, the model and the machine."""
    import torch

    cfg = spec.policy.budgets.cfg
    return {
        "batch": batch,
        "epochs_measured": args.epochs - 1,
        "requests_per_epoch": num_prompts * args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "num_draft_tokens": args.num_draft_tokens,
        "budget": {"policy": cfg.policy, "fixed": cfg.fixed, "cost_limit": cfg.cost_limit},
        "draft_selection": args.draft_selection,
        "admission": args.admission,
        "step_cost": spec.stats()["step_cost"],
        "model": model_label,
        "workload": workload,
        "device": str(spec.device),
        "torch_threads": torch.get_num_threads(),
    }


def _run_batch(args, batch: int, model_label: str, budget) -> dict:
    """Every epoch of the workload at one batch size; the JSON object of one result."""
    args = argparse.Namespace(**{**vars(args), "batch": batch})
    spec, plain = _make_engine(args, "HISTOSPEC", batch, budget), _make_engine(args, "NONE", batch, budget)
    engines = [spec, plain] + ([_make_engine(args, "NONE", batch, budget)] if args.aa else [])
    prompt_ids, token_ids, workload = _prompts(args, spec.tokenizer, spec.vocab_size)
    hf_model = None if args.no_hf else spec.model  # the same weights, in HF's own generate loop
    tok = spec.tokenizer
    pad_id = tok.pad_token_id if tok is not None and tok.pad_token_id is not None else 0
    for engine in engines:
        _warm_up(engine, hf_model if engine is spec else None, token_ids, pad_id, args)
    rows = []
    last_plain = None
    with frozen_heap():  # as ``histospec serve`` does: full collections skip what startup built (engine/heap.py)
        for epoch in range(args.epochs):
            s_run, p_run, *aa_run = _engines_epoch(engines, prompt_ids, token_ids, args, epoch)
            last_plain = p_run[2].pop("results")
            s_run[2].pop("results")
            hf_run = (0, 0, 0)  # (wall s, tokens, cpu s) of transformers generate; zeros with --no-hf
            if hf_model is not None:
                hf_run = _hf_epoch(hf_model, token_ids, args, spec.eos_token_ids, pad_id, epoch)
            rows.append(_epoch_row(epoch, s_run, p_run, hf_run))
            if aa_run:  # the second plain engine's tokens/s over the first's
                rows[-1]["plain_aa_ratio"] = aa_run[0][1] / aa_run[0][0] / rows[-1]["tokens_per_s_plain"]
            _print_row(rows[-1])
    out = {
        **_speeds(rows),
        "mean_token_entropy": _mean_entropy(spec.model, token_ids, last_plain, args.group_size, args.temperature),
        **_setup(args, spec, batch, len(token_ids), model_label, workload),
        "per_epoch": rows,
    }
    p = out["tokens_per_s_plain"]
    if p and out["tokens_per_s_hf_generate"]:
        out["plain_vs_hf_generate"] = p / out["tokens_per_s_hf_generate"]
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    if args.epochs < 2:
        raise SystemExit("--epochs must be >= 2 (epoch 0 only fills the history)")
    try:
        batches = [int(b) for b in str(args.batch).split(",")]
    except ValueError:
        raise SystemExit(f"--batch {args.batch!r}: give an int or a comma list of ints, e.g. 1,4,16") from None
    if min(batches) < 1:
        raise SystemExit(f"--batch {args.batch!r}: every batch size must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    model_label = args.model
    if args.model is not None:
        from sglang_histospec.models import resolve_model

        args.model = resolve_model(args.model, progress=not args.json)
    else:
        from sglang_histospec.models.demo_model import DEMO_MODELS, build_or_load_demo_model

        name = "quick" if args.quick_model else args.demo_model
        args.model = str(build_or_load_demo_model(config=DEMO_MODELS[name], progress=not args.json))
        model_label = f"demo model ({name} config): {args.model}"

    from sglang_histospec.drafting import BudgetConfig

    budget = None  # the engine's default
    if args.budget_policy is not None or args.cost_limit is not None:
        budget_kw = {"policy": args.budget_policy or "paper", "fixed": args.budget_fixed}
        if args.cost_limit is not None:
            budget_kw["cost_limit"] = args.cost_limit or None
        budget = BudgetConfig(**budget_kw)

    results = [_run_batch(args, batch, model_label, budget) for batch in batches]
    out = results[0] if len(results) == 1 else {
        "sweep": results,
        "speedup_min": min(r["speedup_min"] for r in results),
    }  # fmt: skip
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    return 0
