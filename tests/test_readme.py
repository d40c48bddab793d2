"""The README's promises: its two set-up commands are CI's, and its code runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

INSTALL = "pip install . && codl-tvm demo"
TEST = 'pip install -e ".[test]" && ruff check . && pytest -q -p no:cacheprovider'


def test_set_up_commands_are_cis():
    assert INSTALL in README and TEST in README
    # CI runs the same command, with a quieter pip
    ci = (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ")
    assert TEST in ci


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


DOCS = ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve(doc):
    """Every relative link of the README and docs/ names a file of the tree, and an anchor a
    heading of that file."""
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    for target, anchor in re.findall(r"\]\(([^)#:\s]*)(?:#([^)\s]+))?\)", path.read_text()):
        linked = (path.parent / target).resolve() if target else path
        assert linked.exists(), f"{doc}: {target}"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{doc}: {target}#{anchor}"


def test_readme_is_short():
    """A newcomer reads the README top to bottom: at most 250 lines."""
    assert len(README.splitlines()) <= 250


def test_command_table_is_the_clis():
    """The README's command table lists every ``codl-tvm`` command and no other, and the README
    runs the library only through the CLI (no ``python -m codl_tvm...``)."""
    from codl_tvm.cli import COMMANDS

    section = README.split("## The command line", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `codl-tvm ([a-z-]+)", section, re.M)
    assert set(rows) == {name for _, names in COMMANDS for name in names}
    assert "python -m codl_tvm" not in README


@pytest.mark.opencl
def test_pass_api_snippet_runs_and_matches_the_unpartitioned_model():
    (snippet,) = re.findall(r"```python\n(.*?)```", README, re.S)
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)

    import tvm
    from tvm.runtime.vm import VirtualMachine

    from codl_tvm.build.pipeline import single_device_pipeline

    cpu, model, x = scope["cpu"], scope["model"], scope["x"]
    ref = tvm.compile(model.mod, target=cpu, relax_pipeline=single_device_pipeline(cpu))
    expected = VirtualMachine(ref, tvm.cpu(0))["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(scope["y"], expected, rtol=1e-5, atol=1e-5)
