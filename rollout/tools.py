"""The agent's tools: files in its workspace, and the kernel environment behind an EnvClient.

``ToolBox.call`` never raises: an unknown tool or bad arguments give an invalid ``ToolResult``
whose text explains the expected form (the episode counts it, the model reads it and tries
again), and an environment failure is reported as an observation too. Observations are short
and in a fixed layout a small model can learn: the verdict first, then the details that help
(the first compiler errors, the mismatch, the speedups, the guard that fired), truncated to
``observation_max_chars`` with a note saying what was cut.

Evaluations run on ``Workspace.solution_files()``: the agent cannot hand the environment
anything but what its workspace holds, and ``submit`` runs the protected final evaluation
(mode "full", the same verify and profile every candidate gets).
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from typing import Any

from env_pool.results import EvalResult, Milestone
from rollout.workspace import Workspace, WorkspaceError
from rollout.env_client import EnvClient
from rollout.trajectory import ToolCall
from tasks.solution import SOLUTION_FILE
from tasks.task import Task

MESSAGE_MAX_CHARS = 1500  # of an evaluation's message: the first errors say what to fix; the rest is noise


@dataclass
class ToolResult:
    text: str  # the observation the model reads
    valid: bool  # False: unknown tool or bad arguments (the text explains the expected form)
    summary: str  # one line for the turn record
    ends_episode: bool = False  # submit
    eval: EvalResult | None = None  # the evaluation this call ran (compile, verify, profile, submit)
    reward: float | None = None  # its milestone reward; None when the call reaches no milestone


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    properties: dict[str, dict[str, Any]]  # JSON schema of each argument
    required: tuple[str, ...] = ()
    cuda_only: bool = False

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": self.properties, "required": list(self.required)}}}


_PATH = {"type": "string", "description": "a file name in the workspace, e.g. kernel.cpp (no folders)"}
TOOLS = (
    Tool("list_files", "List the workspace's files with their sizes; reference.py and SKILL.md are read-only.", {}),
    Tool("read_file", "Read a workspace file (reference.py, SKILL.md, or your own files).",
         {"path": _PATH, "start_line": {"type": "integer", "description": "first line to show (1-based); default 1"}},
         ("path",)),
    Tool("write_file", "Create or overwrite a workspace file with the full new content: model_new.py "
         "(class ModelNew), the kernel source, headers.",
         {"path": _PATH, "content": {"type": "string", "description": "the whole file"}}, ("path", "content")),
    Tool("profile_reference", "Profile the PyTorch reference: input shapes, eager time, top operators by time.", {}),
    Tool("compile", "Compile the kernel source in the workspace; returns the first compiler errors if any.", {}),
    Tool("verify", "Compile and check ModelNew against the reference on 5 fresh random input sets.", {}),
    Tool("profile", "Verify, then time ModelNew against the eager reference and torch.compile; returns "
         "the speedups and the milestone reached.", {}),
    Tool("ncu", "Nsight Compute summary of your CUDA kernels (throughput, occupancy) over one forward call.", {},
         cuda_only=True),
    Tool("submit", "Submit the workspace as your final solution. Ends the episode; the protected final "
         "evaluation (verify and profile) sets the reward.", {}),
)
_BY_NAME = {t.name: t for t in TOOLS}
_JSON_TYPES = {"string": str, "integer": int, "object": dict, "boolean": bool}
MODES = {"compile": "compile", "verify": "verify", "profile": "full", "submit": "full"}


class ToolBox:
    """The tools of one episode: its task, workspace and environment."""

    def __init__(self, task: Task, workspace: Workspace, env: EnvClient, backend: str, observation_max_chars: int = 4000):
        self.task, self.workspace, self.env = task, workspace, env
        self.backend = str(getattr(backend, "value", backend))
        self.max_chars = observation_max_chars
        self.tools = [t for t in TOOLS if self.backend == "cuda" or not t.cuda_only]

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools]

    async def call(self, call: ToolCall) -> ToolResult:
        tool = _BY_NAME.get(call.name)
        if tool is None:
            names = ", ".join(t.name for t in self.tools)
            return _invalid(f"unknown tool {call.name!r}. The tools are: {names}.", f"unknown tool {call.name!r}")
        problem = _check_arguments(tool, call.arguments)
        if problem:
            return _invalid(f"{problem}. Expected: {_usage(tool)}", f"bad arguments: {problem}")
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

    async def _evaluate(self, tool: str) -> ToolResult:
        result = await self.env.evaluate(self.task, self.workspace.solution_files(), MODES[tool])
        # A compile-only evaluation checks nothing, so it reaches no milestone and earns no reward; nor
        # does one the environment failed to run (infra): that says nothing of the agent's kernel.
        reward = None if tool == "compile" or result.failure == "infra" else result.reward
        return ToolResult(format_eval(result, tool, self.workspace.kernel_source), True,
                          _eval_summary(result, tool), eval=result, reward=reward)


# ----------------------------------------------------------------------------- observations

_MILESTONE_TEXT = {
    Milestone.FAIL: "FAIL",
    Milestone.CORRECT: "CORRECT (not faster than eager PyTorch)",
    Milestone.FASTER_THAN_EAGER: "FASTER THAN EAGER (not yet >5% faster than torch.compile)",
    Milestone.FASTER_THAN_COMPILE: "FASTER THAN TORCH.COMPILE (the target)",
}


def format_eval(result: EvalResult, tool: str, kernel_source: str = "kernel.cpp") -> str:
    """An evaluation as the agent reads it: verdict, then what to fix or how fast it is."""
    if result.failure is not None:
        lines = [f"{tool}: FAILED ({result.failure})", _clip(result.message, MESSAGE_MAX_CHARS)]
        lines += [f"violation [{v.guard}]: {v.reason}" for v in result.violations if v.reason not in result.message]
        return "\n".join(lines)
    if tool == "compile":
        how = "cache hit" if result.cache_hit else f"{result.compile_s:.1f} s"
        return f"compile: OK ({how})" if result.compile_s or result.cache_hit else \
            f"compile: OK (no {kernel_source} to compile; model_new.py is imported when you verify)"
    lines = [f"{tool}: {_MILESTONE_TEXT[result.milestone]} (reward {result.reward:g})"]
    if result.checks:
        worst = max((c.max_abs_error or 0.0) for c in result.checks)
        lines.append(f"correctness: {sum(c.passed for c in result.checks)}/{len(result.checks)} input sets passed, "
                     f"max abs error {worst:.2e}")
    if result.candidate is not None:
        lines.append(_timing_line(result))
    return "\n".join(lines)


def _timing_line(result: EvalResult) -> str:
    parts = [f"time: yours {result.candidate.median_ms:.3f} ms"]
    if result.eager is not None:
        parts.append(f"eager {result.eager.median_ms:.3f} ms (speedup {result.speedup_vs_eager:.2f}x)")
    if result.compiled is not None:
        parts.append(f"torch.compile {result.compiled.median_ms:.3f} ms (speedup {result.speedup_vs_compile:.2f}x)")
    noise = max(t.noise for t in (result.candidate, result.eager, result.compiled) if t is not None)
    return ", ".join(parts) + f"; noise {100 * noise:.0f}%"


def _eval_summary(result: EvalResult, tool: str) -> str:
    if result.failure is not None:
        first = (result.message.strip().splitlines() or [""])[0]
        return f"{result.failure}: {first[:120]}"
    if tool == "compile":
        return "compiled"
    speed = f", {result.speedup_vs_eager:.2f}x eager, {result.speedup_vs_compile:.2f}x compile" \
        if result.speedup_vs_eager is not None and result.speedup_vs_compile is not None else ""
    return f"{result.milestone.name}{speed}"


def format_profile(report: dict[str, Any]) -> str:
    """A reference profile (env_pool/reference_profile.py) as the agent reads it."""
    if not report.get("ok"):
        return f"profiling the reference failed: {_clip(str(report.get('error', 'unknown error')), MESSAGE_MAX_CHARS)}"
    lines = [f"reference {report['task_id']} on {report['device']}",
             f"inputs: {', '.join(report['inputs']) or 'none'}"]
    if report.get("init_inputs"):
        lines.append(f"init inputs: {', '.join(report['init_inputs'])}")
    lines.append(f"eager time: {report['eager_ms']:.3f} ms (median of {report['repetitions']}, "
                 f"IQR {report['eager_iqr_ms']:.3f} ms)")
    lines.append("top operators by self time (under the profiler):")
    lines.append(f"  {'self %':>7}  {'ms/run':>8}  {'calls':>5}  name")
    for op in report.get("top_ops", []):
        lines.append(f"  {op['self_pct']:6.1f}%  {op['self_ms']:8.3f}  {op['calls']:5.3g}  {op['name']}")
    return "\n".join(lines)


def truncate(text: str, limit: int, hint: str = "") -> str:
    """``text`` within ``limit`` characters: the head, and a note saying how much was cut."""
    if len(text) <= limit:
        return text
    note = f"\n[... {{}} more characters cut{'; ' + hint if hint else ''}]"
    keep = max(0, limit - len(note.format(len(text))))
    return text[:keep] + note.format(len(text) - keep)


def _hint(tool: str) -> str:
    return "read on with read_file start_line" if tool == "read_file" else ""


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} characters cut]"


def _lines_within(lines: list[str], budget: int) -> int:
    used = count = 0
    for line in lines:
        if used + len(line) > budget and count:
            break
        used += len(line)
        count += 1
    return count


# ----------------------------------------------------------------------------- arguments

def _check_arguments(tool: Tool, args: Any) -> str:
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    missing = [k for k in tool.required if k not in args]
    if missing:
        return f"{tool.name} needs {', '.join(repr(m) for m in missing)}"
    unknown = sorted(set(args) - set(tool.properties))
    if unknown:
        takes = ", ".join(repr(k) for k in tool.properties) or "no arguments"
        return f"{tool.name} does not take {', '.join(repr(u) for u in unknown)} (it takes {takes})"
    for key, value in args.items():
        want = tool.properties[key]["type"]
        if not isinstance(value, _JSON_TYPES[want]) or (want == "integer" and isinstance(value, bool)):
            return f"{tool.name}: {key!r} must be {'an' if want[0] in 'aeiou' else 'a'} {want}, got {type(value).__name__}"
    return ""


def _usage(tool: Tool) -> str:
    example = {k: ("..." if v["type"] == "string" else 1) for k, v in tool.properties.items() if k in tool.required}
    return json.dumps({"name": tool.name, "arguments": example})


def _invalid(text: str, summary: str) -> ToolResult:
    return ToolResult(text, False, summary)


# ----------------------------------------------------------------------------- the prompt

def format_tool_prompt(schemas: list[dict[str, Any]], fmt: str) -> str:
    """The system-prompt text that tells the model its tools and how to call them.

    "hermes" models read the schemas and the call form here (Qwen's template wording, which
    such models were trained on); "openai" endpoints get the schemas in the request's
    ``tools`` field, so the prompt only reminds the model to use them.
    """
    fmt = str(getattr(fmt, "value", fmt))
    if fmt == "openai":
        return "Use the provided tools (function calling) for every action; call submit when you are done."
    if fmt != "hermes":
        raise ValueError(f"unknown tool-call format {fmt!r} (rollout.tool_call_format); use 'hermes' or 'openai'")
    listing = "\n".join(json.dumps(s) for s in schemas)
    return (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>\n\n"
        "File contents are JSON strings: escape newlines as \\n, quotes as \\\" and backslashes as \\\\. "
        "Several calls in one turn run in order. After your calls, stop and wait for the results."
    )
