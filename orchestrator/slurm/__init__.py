"""Slurm from the workstation: eval shards as ONE job array on a cluster's login node.

The controller never runs on the login node; it runs plain Slurm commands there over the
existing SSH transport (`orchestrator.transport.hosts.Host`), every argument quoted:

- `role`: the login node's settings (partition, account, limits, the shared folder), checked
  at construction;
- `plan`: one array (its tasks, the command each runs) rendered as a batch script and an
  ``sbatch`` command line, pure;
- `states`: Slurm's job states and what each means here (queued, running, done, failed;
  which failures are worth a second attempt);
- `answers`: what ``sbatch``, ``squeue`` and the job folder answer, parsed strictly;
- `client`: the commands on the login node (submit, queue, exit records, cancel);
- `array`: the run, submit, watch, resubmit failed tasks (bounded), cancel on any way out.
"""
