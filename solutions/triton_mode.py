"""How chapter 10's Triton kernels run here, decided once, before anything imports Triton.

With a CUDA GPU, Triton compiles each kernel for it. Without one, Triton's interpreter runs the
same kernel source on the CPU. The interpreter is chosen by the environment variable
TRITON_INTERPRET=1, which Triton reads when its own library is imported and when a kernel is
decorated. So the choice must be made before the first `import triton`, and that import can
come from anywhere: building a Hugging Face model imports Triton too. Importing `solutions` or
`utils` (every notebook's setup cell, the `course` command, the tests) makes the choice first;
`solutions/kernels/runtime.py` then checks that it held.
"""

from __future__ import annotations

import os
import sys


def choose() -> None:
    """Set TRITON_INTERPRET=1 when there is no CUDA GPU, unless the variable is set already.
    Made too late (Triton imported before), the choice still stands: runtime.py then refuses
    to define kernels, with a message that says why."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def imported_compiled() -> bool:
    """Whether Triton's own library was imported in compiled mode (its `tl` functions are then
    compiled builtins that the interpreter cannot run)."""
    language = sys.modules.get("triton.language")
    return language is not None and type(language.zeros).__name__ != "InterpretedFunction"


choose()
