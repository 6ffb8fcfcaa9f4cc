"""Tool calling as vLLM serves it: `tools`, `tool_choice` (none / auto / required / a named function) and
`parallel_tool_calls`, with a Hermes/Qwen-style parser (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`).

- The tools go to the chat template (`tools=`), as do messages of role `tool` and assistant messages with
  `tool_calls` (their JSON `arguments` as objects, as vLLM hands them to templates).
- named and required are forced through structured outputs, with vLLM's schemas
  (vllm/tool_parsers/utils.py get_json_schema_from_tools): named, the function's parameters (the output is the
  arguments); required, an array of {"name", "parameters"} (at most one item when parallel_tool_calls is false).
  Unlike vLLM's default, that JSON is compact (no free whitespace between its tokens).
- auto: the output is parsed for <tool_call> blocks (vLLM's hermes parser); the text before the first one is the
  content.
- finish_reason "tool_calls" for auto and required calls, "stop" for a named one (OpenAI's, as vLLM).
Streams carry `delta.tool_calls`: a named call's arguments as they come; an auto call once its block closes;
required calls once the array is complete (at the end).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from router.api.errors import bad_request
from router.api.fields import is_text, read_field, shorten
from wire.structured import StructuredOutput

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
Choice = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[dict, ...]
    """The function tools as the client sent them (what the chat template gets)."""
    choice: Choice
    name: str | None = None
    """The named function (choice "named")."""
    parallel: bool | None = None

    def constraint(self) -> StructuredOutput | None:
        """named / required: the JSON schema the output must follow (vLLM's)."""
        # NOTE: compact JSON (vLLM's disable_any_whitespace): with any whitespace allowed, weak models loop on it
        if self.choice == "named":
            return StructuredOutput("json", json.dumps(parameters_of(self.function(self.name))), any_whitespace=False)
        if self.choice != "required":
            return None
        definitions: dict = {}
        schemas = [{"properties": {"name": {"type": "string", "enum": [tool["function"]["name"]]},
                                   "parameters": without_definitions(parameters_of(tool["function"]), definitions)},
                    "required": ["name", "parameters"]} for tool in self.tools]
        schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": schemas}}
        if definitions:  # NOTE: as vLLM: "#/$defs/..." in a tool's parameters names the root of this schema
            schema["$defs"] = definitions
        if self.parallel is False:
            schema["maxItems"] = 1
        return StructuredOutput("json", json.dumps(schema), any_whitespace=False)

    def function(self, name: str) -> dict:
        return next(tool["function"] for tool in self.tools if tool["function"]["name"] == name)


def parameters_of(function: dict) -> dict:
    """vLLM's _params_or_empty_object: no parameters is an empty object."""
    return function.get("parameters") or {"type": "object", "properties": {}}


def without_definitions(parameters: dict, definitions: dict) -> dict:
    """The parameters without their root-level $defs, which are added to definitions (vLLM's
    get_json_schema_from_tools: the tools' $defs move to the root of the required-call schema)."""
    if not isinstance(parameters.get("$defs"), dict):
        return parameters
    definitions.update(parameters["$defs"])
    return {key: value for key, value in parameters.items() if key != "$defs"}


def read_tools(body: dict) -> ToolRequest | None:
    """None without tools or with tool_choice "none" (nothing changes then)."""
    tools = read_field(body, "tools", None, lambda v: isinstance(v, list) and all(map(is_function_tool, v)),
                       'a list of {"type": "function", "function": {"name": ..., "parameters": {...}}}')
    parallel = read_field(body, "parallel_tool_calls", None, lambda v: isinstance(v, bool), "a boolean")
    choice = read_field(body, "tool_choice", None, lambda v: v in ("none", "auto", "required") or is_named(v),
                        '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}')
    if not tools:
        if choice not in (None, "none"):
            raise bad_request("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    if choice == "none":
        return None
    if is_named(choice):
        name = choice["function"]["name"]
        if name not in {tool["function"]["name"] for tool in tools}:
            raise bad_request(f"Tool '{shorten(name, quote=False)}' has not been passed in `tools`.",
                              param="tool_choice")
        return ToolRequest(tuple(tools), "named", name, parallel)
    return ToolRequest(tuple(tools), choice or "auto", None, parallel)


def is_function_tool(tool) -> bool:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return False
    function = tool.get("function")
    return isinstance(function, dict) and isinstance(function.get("name"), str) and is_text(function["name"]) and \
        isinstance(function.get("parameters") or {}, dict)


def is_named(choice) -> bool:
    return isinstance(choice, dict) and choice.get("type") == "function" and \
        isinstance(choice.get("function"), dict) and isinstance(choice["function"].get("name"), str)


def is_tool_message(message) -> bool:
    """A message of role tool, or an assistant message carrying tool_calls."""
    return isinstance(message, dict) and (message.get("role") == "tool" or (
        message.get("role") == "assistant" and message.get("tool_calls")))


def template_tool_message(message: dict, where: str, content_text) -> dict:
    """A tool message as the template gets it: content as text ("" for null), tool_calls' arguments as objects."""
    content = message.get("content")
    rendered = {"role": message["role"], "content": "" if content is None else content_text(content, where)}
    if message["role"] == "tool":
        rendered["tool_call_id"] = str(message.get("tool_call_id") or "")
        return rendered
    calls = message["tool_calls"]
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                              for c in calls):
        raise bad_request(f"'{where}.tool_calls' must be a list of {{\"id\", \"type\", \"function\": {{\"name\", "
                          "\"arguments\"}}}}", param="messages")
    rendered["tool_calls"] = [{**call, "function": {**call["function"],
                                                    "arguments": as_object(call["function"].get("arguments"))}}
                              for call in calls]
    return rendered


def as_object(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


# --- output ---------------------------------------------------------------------------------------------------
def call_id(request_id: str, index: int, number: int) -> str:
    """A tool call's id: a function of the request, so that a replay gives the same body."""
    return f"chatcmpl-tool-{request_id}-{index}-{number}"


def function_call(call_ids: str, name: str, arguments) -> dict:
    arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_ids, "type": "function", "function": {"name": name, "arguments": arguments}}


def parse_hermes(text: str) -> tuple[str | None, list[tuple[str, object]]]:
    """-> (content before the first call, or None when empty; [(name, arguments)]). A block that is not a JSON
    object with a name is left in the content, as vLLM's hermes parser does with its whole output."""
    start = text.find(CALL_START)
    if start < 0:
        return text, []
    calls = []
    for block in text[start:].split(CALL_START)[1:]:
        body = block.split(CALL_END, 1)[0].strip()
        try:
            call = json.loads(body)
        except ValueError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        calls.append((call["name"], call.get("arguments", {})))
    return text[:start] or None, calls


def parse_required(text: str) -> list[tuple[str, object]] | None:
    try:
        items = json.loads(text)
    except ValueError:
        return None
    if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return None
    return [(item["name"], item.get("parameters", {})) for item in items]


def chat_message(tools: ToolRequest | None, request_id: str, index: int, text: str,
                 finish_reason: str | None) -> tuple[dict, str | None]:
    """A non-streamed choice's message and finish_reason."""
    if tools is None:
        return {"role": "assistant", "content": text}, finish_reason
    if tools.choice in ("named", "required") and finish_reason == "length":
        # NOTE: as vLLM (and OpenAI): a forced call cut by max_tokens is no call, and its partial JSON no content
        return {"role": "assistant", "content": ""}, finish_reason
    if tools.choice == "named":
        return {"role": "assistant", "content": "",
                "tool_calls": [function_call(call_id(request_id, index, 0), tools.name, text)]}, finish_reason
    calls = parse_required(text) if tools.choice == "required" else parse_hermes(text)[1]
    if not calls:
        return {"role": "assistant", "content": text, "tool_calls": []}, finish_reason
    content = "" if tools.choice == "required" else parse_hermes(text)[0]
    message = {"role": "assistant", "content": content,
               "tool_calls": [function_call(call_id(request_id, index, k), name, arguments)
                              for k, (name, arguments) in enumerate(calls)]}
    return message, "tool_calls" if finish_reason == "stop" else finish_reason


class ToolStream:
    """Rewrites one chat choice's stream deltas ({"content": text}) into content and tool_calls deltas."""

    def __init__(self, tools: ToolRequest, request_id: str, index: int):
        self.tools, self.request_id, self.index = tools, request_id, index
        self.pending = ""
        """auto: text held back (a call being written, or what may begin one); required: all of it."""
        self.num_calls = 0

    def rewrite(self, choice: dict) -> dict:
        text, finished = choice["delta"].get("content", ""), choice.get("finish_reason") is not None
        if self.tools.choice == "named":
            delta = self.named_delta(text)
        elif self.tools.choice == "required":
            self.pending += text
            delta = self.calls_delta(parse_required(self.pending) or []) if finished else {}
            if finished and not delta and self.pending:
                delta = {"content": self.pending}
        else:
            delta = self.auto_delta(text, finished)
        if finished and self.num_calls and choice["finish_reason"] == "stop" and self.tools.choice != "named":
            choice["finish_reason"] = "tool_calls"
        choice["delta"] = delta
        return choice

    def named_delta(self, text: str) -> dict:
        if self.num_calls:
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]} if text else {}
        self.num_calls = 1
        call = function_call(call_id(self.request_id, self.index, 0), self.tools.name, text)
        return {"tool_calls": [{"index": 0, **call}]}

    def calls_delta(self, calls: list[tuple[str, object]]) -> dict:
        if not calls:
            return {}
        first = self.num_calls
        self.num_calls += len(calls)
        return {"tool_calls": [{"index": first + k, **function_call(call_id(self.request_id, self.index, first + k),
                                                                     name, arguments)}
                               for k, (name, arguments) in enumerate(calls)]}

    def auto_delta(self, text: str, finished: bool) -> dict:
        self.pending += text
        content, calls = "", []
        while self.pending:
            start = self.pending.find(CALL_START)
            if start < 0:
                keep = 0 if finished else held_prefix(self.pending)
                content += self.pending[:len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep:]
                break
            end = self.pending.find(CALL_END, start)
            if end < 0 and not finished:
                content += self.pending[:start]
                self.pending = self.pending[start:]
                break
            block = self.pending[start:] if end < 0 else self.pending[start:end + len(CALL_END)]
            parsed = parse_hermes(block)[1]
            if parsed:
                content += self.pending[:start]
                calls += parsed
            else:
                content += self.pending[:start] + block
            self.pending = "" if end < 0 else self.pending[end + len(CALL_END):]
        delta = self.calls_delta(calls)
        if self.num_calls and not content.strip():  # NOTE: whitespace between or after calls is no content
            content = ""
        return {"content": content, **delta} if content or not delta else delta


def held_prefix(text: str) -> int:
    """How many characters at text's end may begin CALL_START (held back until the next delta says)."""
    for size in range(min(len(CALL_START) - 1, len(text)), 0, -1):
        if CALL_START.startswith(text[-size:]):
            return size
    return 0
