"""``bootseer image add|ls|show|rm|gc|first-step|status``.

bootseer image add /shared/images/pytorch.sqsh --name pytorch:24.05
bootseer image ls
bootseer image first-step            # in a job: startup is over, stop the trace
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from bootseer import units
from bootseer.errors import BootseerError
from bootseer.units import argparse_age

if TYPE_CHECKING:
    from bootseer.agentapi.client import AgentClient


NO_IMAGE_RECORDS = "users cannot read the store's image records"


def register(sub: Any) -> None:
    p = sub.add_parser("image", help="container images: add, list, remove, collect garbage")
    isub = p.add_subparsers(dest="image_command", required=True, metavar="ACTION")

    a = isub.add_parser("add", help="cut a squashfs image into blocks and store it")
    a.add_argument("file", help="the squashfs (or SIF) file")
    a.add_argument("--name", help="NAME[:TAG] to register it under (default: the file's stem)")
    a.add_argument("--block-size-kib", type=int, help="block size (default: site config)")
    a.add_argument("--parallel", type=int, default=8, help="parallel uploads (default 8)")
    a.add_argument(
        "--trace-owner",
        metavar="USER",
        help="the user whose jobs' block trace every job of this name prefetches first "
        "(default: none; each user's jobs then prefetch their own user's trace only)",
    )
    a.set_defaults(handler=_add)

    ls = isub.add_parser("ls", help="list registered images")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=_ls)

    show = isub.add_parser("show", help="show one image, its blocks and its trace")
    show.add_argument("ref", help="NAME[:TAG], an image id, or a registered path")
    show.set_defaults(handler=_show)

    rm = isub.add_parser("rm", help="remove a name (its blocks go with the next gc)")
    rm.add_argument("ref")
    rm.set_defaults(handler=_rm)

    gc = isub.add_parser("gc", help="delete manifests, traces and blocks no name or path uses")
    gc.add_argument("--dry-run", action="store_true")
    gc.add_argument(
        "--grace",
        type=argparse_age,
        default=3600.0,
        metavar="AGE",
        help="keep objects younger than AGE, an add in progress (default 1h)",
    )
    gc.set_defaults(handler=_gc)

    fs = isub.add_parser("first-step", help="mark the job's first step: its startup trace ends")
    fs.add_argument("--job", type=int, default=None, help="job id (default $SLURM_JOB_ID)")
    fs.set_defaults(handler=_first_step)

    st = isub.add_parser("status", help="ask this node's agent about a job, or about itself")
    st.add_argument("--job", type=int, default=None)
    st.add_argument("--node", default=None, help="node name for %%n in paths")
    st.set_defaults(handler=_status)


def _node(arg: str | None) -> str:
    from bootseer.nodepaths import node_name

    return arg or node_name()


def _store() -> Any:
    from bootseer.config import load_config

    cfg = load_config()
    return cfg, cfg.store.open()


def _add(args: argparse.Namespace) -> int:
    from bootseer.image.manifest import upload_file
    from bootseer.image.registry import SQUASHFS_MAGIC, tag_image
    from bootseer.progress import transfer_bar
    from bootseer.sitekey import site_keys

    cfg, store = _store()
    # Jobs use only what the site key sealed: an admin adds images as root on a host that
    # holds the key (docs/security.md).
    keys = site_keys(cfg)
    if not keys.keys:
        raise BootseerError(
            f"bootseer image add seals the image's records with the site key: run it as root "
            f"where the key is ({keys.missing})"
        )
    path = os.path.abspath(args.file)
    with open(path, "rb") as f:
        if f.read(4) != SQUASHFS_MAGIC:
            print(f"note: {path} has no squashfs magic; storing it anyway", file=sys.stderr)
    name = args.name or os.path.basename(path).rsplit(".", 1)[0].lower()
    from bootseer.image.registry import name_key
    from bootseer.users import check_user

    name_key(name)  # check the name and the owner before the long part
    if args.trace_owner is not None:
        try:
            check_user(args.trace_owner)
        except ValueError as exc:
            raise BootseerError(f"--trace-owner: {exc}") from None
    bs = (args.block_size_kib or cfg.image.block_size_kib) << 10
    t0 = time.monotonic()
    with transfer_bar("adding", os.path.getsize(path)) as tick:
        manifest = upload_file(
            store, path, bs, args.parallel, lambda done, _t, _u: tick(0, done), keys=keys
        )
    tag_image(store, name, manifest, keys=keys, trace_owner=args.trace_owner)
    print(
        f"{name}: image {manifest.id} ({units.iec(manifest.size)}, {manifest.nblocks} blocks "
        f"of {units.iec(bs)}) in {time.monotonic() - t0:.1f} s"
    )
    return 0


def _ls(args: argparse.Namespace) -> int:
    from bootseer.image.registry import list_names, list_paths

    if os.geteuid() != 0:
        return _ls_through_agent(args)
    _, store = _store()
    names = list_names(store)
    paths = list_paths(store)
    if args.json:
        doc = {"names": {n: r.to_json() for n, r in names}, "paths": [p.to_json() for p in paths]}
        print(json.dumps(doc, indent=1))
        return 0
    from bootseer.cli.listing import print_table

    rows = [[units.iec(record.size), record.image[:12], "name", ref] for ref, record in names]
    rows += [  # registered by the agent on first use
        [units.iec(record.size), record.image[:12], "path", record.path] for record in paths
    ]
    if not rows:
        print("no images")
        return 0
    print_table(["SIZE", "IMAGE", "KIND", "NAME OR PATH"], rows, right={0})
    return 0


def _ls_through_agent(args: argparse.Namespace) -> int:
    """A user's listing: she holds no store credentials and may not read ``images/``; the
    node agent (root) lists the names whose sealed records verify. Path images are
    other users' files, registered on first use: root's ``image ls`` shows them."""
    from bootseer.agentapi.errors import AgentUnavailable
    from bootseer.agentapi.views import ImageList
    from bootseer.cli.caller import this_nodes_agent, through_agent_hint

    try:
        reply = this_nodes_agent().ask(ImageList())
    except AgentUnavailable as exc:
        raise through_agent_hint("image ls", NO_IMAGE_RECORDS, exc) from None
    if args.json:
        names = {i.name: {"image": i.image, "size": i.size, "added": i.added} for i in reply.images}
        print(json.dumps({"names": names, "left_out": reply.left_out}, indent=1))
        return 0
    from bootseer.cli.listing import print_table

    if not reply.images:
        print("no images")
        return 0
    rows = [[units.iec(i.size), i.image[:12], "name", i.name] for i in reply.images]
    print_table(["SIZE", "IMAGE", "KIND", "NAME"], rows, right={0})
    if reply.left_out:
        print(f"... and {reply.left_out} more names", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    from bootseer.image.manifest import load_manifest
    from bootseer.image.registry import list_paths, lookup_name_record
    from bootseer.image.trace import traces_dir
    from bootseer.image.views import image_doc, load_traces

    if os.geteuid() != 0:
        return _show_through_agent(args)
    _, store = _store()
    owner = None
    if len(args.ref) == 64 and all(c in "0123456789abcdef" for c in args.ref):
        m = load_manifest(store, args.ref, keys=None)  # shown, not trusted
    elif args.ref.startswith("/"):
        ids = [record.image for record in list_paths(store) if record.path == args.ref]
        if not ids:
            raise BootseerError(f"{args.ref} is not registered")
        m = load_manifest(store, ids[-1], keys=None)
    else:
        m, owner = lookup_name_record(store, args.ref, keys=None)
    # One trace per user whose jobs kept one.
    users = [
        obj.key.rsplit("/", 1)[1].removesuffix(".json")
        for obj in store.list(traces_dir(m.id))
        if obj.key.endswith(".json")  # (not its bundles/)
    ]
    traces = load_traces(store, m, users, keys=None, log=lambda msg: print(msg, file=sys.stderr))
    print(json.dumps(image_doc(m, owner, traces), indent=1))
    return 0


def _show_through_agent(args: argparse.Namespace) -> int:
    """A user's ``image show``: she may not read ``images/``; the node agent answers for a
    name, with her own trace and the trace owner's (bootseer.image.views)."""
    from bootseer.agentapi.errors import AgentUnavailable
    from bootseer.agentapi.views import ImageShow
    from bootseer.cli.caller import this_nodes_agent, through_agent_hint

    try:
        reply = this_nodes_agent().ask(ImageShow(args.ref))
    except AgentUnavailable as exc:
        raise through_agent_hint("image show", NO_IMAGE_RECORDS, exc, "image show NAME") from None
    print(json.dumps(reply.doc, indent=1))
    return 0


def _rm(args: argparse.Namespace) -> int:
    from bootseer.cli.caller import require_root

    require_root("image rm", "image names are the site's, written by root")
    from bootseer.image.registry import remove_name

    _, store = _store()
    remove_name(store, args.ref)
    print(f"removed {args.ref}; `bootseer image gc` frees blocks no other image uses")
    return 0


def _gc(args: argparse.Namespace) -> int:
    from bootseer.cli.caller import require_root

    require_root("image gc", "it deletes manifests, traces and blocks from the store")
    from bootseer.image.gc import collect

    _, store = _store()
    report = collect(store, grace=args.grace, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"{verb} {report.manifests} manifests, {report.traces} traces, {report.bundles} bundles "
        f"({units.iec(report.bundle_bytes)}), {report.blocks} blocks "
        f"({units.iec(report.bytes)}); kept {report.kept_blocks} blocks"
    )
    if report.unreadable:
        for image_id, why in report.unreadable:
            print(f"image gc: cannot read the manifest of image {image_id}: {why}", file=sys.stderr)
        print(
            f"image gc: kept every block: {len(report.unreadable)} image(s) in use have "
            "manifests this release cannot read, and their blocks must not go (a newer "
            "release's format: run gc from it; damage: `bootseer image rm` the name)",
            file=sys.stderr,
        )
        return 1
    return 0


def _client(node: str | None) -> AgentClient:
    from bootseer.agentapi.client import node_agent
    from bootseer.config import load_config

    return node_agent(load_config().for_node(_node(node)))


def _first_step(args: argparse.Namespace) -> int:
    job = args.job or int(os.environ.get("SLURM_JOB_ID", "0"))
    if not job:
        raise BootseerError("no job: give --job or run inside a Slurm job")
    from bootseer.agentapi.jobs import FirstStep

    resp = _client(None).ask(FirstStep(job))
    print(f"job {job}: first step marked; {resp.recorded_blocks} blocks read during startup")
    return 0


def _status(args: argparse.Namespace) -> int:
    from bootseer.agentapi.jobs import Stats, Status

    client = _client(args.node)
    reply = client.ask(Status(args.job)) if args.job else client.ask(Stats())
    print(json.dumps(reply.to_wire(), indent=1))
    return 0
