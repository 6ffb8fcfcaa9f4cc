"""The KV data plane on NIXL: registration, compatibility-hash handshake, block descriptors, counters."""
