"""Who may talk to a node: zmq CURVE with one key pair per cluster, made by the launcher.

Every member (nodes, the router, and the decode nodes as clients of the prefill nodes) holds the cluster's key
pair. A node's ROUTER socket is a CURVE server with it, and its ZAP handler admits only clients that prove they
hold the same pair's secret (CURVE's handshake proves it): a process without the key file can neither send a
node a message (abort another client's request, claim KV) nor read its replies. Torch-free: the router uses it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth.thread


@dataclass(frozen=True)
class ClusterKey:
    public: bytes
    """Z85, 40 bytes."""
    secret: bytes = field(repr=False)

    @classmethod
    def generate(cls) -> ClusterKey:
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    @classmethod
    def load(cls, path: str | Path) -> ClusterKey:
        """The key file save() wrote; refused if others than its owner may read it."""
        path = Path(path)
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"{path}: the cluster key file must be readable by its owner only (chmod 600)")
        lines = path.read_bytes().split()
        if len(lines) != 2 or not all(len(line) == 40 for line in lines):
            raise ValueError(f"{path}: not a cluster key file (two Z85 lines: public, secret)")
        return cls(*lines)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(self.public + b"\n" + self.secret + b"\n")
        return path

    def serve(self, socket: zmq.Socket) -> None:
        """Make a socket (before it binds) a CURVE server of the cluster."""
        socket.curve_secretkey, socket.curve_publickey, socket.curve_server = self.secret, self.public, True

    def connect(self, socket: zmq.Socket) -> None:
        """Make a socket (before it connects) a CURVE client of a cluster node."""
        socket.curve_secretkey, socket.curve_publickey, socket.curve_serverkey = self.secret, self.public, self.public


class _ClusterMembers:
    """ZAP credentials check: only the cluster's own public key."""

    def __init__(self, key: ClusterKey):
        self.key = key

    def callback(self, domain: str, client_public_key: bytes) -> bool:
        return client_public_key == self.key.public


def admit_only_members(context: zmq.Context, key: ClusterKey) -> zmq.auth.thread.ThreadAuthenticator:
    """Start the ZAP handler of a node process (one per context; stop() it on close)."""
    authenticator = zmq.auth.thread.ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback(domain="*", credentials_provider=_ClusterMembers(key))
    return authenticator
