import sys

from decode_node.server import DecodeServer
from node_core.serving import run_node

sys.exit(run_node("decode", DecodeServer))
