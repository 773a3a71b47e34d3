"""Remote eval from the workstation: one job, shards across hosts, following a run."""
