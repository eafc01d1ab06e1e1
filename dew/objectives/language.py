"""Next-byte prediction with a decoder-only transformer: teacher-forced cross-entropy, bits per
byte, token scores, and continuations of fixed prompts.

A batch has ``tokens`` [B, T + 1] (int32 ids) and ``weights`` [B, T]: the model reads
``tokens[:, :-1]`` and is scored on ``tokens[:, 1:]``, each target weighted 0 or 1 (0 for a
document's first token, which nothing in its document predicts, and for padding). The loss is
the weighted mean cross-entropy in nats; ``bits_per_byte`` is the same in bits.

Precision (``config.precision.compute``, ``docs/precision.md``): under bfloat16 the network
computes on its float32 parameters cast at use (``dew.contracts.precision.compute_in``; the
token ids stay int32) and its logits return to float32 before the log-softmax, so the
cross-entropy, its mean and the previews' sampling are float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from dew import registry
from dew.artifacts import TextSamples, TokenScores
from dew.contracts.objective import Aux, Batch, Objective, Params, Stats, Step
from dew.contracts.precision import compute_dtype_of, compute_in
from dew.inputs import Field, InputSpec
from dew.objectives.whole import BuiltWhole
from dew.schema import ConfigError, Key, Section, at_least

PROMPTS = ("import ", "def __init__(self", "class ", "    return ", "for i in range(", '"""Return the ')
"""The fixed prompts previews continue (the same every preview, so progress is comparable)."""


def decode(tokens: Sequence[int] | np.ndarray) -> str:
    """Byte ids as text (invalid UTF-8 shown as U+FFFD)."""
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def byte_piece(token: int) -> str:
    """How one byte shows in a token-score view: printable ASCII as itself, else its escape."""
    b = int(token)
    if 32 <= b < 127 or b in (9, 10):
        return chr(b)
    return f"\\x{b:02x}"


class LanguageModel(Objective, metaclass=BuiltWhole):
    """Autoregressive byte model. ``model`` builds the network ([B, T] ids -> [B, T, vocab]).

    ``score_rows`` (optional) are held-out batches rows (``tokens``, ``weights``) that the
    preview scores token by token (``TokenScores``); ``prompts`` are continued ``new_tokens``
    bytes at ``temperature`` (0: greedy) for the preview's ``TextSamples``. ``compute_dtype``
    (float32 or bfloat16) is the dtype the network computes in (module docstring).
    """

    precisions = ("float32", "bfloat16")

    def __init__(
        self,
        model: Callable[[], Callable[..., jax.Array]],
        context: int,
        vocab: int = 256,
        prompts: Sequence[str] = PROMPTS,
        new_tokens: int = 96,
        temperature: float = 0.8,
        score_rows: dict[str, np.ndarray] | None = None,
        compute_dtype: str = "float32",
    ):
        if temperature < 0:
            raise ValueError(f"LanguageModel: temperature must be >= 0, got {temperature}")
        longest = max((len(p.encode()) for p in prompts), default=0)
        if longest + new_tokens > context:
            raise ValueError(
                f"LanguageModel: prompts of up to {longest} bytes + new_tokens={new_tokens} exceed the "
                f"context of {context}"
            )
        self.input_spec = InputSpec(Field("tokens", (context + 1,), "int32"))
        self.context, self.vocab = context, vocab
        self.prompts, self.new_tokens, self.temperature = tuple(prompts), new_tokens, temperature
        self.score_rows = score_rows

        def forward(tokens: jax.Array, is_training: bool) -> jax.Array:
            return model()(tokens, is_training=is_training)

        self._net = hk.transform(forward)
        self.compute_dtype = jnp.dtype(compute_dtype)
        self._apply = compute_in(self._net.apply, self.compute_dtype)  # the precision policy

    # --- pure pieces ----------------------------------------------------------------------------
    def logits(
        self, params: Params, tokens: jax.Array, rng: jax.Array | None = None, is_training: bool = False
    ):
        """[B, T] token ids -> [B, T, vocab] logits, float32 under every policy."""
        return self._apply(params, rng, tokens, is_training)

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        return self._net.init(rng, batch["tokens"][:, :-1], True)

    def token_losses(self, params: Params, batch: Batch, rng=None, is_training: bool = False) -> jax.Array:
        """Per-target cross-entropy [B, T] in nats (teacher-forced)."""
        tokens = batch["tokens"]
        chex.assert_rank(tokens, 2)
        chex.assert_shape(batch["weights"], (tokens.shape[0], tokens.shape[1] - 1))
        logits = self.logits(params, tokens[:, :-1], rng, is_training)
        log_p = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return -jnp.take_along_axis(log_p, tokens[:, 1:, None], axis=-1)[..., 0]

    def loss(
        self, params: Params, rng: jax.Array, batch: Batch, step: Step
    ) -> tuple[jax.Array, tuple[Stats, Aux]]:
        losses = self.token_losses(params, batch, rng, step.is_training)
        weights = batch["weights"].astype(jnp.float32)
        mean = jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)
        return mean, ({"bits_per_byte": mean / jnp.log(2.0), "targets": jnp.sum(weights)}, Aux())

    def generate(
        self,
        params: Params,
        rng: jax.Array,
        prompt_tokens: jax.Array,
        prompt_lengths: jax.Array,
        *,
        new_tokens: int,
        temperature: float = 0.8,
    ) -> jax.Array:
        """Continue each prompt row by ``new_tokens`` bytes, pure and jittable.

        ``prompt_tokens`` [B, P] holds each prompt left-aligned (anything after its length is
        ignored), ``prompt_lengths`` [B] (>= 1) their lengths. Returns [B, P + new_tokens]: row b
        is its prompt followed by its continuation (then zeros). Token t is drawn from the
        softmax of the logits at t − 1 divided by ``temperature`` (0: the argmax), with
        ``fold_in(rng, t)``; the whole loop is one ``lax.fori_loop``.
        """
        batch, width = prompt_tokens.shape[0], prompt_tokens.shape[1] + new_tokens
        if width > self.context:
            raise ValueError(
                f"generate: prompts of {prompt_tokens.shape[1]} + {new_tokens} exceed context {self.context}"
            )
        buffer = (
            jnp.zeros((batch, self.context), jnp.int32).at[:, : prompt_tokens.shape[1]].set(prompt_tokens)
        )
        rows = jnp.arange(batch)

        def body(t, buf):
            logits = self.logits(params, buf)  # causal: positions >= current do not matter
            position = prompt_lengths + t  # where each row's next token goes
            last = logits[rows, position - 1].astype(jnp.float32)
            if temperature == 0:
                token = jnp.argmax(last, axis=-1)
            else:
                token = jax.random.categorical(jax.random.fold_in(rng, t), last / temperature)
            return buf.at[rows, position].set(token.astype(jnp.int32))

        buffer = jax.lax.fori_loop(0, new_tokens, body, buffer)
        return buffer[:, :width]

    # --- config ----------------------------------------------------------------------------------
    @classmethod
    def config_section(cls) -> Section:
        return CONFIG

    @classmethod
    def from_config(cls, config: Any, source: Any) -> LanguageModel:
        """Build for a byte source with ``tokens`` [N, T + 1] and ``weights`` [N, T] fields (e.g.
        ``python_bytes``); the network is ``config.model`` (a registered model taking ``context``)
        and the held-out rows the preview scores come from the data set's validation split."""
        from dew.data.splits import open_split

        missing = {"tokens", "weights"} - set(source.fields)
        if missing:
            raise ConfigError(
                f"config.dataset.name={config.dataset.name!r}: the language objective needs fields "
                f"'tokens' and 'weights', {source.name} lacks {sorted(missing)}"
            )
        if config.model.name is None:
            raise ConfigError(
                "config.model.name=None is invalid: the language objective needs a network, "
                "e.g. 'byte_transformer'"
            )
        context = int(source.fields["tokens"].shape[1]) - 1
        options = {k: v for k, v in config.model.items() if k != "name"}
        if options.get("context", context) < context:
            raise ConfigError(
                f"config.model.context={options['context']} is invalid: the data's rows hold {context} "
                f"targets; expected >= {context}"
            )
        o = config.objective
        score_rows = None
        if o.score_rows:
            held = open_split(config.dataset, "validation")
            picks = np.linspace(0, len(held) - 1, o.score_rows).astype(int)
            score_rows = {k: np.asarray(held.fields[k][picks]) for k in ("tokens", "weights")}
        return cls(
            functools.partial(registry.models[config.model.name], **options),
            context=max(context, options.get("context", context)),
            prompts=tuple(o.prompts),
            new_tokens=o.new_tokens,
            temperature=o.temperature,
            score_rows=score_rows,
            compute_dtype=compute_dtype_of(config),
        )

    # --- inference ------------------------------------------------------------------------------
    def inference_options(self) -> dict[str, Any]:
        """What ``dew.pipeline`` accepts, with the preview's settings as defaults."""
        return {
            "prompts": self.prompts,
            "new_tokens": self.new_tokens,
            "temperature": self.temperature,
            "seed": 0,
        }

    def infer(
        self, params: Params, *, prompts, new_tokens: int, temperature: float, seed: int
    ) -> TextSamples:
        """Continuations of ``prompts`` (a str or a sequence of str); ``seed`` 0 with the
        defaults is exactly the run's preview (which draws with ``PRNGKey(config.seed)``)."""
        prompts = (prompts,) if isinstance(prompts, str) else tuple(prompts)
        if not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise ValueError(f"prompts must be non-empty strings, got {prompts!r}")
        longest = max(len(p.encode()) for p in prompts)
        if not isinstance(new_tokens, int) or new_tokens < 1 or longest + new_tokens > self.context:
            raise ValueError(
                f"new_tokens={new_tokens!r} is invalid: expected an int >= 1 with prompt bytes ({longest}) + "
                f"new_tokens <= the context ({self.context})"
            )
        if temperature < 0:
            raise ValueError(f"temperature={temperature!r} is invalid: expected >= 0 (0: greedy)")
        return self.continue_prompts(params, jax.random.PRNGKey(seed), prompts, new_tokens, temperature)

    # --- what a person sees ---------------------------------------------------------------------
    def continue_prompts(
        self, params: Params, rng: jax.Array, prompts: Sequence[str], new_tokens: int, temperature: float
    ) -> TextSamples:
        encoded = [list(p.encode()) for p in prompts]
        if any(not e for e in encoded):
            raise ValueError("LanguageModel: every prompt needs at least one byte")
        width = max(len(e) for e in encoded)
        tokens = np.zeros((len(encoded), width), np.int32)
        for i, e in enumerate(encoded):
            tokens[i, : len(e)] = e
        lengths = np.array([len(e) for e in encoded], np.int32)
        out = np.asarray(
            _generate_jit(self, new_tokens, float(temperature))(
                params, rng, jnp.asarray(tokens), jnp.asarray(lengths)
            )
        )
        continuations = [out[i, lengths[i] : lengths[i] + new_tokens] for i in range(len(encoded))]
        return TextSamples(
            np.stack(continuations), text=tuple(decode(c) for c in continuations), prompt=tuple(prompts)
        )

    def token_scores(self, params: Params, rows: dict[str, np.ndarray]) -> TokenScores:
        losses = np.asarray(_losses_jit(self)(params, {k: jnp.asarray(v) for k, v in rows.items()}))
        tokens = np.asarray(rows["tokens"])[:, 1:]
        pieces = tuple(tuple(byte_piece(t) for t in row) for row in tokens)
        return TokenScores(np.maximum(losses, 0.0), np.asarray(rows["weights"]), pieces=pieces)

    def preview(self, params: Params, rng: jax.Array) -> Any:
        """``TextSamples`` continuing the fixed prompts; with ``score_rows``, also the held-out
        ``TokenScores`` (a mapping name -> artifact)."""
        samples = self.continue_prompts(params, rng, self.prompts, self.new_tokens, self.temperature)
        if self.score_rows is None:
            return samples
        return {"samples": samples, "token_scores": self.token_scores(params, self.score_rows)}


def _positive(v: int) -> bool:
    return v >= 1


CONFIG = Section(
    "next-byte prediction: teacher-forced cross-entropy, bits per byte, prompt continuations",
    {
        "prompts": Key(PROMPTS, "fixed prompts every preview continues", item=str),
        "new_tokens": Key(
            96, "bytes each preview continuation adds", check=_positive, accepted="an int >= 1"
        ),
        "temperature": Key(
            0.8,
            "sampling temperature of previews (0: greedy)",
            **at_least(0, "a float >= 0"),
        ),
        "score_rows": Key(
            4,
            "held-out rows each preview scores token by token (TokenScores; 0: none)",
            **at_least(0, "an int >= 0"),
        ),
    },
)


@functools.lru_cache(maxsize=8)
def _generate_jit(objective: LanguageModel, new_tokens: int, temperature: float):
    return jax.jit(functools.partial(objective.generate, new_tokens=new_tokens, temperature=temperature))


@functools.lru_cache(maxsize=8)
def _losses_jit(objective: LanguageModel):
    return jax.jit(objective.token_losses)


registry.objectives.register("language", LanguageModel)
