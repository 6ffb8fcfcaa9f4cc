"""Chat messages: validated, flattened to plain text content, rendered with the checkpoint's chat template."""

from __future__ import annotations

import jinja2

from router.api.errors import bad_request
from router.api.fields import TEXT, is_text
from router.api.tools import TOOL_FIELDS, is_tool_message, template_tool_message
from wire.tokenizer import Tokenizer

CHAT_FIELDS = frozenset({"messages", "max_completion_tokens", "top_logprobs"}) | TOOL_FIELDS
ROLES = ("system", "developer", "user", "assistant")
TEMPLATE_ROLES = {"developer": "system"}
"""OpenAI's newer name for the system role, rendered as the template's system turn (as vLLM does)."""
MESSAGE_KEYS = frozenset({"role", "content", "name"})


def render_chat(messages, tokenizer: Tokenizer, tools: tuple[dict, ...] | None = None) -> str:
    """The prompt text of a chat, ending with the assistant's generation prompt; tools: the template's `tools`."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of messages", param="messages")
    plain = [plain_message(message, i) for i, message in enumerate(messages)]
    try:
        return tokenizer.apply_chat_template(plain, add_generation_prompt=True,
                                             **({"tools": list(tools)} if tools else {}))
    except (jinja2.TemplateError, ValueError) as error:
        raise bad_request(f"the chat template refused these messages: {error}", param="messages") from None


def plain_message(message, index: int) -> dict:
    where = f"messages[{index}]"
    if is_tool_message(message):
        return template_tool_message(message, where, content_text)
    if not isinstance(message, dict):
        raise bad_request(f"'{where}' must be an object with 'role' and 'content'", param="messages")
    unknown = sorted(set(message) - MESSAGE_KEYS)
    if unknown:
        raise bad_request(f"unknown field(s) in '{where}': {', '.join(map(repr, unknown))}", param="messages")
    role = message.get("role")
    if role not in ROLES:
        raise bad_request(f"'{where}.role' must be one of {', '.join(ROLES)}", param="messages")
    return {"role": TEMPLATE_ROLES.get(role, role), "content": content_text(message.get("content"), where)}


def content_text(content, where: str) -> str:
    """A string, or a list of {"type": "text", "text": ...} parts joined by newlines (as vLLM does)."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list) and all(is_text_part(part) for part in content):
        text = "\n".join(part["text"] for part in content)
    else:
        raise bad_request(f"'{where}.content' must be a string or a list of text parts "
                          "({\"type\": \"text\", \"text\": ...})", param="messages")
    if not is_text(text):
        raise bad_request(f"'{where}.content' must be {TEXT}", param="messages")
    return text


def is_text_part(part) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) \
        and set(part) <= {"type", "text"}
