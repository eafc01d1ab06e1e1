"""``python -m dew.main`` with tensorflow-datasets' mock data standing in for a tfds data set.

    python experiments/tfds_mock_run.py --num_examples=64 -- \
        --config=experiments/edm_paper.py:cifar10-cond-ddpmpp --workdir=runs/c10_reduced ...

Everything after ``--`` goes to ``dew.main`` unchanged; inside, ``tfds.data_source`` returns
``tfds.testing.mock_data``'s records (random uint8 images of the data set's shape, random labels;
``num_examples`` per split), so the real config, data source, trainer, checkpoints and resume run
on a machine without the data set. For checking a configuration's code path at reduced size
(``experiments/RESULTS.md``, "The paper's CIFAR-10 configuration at reduced size"), not for
results: the images are noise.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("tfds_mock_run.py: expected '--' before the arguments for dew.main", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--num_examples", type=int, default=64, help="mock records per split")
    args = parser.parse_args(argv[:split])
    if args.num_examples < 1:
        print(f"tfds_mock_run.py: --num_examples={args.num_examples}: expected an int >= 1", file=sys.stderr)
        return 2

    import tensorflow_datasets as tfds

    from dew import main as dew_main

    with tfds.testing.mock_data(num_examples=args.num_examples):
        return dew_main.main(argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
