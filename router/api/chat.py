"""Chat messages: validated, content flattened to plain text, rendered with the checkpoint's chat template (or the
request's own chat_template), as vLLM renders them."""

from __future__ import annotations

from dataclasses import dataclass, field

import jinja2

from router.api.errors import bad_request
from router.api.fields import TEXT, bool_field, is_text, read_field
from router.api.tools import is_tool_message, template_tool_message
from wire.tokenizer import Tokenizer

TEMPLATE_ROLES = {"developer": "system"}
"""OpenAI's newer name for the system role, rendered as the template's system turn (as vLLM does)."""
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
"""vLLM's reasoning_effort values."""
MAX_TEMPLATE_CHARS = 64 * 1024
"""A request's own chat_template is compiled in the parser process: bounded like any other text it sends."""


@dataclass(frozen=True)
class ChatTemplateOptions:
    """vLLM's chat fields that shape the rendered prompt."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    """The last message is left open (no end-of-turn), for the model to continue it."""
    chat_template: str | None = None
    template_kwargs: dict = field(default_factory=dict)
    """chat_template_kwargs: extra template variables (Qwen3's enable_thinking, ...)."""


def read_template_options(body: dict, trust_request_chat_template: bool) -> ChatTemplateOptions:
    kwargs = read_field(body, "chat_template_kwargs", {}, lambda v: isinstance(v, dict), "an object")
    effort = read_field(body, "reasoning_effort", None, lambda v: v in REASONING_EFFORTS,
                        f"one of {', '.join(REASONING_EFFORTS)}")
    if effort is not None:
        # NOTE: as vLLM: the template sees reasoning_effort, and enable_thinking unless the client set it (Qwen3's
        # template thinks unless enable_thinking is false)
        kwargs = {"reasoning_effort": effort, "enable_thinking": effort != "none", **kwargs}
    options = ChatTemplateOptions(
        add_generation_prompt=bool_field(body, "add_generation_prompt", True),
        continue_final_message=bool_field(body, "continue_final_message", False),
        chat_template=read_field(body, "chat_template", None,
                                 lambda v: is_text(v) and len(v) <= MAX_TEMPLATE_CHARS,
                                 f"a string of at most {MAX_TEMPLATE_CHARS} characters of {TEXT}"),
        template_kwargs=kwargs)
    if options.chat_template is not None and not trust_request_chat_template:
        # NOTE: as vLLM: a template is code; the operator decides whether clients may send theirs
        raise bad_request("'chat_template': a request's own chat template is refused unless the router runs with "
                          "--trust-request-chat-template", param="chat_template")
    if options.add_generation_prompt and options.continue_final_message:
        # NOTE: as vLLM: a generation prompt opens a new turn, which contradicts continuing the last one
        raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true; set "
                          "'add_generation_prompt': false", param="continue_final_message")
    return options


def render_chat(messages, tokenizer: Tokenizer, options: ChatTemplateOptions = ChatTemplateOptions(),
                tools: tuple[dict, ...] | None = None) -> str:
    """The prompt text of a chat: ending with the assistant's generation prompt, or inside the final message
    (continue_final_message); tools: the template's `tools`."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of messages", param="messages")
    plain = [plain_message(message, i) for i, message in enumerate(messages)]
    variables = {**options.template_kwargs, **({"tools": list(tools)} if tools else {})}
    try:
        text = tokenizer.apply_chat_template(plain, options.add_generation_prompt, options.chat_template, variables)
    except (jinja2.TemplateError, ValueError, TypeError) as error:
        raise bad_request(f"the chat template refused these messages: {error}", param="messages") from None
    return cut_after_final_message(text, plain[-1]["content"]) if options.continue_final_message else text


def cut_after_final_message(text: str, final_content: str) -> str:
    """transformers' continue_final_message: the rendered text up to the end of the final message's content."""
    content = final_content.strip()
    at = text.rfind(content) if content else -1
    if at < 0:
        raise bad_request("continue_final_message: the chat template does not render the final message's content "
                          "verbatim", param="continue_final_message")
    return text[:at + len(content)]


def plain_message(message, index: int) -> dict:
    """The message as the template sees it: its content as text, every other key as sent. NOTE: clients resend
    the assistant's reply whole (refusal, annotations, audio, function_call, tool_calls: null), and roles other
    than OpenAI's (custom ones, "tool") are the template's to render or refuse, as vLLM does."""
    where = f"messages[{index}]"
    if is_tool_message(message):
        return template_tool_message(message, where, content_text)
    if not isinstance(message, dict):
        raise bad_request(f"'{where}' must be an object with 'role' and 'content'", param="messages")
    role = message.get("role")
    if not (is_text(role) and role):
        raise bad_request(f"'{where}.role' must be a non-empty string", param="messages")
    content = message.get("content")
    # NOTE: an assistant message that only calls tools has content null
    text = "" if content is None and "content" in message else content_text(content, where)
    return {**message, "role": TEMPLATE_ROLES.get(role, role), "content": text}


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
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def echoed_content(messages: list, role: str = "assistant") -> str:
    """Chat echo (vLLM's): the last message's content when it has the response's role, else ""."""
    last = messages[-1]
    return content_text(last["content"], "messages[-1]") if last.get("role") == role and last.get("content") else ""
