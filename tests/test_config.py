"""Config loading: composition, overrides, and errors that name the key, the type and the fix."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import MISSING, OmegaConf

from configs.document import field_comments, render
from configs.load import ConfigError, load_config, packaged_config_dir, valid_keys
from configs.schema import Backend, Config


def test_defaults_match_the_schema():
    cfg = load_config()
    assert cfg.rollout.max_turns == 150
    assert cfg.eval.max_turns == 200
    assert cfg.env.backend == Backend.cpp
    assert cfg.env.reward.faster_than_compile == 3.0


def test_file_then_overrides_compose_in_order(tmp_path: Path):
    stage = tmp_path / "stage.yaml"
    stage.write_text("rollout:\n  max_turns: 20\n  temperature: 0.7\nenv:\n  backend: cuda\n")
    cfg = load_config([str(stage)], ["rollout.max_turns=7"])
    assert cfg.rollout.max_turns == 7  # the command line wins over the file
    assert cfg.rollout.temperature == 0.7  # the file wins over the defaults
    assert cfg.env.backend == Backend.cuda


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["rollout.max_turn=3"])
    message = str(err.value)
    assert "rollout.max_turn" in message and "did you mean 'rollout.max_turns'" in message
    assert "command line" in message


def test_unknown_key_in_a_file_names_the_file(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner:\n  lr_rate: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config([str(bad)])
    assert str(bad) in str(err.value) and "learner.lr_rate" in str(err.value)


def test_wrong_type_names_the_expected_type():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["rollout.max_turns=many"])
    assert "rollout.max_turns" in str(err.value) and "expected int" in str(err.value)


def test_bad_enum_value_lists_the_choices():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["env.backend=opencl"])
    assert "one of cpp, cuda" in str(err.value)


@pytest.mark.parametrize("override, choices", [("env.backend=rocm", "cpp, cuda"),
                                               ("stage.name=ppo", "single_turn_ppo, rft, value_pretrain, agentic_ppo, recipe")])
def test_bad_enum_value_names_the_value_and_ends_on_the_choices(override: str, choices: str):
    # OmegaConf's own text ("expected one of [CPP, CUDA]") came after ours, its list in brackets
    # that the terminal then read as markup: "... expected one of " and nothing after it.
    key, value = override.split("=")
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert str(err.value) == f"command line: bad value {value!r} for {key!r}: expected one of {choices}"


@pytest.mark.parametrize("text, section, given", [("rollout: 5\n", "rollout", "given 5"),
                                                  ("rollout:\n", "rollout", "is empty"),
                                                  ("learner:\n  rft: yes\n", "learner.rft", "given True")])
def test_a_section_given_a_value_is_named_with_the_fix(tmp_path: Path, text: str, section: str, given: str):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config([str(bad)])
    message = str(err.value)
    assert message.startswith(f"{bad}: {section!r} ") and given in message, message
    assert "None" not in message and "subclass" not in message, message  # OmegaConf's "bad value for None"
    assert f"{section}." in message, f"an example key of the section: {message}"
    with pytest.raises(ConfigError, match=r"^command line: 'rollout' is a section, not a value \(given 5\)"):
        load_config(overrides=["rollout=5"])


@dataclass
class _NeedsPolicy:
    policy: str = MISSING  # a schema field without a default must be set by the user


def test_missing_required_value_fails_at_load():
    with pytest.raises(ConfigError, match="required config value.*policy"):
        load_config(schema=_NeedsPolicy)
    assert load_config(overrides=["policy=openai:http://127.0.0.1:1"], schema=_NeedsPolicy).policy.startswith("openai")
    assert OmegaConf.is_missing(load_config(schema=_NeedsPolicy, require_complete=False), "policy")


def test_override_without_equals_is_explained():
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(overrides=["rollout.max_turns"])


def test_unknown_file_lists_the_shipped_configs():
    with pytest.raises(ConfigError, match="shipped configs:"):
        load_config(["no-such-config"])


def test_every_schema_field_has_a_comment():
    undocumented = [k for k, v in field_comments().items() if not v]
    assert not undocumented, f"fields without a comment in configs/schema.py: {undocumented}"


def test_shipped_defaults_yaml_is_generated_from_the_schema():
    shipped = (packaged_config_dir() / "defaults.yaml").read_text()
    assert shipped.split("\n", 1)[1] == render(load_config()), (
        "configs/defaults.yaml is stale: regenerate with `cuda-agent config defaults > configs/defaults.yaml`"
    )
    assert OmegaConf.to_container(OmegaConf.load(packaged_config_dir() / "defaults.yaml")) == OmegaConf.to_container(
        OmegaConf.structured(Config), enum_to_str=True
    )


@pytest.mark.parametrize("name", sorted(p.name for p in packaged_config_dir().glob("*.yaml")))
def test_every_shipped_config_loads_and_comments_every_key(name: str):
    path = packaged_config_dir() / name
    load_config([str(path)])
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and ":" in stripped and not stripped.startswith("-"):
            assert "#" in stripped, f"{name}:{lineno} has no comment: {line!r}"


def test_valid_keys_cover_nested_sections():
    assert "env.reward.compile_margin" in valid_keys()


def test_the_paper_config_ships_the_papers_reported_settings():
    """`cuda-agent config show paper`: the settings the CUDA Agent paper reports, on the defaults."""
    cfg = load_config(["paper"])
    learner = cfg.learner
    assert (learner.clip_ratio, learner.clip_ratio_high) == (0.2, 0.28), "asymmetric clip-higher"
    assert (learner.lr, learner.critic_lr) == (3.0e-6, 6.0e-6)
    assert (learner.gae_lambda, learner.gamma) == (0.95, 1.0)
    assert cfg.stage.batch_episodes >= 128, "a large batch of episodes per step"
    assert (cfg.rollout.max_turns, cfg.rollout.max_context_tokens, cfg.eval.max_turns) == (150, 131072, 200)
    assert str(cfg.stage.name.value) == "recipe"
    text = (packaged_config_dir() / "paper.yaml").read_text()
    for line in text.splitlines():
        body, _, comment = line.partition("  # ")
        if line.startswith(" ") and ":" in body and body.split(":", 1)[1].strip():  # a value, not a section
            assert comment.startswith(("paper", "ours")), f"paper.yaml must say where each value comes from: {line!r}"
