"""What every handler shares: config, model facts, node pool, metrics, the in-flight limits and the parsers."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

from router.api.clients import ClientLimits
from router.api.errors import RequestError
from router.api.model_info import ModelInfo
from router.api.offload import Offload
from router.metrics import RouterMetrics
from router.nodes.pool import NodePool, PoolMismatch
from wire.config import RouterConfig
from wire.tokenizer import Tokenizer

RETRY_AFTER_S = 1
MODEL_FACTS_WAIT_S = 5.0
"""How long a request waits for the nodes' first Pongs (what it is validated against) before a 503."""


class Admission:
    """Counts prompts in flight; refuses (429) what would exceed the limit instead of queueing without bound."""

    def __init__(self, max_in_flight: int):
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    @contextlib.contextmanager
    def admit(self, num_prompts: int) -> Iterator[None]:
        """NOTE: requests may share an id (a client's X-Request-Id), as in vLLM: their ids on the nodes differ
        (NodeIdTags)."""
        if num_prompts > self.max_in_flight:
            raise RequestError(400, f"at most {self.max_in_flight} prompts per request", param="prompt")
        if self.in_flight + num_prompts > self.max_in_flight:
            raise RequestError(429, f"the router has {self.in_flight} requests in flight (at most "
                               f"{self.max_in_flight}); retry later", headers={"Retry-After": str(RETRY_AFTER_S)})
        self.in_flight += num_prompts
        try:
            yield
        finally:
            self.in_flight -= num_prompts


class NodeIdTags:
    """What makes a request's ids on the nodes its own where its client named it (X-Request-Id): nodes key their work
    by id and refuse one they still hold (409), while clients may send an id again, at once or while a request with it
    runs (vLLM adds 8 random characters to every request id for the same reason)."""

    def __init__(self):
        self.process = secrets.token_hex(3)
        """NOTE: a router started again on the same instance name does not repeat its predecessor's tags."""
        self.serial = itertools.count()

    def fresh(self) -> str:
        return f".{self.process}{next(self.serial):x}"


@dataclass(frozen=True)
class RouterState:
    config: RouterConfig
    tokenizer: Tokenizer
    pool: NodePool
    admission: Admission
    metrics: RouterMetrics
    offload: Offload
    """Where request bodies are parsed: off the event loop."""
    clients: ClientLimits
    """Each client's requests and decode slots."""
    node_id_tags: NodeIdTags = field(default_factory=NodeIdTags)

    async def model_info(self) -> ModelInfo:
        """The served model as the nodes report it; a 503 before any answered or while they disagree."""
        try:
            facts = await self.pool.learned_model_facts(MODEL_FACTS_WAIT_S)
        except PoolMismatch as error:
            raise RequestError(503, f"refusing requests: {error}") from None
        if facts is None:
            raise RequestError(503, "no node has answered the router yet; retry later",
                               headers={"Retry-After": str(RETRY_AFTER_S)})
        return ModelInfo(self.config.served_model_name, facts.max_model_len, facts.vocab_size, facts.max_logprobs,
                         self.config.max_pending_requests, self.config.strict_fields,
                         self.config.trust_request_chat_template)

    def system_fingerprint(self) -> str:
        """Changes whenever anything that determines outputs changes: a node's fingerprint, the model, the length."""
        identity = self.pool.identity()
        return fingerprint_digest(identity.fingerprints, self.config.served_model_name,
                                  None if identity.facts is None else identity.facts.max_model_len)


@functools.lru_cache(maxsize=16)
def fingerprint_digest(node_fingerprints: frozenset[str], served_model_name: str, max_model_len: int | None) -> str:
    identity = {"node_fingerprints": sorted(node_fingerprints), "served_model_name": served_model_name,
                "max_model_len": max_model_len}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
