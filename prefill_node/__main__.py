import sys

from node_core.serving import run_node
from prefill_node.server import PrefillServer

sys.exit(run_node("prefill", PrefillServer))
