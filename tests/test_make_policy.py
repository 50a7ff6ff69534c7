"""make_policy: policy specs and what it refuses; the launcher resolves 'embedded' (launch/embedded_model.py)."""
from __future__ import annotations

import json

import pytest
pytest_asyncio = pytest.importorskip("pytest_asyncio")  # not on the GPU machines; these tests are CPU ones
from omegaconf import OmegaConf

from rollout.policy import PolicyError, make_policy
from rollout.replay_policy import ReplayPolicy
from tests.chat_inputs import SCRIPT, generation_request, rollout_config


@pytest.mark.parametrize("spec, message", [
    ("nonsense", "is not KIND:TARGET"),
    ("vllm:", "is not KIND:TARGET"),
    ("gguf:/models/x", "unknown kind 'gguf'"),
    ("openai:localhost:8000/v1", "must start with http"),
    ("vllm:/nonexistent/model", "is not a folder"),
])
def test_make_policy_rejects_bad_specs_saying_which_forms_work(spec, message):
    with pytest.raises(PolicyError, match=message):
        make_policy(spec, rollout_config())


@pytest.mark.asyncio
async def test_make_policy_builds_replay_and_openai_policies_from_specs(tmp_path, tokenizer):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCRIPT))
    replay = make_policy(f"replay:{path}", rollout_config(), tokenizer=tokenizer)
    assert isinstance(replay, ReplayPolicy) and (await replay.generate(generation_request([1], 4096))).text == SCRIPT[0]

    from rollout.openai_policy import OpenAIPolicy

    remote = make_policy("openai:http://127.0.0.1:9/v1#my-model", rollout_config(openai_retries=2, tool_call_format="openai"))
    assert isinstance(remote, OpenAIPolicy) and not remote.token_level and remote.tokenizer is None
    assert (remote.base_url, remote.model, remote.retries, remote.function_calling) == ("http://127.0.0.1:9/v1", "my-model", 2, True)
    assert make_policy("openai:https://api.example.com/v1", rollout_config()).model is None  # asked from /models later


def test_make_policy_takes_model_folders_and_the_launcher_resolves_the_rest(tmp_path, tiny_model_dir):
    from launch.embedded_model import ModelPrepareError, resolve_policy

    with pytest.raises(PolicyError, match="'embedded' is resolved to one by the launcher"):
        make_policy("vllm:embedded", rollout_config())  # the rollout layer never prepares a model itself
    cfg = rollout_config()  # model.path=embedded: an openai policy does not read it, so nothing is converted
    assert resolve_policy("openai:http://127.0.0.1:9/v1", cfg) == ("openai:http://127.0.0.1:9/v1", cfg)
    assert resolve_policy(f"vllm:{tiny_model_dir}", cfg) == (f"vllm:{tiny_model_dir}", cfg)
    script = tmp_path / "s.json"
    script.write_text(json.dumps(SCRIPT))
    spec, resolved = resolve_policy(f"replay:{script}", OmegaConf.merge(cfg, {"model": {"path": str(tiny_model_dir)}}))
    assert spec == f"replay:{script}" and resolved.model.path == str(tiny_model_dir)
    assert isinstance(make_policy(spec, resolved), ReplayPolicy)  # its tokenizer loaded from the folder
    with pytest.raises(ModelPrepareError, match="is not a folder"):
        resolve_policy(f"replay:{script}", OmegaConf.merge(cfg, {"model": {"path": str(tmp_path / "none")}}))
