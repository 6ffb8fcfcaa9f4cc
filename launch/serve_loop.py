"""The loop of `corun serve`, whatever the launcher: start, keep dead nodes and routers restarted and scaling
commands served, stop everything on SIGINT/SIGTERM or when a router keeps dying. Nothing on it waits for long:
drains run beside it (launch/removals.py)."""

from __future__ import annotations

import logging
import signal
import time
from typing import Protocol

from launch.cluster import ClusterConfig, Role
from launch.removals import Removal, Removals
from launch.scaling import ScaleControl

logger = logging.getLogger(__name__)


class Cluster(Protocol):
    @property
    def url(self) -> str: ...

    def start(self) -> Cluster: ...
    def restart_dead_nodes(self) -> None: ...
    @property
    def removals(self) -> Removals: ...

    def add_node(self, role: Role) -> str: ...
    def begin_removal(self, node_id: str) -> Removal: ...
    def stop(self) -> None: ...


def serve_forever(cluster: Cluster, config: ClusterConfig) -> int:
    """Start, then restart dead nodes and routers every half second until SIGINT/SIGTERM (exit 0) or until a
    router is given up on (exit 1); stop everything either way."""
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: stopping.append(signum))
    cluster.start()
    control = None if config.admin_port is None else ScaleControl(config)
    routers = f", {config.num_routers} routers" if config.num_routers > 1 else ""
    pools = f"{config.num_prefill}P{config.num_decode}D" if config.num_prefill else ""
    pools += ("+" if pools else "") + f"{config.num_colocated}C" if config.num_colocated else ""
    print(f"CoRun cluster ready: {cluster.url}/v1 ({pools}{routers}, "
          f"N={config.engine.resolved().scheduler.max_num_seqs})" + (f"; scale at http://{config.host}:{config.admin_port}"
                                                          if control else ""), flush=True)
    try:
        while not stopping:
            cluster.restart_dead_nodes()
            if control is not None:
                control.run_pending(cluster)
            time.sleep(0.5)
    except RuntimeError as error:
        logger.error("%s; stopping the cluster", error)
        return 1
    finally:
        if control is not None:
            control.close()
        cluster.stop()
    return 0
