"""Ray on this machine: a local cluster runs a stateful actor and round-trips msgpack data."""
from __future__ import annotations

import os
import time

from tests.chat_inputs import report_timing


def test_ray_local_cluster_runs_a_stateful_actor_and_round_trips_msgpack_data(monkeypatch, capsys):
    import msgpack
    import ray

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    trajectory = {
        "task_id": "level1/03_softmax",
        "policy_version": 3,
        "tokens": list(range(64)),
        "logprobs": [-0.25] * 64,
        "loss_mask": [0] * 16 + [1] * 48,
        "turns": [{"start": 16, "end": 40, "reward": 0.0}, {"start": 40, "end": 64, "reward": 1.0}],
        "meta": {"backend": "cpp", "speedup": 1.25, "ok": True, "note": None},
    }

    @ray.remote(num_cpus=0)
    class Buffer:
        def __init__(self):
            self.items: list[dict] = []

        def add(self, item: dict) -> int:
            self.items.append(item)
            return len(self.items)

        def total_tokens(self) -> int:
            return sum(len(i["tokens"]) for i in self.items)

        def pid(self) -> int:
            return os.getpid()

    started = time.perf_counter()
    assert not ray.is_initialized(), "an earlier test left Ray running"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=100 * 1024**2)
    try:
        init_s = time.perf_counter() - started
        buffer = Buffer.remote()
        assert ray.get(buffer.pid.remote()) != os.getpid()  # a real worker process
        # State persists across calls; an ObjectRef argument is resolved in the actor.
        ref = ray.put(trajectory)
        assert ray.get([buffer.add.remote(ref) for _ in range(3)]) == [1, 2, 3]
        assert ray.get(buffer.total_tokens.remote()) == 3 * 64
        assert ray.get(ref) == trajectory
        # The plain-data contract between components: msgpack bytes through the object store.
        packed = msgpack.packb(trajectory)
        assert msgpack.unpackb(ray.get(ray.put(packed))) == trajectory
        report_timing(capsys, f"Ray: init {init_s:.1f}s, whole test {time.perf_counter() - started:.1f}s")
    finally:
        ray.shutdown()
    assert not ray.is_initialized()
