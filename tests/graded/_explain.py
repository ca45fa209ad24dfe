"""How a learner's tensor differs from the oracle's, in words: the grading helpers' one explainer.

A test that knows a slip by name (√d_head missing, the table not used) says so; this module
covers every other slip, by describing the difference itself, computed from the two tensors:
which axis and which positions, heads or rows differ, and the pattern where one fits (a
permutation along an axis, a transpose, a shift by one, a scale factor, a sign flip, an added
constant or vector, zeros where values were expected, a lower precision's rounding, NaN or
inf). `explain_difference` returns a few sentences, or "" when the tensors agree, and never
raises: where nothing fits it lists the largest differences with their indices.

Every check is a few passes over the tensors (up to about a million elements); the ones that
compare slices pairwise run only along short axes.
"""

from __future__ import annotations

import itertools
import math

import torch

__all__ = ["explain_difference", "sentences"]

_MAX_SLICES = 64  # slice-by-slice matching (permutations, repeats) along axes this short
_MAX_PAIR_WORK = 40_000_000  # elements compared in all, at most, by the slice matching
_MAX_ELEMENTS = 4_000_000  # larger tensors (a batch of full-context logits): where, and largest


def explain_difference(
    got,
    expected,
    axes: tuple[str, ...] | None = None,
    atol: float = 1e-4,
    rtol: float = 1e-3,
) -> str:
    """How `got` differs from `expected`, in a tutor's sentences ("" when they agree).

    `axes` names expected's dimensions ("batch", "posn", "head", "d_head"), so that sentences
    say "along 'posn'"; without it they say "along axis 1". `atol` and `rtol` are the
    closeness bounds of the comparison (those of `torch.isclose`).
    """
    try:
        return _explain(got, expected, axes, atol, rtol)
    except Exception as error:  # a diagnosis must never take the test down
        try:
            return _largest(_as_tensor(got), _as_tensor(expected), _Axes(axes, 0), atol, rtol)
        except Exception:
            return f"(the difference could not be described: {type(error).__name__})"


def sentences(*parts: str) -> str:
    """A message's parts joined as sentences (what was compared, how it differs, the slip that
    points to): empty parts are left out, a part without a closing mark gets a full stop."""
    parts = tuple(p.strip() for p in parts if p and p.strip())
    return " ".join(p if p[-1] in ".?!:)" else p + "." for p in parts)


# --------------------------------------------------------------------------- words


class _Axes:
    def __init__(self, names: tuple[str, ...] | None, ndim: int):
        names = tuple(names or ())
        self.names = names if len(names) == ndim else tuple(f"axis {i}" for i in range(ndim))
        self.named = len(names) == ndim and ndim > 0

    def along(self, k: int) -> str:
        return f"along '{self.names[k]}'" if self.named else f"along {self.names[k]}"

    def name(self, k: int) -> str:
        return f"'{self.names[k]}'" if self.named else self.names[k]

    def noun(self, k: int, plural: bool) -> str:
        name = self.names[k].lower() if self.named else ""
        for keys, one, many in [
            (("pos", "seq", "query", "key", "token", "step", "slot"), "position", "positions"),
            (("head",), "head", "heads"),
            (("batch", "row", "request", "seq_id"), "row", "rows"),
            (("layer",), "layer", "layers"),
            (("vocab",), "token", "tokens"),
        ]:  # fmt: skip
            if any(key in name for key in keys) and not name.startswith("d_"):
                return many if plural else one
        return "indices" if plural else "index"

    def at(self, index: tuple[int, ...]) -> str:
        if self.named:
            return "(" + ", ".join(f"{n}={i}" for n, i in zip(self.names, index, strict=True)) + ")"
        return str(tuple(index)) if len(index) != 1 else f"({index[0]})"


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0..2, 5, 7..8' (at most a few runs, then '...')."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    words = [f"{a}" if a == b else f"{a}..{b}" for a, b in runs[:6]]
    return ", ".join(words) + (", ..." if len(runs) > 6 else "")


def _num(x: float) -> str:
    return f"{x:.4g}"


def _factor_words(c: float) -> str:
    """0.125 -> '0.125 (1/8, 1/√64)': the simple forms a scale factor has, if any."""
    forms = []
    sign = "-" if c < 0 else ""
    for a, prefix in [(abs(c), ""), (1 / abs(c), "1/")]:
        k, sq = round(a), round(a * a)
        if prefix and k > 1 and abs(a - k) < 1e-3 * a:
            forms.append(f"{sign}{prefix}{k}")
        if (
            sq >= 3
            and abs(a * a - sq) < 2e-3 * a * a
            and (prefix or abs(a - k) > 1e-3 * a or sq >= 16)
        ):
            forms.append(f"{sign}{prefix}√{sq}")
    return _num(c) + (f" ({', '.join(forms)})" if forms else "")


# --------------------------------------------------------------------------- the tensors


def _as_tensor(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    return torch.as_tensor(x)


def _float(x: torch.Tensor) -> torch.Tensor:
    x = x.to("cpu") if x.device.type != "meta" else x
    if x.is_complex():
        return x.abs().double()
    return x.double()


def _explain(got, expected, axes, atol, rtol) -> str:
    if got is None:
        return "Your code returned None where a tensor was expected (a missing `return`?)."
    if not isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor):
        try:
            got_t = torch.as_tensor(got)
        except Exception:
            return f"Your code returned a {type(got).__name__} where a tensor was expected."
        prefix = f"Your code returned a {type(got).__name__}, not a tensor. "
    else:
        got_t, prefix = _as_tensor(got), ""
    expected_t = _as_tensor(expected)
    if got_t.device.type == "meta" or expected_t.device.type == "meta":
        return prefix.strip()
    names = _Axes(axes, expected_t.dim())
    sentences = [prefix.strip()] if prefix else []
    if got_t.dtype != expected_t.dtype and (
        got_t.is_floating_point() or expected_t.is_floating_point()
    ):
        sentences.append(
            f"Your output's dtype is {_dtype(got_t)} where {_dtype(expected_t)} was expected."
        )
    if got_t.shape == expected_t.shape and got_t.numel() > _MAX_ELEMENTS:
        sentences.append(_big(got_t, expected_t, names, atol, rtol))
        return " ".join(s for s in sentences if s)
    g, e = _float(got_t), _float(expected_t)
    if g.shape != e.shape:
        sentences.append(_shape(g, e, names, atol, rtol))
        return " ".join(s for s in sentences if s)
    if g.numel() == 0:
        return " ".join(sentences)
    sentences.append(_same_shape(g, e, names, atol, rtol, got_t.dtype, expected_t.dtype))
    return " ".join(s for s in sentences if s)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _close(g: torch.Tensor, e: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """`torch.isclose(..., equal_nan=True)`, a few times faster."""
    return ((g - e).abs() <= atol + rtol * e.abs()) | (g == e) | (g.isnan() & e.isnan())


_PROBE = torch.randint(0, 2**62, (512,), generator=torch.Generator().manual_seed(0))


def _allclose(g: torch.Tensor, e: torch.Tensor, atol: float, rtol: float) -> bool:
    if g.shape != e.shape:
        return False
    if g.numel() > 4096:  # most candidate patterns fail: try a few hundred values first
        probe = _PROBE % g.numel()
        if not bool(_close(torch.take(g, probe), torch.take(e, probe), atol, rtol).all()):
            return False
    return bool(_close(g, e, atol, rtol).all())


# --------------------------------------------------------------------------- shapes


def _shape(g, e, names: _Axes, atol, rtol) -> str:
    got, want = tuple(g.shape), tuple(e.shape)
    head = f"Your output has shape {got} where {want} was expected"
    if g.numel() == e.numel() and g.dim() == e.dim() and sorted(got) == sorted(want):
        for perm in itertools.permutations(range(e.dim())):
            if tuple(want[p] for p in perm) != got:
                continue
            if _allclose(g, e.permute(perm), atol, rtol):
                moved = [k for k in range(e.dim()) if perm[k] != k]
                what = " and ".join(names.name(k) for k in sorted(moved, key=lambda k: perm[k]))
                return (
                    f"{head}: the right values with axes {what} swapped (a transpose or "
                    "permute missing, or one too many?)."
                )
        if _allclose(g.reshape(want), e, atol, rtol):
            return (
                f"{head}: the right values in the right memory order, viewed as the wrong "
                "shape (a reshape or view where a transpose, or no reshape, was meant?)."
            )
        swapped = [k for k in range(e.dim()) if got[k] != want[k]]
        if len(swapped) == 2:
            a, b = swapped
            return f"{head}: axes {names.name(a)} and {names.name(b)} swapped?"
    if [s for s in got if s != 1] == [s for s in want if s != 1]:
        extra = "added" if g.dim() > e.dim() else "lost" if g.dim() < e.dim() else "moved"
        right = "the right values, " if _allclose(g.reshape(want), e, atol, rtol) else ""
        return (
            f"{head}: {right}with an axis of size 1 {extra} (keepdim, unsqueeze or squeeze?)."
            + (" Or did a tensor with more axes than the input join the computation (a weight "
               "given leading axes of size 1, say)? Broadcasting adds its axes to the output."
               if extra == "added" else "")
        )  # fmt: skip
    if g.numel() == e.numel():
        if _allclose(g.reshape(want), e, atol, rtol):
            return (
                f"{head}: the right values, in the wrong shape (a reshape, squeeze or unsqueeze?)."
            )
        return (
            f"{head}: as many values, arranged differently (a reshape or view of the wrong axes?)."
        )
    if g.dim() == e.dim():
        differ = [k for k in range(e.dim()) if got[k] != want[k]]
        if len(differ) == 1:
            k = differ[0]
            n, m = got[k], want[k]
            words = f"{head}: {names.along(k)} yours has {n} where {m} were expected"
            if n < m:
                if _allclose(g, e.narrow(k, 0, n), atol, rtol):
                    return (
                        f"{words}, and they are the first {n} of them (the last {m - n} missing)."
                    )
                if _allclose(g, e.narrow(k, m - n, n), atol, rtol):
                    return (
                        f"{words}, and they are the last {n} of them (the first {m - n} missing)."
                    )
            else:
                if _allclose(g.narrow(k, 0, m), e, atol, rtol):
                    return f"{words}: the first {m} are right, {n - m} more follow (one too many?)."
                if _allclose(g.narrow(k, n - m, m), e, atol, rtol):
                    return f"{words}: the last {m} are right, {n - m} extra come first."
            return words + "."
    if g.dim() == e.dim() + 1:
        return f"{head}: one axis more than expected."
    if g.dim() + 1 == e.dim():
        return f"{head}: one axis fewer than expected (reduced over an axis that should stay?)."
    return head + "."


# --------------------------------------------------------------------------- same shape


def _same_shape(g, e, names: _Axes, atol, rtol, got_dtype, expected_dtype) -> str:
    close = _close(g, e, atol, rtol)
    if bool(close.all()):
        return ""
    bad = ~close
    n_bad, n = int(bad.sum()), bad.numel()
    finite = torch.isfinite(g) & torch.isfinite(e)
    sentences = [_nonfinite(g, e, bad, names)]
    low = _lower_precision(got_dtype, expected_dtype)
    pattern = _global_pattern(g, e, finite, names, atol, rtol) if not low else ""
    if pattern:
        return " ".join(s for s in sentences + [pattern] if s)
    where = _where(bad, names, n_bad, n)
    sentences.append(where)
    local = _local_pattern(g, e, bad, finite, atol, rtol) if where else ""
    if not local and not where and bool(finite.all()):
        local = _offset_along(g, e, names, atol, rtol)
    sentences.append(local)
    if not local and (bool(finite.all()) or low):
        local = _precision(g, e, bad, finite, got_dtype, expected_dtype, low)
        sentences.append(local)
    if not local and not sentences[0]:
        sentences.append(_largest(g, e, names, atol, rtol, bad, plain=not where))
    return " ".join(s for s in sentences if s)


def _nonfinite(g, e, bad, names: _Axes) -> str:
    words = []
    for what, test in [("NaN", torch.isnan), ("inf", torch.isinf)]:
        mask = test(g) & bad
        if bool(mask.any()):
            index = tuple(int(i) for i in mask.nonzero()[0])
            count = int(mask.sum())
            where = (
                "everywhere"
                if count == g.numel()
                else (f"at {count} of {g.numel()} values, the first at {names.at(index)}")
            )
            words.append(
                f"Your output has {what} {where} where the expected values are finite"
                + (
                    " (a 0/0, an exp that overflows, a -inf row of a mask with nothing allowed?)"
                    if what == "NaN"
                    else " (an overflow, or a mask's -inf that leaked out?)"
                )
                + "."
            )
        mask = test(e) & bad
        if bool(mask.any()):
            index = tuple(int(i) for i in mask.nonzero()[0])
            words.append(
                f"The expected output has {what} at {int(mask.sum())} values (the first at "
                f"{names.at(index)}) where yours is finite."
            )
    return " ".join(words)


def _global_pattern(g, e, finite, names, atol, rtol) -> str:
    """A pattern that explains the whole tensor, or ""."""
    if not bool(finite.all()):
        return ""
    if bool((g == 0).all()):
        return "Your output is all zeros (nothing written, or multiplied by a zero?)."
    if g.dim() >= 1:
        for sentence in (
            _transposed(g, e, names, atol, rtol),
            _shifted(g, e, names, atol, rtol),
            _slices(g, e, names, atol, rtol),
        ):
            if sentence:
                return sentence
    return _scale(g, e, atol, rtol) or _constant(g, e, atol, rtol)


def _transposed(g, e, names: _Axes, atol, rtol) -> str:
    d = e.dim()
    for a, b in itertools.combinations(range(d), 2):
        if (
            e.shape[a] == e.shape[b]
            and e.shape[a] > 1
            and _allclose(g, e.transpose(a, b), atol, rtol)
        ):
            return (
                f"Yours is the expected transposed: axes {names.name(a)} and {names.name(b)} "
                "swapped (both have the same size, so the shape could not tell)."
            )
    for a, b in itertools.combinations(range(d), 2):
        if e.shape[a] == e.shape[b] or e.shape[a] == 1 or e.shape[b] == 1:
            continue
        if _allclose(g, e.transpose(a, b).reshape(e.shape), atol, rtol):
            return (
                f"Yours has the right shape but the values of the expected with axes "
                f"{names.name(a)} and {names.name(b)} swapped, read in memory order: a reshape "
                "or view where a transpose was meant?"
            )
    return ""


def _shifted(g, e, names: _Axes, atol, rtol) -> str:
    for k in range(e.dim()):
        size = e.shape[k]
        if size < 3:
            continue
        for s in (1, -1):
            if s == 1:
                mine, theirs = g.narrow(k, 1, size - 1), e.narrow(k, 0, size - 1)
            else:
                mine, theirs = g.narrow(k, 0, size - 1), e.narrow(k, 1, size - 1)
            if _allclose(mine, theirs, atol, rtol) and not _allclose(
                mine, e.narrow(k, 1 if s == 1 else 0, size - 1), atol, rtol
            ):
                noun = names.noun(k, plural=False)
                if s == 1:
                    return (
                        f"Yours matches the expected shifted by one {names.along(k)}: your "
                        f"{noun} i holds the expected {noun} i - 1 (yours is one {noun} late)."
                    )
                return (
                    f"Yours matches the expected shifted by one {names.along(k)}: your {noun} "
                    f"i holds the expected {noun} i + 1 (yours is one {noun} early)."
                )
    return ""


def _slices(g, e, names: _Axes, atol, rtol) -> str:
    """Each slice along an axis matches one of the expected slices: a permutation, a repeat."""
    for k in range(e.dim()):
        size = e.shape[k]
        if size < 2 or size > _MAX_SLICES or size * g.numel() > _MAX_PAIR_WORK:
            continue
        gs = g.movedim(k, 0).reshape(size, -1)
        es = e.movedim(k, 0).reshape(size, -1)
        source = []
        for i in range(size):
            match = _close(gs[i][None, :], es, atol, rtol).all(dim=1)
            if bool(match[i]):
                source.append(i)
            elif bool(match.any()):
                source.append(int(match.nonzero()[0]))
            else:
                source = []
                break
        if not source or source == list(range(size)):
            continue
        noun = names.noun(k, plural=False)
        if sorted(source) == list(range(size)):
            if source == list(range(size))[::-1]:
                return (
                    f"Yours is the expected reversed {names.along(k)}: "
                    f"yours[i] = expected[{size - 1} - i]."
                )
            moved = [i for i in range(size) if source[i] != i]
            if len(moved) == 2:
                a, b = moved
                return f"Yours is the expected with {noun}s {a} and {b} {names.along(k)} swapped."
            return (
                f"Yours is a permutation of the expected {names.along(k)}: yours[i] = "
                f"expected[{source}][i] (the right {noun}s in the wrong order)."
            )
        if len(set(source)) == 1:
            return (
                f"Every {noun} of yours {names.along(k)} is the expected {noun} {source[0]} "
                "(the same one repeated: an index that does not move, or a broadcast?)."
            )
        return (
            f"Each {noun} of yours {names.along(k)} is one of the expected ones, but not its own: "
            f"yours[i] = expected[{source}][i]."
        )
    return ""


def _scale(g, e, atol, rtol) -> str:
    ee = float((e * e).sum())
    if ee == 0:
        return ""
    c = float((g * e).sum()) / ee
    if c == 0 or not math.isfinite(c) or abs(c - 1) <= rtol:
        return ""
    if not _allclose(g, c * e, atol * max(1.0, abs(c)), max(rtol, 1e-3)):
        return ""
    if abs(c + 1) <= rtol:
        return "Yours is the expected with every sign flipped (a minus sign too many or missing?)."
    return (
        f"Each value of yours is the expected times {_factor_words(c)}: a scale factor missing, "
        "extra or inverted?"
    )


def _is_constant(d: torch.Tensor, e: torch.Tensor, atol: float, rtol: float) -> bool:
    """The differences `d` are one value, well clear of their own spread and of the bounds: an
    offset as small as rounding's noise is no constant (a dtype's rounding is said elsewhere)."""
    spread, mean = float(d.max() - d.min()), abs(float(d.mean()))
    return spread <= atol + rtol * float(e.abs().max()) and mean > 4 * max(spread, atol)


def _constant(g, e, atol, rtol) -> str:
    d = g - e
    if _is_constant(d, e, atol, rtol):
        return (
            f"Each value of yours is the expected plus the same {_num(float(d.mean()))} "
            "(a constant or a bias added or missing?)."
        )
    return ""


def _offset_along(g, e, names: _Axes, atol, rtol) -> str:
    """Yours minus the expected depends on one axis only: a vector added along it."""
    d = g - e
    for k in range(e.dim()):
        other = tuple(j for j in range(e.dim()) if j != k)
        if e.shape[k] < 2 or not other:
            continue
        mean = d.mean(dim=other, keepdim=True)
        if float(mean.abs().max()) <= 4 * atol:  # as small as the bounds: rounding, no vector
            return ""
        if _allclose(d, mean.expand_as(d), atol, rtol):
            return (
                f"Yours minus the expected depends only on the index {names.along(k)}: the "
                f"same vector {names.along(k)} added everywhere (a bias added twice, or missing?)."
            )
    return ""


_PRECISIONS = [
    (torch.bfloat16, "bfloat16", 2.0**-8),
    (torch.float16, "float16", 2.0**-11),
]


def _lower_precision(got_dtype, expected_dtype) -> str:
    """The name of got's dtype where it is a 16-bit float and expected's is wider, else ""."""
    names = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
    wider = (torch.float32, torch.float64)
    return names.get(got_dtype, "") if expected_dtype in wider else ""


def _precision(g, e, bad, finite, got_dtype, expected_dtype, low: str) -> str:
    """Differences the size of a lower precision's rounding, or values that are its numbers."""
    sel = finite & bad
    scale = float(e[finite].abs().max()) if bool(finite.any()) else 0.0
    if scale == 0 or not bool(sel.any()):
        return ""
    significant = sel & (e.abs() > 1e-3 * scale)
    if not bool(significant.any()):
        return ""
    rel = (g - e).abs()[significant] / e.abs()[significant]
    worst = float(rel.max())
    if low:
        unit = dict((n, u) for _, n, u in _PRECISIONS)[low]
        if worst <= 8 * unit:
            return f"Apart from the dtype, your values are right to {low}'s rounding."
        return ""
    for dtype, name, unit in _PRECISIONS:
        if expected_dtype == dtype:
            continue
        exact = bool((g.to(dtype).double() == g).all())
        if exact and worst <= 16 * unit and not bool((e.to(dtype).double() == e).all()):
            return (
                f"Every value of yours is a {name} number, and the differences are about its "
                f"rounding (up to {_num(100 * worst)}%): rounded to {name} on the way?"
            )
    for _, name, unit in _PRECISIONS[::-1]:
        if worst <= 8 * unit:
            return (
                f"The differences are small, up to {_num(100 * worst)}% of each value: about "
                f"{name}'s rounding. A computation in a lower precision?"
            )
    return ""


def _where(bad, names: _Axes, n_bad: int, n: int) -> str:
    """Which positions, heads or rows differ, along the axis that localises them best."""
    if bad.dim() == 0 or n_bad == n:
        return ""
    best = None
    for k in range(bad.dim()):
        size = bad.shape[k]
        if size < 2:
            continue
        other = tuple(j for j in range(bad.dim()) if j != k)
        rows = bad.any(dim=other) if other else bad
        hit = [int(i) for i in rows.nonzero().flatten()]
        runs = sum(1 for j, i in enumerate(hit) if j == 0 or hit[j - 1] != i - 1)
        if len(hit) < size and (2 * len(hit) <= size or runs == 1):
            if best is None or len(hit) / size < best[0]:
                best = (len(hit) / size, k, hit)
    if best is None:
        return ""
    _, k, hit = best
    size = bad.shape[k]
    right = [i for i in range(size) if i not in set(hit)]
    noun, nouns = names.noun(k, False), names.noun(k, True)
    differ = f"{noun} {_ranges(hit)}" if len(hit) == 1 else f"{nouns} {_ranges(hit)}"
    fine = f"{noun} {_ranges(right)} is" if len(right) == 1 else f"{nouns} {_ranges(right)} are"
    words = f"Only {differ} {names.along(k)} differ{'s' if len(hit) == 1 else ''}; {fine} right"
    group = len(hit)
    if (
        "head" in names.names[k].lower()
        and "d_head" not in names.names[k].lower()  # a head's coordinates, not heads
        and 1 < group < size
        and size % group == 0
        and hit == list(range(hit[0], hit[0] + group))
        and hit[0] % group == 0
    ):
        words += f" (a contiguous group of {group}: the heads that share one key/value head?)"
    return words + "."


def _local_pattern(g, e, bad, finite, atol, rtol) -> str:
    """A pattern of the differing values alone: zeros, flipped signs, a scale, a constant."""
    sel = bad & finite
    if not bool(sel.any()):
        return ""
    gb, eb = g[sel], e[sel]
    if bool((gb == 0).all()):
        return "There yours holds zeros where values were expected (slots never written?)."
    if bool(_close(gb, -eb, atol, rtol).all()):
        return "There the signs are flipped: yours is minus the expected."
    ee = float((eb * eb).sum())
    if ee > 0:
        c = float((gb * eb).sum()) / ee
        fits = c != 0 and math.isfinite(c) and abs(c - 1) > rtol
        if fits and bool(_close(gb, c * eb, atol, rtol).all()):
            return f"There each value of yours is the expected times {_factor_words(c)}."
    if _is_constant(gb - eb, eb, atol, rtol):
        return f"There each value of yours is the expected plus {_num(float((gb - eb).mean()))}."
    return ""


def _big(got: torch.Tensor, expected: torch.Tensor, names: _Axes, atol, rtol) -> str:
    """Where a large tensor differs, and its largest differences, in chunks along its first
    axis (a float64 copy of 150 million logits would not fit in memory)."""
    bad = torch.zeros(expected.shape, dtype=torch.bool)
    worst: list[tuple[float, tuple[int, ...]]] = []
    rows = got.reshape(got.shape[0] if got.dim() else 1, -1)
    want = expected.reshape(rows.shape)
    for i in range(rows.shape[0]):
        g, e = rows[i].float().cpu(), want[i].float().cpu()
        close = _close(g, e, atol, rtol)
        bad.view(rows.shape)[i] = ~close
        diff = (g - e).abs().nan_to_num(nan=math.inf).masked_fill(close, -1.0)
        top = diff.topk(min(3, diff.numel()))
        worst += [(float(v), (i, int(j))) for v, j in zip(top.values, top.indices, strict=True)]
    count = int(bad.sum())
    if count == 0:
        return ""
    shown = []
    for value, (i, j) in sorted(worst, reverse=True)[: min(3, count)]:
        if value < 0:
            break
        index = _unravel(i * rows.shape[1] + j, tuple(expected.shape))
        shown.append(
            f"at {names.at(index)} yours {_num(float(got[index]))}, expected "
            f"{_num(float(expected[index]))}"
        )
    where = _where(bad, names, count, bad.numel())
    return " ".join(
        s
        for s in [
            where,
            f"{count} of {bad.numel()} values differ; the largest differences: "
            + "; ".join(shown)
            + ".",
        ]
        if s
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def _largest(g, e, names: _Axes, atol, rtol, bad=None, plain: bool = True) -> str:
    g, e = _float(_as_tensor(g)), _float(_as_tensor(e))
    if g.shape != e.shape:
        return f"Your output has shape {tuple(g.shape)} where {tuple(e.shape)} was expected."
    if bad is None:
        bad = ~_close(g, e, atol, rtol)
    if names.names and len(names.names) != g.dim():
        names = _Axes(None, g.dim())
    diff = (g - e).abs().nan_to_num(nan=math.inf).masked_fill(~bad, -1.0)
    count = int(bad.sum())
    top = (
        diff.flatten().topk(min(3, count)).indices if count else torch.tensor([], dtype=torch.long)
    )
    shown = []
    for flat in top.tolist():
        index = _unravel(flat, tuple(g.shape))
        shown.append(
            f"at {names.at(index)} yours {_num(float(g[index]))}, expected {_num(float(e[index]))}"
        )
    if plain:
        return (
            f"{count} of {g.numel()} values differ, with no simple pattern; the largest "
            "differences: " + "; ".join(shown) + "."
        )
    return "The largest differences there: " + "; ".join(shown) + "."
