"""What the prefill and decode servers share (node_core.server.NodeServer): the model runner, the KV block
manager, the node's side of the KV transport (its TransferConfig names it: NIXL in the cluster, the in-process fake
in unit tests), the control sockets, the fingerprint and KV compatibility facts, ping stats, freeing, closing and the
run loop."""
