"""The HTTP front door (OpenAI-compatible): request ids, request-bound seeds, instance choice. Never imports torch.

A request flows one way through three rooms, api -> generation -> nodes (each package's docstring says what it
owns and may import; tests/test_layering.py holds them to it); app.py assembles them, metrics.py is shared.
"""
