"""A node bound to loopback listens on loopback only: its zmq socket and NIXL/UCX's listeners too."""

import os
import re
from pathlib import Path

from launch.local import free_port
from prefill_node.server import PrefillServer
from wire.config import CacheConfig, EngineConfig, NodeConfig, SchedulerConfig


def listening_addresses() -> set[str]:
    """host:port of every TCP socket this process listens on (from /proc: no ss needed)."""
    inodes = set()
    for fd in Path(f"/proc/{os.getpid()}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if match := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(match.group(1))
    addresses = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # NOTE: 0A = LISTEN
                host_hex, port_hex = fields[1].split(":")
                addresses.add(f"{decode_host(host_hex, width)}:{int(port_hex, 16)}")
    return addresses


def decode_host(host_hex: str, width: int) -> str:
    if width == 8:
        return ".".join(str(int(host_hex[i:i + 2], 16)) for i in (6, 4, 2, 0))
    return "ipv6:" + host_hex


def test_a_loopback_node_listens_on_loopback_only(tiny_model_dir):
    before = listening_addresses()
    engine = EngineConfig(model=tiny_model_dir, num_threads=1, cache=CacheConfig(num_blocks=16),
                          scheduler=SchedulerConfig(max_num_seqs=2, max_model_len=128, prefill_chunk_size=32))
    server = PrefillServer(NodeConfig("prefill", "prefill-lo", engine, port=free_port("127.0.0.1")))  # NOTE: NIXL
    try:
        opened = listening_addresses() - before
        assert opened, "the node opened no listener at all"
        assert f"127.0.0.1:{server.config.port}" in opened
        # NOTE: NIXL's UCX opens its own listeners; without UCX_NET_DEVICES one sat on the host's public address
        assert all(address.startswith("127.") for address in opened), opened
        assert len(opened) >= 2  # NOTE: zmq's and UCX's: the check saw the UCX listener, not just ours
    finally:
        server.close()
