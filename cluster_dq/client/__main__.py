"""``python -m cluster_dq.client module:function --queue q ...``: the worker's command line
(``worker.main``), the same as ``python -m cluster_dq.client.worker``."""

from cluster_dq.client.worker import main

if __name__ == "__main__":
    main()
