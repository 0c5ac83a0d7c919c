"""Issue 22's "done when": one package on every host role of a fresh Debian, from install
to uninstall, and a plain ``sbatch`` that never breaks on the way.

A minimal bookworm root (``mmdebstrap``: Debian's Slurm 22.05, munge, and what the
package depends on, from Debian's mirror) is built once and laid under two hosts as
overlays: a compute node (slurmctld, slurmd, the agent) and a submit/login host (sbatch
and the bootseer command alone), sharing the store as ``/shared`` would. Both run in
namespaces of the test's own (pid, mount, network, uts, ipc): nothing of this machine's
Slurm, ``/opt`` or network is seen, and all of it ends with the test. Each step is the
admin's command on each role: ``apt-get install ./bootseer_<version>_amd64.deb``; a
package of a higher version (the upgrade); the first again (the rollback, as
``bootseer install --deb`` does it); ``apt-get remove bootseer`` (the uninstall, once
slurm.conf no longer names the hooks). After each, alice submits from the submit host a
``--bootseer`` job and reads its report there, and a plain ``sbatch`` runs from every
role. No systemd runs here: the test starts the agent as the unit would, and stops it
where the package's ``prerm`` would.

What it costs (CI: a fresh bookworm, nothing cached): the root (~45 s), the package
(once per session), two ``apt-get install`` per step, a dozen jobs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootseer.install import debpkg
from tests.conftest import TEST_STATE
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        os.geteuid() != 0
        or not shutil.which("mmdebstrap")
        or not shutil.which("dpkg-deb")
        or not os.path.exists("/dev/fuse"),
        reason="needs root, /dev/fuse, mmdebstrap and dpkg-deb (scripts/bootstrap)",
    ),
]

STATE = Path(f"{TEST_STATE}-fresh-root")
# Slurm and munge, as any node image has them, and the package's dependencies, so that
# each role's `apt-get install ./...deb` takes nothing from the mirror.
PACKAGES = (
    "python3,slurmd,slurmctld,slurm-client,munge,iproute2,procps,"
    "fuse3,libfuse3-3,tzdata,squashfuse,squashfs-tools"
)
ROLES = ("compute", "client")
HOST = "fresh1"  # the compute node; the submit host shares its network namespace
PLUGSTACK_D = "/etc/slurm/plugstack.conf.d/bootseer.conf"
HOOK_LINES = (
    "Prolog=/opt/bootseer/libexec/bootseer-prolog\n"
    "Epilog=/opt/bootseer/libexec/bootseer-epilog\n"
    "PrologFlags=Alloc,DeferBatch\n"
)
SLURM_CONF = f"""ClusterName=fresh
SlurmctldHost={HOST}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
BatchStartTimeout=100
PrologEpilogTimeout=110
MailProg=/bin/true
NodeName={HOST} CPUs=2 RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
CONFIG = """[site]
key_file = "/etc/bootseer/site.key"

[store]
uri = "file:///shared/bootseer"
"""
JOB = """#!/bin/sh
echo "image: $(cat "$BOOTSEER_IMAGE" | head -c 4 | od -An -c | tr -d ' ')"
echo "bootseer: $(readlink -f /opt/bootseer/venv)"
"""


class BaseRoot:
    """The bookworm root both roles start from, as ``mmdebstrap`` makes it: kept across
    runs while its package list is the same (CI builds it each run), built while the
    package builds (the mirror's downloads and dpkg beside pip's work)."""

    def __init__(self) -> None:
        self.path = STATE / f"root-{hashlib.sha256(PACKAGES.encode()).hexdigest()[:12]}"
        self.proc: subprocess.Popen[bytes] | None = None
        if (self.path / ".complete").is_file():
            return
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        argv = ["mmdebstrap", "--variant=apt", "--dpkgopt=force-unsafe-io"]
        argv += [f"--include={PACKAGES}", "bookworm", str(self.path)]
        self.t0 = time.monotonic()
        self.log = open(STATE / "mmdebstrap.log", "wb")  # noqa: SIM115 (closed in wait)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self) -> Path:
        if self.proc is not None:
            status = self.proc.wait(timeout=1200)
            self.log.close()
            self.proc = None
            tail = (STATE / "mmdebstrap.log").read_text(errors="replace")[-2000:]
            assert status == 0, f"mmdebstrap failed ({status}): {tail}"
            print(f"fresh-root: mmdebstrap done {time.monotonic() - self.t0:.0f} s after it began")
            (self.path / ".complete").touch()
        return self.path

    def stop(self) -> None:
        if self.proc is not None:  # the test failed before it waited: leave no mmdebstrap
            self.proc.kill()
            self.proc.wait()
            self.log.close()


@dataclass
class Ran:
    status: int
    out: str


class Site:
    """The two hosts, in namespaces held by one ``sleep`` (pid 1 there): every process
    started there ends with it."""

    def __init__(self, base: Path, work: Path) -> None:
        self.work = work
        shutil.rmtree(work, ignore_errors=True)
        (work / "shared/bootseer").mkdir(parents=True)
        (work / "shared").chmod(0o755)
        mounts = []
        for role in ROLES:
            for d in ("upper", "work", "root"):
                (work / role / d).mkdir(parents=True)
            r = work / role / "root"
            lower = base
            mounts += [
                f"mount -t overlay overlay -o lowerdir={lower},upperdir={work / role}/upper,"
                f"workdir={work / role}/work {r}",
                f"mount -t proc proc {r}/proc",
                f"mount --rbind /sys {r}/sys",
                f"mount -t tmpfs -o mode=0755 tmpfs {r}/run",
                f"mount -t tmpfs -o mode=1777 tmpfs {r}/tmp",
                f"mkdir -p {r}/shared && mount --bind {work}/shared {r}/shared",
            ]
        c = work / "compute/root"
        mounts += [f"touch {c}/dev/fuse", f"mount --bind /dev/fuse {c}/dev/fuse"]
        net = [
            f"hostname {HOST}",
            "ip link set lo up",
            # An address that is not loopback: slurmd's getaddrinfo(AI_ADDRCONFIG) finds
            # none on lo alone.
            "ip link add fresh0 type veth peer name fresh1",
            "ip addr add 10.99.0.1/24 dev fresh0",
            "ip link set fresh0 up && ip link set fresh1 up",
        ]
        script = "set -e\n" + "\n".join(mounts + net) + "\necho ready\nexec sleep infinity\n"
        argv = ["unshare", "--fork", "--kill-child", "--pid", "--mount", "--net", "--uts"]
        argv += ["--ipc", "--propagation", "private", "sh", "-c", script]
        self.holder = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline()
        assert line == "ready\n", f"the namespaces did not come up ({self.holder.poll()})"
        children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children")
        self.pid = int(children.read_text().split()[0])
        # What an image-based site's provisioning puts in every image (Slurm's config and
        # munge key, the users), and alice's image on the shared file system.
        munge_key = os.urandom(128).hex()
        for role in ROLES:
            self.write(role, "/usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", "755")
            # dpkg without an fsync per file, as Debian's container images set it: the
            # package's thousands of files, six installs (the same install, less waiting).
            self.write(role, "/etc/dpkg/dpkg.cfg.d/unsafe-io", "force-unsafe-io\n")
            self.write(role, "/etc/slurm/slurm.conf", SLURM_CONF)
            self.write(role, "/etc/hosts", f"127.0.0.1 localhost\n10.99.0.1 {HOST}\n")
            self.write(role, "/etc/munge/munge.key", munge_key, "400")
            self.run(
                role,
                "chown munge: /etc/munge/munge.key && useradd -m -u 2001 alice && "
                "mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge && "
                "chown munge: /run/munge && runuser -u munge -- munged",
            )
            self.write(role, "/home/alice/job.sh", JOB, "755")
            self.run(role, "chown alice: /home/alice/job.sh")
        img = work / "img"
        img.mkdir()
        (img / "hello").write_text("hello from the image\n")
        sqsh = work / "shared/img.sqsh"
        subprocess.run(["mksquashfs", str(img), str(sqsh), "-quiet", "-noappend"], check=True)

    def close(self) -> None:
        self.holder.send_signal(signal.SIGKILL)  # --kill-child: pid 1 there, and all of it
        self.holder.wait()
        shutil.rmtree(self.work, ignore_errors=True)

    def root(self, role: str) -> Path:
        return self.work / role / "root"

    def run(
        self,
        role: str,
        script: str,
        user: str = "root",
        check: bool = True,
        timeout: float = 300,
        stdin: str = "",
    ) -> Ran:
        """``script`` on ``role``'s host (its root, in the site's namespaces: the roots'
        overlays exist there alone)."""
        as_user = [] if user == "root" else ["setpriv", f"--reuid={user}", f"--regid={user}"]
        as_user += ["--init-groups"] if user != "root" else []
        home = "/root" if user == "root" else f"/home/{user}"
        argv = ["nsenter", "-t", str(self.pid), "-m", "-u", "-i", "-n", "-p", "--"]
        argv += ["chroot", str(self.root(role)), *as_user, "env", "-i", f"HOME={home}"]
        argv += ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "sh", "-c"]
        argv += [f"cd {home} && {script}"]
        r = subprocess.run(
            argv,
            input=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        if check:
            assert r.returncode == 0, f"{role} as {user}: {script}: {r.returncode}\n{r.stdout}"
        return Ran(r.returncode, r.stdout)

    def read(self, role: str, path: str) -> str:
        return self.run(role, f"cat {path}").out

    def write(self, role: str, path: str, text: str, mode: str = "644") -> None:
        self.run(role, f"umask 077 && cat > {path} && chmod {mode} {path}", stdin=text)

    # ---- Slurm --------------------------------------------------------------------
    def start_slurm(self) -> None:
        self.run("compute", "slurmctld && slurmd")
        wait_until(
            lambda: self.run("client", "sinfo -h -o %t", check=False).out.strip() == "idle",
            "the compute node idle, seen from the submit host",
            timeout=120,
            interval=0.5,
        )

    def reconfigure(self, hooks: bool) -> None:
        """slurm.conf's hook lines in (or out), on every role, as the site distributes it."""
        for role in ROLES:
            self.write(role, "/etc/slurm/slurm.conf", SLURM_CONF + (HOOK_LINES if hooks else ""))
        self.run("compute", "scontrol reconfigure")

    def sbatch(self, role: str, *args: str) -> int:
        out = self.run(role, "sbatch --parsable " + " ".join(args), user="alice").out
        return int(out.strip().splitlines()[-1].split(";")[0])

    def wait(self, job: int) -> str:
        def state() -> str:
            out = self.run("compute", f"scontrol -o show job {job}", check=False).out
            got = dict(f.split("=", 1) for f in out.split() if "=" in f).get("JobState", "")
            return got if got not in ("", "PENDING", "RUNNING", "CONFIGURING", "COMPLETING") else ""

        return wait_until(state, f"job {job} to end", timeout=180, interval=0.3)

    def output(self, job: int) -> str:
        return self.read("compute", f"/home/alice/slurm-{job}.out")

    def jobs_run(self, when: str, bootseer: bool = True) -> None:
        """A plain ``sbatch`` from every role, and alice's ``--bootseer`` job from the
        submit host with its report read there, all at once."""
        t0 = time.monotonic()
        plain = {r: self.sbatch(r, "--wrap='echo plain from $SLURM_SUBMIT_HOST'") for r in ROLES}
        job = (
            self.sbatch("client", "--bootseer-image=/shared/img.sqsh", "job.sh") if bootseer else 0
        )
        for role, j in plain.items():
            assert self.wait(j) == "COMPLETED", f"{when}: a plain sbatch from {role}: {self.logs()}"
            assert "plain from" in self.output(j), (when, role)
        if job:
            assert self.wait(job) == "COMPLETED", f"{when}: {self.output(job)}\n{self.logs()}"
            out = self.output(job)
            assert "image: hsqs" in out, f"{when}: the job saw no image: {out}"
            report = self.run("client", f"bootseer report {job}", user="alice", check=False)
            assert report.status == 0 and str(job) in report.out, f"{when}: {report.out}"
        print(f"fresh-root: {when}: jobs in {time.monotonic() - t0:.1f} s")

    # ---- the agent (no systemd here: what the unit would do) -----------------------
    def start_agent(self) -> None:
        self.run(
            "compute",
            "setsid /opt/bootseer/venv/bin/bootseer agent </dev/null "
            ">>/var/log/bootseer-agent.log 2>&1 & echo $! > /run/agent.pid",
        )
        wait_until(
            lambda: (
                self.run("compute", "test -S /run/bootseer/agent.sock", check=False).status == 0
            ),
            "the agent's socket",
            timeout=120,
            interval=0.3,
        )

    def stop_agent(self) -> None:
        """What prerm's ``systemctl disable --now`` does where systemd runs (nothing reaps
        here: the agent is gone once it is a zombie)."""
        self.run(
            "compute",
            "p=$(cat /run/agent.pid) && kill $p && while [ -d /proc/$p ] && "
            "! grep -q '^State:.*zombie' /proc/$p/status; do sleep 0.1; done",
            timeout=120,
        )

    # ---- the package ------------------------------------------------------------------
    def apt(self, role: str, what: str) -> str:
        cmd = f"DEBIAN_FRONTEND=noninteractive apt-get {what} -y -q --allow-downgrades"
        return self.run(role, cmd, timeout=600).out

    def install(self, deb: Path) -> None:
        shutil.copy(deb, self.work / "shared" / deb.name)  # /shared on both hosts
        with ThreadPoolExecutor(len(ROLES)) as pool:  # as an admin's install reaches both
            list(pool.map(lambda role: self.apt(role, f"install /shared/{deb.name}"), ROLES))
        for role in ROLES:
            have = self.run(role, "dpkg-query -W -f='${Version}' bootseer").out
            assert have == deb.name.split("_")[1], (role, have)
            plugstack = self.read(role, PLUGSTACK_D)
            assert "required /opt/bootseer/lib/slurm/bootseer.so" in plugstack, (role, plugstack)

    def logs(self) -> str:
        logs = ("/var/log/slurm/slurmd.log", "/var/log/bootseer-agent.log")
        return self.run("compute", f"tail -n 15 {' '.join(logs)}", check=False).out


@pytest.fixture(scope="module")
def base() -> Iterator[BaseRoot]:
    STATE.mkdir(parents=True, exist_ok=True)
    root = BaseRoot()
    try:
        yield root
    finally:
        root.stop()


@pytest.fixture(scope="module")
def debs(base: BaseRoot) -> Iterator[tuple[Path, Path]]:
    """This checkout's package, and the same under a higher version (the upgrade)."""
    out = STATE / "debs"
    shutil.rmtree(out, ignore_errors=True)
    build = STATE / "build"
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"fresh-root: {time.monotonic() - t0:5.1f} s: {msg}")

    first = debpkg.build_deb(
        build, out, log, version="0.1.0+test.1", more_versions=["0.1.0+test.2"]
    )
    log(f"{first.name}: {first.stat().st_size >> 10} KiB")
    try:
        second = out / debpkg.deb_name("0.1.0+test.2")
        log(f"{second.name}: the same files")
        yield first, second
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture
def site(base: BaseRoot, debs: tuple[Path, Path]) -> Iterator[Site]:
    s = Site(base.wait(), STATE / "site")
    try:
        yield s
    finally:
        s.close()


def test_one_package_installs_upgrades_rolls_back_and_uninstalls_on_every_role(
    site: Site, debs: tuple[Path, Path]
) -> None:
    first, second = debs
    t0 = time.monotonic()

    def step(what: str) -> None:
        print(f"fresh-root: {time.monotonic() - t0:5.1f} s: {what}")

    site.start_slurm()
    site.jobs_run("before bootseer", bootseer=False)

    # Install: the package on both roles (it writes the plugstack line there), the site's
    # files (config everywhere, the site key on the compute node), then slurm.conf's hooks.
    step("install")
    site.install(first)
    for role in ROLES:
        site.run(role, "mkdir -p /etc/bootseer")
        site.write(role, "/etc/bootseer/config.toml", CONFIG)
    site.write("compute", "/etc/bootseer/site.key", os.urandom(32).hex(), mode="600")
    site.jobs_run("the package in, slurm.conf not yet", bootseer=False)
    site.start_agent()
    site.reconfigure(hooks=True)
    site.jobs_run("installed")

    # Upgrade: the higher version on both roles; the agent restarts in place.
    step("upgrade")
    site.install(second)
    site.run("compute", "/opt/bootseer/venv/bin/bootseer agent --restart --force --now")
    site.jobs_run("upgraded")

    # Rollback: the version before, as `bootseer install --deb` pushes it.
    step("rollback")
    site.install(first)
    site.jobs_run("rolled back")

    # Uninstall: slurm.conf's hooks out first, then the package (prerm: the plugstack line
    # first, then the agent).
    step("uninstall")
    site.reconfigure(hooks=False)
    site.stop_agent()
    with ThreadPoolExecutor(len(ROLES)) as pool:
        list(pool.map(lambda role: site.apt(role, "remove bootseer"), ROLES))
    for role in ROLES:
        gone = site.run(role, f"test ! -e {PLUGSTACK_D} && test ! -e /opt/bootseer", check=False)
        assert gone.status == 0, f"{role}: the plugstack line or /opt/bootseer is left"
    site.jobs_run("uninstalled", bootseer=False)
    refused = site.run(
        "client", "sbatch --bootseer-image=/shared/img.sqsh job.sh", user="alice", check=False
    )
    assert refused.status != 0 and "unrecognized option" in refused.out, refused.out
    step("done")
