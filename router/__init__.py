"""The HTTP front door (OpenAI-compatible): request ids, request-bound seeds, instance choice. Never imports torch."""
