"""vLLM's use_beam_search and length_penalty, read from a request (router/generation/beam_search.py runs it).

Beam search honours what vLLM's does: n (the beam width), max_tokens, ignore_eos, length_penalty, logprobs,
include_stop_str_in_output and skip_special_tokens; temperature and seed change no beam (the steps rank tokens by
their raw logprobs). vLLM ignores the other sampling fields under beam search; here one that would change the
output is a 400, as every output-changing field the router does not honour is (router/api/field_policy.py).
"""

from __future__ import annotations

import dataclasses

from router.api.errors import bad_request
from router.api.fields import bool_field, is_number, read_field
from router.generation.output import BeamSearch, OutputOptions
from wire.sampling_params import SamplingParams

HONOURED = frozenset({"temperature", "max_tokens", "n", "ignore_eos", "logprobs", "seed"})
"""The SamplingParams fields beam search reads (or that change no beam)."""
DEFAULTS = SamplingParams()


def read_beam_search(body: dict, params: SamplingParams, stop_strings: tuple[str, ...], stream: bool,
                     output: OutputOptions, max_logprobs: int) -> BeamSearch | None:
    """None unless use_beam_search; length_penalty alone changes nothing (as vLLM, it is accepted)."""
    length_penalty = float(read_field(body, "length_penalty", 1.0, is_number, "a number"))
    if not bool_field(body, "use_beam_search", False):
        return None
    if stream:
        raise bad_request("Streaming is not currently supported with beam search", param="use_beam_search")
    unhonoured = unhonoured_params(params)
    if stop_strings:
        unhonoured.append("stop")
    if output.echo:
        unhonoured.append("echo")
    if unhonoured:
        raise bad_request(f"beam search does not honour {', '.join(unhonoured)} (vLLM's ignores them)",
                          param="use_beam_search")
    if BeamSearch.num_step_logprobs(params.n, params.logprobs) > max_logprobs:
        raise bad_request(f"beam search asks each step for 2 * n logprobs: n = {params.n} is more than the "
                          f"nodes' max_logprobs ({max_logprobs}) allows", param="n")
    return BeamSearch(length_penalty)


def unhonoured_params(params: SamplingParams) -> list[str]:
    """The SamplingParams fields set (away from their defaults) that beam search would not honour."""
    return [field.name for field in dataclasses.fields(params)
            if field.name not in HONOURED and getattr(params, field.name) != getattr(DEFAULTS, field.name)]
