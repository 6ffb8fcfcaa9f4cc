# NOTE: vendored/ holds vLLM's test files and shim/ their stand-ins: they run only in run.py's child pytest (with
# their own rootdir), never in this suite.
collect_ignore = ["vendored", "shim"]
