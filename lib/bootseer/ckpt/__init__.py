"""Striped checkpoint storage: files cut into units over K targets, read in parallel.

The Python API::

    from bootseer.ckpt import Namespace
    ns = Namespace.from_config(load_config(), "ada/llama-25b")
    with ns.open("step100/model.pt", "wb") as f:
        torch.save(state, f)
    with ns.open("step100/model.pt") as f:
        state = torch.load(f)

Jobs use the FUSE mount instead (``--bootseer-ckpt=NAMESPACE``, ``$BOOTSEER_CKPT``),
which serves the same namespace with the same reader and writer.
"""

from bootseer.ckpt.errors import CkptError, CkptIOError, CkptPathError
from bootseer.ckpt.manifest import Manifest
from bootseer.ckpt.names import check_path, namespace_name
from bootseer.ckpt.namespace import Entry, Namespace
from bootseer.errors import ManifestError

__all__ = [
    "CkptError",
    "CkptIOError",
    "CkptPathError",
    "Entry",
    "Manifest",
    "ManifestError",
    "Namespace",
    "check_path",
    "namespace_name",
]
