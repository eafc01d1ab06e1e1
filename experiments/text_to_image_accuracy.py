"""Does a text-to-image run draw the digit its caption names?

Loads the run with ``dew.pipeline`` (debiased EMA of the latest checkpoint), draws
``--per_prompt`` samples for each prompt "a handwritten <digit>" and for a few paraphrases the
training captions also use ("seven", "the number 7", "handwritten 3", ...), without guidance and
with the run's preview guidance (CFG weight and σ interval from its config), and asks the
independent RBF-SVM (``dew/scoring/digits_classifier.py``) what each shows.

    PYTHONPATH=. python experiments/text_to_image_accuracy.py --workdir=runs/text_to_image [--per_prompt=50]
"""

from __future__ import annotations

import argparse
import collections
import sys

import numpy as np

PARAPHRASES = (
    ("seven", 7),
    ("the number 7", 7),
    ("a seven", 7),
    ("handwritten 3", 3),
    ("the digit three", 3),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/text_to_image")
    parser.add_argument("--per_prompt", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    import dew
    from dew.data.sources.digits import WORDS
    from dew.scoring.digits_classifier import classify_digits

    task = dew.pipeline(args.workdir)
    sampling = task.config.objective.sampling
    run_guidance = {"guidance": sampling.guidance, "guidance_interval": tuple(sampling.guidance_interval)}
    prompts = [(f"a handwritten {word}", digit) for digit, word in enumerate(WORDS)]
    n = args.per_prompt
    print(f"run {args.workdir}, step {task.step}: {n} samples per prompt, Heun {sampling.steps} points")
    for label, options, asked in (
        ("no guidance", {"guidance": 1.0}, prompts),
        (f"the run's guidance {run_guidance}", run_guidance, prompts + list(PARAPHRASES)),
    ):
        grid = task(prompts=tuple(p for p, _ in asked for _ in range(n)), seed=args.seed, **options)
        predicted = classify_digits(np.asarray(grid.images)).reshape(len(asked), n)
        print(f"\n{label}\n| prompt | classified as asked | most common classes |\n|---|---|---|")
        for (prompt, digit), row in zip(asked, predicted, strict=True):
            common = ", ".join(f"{k}: {v}" for k, v in collections.Counter(row.tolist()).most_common(3))
            print(f"| {prompt!r} | {np.mean(row == digit):.0%} | {common} |")
        mean = np.mean(predicted[: len(prompts)] == np.arange(10)[:, None])
        print(f"mean over the ten 'a handwritten <digit>' prompts: {mean:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
