"""The frontend language: SGLang's programs (gen / select / fork / roles), in process.

`import radixserve.lang as sgl` and write programs as for SGLang::

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=32))

    state = qa.run(question="What is a radix tree?", temperature=0)
    print(state["answer"])

With no backend set, the first run starts the embedded model; give one with
`sgl.set_default_backend(engine)` (an `AsyncEngine` or `Engine`) or `run(backend=...)`.
"""

from radixserve.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixserve.lang.backend import Backend, ChoiceLogprobs, GenParams, GenResult, StreamChunk
from radixserve.lang.chat_template import ChatTemplate
from radixserve.lang.choices import (
    ChoicesDecision,
    ChoicesMethod,
    ChoicesSamplingMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixserve.lang.defaults import get_default_backend, set_default_backend
from radixserve.lang.executor import ProgramError
from radixserve.lang.function import SglFunction, function
from radixserve.lang.state import ProgramState, ProgramStateGroup

greedy = greedy_token_selection

__all__ = [
    "Backend",
    "ChatTemplate",
    "ChoiceLogprobs",
    "ChoicesDecision",
    "ChoicesMethod",
    "ChoicesSamplingMethod",
    "GenParams",
    "GenResult",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "SglFunction",
    "StreamChunk",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "greedy",
    "greedy_token_selection",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
]
