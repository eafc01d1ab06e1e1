"""Write ``pr_float32_goldens.npz``: openai/guided-diffusion's own ``evaluations/evaluator.py``
precision and recall with every distance block on its float32 branch, for
``tests/test_adm_evaluator.py``'s check of dew's ``arithmetic="float32"`` mode.

    /tmp/tfvenv/bin/python third_party/guided_diffusion/make_float32_goldens.py \
        --evaluator=/tmp/ref-adm/evaluations --out=third_party/guided_diffusion

The evaluator's ``DistanceBlock`` computes ``_batch_pairwise_distances`` on float16 casts and
falls back to the same function on the float32 inputs (``tf.cond``) when a float16 value is not
finite. Here its ``__init__`` builds the graph while ``_batch_pairwise_distances`` adds +inf to
its float16 result (its float32 result untouched), so the ``tf.cond`` takes the float32 branch
for every block: the evaluator's own float32 arithmetic, the one it uses itself whenever float16
overflows, on features where it would otherwise use float16. Everything else (``ManifoldEstimator``
with its blocks, ``manifold_radii``, ``evaluate_pr``, ``less_thans``) is the evaluator's code as
it is. Features are ``make_goldens.features`` (the integer-hash formula; the test rebuilds them).

* ``f32/*``: [400, 2048] references vs [300, 2048] samples, the sets of ``make_goldens``' ``pr``
  case: ``precision``, ``recall``, ``radii_ref``, ``radii_sample`` and the float32 distance matrix
  ``pairwise_distances(ref, samples)``;
* ``f32_large/*``: [1500, 2048] vs [1500, 2048] from the same cluster structure (overlapping
  sets): ``precision``, ``recall``, ``radii_ref``, ``radii_sample``.

numpy >= 1.24 has no ``np.bool``, which ``evaluate_pr`` uses; it is set to ``bool`` first.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys
import tempfile
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
CASES = (
    ("f32", ("pr/ref", 400), ("pr/sample", 300), True),
    ("f32_large", ("pr32/ref", 1500), ("pr32/sample", 1500), False),
)


def _make_goldens():
    spec = importlib.util.spec_from_file_location("adm_goldens", HERE / "make_goldens.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--evaluator", required=True, help="folder holding evaluator.py")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out_dir = os.path.abspath(args.out)
    make = _make_goldens()
    sys.path.insert(0, os.path.abspath(args.evaluator))
    import tensorflow.compat.v1 as tf

    tf.disable_eager_execution()
    import evaluator as ev

    np.bool = bool  # type: ignore[attr-defined]  # removed from numpy 1.24; evaluate_pr uses it

    goldens: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        session = tf.Session()
        original = ev._batch_pairwise_distances

        def float16_reported_infinite(u, v):
            d = original(u, v)
            return d + tf.constant(np.inf, tf.float16) if u.dtype == tf.float16 else d

        ev._batch_pairwise_distances = float16_reported_infinite
        estimator = ev.ManifoldEstimator(session)  # its DistanceBlock's graph is built now
        ev._batch_pairwise_distances = original

        for case, (ref_name, n_ref), (sample_name, n_sample), keep_distances in CASES:
            ref = make.features(ref_name, n_ref, 2048)
            sample = make.features(sample_name, n_sample, 2048)
            radii_1, radii_2 = estimator.manifold_radii(ref), estimator.manifold_radii(sample)
            precision, recall = estimator.evaluate_pr(ref, radii_1, sample, radii_2)
            goldens[f"{case}/precision"], goldens[f"{case}/recall"] = precision, recall
            goldens[f"{case}/radii_ref"], goldens[f"{case}/radii_sample"] = radii_1, radii_2
            if keep_distances:
                d = estimator.distance_block.pairwise_distances(ref, sample)
                assert (d.astype(np.float16).astype(np.float32) != d).any()  # float32, not float16
                goldens[f"{case}/distances"] = d
            print(case, "precision", precision, "recall", recall)
    np.savez_compressed(os.path.join(out_dir, "pr_float32_goldens.npz"), **goldens)
    print(f"wrote {len(goldens)} arrays")


if __name__ == "__main__":
    main()
