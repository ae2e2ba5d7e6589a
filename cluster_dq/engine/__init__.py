"""The engine: Lua scripts (scripts.py), pure operations (commands.py), executors (aio, sync)."""
