"""free_port picks ports below the kernel's ephemeral range, where no outgoing connection takes them first, and above
Ray's worker ports (a Ray head on a picked port once collided with them)."""

import socket

from launch.cluster import EPHEMERAL_PORTS_FILE, FREE_PORTS_FROM, free_port


def test_a_free_port_binds_and_lies_below_the_ephemeral_range():
    first_ephemeral = int(EPHEMERAL_PORTS_FILE.read_text().split()[0]) if EPHEMERAL_PORTS_FILE.exists() else 32768
    ports = {free_port("127.0.0.1") for _ in range(20)}
    assert all(min(FREE_PORTS_FROM, first_ephemeral // 2) <= port < first_ephemeral for port in ports)
    assert len(ports) > 1  # NOTE: random picks, so two launchers rarely pick the same
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_port_someone_listens_on_is_never_given():
    taken = [socket.socket() for _ in range(3)]
    try:
        for s in taken:  # NOTE: listeners in the range free_port picks from
            s.bind(("127.0.0.1", free_port("127.0.0.1")))
            s.listen()
        busy = {s.getsockname()[1] for s in taken}
        assert not busy & {free_port("127.0.0.1") for _ in range(50)}
    finally:
        for s in taken:
            s.close()


def test_a_port_picked_by_a_launcher_on_this_host_is_not_picked_again_while_held(monkeypatch, tmp_path):
    """Two launchers' nodes bind their ports only once their models load; a port one picked stays off the other's
    picks (its marker) until PICK_HOLD_S. Inverse: a marker older than that no longer holds the port."""
    import os
    import time

    import launch.cluster as cluster

    monkeypatch.setattr(cluster, "PICKED_PORTS_DIR", tmp_path / "picked")
    first = free_port("127.0.0.1")
    second = free_port("127.0.0.1")  # NOTE: a different port in any case: only its order is fixed below

    class Fixed:
        def sample(self, population, k):
            return [first, second]

    monkeypatch.setattr(cluster.random, "SystemRandom", Fixed)
    (tmp_path / "picked" / str(second)).unlink()
    assert free_port("127.0.0.1") == second, "the port picked first was picked again while held"
    old = time.time() - cluster.PICK_HOLD_S - 1
    os.utime(tmp_path / "picked" / str(first), (old, old))
    assert free_port("127.0.0.1") == first, "inverse: a stale marker still held its port"


def test_a_pick_removes_every_stale_marker(monkeypatch, tmp_path):
    """Markers of ports no launcher picks again stayed for good (1,299 of them in one /tmp): a pick removes every one
    older than PICK_HOLD_S. Inverse: a marker within it stays."""
    import os
    import time

    import launch.cluster as cluster

    picked = tmp_path / "picked"
    monkeypatch.setattr(cluster, "PICKED_PORTS_DIR", picked)
    picked.mkdir()
    stale, held = picked / "1", picked / "2"  # NOTE: ports free_port never picks, so only the sweep removes them
    stale.touch()
    held.touch()
    old = time.time() - cluster.PICK_HOLD_S - 1
    os.utime(stale, (old, old))
    port = free_port("127.0.0.1")
    assert not stale.exists() and held.exists()
    assert sorted(marker.name for marker in picked.iterdir()) == sorted(["2", str(port)])
