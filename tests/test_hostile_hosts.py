"""What an eval host answers about its jobs is checked before the workstation uses it, read
with bounds, and waited on with a deadline (issue 25: items 2, 6, 8 and the waits).

The host is a real loopback sshd whose ``python`` is a hostile wrapper
(`tests.helpers.hostile`) running the real bundle and rewriting its answers; the jobs are
real jobs of the real ``job start``. Each case is one scenario line and ends with one line
naming the host (no traceback), nothing written outside the results folder, and nothing
left running on the host.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
from pathlib import Path

import pytest

from orchestrator.errors import DflashError
from orchestrator.inventory import load_inventory
from orchestrator.transport.hosts import open_host
from tests.helpers.cli import dflash, one_error_line
from tests.helpers.hostile import HostileHost, finishes
from tests.helpers.runs import make_run
from tests.helpers.sshd import ssh_host_entry

pytestmark = pytest.mark.slow
MiB = 1 << 20
_n = itertools.count()


class Env:
    """One case's hostile host, its inventory, its job and its results folder, inside a
    folder (`outside`) that must hold exactly what it held before."""

    def __init__(self, hostile: HostileHost, inventory: Path, job: str, results: Path):
        self.hostile, self.inventory, self.job, self.results = hostile, inventory, job, results

    def cli(self, *args: str, timeout: float = 120):
        return dflash(*args, "-i", str(self.inventory), timeout=timeout)

    def host(self):
        inv = load_inventory(self.inventory)
        return open_host(inv.host("evalhost"), inv)


@pytest.fixture
def env(eval_sshd, ssh_base, make_inventory, tmp_path):
    n = next(_n)
    workdir = eval_sshd.root / f"hostile-{os.getpid()}-{n}"
    hostile = HostileHost(tmp_path / "hostile", workdir)
    drafters = eval_sshd.root / "hostile-drafters"
    drafters.mkdir(exist_ok=True)
    results = tmp_path / "results"
    results.mkdir()
    (tmp_path / "sentinel").write_text("keep me")
    inventory = make_inventory(
        hosts={
            "evalhost": ssh_host_entry(
                eval_sshd,
                ssh_base,
                python=hostile.python,
                workdir=str(workdir),
                roles={"eval": {"drafters": str(drafters)}},
            )
        },
        defaults={"eval_host": "evalhost", "results_dir": str(results)},
    )
    job = f"job-{n}"
    hostile.make_job(job)
    before = sorted(p.name for p in tmp_path.iterdir())
    yield Env(hostile, inventory, job, results)
    assert hostile.left_behind() == []
    assert (tmp_path / "sentinel").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# ---- item 2: a job id names a local folder only once it is checked ---------------------


def test_a_host_that_accepts_dotdot_cannot_make_attach_delete_folders(env):
    """Before: `jobs attach ..` (then `remote-eval --attach ..`) on a host that accepts `..`
    (played here: it answers for a real done-looking job) pulled into results/.. and
    deleted the folder holding results/, ending in a FileNotFoundError traceback."""
    real = f"--job-id={env.job}"
    files = {"result.json": base64.b64encode(b"{}").decode()}
    env.hostile.play(
        status={
            "argv": f"[x if x != '--job-id=..' else {real!r} for x in args]",
            "answer": "dict(a, job_id='..', state='done', has_result=True)",
        },
        watch={
            "argv": f"[x if x != '--job-id=..' else {real!r} for x in args]",
            "answer": f"dict(a, state='done', has_result=True, files={files!r})"
            " if a.get('event') == 'watch_end' else a",
        },
    )
    proc = env.cli("jobs", "attach", "..")
    assert proc.returncode != 0
    line = one_error_line(proc)
    assert "invalid job id '..'" in line
    assert env.results.is_dir() and list(env.results.iterdir()) == []


def test_a_pull_never_writes_through_a_link_at_the_run_folder(env, tmp_path):
    """A link planted where the run folder goes is replaced, never followed (before:
    `rmtree` refused the link with an OSError traceback)."""
    from orchestrator.eval import pull

    elsewhere = tmp_path / "hostile" / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("mine")
    (env.results / env.job).symlink_to(elsewhere)
    real = (
        make_run(tmp_path / "hostile" / "made", env.job, "step_1", 1) / "result.json"
    )  # well typed
    end = {
        "has_result": True,
        "dir": "/x",
        "files": {"result.json": base64.b64encode(real.read_bytes()).decode()},
    }
    with env.host() as host:
        out = pull.pull_results(host, env.job, env.results, end)
    assert not out.is_symlink() and sorted(p.name for p in out.iterdir()) == [
        "pulled.json",
        "result.json",
    ]
    assert [p.name for p in elsewhere.iterdir()] == ["keep"]
    (env.results / env.job / "result.json").unlink()  # the case's own files: not "outside"


def test_a_run_id_that_is_not_a_job_id_is_refused_before_anything(env):
    from orchestrator.eval.shards.run import run_sharded

    with pytest.raises(DflashError, match=r"invalid job id '\.\./x'"):
        run_sharded(load_inventory(env.inventory), ["evalhost"], "step-1", run_id="../x")


# ---- item 6: every job answer has its shape, or is one line naming host and field -------

STATUS_RUNNING = "dict(a, state='running')"
ANSWERS = [
    # (scenario, command, what the one line says)
    ({"status": {"answer": "[a]"}}, "attach", "the answer is a list, not a JSON object"),
    (
        {"status": {"answer": "{k: v for k, v in a.items() if k != 'state'}"}},
        "attach",
        "'state' is missing",
    ),
    ({"status": {"answer": "dict(a, state='exploded')"}}, "attach", "'state' is text"),
    ({"status": {"answer": "dict(a, job_id='other')"}}, "attach", "about job other, not"),
    (
        {"status": {"answer": "dict(a, exit={'state': 'failed', 'error': ['x']})"}},
        "attach",
        "'exit.error' is a list",
    ),
    ({"list": {"answer": "{'jobs': a}"}}, "jobs", "a JSON object, not a list of jobs"),
    ({"list": {"answer": "a + [{'job_id': 'x'}]"}}, "jobs", "row 2: 'state' is missing"),
    ({"list": {"answer": "a + ['row']"}}, "jobs", "row 2 is text, not a JSON object"),
    ({"list": {"answer": "[dict(r, kind='rm') for r in a]"}}, "jobs", "row 1: 'kind' is text"),
    ({"list": {"answer": "[dict(r, job_id='../x') for r in a]"}}, "jobs", "expected a job id"),
    (
        {"list": {"answer": "[dict(r, progress={'event': 'sample', 'done': 'x'}) for r in a]"}},
        "jobs",
        "'progress.done' is text",
    ),
    (
        {"cancel": {"answer": "{'job_id': a['job_id'], 'state': 'exploded'}"}},
        "cancel",
        "'state' is text ('exploded'), expected one of",
    ),
    (
        {"cancel": {"answer": "dict(a, killed=-1)"}},
        "cancel",
        "'killed' is a number (-1), expected a whole number of at least 0",
    ),
    (
        {
            "status": {"answer": STATUS_RUNNING},
            "watch": {
                "answer": "dict(event='sample', done=1, total={'n': 1})"
                " if a.get('event') == 'watch_end' else a"
            },
        },
        "attach",
        "'total' is a JSON object",
    ),
    (
        {
            "status": {"answer": STATUS_RUNNING},
            "watch": {
                "answer": "dict(event='sample', done=1, total=2, tokens='many')"
                " if a.get('event') == 'watch_end' else a"
            },
        },
        "attach",
        "'tokens' is text",
    ),
    (
        {
            "status": {"answer": STATUS_RUNNING},
            "watch": {"answer": "dict(a, state=['done']) if a.get('event') == 'watch_end' else a"},
        },
        "attach",
        "bad end line from job watch: 'state' is a list",
    ),
]


@pytest.mark.parametrize(("scenario", "command", "says"), ANSWERS)
def test_a_malformed_job_answer_is_one_line_naming_host_and_field(env, scenario, command, says):
    """Before: tracebacks (TypeError, KeyError, a crash in rich's progress bar) or a
    table drawn from whatever the host said."""
    env.hostile.play(**scenario)
    args = {
        "attach": ("jobs", "attach", env.job),
        "jobs": ("jobs",),
        "cancel": ("jobs", "cancel", env.job),
    }[command]
    proc = env.cli(*args)
    assert proc.returncode != 0, proc.stdout
    line = error_line(proc)
    assert line.startswith("error: evalhost: bad "), line
    assert says in line, line


def error_line(proc) -> str:
    """The one error line, last on stderr (a progress bar drawn before it may stand
    above), with no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.strip().endswith(errors[0]), proc.stderr
    return errors[0]


def test_a_start_answer_without_its_pid_is_one_line(env):
    """Before: KeyError 'pid' from `start_job`."""
    from orchestrator.eval import job

    env.hostile.play(start={"answer": "{k: v for k, v in a.items() if k != 'pid'}"})
    spec = {"kind": "eval", "checkpoint": "x"}
    with env.host() as host, pytest.raises(DflashError, match=r"evalhost: .*'pid' is missing"):
        job.start_job(host, spec, f"{env.job}-b")
    env.hostile.cancel(f"{env.job}-b")  # the host did start it


def test_honest_answers_pass_the_contract(env):
    """The checks accept what the real bundle answers, for every action."""
    from orchestrator import jobs as hostjobs
    from orchestrator.eval import job

    with env.host() as host:
        status = job.job_status(host, env.job)
        assert status["state"] == "cancelled" and status["job_id"] == env.job
        end = job.watch(host, env.job, pull=True)
        assert end["state"] == "cancelled" and isinstance(end["files"], dict)
        assert job.cancel(host, env.job)["was"] == "cancelled"
        ref = job.start_job(host, env.hostile.blocking_spec(f"{env.job}-c"), f"{env.job}-c")
        assert ref.pid > 0 and ref.dir.endswith(f"{env.job}-c")
        assert job.cancel(host, ref.job_id)["state"] == "cancelled"
    rows = hostjobs.jobs_on(load_inventory(env.inventory))
    assert {r["job_id"] for r in rows} >= {env.job, f"{env.job}-c"}
    assert {r["host"] for r in rows} == {"evalhost"}


def lower(monkeypatch, name: str, value) -> None:
    """Set bound `name` of `orchestrator.eval.jobwire` to `value` for one case. (Before
    issue 25 there was no such module and no bound: the case then runs against the code
    as it was, and fails on what it asserts rather than on an import.)"""
    try:
        from orchestrator.eval import jobwire
    except ImportError:
        return
    if isinstance(getattr(jobwire, name), dict):  # some of its entries
        for key, entry in value.items():
            monkeypatch.setitem(getattr(jobwire, name), key, entry)
    else:
        monkeypatch.setattr(jobwire, name, value)


# ---- item 8: every line a host sends has a size cap ------------------------------------


def test_a_job_list_line_without_end_is_refused_at_its_cap(env, monkeypatch):
    """Before: the whole answer was buffered (887 MiB for a 300 MB line) and then called
    "printed no JSON"."""
    from orchestrator import jobs as hostjobs

    lower(monkeypatch, "LIST_MAX", 1 * MiB)
    env.hostile.play(list={"print": "(b'x' * MiB for _ in range(64))"})
    with pytest.raises(DflashError, match=r"evalhost: job list sent a line over 1 MiB; refused"):
        finishes(lambda: hostjobs.jobs_on(load_inventory(env.inventory)))
    assert env.hostile.left_behind() == []
    assert env.hostile.written() < 32 * MiB  # the host was cut off, not read to its end


def test_a_watch_stream_without_newline_is_refused_at_its_cap(env, monkeypatch):
    """Before: 732 MiB for a 600 MB watch stream without a newline."""
    from orchestrator.eval import job

    lower(monkeypatch, "EVENT_MAX", 1 * MiB)
    env.hostile.play(watch={"print": "(b'{\"event\": \"x' + b'x' * MiB for _ in range(64))"})
    with env.host() as host, pytest.raises(DflashError, match=r"sent a line over 1 MiB; refused"):
        finishes(lambda: job.watch(host, env.job))
    assert env.hostile.left_behind() == []
    assert env.hostile.written() < 32 * MiB


def test_a_pull_and_a_file_read_are_refused_at_their_caps(env, monkeypatch, tmp_path):
    """`job pull`'s answer (the result files) and a file a host holds (a ground truth the
    controller slices) are read to their caps, no further. Before: read whole."""
    from orchestrator.eval import pull

    lower(monkeypatch, "RESULT_MAX", 1 * MiB)
    env.hostile.play(pull={"print": "(b'{\"x' + b'x' * MiB for _ in range(64))"})
    big = env.hostile.workdir / "big.jsonl"
    big.write_bytes(b"x" * 3 * MiB)
    with env.host() as host:
        with pytest.raises(DflashError, match=r"evalhost: job pull sent a line over 1 MiB"):
            finishes(lambda: pull.pull_results(host, env.job, env.results))
        from orchestrator.eval.jobwire import fetch

        too_big = r"evalhost: the ground truth .*big.jsonl is more than 1 MiB; refused"
        with pytest.raises(DflashError, match=too_big):
            finishes(lambda: fetch(host, str(big), "the ground truth", 1 * MiB))
        assert fetch(host, str(big), "the ground truth", 4 * MiB) == big.read_bytes()
    assert env.hostile.written() < 32 * MiB
    assert list(env.results.iterdir()) == []


def test_the_end_of_a_watch_may_carry_results_bigger_than_an_event(env, tmp_path, monkeypatch):
    """The last line of a watch (--pull) carries the result files: it has its own cap,
    sized for results, above an event's; beyond it, one line."""
    from orchestrator.eval import job, pull

    lower(monkeypatch, "EVENT_MAX", 1 * MiB)
    log = "base64.b64encode(b'y' * 3 * MiB).decode()"
    made = make_run(tmp_path / "hostile" / "made", env.job, "step_1", 1) / "result.json"
    result = base64.b64encode(made.read_bytes()).decode()  # well typed
    env.hostile.play(
        watch={
            "answer": "dict(a, state='done', has_result=True, files={"
            f"'result.json': '{result}', 'log.txt': {log}}})"
            " if a.get('event') == 'watch_end' else a"
        }
    )
    with env.host() as host:
        end = finishes(lambda: job.watch(host, env.job, pull=True))
        out = pull.pull_results(host, env.job, env.results, end)
        assert (out / "log.txt").read_bytes() == b"y" * 3 * MiB
        lower(monkeypatch, "RESULT_MAX", 2 * MiB)
        with pytest.raises(DflashError, match=r"sent a line over 2 MiB; refused"):
            finishes(lambda: job.watch(host, env.job, pull=True))
    for p in out.iterdir():  # the case's own run folder: not "outside"
        p.unlink()
    out.rmdir()


# ---- waits: nothing waits forever on a host --------------------------------------------


def test_a_watch_whose_host_goes_silent_ends_with_one_line(env, monkeypatch):
    """The host's watch sends a heartbeat every few seconds; a host that stops sending
    (here: after its real events, before its end) ends the watch at the silence bound.
    Before: waited forever."""
    from orchestrator.eval import job

    lower(monkeypatch, "WATCH_SILENCE_SECONDS", 2.0)
    env.hostile.play(watch={"answer": "HANG if a.get('event') == 'watch_end' else a"})
    seen: list[dict] = []
    with env.host() as host, pytest.raises(DflashError) as err:
        finishes(lambda: job.watch(host, env.job, seen.append))
    assert str(err.value).startswith(f"evalhost: job watch of {env.job} sent nothing for 2s")
    assert f"dflash jobs attach {env.job} --host evalhost" in str(err.value)
    events = (env.hostile.workdir / "jobs" / env.job / "events.jsonl").read_text()
    assert seen == [json.loads(line) for line in events.splitlines()]  # all before the silence


@pytest.mark.parametrize(
    ("action", "rule"),
    [
        ("status", {"hang": 600}),  # never answers
        ("status", {"answer": "a", "then": "hang"}),  # answers, never ends
        ("status", {"print": "(time.sleep(0.5) or b' ' for _ in range(1200))"}),  # trickles
        ("cancel", {"hang": 600}),
        ("start", {"hang": 600}),
    ],
)
def test_a_job_command_whose_host_never_finishes_ends_at_its_deadline(
    env, monkeypatch, action, rule
):
    """Before: `job start --follow`'s answer, attach's status and a cancel waited as long
    as the host kept the channel open."""
    from orchestrator import jobs as hostjobs
    from orchestrator.eval import job, run

    lower(monkeypatch, "DEADLINES", {action: 2.0})
    env.hostile.play(**{action: rule})
    inv = load_inventory(env.inventory)

    def start():
        with env.host() as host:
            job.start_job(host, {"kind": "eval", "checkpoint": "x"}, f"{env.job}-s", follow=True)

    work = {
        "status": lambda: run.attach(inv, "evalhost", env.job),
        "cancel": lambda: hostjobs.cancel_on(inv, "evalhost", env.job),
        "start": start,
    }[action]
    with pytest.raises(DflashError, match=rf"evalhost: job {action} did not finish within 2s"):
        finishes(work)
