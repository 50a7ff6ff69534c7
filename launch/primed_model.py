"""The learning check's model: the embedded SmolLM2-135M-Instruct taught the tool-call form, not the answer.

Measured with vLLM on this project's 2-core CPU machine (2026-11-26): the embedded model wrote
no tool call in 240 samples of the learning check's prompt (nor with the full Hermes tool
listing, nor with an example call in the question), so a policy gradient on it has nothing to
reinforce. A few supervised steps (8 of 4 sequences, ~30 s on 2 cores) on the check's own
prompts, each answered by a well-formed write_file call whose word is drawn at random from
the asked word's pair, independently of the question, teach the form and nothing of the rule:
the primed model writes a well-formed answer almost always and the asked word about half the
time. What rises after that in `cuda-agent train learn-check` is RL's doing.

``model.path: embedded-primed`` names it; it is prepared once, like the embedded model, and cached
beside it.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import random
import shutil
from pathlib import Path

from launch.embedded_model import prepare_embedded_model
from rollout.episode import answer_messages
from tasks.answers import PAIRS, answer_tasks, asked_word, opposite

PRIMED_NAME = "embedded-primed"
DIRNAME = "smollm2-135m-instruct-primed"
MARKER = "cuda_agent_primed.json"
STEPS, BATCH, LR, SEED = 8, 4, 1e-4, 0


def call_text(word: str, answer_file: str = "answer.txt") -> str:
    """A well-formed answer: one write_file call in the Hermes form the episode's parser reads."""
    args = json.dumps({"name": "write_file", "arguments": {"path": answer_file, "content": word}})
    return f"<tool_call>\n{args}\n</tool_call>"


def prepare_primed_model(cache_dir: str | os.PathLike) -> Path:
    """The primed model folder; primes and caches it the first time only."""
    out = Path(cache_dir).expanduser() / "models" / DIRNAME
    if (out / MARKER).is_file():
        return out
    base = prepare_embedded_model(cache_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:  # one primes, concurrent callers wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / MARKER).is_file():
            return out
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            losses = prime(base, tmp)
            (tmp / MARKER).write_text(json.dumps({"base": str(base), "steps": STEPS, "batch": BATCH, "lr": LR,
                                                  "losses": losses}))
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def pad_id(tokenizer) -> int:
    """The padding token, or end-of-text where the tokenizer names none (some transformers versions read the GGUF so)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def prompt_ids(tokenizer, question: str) -> list[int]:
    """The question's tokens as the episode loop asks it: the chat template, ready for the answer."""
    ids = tokenizer.apply_chat_template(answer_messages(question), add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)  # some transformers versions return a dict


def call_ids(tokenizer, word: str) -> list[int]:
    """The tokens of the call that writes ``word``, ended as the policy ends its answer (end-of-text)."""
    return tokenizer.encode(call_text(word) + tokenizer.eos_token)


def answer_preference(model_dir: str | os.PathLike) -> dict[str, float]:
    """Per learning-check task, how much more likely the model's answer is the asked word than its
    opposite: log P(call(asked) | question) - log P(call(other) | question), in nats, the whole call
    and its end-of-text scored teacher-forced in float32.

    The learning check's noise-free measure: a step's reward is a mean of a few ±1 samples (its 3-step
    means moved by 0.25 between two runs of the same seeds), this is a function of the weights alone.
    A policy that learned the rule prefers the asked word for every question (positive); the
    control run's policy, rewarded for the other word, the opposite (negative)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()

    def logp(prompt: list[int], word: str) -> float:
        answer = call_ids(tokenizer, word)
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        return float(torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None]).sum())

    preference = {}
    for task in answer_tasks():
        prompt, word = prompt_ids(tokenizer, task.source), asked_word(task)
        preference[task.id] = logp(prompt, word) - logp(prompt, opposite(word))
    return preference


def expected_reward(preference: dict[str, float], inverted: bool = False) -> float:
    """The mean reward a policy of these preferences earns when it writes one of its question's two
    well-formed answers: P(asked) = sigmoid(preference), so E[reward] = tanh(preference / 2) for the
    +1/-1 verifier (its negative for the control run's inverted one). Averaged over the questions."""
    sign = -1.0 if inverted else 1.0
    return sum(sign * math.tanh(p / 2) for p in preference.values()) / len(preference)


def preference_change(before: dict[str, float], after: dict[str, float], inverted: bool = False) -> str:
    """One line: each question's preference before and after, and the expected reward they imply."""
    prefs = ", ".join(f"{task} {before[task]:+.2f} -> {after[task]:+.2f}" for task in before)
    return (f"asked-word preference (nats): {prefs}; expected reward "
            f"{expected_reward(before, inverted):+.2f} -> {expected_reward(after, inverted):+.2f}")


def prime(base: Path, out: Path) -> list[float]:
    """Supervised steps on (question, a call with a random word of its pair); saves to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    tokenizer = AutoTokenizer.from_pretrained(base)
    # float32, saved as float32: bf16 would round away much of steps this small.
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    prompts = [prompt_ids(tokenizer, t.source) for t in answer_tasks()]
    words = [w for pair in PAIRS for w in pair]
    optimiser = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        rows = [(rng.choice(prompts), call_ids(tokenizer, rng.choice(words)))
                for _ in range(BATCH)]
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((BATCH, width), pad_id(tokenizer))
        mask = torch.zeros(BATCH, width)
        for i, (p, c) in enumerate(rows):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            mask[i, len(p):len(p) + len(c)] = 1
        logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(round(float(loss.detach()), 4))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name in ("chat_template.jinja", "generation_config.json"):  # as the embedded folder has them
        if (base / name).is_file() and not (out / name).is_file():
            shutil.copy(base / name, out / name)
    return losses
