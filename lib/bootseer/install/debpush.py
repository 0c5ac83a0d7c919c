"""``bootseer install --deb FILE NODESET``: the Debian package (install.debpkg) pushed over
SSH, with the site's files the package never holds.

Each node gets the site's config, and a compute node its root-only files (site key,
store secrets), written first where they differ (the package's ``postinst`` starts the
agent where the config is), then, where ``dpkg`` has another version of bootseer, the
package, installed with ``apt-get`` (its dependencies from the node's own Debian
mirror). A client host (``--role client``) keeps its agent disabled. Run again, a node
with this version and these files is ``unchanged``; a compute node whose agent reads a
changed file is reloaded (``systemctl reload``: the restart in place).
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from pathlib import Path

from bootseer.install.debpkg import LAYOUT, PACKAGE
from bootseer.install.files import NodeFile
from bootseer.install.layout import Role
from bootseer.install.node import NodeReport, _verify
from bootseer.install.remote import Node, RemoteError

# Each file: "<sha256> <mode> <uid> <gid>", or "missing".
LOOK = r"""
for p; do
  if [ -f "$p" ]; then
    printf '%s %s\n' "$(sha256sum < "$p" | cut -d' ' -f1)" "$(stat -c '%a %u %g' "$p")"
  else
    echo missing
  fi
done
"""

SYSTEMD = "[ ! -d /run/systemd/system ] || "


def deb_version(deb: Path) -> str:
    """The package's version, as ``dpkg-deb`` reads it."""
    r = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Package", "Version"], capture_output=True, text=True
    )
    if r.returncode != 0:
        raise RemoteError(f"{deb}: not a Debian package: {r.stderr.strip()[-300:]}")
    fields = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    if fields.get("Package") != PACKAGE:
        raise RemoteError(f"{deb} is the package {fields.get('Package')!r}, not {PACKAGE}'s")
    return fields["Version"]


def push_deb(
    node: Node, deb: Path, version: str, files: list[NodeFile], role: Role, dry_run: bool
) -> NodeReport:
    if node.run(["sh", "-c", "command -v apt-get && command -v dpkg-query"]).status != 0:
        raise RemoteError("no apt-get or dpkg there: the package is for Debian (bookworm)")
    r = node.run(["dpkg-query", "-W", "-f=${Status} ${Version}", PACKAGE])
    have = r.out.split()[-1] if r.status == 0 and "ok installed" in r.out else ""
    looked = node.check(["sh", "-c", LOOK, "-", *(str(f.path) for f in files)]).splitlines()
    stale = [
        f
        for f, got in zip(files, looked, strict=True)
        if got != f"{hashlib.sha256(f.data).hexdigest()} {f.mode:o} 0 0"
    ]
    changes = []
    if have != version:
        changes.append(f"package {version}" + (f" (was {have})" if have else ""))
    if stale:
        names = [f.path.name for f in stale]
        more = f", +{len(names) - 2}" if len(names) > 2 else ""
        changes.append(f"{len(names)} files ({', '.join(names[:2])}{more})")
    report = NodeReport(node.name, "unchanged")
    if not changes:
        return report
    report.changes = changes
    if dry_run:
        report.status = "would change"
        return report
    dirs = sorted({str(f.path.parent) for f in stale})
    if dirs:
        node.check(["sh", "-c", 'umask 022 && mkdir -p -- "$@"', "-", *dirs])
    for f in stale:
        node.put(f.path, f.data, f.mode)
    if have != version:
        remote = Path("/var/tmp") / f".bootseer-install-{version}.deb"
        node.put(remote, deb, 0o644)
        apt = (
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
            f"-o Dpkg::Options::=--force-confold {shlex.quote(str(remote))}; "
            f"s=$?; rm -f {shlex.quote(str(remote))}; exit $s"
        )
        got = node.run(["sh", "-c", apt], timeout=1800)
        if got.status != 0:
            raise RemoteError(f"apt-get install of {deb.name} failed: {got.err.strip()[-500:]}")
    if role == "client":  # a submit or login host runs no agent
        node.check(["sh", "-c", SYSTEMD + "systemctl disable --now bootseer-agent.service"])
    elif stale and have == version:  # the agent reads the config and key: restart in place
        node.check(["sh", "-c", SYSTEMD + "systemctl reload-or-restart bootseer-agent.service"])
    _verify(node, LAYOUT)
    report.status = "installed"
    return report
