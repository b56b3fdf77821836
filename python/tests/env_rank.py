# SPDX-License-Identifier: Apache-2.0
"""One rank of the from_env test: Comm.from_env() under torchrun's variables; prints the
status name, the seconds it took and the message, on one line."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import reshard  # noqa: E402

t0 = time.monotonic()
try:
    with reshard.Comm.from_env() as comm:
        print("OK %.1f rank %d" % (time.monotonic() - t0, comm.rank), flush=True)
except reshard.ReshardError as e:
    print("%s %.1f %s" % (e.name, time.monotonic() - t0, e.message), flush=True)
