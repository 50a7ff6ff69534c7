"""Token glue between turns, from the model's own chat template.

The episode's context grows by appending, never by re-rendering: the generated tokens stay as
sampled, and what comes after them (the end of the assistant turn, the tool observations, the
next assistant header) is rendered by the chat template and tokenized on its own. Re-rendering
the whole conversation each turn would re-tokenize the model's output, and the recorded tokens
would stop being the ones the model sampled (a BPE merge across a boundary is enough).

This runs on the event loop that drives every episode, once per turn, so the work that repeats
is done once: one ChatFormat per tokenizer (``ChatFormat.of``), the template's fixed parts
rendered at construction, and the token ids of recently seen text kept (the same first prompt
for every sample of a task, the same hint after every turn without a tool call). Tokenizing is
deterministic, so a cached answer is the answer.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

# Placeholders rendered through the template to find where its glue begins and ends.
_SYS, _USER, _ASSISTANT = "\x00S\x00", "\x00U\x00", "\x00A\x00"
_BASE = ({"role": "system", "content": _SYS}, {"role": "user", "content": _USER},
         {"role": "assistant", "content": _ASSISTANT})
_TAIL_TOKENS = 32  # generated tokens decoded to find how a turn ended (the closing is a few tokens)
_CACHE_TEXTS = 256  # texts whose token ids are kept

_FORMATS: "weakref.WeakKeyDictionary[Any, ChatFormat]" = weakref.WeakKeyDictionary()


class ChatFormatError(ValueError):
    """A tokenizer whose chat template cannot be used for token-level episodes."""


class ChatFormat:
    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatFormatError(
                "the tokenizer has no chat_template: use an instruct model, or set one in tokenizer_config.json"
            )
        self.tokenizer = tokenizer
        self.template = tokenizer.chat_template
        # Templates that know the tool role get it; others (SmolLM2's plain ChatML) get the
        # Hermes convention: a user turn wrapping the output in <tool_response> tags.
        self.tool_role = "tool" in tokenizer.chat_template
        self._base = self.tokenizer.apply_chat_template(list(_BASE), tokenize=False)
        self._closing = self._assistant_closing()
        self._ends = self._closing_ends()
        self._encoded: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    @classmethod
    def of(cls, tokenizer: Any) -> "ChatFormat":
        """The tokenizer's ChatFormat, shared by every episode on it (and its caches with it)."""
        try:
            chat = _FORMATS.get(tokenizer)
        except TypeError:  # not weakly referenceable: a format of its own
            return cls(tokenizer)
        if chat is None or chat.template != tokenizer.chat_template:  # new, or its template was replaced
            chat = _FORMATS[tokenizer] = cls(tokenizer)
        return chat

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        """The whole context for ``messages``, ending in the assistant header."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        ids = self._encoded.get(text)
        if ids is None:
            ids = self._encoded[text] = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            if len(self._encoded) > _CACHE_TEXTS:
                self._encoded.popitem(last=False)
        else:
            self._encoded.move_to_end(text)
        return list(ids)

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
        still missing. A turn cut by the length limit needs the whole closing. Only whole
        tokens of the closing count as already there: a turn cut after a "<" has not begun
        "<|im_end|>", it needs all of it."""
        text = self._tail_text(generated_ids)
        for k in self._ends:
            if text.endswith(self._closing[:k]):
                return self._closing[k:]
        return self._closing

    def _tail_text(self, generated_ids: list[int]) -> str:
        """The end of the generated text, from its last tokens only (the closing is a few characters).

        A decode that starts mid-text may differ from the whole decode at its start (a split
        UTF-8 character, a stripped leading space); two windows that agree on the end have
        neither difference there. Otherwise the whole generation is decoded."""
        decode = self.tokenizer.decode
        if len(generated_ids) > 2 * _TAIL_TOKENS:
            need = len(self._closing) + 1
            wide = decode(generated_ids[-2 * _TAIL_TOKENS:], skip_special_tokens=False)
            narrow = decode(generated_ids[-_TAIL_TOKENS:], skip_special_tokens=False)
            if len(narrow) > need and wide[-need:] == narrow[-need:]:
                return narrow[-need:]
        return decode(generated_ids, skip_special_tokens=False)

    def _between(self, observations: list[dict[str, Any]]) -> str:
        after = self.tokenizer.apply_chat_template(list(_BASE) + observations, tokenize=False, add_generation_prompt=True)
        if not after.startswith(self._base):
            raise ChatFormatError("the chat template rewrites earlier turns when a message is added")
        return after[len(self._base):]

    def _assistant_closing(self) -> str:
        text = self._base
        if _ASSISTANT not in text:
            raise ChatFormatError("the chat template drops assistant content")
        return text[text.rindex(_ASSISTANT) + len(_ASSISTANT):]

    def _closing_ends(self) -> list[int]:
        """Lengths of the closing's prefixes that end between two of its tokens, longest first.

        For ChatML's "<|im_end|>\\n": the whole closing, and "<|im_end|>" (the end-of-turn token
        the model stops on)."""
        ids = self.tokenizer.encode(self._closing, add_special_tokens=False)
        ends = {len(self._closing)}
        for k in range(1, len(ids)):
            prefix = self.tokenizer.decode(ids[:k], skip_special_tokens=False)
            if prefix and self._closing.startswith(prefix):
                ends.add(len(prefix))
        return sorted(ends, reverse=True)
