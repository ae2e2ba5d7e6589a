"""The ``CLUSTER_DQ_*`` environment variables that are not service settings, in one list.

The client side (the Python client, the worker, the operator commands) reads the first five;
the README has users export them in the shell that also runs ``cluster-dq serve`` and
``cluster-dq token``. The settings loader leaves the names listed here alone and still refuses
any other ``CLUSTER_DQ_*`` name it does not know, so a typo of a setting is named, not ignored.
Here, apart from both sides, so that neither imports the other (this module imports nothing).
"""

URL = "CLUSTER_DQ_URL"
TOKEN = "CLUSTER_DQ_TOKEN"
NAMESPACE = "CLUSTER_DQ_NAMESPACE"
ADMIN_URL = "CLUSTER_DQ_ADMIN_URL"
ADMIN_AUTH = "CLUSTER_DQ_ADMIN_AUTH"
LOCAL_DIR = "CLUSTER_DQ_LOCAL_DIR"  # deploy/local/redis: where its topologies keep their state

NOT_SETTINGS = frozenset({URL, TOKEN, NAMESPACE, ADMIN_URL, ADMIN_AUTH, LOCAL_DIR})
