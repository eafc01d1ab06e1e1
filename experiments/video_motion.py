"""Does the video model move its digits? Generated clips against real validation clips.

    PYTHONPATH=. python experiments/video_motion.py --workdir=runs/video [--per_class=10] [--guidance=1.0]

Loads the run with ``dew.pipeline`` (debiased EMA of the latest checkpoint), draws
``per_class`` clips of every class, and prints, for generated and real clips
(``dew.scoring.motion.motion_statistics``): per-frame accuracy of the independent
digit classifier on the window around each frame's centre of brightness, the share of clips
whose frames all read as one digit, the mean frame-to-frame displacement of that centre and its
deviation from constant-velocity motion. A model that draws a still digit has displacement ~0;
one that draws unrelated frames has a large constant-velocity error. Writes the generated GIF
beside the run (``<workdir>/samples/motion_clips.gif``).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--per_class", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--guidance", type=float, default=None, help="CFG weight (default: the run's)")
    args = parser.parse_args()

    import dew
    from dew.data.sources.moving_digits import moving_digits
    from dew.scoring.motion import motion_statistics
    from dew.tracking.media import write_gif

    task = dew.pipeline(args.workdir)
    options = {} if args.guidance is None else {"guidance": args.guidance}
    clips = task(per_class=args.per_class, seed=args.seed, **options)
    labels = np.repeat(np.arange(10), args.per_class)
    generated = motion_statistics(clips.clips, labels)
    real = moving_digits("validation")
    reference = motion_statistics(real.fields["video"], real.fields["label"])
    guidance = "the run's guidance" if args.guidance is None else f"guidance {args.guidance}"
    print(f"run {args.workdir}, step {task.step}, {guidance}: {len(labels)} generated, {len(real)} real")
    print("| statistic | generated | real |\n|---|---|---|")
    for key in ("frame_accuracy", "identity_consistency", "mean_displacement", "constant_velocity_error"):
        print(f"| {key} | {generated[key]:.3f} | {reference[key]:.3f} |")
    path = write_gif(os.path.join(args.workdir, "samples", "motion_clips.gif"), clips)
    print(f"clips: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
