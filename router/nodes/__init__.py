"""The nodes room: the router's connections to its prefill, decode and colocated nodes. It owns NodeClient (one
node's zmq socket, its replies demultiplexed into per-request ReplyQueues, the watchdog that ends silent waits,
the node's health), NodePool (membership, the ping loop, the model facts the nodes agree on) and the instance
choice (which node takes a request, given the request). It may import wire and the libraries it talks through
(zmq), never another room of the router (generation, api) nor its top-level modules: it is the bottom of the
request path, api -> generation -> nodes (tests/test_layering.py holds it to that)."""
