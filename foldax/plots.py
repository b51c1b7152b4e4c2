"""Plots (matplotlib, Agg, no pyplot state): base-pair dot plots, arc diagrams and
training curves; and a small reader for the scalars a training run logs.

Every plotting function returns the path it wrote (when ``path`` is given) or the
:class:`matplotlib.figure.Figure` (when ``path`` is None).

Training logs (:func:`read_scalars`) are read from a workdir without TensorFlow:

* TensorBoard event files ``events.out.tfevents.*`` anywhere below the workdir
  (TFRecord framing + a minimal protobuf decoder). Both ``simple_value`` scalars
  (tensorboardX, ``tf.compat.v1``) and TF2 scalar tensors are read. A file in a
  subdirectory ``run/`` of the workdir gives tags ``run/<tag>`` (as TensorBoard's
  runs do); a file directly in the workdir gives ``<tag>``.
* ``metrics.jsonl`` files (one JSON object per line with a ``step`` and numeric
  fields; each other field is a tag, prefixed with ``run/`` as above).
"""

from __future__ import annotations

import glob
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence

import numpy as np

PREDICTED = "tab:blue"
REFERENCE = "tab:red"
BOTH = "tab:green"


def _figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def _finish(fig, path, dpi=150):
    if path is None:
        return fig
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def _pairs(structure) -> set[tuple[int, int]]:
    """0-based pairs ``(i, j)``, ``i < j``, of a pair table (or an iterable of pairs)."""
    if structure is None:
        return set()
    arr = np.asarray(structure)
    if arr.ndim == 1:
        return {(i, int(j)) for i, j in enumerate(arr.tolist()) if j > i}
    return {(int(min(i, j)), int(max(i, j))) for i, j in arr.tolist()}


def _legend_handles(predicted, reference, label="predicted"):
    from matplotlib.patches import Patch

    if not reference:
        return [Patch(color=PREDICTED, label=label)]
    return [Patch(color=BOTH, label=f"{label} & reference"), Patch(color=PREDICTED, label=f"{label} only"),
            Patch(color=REFERENCE, label="reference only")]


def _pair_colours(predicted, reference):
    """[(pair, colour)] for the union of both sets."""
    if reference is None:
        return [(p, PREDICTED) for p in sorted(predicted)]
    out = []
    for p in sorted(predicted | reference):
        out.append((p, BOTH if p in predicted and p in reference else PREDICTED if p in predicted else REFERENCE))
    return out


def _sequence_ticks(ax, n, sequence, axes="xy", max_letters=80):
    from matplotlib.ticker import MaxNLocator

    if sequence is not None and n <= max_letters:
        ticks = np.arange(1, n + 1)
        letters = list(sequence)
        if "x" in axes:
            ax.set_xticks(ticks, letters, fontsize=max(3, min(8, 400 // max(n, 1))), fontfamily="monospace")
        if "y" in axes:
            ax.set_yticks(ticks, letters, fontsize=max(3, min(8, 400 // max(n, 1))), fontfamily="monospace")
        ax.tick_params(length=0)
    else:
        if "x" in axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if "y" in axes:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def position_ticks(n: int, max_ticks: int = 10) -> list[int]:
    """1-based position ticks for a length-``n`` axis: 1 and multiples of a round step.

    >>> position_ticks(24), position_ticks(300)
    ([1, 5, 10, 15, 20], [1, 50, 100, 150, 200, 250, 300])
    """
    if n < 1:
        return []
    steps = [k * 10**e for e in range(0, 7) for k in (1, 2, 5)]
    step = next(s for s in steps if n // s < max_ticks)
    return [1] + [t for t in range(step, n + 1, step) if t > 1]


#: Dot plots shade ``sqrt(p)``, as RNAfold's dot plots draw a box of side ``sqrt(p)``
#: (area ``p``): weak pairs (p = 0.01 shades 0.1) stay visible.
SHADING_GAMMA = 0.5


def dot_plot(probs, structure=None, reference=None, sequence=None, path=None, *, title=None,
             structure_label="predicted"):
    """A base-pair probability dot plot.

    Upper-right triangle: ``P(i pairs with j)``, shaded by ``sqrt(P)`` (RNAfold's
    convention, see :data:`SHADING_GAMMA`; the colour bar is labelled in ``P``).
    Lower-left triangle: the predicted ``structure`` (blue; named ``structure_label``
    in the legend, e.g. the decoder ``"MEA structure (gamma 2)"``) and, when given, the
    ``reference`` (pairs in both green, reference only red). ``structure``/``reference``
    are pair tables (or lists of 0-based pairs). Bottom and right axes: 1-based
    positions (:func:`position_ticks`); top and left: the ``sequence`` letters when it
    is short, else positions too.
    """
    from matplotlib.colors import PowerNorm, to_rgba

    probs = np.asarray(probs, dtype=float)
    n = probs.shape[0]
    if probs.shape != (n, n):
        raise ValueError(f"probs must be a square [n, n] matrix, got shape {probs.shape}")
    if sequence is not None and len(sequence) != n:
        raise ValueError(f"sequence has length {len(sequence)}, probs is {n} x {n}")
    sym = np.triu(probs, 1)
    sym = np.clip(sym + sym.T, 0.0, 1.0)
    upper = np.ma.masked_where(~np.triu(np.ones((n, n), bool), 1), sym)

    size = 6.5 if n <= 200 else 8.0
    fig = _figure((size + 1.6, size + 0.4))
    ax = fig.add_subplot()
    extent = (0.5, n + 0.5, n + 0.5, 0.5)
    image = ax.imshow(upper, cmap="Greys", norm=PowerNorm(SHADING_GAMMA, vmin=0.0, vmax=1.0), extent=extent,
                      interpolation="nearest")

    predicted = _pairs(structure)
    ref = None if reference is None else _pairs(reference)
    lower = np.zeros((n, n, 4))
    for (i, j), colour in _pair_colours(predicted, ref):
        lower[j, i] = to_rgba(colour)
    ax.imshow(lower, extent=extent, interpolation="nearest")

    ax.plot([0.5, n + 0.5], [0.5, n + 0.5], color="0.6", linewidth=0.6)
    ax.set_xlim(0.5, n + 0.5)
    ax.set_ylim(n + 0.5, 0.5)
    ax.xaxis.tick_top()
    _sequence_ticks(ax, n, sequence)
    ax.set_xlabel("j (upper: pair probability)")
    ax.xaxis.set_label_position("top")
    ax.set_ylabel("i (lower: structure)")
    ticks = position_ticks(n)
    bottom = ax.secondary_xaxis("bottom")
    bottom.set_xticks(ticks, [str(t) for t in ticks], fontsize=7)
    right = ax.secondary_yaxis("right")
    right.set_yticks(ticks, [str(t) for t in ticks], fontsize=7)
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.09, label="base-pair probability (sqrt shading)")
    bar.set_ticks([0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0])
    if predicted or ref:
        ax.legend(handles=_legend_handles(predicted, ref, structure_label), loc="upper center",
                  bbox_to_anchor=(0.5, -0.05), ncol=3, fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return _finish(fig, path)


def arc_diagram(structure, reference=None, sequence=None, path=None, *, length=None, title=None):
    """An arc diagram: predicted pairs as arcs above the sequence, the reference's below
    (pairs in both green, predicted only blue, reference only red)."""
    from matplotlib.patches import Arc

    predicted = _pairs(structure)
    ref = None if reference is None else _pairs(reference)
    if length is None:
        if sequence is not None:
            length = len(sequence)
        elif np.asarray(structure).ndim == 1:
            length = len(np.asarray(structure))
        else:
            length = max((j for _, j in predicted | (ref or set())), default=0) + 1
    n = int(length)
    spans = [j - i for i, j in predicted | (ref or set())]
    height = max(spans, default=max(n / 4, 1)) / 2
    width = float(np.clip(n * 0.08, 6, 18))
    fig = _figure((width, 3.2 if ref is None else 4.8))
    ax = fig.add_subplot()
    for (i, j), colour in _pair_colours(predicted, ref):
        center, span = ((i + j) / 2 + 1, 0.0), j - i
        if (i, j) in predicted:
            ax.add_patch(Arc(center, span, span, theta1=0, theta2=180, color=colour, linewidth=1.2))
        if ref is not None and (i, j) in ref:
            ax.add_patch(Arc(center, span, span, theta1=180, theta2=360, color=colour, linewidth=1.2))
    ax.set_xlim(0.5, n + 0.5)
    ax.set_ylim(-1.08 * height - 0.5 if ref is not None else 0, 1.08 * height + 0.5)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    if ref is not None:
        ax.axhline(0, color="0.3", linewidth=0.8)
    _sequence_ticks(ax, n, sequence, axes="x", max_letters=150)
    ax.set_xlabel("position")
    if ref is not None:
        ax.text(0.01, 0.98, "predicted", transform=ax.transAxes, va="top", fontsize=8)
        ax.text(0.01, 0.02, "reference", transform=ax.transAxes, va="bottom", fontsize=8)
    ax.legend(handles=_legend_handles(predicted, ref), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7,
              frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _finish(fig, path)


# --------------------------------------------------------------------------- #
# training curves
# --------------------------------------------------------------------------- #


def _ema(values, decay=0.9):
    out, acc = [], None
    for v in values:
        acc = v if acc is None or not math.isfinite(acc) else decay * acc + (1 - decay) * v
        out.append(acc)
    return np.asarray(out)


def select_tags(tags: Sequence[str], word: str) -> list[str]:
    """Tags whose last path component is ``word`` or ends with ``_word`` / ``-word``
    (case-insensitive): ``valid/mea/f1`` and ``val_f1`` but not ``valid/mea/f1_slip``.

    >>> select_tags(["train/loss", "valid/mea/f1", "valid/mea/f1_slip", "val_f1", "nll"], "f1")
    ['val_f1', 'valid/mea/f1']
    """
    word = word.lower()

    def matches(tag):
        last = tag.rsplit("/", 1)[-1].lower()
        return last == word or last.endswith(("_" + word, "-" + word))

    return sorted(t for t in tags if matches(t))


def training_curves(scalars: Mapping[str, tuple], path=None, *, loss_tags=None, f1_tags=None, title=None):
    """Loss (left) and validation F1 (right) per step.

    ``scalars`` maps a tag to ``(steps, values)`` (see :func:`read_scalars`). By
    default the loss panel shows the ``loss`` tags and the F1 panel the ``f1`` tags (see
    :func:`select_tags`); when neither matches, all tags share one panel.
    A noisy series (more than 20 points) is drawn faintly with an EMA-smoothed line.
    """
    loss_tags = select_tags(list(scalars), "loss") if loss_tags is None else list(loss_tags)
    f1_tags = select_tags(list(scalars), "f1") if f1_tags is None else list(f1_tags)
    panels = [(name, tags) for name, tags in (("loss", loss_tags), ("F1", f1_tags)) if tags]
    if not panels:
        if not scalars:
            raise ValueError("no scalars to plot")
        panels = [("value", sorted(scalars))]
    missing = [t for _, tags in panels for t in tags if t not in scalars]
    if missing:
        raise ValueError(f"no such tags: {missing} (found: {sorted(scalars)})")
    fig = _figure((5.2 * len(panels), 3.8))
    for k, (ylabel, tags) in enumerate(panels, start=1):
        ax = fig.add_subplot(1, len(panels), k)
        for tag in tags:
            steps, values = (np.asarray(a, dtype=float) for a in scalars[tag])
            order = np.argsort(steps, kind="stable")
            steps, values = steps[order], values[order]
            marker = "o" if len(steps) <= 30 else None
            if len(steps) > 20:
                line = ax.plot(steps, values, alpha=0.3, linewidth=0.8)[0]
                ax.plot(steps, _ema(values), color=line.get_color(), linewidth=1.5, label=tag)
            else:
                ax.plot(steps, values, marker=marker, markersize=3, linewidth=1.5, label=tag)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        if ylabel == "F1":
            ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]), top=max(1.0, ax.get_ylim()[1]))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _finish(fig, path)


# ---- reading logs --------------------------------------------------------- #


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message (value: int or bytes)."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


_DTYPES = {1: "<f4", 2: "<f8", 3: "<i4", 9: "<i8", 19: "<f2"}  # TF DataType -> numpy


def _tensor_scalar(buf: bytes) -> float | None:
    """The value of a TensorProto holding exactly one number, else None."""
    dtype, content, values = None, None, []
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 4 and wire == 2:
            content = value
        elif number == 5:  # float_val
            values.extend(np.frombuffer(value, "<f4").tolist())
        elif number == 6:  # double_val
            values.extend(np.frombuffer(value, "<f8").tolist())
        elif number in (7, 10):  # int_val, int64_val (varints, maybe packed)
            if wire == 0:
                values.append(value)
            else:
                pos = 0
                while pos < len(value):
                    v, pos = _varint(value, pos)
                    values.append(v)
    if content is not None and dtype in _DTYPES:
        values = np.frombuffer(content, _DTYPES[dtype]).tolist()
    if dtype not in _DTYPES or len(values) != 1:
        return None
    return float(values[0])


def _event_scalars(record: bytes):
    """(step, tag, value) for each scalar in one serialized Event."""
    step, summary = 0, None
    for number, wire, value in _fields(record):
        if number == 2 and wire == 0:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 5 and wire == 2:
            summary = value
    if summary is None:
        return
    for number, wire, value in _fields(summary):
        if number != 1 or wire != 2:
            continue
        tag, scalar = None, None
        for n2, w2, v2 in _fields(value):
            if n2 == 1 and w2 == 2:
                tag = v2.decode("utf-8", "replace")
            elif n2 == 2 and w2 == 5:
                scalar = struct.unpack("<f", v2)[0]
            elif n2 == 8 and w2 == 2:
                scalar = _tensor_scalar(v2)
        if tag is not None and scalar is not None:
            yield step, tag, scalar


def read_event_file(path) -> list[tuple[int, str, float]]:
    """(step, tag, value) of every scalar in a TensorBoard event file (TFRecords)."""
    out = []
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0
    while pos + 12 <= len(data):
        (size,) = struct.unpack("<Q", data[pos:pos + 8])
        start, end = pos + 12, pos + 12 + size
        if end + 4 > len(data):
            break  # a record still being written
        try:
            out.extend(_event_scalars(data[start:end]))
        except (ValueError, IndexError, struct.error):
            pass  # not a scalar event we understand
        pos = end + 4
    return out


def _run_prefix(workdir: str, path: str) -> str:
    run = os.path.relpath(os.path.dirname(path), workdir)
    return "" if run == "." else run.replace(os.sep, "/") + "/"


def read_scalars(workdir) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{tag: (steps, values)}`` from the event files and ``metrics.jsonl`` files of a
    training workdir (see the module docstring). Raises FileNotFoundError if there are none.
    """
    workdir = os.fspath(workdir)
    if not os.path.isdir(workdir):
        raise FileNotFoundError(f"{workdir}: not a directory")
    series: dict[str, dict[int, float]] = {}
    event_files = sorted(glob.glob(os.path.join(glob.escape(workdir), "**", "events.out.tfevents.*"),
                                   recursive=True))
    jsonl_files = sorted(glob.glob(os.path.join(glob.escape(workdir), "**", "metrics.jsonl"), recursive=True))
    if not event_files and not jsonl_files:
        raise FileNotFoundError(f"{workdir}: no TensorBoard event files (events.out.tfevents.*) or "
                                "metrics.jsonl found")
    for path in event_files:
        prefix = _run_prefix(workdir, path)
        for step, tag, value in read_event_file(path):
            series.setdefault(prefix + tag, {})[int(step)] = float(value)
    for path in jsonl_files:
        prefix = _run_prefix(workdir, path)
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(row, dict) or "step" not in row:
                    continue
                for key, value in row.items():
                    if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                        series.setdefault(prefix + key, {})[int(row["step"])] = float(value)
    return {tag: (np.array(sorted(d), dtype=np.int64), np.array([d[s] for s in sorted(d)], dtype=float))
            for tag, d in sorted(series.items())}
