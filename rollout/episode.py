"""One agent episode: the ReAct loop from the task to a Trajectory.

Each turn the policy generates until it ends its turn; the tool calls in its output run against
the workspace and the environment; their observations are appended; and so on until the agent
submits or a budget (turns, context, wall clock) runs out.

Context budget policy (``elide``): when the next turn would not fit in ``max_context_tokens``,
every observation but the newest ``keep_recent_observations`` is replaced by a one-line note,
the conversation is re-rendered, and the episode continues in a new trajectory segment. The
old segment keeps the tokens the model saw before; the new one holds the re-rendered context
(all of it loss-masked) and what the model generates from then on. So the recorded tokens are
always exactly what the model saw. When nothing is left to elide, the episode stops
("context").

An episode that ends without ``submit`` is still judged: the final evaluation runs on what the
agent left in its workspace, so a budget cut-off does not erase the signal of its work. A
workspace with no model_new.py is judged at once (missing_files, the failure reward), as the
environment would, without sending it an evaluation.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from protocol.results import EvalResult
from protocol.trajectory import Segment, ToolCall, Trajectory, Turn
from rollout.chat import ChatFormat
from rollout.parser import ParseResult, from_openai_tool_calls, parse_tool_calls
from rollout.policy import Generation, GenerationRequest, Policy
from rollout.tool_results import ToolResult
from rollout.tool_specs import format_tool_prompt
from rollout.toolbox import ToolBox

ELIDED = "[observation elided to fit the context budget ({chars} characters); call the tool again if you need it]"
# Short: it follows every turn without a call, and each of its tokens is context every later turn attends to.
NO_CALL = "Your turn had no tool call: call a tool, or submit when you are done."


@dataclass
class EpisodeSettings:
    """What one episode needs from RolloutConfig, as plain values."""

    max_turns: int = 150
    max_context_tokens: int = 131072
    max_new_tokens: int = 4096
    timeout_s: float = 3600.0
    tool_call_format: str = "hermes"
    keep_recent_observations: int = 2
    min_new_tokens: int = 256  # a turn with less room than this stops the episode instead
    max_turns_without_call: int = 3
    failure_reward: float = -1.0  # the reward when not even the final evaluation could run

    @classmethod
    def from_config(cls, rollout: Any, failure_reward: float, max_turns: int | None = None) -> "EpisodeSettings":
        return cls(
            max_turns=max_turns or rollout.max_turns,
            max_context_tokens=rollout.max_context_tokens,
            max_new_tokens=rollout.max_new_tokens,
            timeout_s=rollout.episode_timeout_s,
            tool_call_format=str(rollout.tool_call_format),
            keep_recent_observations=rollout.keep_recent_observations,
            min_new_tokens=rollout.min_new_tokens,
            max_turns_without_call=rollout.max_turns_without_call,
            failure_reward=failure_reward,
        )


# The learning check's system prompt (env.kind=verifier): the call form in one line, short
# because the learner's cost on a CPU is every token of every episode.
ANSWER_SYSTEM = ('You answer by writing files in your workspace with tool calls of this form:\n<tool_call>\n'
                 '{"name": "write_file", "arguments": {"path": "<file name>", "content": "<the whole file>"}}\n'
                 '</tool_call>')


def system_prompt(skill: str, tool_prompt: str) -> str:
    """The role, SKILL.md (or where to find it), and the tools."""
    skill = skill.strip() or "Your workspace holds SKILL.md, the guide to this environment: read it first."
    return (
        "You are an expert kernel engineer. You make PyTorch models faster by writing custom kernels, "
        "working in a sandboxed workspace through tools.\n\n" + skill + "\n\n" + tool_prompt.strip()
    )


def task_prompt(task_source: str, backend: str) -> str:
    target = "CUDA kernels for an NVIDIA H100 GPU" if backend == "cuda" else "C++ kernels for the CPU"
    return (
        f"Write {target} that compute the same result as this PyTorch model (reference.py in your "
        "workspace), and make it faster than torch.compile. Put the new model in model_new.py as class "
        "ModelNew, with the same constructor arguments and forward signature.\n\n"
        f"```python\n{task_source.strip()}\n```"
    )


def answer_messages(question: str) -> list[dict[str, Any]]:
    """The learning check's opening: the call form, then the question (its task's source)."""
    return [{"role": "system", "content": ANSWER_SYSTEM}, {"role": "user", "content": question}]


class Episode:
    """The state of one episode; ``run`` drives it to the end."""

    def __init__(self, task: Any, policy: Policy, tools: ToolBox, settings: EpisodeSettings,
                 skill: str, backend: str, episode_id: str | None = None):
        self.task, self.policy, self.tools, self.settings = task, policy, tools, settings
        self.chat = ChatFormat.of(policy.tokenizer) if policy.token_level else None
        self.schemas = tools.schemas()
        prompt = format_tool_prompt(self.schemas, settings.tool_call_format)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt(skill, prompt)},
            {"role": "user", "content": task_prompt(task.source, backend)},
        ] if not tools.answer_file else answer_messages(task.source)
        self.traj = Trajectory(episode_id=episode_id or uuid.uuid4().hex, task_id=task.id,
                               token_level=policy.token_level, meta={"backend": backend})
        self.final: EvalResult | None = None
        self.turns_without_call = 0
        self.observations: list[int] = []  # indices into messages, oldest first, for elision
        self.elided: set[int] = set()

    # -- the loop -----------------------------------------------------------------------

    async def run(self) -> Trajectory:
        start = time.monotonic()
        if self.chat:
            self._new_segment()
        stop = None
        try:
            while stop is None:
                stop = self._budget_stop(start) or await self._turn()
            if self.final is None:  # judged on what it left in the workspace
                self.final = (self.tools.unsubmitted_without_solution(self.settings.failure_reward)
                              or (await self.tools.call(ToolCall("submit"))).eval)
        except Exception as exc:  # an infrastructure failure: the trajectory says so, the run goes on
            stop, self.traj.error = "error", f"{type(exc).__name__}: {exc}"
        return self._finish(stop, time.monotonic() - start)

    def _budget_stop(self, start: float) -> str | None:
        if len(self.traj.turns) >= self.settings.max_turns:
            return "max_turns"
        if time.monotonic() - start >= self.settings.timeout_s:
            return "timeout"
        if self.chat and self._room() < self.settings.min_new_tokens and not self._elide():
            return "context"
        return None

    async def _turn(self) -> str | None:
        gen = await self.policy.generate(self._request())
        turn = self._record_generation(gen)
        parsed = self._parse(gen)
        self.messages.append(self._assistant_message(gen))
        t0 = time.monotonic()
        observations, ended = await self._run_calls(parsed, turn)
        turn.tool_s = time.monotonic() - t0
        if ended:
            return "submit"
        if self.turns_without_call >= self.settings.max_turns_without_call:
            return "model_stop"
        self._append_observations(gen, observations)
        return None

    # -- generation and the context ------------------------------------------------------

    def _request(self) -> GenerationRequest:
        seg = self.traj.segments[-1] if self.chat else None
        room = self._room() if self.chat else self.settings.max_new_tokens
        return GenerationRequest(
            prompt_ids=list(seg.token_ids) if seg else [],
            messages=self.messages,
            tools=self.schemas,
            max_new_tokens=min(self.settings.max_new_tokens, room),
            episode_id=self.traj.episode_id,
            task_id=self.task.id,
        )

    def _room(self) -> int:
        return self.settings.max_context_tokens - len(self.traj.segments[-1])

    def _record_generation(self, gen: Generation) -> Turn:
        seg_index = max(len(self.traj.segments) - 1, 0)
        start = len(self.traj.segments[-1]) if self.chat else 0
        if self.chat:
            self.traj.segments[-1].extend(gen.token_ids, generated=True, logprobs=gen.logprobs)
        turn = Turn(segment=seg_index, start=start, end=start + len(gen.token_ids) if self.chat else 0,
                    version=gen.version, text=gen.text, gen_s=gen.gen_s)
        self.traj.turns.append(turn)
        return turn

    def _new_segment(self) -> None:
        seg = Segment()
        seg.extend(self.chat.render(self.messages), generated=False)
        self.traj.segments.append(seg)

    def _elide(self) -> bool:
        """Shorten old observations and continue in a new segment; False when nothing is left to cut."""
        old = self.observations[: max(len(self.observations) - self.settings.keep_recent_observations, 0)]
        cut = [i for i in old if i not in self.elided]
        if not cut:
            return False
        for i in cut:
            chars = len(self.messages[i]["content"])
            self.messages[i] = self.chat.observation_message(ELIDED.format(chars=chars), self.messages[i].get("name", ""))
            self.elided.add(i)
        self.traj.elisions += 1
        self._close_segment()
        self._new_segment()
        return self._room() >= self.settings.min_new_tokens or self._elide()

    def _close_segment(self) -> None:
        """Cut what the model never attended to: the observations after its last turn here."""
        index = len(self.traj.segments) - 1
        ends = [t.end for t in self.traj.turns if t.segment == index]
        if not ends:
            self.traj.segments.pop()
            return
        seg = self.traj.segments[index]
        del seg.token_ids[ends[-1]:], seg.loss_mask[ends[-1]:], seg.logprobs[ends[-1]:]

    def _append_observations(self, gen: Generation, observations: list[tuple[str, str, str]]) -> None:
        msgs = [self._observation_message(name, text, call_id) for name, text, call_id in observations]
        if self.chat:
            self.traj.segments[-1].extend(self.chat.continuation(gen.token_ids, msgs), generated=False)
        self.observations.extend(range(len(self.messages), len(self.messages) + len(msgs)))
        self.messages.extend(msgs)

    def _observation_message(self, name: str, text: str, call_id: str) -> dict[str, Any]:
        if self.chat:
            return self.chat.observation_message(text, name)
        return {"role": "tool", "tool_call_id": call_id, "name": name, "content": text}

    def _assistant_message(self, gen: Generation) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": gen.text}
        if gen.tool_calls:
            msg["tool_calls"] = gen.tool_calls
        return msg

    # -- tools ---------------------------------------------------------------------------

    def _parse(self, gen: Generation) -> ParseResult:
        if gen.tool_calls is not None:
            return from_openai_tool_calls(gen.tool_calls)
        return parse_tool_calls(gen.text, self.settings.tool_call_format)

    async def _run_calls(self, parsed: ParseResult, turn: Turn) -> tuple[list[tuple[str, str, str]], bool]:
        """Run the turn's calls in order; returns the observations and whether the episode ended."""
        observations = [("error", err, "") for err in parsed.errors]
        turn.invalid_calls += len(parsed.errors)
        turn.calls += len(parsed.errors)
        summaries = [f"parse error: {err.splitlines()[0]}" for err in parsed.errors]
        rewards: list[float] = []
        self.turns_without_call = 0 if parsed.calls or parsed.errors else self.turns_without_call + 1
        if not parsed.calls and not parsed.errors:
            observations.append(("error", NO_CALL, ""))
        for call in parsed.calls:
            result: ToolResult = await self.tools.call(call)
            turn.tools.append(call.name)
            turn.calls += 1
            turn.invalid_calls += not result.valid
            summaries.append(f"{call.name}: {result.summary}")
            if result.reward is not None:
                rewards.append(result.reward)
                turn.reward = max(rewards)
            observations.append((call.name, result.text, call.id))
            if result.ends_episode:
                self.final = result.eval
                turn.summary = "\n".join(summaries)
                return observations, True
        turn.summary = "\n".join(summaries)
        return observations, False

    # -- the end -------------------------------------------------------------------------

    def _finish(self, stop: str, wall_s: float) -> Trajectory:
        traj = self.traj
        traj.stop_reason, traj.wall_s = stop, wall_s
        while len(traj.segments) > 1 and not any(t.segment == len(traj.segments) - 1 for t in traj.turns):
            traj.segments.pop()  # re-rendered for a turn that never came
        traj.messages = self.messages
        if self.final is not None:
            traj.final_eval = self.final.to_dict()
            traj.milestone, traj.reward = int(self.final.milestone), float(self.final.reward)
        else:
            traj.reward = self.settings.failure_reward
        traj.validate()
        return traj


async def run_episode(task: Any, policy: Policy, tools: ToolBox, settings: EpisodeSettings,
                      skill: str, backend: str, episode_id: str | None = None) -> Trajectory:
    return await Episode(task, policy, tools, settings, skill, backend, episode_id).run()
