"""Model definitions, checkpoint loading and the tiny test checkpoint."""
