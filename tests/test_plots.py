"""foldax.plots: PNGs are written and non-trivial; training logs are read without TensorFlow."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from foldax import plots
from foldax.cli import main
from foldax.layers.dotbracket import from_dot_bracket

SEQ = "GGGGAAACCCCAUAGGGAAACCCU"
STRUCTURE = "((((...))))..(((...))).."
REFERENCE = "((((...))))...(((...)))."


def check_png(path, min_bytes=5000):
    import matplotlib.image

    assert path.stat().st_size > min_bytes
    pixels = matplotlib.image.imread(path)
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert len(colours) > 2
    return pixels


def toy_probs(n, pairs):
    probs = np.zeros((n, n))
    for i, j in pairs:
        probs[i, j] = probs[j, i] = 0.8
    probs[0, n - 1] = probs[n - 1, 0] = 0.1
    return probs


def test_dot_plot_and_arc_diagram(tmp_path):
    pt, ref = from_dot_bracket(STRUCTURE), from_dot_bracket(REFERENCE)
    probs = toy_probs(len(SEQ), [(i, j) for i, j in enumerate(pt.tolist()) if j > i])
    out = plots.dot_plot(probs, pt, ref, SEQ, path=tmp_path / "dp.png", title="toy")
    assert out == str(tmp_path / "dp.png")
    check_png(tmp_path / "dp.png")
    plots.arc_diagram(pt, ref, SEQ, path=tmp_path / "sub" / "arc.png")
    check_png(tmp_path / "sub" / "arc.png")
    plots.arc_diagram(pt, path=tmp_path / "arc_noref.png")
    check_png(tmp_path / "arc_noref.png")
    # Without a path: the figure (a long sequence gets numeric ticks).
    fig = plots.dot_plot(np.zeros((300, 300)), structure=[(0, 299), (1, 298)])
    assert fig.axes


def test_dot_plot_rejects_bad_shapes():
    with pytest.raises(ValueError, match="square"):
        plots.dot_plot(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="length"):
        plots.dot_plot(np.zeros((4, 4)), sequence="ACG")


def _cell_rgb(fig, ax, i, j):
    """The rendered colour at the centre of dot-plot cell (row i, column j), 1-based."""
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0
    x, y = ax.transData.transform((j, i))
    return pixels[int(round(pixels.shape[0] - y)), int(round(x))]


def test_dot_plot_shades_the_square_root_of_the_probability():
    """RNAfold's convention (box side sqrt(p)): a p = 0.04 pair is shaded as 0.2, not as 0.04."""
    import matplotlib

    n = 30
    probs = np.zeros((n, n))
    cells = {(1, 12): 0.04, (2, 20): 0.25, (5, 28): 1.0}  # 1-based (i, j): p
    for (i, j), p in cells.items():
        probs[i - 1, j - 1] = probs[j - 1, i - 1] = p
    fig = plots.dot_plot(probs)
    ax = fig.axes[0]
    greys = matplotlib.colormaps["Greys"]
    for (i, j), p in cells.items():
        np.testing.assert_allclose(_cell_rgb(fig, ax, i, j), greys(np.sqrt(p))[:3], atol=0.02)
    assert np.abs(_cell_rgb(fig, ax, 1, 12) - np.asarray(greys(0.04)[:3])).max() > 0.05  # not linear


def test_dot_plot_has_position_ticks_on_both_axes_and_names_the_decoder():
    pt, ref = from_dot_bracket(STRUCTURE), from_dot_bracket(REFERENCE)
    probs = toy_probs(len(SEQ), [(i, j) for i, j in enumerate(pt.tolist()) if j > i])
    fig = plots.dot_plot(probs, pt, ref, SEQ, title="toy: MEA structure (gamma 2)",
                         structure_label="MEA structure (gamma 2)")
    ax = fig.axes[0]
    axes = [ax, *ax.child_axes]
    fig.canvas.draw()
    x_labels = {t.get_text() for a in axes for t in a.get_xticklabels()}
    y_labels = {t.get_text() for a in axes for t in a.get_yticklabels()}
    positions = {"1", "5", "10", "15", "20"}  # len(SEQ) = 24
    assert positions <= x_labels and positions <= y_labels
    assert set(SEQ) <= x_labels and set(SEQ) <= y_labels  # and the letters of a short sequence
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["MEA structure (gamma 2) & reference", "MEA structure (gamma 2) only", "reference only"]
    assert fig._suptitle.get_text() == "toy: MEA structure (gamma 2)"
    long = plots.dot_plot(np.zeros((300, 300)))
    long.canvas.draw()
    labels = {t.get_text() for a in [long.axes[0], *long.axes[0].child_axes] for t in a.get_yticklabels()}
    assert {"1", "100", "300"} <= labels


def test_position_ticks():
    assert plots.position_ticks(1) == [1] and plots.position_ticks(0) == []
    for n in (7, 24, 99, 100, 101, 1234, 5000):
        ticks = plots.position_ticks(n)
        assert ticks[0] == 1 and ticks == sorted(set(ticks)) and ticks[-1] <= n and len(ticks) <= 11
        step = ticks[-1] - ticks[-2]
        assert all(t % step == 0 for t in ticks[1:]) and n - ticks[-1] < step


# ---- event files, written by hand (TFRecord framing, protobuf wire format) ---- #


def _varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number, wire, payload):
    key = _varint(number << 3 | wire)
    if wire == 2:
        return key + _varint(len(payload)) + payload
    return key + payload


def _event(step, tag, value, *, tensor=False):
    if tensor:  # TF2 style: a scalar DT_FLOAT tensor in tensor_content
        proto = _field(1, 0, _varint(1)) + _field(2, 2, b"") + _field(4, 2, struct.pack("<f", value))
        val = _field(1, 2, tag.encode()) + _field(8, 2, proto)
    else:  # simple_value
        val = _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value))
    return _field(1, 1, struct.pack("<d", 1.0)) + _field(2, 0, _varint(step)) + _field(5, 2, _field(1, 2, val))


def _write_events(path, events, *, truncated_tail=False):
    data = b""
    for event in events:
        data += struct.pack("<Q", len(event)) + b"\0" * 4 + event + b"\0" * 4  # CRCs are not checked
    if truncated_tail:
        data += struct.pack("<Q", 100) + b"\0" * 10
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _fake_workdir(root):
    train = [_event(s, "loss", 2.0 / (1 + s)) for s in range(0, 100, 5)]
    evals = [_event(s, "f1", 0.2 + s / 200, tensor=True) for s in range(0, 100, 20)]
    evals += [_event(s, "loss", 1.5 / (1 + s), tensor=True) for s in range(0, 100, 20)]
    evals += [_event(s, "f1_slip", 0.3 + s / 200, tensor=True) for s in range(0, 100, 20)]
    _write_events(root / "train" / "events.out.tfevents.1.host", train, truncated_tail=True)
    _write_events(root / "eval" / "events.out.tfevents.2.host", evals)
    _write_events(root / "events.out.tfevents.3.host", [_event(0, "learning_rate", 0.1)])
    (root / "summary.json").write_text(json.dumps({"test_f1": 0.61, "steps": 100}))


def test_read_scalars_from_event_files(tmp_path):
    _fake_workdir(tmp_path)
    scalars = plots.read_scalars(tmp_path)
    assert sorted(scalars) == ["eval/f1", "eval/f1_slip", "eval/loss", "learning_rate", "train/loss"]
    steps, values = scalars["train/loss"]
    assert steps.tolist() == list(range(0, 100, 5))
    np.testing.assert_allclose(values, [2.0 / (1 + s) for s in steps], rtol=1e-6)
    steps, values = scalars["eval/f1"]
    assert steps.tolist() == [0, 20, 40, 60, 80]
    np.testing.assert_allclose(values, 0.2 + steps / 200, rtol=1e-6)
    assert plots.select_tags(list(scalars), "loss") == ["eval/loss", "train/loss"]
    assert plots.select_tags(list(scalars), "f1") == ["eval/f1"]


def test_read_scalars_tensorboardx(tmp_path):
    tensorboardX = pytest.importorskip("tensorboardX")
    with tensorboardX.SummaryWriter(str(tmp_path / "train")) as writer:
        for step in range(10):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
            writer.add_scalar("val/f1", step / 10, step)
        writer.add_text("note", "not a scalar", 0)
    scalars = plots.read_scalars(tmp_path)
    assert sorted(scalars) == ["train/loss", "train/val/f1"]
    np.testing.assert_allclose(scalars["train/val/f1"][1], np.arange(10) / 10, rtol=1e-6)


def test_read_scalars_metrics_jsonl_and_errors(tmp_path):
    rows = [{"step": s, "loss": 1.0 / (s + 1), "val_f1": s / 50} for s in range(0, 50, 10)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    scalars = plots.read_scalars(tmp_path)
    assert sorted(scalars) == ["loss", "val_f1"]
    assert scalars["val_f1"][0].tolist() == [0, 10, 20, 30, 40]
    with pytest.raises(FileNotFoundError, match="not a directory"):
        plots.read_scalars(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no TensorBoard event files"):
        plots.read_scalars(tmp_path / "empty")


def test_training_curves_png(tmp_path):
    _fake_workdir(tmp_path)
    scalars = plots.read_scalars(tmp_path)
    plots.training_curves(scalars, tmp_path / "curves.png", title="run")
    check_png(tmp_path / "curves.png")
    fig = plots.training_curves({"accuracy": ([1, 2, 3], [0.1, 0.2, 0.3])})  # no loss/f1: one panel
    assert len(fig.axes) == 1
    with pytest.raises(ValueError, match="no such tags"):
        plots.training_curves(scalars, loss_tags=["nope"])


def test_plot_command(tmp_path, capsys):
    _fake_workdir(tmp_path)
    assert main(["plot", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(tmp_path / "training_curves.png")
    check_png(tmp_path / "training_curves.png")

    assert main(["plot", "--workdir", str(tmp_path), "-o", str(tmp_path / "x.png"), "--f1-tags", "eval/f1"]) == 0
    check_png(tmp_path / "x.png")

    (tmp_path / "empty").mkdir()
    assert main(["plot", "--workdir", str(tmp_path / "empty")]) == 1
    assert "no TensorBoard event files" in capsys.readouterr().err
    assert main(["plot"]) == 2  # --workdir is required


def test_workdir_like_train_main(tmp_path, capsys):
    """foldax.train.train.MetricWriter's layout: tensorboardX events and metrics.jsonl (same scalars) in the workdir."""
    tensorboardX = pytest.importorskip("tensorboardX")
    rows = []
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as writer:
        for step in range(10, 101, 10):
            row = {"train/loss": 3.0 / step, "train/grad_norm": 1.0}
            if step % 50 == 0:
                row.update({"valid/mea/f1": step / 200, "valid/mea/f1_slip": step / 150, "valid/loss": 2.0 / step})
            rows.append({"step": step, **row})
            for k, v in row.items():
                writer.add_scalar(k, v, step)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"test/mea/f1": 0.5}))
    scalars = plots.read_scalars(tmp_path)
    assert scalars["train/loss"][0].tolist() == list(range(10, 101, 10))  # merged, not duplicated
    assert scalars["valid/mea/f1"][0].tolist() == [50, 100]
    assert plots.select_tags(list(scalars), "f1") == ["valid/mea/f1"]
    assert main(["plot", "--workdir", str(tmp_path)]) == 0
    check_png(tmp_path / "training_curves.png")
