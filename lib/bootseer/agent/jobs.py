"""The job lifecycle in the agent: prepare, first step, release.

``prepare`` (the prolog) resolves the job's image (a registered name, or a path
image registered on first use), loads its trace, prefetches the hot blocks and starts
the background fill; the job's lazy file appears in the FUSE mount. ``first_step``
(the job, or ``bootseer image first-step``) ends the job's block trace. ``release``
(the epilog) saves or merges the trace and lets the image's blocks be evicted once no
job uses it. Jobs that use one image share one :class:`PreparedImage`.

    >>> view = jobs.prepare(Prepare(42, 1000, 1000, "pytorch:24.05"))  # doctest: +SKIP
    >>> jobs.describe(view).path  # doctest: +SKIP
    '/run/bootseer/images/42.sqsh'
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bootseer.agent.hashing import HashBudget, check_dense
from bootseer.agent.restart import RestartState, SavedJob
from bootseer.agentapi.errors import (
    AgentBadRequest,
    AgentError,
    AgentNotFound,
    AgentPending,
    AgentRefused,
    AgentTimeout,
)
from bootseer.agentapi.jobs import (
    ByteCounts,
    FillSummary,
    JobReply,
    PeerSummary,
    PrefetchSummary,
    Prepare,
    ReleaseReply,
)
from bootseer.config import ImageSection
from bootseer.context import expand_nodes
from bootseer.errors import ContextError, StoreError, describe
from bootseer.image import bundles
from bootseer.image.cache import BlockCache
from bootseer.image.fetch import BlockSource, Fetcher, FileSource, StoreSource, nice_thread
from bootseer.image.manifest import Manifest, load_manifest, max_path_image_bytes
from bootseer.image.prefetch import BackgroundFill, PrefetchResult, prefetch_hot
from bootseer.image.registry import (
    RegistrationPending,
    UnknownImage,
    lookup_name_record,
    open_image_file,
    register_path,
)
from bootseer.image.trace import Recorder, Trace, hot_order, load_trace, save_trace, trace_user
from bootseer.nodepaths import NodePaths
from bootseer.p2p.imagesource import PeerSource, held_run, provide_run
from bootseer.p2p.node import PeerNode
from bootseer.p2p.owner import TREES
from bootseer.p2p.server import HeldPiece, RunBlocks
from bootseer.p2p.swarm import Swarm
from bootseer.p2p.wire import PeerError, PieceRequest
from bootseer.recordcache import RecordCache
from bootseer.sitekey import SiteKeys
from bootseer.store import Store

INODE_BASE = 16  # job file inode = INODE_BASE + job id; below are the mount root's


def _close_origin(source: BlockSource) -> None:
    """Close the image file behind ``source`` (its descriptor), if it reads one."""
    origin = source.origin if isinstance(source, PeerSource) else source
    if isinstance(origin, FileSource):
        origin.close()


@dataclass(eq=False)
class PreparedImage:
    """An image some jobs on this node use, read from one block source."""

    manifest: Manifest
    source: BlockSource  # the job's peers first (PeerSource), or the origin itself
    ref: str
    users: int = 0
    fill: BackgroundFill | None = None

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def origin(self) -> BlockSource:
        """Where the image's bytes really are: the store or the image file."""
        return self.source.origin if isinstance(self.source, PeerSource) else self.source


@dataclass(eq=False)
class JobView:
    """One prepared job: its image, its user, the blocks it read so far."""

    job_id: int
    uid: int
    gid: int
    image: PreparedImage
    recorder: Recorder
    refresh: bool = False
    prepared_at: float = field(default_factory=time.time)
    first_step_at: float | None = None
    fetched_at_prepare: int = 0
    fetched_before_first_step: int | None = None
    prefetch: PrefetchResult | None = None
    trace_runs: int = 0
    swarm: Swarm | None = None
    peers_at_prepare: ByteCounts | None = None
    peers_at_fill: ByteCounts | None = None  # when this job's fill started
    fill_timer: threading.Timer | None = None
    # Whose trace of the image the job prefetches first (the name record's trace_owner,
    # the path image's file owner; None: nobody's), and under whose name its own is kept
    # (its user's; None: a uid without a name, whose jobs keep none).
    trace_owner: str | None = None
    trace_user: str | None = None
    # The hot set's source when its traces name bundles (image.bundles): their reads.
    bundle_source: bundles.BundleSource | None = None

    @property
    def inode(self) -> int:
        return INODE_BASE + self.job_id

    @property
    def name(self) -> str:
        return f"{self.job_id}.sqsh"


class Jobs:
    """The prepared jobs of one node and the images they use."""

    def __init__(
        self,
        icfg: ImageSection,
        paths: NodePaths,
        store: Store,
        cache: BlockCache,
        fetcher: Fetcher,
        block_size: int,
        log: Callable[[str], None],
        keys: Callable[[], SiteKeys],
    ) -> None:
        self.icfg = icfg
        self.store = store
        # The site keys (read again when the key file changes): records are sealed with
        # them, and a name or path record, manifest or trace that does not verify is refused.
        self.keys = keys
        self.cache = cache
        self.fetcher = fetcher
        self.block_size = block_size
        self.log = log
        self.peers: PeerNode | None = None  # set by the agent when p2p is on
        self.paths = paths
        self.restart = RestartState(paths.agent_state, log)
        self._jobs: dict[int, JobView] = {}
        self._images: dict[tuple[str, str], PreparedImage] = {}
        self._lock = threading.RLock()
        self._added = threading.Condition(self._lock)
        self._ref_locks: dict[str, threading.Lock] = {}
        self.hashing = HashBudget()  # path images hashed at once, stopped with their job
        # Name records, manifests and traces as this node last read them: each manifest
        # read once per node, and a store outage does not take what the node had.
        self.records = RecordCache(paths.records, log=log)
        self._bundling: set[tuple[str, str]] = set()  # (image id, user): bundles being written

    # -- the job table ------------------------------------------------------------------

    def get(self, job_id: int) -> JobView | None:
        with self._lock:
            return self._jobs.get(job_id)

    def by_inode(self, inode: int) -> JobView | None:
        return self.get(inode - INODE_BASE)

    def views(self) -> list[JobView]:
        with self._lock:
            return sorted(self._jobs.values(), key=lambda v: v.job_id)

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._jobs)

    def images(self) -> list[PreparedImage]:
        with self._lock:
            return list(self._images.values())

    def _add(self, view: JobView) -> None:
        with self._added:
            self._jobs[view.job_id] = view
            self._added.notify_all()

    # -- peers --------------------------------------------------------------------------

    def _swarm(self, req: Prepare) -> Swarm | None:
        if self.peers is None or not req.nodelist:
            return None
        try:
            return self.peers.join(req.job_id, expand_nodes(req.nodelist))
        except ContextError as exc:
            raise AgentBadRequest(str(exc)) from None

    def provide_block(self, req: PieceRequest, deadline: float) -> bytes | memoryview | RunBlocks:
        """A block of the job's image for one of its other nodes (the peer server asks),
        or a run of them (``req.blocks``)."""
        # The job joined its swarm as its prepare began; the image may take a moment more.
        with self._added:
            self._added.wait_for(
                lambda: req.job_id in self._jobs, max(0.0, min(deadline - time.monotonic(), 5.0))
            )
            view = self._jobs.get(req.job_id)
        if view is None:
            raise PeerError("unknown", f"job {req.job_id} has no image here")
        # An asker whose blocks' trees are not this node's (an agent of another version)
        # gets what is held here, nothing fetched for it: fetching, this node might ask
        # the asker, who waits on it (bootseer.p2p.owner, TREES).
        held_only = req.trees != TREES
        if req.blocks:
            return self._provide_run(view, req, deadline, held_only)
        return self._provide(view, req.piece, req.priority, deadline, req.cached_only, held_only)

    def held_block(self, req: PieceRequest) -> HeldPiece | list[HeldPiece] | None:
        """Where the cache holds a block of the job's image (a run's: each of its blocks),
        if this node holds it; None (``provide_block`` answers) if not, or if the job has
        no image here yet."""
        with self._added:
            view = self._jobs.get(req.job_id)
        if view is None:
            return None
        if req.blocks:
            return held_run(self.cache, view.image.manifest, req)
        i = view.image.manifest.index_of(req.piece)
        where = self.cache.locate(req.piece) if i is not None else None
        if i is None or where is None or where.size != view.image.manifest.block_length(i):
            return None
        return HeldPiece(where.path, where.size, where.offset)

    def _provide(
        self,
        view: JobView,
        piece: str,
        priority: int,
        deadline: float,
        cached_only: bool,
        held_only: bool,
    ) -> bytes | memoryview:
        image = view.image
        i = image.manifest.index_of(piece)
        if i is None:
            raise PeerError("missing", f"{piece[:12]} is no block of job {view.job_id}'s image")
        data = self.cache.read(piece, 0, image.manifest.block_length(i))
        if data is not None:
            return data
        if cached_only:
            raise PeerError("missing", f"block {i} is not held here")
        if held_only:  # "failed", not "missing": the asker drops no node for it
            raise PeerError("failed", f"block {i} is not held here (asked under other trees)")
        # At the asker's priority: a peer's fill waits here too until this node's own start
        # is quiet (and is paced), or it would compete with this node's startup.
        fut = self.fetcher.request(image.source, image.manifest, i, priority, ahead=True)
        wait = max(0.0, deadline - time.monotonic())
        try:
            return fut.result(timeout=wait)
        except Exception as exc:
            why = describe(exc, after=wait)
            raise PeerError("failed", f"block {i} of job {view.job_id}: {why}") from None

    def _provide_run(
        self, view: JobView, req: PieceRequest, deadline: float, held_only: bool
    ) -> RunBlocks:
        image = view.image
        run_bytes = self.icfg.prefetch_run_kib << 10
        return provide_run(
            self.fetcher, image.source, image.manifest, req, deadline, run_bytes, held_only
        )

    # -- prepare ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _single_flight(self, ref: str) -> Iterator[None]:
        with self._lock:
            lock = self._ref_locks.setdefault(ref, threading.Lock())
        with lock:
            yield

    def prepare(self, req: Prepare) -> JobView:
        t0 = time.monotonic()
        ref = req.image  # its syntax checked where the request was read (protocol)
        until = t0 + req.deadline
        view = self.get(req.job_id)
        if view is not None:
            return view  # a retried prolog: the same answer
        swarm = self._swarm(req)
        with self._single_flight(ref):
            manifest, source, owner = self._resolve(ref, req.uid, req.gid, until, req.job_id)
            if time.monotonic() >= until:
                raise AgentTimeout(f"image {ref} took longer than the prolog waits to prepare")
            if swarm is not None:
                source = PeerSource(source, swarm, manifest)
            image = self._use_image(manifest, source, ref)
        view = JobView(
            req.job_id,
            req.uid,
            req.gid,
            image,
            Recorder(manifest.nblocks, self.icfg.trace_window),
            refresh=req.mode == "refresh",
            fetched_at_prepare=self.fetcher.stats.by_image[manifest.id],
            swarm=swarm,
            trace_owner=owner,
            trace_user=trace_user(req.uid),
        )
        self._add(view)
        self.restart.save(
            SavedJob(
                view.job_id,
                view.uid,
                view.gid,
                image.ref,
                image.id,
                view.refresh,
                image.origin.path if isinstance(image.origin, FileSource) else None,
                image.origin.identity if isinstance(image.origin, FileSource) else None,
            )
        )
        owners, own = self._traces(view)
        trace = own or owners
        view.trace_runs = trace.runs if trace else 0
        hot = hot_order(owners, own)
        hot_until = min(time.monotonic() + self.icfg.hot_deadline, until - 0.5)
        view.bundle_source = self._bundled(image.origin, manifest, (owners, own))
        hot_source = source
        if isinstance(source, PeerSource):
            # The blocks this node reads from the store itself: from the bundles too.
            source.bundles = view.bundle_source
        elif view.bundle_source is not None:
            hot_source = view.bundle_source
        view.prefetch = prefetch_hot(
            self.fetcher,
            hot_source,
            manifest,
            hot,
            hot_until,
            self.icfg.hot_start_fraction,
            self.icfg.prefetch_run_kib << 10,
        )
        view.peers_at_prepare = _counts(view)
        # The cold rest waits for the job's first step (or fill_delay): until then the
        # link belongs to startup (the hot set, the job's reads, restores, checkpoints).
        view.fill_timer = threading.Timer(self.icfg.fill_delay, self._start_fill, (view,))
        view.fill_timer.daemon = True
        view.fill_timer.start()
        p = view.prefetch
        self.log(
            f"job={req.job_id} prepared {ref} ({manifest.id[:12]}, {manifest.size} bytes): "
            f"trace={_trace_note(view, owners, own)} "
            f"local_before={p.local_before} fetched={p.fetched_blocks} "
            f"failed={p.failed} complete={p.complete} "
            f"bundled={len(view.bundle_source.places) if view.bundle_source else 0} "
            f"secs={time.monotonic() - t0:.3f}"
        )
        return view

    def _bundled(
        self, source: BlockSource, manifest: Manifest, traces: tuple[Trace | None, ...]
    ) -> bundles.BundleSource | None:
        """The hot set's source when its traces name bundles: the store's blocks, the
        bundled ones read in runs (image.bundles); in a job of several nodes, those this
        node reads from the store itself (PeerSource.bundles). Bundles are read from the
        store only: a path image's file is read where it is."""
        if not self.icfg.bundle_kib or not isinstance(source, StoreSource):
            return None
        places = bundles.index(manifest, traces)
        return bundles.BundleSource(source, places) if places else None

    def _traces(self, view: JobView) -> tuple[Trace | None, Trace | None]:
        """The image owner's trace and the job user's own (None each: none, or refresh)."""
        if view.refresh:
            return None, None
        m = view.image.manifest

        def load(user: str | None) -> Trace | None:
            if user is None:
                return None
            return load_trace(
                self.store, m, self.log, keys=self.keys(), user=user, records=self.records
            )

        own = load(view.trace_user)
        owners = own if view.trace_owner == view.trace_user else load(view.trace_owner)
        return owners, own

    def _resolve(
        self, ref: str, uid: int, gid: int, until: float, job_id: int = 0
    ) -> tuple[Manifest, BlockSource, str | None]:
        """The image's manifest, where its blocks come from, and its trace owner."""
        if ref.startswith("/"):
            try:
                fd, st = open_image_file(ref, uid, gid)
            except StoreError as exc:
                raise AgentRefused(str(exc)) from None
            # The one descriptor the image is read through from now on: never by path again.
            source = FileSource(ref, fd)
            cap = max_path_image_bytes(self.icfg.max_image_gib, self.block_size)
            if st.st_size > cap:
                source.close()
                raise AgentRefused(
                    f"image {ref} is {st.st_size} bytes, more than the {cap} a path image "
                    f"may have (image.max_image_gib = {self.icfg.max_image_gib:g})"
                )
            wait = max(0.0, min(self.icfg.register_wait, until - time.monotonic() - 1.0))
            try:
                # Holes, hashings at once, and a job gone: what the hashing may cost
                # (bootseer.agent.hashing).
                check_dense(ref, st)
                with self.hashing.slot(job_id, uid, ref) as progress:
                    manifest = register_path(
                        self.store,
                        ref,
                        st,
                        self.block_size,
                        wait,
                        self.log,
                        f"/proc/self/fd/{fd}",
                        keys=self.keys(),
                        progress=progress,
                    )
            except RegistrationPending as exc:
                source.close()
                raise AgentPending(f"{exc}; not ready within {wait:.0f}s") from None
            except BaseException:
                source.close()
                raise
            # The file's owner can change its bytes: trusting her trace adds nothing. A
            # root-owned file's jobs are no root's: the admin may name whose trace leads.
            if st.st_uid == 0 and self.icfg.root_path_trace_owner:
                return manifest, source, self.icfg.root_path_trace_owner
            return manifest, source, trace_user(st.st_uid)
        try:
            manifest, owner = lookup_name_record(
                self.store, ref, keys=self.keys(), records=self.records
            )
            return manifest, StoreSource(self.store), owner
        except UnknownImage as exc:
            raise AgentNotFound(str(exc)) from None
        except StoreError as exc:
            raise AgentError(str(exc)) from None

    def _use_image(self, manifest: Manifest, source: BlockSource, ref: str) -> PreparedImage:
        key = (manifest.id, source.describe())
        with self._lock:
            image = self._images.get(key)
            if image is None:
                image = self._images[key] = PreparedImage(manifest, source, ref)
                self.cache.pin(manifest.blocks)
            else:
                _close_origin(source)  # the same file, already open for another job
            image.users += 1
            return image

    # -- first step ---------------------------------------------------------------------

    def _start_fill(self, view: JobView) -> None:
        """Queue the image's blocks not yet local, behind every other fetch (once per image)."""
        image = view.image
        with self._lock:
            if view.job_id not in self._jobs or not (image.fill is None or image.fill.cancelled):
                return
            image.fill = BackgroundFill(image.id)
            view.peers_at_fill = _counts(view)
        image.fill.start(
            self.fetcher, image.source, image.manifest, set(), self.icfg.prefetch_run_kib << 10
        )
        self.log(f"job={view.job_id} background fill: {image.fill.total} blocks")

    def first_step(self, view: JobView) -> None:
        if view.fill_timer is not None:
            view.fill_timer.cancel()
            threading.Thread(target=self._start_fill, args=(view,), daemon=True).start()
        if view.first_step_at is None:
            view.first_step_at = time.time()
            view.recorder.stop()
            view.fetched_before_first_step = (
                self.fetcher.stats.by_image[view.image.id] - view.fetched_at_prepare
            )
            self.log(
                f"job={view.job_id} first step: {len(view.recorder.order)} blocks read "
                f"since prepare, {view.fetched_before_first_step} bytes fetched"
            )

    # -- release ------------------------------------------------------------------------

    def release(self, job_id: int) -> ReleaseReply:
        if self.hashing.cancel(job_id):
            self.log(f"job={job_id} ended: its path image's hashing stops")
        with self._lock:
            view = self._jobs.pop(job_id, None)
        self.restart.forget(job_id)
        if view is None:
            return ReleaseReply(released=False)
        if view.fill_timer is not None:
            view.fill_timer.cancel()
        if self.peers is not None:
            self.peers.leave(job_id)
        view.recorder.stop()
        job = self.describe(view)
        try:
            trace, kept = self._keep_trace(view)
            if kept is not None and view.trace_user is not None:
                self._bundle_later(view, view.trace_user, kept)
        except StoreError as exc:
            self.log(f"job={job_id} trace not saved: {exc}")
            trace = f"not saved: {exc}"
        if view.bundle_source is not None:
            st = view.bundle_source.stats
            self.log(
                f"job={job_id} bundles: {st.reads} reads, {st.blocks} blocks, {st.bytes} bytes, "
                f"{st.refused} refused{': ' + '; '.join(st.errors) if st.errors else ''}"
            )
        with self._lock:
            image = view.image
            image.users -= 1
            if image.users <= 0:
                self.cache.unpin(image.manifest.blocks)
                if image.fill is not None:
                    image.fill.cancel()
                self._images.pop((image.id, image.source.describe()), None)
                _close_origin(image.source)
        self.log(f"job={job_id} released: trace {trace}")
        return ReleaseReply(released=True, trace=trace, job=job)

    def _keep_trace(self, view: JobView) -> tuple[str, Trace | None]:
        """The job's trace, merged into its own user's (never another user's): what
        was done, and the user's trace as it is now stored."""
        order = view.recorder.order
        if not order:
            return "none recorded", None
        user = view.trace_user
        if user is None:
            return f"not kept: uid {view.uid} has no user name here", None
        m = view.image.manifest
        stored = (
            None
            if view.refresh
            else load_trace(self.store, m, self.log, keys=self.keys(), user=user)
        )
        if stored is None:
            new: Trace | None = Trace(m.id, m.nblocks, m.block_size, tuple(order))
            verdict = f"saved ({len(order)} blocks)"
        else:
            new = stored.merged(order)
            verdict = (
                "unchanged"
                if new is None
                else f"merged ({len(new.blocks) - len(stored.blocks)} new blocks)"
            )
        if new is not None:
            save_trace(self.store, new, keys=self.keys(), user=user)
        return f"{verdict} for {user}", new or stored

    def _bundle_later(self, view: JobView, user: str, trace: Trace) -> None:
        """Write the bundles ``trace`` lacks, after the epilog (a thread): by the job's
        first node only, for an image read from the store, one writer per trace here."""
        m = view.image.manifest
        bundle_blocks = bundles.bundle_blocks_for(self.icfg.bundle_kib, m.block_size)
        max_bytes = int(self.icfg.bundle_max_gib * (1 << 30))
        swarm = view.swarm
        if (
            not bundle_blocks
            or not isinstance(view.image.origin, StoreSource)
            or (swarm is not None and swarm.nodes[0] != swarm.node)  # one writer: the first
            or bundles.complete(m, trace, bundle_blocks, max_bytes)
        ):
            return
        with self._lock:
            if (m.id, user) in self._bundling:
                return
            self._bundling.add((m.id, user))
        threading.Thread(
            target=self._bundle,
            args=(m, user, trace, bundle_blocks, max_bytes),
            name=f"bundles-{m.id[:12]}",
            daemon=True,
        ).start()

    def _bundle(
        self, m: Manifest, user: str, trace: Trace, bundle_blocks: int, max_bytes: int
    ) -> None:
        """Store ``trace``'s bundles (its blocks from this node's cache), then name them in
        the user's trace, if it is still the one they were cut from. At the lowest CPU
        priority, each bundle once the node's starts are quiet, as the fill."""
        t0 = time.monotonic()
        nice_thread(19)
        try:
            done = bundles.write_bundles(
                self.store,
                m,
                trace,
                bundle_blocks,
                lambda d, n: self.cache.read(d, 0, n),
                max_bytes,
                self.fetcher.wait_quiet,  # a job starting here has the link and the CPU
            )
            stored = load_trace(self.store, m, self.log, keys=self.keys(), user=user)
            if stored is None or stored.blocks != trace.blocks:
                verdict = "not named: the trace changed meanwhile (the next save names them)"
            elif stored.bundle_blocks == bundle_blocks and list(stored.bundles) == done.bundles:
                verdict = "already named"
            else:
                save_trace(
                    self.store,
                    stored.with_bundles(bundle_blocks, done.bundles),
                    keys=self.keys(),
                    user=user,
                )
                verdict = "named in the trace"
            missing = sum(1 for p in done.bundles if p is None)
            self.log(
                f"image {m.id[:12]} bundles for {user}: {done.written} written "
                f"({done.bytes} bytes), {done.kept} kept, {missing} lacking a block here; "
                f"{verdict} ({time.monotonic() - t0:.1f}s)"
            )
        except Exception as exc:  # a store error, or a bug: the next save tries again
            self.log(f"image {m.id[:12]} bundles for {user} not written: {describe(exc)}")
        finally:
            with self._lock:
                self._bundling.discard((m.id, user))

    def describe(self, view: JobView) -> JobReply:
        fill = view.image.fill
        return JobReply(
            job_id=view.job_id,
            path=str(self.paths.image_file(view.name)),
            image=view.image.id,
            ref=view.image.ref,
            size=view.image.manifest.size,
            block_size=view.image.manifest.block_size,
            blocks=view.image.manifest.nblocks,
            trace_runs=view.trace_runs,
            prefetch=_prefetch_summary(view.prefetch) if view.prefetch else None,
            fill=_fill_summary(fill) if fill else None,
            recorded_blocks=len(view.recorder.order),
            first_step_at=view.first_step_at,
            fetched_before_first_step=view.fetched_before_first_step,
            peers=self._peer_stats(view),
        )

    def _peer_stats(self, view: JobView) -> PeerSummary | None:
        if view.swarm is None:
            return None
        st = view.swarm.stats
        counts = _counts(view) or ByteCounts()  # the image's blocks (the swarm serves frames too)
        return PeerSummary(
            counts.store_bytes,
            counts.peer_bytes,
            peer_failures=st.peer_failures,
            corrupt=st.corrupt,
            dropped=dict(st.dropped),
            at_prepare=view.peers_at_prepare,
            at_fill=view.peers_at_fill,
        )

    # -- restart ------------------------------------------------------------------------

    def restore(self) -> None:
        """Bring back the jobs prepared before a restart, so their image files work again."""
        for saved in self.restart.load():
            try:
                manifest = load_manifest(
                    self.store, saved.image, keys=self.keys(), records=self.records
                )
            except StoreError as exc:
                self.restart.forget(saved.job_id, str(exc))
                continue
            source: BlockSource = StoreSource(self.store)
            if saved.path:
                try:
                    source = self._reopen(saved)
                except StoreError as exc:
                    self.restart.forget(saved.job_id, str(exc))
                    continue
            image = self._use_image(manifest, source, saved.ref)
            self._add(
                JobView(
                    saved.job_id,
                    saved.uid,
                    saved.gid,
                    image,
                    Recorder(manifest.nblocks, 0),
                    refresh=saved.refresh,
                )
            )
        if ids := self.ids():
            self.log(f"restored {len(ids)} prepared jobs: {ids}")

    def _reopen(self, saved: SavedJob) -> FileSource:
        """The path image's file again, opened as the job's user, if it is the same file."""
        assert saved.path is not None
        if saved.file is None:
            raise StoreError(f"{saved.path}: saved without the file's identity")
        fd, _ = open_image_file(saved.path, saved.uid, saved.gid)
        source = FileSource(saved.path, fd)
        if source.identity != saved.file:
            source.close()
            raise StoreError(f"{saved.path} is no longer the file the job was prepared with")
        return source

    def close(self) -> None:
        for image in self.images():
            if image.fill is not None:
                image.fill.cancel()


def _trace_note(view: JobView, owners: Trace | None, own: Trace | None) -> str:
    """What the prefetch followed, for the log: ``none``, or each trace and its blocks."""
    parts = []
    if owners is not None and owners is not own:
        parts.append(f"{view.trace_owner}'s {len(owners.blocks)} blocks")
    if own is not None:
        parts.append(f"own {len(own.blocks)} blocks")
    return " + ".join(parts) or "none"


def _counts(view: JobView) -> ByteCounts | None:
    """The job's image bytes so far from the store and from peers (None without peers)."""
    source = view.image.source
    if not isinstance(source, PeerSource):
        return None
    store_bytes, peer_bytes = source.counts()
    return ByteCounts(store_bytes, peer_bytes)


def _prefetch_summary(p: PrefetchResult) -> PrefetchSummary:
    return PrefetchSummary(**dataclasses.asdict(p), hit_ratio=round(p.hit_ratio, 4))


def _fill_summary(f: BackgroundFill) -> FillSummary:
    return FillSummary(f.state, f.started, f.ended, f.total, f.done, f.failed, f.fetched_bytes)
