"""Chapter 10's kernels compiled for a GPU (an H100: sm_90), here, without one.

Triton's interpreter, which runs the kernels wherever there is no GPU (CI included), runs a
kernel as Python: a `break` or `continue`, a `return` inside a loop, a global that is not a
`tl.constexpr` all run there, and a GPU compiler refuses every one of them. Triton compiles ahead
of time for a named target, down to the GPU's machine code (cubin), on any Linux machine: so a
kernel that passes the interpreter's tests is also compiled as a GPU would compile it.

A process chooses between the interpreter and the compiler once, when Triton is imported, and
the grader runs the interpreter. So the compiler runs in a child process (this module run with
`python -m`, jobs in and verdicts out as JSON) whose environment has TRITON_INTERPRET=0. A
learner's kernel is an interpreter object in a notebook's namespace, not something that child
could import: it goes there as source, one module file per `@triton.jit` function, written with
the globals the function reads. Jit helpers it calls get files of their own, modules are
imported, and values stay as the learner wrote them (`BIG = 2**30` stays a plain int, which a GPU
compiler refuses; `BIG = tl.constexpr(2**30)` stays a constexpr, which it accepts).

`LAUNCHES` holds, for each exercise, what its wrapper passes on a GPU for a batch of 64 rows of
Llama 3's vocabulary: the arguments, and the constexpr branches the wrapper can take (each is a
separate compilation). The child specialises on them with Triton's own launcher code
(`as_launched`): pointers (torch's allocations are aligned) and integers divisible by 16 get
`tt.divisibility` 16, an integer equal to 1 becomes a constant. The solutions' compile test
(tests/machinery/compile/test_kernels_compile.py) compiles the same launches.
"""

from __future__ import annotations

import ast
import importlib
import json
import linecache
import math
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path

from utils import REPO_ROOT
from utils.cells import cell_names, raises_not_implemented
from utils.timing import patient

TARGET = ("cuda", 90, 32)  # an H100: compute capability 9.0, warps of 32 threads
GPU_NAME = "an H100 (sm_90)"
# The compiler's child process may take this long (a few seconds on a busy 2-core machine);
# the graded test that waits for it has a little more, so a slow compile is called one. Both
# are idle-machine figures, stretched alike where used (utils/timing.patient).
COMPILE_TIMEOUT_S = 50.0
COMPILE_BUDGET_S = COMPILE_TIMEOUT_S + 10

B, V = 64, 128_256  # a batch of 64 rows of Llama 3's vocabulary, as a GPU launch sees it
GENERATED = "_course_kernel_"  # the modules written for the child to import
SEED = 12_345  # any seed; this one is no multiple of 16 (a seed of 0 would add divisibility)


@dataclass(frozen=True)
class Launch:
    """How a wrapper launches one kernel on a GPU. `args`: the arguments that are not
    constexprs, in the kernel's order, a pointer as its type ("*fp32"), a number as its value;
    `branches`: the constexpr arguments, by name, one dict per compilation; `options`: launch
    options (num_warps, num_stages) where the wrapper passes some."""

    module: str  # the solution's module, solutions.kernels.<module>
    kernel: str
    args: tuple
    branches: tuple[dict, ...]
    options: dict = field(default_factory=dict)
    # (pattern, why): a regular expression that must not match the compiled kernel's Triton IR
    # (TTIR), and the sentence that says what it means. What the interpreter cannot show.
    forbid: tuple[tuple[str, str], ...] = ()
    # The int32 arguments (sizes) whose product with a program id may pass 2**31 (the wrapper
    # allows such tensors): no pointer offset may come from that product in int32
    # (`int32_offsets` below). True: every int32 argument; () where the wrapper caps the sizes.
    wide: bool | tuple[str, ...] = True


# The fused kernel's scores stay in float32 up to the argmax. The interpreter cannot tell: it
# upcasts bfloat16 tiles before tl.dot, so a cast "back to the input dtype" there casts to
# float32. Compiled for a GPU, the cast is an `arith.truncf` of a float32 tile to 16 bits.
ACCUMULATOR_KEPT = (
    r"arith\.truncf [^\n]*xf32> to tensor<[^\n]*x(bf16|f16)>",
    "the float32 accumulator (or the scores made from it) is rounded to 16 bits before the "
    "argmax: on a GPU every logit near 96 then moves in steps of 1/2 (bfloat16), and ties "
    "decide the token. Keep acc and the scores in float32",
)


INT32_OFFSET = (
    "a pointer offset is an int32 product of a program id and a size ({line}): `rows * n_cols` "
    "in int32 wraps past 2**31 elements (a batch of 16,384 rows of 131,072 columns is 2**31), "
    "and the kernel then reads and writes someone else's memory on a GPU. Make the row index "
    "int64 before multiplying (section 2)"
)
_SSA = re.compile(r"%[\w.#]+")


def int32_offsets(ttir: str, names: bool | tuple[str, ...] = True) -> list[str]:
    """The lines of the kernel's Triton IR where an int32 multiply of a value that depends on
    `tl.program_id` by one computed from the kernel's int32 arguments alone (a size: n_cols)
    feeds a pointer offset (`tt.addptr`). The interpreter computes in Python integers and never
    wraps; a GPU wraps at 2**31."""
    head = next((line for line in ttir.splitlines() if "tt.func public" in line), "")
    sizes = {
        arg for arg in re.findall(r"(%[\w.#]+): i32\b", head) if names is True or arg[1:] in names
    }
    pids, tainted, found = set(), set(), []
    for line in ttir.splitlines():
        code = line.split(" loc(")[0].strip()
        if " = " not in code or not code.startswith("%"):
            continue
        target, rest = code.split(" = ", 1)
        results = [target.split(":")[0]]
        operands = [o for o in _SSA.findall(rest)]
        op = rest.split()[0] if rest.split() else ""
        if op == "tt.get_program_id" or any(o in pids for o in operands):
            pids.update(results)
        elif operands and op != "arith.constant" and all(o in sizes for o in operands):
            sizes.update(results)
        int32 = re.search(r": (i32|tensor<[^>]*xi32>)\s*$", code)
        if (
            op == "arith.muli"
            and int32
            and any(o in pids for o in operands)
            and any(o in sizes for o in operands)
        ):
            tainted.update(results)
        elif any(o in tainted for o in operands):
            if op == "tt.addptr":
                found.append(code)
            tainted.update(results)
    return found


def _fused(dtype: str, n_rows: int, greedy: tuple[bool, ...]) -> Launch:
    """The fused kernel's launch (solutions/kernels/fused_matmul.py, fused_tiles): a tile of
    up to 64 rows, 128 columns, d_model (GPT-2's 768) in steps of 64."""
    block_b = min(max(1 << (n_rows - 1).bit_length(), 16), 64)
    tiles = {"UPCAST": False, "BLOCK_B": block_b, "BLOCK_V": 128, "BLOCK_D": 64}
    return Launch(
        "fused_matmul",
        "fused_matmul_kernel",
        (f"*{dtype}", f"*{dtype}", "*fp32", "*i64", n_rows, V, 768, math.ceil(V / 128), 1.25,
         SEED),
        tuple({"GREEDY": g, **tiles} for g in greedy),
        {"num_warps": 4, "num_stages": 3},
        forbid=(ACCUMULATOR_KEPT,) if dtype != "fp32" else (),
        # fused_matmul_sample caps batch * d_vocab below 2**31, so the [batch, tiles] outputs
        # may use int32 offsets; the rows of h and of W_U times d_model may not.
        wide=("d_model",),
    )  # fmt: skip


# One GPU program per row (BLOCK_B = 1), blocks and warps as the wrappers choose them without
# the interpreter (solutions/kernels/runtime.py: rows_per_program, row_block): up to 16,384
# columns (8,192 for top-k / top-p), 32 per thread; the rejection kernel 4,096 with 4 warps.
# (runtime imports Triton in a mode of its own, so its formula is repeated here;
# tests/machinery/compile/test_kernels_compile.py checks that the two agree.)
def _rows(block_cap: int) -> tuple[dict, dict]:
    """(constexprs, options) of a one-row launch whose blocks hold up to `block_cap` columns."""
    block = min(1 << (V - 1).bit_length(), block_cap)
    warps = max(4, min(16, block // 1024))
    return {"BLOCK_B": 1, "BLOCK_V": block}, {"num_warps": warps}


_WIDE, _WIDE_OPTIONS = _rows(16384)
_TOP, _TOP_OPTIONS = _rows(8192)

LAUNCHES: dict[str, tuple[Launch, ...]] = {
    "softmax_kernel": (
        Launch("row_softmax", "softmax_kernel", ("*bf16", "*bf16", B, V), (_WIDE,),
               _WIDE_OPTIONS),
    ),
    "gumbel_kernel": (
        # gumbel_sample refuses logits of 2**31 elements or more (its int32 offsets).
        Launch("gumbel", "gumbel_kernel", ("*fp32", "*i64", B, V, 1.25, SEED),
               tuple({"GREEDY": g, **_WIDE} for g in (False, True)), _WIDE_OPTIONS,
               wide=()),
    ),
    "inverse_transform": (
        Launch("inverse_transform", "inverse_transform_kernel", ("*fp32", "*i64", B, V, SEED),
               (_WIDE,), _WIDE_OPTIONS),
    ),
    "top_k_top_p": (
        Launch("top_k_top_p", "top_k_top_p_kernel",
               ("*fp32", "*i64", "*i32", B, V, 50, 0.9, SEED),
               tuple({"MODE": m, "MAX_ROUNDS": 256, **_TOP} for m in (0, 1, 2)), _TOP_OPTIONS),
    ),
    # bfloat16 (tensor cores) sampling and greedy for a batch of 64, where the accumulator's
    # precision is checked; float32 ("ieee" dot products, slow to compile for 64 rows) greedy
    # for 16.
    "fused_matmul": (_fused("bf16", B, (False, True)), _fused("fp32", 16, (True,))),
    "rejection_kernel": (
        Launch("rejection", "rejection_kernel",
               ("*fp32", "*fp32", "*i64", "*fp32", "*i64", "*i8", B, 4, V),
               tuple({"GREEDY": g, "BLOCK_B": 1, "BLOCK_V": 4096} for g in (False, True))),
    ),
}  # fmt: skip


# --------------------------------------------------------------------------- the child process


class _Tensor:
    """What Triton's launcher reads of a tensor argument: its element type, and its address
    (torch's allocations on a GPU are aligned to far more than 16 bytes)."""

    def __init__(self, pointer: str):
        import triton.language as tl

        self.dtype = tl.str_to_ty(pointer, None).element_ty

    def data_ptr(self) -> int:
        return 1 << 40


def as_launched(fn, launch: dict, constexprs: dict, backend):
    """(options, signature, constexprs, attrs) for compiling `fn` exactly as Triton's launcher
    does for a launch with these arguments (JITFunction.run: its binder specialises on the
    values, then _pack_args): pointers and integers divisible by 16 get `tt.divisibility` 16,
    an integer equal to 1 becomes a constant, the launch options are parsed for the target."""
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    runtime = [p.name for p in fn.params if not p.is_constexpr]
    wanted = [p.name for p in fn.params if p.is_constexpr]
    if len(runtime) != len(launch["args"]) or sorted(wanted) != sorted(constexprs):
        raise _SignatureError(
            f"its parameters are {', '.join(runtime)} and the constexprs "
            f"{', '.join(wanted) or '(none)'}; the wrapper passes {len(launch['args'])} "
            f"arguments and the constexprs {', '.join(constexprs)}. Keep the signature the cell "
            "gave you"
        )
    kwargs = {**constexprs, **launch["options"]}
    kwargs["debug"] = fn.debug or knobs.runtime.debug  # as JITFunction.run sets them
    # The compilation knobs the launcher adds differ between Triton versions: 3.9 has
    # fpsan_homomorphic_casts, 3.6 and 3.7.1 do not (the compile check failed on them for every
    # kernel, seen on an H100 with 3.6). Add those this Triton has.
    for knob in ("instrumentation_mode", "fpsan_homomorphic_casts"):
        if hasattr(knobs.compilation, knob):
            kwargs[knob] = getattr(knobs.compilation, knob)
    args = [_Tensor(a) if isinstance(a, str) else a for a in launch["args"]]
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    return fn._pack_args(backend, kwargs, bound, specialization, options)


class _SignatureError(Exception):
    pass


def jit_function(obj):
    """The JITFunction under decorators such as @triton.autotune (each keeps it as `.fn`)."""
    from triton.runtime.jit import JITFunction

    for _ in range(10):
        if isinstance(obj, JITFunction):
            return obj
        obj = getattr(obj, "fn", None)
    return None


def _where(err: BaseException, functions) -> tuple[str | None, int | None, str]:
    """(file, line in it, Triton's own words) of the innermost compilation error: the place
    in the function (kernel or helper) where the compiler gave up."""
    from triton.compiler.errors import CompilationError

    innermost = None
    seen = err
    while seen is not None:
        if isinstance(seen, CompilationError):
            innermost = seen
        seen = seen.__cause__ or seen.__context__
    if innermost is None:
        return None, None, f"{type(err).__name__}: {err}"
    words = innermost.error_message or str(innermost)
    node_line = getattr(innermost.node, "lineno", None)
    for fn in functions:
        if fn.src == innermost.src and node_line is not None:
            return fn.fn.__code__.co_filename, fn.def_file_line_number + node_line - 1, words
    return None, None, words


def _child() -> None:
    """Compile the jobs read from stdin; print one JSON list of failures."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    target = GPUTarget(*TARGET)
    backend = make_backend(target)
    failures = []
    for job in json.load(sys.stdin):
        if job["dir"]:
            sys.path.insert(0, job["dir"])
        where = {"kernel": job["kernel"], "branch": None}
        try:
            module = importlib.import_module(job["module"])
            fn = jit_function(getattr(module, job["kernel"]))
            if fn is None:
                raise _SignatureError("it is not a @triton.jit function")
        except Exception as err:  # noqa: BLE001 - reported, as every failure below
            failures.append({**where, "file": None, "line": None, "error": f"{err}"})
            continue
        functions = [  # the kernel and its helpers: where a compilation error can be
            f
            for name, m in list(sys.modules.items())
            if name == job["module"] or name.startswith(GENERATED)
            for f in [jit_function(v) for v in list(vars(m).values())]
            if f is not None
        ]
        for constexprs in job["branches"]:
            where = {"kernel": job["kernel"], "branch": constexprs}
            try:
                options, signature, values, attrs = as_launched(fn, job, constexprs, backend)
                compiled = triton.compile(
                    ASTSource(fn=fn, signature=signature, constexprs=values, attrs=attrs),
                    target=target,
                    options=options.__dict__,
                )
                assert "cubin" in compiled.asm, f"no cubin, only {sorted(compiled.asm)}"
                for pattern, why in job["forbid"]:
                    if re.search(pattern, compiled.asm["ttir"]):
                        failures.append(
                            {**where, "file": None, "line": None, "error": why, "compiled": True}
                        )
                wraps = int32_offsets(compiled.asm["ttir"], job["wide"])
                if wraps:
                    why = INT32_OFFSET.format(line=wraps[0].split(" : ")[0])
                    failures.append(
                        {**where, "file": None, "line": None, "error": why, "compiled": True}
                    )
            except _SignatureError as err:
                failures.append({**where, "file": None, "line": None, "error": f"{err}"})
                break
            except Exception as err:  # noqa: BLE001
                file, line, words = _where(err, functions)
                failures.append({**where, "file": file, "line": line, "error": words})
    print(json.dumps(failures))


# --------------------------------------------------------------------------- the grader's side


_NOT_FOR_THE_COMPILER = ("TRITON_INTERPRET", "TRITON_ALLOW_NON_CONSTEXPR_GLOBALS")


@dataclass(frozen=True)
class Job:
    """Compile `kernel` of `module` (importable from `dir`, when given) as `launch` says."""

    module: str
    kernel: str
    launch: Launch
    dir: str | None = None


@dataclass(frozen=True)
class Failure:
    kernel: str
    branch: dict | None  # the constexprs it was compiled with (None: it did not get that far)
    file: str | None  # where the compiler gave up: the file and line...
    line: int | None
    error: str  # ...and what it said
    # True: it compiled, but its code does what the interpreter hides (a forbidden pattern, an
    # int32 offset); `error` is then the whole sentence for the learner.
    compiled: bool = False


def run_compiler(jobs: list[Job], timeout_s: float = COMPILE_TIMEOUT_S) -> list[Failure]:
    """Compile every job in one child process (Triton in compiled mode, targeting sm_90, no
    GPU needed); the failures, every one of them."""
    payload = [
        {
            "dir": job.dir,
            "module": job.module,
            "kernel": job.kernel,
            "args": list(job.launch.args),
            "branches": list(job.launch.branches),
            "options": job.launch.options,
            "forbid": [list(f) for f in job.launch.forbid],
            "wide": job.launch.wide,
        }
        for job in jobs
    ]
    # The learner's environment, less what makes Triton interpret, or accept any global.
    env = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_THE_COMPILER}
    with tempfile.TemporaryDirectory(prefix="course-triton-cache-") as cache:
        env["TRITON_INTERPRET"] = "0"  # compile, although there is no GPU
        env["TRITON_CACHE_DIR"] = cache  # compile for real, not from an earlier run's cache
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default (no warning)
        try:
            done = subprocess.run(
                [sys.executable, "-m", __name__],
                input=json.dumps(payload),
                cwd=REPO_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=patient(timeout_s),
            )
        except subprocess.TimeoutExpired:
            kernels = ", ".join(sorted({f"`{job.kernel}`" for job in jobs}))
            limit = patient(timeout_s)
            raise AssertionError(
                f"compiling {kernels} for {GPU_NAME} took more than {limit:.0f} s (a few "
                "seconds is usual): a loop over a constexpr range (`tl.static_range`) so long "
                "that unrolling it never ends?"
            ) from None
    lines = done.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(
            f"the compiler's process failed (exit code {done.returncode}):\n"
            f"{done.stdout[-2000:]}{done.stderr[-3000:]}"
        ) from None
    return [Failure(**f) for f in found]


# --------------------------------------------------------------------------- a learner's kernel


def python_function(kernel) -> types.FunctionType:
    """The plain Python function under a @triton.jit object (interpreted or compiled), also
    under decorators such as @triton.autotune, which keep what they wrap as `.fn`."""
    obj = kernel
    for _ in range(10):
        if _is_jit(obj) and isinstance(obj.fn, types.FunctionType):
            return obj.fn
        obj = getattr(obj, "fn", None)
    name = getattr(kernel, "__name__", repr(kernel))
    raise AssertionError(f"`{name}` is not a Triton kernel: decorate it with @triton.jit")


def _is_jit(value) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return isinstance(value, JITFunction | InterpretedFunction)


def _definition(fn: types.FunctionType) -> ast.FunctionDef:
    source = textwrap.dedent(_source(fn))
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            return node
    raise AssertionError(f"the source of {fn.__name__} has no function definition")


def _source(fn: types.FunctionType) -> str:
    try:
        import inspect

        return inspect.getsource(fn)
    except (OSError, TypeError) as err:
        raise AssertionError(
            f"the source of {fn.__name__} cannot be found ({err}): run its cell again"
        ) from None


def still_a_stub(fn: types.FunctionType) -> bool:
    """Whether the function still raises NotImplementedError (the blank exercise does)."""
    return any(raises_not_implemented(node) for node in ast.walk(_definition(fn)))


def _literal(value) -> str | None:
    """Source that rebuilds `value` in another process, or None."""
    if value is None or isinstance(value, bool | int | str):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, tuple | list):
        parts = [_literal(v) for v in value]
        if any(p is None for p in parts):
            return None
        if hasattr(value, "_fields"):  # a namedtuple, which Triton accepts as a global
            name, fields = type(value).__name__, tuple(value._fields)
            return f"_course_collections.namedtuple({name!r}, {fields!r})({', '.join(parts)})"
        inner = ", ".join(parts) + ("," if len(parts) == 1 and isinstance(value, tuple) else "")
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    import triton.language as tl

    if isinstance(value, tl.dtype):
        return f"_course_tl.dtype({value.name!r})"
    if isinstance(value, tl.constexpr):
        inner = _literal(value.value)
        return None if inner is None else f"_course_tl.constexpr({inner})"
    return None


@dataclass
class _Origin:
    label: str  # "the `inverse_transform` cell", "solutions/kernels/rejection.py"
    source_file: str  # where linecache has the lines (the cell's compile name, or a file)
    offset: int  # line in the cell = line in the written file + offset


def _label(filename: str) -> str:
    cell = re.fullmatch(r"<(.*) #\d+>", filename)
    if cell:
        return cell.group(1)
    path = Path(filename)
    if "ipykernel" in filename or filename.startswith("<"):  # a running notebook's cell
        return "your cell"
    return str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)


class KernelFiles:
    """A learner's jit functions written to module files in `directory`, one per function,
    each with the globals it reads, so that another process can import and compile them."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.modules: dict[int, str] = {}  # id(python function) -> module name
        self.origins: dict[str, _Origin] = {}  # written file -> where its lines come from

    def add(self, kernel) -> str:
        """Write `kernel` (and what it reads); the module's name."""
        fn = python_function(kernel)
        if id(fn) in self.modules:
            return self.modules[id(fn)]
        module = f"{GENERATED}{len(self.modules)}"
        self.modules[id(fn)] = module
        source = textwrap.dedent(_source(fn))
        names = cell_names(source)
        header = [
            "# Written by utils/kernel_compile.py: a kernel of a notebook's, to compile.",
            "import collections as _course_collections",
            "import types as _course_types",
            "",
            "import triton.language as _course_tl",
            "",
        ]
        for name in sorted(names.free if names else ()):
            if name in fn.__globals__:
                header.append(self._global(name, fn.__globals__[name]))
        header.append("")
        path = self.directory / f"{module}.py"
        path.write_text("\n".join(header) + "\n" + source)
        first_line = fn.__code__.co_firstlineno  # of the decorator, as getsource's first line
        self.origins[str(path)] = _Origin(
            _label(fn.__code__.co_filename), fn.__code__.co_filename, first_line - len(header) - 1
        )
        return module

    def _global(self, name: str, value) -> str:
        if isinstance(value, types.ModuleType):
            return f"import {value.__name__} as {name}"
        if _is_jit(value):
            fn = python_function(value)
            home = sys.modules.get(fn.__module__)
            if fn.__module__.split(".")[0] == "triton" and getattr(home, fn.__name__, 0) is value:
                return f"from {fn.__module__} import {fn.__name__} as {name}"
            # A helper of the learner's, or a given one: a file of its own.
            return f"from {self.add(value)} import {fn.__name__} as {name}"
        home = getattr(value, "__module__", None) or ""
        if home.split(".")[0] == "triton" and hasattr(value, "__name__"):
            if getattr(sys.modules.get(home), value.__name__, 0) is value:
                return f"from {home} import {value.__name__} as {name}"
        literal = _literal(value)
        if literal is not None:
            return f"{name} = {literal}"
        # Anything else (a tensor, a plain function, a class): an object a GPU compiler refuses
        # as a global, as it refuses the original.
        return f"{name} = _course_types.SimpleNamespace(kind={type(value).__name__!r})"

    def place(self, failure: Failure) -> str | None:
        """'line 27 of the `inverse_transform` cell' and that line, for a failure's place."""
        if failure.file is None or failure.line is None:
            return None
        origin = self.origins.get(failure.file)
        if origin is None:  # a file of its own (the solutions), not a written copy
            label, line, lines_of = _label(failure.file), failure.line, failure.file
        else:
            label, line, lines_of = origin.label, failure.line + origin.offset, origin.source_file
        text = linecache.getline(lines_of, line).strip()
        return f"line {line} of {label}" + (f": `{text}`" if text else "")


# What Triton says -> (the refusal in a few words, what to do instead).
_REFUSALS = [
    (
        r"unsupported AST node type: (Break|Continue)",
        "`{0}` is not supported",
        "A GPU kernel's loop runs to its end: there is no `break` or `continue`. Let every "
        "block be read, and keep what a row has already found with a mask (`tl.where`), so "
        "that the blocks after it change nothing.",
    ),
    (
        r"Cannot have `return` statements inside `while` or `for`",
        "`return` inside a loop is not supported",
        "Let the loop run to its end, then store (or return) after it.",
    ),
    (
        r"Cannot access global variable (\w+)",
        "the global `{0}` is not a `tl.constexpr`",
        "A GPU compiler builds only constants into a kernel, and a global is one only when it "
        "is a `tl.constexpr`: pass `{0}` as an argument, or define it as "
        "`{0} = tl.constexpr(...)`.",
    ),
]


def explain(failure: Failure, files: KernelFiles | None = None) -> str:
    """A failure in a tutor's words: which kernel, why (Triton's error), where (the line)."""
    words = failure.error.strip() or "(no message)"
    if failure.compiled:  # it compiles: what it would do on a GPU is the message
        branch = ", ".join(f"{k}={v}" for k, v in (failure.branch or {}).items())
        return (
            f"`{failure.kernel}` compiled for {GPU_NAME} ({branch}) does what the interpreter "
            f"hides: {words}"
        )
    short, hints = words.splitlines()[-1][:160], []
    for pattern, refusal, hint in _REFUSALS:
        match = re.search(pattern, words)
        if match:
            found = [g.lower() for g in match.groups()] if "AST" in pattern else match.groups()
            short, hints = refusal.format(*found), [hint.format(*match.groups())]
            break
    first = f"a GPU compiler refuses `{failure.kernel}`: {short}"
    place = (files or KernelFiles(Path())).place(failure)
    if place:
        first += f" ({place})"
    branch = (
        " (" + ", ".join(f"{k}={v}" for k, v in failure.branch.items()) + ")"
        if failure.branch
        else ""
    )
    return "\n\n".join(
        [
            first,
            f"Compiled for {GPU_NAME} as a GPU launch compiles it{branch}. Triton's "
            "interpreter, which runs your kernel on this machine, runs any Python; a GPU "
            "compiler takes only Triton's subset of it.",
            *hints,
            f"Triton says:\n{textwrap.indent(words, '    ')}",
        ]
    )


def assert_compiles_for_a_gpu(kernel, exercise: str) -> None:
    """The graded check of a learner's kernel: NotImplementedError while it is the blank stub,
    an AssertionError saying what, why and where when a GPU compiler refuses it."""
    fn = python_function(kernel)
    if still_a_stub(fn):
        raise NotImplementedError(f"{fn.__name__} still raises NotImplementedError")
    with tempfile.TemporaryDirectory(prefix="course-kernel-") as tmp:
        files = KernelFiles(Path(tmp))
        module = files.add(kernel)
        jobs = [Job(module, fn.__name__, launch, tmp) for launch in LAUNCHES[exercise]]
        failures = run_compiler(jobs)
    if failures:
        total = sum(len(launch.branches) for launch in LAUNCHES[exercise])
        more = f"\n\n({len(failures)} of {total} compilations failed; this was the first.)"
        raise AssertionError(explain(failures[0], files) + (more if failures[1:] else ""))


if __name__ == "__main__":
    _child()
