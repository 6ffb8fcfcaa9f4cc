"""What every launcher shares: the cluster's settings, the node and router command lines, the wait for the
router's /health, stopping processes, and the serve loop of `corun serve`.

Imports neither torch nor ray: Ray actors import this module on every host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from corun.models.config import random_weights_spec
from corun.models.context import check_context_length
from corun.models.presets import RANDOM_PREFIX
from wire.config import (
    MIB,
    EngineConfig,
    NodeConfig,
    NodeSettings,
    Role,
    RouterConfig,
    RouterSettings,
    SharedWeightsConfig,
    settings_of,
)
from wire.flags import config_argv, config_environment, environment_variables, flag, parse_port
from wire.node_auth import ClusterKey
from wire.supervision import make_owned_dir

logger = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
"""How long a launcher waits for a process it stops (SIGTERM) before it kills it (SIGKILL)."""
KEY_DIR_PREFIX = "corun-cluster-key-"
"""The cluster key's private directory: KEY_DIR_PREFIX{launcher pid}-XXXX in the temporary directory."""
STARTUP_TIMEOUT_S = 180.0
"""ClusterConfig.startup_timeout_s's default, and how long `corun scale add` waits for the node it added."""


class StartupError(RuntimeError):
    """The cluster could not start (a process exited, or /health never came): `corun serve` prints it as one
    line after the failing process' own message."""


@dataclass(frozen=True)
class ClusterConfig(RouterSettings, NodeSettings):
    """P prefill servers, D decode servers, C colocated servers and the routers, whatever starts them.

    Its RouterSettings (port, api_key, ...: the API key is the control port's too, and the launcher's own calls
    send it) go to every router, its NodeSettings (kv_lease_seconds, transfer) to every node."""

    engine: EngineConfig
    """Every node's engine (--model, --max-num-seqs, ...; launch.node_engine gives each role its KV budget)."""
    num_prefill: int = field(default=1, metadata=flag("--prefill"))
    """Prefill servers."""
    num_decode: int = field(default=1, metadata=flag("--decode"))
    """Decode servers."""
    num_colocated: int = field(default=0, metadata=flag("--colocated"))
    """Nodes that prefill and decode in one process (colocated_node/, the engine's fixed_shape schedule): beside the P/D
    pools, or alone (P = D = 0: one GPU served by one process, no KV hand-off)."""
    num_routers: int = field(default=1, metadata=flag("--routers"))
    """Router processes on the launching host, all serving `port` (launch/routers.py: SO_REUSEPORT, the kernel
    spreads connections over them), for a front door that one process cannot carry."""
    prefill_gpus: tuple[str, ...] = ()
    """--device cuda, local launcher: the GPU of each prefill node (CUDA_VISIBLE_DEVICES of its process), one per
    node or one for all; several nodes may share a GPU. (): the launching process' default GPU."""
    decode_gpus: tuple[str, ...] = ()
    """As prefill_gpus, for the decode nodes."""
    colocated_gpus: tuple[str, ...] = ()
    """As prefill_gpus, for the colocated nodes."""
    prefill_kv_cache_mib: int | None = None
    """KV cache of each prefill node (it holds prompts being prefilled and their leases); None: the engine's."""
    decode_kv_cache_mib: int | None = None
    """KV cache of each decode node and each colocated node (it holds every running request's context); None: the
    engine's. Nodes that share a GPU split it: weights once per node, plus these."""
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    """How long every node may take to answer the router's pings (model load) before start() gives up."""
    drain_timeout_s: float = 600.0
    """How long a node being removed may take to finish what it holds; one that still holds work then is
    returned to service (nothing lost) and its removal says so (launch/removals.py)."""
    admin_port: int | None = field(default=None, metadata=flag(parse=parse_port))
    """`corun serve`'s control port (`corun scale`: add or remove nodes at run time); None: none."""
    admin_max_connections: int = 16
    """Connections the control port holds open at once; one more is answered 503 and closed."""
    share_weights: Literal["auto", "on", "off"] = "auto"
    """Nodes that share a GPU hold one copy of the weights between them (corun/shared_weights.py: one node loads
    them, the others map its memory; on one H100 (8B shape) 1P1D's second copy took 16.4 GB from the decode node's
    KV). auto: on CUDA where the local launcher puts several nodes on one GPU; on: also the local nodes of a CPU host
    (one memory-mapped file); off: every node loads its own."""
    admin_timeout_s: float = 10.0
    """A control-port connection is closed unless its whole request arrived within this of its opening (idle and
    trickling clients are reaped; each connection carries one request)."""

    def __post_init__(self):
        for name in ("num_prefill", "num_decode", "num_colocated"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if (self.num_prefill == 0) != (self.num_decode == 0):
            raise ValueError(f"prefill and decode servers come together: {self.num_prefill} prefill and "
                             f"{self.num_decode} decode (give both, or neither and colocated servers)")
        if self.num_prefill == 0 and self.num_colocated == 0:
            raise ValueError("a cluster needs a prefill and a decode server, or a colocated one")
        if self.num_colocated and self.engine.backend != "native":
            raise ValueError("colocated servers run the native engine (--engine native)")
        if self.num_routers < 1:
            raise ValueError(f"num_routers must be >= 1, got {self.num_routers}")
        # NOTE: each base's own checks, called by name: with two bases no one super() chain reaches both
        RouterSettings.__post_init__(self)
        NodeSettings.__post_init__(self)
        for name in ("startup_timeout_s", "drain_timeout_s", "admin_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.admin_max_connections < 1:
            raise ValueError(f"admin_max_connections must be >= 1, got {self.admin_max_connections}")
        for role, gpus, count in (("prefill", self.prefill_gpus, self.num_prefill),
                                  ("decode", self.decode_gpus, self.num_decode),
                                  ("colocated", self.colocated_gpus, self.num_colocated)):
            if gpus and not self.engine.device.startswith("cuda"):
                raise ValueError(f"--{role}-gpus needs --device cuda")
            if len(gpus) not in (0, 1, count):
                raise ValueError(f"--{role}-gpus names {len(gpus)} GPUs for {count} {role} nodes: give one per "
                                 f"node, or one for all")
            if any(not gpu.isdigit() for gpu in gpus):
                raise ValueError(f"--{role}-gpus must be GPU indices, got {','.join(gpus)}")
        for name in ("prefill_kv_cache_mib", "decode_kv_cache_mib"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def nodes(self) -> list[tuple[Role, int]]:
        """(role, index) of every node, the prefill servers first."""
        return [(role, i) for role, count in (("prefill", self.num_prefill), ("decode", self.num_decode),
                                              ("colocated", self.num_colocated)) for i in range(count)]


def check_model(engine: EngineConfig) -> None:
    """Before any node starts: the files the cluster's processes read (the nodes config.json and the weights, the
    router tokenizer.json) and --max-model-len against the model's context, so a wrong --model or a context the
    model was not made for is one line now, not nodes failing later while the router already answers 503."""
    check_model_files(engine.model)
    check_context_length(engine)


def check_model_files(path: str) -> None:
    directory = Path(path)
    if path.startswith(RANDOM_PREFIX) and not directory.is_dir():
        # NOTE: a preset has no tokenizer, and the router detokenizes: `corun bench` and LLM(...) take it as ids
        preset = path.removeprefix(RANDOM_PREFIX)
        raise FileNotFoundError(f"--model {path}: a preset without a tokenizer (for `corun bench` and LLM(...)); to "
                                f"serve its shape, write it as a model directory: `corun make-random-model {preset} "
                                f"DIR`, then --model DIR")
    if not directory.is_dir():
        raise FileNotFoundError(f"--model {path}: no such directory (the built-in tiny model: "
                                f"`corun make-tiny-model {path}`)")
    missing = [name for name in ("config.json", "tokenizer.json") if not (directory / name).is_file()]
    weights = random_weights_spec(directory) is not None or any(directory.glob("*.safetensors"))
    missing += [] if weights else ["*.safetensors"]
    if missing:
        raise FileNotFoundError(f"--model {path}: no {', '.join(missing)} there (an HF-format checkpoint directory)")


def check_port_free(host: str, port: int) -> None:
    with socket.socket() as s:
        # NOTE: as the router's server binds (aiohttp sets SO_REUSEADDR): a port a stopped cluster left in
        # TIME_WAIT is free to it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as error:
            raise ValueError(f"cannot serve on {host}:{port}: {error.strerror} (another `corun serve`? pick "
                             f"another --port)") from None


def node_gpu(config: ClusterConfig, role: Role, index: int) -> str | None:
    """The GPU index a local node's process sees as its one device, or None (the launching process' default)."""
    gpus = {"prefill": config.prefill_gpus, "decode": config.decode_gpus, "colocated": config.colocated_gpus}[role]
    return None if not gpus else gpus[index] if len(gpus) > 1 else gpus[0]


def node_engine(config: ClusterConfig, role: Role, num_threads: int, gpu_split: tuple[int, float] = (1, 1.0)
                ) -> EngineConfig:
    """The engine a node of this role runs: the cluster's, with its role's KV budget and a thread count. gpu_split:
    the nodes on its GPU and its part of their KV memory (gpu_kv_split; on Ray, from --gpus-per-node), where the KV
    budget is sized on the GPU (no --kv-cache-mib).

    NOTE: the thread count changes the bits (it is in every node's fingerprint), so a node never keeps torch's
    default, which follows the host's cores."""
    engine = config.engine if config.engine.num_threads is not None else dataclasses.replace(
        config.engine, num_threads=num_threads)
    kv_mib = config.prefill_kv_cache_mib if role == "prefill" else config.decode_kv_cache_mib
    cache = engine.cache
    if kv_mib is not None:
        cache = dataclasses.replace(cache, memory_budget_bytes=kv_mib * MIB)
    elif cache.memory_budget_bytes is None and cache.num_blocks is None and engine.device.startswith("cuda"):
        cache = dataclasses.replace(cache, gpu_nodes=gpu_split[0], gpu_kv_share=gpu_split[1])
    return dataclasses.replace(engine, cache=cache)


ROLE_KV_WEIGHTS: dict[Role, int] = {"prefill": 1, "decode": 7, "colocated": 7}
"""Where nodes share a GPU, each role's weight in the KV memory it holds: a prefill node keeps a prompt's KV only while
it is prefilled and leased (and its prefix cache), a decode or colocated node every running request's whole context
(prompt + max_tokens: reserved at admission on a colocated node; on a decode node beyond its swap space). At 1:3
(until stop 51) 1P1D on one H200 (8B shape) gave its decode node ~62 GiB: ~111 rows of 1024x2048 where the engine ran
240, 0.69x the engine's tok/s (stop 48). At 1:7 a prefill node still holds ~10 GiB there, about nine 8,192-token
forwards. Measured on an H100 (stop 51): 7% more decode blocks than ~1:3 given in MiB, 3,827 against 3,726 tok/s on
1024x2048."""


def gpu_of(config: ClusterConfig, node: tuple[Role, int]) -> str:
    """The GPU a local node runs on; the launching process' default counts as GPU 0."""
    return node_gpu(config, *node) or "0"


WEIGHTS_EXPORTER_ROLES: tuple[Role, ...] = ("decode", "colocated", "prefill")
"""Which of a GPU's nodes loads the weights the others map, by role: on CUDA they stop when it ends, and a decode
node's end ends its running requests anyway, where a prefill node holds only prompts in flight."""


def weights_sharing(config: ClusterConfig, role: Role, index: int, directory: Path | None) -> SharedWeightsConfig:
    """How the local node role-index holds its weights (ClusterConfig.share_weights): shared where two or more of
    the cluster's first nodes run on its GPU (on CPU, with share_weights on: on this host); the first of them by
    WEIGHTS_EXPORTER_ROLES exports, every other node there imports (a node added later too). directory: the
    launcher's private directory, where the rendezvous file is written (None: nothing shared)."""
    cuda = config.engine.device.startswith("cuda")
    wanted = config.share_weights == "on" or (config.share_weights == "auto" and cuda)
    if not wanted or directory is None or config.engine.backend != "native":
        return SharedWeightsConfig()
    def place(node: tuple[Role, int]) -> str:
        return f"gpu{gpu_of(config, node)}" if cuda else "host"

    sharers = [node for node in config.nodes() if place(node) == place((role, index))]
    if len(sharers) < 2:
        return SharedWeightsConfig()
    exporter = min(sharers, key=lambda node: (WEIGHTS_EXPORTER_ROLES.index(node[0]), node[1]))
    return SharedWeightsConfig(holding="export" if (role, index) == exporter else "import",
                               rendezvous=str(directory / f"weights-{place((role, index))}.msgpack"))


def gpu_kv_split(config: ClusterConfig, role: Role, index: int) -> tuple[int, float]:
    """(the local launcher's first nodes on this node's GPU, itself included; its part of their KV memory, by
    ROLE_KV_WEIGHTS). NOTE: a node added later (corun scale) on a GPU in use counts as one more, and never takes
    more than is free there (corun/kv_sizing.py). A node on the launching process' default GPU counts as on GPU 0
    (where that is another GPU, the two leave memory unused rather than overrun one GPU)."""
    if not config.engine.device.startswith("cuda"):
        return 1, 1.0

    sharers = [other for other in set(config.nodes()) | {(role, index)}
               if gpu_of(config, other) == gpu_of(config, (role, index))]
    return len(sharers), ROLE_KV_WEIGHTS[role] / sum(ROLE_KV_WEIGHTS[other_role] for other_role, _ in sharers)


def node_id(role: Role, index: int) -> str:
    """A node's id: its NIXL agent name, its name in logs and in the router's X-CoRun-*-Node headers."""
    return f"{role}-{index}"


PICKED_PORTS_DIR = Path(tempfile.gettempdir()) / "corun-picked-ports"
"""Where free_port marks the ports it picked, one empty file each, so that no launcher on this host picks one again
while the process it was picked for starts (a node binds its port only once its model has loaded)."""
PICK_HOLD_S = 300.0
"""How long a pick stays off other picks: longer than a node's start-up, so a marker this old is stale."""


def mark_picked(port: int) -> bool:
    """Mark port picked on this host; False if a launcher picked it within PICK_HOLD_S. Where the marks cannot be
    written (a read-only or foreign temporary directory), every port counts as unpicked, as before the marks."""
    marker = PICKED_PORTS_DIR / str(port)
    try:
        if not PICKED_PORTS_DIR.is_dir():
            PICKED_PORTS_DIR.mkdir(exist_ok=True)
            os.chmod(PICKED_PORTS_DIR, 0o1777)  # NOTE: every user's launchers share it, as /tmp itself
        remove_stale_marks()
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def remove_stale_marks() -> None:
    """Remove every mark older than PICK_HOLD_S (they hold no port), so that the directory keeps only live picks.
    NOTE: per mark, any OSError is left alone: another launcher removed it first, or another user's mark is not
    ours to remove (the port then stays off this launcher's picks, which try another)."""
    now = time.time()
    for marker in PICKED_PORTS_DIR.iterdir():
        with contextlib.suppress(OSError):
            if now - marker.stat().st_mtime > PICK_HOLD_S:
                marker.unlink()


EPHEMERAL_PORTS_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
FREE_PORT_TRIES = 64
FREE_PORTS_FROM = 20000
"""free_port's lowest pick: above the ports other cluster software claims (Ray's worker ports are 10002-19999)."""


def free_port(host: str) -> int:
    """A port nothing is bound to on host, for a process started next to bind: picked at random below the kernel's
    ephemeral range, and not picked by a launcher on this host in the last PICK_HOLD_S. NOTE: a port the kernel hands
    out for port 0 lies in that range, where it may give it next as an outgoing connection's source port before the
    new process binds it (seen with two test workers: 'Address already in use'); below it only another listener can
    take it. Two launchers could still pick the same port while neither process had bound it yet (seen once in a
    suite run: two test workers' nodes, each loading its model); the marker closes that window."""
    first_ephemeral = 32768
    with contextlib.suppress(OSError, ValueError):
        first_ephemeral = int(EPHEMERAL_PORTS_FILE.read_text().split()[0])
    low = FREE_PORTS_FROM if first_ephemeral > FREE_PORTS_FROM + 1024 else first_ephemeral // 2
    high = first_ephemeral - 1
    for port in random.SystemRandom().sample(range(low, high + 1), min(FREE_PORT_TRIES, high - low + 1)):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind((host, port))
            if mark_picked(port):
                return port
    with socket.socket() as s:  # NOTE: every pick taken: the kernel's choice
        s.bind((host, 0))
        return s.getsockname()[1]


def node_argv(config: ClusterConfig, engine: EngineConfig, role: Role, index: int, host: str, port: int,
              advertise_host: str | None = None, key_file: Path | None = None,
              weights: SharedWeightsConfig = SharedWeightsConfig()) -> list[str]:
    """`python -m {role}_node ...` with this process' interpreter (on a Ray actor: the one on the node's host): the
    flags of the node's NodeConfig, the cluster's NodeSettings included. Supervised by this process, which starts
    it: the node ends when this process does (wire/supervision.py)."""
    node = NodeConfig(role=role, node_id=node_id(role, index), engine=engine, host=host, port=port,
                      advertise_host=advertise_host, cluster_key_file=None if key_file is None else str(key_file),
                      supervisor_pid=os.getpid(), weights=weights, **settings_of(config, NodeSettings))
    return [sys.executable, "-m", f"{role}_node", *config_argv(node)]


def make_cluster_key(directory: Path | None = None) -> tuple[ClusterKey, Path]:
    """A fresh CURVE key pair for one cluster, in a file only this user can read (in a new private directory
    unless given one, named for this process: one that a killed launcher left is removed here, at the next
    start): the nodes and the router get its path, nobody else the key."""
    directory = make_owned_dir(KEY_DIR_PREFIX) if directory is None else directory
    key = ClusterKey.generate()
    return key, key.save(directory / "cluster.key")


def router_config(config: ClusterConfig, prefill_addresses: Iterable[str], decode_addresses: Iterable[str],
                  key_file: Path | None = None, colocated_addresses: Iterable[str] = (),
                  **one_router: Any) -> RouterConfig:
    """A router of this cluster, serving this pool: the cluster's RouterSettings, its engine's model and base
    seed, supervised by this process (which starts it); one_router: more RouterConfig fields (one of several
    routers: launch.routers.one_of_several)."""
    return RouterConfig(model=config.engine.model, prefill_addresses=tuple(prefill_addresses),
                        decode_addresses=tuple(decode_addresses), colocated_addresses=tuple(colocated_addresses),
                        base_seed=config.engine.seed, cluster_key_file=None if key_file is None else str(key_file),
                        supervisor_pid=os.getpid(), **settings_of(config, RouterSettings), **one_router)


def router_argv(router: RouterConfig) -> list[str]:
    """`python -m router ...` with this process' interpreter: the flags of every field of router but those that
    travel in its environment (router_environment)."""
    return [sys.executable, "-m", "router", *config_argv(router)]


def router_environment(router: RouterConfig, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The router process' environment: environ (this process') with the variables of the router's config set
    from it, or removed where it has no value: the API key as VLLM_API_KEY (or none), the metrics directory as
    PROMETHEUS_MULTIPROC_DIR. NOTE: not --api-key: a command line is visible to every user of the host in `ps`."""
    own = environment_variables(RouterConfig)
    return {name: value for name, value in environ.items() if name not in own} | config_environment(router)


def node_environment(gpu: str | None = None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A node process' environment: environ (this process') without the router's variables (the API key: a node
    never needs it, and any code the node runs could read it), with CUDA_VISIBLE_DEVICES when given its GPU."""
    own = environment_variables(RouterConfig)
    return {name: value for name, value in environ.items() if name not in own} | (
        {} if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu})


class PoolRefused(ValueError):
    """The router refuses the pool: its nodes disagree on the model or their fingerprint (a configuration
    error: `corun serve` prints it as one line)."""


def router_healthy(url: str) -> bool:
    """Whether the router's /health says "ok": every node answered a ping in the last few seconds ("degraded", also
    a 200, is not enough: some node does not answer); PoolRefused when it reports that the nodes disagree (waiting
    would not help)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200 and json.loads(response.read()).get("status") == "ok"
    except urllib.error.HTTPError as error:
        refusal = None
        with contextlib.suppress(ValueError, AttributeError):  # NOTE: a body that is not the router's JSON
            refusal = json.loads(error.read()).get("error")
        if refusal:
            raise PoolRefused(f"the router refuses this cluster: {refusal}") from None
        return False
    except OSError:
        return False


def wait_healthy(url: str, timeout_s: float, check_alive: Callable[[], None]) -> None:
    """Until the router at url reports every node up; check_alive raises if a process died meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            check_alive()
        except RuntimeError as error:
            raise StartupError(f"{error} during start-up (its message is above)") from None
        if router_healthy(url):
            logger.info("cluster ready at %s", url)
            return
        time.sleep(0.25)
    raise StartupError(f"cluster not healthy after {timeout_s} s: a node did not answer the router's pings")


def stop_processes(processes: list[tuple[str, subprocess.Popen]], grace_s: float) -> None:
    """SIGTERM all, then SIGKILL whichever is still running after grace_s."""
    for _, process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace_s
    for name, process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop in time; killing it", name)
            process.kill()
            process.wait()
