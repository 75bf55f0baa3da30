"""Reference solutions of the code tasks, one plain function per task.

Calling one gives the unit tests' expected values; its source text (read with
`inspect.getsource`, never run from text) is the correct candidate. So the correct candidate is
the very code that computed the expectations, and it passes by construction. Nothing else lives
here: every line of a function below is trajectory text.
"""

from __future__ import annotations


def clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(x, hi))


def count_vowels(s: str) -> int:
    return sum(1 for ch in s.lower() if ch in "aeiou")


def is_palindrome(s: str) -> bool:
    chars = [ch.lower() for ch in s if ch.isalnum()]
    return chars == chars[::-1]


def running_sum(xs: list[int]) -> list[int]:
    total = 0
    out = []
    for x in xs:
        total += x
        out.append(total)
    return out


def second_largest(xs: list[int]) -> int:
    return sorted(set(xs))[-2]


def fizzbuzz(n: int) -> str:
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)


def fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def word_count(s: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word in s.split():
        counts[word] = counts.get(word, 0) + 1
    return counts


def gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def digit_sum(n: int) -> int:
    return sum(int(d) for d in str(abs(n)))
