"""`python -m benchmarks.router_request_cost --model DIR`: what one hostile request costs the router, and whether
other clients notice (issue 23, findings 1 and 7).

Starts `corun serve` (1 prefill, 1 decode node) on the model, then:
- body: sends a prompt that is one long "word" in a body of --body-bytes (default: the router's body limit) while
  a second client sends normal requests (a short prompt, and a 40 KiB one that goes to a parser process), and
  samples the resident memory of the router and its parser processes every 20 ms. Reports the big request's
  status and time, the peak memory over the idle router's, and the normal requests' latencies.
- fairness (--fairness, --client-keys A B, limits in --serve-args): the second client's requests alone, then
  while the first holds 3 x max_num_seqs never-read streams of 900 tokens (those its limits let in); reports the
  second client's latency p50/p99 both ways.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from benchmarks.child_processes import start_child, stop_child
from benchmarks.cpu_usage import descendants, memory_mib
from wire.config import RouterSettings

SAMPLE_S = 0.02
OPERATOR_KEY = "sk-benchmark-operator"
NORMAL = {"model": "corun-tiny", "prompt": "The river reads the morning light", "max_tokens": 4, "seed": 1}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.router_request_cost", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--body-bytes", type=int, default=RouterSettings.max_request_bytes)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--fairness", action="store_true", help="the fairness run instead of the body one")
    parser.add_argument("--client-keys", nargs=2, metavar="KEY", default=None,
                        help="fairness run: the two clients' keys (the router gets them in --client-api-keys-file); "
                        "without: both clients send no key")
    parser.add_argument("--serve-args", default="", help="more `corun serve` flags, space-separated")
    parser.add_argument("--num-normal", type=int, default=40)
    parser.add_argument("--first-streams", type=int, default=None,
                        help="fairness run: the first client's never-read streams (default: 3 x --max-num-seqs)")
    parser.add_argument("--num-big", type=int, default=2, help="such bodies at once (2: the parser processes of a "
                        "2-core host)")
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes, key: str | None = None, timeout_s: float = 600.0) -> tuple[int, float, bytes]:
    """-> (status, seconds, body)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    started = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=timeout_s) as reply:
            return reply.status, time.monotonic() - started, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, time.monotonic() - started, error.read()


def wait_healthy(base_url: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError("the cluster did not become healthy")


def router_pid(serve_pid: int) -> int:
    for pid in descendants(serve_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except FileNotFoundError:
            continue
        if b"-m" in argv and b"router" in argv:
            return pid
    raise RuntimeError("no router process under corun serve")


def tree_rss_mib(pid: int) -> float:
    return sum(memory_mib(p).get("rss_mib", 0.0) for p in [pid, *descendants(pid)])


class MemorySampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, tree_rss_mib(self.pid))
            time.sleep(SAMPLE_S)


def one_word_body(num_bytes: int) -> bytes:
    head = json.dumps({**NORMAL, "prompt": ""}).encode()
    return head.replace(b'"prompt": ""', b'"prompt": "' + b"a" * (num_bytes - len(head)) + b'"')


def normal_text_body(num_bytes: int) -> bytes:
    words = "the river reads morning light because seven people ran quickly under green houses".split()
    text = " ".join(f"{words[i % len(words)]}{i}" for i in range(num_bytes // 8))[:num_bytes]
    return json.dumps({**NORMAL, "prompt": text, "max_tokens": 1}).encode()


def quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    at = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)  # noqa: E731
    return {"n": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 4)}


def measure_body(base_url: str, router: int, args: argparse.Namespace) -> dict:
    url = base_url + "/v1/completions"
    small, medium = json.dumps(NORMAL).encode(), normal_text_body(40 * 2**10)
    post(url, small), post(url, medium)  # NOTE: warm: the parser processes start on first use
    idle = {"short": [post(url, small)[1] for _ in range(5)], "40KiB": [post(url, medium)[1] for _ in range(5)]}
    baseline = tree_rss_mib(router)
    sampler = MemorySampler(router)
    sampler.start()
    bigs: list[tuple[int, float, bytes]] = []
    senders = [threading.Thread(target=lambda: bigs.append(post(url, one_word_body(args.body_bytes))))
               for _ in range(args.num_big)]
    for sender in senders:
        sender.start()
    during: dict[str, list[float]] = {"short": [], "40KiB": []}
    while any(sender.is_alive() for sender in senders):
        during["short"].append(post(url, small)[1])
        during["40KiB"].append(post(url, medium)[1])
    for sender in senders:
        sender.join()
    sampler.stop.set()
    sampler.join()
    return {"body_bytes": args.body_bytes, "num_big": args.num_big, "statuses": [b[0] for b in bigs],
            "seconds": [round(b[1], 3) for b in bigs],
            "message": json.loads(bigs[0][2]).get("error", {}).get("message", "")[:200],
            "idle_rss_mib": round(baseline, 1), "peak_rss_mib": round(sampler.peak, 1),
            "peak_over_idle_mib": round(sampler.peak - baseline, 1),
            "normal_idle_s": {k: quantiles(v) for k, v in idle.items()},
            "normal_during_s": {k: quantiles(v) for k, v in during.items() if v}}


def hold_streams(url: str, key: str | None, num: int) -> tuple[list[socket.socket], list[int]]:
    """num streamed requests of many tokens whose responses are never read; -> (sockets, statuses seen, 0 for
    those not answered yet)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    body = json.dumps({**NORMAL, "max_tokens": 900, "stream": True, "ignore_eos": True}).encode()
    sockets, statuses = [], []
    for _ in range(num):
        connection = socket.create_connection((host, int(port)))
        connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           + (f"Authorization: Bearer {key}\r\n" if key else "").encode()
                           + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        sockets.append(connection)
    time.sleep(2.0)
    for connection in sockets:
        connection.settimeout(0.5)
        try:
            head = connection.recv(64)
        except TimeoutError:  # NOTE: no answer yet: waiting (in the router or at the decode node)
            head = b""
        statuses.append(int(head.split()[1]) if head.startswith(b"HTTP/") else 0)
    return sockets, statuses


def measure_fairness(base_url: str, args: argparse.Namespace) -> dict:
    url = base_url + "/v1/completions"
    first, second = args.client_keys or (None, None)
    small = json.dumps(NORMAL).encode()
    post(url, small, second)
    alone = [post(url, small, second)[1] for _ in range(args.num_normal)]
    sockets, statuses = hold_streams(url, first, args.first_streams or 3 * args.max_num_seqs)
    try:
        loaded = [post(url, small, second) for _ in range(args.num_normal)]
    finally:
        for connection in sockets:
            connection.close()
    return {"second_alone_s": quantiles(alone), "second_while_first_saturates_s": quantiles([s for _, s, _ in loaded]),
            "second_statuses": sorted({status for status, _, _ in loaded}),
            "first_statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    port = free_port()
    log_dir = tempfile.mkdtemp(prefix="router-cost-")
    command = [sys.executable, "-m", "cli.main", "serve", "--model", args.model, "--served-model-name", "corun-tiny",
               "--prefill", "1", "--decode", "1",
               "--max-num-seqs", str(args.max_num_seqs), "--port", str(port), *args.serve_args.split()]
    if args.client_keys:
        keys_file = os.path.join(log_dir, "client_keys")
        with open(keys_file, "w") as f:
            f.write("\n".join(args.client_keys) + "\n")
        command += ["--client-api-keys-file", keys_file]
    # NOTE: client keys need the operator's key, handed over as the launchers do: in the environment
    env = {**os.environ, "VLLM_API_KEY": OPERATOR_KEY} if args.client_keys else None
    serve = start_child(command, os.path.join(log_dir, "serve.log"), env=env)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url)
        result = {"command": " ".join(command[1:])}
        if args.fairness:
            result["fairness"] = measure_fairness(base_url, args)
        else:
            result["body"] = measure_body(base_url, router_pid(serve.pid), args)
        print(json.dumps(result, indent=1))
    finally:
        stop_child(serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
