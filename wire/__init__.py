"""The cluster's vocabulary, torch-free: what the router, the nodes, the launcher and the engine all speak.

Wire messages (protocol), configs (config, engine_args: one definition of each default, the flag table), request
parameters and outputs (sampling_params, outputs), seeds (seeding), the tokenizer, and credentials (auth: API keys;
node_auth: the cluster's CURVE key). Nothing here imports torch or the engine (tests/test_layering.py).
"""
