"""Prometheus metrics of the router, plus every numeric stat of each node's latest Pong as a gauge.

Request metrics carry vLLM's names and types (vllm:time_to_first_token_seconds, ...), so dashboards built for vLLM
read a CoRun cluster; the cluster's own (HTTP requests, nodes) are corun_*.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from router.nodes.client import NodeStatus
from router.token_tally import StreamedTokenTally, observe_counts
from wire.gc_heap import NUM_GENERATIONS, CollectionPauses
from wire.iteration_tokens import ITERATION_TOKENS_BUCKETS
from wire.iteration_tokens import STAT_KEY as ITERATION_TOKENS_KEY
from wire.iteration_tokens import read_stat as read_iteration_tokens

# NOTE: vLLM's bucket bounds (vllm/v1/metrics/buckets.py), so that a vLLM dashboard's quantiles read the same
TIME_TO_FIRST_TOKEN_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                                 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                                 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                             240.0, 480.0, 960.0, 1920.0, 7680.0)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
GC_PAUSE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""corun_router_gc_pause_seconds: a pause past a few ms holds every stream's next token (a decode step's dispatch
takes ~5 ms at 256 streams)."""
MODEL_LABEL = ("model_name",)
"""vLLM labels its engine families model_name and engine; here the router's families carry model_name (the
served name) and the nodes' families the node instead of the engine (role_label_families)."""
NODE_LABELS = ("node_id", "role")
"""NOTE: no address: /metrics is open to anyone (as vLLM's), so it names nodes, never where they listen (GET
/admin/nodes, behind the API key, has that)."""


def request_tokens_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's request_tokens family: 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


class RouterMetrics:
    """One registry per router (never the global one: tests build many routers in one process).

    With multiprocess_dir (several routers on one port: prometheus_client's multiprocess mode, switched on by
    PROMETHEUS_MULTIPROC_DIR in the process' environment), every series is also written to that directory, and
    render() sums them over the routers, as one router's would be; render_own() is this process' alone."""

    def __init__(self, node_statuses: Callable[[], list[NodeStatus]], count_in_flight: Callable[[], int],
                 multiprocess_dir: str | None = None, model_name: str = "corun"):
        self.registry = CollectorRegistry()
        self.multiprocess_dir = multiprocess_dir
        self.model_name = model_name
        self._node_statuses = node_statuses
        self._count_in_flight = count_in_flight
        if multiprocess_dir is None:
            # NOTE: process_cpu_seconds_total and the other process_* series, as vLLM's /metrics has them (one
            # process' only, so not beside other routers' series)
            ProcessCollector(registry=self.registry)
        self.requests = Counter("corun_router_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        # NOTE: set by refresh(), not set_function: multiprocess mode reads values from the files alone
        self.in_flight = Gauge("corun_router_requests_in_flight", "Prompts admitted and not finished",
                               registry=self.registry, multiprocess_mode="livesum")
        self.cpu_seconds = Gauge("corun_router_process_cpu_seconds", "A router process' CPU time (user + "
                                 "system): what `corun bench --url` turns into router CPU per streamed token; "
                                 "one series per router process (label pid) beside others",
                                 registry=self.registry, multiprocess_mode="all")
        self.time_to_first_token = self.histogram("vllm:time_to_first_token_seconds",
                                                  "From a prompt's start to its first token",
                                                  TIME_TO_FIRST_TOKEN_BUCKETS_S)
        self.inter_token_latency = self.histogram("vllm:inter_token_latency_seconds",
                                                  "Between a prompt's consecutive streamed token groups",
                                                  INTER_TOKEN_LATENCY_BUCKETS_S)
        self.time_per_output_token = self.histogram("vllm:request_time_per_output_token_seconds",
                                                    "A finished prompt's mean gap between its later tokens",
                                                    INTER_TOKEN_LATENCY_BUCKETS_S)
        self.request_latency = self.histogram("vllm:e2e_request_latency_seconds",
                                              "From a prompt's start to its last token", REQUEST_LATENCY_BUCKETS_S)
        self.queue_time = self.histogram("vllm:request_queue_time_seconds",
                                         "A prompt's wait in its prefill node's queue before its first chunk ran",
                                         REQUEST_LATENCY_BUCKETS_S)
        self.inference_time = self.histogram("vllm:request_inference_time_seconds",
                                             "A sample's prefill time plus its decode time (vLLM's RUNNING phase)",
                                             REQUEST_LATENCY_BUCKETS_S)
        self.prefill_time = self.histogram("vllm:request_prefill_time_seconds",
                                           "From a prompt's start to its first token, less its prefill queue time",
                                           REQUEST_LATENCY_BUCKETS_S)
        self.decode_time = self.histogram("vllm:request_decode_time_seconds",
                                          "From a sample's first token to its last", REQUEST_LATENCY_BUCKETS_S)
        self.params_n = self.histogram("vllm:request_params_n", "The n of each prompt", REQUEST_PARAMS_N_BUCKETS)
        self._token_histograms: dict[str, Histogram] = {}
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of prompts started", MODEL_LABEL,
                                     registry=self.registry).labels(model_name)
        self.generated_tokens = Counter("vllm:generation_tokens", "Tokens returned to clients", MODEL_LABEL,
                                        registry=self.registry).labels(model_name)
        self.streamed_tokens = StreamedTokenTally(self.generated_tokens, self.inter_token_latency)
        """Where each streamed token is counted (vllm:generation_tokens, vllm:inter_token_latency_seconds)."""
        self.request_success = Counter("vllm:request_success", "Samples finished, by finish reason",
                                       [*MODEL_LABEL, "finished_reason"], registry=self.registry)
        self.gc_pauses = Histogram("corun_router_gc_pause_seconds", "How long each of the router process' cyclic "
                                   "garbage collections held its event loop, by generation", ["generation"],
                                   buckets=GC_PAUSE_BUCKETS_S, registry=self.registry)
        children = [self.gc_pauses.labels(str(generation)) for generation in range(NUM_GENERATIONS)]
        self.collection_pauses = CollectionPauses(tuple(children[0]._upper_bounds))
        """The process' collections, reported at each refresh; started where the router process starts (a test
        process holds many routers, whose collections are one process')."""
        self.registry.register(NodeStatsCollector(node_statuses, model_name))

    def histogram(self, name: str, documentation: str, buckets) -> Histogram:
        """One of vLLM's histograms, its model_name label set (the router serves one model)."""
        return Histogram(name, documentation, MODEL_LABEL, buckets=buckets,
                         registry=self.registry).labels(self.model_name)

    def token_histogram(self, name: str, max_model_len: int) -> Histogram:
        """vllm:request_prompt_tokens, _generation_tokens or _params_max_tokens: vLLM's request_tokens buckets end
        at max_model_len, which the router learns from the nodes, so each is made at its first observation."""
        if name not in self._token_histograms:
            documentation = TOKEN_HISTOGRAMS[name]
            self._token_histograms[name] = self.histogram(name, documentation, request_tokens_buckets(max_model_len))
        return self._token_histograms[name]

    def refresh(self) -> None:
        """This process' gauges as of now (beside other routers, each refreshes its own every REFRESH_S), and its
        tokens counted since the last loop turn."""
        self.streamed_tokens.flush()
        for generation, counts, total in self.collection_pauses.take():
            observe_counts(self.gc_pauses.labels(str(generation)), counts, total)
        self.in_flight.set(self._count_in_flight())
        times = os.times()
        self.cpu_seconds.set(times.user + times.system)

    def render(self) -> bytes:
        """The router's /metrics: every router's series, summed, where there are several."""
        self.refresh()
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.multiprocess_dir)
        registry.register(NodeStatsCollector(self._node_statuses, self.model_name))
        return generate_latest(registry)

    def render_own(self) -> bytes:
        """This process' series alone (its control port's /metrics)."""
        self.refresh()
        return generate_latest(self.registry)


TOKEN_HISTOGRAMS = {
    "vllm:request_prompt_tokens": "Prompt tokens of each finished sample",
    "vllm:request_generation_tokens": "Tokens generated for each finished sample",
    "vllm:request_params_max_tokens": "The max_tokens of each finished sample",
}


REFRESH_S = 0.5
"""Beside other routers, how often each writes its in-flight count and CPU time for the others' /metrics."""


class NodeStatsCollector(Collector):
    """Reads the nodes' latest Pongs at scrape time: corun_router_node_up and corun_node_<stat> gauges, and vLLM's
    engine families made of them (pool_families)."""

    def __init__(self, node_statuses: Callable[[], list[NodeStatus]], model_name: str = "corun"):
        self._node_statuses = node_statuses
        self._model_name = model_name

    def collect(self) -> Iterator[GaugeMetricFamily]:
        statuses = self._node_statuses()
        up = GaugeMetricFamily("corun_router_node_up", "1 when the node answered a recent ping", labels=NODE_LABELS)
        stat_families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for status in statuses:
            labels = node_labels(status)
            up.add_metric(labels, 1.0 if status.healthy else 0.0)
            counters = set(status.pong.counters) if status.pong is not None else set()
            for key, value in numeric_stats(status).items():
                # NOTE: a counter's exposed name ends in _total (the client library adds it to the family's)
                base = "corun_node_" + metric_name(key).removesuffix("_total")
                kind = CounterMetricFamily if key in counters else GaugeMetricFamily
                family = stat_families.setdefault(f"{kind.__name__}:{base}", kind(base, f"Node stat {key!r}",
                                                                                   labels=NODE_LABELS))
                family.add_metric(labels, float(value))
        yield up
        yield from stat_families.values()
        yield from pool_families(statuses, self._model_name)


ROLES = ("decode", "colocated", "prefill")
"""NOTE: decode first: a client reading one sample of vllm:kv_cache_usage_perc (vLLM has one per engine) gets the
pool where a request's KV lives for its whole decode; a prefill node's is freed once read."""


def pool_families(statuses: list[NodeStatus], model_name: str) -> Iterator:
    """vLLM's engine families for the pool, from the nodes' latest Pongs, each labelled model_name."""
    answered = [status for status in statuses if status.pong is not None]
    running = GaugeMetricFamily("vllm:num_requests_running", "Requests running, over the decode and colocated "
                                "nodes", labels=MODEL_LABEL)
    running.add_metric([model_name], float(sum(s.pong.stats.get("num_running", 0) for s in answered
                                               if s.role in ("decode", "colocated"))))
    waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests queued on the nodes (prefill and decode)",
                                labels=MODEL_LABEL)
    waiting.add_metric([model_name], float(sum(s.pong.stats.get("num_waiting", 0) for s in answered)))
    yield from (running, waiting, kv_cache_usage(answered, model_name), iteration_tokens(answered, model_name))
    # NOTE: decode and colocated nodes with a swap space pause samples to host memory (corun/kv_swap.py,
    # corun/swap_preemption.py); a prefill node never does
    preemptions = CounterMetricFamily("vllm:num_preemptions", "Samples the decode and colocated nodes paused to host "
                                      "memory, over the nodes", labels=MODEL_LABEL)
    preemptions.add_metric([model_name], float(sum(s.pong.stats.get("num_preemptions", 0) for s in answered)))
    # NOTE: the prefill and colocated nodes' prefix caches, in prompt tokens as vLLM counts them (a request asking
    # prompt_logprobs looks nothing up and is not counted); summed over the nodes that answered
    queries = CounterMetricFamily("vllm:prefix_cache_queries", "Prefix cache queries, in prompt tokens, over the "
                                  "nodes", labels=MODEL_LABEL)
    queries.add_metric([model_name], float(sum(s.pong.stats.get("prefix_cache_queries", 0) for s in answered)))
    hits = CounterMetricFamily("vllm:prefix_cache_hits", "Prefix cache hits, in prompt tokens, over the nodes",
                               labels=MODEL_LABEL)
    hits.add_metric([model_name], float(sum(s.pong.stats.get("prefix_cache_hits", 0) for s in answered)))
    yield from (preemptions, queries, hits, cache_config_info(answered, model_name))


def kv_cache_usage(answered: list[NodeStatus], model_name: str) -> GaugeMetricFamily:
    """One sample per role present: the fraction of that role's KV blocks in use, over its nodes (weighted by each
    node's blocks where it reports them; corun_node_kv_cache_usage_perc has each node's)."""
    usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "Fraction of a role's KV blocks in use, over its nodes "
                              "(1 = full)", labels=(*MODEL_LABEL, "role"))
    for role in ROLES:
        pairs = [(float(s.pong.stats["kv_cache_usage_perc"]),
                  s.pong.capacity.num_kv_blocks if s.pong.capacity is not None else 1)
                 for s in answered if s.role == role and "kv_cache_usage_perc" in s.pong.stats]
        if pairs:
            total = sum(weight for _, weight in pairs)
            usage.add_metric([model_name, role], sum(value * weight for value, weight in pairs) / total)
    return usage


def iteration_tokens(answered: list[NodeStatus], model_name: str) -> HistogramMetricFamily:
    """vLLM's vllm:iteration_tokens_total: tokens per forward, summed over every node's forwards."""
    counts, total = [0] * (len(ITERATION_TOKENS_BUCKETS) + 1), 0
    for status in answered:
        stat = read_iteration_tokens(status.pong.stats.get(ITERATION_TOKENS_KEY))
        if stat is not None:
            counts = [a + b for a, b in zip(counts, stat[0], strict=True)]
            total += stat[1]
    family = HistogramMetricFamily("vllm:iteration_tokens_total", "Tokens per engine step (forward), over the "
                                   "nodes", labels=MODEL_LABEL)
    cumulative = list(itertools.accumulate(counts))
    bounds = [*(str(float(bound)) for bound in ITERATION_TOKENS_BUCKETS), "+Inf"]
    family.add_metric([model_name], list(zip(bounds, map(float, cumulative), strict=True)), float(total))
    return family


def cache_config_info(answered: list[NodeStatus], model_name: str) -> GaugeMetricFamily:
    """vLLM's info gauge (always 1), one sample per node: its cache's shape, labels named as vLLM's CacheConfig
    fields (engine: the node)."""
    labels = (*MODEL_LABEL, "engine", "block_size", "num_gpu_blocks", "enable_prefix_caching")
    info = GaugeMetricFamily("vllm:cache_config_info", "Information of each node's KV cache (vLLM's CacheConfig "
                             "names)", labels=labels)
    for status in answered:
        capacity = status.pong.capacity
        if capacity is not None:
            caching = bool(status.pong.stats.get("prefix_caching_enabled", 0))
            info.add_metric([model_name, status.pong.node_id, str(capacity.block_size), str(capacity.num_kv_blocks),
                             str(caching)], 1.0)
    return info


def node_labels(status: NodeStatus) -> list[str]:
    # NOTE: a node not heard from yet gets a name no node id takes (launchers name nodes ROLE-INDEX), so that two
    # nodes never share a label set
    node_id = status.pong.node_id if status.pong else f"unanswered-{status.role}-{status.index}"
    return [node_id, status.role]


def numeric_stats(status: NodeStatus) -> dict[str, float]:
    if status.pong is None:
        return {}
    return {key: value for key, value in status.pong.stats.items() if isinstance(value, (int, float))}


def metric_name(key: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9_]", "_", str(key))
    return name if not name[:1].isdigit() else "_" + name
