# NOTE: upstream/ holds vLLM's test files as fetched, vendored/ the tree run.py lays out from them and shim/ their
# stand-ins: they run only in run.py's child pytest (with their own rootdir), never in this suite.
collect_ignore = ["upstream", "vendored", "shim"]
