"""Save the distributions of a features output as one PNG (matplotlib, headless)."""

from __future__ import annotations

import numpy as np

from pipelines.optional import require


def save_plot(path: str, lengths: np.ndarray, mixes: dict[str, list[tuple[str, int, float]]]) -> str:
    matplotlib = require("matplotlib", "plot", "inspect --plot (matplotlib)")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(mixes), figsize=(6 + 5 * len(mixes), 4.5))
    axes = np.atleast_1d(axes)
    top = max(int(lengths.max()) if lengths.size else 1, 1)
    axes[0].hist(lengths, bins=np.logspace(0, np.log10(top + 1), 40))
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_title("events per user history")
    axes[0].set_xlabel("retained events")
    for ax, (name, mix) in zip(axes[1:], mixes.items(), strict=True):
        ax.barh([m[0] for m in mix][::-1], [m[1] for m in mix][::-1])
        ax.set_title(f"{name} mix")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
