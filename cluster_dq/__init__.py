"""cluster_dq: a delayed task queue service on Redis, lmstfy-compatible."""

__version__ = "0.1.0"
