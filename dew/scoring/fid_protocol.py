"""The EDM paper's FID protocol: N images (50,000) from seeds s₀ … s₀ + N − 1 at the paper's
sampler settings, features streamed into resumable statistics, FID against reference statistics.

**Seeds index images.** Image ``s`` is a function of ``s`` alone, as in NVlabs/edm's
``generate.py`` (its ``StackedRandomGenerator`` keeps one torch generator per seed): with
``key = jax.random.PRNGKey(s)``, its starting noise is ``normal(fold_in(key, 0), [H, W, C])``,
its class (a class-conditional model; ``generate.py``'s ``randint(label_dim)``) is
``randint(fold_in(key, 1), 0, classes)`` and a stochastic sampler's per-step noise comes from
``fold_in(key, 2)``. Each image is sampled as a batch of one under ``vmap``, so how seeds are
grouped into batches, devices and processes does not change which image a seed gives. Images
are quantised as ``generate.py`` writes its PNGs: ``clip(x · 127.5 + 128, 0, 255)`` truncated
to uint8, and the detector sees those uint8 images.

**Presets** (``PRESETS``, the NVlabs/edm README's "Generating images" commands): ``cifar10``
18 Heun steps (NFE 35), ``ffhq`` and ``afhqv2`` 40 Heun steps (NFE 79), ``imagenet64`` EDM's
stochastic sampler (Algorithm 2) with S_churn 40, S_tmin 0.05, S_tmax 50, S_noise 1.003 over 256
steps (NFE 511); all on the model's own σ schedule (EDM: Eq. 5, σ ∈ [0.002, 80], ρ 7). Presets
that draw through another objective's own sampler (``ProtocolSampler``: DiT's, SiT's, REPA's in
``dew.objectives.protocol_presets``) follow the same seed rule and go through the same ``Draw``.

**Sharding.** One jitted program draws and embeds ``batch`` images per device over a 1-D mesh
of every device of every process (``jax.devices()``); each process builds only its own
devices' seeds (``jax.make_array_from_callback``), and the features [devices · batch, D] come
back to every host (``process_allgather``), in seed order.

**Resume.** The seeds are cut into chunks of ``chunk`` images (independent of the device
count). After each chunk the float64 sums (``MomentSums``) and the chunk count are written to
``<outdir>/fid-progress.npz`` with their digest (``dew.scoring.progress_file``; a temporary file
renamed over the old one, by process 0; temporary files of killed draws are removed at the next
start); a
rerun with the same settings (with several processes, ``outdir`` on a file system they all
read) continues after the last completed chunk, and since every chunk's
features are summed in one fixed order, it ends with the same statistics, bit for bit, as a run
never interrupted. A progress file made with other settings is refused, and so is one that is damaged or whose
counts disagree with each other or the settings (one line naming it: delete it to start over).
What a chunk adds and its progress file are the draw's ``Tally`` (``Draw.run_tally``;
``dew.scoring.fid_progress``): ``FidTally`` for FID; ADM's suite's
``dew.scoring.adm_progress.AdmTally`` also keeps each chunk's pool rows. The report and the
statistics a finished draw writes are ``dew.scoring.protocol_results``'.

**Preview.** With ``preview`` = k > 0, the first k images of the draw (seeds s₀ … s₀ + k − 1,
the very uint8 images the detector embeds, out of the same program) are written as one grid,
``<outdir>/preview.png``, when the first chunk is drawn.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from dew.scoring.fid_detector import Detector
from dew.scoring.fid_progress import (  # noqa: F401  (public here too, as before)
    PROGRESS_FILE,
    REPORT_FILE,
    STATS_FILE,
    FidTally,
    Tally,
    read_progress,
    remove_stale_temporaries,
    write_progress,
)
from dew.scoring.fid_reference import FidInputError, MomentSums

PREVIEW_FILE = "preview.png"


class _Step(Protocol):
    """``FidRun._step_fn``'s step: features [per_step, D] of ``seeds`` and, with ``keep_images``,
    their uint8 images (else None)."""

    def __call__(
        self, seeds: np.ndarray, keep_images: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]: ...


@dataclasses.dataclass(frozen=True)
class SamplerPreset:
    """A paper row's sampler: ``steps`` σ points and a solver (``heun`` or EDM Algorithm 2's
    stochastic sampler with its S_churn, S_tmin, S_tmax, S_noise)."""

    name: str
    steps: int
    solver: str = "heun"
    s_churn: float = 0.0
    s_tmin: float = 0.0
    s_tmax: float = float("inf")
    s_noise: float = 1.0

    def solver_object(self) -> Any:
        from dew.sampling import SOLVERS, EDMStochastic

        if self.solver == "edm_stochastic":
            return EDMStochastic(
                s_churn=self.s_churn, s_tmin=self.s_tmin, s_tmax=self.s_tmax, s_noise=self.s_noise
            )
        return SOLVERS[self.solver]

    @property
    def nfe(self) -> int:
        from dew.sampling import nfe

        return nfe(self.solver_object(), self.steps)

    def settings(self) -> dict[str, Any]:
        out = {"preset": self.name, "steps": self.steps, "solver": self.solver, "nfe": self.nfe}
        if self.solver == "edm_stochastic":
            out.update(S_churn=self.s_churn, S_min=self.s_tmin, S_max=self.s_tmax, S_noise=self.s_noise)
        return out


PRESETS: dict[str, SamplerPreset] = {
    # NVlabs/edm README: "For CIFAR-10 at 32x32, use deterministic sampling with 18 steps (NFE = 35)"
    "cifar10": SamplerPreset("cifar10", 18),
    # "For FFHQ and AFHQv2 at 64x64, use deterministic sampling with 40 steps (NFE = 79)"
    "ffhq": SamplerPreset("ffhq", 40),
    "afhqv2": SamplerPreset("afhqv2", 40),
    # "For ImageNet at 64x64, use stochastic sampling with 256 steps (NFE = 511)":
    # --steps=256 --S_churn=40 --S_min=0.05 --S_max=50 --S_noise=1.003
    "imagenet64": SamplerPreset("imagenet64", 256, "edm_stochastic", 40.0, 0.05, 50.0, 1.003),
}


def preset(name: str) -> SamplerPreset:
    if name not in PRESETS:
        raise FidInputError(f"--preset={name!r} is not a sampler preset; expected one of {sorted(PRESETS)}")
    return PRESETS[name]


def quantize(x: Any) -> Any:
    """[-1, 1] images -> uint8 as ``generate.py``: ``(x * 127.5 + 128).clip(0, 255).to(uint8)``."""
    import jax.numpy as jnp

    return jnp.clip(x * 127.5 + 128.0, 0.0, 255.0).astype(jnp.uint8)


def model_classes(objective: Any) -> int:
    """The class count a class-conditional objective draws from (0: unconditional); a
    text-conditioned one is refused (the protocol draws classes, not prompts)."""
    condition = objective.input_spec.conditions.get("label")
    if condition is None:
        return 0
    if condition.encoder != "class_label":
        raise FidInputError(
            f"--workdir: the model is conditioned by {condition.encoder!r}; the FID protocol draws "
            "unconditional or class-conditional images"
        )
    return int(objective.num_classes)


class ProtocolSampler(Protocol):
    """A preset that draws through its objective's own sampler (DiT's, SiT's, REPA's:
    ``dew.objectives.protocol_presets``): samples [n, *shape] for ``seeds``, each from its own
    seed by this module's rule, and the settings a progress file records."""

    @property
    def name(self) -> str: ...

    def draw_samples(self, objective: Any, params: Any, seeds: Any) -> Any: ...

    def settings(self) -> dict[str, Any]: ...

    def to_uint8(self, objective: Any, samples: Any) -> Any:
        """uint8 images [n, H, W, C] of ``samples`` (decoded by the run's VAE for a latent run)
        as the preset's reference writes its PNGs."""
        ...


def draw_images(objective: Any, params: Any, seeds: Any, sampler: SamplerPreset | ProtocolSampler) -> Any:
    """uint8 images [n, H, W, C] for int32 ``seeds`` [n], each from its own seed (module
    docstring); pure and jittable, any sharding of ``seeds``. A latent run's samples are
    decoded by its VAE (``config.objective.latent``). A ``ProtocolSampler`` draws the samples
    through its objective's sampler and turns them into uint8 images by its reference's rule."""
    if not isinstance(sampler, SamplerPreset):
        return sampler.to_uint8(objective, sampler.draw_samples(objective, params, seeds))
    latents_or_pixels = _edm_samples(objective, params, seeds, sampler)
    latent = getattr(objective, "latent", None)
    if latent is not None:  # a latent run: edm2's generate_images.py decodes to uint8 (encoder.decode)
        return latent.codec.decode(latents_or_pixels)
    return quantize(latents_or_pixels)


def _edm_samples(objective: Any, params: Any, seeds: Any, sampler: SamplerPreset) -> Any:
    """The EDM presets' samples [n, *shape]: ``sample`` on the model's σ schedule."""
    import jax

    from dew.sampling import sample

    shape = tuple(objective.input_spec.sample.shape)
    classes = model_classes(objective)
    solver = sampler.solver_object()
    with jax.ensure_compile_time_eval():
        sigmas = objective.process.sigmas(sampler.steps)

    def one(seed: jax.Array) -> jax.Array:
        key = jax.random.PRNGKey(seed)
        noise = jax.random.normal(jax.random.fold_in(key, 0), (1, *shape))
        conditions = {}
        if classes:
            conditions = {"label": jax.random.randint(jax.random.fold_in(key, 1), (1,), 0, classes)}
        denoise = objective.denoiser(params, conditions)
        return sample(denoise, noise, sigmas, solver, rng=jax.random.fold_in(key, 2))[0]

    return jax.vmap(one)(seeds)


@dataclasses.dataclass
class Draw:
    """One protocol draw: ``num`` images from seeds ``first_seed`` … of ``objective`` with
    ``params`` at ``sampler``, embedded by ``detector``, ``batch`` images per device per step,
    ``chunk`` images per progress record in ``outdir`` (made when missing), over ``devices``
    (default: all). ``identity`` (the model's source, step, weights) goes into the settings a
    progress file must match. ``preview`` (at most ``chunk`` and ``num``): how many of the
    first images go into ``<outdir>/preview.png`` (0: none)."""

    objective: Any
    params: Any
    sampler: SamplerPreset | ProtocolSampler
    detector: Detector
    num: int
    outdir: str
    first_seed: int = 0
    batch: int = 64
    chunk: int = 1000
    identity: dict[str, Any] = dataclasses.field(default_factory=dict)
    devices: Any = None  # default: jax.devices(), every device of every process
    preview: int = 0
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)

    def settings(self) -> dict[str, Any]:
        return {
            **self.sampler.settings(),
            **self.identity,
            "num_images": self.num,
            "first_seed": self.first_seed,
            "chunk": self.chunk,
            "detector": self.detector.description,
        }

    def _step_fn(self) -> tuple[_Step, int]:
        import jax
        from jax.experimental import multihost_utils
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        mesh = Mesh(np.array(self.devices or jax.devices()), ("images",))
        seeds_sharding = NamedSharding(mesh, PartitionSpec("images"))
        replicated = NamedSharding(mesh, PartitionSpec())
        per_step = self.batch * mesh.devices.size
        # host copies first: every process places the same values on the global mesh
        params = jax.device_put(jax.tree.map(np.asarray, self.params), replicated)
        detector_params = jax.device_put(jax.tree.map(np.asarray, self.detector.params), replicated)

        def draw_and_embed(params, detector_params, seeds):
            images = draw_images(self.objective, params, seeds, self.sampler)
            rgb = jax.numpy.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images
            return self.detector.fn(detector_params, rgb), images  # greyscale repeated, as fid.py

        program = jax.jit(draw_and_embed, out_shardings=seeds_sharding)

        def gather(x: jax.Array) -> np.ndarray:
            if jax.process_count() > 1:
                return np.asarray(multihost_utils.process_allgather(x, tiled=True))
            return np.asarray(x)

        def step(seeds: np.ndarray, keep_images: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
            """Features [per_step, D] of ``seeds`` and, with ``keep_images``, their uint8 images."""
            global_seeds = jax.make_array_from_callback(
                (per_step,), seeds_sharding, lambda index: seeds[index]
            )
            features, images = program(params, detector_params, global_seeds)
            return gather(features), gather(images) if keep_images else None

        return step, per_step

    def run(self, max_chunks: int | None = None) -> MomentSums | None:
        """Draw the chunks not yet in the progress file (at most ``max_chunks`` this call);
        the complete sums, or None when stopped by ``max_chunks`` before the end."""
        tally = FidTally(self.detector.dim)
        return tally.sums if self.run_tally(tally, max_chunks) else None

    def run_tally(self, tally: Tally, max_chunks: int | None = None) -> bool:
        """``run`` into any ``tally`` (it reads and writes its own progress file): True when
        every chunk is in it, False when stopped by ``max_chunks`` before the end."""
        import jax

        settings = self.settings()
        done = tally.resume(self.outdir, settings)
        os.makedirs(self.outdir, exist_ok=True)
        num_chunks = math.ceil(self.num / self.chunk)
        if jax.process_index() == 0:
            stale = remove_stale_temporaries(self.outdir, tally.temporaries(num_chunks))
            if stale:
                self.log(
                    f"fid: removed {len(stale)} temporary files of interrupted writes ({', '.join(stale)})"
                )
        if done:
            self.log(f"fid: resuming after {done}/{num_chunks} chunks ({tally.count}/{self.num} images)")
        step, per_step = self._step_fn()
        started = time.monotonic()
        for ran, index in enumerate(range(done, num_chunks)):
            if max_chunks is not None and ran >= max_chunks:
                self.log(f"fid: stopped after {ran} chunks (--max_chunks); rerun to continue")
                return False
            lo = self.first_seed + index * self.chunk
            hi = min(lo + self.chunk, self.first_seed + self.num)
            seeds = np.arange(lo, hi, dtype=np.int64)
            parts, shown = [], []
            for s in range(0, len(seeds), per_step):
                part = seeds[s : s + per_step]
                padded = np.concatenate([part, np.full(per_step - len(part), part[-1])]).astype(np.int32)
                wanted = index == 0 and s < self.preview
                features, images = step(padded, keep_images=wanted)
                parts.append(features[: len(part)])
                if wanted:
                    assert images is not None  # keep_images=True
                    shown.append(images[: len(part)])
            tally.add(index, np.concatenate(parts))
            if jax.process_index() == 0:
                if shown:
                    write_preview(self.outdir, np.concatenate(shown)[: self.preview])
                tally.commit(self.outdir, settings, index + 1)
            rate = (tally.count - done * self.chunk) / max(time.monotonic() - started, 1e-9)
            remaining = (self.num - tally.count) / rate if rate > 0 else float("nan")
            self.log(
                f"fid: {tally.count}/{self.num} images (chunk {index + 1}/{num_chunks}, "
                f"{rate:.1f} images/s, ~{remaining / 60:.1f} min left)"
            )
        return True


def write_preview(outdir: str, images: np.ndarray) -> str:
    """uint8 images [k, H, W, C] as one grid, ``<outdir>/preview.png`` (written atomically)."""
    from dew.artifacts import ImageGrid
    from dew.tracking.media import write_png

    return write_png(os.path.join(outdir, PREVIEW_FILE), ImageGrid(images.astype(np.float32) / 127.5 - 1.0))


__all__ = [
    "PRESETS",
    "Draw",
    "FidTally",
    "ProtocolSampler",
    "SamplerPreset",
    "Tally",
    "draw_images",
    "preset",
    "quantize",
    "write_preview",
]
