"""Kubernetes resource quantities ("500m", "1.5Gi", "2e3") to integer base units.

CPU becomes milli-CPU; everything else its base unit (bytes, counts). Fractions round up, as
kube-scheduler rounds requests up. Anything else is rejected with a message naming the text.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

from solver import InvalidInput

_SUFFIX: dict[str, int | Fraction] = {
    "": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_PATTERN = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")

#: The largest amount phalanx takes, in base units (milli for CPU): an int64, as the API server's
#: validation bounds a quantity's (milli-)value (resource.MaxMilliValue). Larger is InvalidInput.
MAX_AMOUNT = 2**63 - 1

#: Resources measured in milli-units on the wire of phalanx's model.
MILLI_RESOURCES = frozenset({"cpu"})


def parse_quantity(text: str | int | float, resource: str = "") -> int:
    """Parse a quantity into integer base units (milli for CPU). Raises InvalidInput.

    A cluster has few distinct quantity strings, so parses are memoised (an initial sync of
    100,000 pods parses a handful of strings, not half a million)."""
    if isinstance(text, str):
        return _parse_text(text, resource in MILLI_RESOURCES, resource)
    return _parse(text, resource)


@functools.lru_cache(maxsize=8192)
def _parse_text(text: str, milli: bool, resource: str) -> int:
    return _parse(text, resource)


def _parse(text: str | int | float, resource: str) -> int:
    if isinstance(text, bool):
        raise InvalidInput(f"{resource or 'quantity'}: not a quantity: {text!r}")
    if isinstance(text, (int, float)):
        text = repr(text) if isinstance(text, float) else str(text)
    if not isinstance(text, str):
        raise InvalidInput(f"{resource or 'quantity'}: not a quantity: {text!r}")
    match = _PATTERN.match(text.strip())
    if not match:
        raise InvalidInput(f"{resource or 'quantity'}: unparsable quantity {text!r}")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    value *= Fraction(10) ** int(exponent[1:]) if exponent else _SUFFIX[suffix or ""]
    if value < 0:
        raise InvalidInput(f"{resource or 'quantity'}: negative quantity {text!r}")
    if resource in MILLI_RESOURCES:
        value *= 1000
    amount = -(-value.numerator // value.denominator)  # ceiling
    if amount > MAX_AMOUNT:
        raise InvalidInput(f"{resource or 'quantity'}: quantity {text!r} is too large "
                           f"(at most {MAX_AMOUNT} {'milli-units' if resource in MILLI_RESOURCES else 'units'})")
    return amount
