"""Launch: local (`corun serve`) and multi-node on Ray; the prefill:decode capacity planner."""
