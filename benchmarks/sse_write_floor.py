"""`python -m benchmarks.sse_write_floor --out FILE`: what one streamed chunk's socket write costs a Python event
loop on this host, with nothing else done per token: the floor under the router's CPU per streamed token.

An asyncio server holds --streams loopback connections to a reader process and writes each one an SSE chunk the
size of the router's (HTTP chunked framing included) every --step-ms, as the router does once per decode step per
stream. The writer's CPU (utime + stime) per write is the floor; the router adds parsing, detokenizing, framing and
bookkeeping on top.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import selectors
import socket
import time

from benchmarks.cpu_usage import host_facts
from benchmarks.report import emit

CHUNK = (b'data: {"id":"cmpl-0123456789abcdef0123456789abcdef","object":"text_completion","created":1700000000,'
         b'"model":"router-throughput","system_fingerprint":"fp_0123456789ab","seed":1234567890,"choices":[{"index":0,'
         b'"logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[1234],"seed":1234567890,'
         b'"text":" hello"}],"usage":null}\n\n')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sse_write_floor", description=__doc__.split("\n")[0])
    parser.add_argument("--out")
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    return parser.parse_args(argv)


def read_everything(port: int, streams: int, seconds: float) -> None:
    selector, sockets = selectors.DefaultSelector(), []
    for _ in range(streams):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        sockets.append(sock)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for key, _ in selector.select(0.1):
            try:
                if not key.fileobj.recv(65536):
                    return
            except BlockingIOError:
                pass


async def measure(args: argparse.Namespace) -> dict:
    writers: list[asyncio.StreamWriter] = []

    async def accept(reader, writer):
        writers.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader_pid = os.fork()
    if reader_pid == 0:
        read_everything(port, args.streams, args.seconds + 5)
        os._exit(0)
    while len(writers) < args.streams:
        await asyncio.sleep(0.01)
    for writer in writers:  # NOTE: as aiohttp's responses
        writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    framed = b"%x\r\n" % len(CHUNK) + CHUNK + b"\r\n"
    cpu_start, num_writes, end = time.process_time(), 0, time.monotonic() + args.seconds
    while time.monotonic() < end:
        for writer in writers:
            writer.transport.write(framed)
            num_writes += 1
        await asyncio.sleep(args.step_ms / 1000)
    cpu_s = time.process_time() - cpu_start
    os.kill(reader_pid, 9)
    os.waitpid(reader_pid, 0)
    server.close()
    return {"benchmark": "sse_write_floor", "host": host_facts(), "streams": args.streams, "step_ms": args.step_ms,
            "chunk_bytes": len(framed), "writes": num_writes, "writer_cpu_s": round(cpu_s, 3),
            "writer_cpu_us_per_write": round(cpu_s / num_writes * 1e6, 2)}


def main(argv=None) -> int:
    args = parse_args(argv)
    emit(asyncio.run(measure(args)), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
