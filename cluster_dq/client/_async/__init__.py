"""The asyncio clients: the source the blocking ones (``_sync``) are generated from."""
