"""Evaluate one checkpoint across several eval hosts: plan, run the shards, merge.

The everyday path is one call::

    run_sharded(inventory, ["ct129", "ct130"], "step_12000", EvalOptions(samples=200),
                on_event=lambda host, ev: print(host, ev))

1. **Ground truth, once.** A ground-truth-only job (``stop_after="ground_truth"``) runs on
   the first host, exactly as a single-host eval's first phase would (server, file, local
   generation; cached on that host). Its JSONL is pulled here. Every shard then gets ITS
   SLICE of that very file, pushed to its host as a ``file`` ground truth. Why not let every
   host ask the server for its ids: N hosts would each need the server reachable and
   their own cache, a server whose answer changed between requests would give shards
   different ground truth, and a ``local`` source would pay generation N times. One file,
   sliced, is identical across shards by construction.
2. **Plan.** `shard_plan.plan_shards`: balanced by expected tokens, not by sample count
   (see there). Each shard keeps ground-truth order.
3. **Run.** One detached job per host (`remote_job.start_job`), all watched at once in a
   `concurrent.futures` thread pool over our `Host` objects; events go to ``on_event(host,
   event)`` (the CLI draws one progress row per host and a total). Besides the jobs' own
   events: ``plan`` (samples, shards), ``shard`` (a job started: job_id, samples, tokens)
   and ``shard_failed`` (error, kept, unfinished). The engine's sample
   events carry each sample's record, so the records a host finished are here even if the
   host is lost afterwards.
4. **Failures.** A shard whose job fails, is lost, or whose connection drops keeps the
   records already received; its unfinished samples are re-planned across the hosts that
   are free (as soon as one is), and the result lists that under ``"reassigned"``.
5. **Merge.** (`shard_plan.merge_result`) Records in ground-truth order; aggregates recomputed by
   `remote.eval.metrics.summarize`, the function the engine itself uses, so the merged result
   equals what one host would produce for the same samples. ``result["shards"]`` records
   the hosts, the plan, the jobs and how ground truth was shared.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import DflashError
from orchestrator.eval import job as remote_job
from orchestrator.eval import jobwire, pull
from orchestrator.eval.job import JobError, JobRef
from orchestrator.eval.shard_plan import merge_result, plan_shards
from orchestrator.eval.spec import EvalOptions, build_spec, carry_or_push, new_job_id
from orchestrator.inventory import HostSpec, Inventory
from orchestrator.results.store import results_dir
from orchestrator.transport.hosts import Host, open_host
from remote.protocol import GT_CACHE_KEY_RE, GT_DEFERRED_FILE, agreement_suspect, flag_suspect
from remote.protocol import GT_DEFAULT_MAX_NEW_TOKENS as DEFAULT_MAX_NEW_TOKENS

# The ground truth file the first host makes, pulled here to be sliced: 10,000 samples of
# 2048 + 2048 tokens are about 300 MB of JSON.
GROUND_TRUTH_MAX = 1 << 30
# How long a shard job started early waits for its slice of the ground truth before it
# gives up (a controller that went away must not leave it holding its target for ever).
EARLY_WAIT_SECONDS = 3600.0

# Dropping a ground truth judged wrong from the first host's cache: one rm, or given up.
EVICT_SECONDS = 60.0

HostEventHandler = Callable[[str, dict], None]


# ---- run --------------------------------------------------------------------------------


@dataclass
class _Outcome:
    """What one shard job gave back: the records received (index -> record), and either
    its pulled result or why it failed."""

    host: str
    indices: list[int]
    job_id: str | None = None
    records: dict[int, dict] = field(default_factory=dict)
    result: dict | None = None
    run_dir: Path | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _gt_lines(records: list[dict], indices: list[int]) -> bytes:
    return b"".join(
        json.dumps(
            {
                "id": records[i]["id"],
                "prompt_ids": records[i]["prompt_ids"],
                "completion_ids": records[i]["completion_ids"],
            }
        ).encode()
        + b"\n"
        for i in indices
    )


def _carried(host: Host, job_id: str, end: dict, name: str) -> bytes | None:
    """The result file `name` a watch's end carried (``--pull``), checked as every pulled
    file is (`pull.decode_files`); None when it carried none (then fetch it)."""
    files = end.get("files")
    if not isinstance(files, dict) or name not in files:
        return None
    return pull.decode_files(host, job_id, files, required=(name,))[name]


def _ground_truth_records(host: str, data: bytes) -> list[dict]:
    """The records of the ground truth file a host made, checked as a host checks a
    ground truth file it is given (`remote.eval.groundtruth.read_ground_truth_file`)."""
    from remote.errors import UserError
    from remote.eval.groundtruth import read_ground_truth_file

    with tempfile.TemporaryDirectory(prefix="dflash-gt-") as tmp:
        path = Path(tmp) / "ground_truth.jsonl"
        path.write_bytes(data)
        try:
            return read_ground_truth_file(str(path))
        except UserError as exc:
            raise JobError(
                f"{host}: its ground truth: {str(exc).replace(str(path), 'file')}"
            ) from None


def _read_jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


class _Sharded:
    """State of one sharded run; `run` drives it. Worker threads only fill their own
    `_Outcome`; the scheduling decisions happen in the calling thread."""

    def __init__(
        self,
        inventory: Inventory,
        specs: list[HostSpec],
        checkpoint: str,
        options: EvalOptions,
        on_event: HostEventHandler | None,
        stage: Path,
        run_id: str,
    ):
        self.inventory, self.specs, self.checkpoint = inventory, specs, checkpoint
        self.options, self.stage, self.run_id = options, stage, run_id
        self._on_event = on_event
        self._event_lock = threading.Lock()
        self.hosts: dict[str, Host] = {}
        self.attempts: dict[str, int] = {}

    def emit(self, host: str, event: dict) -> None:
        if self._on_event:
            with self._event_lock:  # one progress view fed by several watcher threads
                self._on_event(host, event)

    # -- ground truth --------------------------------------------------------------------
    def start_ground_truth(self) -> tuple[JobRef, dict]:
        """Start the ground-truth job on the first host; returns once its host checks passed
        (the target's tokenizer among them), so a run whose ground truth cannot be made
        starts nothing else. (ref, the job spec)."""
        spec = self.specs[0]
        host = self.hosts[spec.name]
        options = dataclasses.replace(self.options, stop_after="ground_truth")
        job = build_spec(host, spec, self.checkpoint, options)
        ref = remote_job.start_job(host, job, f"{self.run_id}-gt", preflight=True, follow=True)
        self.emit(spec.name, {"event": "ground_truth_job", "job_id": ref.job_id})
        return ref, job

    def ground_truth(self, ref: JobRef, job: dict) -> tuple[list[dict], dict, dict]:
        """Watch the ground-truth job `ref` to its end; returns (records, the job's
        ground_truth.json, the job spec)."""
        spec = self.specs[0]
        host = self.hosts[spec.name]
        end = remote_job.watch(
            host, ref.job_id, lambda ev: self.emit(spec.name, ev), stream=ref.stream
        )
        if end["state"] != "done":
            err = (end.get("exit") or {}).get("error")
            raise JobError(
                f"ground truth job {ref.job_id} on {spec.name} {end['state']}"
                f"{': ' + err if err else ''}"
            )
        raw = _carried(host, ref.job_id, end, "ground_truth.json") or jobwire.fetch(
            host, f"{ref.dir}/ground_truth.json", "ground_truth.json", jobwire.ANSWER_MAX
        )
        try:
            info = json.loads(raw)
        except ValueError:
            info = None
        if not isinstance(info, dict) or not isinstance(info.get("file"), str):
            raise JobError(f"{spec.name}: ground truth job {ref.job_id} names no ground truth file")
        data = jobwire.fetch(host, info["file"], "the ground truth", GROUND_TRUTH_MAX)
        records = _ground_truth_records(spec.name, data)
        info["sha256"] = hashlib.sha256(data).hexdigest()
        info["job_id"] = ref.job_id
        return records, info, job

    def judge_ground_truth(self, gt_info: dict, agreement: object) -> dict:
        """The merged eval's verdict on its ground truth (`remote.protocol.
        agreement_suspect`): wrong wholesale, it is flagged (`flag_suspect`) and its entry
        dropped from the first host's cache, where the ground-truth job made it (one ``rm``
        over a new connection, by the cache key that host reported, checked to be one)."""
        rate = agreement.get("rate") if isinstance(agreement, dict) else None
        if not agreement_suspect(rate):
            return gt_info
        key, evicted = gt_info.get("cache_key"), False
        if isinstance(key, str) and GT_CACHE_KEY_RE.match(key):
            try:
                with open_host(self.specs[0], self.inventory) as host:
                    base = f"{host.workdir}/groundtruth/{key}"
                    done = host.run(
                        ["rm", "-f", "--", f"{base}.jsonl", f"{base}.json"],
                        check=False,
                        timeout=EVICT_SECONDS,
                    )
                    evicted = done.ok
            except DflashError:  # the flag says it stayed; the next eval's user is told
                pass
        flagged = flag_suspect(gt_info, rate, evicted)
        self.emit(self.specs[0].name, {"event": "warning", "message": flagged["warnings"][-1]})
        return flagged

    # -- one shard -----------------------------------------------------------------------
    def _job_id(self, spec: HostSpec) -> str:
        self.attempts[spec.name] = self.attempts.get(spec.name, 0) + 1
        return f"{self.run_id}-{spec.name}-{self.attempts[spec.name]}"

    def start_early(self, spec: HostSpec) -> JobRef:
        """Start a shard's job before its samples are known, while the ground truth is
        still being made: its ground truth is a DEFERRED file (`remote.protocol.
        GT_DEFERRED_FILE`), so it imports, runs its checks and loads its target now and
        waits for its slice, which `run_shard` pushes into its folder."""
        host = self.hosts[spec.name]
        job = build_spec(host, spec, self.checkpoint, self.options, exact_file="(deferred)")
        job["ground_truth"] = {
            **{k: v for k, v in job["ground_truth"].items() if k != "path"},
            "deferred": EARLY_WAIT_SECONDS,
        }
        job["shard"] = {"run_id": self.run_id, "indices": None, "started_early": True}
        return remote_job.start_job(host, job, self._job_id(spec), preflight=True, follow=True)

    def run_shard(
        self,
        spec: HostSpec,
        indices: list[int],
        gt: list[dict],
        out: _Outcome,
        early: Future | None = None,
    ) -> _Outcome:
        """Push the slice, start the job, watch it, pull it. Never raises: a failure is
        recorded in `out` with the records received until then. `early`: the job
        `start_early` started on this host (its slice goes into its folder); one that
        failed to start, or ended without its slice, is replaced by a fresh start."""
        host = self.hosts[spec.name]
        try:
            data = _gt_lines(gt, indices)
            ref = None
            if early is not None:
                try:
                    ref = early.result()
                except Exception:  # a fresh start below says what is wrong, in one line
                    ref = None
            if ref is not None:
                host.put_bytes(data, f"{ref.dir}/{GT_DEFERRED_FILE}")
            else:
                ref = self._start_with(host, spec, indices, data)
            out.job_id = ref.job_id
            self.emit(
                spec.name,
                {
                    "event": "shard",
                    "job_id": ref.job_id,
                    "samples": len(indices),
                    "tokens": sum(
                        len(gt[i]["prompt_ids"]) + len(gt[i]["completion_ids"]) for i in indices
                    ),
                },
            )

            def on_event(ev: dict) -> None:
                done = ev.get("done")  # a count, checked by `watch`; a host's, so in range?
                if (
                    ev.get("event") == "sample"
                    and ev.get("record")
                    and done in range(1, len(indices) + 1)
                ):
                    i = indices[done - 1]
                    if ev["record"].get("id") == gt[i]["id"]:
                        out.records[i] = ev["record"]
                self.emit(spec.name, ev)

            end = remote_job.watch(host, ref.job_id, on_event, stream=ref.stream)
            if end["state"] != "done" and early is not None and not out.records:
                # The early job ended before it evaluated anything (its wait ran out, or it
                # failed on its own): once more, started the ordinary way.
                ref = self._start_with(host, spec, indices, data)
                out.job_id = ref.job_id
                end = remote_job.watch(host, ref.job_id, on_event, stream=ref.stream)
            if end["state"] != "done":
                err = (end.get("exit") or {}).get("error")
                raise JobError(f"job {ref.job_id} {end['state']}{': ' + err if err else ''}")
            run_dir = pull.pull_results(host, ref.job_id, self.stage / "shards", end)
            pulled = _read_jsonl((run_dir / "samples.jsonl").read_bytes())
            if [r.get("id") for r in pulled] != [gt[i]["id"] for i in indices]:
                raise JobError(f"job {ref.job_id} returned samples other than its shard's")
            out.records = dict(
                zip(indices, pulled, strict=False)
            )  # the host's own file is authoritative
            out.result = json.loads((run_dir / "result.json").read_text())
            out.run_dir = run_dir
        except Exception as exc:  # any failure of one host is that shard's, not the run's
            out.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if out.job_id:
                try:  # a watcher that lost its connection leaves the job running: stop it
                    remote_job.cancel(host, out.job_id)
                except Exception:
                    pass
            self.emit(
                spec.name,
                {
                    "event": "shard_failed",
                    "job_id": out.job_id,
                    "error": out.error,
                    "kept": len(out.records),
                    "unfinished": len(indices) - len(out.records),
                },
            )
        return out

    def _start_with(self, host: Host, spec: HostSpec, indices: list[int], data: bytes) -> JobRef:
        """Start a shard's job with its slice `data` as its ground truth file."""
        path = f"{host.workdir}/groundtruth/shards/{hashlib.sha256(data).hexdigest()[:16]}.jsonl"
        carry: list = []  # a small slice travels inside the job start: no round trip
        carry_or_push(host, data, path, carry)
        # a shard: the same options (so the same EvalSpec over this host's role) and
        # its slice of the ground truth, evaluated whole
        job = build_spec(host, spec, self.checkpoint, self.options, exact_file=path, carry=carry)
        job["shard"] = {"run_id": self.run_id, "indices": indices}
        return remote_job.start_job(host, job, self._job_id(spec), preflight=True, follow=True)

    def cancel_early(self, early: dict[str, Future]) -> None:
        """Stop the early jobs no shard took (a host the plan left idle, a failed run)."""
        for name, fut in early.items():
            try:
                ref = fut.result()
            except Exception:
                continue
            try:
                if ref.stream is not None:
                    ref.stream.kill()
                remote_job.cancel(self.hosts[name], ref.job_id)
            except Exception:  # best effort: it ends by itself when its wait runs out
                pass

    # -- the whole run -------------------------------------------------------------------
    def run(self) -> Path:
        t0 = time.time()
        names = [s.name for s in self.specs]
        by_name = {s.name: s for s in self.specs}
        early: dict[str, Future] = {}
        starter = ThreadPoolExecutor(max_workers=len(self.specs))
        with ThreadPoolExecutor(max_workers=len(self.specs)) as pool:
            for spec, host in zip(
                self.specs,
                pool.map(lambda s: open_host(s, self.inventory), self.specs),
                strict=False,
            ):
                self.hosts[spec.name] = host
            try:
                # No separate look for the bundles: each job start runs it where it is and
                # pushes it where it is not (`remote_job.start_job`), once per host.
                # Every host's shard job starts once the ground-truth job has passed its
                # checks (quick: it loads nothing), beside it: their start-up (imports,
                # checks, the target's load) overlaps that phase.
                gt_ref, gt_job = self.start_ground_truth()
                early = {s.name: starter.submit(self.start_early, s) for s in self.specs}
                gt, gt_info, gt_job = self.ground_truth(gt_ref, gt_job)
                sampling = gt_job.get("sampling") or {}
                max_new = int(sampling.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
                plan = plan_shards(gt, names, max_new)
                self.emit(
                    names[0],
                    {"event": "plan", "samples": len(gt), "shards": [s.to_json(gt) for s in plan]},
                )
                records: dict[int, dict] = {}
                outcomes: list[_Outcome] = []
                reassigned: list[dict] = []
                running: dict[Future, _Outcome] = {}
                idle: list[str] = []  # hosts that finished their work; failed ones never are
                entry_of: dict[int, dict] = {}  # sample index -> its reassignment entry

                def submit(host: str, indices: list[int]) -> None:
                    out = _Outcome(host, indices)
                    fut = pool.submit(
                        self.run_shard, by_name[host], indices, gt, out, early.pop(host, None)
                    )
                    running[fut] = out

                for shard in plan:
                    if shard.indices:
                        submit(shard.host, shard.indices)
                    else:
                        idle.append(shard.host)
                # hosts the plan left idle: their early jobs stop (in the background: a
                # start may still be under way)
                starter.submit(self.cancel_early, {h: early.pop(h) for h in idle if h in early})
                pending: list[int] = []
                while running:
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    for fut in done:
                        out = running.pop(fut)
                        outcomes.append(out)
                        records.update(out.records)
                        if out.ok:
                            idle.append(out.host)
                            continue
                        lost = [i for i in out.indices if i not in out.records]
                        entry = {
                            "host": out.host,
                            "job_id": out.job_id,
                            "reason": out.error,
                            "kept": [gt[i]["id"] for i in out.indices if i in out.records],
                            "samples": [gt[i]["id"] for i in lost],
                            "to": {},
                        }
                        reassigned.append(entry)
                        entry_of.update((i, entry) for i in lost)
                        pending.extend(lost)
                    if pending and idle:
                        # Re-plan what failed hosts left across every host free right now.
                        for shard in plan_shards(gt, idle, max_new, pending):
                            if not shard.indices:
                                continue
                            idle.remove(shard.host)
                            for i in shard.indices:
                                entry_of[i]["to"].setdefault(shard.host, []).append(gt[i]["id"])
                            submit(shard.host, shard.indices)
                        pending = []
                    if pending and not running:
                        raise JobError(
                            f"every host failed; {len(pending)} of {len(gt)} "
                            f"samples unevaluated (last error: "
                            f"{reassigned[-1]['reason']})"
                        )
            finally:
                self.cancel_early(early)
                starter.shutdown(wait=False)
                for host in self.hosts.values():
                    host.close()

        ordered = [records[i] for i in range(len(gt))]
        shards = {
            "hosts": names,
            "balance_by": "expected tokens: prompt + completion (ground truth known)",
            "plan": [s.to_json(gt) for s in plan],
            "jobs": [
                {
                    "host": o.host,
                    "job_id": o.job_id,
                    "state": "done" if o.ok else "failed",
                    "error": o.error,
                    "samples": len(o.indices),
                    "records_received": len(o.records),
                    "environment": (o.result or {}).get("environment"),
                    "run_dir": str(o.run_dir.relative_to(self.stage)) if o.run_dir else None,
                }
                for o in outcomes
            ],
            "reassigned": reassigned,
            "ground_truth": {
                "obtained_on": names[0],
                "job_id": gt_info.get("job_id"),
                "sha256": gt_info.get("sha256"),
                "samples": len(gt),
                "shared_as": "fetched once on the first host; each shard evaluates its slice "
                "of that file (kind 'file'), so all shards share one ground truth",
            },
        }
        result = merge_result(
            [o.result for o in outcomes if o.ok and o.result],
            ordered,
            ground_truth_source=gt_info,
            shards=shards,
            job={"job_id": self.run_id, "hosts": names, "created": t0},
            wall_s=time.time() - t0,
        )
        gt_info = self.judge_ground_truth(gt_info, result["metrics"].get("target_agreement"))
        result["inputs"]["ground_truth_source"] = gt_info
        result["inputs"]["checkpoint"] = gt_job.get("checkpoint")
        result["inputs"]["prompts"] = gt_job.get("prompts")
        (self.stage / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ordered))
        (self.stage / "result.json").write_text(json.dumps(result, indent=2))
        (self.stage / "spec.json").write_text(
            json.dumps(
                {
                    **{k: v for k, v in gt_job.items() if k != "stop_after"},
                    "hosts": names,
                    "job_id": self.run_id,
                },
                indent=2,
            )
        )
        (self.stage / "ground_truth.json").write_text(json.dumps(gt_info, indent=2))
        return self.stage


def run_sharded(
    inventory: Inventory,
    host_names: list[str],
    checkpoint: str,
    options: EvalOptions | None = None,
    *,
    on_event: HostEventHandler | None = None,
    dest: str | os.PathLike | None = None,
    run_id: str | None = None,
) -> Path:
    """Evaluate `checkpoint` across the hosts (names or inventory groups) and merge into one
    local run folder ``<results_dir>/<run-id>`` (the shards' pulled folders under
    ``shards/``). Returns that folder. See the module docstring for the procedure."""
    options = options or EvalOptions()
    specs = inventory.expand(host_names)
    if not specs:
        raise DflashError("--hosts names no host")
    # matplotlib is imported while the shards run, as a single-host eval does, not after
    # the merge on the way to the plots.
    pull.warm_plots()
    # it names a folder here and starts the shard jobs' ids: checked as a job id is
    run_id = jobwire.local_job_id(run_id or new_job_id(checkpoint))
    root = results_dir(inventory, dest)
    final = root / run_id
    stage = root / f".{run_id}.partial-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        _Sharded(inventory, specs, checkpoint, options, on_event, stage, run_id).run()
        if final.exists():
            shutil.rmtree(final)
        os.replace(stage, final)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return pull.finish_local(final)
