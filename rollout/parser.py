"""Tool calls out of a model's turn: Hermes/Qwen ``<tool_call>`` blocks, or OpenAI function calls.

A malformed call is never fatal: it becomes an error message that says what was wrong and
shows the expected form, and the episode loop hands that message back to the model as the
observation (and counts it as an invalid call). Well-formed calls in the same turn still run.

Kernel source travels inside JSON strings, so the parser reads each call with a real JSON
decoder (braces and quotes inside strings are the decoder's business, not a regex's), in
non-strict mode: small models often put raw newlines in strings, which strict JSON forbids
but which mean exactly what they look like.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from protocol.trajectory import ToolCall

FORMATS = ("hermes", "openai")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
EXAMPLE = '<tool_call>{"name": "write_file", "arguments": {"path": "kernel.cpp", "content": "..."}}</tool_call>'
OPENAI_EXAMPLE = '{"id": "call_1", "type": "function", "function": {"name": "verify", "arguments": "{}"}}'
_DECODER = json.JSONDecoder(strict=False)


@dataclass
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one per malformed call, each explains and shows the form
    content: str = ""  # the turn's text with the tool-call blocks removed (what the model said)


def parse_tool_calls(text: str, fmt: str = "hermes") -> ParseResult:
    """Tool calls written in a model's text. ``fmt="openai"`` has none in the text: see from_openai_tool_calls."""
    fmt = str(fmt)
    if fmt == "openai":
        return ParseResult(content=text)  # the endpoint returns the calls structured, beside the text
    if fmt != "hermes":
        raise ValueError(f"unknown tool-call format {fmt!r} (rollout.tool_call_format); use one of {FORMATS}")
    return _parse_hermes(text)


def _parse_hermes(text: str) -> ParseResult:
    result = ParseResult()
    kept: list[str] = []
    pos = 0
    while (start := text.find(OPEN, pos)) != -1:
        kept.append(text[pos:start])
        body_start = start + len(OPEN)
        number = len(result.calls) + len(result.errors) + 1
        call, end, error = _read_call(text, body_start, number)
        if call is not None:
            result.calls.append(call)
        else:
            result.errors.append(error)
        pos = end
    kept.append(text[pos:])
    stray = text.count(CLOSE) - text.count(OPEN)
    if not result.calls and not result.errors and stray > 0:
        result.errors.append(f"found {CLOSE} without an opening {OPEN}. Write each call as {EXAMPLE}")
    result.content = "".join(kept).strip()
    return result


def _read_call(text: str, body_start: int, number: int) -> tuple[ToolCall | None, int, str]:
    """(call or None, where parsing resumes, error message)."""
    # Decoded from the full text, not cut at the first closing tag: kernel code in a string may
    # itself contain "</tool_call>", and the decoder knows where the string ends.
    close = text.find(CLOSE, body_start)
    skip_to_close = close + len(CLOSE) if close != -1 else len(text)
    next_open = text.find(OPEN, body_start)
    if next_open != -1 and next_open < skip_to_close:  # unclosed, and the next call follows: keep that one
        skip_to_close = next_open
    i = _skip_fence(text, _skip_space(text, body_start))
    if i >= len(text) or text.startswith(CLOSE, i):
        return None, skip_to_close, f"tool call {number} is empty. Put one JSON object between the tags: {EXAMPLE}"
    try:
        obj, end = _DECODER.raw_decode(text, i)
    except json.JSONDecodeError as err:
        return None, skip_to_close, (f"tool call {number} is not valid JSON: {err.msg} here: {text[max(i, err.pos - 30):err.pos + 10]!r}. "
                                     f"Escape quotes (\\\") and backslashes (\\\\) inside strings. Expected: {EXAMPLE}")
    j = _skip_space(text, end)
    if text.startswith("```", j):
        j = _skip_space(text, j + 3)
    if text.startswith(CLOSE, j):
        resume = j + len(CLOSE)
    elif j == len(text):
        resume = j  # the closing tag is missing at the very end: the model stopped on it
    else:
        later = text.find(CLOSE, end)
        return None, later + len(CLOSE) if later != -1 else len(text), (
            f"tool call {number} has text after its JSON object: {text[j:j + 40]!r}. "
            f"Put exactly one JSON object between the tags: {EXAMPLE}")
    call, error = _to_call(obj, f"tool call {number}", EXAMPLE)
    return call, resume, error


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _skip_fence(text: str, i: int) -> int:
    """Past an opening Markdown code fence (```json), which models like to wrap JSON in."""
    if not text.startswith("```", i):
        return i
    newline = text.find("\n", i)
    return _skip_space(text, newline if newline != -1 else i + 3)


def _to_call(obj: Any, where: str, example: str, call_id: str = "") -> tuple[ToolCall | None, str]:
    if not isinstance(obj, dict):
        return None, f"{where} must be a JSON object with \"name\" and \"arguments\", got {type(obj).__name__}. Expected: {example}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f"{where} has no \"name\" (the tool to call, a string). Expected: {example}"
    unknown = sorted(set(obj) - {"name", "arguments", "parameters", "id", "type"})
    if unknown:
        return None, f"{where} ({name}) has unexpected keys {unknown}; put the tool's inputs inside \"arguments\". Expected: {example}"
    args = obj.get("arguments", obj.get("parameters", {}))
    args, error = _arguments(args)
    if error:
        return None, f"{where} ({name}): {error}. Expected: {example}"
    return ToolCall(name=name.strip(), arguments=args, id=call_id), ""


def _arguments(args: Any) -> tuple[dict[str, Any], str]:
    if args is None:
        return {}, ""
    if isinstance(args, str):  # OpenAI style: the arguments object serialised as a string
        if not args.strip():
            return {}, ""
        try:
            args = _DECODER.decode(args)
        except json.JSONDecodeError as err:
            return {}, f"\"arguments\" is a string that is not valid JSON ({err.msg} at column {err.colno})"
    if not isinstance(args, dict):
        return {}, f"\"arguments\" must be a JSON object of named inputs, got {type(args).__name__}"
    return args, ""


def from_openai_tool_calls(tool_calls: Iterable[Any] | None) -> ParseResult:
    """Calls from an OpenAI-compatible response: dicts {id, function: {name, arguments}} or SDK objects."""
    result = ParseResult()
    for k, raw in enumerate(tool_calls or [], start=1):
        item = _as_dict(raw)
        call_id = str(item.get("id") or "")
        where = f"tool call {k}" + (f" ({call_id})" if call_id else "")
        function = _as_dict(item.get("function"))
        if not function:
            result.errors.append(f"{where} has no \"function\" object. Expected: {OPENAI_EXAMPLE}")
            continue
        call, error = _to_call({"name": function.get("name"), "arguments": function.get("arguments")}, where,
                               OPENAI_EXAMPLE, call_id)
        if call is not None:
            result.calls.append(call)
        else:
            result.errors.append(error)
    return result


def _as_dict(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "model_dump"):  # openai SDK (pydantic) objects
        return obj.model_dump()
    return {k: getattr(obj, k) for k in ("id", "type", "function", "name", "arguments") if hasattr(obj, k)}
