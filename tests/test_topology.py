"""The resource plan (pure) and its reservation on a real local Ray cluster with 2 CPUs and 2 logical GPUs.

Ray lets a cluster declare GPUs it does not have; placement, bundle indices and each actor's
assigned GPU ids are then real Ray scheduling decisions, which is what these tests check.
"""
from __future__ import annotations

import pytest

from actors.system import start_env_workers
from actors.topology import TopologyError, check_fits, plan_resources, ranks_on_nodes, reserve, start_cluster
from configs.load import load_config
from configs.schema import ClusterConfig
from env_pool.evaluate import cpu_share


def config(*overrides: str, files: tuple[str, ...] = ()):
    return load_config(files, overrides)


@pytest.fixture(scope="module")
def cluster():
    import ray

    assert not ray.is_initialized(), "an earlier test left Ray running"
    resources = start_cluster(ClusterConfig(num_cpus=2, num_gpus=2))
    yield resources
    ray.shutdown()


# --------------------------------------------------------------------------- planning, no Ray


def test_cpu_demo_plans_one_cpu_bundle_per_actor_and_no_gpu():
    plan = plan_resources(config(files=("cpu-demo",)))
    assert plan.bundles == [{"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 1.0}]  # generator, learner, env worker
    assert plan.totals() == {"CPU": 5.0}
    assert [(s.role, s.bundles, s.num_gpus) for s in plan.slots()] == [
        ("generator", [0], 0.0), ("env_worker", [2], 0.0), ("learner", [1], 0.0)]


def test_one_h100_shares_its_single_gpu_three_ways_with_shares_that_fit():
    plan = plan_resources(config(files=("gpu-1xh100",)))
    assert plan.bundles == [{"GPU": 1.0, "CPU": 3.0}]
    assert {s.role: (s.bundles, s.num_gpus) for s in plan.slots()} == {
        "generator": ([0], 0.3333), "env_worker": ([0], 0.3333), "learner": ([0], 0.3333)}
    assert sum(s.num_gpus for s in plan.slots()) <= 1.0


def test_scoring_solutions_plans_env_workers_alone_each_on_a_gpu_of_its_own():
    plan = plan_resources(config("cluster.num_env_workers=4", files=("gpu-1xh100",)), learner=False, with_generators=False)
    assert plan.generators == [] and plan.learner == []
    assert plan.bundles == [{"GPU": 1.0, "CPU": 1.0}] * 4  # env_colocate has no generator to share with
    assert [(s.bundles, s.num_gpus) for s in plan.env_workers] == [([0], 1.0), ([1], 1.0), ([2], 1.0), ([3], 1.0)]


@pytest.mark.parametrize("cpus, count", [(list(range(64)), 4), (list(range(16)), 3), ([2, 5, 7], 2), ([0, 1], 2)])
def test_env_workers_of_a_node_split_its_cpus_into_disjoint_shares_that_cover_them(cpus, count):
    shares = [cpu_share(cpus, rank, count) for rank in range(count)]
    assert sorted(c for share in shares for c in share) == cpus
    assert all(len(share) >= len(cpus) // count for share in shares)


def test_env_workers_are_ranked_among_those_on_their_own_node():
    plan = plan_resources(config("cluster.num_env_workers=5", files=("gpu-1xh100",)), learner=False, with_generators=False)
    node_of = {0: "a", 1: "b", 2: "a", 3: "b", 4: "a"}  # the placement group's bundles_to_node_id, two nodes
    assert ranks_on_nodes(plan.env_workers, node_of) == {0: (0, 3), 1: (0, 2), 2: (1, 3), 3: (1, 2), 4: (2, 3)}


def test_more_env_workers_than_cpus_share_one_cpu_each():
    shares = [cpu_share([3, 4], rank, 3) for rank in range(3)]
    assert all(len(share) == 1 for share in shares) and {c for share in shares for c in share} == {3, 4}


def test_two_h200_put_the_learner_alone_and_the_env_worker_beside_the_generator():
    plan = plan_resources(config(files=("gpu-2xh200",)))
    assert plan.bundles == [{"GPU": 1.0, "CPU": 2.0}, {"GPU": 1.0, "CPU": 1.0}]
    slots = {s.role: s for s in plan.slots()}
    assert slots["generator"].bundles == slots["env_worker"].bundles == [0] and slots["generator"].num_gpus == 0.5
    assert slots["learner"].bundles == [1] and slots["learner"].num_gpus == 1.0


def test_tensor_parallel_generators_span_consecutive_gpu_bundles_and_colocated_ranks_follow_them():
    plan = plan_resources(config("env.backend=cuda", "cluster.num_generators=2", "cluster.generator_gpus=2",
                                 "cluster.learner_gpus=4", "cluster.colocate=true", "cluster.num_env_workers=2",
                                 "cluster.env_worker_gpus=1"))
    assert [s.bundles for s in plan.generators] == [[0, 1], [2, 3]]
    assert [s.bundles for s in plan.learner] == [[0], [1], [2], [3]]
    assert [s.bundles for s in plan.env_workers] == [[4], [5]]  # their own GPUs: env_colocate is off
    assert plan.totals() == {"GPU": 6.0, "CPU": 2 + 4 + 2}
    assert plan.bundles[1] == {"GPU": 1.0, "CPU": 1.0}  # a TP bundle holds only the colocated rank's CPU


@pytest.mark.parametrize("overrides, message", [
    (("env.backend=cuda",), "env.backend=cuda times kernels on a GPU: set cluster.env_worker_gpus=1"),
    (("cluster.env_worker_gpus=1",), "env.backend=cpp verifies and times on the CPU: set cluster.env_worker_gpus=0"),
    (("cluster.colocate=true", "cluster.learner_gpus=1"), "cluster.colocate=true shares GPUs"),
    (("cluster.num_generators=0",), "cluster.num_generators must be at least 1, got 0"),
    (("cluster.learner_cpus=0",), "cluster.learner_gpus and cluster.learner_cpus are both 0"),
])
def test_impossible_shapes_are_refused_naming_the_key(overrides, message):
    with pytest.raises(TopologyError) as err:
        plan_resources(config(*overrides))
    assert message in str(err.value)


def test_a_plan_larger_than_the_cluster_says_what_was_asked_what_exists_and_what_to_change():
    plan = plan_resources(config(files=("gpu-2xh200",)))
    with pytest.raises(TopologyError) as err:
        check_fits(plan, {"CPU": 2.0, "GPU": 1.0, "memory": 1e9}, [{"CPU": 2.0, "GPU": 1.0}])
    assert str(err.value) == (
        "the cluster cannot hold this topology: it asks for 2 GPU and 3 CPU; the cluster has 1 GPU and 2 CPU "
        "(ray.cluster_resources()); short of GPU and CPU\n"
        "  generators: 1 x 1 GPU + 1 CPU (cluster.num_generators=1, cluster.generator_gpus=1, cluster.generator_cpus=1)\n"
        "  env workers: 1 x 1 GPU + 1 CPU (cluster.num_env_workers=1, cluster.env_worker_gpus=1, cluster.env_worker_cpus=1)\n"
        "  learner: 1 rank(s) x 1 GPU + 1 CPU (cluster.learner_gpus=1, cluster.learner_cpus=1)\n"
        "  GPU sharing: cluster.colocate=false, cluster.env_colocate=true\n"
        "fix: lower the keys above, share GPUs (cluster.colocate=true, cluster.env_colocate=true), or give the cluster "
        "more (a local cluster: cluster.num_cpus, cluster.num_gpus; a Ray cluster: add nodes)"
    )


def test_a_bundle_bigger_than_every_node_is_refused_even_when_the_totals_fit():
    plan = plan_resources(config("cluster.generator_cpus=4"))  # 6 CPUs in all, 4 of them in one bundle
    with pytest.raises(TopologyError, match=r"bundle 0 \(0 GPU and 4 CPU, for generator 0\) fits on no single node; "
                                            r"the nodes have 0 GPU and 3 CPU; 0 GPU and 3 CPU \(ray.nodes\(\)\)"):
        check_fits(plan, {"CPU": 6.0}, [{"CPU": 3.0}, {"CPU": 3.0}])


# --------------------------------------------------------------------------- a real Ray cluster


NODE_8 = {"CPU": 128.0, "GPU": 8.0}


@pytest.mark.parametrize("shape, rollout_nodes", [("cluster-2x8", 1), ("cluster-4x8", 3)])
def test_multi_node_configs_keep_the_learner_on_its_node_and_rollout_on_the_others(shape, rollout_nodes):
    plan = plan_resources(config(files=("paper", shape)))
    learner = {b for s in plan.learner for b in s.bundles}
    assert len(plan.learner) == 8 and all(plan.labels[b] == {"cuda-agent/role": "learner"} for b in learner)
    rollout = {b for s in [*plan.generators, *plan.env_workers] for b in s.bundles}
    assert all(plan.labels[b] == {"cuda-agent/role": "rollout"} for b in rollout) and len(rollout) == 8 * rollout_nodes
    nodes = [NODE_8] * (1 + rollout_nodes)
    labels = [{"cuda-agent/role": "learner"}] + [{"cuda-agent/role": "rollout"}] * rollout_nodes
    check_fits(plan, {"CPU": 128.0 * len(nodes), "GPU": 8.0 * len(nodes)}, nodes, labels)
    with pytest.raises(TopologyError, match=r"(?s)needs a node labelled cuda-agent/role=learner.*cluster.learner_labels"):
        check_fits(plan, {"CPU": 128.0 * len(nodes), "GPU": 8.0 * len(nodes)}, nodes, [{"cuda-agent/role": "rollout"}] * len(nodes))


def test_roles_sharing_a_gpu_must_ask_for_the_same_node_labels():
    with pytest.raises(TopologyError, match=r"bundle 0 is shared by env_worker and generator.*cluster.env_worker_labels"):
        plan_resources(config("cluster.generator_labels.role=a", "cluster.env_worker_labels.role=b",
                              files=("gpu-2xh200",)))


def test_local_cluster_starts_with_the_configured_cpus_and_gpus(cluster):
    assert cluster["CPU"] == 2.0 and cluster["GPU"] == 2.0


def test_reserved_actors_land_on_their_gpus_sharing_where_the_plan_says(cluster):
    import ray

    @ray.remote
    class Probe:
        def gpus(self) -> list[str]:
            return [str(g) for g in ray.get_gpu_ids()]

    cfg = config("cluster.generator_cpus=0.5", "cluster.env_worker_cpus=0.5", "cluster.learner_cpus=0.5",
                 files=("gpu-2xh200",))
    plan = plan_resources(cfg)
    reservation = reserve(plan, timeout_s=60)
    try:
        probes = {s.role: Probe.options(**reservation.options(s)).remote() for s in plan.slots()}
        gpus = {role: ray.get(p.gpus.remote(), timeout=60) for role, p in probes.items()}
        assert len(gpus["generator"]) == len(gpus["learner"]) == 1
        assert gpus["env_worker"] == gpus["generator"], gpus  # env_colocate: the generator's GPU
        assert gpus["learner"] != gpus["generator"], gpus  # colocate off: a GPU of its own
        for p in probes.values():
            ray.kill(p)
    finally:
        reservation.release()


def test_env_workers_of_one_node_each_keep_to_their_own_share_of_its_cpus(cluster, tmp_path):
    """Real EnvWorkers in a scoring sweep's reservation: without shares, both timed on the same CPU."""
    import os

    import ray

    cfg = config("cluster.num_env_workers=2", "cluster.env_worker_cpus=0.5", files=("gpu-1xh100",))
    reservation = reserve(plan_resources(cfg, learner=False, with_generators=False), timeout_s=60)
    try:
        workers = start_env_workers(reservation, config("env.backend=cpp", f"env.work_dir={tmp_path}").env)
        cpus = [ray.get(w.health.remote(), timeout=120)["cpus"] for w in workers]
        mine = sorted(os.sched_getaffinity(0))
        assert cpus == [cpu_share(mine, 0, 2), cpu_share(mine, 1, 2)], cpus
        for w in workers:
            ray.kill(w)
    finally:
        reservation.release()


def test_a_topology_the_cluster_cannot_hold_fails_before_reserving_anything(cluster):
    import ray

    before = len(ray.util.placement_group_table())
    plan = plan_resources(config("cluster.num_generators=3"))  # 3 + 1 + 1 CPUs on a 2-CPU cluster
    with pytest.raises(TopologyError) as err:
        reserve(plan, timeout_s=5)
    assert str(err.value).startswith(
        "the cluster cannot hold this topology: it asks for 0 GPU and 5 CPU; the cluster has 2 GPU and 2 CPU "
        "(ray.cluster_resources()); short of CPU\n  generators: 3 x 1 CPU (cluster.num_generators=3,")
    assert len(ray.util.placement_group_table()) == before, "no placement group may be created for a refused plan"


def test_a_reservation_blocked_by_other_holders_times_out_and_frees_what_it_asked(cluster):
    import ray

    holder = reserve(plan_resources(config("cluster.generator_cpus=0.5", "cluster.env_worker_cpus=0.5",
                                           "cluster.learner_cpus=0.5")), timeout_s=60)
    try:
        plan = plan_resources(config("cluster.generator_cpus=1", "cluster.env_worker_cpus=0.5", "cluster.learner_cpus=0.5"))
        with pytest.raises(TopologyError, match=r"could not reserve it within 2 s: free now 2 GPU and 0.5 CPU"):
            reserve(plan, timeout_s=2)
    finally:
        holder.release()
    states = [pg["state"] for pg in ray.util.placement_group_table().values()]
    assert "PENDING" not in states and "CREATED" not in states, states


# --------------------------------------------------------------------------- weight sync transport


@pytest.mark.parametrize("overrides, expected", [
    ((), "object_store"),
    (("cluster.generator_gpus=1", "cluster.learner_gpus=1"), "nccl"),
    (("cluster.generator_gpus=1", "cluster.learner_gpus=1", "cluster.colocate=true"), "ipc"),
    (("cluster.generator_gpus=1", "cluster.learner_gpus=1", "cluster.weight_sync=object_store"), "object_store"),
    (("cluster.generator_gpus=1", "cluster.learner_gpus=2", "cluster.num_generators=2", "cluster.colocate=true"),
     "object_store"),
])
def test_auto_weight_sync_follows_the_topology(overrides, expected):
    from actors.weight_sync import resolve_transport

    assert resolve_transport(config(*overrides).cluster) == expected


@pytest.mark.parametrize("overrides, message", [
    (("cluster.weight_sync=nccl",), "needs GPUs for both learner and generators"),
    (("cluster.weight_sync=ipc", "cluster.generator_gpus=1", "cluster.learner_gpus=1"), "cluster.colocate=true"),
    (("cluster.weight_sync=nccl", "cluster.generator_gpus=1", "cluster.learner_gpus=1", "cluster.colocate=true"),
     "two processes on one GPU"),
])
def test_a_weight_sync_the_topology_cannot_do_is_refused_with_the_fix(overrides, message):
    from actors.weight_sync import resolve_transport

    with pytest.raises(ValueError, match=message):
        resolve_transport(config(*overrides).cluster)


def test_cpu_learner_ranks_get_a_slot_each():
    plan = plan_resources(config("cluster.learner_cpu_ranks=2"))
    assert [s.index for s in plan.learner] == [0, 1]
    with pytest.raises(TopologyError, match="learner_cpu_ranks"):
        plan_resources(config("cluster.learner_cpu_ranks=0"))
