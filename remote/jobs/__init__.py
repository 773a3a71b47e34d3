"""``job``: long-running work on a host, detached from the SSH session (docs/eval.md)."""
