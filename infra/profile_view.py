"""A workload profile for a terminal: its buckets, shares as bars, lengths within each bucket."""

from __future__ import annotations

from collections.abc import Mapping

from schemas.profile import WorkloadProfile

BAR_WIDTH = 40


def _bar(share: float, width: int = BAR_WIDTH) -> str:
    filled = share * width
    whole = int(filled)
    return "█" * whole + ("▌" if filled - whole >= 0.5 else "")


def describe_profile(profile: WorkloadProfile, *, delivered: Mapping[str, float] | None = None) -> str:
    """The profile as text: id, source, one histogram line per bucket (and a delivered mix beside it)."""
    lines = [
        f"profile {profile.id}",
        f"  source: {profile.source or '(not stated)'}",
        f"  method: {profile.method or '(not stated)'}",
        "",
        f"  {'bucket':<12} {'tokens':>17}  {'share':>6}  {'delivered':>9}"
        if delivered
        else f"  {'bucket':<12} {'tokens':>17}  {'share':>6}",
    ]
    for b in profile.buckets:
        span = f"[{b.lower}, {b.upper if b.upper is not None else '∞'})"
        got = f"  {delivered.get(b.name, 0.0):>9.1%}" if delivered is not None else ""
        lines.append(f"  {b.name:<12} {span:>17}  {b.share:>6.1%}{got}  {_bar(b.share)}")
    lines += ["", "  lengths within each bucket (deciles, prompt share):"]
    for b in profile.buckets:
        knots = ", ".join(str(q) for q in b.quantiles)
        lines.append(f"  {b.name:<12} {knots}  (prompt {b.prompt_share:.0%})")
    return "\n".join(lines)
