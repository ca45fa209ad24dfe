"""Tensors made on the wrong device, found on a CPU.

On a GPU, a tensor made without `device=` lands on the CPU and meets the GPU's tensors in the
next operation, which fails; on a CPU every tensor is on the CPU and nothing shows. Where code
can run on PyTorch's `meta` device (shapes, no values), the tests run it there (chapter 1's
attention, chapter 4's `causal_mask` and `positions_and_allowed`). Code that reads values on the
way (the argument checks of `forward_with_cache`, a sampler's branches) cannot run there, so
for it the source is read instead: each call of a torch factory function must say where its
tensor goes (`device=`) or be moved at once (`.to(...)`)."""

from __future__ import annotations

import ast
import inspect
import textwrap

from utils.kernel_compile import still_a_stub

# torch functions that make a new tensor on the CPU unless told otherwise (the *_like ones
# follow their argument, and are not here).
FACTORIES = {
    "arange", "empty", "eye", "full", "linspace", "ones", "rand", "randint", "randn",
    "randperm", "tensor", "zeros",
}  # fmt: skip


def made_without_a_device(fn) -> list[str]:
    """'torch.arange(...) on line N of its cell' for each factory call in `fn` that names no
    device and is not moved by a `.to(...)` straight after; NotImplementedError while `fn` is
    the blank exercise (which has no code to read)."""
    if still_a_stub(fn):
        raise NotImplementedError(f"{fn.__qualname__} still raises NotImplementedError")
    lines, first = inspect.getsourcelines(fn)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    moved = {
        id(node.func.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "to"
        and isinstance(node.func.value, ast.Call)
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
            and node.func.attr in FACTORIES
            and not any(k.arg == "device" for k in node.keywords)
            and id(node) not in moved
        ):
            found.append(
                f"torch.{node.func.attr}(...) on line {first + node.lineno - 1} of its cell"
            )
    return found


def assert_made_on_the_inputs_device(fn, what: str, whose: str) -> None:
    """Every tensor `fn` makes says where it goes."""
    found = made_without_a_device(fn)
    assert not found, (
        f"{what} makes {', '.join(found)} without a device: on a GPU that tensor sits on the "
        f"CPU while {whose} are on the GPU, and the next operation fails (here, on a CPU, "
        f"nothing shows). Make each new tensor on {whose}' device."
    )
