"""Structured-output fields of a request body -> one wire.structured.StructuredOutput (or None).

vLLM's fields: `structured_outputs` ({json | regex | choice | grammar | json_object, disable_any_whitespace,
disable_additional_properties}), `response_format` (json_object, json_schema; it overrides structured_outputs, as
vLLM's structured_outputs_from_response_format), and the older `guided_json`, `guided_regex`, `guided_choice`,
`guided_grammar` (vLLM removed them; here they still constrain, rather than being ignored). One constraint kind per
request. The router checks the shapes and that a schema is JSON; whether a schema, regex or grammar compiles is the
nodes' check (xgrammar imports torch, which the router must not): their refusal is the request's 400, naming the
field the constraint came from (refused_constraint).
"""

from __future__ import annotations

import json

from router.api.errors import RequestError, bad_request
from router.api.fields import TEXT, is_str_list, is_text, read_field, shorten
from wire.structured import MAX_CHOICES, MAX_SPEC_CHARS, StructuredOutput

GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}
"""The older fields and the constraint kind each one sets."""
KINDS = ("json", "regex", "choice", "grammar", "json_object")
OPTIONS = frozenset({"disable_any_whitespace", "disable_additional_properties", "whitespace_pattern",
                     "structural_tag", "disable_fallback", "disable_any_whitespace"})


def read_structured(body: dict) -> tuple[StructuredOutput | None, str | None]:
    """The request's constraint: response_format, else structured_outputs, else a guided_* field; and the name of
    the field it came from (None without one)."""
    from_format = read_response_format(body)
    from_fields = read_structured_outputs(body)
    guided = [name for name in GUIDED_FIELDS if body.get(name) is not None]
    if len(guided) > 1 or (guided and from_fields is not None):
        names = ", ".join(guided + (["structured_outputs"] if from_fields is not None else []))
        raise bad_request(f"only one kind of structured output per request, got {names}", param=guided[0])
    read_field(body, "guided_whitespace_pattern", None, lambda v: False, "null (not supported)")
    read_field(body, "guided_decoding_backend", None, lambda v: isinstance(v, str), "a string")
    fields_name = "structured_outputs"
    if guided:
        from_fields = constraint(GUIDED_FIELDS[guided[0]], body[guided[0]], guided[0], any_whitespace=True)
        fields_name = guided[0]
    if from_format is None:
        return from_fields, None if from_fields is None else fields_name
    if from_fields is not None:  # NOTE: vLLM: response_format replaces the kind
        from_format = StructuredOutput(from_format.kind, from_format.spec, any_whitespace=from_fields.any_whitespace)
    return from_format, "response_format"


def read_structured_outputs(body: dict) -> StructuredOutput | None:
    fields = read_field(body, "structured_outputs", None, lambda v: isinstance(v, dict), "an object")
    if fields is None:
        return None
    unknown = sorted(set(fields) - set(KINDS) - OPTIONS)
    if unknown:
        raise bad_request(f"unknown field(s) in 'structured_outputs': {', '.join(map(shorten, unknown))}",
                          param="structured_outputs")
    for option in ("whitespace_pattern", "structural_tag"):
        read_field(fields, option, None, lambda v: False, f"null ('structured_outputs.{option}' is not supported)")
    kinds = [kind for kind in KINDS if fields.get(kind) is not None and fields.get(kind) is not False]
    if len(kinds) != 1:
        raise bad_request("'structured_outputs' must set exactly one of " + ", ".join(KINDS),
                          param="structured_outputs")
    any_whitespace = not read_field(fields, "disable_any_whitespace", False, lambda v: isinstance(v, bool),
                                    "a boolean")
    spec = constraint(kinds[0], fields[kinds[0]], f"structured_outputs.{kinds[0]}", any_whitespace)
    if spec.kind == "json" and read_field(fields, "disable_additional_properties", False,
                                          lambda v: isinstance(v, bool), "a boolean"):
        closed = json.dumps(closed_objects(json.loads(spec.spec)))
        spec = StructuredOutput("json", closed, any_whitespace=any_whitespace)
    return spec


def read_response_format(body: dict) -> StructuredOutput | None:
    """OpenAI's response_format: text (no constraint), json_object, json_schema {name, schema, strict}."""
    response_format = read_field(body, "response_format", None, lambda v: isinstance(v, dict), "an object")
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "json_schema":
        json_schema = response_format.get("json_schema")
        if not isinstance(json_schema, dict) or json_schema.get("schema") is None:
            raise bad_request("'response_format.json_schema' must be an object with a 'schema'",
                              param="response_format")
        return constraint("json", json_schema["schema"], "response_format.json_schema.schema", True)
    raise bad_request("'response_format.type' must be one of text, json_object, json_schema (structural_tag is not "
                      f"supported), got {shorten(kind)}", param="response_format")


def constraint(kind: str, value, name: str, any_whitespace: bool) -> StructuredOutput:
    """One constraint's value checked as far as the router can: a 400 naming the field otherwise."""
    if kind == "json":
        return StructuredOutput("json", schema_text(value, name), any_whitespace=any_whitespace)
    if kind == "json_object":
        if value is not True:
            raise bad_request(f"'{name}' must be true", param=name.split(".")[0])
        return StructuredOutput("json_object", any_whitespace=any_whitespace)
    if kind == "choice":
        if not is_str_list(value) or not 1 <= len(value) <= MAX_CHOICES or not all(map(is_text, value)) or \
                sum(map(len, value)) > MAX_SPEC_CHARS:
            raise bad_request(f"'{name}' must be a list of 1 to {MAX_CHOICES} strings of {TEXT}",
                              param=name.split(".")[0])
        return StructuredOutput("choice", choices=tuple(value))
    if not is_text(value) or not value or len(value) > MAX_SPEC_CHARS:
        raise bad_request(f"'{name}' must be a non-empty string of at most {MAX_SPEC_CHARS} characters of {TEXT}",
                          param=name.split(".")[0])
    return StructuredOutput(kind, value)


def schema_text(value, name: str) -> str:
    """A JSON schema (an object, or its JSON text) -> its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as error:
            raise bad_request(f"'{name}' is not valid JSON: {error}", param=name.split(".")[0]) from None
    if not isinstance(value, dict | bool):
        raise bad_request(f"'{name}' must be a JSON schema (an object), got {shorten(value)}", param=name.split(".")[0])
    text = json.dumps(value)
    if len(text) > MAX_SPEC_CHARS:
        raise bad_request(f"'{name}' has more than {MAX_SPEC_CHARS} characters", param=name.split(".")[0])
    return text


def refused_constraint(field: str, kind: str, reason: str) -> RequestError:
    """A node's refusal of the request's constraint (it does not compile) as the client's 400: the field it came from
    and the grammar library's reason, not the node's name nor the request's id there."""
    return bad_request(f"invalid {kind} constraint in '{field}': {reason}", param=field)


def closed_objects(schema):
    """disable_additional_properties (vLLM's): every object schema without additionalProperties gets false."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: closed_objects(value) for key, value in schema.items()}
    if (closed.get("type") == "object" or "properties" in closed) and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed
