"""The agent's tools as the model sees them: their JSON schemas, the check of a call's
arguments against them, and the system-prompt text that lists them.

Running a call is rollout/toolbox.py's job; writing its result as an observation is
rollout/tool_results.py's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


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
BY_NAME = {t.name: t for t in TOOLS}
_JSON_TYPES = {"string": str, "integer": int, "object": dict, "boolean": bool}


def check_arguments(tool: Tool, args: Any) -> str:
    """What is wrong with a call's arguments, in words for the model; "" when nothing is."""
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


def usage(tool: Tool) -> str:
    """An example call with the required arguments, as the model should write it."""
    example = {k: ("..." if v["type"] == "string" else 1) for k, v in tool.properties.items() if k in tool.required}
    return json.dumps({"name": tool.name, "arguments": example})


def format_tool_prompt(schemas: list[dict[str, Any]], fmt: str) -> str:
    """The system-prompt text that tells the model its tools and how to call them.

    "hermes" models read the schemas and the call form here (Qwen's template wording, which
    such models were trained on); "openai" endpoints get the schemas in the request's
    ``tools`` field, so the prompt only reminds the model to use them.
    """
    fmt = str(fmt)
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
