"""Tool calls out of model text: the well-formed ones, and an explanation for each malformed one."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from protocol.trajectory import ToolCall
from rollout.parser import EXAMPLE, from_openai_tool_calls, parse_tool_calls

KERNEL = '#include <cstdint>\nextern "C" void f(float* y) { if (y) { y[0] = 1.0f; } }  // "quotes" {braces} \\ </tool_call>\n'


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_one_call_with_text_around_it():
    r = parse_tool_calls(f"I will compile now.\n{call('compile')}\nWaiting.", "hermes")
    assert r.calls == [ToolCall("compile", {})] and r.errors == []
    assert r.content == "I will compile now.\n\nWaiting."


def test_several_calls_in_one_turn_keep_their_order():
    text = call("write_file", path="kernel.cpp", content="x") + "\n" + call("compile") + call("verify")
    r = parse_tool_calls(text, "hermes")
    assert [c.name for c in r.calls] == ["write_file", "compile", "verify"] and not r.errors


def test_kernel_source_with_braces_quotes_backslashes_and_the_closing_tag_survives():
    r = parse_tool_calls("ok " + call("write_file", path="kernel.cpp", content=KERNEL) + call("compile"), "hermes")
    assert not r.errors, r.errors
    assert r.calls[0].arguments["content"] == KERNEL and r.calls[1].name == "compile"


def test_raw_newlines_inside_json_strings_are_accepted():
    text = '<tool_call>{"name": "write_file", "arguments": {"path": "a.h", "content": "line1\nline2"}}</tool_call>'
    assert parse_tool_calls(text, "hermes").calls[0].arguments["content"] == "line1\nline2"


def test_arguments_given_as_a_json_string_are_decoded():
    text = '<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"reference.py\\"}"}</tool_call>'
    assert parse_tool_calls(text, "hermes").calls == [ToolCall("read_file", {"path": "reference.py"})]


def test_missing_closing_tag_at_the_end_is_tolerated():
    r = parse_tool_calls('Done.\n<tool_call>\n{"name": "submit", "arguments": {}}\n', "hermes")
    assert r.calls == [ToolCall("submit", {})] and not r.errors


def test_code_fence_inside_the_tags_is_tolerated():
    r = parse_tool_calls('<tool_call>\n```json\n{"name": "verify", "arguments": {}}\n```\n</tool_call>', "hermes")
    assert r.calls == [ToolCall("verify", {})] and not r.errors


def test_broken_json_is_explained_and_later_calls_still_parse():
    text = '<tool_call>{"name": "write_file", "arguments": {"path": "k.cpp", "content": "a"b"}}</tool_call>' + call("verify")
    r = parse_tool_calls(text, "hermes")
    assert [c.name for c in r.calls] == ["verify"]
    assert len(r.errors) == 1 and "not valid JSON" in r.errors[0] and EXAMPLE in r.errors[0]
    assert "Escape quotes" in r.errors[0]


def test_unclosed_broken_call_does_not_swallow_the_next_call():
    r = parse_tool_calls('<tool_call>{"name": "compile", \n' + call("verify"), "hermes")
    assert [c.name for c in r.calls] == ["verify"] and len(r.errors) == 1


@pytest.mark.parametrize("body, why", [
    ('{"arguments": {}}', 'no "name"'),
    ('{"name": 3, "arguments": {}}', 'no "name"'),
    ('{"name": "read_file", "arguments": ["reference.py"]}', "must be a JSON object of named inputs"),
    ('{"name": "read_file", "arguments": "{not json"}', "string that is not valid JSON"),
    ('{"name": "read_file", "path": "reference.py"}', 'inside \\"arguments\\"'),
    ('["read_file"]', "must be a JSON object"),
    ("", "is empty"),
    ('{"name": "verify"} trailing', "text after its JSON object"),
])
def test_malformed_calls_are_explained_with_the_expected_form(body, why):
    r = parse_tool_calls(f"<tool_call>{body}</tool_call>", "hermes")
    assert r.calls == [] and len(r.errors) == 1
    assert why.replace('\\"', '"') in r.errors[0] and EXAMPLE in r.errors[0], r.errors[0]


def test_missing_arguments_mean_no_arguments():
    assert parse_tool_calls('<tool_call>{"name": "list_files"}</tool_call>', "hermes").calls == [ToolCall("list_files", {})]


def test_a_stray_closing_tag_is_reported_and_plain_text_has_no_calls():
    assert "without an opening" in parse_tool_calls('{"name": "verify"}</tool_call>', "hermes").errors[0]
    r = parse_tool_calls("Let me think about tiling first.", "hermes")
    assert r.calls == [] and r.errors == [] and r.content == "Let me think about tiling first."


def test_unknown_format_names_the_setting():
    with pytest.raises(ValueError, match="rollout.tool_call_format"):
        parse_tool_calls("x", "xml")


def test_openai_text_carries_no_calls():
    assert parse_tool_calls(call("verify"), "openai").calls == []


def test_openai_structured_calls_keep_their_ids_and_decode_arguments():
    raw = [
        {"id": "call_1", "type": "function", "function": {"name": "write_file",
                                                          "arguments": json.dumps({"path": "kernel.cpp", "content": KERNEL})}},
        {"id": "call_2", "type": "function", "function": {"name": "compile", "arguments": ""}},
        SimpleNamespace(id="call_3", function=SimpleNamespace(name="verify", arguments="{}")),  # SDK-like objects
    ]
    r = from_openai_tool_calls(raw)
    assert not r.errors
    assert r.calls == [ToolCall("write_file", {"path": "kernel.cpp", "content": KERNEL}, "call_1"),
                       ToolCall("compile", {}, "call_2"), ToolCall("verify", {}, "call_3")]


def test_openai_malformed_calls_are_explained():
    r = from_openai_tool_calls([
        {"id": "call_1", "function": {"name": "read_file", "arguments": "{\"path\": "}},
        {"id": "call_2"},
        {"id": "call_3", "function": {"arguments": "{}"}},
    ])
    assert r.calls == [] and len(r.errors) == 3
    assert "call_1" in r.errors[0] and "not valid JSON" in r.errors[0]
    assert 'no "function"' in r.errors[1] and 'no "name"' in r.errors[2]
    assert all('"type": "function"' in e for e in r.errors)
    assert from_openai_tool_calls(None).calls == []
