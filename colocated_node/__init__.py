"""Colocated servers: prefill and decode in one process (the engine's fixed_shape schedule) behind the router."""
