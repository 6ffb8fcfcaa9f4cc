import sys

from corun.serving import run_node
from decode_node.server import DecodeServer

sys.exit(run_node("decode", DecodeServer))
