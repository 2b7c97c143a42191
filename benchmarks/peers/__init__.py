"""Peers run in processes of their own (``python -m benchmarks.peers.<name> ...``) so their
threads, actors and memory never mix with the benchmark process; each prints one JSON line."""
