"""foldax installs as one import namespace (issue 13): ``foldax.layers``, ``foldax.model``, ...

* Importing every module of the package never loads a bare ``layers`` / ``train`` / ... module
  (a second copy of a module under another name would split its state, e.g. registries).
* (slow) The wheel, installed into a fresh virtual environment outside the repository, puts only
  ``foldax`` into site-packages, and ``foldax fold``, ``--config default`` and the README's
  Python examples (the ten-line API example, the Turner model's) work there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BARE = ("layers", "model", "train", "configs", "data")

IMPORT_ALL = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys
    import foldax
    names = []
    for package in ["foldax"] + ["foldax." + sub for sub in foldax._SUBPACKAGES]:
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
                names.append(info.name)
    bare = sorted(m for m in sys.modules if m.split(".")[0] in %r)
    print(json.dumps({"imported": names, "bare": bare, "api": callable(foldax.log_partition)}))
    """ % (BARE,))


def _run(python, code, cwd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(JAX_PLATFORMS="cpu", FOLDAX_CACHE_DIR="")
    proc = subprocess.run([str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
                          **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_module_imports_under_foldax_only(tmp_path):
    out = json.loads(_run(sys.executable, IMPORT_ALL, tmp_path).strip().splitlines()[-1])
    assert out["bare"] == [], f"modules imported under a bare top-level name: {out['bare']}"
    for name in ("foldax.layers.chart", "foldax.model.models", "foldax.train.train", "foldax.configs.turner",
                 "foldax.data.archiveii.archiveii_dataset_builder", "foldax.cli"):
        assert name in out["imported"]
    assert out["api"]


def _readme_api_example() -> str:
    """Every Python block of the README, in order (the ten-line API example first)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## API in ten lines"):]
    return "\n".join(re.findall(r"```python\n(.*?)```", section, re.S))


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_outside_the_repository(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("foldax-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(_run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])", tmp_path).strip())
    # The dependencies come from this environment's site-packages (as a plain path entry: its .pth files,
    # among them the editable install of this checkout, are not processed there).
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=600)

    top = sorted(p.name for p in site.iterdir() if p.name not in ("deps.pth", "__pycache__")
                 and not p.name.startswith(("pip", "_distutils_hack", "distutils-precedence", "setuptools")))
    assert [name for name in top if not name.startswith("foldax")] == [], top
    assert {name for name in top} == {"foldax", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
                                      + ".dist-info"}, top

    work = tmp_path / "elsewhere"
    work.mkdir()
    out = json.loads(_run(python, IMPORT_ALL, work).strip().splitlines()[-1])
    assert out["bare"] == [] and "foldax.layers.chart" in out["imported"]
    where = _run(python, "import foldax.layers; print(foldax.layers.__file__)", work).strip()
    assert where.startswith(str(site)), where
    missing = _run(python, "import os; from foldax.layers import params_io as p; "
                           "print([n for n in p.shipped_params() if p.shipped_file(n) and not os.path.isfile(p.shipped_file(n))])",
                   work).strip()
    assert missing == "[]", missing  # every shipped parameter set's file is in the wheel

    fold = subprocess.run([str(venv / "bin" / "foldax"), "fold", "GGGGAAACCCCAUAUGCGCAUAU"], cwd=work,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "FOLDAX_CACHE_DIR": "", "JAX_PLATFORMS": "cpu"})
    assert fold.returncode == 0, fold.stderr[-3000:]
    assert re.fullmatch(r">seq1\nGGGGAAACCCCAUAUGCGCAUAU\n[().]{23} \( *-?\d+\.\d\d\)\n", fold.stdout), fold.stdout

    config = _run(python, "from foldax.train.main import resolve_config_file as r; print(r('default'), r('turner'))",
                  work).split()
    assert all(path.startswith(str(site)) and os.path.isfile(path) for path in config), config

    api = _run(python, _readme_api_example() + "\nprint('API OK', float(log_z), float(mfe))", work)
    assert "API OK" in api
