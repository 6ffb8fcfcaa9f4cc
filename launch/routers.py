"""The cluster's router processes, on the launching host: one, or K full routers on one port (`--routers K`).

K > 1: each router listens with SO_REUSEPORT (the kernel spreads new connections over them) and on a control port
of its own on 127.0.0.1, where the launcher reaches that router alone: its /health, and the /admin/nodes API, which
a pool change must reach in every router. Their Prometheus series go to one multiprocess directory, so every
router's /metrics is the cluster's. A router that dies is started again (RestartPolicy) with the pool as it is
now, while the others serve; its clients' open streams end with it.

Imports neither torch nor ray.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.multiprocess import mark_process_dead

from launch import cluster as launch
from launch import scaling
from launch.cluster import ClusterConfig, free_port
from launch.restarts import RestartPolicy
from wire.config import CLIENT_LIMIT_LOWEST
from wire.supervision import make_owned_dir

logger = logging.getLogger(__name__)

CONTROL_HOST = "127.0.0.1"
"""Where each router's control port listens: only the launcher, on the same host, calls it."""

METRICS_DIR_PREFIX = "corun-router-metrics-"
"""K > 1: the routers' Prometheus directory, METRICS_DIR_PREFIX{launcher pid}-XXXX in the temporary directory (one
that a killed launcher left is removed at the next start)."""
Addresses = Callable[[], tuple[list[str], list[str], list[str]]]
"""-> (prefill, decode, colocated) addresses of the nodes in the pool now."""


def one_of_several(index: int, control_port: int, metrics_dir: str) -> dict[str, Any]:
    """The RouterConfig fields that make a router index of several on one port."""
    return {"reuse_port": True, "control_port": control_port, "instance_name": f"r{index}", "metrics_dir": metrics_dir}


def warn_of_limits_per_router(config: ClusterConfig) -> str | None:
    """With several routers, each counts a client's requests alone (router/api/clients.py: the kernel hands a
    client's connections to any of them): the warning that says so, where a per-client limit is set, else None."""
    given = [f"--{name.replace('_', '-')} {getattr(config, name)}" for name in CLIENT_LIMIT_LOWEST
             if getattr(config, name) is not None]
    if config.num_routers == 1 or not given:
        return None
    return (f"{', '.join(given)} hold in each of the {config.num_routers} routers: a client whose connections "
            f"reach them all may have up to {config.num_routers} times as much (give 1/{config.num_routers} of "
            "what one client may hold, at least a request's n)")


class RouterGroup:
    def __init__(self, config: ClusterConfig, key_file: Path | None, restarts: RestartPolicy):
        self.config = config
        warning = warn_of_limits_per_router(config)
        if warning is not None:
            logger.warning(warning)
        self.key_file = key_file
        self.restarts = restarts
        several = config.num_routers > 1
        self.names = [f"router-{i}" for i in range(config.num_routers)] if several else ["router"]
        self.control_ports = [free_port(CONTROL_HOST) for _ in self.names] if several else []
        self.metrics_dir: Path | None = None
        """K > 1: the routers' Prometheus directory (made at start, removed at stop)."""
        self.processes: dict[str, subprocess.Popen] = {}
        self.num_restarts = 0
        self.given_up: set[str] = set()
        """Addresses of the nodes the launcher gave up restarting."""
        self.untold: dict[str, set[str]] = {}
        """Admin URL -> the given-up nodes that router was not told of yet (it was down, or is new)."""

    @property
    def url(self) -> str:
        """The cluster's front door: every router's."""
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def admin_urls(self) -> list[str]:
        """Where each router alone answers (/health, /admin/nodes)."""
        if not self.control_ports:
            return [self.url]
        return [f"http://{CONTROL_HOST}:{port}" for port in self.control_ports]

    def start(self, addresses: Addresses) -> None:
        if self.control_ports:
            self.metrics_dir = make_owned_dir(METRICS_DIR_PREFIX)
        for index in range(len(self.names)):
            self._spawn(index, addresses)

    def _spawn(self, index: int, addresses: Addresses) -> None:
        name = self.names[index]
        prefill, decode, colocated = addresses()
        several = one_of_several(index, self.control_ports[index], str(self.metrics_dir)) if self.control_ports else {}
        router = launch.router_config(self.config, prefill, decode, self.key_file, colocated, **several)
        logger.info("starting %s", name)
        self.processes[name] = subprocess.Popen(launch.router_argv(router), env=launch.router_environment(router))
        self.restarts.started(name)

    def restart_dead(self, addresses: Addresses) -> None:
        """Start again each router that exited (with the pool as it is now); raise once one is given up on (it
        keeps dying at start: the cluster cannot serve as configured)."""
        for index, name in enumerate(self.names):
            process = self.processes[name]
            if process.poll() is None:
                continue
            decision = self.restarts.decide(name, f"exit code {process.returncode}")
            if decision == "give_up":
                raise RuntimeError(f"{name} exited with code {process.returncode} and keeps exiting")
            if decision != "restart":
                continue
            if self.metrics_dir is not None:
                # NOTE: its in-flight gauge ends with it; its counters stay in the sums
                mark_process_dead(process.pid, str(self.metrics_dir))
            logger.warning("%s exited with code %s; starting it again", name, process.returncode)
            self._spawn(index, addresses)
            self.num_restarts += 1
            self.untold[self.admin_urls[index]] = set(self.given_up)
        self.tell_given_up()

    def give_up(self, address: str) -> None:
        """The launcher gave up restarting the node at address: every router lists it as given up (its /health
        then says "degraded" while the others can serve, router/app.py)."""
        if address in self.given_up:
            return
        self.given_up.add(address)
        for url in self.admin_urls:
            self.untold.setdefault(url, set()).add(address)
        self.tell_given_up()

    def tell_given_up(self) -> None:
        for url, addresses in self.untold.items():
            for address in list(addresses):
                try:
                    scaling.router_admin(url, "GIVE_UP", {"address": address}, self.config.api_key)
                    addresses.discard(address)
                except (ValueError, OSError) as error:  # NOTE: a router (re)starting: told on a later round
                    logger.debug("telling %s that %s is given up: %s", url, address, error)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with code {process.returncode}")

    def wait_healthy(self, timeout_s: float, check_alive: Callable[[], None]) -> None:
        for url in self.admin_urls:
            launch.wait_healthy(url, timeout_s, check_alive)

    def healthy(self) -> bool:
        return all(launch.router_healthy(url) for url in self.admin_urls)

    def add_node(self, role: str, address: str) -> None:
        for url in self.admin_urls:
            scaling.router_admin(url, "POST", {"role": role, "address": address}, self.config.api_key)

    def node_state(self, address: str) -> str:
        """An added node's state in the routers' pools: "serving" once every router lists it answering (it takes
        requests from then on), "given_up" once one has given up on it (it exited too often), else "starting"."""
        entries = []
        for url in self.admin_urls:
            listed = scaling.router_admin(url, "GET", api_key=self.config.api_key)["nodes"]
            entries.append(next((node for node in listed if node["address"] == address), None))
        if any(entry is not None and entry["given_up"] for entry in entries):
            return "given_up"
        return "serving" if all(entry is not None and entry["healthy"] for entry in entries) else "starting"

    def stop(self, grace_s: float) -> None:
        launch.stop_processes(list(self.processes.items()), grace_s)
        self.processes.clear()
        if self.metrics_dir is not None:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            self.metrics_dir = None
