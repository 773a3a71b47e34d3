"""How `dflash online` looks to people: offline beside online (tau both ways, per
position), lossless, the diagnosis; and its ``--json`` form."""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands.output.base import console, fmt, pct, plain, show
from orchestrator.commands.output.progress import LiveProgress
from orchestrator.commands.output.speedup import ms
from orchestrator.commands.output.tables import Col, Grid, kv
from orchestrator.results import online_view, summary
from orchestrator.results import store as res


def online_json(run_dir: Path) -> dict:
    """`online --json`: the run folder, the eval's summary, the verdict's and the verdict."""
    v = online_view.load_verdict(run_dir)
    return {
        "run_dir": str(run_dir),
        "run_id": run_dir.name,
        "summary": summary.summary(res.load_run(run_dir)),
        "online": online_view.summary(v) if v else None,
        "speed": online_view.speed(v, res.load_run(run_dir)) if v else None,
        "verdict": v,
    }


def render_online_run(run_dir: Path) -> None:
    """The verdict of the run in `run_dir`, then where it lies."""
    v = online_view.load_verdict(run_dir)
    if v is not None:
        render_verdict(v, res.load_run(run_dir))
    console.print(plain(f"results: {run_dir}"), soft_wrap=True)


def render_verdict(v: dict, run: res.Run | None = None) -> None:
    """Offline beside online: tau, rounds, per position; lossless; every cause found; and,
    with the eval `run`, the engine's own times beside the eval host's estimate."""
    s = online_view.summary(v)
    where = "started here" if s["started_here"] else "already running"
    show(
        kv(
            f"online vs offline ({s['engine']} {where}, {s['samples']} samples)",
            [
                ("verdict", s["verdict"]),
                ("tau offline (tokens)", fmt(s["offline_tau"])),
                ("tau online (cut the same way)", fmt(s["online_tau"])),
                ("tau online (engine's own, uncut)", fmt(s["online_uncut_tau"])),
                ("rounds equal", f"{fmt(s['rounds_equal'])} of {s['samples']}"),
                ("lossless", f"{s['lossless']} of {s['samples']}"),
                (
                    "block size / num_speculative_tokens",
                    f"{s['block_size']} / {fmt(s['num_speculative_tokens'])}",
                ),
                ("server start (s)", fmt(s["server_start_s"])),
                ("measurement (s)", fmt(s["measure_s"])),
            ],
        )
    )
    if run is not None:
        show(_speed_table(online_view.speed(v, run)))
    rows = online_view.position_rows(v)
    if rows:
        t = Grid(
            "per-position acceptance, offline | online",
            [
                Col("position", "num", justify="right"),
                Col("offline", "num", justify="right"),
                Col("online", "num", justify="right"),
                Col("attempts off/on", "num", justify="right", drop=1),
            ],
            compact=False,
        )
        for pos, off, on in rows:
            t.row(
                str(pos),
                pct(off.get("rate")),
                pct(on.get("rate")) if on else "-",
                f"{off.get('attempts')}/{on.get('attempts') if on else '-'}",
            )
        show(t)
    for d in v["diagnosis"]:
        console.print(plain(f"{d['cause']}: {d['detail']}"), soft_wrap=True)


class OnlineProgress(LiveProgress):
    """An eval's bars, a line for each phase of the serving engine, and a bar of the
    prompts it answered."""

    PHASES = {
        "serve": "starting the serving engine",
        "serve_wait": "waiting for the serving engine to answer",
        "online": "sending the prompts to the serving engine",
    }

    online_task = None

    def __call__(self, ev: dict) -> None:
        super().__call__(ev)
        if ev.get("event") == "phase" and ev.get("phase") in self.PHASES:
            self.progress.console.print(plain(self.PHASES[ev["phase"]]), soft_wrap=True)
        elif ev.get("event") == "online_sample":
            if self.online_task is None:
                self.online_task = self.progress.add_task("online", total=ev.get("total"), info="")
            self.progress.update(self.online_task, completed=ev.get("done", 0))


def _speed_table(sp: dict) -> object:
    """The engine's decode times beside the eval host's round costs and estimate."""
    e, off = sp["engine"] or {}, sp["offline"]
    est = off["speedup_estimate"]
    return kv(
        "speed: the serving engine's own times beside the eval host's estimate",
        [
            (
                f"engine: decode time per output token (ms; {e.get('source') or 'not read'})",
                ms(e.get("time_per_output_token_s")),
            ),
            ("engine: decode time per verify step (ms)", ms(e.get("time_per_verify_step_s"))),
            ("engine: tokens per verify step", fmt(e.get("tokens_per_verify_step"))),
            (
                "eval host: time per output token, estimated (ms; (t_verify + t_draft) / tau)",
                ms(off["time_per_output_token_s"]),
            ),
            ("eval host: plain decode step t_step (ms)", ms(off["target_step_s"])),
            (
                f"speedup estimate, eval host's costs ({off['formula']})",
                "-" if est is None else f"{est:.2f}x",
            ),
            ("speedup estimate, engine's costs", sp["engine_speedup_note"]),
        ],
    )
