"""ToolBox: the agent's tool calls run against its workspace and the kernel environment.

``ToolBox.call`` never raises: an unknown tool or bad arguments give an invalid ``ToolResult``
whose text explains the expected form (the episode counts it, the model reads it and tries
again), and an environment failure is reported as an observation too. The tools' schemas are
rollout/tool_specs.py's; how a result reads as an observation is rollout/tool_results.py's.

Evaluations run on ``Workspace.solution_files()``: the agent cannot hand the environment
anything but what its workspace holds, and ``submit`` runs the protected final evaluation
(mode "full", the same verify and profile every candidate gets).
"""
from __future__ import annotations

import os
import stat
from typing import Any

from protocol.results import EvalResult, Milestone
from protocol.trajectory import ToolCall
from rollout.env_client import EnvClient
from rollout.tool_results import ToolResult, eval_summary, format_eval, format_profile, truncate
from rollout.tool_specs import BY_NAME, TOOLS, check_arguments, usage
from rollout.workspace import Workspace, WorkspaceError
from tasks.solution import SOLUTION_FILE
from tasks.task import Task

ANSWER_TOOLS = ("write_file", "submit")  # the learning check's tools
MODES = {"compile": "compile", "verify": "verify", "profile": "full", "submit": "full"}  # tool -> evaluation mode


class ToolBox:
    """The tools of one episode: its task, workspace and environment."""

    def __init__(self, task: Task, workspace: Workspace, env: EnvClient, backend: str, observation_max_chars: int = 4000,
                 answer_file: str | None = None):
        self.task, self.workspace, self.env = task, workspace, env
        self.backend = str(backend)
        self.max_chars = observation_max_chars
        # The learning check (env.kind=verifier) judges one answer file: the agent writes it and
        # submits; the kernel tools would only be ways to fail.
        self.answer_file = answer_file
        self.tools = ([t for t in TOOLS if t.name in ANSWER_TOOLS] if answer_file else
                      [t for t in TOOLS if self.backend == "cuda" or not t.cuda_only])

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools]

    async def call(self, call: ToolCall) -> ToolResult:
        tool = BY_NAME.get(call.name)
        if tool is None or (self.answer_file and tool not in self.tools):
            names = ", ".join(t.name for t in self.tools)
            return _invalid(f"unknown tool {call.name!r}. The tools are: {names}.", f"unknown tool {call.name!r}")
        problem = check_arguments(tool, call.arguments)
        if problem:
            return _invalid(f"{problem}. Expected: {usage(tool)}", f"bad arguments: {problem}")
        try:
            result = await getattr(self, "_" + tool.name)(**call.arguments)
        except WorkspaceError as err:
            result = ToolResult(str(err), True, f"refused: {str(err)[:100]}")
        except Exception as err:  # the environment's fault (a worker died): the model may retry
            result = ToolResult(f"the environment failed to answer ({type(err).__name__}: {err}); try again",
                                True, f"environment error: {type(err).__name__}", ends_episode=tool.name == "submit")
        result.text = truncate(result.text, self.max_chars, _hint(tool.name))
        return result

    # -- files --------------------------------------------------------------------------

    async def _list_files(self) -> ToolResult:
        rows = [f"{name:<24} {size:>8} bytes{'  (read-only)' if not writable else ''}"
                for name, size, writable in self.workspace.list_files()]
        return ToolResult("\n".join(rows) or "(empty)", True, f"{len(rows)} files")

    async def _read_file(self, path: str, start_line: int = 1) -> ToolResult:
        lines = self.workspace.read(path).splitlines(keepends=True)
        if start_line < 1 or (lines and start_line > len(lines)):
            return ToolResult(f"{path} has {len(lines)} lines; start_line must be between 1 and {len(lines)}",
                              True, f"{path}: start_line out of range")
        text = "".join(lines[start_line - 1:])
        head = f"[{path} from line {start_line} of {len(lines)}]\n" if start_line > 1 else ""
        # The cut, if any, says which line to continue from.
        if len(head) + len(text) > self.max_chars:
            shown = _lines_within(lines[start_line - 1:], self.max_chars - len(head) - 120)
            rest = start_line + shown
            return ToolResult(head + "".join(lines[start_line - 1:rest - 1]) +
                              f"\n[... cut: lines {rest}-{len(lines)} not shown; call read_file with start_line={rest}]",
                              True, f"read {path} lines {start_line}-{rest - 1} of {len(lines)}")
        return ToolResult(head + text if text else f"{path} is empty", True, f"read {path} ({len(lines)} lines)")

    async def _write_file(self, path: str, content: str) -> ToolResult:
        size = self.workspace.write(path, content)
        lines = content.count("\n") + (not content.endswith("\n") and bool(content))
        return ToolResult(f"wrote {path} ({size} bytes, {lines} lines)", True, f"wrote {path} ({size} bytes)")

    # -- the environment ------------------------------------------------------------------

    async def _profile_reference(self) -> ToolResult:
        report = await self.env.profile_reference(self.task)
        if not report.get("ok"):
            return ToolResult(format_profile(report), True, "reference profile failed")
        return ToolResult(format_profile(report), True, f"reference eager {report['eager_ms']:.3f} ms")

    async def _compile(self) -> ToolResult:
        return await self._evaluate("compile")

    async def _verify(self) -> ToolResult:
        return await self._evaluate("verify")

    async def _profile(self) -> ToolResult:
        return await self._evaluate("profile")

    async def _submit(self) -> ToolResult:
        result = await self._evaluate("submit")
        result.ends_episode = True
        result.text = "submitted; final evaluation:\n" + result.text
        return result

    async def _ncu(self) -> ToolResult:
        if self.backend != "cuda":
            return ToolResult("ncu is unavailable on the cpp backend: it profiles CUDA kernels on a GPU. "
                              "Use profile for timings.", True, "ncu unavailable (cpp)")
        text = await self.env.ncu(self.task, self.workspace.solution_files())
        return ToolResult(text, True, "ncu: " + (text.strip().splitlines() or ["(empty)"])[0][:100])

    def unsubmitted_without_solution(self, failure_reward: float) -> EvalResult | None:
        """The final evaluation of an episode that ended without submit, when the workspace holds
        no model_new.py: the environment would fail it as missing_files before running anything,
        so it is judged here, at once, with no round trip to (or queue at) an env worker.
        None when there is a solution to evaluate."""
        if self.answer_file:
            return None  # the learning check's verifier judges a missing answer file itself (and says so)
        try:  # one lstat: solution_files() holds model_new.py when it is a regular file (not a link)
            mode = os.lstat(self.workspace.path / SOLUTION_FILE).st_mode
        except FileNotFoundError:
            mode = 0
        except OSError:  # the workspace itself is in trouble: the real evaluation says what it can
            return None
        if stat.S_ISREG(mode):
            return None
        result = EvalResult(task_id=self.task.id, backend=self.backend, failure="missing_files",
                            message=f"{SOLUTION_FILE} is missing: it must define class ModelNew (the episode ended "
                                    f"without submit and its workspace holds no solution, so nothing was evaluated)")
        result.milestone, result.reward = Milestone.FAIL, failure_reward
        return result

    def _evaluated_files(self) -> dict[str, str]:
        """What the environment judges: the kernel solution's files, or the learning check's answer file."""
        if not self.answer_file:
            return self.workspace.solution_files()
        names = {name for name, _, _ in self.workspace.list_files()}
        return {self.answer_file: self.workspace.read(self.answer_file)} if self.answer_file in names else {}

    async def _evaluate(self, tool: str) -> ToolResult:
        result = await self.env.evaluate(self.task, self._evaluated_files(), MODES[tool])
        # A compile-only evaluation checks nothing, so it reaches no milestone and earns no reward; nor
        # does one the environment failed to run (infra): that says nothing of the agent's kernel.
        reward = None if tool == "compile" or result.failure == "infra" else result.reward
        return ToolResult(format_eval(result, tool, self.workspace.kernel_source), True,
                          eval_summary(result, tool), eval=result, reward=reward)


def _invalid(text: str, summary: str) -> ToolResult:
    return ToolResult(text, False, summary)


def _hint(tool: str) -> str:
    """What a cut observation of ``tool`` tells the model to do to see the rest."""
    return "read on with read_file start_line" if tool == "read_file" else ""


def _lines_within(lines: list[str], budget: int) -> int:
    used = count = 0
    for line in lines:
        if used + len(line) > budget and count:
            break
        used += len(line)
        count += 1
    return count
