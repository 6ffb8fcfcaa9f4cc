"""Colocated servers: prefill and decode in one process (the engine's co-run schedule) behind the router."""
