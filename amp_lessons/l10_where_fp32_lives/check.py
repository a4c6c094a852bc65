"""Lesson 10's checker: exercise 10.1, stochastic rounding from float32 to bfloat16.

The check judges behaviour only. It calls the learner's ``stochastic_round`` once on a large tensor holding 2048
copies of each probe value (exact BF16 values, ±0, values between two BF16 neighbours with chances of rounding up
from 0.0001 to 0.9999, values just below a power of two where the spacing halves, subnormals, values above the
largest finite BF16, ±inf, a default NaN and a NaN whose payload sits in the dropped bits), and reads every column:
only the two BF16 neighbours of ``x`` may appear, and the share rounded up must match the chance (x - lower) /
spacing within 6 standard deviations. Then it calls it again with generators seeded alike (after reseeding the
global RNG in between) and differently, on a 0-d and a 3-d tensor, and checks that the input was not modified.

Every known wrong answer is a rule on that observation (``Seen``), most specific first: the first that matches
names the mistake. Each rule has a test with an answer a learner could write (tests/l10_where_fp32_lives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from amp_lessons.checks.harness import call_learner, checker, passed, stop
from amp_lessons.checks.mistakes import first_mistake, rule
from amp_lessons.l10_where_fp32_lives.rounding import bf16_neighbours

DRAWS = 2048
SIGMAS = 6.0
SUB = 2.0**-133  # the smallest positive bfloat16 subnormal; subnormals below 2^-126 are spaced by it
BF16_MAX = torch.finfo(torch.bfloat16).max
NAN_LOW_PAYLOAD = (
    torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32).item()
)  # a NaN bfloat16 would drop


def _above(base: float, spacing: float, chance: float) -> float:
    return base + chance * spacing


ONE_UP = 2.0**-7  # the spacing above 1.0
ONE_DOWN = 2.0**-8  # the spacing below 1.0

# (value, kind) — kind: "exact", "between", "subnormal", "above max", "nan", "inf"
PROBES = (
    [(v, "exact") for v in (1.0, -2.5, 0.0, -0.0, 0.5, BF16_MAX, -BF16_MAX, 2.0**-126, SUB, -3 * SUB, 96.0)]
    + [(_above(1.0, ONE_UP, p), "between") for p in (0.3, 0.75, 0.5, 2.0**-13, 1 - 2.0**-13, 0.1, 0.9)]
    + [(-_above(1.0, ONE_UP, p), "between") for p in (0.3, 0.75, 0.1)]
    + [(1.0 - p * ONE_DOWN, "between") for p in (0.3, 0.8)]  # just below a power of two: the spacing halves
    + [(-(1.0 - 0.3 * ONE_DOWN), "between"), (2.0 - 0.2 * ONE_UP, "between")]
    + [
        (v, "between")
        for v in (0.1, -0.1, math.pi, -math.e, 1000.7, 3.0e-5, -7.7e-3, 1.3 * 2.0**-126, 6.0e30)
    ]
    + [(v * SUB, "subnormal") for v in (0.3, 5.6, -2.3, 100.7, 0.9)]
    + [(3.3999e38, "above max"), (-3.3999e38, "above max")]
    + [(math.inf, "inf"), (-math.inf, "inf"), (math.nan, "nan"), (NAN_LOW_PAYLOAD, "nan")]
)


def probe_tensor(draws: int = DRAWS) -> torch.Tensor:
    """``[draws, probes]`` float32: every row is the probe values (NaN payloads kept bit for bit)."""
    row = torch.tensor([v for v, _ in PROBES], dtype=torch.float64).to(torch.float32)
    payload = [i for i, (_, kind) in enumerate(PROBES) if kind == "nan"][1]
    row.view(torch.int32)[payload] = 0x7F800001
    return row.expand(draws, -1).contiguous()


@dataclass
class Seen:
    """What the learner's function did (``None`` where a fact could not be read because of an earlier problem)."""

    dtype: torch.dtype | None = None
    shape_ok: bool = True
    shapes_seen: str = ""
    input_modified: bool = False
    result: torch.Tensor | None = None  # float32 [draws, probes] of the main call
    deterministic: bool = True
    other_seed_differs: bool = True


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float().view(torch.int32) == b.float().view(torch.int32)) | (a.isnan() & b.isnan())


class Columns:
    """The probe columns and their reference facts (lower/upper neighbour, chance of rounding up)."""

    def __init__(self):
        x = probe_tensor(1)[0]
        self.x = x
        self.kinds = [kind for _, kind in PROBES]
        self.lower, self.upper = bf16_neighbours(x)
        spacing = self.upper.double() - self.lower.double()
        self.chance = torch.where(
            spacing > 0, (x.double() - self.lower.double()) / spacing, torch.zeros_like(spacing)
        )
        self.nearest = x.to(torch.bfloat16).float()
        self.toward_zero = (x.view(torch.int32) & -65536).view(torch.float32)

    def of(self, *kinds) -> list:
        return [i for i, kind in enumerate(self.kinds) if kind in kinds]


COLUMNS = Columns()
FINITE = COLUMNS.of("exact", "between", "subnormal")
NON_EXACT = COLUMNS.of("between", "subnormal")


def share_up(seen: Seen) -> torch.Tensor:
    return (seen.result.double() == COLUMNS.upper.double()).double().mean(dim=0)


def in_bracket(seen: Seen) -> torch.Tensor:
    """Per column: every draw is one of the two neighbours (above max: the largest BF16 or inf)."""
    r = seen.result
    ok = (r == COLUMNS.lower) | (r == COLUMNS.upper)
    big = torch.tensor([kind == "above max" for kind in COLUMNS.kinds])
    ok_big = (r.abs() == BF16_MAX) | r.isinf()
    ok = torch.where(big, ok_big & (torch.sign(r) == torch.sign(COLUMNS.x)), ok)
    return ok.all(dim=0)


def biased(seen: Seen) -> torch.Tensor:
    """Per column: the share rounded up differs from the chance by more than 6 standard deviations."""
    p = COLUMNS.chance
    tolerance = SIGMAS * torch.sqrt(p * (1 - p) / seen.result.shape[0]) + 2.0 / seen.result.shape[0]
    bad = (share_up(seen) - p).abs() > tolerance
    mask = torch.zeros(len(PROBES), dtype=torch.bool)
    mask[NON_EXACT] = True
    return bad & mask


def wrong_columns(seen: Seen) -> list:
    bad = ~in_bracket(seen) | biased(seen)
    return [i for i in FINITE + COLUMNS.of("above max") if bool(bad[i])]


def _all_equal(seen: Seen, target: torch.Tensor) -> bool:
    return bool(
        _bits_equal(seen.result[:, NON_EXACT], target[NON_EXACT].expand(seen.result.shape[0], -1)).all()
    )


# ------------------------------------------------------------------------------------------------ the rules


@rule(
    "wrong dtype",
    lambda seen: (
        f"`stochastic_round` returned a {str(seen.dtype).replace('torch.', '')} tensor; it must return "
        "torch.bfloat16. Once every value is one of the two BF16 neighbours, `.to(torch.bfloat16)` is exact."
    ),
)
def wrong_dtype(seen) -> bool:
    return seen.dtype != torch.bfloat16


@rule(
    "wrong shape",
    lambda seen: (
        f"The result has the wrong shape ({seen.shapes_seen}): return one value per element of x, in x's shape."
    ),
)
def wrong_shape(seen) -> bool:
    return not seen.shape_ok


@rule(
    "modified the input",
    "Your function changed x itself: `x.view(torch.int32)` shares x's memory, so `bits += noise` writes into x. "
    "Compute a new tensor (`bits = x.view(torch.int32) + noise`) and leave the input as it came.",
)
def modified_input(seen) -> bool:
    return seen.input_modified


@rule(
    "inf became NaN",
    "±inf came back as NaN: arithmetic on inf makes NaN (the spacing around inf is inf - inf, and inf * 0 is NaN). "
    "Keep the non-finite values as they are: `torch.where(torch.isfinite(x), rounded, x)`.",
)
def inf_became_nan(seen) -> bool:
    return bool(seen.result[:, COLUMNS.of("inf")].isnan().any())


@rule(
    "inf not kept",
    "±inf must come back as the same infinity; yours did not. Pass non-finite values through unchanged.",
)
def inf_not_kept(seen) -> bool:
    cols = COLUMNS.of("inf")
    return not bool((seen.result[:, cols] == COLUMNS.x[cols]).all())


@rule(
    "NaN not kept",
    "A NaN input did not come back as NaN. A NaN whose payload sits only in the 16 bits BF16 drops turns into inf "
    "when those bits are cleared: pass non-finite values through with `torch.where(torch.isfinite(x), rounded, x)`.",
)
def nan_not_kept(seen) -> bool:
    return not bool(seen.result[:, COLUMNS.of("nan")].isnan().all())


@rule(
    "round to nearest",
    "Every value came back rounded to NEAREST — the same as `x.to(torch.bfloat16)`, with no randomness: small "
    "updates are lost exactly as before. Choose the upper neighbour with probability (x - lower) / spacing.",
)
def rounds_to_nearest(seen) -> bool:
    return _all_equal(seen, COLUMNS.nearest)


@rule(
    "truncation",
    "Every value came back truncated (the neighbour toward zero, the 16 low bits cleared) with no randomness: that "
    "is biased toward zero. Add a random integer in [0, 2^16) to the bits BEFORE clearing them.",
)
def truncates(seen) -> bool:
    return _all_equal(seen, COLUMNS.toward_zero)


@rule(
    "always the lower neighbour",
    "Every value came back as its LOWER neighbour (rounded toward -inf), with no randomness: biased downward. The "
    "upper neighbour must come with probability (x - lower) / spacing.",
)
def always_down(seen) -> bool:
    return _all_equal(seen, COLUMNS.lower)


@rule(
    "always the upper neighbour",
    "Every value came back as its UPPER neighbour (rounded toward +inf), with no randomness: biased upward. Choose "
    "it only with probability (x - lower) / spacing.",
)
def always_up(seen) -> bool:
    return _all_equal(seen, COLUMNS.upper)


@rule(
    "one random number for the whole tensor",
    "All 2048 copies of a value rounded the same way within one call: you drew ONE random number and used it for "
    "every element. Draw one per element: `torch.rand(x.shape, generator=generator)` (or `torch.randint`).",
)
def one_draw(seen) -> bool:
    cols = [i for i in NON_EXACT if 0.05 < float(COLUMNS.chance[i]) < 0.95]
    r = seen.result[:, cols]
    return bool((r == r[:1]).all())


@rule(
    "global RNG instead of the generator",
    "Two calls with generators seeded alike gave different results: your randomness does not come (only) from "
    "`generator`. Pass it to every draw, e.g. `torch.rand(x.shape, generator=generator, device=x.device)`.",
)
def global_rng(seen) -> bool:
    return not seen.deterministic


@rule(
    "ignores the generator",
    "Generators with DIFFERENT seeds gave identical results: your function makes its own random numbers with a "
    "fixed seed instead of drawing from the `generator` it is given.",
)
def ignores_generator(seen) -> bool:
    return not seen.other_seed_differs


@rule(
    "exact values changed",
    "A value that already is a BF16 number (such as 1.0, 0.5 or -0.0) came back changed: exact values must be "
    "returned unchanged, bit for bit. Watch -0.0: `lower + spacing * up` turns it into +0.0 (-0.0 + 0.0 is +0.0); "
    "choose between the two neighbours with `torch.where` instead of adding.",
)
def exact_changed(seen) -> bool:
    cols = COLUMNS.of("exact")
    changed = not bool(
        _bits_equal(seen.result[:, cols], COLUMNS.x[cols].expand(seen.result.shape[0], -1)).all()
    )
    others = NON_EXACT + COLUMNS.of("above max")
    return changed and bool(in_bracket(seen)[others].all())  # only the exact values are wrong


@rule(
    "subnormals",
    "Only the subnormal values (below 2^-126) are wrong: there the BF16 spacing stops shrinking and stays 2^-133. "
    "Clamp the exponent you derive the spacing from at -126 (working on the float32 bits handles this for free).",
)
def subnormals_wrong(seen) -> bool:
    wrong = wrong_columns(seen)
    return bool(wrong) and all(COLUMNS.kinds[i] == "subnormal" for i in wrong)


@rule(
    "biased for negatives",
    "Positive values round correctly, negative ones do not: for x < 0 the lower neighbour is the one FARTHER from "
    "zero. Work on |x| and copy the sign back (`torch.copysign`), or note that on the float32 bits (sign and "
    "magnitude) adding noise to the magnitude works for both signs.",
)
def negatives_wrong(seen) -> bool:
    wrong = wrong_columns(seen)
    return bool(wrong) and all(float(COLUMNS.x[i]) < 0 for i in wrong)


@rule(
    "probability reversed",
    "The NEARER neighbour comes out less often: your chance of rounding up is 1 - (x - lower) / spacing. Round up "
    "when the uniform draw u satisfies u < (x - lower) / spacing.",
)
def probability_reversed(seen) -> bool:
    cols = [i for i in NON_EXACT if abs(float(COLUMNS.chance[i]) - 0.5) > 0.15]
    expected = 1 - COLUMNS.chance[cols]
    return bool(((share_up(seen)[cols] - expected).abs() < 0.05).all())


def _not_bracketing_message(seen) -> str:
    i = next(i for i in FINITE + COLUMNS.of("above max") if not bool(in_bracket(seen)[i]))
    r = seen.result[:, i]
    odd = r[(r != COLUMNS.lower[i]) & (r != COLUMNS.upper[i])][0].item()
    return (
        f"For x = {COLUMNS.x[i].item()!r} your function returned {odd!r}, which is not one of its two BF16 neighbours "
        f"({COLUMNS.lower[i].item()!r} and {COLUMNS.upper[i].item()!r}): the noise reaches the wrong bits. It must be "
        "smaller than one spacing and only decide between the neighbours (an integer in [0, 2^16) added to the 16 "
        "dropped float32 bits)."
    )


@rule("not a neighbour", _not_bracketing_message)
def not_bracketing(seen) -> bool:
    return not bool(in_bracket(seen)[FINITE + COLUMNS.of("above max")].all())


def _biased_message(seen) -> str:
    i = next(i for i in NON_EXACT if bool(biased(seen)[i]))
    got, want = float(share_up(seen)[i]), float(COLUMNS.chance[i])
    direction = "too rarely" if got < want else "too often"
    return (
        f"Biased: x = {COLUMNS.x[i].item()!r} lies {want:.3f} of the way from {COLUMNS.lower[i].item()!r} to "
        f"{COLUMNS.upper[i].item()!r}, so it must round up in {want:.1%} of the draws; yours did in {got:.1%} "
        f"({direction}), so the mean is not x. Check the range of your noise: a uniform number over exactly one "
        "spacing (2^16 values of the dropped bits)."
    )


@rule("biased", _biased_message)
def is_biased(seen) -> bool:
    return bool(biased(seen).any())


RULES = (
    wrong_dtype,
    wrong_shape,
    modified_input,
    inf_became_nan,
    inf_not_kept,
    nan_not_kept,
    rounds_to_nearest,
    truncates,
    always_down,
    always_up,
    one_draw,
    global_rng,
    ignores_generator,
    exact_changed,
    subnormals_wrong,
    negatives_wrong,
    probability_reversed,
    not_bracketing,
    is_biased,
)


# ------------------------------------------------------------------------------------------------ the check


def _call(fn, x: torch.Tensor, seed: int):
    out = call_learner(fn, x, generator=torch.Generator().manual_seed(seed), what="`stochastic_round`")
    if not isinstance(out, torch.Tensor):
        stop(
            f"`stochastic_round` returned a {type(out).__name__}, not a tensor: return a torch.bfloat16 tensor "
            "of x's shape."
        )
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(_bits_equal(a.detach().cpu(), b.detach().cpu()).all())


def observe(fn) -> Seen:
    """Run the learner's function on the probes and record what it did (see the module docstring)."""
    seen = Seen()
    x = probe_tensor()
    before = x.clone()
    out = _call(fn, x, seed=10)
    seen.dtype = out.dtype
    seen.input_modified = not _same_bits(x, before)
    if out.shape != x.shape:
        seen.shape_ok, seen.shapes_seen = False, f"x {tuple(x.shape)}, result {tuple(out.shape)}"
        return seen
    seen.result = out.detach().cpu().float()
    for shape in ((), (2, 3, 4)):
        small = _call(fn, torch.full(shape, 1.003), seed=1)
        if small.shape != torch.Size(shape):
            seen.shape_ok, seen.shapes_seen = False, f"x {tuple(shape)}, result {tuple(small.shape)}"
    state = torch.get_rng_state()
    try:
        torch.manual_seed(1)
        first = _call(fn, probe_tensor(64), seed=7)
        torch.manual_seed(2)
        again = _call(fn, probe_tensor(64), seed=7)
        other = _call(fn, probe_tensor(64), seed=8)
    finally:
        torch.set_rng_state(state)
    seen.deterministic = _same_bits(first, again)
    seen.other_seed_differs = not _same_bits(first, other)
    return seen


@checker("10.1 stochastic_round")
def check_stochastic_round(stochastic_round):
    seen = observe(stochastic_round)
    mistake = first_mistake(RULES, seen)
    if mistake is not None:
        stop(mistake.text(seen))
    i = PROBES.index(next(p for p in PROBES if p[1] == "between"))
    mean = seen.result[:, i].double().mean().item()
    return passed(
        f"`stochastic_round` is right: over {DRAWS} draws each value comes out as one of its two BF16 neighbours, "
        f"as often as it should (x = {COLUMNS.x[i].item():.7g}: mean {mean:.7g}); exact values, ±0, subnormals, "
        "±inf and NaN are kept, and a generator seeded alike gives the same result every time."
    )
