"""Removing nodes at run time without holding up the launcher: each drain waits in a thread of its own, beside
`corun serve`'s loop, which keeps restarting dead nodes and answers SIGTERM at once.

A removal's states, one way:
    draining            every router sends the node nothing new (a router restarted meanwhile is asked again);
                        what the node holds finishes
    -> drained          it held nothing in any router, and every router forgot it: the launcher stops it next
    -> stopping         the launcher took it (take_drained) and stops it off its loop's thread
    -> removed          its process (or actor) stopped
  or -> returned        it still held work drain_timeout_s after the drain began: every router sends it requests
                        again (nothing it held is lost), and the removal says why

The launcher's loop moves drained ones on (Removals.take_drained) and stops them off its thread. A node that dies
while it drains is restarted as any other (its new instance holds nothing, so the drain then ends).

Imports neither torch nor ray.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from launch.scaling import router_admin

logger = logging.getLogger(__name__)

State = Literal["draining", "drained", "stopping", "removed", "returned"]
FINAL_STATES = ("removed", "returned")
POLL_S = 0.2
"""How often a drain asks the routers whether the node still holds work."""


@dataclass
class Removal:
    node_id: str
    address: str
    state: State = "draining"
    message: str = ""
    """Why a removal ended as it did (a drain that timed out says so)."""
    ended: threading.Event = field(default_factory=threading.Event)
    """Set once the state is final."""

    def finish(self, state: State, message: str) -> None:
        self.state, self.message = state, message
        logger.info("scale: %s %s", self.node_id, message)
        if state in FINAL_STATES:
            self.ended.set()

    def answer(self) -> dict:
        """What the control port says about it."""
        return {"node_id": self.node_id, "state": self.state, "message": self.message}


class Removals:
    """The removals of one cluster: begun by the launcher's loop (or a caller of remove_node), each drained in a
    thread; stop() ends their threads (the launcher is stopping)."""

    def __init__(self, timeout_s: float, api_key: str | None):
        self.timeout_s, self.api_key = timeout_s, api_key
        self.by_node_id: dict[str, Removal] = {}
        """The latest removal of each node."""
        self._stopping = threading.Event()

    def begin(self, node_id: str, address: str, router_urls: list[str]) -> Removal:
        """Drain the node in every router (at once: a refusal, say of a role's last node, raises ValueError here),
        then wait for it in a thread."""
        latest = self.by_node_id.get(node_id)
        if latest is not None and latest.state not in FINAL_STATES:
            raise ValueError(f"{node_id} is being removed already ({latest.state})")
        for i, url in enumerate(router_urls):
            try:
                router_admin(url, "DRAIN", {"address": address}, self.api_key)
            except (ValueError, OSError):
                for done in router_urls[:i]:  # NOTE: all routers or none: the others take it back
                    router_admin(done, "DRAIN", {"address": address, "draining": False}, self.api_key)
                raise
        removal = self.by_node_id[node_id] = Removal(node_id, address)
        threading.Thread(target=self._drain, args=(removal, router_urls), name=f"drain {node_id}",
                         daemon=True).start()
        return removal

    def take_drained(self) -> list[Removal]:
        """The removals whose node every router forgot, for the launcher to stop (each is returned once)."""
        drained = [removal for removal in self.by_node_id.values() if removal.state == "drained"]
        for removal in drained:
            removal.state = "stopping"
        return drained

    def stop(self) -> None:
        self._stopping.set()

    def _drain(self, removal: Removal, router_urls: list[str]) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self._stopping.is_set():
            listing = self._drained_in(removal, router_urls)
            if listing is not None and self._forget(removal, listing):
                return
            if time.monotonic() > deadline:
                self._return(removal, router_urls)
                return
            self._stopping.wait(POLL_S)

    def _drained_in(self, removal: Removal, router_urls: list[str]) -> list[str] | None:
        """The routers that still list the node, once it holds nothing in any of them; None until then. A router
        that lists it not draining (it restarted meanwhile) is asked again; one that does not list it forgot it."""
        listing = []
        try:
            for url in router_urls:
                entry = node_entry(url, removal.address, self.api_key)
                if entry is not None and not entry["draining"]:
                    router_admin(url, "DRAIN", {"address": removal.address}, self.api_key)
                    return None
                if entry is not None and not entry["drained"]:
                    return None
                listing += [] if entry is None else [url]
        except (ValueError, OSError) as error:  # NOTE: a router restarting: ask again next time
            logger.debug("scale: draining %s: %s", removal.node_id, error)
            return None
        return listing

    def _forget(self, removal: Removal, router_urls: list[str]) -> bool:
        try:
            for url in router_urls:
                router_admin(url, "DELETE", {"address": removal.address}, self.api_key)
        except (ValueError, OSError) as error:  # NOTE: e.g. it took work again in between: next time
            logger.warning("scale: forgetting %s: %s", removal.node_id, error)
            return False
        removal.finish("drained", "drained: every router forgot it; stopping it")
        return True

    def _return(self, removal: Removal, router_urls: list[str]) -> None:
        for url in router_urls:
            try:
                router_admin(url, "DRAIN", {"address": removal.address, "draining": False}, self.api_key)
            except (ValueError, OSError) as error:
                logger.warning("scale: returning %s to service at %s: %s", removal.node_id, url, error)
        removal.finish("returned", f"still held work after {self.timeout_s:g} s of draining (drain_timeout_s): "
                                   "returned to service, nothing lost; remove it again later")


def wait_until_removed(removal: Removal, end_removals: Callable[[], None]) -> None:
    """Wait for a launcher's removal to end, ending drained ones meanwhile (what a launcher's remove_node does);
    ValueError if its drain timed out (the node is back in service)."""
    while not removal.ended.wait(0.1):
        end_removals()
    if removal.state != "removed":
        raise ValueError(f"{removal.node_id}: {removal.message}")


def node_entry(url: str, address: str, api_key: str | None) -> dict | None:
    """The router's /admin/nodes entry of the node at address; None if it has none."""
    return next((entry for entry in router_admin(url, "GET", api_key=api_key)["nodes"]
                 if entry["address"] == address), None)
