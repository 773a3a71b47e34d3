"""How `dflash online` looks to people (offline beside online, levels, the diagnosis) and
its ``--json`` form."""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands.output.base import console, fmt, pct, plain, show
from orchestrator.commands.output.progress import LiveProgress
from orchestrator.commands.output.speedup import ms, speedup_x
from orchestrator.commands.output.tables import Col, Grid, kv
from orchestrator.commands.output.ticker import Pace
from orchestrator.results import online_view, summary
from orchestrator.results import store as res
from remote.protocol import metrics as registry


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


def _engine(s: dict) -> str:
    said = " ".join(x for x in (s["engine"], s["engine_version"]) if x)
    return said + (f" on {s['platform']}" if s["platform"] else "")


def render_verdict(v: dict, run: res.Run | None = None) -> None:
    """Offline beside online, lossless, the levels, every cause found; with the eval `run`,
    the engine's own times beside the eval host's estimate."""
    s = online_view.summary(v)
    rows = [("verdict", s["verdict"]), ("engine", _engine(s))]
    if s["threads"] is not None:
        rows.append(("engine threads (OMP_NUM_THREADS)", f"{s['threads']}: {s['threads_from']}"))
    if s["max_model_len"] is not None:
        rows.append(("engine max_model_len", f"{s['max_model_len']}: the longest sample's, drafts"))
    rows += [
        (f"{label}: offline / online", f"{off} / {on}")
        for label, off, on in online_view.tau_rows(v)
    ]
    rows += [
        ("tau online, the engine's own (uncut)", fmt(s["online_uncut_tau"])),
        ("rounds equal", f"{fmt(s['rounds_equal'])} of {s['samples']}"),
        ("lossless", f"{s['lossless']} of {s['samples']}"),
        (
            "block size / num_speculative_tokens",
            f"{s['block_size']} / {fmt(s['num_speculative_tokens'])}",
        ),
        ("server start (s)", fmt(s["server_start_s"])),
        ("measurement (s)", fmt(s["measure_s"])),
    ]
    if s["baseline_start_s"] is not None:
        rows.append(("baseline server start (s)", fmt(s["baseline_start_s"])))
    d, sampling = v.get("distribution"), v.get("sampling") or {}
    if d:  # above temperature 0: the engine's tau against the expectation's interval
        lo, hi = d["tau_interval"]
        rows.append(
            (
                f"T {sampling.get('temperature')}, {sampling.get('draft_policy')} drafts: "
                f"tau expected [{1 - d['level']:.0%} interval] / engine, p",
                f"{fmt(d['expected_tau'])} [{fmt(lo)}, {fmt(hi)}] / "
                f"{fmt(d['observed_tau'])}, p = {d['p_value']:.3g}",
            )
        )
    where = "started here" if s["started_here"] else "already running"
    show(kv(f"online vs offline ({s['engine']} {where}, {s['samples']} samples)", rows))
    levels = online_view.level_rows(v)
    if len(levels) > 1 or (levels and levels[0]["speedup"] is not None):
        show(_levels_table(levels, s["samples"]))
    if run is not None:
        show(_speed_table(online_view.speed(v, run)))
    positions = online_view.position_rows(v)
    if positions:
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
        for pos, off, on in positions:
            t.row(
                str(pos),
                pct(off.get("rate")),
                pct(on.get("rate")) if on else "-",
                f"{off.get('attempts')}/{on.get('attempts') if on else '-'}",
            )
        show(t)
    by = v.get("by_context") or []
    if len(by) > 1:  # one bucket says no more than the summary above
        t = Grid(
            "tau by context, offline | online (rounds placed by where they start)",
            [
                Col("context", "num", justify="right"),
                Col("offline", "num", justify="right"),
                Col("online", "num", justify="right"),
                Col("rounds off/on", "num", justify="right", drop=1),
                Col("walks part here", "num", justify="right"),
            ],
            compact=False,
        )
        for r in by:
            t.row(
                str(r["context"]),
                fmt(r["offline_tau"]),
                fmt(r["online_tau"]),
                f"{r['offline_rounds']}/{r['online_rounds']}",
                str(r["diverged"]),
            )
        show(t)
    for d in v["diagnosis"]:
        console.print(plain(f"{d['cause']}: {d['detail']}"), soft_wrap=True)


def _levels_table(levels: list[dict], samples: int) -> Grid:
    """Acceptance and tokens per second at each concurrency level (and the baseline's)."""
    taus = [registry.find(name) for name in online_view.TAUS]
    t = Grid(
        "by concurrency: the same prompts, requests in flight",
        [
            Col("concurrency", "num", justify="right"),
            *[Col(m.header, "num", justify="right") for m in taus],
            Col("rounds as first", "num", justify="right", drop=2),
            Col("lossless", "num", justify="right", drop=3),
            Col("tokens/s", "num", justify="right"),
            Col("baseline tokens/s", "num", justify="right", drop=1),
            Col("speedup", "num", justify="right"),
        ],
        compact=False,
    )
    for lv in levels:
        same = lv["same_rounds_as_first"]
        t.row(
            str(lv["concurrency"]),
            *[m.text(lv[m.name]) for m in taus],
            "-" if same is None else f"{same}/{samples}",
            f"{lv['lossless']}/{samples}",
            fmt(lv["tokens_per_s"], 1),
            fmt(lv["baseline_tokens_per_s"], 1),
            speedup_x(lv["speedup"]),
        )
    return t


class OnlineProgress(LiveProgress):
    """An eval's bars, a line per serving-engine phase and a bar per concurrency level."""

    PHASES = {
        "serve": "starting the serving engine",
        "serve_wait": "waiting for the serving engine to answer",
        "online": "sending the prompts to the serving engine",
        "baseline_serve": "starting the baseline server (the target without the drafter)",
        "baseline_wait": "waiting for the baseline server to answer",
        "baseline": "sending the prompts to the baseline server",
        "deviation": "simulating a known engine deviation offline",
        "expectation": "the offline expectation along the engine's completions",
    }

    online_tasks: dict | None = None
    paces: dict | None = None  # (phase, concurrency) -> its `Pace`
    current: tuple | None = None

    def __call__(self, ev: dict) -> None:
        super().__call__(ev)
        if ev.get("event") == "phase" and ev.get("phase") in self.PHASES:
            said = [
                f"OMP threads {ev['threads']}: {ev.get('threads_from')}"
                if ev.get("threads")
                else None,
                f"concurrency {ev['concurrency']}" if ev.get("concurrency") else None,
                f"{ev['name']} on {ev.get('samples')} samples" if ev.get("name") else None,
            ]
            extra = "; ".join(x for x in said if x)
            line = self.PHASES[ev["phase"]] + (f" ({extra})" if extra else "")
            self.doing = line
            self.progress.console.print(plain(line), soft_wrap=True)
        elif ev.get("event") == "online_sample":
            self.online_tasks = self.online_tasks or {}
            self.paces = self.paces or {}
            key = (ev.get("phase") or "online", ev.get("concurrency") or 1)
            if key not in self.online_tasks:
                name = f"{key[0]} x{key[1]}"
                self.online_tasks[key] = self.progress.add_task(
                    name, total=ev.get("total"), info=""
                )
                self.paces[key] = Pace()
            pace, self.current = self.paces[key], key
            pace.update(ev.get("time"), ev.get("done") or 0, ev.get("total"))
            self.progress.update(
                self.online_tasks[key], completed=ev.get("done", 0), info=pace.eta()
            )

    def tick_line(self) -> str | None:
        """The level being measured, else the engine's phase, else the eval's (`Ticker`)."""
        if self.current is not None and self.paces:
            pace = self.paces[self.current]
            line = f"{self.current[0]} x{self.current[1]}: {pace.count('prompts answered')}"
            return ", ".join(x for x in (line, pace.eta()) if x)
        if self.last.get("event") == "phase" and self.last.get("phase") in self.PHASES:
            return f"online: {self.doing}"
        return super().tick_line()


def _speed_table(sp: dict) -> object:
    """The engine's decode times (and baseline speedup) beside the eval host's estimate."""
    e, off = sp["engine"] or {}, sp["offline"]
    plain_costs = sp.get("engine_plain") or {}
    est = off["speedup_estimate"]
    rows = [
        (
            f"engine: decode time per output token (ms; {e.get('source') or 'not read'})",
            ms(e.get("time_per_output_token_s")),
        ),
        ("engine: decode time per verify step (ms)", ms(e.get("time_per_verify_step_s"))),
        ("engine: tokens per verify step", fmt(e.get("tokens_per_verify_step"))),
    ]
    if sp.get("engine_plain") is not None or sp.get("engine_plain_tokens_per_s") is not None:
        rows += [
            (
                "engine without the drafter: decode time per output token (ms; its t_step)",
                ms(plain_costs.get("time_per_output_token_s")),
            ),
            (
                "engine: tokens/s with / without the drafter (first level)",
                f"{fmt(sp['engine_tokens_per_s'], 1)} / {fmt(sp['engine_plain_tokens_per_s'], 1)}",
            ),
            ("speedup measured, the engine's tokens/s", speedup_x(sp["engine_speedup_measured"])),
        ]
    rows += [
        (
            "eval host: time per output token, estimated (ms; (t_verify + t_draft) / tau)",
            ms(off["time_per_output_token_s"]),
        ),
        ("eval host: plain decode step t_step (ms)", ms(off["target_step_s"])),
        (f"speedup estimate, eval host's costs ({off['formula']})", speedup_x(est)),
        (
            "speedup estimate, engine's costs (its t_step / its time per token)",
            speedup_x(sp["engine_speedup_estimate"])
            if sp["engine_speedup_note"] is None
            else sp["engine_speedup_note"],
        ),
    ]
    return kv("speed: the serving engine's own times beside the eval host's estimate", rows)
