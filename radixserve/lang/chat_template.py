"""Role prefixes and suffixes, read off a tokenizer's own chat template.

`system()/user()/assistant()` append text, not messages, so the program's text
must be exactly what `tokenizer.apply_chat_template(messages)` renders. We
render a few sentinel conversations once and cut the template into the pieces
around each message's content.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_SENT = {"system": "SentinelSystemText", "user": "SentinelUserText", "assistant": "SentinelAssistantText"}
Render = Callable[[list[dict[str, str]], bool], str]


@dataclass(frozen=True)
class ChatTemplate:
    """`roles[role] = (prefix, suffix)` around a message's content; `preamble` goes before a
    first message that is not a system one (a template's default system prompt, a BOS)."""

    roles: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    preamble: str = ""

    def prefix(self, role: str, first: bool) -> str:
        if role not in self.roles:
            raise ValueError(f"unknown role {role!r}; use one of {', '.join(self.roles)}")
        pre = self.roles[role][0]
        return (self.preamble + pre) if first and role != "system" else pre

    def suffix(self, role: str) -> str:
        return self.roles[role][1]


# For models without a chat template (base models): plain labels, one message a line.
PLAIN = ChatTemplate(
    roles={"system": ("System: ", "\n"), "user": ("User: ", "\n"), "assistant": ("Assistant: ", "\n")}
)


def _split(text: str, sentinel: str) -> tuple[str, str]:
    i = text.find(sentinel)
    if i < 0 or text.find(sentinel, i + 1) >= 0:
        raise ValueError("the chat template does not render a message's content verbatim")
    return text[:i], text[i + len(sentinel) :]


def template_from_renderer(render: Render) -> ChatTemplate:
    """Cut a chat template into role pieces; `render(messages, add_generation_prompt)`."""
    sysm = {"role": "system", "content": _SENT["system"]}
    userm = {"role": "user", "content": _SENT["user"]}
    asstm = {"role": "assistant", "content": _SENT["assistant"]}
    one = render([sysm], False)
    two = render([sysm, userm], False)
    three = render([sysm, userm, asstm], False)
    if not (two.startswith(one) and three.startswith(two)):
        raise ValueError("the chat template does not render conversations incrementally")
    user_pre, user_suf = _split(two[len(one) :], _SENT["user"])
    asst_pre, asst_suf = _split(three[len(two) :], _SENT["assistant"])
    sys_pre, sys_suf = _split(one, _SENT["system"])
    only_user = render([userm], False)
    if not only_user.endswith(user_pre + _SENT["user"] + user_suf):
        raise ValueError("the chat template renders a first user message differently")
    preamble = only_user[: len(only_user) - len(user_pre + _SENT["user"] + user_suf)]
    return ChatTemplate(
        roles={"system": (sys_pre, sys_suf), "user": (user_pre, user_suf), "assistant": (asst_pre, asst_suf)},
        preamble=preamble,
    )


def template_from_tokenizer(tokenizer: Any) -> ChatTemplate:
    """The tokenizer's chat template in pieces, or PLAIN when it has none or it cannot be cut."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return PLAIN

    def render(messages: list[dict[str, str]], gen: bool) -> str:
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen))

    try:
        return template_from_renderer(render)
    except Exception:  # templates that reject a system role or reorder messages
        return PLAIN
