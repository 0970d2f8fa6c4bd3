"""Tool calls and reasoning blocks in model output: parsing (whole or streamed), writing, and
xgrammar structural tags that constrain calls. Pure Python; see docs/tools.md."""

from radixserve.tools.base import ToolParser, assemble
from radixserve.tools.hermes import HermesParser
from radixserve.tools.json_scan import JsonSpan, RawCall, arguments_text, read_call
from radixserve.tools.llama import LlamaParser
from radixserve.tools.mistral import MistralParser
from radixserve.tools.reasoning import (
    ReasoningFormat,
    ReasoningParser,
    ReasoningSplit,
    ReasoningStream,
    detect_reasoning_parser,
    reasoning_parser,
    reasoning_parser_names,
    register_reasoning_parser,
)
from radixserve.tools.registry import (
    detect_tool_parser,
    register_tool_parser,
    tool_parser,
    tool_parser_names,
)
from radixserve.tools.scan import CallScanner, Found, Malformed, Pending, Scan
from radixserve.tools.stream import ToolStream
from radixserve.tools.structural import MODES, CallShape, Mode
from radixserve.tools.types import (
    FunctionSpec,
    ParsedText,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    function_spec,
    function_specs,
    new_call_id,
)

__all__ = [
    "MODES",
    "CallScanner",
    "CallShape",
    "Found",
    "FunctionSpec",
    "HermesParser",
    "JsonSpan",
    "LlamaParser",
    "Malformed",
    "MistralParser",
    "Mode",
    "ParsedText",
    "Pending",
    "RawCall",
    "ReasoningFormat",
    "ReasoningParser",
    "ReasoningSplit",
    "ReasoningStream",
    "Scan",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "ToolStream",
    "arguments_text",
    "assemble",
    "detect_reasoning_parser",
    "detect_tool_parser",
    "function_spec",
    "function_specs",
    "new_call_id",
    "read_call",
    "reasoning_parser",
    "reasoning_parser_names",
    "register_reasoning_parser",
    "register_tool_parser",
    "tool_parser",
    "tool_parser_names",
]
