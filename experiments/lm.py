"""A byte-level language model on the Python standard library's own source (offline everywhere).

    python -m dew.main --config=experiments/lm.py --workdir=runs/lm

Data: ``python_bytes`` (``dew/data/sources/python_bytes.py``): the interpreter's top-level
stdlib ``*.py`` files, every 10th file (sorted by name) held out; windows of 129 bytes (128
targets each; a document's first byte and padding weigh 0). Model: a 2-layer, 128-wide
decoder-only transformer (``byte_transformer``). Evaluation reports held-out ``bits_per_byte``;
previews continue fixed prompts (``TextSamples``) and score held-out rows byte by byte
(``TokenScores``, a heat-coloured HTML/PNG under the tracking directory). The unigram baseline
on the same split: ``dew.data.sources.python_bytes.unigram_bits_per_byte()``.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    config.dataset = ConfigDict({"name": "python_bytes", "batch_size": 16})
    config.objective = ConfigDict({"name": "language", "new_tokens": 96, "temperature": 0.8, "score_rows": 4})
    config.model = ConfigDict(
        {"name": "byte_transformer", "vocab": 256, "width": 128, "depth": 2, "heads": 4, "context": 128}
    )
    config.optimizer = ConfigDict({"learning_rate": 2e-3, "warmup_steps": 100, "grad_clip": 1.0})
    config.ema = ConfigDict({"decay": 0.99})
    config.train = ConfigDict({"num_steps": 700, "log_every": 50})
    config.eval = ConfigDict({"every": 350, "num_batches": 16})
    config.preview = ConfigDict({"every": 350})
    config.checkpoint = ConfigDict({"every": 350})
    return config
