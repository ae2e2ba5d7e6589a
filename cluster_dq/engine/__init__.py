"""The engine: Lua scripts (scripts.py), pure operations (steps.py and one module per concept, listed in commands.py), executors (aio, sync)."""
