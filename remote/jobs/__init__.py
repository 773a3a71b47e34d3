"""``job``: long-running work on a host, detached from the SSH session that started it.

A job lives in ``<workdir>/jobs/<job-id>/``::

    spec.json        what to do (written once, by ``job start``)
    pid.json         {pid, pgid, starttime, started}: the runner's supervisor, its group
    runner.json      {pid, starttime, oom_before}: the runner it forked, the OOM counters
    preflight.json   the host checks' report (``job start --preflight``)
    log.txt          the runner's stdout/stderr, for people
    events.jsonl     progress events, one JSON object a line, appended as they happen
    ground_truth.json  where the ground truth came from (kind, url, cache key, warnings)
    eval_spec.json   the spec handed to the eval engine
    result.json      the engine's result (schema dflash.eval/1), when it finished
    samples.jsonl    the engine's per-sample records
    exit.json        {state: done|failed|cancelled, code, error, finished}: written last
                     (a killed runner's also {signal, oom, log}: `supervise`)
    slurm.json       how the scheduler ended a Slurm array task's attempt (``job array-end``)

``job start`` creates the folder, spawns ``job run`` in a NEW SESSION (``setsid``: its own
process group, no controlling terminal, stdin from /dev/null, output to ``log.txt``), whose
small supervisor forks the runner and records how it ended when it could not (a signal,
the OOM killer: `supervise`, `ending`), and returns at once, so a dropped connection or
a killed controller never reaches the job (``--follow``: it then goes on as ``job watch``
in the same SSH command, one round trip less). ``job watch`` follows ``events.jsonl``
from a byte offset and ends with one ``watch_end`` event (``--pull``: carrying the result
files, so no further round trip); ``job pull`` prints the state and the result files;
``job array`` runs one Slurm array task's job in the foreground, in a folder of its own
per attempt (`array`), and ``job array-end`` records how the scheduler ended one
(`slurm_end`); ``job cancel`` signals the whole process group (TERM, then KILL)
and waits until no member is left; ``job list`` and ``job status`` report state:
``running`` (the recorded supervisor or runner is alive: same pid AND same start time, so
a reused pid is not mistaken for it), ``done``, ``failed``, ``cancelled`` or ``lost`` (both
died without writing ``exit.json``; its status then says what the kernel says of it);
``job prune`` removes finished job folders and, when asked, cache entries older than an
age (`prune`).

The runner is generic (`run`); what a job does is its kind's (`remote.protocol.JOB_KINDS`):
``eval`` runs `remote.eval.job`, ``parity-capture`` and ``parity-compare`` run
`remote.eval.parity`, ``online`` runs `remote.online.job` (its ``verdict.json``,
``server.log`` and ``baseline.log`` travel back with the result). The rooms: the folder
and its state (`folder`), ``job start`` (`start`), the supervisor (`supervise`) and why a
runner ended (`ending`), the runner (`run`), ``job watch`` (`watch`), ``job cancel``
(`cancel`), and the command line (`command`), which imports only the room its action
runs.
"""
