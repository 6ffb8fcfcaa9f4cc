"""The KV transport seam (transfer/transport.py): the registry and its factory, and a sender and a receiver of the
fake transport through a lease's whole life, counted as the prefill node counts it (transfer/leases.py)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import msgspec
import pytest

from corun.block_manager import BlockManager
from tests.transfer import scenario
from transfer.compat import IncompatiblePeer
from transfer.leases import Claimer
from transfer.transport import make_transport, transport_module
from wire.config import KV_TRANSPORTS, TransferConfig
from wire.engine_args import add_transfer_args, transfer_config_from_args

ROOT = Path(__file__).resolve().parents[2]
FAKE = TransferConfig(transport="fake")
BLOCK_SIZE = scenario.KV_SHAPE[3]
CLAIMER = Claimer(scenario.DECODE_NAME, "decode-instance-1")


def open_pair(lease_seconds: float = 30.0):
    prefill_kv, decode_kv = scenario.patterned_kv(), scenario.empty_kv()
    prefill_blocks, decode_blocks = (BlockManager(kv.shape[0], BLOCK_SIZE) for kv in (prefill_kv, decode_kv))
    sender = make_transport("prefill", FAKE, scenario.PREFILL_NAME, prefill_kv, lease_seconds=lease_seconds,
                            blocks=prefill_blocks)
    receiver = make_transport("decode", FAKE, scenario.DECODE_NAME, decode_kv, lease_seconds=lease_seconds,
                              blocks=decode_blocks)
    return sender, receiver, prefill_kv, decode_kv, decode_blocks


@pytest.fixture
def pair():
    opened = open_pair()
    yield opened
    opened[1].close()
    opened[0].close()


def test_the_registry_refuses_an_unknown_transport_and_accepts_every_known_one():
    assert set(KV_TRANSPORTS) == {"nixl", "fake"} and TransferConfig().transport == "nixl"
    for name in KV_TRANSPORTS:
        assert TransferConfig(transport=name).transport == name
        module = transport_module(name)
        assert callable(module.open_sender) and callable(module.open_receiver)
    for bad in ("tcp", "NIXL", "", None):
        with pytest.raises(ValueError, match="KV transport must be one of nixl, fake"):
            TransferConfig(transport=bad)
    with pytest.raises(ValueError, match="unknown KV transport 'tcp'"):
        transport_module("tcp")


def test_the_transport_flag_offers_the_registry_and_nothing_else():
    parser = argparse.ArgumentParser()
    add_transfer_args(parser)
    assert transfer_config_from_args(parser.parse_args(["--kv-transport", "fake"])) == FAKE
    assert transfer_config_from_args(parser.parse_args([])) == TransferConfig()
    [action] = [a for a in parser._actions if "--kv-transport" in a.option_strings]
    assert tuple(action.choices) == tuple(KV_TRANSPORTS)
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-transport", "tcp"])


def test_a_colocated_node_opens_no_transport():
    kv = scenario.empty_kv()
    assert make_transport("colocated", FAKE, "colocated-0", kv, lease_seconds=1.0,
                          blocks=BlockManager(kv.shape[0], BLOCK_SIZE)) is None


def test_the_fake_transport_loads_no_nixl():
    """Inverse: opening the nixl transport's module does load it, so the check can fail."""
    code = (
        "import sys\n"
        "from tests.transfer.test_transport import open_pair\n"
        "sender, receiver, *_ = open_pair()\n"
        "receiver.add_peer(sender.name, sender.transport, sender.handshake_payload())\n"
        "assert 'nixl' not in sys.modules, 'the fake transport loaded nixl'\n"
        "from transfer.transport import transport_module\n"
        "transport_module('nixl')\n"
        "assert 'nixl' in sys.modules\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_lease_is_claimed_read_and_freed_by_the_done_notification(pair):
    sender, receiver, prefill_kv, decode_kv, decode_blocks = pair
    holder = object()
    sender.lease("r", holder, scenario.REMOTE_BLOCK_IDS)
    assert receiver.add_peer(sender.name, sender.transport, sender.handshake_payload()) == prefill_kv.shape[0]
    assert receiver.has_peer(sender.name) and receiver.read_gbps[sender.name] > 0
    assert decode_blocks.num_free_blocks == decode_blocks.num_usable_blocks  # NOTE: the probe's blocks came back
    claim = sender.claim("r", CLAIMER)
    assert claim.ok and claim.block_ids == tuple(scenario.REMOTE_BLOCK_IDS)
    again = sender.claim("r", CLAIMER)
    assert not again.ok and again.reason == "KV lease already claimed"
    handle = receiver.start_read(sender.name, "r", claim.block_ids, scenario.LOCAL_BLOCK_IDS)
    assert sender.poll() == [] and "r" in sender.leases  # NOTE: nothing read yet
    assert scenario.wait_until_finished(receiver, handle) == "DONE"
    scenario.check_pulled(decode_kv, prefill_kv)
    [freed] = sender.poll()
    assert freed.holder is holder and freed.request_id == "r" and not sender.leases
    assert sender.counters.kv_released == 1 and sender.counters.lease_expiries == 0
    assert sender.num_released_unread == 0
    assert receiver.counters.reads_completed == 1 and receiver.counters.blocks_read == len(scenario.LOCAL_BLOCK_IDS)
    assert sender.poll() == [] and sender.counters.kv_released == 1  # NOTE: a lease ends once


def test_leases_expire_claimed_or_not_and_a_released_one_ends_at_once():
    sender, receiver, *_ = open_pair(lease_seconds=0.05)
    try:
        unclaimed, claimed, released = object(), object(), object()
        sender.lease("unclaimed", unclaimed, [1, 2])
        sender.lease("claimed", claimed, [3])
        sender.lease("released", released, [4])
        assert sender.claim("claimed", CLAIMER).ok and sender.claim("released", CLAIMER).ok
        assert sender.release("released", "the READ failed").holder is released
        assert sender.release("released", "again") is None  # NOTE: counted once
        assert sender.abort("claimed") is None and "claimed" in sender.leases  # NOTE: its claimer may be reading
        time.sleep(0.1)
        assert {lease.holder for lease in sender.poll()} == {unclaimed, claimed}
        assert sender.counters.lease_expiries == 2 and sender.counters.kv_released == 0
        assert sender.num_released_unread == 1 and not sender.leases
        refused = sender.claim("unclaimed", CLAIMER)
        assert not refused.ok and refused.reason == "unknown or expired KV lease"
    finally:
        receiver.close()
        sender.close()


def test_the_leases_of_a_gone_claimer_end_released_unread_and_no_other(pair):
    sender, *_ = pair
    restarted = Claimer(CLAIMER.node_id, "decode-instance-2")
    holders = {request_id: object() for request_id in ("gone-1", "gone-2", "restarted", "unclaimed")}
    for request_id, holder in holders.items():
        sender.lease(request_id, holder, [len(request_id)])
    for request_id, claimer in (("gone-1", CLAIMER), ("gone-2", CLAIMER), ("restarted", restarted)):
        assert sender.claim(request_id, claimer).ok
    ended = sender.release_claims_of(CLAIMER, "its claimer is gone")
    assert {lease.holder for lease in ended} == {holders["gone-1"], holders["gone-2"]}
    assert sender.leases.keys() == {"restarted", "unclaimed"} and sender.num_released_unread == 2
    assert sender.release_claims_of(CLAIMER, "again") == [] and sender.num_released_unread == 2
    assert sender.poll() == [] and sender.counters.lease_expiries == 0 and sender.counters.kv_released == 0


def test_an_unclaimed_lease_is_aborted_uncounted(pair):
    sender, *_ = pair
    holder = object()
    sender.lease("a", holder, [5])
    assert sender.abort("a").holder is holder and not sender.leases and sender.poll() == []
    assert (sender.counters.kv_released, sender.counters.lease_expiries, sender.num_released_unread) == (0, 0, 0)


def test_a_payload_of_another_transport_or_malformed_is_refused(pair):
    """Inverse: the same receiver adds the peer from the fake sender's own payload."""
    sender, receiver, *_ = pair
    payload = sender.handshake_payload()
    with pytest.raises(IncompatiblePeer, match="over transport 'nixl', this node reads over 'fake'"):
        receiver.add_peer(sender.name, "nixl", payload)
    mistyped = msgpack.packb({**msgpack.unpackb(payload), "num_blocks": "12"}, use_bin_type=True)
    bad_share = msgpack.packb({**msgpack.unpackb(payload), "gpu_share": {"gpu_uuid": "GPU-1", "pid": "x"}},
                              use_bin_type=True)
    for bad in (b"\xc1", msgpack.packb({"agent_metadata": b"x"}), mistyped, bad_share):
        with pytest.raises(IncompatiblePeer, match=f"peer {sender.name} sent a malformed handshake payload"):
            receiver.add_peer(sender.name, "fake", bad)
    assert not receiver.has_peer(sender.name)
    receiver.add_peer(sender.name, "fake", payload)
    assert receiver.has_peer(sender.name)


def test_a_gpu_share_in_the_payload_survives_the_round_trip():
    """A prefill node's KV as CUDA IPC handles (transfer/gpu_peers.py) decodes field for field; a payload without one
    (CPU KV, copy_on_gpu off) decodes to None."""
    from transfer.endpoints import AgentPayload
    from transfer.gpu_peers import GpuShare
    from wire.cuda_ipc import CudaStorage, SharedCudaTensor

    storage = CudaStorage(0, b"handle", 4096, 512, b"counter", 8, None, True)
    share = GpuShare("GPU-1234", 4321, 99, (SharedCudaTensor("bfloat16", [4, 16, 2], [32, 2, 1], 0, storage),))
    payload = AgentPayload(b"meta", (1, 2), 4, 64, "VRAM", 0, {}, share)
    assert AgentPayload.decode("prefill-0", payload.encode()) == payload
    assert AgentPayload.decode("prefill-0", msgspec.msgpack.encode(
        msgspec.structs.replace(payload, gpu_share=None))).gpu_share is None
