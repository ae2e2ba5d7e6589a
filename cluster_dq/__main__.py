"""``python -m cluster_dq``: the ``cluster-dq`` command (cluster_dq/cli.py), for an environment
whose scripts directory is not on the PATH."""

from cluster_dq.cli import main

raise SystemExit(main())
