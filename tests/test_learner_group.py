"""Data-parallel learner ranks as Ray actors (CPU, gloo): two ranks given a batch between them
take the same step as one rank given all of it, also when their shares pack into different
numbers of micro-batches; and the batch is dealt so every rank gets work."""
from __future__ import annotations

import pytest
import torch

from actors.learner_group import deal, rank_shares

try:
    from tests.learner_toy import OBSERVATION, PROMPT, make_trajectory
except ImportError:  # tests/ is on sys.path itself under pytest's default import mode
    from learner_toy import OBSERVATION, PROMPT, make_trajectory


def test_deal_gives_every_rank_work_and_balances_tokens():
    shares = deal([100, 10, 7, 5, 1], 2)
    assert sorted(i for s in shares for i in s) == [0, 1, 2, 3, 4]
    assert shares == [[0], [1, 2, 3, 4]]
    assert deal([3, 3, 3], 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="stage.batch_episodes"):
        deal([1], 2)


def test_the_ranks_of_a_sequence_parallel_group_get_the_same_share():
    sizes = [100, 10, 7, 5, 1]
    assert rank_shares(sizes, 4, 2) == [[0], [0], [1, 2, 3, 4], [1, 2, 3, 4]]
    assert rank_shares(sizes, 2, 2) == [[0, 1, 2, 3, 4]] * 2
    assert rank_shares(sizes, 2) == deal(sizes, 2)
    from actors.learner_group import LearnerGroup

    with pytest.raises(ValueError, match="sequence_parallel_size=2 must be at least 1 and divide the learner's 3"):
        LearnerGroup({"learner": {"sequence_parallel_size": 2}}, [{}] * 3)


def _episodes() -> list:
    """Episodes of very different lengths, so that the ranks' shares pack differently."""
    g = torch.Generator().manual_seed(5)
    out = []
    for i, turns in enumerate([1, 6, 2, 1, 3, 1]):
        steps = [(torch.randint(3, 2000, (4,), generator=g).tolist(), [-7.0] * 4, 0) for _ in range(turns)]
        out.append(make_trajectory(f"dp{i}", PROMPT, steps, OBSERVATION, 3.0,
                                   texts=[f"t{i}{k}" for k in range(turns)]))
    return out


def _train(ray, cfg: dict, ranks: int, trajectories: list, stage_dir: str) -> tuple[float, dict[str, torch.Tensor]]:
    """One RFT step by ``ranks`` ranks: the global gradient norm and the weights after it."""
    import asyncio

    from actors.learner_group import LearnerGroup

    async def run() -> tuple[float, dict[str, torch.Tensor]]:
        group = LearnerGroup(cfg, [{"num_cpus": 1}] * ranks)
        await group.start()
        try:
            await group.call("setup", "rft", stage_dir, cfg["model"]["path"], None, 4)
            refs = [ray.put(t) for t in trajectories]
            result = await group.step(refs, [t.num_tokens for t in trajectories], [1.0] * len(trajectories))
            assert result.lost == []
            buckets = await group.call("export_weights", 64)
            return result.metrics["grad_norm_policy"], {name: tensor for ref in buckets for name, tensor in ray.get(ref)}
        finally:
            group.kill()

    return asyncio.run(run())


def test_two_ranks_take_the_step_one_rank_takes_on_the_whole_batch(tiny_model_dir, tmp_path):
    ray = pytest.importorskip("ray")
    from omegaconf import OmegaConf

    from configs.schema import Config

    cfg = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(Config), {
        "model": {"path": str(tiny_model_dir)},
        "learner": {"lr": 1e-2, "warmup_steps": 0, "lr_schedule": "constant", "grad_checkpointing": False,
                    "micro_batch_tokens": 96, "rft": {"lr": 1e-2}}}), enum_to_str=True)
    trajectories = _episodes()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        norm_two, two = _train(ray, cfg, 2, trajectories, str(tmp_path / "two"))
        norm_one, one = _train(ray, cfg, 1, trajectories, str(tmp_path / "one"))
    finally:
        ray.shutdown()
    from safetensors.torch import load_file

    # The gradient norm catches a wrong scale (Adam's update would not: it divides scale out).
    assert norm_two == pytest.approx(norm_one, rel=1e-4) and norm_one > 0
    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    assert two.keys() == one.keys()
    moved = [n for n in one if n in initial and not torch.allclose(one[n], initial[n])]
    assert moved, "the step changed no weight: the comparison would prove nothing"
    # Adam's step is about lr (1e-2) per element whatever the gradient's size, so summation-order
    # noise in a gradient that is ~0 can flip an element's step; a wrong share moves many.
    diffs = torch.cat([(two[n] - one[n]).abs().flatten() for n in one])
    assert float(diffs.max()) < 2e-3, float(diffs.max())
    assert float((diffs > 1e-5).float().mean()) < 1e-3, float((diffs > 1e-5).float().mean())


def test_trajectories_lost_with_their_generator_are_left_out_and_the_rest_dealt_again(tiny_model_dir, tmp_path):
    """The ranks are the only ones to fetch a batch's trajectories (the driver reads metas), so they
    find the lost ones: here a whole rank's share, reported by their positions, and the step trains
    both ranks on the other four, dealt again (a rank with nothing would hang the other's step)."""
    ray = pytest.importorskip("ray")
    import asyncio
    import time

    from omegaconf import OmegaConf

    from actors.learner_group import LearnerGroup
    from configs.schema import Config

    cfg = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(Config), {
        "model": {"path": str(tiny_model_dir)},
        "learner": {"grad_checkpointing": False, "micro_batch_tokens": 96}}), enum_to_str=True)
    trajectories = _episodes()
    sizes = [t.num_tokens for t in trajectories]
    lost = deal(sizes, 2)[0]  # rank 0's whole share

    @ray.remote(num_cpus=0)
    class Owner:  # a generator's part: its objects live as long as it does
        def put(self, values):
            return [ray.put(v) for v in values]  # in a list: the references themselves come back

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        owner = Owner.remote()
        doomed = dict(zip(lost, ray.get(owner.put.remote([trajectories[i] for i in lost]))))
        ray.kill(owner)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the store frees them a second or two after the kill
            try:
                ray.get(list(doomed.values()), timeout=10)
                time.sleep(0.2)
            except ray.exceptions.ObjectLostError:
                break
        refs = [doomed[i] if i in doomed else ray.put(t) for i, t in enumerate(trajectories)]

        async def run():
            group = LearnerGroup(cfg, [{"num_cpus": 1}] * 2)
            await group.start()
            try:
                await group.call("setup", "rft", str(tmp_path / "stage"), cfg["model"]["path"], None, 4)
                return await group.step(refs, sizes, [1.0] * len(refs))
            finally:
                group.kill()

        result = asyncio.run(run())
    finally:
        ray.shutdown()
    assert result.lost == sorted(lost)
    assert result.metrics["tokens"] == sum(s for i, s in enumerate(sizes) if i not in lost), result.metrics
