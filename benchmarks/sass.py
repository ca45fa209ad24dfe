"""Chapter 10's kernels compiled for an H100 (sm_90) here, without a GPU: their machine code.

    python benchmarks/sass.py [--kernel inverse_transform ...] [--arch 90]

`--arch` names another GPU generation by its compute capability: 75 (T4), 80 (A100), 89 (L4),
90 (H100, the default).

Compiled, not timed: what the GPU would run, read from Triton's own toolchain (the cubin it
builds, disassembled by the `cuobjdump` it ships). Each kernel is compiled as a real launch
compiles it: the launches of utils/kernel_compile.py (the GPU wrappers' block sizes, one row
per program, the 16-byte divisibility hints Triton's launcher gives, each constexpr branch).
Prints one JSON object, per kernel and branch:

- `registers` per thread, `spill_bytes` (local memory: registers that did not fit), `shared`
  bytes, `instructions` in the whole kernel;
- `main_loop`: the longest loop (a backward branch and the code it jumps back over), which for
  these kernels is the loop over the row's blocks: its `instructions`, `barriers` (BAR.SYNC:
  every thread of the program waits), `global_loads` by width (LDG.E.128 moves 16 bytes per
  thread, LDG.E 4), `special_function` ops (MUFU: exp, log, reciprocal...), `wgmma`
  (Hopper's tensor-core matrix products, HGMMA in SASS), `mma` (Ampere's, HMMA), `ffma` (fused
  multiply-adds on the ordinary float32 units), and the largest forward branch inside
  it: `skippable_instructions` (an `if` a block can skip) and `path_around_it`, the
  instructions and barriers of a block that skips it;
- `loops`: every loop in the order of the code, its `instructions` and `barriers` (the top-k /
  top-p kernel's main loop is its loop over rounds; the two loops inside it are the passes
  over the row's blocks, the draw and the count).

Fewer instructions and barriers per block, and wider loads, are what a kernel bound by memory
needs to keep enough bytes in flight; this script is the evidence for chapter 10's kernel
changes when no GPU is at hand. It runs in about 15 seconds on a 2-core machine (a few with
Triton's cache of compiled kernels warm).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import tempfile
from collections import Counter

from utils.records import add_record_options, emit

# Compile for a GPU although there is none: before anything imports Triton (solutions would
# otherwise choose the interpreter).
os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def disassemble(cubin: bytes) -> tuple[list[tuple[int, str, str]], str]:
    """[(address, opcode, operands)] of the cubin's SASS, and its resource usage line."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True)
        usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    code = [(int(m[1], 16), m[3], m[4].strip()) for m in LINE.finditer(sass.stdout)]
    return code, usage.stdout


def loop_stats(code: list[tuple[int, str, str]]) -> dict:
    """The longest loop: the code between a backward branch and its target."""
    best = None
    for address, opcode, operands in code:
        if opcode.startswith("BRA") and (m := re.search(r"0x([0-9a-f]+)", operands)):
            target = int(m[1], 16)
            if target < address and (best is None or address - target > best[1] - best[0]):
                best = (target, address)
    if best is None:
        return {"instructions": 0}
    body = [(a, op, args) for a, op, args in code if best[0] <= a <= best[1]]
    loads = Counter(op for _, op, _ in body if op.startswith("LDG"))
    # The largest forward branch inside the loop: code a block can skip (an `if` on the
    # block's data). The path around it is what most blocks run.
    skip = (0, 0)
    for address, opcode, operands in body:
        if opcode.startswith("BRA") and (m := re.search(r"0x([0-9a-f]+)", operands)):
            target = int(m[1], 16)
            if address < target <= best[1] and target - address > skip[1] - skip[0]:
                skip = (address, target)
    around = [(op, args) for a, op, args in body if not skip[0] < a < skip[1]]
    return {
        "instructions": len(body),
        "barriers": sum(op.startswith("BAR") for _, op, _ in body),
        "global_loads": dict(sorted(loads.items())),
        "special_function": sum(op.startswith("MUFU") for _, op, _ in body),
        "wgmma": sum(op.startswith("HGMMA") for _, op, _ in body),
        "mma": sum(op.startswith("HMMA") for _, op, _ in body),
        "ffma": sum(op.startswith("FFMA") for _, op, _ in body),
        "skippable_instructions": len(body) - len(around),
        "path_around_it": {
            "instructions": len(around),
            "barriers": sum(op.startswith("BAR") for op, _ in around),
        },
    }


def all_loops(code: list[tuple[int, str, str]]) -> list[dict]:
    """Every loop (a backward branch and the code it jumps back over), in the code's order."""
    loops = []
    for address, opcode, operands in code:
        if opcode.startswith("BRA") and (m := re.search(r"0x([0-9a-f]+)", operands)):
            target = int(m[1], 16)
            if target < address:
                body = [op for a, op, _ in code if target <= a <= address]
                loops.append((target, len(body), sum(op.startswith("BAR") for op in body)))
    return [{"instructions": n, "barriers": b} for _, n, b in sorted(loops)]


def usage_of(text: str) -> dict:
    found = dict(re.findall(r"(REG|SHARED|LOCAL|STACK):(\d+)", text))
    return {
        "registers": int(found.get("REG", 0)),
        "spill_bytes": int(found.get("LOCAL", 0)),
        "shared": int(found.get("SHARED", 0)),
    }


def compile_launch(launch, branch: dict, module_prefix: str = "solutions.kernels", arch: int = 90):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    from utils import kernel_compile

    kind, _, warp = kernel_compile.TARGET
    target = GPUTarget(kind, arch, warp)
    backend = make_backend(target)
    module = importlib.import_module(f"{module_prefix}.{launch.module}")
    fn = kernel_compile.jit_function(getattr(module, launch.kernel))
    job = {"args": list(launch.args), "options": launch.options}
    options, signature, values, attrs = kernel_compile.as_launched(fn, job, branch, backend)
    source = ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs)
    return triton.compile(source, target=target, options=options.__dict__)


NAMES = {75: "T4", 80: "A100", 86: "RTX 30", 89: "L4", 90: "H100"}


def report(names: list[str] | None = None, arch: int = 90) -> dict:
    from utils import kernel_compile

    out = {"target": f"sm_{arch} ({NAMES.get(arch, 'a GPU')})", "kernels": {}}
    for name, launches in kernel_compile.LAUNCHES.items():
        if names and name not in names:
            continue
        rows = []
        for launch in launches:
            for branch in launch.branches:
                compiled = compile_launch(launch, branch, arch=arch)
                code, usage = disassemble(compiled.asm["cubin"])
                rows.append({
                    "constexprs": branch,
                    "num_warps": launch.options.get("num_warps", 4),
                    **usage_of(usage),
                    "instructions": len(code),
                    "main_loop": loop_stats(code),
                    "loops": all_loops(code),
                })  # fmt: skip
        out["kernels"][name] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", help="a key of LAUNCHES (default: all)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 75 or 80")
    add_record_options(parser)
    args = parser.parse_args()
    emit(report(args.kernel, args.arch), args)


if __name__ == "__main__":
    main()
