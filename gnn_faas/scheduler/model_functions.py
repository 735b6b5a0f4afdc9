"""A served model's functions: their specs, their pools and the orchestrator over them.

Each model gets a memory function (CSR fetch, feature cache, Aggregate) and a
compute function (Update), each behind a
:class:`~gnn_faas.scheduler.function_pool.FunctionPool` on the platform, and an
:class:`~gnn_faas.scheduler.orchestrator.Orchestrator` that runs the model's
layers over the two pools. ``request_centric`` turns the memory function's
cache off and launches per request (AWSGNN).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from gnn_faas.config import ModelServingConfig, ServingConfig
from gnn_faas.functions.layer_plan import ModelPlan
from gnn_faas.scheduler.function_pool import FunctionPool, LaunchBudget
from gnn_faas.scheduler.orchestrator import ClientCache, Orchestrator
from gnn_faas.scheduler.platform.base import FunctionSpec


class MeteredPool:
    """A :class:`FunctionPool` whose every call runs inside ``platform.busy``:
    the platform meters busy GB-s and knows when an instance was last used."""

    def __init__(self, pool: FunctionPool, platform):
        self.pool = pool
        self.platform = platform

    def submit(self, fn, inline: bool = False) -> Future:
        def run(inst):
            with self.platform.busy(inst.id):
                return fn(inst)

        return self.pool.submit(run, inline=inline)

    def __getattr__(self, name):
        return getattr(self.pool, name)


@dataclass
class ModelFunctions:
    memory_spec: FunctionSpec
    compute_spec: FunctionSpec
    memory_pool: FunctionPool
    compute_pool: FunctionPool
    orchestrator: Orchestrator

    @property
    def pools(self) -> tuple[tuple[FunctionPool, FunctionSpec], ...]:
        return ((self.memory_pool, self.memory_spec), (self.compute_pool, self.compute_spec))


def memory_mb(serving: ServingConfig, model: ModelServingConfig) -> int:
    """The model's memory function size: its own (the chart's ``sizing``) where
    set, else the platform's; its partitions are budgeted on it."""
    return model.memory_function_mb or serving.platform.memory_function_mb


def launch_wait_ratio(serving: ServingConfig, model: ModelServingConfig) -> float | None:
    """The function pools' launch budget (:class:`LoadAwarePolicy`): graph sharing
    under the ``balanced`` objective launches only when queueing costs more than
    its ``latency_slack`` of a stage's service time; every other mode and
    objective keeps FaaS-GNN's launch rule (None)."""
    objective = model.buffers.objective or serving.buffers.objective
    if model.mode != "graph_sharing" or objective != "balanced":
        return None
    slack = model.buffers.latency_slack
    return float(serving.buffers.latency_slack if slack is None else slack)


def function_specs(
    serving: ServingConfig, model: ModelServingConfig, checkpoint: Path
) -> tuple[FunctionSpec, FunctionSpec]:
    """The model's memory and compute function specs."""
    p = serving.platform
    mem_args = ["--store", serving.store, "--graph", model.graph]
    if model.mode == "request_centric":
        mem_args += ["--cache-max-rows", "0"]
    elif model.cache_prior != "degree":
        mem_args += ["--cache-prior", model.cache_prior]
    memory = FunctionSpec(
        name=f"{model.name}-memory",
        kind="memory",
        args=tuple(mem_args),
        memory_mb=memory_mb(serving, model),
        vcpus=model.memory_vcpus or p.memory_vcpus,
        keep_alive_s=p.keep_alive_s,
    )
    compute = FunctionSpec(
        name=f"{model.name}-compute",
        kind="compute",
        args=("--model", str(checkpoint), "--device", model.device),
        memory_mb=model.compute_function_mb or p.compute_function_mb,
        vcpus=model.compute_vcpus or p.compute_vcpus,
        keep_alive_s=p.keep_alive_s,
    )
    return memory, compute


def build_model_functions(
    serving: ServingConfig,
    model: ModelServingConfig,
    checkpoint: Path,
    plan: ModelPlan,
    platform,
    clock,
) -> ModelFunctions:
    """Specs, pools (not started) and the orchestrator of one served model; the
    HTTP clients' connection pools are sized to the gateway's threads."""
    p = serving.platform
    memory_spec, compute_spec = function_specs(serving, model, checkpoint)
    policy = "request_centric" if model.mode == "request_centric" else "load_aware"
    ratio = launch_wait_ratio(serving, model)
    budget = LaunchBudget(ratio) if ratio is not None else None  # shared by the two pools

    def pool(spec: FunctionSpec, max_instances: int) -> FunctionPool:
        return FunctionPool(
            spec.name,
            launch=lambda: platform.launch(spec),
            clock=clock,
            max_instances=max_instances,
            min_instances=p.min_instances,
            policy=policy,
            on_failed=lambda inst: platform.stop(inst.id),
            budget=budget,
            memory_mb=spec.memory_mb,
        )

    memory_pool = pool(memory_spec, p.max_memory_instances)
    compute_pool = pool(compute_spec, p.max_compute_instances)
    orchestrator = Orchestrator(
        plan,
        MeteredPool(memory_pool, platform),
        MeteredPool(compute_pool, platform),
        budget_bytes=memory_mb(serving, model) * 2**20,
        runtime_bytes=p.runtime_mb * 2**20,
        clients=ClientCache(pool_size=serving.gateway.threads),
        # memory functions reach compute instances only where each has its own URL
        forward=serving.gateway.forward_update and platform.addresses_instances,
    )
    return ModelFunctions(memory_spec, compute_spec, memory_pool, compute_pool, orchestrator)
