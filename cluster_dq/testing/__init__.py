"""Helpers for the test suite, the drills, the profiles and the benchmarks that run the real
service; standard library only, so the runtime never depends on a test tool."""
