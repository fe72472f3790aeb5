"""In a notebook, a figure that minibert returns shows as an image with no `%matplotlib inline`
(that `import minibert` loads no matplotlib is test_layers' check)."""

from __future__ import annotations

import base64

import nbclient
import nbformat

FIGURE = ("import numpy as np\nfrom minibert.viz import figures\n"
          "figures.attention_heatmap(np.full((3, 3), 1 / 3), ['[CLS]', 'hi', '[SEP]'])")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def executed(tmp_path, *sources: str) -> list[list[dict]]:
    """Each code cell's outputs after running the cells in a fresh kernel of this Python."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    # The timeouts guard against a hang; each wait ends when its message arrives. nbclient's default waits only
    # 4 s for a cell's outputs after its reply and then drops them with a log line (on a loaded CI machine the
    # figure's display_data can come later): wait longer, and fail saying so rather than with a missing image.
    client = nbclient.NotebookClient(notebook, timeout=300, startup_timeout=300, iopub_timeout=120,
                                     raise_on_iopub_timeout=True, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return [cell.outputs for cell in notebook.cells]


def images(outputs: list[dict]) -> list[bytes]:
    return [base64.b64decode(output["data"]["image/png"]) for output in outputs
            if output["output_type"] in ("execute_result", "display_data") and "image/png" in output["data"]]


def test_a_returned_figure_shows_as_an_image(tmp_path, monkeypatch):
    """As a user's fresh notebook: no MPLBACKEND set, no pyplot, no magic; the last expression is a figure.
    After pyplot is imported (which registers the inline formatter) it still shows exactly once."""
    monkeypatch.delenv("MPLBACKEND", raising=False)
    bare, with_pyplot = executed(tmp_path, FIGURE, "import matplotlib.pyplot\n" + FIGURE)
    for outputs in (bare, with_pyplot):
        shown = images(outputs)
        assert len(shown) == 1, outputs
        assert shown[0].startswith(PNG_MAGIC) and len(shown[0]) > 1000
