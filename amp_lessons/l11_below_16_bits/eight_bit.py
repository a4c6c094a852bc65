"""Lesson 11: the 8-bit formats next to FP16/BF16, and what a cast does on overflow on *this* build.

E4M3FN (4 exponent bits, 3 mantissa bits) reaches 448 and has **no infinity**: its all-ones exponent holds normal
numbers, and only ``S.1111.111`` is NaN. E5M2 (5 and 2) is IEEE-like: inf exists, the range reaches 57344, the
precision is one bit coarser. E8M0 (8 exponent bits, nothing else) is the MX formats' *scale* format: a power of
two from 2^-127 to 2^127, one byte, no sign, no zero.

Because E4M3FN has no infinity, a value beyond its range must become *something else*: NaN (a non-saturating cast:
ml_dtypes, torch 2.4's ``tensor.to``) or +-448 (a saturating cast: torch's CPU ``tensor.to`` since 2026, torchao's
``to_fp8_saturated``, which clamps first). That is a property of the conversion code in the build you run, not of
the format, so the lesson measures it on every path it can reach here.
"""

from __future__ import annotations

import math

import torch

from amp_lessons.core.optional_libraries import torchao_support
from amp_lessons.l01_precision_formats.formats import BFLOAT16, FLOAT8_FORMATS, FLOAT16, cast_overflow

OVERFLOW_INPUTS = (448.0, 464.0, 500.0, 1e6, math.inf, -500.0, math.nan)


def format_facts():
    """One row per format (FP16, BF16, E4M3FN, E5M2 and E8M0 where torch has it): bits, range, epsilon, and
    which special values it has — every number from ``torch.finfo`` or lesson 01's format description."""
    import pandas as pd

    rows = []
    for fmt in (FLOAT16, BFLOAT16) + FLOAT8_FORMATS:
        info = torch.finfo(fmt.dtype)
        rows.append(
            {
                "format": fmt.name,
                "bits (sign/exp/mantissa)": f"{int(fmt.signed)}/{fmt.exponent_bits}/{fmt.mantissa_bits}",
                "max": info.max,
                "smallest normal": info.tiny,
                "smallest subnormal": fmt.smallest_subnormal,
                "eps (1 -> next)": info.eps,
                "infinity": "yes" if fmt.has_inf else "no",
                "zero": "no" if fmt.special == "e8m0" else "yes",
                "NaN patterns": _nan_patterns(fmt),
            }
        )
    return pd.DataFrame(rows).set_index("format")


def _nan_patterns(fmt) -> int:
    if fmt.special == "e8m0":
        return 1
    if fmt.special == "fn":
        return 2  # S.1111.111, both signs
    return 2 * (2**fmt.mantissa_bits - 1)


def _torch_cast(values: torch.Tensor, dtype) -> list:
    return values.to(dtype).float().tolist()


def _clamped_cast(values: torch.Tensor, dtype) -> list:
    top = torch.finfo(dtype).max
    return values.clamp(-top, top).to(dtype).float().tolist()


def cast_paths(dtype=torch.float8_e4m3fn) -> tuple[dict, dict]:
    """``({path: cast function}, {path: why it is not here})`` for every way of casting to ``dtype`` here."""
    paths = {
        f"tensor.to (torch {torch.__version__.split('+')[0]})": _torch_cast,
        "clamp to +-max, then .to": _clamped_cast,
    }
    missing = {}
    support = torchao_support()
    if support.available:
        from torchao.float8.float8_utils import to_fp8_saturated

        paths[f"torchao {support.version} to_fp8_saturated"] = lambda v, d: (
            to_fp8_saturated(v, d).float().tolist()
        )
    else:
        missing["torchao to_fp8_saturated"] = support.reason
    try:
        import ml_dtypes
        import numpy as np
    except ImportError:
        missing["ml_dtypes"] = (
            "ml_dtypes is not installed (pip install ml_dtypes; a test dependency of the course)"
        )
    else:
        ml = getattr(ml_dtypes, str(dtype).removeprefix("torch."))

        def numpy_cast(values, _dtype):
            with np.errstate(all="ignore"):
                return values.cpu().numpy().astype(ml).astype(np.float32).tolist()

        paths[f"ml_dtypes {ml_dtypes.__version__} astype"] = numpy_cast
    return paths, missing


def overflow_casts(values=OVERFLOW_INPUTS, dtype=torch.float8_e4m3fn, device="cpu"):
    """What each cast path stores for ``values``: a DataFrame (rows: inputs, columns: paths), and the paths
    that are missing here with the reason, in ``.attrs["missing"]``."""
    import pandas as pd

    x = torch.tensor(values, dtype=torch.float32, device=device)
    paths, missing = cast_paths(dtype)
    table = pd.DataFrame(
        {name: cast(x, dtype) for name, cast in paths.items()}, index=[repr(v) for v in values]
    )
    table.index.name = f"x -> {str(dtype).removeprefix('torch.')}"
    table.attrs["missing"] = missing
    table.attrs["this build"] = cast_overflow(dtype)
    return table
