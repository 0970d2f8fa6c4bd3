"""Chat templates rendered by `radixserve.model.chat_template` (no transformers) equal
transformers' `apply_chat_template`: the embedded model's template and published ones
(Qwen2.5, Llama-3.1, Gemma, Mistral v0.2 and Small 3.1: tools, tojson, strftime_now,
raise_exception, namespace), and the calls it leaves to transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from radixserve.model import chat_template
from radixserve.model.text_tokenizer import TextTokenizer

TEMPLATES = {
    k: v
    for k, v in json.loads((Path(__file__).parent / "data" / "chat_templates.json").read_text()).items()
    if not k.startswith("_")
}
SYSTEM = {"role": "system", "content": "You are terse. "}
USER = {"role": "user", "content": ' What is 2+2? <|im_end|> "quoted" 数学'}
ASSISTANT = {"role": "assistant", "content": "4.", "reasoning_content": "Add them."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city <b>now</b>.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {
    "role": "assistant",
    "content": None,  # dropped, as transformers drops it
    "tool_calls": [
        {
            "id": "call_0123456789",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_0123456789", "content": "Sunny, 21 °C"}
# (messages, keywords): system/user/assistant turns with and without the generation prompt,
# tools, a continued final message and extra template variables.
CASES: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    ([SYSTEM, USER], {"add_generation_prompt": True}),
    ([SYSTEM, USER, ASSISTANT], {"add_generation_prompt": False}),
    ([USER], {"add_generation_prompt": True}),
    (
        [USER, ASSISTANT, USER],
        {"add_generation_prompt": True, "bos_token": "<s>", "date_string": "1 Dec 2026"},
    ),
    ([USER, ASSISTANT], {"continue_final_message": True}),
    ([USER, CALL, RESULT], {"tools": TOOLS, "add_generation_prompt": True}),
    ([SYSTEM, USER], {"tools": TOOLS, "add_generation_prompt": True, "tools_in_user_message": False}),
]


def _outcome(fn: Any, *args: Any, **kw: Any) -> tuple[str, str]:
    try:
        return "ok", fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - the same error, type and message, is part of the contract
        return type(e).__name__, str(e)


@pytest.mark.parametrize("name", ["embedded", *TEMPLATES])
def test_rendered_text_equals_transformers(tokenizer_pair: tuple[TextTokenizer, Any], name: str) -> None:
    ours, ref = tokenizer_pair
    source = ours.chat_template if name == "embedded" else TEMPLATES[name]
    assert source
    rendered = 0
    for messages, kw in CASES:
        kw = {"chat_template": source, "tokenize": False, **kw}
        expected = _outcome(ref.apply_chat_template, messages, **kw)
        # Straight from the module (Unsupported would mean a fall back to transformers) ...
        direct = _outcome(chat_template.apply, source, ours.special_tokens_map, ours.encode, messages, **kw)
        assert direct == expected, (messages, kw)
        # ... and through the tokenizer, as the engine calls it.
        assert _outcome(ours.apply_chat_template, messages, **kw) == expected
        rendered += expected[0] == "ok"
    assert rendered >= 3  # templates that reject a system role or tools still render the rest
    assert ours.special_tokens_map == ref.special_tokens_map


def test_ids_and_calls_left_to_transformers(tokenizer_pair: tuple[TextTokenizer, Any]) -> None:
    ours, ref = tokenizer_pair
    chat = [SYSTEM, USER]
    ids = ours.apply_chat_template(chat, tokenize=True, return_dict=False, add_generation_prompt=True)
    assert ids == ref.apply_chat_template(chat, tokenize=True, return_dict=False, add_generation_prompt=True)

    def weather(city: str) -> str:
        """The weather.

        Args:
            city: The city.
        """
        return city

    source = TEMPLATES["Qwen/Qwen2.5-Instruct"]
    for messages, kw in (
        ([USER], {"tools": [weather], "tokenize": False}),  # a function: transformers builds its schema
        ([[USER], [SYSTEM, USER]], {"tokenize": False}),  # a batch
        (chat, {"tokenize": True}),  # a BatchEncoding
    ):
        with pytest.raises(chat_template.Unsupported):
            chat_template.apply(source, ours.special_tokens_map, ours.encode, messages, **kw)
        kw = {"chat_template": source, **kw}
        assert str(ours.apply_chat_template(messages, **kw)) == str(ref.apply_chat_template(messages, **kw))
