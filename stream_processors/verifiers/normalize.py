"""Normalizing what people write for a value: numbers, money, percentages, units and dates.

"1.2 million" is 1,200,000; "(3.4)" is -3.4 (accounting negative); "$1,234.50", "USD 1234.5" and
"1.234,50 $" are the same amount in dollars; "12.5%" is 0.125; "2.5 kg" is 2500 g; "March 5,
2024", "5 Mar 2024" and "2024-03-05" are one date. Used by the extraction and math verifiers.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from fractions import Fraction
from typing import Any, Generic, TypeVar

_SCALES = {
    "thousand": 10**3, "k": 10**3, "million": 10**6, "mn": 10**6, "mm": 10**6, "m": 10**6,
    "billion": 10**9, "bn": 10**9, "b": 10**9, "trillion": 10**12, "tn": 10**12, "t": 10**12,
}  # fmt: skip
_CURRENCY_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY", "₹": "INR", "₩": "KRW", "₽": "RUB"}
_CURRENCY_CODES = frozenset(
    {"USD", "EUR", "GBP", "JPY", "CHF", "CNY", "INR", "CAD", "AUD", "KRW", "RUB", "BRL"}
)
# unit -> (dimension, factor to the dimension's base unit)
_UNITS: dict[str, tuple[str, Fraction]] = {
    "mg": ("mass", Fraction(1, 1000)), "g": ("mass", Fraction(1)), "kg": ("mass", Fraction(1000)),
    "t": ("mass", Fraction(10**6)), "lb": ("mass", Fraction(45359237, 100000)),
    "oz": ("mass", Fraction(45359237, 1600000)),
    "mm": ("length", Fraction(1, 1000)), "cm": ("length", Fraction(1, 100)), "m": ("length", Fraction(1)),
    "km": ("length", Fraction(1000)), "in": ("length", Fraction(254, 10000)),
    "ft": ("length", Fraction(3048, 10000)), "mi": ("length", Fraction(1609344, 1000)),
    "ms": ("time", Fraction(1, 1000)), "s": ("time", Fraction(1)), "min": ("time", Fraction(60)),
    "h": ("time", Fraction(3600)), "day": ("time", Fraction(86400)),
    "ml": ("volume", Fraction(1, 1000)), "l": ("volume", Fraction(1)),
}  # fmt: skip
_UNIT_ALIASES = {
    "grams": "g", "gram": "g", "kilograms": "kg", "kilogram": "kg", "kgs": "kg", "lbs": "lb", "pounds": "lb",
    "meters": "m", "meter": "m", "metres": "m", "metre": "m", "kilometers": "km", "kilometres": "km",
    "centimeters": "cm", "millimeters": "mm", "inches": "in", "inch": "in", "feet": "ft", "foot": "ft",
    "miles": "mi", "mile": "mi", "seconds": "s", "second": "s", "sec": "s", "secs": "s", "minutes": "min",
    "minute": "min", "mins": "min", "hours": "h", "hour": "h", "hr": "h", "hrs": "h", "days": "day",
    "liters": "l", "litres": "l", "liter": "l", "litre": "l", "milliliters": "ml", "tonnes": "t", "tons": "t",
}  # fmt: skip
_MONTHS = {
    m: i + 1
    for i, names in enumerate(
        [("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"), ("may",),
         ("jun", "june"), ("jul", "july"), ("aug", "august"), ("sep", "sept", "september"),
         ("oct", "october"), ("nov", "november"), ("dec", "december")]
    )
    for m in names
}  # fmt: skip
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_THOUSANDS_SPACE = re.compile(r"^[+-]?\d{1,3}( \d{3})+(\.\d+)?$")
# 1.234.567 or 1.234,5 or 12,5; a lone "1.234" stays a decimal number
_EUROPEAN = re.compile(r"^[+-]?[1-9]\d{0,2}((\.\d{3}){2,}(,\d+)?|(\.\d{3})+,\d+)$|^[+-]?\d+,\d{1,2}$")
MEMO_SIZE = 16_384
"""Distinct texts whose reading `Remembered` keeps: a group's samples share their gold values, and
answers repeat (on the fleet, 26% of extraction field pairs and 33% of math answers are distinct)."""
MEMO_MAX_CHARS = 256
"""Longer texts are read afresh each time: model output can be long, and the memory stays bounded
(MEMO_SIZE entries of at most this many characters per function)."""
_QUANTITY = re.compile(r"^(?P<num>[+-]?[\d.,' ]*\d)\s*(?P<rest>[^\d]*)$")


T = TypeVar("T")


class Remembered(Generic[T]):
    """A pure function of one text that remembers its result for each of MEMO_SIZE recent texts
    of at most MEMO_MAX_CHARS characters; longer texts are read afresh."""

    def __init__(self, read: Callable[[str], T]) -> None:
        self._read = read
        self._cached = functools.lru_cache(maxsize=MEMO_SIZE)(read)
        functools.update_wrapper(self, read)

    def __call__(self, text: str) -> T:
        return self._cached(text) if len(text) <= MEMO_MAX_CHARS else self._read(text)

    def cache_info(self) -> Any:
        """functools' statistics of the memo (hits, misses, size)."""
        return self._cached.cache_info()

    def cache_clear(self) -> None:
        """Forget every remembered result."""
        self._cached.cache_clear()


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number with an optional kind: a currency code, a unit dimension, or 'percent'."""

    value: Fraction
    kind: str | None = None


def clean(text: str) -> str:
    """NFKC, unicode minus and dashes to '-', no thin spaces or quotes around, collapsed whitespace."""
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\u2212", "-").replace("\u2013", "-").replace("\u2014", "-").replace("\u00a0", " ")
    text = text.replace("\u202f", " ").replace("\u2009", " ")
    return re.sub(r"\s+", " ", text).strip().strip("\"'`")


def parse_number(text: str) -> Fraction | None:
    """A plain number with optional thousands separators (1,234.5; 1 234.5; 1.234,5), or None."""
    t = text.strip().replace("'", "")
    if _THOUSANDS.match(t):
        t = t.replace(",", "")
    elif _THOUSANDS_SPACE.match(t):
        t = t.replace(" ", "")
    elif _EUROPEAN.match(t):
        t = t.replace(".", "").replace(",", ".")
    if not _NUMBER.match(t):
        return None
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def parse_quantity(text: str) -> Quantity | None:
    """A number with its scale word, currency, percent sign or unit; None if it is not one."""
    t = clean(text)
    negative = False
    if t.startswith("(") and t.endswith(")"):
        negative, t = True, t[1:-1].strip()
    kind: str | None = None
    for symbol, code in _CURRENCY_SYMBOLS.items():
        if symbol in t:
            kind, t = code, t.replace(symbol, " ").strip()
    words = t.split()
    if words and words[0].upper() in _CURRENCY_CODES:
        kind, t = words[0].upper(), " ".join(words[1:])
    elif words and words[-1].upper() in _CURRENCY_CODES:
        kind, t = words[-1].upper(), " ".join(words[:-1])
    if t.startswith("-"):
        negative, t = not negative, t[1:].strip()
    if t.startswith("(") and t.endswith(")"):
        negative, t = not negative, t[1:-1].strip()
    match = _QUANTITY.match(t)
    if match is None:
        return None
    value = parse_number(match["num"])
    if value is None:
        return None
    raw_rest = match["rest"].strip().rstrip(".")
    rest = raw_rest.lower()
    if raw_rest in ("K", "M", "B", "MM", "Mn", "Bn"):  # capitals: thousands, millions, billions
        return Quantity((-value if negative else value) * _SCALES[rest], kind)
    if rest in ("%", "percent", "pct", "per cent"):
        value, kind = value / 100, kind or "percent"
    elif rest in _SCALES and (rest not in _UNITS or kind is not None or rest in ("million", "billion")):
        value *= _SCALES[rest]
    elif rest:
        unit = _UNIT_ALIASES.get(rest, rest)
        if unit not in _UNITS or kind is not None:
            return None
        dimension, factor = _UNITS[unit]
        value, kind = value * factor, dimension
    return Quantity(-value if negative else value, kind)


def parse_date(text: str) -> date | None:
    """ISO (2024-03-05, 2024/03/05), 'March 5, 2024', '5 Mar 2024', '5th March 2024', 03/05/2024
    (month first unless the first number exceeds 12), or None."""
    t = clean(text).lower().replace(",", " ")
    t = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", t)
    parts = t.replace(".", " ").split()
    try:
        if m := re.fullmatch(r"(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})", t):
            return date(int(m[1]), int(m[2]), int(m[3]))
        if m := re.fullmatch(r"(\d{1,2})[/.-](\d{1,2})[/.-](\d{4})", t):
            a, b = int(m[1]), int(m[2])
            month, day = (b, a) if a > 12 else (a, b)
            return date(int(m[3]), month, day)
        if len(parts) == 3:
            if parts[0] in _MONTHS and parts[1].isdigit() and parts[2].isdigit():
                return date(int(parts[2]), _MONTHS[parts[0]], int(parts[1]))
            if parts[1] in _MONTHS and parts[0].isdigit() and parts[2].isdigit():
                return date(int(parts[2]), _MONTHS[parts[1]], int(parts[0]))
    except ValueError:
        return None
    return None


@Remembered
def canonical(text: str) -> str | Quantity | date:
    """The comparable form of a field value: a date, a quantity, or case-folded text.

    Cached: a group's samples are judged against the same gold fields, and often answer alike;
    every form returned is immutable."""
    if (day := parse_date(text)) is not None:
        return day
    if (quantity := parse_quantity(text)) is not None:
        return quantity
    return clean(text).casefold().rstrip(".")


def same_value(a: str, b: str, rel_tol: float = 1e-9) -> bool:
    """Whether two written values mean the same thing (a missing currency or unit on one side is
    allowed; different ones are not)."""
    ca, cb = canonical(a), canonical(b)
    if isinstance(ca, Quantity) and isinstance(cb, Quantity):
        if ca.kind and cb.kind and ca.kind != cb.kind:
            return False
        if (ca.kind == "percent") != (cb.kind == "percent") and not (ca.kind and cb.kind):
            # "12.5%" against "12.5": the same figure written without its sign
            other = cb if ca.kind == "percent" else ca
            pct = ca if ca.kind == "percent" else cb
            return _close(pct.value * 100, other.value, rel_tol) or _close(pct.value, other.value, rel_tol)
        return _close(ca.value, cb.value, rel_tol)
    return type(ca) is type(cb) and ca == cb


def _close(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    if a == b:
        return True
    return abs(a - b) <= exact(rel_tol) * max(abs(a), abs(b))


@functools.lru_cache(maxsize=64)
def exact(value: float) -> Fraction:
    """The exact value of a float as a Fraction, remembered (tolerances repeat on every record)."""
    return Fraction(value)
