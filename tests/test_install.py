"""The shipped pair is found both from the source tree (pip install -e .) and from a plain `pip install .`."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npspec.models import shipped_dir

from conftest import ROOT


def test_source_tree_install_finds_shipped_pair():
    assert shipped_dir("shakespeare/target") == ROOT / "weights" / "shakespeare" / "target"


def test_non_editable_install_finds_shipped_pair(tmp_path):
    # a clean copy of what git would check out (no build/ or egg-info leftovers), built into a fresh venv
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "*.egg-info", "build", "__pycache__",
                                                             "checkpoints", "input.txt", "tests", "bench", "notes"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(src)],
                       capture_output=True, text=True)
    if r.returncode and "No module named" in r.stderr:
        pytest.skip(f"cannot build here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    shutil.rmtree(src)  # the installed copy must not need the source tree
    code = ("import json, npspec; from npspec.models import shipped_dir; "
            "g = npspec.generate_text(npspec.load(role='target'), 'ROMEO:', draft=npspec.load(role='draft'), max_new_tokens=5); "
            "print(json.dumps([npspec.__file__, str(shipped_dir('shakespeare/draft')), len(g.ids)]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    module, draft, n = json.loads(r.stdout)
    assert Path(module).is_relative_to(venv) and Path(draft) == venv / "share" / "npspec" / "shakespeare" / "draft"
    assert n == 5
