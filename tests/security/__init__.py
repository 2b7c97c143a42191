"""Attacks on the platform from a second account, one test per class of hole (issue #31)."""
