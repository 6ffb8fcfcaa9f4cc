"""Prometheus metrics of the router, plus every numeric stat of each node's latest Pong as a gauge.

Request metrics carry vLLM's names and types (vllm:time_to_first_token_seconds, ...), so dashboards built for vLLM
read a CoRun cluster; the cluster's own (HTTP requests, nodes) are corun_*.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from router.nodes.client import NodeStatus

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
NODE_LABELS = ("node_id", "role")
"""NOTE: no address: /metrics is open to anyone (as vLLM's), so it names nodes, never where they listen (GET
/admin/nodes, behind the API key, has that)."""


class RouterMetrics:
    """One registry per router (never the global one: tests build many routers in one process).

    With multiprocess_dir (several routers on one port: prometheus_client's multiprocess mode, switched on by
    PROMETHEUS_MULTIPROC_DIR in the process' environment), every series is also written to that directory, and
    render() sums them over the routers, as one router's would be; render_own() is this process' alone."""

    def __init__(self, node_statuses: Callable[[], list[NodeStatus]], count_in_flight: Callable[[], int],
                 multiprocess_dir: str | None = None):
        self.registry = CollectorRegistry()
        self.multiprocess_dir = multiprocess_dir
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
        self.time_to_first_token = Histogram("vllm:time_to_first_token_seconds",
                                             "From a prompt's start to its first token", buckets=LATENCY_BUCKETS_S,
                                             registry=self.registry)
        self.inter_token_latency = Histogram("vllm:inter_token_latency_seconds",
                                             "Between a prompt's consecutive streamed token groups",
                                             buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.time_per_output_token = Histogram("vllm:request_time_per_output_token_seconds",
                                               "A finished prompt's mean gap between its later tokens",
                                               buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.request_latency = Histogram("vllm:e2e_request_latency_seconds",
                                         "From a prompt's start to its last token", buckets=LATENCY_BUCKETS_S,
                                         registry=self.registry)
        self.queue_time = Histogram("vllm:request_queue_time_seconds",
                                    "A prompt's wait in its prefill node's queue before its first chunk ran",
                                    buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of prompts started",
                                     registry=self.registry)
        self.generated_tokens = Counter("vllm:generation_tokens", "Tokens returned to clients",
                                        registry=self.registry)
        self.request_success = Counter("vllm:request_success", "Prompts finished, by finish reason",
                                       ["finished_reason"], registry=self.registry)
        self.registry.register(NodeStatsCollector(node_statuses))

    def refresh(self) -> None:
        """This process' gauges as of now (beside other routers, each refreshes its own every REFRESH_S)."""
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
        registry.register(NodeStatsCollector(self._node_statuses))
        return generate_latest(registry)

    def render_own(self) -> bytes:
        """This process' series alone (its control port's /metrics)."""
        self.refresh()
        return generate_latest(self.registry)


REFRESH_S = 0.5
"""Beside other routers, how often each writes its in-flight count and CPU time for the others' /metrics."""


class NodeStatsCollector(Collector):
    """Reads the nodes' latest Pongs at scrape time: corun_router_node_up and corun_node_<stat> gauges."""

    def __init__(self, node_statuses: Callable[[], list[NodeStatus]]):
        self._node_statuses = node_statuses

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
        yield from pool_gauges(statuses)


def pool_gauges(statuses: list[NodeStatus]) -> Iterator[GaugeMetricFamily]:
    """vLLM's engine gauges for the whole pool: requests running and waiting (summed over the nodes' latest
    stats), and each node's KV cache usage."""
    stats = [(status, status.pong.stats) for status in statuses if status.pong is not None]
    running = GaugeMetricFamily("vllm:num_requests_running", "Requests running, over the decode and colocated "
                                "nodes")
    running.add_metric([], float(sum(s.get("num_running", 0) for status, s in stats
                                     if status.role in ("decode", "colocated"))))
    waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests queued on the nodes (prefill and decode)")
    waiting.add_metric([], float(sum(s.get("num_waiting", 0) for _, s in stats)))
    usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "Fraction of a node's KV blocks in use (1 = full)",
                              labels=NODE_LABELS)
    for status, s in stats:
        if "kv_cache_usage_perc" in s:
            usage.add_metric(node_labels(status), float(s["kv_cache_usage_perc"]))
    yield from (running, waiting, usage)


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
