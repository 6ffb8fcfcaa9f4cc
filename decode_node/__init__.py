"""Decode servers: N fixed slots, KV pulled over NIXL, one fixed-shape decode step, tokens streamed."""
