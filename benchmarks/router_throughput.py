"""`python -m benchmarks.router_throughput --out FILE`: the streamed tokens per second one router process moves,
and what each token costs it, at increasing concurrency.

No model: fake prefill and decode nodes (benchmarks/fake_nodes.py, each a process of its own) feed the router
(`python -m router`, a subprocess), the decode node pacing steps as a real one does (one TokenEvent per running
request every --step-ms). Client worker processes (benchmarks/router_load_client.py) hold S concurrent streams of
POST /v1/completions, each replaced as soon as it ends (closed loop), through a warm-up and a measured window, for
each S of --streams. Per run:
- tok_per_s: tokens the clients received inside the window, per second (paced_tok_per_s: one token per stream per
  step, what the decode node sends while every stream decodes: the ceiling);
- router_cpu_us_per_token: the router's CPU (its process tree, utime + stime from /proc) inside the window per
  token streamed;
- client ITL (gaps between one request's token chunks) and added_itl_p99_ms: its p99 over the fake step interval,
  what the router (and the host it shares) adds;
- what the drivers did: the fake decode node's achieved step interval and send drops, the clients' and the host's
  CPU. A row whose drivers could not keep up says so (driver_limited, warnings): it measures them, not only the
  router.

--routers takes a list: K router processes on one port, as `corun serve --routers K` starts them (SO_REUSEPORT,
a control port each, one Prometheus directory); the clients open every stream to that one port, and the kernel
spreads the connections.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import zmq

from benchmarks.child_processes import read_json_line, start_child, stop_child
from benchmarks.cpu_usage import (
    busy_fraction,
    cpu_delta,
    host_cpu_ticks,
    host_facts,
    memory_mib,
    process_cpu_seconds,
    tree_cpu_seconds,
)
from benchmarks.fake_nodes import MAX_LOGPROBS
from benchmarks.fake_output import MIN_VOCAB_SIZE
from benchmarks.report import emit
from benchmarks.router_load_client import LoadPlan, Schedule, run_worker
from launch.cluster import free_port, router_argv, router_environment
from launch.routers import one_of_several
from wire.config import RouterConfig

DEFAULT_STREAMS = (32, 64, 128, 256, 512, 1024)
SERVED_MODEL_NAME = "router-throughput"
STARTUP_TIMEOUT_S = 60.0
CONTROL_TIMEOUT_MS = 10_000
IDLE_SECONDS = 2.0
SATURATED_CORES = 0.95
"""The router is one event loop: from this much of a core on it has no CPU left to give."""
LATE_STEP_FACTOR = 1.1
"""A fake decode step later than this many step intervals after the previous one counts as late."""
MAX_LATE_STEPS = 0.05
BUSY_CORE = 0.9
"""A client worker using this much of a core may be what limits its streams."""
BUSY_HOST = 0.95


@dataclass(frozen=True)
class FakeNodeProcess:
    process: subprocess.Popen
    address: str
    control: str

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass(frozen=True)
class RouterProcess:
    process: subprocess.Popen
    url: str
    """The port every router serves."""
    own_url: str
    """Where this router alone answers (/health, /metrics): its control port beside others, else url."""

    @property
    def pid(self) -> int:
        return self.process.pid


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.router_throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the JSON report here too (it is always printed)")
    parser.add_argument("--streams", type=int_list, default=DEFAULT_STREAMS,
                        help="concurrent streams per run, comma-separated (default %(default)s)")
    parser.add_argument("--routers", type=int_list, default=(1,),
                        help="router processes per run (on one port), comma-separated (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window of each run")
    parser.add_argument("--warmup-seconds", type=float, default=3.0,
                        help="streaming before the window (streams start spread over it)")
    parser.add_argument("--step-ms", type=float, default=20.0, help="the fake decode node's step interval")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per request (ignore_eos)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="token ids per prompt")
    parser.add_argument("--logprobs", type=int, default=None,
                        help="the requests' logprobs (alternatives per token; RL rollouts ask for them); the clients "
                             "check each token's")
    parser.add_argument("--workers", type=int, default=2, help="client worker processes")
    parser.add_argument("--model", default="models/tiny", help="the router's tokenizer files (and vocab size)")
    parser.add_argument("--log-dir", help="keep the router's and fake nodes' logs here (default: a temporary "
                        "directory, removed at the end)")
    args = parser.parse_args(argv)
    if min(args.routers) < 1:
        parser.error("--routers must be >= 1")
    if min(args.streams) < 1 or args.workers < 1 or args.max_tokens < 2 or args.prompt_tokens < 1:
        parser.error("--streams, --workers and --prompt-tokens must be >= 1, --max-tokens >= 2 (a decode)")
    if args.logprobs is not None and not 0 <= args.logprobs <= MAX_LOGPROBS:
        parser.error(f"--logprobs must be 0 to {MAX_LOGPROBS} (what the fake nodes report they allow)")
    if args.seconds <= 0 or args.warmup_seconds < 0 or args.step_ms <= 0:
        parser.error("--seconds and --step-ms must be > 0, --warmup-seconds >= 0")
    return args


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def read_vocab_size(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab_size = json.load(f)["vocab_size"]
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"{model_dir}: the fake output needs {MIN_VOCAB_SIZE} token ids, the model has {vocab_size}")
    return vocab_size


def run_benchmark(args: argparse.Namespace) -> dict:
    vocab_size = read_vocab_size(args.model)
    runs, idle = [], []
    with contextlib.ExitStack() as stack:
        if args.log_dir:
            os.makedirs(args.log_dir, exist_ok=True)
            log_dir = args.log_dir
        else:
            log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="router-throughput-"))
        try:
            prefill = start_fake_node("prefill", vocab_size, args.step_ms, log_dir)
            stack.callback(stop_child, prefill.process)
            decode = start_fake_node("decode", vocab_size, args.step_ms, log_dir)
            stack.callback(stop_child, decode.process)
            for num_routers in args.routers:
                with contextlib.ExitStack() as router_stack:
                    routers, port = [], free_port("127.0.0.1")
                    metrics_dir = router_stack.enter_context(tempfile.TemporaryDirectory(prefix="router-metrics-"))
                    for index in range(num_routers):
                        router = start_router(index, num_routers, port, metrics_dir, args, prefill, decode, log_dir)
                        router_stack.callback(stop_child, router.process)
                        routers.append(router)
                    for router in routers:
                        wait_until_healthy(router)
                    idle.append(measure_idle(routers))
                    for streams in args.streams:
                        run = measure_run(routers, prefill, decode, streams, args)
                        print(progress_line(run), file=sys.stderr, flush=True)
                        runs.append(run)
        except BaseException:
            print_log_tails(log_dir)
            raise
    return {"benchmark": "router_throughput", "command": command_line(), "host": host_facts(),
            "settings": {"seconds": args.seconds, "warmup_seconds": args.warmup_seconds, "step_ms": args.step_ms,
                         "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens,
                         "logprobs": args.logprobs, "workers": args.workers, "model": args.model,
                         "vocab_size": vocab_size},
            "idle": idle, "runs": runs}


def command_line() -> str:
    return shlex.join(["python", "-m", "benchmarks.router_throughput", *sys.argv[1:]])


def start_fake_node(role: str, vocab_size: int, step_ms: float, log_dir: str) -> FakeNodeProcess:
    command = [sys.executable, "-m", "benchmarks.fake_nodes", "--role", role, "--vocab-size", str(vocab_size),
               "--step-ms", str(step_ms)]
    process = start_child(command, os.path.join(log_dir, f"fake_{role}.log"), stdout=subprocess.PIPE)
    try:
        ready = read_json_line(process, STARTUP_TIMEOUT_S, f"the fake {role} node")
    except BaseException:
        stop_child(process)
        raise
    print(f"fake {role} node: pid {process.pid}, {ready['address']}", file=sys.stderr, flush=True)
    return FakeNodeProcess(process, ready["address"], ready["control"])


def start_router(index: int, num_routers: int, port: int, metrics_dir: str, args: argparse.Namespace,
                 prefill: FakeNodeProcess, decode: FakeNodeProcess, log_dir: str) -> RouterProcess:
    """Router index of num_routers on port, started as launch/routers.py starts them."""
    # NOTE: admission must never refuse a stream: the benchmark measures streaming, not 429s
    max_pending = 2 * max(args.streams) + 64
    control_port = free_port("127.0.0.1") if num_routers > 1 else None
    several = one_of_several(index, control_port, metrics_dir) if control_port else {}
    router = RouterConfig(model=args.model, prefill_addresses=(prefill.address,), decode_addresses=(decode.address,),
                          port=port, served_model_name=SERVED_MODEL_NAME, max_pending_requests=max_pending,
                          listen_backlog=getattr(args, "listen_backlog", RouterConfig.listen_backlog), **several)
    url = f"http://127.0.0.1:{port}"
    own_url = url if control_port is None else f"http://127.0.0.1:{control_port}"
    process = start_child(router_argv(router), os.path.join(log_dir, f"router_{index}.log"),
                          env=router_environment(router))
    print(f"router {index}: pid {process.pid}, {url}", file=sys.stderr, flush=True)
    return RouterProcess(process, url, own_url)


def wait_until_healthy(router: RouterProcess) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if router.process.poll() is not None:
            raise RuntimeError(f"the router exited ({router.process.returncode}) before it was healthy")
        try:
            with urllib.request.urlopen(f"{router.own_url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # NOTE: not listening yet, or 503 until both nodes answered a ping
        if time.monotonic() > deadline:
            raise RuntimeError(f"{router.own_url}/health was not 200 within {STARTUP_TIMEOUT_S:g} s")
        time.sleep(0.1)


def measure_idle(routers: list[RouterProcess]) -> dict:
    """What the routers cost with no request (pings, heartbeats, timers): the floor under every row's CPU."""
    before = [tree_cpu_seconds(router.pid) for router in routers]
    start = time.monotonic()
    time.sleep(IDLE_SECONDS)
    after = [tree_cpu_seconds(router.pid) for router in routers]
    seconds = time.monotonic() - start
    cpu_s = sum(cpu_delta(b, a) for b, a in zip(before, after, strict=True))
    return {"routers": len(routers), "seconds": round(seconds, 3), "router_cpu_cores": round(cpu_s / seconds, 4)}


def generated_tokens(router: RouterProcess) -> int:
    """The router's own count of tokens it returned (vllm:generation_tokens), read while it is idle."""
    with urllib.request.urlopen(f"{router.own_url}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            # NOTE: one series, labelled model_name
            if line.startswith(("vllm:generation_tokens_total ", "vllm:generation_tokens_total{")):
                return int(float(line.split()[-1]))
    raise RuntimeError(f"{router.own_url}/metrics has no vllm:generation_tokens_total")


LONG_GC_PAUSE_S = 0.005
"""A collection pause the report counts apart: about what a 256-row step's dispatch takes on the 2-core host."""


def gc_pauses(router: RouterProcess) -> tuple[float, float, float]:
    """The router's cyclic collections so far, every generation: (count, seconds, count longer than LONG_GC_PAUSE_S),
    from its corun_router_gc_pause_seconds."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{router.own_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    count = seconds = within = 0.0
    bounds = set()
    for family in text_string_to_metric_families(text):
        if family.name == "corun_router_gc_pause_seconds":
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    count += sample.value
                elif sample.name.endswith("_sum"):
                    seconds += sample.value
                elif sample.name.endswith("_bucket"):
                    bounds.add(float(sample.labels["le"]))
                    within += sample.value if float(sample.labels["le"]) == LONG_GC_PAUSE_S else 0.0
    if LONG_GC_PAUSE_S not in bounds:  # NOTE: else every pause would count as long
        raise RuntimeError(f"{router.own_url}/metrics has no corun_router_gc_pause_seconds bucket at "
                           f"{LONG_GC_PAUSE_S} s")
    return count, seconds, count - within


def ask_window(node: FakeNodeProcess) -> dict:
    """What the fake node did since it was last asked."""
    context = zmq.Context.instance()
    with context.socket(zmq.REQ) as request:
        request.setsockopt(zmq.LINGER, 0)
        request.setsockopt(zmq.RCVTIMEO, CONTROL_TIMEOUT_MS)
        request.connect(node.control)
        request.send(b"window")
        return json.loads(request.recv())


@dataclass(frozen=True)
class Snapshot:
    """CPU of every process of the run at one instant."""

    at: float
    routers: list[dict[int, float]]
    prefill_s: float
    decode_s: float
    host_ticks: tuple[int, int]


def snapshot(routers: list[RouterProcess], prefill: FakeNodeProcess, decode: FakeNodeProcess) -> Snapshot:
    return Snapshot(time.monotonic(), [tree_cpu_seconds(router.pid) for router in routers],
                    process_cpu_seconds(prefill.pid), process_cpu_seconds(decode.pid), host_cpu_ticks())


def measure_run(routers: list[RouterProcess], prefill: FakeNodeProcess, decode: FakeNodeProcess, streams: int,
                args: argparse.Namespace) -> dict:
    step_s = args.step_ms / 1e3
    num_workers = min(args.workers, streams)
    plans = [LoadPlan(worker, tuple(sorted({router.url for router in routers})), SERVED_MODEL_NAME,
                      tuple(range(worker, streams, num_workers)), streams, tuple(range(1, args.prompt_tokens + 1)),
                      args.max_tokens, os.getpid(), args.logprobs)
             for worker in range(num_workers)]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    schedules = [context.Queue() for _ in plans]
    workers = [context.Process(target=run_worker, args=(plan, queue, results), daemon=True,
                               name=f"router-load-client-{plan.worker}")
               for plan, queue in zip(plans, schedules, strict=True)]
    router_tokens_before = [generated_tokens(router) for router in routers]
    try:
        for worker in workers:
            worker.start()
        await_messages(results, "ready", num_workers, STARTUP_TIMEOUT_S)
        request_s = args.max_tokens * step_s
        start_at = time.monotonic() + 0.2
        window_start = start_at + args.warmup_seconds
        schedule = Schedule(start_at, min(args.warmup_seconds, request_s), window_start, window_start + args.seconds,
                            drain_timeout_s=3 * request_s + 10)
        for queue in schedules:
            queue.put(schedule)
        sleep_until(schedule.window_start)
        ask_window(prefill)  # NOTE: what each fake node did before the window is dropped
        ask_window(decode)
        before, gc_before = snapshot(routers, prefill, decode), [gc_pauses(router) for router in routers]
        sleep_until(schedule.window_end)
        after, gc_after = snapshot(routers, prefill, decode), [gc_pauses(router) for router in routers]
        # NOTE: what a router holds at the window's end: token events it took in and has not streamed yet live there
        router_memory = [memory_mib(router.pid) for router in routers]
        prefill_window, decode_window = ask_window(prefill), ask_window(decode)
        tallies = await_messages(results, "done", num_workers, schedule.drain_timeout_s + STARTUP_TIMEOUT_S)
        left_running = ask_window(decode)["num_running"]
        router_tokens = [generated_tokens(router) - before for router, before in zip(routers, router_tokens_before,
                                                                                     strict=True)]
    finally:
        # NOTE: only those started: SIGTERM may come while the next one starts, and joining one never started raises
        for worker in (worker for worker in workers if worker.pid is not None):
            if worker.is_alive():
                worker.kill()
            worker.join(timeout=10)
    router_gc = [tuple(a - b for a, b in zip(after, before, strict=True))
                 for before, after in zip(gc_before, gc_after, strict=True)]
    return summarize_run(len(routers), streams, args, before, after, prefill_window, decode_window, tallies,
                         left_running, router_tokens, router_memory) | {"router_gc": {
                             "collections": sum(gc[0] for gc in router_gc),
                             "pause_seconds": round(sum(gc[1] for gc in router_gc), 4),
                             f"pauses_over_{LONG_GC_PAUSE_S * 1e3:g}_ms": sum(gc[2] for gc in router_gc)}}


def await_messages(results, kind: str, count: int, timeout_s: float) -> list[dict]:
    """count messages of this kind from the workers; RuntimeError if one failed or they are late."""
    deadline = time.monotonic() + timeout_s
    received = []
    while len(received) < count:
        try:
            got, worker, payload = results.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as error:  # NOTE: queue.Empty
            raise RuntimeError(f"{count - len(received)} client worker(s) never reported {kind!r}") from error
        if got == "failed":
            raise RuntimeError(f"client worker {worker} failed:\n{payload}")
        if got == kind:
            received.append(payload)
    return received


def sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.monotonic()))


def summarize_run(num_routers: int, streams: int, args: argparse.Namespace, before: Snapshot, after: Snapshot,
                  prefill_window: dict, decode_window: dict, tallies: list[dict], left_running: int,
                  router_tokens: list[int], router_memory: list[dict]) -> dict:
    window_s = after.at - before.at
    tokens = sum(t["tokens"] for t in tallies)
    chunks = sum(t["chunks"] for t in tallies)
    itl_ms = [1e3 * gap for t in tallies for gap in t["itl_s"]]
    ttft_ms = [1e3 * gap for t in tallies for gap in t["ttft_s"]]
    router_cpu_s = sum(cpu_delta(b, a) for b, a in zip(before.routers, after.routers, strict=True))
    intervals_ms = [1e3 * s for s in decode_window["step_intervals_s"]]
    late = sum(interval > LATE_STEP_FACTOR * args.step_ms for interval in intervals_ms)
    itl = quantiles(itl_ms)
    nproc = len(os.sched_getaffinity(0))
    run = {
        "routers": num_routers, "streams": streams,
        "tok_per_s": round(tokens / window_s, 1),
        "router_cpu_us_per_token": round(router_cpu_s * 1e6 / tokens, 2) if tokens else None,
        "added_itl_p99_ms": round(itl["p99"] - args.step_ms, 3) if itl_ms else None,
        "itl_ms": itl, "ttft_ms": quantiles(ttft_ms),
        "step_ms": args.step_ms,
        "fake_step_interval_ms": quantiles(intervals_ms) | {"mean": round(mean(intervals_ms), 3)},
        "paced_tok_per_s": round(streams * 1e3 / args.step_ms, 1),
        "tokens": tokens, "chunks": chunks, "window_s": round(window_s, 3),
        "router_cpu_s": round(router_cpu_s, 3), "router_cpu_cores": round(router_cpu_s / window_s, 3),
        "router_saturated": router_cpu_s / window_s >= SATURATED_CORES * num_routers,
        "router_memory_at_window_end": router_memory,
        "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens, "logprobs": args.logprobs,
        "fake_decode": {
            "steps": len(intervals_ms), "late_steps_fraction": round(late / len(intervals_ms), 4) if intervals_ms
            else None, "emit_ms": quantiles([1e3 * s for s in decode_window["step_emit_s"]]),
            "running_per_step_mean": round(mean(decode_window["running_per_step"]), 1),
            "requests": decode_window["requests"], "aborts": decode_window["aborts"],
            "events_sent": decode_window["events_sent"], "events_dropped": decode_window["events_dropped"],
            "running_after_drain": left_running,
            "cpu_cores": round((after.decode_s - before.decode_s) / window_s, 3)},
        "fake_prefill": {"requests": prefill_window["requests"], "events_dropped": prefill_window["events_dropped"],
                         "cpu_cores": round((after.prefill_s - before.prefill_s) / window_s, 3)},
        "clients": {
            "workers": len(tallies), "cpu_cores_per_worker": [round(t["cpu_s"] / window_s, 3) for t in tallies],
            "requests_started": sum(t["requests_started"] for t in tallies),
            "tokens_received": sum(t["tokens_total"] for t in tallies), "router_counted_tokens": sum(router_tokens),
            "router_counted_tokens_per_router": router_tokens,
            "completed_exact": sum(t["completed_exact"] for t in tallies),
            "wrong_outputs": sum(t["wrong_outputs"] for t in tallies),
            "errors": sum(t["errors"] for t in tallies), "unfinished": sum(t["unfinished"] for t in tallies),
            "first_problems": [p for t in tallies for p in t["problems"]][:5]},
        "host": {"nproc": nproc, "busy_fraction": round(busy_fraction(before.host_ticks, after.host_ticks), 3)},
    }
    run["warnings"], run["driver_limited"] = judge_drivers(run)
    return run


def judge_drivers(run: dict) -> tuple[list[str], bool]:
    """What in this row is not the router's doing; driver_limited: the fake decode node or a client could not
    keep up, so the row measures them too."""
    warnings, driver_limited = [], False
    decode, clients, step_ms = run["fake_decode"], run["clients"], run["step_ms"]
    if decode["late_steps_fraction"] is None or decode["late_steps_fraction"] > MAX_LATE_STEPS:
        driver_limited = True
        warnings.append(f"the fake decode node kept its {step_ms:g} ms step on only "
                        f"{100 * (1 - (decode['late_steps_fraction'] or 1)):.0f}% of steps (p50/p99 "
                        f"{run['fake_step_interval_ms']['p50']}/{run['fake_step_interval_ms']['p99']} ms): "
                        "the driver's pace, not only the router, sets this row's ITL and tok/s")
    busiest = max(clients["cpu_cores_per_worker"])
    if busiest > BUSY_CORE:
        driver_limited = True
        warnings.append(f"a client worker used {busiest:.2f} of a core: the client may limit this row")
    if run["host"]["busy_fraction"] > BUSY_HOST:
        warnings.append(f"the host's {run['host']['nproc']} cores were {100 * run['host']['busy_fraction']:.0f}% "
                        "busy: router, fake nodes and clients wait for each other's cores")
    if decode["events_dropped"]:
        warnings.append(f"the fake decode node dropped {decode['events_dropped']} token events at its send HWM "
                        "(zmq's default, as the real node's ROUTER): the router fell that far behind")
    failed = {key: clients[key] for key in ("wrong_outputs", "errors", "unfinished") if clients[key]}
    if failed:
        warnings.append(f"not every stream got exactly its tokens: {failed}")
    if clients["tokens_received"] != clients["router_counted_tokens"]:
        warnings.append(f"the clients received {clients['tokens_received']} tokens, the router counts "
                        f"{clients['router_counted_tokens']} returned")
    if decode["running_after_drain"]:
        warnings.append(f"{decode['running_after_drain']} samples still ran on the fake decode node after the drain "
                        "(an abort lost?)")
    return warnings, driver_limited


def quantiles(values: list[float]) -> dict:
    ordered = sorted(values)

    def at(q: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else None

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)}


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def progress_line(run: dict) -> str:
    flag = (" ROUTER-SATURATED" if run["router_saturated"] else "") + (" DRIVER-LIMITED" if run["driver_limited"]
                                                                          else "")
    return (f"routers {run['routers']} streams {run['streams']}: {run['tok_per_s']:.0f} tok/s (paced "
            f"{run['paced_tok_per_s']:.0f}), router {run['router_cpu_us_per_token']} us/token "
            f"({run['router_cpu_cores']} cores), ITL p50/p99 {run['itl_ms']['p50']}/{run['itl_ms']['p99']} ms, "
            f"fake step p50/p99 {run['fake_step_interval_ms']['p50']}/{run['fake_step_interval_ms']['p99']} ms, "
            f"host busy {run['host']['busy_fraction']}{flag}" + "".join(f"\n  warning: {w}" for w in run["warnings"]))


def print_log_tails(log_dir: str, num_lines: int = 20) -> None:
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name), errors="replace") as f:
            lines = f.readlines()[-num_lines:]
        if lines:
            print(f"--- last lines of {name} ---\n{''.join(lines)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # NOTE: SIGTERM unwinds like an error, through every cleanup: no router, fake node or client is left behind
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        report = run_benchmark(args)
    except (RuntimeError, ValueError, OSError) as error:
        print(f"python -m benchmarks.router_throughput: error: {error}", file=sys.stderr)
        return 1
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
