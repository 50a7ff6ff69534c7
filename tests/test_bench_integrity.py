"""scripts/bench_integrity.py's --env, which the GPU machines (no omegaconf) type by EnvConfig's fields themselves."""
from __future__ import annotations

import pytest

from configs.schema import RuleSet
from scripts.bench_integrity import env_settings


def test_env_settings_are_typed_by_the_env_configs_fields():
    assert env_settings(["keep_cpus_awake=true", "repetitions=30", "rules=paper", "code_sampling=False"]) == {
        "keep_cpus_awake": True, "repetitions": 30, "rules": RuleSet.paper, "code_sampling": False}


@pytest.mark.parametrize("pair, named", [
    ("no_such_field=1", "--env no_such_field=1: expected KEY=VALUE"),
    ("keep_cpus_awake", "--env keep_cpus_awake: expected KEY=VALUE"),
    ("repetitions=many", "--env repetitions=many: not a valid int"),
    ("rules=lenient", "--env rules=lenient: not a valid RuleSet"),
    ("keep_cpus_awake=yes", "--env keep_cpus_awake=yes: not a valid bool"),
    ("reward=1", "--env reward: a RewardConfig cannot be set here"),
])
def test_a_bad_env_setting_names_itself(pair, named):
    with pytest.raises(SystemExit, match=named):
        env_settings([pair])
