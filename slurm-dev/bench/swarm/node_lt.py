"""One emulated node of the ``libtorrent`` engine: a libtorrent session in its namespace.

Run by ``bench.py`` instead of ``node.py`` for ``--engine libtorrent``, with the same
protocol on stdin/stdout (``ready``; ``go``; ``done <monotonic time>``; ``stop``, then one
JSON line of counts) and the same counts where libtorrent has them.

The job's piece set is one private v2 torrent (SHA-256 merkle piece hashes, 16 KiB
pieces), one file per kind of piece (``block``, ``frame``, ``unit``: each kind's pieces in
manifest order), made by ``bench.py`` from the store's bytes as image registration would.
The store is the torrent's web seed (BEP 19: ``store.py``'s ``/ws/``, HTTP byte ranges).

- **Peers** come from the job's node list (``connect_peer``), no tracker, DHT, LSD, PEX,
  UPnP, NAT-PMP or uTP; a node connects to the nodes after it on a ring of the list
  (distances 1..K, K = (bound - 1) // 2, and the opposite node when the whole list fits):
  every pair once, each node with at most ``max_connections - 1`` peers (the whole job up
  to 64 nodes, 62 of them at 256), the last slot for the web seed.
- **The store**: the web seed is given at the start to ``webseeds`` nodes only (the spec
  names them: one by default, the list's first); every other node adds it only when it has
  gained no piece for ``fallback_s`` (the fall-back to the store: a node cut off from
  its peers, or whose peers are all waiting on a dead seed). Given to every node, every
  node pulls from the store at the start (``--lt-webseeds 0`` measures that).
- **Tuned** for a cluster's fabric (``settings``): 4 upload slots a node (``slots``), 2 on
  the web-seeded node (else it sends every piece it reads to nearly every peer itself:
  12x the piece set at 16 nodes), the local peer class made to count as any (libtorrent
  exempts peers on the local network from the slots, and counts each 1.5x against the
  connection limit), reconnect at once, the request and piece timeouts of the
  p2p spike (issue 10) stretched as the emulator stretches time, no encryption (it
  authenticates nobody), 2 disk threads (64-256 sessions share 2 cores).

``--corrupt``: this node joins as a seed whose files have a byte flipped in every piece
(``seed_mode``: libtorrent trusts them unchecked) and serves them; it holds no good copy
and is left out of the "every node holds every piece" check by ``bench.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

import libtorrent as lt
from node import Connections, neighbours


def settings(spec: dict[str, Any], ip: str) -> dict[str, Any]:
    stretch = spec["stretch"]
    bound = spec["max_connections"]
    return {
        "listen_interfaces": f"{ip}:{spec['port']}",
        "enable_dht": False,
        "enable_lsd": False,
        "enable_upnp": False,
        "enable_natpmp": False,
        "enable_incoming_utp": False,
        "enable_outgoing_utp": False,
        "in_enc_policy": int(lt.enc_policy.disabled),
        "out_enc_policy": int(lt.enc_policy.disabled),
        "user_agent": "bootseer-swarm",
        "connections_limit": bound,
        # Choking: a few upload slots a node (bench.py --lt-slots), fixed: a piece then
        # spreads by relays, as a tree would, not from its first holder to everyone.
        "choking_algorithm": int(lt.choking_algorithm_t.fixed_slots_choker),
        "unchoke_slots_limit": spec.get("slots") or bound,
        # The p2p spike's tuning (issue 10): with the defaults 6 of 44 runs stalled 60 s
        # waiting to reconnect or for a block's timeout; stretched like the tree's bounds.
        "close_redundant_connections": False,
        "min_reconnect_time": 1,
        "request_timeout": int(5 * stretch),
        "piece_timeout": int(5 * stretch),
        "peer_connect_timeout": int(max(5, 3 * stretch)),
        "urlseed_timeout": int(20 * stretch),
        "urlseed_wait_retry": int(max(2, 2 * stretch)),
        "aio_threads": 2,
        "hashing_threads": 1,
        "alert_mask": int(
            lt.alert_category.error
            | lt.alert_category.status
            | lt.alert_category.storage
            | lt.alert_category.connect
            | lt.alert_category.peer
        ),
        **spec.get("lt_settings", {}),
    }


def ring_peers(nodes: list[str], me: str, bound: int) -> list[str]:
    """The peers ``me`` connects to: the next K nodes on the ring of the job's list (K =
    (bound - 1) // 2), and the opposite node (the lower of the pair) when the whole job
    fits in the bound. Each pair connects once; a node has at most bound - 1 peers."""
    n = len(nodes)
    i = nodes.index(me)
    k = min(n - 1, bound - 1) // 2
    out = [nodes[(i + d) % n] for d in range(1, k + 1)]
    if n - 1 <= bound - 1 and n % 2 == 0 and n > 2 and i < n // 2:
        out.append(nodes[i + n // 2])
    return out


class Node:
    def __init__(self, a: argparse.Namespace) -> None:
        spec = json.loads(Path(a.spec).read_text())
        self.spec = spec
        self.name: str = a.name
        self.nodes: list[str] = spec["nodes"]
        self.ips: dict[str, str] = spec["ips"]
        self.port: int = spec["port"]
        self.pieces: list[dict[str, Any]] = spec["pieces"]
        self.corrupt = a.corrupt
        self.dir = Path(a.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.webseed = f"http://{spec['store_ip']}:{spec['store_port']}/ws/"
        self.webseeded = self.name in spec["webseeds"]
        self.fallback_s: float = spec["fallback_s"]
        self.fallbacks = 0
        self.handshakes = 0  # outgoing connections to peers that completed
        self.incoming = 0
        self.disconnects = 0
        self.dropped: dict[str, int] = {}  # why peers were disconnected: how often
        self.hash_failures = 0
        self.errors: list[str] = []
        self.connections = Connections(self.port)
        self.debug = bool(os.environ.get("SWARM_LT_DEBUG"))
        if self.corrupt:
            self.write_bad_copy()
        pack = settings(spec, self.ips[self.name])
        if self.webseeded and spec["seed_slots"]:
            # A node that reads the store unchokes a few peers only: the rest get its
            # pieces from them (else it sends every piece to nearly every peer itself).
            pack["unchoke_slots_limit"] = spec["seed_slots"]
        self.ses = lt.session(pack)
        # Every peer of a job is on the "local" network (one fabric, private addresses),
        # and libtorrent's local peer class ignores the unchoke slots and counts each
        # connection 1.5x against connections_limit (42 peers, not 64): count as global.
        local = self.ses.get_peer_class(self.ses.local_peer_class_id)
        local.update(ignore_unchoke_slots=False, connection_limit_factor=100)
        self.ses.set_peer_class(self.ses.local_peer_class_id, local)
        atp = lt.add_torrent_params()
        atp.ti = lt.torrent_info(spec["torrent"])
        atp.save_path = str(self.dir)
        atp.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused)
        if self.corrupt:
            atp.flags |= lt.torrent_flags.seed_mode
        self.total = atp.ti.num_pieces()
        self.h = self.ses.add_torrent(atp)
        deadline = time.monotonic() + 120
        want = (lt.torrent_status.downloading, lt.torrent_status.seeding)
        while self.h.status().state not in want:
            if time.monotonic() > deadline:
                raise SystemExit(f"torrent stuck in {self.h.status().state}")
            time.sleep(0.05)

    def write_bad_copy(self) -> None:
        """--corrupt: the job's files with a byte flipped in every piece, from the store
        (before the clock starts: this node is a liar that seems to have everything)."""
        import urllib.request

        kinds: dict[str, list[dict[str, Any]]] = {}
        for p in self.pieces:
            kinds.setdefault(p["kind"], []).append(p)
        root = self.dir / self.spec["torrent_name"]
        root.mkdir(parents=True, exist_ok=True)
        for kind in kinds:
            with urllib.request.urlopen(f"{self.webseed}{self.spec['torrent_name']}/{kind}") as r:
                data = bytearray(r.read())
            for at in range(0, len(data), 16 << 10):
                data[at] ^= 0xFF
            (root / kind).write_bytes(bytes(data))

    def pump(self, timeout_ms: int) -> None:
        self.ses.wait_for_alert(timeout_ms)
        for al in self.ses.pop_alerts():
            if isinstance(al, lt.peer_connect_alert):
                if al.endpoint[1] == self.port:
                    self.handshakes += 1
            elif isinstance(al, lt.incoming_connection_alert):
                self.incoming += 1
            elif isinstance(al, lt.peer_disconnected_alert):
                self.disconnects += 1
                why = f"{al.op} {al.error.message()} reason {int(al.reason)}"
                self.dropped[why] = self.dropped.get(why, 0) + 1
            elif isinstance(al, lt.hash_failed_alert):
                self.hash_failures += 1
            elif al.category() & lt.alert_category.error:
                if len(self.errors) < 10:
                    self.errors.append(f"{type(al).__name__}: {al.message()}"[:300])
                if self.debug:
                    print(f"{self.name}: {type(al).__name__}: {al.message()}", file=sys.stderr)

    def run(self) -> float:
        for peer in ring_peers(self.nodes, self.name, self.spec["max_connections"]):
            self.h.connect_peer((self.ips[peer], self.port))
        if self.webseeded:
            # Web-seeded nodes split the store's pieces: seed j of k asks the store for
            # stripe j first (priority 7, the rest 1), so that each piece leaves the
            # store about once and the rest arrive from the other seeds through peers.
            seeds = self.spec["webseeds"]
            if len(seeds) > 1:
                j, k = seeds.index(self.name), len(seeds)
                self.h.prioritize_pieces(
                    [7 if i * k // self.total == j else 1 for i in range(self.total)]
                )
            self.h.add_url_seed(self.webseed)
            if self.spec["seed_upload_bps"]:
                self.h.set_upload_limit(self.spec["seed_upload_bps"])
        have, since = -1, time.monotonic()
        while True:
            self.pump(200)
            st = self.h.status()
            if self.debug and self.webseeded:
                self.show_choking(st)
            if st.num_pieces == self.total:
                return time.monotonic()
            if st.num_pieces != have:
                have, since = st.num_pieces, time.monotonic()
            elif not self.webseeded and time.monotonic() - since > self.fallback_s:
                self.h.add_url_seed(self.webseed)  # the fall-back to the store
                self.webseeded = True
                self.fallbacks += 1

    def show_choking(self, st: Any) -> None:
        """SWARM_LT_DEBUG=1: how many peers a web-seeded node unchokes (the last 8 looks, in
        the record's log_sample): how the local peer class's exemption was found."""
        peers = self.h.get_peer_info()
        unchoked = sum(not (p.flags & lt.peer_info.choked) for p in peers)
        slots = self.ses.get_settings()["unchoke_slots_limit"]
        self.errors = [
            *self.errors[-7:],
            f"{st.num_pieces} pieces, unchoked {unchoked} of {len(peers)}, slots {slots}, "
            f"uploading at {st.upload_payload_rate} B/s",
        ]

    def verify_all(self) -> int:
        """Pieces held with the manifest's sha256 (read back from the torrent's files,
        after libtorrent flushed them)."""
        if self.corrupt:
            return 0
        self.h.flush_cache()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.ses.wait_for_alert(200)
            if any(isinstance(al, lt.cache_flushed_alert) for al in self.ses.pop_alerts()):
                break
        ok = 0
        root = self.dir / self.spec["torrent_name"]
        data: dict[str, bytes] = {}
        at: dict[str, int] = {}
        for p in self.pieces:
            kind = p["kind"]
            if kind not in data:
                path = root / kind
                data[kind] = path.read_bytes() if path.exists() else b""
            off = at.get(kind, 0)
            at[kind] = off + p["size"]
            ok += hashlib.sha256(data[kind][off : off + p["size"]]).hexdigest() == p["sha256"]
        return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--corrupt", action="store_true")
    a = ap.parse_args()
    node = Node(a)
    stop = threading.Event()
    threading.Thread(target=node.connections.sample, args=(stop,), daemon=True).start()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    t0 = time.monotonic()
    if node.corrupt:
        print(f"done {time.monotonic()}", flush=True)
    else:
        try:
            print(f"done {node.run()}", flush=True)
        except Exception as exc:
            print(f"failed {type(exc).__name__}: {exc}", flush=True)
    # Keep serving (and counting) until stopped: the others may still be fetching.
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(sys.stdin.readline()), daemon=True)
    reader.start()
    while reader.is_alive():
        node.pump(200)
    stop.set()
    st = node.h.status()
    held = node.verify_all()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "node": node.name,
                "held_ok": held,
                "store_bytes": 0,
                "store_reads": 0,
                "peer_bytes": st.total_payload_download,
                "peer_failures": node.disconnects,
                "corrupt_refused": node.hash_failures,
                "served_bytes": st.total_payload_upload,
                "served_pieces": 0,
                "refused": 0,
                "handshakes": node.handshakes,
                "incoming": node.incoming,
                "fallbacks": node.fallbacks,
                "webseeded": node.webseeded,
                "max_out": node.connections.max_out,
                "max_in": node.connections.max_in,
                "max_both": node.connections.max_both,
                "cpu_s": ru.ru_utime + ru.ru_stime,
                "neigh": neighbours(),
                "started": t0,
                "dropped": node.dropped,
                "log": node.errors,
            }
        ),
        flush=True,
    )
    os._exit(0)


if __name__ == "__main__":
    main()
