"""The blocking clients, generated from ``_async`` by ``scripts/unasync.py``."""
