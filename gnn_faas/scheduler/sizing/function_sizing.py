"""Function sizing: cores per stage with Bayesian optimisation (λGrapher 3.5).

Each stage ``s`` (a memory or compute function of the plan) runs on ``c_s``
cores, ``c_s`` in the grid ``{step, 2·step, ..., max_cores}`` (0.25 vCPU steps,
as Knative/Kubernetes CPU requests and Fargate sizes go), with memory ``m_s``
fixed by the memory formulas (function_memory.py). It costs

    F(c, m) = c · P_vcpu + (m / 1024) · P_gb         ($ per second)

while it runs for ``T_s(c_s)`` (profiled). The sizing problem::

    minimise    Σ_s F(c_s, m_s) · T_s(c_s)
    subject to  Σ_s T_s(c_s) <= T_SLO - T_timeout

(stages of a request run one after another; ``T_timeout`` is what the request
may wait in its buffer). Prices default to AWS Fargate on-demand Linux/x86 in
us-east-1, which bills vCPU-seconds and GB-seconds separately:
$0.04048 per vCPU-hour and $0.004445 per GB-hour.

:func:`size_functions` solves it with ``bayes_opt.BayesianOptimization``
(bayesian-optimization 3.x) and its constraint support: the variables are the
per-stage grid indices, continuous for the GP and rounded to the grid before
each evaluation; one GP models the cost, another ``Σ T / budget`` (feasible at
<= 1), and the acquisition is expected improvement weighted by the probability
of feasibility. The answer is the cheapest *evaluated* point that meets the
constraint exactly (the GPs are only a guide), so it always meets the SLO when
anything can. (A penalty in the objective instead of the constraint model gave
answers 5-20% above the optimum on the same budget of evaluations: the penalty
cliff is hard for one GP to model.) :func:`exhaustive` is the exact optimum for
comparison: it enumerates every combination, pruning partial sums that another
partial sum beats in both latency and cost (Pareto pruning, which never drops an
optimum).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.scheduler.sizing.latency_profile import LatencyProfile


@dataclass(frozen=True)
class Prices:
    """$ per vCPU-second and per GB-second (AWS Fargate on-demand, us-east-1)."""

    vcpu_s: float = 0.04048 / 3600
    gb_s: float = 0.004445 / 3600

    def rate(self, cores, memory_mb):
        """``F(c, m)``: $ per second of a function with ``cores`` and ``memory_mb``."""
        return np.asarray(cores) * self.vcpu_s + np.asarray(memory_mb) / 1024 * self.gb_s


@dataclass(frozen=True)
class Stage:
    """One function of a plan: its memory and its latency ``T(cores)`` in seconds."""

    name: str
    memory_mb: int
    latency: Callable[[float], float]


@dataclass(frozen=True)
class SizingResult:
    cores: dict[str, float]
    latency_s: dict[str, float]
    total_latency_s: float
    cost: float  # $ for one execution of all stages
    budget_s: float
    feasible: bool
    evaluations: int
    solver: str

    def as_dict(self) -> dict:
        return {
            "cores": dict(self.cores),
            "latency_s": dict(self.latency_s),
            "total_latency_s": self.total_latency_s,
            "cost": self.cost,
            "budget_s": self.budget_s,
            "feasible": self.feasible,
            "evaluations": self.evaluations,
            "solver": self.solver,
        }


def core_grid(max_cores: float = 4.0, step: float = 0.25) -> np.ndarray:
    """``{step, 2·step, ..., max_cores}``."""
    if step <= 0 or max_cores < step:
        raise InvalidRequest(f"need 0 < step <= max_cores, got step={step} max={max_cores}")
    return step * np.arange(1, int(math.floor(max_cores / step + 1e-9)) + 1)


def stages_from_profile(
    profile: LatencyProfile, rows: Mapping[str, int], memory_mb: Mapping[str, int]
) -> list[Stage]:
    """Stages named by ``rows`` (the rows each one processes), latencies from
    ``profile``, memory from ``memory_mb`` (function_memory.py's formulas)."""
    return [
        Stage(name, int(memory_mb[name]), lambda c, s=name, n=n: profile.latency(s, c, n))
        for name, n in rows.items()
    ]


class _Tables:
    """Latency and cost of every stage at every grid point (the objective is a lookup)."""

    def __init__(self, stages: Sequence[Stage], grid: np.ndarray, prices: Prices, budget: float):
        if not stages:
            raise InvalidRequest("nothing to size: no stages")
        if budget <= 0:
            raise InvalidRequest(f"SLO minus timeout must be positive, got {budget:.4f} s")
        self.stages, self.grid, self.budget = list(stages), grid, budget
        self.T = np.array([[s.latency(float(c)) for c in grid] for s in stages])
        rates = np.stack([prices.rate(grid, s.memory_mb) for s in stages])
        self.C = rates * self.T

    def result(self, idx: Sequence[int], evaluations: int, solver: str) -> SizingResult:
        rows = np.arange(len(self.stages))
        idx = np.asarray(idx, dtype=np.int64)
        t = self.T[rows, idx]
        return SizingResult(
            cores={s.name: float(self.grid[i]) for s, i in zip(self.stages, idx, strict=True)},
            latency_s={s.name: float(x) for s, x in zip(self.stages, t, strict=True)},
            total_latency_s=float(t.sum()),
            cost=float(self.C[rows, idx].sum()),
            budget_s=self.budget,
            feasible=bool(t.sum() <= self.budget),
            evaluations=evaluations,
            solver=solver,
        )


def exhaustive(
    stages: Sequence[Stage],
    slo_s: float,
    timeout_s: float = 0.0,
    *,
    prices: Prices = Prices(),
    max_cores: float = 4.0,
    step: float = 0.25,
) -> SizingResult:
    """The exact optimum over the whole grid (Pareto-pruned enumeration).

    Infeasible everywhere: the fastest choice (most cores), ``feasible=False``.
    """
    tables = _Tables(stages, core_grid(max_cores, step), prices, slo_s - timeout_s)
    g = tables.grid.size
    # Frontier of partial assignments: latency, cost, choices (one column per stage).
    lat, cost = np.zeros(1), np.zeros(1)
    choice = np.zeros((1, 0), dtype=np.int64)
    evaluations = 0
    for s in range(len(stages)):
        lat = (lat[:, None] + tables.T[s][None, :]).ravel()
        cost = (cost[:, None] + tables.C[s][None, :]).ravel()
        choice = np.concatenate(
            (np.repeat(choice, g, axis=0), np.tile(np.arange(g), choice.shape[0])[:, None]),
            axis=1,
        )
        evaluations += lat.size
        ok = lat <= tables.budget
        lat, cost, choice = lat[ok], cost[ok], choice[ok]
        if lat.size == 0:
            return tables.result([g - 1] * len(stages), evaluations, "exhaustive")
        order = np.lexsort((cost, lat))  # by latency, ties by cost
        lat, cost, choice = lat[order], cost[order], choice[order]
        best_before = np.minimum.accumulate(np.concatenate(([np.inf], cost[:-1])))
        keep = cost < best_before  # strictly cheaper than every faster partial sum
        lat, cost, choice = lat[keep], cost[keep], choice[keep]
    return tables.result(choice[int(np.argmin(cost))], evaluations, "exhaustive")


def _fast_acquisition(base: type, n_random: int, n_smart: int) -> type:
    """``base`` with a cheaper inner search: the objective is constant between
    grid points, so a few thousand random candidates (vectorised GP predictions)
    find the acquisition's maximum as well as the default 10,000 samples plus
    L-BFGS-B restarts, at a fraction of the cost."""

    class Fast(base):
        def suggest(self, gp, target_space, n_random=0, n_smart=0, fit_gp=True, random_state=None):
            return super().suggest(
                gp,
                target_space,
                n_random=fast_random,
                n_smart=fast_smart,
                fit_gp=fit_gp,
                random_state=random_state,
            )

    fast_random, fast_smart = n_random, n_smart
    return Fast


def size_functions(
    stages: Sequence[Stage],
    slo_s: float,
    timeout_s: float = 0.0,
    *,
    prices: Prices = Prices(),
    max_cores: float = 4.0,
    step: float = 0.25,
    init_points: int | None = None,
    n_iter: int | None = None,
    seed: int = 0,
) -> SizingResult:
    """Cores per stage by constrained Bayesian optimisation; seeded and deterministic.

    ``bayes_opt.BayesianOptimization`` with its constraint support: one GP models
    the cost, another the latency constraint ``Σ T / budget <= 1``, and the
    acquisition is expected improvement times the probability of feasibility.
    Parameters are grid indices ``1..G`` per stage; each suggestion is rounded
    to the grid before it is evaluated and registered (a suggestion that rounds
    onto a point already evaluated is replaced by an unevaluated neighbour, so
    no evaluation is wasted). The first point is the fastest choice per stage,
    which is feasible whenever anything is; if even it misses the budget the
    problem is infeasible and that choice is returned with ``feasible=False``.
    Defaults: ``init_points = 2·S + 3`` random points, ``n_iter = 10·S`` for
    ``S`` stages.
    """
    import bayes_opt  # noqa: F401  (loads scipy.linalg's BLAS before the limit below)
    from threadpoolctl import threadpool_limits  # a scikit-learn dependency

    tables = _Tables(stages, core_grid(max_cores, step), prices, slo_s - timeout_s)
    n = len(stages)
    rows = np.arange(n)
    fastest = np.argmin(tables.T, axis=1)
    if tables.T[rows, fastest].sum() > tables.budget:
        return tables.result(fastest, 1, "bayes_opt")
    # The GPs factor ~50x50 matrices: one BLAS thread is fastest, and threads
    # spinning on a busy host made the search 4x slower. (threadpoolctl limits
    # only the BLAS libraries already loaded, hence the import above.)
    with threadpool_limits(limits=1):
        evaluated = _bo_search(
            tables,
            fastest,
            2 * n + 3 if init_points is None else init_points,
            10 * n if n_iter is None else n_iter,
            seed,
        )
    lats = np.array([tables.T[rows, idx].sum() for idx in evaluated])
    costs = np.array([tables.C[rows, idx].sum() for idx in evaluated])
    feasible = np.flatnonzero(lats <= tables.budget)  # never empty: ``fastest`` is feasible
    best = evaluated[int(feasible[np.argmin(costs[feasible])])]
    return tables.result(best, len(evaluated), "bayes_opt")


def _bo_search(
    tables: _Tables, first: np.ndarray, init_points: int, n_iter: int, seed: int
) -> list[np.ndarray]:
    """The grid points (index per stage) the optimiser evaluated, in order."""
    from bayes_opt import BayesianOptimization, acquisition
    from scipy.optimize import NonlinearConstraint

    g, n = tables.grid.size, len(tables.stages)
    rows = np.arange(n)
    cost_scale = float(tables.C.max(axis=1).sum())  # so the GP sees values of order 1
    optimizer = BayesianOptimization(
        f=None,
        pbounds={f"c{i}": (1, g) for i in range(n)},
        acquisition_function=_fast_acquisition(
            acquisition.ExpectedImprovement, n_random=3000, n_smart=0
        )(xi=0.0, random_state=seed),
        # Evaluated by us below; bayes_opt only needs the bounds to fit its model.
        constraint=NonlinearConstraint(lambda **_: 0.0, -np.inf, 1.0),
        random_state=seed,
        verbose=0,
    )
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, ...]] = set()
    evaluated: list[np.ndarray] = []

    def evaluate(idx: np.ndarray) -> None:
        key = tuple(int(i) for i in idx)
        seen.add(key)
        evaluated.append(idx)
        optimizer.register(
            params={f"c{i}": float(k + 1) for i, k in enumerate(key)},
            target=-float(tables.C[rows, idx].sum()) / cost_scale,
            constraint_value=float(tables.T[rows, idx].sum()) / tables.budget,
        )

    def unevaluated_near(idx: np.ndarray) -> np.ndarray | None:
        if tuple(idx) not in seen:
            return idx
        moves = [(i, d) for i in range(n) for d in (-1, 1)]
        for j in rng.permutation(len(moves)):
            i, d = moves[j]
            cand = idx.copy()
            cand[i] += d
            if 0 <= cand[i] < g and tuple(cand) not in seen:
                return cand
        return None

    evaluate(first)
    for _ in range(init_points):
        cand = unevaluated_near(rng.integers(0, g, n))
        if cand is not None:
            evaluate(cand)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GP hyper-parameter convergence chatter
        for _ in range(n_iter):
            x = optimizer.suggest()
            idx = np.clip(np.rint([x[f"c{i}"] for i in range(n)]).astype(np.int64), 1, g) - 1
            cand = unevaluated_near(idx)
            if cand is not None:
                evaluate(cand)
    return evaluated
