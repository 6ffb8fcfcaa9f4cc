import sys

from colocated_node.server import ColocatedServer
from node_core.serving import run_node

sys.exit(run_node("colocated", ColocatedServer))
