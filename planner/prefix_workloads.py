"""Workloads whose prompts share prefixes (issue 25), each the shape of a use the prefix cache serves:

- few_shot: an evaluation's few-shot examples, one long shared prefix, then a short question and a short answer;
- multiple_choice: lm-eval's loglikelihood shape: one context, 4 continuations, 1 token each;
- multi_turn: chat conversations of 4 turns, each turn resending the whole history (the previous turns' messages,
  the assistant's replies among them) plus a new user message;
- rl_system_prompt: RL rollouts, one system prompt before each problem, long outputs.

A request's prompt is the first `shared` tokens of its group's token sequence, then tokens of its own
(prefix_groups: (group, shared) per request; make_prompts builds them). Sized to fit max_model_len 1024 (the
built-in tiny model's); the prefix cache hits only on whole prefill chunks, so run them with a prefill_chunk_size
well below the shared lengths (the CPU run: 64).
"""

from __future__ import annotations

import random

SHARED_PREFIX_WORKLOADS = ("few_shot", "multiple_choice", "multi_turn", "rl_system_prompt")


def shared_prefix_requests(name: str, num_requests: int, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """(input tokens, output tokens, group, shared tokens) per request."""
    return {"few_shot": few_shot, "multiple_choice": multiple_choice, "multi_turn": multi_turn,
            "rl_system_prompt": rl_system_prompt}[name](num_requests, rng)


def few_shot(num_requests: int, rng: random.Random) -> list[tuple[int, int, int, int]]:
    prefix = 768
    return [(prefix + rng.randint(16, 64), 8, 0, prefix) for _ in range(num_requests)]


def multiple_choice(num_requests: int, rng: random.Random) -> list[tuple[int, int, int, int]]:
    requests = []
    for question in range(-(-num_requests // 4)):
        context = rng.randint(400, 700)
        requests += [(context + rng.randint(4, 24), 1, question, context) for _ in range(4)]
    return requests[:num_requests]


def multi_turn(num_requests: int, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """NOTE: the assistant's replies in a later turn's history are the group's tokens, not what the model
    generated: the cache holds prompt chunks only, so what it can serve is the earlier turns' prompts either way."""
    requests = []
    for conversation in range(-(-num_requests // 4)):
        history = 0
        for _ in range(4):
            num_in, num_out = history + rng.randint(40, 120), rng.randint(40, 120)
            requests.append((num_in, num_out, conversation, num_in))
            history = num_in + num_out
    return requests[:num_requests]


def rl_system_prompt(num_requests: int, rng: random.Random) -> list[tuple[int, int, int, int]]:
    system = 384
    return [(system + rng.randint(32, 128), rng.randint(64, 256), 0, system) for _ in range(num_requests)]


def group_prompts(lengths, prefix_groups, vocab_size: int, rng: random.Random) -> list[list[int]]:
    """Each request's prompt: its group's first `shared` tokens, then its own random tokens."""
    longest: dict[int, int] = {}
    for (num_in, _), (group, shared) in zip(lengths, prefix_groups, strict=True):
        longest[group] = max(longest.get(group, 0), shared)
    sequences = {group: [rng.randrange(vocab_size) for _ in range(n)] for group, n in sorted(longest.items())}
    return [sequences[group][:shared] + [rng.randrange(vocab_size) for _ in range(num_in - shared)]
            for (num_in, _), (group, shared) in zip(lengths, prefix_groups, strict=True)]
