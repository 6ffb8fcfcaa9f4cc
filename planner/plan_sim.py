"""A seeded discrete-event simulation of a P:D cluster, to check the planner's analytic answer.

What it replays (as the cluster does it):
- Poisson arrivals; each draws an (input, output) sample.
- Router: a prompt goes to the prefill server with the fewest outstanding prompt tokens, then (once prefilled)
  to the decode instance with the fewest unfinished requests; ties to the lowest index.
- Prefill server: FIFO, one request at a time, for the fitted isolated-prefill time. A request whose output is
  one token ends there.
- Decode instance: FIFO; admits the head while a slot and KV for its whole sequence are free, at step boundaries
  (at once when idle); token 1 streams at admission (KV transfer taken as instantaneous). Each step costs
  a + b * (total context of the active rows) and gives every active row one token. With a swap space
  (DecodeConfig.swap_tokens) admission counts the whole sequences against KV + swap space, and a step runs the
  oldest requests whose held tokens (block-rounded, through the token it writes) fit the KV; the newer ones pause.
TTFT = token 1 streamed - arrival; TPOT = (last token - token 1) / (output - 1). The cluster starts empty and
the longest requests take a while to pile up, so the figures cover only arrivals (and busy time) after a warm-up:
the longer of warmup_fraction of the arrival span and the longest decode residence seen, at most half the span.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass

import numpy as np

from planner.capacity_model import QUANTILE
from planner.plan import split_too_long


@dataclass(frozen=True)
class SimResult:
    num_prefill: int
    num_decode: int
    num_measured: int
    warmup_s: float
    ttft_p99_s: float
    tpot_p99_s: float
    mean_step_s: float
    prefill_utilization: float
    decode_slot_utilization: float
    decode_kv_utilization: float

    @property
    def max_utilization(self) -> float:
        return max(self.prefill_utilization, self.decode_slot_utilization, self.decode_kv_utilization)

    def meets(self, slo) -> bool:
        return self.ttft_p99_s <= slo.ttft_p99_s and self.tpot_p99_s <= slo.tpot_p99_s

    def to_dict(self, slo=None) -> dict:
        result = {k: round(v, 5) if isinstance(v, float) else v for k, v in self.__dict__.items()}
        return result if slo is None else result | {"meets_slo": self.meets(slo)}


class SimRequest:
    __slots__ = ("arrival", "num_input", "num_output", "prefill_s", "reserved", "first_token", "last_token",
                 "steps_done")

    def __init__(self, arrival: float, num_input: int, num_output: int, prefill_s: float, reserved: int):
        self.arrival, self.num_input, self.num_output = arrival, num_input, num_output
        self.prefill_s, self.reserved = prefill_s, reserved
        self.first_token = self.last_token = None
        self.steps_done = 0
        """With a swap space: decode steps it has had (a paused request has none)."""


class PrefillServer:
    def __init__(self):
        self.queue: deque[SimRequest] = deque()
        self.outstanding_tokens = 0
        self.busy = False


class DecodeInstance:
    def __init__(self, admission_tokens: int):
        self.waiting: deque[SimRequest] = deque()
        self.num_unfinished = 0
        self.num_running = 0
        self.free_kv = admission_tokens
        """What admission may still reserve (whole sequences)."""
        self.admitted: list[SimRequest] = []
        """With a swap space: the admitted requests, oldest first."""
        self.stepping_rows: list[SimRequest] = []
        """With a swap space: the requests the step in flight runs."""
        self.total_context = 0
        """Tokens the next step attends, summed over the running requests."""
        self.finishing: list = []
        """Heap of (step count at which it finishes, tie-break, request)."""
        self.num_steps = 0
        self.stepping = False


class ClusterSim:
    def __init__(self, model, decode, num_prefill: int, num_decode: int):
        if num_prefill < 1 or num_decode < 1:
            raise ValueError("the simulation needs at least one prefill and one decode instance")
        self.model, self.decode = model, decode
        self.prefill_servers = [PrefillServer() for _ in range(num_prefill)]
        self.decode_instances = [DecodeInstance(decode.admission_tokens) for _ in range(num_decode)]
        self.swap = decode.swap_tokens > 0
        self.events: list = []
        self.order = itertools.count()
        self.now = 0.0
        self.prefill_log: list[tuple[float, float]] = []
        """(start, seconds) of every prefill."""
        self.step_log: list[tuple[float, float, int, int, int]] = []
        """(start, seconds, admitted requests, reserved KV tokens, held KV tokens) of every decode step, all
        instances (held: the reservations without a swap space)."""

    def at(self, time: float, handler, arg) -> None:
        heapq.heappush(self.events, (time, next(self.order), handler, arg))

    def run(self, requests: list[SimRequest]) -> None:
        for request in requests:
            self.at(request.arrival, self.arrive, request)
        while self.events:
            self.now, _, handler, arg = heapq.heappop(self.events)
            handler(arg)

    def arrive(self, request: SimRequest) -> None:
        server = min(self.prefill_servers, key=lambda s: s.outstanding_tokens)  # NOTE: min keeps the first tie
        server.outstanding_tokens += request.num_input
        server.queue.append(request)
        if not server.busy:
            self.start_prefill(server)

    def start_prefill(self, server: PrefillServer) -> None:
        request = server.queue.popleft()
        server.busy = True
        self.prefill_log.append((self.now, request.prefill_s))
        self.at(self.now + request.prefill_s, self.finish_prefill, (server, request))

    def finish_prefill(self, server_and_request) -> None:
        server, request = server_and_request
        server.outstanding_tokens -= request.num_input
        server.busy = False
        if server.queue:
            self.start_prefill(server)
        if request.num_output == 1:
            request.first_token = request.last_token = self.now
            return
        instance = min(self.decode_instances, key=lambda d: d.num_unfinished)
        instance.num_unfinished += 1
        instance.waiting.append(request)
        if not instance.stepping:
            self.admit(instance)
            self.start_step(instance)

    def admit(self, instance: DecodeInstance) -> None:
        while instance.waiting and instance.num_running < self.decode.max_num_seqs and \
                instance.waiting[0].reserved <= instance.free_kv:
            request = instance.waiting.popleft()
            instance.num_running += 1
            instance.free_kv -= request.reserved
            request.first_token = self.now
            if self.swap:
                instance.admitted.append(request)
                continue
            instance.total_context += request.num_input + 1
            finish_at = instance.num_steps + request.num_output - 1
            heapq.heappush(instance.finishing, (finish_at, next(self.order), request))

    def start_step(self, instance: DecodeInstance) -> None:
        if self.swap:
            self.start_swap_step(instance)
            return
        instance.stepping = instance.num_running > 0
        if instance.stepping:
            step_s = float(self.model.decode.seconds(instance.total_context))
            reserved_kv = self.decode.admission_tokens - instance.free_kv
            self.step_log.append((self.now, step_s, instance.num_running, reserved_kv, reserved_kv))
            self.at(self.now + step_s, self.finish_step, instance)

    def start_swap_step(self, instance: DecodeInstance) -> None:
        """The oldest admitted requests whose blocks, through the token the step writes, fit the KV run; the rest
        wait paused (the oldest always fits: a sample longer than the KV is rejected, split_too_long)."""
        rows, held, context = [], 0, 0
        for request in instance.admitted:
            tokens = request.num_input + 1 + request.steps_done
            blocks = -(-tokens // self.decode.block_size) * self.decode.block_size
            if held + blocks > self.decode.kv_capacity_tokens:
                break
            rows.append(request)
            held, context = held + blocks, context + tokens
        instance.stepping_rows = rows
        instance.stepping = bool(rows)
        if rows:
            step_s = float(self.model.decode.seconds(context))
            reserved_kv = self.decode.admission_tokens - instance.free_kv
            self.step_log.append((self.now, step_s, instance.num_running, reserved_kv, held))
            self.at(self.now + step_s, self.finish_swap_step, instance)

    def finish_swap_step(self, instance: DecodeInstance) -> None:
        for request in instance.stepping_rows:
            request.steps_done += 1
            if request.steps_done == request.num_output - 1:
                instance.admitted.remove(request)
                instance.num_running -= 1
                instance.num_unfinished -= 1
                instance.free_kv += request.reserved
                request.last_token = self.now
        self.admit(instance)
        self.start_step(instance)

    def finish_step(self, instance: DecodeInstance) -> None:
        instance.num_steps += 1
        instance.total_context += instance.num_running
        while instance.finishing and instance.finishing[0][0] == instance.num_steps:
            request = heapq.heappop(instance.finishing)[2]
            instance.num_running -= 1
            instance.num_unfinished -= 1
            instance.free_kv += request.reserved
            instance.total_context -= request.num_input + request.num_output
            request.last_token = self.now
        self.admit(instance)
        self.start_step(instance)


def make_requests(model, workload, decode, num_requests: int, seed: int) -> list[SimRequest]:
    if split_too_long(workload, decode)[1]:
        raise ValueError("the workload has samples the cluster would reject (split_too_long drops them)")
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    rng = random.Random(seed)
    samples = [rng.choice(workload.lengths) for _ in range(num_requests)]
    prefill_s = model.prefill.seconds([num_in for num_in, _ in samples])
    reserved = decode.reserved_tokens([num_in + num_out for num_in, num_out in samples])
    requests, now = [], 0.0
    for (num_in, num_out), seconds, tokens in zip(samples, prefill_s, reserved, strict=True):
        now += rng.expovariate(workload.rate)
        requests.append(SimRequest(now, num_in, num_out, float(seconds), int(tokens)))
    return requests


def simulate(model, workload, decode, num_prefill: int, num_decode: int, num_requests: int = 20000, seed: int = 0,
             warmup_fraction: float = 0.2) -> SimResult:
    sim = ClusterSim(model, decode, num_prefill, num_decode)
    requests = make_requests(model, workload, decode, num_requests, seed)
    sim.run(requests)
    span = requests[-1].arrival
    longest_residence = max(r.last_token - r.first_token for r in requests)
    warmup_s = min(max(warmup_fraction * span, longest_residence), span / 2)
    measured = [r for r in requests if r.arrival >= warmup_s]
    ttfts = [r.first_token - r.arrival for r in measured]
    tpots = [(r.last_token - r.first_token) / (r.num_output - 1) for r in measured if r.num_output > 1]
    steps = np.array([step[1:] for step in sim.step_log if warmup_s <= step[0] < span]).reshape(-1, 4)
    seconds, running, reserved_kv, held_kv = steps.T  # [num_steps] each
    window_s = span - warmup_s
    kv_busy = float(seconds @ reserved_kv) / (num_decode * decode.admission_tokens * window_s)
    if decode.swap_tokens:  # NOTE: as capacity_model.kv_utilization
        kv_busy = max(kv_busy, float(seconds @ held_kv) / (num_decode * decode.kv_capacity_tokens * window_s))
    return SimResult(
        num_prefill, num_decode, len(measured), warmup_s, float(np.quantile(ttfts, QUANTILE)),
        float(np.quantile(tpots, QUANTILE)) if tpots else 0.0, float(seconds.mean()) if len(seconds) else 0.0,
        sum(s for start, s in sim.prefill_log if warmup_s <= start < span) / (num_prefill * window_s),
        float(seconds @ running) / (num_decode * decode.max_num_seqs * window_s), kv_busy)


def check_plan(plan, model, workload, slo, decode, max_utilization: float = 0.9, num_requests: int = 20000,
               seed: int = 0) -> dict:
    """Simulate the plan and one instance fewer in each pool. They agree with the plan when the plan meets the
    SLO and each smaller cluster misses it or runs busier than max_utilization."""
    if not plan.feasible:
        return {}
    runs = {"plan": (plan.num_prefill, plan.num_decode), "one_fewer_prefill": (plan.num_prefill - 1, plan.num_decode),
            "one_fewer_decode": (plan.num_prefill, plan.num_decode - 1)}
    results = {name: simulate(model, workload, decode, p, d, num_requests, seed)
               for name, (p, d) in runs.items() if p >= 1 and d >= 1}
    agrees = results["plan"].meets(slo) and all(not r.meets(slo) or r.max_utilization > max_utilization
                                                 for name, r in results.items() if name != "plan")
    return {"agrees": agrees} | {name: r.to_dict(slo) for name, r in results.items()}
