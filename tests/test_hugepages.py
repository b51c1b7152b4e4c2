"""foldax.hugepages: when entry points re-execute themselves with glibc's huge-page tunable, and that it works."""

import json
import os
import subprocess
import sys

import pytest

from foldax import hugepages


def test_thp_mode_reads_the_bracketed_setting(tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert hugepages.thp_mode(str(setting)) == "madvise"
    setting.write_text("[always] madvise never\n")
    assert hugepages.thp_mode(str(setting)) == "always"
    setting.write_text("garbled\n")
    assert hugepages.thp_mode(str(setting)) is None
    assert hugepages.thp_mode(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("environ, mode, glibc, expected", [
    ({}, "madvise", True, True),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", True, True),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "madvise", True, False),  # already on: no loop
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", True, False),  # the user's own choice
    ({"FOLDAX_HUGE_PAGES": "0"}, "madvise", True, False),
    ({"FOLDAX_HUGE_PAGES_REEXECUTED": "1"}, "madvise", True, False),  # once only, tunable or not
    ({}, "always", True, False),
    ({}, "never", True, False),
    ({}, None, True, False),
    ({}, "madvise", False, False),  # not glibc (musl, macOS)
])
def test_wanted_only_where_it_changes_something(environ, mode, glibc, expected):
    assert hugepages.wanted(environ, mode=mode, glibc=glibc) is expected


def test_environment_keeps_the_users_tunables():
    env = hugepages.environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "PATH": "/bin"})
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "PATH": "/bin",
                   hugepages.REEXECUTED: "1"}
    assert hugepages.environment({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert not hugepages.wanted(hugepages.environment({"GLIBC_TUNABLES": ""}), mode="madvise", glibc=True)


CHILD = """
import ctypes, json, os, sys
from foldax import hugepages
hugepages.reexec_with_huge_pages()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 64 << 20
block = libc.malloc(ctypes.c_size_t(size))
ctypes.memset(block, 1, size)  # touched: backed by pages now
huge_kb = 0
with open("/proc/self/smaps_rollup") as f:
    for line in f:
        if line.startswith("AnonHugePages:"):
            huge_kb = int(line.split()[1])
print(json.dumps([os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], huge_kb]))
"""


def _run_child(env):
    out = subprocess.run([sys.executable, "-c", CHILD, "first arg", "--second"], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables and /proc: Linux only")
def test_reexec_sets_the_tunable_keeps_the_arguments_and_gives_huge_pages():
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", hugepages.OPT_OUT, hugepages.REEXECUTED)}
    tunables, args, huge_kb = _run_child(env)
    assert args == ["first arg", "--second"]  # the command line survives the exec
    if hugepages.wanted(env):
        assert tunables == hugepages.TUNABLE
        # (Without the tunable the process has none: 0 kB. One page is enough here, so that a
        # kernel short of free huge pages under a parallel test run cannot fail the test.)
        assert huge_kb > 0, "the tunable was set but malloc's 64 MB block got no huge page"
    else:  # nothing to gain here (THP always/never, not glibc): no exec
        assert tunables is None
    # Opted out: the process runs as it was started.
    tunables, args, _ = _run_child({**env, hugepages.OPT_OUT: "0"})
    assert tunables is None and args == ["first arg", "--second"]
