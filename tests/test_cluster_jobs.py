"""Cluster jobs on a real two-node Ray cluster on this machine (tests/two_node_cluster.py).

The second node cannot see the folder the run writes to (a tmpfs over it in its own mount
namespace), so what these tests read on the driver's node came through the object store:
- the run storage: a folder fetched by a node that does not see it, brought up to date, written
  back, removed; storage.mode=shared refused where a node does not see the run folder;
- a training job submitted through the Jobs API, its generator on one node and its learner on
  the other (cluster.*_labels), its model folder hidden from the learner's node too; then
  `jobs logs`, `jobs stop` after the first checkpoint, and the same job submitted again
  resuming from that checkpoint;
- slow: `make demo`'s recipe (SmolLM2, four stages) as a job with its generator on the node
  that does not see the run folder, so each stage's export reaches the engine through the
  object store.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from configs.load import load_config
from protocol.records import read_records

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare: the second node hides the run folder in a mount namespace")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray
    from ray._private.authentication_test_utils import reset_auth_token_state

    from tests.two_node_cluster import AUTH_MODE, TwoNodeCluster

    assert not ray.is_initialized(), "an earlier test left Ray running"
    base = tmp_path_factory.mktemp("two-nodes")
    nodes = TwoNodeCluster(base / "storage").start()
    auth = os.environ.get("RAY_AUTH_MODE")
    # As the cluster's nodes run (tests/two_node_cluster.py). Ray reads the mode into its config
    # once per process, so the config is read again (Ray's own test helper) for this and after it.
    os.environ["RAY_AUTH_MODE"] = AUTH_MODE
    reset_auth_token_state()
    try:
        ray.init(address=nodes.address, include_dashboard=False, configure_logging=False)
        yield nodes
    finally:
        ray.shutdown()
        nodes.stop()
        os.environ.pop("RAY_AUTH_MODE") if auth is None else os.environ.update(RAY_AUTH_MODE=auth)
        reset_auth_token_state()


def node_of(role: str) -> str:
    import ray

    return next(n["NodeID"] for n in ray.nodes() if n.get("Alive") and (n.get("Labels") or {}).get("cuda-agent/role") == role)


def on_node(node: str):
    """Ray options that run a task or actor on that node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def storage_for(cluster, tmp_name: str, mode: str = "auto"):
    from actors.storage import RunStorage

    cfg = load_config([], [f"storage.mode={mode}", f"storage.node_dir={cluster.hidden.parent / 'copies'}", "storage.chunk_mb=1"])
    return RunStorage.for_run(cfg.storage, cluster.hidden / tmp_name)


def test_a_node_that_does_not_see_the_run_folder_reads_and_writes_it_through_the_object_store(cluster):
    import ray

    storage = storage_for(cluster, "run-a")
    export = Path(storage.run_dir) / "export"
    (export / "sub").mkdir(parents=True)
    big = os.urandom(3 * 2**20 + 12345)  # several 1 MB chunks and a tail
    (export / "weights.bin").write_bytes(big)
    (export / "sub" / "config.json").write_text('{"a": 1}')
    (export / "gone.txt").write_text("deleted before the second fetch")

    @ray.remote
    def far_side(storage, export: str, step: int) -> dict:
        from pathlib import Path

        path = Path(export)
        seen = {"sees_run_dir": any(Path(storage.run_dir).glob("*")), "in_place": storage.place(path) == path}
        copy = storage.fetch(path)
        seen["files"] = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
        seen["weights"] = (copy / "weights.bin").read_bytes()
        if step == 1:  # write a checkpoint-like folder and send it
            out = storage.place(path.parent / "written")
            (out / "inner").mkdir(parents=True, exist_ok=True)
            (out / "inner" / "shard.pt").write_bytes(b"x" * 1_500_000)
            (out / "empty").write_bytes(b"")
            storage.publish(path.parent / "written")
        return seen

    first = ray.get(far_side.options(**on_node(node_of("learner"))).remote(storage, str(export), 1))
    assert first["sees_run_dir"] is False and first["in_place"] is False, "the second node must not see the run folder"
    assert first["files"] == ["gone.txt", "sub/config.json", "weights.bin"] and first["weights"] == big
    written = Path(storage.run_dir) / "written"
    assert (written / "inner" / "shard.pt").read_bytes() == b"x" * 1_500_000 and (written / "empty").read_bytes() == b""

    (export / "gone.txt").unlink()
    changed = big[::-1]
    (export / "weights.bin").write_bytes(changed)
    second = ray.get(far_side.options(**on_node(node_of("learner"))).remote(storage, str(export), 2))
    assert second["files"] == ["sub/config.json", "weights.bin"] and second["weights"] == changed

    @ray.remote
    def remove(storage, path: str) -> bool:
        storage.remove(path)
        return storage.place(path).exists()

    assert ray.get(remove.options(**on_node(node_of("learner"))).remote(storage, str(written))) is False
    assert not written.exists()
    here = ray.get(far_side.options(**on_node(node_of("rollout"))).remote(storage, str(export), 2))
    assert here["in_place"] is True and here["sees_run_dir"] is True, "the driver's node uses the run folder in place"
    storage.close()


def test_shared_mode_refuses_a_node_that_does_not_see_the_run_folder(cluster):
    from actors.storage import StorageError

    with pytest.raises(StorageError, match=r"storage.mode=shared.*set storage.mode=auto"):
        storage_for(cluster, "run-b", mode="shared")


def test_object_store_mode_sends_even_what_a_node_could_see(cluster, tmp_path):
    import ray

    from actors.storage import RunStorage

    cfg = load_config([], ["storage.mode=object_store", f"storage.node_dir={tmp_path / 'copies'}"])
    storage = RunStorage.for_run(cfg.storage, tmp_path / "visible-run")  # both nodes see tmp_path
    (tmp_path / "visible-run" / "f.txt").write_text("hello")

    @ray.remote
    def where(storage, path: str) -> tuple[bool, str]:
        return storage.place(path) == path, storage.fetch(path).read_text()

    in_place, text = ray.get(where.options(**on_node(node_of("learner"))).remote(storage, str(tmp_path / "visible-run" / "f.txt")))
    assert in_place is False and text == "hello"


# --------------------------------------------------------------------------- a training job


@pytest.mark.slow  # 181 s on 2 cores; the storage tests keep both nodes in the default suite
def test_a_training_job_spans_both_nodes_and_resumes_after_jobs_stop(cluster, tiny_model_dir, capsys):
    from launch import jobs
    from launch.cli import main

    model = cluster.hidden / "models" / "tiny"  # on the driver's disk only: the learner's node must fetch it
    shutil.copytree(tiny_model_dir, model)
    copies = cluster.hidden.parent / "job-copies"
    items = ["cpu-demo", f"storage.root={cluster.hidden}", "logging.out_dir=runs/job", f"storage.node_dir={copies}",
             f"model.path={model}", "stage.name=single_turn_ppo", "stage.steps=2", "stage.checkpoint_every=1",
             "stage.keep_checkpoints=1", "rollout.max_new_tokens=24", "rollout.max_context_tokens=4096",
             "rollout.kv_cache_gib=0.25", "logging.progress=false", f"job.python={sys.executable}",
             "cluster.generator_labels.cuda-agent/role=rollout", "cluster.env_worker_labels.cuda-agent/role=rollout",
             "cluster.learner_labels.cuda-agent/role=learner"]
    run = cluster.hidden / "runs" / "job"
    checkpoints = run / "single_turn_ppo" / "checkpoints"

    first, run_dir = jobs.submit("train", items, cluster.dashboard)
    assert Path(run_dir) == run
    deadline = time.monotonic() + 600
    while not (checkpoints / "latest").exists():
        assert jobs.client(cluster.dashboard).get_job_status(first).value in ("PENDING", "RUNNING"), \
            jobs.client(cluster.dashboard).get_job_logs(first)[-3000:]
        assert time.monotonic() < deadline, "no checkpoint reached the run folder"
        time.sleep(1.0)
    assert main(["jobs", "stop", first, "--address", cluster.dashboard, "--wait", "120"]) == 0
    assert "STOPPED" in capsys.readouterr().out
    assert main(["jobs", "logs", first, "--address", cluster.dashboard]) == 0
    first_log = capsys.readouterr().out
    assert "interrupted" in first_log, first_log[-3000:]
    stopped_at = json.loads((checkpoints / (checkpoints / "latest").read_text().strip() / "state.json").read_text())["step"]
    assert stopped_at >= 1

    second, _ = jobs.submit("train", items, cluster.dashboard)
    assert jobs.wait(second, cluster.dashboard, timeout_s=600) == "SUCCEEDED", jobs.client(cluster.dashboard).get_job_logs(second)[-3000:]
    assert main(["jobs", "list", "--address", cluster.dashboard, "--json"]) == 0
    listed = {j["id"]: j for j in json.loads(capsys.readouterr().out)}
    assert listed[first]["status"] == "STOPPED" and listed[second]["status"] == "SUCCEEDED"
    assert listed[second]["run_dir"] == str(run)

    metrics = read_records(run / "metrics.jsonl")
    assert [r["step"] for r in metrics][-1] == 2 and {r["step"] for r in metrics} == {1, 2}
    recipe = json.loads((run / "recipe.json").read_text())
    assert recipe["done"] == ["single_turn_ppo"]
    assert (Path(recipe["policy"]) / "config.json").exists() and str(run) in recipe["policy"], \
        "the learner's export, written on the other node, is in the run folder on the driver's node"
    assert not checkpoints.exists(), "a finished stage's checkpoints are removed from the run folder"
    learner_copies = [p for p in copies.glob("*/") if p.name[:12] == node_of("learner")[:12]]
    assert learner_copies and any(learner_copies[0].rglob("tokenizer*")), "the learner's node fetched the model"


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the job's own limit (1800 s) and the cluster's start, past pytest's default 900 s
def test_the_cpu_demo_recipe_as_a_job_with_its_generator_on_the_other_node(cluster):
    from launch import jobs

    copies = cluster.hidden.parent / "demo-copies"
    items = ["cpu-demo", f"storage.root={cluster.hidden}", "logging.out_dir=runs/demo", f"storage.node_dir={copies}",
             "logging.progress=false", f"job.python={sys.executable}",
             "cluster.generator_labels.cluster-test/node=second",  # the node without the run folder
             "cluster.env_worker_labels.cluster-test/node=head", "cluster.learner_labels.cluster-test/node=head"]
    started = time.monotonic()
    job, run_dir = jobs.submit("train", items, cluster.dashboard)
    status = jobs.wait(job, cluster.dashboard, timeout_s=1800)
    log = jobs.client(cluster.dashboard).get_job_logs(job)
    print(f"[timing] cpu-demo recipe as a two-node job: {time.monotonic() - started:.0f} s")
    assert status == "SUCCEEDED", log[-3000:]
    recipe = json.loads((Path(run_dir) / "recipe.json").read_text())
    assert recipe["done"] == ["single_turn_ppo", "rft", "value_pretrain", "agentic_ppo"]
    second = next(p for p in copies.glob("*/") if p.name[:12] == node_of("learner")[:12])
    fetched = {p.parent.parent.name for p in second.rglob("export/policy/config.json")}
    assert "single_turn_ppo" in fetched, f"no stage export reached the generator's node: {sorted(second.rglob('*'))[:20]}"


# --------------------------------------------------------------------------- submit's config, no cluster


def test_submit_makes_the_config_a_clusters_and_the_run_folder_absolute(tmp_path, monkeypatch):
    from launch.jobs import cluster_config, job_argv

    monkeypatch.chdir(tmp_path)
    cfg = cluster_config(["cpu-demo"], ["logging.out_dir=runs/x"])
    assert cfg.cluster.address == "auto" and cfg.cluster.num_cpus is None  # cpu-demo sizes a local cluster: not a job's
    assert cfg.storage.root == str(tmp_path) and cfg.logging.out_dir == str(tmp_path / "runs" / "x")
    cfg = cluster_config([], ["storage.root=/data/runs", "eval.out_dir=sweep"])
    assert cfg.eval.out_dir == "/data/runs/sweep"
    assert job_argv("eval", "vllm:/m", ["a", "b"], None, "out", cfg) == \
        ["eval", "--policy", "vllm:/m", "--out", "/data/runs/out", "--tasks", str(tmp_path / "a"), str(tmp_path / "b")]
    assert job_argv("train", None, None, None, None, cfg) == ["train"]


def test_submit_refuses_eval_options_on_train_and_a_bad_key_before_reaching_any_cluster(capsys):
    from launch.cli import main

    assert main(["submit", "train", "cpu-demo", "--policy", "vllm:embedded", "--address", "http://127.0.0.1:9"]) == 2
    assert "options of eval, not of train" in capsys.readouterr().err
    assert main(["submit", "cpu-demo", "stage.stepz=3", "--address", "http://127.0.0.1:9"]) == 2
    assert "did you mean 'stage.steps'" in capsys.readouterr().err


def test_jobs_commands_without_a_cluster_say_how_to_reach_one(capsys):
    from launch.cli import main

    assert main(["jobs", "list", "--address", "http://127.0.0.1:9"]) == 2
    assert "no Ray Jobs API at http://127.0.0.1:9" in capsys.readouterr().err
