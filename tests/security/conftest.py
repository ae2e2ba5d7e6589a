"""The security suite (docs/security.md): the admin port against a hostile page, Host and
head bounds, slow clients, paths and names, metric labels, write limits. On a Cluster by
default, on every topology in the long run (``tests/support/run.py``); most modules run their
own service, with the setting under test."""
