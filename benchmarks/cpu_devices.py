"""``--devices N``: N XLA CPU devices (one per core), set before JAX starts.

Import this module before ``jax`` in a benchmark script: XLA reads the device count
from ``XLA_FLAGS`` only once, when the CPU backend starts.
"""

import os
import sys


def requested_devices(argv):
    """The value of ``--devices`` in ``argv`` (1 when absent)."""
    for k, a in enumerate(argv):
        if a == "--devices" and k + 1 < len(argv):
            return int(argv[k + 1])
        if a.startswith("--devices="):
            return int(a.split("=", 1)[1])
    return 1


DEVICES = requested_devices(sys.argv)
if DEVICES > 1:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
    ).strip()
