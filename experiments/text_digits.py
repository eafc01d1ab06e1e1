"""Text-conditioned digits: does "a handwritten seven" draw sevens?

Trains (once; a later call reuses the checkpoint) ``experiments/edm.py`` on ``digits_text``:
every training digit carries a caption from six templates ("a handwritten seven", "the digit
seven", "seven", "a seven", "handwritten 7", "the number 7"), read as raw UTF-8 bytes by the
``byte_text`` encoder trained jointly with the U-Net (condition dropout 0.1, so the empty prompt
is the unconditional branch). Then samples ``--per_prompt`` digits per prompt from the debiased
EMA and asks the independent RBF-SVM (``dew/scoring/digits_classifier.py``) what they show.

    PYTHONPATH=. .venv/bin/python experiments/text_digits.py --workdir=runs/text_digits
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dew.config import apply_overrides, load_config
from dew.data.sources.digits import CAPTION_LENGTH, WORDS
from dew.encoding.byte_text import tokenize
from dew.sampling import CFG
from dew.scoring.digits_classifier import classify_digits
from dew.training.trainer import Trainer

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workdir", default="runs/text_digits")
    parser.add_argument("--train_steps", type=int, default=1500)
    parser.add_argument("--per_prompt", type=int, default=100)
    parser.add_argument("--points", type=int, default=18)
    parser.add_argument("--guidance", type=float, default=1.0)
    args = parser.parse_args()

    config = apply_overrides(
        load_config(str(HERE / "edm.py")),
        [
            "config.dataset.name=digits_text",
            "config.objective.condition_dropout=0.1",  # --guidance needs the unconditional branch
            f"config.train.num_steps={args.train_steps}",
            "config.eval.every=0",
            "config.preview.every=0",
            f"config.checkpoint.every={args.train_steps}",
        ],
    )
    trainer = Trainer(config, args.workdir)
    start = time.perf_counter()
    state = trainer.run()
    print(
        f"model: step {int(state.step)} ({time.perf_counter() - start:.0f} s incl. compiles), {args.workdir}"
    )
    params = trainer.debiased_ema(state)
    guidance = CFG(weight=args.guidance) if args.guidance != 1.0 else None

    @jax.jit
    def draw(tokens, rng):
        rows = jnp.broadcast_to(tokens, (args.per_prompt, CAPTION_LENGTH))
        return trainer.objective.generate(params, rng, {"label": rows}, steps=args.points, guidance=guidance)

    prompts = [("a handwritten seven", 7), ("seven", 7), ("the number 7", 7)]
    prompts += [(f"a handwritten {w}", c) for c, w in enumerate(WORDS) if c != 7]
    print("| prompt | classified as asked | most common classes |\n|---|---|---|")
    agree = []
    for i, (prompt, wanted) in enumerate(prompts):
        images = np.asarray(draw(jnp.asarray(tokenize(prompt, CAPTION_LENGTH)), jax.random.PRNGKey(i)))
        predicted = classify_digits(np.clip(images, -1, 1))
        share = float(np.mean(predicted == wanted))
        if prompt.startswith("a handwritten"):
            agree.append(share)
        top = ", ".join(f"{c}: {n}" for c, n in collections.Counter(predicted.tolist()).most_common(3))
        print(f"| {prompt!r} | {share:.0%} | {top} |")
    print(f"mean over the ten 'a handwritten <digit>' prompts: {np.mean(agree):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
