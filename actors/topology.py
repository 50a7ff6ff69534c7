"""The resource plan: which actor runs where, reserved up front with one Ray placement group.

``plan_resources(cfg)`` turns ``cluster:`` into bundles and slots without touching Ray, so a
config can be checked (and explained) anywhere. ``reserve(plan)`` compares the plan with the
cluster and fails before any actor starts when it cannot fit, saying what was asked, what
exists and which keys to change; otherwise it reserves every bundle at once.

Every GPU is its own bundle ({"GPU": 1, "CPU": the CPUs of the actors on it}). Actors that share
a GPU (a colocated learner rank, an env worker timing on a generator's GPU) sit in the same
bundle with a fractional ``num_gpus``; a tensor-parallel generator spans several bundles, its
actor on the first and its vLLM workers on the rest. One group for everything, because Ray
reserves a group atomically: separate groups per role could each hold half of what they need
and wait on each other forever.

A role's bundles can be kept to nodes that carry given labels (``cluster.learner_labels`` and
its peers, matched against ``ray start --labels``): on several nodes, that is how the learner's
ranks stay on one node and the generators and env workers go to the others.
"""
from __future__ import annotations

import logging
import math
import os
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

ROLES = ("generator", "env_worker", "learner")


class TopologyError(RuntimeError):
    """A topology that cannot run; the message says what was asked, what exists and what to change."""


@dataclass
class Slot:
    """Where one actor goes: its bundles in the placement group and its share of each."""

    role: str  # generator, env_worker or learner
    index: int  # generator number, env worker number, or learner rank
    bundles: list[int]  # bundle indices; the actor sits on the first, tensor-parallel workers on the rest
    num_gpus: float  # share of each bundle's GPU (1.0 alone on it, less when shared; 0 on the CPU)
    num_cpus: float  # CPUs the actor reserves, inside its first bundle


@dataclass
class ResourcePlan:
    bundles: list[dict[str, float]]  # the placement group's bundles, GPU bundles first
    strategy: str  # Ray placement strategy: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD
    generators: list[Slot]
    env_workers: list[Slot]
    learner: list[Slot]  # one slot per rank; a single CPU rank when learner_gpus is 0
    cluster: dict[str, Any] = field(default_factory=dict)  # the cluster config it came from, for messages
    labels: list[dict[str, str]] = field(default_factory=list)  # per bundle: node labels it must be placed on ({}: any node)

    def totals(self) -> dict[str, float]:
        """Resources the whole plan reserves, by name."""
        total: dict[str, float] = {}
        for bundle in self.bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
        return total

    def slots(self) -> list[Slot]:
        return [*self.generators, *self.env_workers, *self.learner]

    def describe(self) -> str:
        """One line per role with the keys that size it, then how GPUs are shared."""
        c = self.cluster
        lines = [
            f"generators: {c['num_generators']} x {_amounts(c['generator_gpus'], c['generator_cpus'])} "
            f"(cluster.num_generators={c['num_generators']}, cluster.generator_gpus={c['generator_gpus']}, "
            f"cluster.generator_cpus={_num(c['generator_cpus'])})",
            f"env workers: {c['num_env_workers']} x {_amounts(c['env_worker_gpus'], c['env_worker_cpus'])} "
            f"(cluster.num_env_workers={c['num_env_workers']}, cluster.env_worker_gpus={c['env_worker_gpus']}, "
            f"cluster.env_worker_cpus={_num(c['env_worker_cpus'])})",
            f"learner: {len(self.learner)} rank(s) x {_amounts(1 if c['learner_gpus'] else 0, c['learner_cpus'])} "
            f"(cluster.learner_gpus={c['learner_gpus']}, cluster.learner_cpus={_num(c['learner_cpus'])})",
            f"GPU sharing: cluster.colocate={str(c['colocate']).lower()}, "
            f"cluster.env_colocate={str(c['env_colocate']).lower()}",
        ]
        return "\n".join(lines)


# --------------------------------------------------------------------------- planning


def plan_resources(cfg: Any, learner: bool = True, with_generators: bool = True) -> ResourcePlan:
    """The bundles and slots for ``cfg.cluster`` (and ``cfg.env.backend``); no Ray needed.

    ``learner=False`` plans generators and env workers only (an evaluation sweep trains nothing);
    ``with_generators=False`` no generators either (a sweep that scores existing solutions): the env
    workers then take GPUs of their own, env_colocate or not, one timing lane on each."""
    c = _cluster_values(cfg.cluster)
    _validate(c, _backend(cfg))
    layout = _Layout()
    generators = [Slot("generator", i, [], 0.0, c["generator_cpus"]) for i in range(c["num_generators"] if with_generators else 0)]
    for slot in generators:
        layout.place(slot, [layout.new_gpu() for _ in range(c["generator_gpus"])])
    generator_gpus = len(layout.gpus)

    ranks = (c["learner_gpus"] or c["learner_cpu_ranks"]) if learner else 0
    learner = [Slot("learner", r, [], 0.0, c["learner_cpus"]) for r in range(ranks)]
    for slot in learner:
        # Colocated: rank r shares generator GPU r, so weights swap within a device (CUDA IPC).
        shared = c["colocate"] and slot.index < generator_gpus
        layout.place(slot, [slot.index if shared else layout.new_gpu()] if c["learner_gpus"] else [])

    env_workers = [Slot("env_worker", w, [], 0.0, c["env_worker_cpus"]) for w in range(c["num_env_workers"])]
    for slot in env_workers:
        gpu = (slot.index % generator_gpus if c["env_colocate"] and generator_gpus else layout.new_gpu()) if c["env_worker_gpus"] else None
        layout.place(slot, [] if gpu is None else [gpu])
    bundles = layout.bundles()
    return ResourcePlan(bundles, str(c["placement_strategy"]), generators, env_workers, learner, c, layout.labels(c))


class _Layout:
    """GPU bundles (each a list of its occupants and the CPUs they bring) and CPU-only slots."""

    def __init__(self) -> None:
        self.gpus: list[list[tuple[Slot, float]]] = []
        self.cpu_slots: list[Slot] = []

    def new_gpu(self) -> int:
        self.gpus.append([])
        return len(self.gpus) - 1

    def place(self, slot: Slot, gpus: list[int]) -> None:
        """On these GPU bundles (its CPUs in the first), or on a CPU bundle of its own when none."""
        if not gpus:
            self.cpu_slots.append(slot)
            return
        slot.bundles = gpus
        for k, b in enumerate(gpus):
            self.gpus[b].append((slot, slot.num_cpus if k == 0 else 0.0))

    def bundles(self) -> list[dict[str, float]]:
        """The bundles in index order; sets each slot's GPU share and CPU bundle index."""
        bundles = []
        for occupants in self.gpus:
            cpus = sum(c for _, c in occupants)
            bundles.append({"GPU": 1.0, "CPU": cpus} if cpus else {"GPU": 1.0})
        for slot in {id(s): s for occupants in self.gpus for s, _ in occupants}.values():
            slot.num_gpus = min(_gpu_share(len(self.gpus[b])) for b in slot.bundles)
        for slot in self.cpu_slots:
            slot.bundles = [len(bundles)]
            bundles.append({"CPU": slot.num_cpus})
        return bundles


    def labels(self, c: dict[str, Any]) -> list[dict[str, str]]:
        """Per bundle (after ``bundles``): the node labels its occupants' roles ask for, which must agree."""
        occupants: dict[int, list[Slot]] = {}
        for slot in [s for g in self.gpus for s, _ in g] + self.cpu_slots:
            for b in slot.bundles:
                occupants.setdefault(b, []).append(slot)
        labels = []
        for b in range(len(self.gpus) + len(self.cpu_slots)):
            asked = {s.role: dict(c[LABELS_KEY[s.role]] or {}) for s in occupants.get(b, [])}
            distinct = {tuple(sorted(v.items())) for v in asked.values()}
            if len(distinct) > 1:
                raise TopologyError(f"bundle {b} is shared by {' and '.join(sorted(asked))}, whose node labels differ "
                                    f"({'; '.join(f'cluster.{LABELS_KEY[r]}={v}' for r, v in sorted(asked.items()))}): "
                                    "give them the same labels, or stop sharing the GPU (cluster.colocate, cluster.env_colocate)")
            labels.append(next(iter(asked.values()), {}))
        return labels


# Each role's node-label key, spelled out: a key built from the role's name would hide the
# fields' readers from a search (and from tests/test_config_fields.py).
LABELS_KEY = {"generator": "generator_labels", "env_worker": "env_worker_labels", "learner": "learner_labels"}


def _gpu_share(occupants: int) -> float:
    # Rounded down to Ray's 1e-4 resource granularity, so the shares never add up past one GPU.
    return math.floor(10_000 / occupants) / 10_000


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """A field of a dataclass, a DictConfig or a plain dict (an enum is a str: configs.schema)."""
    return obj.get(key, default) if hasattr(obj, "get") else getattr(obj, key, default)


def _cluster_values(cluster: Any) -> dict[str, Any]:
    from configs.schema import ClusterConfig

    return {key: _get(cluster, key, default) for key, default in asdict(ClusterConfig()).items()}


def _backend(cfg: Any) -> str:
    env = _get(cfg, "env")
    return str(_get(env, "backend", "cpp")) if env is not None else "cpp"


def _validate(c: dict[str, Any], backend: str) -> None:
    for key in ("num_generators", "num_env_workers", "learner_cpu_ranks"):
        if c[key] < 1:
            raise TopologyError(f"cluster.{key} must be at least 1, got {c[key]}")
    for key in ("generator_gpus", "env_worker_gpus", "learner_gpus", "generator_cpus", "env_worker_cpus", "learner_cpus"):
        if c[key] < 0:
            raise TopologyError(f"cluster.{key} must be 0 or more, got {c[key]}")
    for role, gpus, cpus in (("generator", "generator_gpus", "generator_cpus"), ("env_worker", "env_worker_gpus", "env_worker_cpus"),
                             ("learner", "learner_gpus", "learner_cpus")):
        if not c[gpus] and not c[cpus]:
            raise TopologyError(f"a {role} on the CPU needs CPUs: cluster.{gpus} and cluster.{cpus} are both 0; set one of them")
    if c["env_worker_gpus"] > 1:
        raise TopologyError(f"cluster.env_worker_gpus must be 0 or 1 (an env worker times on one GPU), got {c['env_worker_gpus']}")
    if backend == "cuda" and not c["env_worker_gpus"]:
        raise TopologyError("env.backend=cuda times kernels on a GPU: set cluster.env_worker_gpus=1 (or use env.backend=cpp)")
    if backend == "cpp" and c["env_worker_gpus"]:
        raise TopologyError("env.backend=cpp verifies and times on the CPU: set cluster.env_worker_gpus=0 (or use env.backend=cuda)")
    if c["colocate"] and not (c["generator_gpus"] and c["learner_gpus"]):
        raise TopologyError("cluster.colocate=true shares GPUs between generators and learner, so cluster.generator_gpus and "
                            "cluster.learner_gpus must both be at least 1; or set cluster.colocate=false")
    if c["env_colocate"] and not (c["generator_gpus"] and c["env_worker_gpus"]):
        raise TopologyError("cluster.env_colocate=true puts env workers on the generators' GPUs, so cluster.generator_gpus and "
                            "cluster.env_worker_gpus must both be at least 1; or set cluster.env_colocate=false")
    if c["placement_timeout_s"] <= 0:
        raise TopologyError(f"cluster.placement_timeout_s must be positive, got {c['placement_timeout_s']}")


# --------------------------------------------------------------------------- checking against a cluster


def check_fits(plan: ResourcePlan, cluster_resources: Mapping[str, float], nodes: Iterable[Mapping[str, float]],
               node_labels: Iterable[Mapping[str, str]] | None = None) -> None:
    """Raise TopologyError if the cluster (totals, and nodes' resources and labels) cannot hold the plan."""
    asked = plan.totals()
    short = [k for k in ("GPU", "CPU") if asked.get(k, 0.0) > cluster_resources.get(k, 0.0) + 1e-9]
    if short:
        raise TopologyError(
            f"the cluster cannot hold this topology: it asks for {_resources(asked)}; the cluster has "
            f"{_resources(cluster_resources)} (ray.cluster_resources()); short of {' and '.join(short)}\n"
            f"{_indent(plan.describe())}\n{_FIX}"
        )
    nodes = [dict(n) for n in nodes]
    labels = [dict(n) for n in node_labels] if node_labels is not None else [{} for _ in nodes]
    for i, (bundle, wanted) in enumerate(zip(plan.bundles, plan.labels or [{}] * len(plan.bundles))):
        matching = [n for n, have in zip(nodes, labels) if all(have.get(k) == v for k, v in wanted.items())]
        if wanted and not matching:
            raise TopologyError(
                f"the cluster cannot hold this topology: bundle {i} (for {_occupants(plan, i)}) needs a node labelled "
                f"{_labels(wanted)}; the nodes have {'; '.join(_labels(n) or 'no labels' for n in labels)} (ray start --labels)\n"
                f"{_indent(plan.describe())}\nfix: start a node with those labels, or change "
                f"{', '.join(sorted({f'cluster.{LABELS_KEY[s.role]}' for s in plan.slots() if i in s.bundles}))}")
        nodes_for_bundle = matching if wanted else nodes
        if not any(_fits(bundle, n) for n in nodes_for_bundle):
            raise TopologyError(
                f"the cluster cannot hold this topology: bundle {i} ({_resources(bundle)}, for {_occupants(plan, i)}) fits on "
                f"no single node{' labelled ' + _labels(wanted) if wanted else ''}; the nodes have "
                f"{'; '.join(_resources(n) for n in nodes_for_bundle) or 'nothing'} (ray.nodes())\n"
                f"{_indent(plan.describe())}\n{_FIX}"
            )
    if plan.strategy == "STRICT_PACK" and not any(_fits(asked, n) for n in nodes):
        raise TopologyError(
            f"the cluster cannot hold this topology: cluster.placement_strategy=STRICT_PACK needs {_resources(asked)} on one "
            f"node; the nodes have {'; '.join(_resources(n) for n in nodes)} (ray.nodes()); use PACK or a smaller topology\n"
            f"{_indent(plan.describe())}"
        )
    if plan.strategy == "STRICT_SPREAD" and len(plan.bundles) > len(nodes):
        raise TopologyError(
            f"the cluster cannot hold this topology: cluster.placement_strategy=STRICT_SPREAD puts each of "
            f"{len(plan.bundles)} bundles on its own node; the cluster has {len(nodes)} node(s); use PACK or SPREAD"
        )


_FIX = ("fix: lower the keys above, share GPUs (cluster.colocate=true, cluster.env_colocate=true), or give the cluster more "
        "(a local cluster: cluster.num_cpus, cluster.num_gpus; a Ray cluster: add nodes)")


def _fits(bundle: Mapping[str, float], node: Mapping[str, float]) -> bool:
    return all(amount <= node.get(name, 0.0) + 1e-9 for name, amount in bundle.items())


def _occupants(plan: ResourcePlan, bundle: int) -> str:
    return ", ".join(f"{s.role} {s.index}" for s in plan.slots() if bundle in s.bundles)


def _num(x: float) -> str:
    return f"{float(x):g}"


def _amounts(gpus: float, cpus: float) -> str:
    return f"{_num(gpus)} GPU + {_num(cpus)} CPU" if gpus else f"{_num(cpus)} CPU"


def _resources(res: Mapping[str, float]) -> str:
    return f"{_num(res.get('GPU', 0.0))} GPU and {_num(res.get('CPU', 0.0))} CPU"


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if not k.startswith("ray.io/"))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


# --------------------------------------------------------------------------- Ray


def start_cluster(cluster: Any, init_options: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Start (``address: local``) or join the Ray cluster; returns ray.cluster_resources().

    ``init_options``: more of ray.init's arguments (the run's worker output: actors/run_logs.py).
    Already connected (a test, or a driver running as a Ray job) is kept as it is.
    """
    import ray

    from actors.ray_auth import settle_mode

    c = _cluster_values(cluster)
    # No usage reports: these machines have no network, and a training run should not phone home.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        settle_mode(starts_cluster=c["address"] == "local")
        common = dict(include_dashboard=False, configure_logging=False, ignore_reinit_error=False, **(init_options or {}))
        if c["address"] == "local":
            # address="local" starts a private cluster even when RAY_ADDRESS points elsewhere. Ray
            # turns token authentication on for it (a token in ~/.ray/auth_token) and says so at
            # every start: nothing to act on for a cluster of this process's own, so not on the terminal.
            auth = logging.getLogger("ray._private.authentication.authentication_token_setup")
            level = auth.level
            auth.setLevel(logging.ERROR)
            try:
                ray.init(address="local", num_cpus=c["num_cpus"], num_gpus=c["num_gpus"], **common)
            finally:
                auth.setLevel(level)
        else:
            if c["num_cpus"] is not None or c["num_gpus"] is not None:
                raise TopologyError(f"cluster.num_cpus and cluster.num_gpus size a local cluster only; with "
                                    f"cluster.address={c['address']!r} unset them (the cluster's nodes decide)")
            ray.init(address=c["address"], **common)
    return dict(ray.cluster_resources())


@dataclass
class Reservation:
    """A ready placement group for a plan; ``options(slot)`` places an actor in it."""

    plan: ResourcePlan
    group: Any  # ray.util.placement_group.PlacementGroup

    def options(self, slot: Slot) -> dict[str, Any]:
        """Keyword arguments for ``ActorClass.options(...)`` that put the actor in its slot."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_cpus": slot.num_cpus,
            "num_gpus": slot.num_gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group,
                placement_group_bundle_index=slot.bundles[0],
                # vLLM's tensor-parallel workers, started by the generator, stay in the reservation.
                placement_group_capture_child_tasks=True,
            ),
        }

    def node_shares(self, slots: list[Slot]) -> dict[int, tuple[int, int]]:
        """Per slot index: (its rank, how many of ``slots`` there are) among those placed on its node."""
        from ray.util.placement_group import placement_group_table

        return ranks_on_nodes(slots, placement_group_table(self.group).get("bundles_to_node_id") or {})

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)


def ranks_on_nodes(slots: list[Slot], node_of: Mapping[int, str]) -> dict[int, tuple[int, int]]:
    """Per slot index: (its rank, how many of ``slots`` there are) among those whose first bundle is on its node."""
    on_node: dict[str | None, list[int]] = {}
    for slot in slots:
        on_node.setdefault(node_of.get(slot.bundles[0]), []).append(slot.index)
    return {index: (rank, len(indices)) for indices in on_node.values() for rank, index in enumerate(indices)}


def alive_nodes() -> tuple[list[dict[str, float]], list[dict[str, str]]]:
    """The alive nodes' resources, and their labels in the same order."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return [dict(n["Resources"]) for n in nodes], [dict(n.get("Labels") or {}) for n in nodes]


def reserve(plan: ResourcePlan, timeout_s: float | None = None) -> Reservation:
    """Check the plan against the cluster, then reserve all its bundles at once (waits up to the timeout)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    check_fits(plan, ray.cluster_resources(), *alive_nodes())
    timeout_s = plan.cluster.get("placement_timeout_s", 120.0) if timeout_s is None else timeout_s
    # Named for the dashboard; unique, because two runs may share a cluster.
    labelled = {"bundle_label_selector": plan.labels} if any(plan.labels) else {}
    group = placement_group(plan.bundles, strategy=plan.strategy, name=f"cuda-agent-{uuid.uuid4().hex[:8]}", **labelled)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise TopologyError(
            f"the cluster has room for this topology ({_resources(plan.totals())}) but could not reserve it within "
            f"{_num(timeout_s)} s: free now {_resources(ray.available_resources())} (ray.available_resources()); other "
            f"jobs or actors hold the rest; stop them, or wait longer with cluster.placement_timeout_s\n{_indent(plan.describe())}"
        )
    return Reservation(plan, group)
