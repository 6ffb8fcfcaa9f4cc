"""VllmModelRunner: corun's ModelRunner interface (run_prefill, run_decode, kv_cache) over a vLLM worker, so the
prefill and decode nodes run vLLM engines with their own schedules, leases, NIXL reads and protocol unchanged.

The node decides every step (one prompt's chunk, or every running request's decode step) and owns the KV blocks
(its BlockManager over vLLM's block pool; vLLM's own scheduler never runs). Each step goes to the worker as the
SchedulerOutput a vLLM scheduler would have made: a request the worker has not seen is a NewRequestData with the
node's block ids and its computed tokens (a decode node's request arrives with its prompt's KV read over NIXL and
token 1 from prefill: its vLLM prompt is the prompt plus token 1, all computed but the last), a known one a
CachedRequestData entry, and requests the node no longer schedules are finished. Decode steps run at N rows
(worker.FixedDecodeShape). Tokens are sampled from the step's raw logits by corun's own Sampler (n first tokens on
a prefill node, logprobs), and checked against what the worker appended (the processor's request-keyed choice).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from corun.device_facts import resolved_on_device
from corun.model_runner import SampledToken, sample_requests
from corun.request import Request
from corun.sampler import Sampler
from corun.scheduler import PrefillChunk
from corun.vllm_backend.engine import start_vllm_engine, vllm_params
from corun.vllm_backend.engine_args import eos_token_ids
from wire.config import EngineConfig
from wire.outputs import TokenLogprobs
from wire.sampling_params import SamplingParams


@dataclass(frozen=True)
class VllmArch:
    """What a node reads of its model (ModelArchConfig's fields), from vLLM's config and its KV tensors."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    num_layers: int
    num_kv_heads: int
    head_dim: int


class VllmKVCache:
    """vLLM's KV: one block-major tensor per layer [num_blocks, kv heads, block_size, 2 * head_dim] (CPU layout);
    the transfer agent registers each as a segment (transfer/reads.py)."""

    def __init__(self, layers: list[torch.Tensor]):
        self.layers = layers
        self.data = tuple(layers)
        self.num_blocks = layers[0].shape[0]

    def copy_blocks(self, source_ids: list[int], target_ids: list[int]) -> None:
        """Blocks target_ids[i] become copies of source_ids[i], in every layer."""
        if len(source_ids) != len(target_ids):
            raise ValueError(f"{len(source_ids)} source blocks for {len(target_ids)} targets")
        if source_ids:
            source, target = torch.tensor(source_ids), torch.tensor(target_ids)
            for layer in self.layers:
                layer[target] = layer[source]


@dataclass
class WorkerRequest:
    vllm_id: str
    num_prompt_outputs: int
    """Output tokens the request already had when the worker first saw it (in its vLLM prompt)."""


def tensor_logprobs(tensors, num_top: int) -> list[TokenLogprobs]:
    """vLLM's LogprobsTensors of prompt tokens (per row: the target token, then the top alternatives) -> corun's."""
    ids, values = tensors.logprob_token_ids.tolist(), tensors.logprobs.tolist()
    return [TokenLogprobs(row_ids[0], row_values[0], tuple(zip(row_ids[1:num_top + 1], row_values[1:num_top + 1])))
            for row_ids, row_values in zip(ids, values, strict=True)]


def unsupported_settings(config: EngineConfig) -> list[str]:
    sched = config.scheduler
    problems = []
    if sched.mode != "fixed_shape":
        problems.append(f"mode {sched.mode} (nodes on vLLM run fixed_shape's schedule)")
    if sched.prefill_pack_tokens or sched.prefill_buckets or sched.decode_step_sizes:
        problems.append("packed or bucketed prefill and decode_step_sizes (native engine features)")
    return problems


class VllmModelRunner:
    decode_graph = None
    """vLLM captures its own decode graph on CUDA (engine_args)."""

    def __init__(self, config: EngineConfig, capture_decode_graph: bool = True):
        config = resolved_on_device(config)
        problems = unsupported_settings(config)
        if problems:
            raise ValueError("--engine vllm nodes do not support: " + "; ".join(problems))
        self.config = config
        self.vllm = start_vllm_engine(config)
        layers = self.vllm.collective_rpc(lambda worker: worker.model_runner.kv_caches)[0]
        self.kv_cache = VllmKVCache(layers)
        _, num_kv_heads, _, doubled_head_dim = layers[0].shape
        self.arch = VllmArch(self.vllm.model_config.get_vocab_size(), eos_token_ids(self.vllm.model_config),
                             len(layers), num_kv_heads, doubled_head_dim // 2)
        self.sampler = Sampler()
        self.known: dict[Request, WorkerRequest] = {}
        """corun request (hashed by identity) -> the worker's request, for requests the worker holds.
        NOTE: the request itself, not its id(): a finished request's id may be reused by the next one."""
        self.ids = itertools.count()
        self.last_output = None
        """vLLM's ModelRunnerOutput of the last step."""
        self.num_prefill_forwards = self.num_decode_forwards = 0
        self.warm_up()
        self.num_prefill_forwards = self.num_decode_forwards = 0

    def warm_up(self) -> None:
        """A prefill and a decode step of a throwaway request in block 1, before the node serves: vLLM compiles some
        sampler ops at their first call (~10 s on CPU), which would stall the node's loop past its heartbeats."""
        params = SamplingParams(temperature=1.0, seed=0, max_tokens=2, logprobs=1)
        request = Request.create("corun-warm-up", [0] * 4, params, 0, frozenset())
        request.block_ids = [1]
        (first,) = self.run_prefill([PrefillChunk(request, 0, request.num_prompt_tokens)])
        request.append_token(first.token_id, first.logprobs)
        self.run_decode([request])  # NOTE: the worker forgets it at the next step (it is no longer scheduled)

    def forward_counts(self) -> dict[str, int]:
        return {"num_prefill_forwards": self.num_prefill_forwards, "num_decode_forwards": self.num_decode_forwards}

    decode_in_flight = None
    """vLLM's worker steps one at a time here: no decode step runs ahead of the host."""

    def overlaps(self, requests: list[Request]) -> bool:
        return False

    def finish_decode_in_flight(self) -> list[SampledToken]:
        return []

    def run_prefill(self, chunks: list[PrefillChunk]) -> list[SampledToken]:
        """One prompt's chunk, alone; token 1 of each of its n samples when it is the prompt's last."""
        (chunk,) = chunks  # NOTE: unsupported_settings refuses packed prefill
        self.num_prefill_forwards += 1
        logits = self.execute([chunk.request], {chunk.request: chunk.num_tokens})
        chunk.request.num_computed_tokens = chunk.start + chunk.num_tokens
        if not chunk.is_last:
            return []
        if chunk.request.params.prompt_logprobs is not None:
            tensors = self.last_output.prompt_logprobs_dict[self.known[chunk.request].vllm_id]
            chunk.request.prompt_logprobs = [None, *tensor_logprobs(tensors, chunk.request.params.prompt_logprobs)]
        return sample_requests(self.sampler, logits, [chunk.request], self.config.max_logprobs)

    decode_rides_prefill = multi_chunk_prefill = False
    """vLLM's worker runs one kind of step at a time here: the engine refuses corun's shape settings."""

    def run_prefill_and_decode(self, chunks: list[PrefillChunk], decodes: list[Request]) -> list[SampledToken]:
        return self.run_decode(decodes) + [token for chunk in chunks for token in self.run_prefill([chunk])]

    def run_decode(self, requests: list[Request]) -> list[SampledToken]:
        self.num_decode_forwards += 1
        logits = self.execute(requests, dict.fromkeys(requests, 1))
        sampled = sample_requests(self.sampler, logits, requests, self.config.max_logprobs)
        self.check_worker_agrees(requests, sampled)
        return sampled

    def check_worker_agrees(self, requests: list[Request], sampled: list[SampledToken]) -> None:
        """The worker's next input is the token its processor chose: it must be the one sampled here."""
        output = self.last_output
        for request, item in zip(requests, sampled, strict=True):
            worker_token = output.sampled_token_ids[output.req_id_to_index[self.known[request].vllm_id]][0]
            if worker_token != item.token_id:
                raise RuntimeError(f"vLLM's worker took token {worker_token} for {request.request_id}, corun's "
                                   f"sampler {item.token_id}: their sampling differs")

    def execute(self, requests: list[Request], num_tokens: dict[Request, int]) -> torch.Tensor:
        """One worker step of these requests -> their raw logits rows [len(requests), vocab], in order."""
        self.last_output, logits = self.vllm.collective_rpc("corun_execute",
                                                            args=(self.step_output(requests, num_tokens),))[0]
        return torch.stack([logits[self.known[r].vllm_id] for r in requests])

    def step_output(self, requests: list[Request], num_tokens: dict[Request, int]):
        """The SchedulerOutput of the step: requests the worker has not seen are new, the others cached, and those
        it holds but this step does not schedule are finished (the node ended them)."""
        from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput

        finished_ids = {self.known.pop(r).vllm_id for r in [r for r in self.known if r not in num_tokens]}
        new, cached = [], CachedRequestData.make_empty()
        for request in requests:
            known = self.known.get(request)
            if known is None:
                new.append(self.new_request_data(request))
                continue
            cached.req_ids.append(known.vllm_id)
            cached.new_token_ids.append([])  # NOTE: only pipeline parallelism sends tokens; the worker keeps its own
            cached.new_block_ids.append(None)  # NOTE: the node allocated every block at admission
            cached.num_computed_tokens.append(request.num_computed_tokens)
            cached.num_output_tokens.append(len(request.output_token_ids) - known.num_prompt_outputs)
        scheduled = {self.known[r].vllm_id: num_tokens[r] for r in requests}
        return SchedulerOutput(
            scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=sum(scheduled.values()), scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={}, finished_req_ids=finished_ids, free_encoder_mm_hashes=[])

    def new_request_data(self, request: Request):
        """A request the worker has not seen: its tokens so far (a decode node's ends with token 1), the node's
        blocks, its computed tokens; prompt logprobs only when the worker computes the whole prompt."""
        from vllm.v1.core.sched.output import NewRequestData

        known = self.known[request] = WorkerRequest(f"{request.request_id}#{next(self.ids)}",
                                                    len(request.output_token_ids))
        params = vllm_params(request.params, request.seed, request.num_prompt_tokens, known.vllm_id,
                             with_prompt_logprobs=request.num_computed_tokens == 0)
        return NewRequestData(req_id=known.vllm_id, prompt_token_ids=[*request.prompt_token_ids,
                                                                      *request.output_token_ids],
                              mm_features=[], sampling_params=params, pooling_params=None,
                              block_ids=(list(request.block_ids),), num_computed_tokens=request.num_computed_tokens,
                              lora_request=None)
