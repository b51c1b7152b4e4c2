"""Transparent huge pages for XLA's CPU buffers: a start-up setting that entry points apply.

XLA's CPU runtime allocates each call's temporaries afresh (one block of ~290 MB for
:func:`foldax.layers.pair_probs` at 1,000 nt) with glibc's ``malloc``. Where the kernel gives
transparent huge pages only on request (``madvise`` in
``/sys/kernel/mm/transparent_hugepage/enabled``, the usual default), glibc asks for them only
when the process starts with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``; otherwise the DP's
passes over its charts run on 4 KB pages and pay TLB misses. With the setting, ``pair_probs``
at 1,000 nt ran 1.1x faster and the forward pass 1.3x (BENCHMARKS.md, "Huge pages"); results
are bit-identical.

The dynamic loader reads the setting once, so a running process cannot turn it on for itself.
The ``foldax`` command and the benchmarks therefore re-execute themselves with it at start-up
(:func:`reexec_with_huge_pages`), before anything is imported or printed. From your own
script, start Python with the variable set::

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python my_script.py

``FOLDAX_HUGE_PAGES=0`` in the environment turns the re-execution off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["TUNABLE", "OPT_OUT", "REEXECUTED", "thp_mode", "wanted", "environment", "reexec_with_huge_pages"]

#: The glibc tunable that makes ``malloc`` advise huge pages for its large blocks.
TUNABLE = "glibc.malloc.hugetlb=1"
#: Set to ``0`` to keep an entry point from re-executing itself.
OPT_OUT = "FOLDAX_HUGE_PAGES"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
#: Set in the re-executed process: never a second time, even where the loader drops the tunable
#: (setuid programs' secure mode removes ``GLIBC_TUNABLES`` from the environment).
REEXECUTED = "FOLDAX_HUGE_PAGES_REEXECUTED"


def thp_mode(path: str = THP_SETTING) -> str | None:
    """The kernel's transparent-huge-page mode (``always``, ``madvise`` or ``never``), or None
    where it cannot be read (not Linux, no such file)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def _glibc() -> bool:
    """glibc 2.35 or later (the first with the tunable; older ones ignore it)."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        return name == "glibc" and tuple(int(v) for v in version.split(".")[:2]) >= (2, 35)
    except (AttributeError, ValueError, OSError):
        return False


_THIS_MACHINE = object()


def wanted(environ: Mapping[str, str] | None = None, *, mode=_THIS_MACHINE, glibc=_THIS_MACHINE) -> bool:
    """Whether re-executing with :data:`TUNABLE` would change anything: glibc, huge pages on
    request only (``madvise``; with ``always`` every large block gets them anyway, with ``never``
    none can), the tunable not set yet, and no opt-out (:data:`OPT_OUT` ``=0``). ``mode`` and
    ``glibc`` default to this machine's (:func:`thp_mode`)."""
    environ = os.environ if environ is None else environ
    mode = thp_mode() if mode is _THIS_MACHINE else mode
    glibc = _glibc() if glibc is _THIS_MACHINE else glibc
    if environ.get(OPT_OUT, "").strip() == "0" or REEXECUTED in environ or not glibc or mode != "madvise":
        return False
    return "glibc.malloc.hugetlb" not in environ.get("GLIBC_TUNABLES", "")


def environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``environ`` with :data:`TUNABLE` added to ``GLIBC_TUNABLES`` (kept: the user's own
    tunables) and the :data:`REEXECUTED` mark."""
    env = dict(os.environ if environ is None else environ)
    current = env.get("GLIBC_TUNABLES", "")
    env["GLIBC_TUNABLES"] = f"{current}:{TUNABLE}" if current else TUNABLE
    env[REEXECUTED] = "1"
    return env


def reexec_with_huge_pages() -> None:
    """Replaces this process by the same command started with :data:`TUNABLE`, when
    :func:`wanted`; otherwise (or if ``exec`` fails) returns and the process goes on as it was.

    For entry points only, first thing: nothing the process did so far survives the ``exec``
    (its open files, stdin included, do). The command is ``sys.orig_argv`` with Python itself
    (``sys.executable``), so the interpreter's own options and ``-m``/script come back as given.
    """
    if not wanted():
        return
    argv = [sys.executable, *sys.orig_argv[1:]]
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, argv, environment())
    except OSError:
        return
