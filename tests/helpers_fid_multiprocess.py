"""One process of the two-process FID draw (tests/system/test_fid_protocol.py starts two).

argv: process_id, coordinator port, outdir (shared), output .npz. Each process has 2 CPU
devices; the draw's mesh spans the 4 devices of both, each process builds its own devices'
seeds, and both end with the whole draw's sums."""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, port, outdir, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

import numpy as np  # noqa: E402

from tests.system.test_fid_protocol import _draw, build_model  # noqa: E402

assert jax.process_count() == 2 and jax.device_count() == 4
sums = _draw(build_model(), outdir, None).run()
assert sums is not None  # no max_chunks: the draw runs to the end
assert sums.total is not None and sums.outer is not None  # it drew features
np.savez(out, count=sums.count, total=sums.total, outer=sums.outer)
