"""What the queue promises, under concurrency, crashes, leadership changes and lost replicas:
delivery at least once and at most ``tries`` times, leases, durable writes. On all three
topologies in every run (``tests/support/run.py``); the fixtures are the root's
(``tests/conftest.py``, ``tests/support/fixtures.py``)."""
