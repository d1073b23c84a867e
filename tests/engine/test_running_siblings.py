"""The running-sibling source in the engine: a sample admitted while another sample of its prompt is decoding
drafts from the tokens that sibling has emitted so far (``DrafterConfig.sources``, docs/drafting.md section 13)."""

from __future__ import annotations

import pytest

from sglang_histospec.drafting import DrafterConfig
from sglang_histospec.engine import EngineConfig, GenerateRequest, SamplingParams
from sglang_histospec.engine.engine import Engine
from tests.helpers.engine_tools import FixedBudgets
from tests.helpers.tiny import make_tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = [1, 7, 9, 11, 13]
NEW_TOKENS, LEAD = 40, 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("running"), arch="llama", vocab_size=64, seed=3)


def request(rid: str) -> GenerateRequest:
    sampling = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    return GenerateRequest(rid=rid, input_ids=PROMPT, prompt_id="p", sampling=sampling)


def lead_and_late(model_dir, sources: tuple[str, ...]) -> dict:
    """Greedy samples of one prompt: "lead" decodes LEAD tokens alone, then "late" joins it."""
    cfg = EngineConfig(
        model_path=model_dir,
        device="cpu",
        admission="fifo",
        draft_selection="always",
        num_draft_tokens=8,
        drafter=DrafterConfig(sources=sources, prompt_tail=2),
    )
    engine = Engine(cfg, budgets=FixedBudgets(8))
    engine.add_request(request("lead"))
    while not engine.scheduler.running or len(engine.scheduler.running[0].output) < LEAD:
        engine.step()
    engine.add_request(request("late"))
    done = {}
    while engine.has_unfinished():
        done.update((r.rid, r) for r in engine.step())
    return done


def test_a_late_sample_drafts_what_its_running_sibling_emitted(model_dir):
    """With only the running source, every accepted draft token of "late" came from "lead" while it ran (greedy
    samples agree); with only finished siblings, "late" waits for the lead's end and needs more verify steps."""
    done = lead_and_late(model_dir, ("running",))
    lead, late = done["lead"], done["late"]
    assert late.output_ids == lead.output_ids and len(late.output_ids) == NEW_TOKENS
    assert late.spec_accepted_tokens >= LEAD // 2
    without = lead_and_late(model_dir, ("siblings",))["late"]  # drafts only once the lead finished
    assert without.output_ids == late.output_ids
    assert late.spec_verify_ct < without.spec_verify_ct
