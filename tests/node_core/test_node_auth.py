"""Node sockets admit only holders of the cluster's key: without it (or with another key pair) a process gets no
reply and its messages never reach a handler; with it, the node serves as usual."""

import os
import stat

import pytest
import zmq

from launch.cluster import make_cluster_key
from launch.local import free_port
from prefill_node.server import PrefillServer
from wire import protocol
from wire.config import CacheConfig, EngineConfig, NodeConfig, SchedulerConfig, TransferConfig
from wire.node_auth import ClusterKey
from wire.sampling_params import SamplingParams


@pytest.fixture
def keyed_node(tiny_model_dir, tmp_path):
    key, key_file = make_cluster_key(tmp_path)
    engine = EngineConfig(model=tiny_model_dir, num_threads=1, cache=CacheConfig(num_blocks=32),
                          scheduler=SchedulerConfig(max_num_seqs=2, max_model_len=128, prefill_chunk_size=32))
    config = NodeConfig("prefill", "prefill-k", engine, port=free_port("127.0.0.1"), cluster_key_file=str(key_file),
                        transfer=TransferConfig(transport="fake"))
    server = PrefillServer(config)
    yield server, key
    server.close()


def ask(server, key: ClusterKey | None, message, wait_ms: int = 1500):
    """Send one message as a CURVE client holding this key pair, knowing the node's public key (None: plain
    zmq); -> the reply, or None."""
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    if key is not None:
        socket.curve_secretkey, socket.curve_publickey = key.secret, key.public
        socket.curve_serverkey = server.sockets.key.public
    socket.connect(server.config.address)
    socket.send(protocol.encode(message))
    reply = None
    for _ in range(wait_ms // 50):
        server.step()
        if socket.poll(50):
            reply = protocol.decode(socket.recv_multipart()[-1])
            break
    socket.close()
    context.term()
    return reply


def test_a_cluster_member_is_served(keyed_node):
    server, key = keyed_node
    assert isinstance(ask(server, key, protocol.Ping(1)), protocol.Pong)


@pytest.mark.parametrize("who", ["plain zmq", "another key pair"])
def test_others_get_nothing_and_reach_no_handler(keyed_node, who):
    server, _ = keyed_node
    stranger = None if who == "plain zmq" else ClusterKey.generate()
    server.waiting.clear()
    prefill = protocol.PrefillRequest("intruder", [1, 2, 3], SamplingParams(max_tokens=2, seed=1))
    assert ask(server, stranger, prefill) is None
    assert ask(server, stranger, protocol.Ping(2)) is None
    assert server.num_prefills == 0 and not server.waiting and not server.transport.leases


def test_the_key_file_must_be_private(tmp_path):
    _, key_file = make_cluster_key(tmp_path)
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert ClusterKey.load(key_file).public == ClusterKey.load(key_file).public
    os.chmod(key_file, 0o644)
    with pytest.raises(ValueError, match="owner only"):
        ClusterKey.load(key_file)
