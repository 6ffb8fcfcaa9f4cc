"""The KV data plane: the transport seam (transport.py: a prefill node's sender, a decode node's receiver, the
registry's factory), the leases every sender keeps (leases.py), the NIXL transport (agent.py) and the in-process fake
(fake.py) over one pair of agent endpoints (endpoints.py); compatibility-hash handshake, block descriptors, counters."""
