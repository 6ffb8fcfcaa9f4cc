"""Beam search (vLLM's use_beam_search) run as vLLM's OpenAI server runs it (its BeamSearchOnlineMixin): on top
of ordinary requests. Each step asks every running beam's tokens, as a prompt, for one token with the logprobs of
the 2 * beam_width most likely ones (max_tokens 1: the prefill node alone answers); the beam_width best
continuations by cumulative logprob run on, and a beam whose next token is EOS is put aside as completed. The
beam_width best of the completed and running beams, by cumulative logprob over length ** length_penalty (vLLM's
score), are the choices.

Deterministic as every request is: each step's logprobs are a function of the beam's tokens alone (the contract),
and ties are kept in (beam, token rank) order by stable sorts, never broken by arrival. The step requests go
through the pipeline directly (their tokens are not counted in the generation metrics; the beams are).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from router.generation.output import BeamSearch, ChoiceDelta, OutputOptions
from router.generation.pipeline import GenerationError, generate
from router.nodes.choice import Placement
from router.nodes.pool import NodePool
from wire.outputs import TokenLogprobs
from wire.sampling_params import SamplingParams
from wire.tokenizer import Tokenizer

STEP_SEED = 0
"""The step requests are greedy (temperature 0): no seed changes them, but the pipeline sends one."""


@dataclass(frozen=True)
class Beam:
    token_ids: tuple[int, ...] = ()
    """Generated so far (the prompt not included)."""
    cum_logprob: float = 0.0
    logprobs: tuple[TokenLogprobs, ...] = ()
    """Each generated token's logprob and its step's most likely alternatives."""
    finished: bool = False
    """Ended by EOS."""


async def beam_search_deltas(pool: NodePool, tokenizer: Tokenizer, index: int, request_id: str,
                             prompt_token_ids: list[int], params: SamplingParams, beam_search: BeamSearch,
                             placement: Placement = Placement(),
                             output: OutputOptions = OutputOptions(), tenant: str = "") -> AsyncIterator[ChoiceDelta]:
    """One prompt's params.n best beams as choices index, index + 1, ... (one delta each, at the end); tenant: the
    request's client (router/generation/pipeline.py, generate)."""
    width, eos = params.n, tokenizer.eos_token_id
    step_params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                                 logprobs=BeamSearch.num_step_logprobs(width, params.logprobs))
    running, completed = [Beam()], []
    for step in range(params.max_tokens):
        tops = await asyncio.gather(*(
            next_token_logprobs(pool, f"{request_id}.beam{step}.{i}", [*prompt_token_ids, *beam.token_ids],
                                step_params, placement, tenant)
            for i, beam in enumerate(running)))
        candidates = []
        for beam, top in zip(running, tops, strict=True):
            for token_id, logprob in top.top[:2 * width]:
                grown = Beam((*beam.token_ids, token_id), beam.cum_logprob + logprob,
                             (*beam.logprobs, TokenLogprobs(token_id, logprob, top.top)))
                if token_id == eos and not params.ignore_eos:
                    completed.append(Beam(grown.token_ids if output.include_stop_str_in_output
                                          else beam.token_ids, grown.cum_logprob, grown.logprobs, finished=True))
                else:
                    candidates.append(grown)
        running = sorted(candidates, key=lambda b: b.cum_logprob, reverse=True)[:width]
        if not running:
            break
    ranked = sorted(completed + running, key=lambda b: beam_score(b, len(prompt_token_ids), eos,
                                                                beam_search.length_penalty), reverse=True)
    for rank, beam in enumerate(ranked[:width]):
        yield beam_choice(tokenizer, index + rank, beam, params, output, eos)


async def next_token_logprobs(pool: NodePool, request_id: str, token_ids: list[int], params: SamplingParams,
                              placement: Placement, tenant: str = "") -> TokenLogprobs:
    """The logprobs of the token after token_ids: one max_tokens 1 request."""
    async with contextlib.aclosing(generate(pool, request_id, token_ids, params, STEP_SEED, placement,
                                            tenant=tenant)) as events:
        async for event in events:
            if event.logprobs:
                return event.logprobs[0]
    raise GenerationError(500, f"beam search step {request_id} came back without logprobs")


def beam_score(beam: Beam, num_prompt_tokens: int, eos: int, length_penalty: float) -> float:
    """vLLM's get_beam_search_score: cumulative logprob / length ** length_penalty, the length counting the prompt
    and not a final EOS."""
    length = num_prompt_tokens + len(beam.token_ids) - (1 if beam.token_ids[-1:] == (eos,) else 0)
    return beam.cum_logprob / max(length, 1) ** length_penalty


def beam_choice(tokenizer: Tokenizer, index: int, beam: Beam, params: SamplingParams, output: OutputOptions,
                eos: int) -> ChoiceDelta:
    """As vLLM's: the text leaves out a final EOS; the token ids keep it only with include_stop_str_in_output."""
    text_ids = beam.token_ids[:-1] if beam.token_ids[-1:] == (eos,) else beam.token_ids
    shown = None if params.logprobs is None else tuple(
        TokenLogprobs(lp.token_id, lp.logprob, lp.top[:params.logprobs]) for lp in beam.logprobs)
    return ChoiceDelta(index, tokenizer.decode(list(text_ids), skip_special_tokens=output.skip_special_tokens),
                       beam.token_ids, shown, "stop" if beam.finished else "length")
