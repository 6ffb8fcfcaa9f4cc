"""Structured outputs on the engine (tiny random-weight model, float32, CPU): the constraint holds, and the contract
holds with it (a row's mask is a function of its own request's output so far).

With random weights the unconstrained output is garbage: a valid JSON document, a regex match or a choice can only
come from the mask (each check's inverse shows the unconstrained output is not one).
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from corun import LLM, SamplingParams
from corun.request import Request
from corun.structured import BATCH_FILL_ROWS, Grammars, apply_token_bitmask, num_bitmask_words
from wire.structured import StructuredOutput

pytestmark = pytest.mark.numerics

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
# NOTE: strings bounded by pattern, not maxLength: xgrammar 0.2.8's maxLength strings admit raw control characters
# (root_characters ::= [^"\\\r\n]), which strict JSON refuses
JSON_SPEC = StructuredOutput("json", json.dumps(SCHEMA), any_whitespace=False)
PROMPTS = ["The river", "Seven numbers and a long walk", "Once upon a time in a quiet valley"]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, mode="fixed_shape", max_num_seqs=4)


def params(spec: StructuredOutput | None, seed: int = 1, **overrides) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.8, "seed": seed, "max_tokens": 64, "logprobs": 2, "structured": spec,
                             **overrides})


def completion(out):
    return out.outputs[0]


def test_json_schema_output_parses_and_validates(llm):
    outs = llm.generate(PROMPTS, params(JSON_SPEC))
    for out in outs:
        assert completion(out).finish_reason == "stop"
        jsonschema.validate(json.loads(completion(out).text), SCHEMA)
    # NOTE: inverse: the same requests without the constraint are not JSON (random weights)
    for out in llm.generate(PROMPTS, params(None)):
        with pytest.raises(ValueError):
            json.loads(completion(out).text)


def test_json_object_regex_and_choice(llm):
    object_out = completion(llm.generate(PROMPTS[0], params(StructuredOutput("json_object", any_whitespace=False),
                                                            max_tokens=128))[0])
    assert object_out.finish_reason != "stop" or isinstance(json.loads(object_out.text), dict)
    assert object_out.text.startswith("{")
    pattern = r"[a-z]{2,5}-[0-9]{3}"
    for out in llm.generate(PROMPTS, params(StructuredOutput("regex", pattern))):
        assert re.fullmatch(pattern, completion(out).text) and completion(out).finish_reason == "stop"
    choices = ("yes", "no", "maybe \"so\"")
    for out in llm.generate(PROMPTS, params(StructuredOutput("choice", choices=choices))):
        assert completion(out).text in choices
    grammar = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'
    for out in llm.generate(PROMPTS, params(StructuredOutput("grammar", grammar))):
        assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", completion(out).text)
    # NOTE: inverse: unconstrained, no output matches the regex
    assert not any(re.fullmatch(pattern, completion(out).text) for out in llm.generate(PROMPTS, params(None)))


@pytest.mark.parametrize("greedy", [False, True])
def test_constrained_request_alone_equals_batched(llm, greedy):
    """Tokens and logprobs bitwise the same alone and beside other requests (constrained and not) at other slots."""
    target = params(JSON_SPEC, seed=5, temperature=0.0 if greedy else 0.9)
    alone = completion(llm.generate(PROMPTS[0], target)[0])
    others = [params(None, seed=8), params(StructuredOutput("regex", "[0-9]{4,40}"), seed=9)]
    batched = llm.generate(PROMPTS[1:] + PROMPTS[:1], others + [target])
    together = completion(batched[-1])
    assert together.token_ids == alone.token_ids
    assert together.logprobs == alone.logprobs  # NOTE: TokenLogprobs compare floats exactly
    # NOTE: inverse: the comparison sees a difference: the same request unconstrained gives other tokens
    assert completion(llm.generate(PROMPTS[0], params(None, seed=5, temperature=target.temperature))[0]).token_ids \
        != alone.token_ids


def test_invalid_specs_are_refused(llm):
    for spec in (StructuredOutput("regex", "(ab"), StructuredOutput("json", "{not json"),
                 StructuredOutput("grammar", "root ::= missing_rule")):
        with pytest.raises(ValueError, match=f"invalid {spec.kind} constraint"):
            llm.generate(PROMPTS[0], params(spec))


def test_state_rebuilt_from_tokens_equals_state_advanced_step_by_step(tiny_model_dir, llm):
    """A decode node rebuilds a request's grammar state from its tokens so far (the prefill node's first token):
    its mask is the one of a matcher advanced token by token. Inverse: another output prefix gives another mask."""
    out = completion(llm.generate(PROMPTS[0], params(JSON_SPEC))[0])
    vocab_size, eos_ids = llm.engine.runner.arch.vocab_size, llm.engine.eos_token_ids

    def request(output_token_ids):
        created = Request.create("r", [1, 2], params(JSON_SPEC), 1, eos_ids)
        created.output_token_ids.extend(output_token_ids)
        return created

    stepwise, advanced = Grammars(tiny_model_dir), request([])
    for token_id in out.token_ids[:5]:
        stepwise.bitmask([advanced], 1, vocab_size)
        advanced.output_token_ids.append(token_id)
    stepwise_mask = stepwise.bitmask([advanced], 1, vocab_size)
    assert torch.equal(Grammars(tiny_model_dir).bitmask([request(out.token_ids[:5])], 1, vocab_size), stepwise_mask)
    assert not torch.equal(Grammars(tiny_model_dir).bitmask([request(out.token_ids[:2])], 1, vocab_size),
                           stepwise_mask)


def test_mask_leaves_other_rows_bits_alone():
    """apply_token_bitmask: an all-ones row is bitwise unchanged; a masked row is -inf exactly where its bits are 0."""
    vocab_size = 100
    logits = torch.randn(3, vocab_size, generator=torch.Generator().manual_seed(0))
    bitmask = torch.full((3, num_bitmask_words(vocab_size)), -1, dtype=torch.int32)
    bitmask[1] = 0
    bitmask[1, 0] = 0b1010  # tokens 1 and 3
    masked = apply_token_bitmask(logits, bitmask)
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    assert torch.isfinite(masked[1]).nonzero().flatten().tolist() == [1, 3]
    assert torch.equal(masked[1, [1, 3]], logits[1, [1, 3]])


def test_batch_fill_gives_each_row_its_own_mask(tiny_model_dir, llm):
    """From BATCH_FILL_ROWS rows on, xgrammar's threads fill the masks: each row's equals its mask filled alone."""
    out = completion(llm.generate(PROMPTS[0], params(JSON_SPEC))[0])
    vocab_size, eos_ids = llm.engine.runner.arch.vocab_size, llm.engine.eos_token_ids
    requests = []
    for i in range(BATCH_FILL_ROWS + 3):
        request = Request.create(f"r{i}", [1], params(JSON_SPEC if i % 4 else None), 1, eos_ids)
        request.output_token_ids.extend(out.token_ids[:i % 7])
        requests.append(request)
    together = Grammars(tiny_model_dir).bitmask(requests, len(requests) + 2, vocab_size)
    for row, request in enumerate(requests):
        alone = Grammars(tiny_model_dir).bitmask([request], 1, vocab_size)
        assert torch.equal(together[row], alone[0] if alone is not None else torch.full_like(together[row], -1))
    assert (together[-2:] == -1).all()  # NOTE: padding rows allow everything
    assert not torch.equal(together[1], together[2]), "inverse: rows at other points get other masks"


def test_the_vllm_backend_refuses_constraints(tiny_model_dir):
    """Its sampling runs inside vLLM's engine, where no mask is applied: a constraint would be silently ignored."""
    from corun.scheduler import RequestRejected, check_request
    from wire.config import EngineConfig

    config = EngineConfig(model=tiny_model_dir)
    check_request("r", [1, 2], params(JSON_SPEC), config, 2048)  # NOTE: inverse: the native backend takes it
    vllm_config = SimpleNamespace(**{name: getattr(config, name) for name in ("scheduler", "max_logprobs", "model")},
                                  backend="vllm")
    with pytest.raises(RequestRejected, match="native engine backend"):
        check_request("r", [1, 2], params(JSON_SPEC), vllm_config, 2048)


def test_a_finished_grammar_allows_only_stop_tokens(llm):
    """With ignore_eos the request goes on past the grammar's end: every later token is a stop token (EOS)."""
    stop_ids = llm.engine.eos_token_ids | {llm.tokenizer.eos_token_id}
    out = completion(llm.generate(PROMPTS[0], params(StructuredOutput("regex", "ab"), ignore_eos=True,
                                                     max_tokens=8))[0])
    first_stop = next(i for i, t in enumerate(out.token_ids) if t in stop_ids)
    assert out.finish_reason == "length" and llm.tokenizer.decode(out.token_ids[:first_stop]) == "ab"
    assert set(out.token_ids[first_stop:]) <= stop_ids
    # NOTE: inverse: without ignore_eos the request ends at the first stop token
    ended = completion(llm.generate(PROMPTS[0], params(StructuredOutput("regex", "ab"), max_tokens=8))[0])
    assert ended.token_ids[:-1] == out.token_ids[:first_stop] and ended.token_ids[-1] in stop_ids
    assert ended.finish_reason == "stop"
