"""The api room: the router's HTTP surface. It owns the handlers of /v1/completions and /v1/chat/completions
(request ids, seeds, admission, full and streamed answers), body parsing and validation (openai_api, fields,
chat, tokens) with its offloading off the event loop, response bodies and stream chunks, client-facing errors,
the API key check, the admin API over the pool and the state every handler shares. It may import the
generation and nodes rooms, router.metrics and wire; never router.app, which assembles it (the request path
flows one way, api -> generation -> nodes: tests/test_layering.py)."""
