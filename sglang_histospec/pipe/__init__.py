"""HistoPipe: response-length prediction, the step planner, the rollout worker's cost model and the simulators."""

from sglang_histospec.pipe.lengths import LengthEstimate, LengthPredictor, LengthPredictorConfig
from sglang_histospec.pipe.planner import POLICIES, Planner, PlannerConfig, StepPlan
from sglang_histospec.pipe.simulator import PipeSimConfig, PipeSimResult, PipeSimulator, workload_from_trace
from sglang_histospec.pipe.worker_cost import CostModel, CostModelConfig

__all__ = [
    "POLICIES",
    "CostModel",
    "CostModelConfig",
    "LengthEstimate",
    "LengthPredictor",
    "LengthPredictorConfig",
    "PipeSimConfig",
    "PipeSimResult",
    "PipeSimulator",
    "Planner",
    "PlannerConfig",
    "StepPlan",
    "workload_from_trace",
]
