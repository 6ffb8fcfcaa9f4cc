"""`corun bench --url`: the bench's workloads streamed to a running cluster, reported in the engine bench's schema."""

import json

import pytest

from benchmarks.harness import SLOTargets, run_bench
from benchmarks.http_bench import run_http_bench
from cli.main import main
from launch.cluster import free_port
from planner.workloads import Arrivals, Workload
from tests.launch.cluster_client import start_cluster
from wire.config import CacheConfig, EngineConfig, SchedulerConfig

WORKLOADS = [Workload("short", ((12, 5),) * 6), Workload("mixed", ((40, 9), (7, 3), (90, 12), (25, 1)))]


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    cluster = start_cluster(tiny_model_dir, 1, 1)
    yield cluster
    cluster.stop()


def test_every_request_streams_to_its_end_with_the_engine_schema(cluster, tiny_model_dir):
    slo = SLOTargets(ttft_ms=60_000)
    report = run_http_bench(cluster.url, WORKLOADS, 2048, 512, arrivals=Arrivals(request_rate=50), slo=slo,
                            max_concurrency=3, label="cluster")
    served = report["modes"]["cluster"]
    for workload in WORKLOADS:
        result = served[workload.name]
        assert result["num_finished"] == result["num_requests"] == len(workload.lengths) and not result["truncated"]
        assert result["output_tokens"] == sum(num_out for _, num_out in workload.lengths) and result["num_errors"] == 0
        assert result["num_good"] == len(workload.lengths) and 0 < result["ttft_s"]["p50"] <= result["ttft_s"]["p99"]
        assert result["itl_ms"]["p50"] > 0 and result["tpot_ms"]["p50"] > 0
        # NOTE: the router's own CPU from its /metrics, per token and per chunk (a chunk holds >= 1 token)
        assert result["router_cpu_s"] > 0 and result["router_cpu_us_per_chunk"] >= result["router_cpu_us_per_token"] > 0
        # NOTE: the nodes' loops over the run: a forward per workload at least, and its time within the phases'
        loop = result["node_loop"]
        assert loop["prefill_forwards"] >= 1 and loop["decode_steps"] >= 1
        assert 0 < loop["run_s"] <= loop["turns_s"] and loop["receive_s"] >= 0
        # NOTE: the router's own latency means over the run: its TTFT starts after the client's does (the send, the
        # body's parse) and holds the node's queue and prefill
        means = result["server_means"]
        assert 0 < means["ttft_s"] <= means["client_ttft_s"] and means["queue_s"] + means["prefill_s"] >= 0
    engine = EngineConfig(model=tiny_model_dir, num_threads=1, cache=CacheConfig(num_blocks=128),
                          scheduler=SchedulerConfig(max_num_seqs=4, max_model_len=512))
    colocated = run_bench(engine, ["fixed_shape"], WORKLOADS[:1], slo=slo)["modes"]["fixed_shape"]["short"]
    shared = {"num_requests", "num_finished", "output_tokens", "seconds", "output_tok_per_s", "ttft_s", "tpot_ms",
              "num_good", "goodput_req_per_s", "slo_targets", "arrivals", "prefill_path", "truncated"}
    assert shared <= colocated.keys() and shared <= served["short"].keys()  # NOTE: side by side in one report


def test_a_shared_prefix_workload_reports_the_cluster_s_prefix_cache_hit_rate(cluster):
    # NOTE: 4 prompts sharing 128 tokens (2 of the cluster's 64-token chunks), one at a time: the 3 after the first
    # are served those chunks from the prefill node's cache
    shared = Workload("shared", ((150, 2),) * 4, ((0, 128),) * 4)
    report = run_http_bench(cluster.url, [shared], 2048, 512, arrivals=Arrivals(request_rate=50),
                            slo=SLOTargets(ttft_ms=60_000), max_concurrency=1, label="cluster")
    result = report["modes"]["cluster"]["shared"]
    assert result["num_finished"] == 4 and result["prefix_cache_hit_tokens"] == 3 * 128
    assert result["hit_rate"] == round(3 * 128 / (4 * 150), 4)


def test_a_run_cut_short_is_marked_truncated(cluster):
    slow = Workload("long", ((30, 200),) * 4)
    report = run_http_bench(cluster.url, [slow], 2048, 512, arrivals=Arrivals(), slo=SLOTargets(), max_seconds=0.3)
    result = report["modes"][f"served@{cluster.url}"]["long"]
    assert result["truncated"] and result["num_finished"] < 4


def test_cli_streams_to_the_url_and_refuses_what_it_cannot_run(cluster, tiny_model_dir, capsys):
    argv = ["bench", "--url", cluster.url, "--model", tiny_model_dir, "--workloads", "20x4", "--num-requests", "3",
            "--max-model-len", "512"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["modes"][f"served@{cluster.url}"]["20x4"]["num_finished"] == 3
    assert main([*argv, "--modes", "fixed_shape"]) == 2
    assert "--modes" in capsys.readouterr().err
    assert main(["bench", "--url", f"http://127.0.0.1:{free_port('127.0.0.1')}", "--model", tiny_model_dir,
                 "--workloads", "20x4", "--num-requests", "1"]) == 2
    assert "cannot reach the router" in capsys.readouterr().err


def test_a_cluster_behind_an_api_key_is_benched_with_it(tiny_model_dir, capsys, monkeypatch):
    keyed = start_cluster(tiny_model_dir, 1, 1, api_key="bench-key")
    try:
        argv = ["bench", "--url", keyed.url, "--model", tiny_model_dir, "--workloads", "20x4", "--num-requests", "2",
                "--max-model-len", "512"]
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
        assert main(argv) == 2  # NOTE: the inverse: without the key every request is a 401
        capsys.readouterr()
        assert main([*argv, "--api-key", "bench-key"]) == 0
        assert json.loads(capsys.readouterr().out)["modes"][f"served@{keyed.url}"]["20x4"]["num_finished"] == 2
        monkeypatch.setenv("VLLM_API_KEY", "bench-key")
        assert main(argv) == 0  # NOTE: or from the environment, as the router takes it
    finally:
        keyed.stop()


@pytest.mark.parametrize("warm_connections", [False, True])
def test_requests_sent_from_two_client_processes_all_stream_to_their_end(cluster, warm_connections):
    """benchmarks/http_clients.py: the requests dealt to two processes, started together at t = 0 (their connections
    opened before, or each by its request)."""
    report = run_http_bench(cluster.url, WORKLOADS[1:], 2048, 512, arrivals=Arrivals(), slo=SLOTargets(),
                            label="cluster", client_processes=2, warm_connections=warm_connections)
    result = report["modes"]["cluster"]["mixed"]
    assert result["client_processes"] == 2 and result["num_errors"] == 0 and not result["truncated"]
    assert result["warm_connections"] == warm_connections
    assert result["num_finished"] == len(WORKLOADS[1].lengths)
    assert result["output_tokens"] == sum(num_out for _, num_out in WORKLOADS[1].lengths)
    assert 0 < result["ttft_s"]["p50"] <= result["ttft_s"]["p99"] <= result["seconds"]


def test_client_processes_default_to_one_per_four_cores():
    from benchmarks.http_clients import auto_client_processes

    assert [auto_client_processes(n) for n in (1, 2, 4, 16, 64, 128)] == [1, 1, 1, 4, 8, 8]


def test_each_client_process_sends_a_run_of_consecutive_requests():
    from benchmarks.http_clients import contiguous_shares

    shares = contiguous_shares(10, 4)
    assert [list(share) for share in shares] == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    assert [list(share) for share in contiguous_shares(2, 4)] == [[], [0], [], [1]]


@pytest.mark.parametrize("num_warmed", [3, 1])
def test_warmed_connections_carry_the_requests_sent_after_them(num_warmed):
    """open_connections leaves its connections idle in the session's pool, and requests sent at once afterwards
    each take one of them instead of opening their own; the inverse: with one warmed for three requests, the two
    others open connections of their own, on ports the warm-up never used."""
    import asyncio

    from aiohttp import web

    from benchmarks.http_clients import open_connections, open_session

    async def run() -> tuple[set[int], list[int]]:
        warm_ports: set[int] = set()
        request_ports: list[int] = []

        async def models(request: web.Request) -> web.Response:
            warm_ports.add(request.transport.get_extra_info("peername")[1])
            await asyncio.sleep(0.05)  # NOTE: held open together, so that the warm-up opens `count` connections
            return web.json_response({"data": []})

        async def completions(request: web.Request) -> web.Response:
            request_ports.append(request.transport.get_extra_info("peername")[1])
            await asyncio.sleep(0.05)
            return web.json_response({})

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port("127.0.0.1")
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        try:
            async with open_session(None) as session:
                await open_connections(session, url, num_warmed)

                async def post() -> None:
                    async with session.post(f"{url}/v1/completions", json={}) as response:
                        await response.read()
                await asyncio.gather(post(), post(), post())
        finally:
            await runner.cleanup()
        return warm_ports, request_ports

    warm_ports, request_ports = asyncio.run(run())
    assert len(warm_ports) == num_warmed and len(request_ports) == len(set(request_ports)) == 3
    assert len(set(request_ports) & warm_ports) == num_warmed


def test_each_workload_is_timed_after_a_warm_up_that_its_figures_leave_out(cluster):
    # NOTE: the engine bench's warm-up (2 tokens each) runs through the front door first, from prompts of another
    # seed: the router finishes those requests too, yet the report counts only the workload's
    import asyncio

    from benchmarks.harness import WARM_UP_REQUESTS
    from benchmarks.http_bench import open_session, scrape, warm_up_server

    async def finished() -> float:
        async with open_session(None) as session:
            # NOTE: a labelled counter appears only after its first request: none yet when this test runs first
            return sum((await scrape(session, cluster.url)).get("vllm:request_success_total", []))

    workload = Workload("warmed", ((20, 3),) * 5)
    before = asyncio.run(finished())
    report = run_http_bench(cluster.url, [workload], 2048, 512, arrivals=Arrivals(request_rate=50),
                            slo=SLOTargets(ttft_ms=60_000), label="cluster")
    result = report["modes"]["cluster"]["warmed"]
    assert result["num_requests"] == 5 and result["output_tokens"] == 15
    assert asyncio.run(finished()) - before == 5 + WARM_UP_REQUESTS
    # NOTE: a caller reading the counters itself warms up first, then runs without one (front_door)
    before = asyncio.run(finished())
    warm_up_server(cluster.url, workload, 2048)
    assert asyncio.run(finished()) - before == WARM_UP_REQUESTS
    run_http_bench(cluster.url, [workload], 2048, 512, arrivals=Arrivals(request_rate=50),
                   slo=SLOTargets(ttft_ms=60_000), label="cluster", warm_up=False)
    assert asyncio.run(finished()) - before == WARM_UP_REQUESTS + 5
