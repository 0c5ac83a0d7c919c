"""The layering scripts/check holds (scripts/layering: pyproject.toml [tool.importlinter]
and scripts/layering.py): a library that imports a process package, two process packages
that import each other, an import cycle among siblings or between any two modules fails
the check, naming the import. Each planted into a copy of lib/bootseer, checked by the
same scripts/layering, with the same contracts, that scripts/check runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"


def lint(tmp_path: Path, plant: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """scripts/layering over a copy of lib/bootseer with ``plant`` (module path -> a line
    appended to it)."""
    lib = tmp_path / "lib"
    shutil.copytree(
        TOP / "lib" / "bootseer", lib / "bootseer", ignore=shutil.ignore_patterns("__pycache__")
    )
    for rel, line in plant.items():
        with open(lib / "bootseer" / rel, "a") as f:
            f.write(f"\n{line}\n")
    return subprocess.run(
        [str(TOP / "scripts" / "layering"), str(lib)],
        env={**os.environ, "BOOTSEER_VENV": sys.prefix},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev dependency")
def test_the_tree_keeps_its_layering(tmp_path: Path) -> None:
    r = lint(tmp_path, {})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout
    assert "no import cycle among the" in r.stdout, r.stdout


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev dependency")
@pytest.mark.parametrize(
    ("plant", "named"),
    [
        # A technique library reaching up into the agent (a function-level import counts).
        (
            {"image/blocks.py": "def _f() -> None:\n    import bootseer.agent.server  # noqa"},
            "bootseer.image.blocks -> bootseer.agent.server",
        ),
        # The base reaching into a library, under TYPE_CHECKING.
        (
            {"config.py": "if TYPE_CHECKING:\n    import bootseer.ckpt.layout  # noqa"},
            "bootseer.config -> bootseer.ckpt.layout",
        ),
        # Two process packages, which stay independent.
        (
            {"hooks/log.py": "import bootseer.ckptd.log  # noqa"},
            "bootseer.hooks.log -> bootseer.ckptd.log",
        ),
    ],
)
def test_an_import_against_the_layers_fails_the_check(
    tmp_path: Path, plant: dict[str, str], named: str
) -> None:
    r = lint(tmp_path, plant)
    assert r.returncode != 0, r.stdout
    assert "processes over technique libraries over the base BROKEN" in r.stdout, r.stdout
    assert named in r.stdout, r.stdout


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev dependency")
def test_a_cycle_among_siblings_fails_the_check(tmp_path: Path) -> None:
    # units is imported by progress; units importing progress back closes a cycle within
    # one layer, which only the acyclic-siblings contract sees.
    r = lint(tmp_path, {"units.py": "def _f() -> None:\n    import bootseer.progress  # noqa"})
    assert r.returncode != 0, r.stdout
    assert "no import cycles among the siblings of any package BROKEN" in r.stdout, r.stdout
    assert "processes over technique libraries over the base KEPT" in r.stdout
    assert ".units -> .progress" in r.stdout or ".progress -> .units" in r.stdout, r.stdout
    # scripts/layering.py names the cycle import by import, with its line.
    assert "import cycle among 2 modules: bootseer.progress, bootseer.units" in r.stdout
    assert "bootseer.units -> bootseer.progress   (bootseer/units.py l." in r.stdout, r.stdout
    assert "bootseer.progress -> bootseer.units" in r.stdout, r.stdout


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev dependency")
def test_a_cycle_through_a_packages_init_fails_the_check(tmp_path: Path) -> None:
    # ckpt/__init__ imports ckpt.names; names importing the package back is a cycle no
    # contract sees (the __init__ is no sibling), which Python meets as a partly
    # initialised module.
    plant = "def _f() -> None:\n    from bootseer.ckpt import Namespace  # noqa"
    r = lint(tmp_path, {"ckpt/names.py": plant})
    assert r.returncode != 0, r.stdout
    assert "2 kept, 0 broken" in r.stdout, r.stdout
    assert "bootseer.ckpt -> bootseer.ckpt.names   (bootseer/ckpt/__init__.py l." in r.stdout
    assert "bootseer.ckpt.names -> bootseer.ckpt   (bootseer/ckpt/names.py l." in r.stdout
