"""Artifacts refuse bad rank, dtype and range with errors naming the artifact, field, value and
expectation; each backend writes each artifact in its natural form, read back by its own reader."""

from __future__ import annotations

import html.parser
import io
import json
import pathlib

import numpy as np
import pytest
from helpers_tracking import event_accumulator, offline_run_dirs, wandb_history
from PIL import GifImagePlugin, Image

from dew.artifacts import LIMITS, ImageGrid, Representations, TextSamples, TokenScores, VideoGrid
from dew.tracking.render import PALETTE, heat_colour, token_scores_html
from dew.tracking.trackers import LocalTracker, MLflowTracker, TensorBoardTracker, WandbTracker


@pytest.mark.parametrize(
    "build, kind, message",
    [
        (
            lambda: ImageGrid(np.zeros((8, 8, 1))),
            ValueError,
            r"ImageGrid\.images: got shape \(8, 8, 1\) \(rank 3\), expected rank 4",
        ),
        (
            lambda: ImageGrid(np.zeros((2, 8, 8, 2))),
            ValueError,
            r"ImageGrid\.images: got shape \(2, 8, 8, 2\), expected .*C in \(1, 3\)",
        ),
        (
            lambda: ImageGrid(np.zeros((2, 8, 8, 1), np.uint8)),
            TypeError,
            r"ImageGrid\.images: got dtype uint8, expected a floating dtype",
        ),
        (
            lambda: ImageGrid(np.full((2, 4, 4, 1), 2.5)),
            ValueError,
            r"ImageGrid\.images: got values in \[2\.5, 2\.5\], expected values in \[-1, 1\]",
        ),
        (
            lambda: ImageGrid(np.full((2, 4, 4, 1), np.nan)),
            ValueError,
            r"ImageGrid\.images: got 32 non-finite values",
        ),
        (
            lambda: ImageGrid(np.zeros((2, 4, 4, 1)), captions=("one",)),
            ValueError,
            r"ImageGrid\.captions: got 1 entries, expected one per row \(2\)",
        ),
        (
            lambda: ImageGrid(np.zeros((2, 4, 4, 1)), captions="ab"),  # pyright: ignore[reportArgumentType]  # the refusal under test
            ValueError,
            r"ImageGrid\.captions: got a single str",
        ),
        (
            lambda: ImageGrid(np.zeros((LIMITS["items"] + 1, 1, 1, 1))),
            ValueError,
            r"ImageGrid\.images: got 1025 images, expected at most 1024",
        ),
        (
            lambda: VideoGrid(np.zeros((2, 8, 8, 1))),
            ValueError,
            r"VideoGrid\.clips: got shape \(2, 8, 8, 1\) \(rank 4\), expected rank 5",
        ),
        (
            lambda: VideoGrid(np.zeros((1, 2, 4, 4, 1), np.int32)),
            TypeError,
            r"VideoGrid\.clips: got dtype int32",
        ),
        (
            lambda: VideoGrid(np.full((1, 2, 4, 4, 1), -3.0)),
            ValueError,
            r"VideoGrid\.clips: got values in \[-3, -3\]",
        ),
        (
            lambda: VideoGrid(np.zeros((1, 2, 4, 4, 1)), fps=0),
            ValueError,
            r"VideoGrid\.fps: got 0, expected an int in \[1, 60\]",
        ),
        (
            lambda: VideoGrid(np.zeros((1, LIMITS["frames"] + 1, 1, 1, 1))),
            ValueError,
            r"VideoGrid\.clips: got 257 frames",
        ),
        (
            lambda: TextSamples(np.zeros(4, np.int32)),
            ValueError,
            r"TextSamples\.tokens: got shape \(4,\) \(rank 1\), expected rank 2",
        ),
        (
            lambda: TextSamples(np.zeros((1, 4))),
            TypeError,
            r"TextSamples\.tokens: got dtype float64, expected an integer dtype",
        ),
        (
            lambda: TextSamples(np.full((1, 2), -1)),
            ValueError,
            r"TextSamples\.tokens: got minimum id -1, expected token ids >= 0",
        ),
        (
            lambda: TextSamples(np.zeros((2, 2), int), text=("a",)),
            ValueError,
            r"TextSamples\.text: got 1 entries",
        ),
        (
            lambda: TokenScores(np.zeros((2, 3)), np.ones((2, 4))),
            ValueError,
            r"TokenScores\.weights: got shape \(2, 4\), expected the shape of losses, \(2, 3\)",
        ),
        (
            lambda: TokenScores(np.zeros(3), np.ones(3)),
            ValueError,
            r"TokenScores\.losses: got shape \(3,\) \(rank 1\), expected rank 2",
        ),
        (
            lambda: TokenScores(np.zeros((1, 3), int), np.ones((1, 3))),
            TypeError,
            r"TokenScores\.losses: got dtype int64",
        ),
        (
            lambda: TokenScores(np.zeros((1, 3)), np.full((1, 3), 0.5)),
            ValueError,
            r"TokenScores\.weights: got values \[0\.5\], expected only 0 and 1",
        ),
        (
            lambda: TokenScores(np.full((1, 3), -0.1), np.ones((1, 3))),
            ValueError,
            r"TokenScores\.losses: got minimum -0\.1, expected losses >= 0",
        ),
        (
            lambda: TokenScores(np.full((1, 2), np.inf), np.ones((1, 2))),
            ValueError,
            r"TokenScores\.losses: got 2 non-finite values",
        ),
        (
            lambda: TokenScores(np.zeros((1, 2)), np.ones((1, 2)), pieces=(("a",),)),
            ValueError,
            r"TokenScores\.pieces: got 1 rows of lengths \[1\], expected 1 rows of 2 strings",
        ),
        (
            lambda: Representations(np.zeros((4, 2, 1)), np.zeros(4, int)),
            ValueError,
            r"Representations\.features: got shape \(4, 2, 1\) \(rank 3\), expected rank 2",
        ),
        (
            lambda: Representations(np.zeros((4, 2)), np.zeros(3, int)),
            ValueError,
            r"Representations\.labels: got 3 labels, expected one per feature row \(4\)",
        ),
        (
            lambda: Representations(np.zeros((4, 2)), np.zeros(4)),
            TypeError,
            r"Representations\.labels: got dtype float64, expected an integer dtype",
        ),
        (
            lambda: Representations(np.full((4, 2), np.nan), np.zeros(4, int)),
            ValueError,
            r"Representations\.features: got 8 non-finite",
        ),
        (
            lambda: Representations(np.zeros((4, LIMITS["features"] + 1)), np.zeros(4, int)),
            ValueError,
            r"got 4097 features per row",
        ),
    ],
)
def test_bad_artifacts_are_refused_naming_artifact_field_received_and_expected(build, kind, message):
    with pytest.raises(kind, match=message):
        build()


def test_pca_recovers_the_plane_the_features_lie_in():
    # Points on a known 2-D plane inside 16-D (plus nothing else): PCA must explain all the
    # variance with two components and reproduce the pairwise distances exactly (rotation only).
    rng = np.random.default_rng(0)
    plane = rng.normal(size=(200, 2)) * np.array([3.0, 1.0])
    basis, _ = np.linalg.qr(rng.normal(size=(16, 2)))
    reps = Representations((plane @ basis.T).astype(np.float32), rng.integers(0, 5, 200))
    points, explained = reps.pca_2d()
    assert explained.sum() == pytest.approx(1.0, abs=1e-5)
    assert explained[0] == pytest.approx(9 / 10, abs=0.05)  # variances 9 : 1, sampled
    d_in = np.linalg.norm(plane[:, None] - plane[None], axis=-1)
    d_out = np.linalg.norm(points[:, None] - points[None], axis=-1)
    np.testing.assert_allclose(d_out, d_in, atol=1e-4)  # float32 features, float64 PCA


def _scores() -> TokenScores:
    text = "def f(x):\n    return x"
    losses = np.linspace(0.0, 4.0, len(text))[None].repeat(2, 0)
    weights = np.ones_like(losses)
    weights[:, 0] = 0  # a document's first token
    weights[1, -3:] = 0  # padding
    return TokenScores(losses, weights, pieces=(tuple(text), tuple(text)))


def _reps() -> Representations:
    labels = np.repeat(np.arange(3), 20)
    features = np.eye(3)[labels] * 5 + np.random.default_rng(1).normal(size=(60, 3)) * 0.1
    return Representations(features.astype(np.float32), labels)


ARTIFACTS = {
    "grid": ImageGrid(
        np.linspace(-1, 1, 4 * 8 * 8).reshape(4, 8, 8, 1),
        captions=("a seven", "a one", "the number 3", "x" * 80),
    ),
    "clip": VideoGrid(
        np.broadcast_to(np.linspace(-1, 1, 3)[None, :, None, None, None], (2, 3, 8, 8, 1)), fps=4
    ),
    "text": TextSamples(np.array([[100, 101], [102, 103]]), text=("pass", "<b>&"), prompt=("def ", "x = ")),
    "scores": _scores(),
    "reps": _reps(),
}


class _Spans(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.spans, self.text = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "span":
            self.spans.append(dict(attrs))

    def handle_data(self, data):
        self.text.append(data)


def _check_scores_html(page: str, scores: TokenScores) -> None:
    parser = _Spans()
    parser.feed(page)
    assert len(parser.spans) == scores.losses.size
    cap = float(np.percentile(scores.losses[scores.weights > 0] / np.log(2), 99))
    styles = [s["style"] for s in parser.spans]
    for k, (loss, weight) in enumerate(zip(scores.losses.ravel(), scores.weights.ravel(), strict=True)):
        assert styles[k] == "background:rgb({},{},{})".format(*heat_colour(loss / np.log(2), weight, cap))
    assert styles[0] == "background:rgb(215,215,215)"  # the first token, weight 0: grey
    assert styles[scores.losses.shape[1] - 1] == "background:rgb(255,0,0)"  # the hottest counted
    assert "\n    return x" in "".join(parser.text)


def _check_scatter(png: Image.Image) -> None:
    pixels = np.asarray(png.convert("RGB")).reshape(-1, 3)
    for label in range(3):  # every label's colour is drawn (points and legend)
        assert (pixels == PALETTE[label]).all(axis=1).sum() > 20


def test_local_tracker_writes_every_artifact_in_its_natural_form(tmp_path):
    tracker = LocalTracker(str(tmp_path))
    for name, artifact in ARTIFACTS.items():
        tracker.log_artifact(name, artifact, 7)
    grid = Image.open(tmp_path / "images" / "grid_00000007.png")
    plain = ImageGrid(ARTIFACTS["grid"].images, columns=2)
    uncaptioned = Image.open(io.BytesIO(_png(plain)))
    assert grid.mode == "RGB" and grid.height > uncaptioned.height  # room for the captions
    # The caption strip under each image holds dark text pixels; the image area is unchanged.
    strip = np.asarray(grid)[66:100, 2:100]
    assert (strip < 80).any()
    gif = Image.open(tmp_path / "videos" / "clip_00000007.gif")
    assert isinstance(gif, GifImagePlugin.GifImageFile) and gif.n_frames == 3
    assert "0: [def ] pass" in (tmp_path / "text" / "text_00000007.txt").read_text()
    assert "<b>x = </b>&lt;b&gt;&amp;" in (tmp_path / "text" / "text_00000007.html").read_text()
    _check_scores_html((tmp_path / "scores" / "scores_00000007.html").read_text(), ARTIFACTS["scores"])
    assert Image.open(tmp_path / "scores" / "scores_00000007.png").format == "PNG"
    _check_scatter(Image.open(tmp_path / "representations" / "reps_00000007.png"))
    with np.load(tmp_path / "representations" / "reps_00000007.npz", allow_pickle=False) as saved:
        np.testing.assert_array_equal(saved["labels"], ARTIFACTS["reps"].labels)


def _png(grid: ImageGrid) -> bytes:
    from dew.tracking.media import encode_png, image_pixels

    return encode_png(image_pixels(grid))


def test_tensorboard_mlflow_and_wandb_write_every_artifact(tmp_path):
    from mlflow import MlflowClient

    trackers = [
        TensorBoardTracker(str(tmp_path / "tb"), writer="thread"),
        MLflowTracker("art", directory=str(tmp_path / "mlflow"), writer="thread"),
        WandbTracker("dew-tests", directory=str(tmp_path / "wandb"), writer="thread"),
    ]
    for tracker in trackers:
        for name, artifact in ARTIFACTS.items():
            tracker.log_artifact(name, artifact, 3)
        tracker.close()

    events = event_accumulator(str(tmp_path / "tb"))
    for tag in ("grid", "clip", "scores", "reps"):
        (image,) = events.Images(tag)
        picture = Image.open(io.BytesIO(image.encoded_image_string))
        assert picture.size == (image.width, image.height)
    _check_scatter(Image.open(io.BytesIO(events.Images("reps")[0].encoded_image_string)))
    (bits,) = events.Tensors("scores/bits")
    assert f"mean {ARTIFACTS['scores'].bits_per_token():.4f} bits" in bits.tensor_proto.string_val[0].decode()

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    run_id = json.loads((tmp_path / "mlflow" / "run.json").read_text())["run_id"]
    listed = {
        f: [a.path for a in client.list_artifacts(run_id, f)]
        for f in ("videos", "text", "scores", "representations")
    }
    assert listed["videos"] == ["videos/clip_00000003.gif"]
    assert listed["text"] == ["text/text_00000003.html", "text/text_00000003.txt"]
    assert listed["scores"] == ["scores/scores_00000003.html", "scores/scores_00000003.png"]
    page = client.download_artifacts(run_id, "scores/scores_00000003.html", str(tmp_path / "dl"))
    _check_scores_html(pathlib.Path(page).read_text(), ARTIFACTS["scores"])
    png = client.download_artifacts(run_id, "representations/reps_00000003.png", str(tmp_path / "dl"))
    _check_scatter(Image.open(png))

    (run_dir,) = offline_run_dirs(str(tmp_path / "wandb"))
    (row,) = wandb_history(run_dir)
    assert row["grid/_type"] == "image-file" and row["reps/_type"] == "image-file"
    assert row["clip/_type"] == "video-file" and row["scores/_type"] == "html-file"
    assert row["text/_type"] == "table-file"
    page = pathlib.Path(run_dir, "files", row["scores/path"]).read_text()
    _check_scores_html(page, ARTIFACTS["scores"])
    _check_scatter(Image.open(f"{run_dir}/files/{row['reps/path']}"))


def test_token_scores_html_is_bounded_and_says_what_it_left_out():
    from dew.tracking import render

    big = TokenScores(np.ones((render.MAX_SCORE_ROWS + 4, 10)), np.ones((render.MAX_SCORE_ROWS + 4, 10)))
    page = token_scores_html(big)
    assert page.count("<span") == render.MAX_SCORE_ROWS * 10
    assert "not shown: 4 rows, 0 positions per row" in page
