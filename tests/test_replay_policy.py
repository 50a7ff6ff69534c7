"""ReplayPolicy: scripted turns played as a model would, tokenized with the tiny model's tokenizer."""
from __future__ import annotations

import json

import pytest
pytest_asyncio = pytest.importorskip("pytest_asyncio")  # not on the GPU machines; these tests are CPU ones

from rollout.policy import GenerationRequest, Policy, PolicyError
from rollout.replay_policy import ReplayExhausted, ReplayPolicy
from tests.chat_inputs import SCRIPT, generation_request


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@pytest.mark.asyncio
async def test_replay_plays_each_turn_tokenized_with_eos_and_zero_logprobs_then_refuses_more(tmp_path, tokenizer, suffix):
    path = tmp_path / f"script{suffix}"
    path.write_text(json.dumps(SCRIPT) if suffix == ".json" else "".join(f"- {json.dumps(t)}\n" for t in SCRIPT))
    policy = ReplayPolicy(path, tokenizer)
    assert isinstance(policy, Policy) and policy.token_level and policy.tokenizer is tokenizer

    for turn in SCRIPT:
        g = await policy.generate(generation_request([1, 2, 3], max_new_tokens=4096))
        expected = tokenizer(turn, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert g.text == turn and g.token_ids == expected, "replay must tokenize the turn exactly and end it with EOS"
        assert g.logprobs == [0.0] * len(expected) and g.finish_reason == "stop" and g.version == 0
        assert tokenizer.decode(g.token_ids, skip_special_tokens=True) == turn
    with pytest.raises(ReplayExhausted, match="has 2 turns and all were played"):
        await policy.generate(generation_request([1], max_new_tokens=4096))


@pytest.mark.asyncio
async def test_replay_cuts_a_turn_longer_than_max_new_tokens_like_a_model_would(tmp_path, tokenizer):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCRIPT[:1]))
    g = await ReplayPolicy(path, tokenizer).generate(generation_request([1], max_new_tokens=5))
    assert len(g.token_ids) == 5 and g.finish_reason == "length"
    assert g.text == tokenizer.decode(g.token_ids) and SCRIPT[0].startswith(g.text)


@pytest.mark.parametrize("content, message", [
    ("[]", "non-empty list of strings"),
    ('{"turns": ["a"]}', "non-empty list of strings"),
    ('["a", 3]', "non-empty list of strings"),
    ("[unclosed", "does not parse"),
])
def test_replay_rejects_a_malformed_script_naming_the_file(tmp_path, tokenizer, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(PolicyError, match=message) as info:
        ReplayPolicy(path, tokenizer)
    assert str(path) in str(info.value)
    with pytest.raises(PolicyError, match="No such file"):
        ReplayPolicy(tmp_path / "missing.json", tokenizer)


@pytest.mark.asyncio
async def test_replay_folder_plays_each_tasks_script_with_a_place_per_episode(tmp_path, tokenizer):
    """replay:DIR (eval sweeps): DIR/<task id>.json or DIR/<name>.yaml per task; episodes do not share a place."""
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "01_gelu.json").write_text(json.dumps(["gelu 1", "gelu 2"]))
    (tmp_path / "03_softmax.yaml").write_text("- softmax 1\n")
    policy = ReplayPolicy(tmp_path, tokenizer)

    def ask(task_id: str, episode_id: str):
        return policy.generate(GenerationRequest(prompt_ids=[1], messages=[], tools=[], max_new_tokens=64,
                                                 episode_id=episode_id, task_id=task_id))

    assert (await ask("level1/01_gelu", "a")).text == "gelu 1"
    assert (await ask("level1/01_gelu", "b")).text == "gelu 1", "a second episode starts at its own first turn"
    assert (await ask("level1/01_gelu", "a")).text == "gelu 2"
    assert (await ask("level1/03_softmax", "c")).text == "softmax 1", "found by the task's name alone"
    with pytest.raises(ReplayExhausted, match="has 1 turns"):
        await ask("level1/03_softmax", "c")
    with pytest.raises(PolicyError, match="no script for task 'level2/07_x'"):
        await ask("level2/07_x", "d")
