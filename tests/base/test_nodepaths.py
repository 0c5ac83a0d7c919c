"""bootseer.nodepaths names every node-local path; the SPANK plugin computes one of them
(the job's env file) in C, and must get the same answer."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bootseer import nodepaths
from bootseer.config import SiteConfig
from bootseer.jobdir import JobDir
from bootseer.nodepaths import NodePaths
from bootseer.phases.spool import Spool

SPANK = Path(__file__).resolve().parents[2] / "spank"

HARNESS = r"""
#include "bootseer.c"

/* host | env RUN_DIR NODE JOB_ID | contract | names | parse FILE */
int main(int argc, char **argv)
{
    char out[PATH_MAX + 64];
    if (argc == 2 && !strcmp(argv[1], "names")) {
        for (const char *const *name = env_names; *name; name++)
            puts(*name);
        return 0;
    } else if (argc == 2 && !strcmp(argv[1], "contract")) {
        printf("%s%d\n%s\n", ENV_HEADER, ENV_CONTRACT, plugin_contract);
        return 0;
    } else if (argc == 3 && !strcmp(argv[1], "parse")) {
        char *body;
        FILE *f = fopen(argv[2], "r");
        size_t n = f ? fread(job_env, 1, sizeof(job_env) - 1, f) : 0;
        job_env[n] = '\0';
        long contract = env_contract(&body);
        printf("%ld\n%s", contract, body);
        return 0;
    } else if (argc == 2 && !strcmp(argv[1], "host")) {
        if (host_name(out, 256) < 0)
            return 1;
    } else if (argc == 5 && !strcmp(argv[1], "env")) {
        if (job_env_path(out, sizeof(out), argv[2], argv[3],
                 (uint32_t)strtoul(argv[4], NULL, 10)) < 0)
            return 1;
    } else {
        return 2;
    }
    puts(out);
    return 0;
}
"""

CASES = [
    ("/run/bootseer", "n1", 42),
    ("/var/tmp/dev/nodes/%n/run", "n3", 7),
    ("/x/%n/y/%n", "gpu-017", 4294967295),
    ("/%n", "a", 1),
]


@pytest.fixture(scope="module")
def plugin_paths(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin's own path functions, built into a small program."""
    cc = shutil.which("cc")
    if cc is None or not Path("/usr/include/slurm/spank.h").exists():
        pytest.skip("needs cc and libslurm-dev (spank.h)")
    d = tmp_path_factory.mktemp("spank")
    (d / "harness.c").write_text(HARNESS)
    exe = d / "harness"
    # The plugin's calls into slurmd stay unresolved (the harness never makes them),
    # which a position-independent executable would not load with.
    unresolved = ["-no-pie", "-Wl,--unresolved-symbols=ignore-all"]
    subprocess.run(
        [cc, "-std=gnu11", "-I", str(SPANK), "-o", str(exe), str(d / "harness.c"), *unresolved],
        check=True,
        capture_output=True,
    )
    return exe


@pytest.mark.parametrize(("run_dir", "node", "job_id"), CASES)
def test_plugin_reads_the_env_file_the_prolog_writes(
    plugin_paths: Path, run_dir: str, node: str, job_id: int
) -> None:
    out = subprocess.run(
        [str(plugin_paths), "env", run_dir, node, str(job_id)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    cfg = SiteConfig.from_mapping({"paths": {"run_dir": run_dir}}).for_node(node)
    assert out == str(nodepaths.job_env(cfg.paths.run_dir, job_id))
    assert out == str(JobDir(cfg.paths.run_dir, job_id).path / nodepaths.JOB_ENV)


def test_plugin_and_hooks_agree_on_the_env_files_contract(
    plugin_paths: Path, tmp_path: Path
) -> None:
    out = subprocess.run(
        [str(plugin_paths), "contract"], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert out == [
        f"{nodepaths.ENV_HEADER} {nodepaths.ENV_CONTRACT}",
        f"bootseer-spank-contract={nodepaths.ENV_CONTRACT};",  # what doctor looks for
    ]
    job = JobDir(tmp_path, 7).create()
    job.write_env({"BOOTSEER_IMAGE": "/x", "BOOTSEER_CKPT": "/c"})
    parsed = subprocess.run(
        [str(plugin_paths), "parse", str(job.path / nodepaths.JOB_ENV)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert parsed == [str(nodepaths.ENV_CONTRACT), "BOOTSEER_CKPT=/c", "BOOTSEER_IMAGE=/x"]
    assert job.read_env() == {"BOOTSEER_IMAGE": "/x", "BOOTSEER_CKPT": "/c"}
    # A file of the hooks before the contract line: the plugin finds none (and says so).
    old = tmp_path / "old-env"
    old.write_text("BOOTSEER_IMAGE=/x\n")
    parsed = subprocess.run(
        [str(plugin_paths), "parse", str(old)], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert parsed[0] == "-1"


def test_plugin_and_python_name_the_node_alike(plugin_paths: Path) -> None:
    out = subprocess.run(
        [str(plugin_paths), "host"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert out == nodepaths.host_name()
    assert nodepaths.node_name({}) == out
    assert nodepaths.node_name({"SLURMD_NODENAME": "n9"}) == "n9"


def test_derived_paths_follow_the_roots() -> None:
    cfg = SiteConfig.from_mapping(
        {"paths": {"run_dir": "/r/%n", "cache_dir": "/c/%n", "log_dir": "/l"}}
    ).for_node("n1")
    p = NodePaths(cfg)
    assert p.agent_socket == Path("/r/n1/agent.sock")
    assert p.image_mounts == Path("/r/n1/images")
    assert p.image_cache == Path("/c/n1/image")
    assert p.agent_state == Path("/c/n1/image/jobs")
    assert p.ckpt_mounts == Path("/r/n1/ckpt")
    assert p.deps_state(5) == Path("/r/n1/jobs/5/deps/prolog.json")
    assert p.spool_dir(5) == Spool(cfg.paths.run_dir, 5).path == Path("/r/n1/phases/5")
    assert p.hook_log("n1") == Path("/l/n1.log")
    assert p.ckpt_log(5) == Path("/l/ckpt/5.log")


def test_configured_paths_win_and_take_n() -> None:
    cfg = SiteConfig.from_mapping(
        {
            "image": {"socket": "/s/%n.sock", "mount_dir": "/m/%n", "cache_dir": "/ic"},
            "ckpt": {"mount_root": "/ck/%n"},
        }
    ).for_node("n2")
    p = NodePaths(cfg)
    assert (p.agent_socket, p.image_mounts, p.image_cache, p.ckpt_mounts) == (
        Path("/s/n2.sock"),
        Path("/m/n2"),
        Path("/ic"),
        Path("/ck/n2"),
    )
    # An empty mount_root (as docs/ckpt.md shows it) is the default.
    empty = SiteConfig.from_mapping({"ckpt": {"mount_root": ""}})
    assert NodePaths(empty).ckpt_mounts == Path("/run/bootseer/ckpt")


def test_defaults_are_the_documented_ones() -> None:
    p = NodePaths(SiteConfig())
    assert p.agent_socket == Path("/run/bootseer/agent.sock")
    assert p.image_mounts == Path("/run/bootseer/images")
    assert p.image_cache == Path("/var/cache/bootseer/image")


def test_plugin_unsets_every_name_the_prolog_may_write(plugin_paths: Path, tmp_path: Path) -> None:
    """The plugin clears each of them where the node's env file does not set it (a task
    gets its own node's, not what srun passed on); the hooks write no other name."""
    out = subprocess.run(
        [str(plugin_paths), "names"], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert tuple(out) == nodepaths.ENV_NAMES
    job = JobDir(tmp_path, 7).create()
    with pytest.raises(ValueError, match="BOOTSEER_NEW is not in nodepaths"):
        job.write_env({"BOOTSEER_IMAGE": "/x", "BOOTSEER_NEW": "1"})
