"""A plain `pip install .` (not editable) finds the shipped pair in `<prefix>/share/npspec`, without the source tree.

Builds the package into a fresh virtual environment (slow). That environment is made from the
base interpreter and sees the dependencies (numpy, safetensors, tokenizers, huggingface_hub)
installed in the environment running the tests, whether it is a virtualenv or not: their
directories are listed in a .pth file after the new environment's own site-packages. Listed as
plain directories, so the .pth files in them (such as an editable npspec) do not run there.
(The source-tree case, `pip install -e .`, is tests/test_sources.py.)
"""

import json
import os
import shutil
import site
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, run_python

pytestmark = pytest.mark.slow


def running_site_dirs():
    """The site-packages directories of the running environment (a virtualenv's, or the interpreter's and the
    user's)."""
    dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def test_non_editable_install_finds_shipped_pair(tmp_path):
    # a clean copy of what git would check out (no build/ or egg-info leftovers), built into a fresh venv
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "*.egg-info", "build", "__pycache__",
                                                             "checkpoints", "input.txt", "tests", "bench", "notes"))
    venv = tmp_path / "venv"
    r = run_python("-m", "venv", venv)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what is installed counts

    def inner(*argv):
        return subprocess.run([str(py), *map(str, argv)], capture_output=True, text=True, cwd=tmp_path, env=env)

    purelib = Path(inner("-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    assert purelib.is_relative_to(venv)
    (purelib / "running-environment.pth").write_text("".join(d + "\n" for d in running_site_dirs()))
    r = inner("-m", "pip", "install", "-q", "--no-deps", src)
    if r.returncode and "No module named" in r.stderr:
        pytest.skip(f"cannot build here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    shutil.rmtree(src)  # the installed copy must not need the source tree
    code = ("import json, npspec, tokenizers; from npspec.sources import shipped_dir; "
            "g = npspec.generate_text(npspec.load(role='target'), 'ROMEO:', draft=npspec.load(role='draft'), "
            "max_new_tokens=5); print(json.dumps([npspec.__file__, str(shipped_dir('shakespeare/draft')), len(g.ids), "
            "tokenizers.__file__, npspec.__version__]))")
    r = inner("-c", code)
    assert r.returncode == 0, r.stderr
    module, draft, n, dependency, module_version = json.loads(r.stdout)
    assert Path(module).is_relative_to(venv) and Path(draft) == venv / "share" / "npspec" / "shakespeare" / "draft"
    assert n == 5
    assert any(Path(dependency).is_relative_to(d) for d in running_site_dirs()), dependency
    r = subprocess.run([str(venv / "bin" / "npspec"), "--version"], capture_output=True, text=True, env=env)
    assert (r.returncode, r.stdout) == (0, f"npspec {module_version}\n"), r.stderr  # the console script
