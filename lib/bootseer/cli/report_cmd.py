"""``bootseer report``: where startup time goes, for one job or the whole cluster.

    bootseer report 4242              one job: phases, straggler, timeline, runs
    bootseer report 4242_3            task 3 of array job 4242
    bootseer report 4242 --json       the same for scripts
    bootseer report 4242 --plot t.png the per-node timeline as a picture
    bootseer report --since 7d        the cluster view (also 12h, 2026-11-01)
    bootseer report --since 30d --plot sizes.svg

The records come from the store in the site config (--store reads another).
Exit status 1 when there are no records for the job; Slurm is then asked
whether it knows the job at all.

Root's report counts only the files bootseer's root-run parts sealed with the
site key; a user's, which has no key, shows files without a seal as such and
checks a job's latest run against the nodes and user Slurm lists for it. Both
say what they left out, and what they could not check.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

from bootseer.cli import plain_doc
from bootseer.errors import BootseerError

TYPE_CHECKING = False  # typing costs a mark from a job script milliseconds
if TYPE_CHECKING:
    from typing import Any

    from bootseer.config import SiteConfig
    from bootseer.store import Store


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="startup report of a job, or of the cluster (--since)",
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job", nargs="?", type=parse_job, metavar="JOBID")
    p.add_argument(
        "--since",
        metavar="AGE|DATE",
        help="cluster view over runs allocated since then: 7d, 12h, 2026-11-01",
    )
    p.add_argument("--run", type=int, metavar="N", help="only this restart of the job")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="FILE", help="also draw FILE (.png, .svg, .pdf)")
    p.add_argument("--store", metavar="URI", help="read this store instead of the site config's")
    p.set_defaults(handler=run, exit_at_once=True)  # read-only (bootseer.cli.program)


_JOB = re.compile(r"^(\d{1,12})(?:_(\d{1,9}))?$")


def parse_job(text: str) -> tuple[int, int | None]:
    """``4242`` -> (4242, None); an array task ``4242_3`` -> (4242, 3)."""
    m = _JOB.match(text)
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a job id: want JOBID or ARRAYID_TASK (4242, 4242_3)"
        )
    return int(m.group(1)), None if m.group(2) is None else int(m.group(2))


def job_label(job: tuple[int, int | None]) -> str:
    return f"{job[0]}" if job[1] is None else f"{job[0]}_{job[1]}"


def squeue_job(job: str, timeout: float = 10) -> dict[str, object] | None:
    """What ``squeue --json`` says of ``job`` (``4242`` or ``4242_3``), if Slurm still
    knows it."""
    import json
    import subprocess

    try:
        r = subprocess.run(
            ["squeue", "--json", "--states=all", f"--jobs={job}"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        jobs = json.loads(r.stdout).get("jobs") or [] if r.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError, AttributeError):
        return None
    # squeue --json (22.05) lists every job whatever --jobs says: pick ours.
    return next((j for j in jobs if isinstance(j, dict) and _is(j, job)), None)


def slurm_knows(job: str, timeout: float = 10) -> str | None:
    """The job's state if Slurm still knows it (squeue; sacct where there is accounting),
    else None."""
    import subprocess

    j = squeue_job(job, timeout)
    if j is not None:
        state = j.get("job_state", "known")
        return str(state[0] if isinstance(state, list) and state else state)
    try:
        r = subprocess.run(
            ["sacct", "--noheader", "--parsable2", "-X", "--format=State", f"--jobs={job}"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.split()[0] if r.returncode == 0 and r.stdout.strip() else None


def array_task_job(ds: Any, array_job: int, task: int) -> int | None:
    """The job id of array task ``array_job``_``task``: Slurm's answer while it knows the
    job (cheap), else the records' (a scan of the array columns)."""
    j = squeue_job(f"{array_job}_{task}")
    found = None if j is None else _number(j.get("job_id"))
    return found if isinstance(found, int) else ds.array_task(array_job, task)


def _number(v: object) -> object:
    return v.get("number") if isinstance(v, dict) else v


def _is(j: dict[str, object], job: str) -> bool:
    ident, _, task = job.partition("_")
    if task:
        return _number(j.get("array_job_id")) == int(ident) and _number(
            j.get("array_task_id")
        ) == int(task)
    return _number(j.get("job_id")) == int(ident)


def parse_age(text: str) -> float:
    """``7d`` -> seconds (:func:`bootseer.units.parse_age`, as every command reads ages)."""
    from bootseer import units

    try:
        return units.parse_age(text)
    except units.UnitError as exc:
        raise BootseerError(str(exc)) from None


def parse_since(text: str, now: float) -> float:
    if re.match(r"^\d{4}-\d\d-\d\d$", text):
        return time.mktime(time.strptime(text, "%Y-%m-%d"))
    return now - parse_age(text)


def open_report_store(uri: str | None) -> Store:
    from bootseer.config import load_config
    from bootseer.store import open_store

    if uri:
        return open_store(uri)
    cfg = load_config()
    return cfg.store.open()


def open_dataset(uri: str | None) -> tuple[Any, SiteConfig]:
    """The phase dataset a report reads, its seals checked (:mod:`bootseer.phases.seal`):
    by root with the site key; a user, who has none (or root where the key file is
    missing), tells files without a seal only, and the report says so."""
    from bootseer.config import load_config
    from bootseer.phases.reader import PhaseDataset
    from bootseer.sitekey import site_keys
    from bootseer.store import open_store

    cfg = load_config()
    keys = site_keys(cfg) if os.geteuid() == 0 else None
    why = "this report ran as a user, who has no site key (root's report checks them)"
    if keys is not None and not keys.keys:  # root where the key is not: say so, go on
        why = f"no site key here: {keys.missing}"
        keys = None
    store = open_store(uri) if uri else cfg.store.open()
    return PhaseDataset(store, keys=keys, check_seals=True, unchecked_why=why), cfg


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    if args.job is not None and args.since:
        raise BootseerError("give a JOBID or --since, not both")
    if args.plot:
        args.plot = Path(args.plot)
    ds, args.cfg = open_dataset(args.store)
    console = Console(highlight=False)
    if args.job is None:
        return _cluster(ds, parse_since(args.since or "7d", time.time()), args, console)
    return _job(ds, args.job, args, console)


def _job(ds: Any, job: tuple[int, int | None], args: argparse.Namespace, console: Any) -> int:
    from bootseer.phases.render import render_job
    from bootseer.phases.report import JobReport, job_report

    label = job_label(job)
    job_id = job[0] if job[1] is None else array_task_job(ds, job[0], job[1])
    report = JobReport(job[0], []) if job_id is None else job_report(ds, job_id)
    if ds.keys is None:  # no key to check the seals: check what Slurm says of the job
        from bootseer.phases.report import check_against_slurm

        phases = args.cfg.phases
        report.slurm = check_against_slurm(report, phases.squeue, max(phases.squeue_timeout, 10.0))
    if args.run is not None:
        report.runs = [r for r in report.runs if r.restart_count == args.run]
    if args.json:
        import json

        print(json.dumps(report.to_json(), indent=1))
    if not report.runs:
        what = f"job {label}" + (f" run {args.run}" if args.run is not None else "")
        state = slurm_knows(label)
        known = (
            f"Slurm knows job {label} ({state}), but it has no records: it ran without "
            "--bootseer, its prolog has not run yet, or its nodes could not write to the "
            "store (an unmounted shared filesystem: their hook logs say why; bootseer "
            "doctor NODESET)."
            if state
            else f"Slurm does not know job {label} (never submitted, or gone from its "
            "memory and accounting)."
        )
        print(f"No phase records for {what} in {ds.store.uri}. {known}", file=sys.stderr)
        return 1
    if not args.json:
        render_job(report, console)
    if args.plot:
        from bootseer.phases.plot import plot_timeline
        from bootseer.phases.render import colors

        plot_timeline(report.runs[-4:], args.plot, colors(report.runs))
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _cluster(ds: Any, since: float, args: argparse.Namespace, console: Any) -> int:
    from bootseer.phases.cluster import cluster_report
    from bootseer.phases.render import render_cluster

    view = cluster_report(ds, since)
    if args.json:
        import json

        print(json.dumps(view.to_json(), indent=1))
    else:
        render_cluster(view, console)
    if args.plot:
        from bootseer.phases.plot import plot_cluster

        plot_cluster(view, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
