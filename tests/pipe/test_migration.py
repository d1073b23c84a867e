"""Outlier migration: the pure rule (pipe/migration.py) and the router end to end, against fake servers that
stall a request and against real torch-engine servers (the migrated answer equals the unmigrated one)."""

from __future__ import annotations

import threading
import time

import pytest

from sglang_histospec.pipe.lengths import LengthEstimate
from sglang_histospec.pipe.migration import InFlight, backlog_s, decode_rate, pick_deferrals, pick_migrations
from sglang_histospec.pipe.planner import PlannerConfig
from sglang_histospec.pipe.worker_cost import CostModel, CostModelConfig
from sglang_histospec.router.config import RouterConfig, RouterError
from sglang_histospec.router.router import Router
from tests.helpers.fake_servers import StallServer
from tests.helpers.fake_servers import fake_token as _token
from tests.helpers.server_harness import ServerThread, shared_tiny_model_dir

KNOWN = LengthEstimate(100.0, {0.9: 120.0}, count=8, known=True)
TAIL = PlannerConfig(tail_fraction=0.5)


def _f(key, worker=0, elapsed=3.0, done=0, estimate=KNOWN, moved=False):
    return InFlight(key, worker, elapsed, done, estimate, moved)


@pytest.mark.parametrize(
    ("flights", "unfinished", "idle", "rate", "expected"),
    [
        ([_f(1)], 1, [1], 60.0, [(1, 1)]),  # 180 tokens > max(150, 120)
        ([_f(1, elapsed=2.0)], 1, [1], 60.0, []),  # 120 tokens: not past 150
        ([_f(1, elapsed=1.0, done=100)], 1, [1], 60.0, [(1, 1)]),  # tokens carried from before count
        ([_f(1)], 9, [1], 60.0, []),  # 9 of 16 unfinished: not in the tail
        ([_f(1)], 1, [], 60.0, []),  # no idle worker
        ([_f(1)], 1, [0], 60.0, []),  # the only idle worker is its own
        ([_f(1)], 1, [1], None, []),  # no decode rate yet
        ([_f(1, moved=True)], 1, [1], 60.0, []),  # each request moves at most once
        ([_f(1, estimate=LengthEstimate(1.0))], 1, [1], 60.0, []),  # no history: the default is never judged
        ([_f(1, elapsed=3.0), _f(2, elapsed=6.0)], 2, [1], 60.0, [(2, 1)]),  # one per idle worker, worst first
        ([_f(1, elapsed=3.0), _f(2, elapsed=6.0)], 2, [2, 1], 60.0, [(2, 2), (1, 1)]),
    ],
)
def test_pick_migrations(flights, unfinished, idle, rate, expected):
    assert pick_migrations(flights, unfinished, 16, idle, rate, TAIL) == expected


@pytest.mark.parametrize(
    ("samples", "rate"),
    [([], None), ([(10, 0.0)], None), ([(100, 2.0), (30, 1.0), (10, 0.0)], 40.0), ([(5, 1.0)], 5.0)],
)
def test_decode_rate(samples, rate):
    assert decode_rate(samples) == rate


def test_pick_migrations_refuses_a_bad_rate():
    with pytest.raises(ValueError, match="tokens_per_s"):
        pick_migrations([_f(1)], 1, 16, [1], -1.0, TAIL)


def _d(key, elapsed=3.0, deferrals=0, estimate=KNOWN):
    return InFlight(key, 0, elapsed, 0, estimate, deferrals=deferrals)


@pytest.mark.parametrize(
    ("flights", "unfinished", "rate", "config", "step_mean", "expected"),
    [
        ([_d(1)], 1, 60.0, TAIL, 100.0, [1]),  # 180 tokens > max(150, 120); no idle worker needed
        ([_d(1, elapsed=2.0)], 1, 60.0, TAIL, 100.0, []),  # 120 tokens: not past 150
        ([_d(1, elapsed=2.0)], 1, 60.0, TAIL, 35.0, [1]),  # 120 tokens > 3 x the step mean (DEFER_STEP_FACTOR)
        ([_d(1)], 9, 60.0, TAIL, 100.0, []),  # not in the tail
        ([_d(1)], 1, None, TAIL, 100.0, []),  # no decode rate yet
        ([_d(1, deferrals=1)], 1, 60.0, TAIL, 100.0, []),  # deferred once already (max_deferrals 1)
        ([_d(1, deferrals=1)], 1, 60.0, PlannerConfig(tail_fraction=0.5, max_deferrals=2), 100.0, [1]),
        ([_d(1, estimate=LengthEstimate(1.0))], 1, 60.0, TAIL, 100.0, []),  # no history
        ([_d(1, elapsed=3.0), _d(2, elapsed=6.0)], 2, 60.0, TAIL, 100.0, [2, 1]),  # all of them, worst first
    ],
)
def test_pick_deferrals(flights, unfinished, rate, config, step_mean, expected):
    assert pick_deferrals(flights, unfinished, 16, rate, config, step_mean) == expected


def test_backlog_is_the_remaining_work_of_each_workers_running_requests():
    cost = CostModel(CostModelConfig(iteration_s=1.0, per_request_s=0.0, per_context_token_s=0.0, prefill_token_s=0.0))
    # worker 1: 40 of 100 predicted tokens emitted (60 left) and one past its prediction (a tenth of it left)
    flights = [InFlight(1, 1, 2.0, 0, KNOWN), InFlight(2, 1, 1.0, 150, KNOWN)]
    assert backlog_s(flights, 3, 20.0, cost) == [0.0, 60.0, 0.0]
    assert backlog_s(flights, 3, None, cost) == [0.0, 100.0, 0.0]  # no rate: nothing counted as emitted now


# ---- fake rollout servers that stall -------------------------------------------------------------------------
@pytest.fixture
def stall_servers():
    servers = [StallServer(), StallServer()]
    yield servers
    for s in servers:
        s.stop()


def test_router_migrates_a_stalled_request_and_answers_each_once(stall_servers):
    cfg = RouterConfig(backends=[s.url for s in stall_servers], planner=PlannerConfig(tail_fraction=0.5))
    router = Router(cfg)
    router.start()
    try:
        pids = [f"ok{i}" for i in range(7)] + ["stall"]
        for pid in pids:
            router.predictor.add(pid, 0, [12] * 4)
        params = [{"max_new_tokens": 12, "sampling_seed": 100 + i} for i in range(len(pids))]
        out = router.run_step(1, [(pid, [1, 2, 3]) for pid in pids], 1, {}, item_params=params)
        assert len(out) == len(pids)
        for i, item in enumerate(out):
            assert item["output_ids"] == [_token(100 + i, j) for j in range(12)]  # nothing lost, repeated or redrawn
            assert item["meta_info"]["completion_tokens"] == 12 and item["meta_info"]["prompt_tokens"] == 3
        hp = out[-1]["meta_info"]["histopipe"]
        assert len(hp["migrated_from"]) == 1 and hp["backend"] != hp["migrated_from"][0]
        assert all(o["meta_info"]["histopipe"]["migrated_from"] == [] for o in out[:-1])
        assert router.migrations == 1 and "histopipe_migrations_total 1" in router.metrics_text()
        assert sum(len(s.calls) for s in stall_servers) == len(pids) + 1  # one extra call: the resumed request
    finally:
        router.close()


# ---- the embedded engine -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine_servers(tmp_path_factory):
    model_dir = shared_tiny_model_dir(tmp_path_factory)
    with ServerThread(model_dir, speculative_algorithm="NONE") as a, ServerThread(model_dir) as b:
        yield [a, b]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("sampling", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}])
def test_migrated_response_equals_the_unmigrated_one_under_the_same_seed(engine_servers, sampling):
    # 384 tokens against a history of 2: long enough that a loaded machine cannot finish it before the router's
    # outlier scan (every 50 ms, at the decode rate of the short requests) picks it (96 could, and did, on CI)
    long = {"max_new_tokens": 384, "ignore_eos": True, "sampling_seed": 7, **sampling}
    short = {"max_new_tokens": 2, "ignore_eos": True, "sampling_seed": 1}
    reference = engine_servers[0].client._http.post(
        "/generate", json={"input_ids": [1, 5, 9], "sampling_params": long}
    )
    expected = reference.json()["output_ids"]
    cfg = RouterConfig(backends=[s.url for s in engine_servers], planner=PlannerConfig(tail_fraction=1.0))
    router = Router(cfg)
    router.start()
    try:
        router.predictor.add("long", 0, [2, 2, 2])  # history says 2 tokens: 96 is an outlier
        pids = ["long", "short0", "short1", "short2"]
        for pid in pids[1:]:
            router.predictor.add(pid, 0, [2, 2, 2])
        out = router.run_step(1, [(pid, [1, 5, 9]) for pid in pids], 1, {}, item_params=[long, short, short, short])
        hp = out[0]["meta_info"]["histopipe"]
        assert hp["migrated_from"], "the long request was expected to migrate"
        assert out[0]["output_ids"] == expected and out[0]["meta_info"]["completion_tokens"] == 384
        assert all(len(o["output_ids"]) == 2 for o in out[1:])
    finally:
        router.close()


@pytest.mark.usefixtures("one_torch_thread")
def test_overlap_defers_a_long_request_on_real_servers_and_answers_it_with_the_next_step(engine_servers):
    long = {"max_new_tokens": 96, "ignore_eos": True, "sampling_seed": 7, "temperature": 1.0}
    short = {"max_new_tokens": 2, "ignore_eos": True, "sampling_seed": 1}
    http = engine_servers[0].client._http
    expected = http.post("/generate", json={"input_ids": [1, 5, 9], "sampling_params": long}).json()["output_ids"]
    cfg = RouterConfig(
        backends=[s.url for s in engine_servers], overlap=True, planner=PlannerConfig(tail_fraction=1.0)
    )
    router = Router(cfg)
    router.start()
    try:
        pids = ["long", "short0", "short1", "short2"]
        for pid in pids:
            router.predictor.add(pid, 0, [2, 2, 2])  # history says 2 tokens: 96 is an outlier
        first = router.overlap_step(1, [(pid, [1, 5, 9]) for pid in pids], 1, {}, item_params=[long] + [short] * 3)
        # the rule judges by time: on a loaded machine a short one queued behind the long one can be deferred too
        assert 0 in first.deferred, "the long request was expected to be deferred"
        assert all(len(first.results[i]["output_ids"]) == 2 for i in range(1, 4) if i not in first.deferred)
        assert all(first.results[i] is None for i in first.deferred)
        second = router.overlap_step(2, [("short0", [1, 5, 9])], 1, short)
        late = second.carried + router.drain()  # with step 2 or, if step 2 was quicker still, with the drain
        by_index = {o["meta_info"]["histopipe"]["index"]: o for o in late}
        assert sorted(by_index) == sorted(first.deferred), "each deferred request is answered once, later"
        assert all(o["meta_info"]["histopipe"]["step"] == 1 for o in late)
        assert by_index[0]["output_ids"] == expected
        assert all(len(by_index[i]["output_ids"]) == 2 for i in first.deferred if i != 0)
        assert all(o["meta_info"]["histopipe"]["migrated_from"] == [] for o in late)  # deferred, not migrated
    finally:
        router.close()


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("/abort_request", {}, "rid"),
        ("/generate", {"input_ids": [1, 2], "sampling_params": {"custom_params": {"seed_offset": -1}}}, "seed_offset"),
    ],
)
def test_abort_and_seed_offset_validation(engine_servers, route, body, field):
    response = engine_servers[0].client._http.post(route, json=body)
    assert response.status_code == 400 and field in response.json()["error"]["field"]


def test_abort_of_an_unknown_request_is_harmless(engine_servers):
    http = engine_servers[0].client._http
    assert http.post("/abort_request", json={"rid": "nobody"}).json() == {"success": True}


def test_run_step_item_params_merge_per_request(stall_servers):
    router = Router(RouterConfig(backends=[s.url for s in stall_servers]))
    router.start()
    try:
        prompts = [("a", [1, 2]), ("b", [3])]
        params = [{"sampling_seed": 10 + i, "max_new_tokens": 2 + i} for i in range(4)]
        out = router.run_step(0, prompts, 2, {"max_new_tokens": 9}, item_params=params)
        assert [o["output_ids"] for o in out] == [[_token(10 + i, j) for j in range(2 + i)] for i in range(4)]
        with pytest.raises(RouterError, match="item_params"):
            router.run_step(1, prompts, 2, {}, item_params=params[:3])
    finally:
        router.close()


def test_router_keeps_at_most_max_running_in_flight_per_backend_in_plan_order(stall_servers):
    from sglang_histospec.pipe.worker_cost import CostModel, CostModelConfig

    router = Router(RouterConfig(backends=[stall_servers[0].url]), CostModel(CostModelConfig(max_running=2)))
    router.start()
    try:
        router.predictor.add("long", 0, [12])
        router.predictor.add("short", 0, [2])
        prompts = [("short", [1]), ("long", [2]), ("mid", [3])]
        rids = [f"r-{i}" for i in range(6)]
        out = router.run_step(1, prompts, 2, {"max_new_tokens": 6, "sampling_seed": 3}, rids=rids)
        assert len(out) == 6 and stall_servers[0].peak == 2
        sent = [int(rid.split("-")[-1]) for rid in stall_servers[0].calls]
        # longest predicted first (plan order; the two sent together may arrive in either order), the rest held
        # back until slots free up, the shortest last
        assert set(sent[:2]) == {2, 3} and set(sent[4:]) == {0, 1}
    finally:
        router.close()


def test_router_shutdown_fails_a_migrating_step_at_once(stall_servers):
    """begin_shutdown (SIGTERM) fails a step of per-request calls at once, even while a request still runs."""
    router = Router(RouterConfig(backends=[stall_servers[0].url]))
    router.start()
    got: list = []

    def run() -> None:
        try:
            got.append(router.run_step(1, [("stall", [1, 2])], 1, {"max_new_tokens": 12, "sampling_seed": 1}))
        except RouterError as exc:
            got.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not stall_servers[0].calls:  # the request runs (and stalls) on the backend
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.01)
        t0 = time.monotonic()
        router.begin_shutdown()
        t.join(10)
        assert time.monotonic() - t0 < 5 and isinstance(got[0], RouterError) and got[0].status == 503, got
    finally:
        stall_servers[0].aborted.update(stall_servers[0].calls)  # let the fake server's stalled request end
        t.join(10)
        router.close()


def test_client_abort_reaches_a_resubmitted_request_and_stops_its_migration():
    """Router.abort of a step's rid also aborts its current resubmission ("<rid>~<k>") and marks it aborted."""
    router = Router(RouterConfig(backends=["http://127.0.0.1:9"]))
    posted: list = []
    router.backends[0].http.post = lambda path, content, timeout: posted.append((path, content))  # type: ignore[method-assign]
    try:
        router._current_rids.update({"a": "a~2", "b": "b"})
        router.abort(["a", "b", "unknown"])
        assert posted == [("/abort_request", b'{"rid":["a","b","unknown","a~2"]}')]
        assert router._aborted == {"a", "b"}
    finally:
        router.close()
