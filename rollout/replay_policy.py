"""ReplayPolicy: plays scripted assistant turns as a token-level policy.

The script is a JSON or YAML file holding a list of strings, each the full assistant text of
one turn (tool calls included, e.g. ``<tool_call>{"name": "compile", ...}</tool_call>``). Each
generate() call returns the next turn: its text tokenized with the policy's tokenizer, then
the tokenizer's EOS id, as a model ending its turn would (a turn longer than the request's
max_new_tokens is cut there, finish "length", as a model's would be). It lets tests and
``cuda-agent episode --policy replay:FILE`` drive the whole loop and the real environment
with a known solution, without a model.

A folder instead of a file holds one script per task, for sweeps (``cuda-agent eval --policy
replay:DIR``): ``DIR/<task id>.json`` (``DIR/level1/01_gelu.json``) or ``DIR/<name>.json``
(``DIR/01_gelu.json``), YAML alike. Each episode keeps its own place in its script (requests
carry the episode's id), so concurrent episodes replay independently.

Logprobs are 0.0 for every token: a script is not a sampling distribution, so replay
trajectories carry no behaviour-policy probabilities and must not feed PPO's importance
ratio (they may feed RFT, which needs none).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rollout.policy import Generation, GenerationRequest, PolicyError


class ReplayExhausted(PolicyError):
    """The episode asked for more turns than the script has."""


def load_script(path: str | Path) -> list[str]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(f"replay script {path}: {e.strerror or e}") from e
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            turns = yaml.safe_load(text)
        else:
            turns = json.loads(text)
    except Exception as e:  # json.JSONDecodeError, yaml.YAMLError
        raise PolicyError(f"replay script {path} does not parse: {e}") from e
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise PolicyError(f"replay script {path} must hold a non-empty list of strings (one assistant turn each)")
    return turns


SUFFIXES = (".json", ".yaml", ".yml")


def script_for_task(folder: Path, task_id: str) -> Path:
    """The script of ``task_id`` in a folder of per-task scripts, or PolicyError naming what was tried."""
    name = task_id.rsplit("/", 1)[-1]
    tried = [folder / f"{stem}{suffix}" for stem in (task_id, name) for suffix in SUFFIXES]
    for path in tried:
        if path.is_file():
            return path
    raise PolicyError(f"replay folder {folder} has no script for task {task_id!r}: tried "
                      + ", ".join(str(p.relative_to(folder)) for p in tried))


class ReplayPolicy:
    token_level = True

    def __init__(self, file: str | Path, tokenizer: Any, version: int = 0):
        if tokenizer.eos_token_id is None:
            raise PolicyError("ReplayPolicy needs a tokenizer with an EOS token (it ends each turn with it)")
        self.file = str(file)
        self.folder = Path(file) if Path(file).is_dir() else None
        self.turns = None if self.folder else load_script(file)
        self.scripts: dict[str, tuple[str, list[str]]] = {}  # task id -> (file, turns), folder form
        self.tokenizer = tokenizer
        self.version = version
        self.positions: dict[str, int] = {}  # episode id -> turns played

    @property
    def next_turn(self) -> int:
        """Turns played by requests that name no episode (one script, played straight through)."""
        return self.positions.get("", 0)

    def _script(self, task_id: str) -> tuple[str, list[str]]:
        if self.folder is None:
            return self.file, self.turns
        if task_id not in self.scripts:
            path = script_for_task(self.folder, task_id)
            self.scripts[task_id] = (str(path), load_script(path))
        return self.scripts[task_id]

    async def generate(self, request: GenerationRequest) -> Generation:
        file, turns = self._script(request.task_id)
        played = self.positions.get(request.episode_id, 0)
        if played >= len(turns):
            raise ReplayExhausted(f"replay script {file} has {len(turns)} turns and all were played; "
                                  f"the episode asked for turn {played + 1}")
        started = time.perf_counter()
        text = turns[played]
        self.positions[request.episode_id] = played + 1
        token_ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
        finish = "stop"
        if len(token_ids) > request.max_new_tokens:
            # A model cannot write past its budget, and the loop's context accounting relies on that.
            token_ids = token_ids[: request.max_new_tokens]
            text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
            finish = "length"
        return Generation(text=text, token_ids=token_ids, logprobs=[0.0] * len(token_ids), finish_reason=finish,
                          version=self.version, gen_s=time.perf_counter() - started)

    async def close(self) -> None:
        pass
