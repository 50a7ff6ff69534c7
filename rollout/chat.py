"""Token glue between turns, from the model's own chat template.

The episode's context grows by appending, never by re-rendering: the generated tokens stay as
sampled, and what comes after them (the end of the assistant turn, the tool observations, the
next assistant header) is rendered by the chat template and tokenized on its own. Re-rendering
the whole conversation each turn would re-tokenize the model's output, and the recorded tokens
would stop being the ones the model sampled (a BPE merge across a boundary is enough).
"""
from __future__ import annotations

from typing import Any

# Placeholders rendered through the template to find where its glue begins and ends.
_SYS, _USER, _ASSISTANT = "\x00S\x00", "\x00U\x00", "\x00A\x00"


class ChatFormatError(ValueError):
    """A tokenizer whose chat template cannot be used for token-level episodes."""


class ChatFormat:
    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatFormatError(
                "the tokenizer has no chat_template: use an instruct model, or set one in tokenizer_config.json"
            )
        self.tokenizer = tokenizer
        # Templates that know the tool role get it; others (SmolLM2's plain ChatML) get the
        # Hermes convention: a user turn wrapping the output in <tool_response> tags.
        self.tool_role = "tool" in tokenizer.chat_template
        self._closing = self._assistant_closing()

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        """The whole context for ``messages``, ending in the assistant header."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def observation_message(self, text: str, name: str = "") -> dict[str, Any]:
        if self.tool_role:
            return {"role": "tool", "name": name, "content": text}
        return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}

    def continuation(self, generated_ids: list[int], observations: list[dict[str, Any]]) -> list[int]:
        """Tokens after a model turn: the rest of its closing, the observations, the next header."""
        return self.encode(self._close(generated_ids) + self._between(observations))

    def _close(self, generated_ids: list[int]) -> str:
        """What the template puts after an assistant message that the model did not generate.

        The model usually ends with its end-of-turn token; the template's newline after it is
        still missing. A turn cut by the length limit needs the whole closing."""
        text = self.tokenizer.decode(generated_ids, skip_special_tokens=False)
        closing = self._closing
        for k in range(len(closing), 0, -1):
            if text.endswith(closing[:k]):
                return closing[k:]
        return closing

    def _between(self, observations: list[dict[str, Any]]) -> str:
        base = [{"role": "system", "content": _SYS}, {"role": "user", "content": _USER},
                {"role": "assistant", "content": _ASSISTANT}]
        before = self.tokenizer.apply_chat_template(base, tokenize=False)
        after = self.tokenizer.apply_chat_template(base + observations, tokenize=False, add_generation_prompt=True)
        if not after.startswith(before):
            raise ChatFormatError("the chat template rewrites earlier turns when a message is added")
        return after[len(before):]

    def _assistant_closing(self) -> str:
        base = [{"role": "system", "content": _SYS}, {"role": "user", "content": _USER},
                {"role": "assistant", "content": _ASSISTANT}]
        text = self.tokenizer.apply_chat_template(base, tokenize=False)
        if _ASSISTANT not in text:
            raise ChatFormatError("the chat template drops assistant content")
        return text[text.rindex(_ASSISTANT) + len(_ASSISTANT):]
