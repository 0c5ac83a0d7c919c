"""The node agent sweeps what hooks left of jobs Slurm no longer runs on the node, asking
real Slurm: a job dir for a job Slurm never had (which held a restart) and a job whose
epilog could not clean up are cleaned, a running job's (one in its prolog too) never, and
nothing while slurmctld is down."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemons import stop_pid

from bootseer.agent.handover import ask_restart
from bootseer.agentapi.client import AgentClient
from bootseer.agentapi.errors import AgentError
from bootseer.agentapi.jobs import AgentRestart, Ping, Stats
from bootseer.config import load_config
from bootseer.nodepaths import NodePaths
from tests.conftest import DevSlurm, squash
from tests.waiting import wait_until

pytestmark = pytest.mark.slurm

NODE = "n4"


class Agent:
    """NODE's agent of the session cluster, as the test watches it."""

    def __init__(self, cluster: DevSlurm) -> None:
        self.paths = NodePaths(load_config(cluster.site_config).for_node(NODE))
        self.client = AgentClient(self.paths.agent_socket)
        self.log = self.paths.agent_log(NODE)

    def job_dir(self, job: int) -> Path:
        return self.paths.job_dir(job)

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def started(self) -> float | None:
        try:
            return self.client.ask(Ping(), timeout=30).started
        except AgentError:
            return None  # restarting

    def restart(self) -> None:
        """Run again in place, reading the site config afresh (what install does)."""
        before = self.started()
        out = ask_restart(self.client, force=True, wait=120)
        if out.state == "pending" and not out.jobs:
            # A root request (a hook's, another test's job's) still open past the drain:
            # the pending restart follows once it ends (seen once in a full run).
            wait_until(lambda: self.started() not in (None, before), "the pending restart", 120)
            return
        assert out.state == "restarted", out


@pytest.fixture
def agent(cluster: DevSlurm) -> Iterator[Agent]:
    """NODE's agent, sweeping every second (the site's interval is minutes)."""
    a = Agent(cluster)
    cluster.configure("hooks", sweep_interval=1)
    a.restart()
    try:
        yield a
    finally:
        cluster.reset()
        ctld = cluster.cluster
        if not ctld.alive("slurmctld"):
            ctld.start_slurmctld()
        a.restart()


def new_lines(agent: Agent, since: int, text: str) -> list[str]:
    return [line for line in agent.lines()[since:] if text in line]


def test_slurm_down_keeps_all_then_a_job_dir_slurm_never_had_goes_and_the_restart_follows(
    cluster: DevSlurm, agent: Agent
) -> None:
    ctld = cluster.cluster
    pid = ctld.alive("slurmctld")
    assert pid
    stop_pid(pid, "slurmctld")
    planted = agent.job_dir(987654)
    (planted / "deps").mkdir(parents=True, mode=0o711)
    (planted / "deps" / "prolog.json").write_text("{}")
    try:
        before = agent.client.ask(Ping())
        mark = len(agent.lines())
        reply = agent.client.ask(AgentRestart(True))
        assert (reply.state, reply.jobs) == ("pending", [987654])
        # Slurm cannot be asked: the dir is kept, and so is the agent as it is.
        said = wait_until(
            lambda: new_lines(agent, mark, "sweep: cannot ask Slurm"), "a sweep that asked", 120
        )
        assert "987654" in said[0] and "kept" in said[0]
        assert planted.is_dir()
        assert agent.client.ask(Ping()).started == before.started
    finally:
        ctld.start_slurmctld()

    def restarted() -> bool:
        try:
            return agent.client.ask(Ping(), timeout=5).started != before.started
        except Exception:
            return False

    try:
        wait_until(restarted, "the pending restart, once the job dir was swept", 120)
    finally:
        shutil.rmtree(planted, ignore_errors=True)  # on failure: the fixture's restart
    swept = new_lines(agent, mark, "sweep: job=987654")
    assert len(swept) == 1, swept
    assert f"Slurm does not run it on {NODE}" in swept[0] and "job dir removed" in swept[0]


def test_a_job_in_its_prolog_and_a_running_job_are_kept_an_uncleaned_one_swept(
    cluster: DevSlurm, agent: Agent
) -> None:
    src = cluster.dir / "sweep-image-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    (src / "data").write_bytes(b"x" * 100_000)
    (cluster.dir / "images").mkdir(exist_ok=True)
    image = squash(src, cluster.dir / "images" / "sweep.sqsh")
    flag = cluster.dir / "out" / f"sweep-go-{time.time_ns()}"
    # Job A runs (its image prepared, its checkpoint mounted) until the test lets it end.
    a = cluster.sbatch(
        "-N1",
        "-w",
        NODE,
        f"--bootseer-image={image}",
        "--bootseer-ckpt=sweep",
        script=f"#!/bin/sh\nuntil [ -e {flag} ]; do sleep 0.2; done\n",
    )
    wait_until(lambda: (agent.job_dir(a) / "env").exists(), "job A's prolog done", 120)
    assert a in agent.client.ask(Stats()).jobs  # its prepared image
    ckpt = agent.paths.ckpt_mounts / str(a)
    assert os.path.ismount(ckpt)
    # Job B hangs in its prolog (its ckpt step), as a slow mount would.
    cluster.configure("hooks", failpoints=["ckpt:hang"], step_deadlines={"ckpt": 30})
    b = cluster.sbatch("-N1", "-w", NODE, "--bootseer-ckpt=sweep", script="#!/bin/sh\ntrue\n")
    wait_until(lambda: agent.job_dir(b).is_dir(), "job B in its prolog", 60)
    mark = len(agent.lines())

    def both_kept() -> list[str]:
        return [
            line
            for line in new_lines(agent, mark, "sweep: Slurm runs jobs")
            if str(a) in line and str(b) in line
        ]

    wait_until(both_kept, "a sweep that found both jobs running", 60)
    assert not (agent.job_dir(b) / "env").exists()  # B was still in its prolog
    assert cluster.job_state(b) in ("CONFIGURING", "RUNNING"), cluster.job_state(b)
    assert agent.job_dir(a).is_dir() and agent.job_dir(b).is_dir()
    assert not new_lines(agent, mark, "sweep: job=")

    # A's epilog cannot clean up (the site config is broken meanwhile: it starts the
    # job the ordinary way and leaves everything), so A's state stays behind.
    good = cluster.site_config.read_text()
    cluster.site_config.write_text("not toml [\n")
    try:
        flag.write_text("")
        assert cluster.wait(a, 120) == "COMPLETED"  # its epilog done too
    finally:
        cluster.site_config.write_text(good)
    swept = wait_until(lambda: new_lines(agent, mark, f"sweep: job={a} "), "A swept", 60)
    assert "prepared image" in swept[0] and "image released" in swept[0], swept
    assert "job dir removed" in swept[0] and "phase spool removed" in swept[0]
    assert f"checkpoint mount {ckpt} stopped" in swept[0]
    assert not ckpt.exists()
    prom = load_config(cluster.site_config).for_node(NODE).metrics.textfile_dir
    assert prom is not None

    def swept_metric() -> bool:
        text = (prom / "bootseer_agent.prom").read_text()
        return any(
            line.startswith("bootseer_agent_swept_jobs_total ") and float(line.split()[1]) >= 1
            for line in text.splitlines()
        )

    wait_until(swept_metric, "bootseer_agent_swept_jobs_total counted it", 60)
    assert not agent.job_dir(a).exists()
    assert a not in agent.client.ask(Stats()).jobs
    assert not (agent.paths.image_mounts / f"{a}.sqsh").exists()
    assert cluster.wait(b, 240) == "COMPLETED"
    assert not new_lines(agent, mark, f"sweep: job={b} ")  # its own epilog cleaned up


def test_doctor_names_the_job_dirs_of_jobs_slurm_does_not_run_on_the_node(
    cluster: DevSlurm, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real Slurm, a run dir of the test's own (no agent sweeps it meanwhile)."""
    import dataclasses

    from bootseer.doctor import Node
    from bootseer.doctor.agent import check_stale_jobs

    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    cfg = load_config(cluster.site_config).for_node(NODE)
    cfg = dataclasses.replace(cfg, paths=dataclasses.replace(cfg.paths, run_dir=base / "run"))
    node = Node(NODE, Path(cluster.env["SLURM_CONF"]), cluster.site_config, cfg)
    assert check_stale_jobs(node).status == "ok"  # nothing there: Slurm not asked

    flag = cluster.dir / "out" / f"sweep-doctor-{time.time_ns()}"
    running = cluster.sbatch(
        "-N1", "-w", NODE, script=f"#!/bin/sh\nuntil [ -e {flag} ]; do sleep 0.2; done\n"
    )
    try:
        wait_until(lambda: cluster.job_state(running) == "RUNNING", "the job running", 120)
        for job in (running, 987655):
            (base / "run" / "jobs" / str(job)).mkdir(parents=True)
        check = check_stale_jobs(node)
        assert check.status == "problem", check
        # Job ids as words: a fresh cluster's job 5 is inside 987655.
        assert "987655 (job dir)" in check.detail
        assert not re.search(rf"\b{running} \(", check.detail), check.detail
        assert "sweep" in check.fix
    finally:
        flag.write_text("")
    assert cluster.wait(running, 120) == "COMPLETED"
    ended = check_stale_jobs(node).detail
    assert re.search(rf"\b{running} \(job dir\)", ended), ended  # ended: stale now
