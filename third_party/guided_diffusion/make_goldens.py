"""Write ``evaluator_goldens.npz`` and ``reference_batch.npz``: outputs of openai/guided-diffusion's
own ``evaluations/evaluator.py`` on deterministic feature sets, for ``tests/test_adm_evaluator.py``.

    /work/venvs/adm/bin/python third_party/guided_diffusion/make_goldens.py \
        --evaluator=/tmp/ref-adm/evaluations --out=third_party/guided_diffusion

``--evaluator`` is the folder of a checkout's ``evaluations/evaluator.py`` (imported from there;
nothing of it is copied here). The Inception graph ``classify_image_graph_def.pb`` is a
download this machine cannot make, so both sides get identical inputs instead of images:

* features from ``third_party/pytorch_fid/weights.py``'s integer-hash formula (NumPy only,
  identical on every machine; the test rebuilds them): ``features(name, n, d)``;
* a stand-in ``classify_image_graph_def.pb`` written into a temporary working directory, where
  the evaluator looks for it: a graph with the tensor names the evaluator imports
  (``ExpandDims``, ``pool_3``, ``mixed_6/conv``) and ``softmax/logits/MatMul`` whose weight input
  is the classifier ``fc.weight.T`` of that formula times ``CLASSIFIER_SCALE`` (8) (the
  evaluator's ``_create_softmax_graph`` reads that input and builds its own ``matmul`` and
  ``softmax``). ``Evaluator(session)`` is built by the evaluator's own ``__init__`` on it.

What is computed, all by the evaluator's code:

* ``fid/*``: ``compute_statistics`` and ``FIDStatistics.frechet_distance`` for pool-like sets
  [3000, 2048] vs [2500, 2048] and spatial-like sets [3000, 2023] vs [2500, 2023];
* ``is/*``: ``compute_inception_score`` (its TF softmax of ``pool @ fc.weight.T``) with the
  default ``split_size`` (one split of 3000) and with 700 (four splits of 700 and one of 200),
  and the softmax rows of the first 64 images (``softmax_head``);
* ``pr/*``: ``compute_prec_recall`` (``ManifoldEstimator`` and ``DistanceBlock``, float16 path)
  on [400, 2048] vs [300, 2048], with the radii and the distance matrix
  ``DistanceBlock.pairwise_distances(ref, samples)``; ``pr_blocks/*``: the same through a
  ``ManifoldEstimator(row_batch_size=128, col_batch_size=96)``; ``pr_f32/*``: features scaled
  ×16 so the float16 norms overflow and every block takes the float32 path;
* ``reference_batch.npz``: a reference batch in ADM's layout (``arr_0`` 6 uint8 images 12×10,
  ``mu``/``sigma``/``mu_s``/``sigma_s`` from features nonzero in 16 columns, so the file
  compresses: ``np.savez_compressed``, which the evaluator's readers read as they read
  ``np.savez``), and in the goldens what the evaluator's
  ``read_statistics`` and ``open_npz_array(...).read_batches`` return for it.

numpy >= 1.24 has no ``np.bool``, which ``ManifoldEstimator.evaluate_pr`` uses; the script sets
``np.bool = bool`` (the alias it was) before calling it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent


def _weights_module():
    spec = importlib.util.spec_from_file_location("w", HERE.parent / "pytorch_fid" / "weights.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def features(name: str, n: int, d: int, scale: float = 1.0) -> np.ndarray:
    """Non-negative float32 [n, d] rows with per-row scales in [0.5, 1.5) and a cluster
    structure (every row is 0.6 · its own draw + 0.4 · one of 8 shared centres), like pooled
    ReLU features; from the hash formula alone."""
    gen = _weights_module()
    own = np.abs(gen.conv_weight(name, (n, d))) * np.float32(np.sqrt(d / 6.0))  # |U(-1, 1)|
    centres = np.abs(gen.conv_weight("centres", (8, d))) * np.float32(np.sqrt(d / 6.0))
    which = (np.arange(n) * 5) % 8
    rows = 0.6 * own + 0.4 * centres[which]
    row_scale = 0.5 + np.abs(gen.conv_weight(name + "/scale", (n, 1)))[:, 0] * np.sqrt(1 / 6.0)
    return (rows * row_scale[:, None] * scale).astype(np.float32)


CLASSIFIER_SCALE = 8.0  # logits of a few units, so the Inception Score is well above 1


def classifier() -> np.ndarray:
    return _weights_module().conv_weight("fc.weight", (1008, 2048)) * np.float32(CLASSIFIER_SCALE)


def stand_in_graph(path: str) -> None:
    import tensorflow.compat.v1 as tf

    graph = tf.Graph()
    with graph.as_default():
        images = tf.placeholder(tf.float32, [None, None, None, 3], name="ExpandDims")
        pooled = tf.reduce_mean(images, axis=[1, 2], keepdims=True)
        tf.identity(tf.tile(pooled, [1, 1, 1, 683])[..., :2048], name="pool_3")
        tf.identity(tf.tile(pooled, [1, 17, 17, 64]), name="mixed_6/conv")
        weights = tf.constant(classifier().T, name="softmax/weights")
        with tf.name_scope("softmax/logits/"):
            tf.matmul(tf.reshape(pooled[..., :1], [-1, 1]) * tf.ones([1, 2048]), weights, name="MatMul")
    with open(path, "wb") as f:
        f.write(graph.as_graph_def().SerializeToString())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--evaluator", required=True, help="folder holding evaluator.py")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out_dir = os.path.abspath(args.out)
    sys.path.insert(0, os.path.abspath(args.evaluator))
    import tensorflow.compat.v1 as tf

    tf.disable_eager_execution()
    import evaluator as ev

    np.bool = bool  # removed from numpy 1.24; evaluate_pr uses it as the alias of bool it was

    goldens: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the evaluator reads classify_image_graph_def.pb from the working directory
        stand_in_graph(ev.INCEPTION_V3_PATH)
        session = tf.Session()
        evaluator = ev.Evaluator(session)

        for kind, d in (("pool", 2048), ("spatial", 2023)):
            a, b = features(f"{kind}/ref", 3000, d), features(f"{kind}/sample", 2500, d)
            sa, sb = evaluator.compute_statistics(a), evaluator.compute_statistics(b)
            goldens[f"fid/{kind}"] = np.float64(sb.frechet_distance(sa))
            goldens[f"fid/{kind}/mu"] = sb.mu
            print(kind, "FD", goldens[f"fid/{kind}"], "mu dtype", sb.mu.dtype)

        acts = features("is/pool", 3000, 2048)
        goldens["is/default"] = np.float64(evaluator.compute_inception_score(acts))
        goldens["is/split700"] = np.float64(evaluator.compute_inception_score(acts, split_size=700))
        goldens["is/softmax_head"] = session.run(evaluator.softmax, {evaluator.softmax_input: acts[:64]})
        print("IS", goldens["is/default"], goldens["is/split700"])

        for case, scale, estimator in (
            ("pr", 1.0, evaluator.manifold_estimator),
            ("pr_blocks", 1.0, ev.ManifoldEstimator(session, row_batch_size=128, col_batch_size=96)),
            ("pr_f32", 16.0, evaluator.manifold_estimator),
        ):
            ref = features("pr/ref", 400, 2048, scale)
            sample = features("pr/sample", 300, 2048, scale)
            radii_1, radii_2 = estimator.manifold_radii(ref), estimator.manifold_radii(sample)
            precision, recall = estimator.evaluate_pr(ref, radii_1, sample, radii_2)
            goldens[f"{case}/precision"], goldens[f"{case}/recall"] = precision, recall
            goldens[f"{case}/radii_ref"], goldens[f"{case}/radii_sample"] = radii_1, radii_2
            if case != "pr_blocks":
                goldens[f"{case}/distances"] = estimator.distance_block.pairwise_distances(ref, sample)
            if case == "pr":
                assert (precision[0], recall[0]) == evaluator.compute_prec_recall(ref, sample)
            print(case, "precision", precision, "recall", recall)

        rng = np.random.default_rng(44)
        images = rng.integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)
        # features zero but in 16 columns: the [D, D] covariances compress to a few KB
        pool, spatial = np.zeros((6, 2048), np.float32), np.zeros((6, 2023), np.float32)
        pool[:, :16], spatial[:, :16] = features("batch/pool", 6, 16), features("batch/spatial", 6, 16)
        stats = [evaluator.compute_statistics(x) for x in (pool, spatial)]
        batch = os.path.join(out_dir, "reference_batch.npz")
        np.savez_compressed(
            batch,
            arr_0=images,
            mu=stats[0].mu,
            sigma=stats[0].sigma,
            mu_s=stats[1].mu,
            sigma_s=stats[1].sigma,
        )
        read = evaluator.read_statistics(batch, (None, None))
        goldens["batch/mu"], goldens["batch/mu_s"] = read[0].mu, read[1].mu
        with ev.open_npz_array(batch, "arr_0") as reader:
            goldens["batch/read_batches_4"] = np.concatenate(list(reader.read_batches(4)))
    np.savez_compressed(os.path.join(out_dir, "evaluator_goldens.npz"), **goldens)
    print(f"wrote {len(goldens)} arrays")


if __name__ == "__main__":
    main()
