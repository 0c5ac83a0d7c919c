"""The metrics files: written whole, 0644 whatever the umask, hook counts that add up
across concurrent hook processes, and what a hook salvages of a bad site config."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bootseer.hooks.badconfig import salvage
from bootseer.metrics.hooks import FILE, BytesSample, HookSample, StepSample, record


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(path: Path, name: str, **labels: str) -> float:
    return samples(path).get((name, tuple(sorted(labels.items()))), 0.0)


RUN = HookSample(
    "prolog",
    "ok",
    0.3,
    (StepSample("image", "ok", 0.2), StepSample("deps", "timed_out", 40.0)),
    (BytesSample("image_prefetch", 1000, 600, 400),),
)


def test_hook_runs_add_up_and_histograms_count_each_run(tmp_path: Path) -> None:
    logged: list[str] = []
    for _ in range(3):
        record(tmp_path, RUN, logged.append)
    record(tmp_path, HookSample("epilog", "config_error", 0.01), logged.append)
    path = tmp_path / FILE
    assert logged == []
    assert value(path, "bootseer_hook_runs_total", hook="prolog", outcome="ok") == 3
    assert value(path, "bootseer_hook_runs_total", hook="epilog", outcome="config_error") == 1
    assert value(path, "bootseer_hook_config_error", hook="epilog") == 1
    assert value(path, "bootseer_hook_config_error", hook="prolog") == 0
    assert (
        value(path, "bootseer_step_outcomes_total", hook="prolog", step="deps", outcome="timed_out")
        == 3
    )
    assert value(path, "bootseer_step_seconds_count", hook="prolog", step="image") == 3
    assert value(path, "bootseer_step_seconds_bucket", hook="prolog", step="image", le="0.25") == 3
    assert value(path, "bootseer_step_seconds_bucket", hook="prolog", step="deps", le="30.0") == 0
    assert value(path, "bootseer_step_seconds_bucket", hook="prolog", step="deps", le="60.0") == 3
    assert value(path, "bootseer_step_seconds_sum", hook="prolog", step="deps") == pytest.approx(
        120
    )
    assert value(path, "bootseer_phase_bytes_total", phase="image_prefetch") == 3000
    src = "bootseer_phase_source_bytes_total"
    assert value(path, src, phase="image_prefetch", source="store") == 1800
    assert value(path, src, phase="image_prefetch", source="peer") == 1200
    # node_exporter reads it as root's, 0644; the lock beside it is no .prom file.
    st = path.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o644)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".prom") == [FILE]


def test_concurrent_hook_processes_lose_no_count(tmp_path: Path) -> None:
    """Many hooks at once on one node (many jobs start): every run is counted. Without
    the lock around read-add-write, runs overwrite each other's counts."""
    code = textwrap.dedent(
        f"""
        import os, sys
        os.umask(0o077)  # a site's strict umask: the file must stay readable all the same
        from pathlib import Path
        from bootseer.metrics.hooks import HookSample, StepSample, record
        for _ in range(15):
            record(Path({str(tmp_path)!r}), HookSample("prolog", "ok", 0.1,
                   (StepSample("image", "ok", 0.05),)), sys.exit, wait=30)
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(6)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 6
    path = tmp_path / FILE
    assert value(path, "bootseer_hook_runs_total", hook="prolog", outcome="ok") == 90
    assert value(path, "bootseer_step_seconds_count", hook="prolog", step="image") == 90
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{FILE}")] == []


def test_a_file_that_is_not_ours_starts_the_counts_afresh(tmp_path: Path) -> None:
    (tmp_path / FILE).write_text("bootseer_hook_runs_total{hook=\n")
    logged: list[str] = []
    record(tmp_path, RUN, logged.append)
    assert value(tmp_path / FILE, "bootseer_hook_runs_total", hook="prolog", outcome="ok") == 1
    assert any("counting afresh" in line for line in logged), logged


def test_a_lock_held_too_long_gives_the_sample_up_with_a_log_line(tmp_path: Path) -> None:
    import fcntl

    from bootseer.metrics.hooks import LOCK

    fd = os.open(tmp_path / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        logged: list[str] = []
        record(tmp_path, RUN, logged.append, wait=0.2)
        assert not (tmp_path / FILE).exists()
        assert any("held by another" in line for line in logged), logged
    finally:
        os.close(fd)


def test_refused_records_are_counted_by_purpose(tmp_path: Path) -> None:
    from bootseer import sitekey

    keys, other = sitekey.SiteKeys([b"k" * 32]), sitekey.SiteKeys([b"o" * 32])
    before = sitekey.refused[sitekey.DEPS_REF]
    raw = other.seal(sitekey.DEPS_REF, "refs/x.json", b'{"a":1}')
    for bad in (raw, b'{"a":1}'):  # another key's seal; no seal at all
        with pytest.raises(sitekey.SealError):
            keys.open(sitekey.DEPS_REF, "refs/x.json", bad)
    assert sitekey.refused[sitekey.DEPS_REF] == before + 2
    refused = tuple((p, sitekey.refused[p]) for p in sitekey.PURPOSES)
    record(tmp_path, HookSample("prolog", "ok", 0.1, refused=refused), pytest.fail)
    path = tmp_path / FILE
    name = "bootseer_hook_records_refused_total"
    assert value(path, name, hook="prolog", purpose="deps.ref") == before + 2
    assert value(path, name, hook="prolog", purpose="image.trace") == sitekey.refused["image.trace"]


def test_admin_doc_lists_every_hook_series() -> None:
    from bootseer.metrics.hooks import FAMILIES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "admin.md").read_text()
    for f in FAMILIES:
        name = f"{f.name}_total" if f.kind == "counter" else f.name
        assert f"| `{name}` | {f.kind} |" in doc, name


def test_metrics_off_writes_nothing(tmp_path: Path) -> None:
    record(None, RUN, lambda line: pytest.fail(line))


# -- what a hook salvages of a bad site config ----------------------------------------


def test_salvage_drops_the_bad_key_and_keeps_the_rest(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        '[store]\nuri = "file:///shared/bootseer"\n'
        '[paths]\nlog_dir = "/var/log/bs"\n'
        '[hooks]\nprolog_deadline = "soon"\nstrict = true\n'
        "[nosuch]\nx = 1\n"
    )
    found = salvage(cfg)
    assert found is not None
    assert found.cfg.store.uri == "file:///shared/bootseer"
    assert found.cfg.hooks.strict is True
    assert found.cfg.hooks.prolog_deadline == 90.0  # the default, not "soon"
    assert found.has("store.uri") and not found.has("hooks.prolog_deadline")
    assert found.cfg.store.secrets_file == tmp_path / "secrets.toml"


def test_salvage_skips_lines_that_are_not_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text('[store]\nuri = "s3://b/p"\n[hooks]\nstrict = tru e\nthis is not toml\n')
    found = salvage(cfg)
    assert found is not None and found.cfg.store.uri == "s3://b/p"
    assert not found.has("hooks.strict")


def test_salvage_without_a_store_uri_says_so(tmp_path: Path) -> None:
    """The defaults' store is node-local: a hook must not write its rows there."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('[store]\nuri = 5\n[metrics]\ntextfile_dir = "/srv/tf"\n')
    found = salvage(cfg)
    assert found is not None and not found.has("store.uri")
    assert found.has("metrics.textfile_dir")


def test_salvage_of_a_missing_file_is_none(tmp_path: Path) -> None:
    assert salvage(tmp_path / "nosuch.toml") is None
