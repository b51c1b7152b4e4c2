"""``python -m foldax.data.archiveii fetch``: ArchiveII on this machine (downloaded once if needed); prints its path.

Exit status: 0 (the path is printed), 3 when it cannot be downloaded now (offline: the
message says why), 1 when what was downloaded is not ArchiveII. ``--url`` downloads from
elsewhere (a mirror, a ``file://`` URL); ``--cache DIR`` keeps it in DIR instead of
:func:`foldax.data.archiveii.cache_root`.
"""

from __future__ import annotations

import argparse
import sys

from foldax.data import archiveii


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m foldax.data.archiveii", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("fetch",))
    parser.add_argument("--url", default=None, help=f"where to download from (default {archiveii.URL})")
    parser.add_argument("--cache", default=None, help="where to keep it (default: foldax.data.archiveii.cache_root())")
    args = parser.parse_args(argv)
    found = archiveii.default_path() if args.url is None and args.cache is None else None
    try:
        path = found or archiveii.fetch_archiveii(url=args.url, cache=args.cache)
    except archiveii.ArchiveIIUnavailable as err:
        print(f"ArchiveII: {err}", file=sys.stderr)
        return 3
    except ValueError as err:
        print(f"ArchiveII: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
