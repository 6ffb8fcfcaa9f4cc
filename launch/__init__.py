"""Launchers: every node on this host (`corun serve`), or the nodes on a Ray cluster (`--launcher ray`)."""
