"""The generation room: one prompt through the cluster and back as text. It owns the per-prompt pipeline
(prefill then decode, or the whole request on a colocated node; retries and failover, SampleProgress), the
incremental detokenizer, and the prompt's choice deltas (detokenised, cut at stop strings, timed for metrics)
with several prompts' deltas merged as they come. It may import the nodes room, router.metrics and wire; never
the api room nor router.app: what it yields (ChoiceDelta) knows nothing of HTTP or OpenAI's bodies
(tests/test_layering.py holds it to that)."""
