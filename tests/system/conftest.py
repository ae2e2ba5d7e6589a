"""Whole-system runs with real processes: failover drills, history checks under SIGKILLs, Redis
outages, the load profile through nginx, the Spark pipeline, every benchmark command, the
packaging and the local scripts. Each fixed-duration run keeps a short version here and its
full length in the long run (``tests/support/run.by_tier``)."""
