"""The suite's own rules, held by running pytest on a probe module with this tree's config:
a test that needs the cluster or the store host says so by its marker (else `-m "not
slurm"` would start the cluster), and a hung test fails with its traceback, its fixtures
torn down, instead of hanging the run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import TOP


def pytest_on(probe: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest with pyproject.toml's settings and tests/conftest.py as a plugin, on ``probe``."""
    probe.write_text(source)
    ini = ["-c", str(TOP / "pyproject.toml"), "--rootdir", str(probe.parent)]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *ini, "-p", "tests.conftest", str(probe), *args],
        cwd=probe.parent,
        env={**os.environ, "PYTHONPATH": f"{TOP}{os.pathsep}{TOP / 'lib'}"},
        capture_output=True,
        text=True,
        timeout=120,
    )


UNMARKED = """
import pytest

def test_plain() -> None:
    pass

def test_on_the_cluster(cluster) -> None:
    pass

@pytest.fixture
def bucket(s3_store):
    return s3_store

def test_in_a_bucket(bucket) -> None:
    pass
"""


def test_a_test_using_the_cluster_or_the_store_host_unmarked_is_refused(tmp_path: Path) -> None:
    r = pytest_on(tmp_path / "test_probe.py", UNMARKED, "--collect-only", "-q")
    assert r.returncode != 0
    assert "test_probe.py::test_on_the_cluster: _cluster_session without @pytest.mark.slurm" in (
        r.stderr
    )
    # through a fixture of its own too
    assert "test_probe.py::test_in_a_bucket: s3_store without @pytest.mark.s3" in r.stderr
    assert "test_plain" not in r.stderr


def test_marked_they_are_left_out_by_their_marker(tmp_path: Path) -> None:
    marked = UNMARKED.replace("def test_on", "@pytest.mark.slurm\ndef test_on").replace(
        "def test_in", "@pytest.mark.s3\ndef test_in"
    )
    r = pytest_on(tmp_path / "test_probe.py", marked, "--collect-only", "-q", "-m", "not slurm")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test_probe.py::test_plain" in r.stdout
    assert "test_probe.py::test_in_a_bucket" in r.stdout
    assert "test_on_the_cluster" not in r.stdout


def test_an_unknown_marker_is_an_error(tmp_path: Path) -> None:
    r = pytest_on(
        tmp_path / "test_probe.py", "import pytest\n\n@pytest.mark.slrum\ndef test_x():\n    pass\n"
    )
    assert r.returncode != 0
    assert "'slrum' not found in `markers` configuration option" in r.stdout + r.stderr


HUNG = """
import time
from pathlib import Path

import pytest

@pytest.fixture
def held(tmp_path):
    yield
    Path({done!r}).write_text("torn down")

@pytest.mark.timeout(2)
def test_hangs(held) -> None:
    time.sleep(300)  # the hang
"""


def test_a_hung_test_fails_with_its_traceback_and_its_teardown_runs(tmp_path: Path) -> None:
    done = tmp_path / "done"
    start = time.monotonic()
    r = pytest_on(tmp_path / "test_probe.py", HUNG.format(done=str(done)))
    assert time.monotonic() - start < 60
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Failed: Timeout (>2.0s) from pytest-timeout." in r.stdout
    assert "time.sleep(300)  # the hang" in r.stdout
    assert done.read_text() == "torn down"
