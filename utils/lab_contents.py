"""What JupyterLab's server hands the browser when a learner opens a notebook.

When a kernel starts, JupyterLab writes the kernel's `kernelspec` and `language_info` into the
notebook's metadata, and a notebook whose metadata changed is "modified": closing it, unsaved,
asks whether to save. The build cannot write what the kernel will report (the version of the
learner's Python is part of `language_info`), so the server writes it as it reads the file:
`CourseContentsManager` gives each notebook of the python3 kernel the metadata that kernel
reports, and a notebook just opened is not modified. The file on disk is left as it is until
the learner saves. `make lab-settings` installs utils/jupyter_server_config.json, which names
it, as the environment's jupyter_server_config.json (Jupyter reads `contents_manager_class`
there; the extension folder beside it, jupyter_server_config.d/, only enables extensions).
"""

from __future__ import annotations

import functools

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


@functools.cache
def kernel_metadata() -> dict:
    """The python3 kernel's `kernelspec` and `language_info`, as JupyterLab writes them: the
    kernel is ipykernel on this server's Python (its built-in python3 spec runs
    sys.executable), unless another python3 spec is installed, whose name Lab would write."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    return {
        "kernelspec": {
            "display_name": spec.display_name,
            "language": spec.language,
            "name": "python3",
        },
        "language_info": dict(IPythonKernel.language_info),
    }


class CourseContentsManager(AsyncLargeFileManager):
    """Jupyter's own contents manager, with a python3 notebook's kernel metadata as its kernel
    will report it."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "notebook" and model.get("content") is not None:
            metadata = model["content"].metadata
            if metadata.get("kernelspec", {}).get("name") == "python3":
                metadata.update(kernel_metadata())
        return model
