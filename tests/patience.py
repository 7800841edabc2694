"""How long a test waits for something that must happen (a server to start, a stream's next token, a subprocess
to end): long enough that a machine loaded by other work never trips it, so only a hang fails a test."""

PATIENCE_S = 900
"""Seconds; no test here waits on anything that takes more than a minute on an idle 2-core machine."""
