"""JupyterLab's server, as `make lab` configures it, gives a notebook the metadata its kernel
reports (utils/lab_contents.py), so a notebook just opened is not "modified"; the file on disk
is left alone. Ground truth: a real python3 kernel's own kernel_info reply. (The browser test
checks the same in JupyterLab: the notebook's tab is not marked modified once its kernel is up.)
"""

from __future__ import annotations

import asyncio
import json
import shutil

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel

from utils import REPO_ROOT
from utils.lab_contents import CourseContentsManager

NOTEBOOK = REPO_ROOT / "notebooks" / "01_transformer.ipynb"


def test_an_opened_notebook_carries_its_kernels_metadata_and_the_file_is_left_alone(tmp_path):
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    before = (tmp_path / NOTEBOOK.name).read_bytes()
    manager = CourseContentsManager(root_dir=str(tmp_path))
    served = asyncio.run(manager.get(NOTEBOOK.name)).get("content").metadata

    kernel, client = start_new_kernel(kernel_name="python3")
    try:
        reported = client.kernel_info(reply=True)["content"]["language_info"]
    finally:
        client.stop_channels()
        kernel.shutdown_kernel(now=True)
    assert json.loads(json.dumps(served["language_info"])) == reported
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert served["kernelspec"] == {
        "display_name": spec.display_name,
        "language": spec.language,
        "name": "python3",
    }
    assert served["course"] == json.loads(before)["metadata"]["course"]  # the rest is kept
    assert (tmp_path / NOTEBOOK.name).read_bytes() == before


def test_a_file_that_is_not_a_notebook_is_served_as_it_is(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    manager = CourseContentsManager(root_dir=str(tmp_path))
    assert asyncio.run(manager.get("notes.txt"))["content"] == "hello"
