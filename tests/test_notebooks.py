"""The notebooks in notebooks/ run top to bottom.

Each notebook's source of truth is a jupytext percent-format script
(``notebooks/NN_name.py``); see ``notebooks/README.md``. Two kinds of checks:

* every notebook runs as a plain script in a fresh interpreter (``MPLBACKEND=Agg``,
  cwd = the repository root): the cheap, robust way to keep them working. The
  quickstart takes ~20 s on 2 cores; the others 30-50 s each and are marked ``slow``.
* (needs ``jupytext``, and ``nbclient`` + ``ipykernel`` for the second) each script
  parses as a notebook and round-trips through jupytext unchanged, and the quickstart
  executes in a real Jupyter kernel with its figures rendered inline (``slow``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ALL = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))
SLOW = {"02_training.py", "03_embedding.py", "04_performance.py"}  # > ~30 s each on 2 cores
TIMEOUT_S = 600  # generous: the machines running CI are small and shared


def _env():
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def test_the_notebooks_are_all_here():
    assert ALL == ["01_quickstart.py", "02_training.py", "03_embedding.py", "04_performance.py"]


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ALL]
)
def test_notebook_runs_as_a_script(name):
    proc = subprocess.run(
        [sys.executable, str(NOTEBOOKS / name)], cwd=ROOT, env=_env(), capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )
    if proc.returncode != 0:
        pytest.fail(f"{name} failed (exit {proc.returncode}):\n--- stdout ---\n{proc.stdout[-3000:]}"
                    f"\n--- stderr ---\n{proc.stderr[-6000:]}")


@pytest.mark.parametrize("name", ALL)
def test_notebook_is_canonical_jupytext(name):
    """The .py reads as a notebook (markdown + code cells, a kernelspec) and jupytext
    writes it back byte for byte, so editing it in Jupyter produces no spurious diff."""
    jupytext = pytest.importorskip("jupytext")
    text = (NOTEBOOKS / name).read_text()
    nb = jupytext.reads(text, fmt="py:percent")
    kinds = {cell.cell_type for cell in nb.cells}
    assert kinds == {"markdown", "code"}, kinds
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")  # a title
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert not any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")
    # Compare the cells only: the header's jupytext_version line may differ by installed version.
    body = lambda t: t.split("# ---\n", 2)[-1]  # noqa: E731
    assert body(jupytext.writes(nb, fmt="py:percent")) == body(text)


@pytest.mark.slow
def test_quickstart_executes_in_a_jupyter_kernel():
    """Converted with jupytext and executed by nbclient, as `jupyter execute` / nbmake do."""
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        pytest.skip("no 'python3' Jupyter kernelspec (python -m ipykernel install --sys-prefix)")
    nb = jupytext.read(NOTEBOOKS / "01_quickstart.py")
    client = nbclient.NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old]))  # the kernel inherits it
    try:
        client.execute()
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    images = [o for cell in nb.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 2  # the dot plot and the gradient heat map render inline
    errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
