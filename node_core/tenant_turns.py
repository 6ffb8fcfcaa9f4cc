"""The order in which a node's waiting prompts of several tenants (the router's clients) may start.

Each tenant's first waiting prompt, then each one's second, ...; within a round, the tenant admitted longest ago
first (one never admitted, or with nothing left on the node, before all), then arrival. One tenant (every request
of a router without client keys) is first come, first served. So one client's burst does not queue another's
prompt behind all of it (issue 23).
NOTE: the order moves only when a prompt starts; its outputs depend on the prompt alone (corun/model_runner.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

Item = TypeVar("Item")


class TenantTurns:
    def __init__(self):
        self.num_admitted = 0
        self.last_admitted: dict[str, int] = {}
        """Tenant -> the admission number of its latest admitted prompt, kept while it has prompts on the node."""

    def order(self, waiting: Sequence[Item], tenant_of: Callable[[Item], str],
              active_tenants: Iterable[str]) -> list[Item]:
        """waiting (in arrival order) in the order its prompts may start; active_tenants: those with a prompt
        waiting or being prefilled (the others are new again when their next prompt arrives)."""
        self.forget_all_but(set(active_tenants))
        rounds: dict[str, int] = {}
        keyed = []
        for arrival, item in enumerate(waiting):
            tenant = tenant_of(item)
            turn = rounds[tenant] = rounds.get(tenant, -1) + 1
            keyed.append(((turn, self.last_admitted.get(tenant, -1), arrival), item))
        return [item for _, item in sorted(keyed, key=lambda pair: pair[0])]

    def admitted(self, tenant: str) -> None:
        self.last_admitted[tenant] = self.num_admitted
        self.num_admitted += 1

    def forget_all_but(self, active_tenants: set[str]) -> None:
        for tenant in self.last_admitted.keys() - active_tenants:
            del self.last_admitted[tenant]
