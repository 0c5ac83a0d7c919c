"""Debian's node_exporter with only its textfile collector, run as ``nobody`` on loopback
(as Debian's runs as ``prometheus``, not root), and one scrape of it parsed.

    >>> with node_exporter(textfiles, port, base / "exporter.err"):  # doctest: +SKIP
    ...     got = scrape(port)
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

EXPORTER = shutil.which("prometheus-node-exporter")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@contextmanager
def node_exporter(textfiles: Path, port: int, err: Path) -> Iterator[None]:
    assert EXPORTER is not None
    proc = subprocess.Popen(
        [
            *("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"),
            EXPORTER,
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={textfiles}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(err, "wb"),  # noqa: SIM115
    )
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def scrape(port: int, timeout: float = 20) -> Samples:
    """One scrape, once the exporter answers (within ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            break
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in text_string_to_metric_families(text)
        for x in fam.samples
    }
