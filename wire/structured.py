"""A request's structured-output constraint as it travels (torch-free: the router builds it, the nodes compile it).

One kind per request, as vLLM's StructuredOutputsParams: a JSON schema, any JSON object, a regex, one of a list of
strings, or an EBNF grammar. The nodes compile it with xgrammar (corun/structured.py); the router only checks what
it can without the grammar engine (router/api/structured.py), so a spec the engine refuses is the node's 400.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

StructuredKind = Literal["json", "json_object", "regex", "choice", "grammar"]
MAX_SPEC_CHARS = 1 << 20
"""Longest schema, regex or grammar text (and the choices' total length): a bound on a node's compile work."""
MAX_CHOICES = 1024


def invalid_constraint(kind: str, reason: str) -> str:
    """How a node refuses a constraint that does not compile (corun/structured.py), reason: the grammar library's."""
    return f"invalid {kind} constraint: {reason}"


@dataclass(frozen=True)
class StructuredOutput:
    kind: StructuredKind
    """json: spec is a JSON schema's text; json_object: any JSON object (spec unused); regex: spec is the pattern;
    choice: the output is one of choices; grammar: spec is an EBNF grammar (xgrammar's GBNF dialect, root rule
    `root`)."""
    spec: str = ""
    choices: tuple[str, ...] = field(default_factory=tuple)
    any_whitespace: bool = True
    """JSON kinds: any whitespace between tokens (vLLM's default; disable_any_whitespace turns it off)."""

    def __post_init__(self):
        object.__setattr__(self, "choices", tuple(self.choices))
        if len(self.spec) > MAX_SPEC_CHARS or sum(map(len, self.choices)) > MAX_SPEC_CHARS:
            raise ValueError(f"a structured output spec has at most {MAX_SPEC_CHARS} characters")
        if self.kind == "choice" and not 1 <= len(self.choices) <= MAX_CHOICES:
            raise ValueError(f"a choice constraint needs 1 to {MAX_CHOICES} choices")
        if self.kind in ("json", "regex", "grammar") and not self.spec:
            raise ValueError(f"a {self.kind} constraint needs a non-empty spec")

    def grammar_text(self) -> str:
        """choice as an EBNF grammar (vLLM's choice_as_grammar): root ::= "a" | "b"."""
        return "root ::= " + " | ".join(f'"{escape_ebnf(c)}"' for c in self.choices)


EBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_ebnf(text: str) -> str:
    return "".join(EBNF_ESCAPES.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch)
                   for ch in text)
