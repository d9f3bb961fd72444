"""hw.provenance: the one git revision and machine description that board reports, the CLI and bench/ record."""

import shutil
import subprocess

import pytest

from hw.provenance import UNKNOWN_REVISION, git_info, git_revision, machine_info

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git executable")


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


@needs_git
def test_outside_a_checkout_the_revision_is_unknown(tmp_path):
    assert git_info(repo=tmp_path) == {"revision": UNKNOWN_REVISION, "dirty": None, "describe": UNKNOWN_REVISION}
    assert git_revision(repo=tmp_path) is None


@needs_git
def test_dirty_follows_the_pathspec(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "hw/a.py")
    _git(tmp_path, "commit", "-q", "-m", "a")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert git_info(repo=tmp_path) == {"revision": sha, "dirty": False, "describe": sha}

    (tmp_path / "notes.txt").write_text("untracked\n")      # untracked files count, outside hw/ only there
    assert git_info(repo=tmp_path)["describe"] == sha + "-dirty"
    assert git_revision(paths=("hw",), repo=tmp_path) == sha

    (tmp_path / "hw" / "a.py").write_text("x = 2\n")
    assert git_revision(paths=("hw",), repo=tmp_path) == sha + "-dirty"


def test_machine_info_names_the_cpu():
    info = machine_info()
    assert {"platform", "machine", "cpu", "cpu_count", "memory_bytes", "python", "numpy"} <= info.keys()
    assert info["cpu_count"] >= 1
