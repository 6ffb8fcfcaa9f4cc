"""Prefill servers: one request per forward (isolated prefill), first token sampled, KV leased to decode."""
