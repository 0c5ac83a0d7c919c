"""Forged phase rows (issue 21.2): root's flushes seal each phase file, root's report
counts only files whose seal verifies, a report without the key shows unsealed ones as
such, and compaction never folds a forged file into a sealed one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bootseer.phases import reader
from bootseer.phases.compact import compact
from bootseer.phases.reader import PhaseDataset
from bootseer.phases.seal import parquet_bytes, seal_table, verdict
from bootseer.phases.writer import write_rows
from bootseer.sitekey import SiteKeys
from bootseer.store import Store
from tests.phases.conftest import T0, node_rows
from tests.sitekeys import KEY, KEYS, key_file

ALICE_JOB = 4242
MALLORY_KEYS = SiteKeys([b"mallory-minted-no-site-key-0123456789"])


def alices_job(store: Store) -> None:
    """Alice's two-node job, as root's epilog flushes write it (sealed)."""
    for node in ("n1", "n2"):
        write_rows(store, node_rows(ALICE_JOB, node, nodes=2), "epilog", keys=KEYS)


def forge(store: Store) -> list[str]:
    """What mallory, with write access to the store, adds to alice's job: a node that was
    never hers (unsealed; sealed under a key of her own), and a genuine sealed file of
    another job moved into alice's, and one of alice's own files altered in place."""
    keys = [
        write_rows(store, node_rows(ALICE_JOB, "n9", nodes=2), "epilog"),
        write_rows(store, node_rows(ALICE_JOB, "n8", nodes=2), "epilog", keys=MALLORY_KEYS),
    ]
    bobs = write_rows(store, node_rows(77, "n7", nodes=2), "epilog", keys=KEYS)
    assert bobs is not None
    moved = bobs.replace("job=77", f"job={ALICE_JOB}")
    store.write_bytes(moved, store.read_bytes(bobs))
    store.delete(bobs)
    keys.append(moved)
    genuine = next(
        f.key for f in PhaseDataset(store).files() if f.job_id == ALICE_JOB and "/n1-" in f.key
    )
    raw = bytearray(store.read_bytes(genuine))
    table = pq.read_table(pa.BufferReader(bytes(raw)))
    altered = table.set_column(
        table.column_names.index("node"), "node", pa.array(["n6"] * table.num_rows)
    )
    redo = bytearray(seal_table(MALLORY_KEYS, genuine, altered))  # then alice's MAC over it
    at = bytes(raw).rfind(b"bootseer-seal:v1:") + 17
    at2 = bytes(redo).rfind(b"bootseer-seal:v1:") + 17
    redo[at2 : at2 + 64] = raw[at : at + 64]
    store.write_bytes(genuine, bytes(redo))
    return [k for k in keys if k] + [genuine]


def config(tmp_path: Path, store: Store, with_key: bool = True) -> dict[str, str]:
    site = tmp_path / "site.toml"
    key = key_file(tmp_path) if with_key else tmp_path / "no-such.key"
    site.write_text(
        f'[store]\nuri = "{store.uri}"\n[site]\nkey_file = "{key}"\n'
        '[phases]\nsqueue = "/nonexistent/squeue"\n'  # Slurm is not asked here
    )
    return {**os.environ, "BOOTSEER_CONFIG": str(site)}


def report(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "COLUMNS": "200"},
    )


def test_a_seal_verifies_for_its_file_at_its_key_only() -> None:
    table = pa.table({"x": [1, 2, 3]})
    raw = seal_table(KEYS, "phases/a.parquet", table)
    assert verdict(KEYS, "phases/a.parquet", raw) == "sealed"
    assert pq.read_table(pa.BufferReader(raw))["x"].to_pylist() == [1, 2, 3]  # still Parquet
    assert verdict(KEYS, "phases/b.parquet", raw) == "altered"  # moved
    assert verdict(MALLORY_KEYS, "phases/a.parquet", raw) == "altered"  # another key
    flipped = bytearray(raw)
    flipped[10] ^= 1
    assert verdict(KEYS, "phases/a.parquet", bytes(flipped)) == "altered"
    assert verdict(KEYS, "phases/a.parquet", parquet_bytes(table)) == "unsealed"
    assert verdict(KEYS, "phases/a.parquet", b"not parquet at all") == "unsealed"
    assert verdict(None, "phases/a.parquet", raw) == "unchecked"
    rotated = SiteKeys([b"the-new-site-key-0123456789abcdef", KEY])
    assert verdict(rotated, "phases/a.parquet", raw) == "sealed"
    assert verdict(KEYS, "phases/a.parquet", seal_table(rotated, "phases/a.parquet", table)) == (
        "altered"
    )


def test_a_forged_or_altered_phase_file_is_not_counted_by_roots_report(
    store: Store, tmp_path: Path
) -> None:
    """mallory's rows add a node to alice's job: root's report (job and cluster view)
    counts none of them and says so. Before sealing, the report showed n9, n8, n7, n6."""
    alices_job(store)
    forged = forge(store)
    env = config(tmp_path, store)
    r = report(env, str(ALICE_JOB), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    (run,) = data["runs"]
    assert sorted(n["node"] for n in run["nodes"]) == ["n2"]  # n1's file was altered
    assert data["seals"]["checked"] is True
    assert {x["key"]: x["why"] for x in data["seals"]["refused"]} == {
        forged[0]: "unsealed",
        forged[1]: "altered",
        forged[2]: "altered",
        forged[3]: "altered",
    }
    assert data["seals"]["rows_refused"] == 4 * 7
    text = report(env, str(ALICE_JOB)).stdout
    assert "4 phase file(s) (28 rows) not counted" in text, text
    assert "1 without a seal, 3 whose seal does not verify" in text

    view = json.loads(report(env, "--since", "3650d", "--json").stdout)
    assert view["runs"] == 1 and view["seals"]["files_refused"] == 4
    text = report(env, "--since", "3650d").stdout
    assert "4 phase file(s) (28 rows) not counted" in text, text


def test_without_the_key_unsealed_files_are_flagged_and_what_was_not_checked_is_said(
    store: Store, tmp_path: Path
) -> None:
    """A report without the key (a user's; here root's where the key file is missing)
    cannot check seals: a file without one is counted but shown as such, and the report
    says the seals were not checked, and that Slurm could not be asked."""
    alices_job(store)
    unsealed = write_rows(store, node_rows(ALICE_JOB, "n9", nodes=2), "epilog")
    env = config(tmp_path, store, with_key=False)
    data = json.loads(report(env, str(ALICE_JOB), "--json").stdout)
    assert data["seals"]["checked"] is False
    assert data["seals"]["unsealed"] == [unsealed] and data["seals"]["files_unchecked"] == 2
    assert "no site key here" in data["seals"]["unchecked_why"]
    assert data["slurm_check"]["unchecked"].startswith("Slurm could not be asked")
    text = report(env, str(ALICE_JOB)).stdout
    assert "1 phase file(s) (7 rows) carry no seal" in text, text
    assert "Seals not checked: no site key here" in text
    assert "Not checked against Slurm" in text


def test_a_file_too_large_to_hold_is_refused_unread_past_the_cap(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root's report holds each file in memory to parse only what it checked: a file
    over the cap (a forger's 10 GB) is refused after reading the cap, and said."""
    alices_job(store)
    rows = [
        r.__class__.from_dict({**r.to_dict(), "detail": os.urandom(200).hex()})
        for r in node_rows(ALICE_JOB, "n9", nodes=2)
    ]
    big = write_rows(store, rows, "epilog", keys=KEYS) or ""
    cap = max(i.size for i in store.list("phases", recursive=True) if i.key != big)
    assert store.info(big).size > cap  # type: ignore[union-attr]
    monkeypatch.setattr(reader, "MAX_FILE_BYTES", cap)
    ds = PhaseDataset(store, keys=KEYS)
    assert sorted(set(ds.job(ALICE_JOB)["node"].to_pylist())) == ["n1", "n2"]
    assert ds.seals is not None and ds.seals.refused == {big: "oversize"}


def test_compaction_seals_the_day_and_leaves_a_forged_file_out(store: Store) -> None:
    alices_job(store)
    write_rows(store, node_rows(ALICE_JOB, "n3", nodes=2), "epilog", keys=KEYS)
    forged = write_rows(store, node_rows(ALICE_JOB, "n9", nodes=2), "epilog")
    (done,) = compact(store, now=T0 + 3 * 86400, keys=KEYS)
    assert (done.files_in, done.refused) == (3, 1)
    assert store.exists(forged or "") and store.exists(done.key)
    assert verdict(KEYS, done.key, store.read_bytes(done.key)) == "sealed"
    ds = PhaseDataset(store, keys=KEYS)
    assert sorted(set(ds.job(ALICE_JOB)["node"].to_pylist())) == ["n1", "n2", "n3"]
    assert ds.seals is not None and list(ds.seals.refused) == [forged]


def test_the_admin_adopts_files_from_before_seals_once_and_never_an_altered_one(
    store: Store, tmp_path: Path
) -> None:
    """After upgrading, root's report counts no file from before seals until the admin
    seals them as they are (``phase compact --adopt-unsealed``); a file whose seal does
    not verify is not adopted."""
    old = [write_rows(store, node_rows(ALICE_JOB, n, nodes=2), "epilog") for n in ("n1", "n2")]
    moved = write_rows(store, node_rows(77, "n7", nodes=2), "epilog", keys=KEYS) or ""
    store.write_bytes(moved.replace("job=77", "job=78"), store.read_bytes(moved))
    store.delete(moved)
    env = config(tmp_path, store)
    assert json.loads(report(env, str(ALICE_JOB), "--json").stdout)["runs"] == []
    r = subprocess.run(
        [sys.executable, "-m", "bootseer.cli", "phase", "compact", "--adopt-unsealed"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "sealed 2 file(s) written before seals" in r.stdout
    # ... then compacted (the day is long over); the moved file stays where it is.
    assert "2 files -> " in r.stdout and "1 file(s) left, their seal does not verify" in r.stdout
    assert not any(store.exists(k or "") for k in old)
    data = json.loads(report(env, str(ALICE_JOB), "--json").stdout)
    assert sorted(n["node"] for n in data["runs"][0]["nodes"]) == ["n1", "n2"]
    assert json.loads(report(env, "78", "--json").stdout)["seals"]["files_refused"] == 1
