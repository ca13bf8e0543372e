"""What adpsgd-report's pictures share (report.py's per-run ones, report_groups.py's bands):
the panels of a figure and which way a metric improves."""

from __future__ import annotations


def lower_is_better(metric: str) -> bool:
    return any(word in metric for word in ("wer", "loss", "err"))


def panel_figure(panels: int, max_columns: int | None = None):
    """A figure of ``panels`` panels of one size, in rows of at most ``max_columns`` (None:
    one row), so that many runs make a taller picture, not an ever wider one."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    from matplotlib.figure import Figure

    columns = max(1, min(panels, max_columns or panels))
    rows = -(-panels // columns)
    fig = Figure(figsize=(5.2 * columns, 3.8 * rows), dpi=90, layout="constrained")
    return fig, [fig.add_subplot(rows, columns, i + 1) for i in range(panels)]
