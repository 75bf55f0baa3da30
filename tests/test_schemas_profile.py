"""The inference workload profile: fitting from the Azure trace, bucketing, drawing, the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schemas.exceptions import ProfileError
from schemas.profile import Bucket, WorkloadProfile, load_profile
from schemas.profile_fit import fit_profile, read_trace

TRACE = (
    Path(__file__).resolve().parents[2]
    / "shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"
)


@pytest.fixture(scope="module")
def trace() -> tuple[np.ndarray, np.ndarray]:
    assert TRACE.exists(), f"the Azure trace is expected at {TRACE} (shared/ beside the clone)"
    return read_trace(TRACE)


def test_fit_by_quantiles_reproduces_the_trace_mix(trace):
    prompt, generated = trace
    profile = fit_profile(prompt, generated, quantiles=(0.5, 0.9))
    assert profile.names == ("short", "long", "ultra_long")
    mix = profile.mix(prompt + generated)
    for name, share in profile.targets.items():
        assert abs(mix[name] - share) < 0.01
    assert abs(profile.targets["short"] - 0.5) < 0.01 and abs(profile.targets["ultra_long"] - 0.1) < 0.01


def test_fit_by_edges_and_names(trace):
    prompt, generated = trace
    profile = fit_profile(prompt, generated, edges=(1024, 4096), names=("s", "m", "l"))
    total = prompt + generated
    assert profile.targets["s"] == pytest.approx(float(np.mean(total < 1024)))
    assert profile.targets["l"] == pytest.approx(float(np.mean(total >= 4096)))
    assert (
        profile.bucket_of(1023) == "s" and profile.bucket_of(1024) == "m" and profile.bucket_of(10**7) == "l"
    )


def test_file_round_trip_and_id(tmp_path, trace):
    profile = fit_profile(*trace, source="test")
    path = profile.save(tmp_path / "p.toml")
    again = load_profile(path)
    assert again == profile and again.id == profile.id
    edited = path.read_text().replace("share = 0.", "share = 0.0", 1)
    path.write_text(edited)
    with pytest.raises(ProfileError, match=r"edited by hand|sum to 1"):
        load_profile(path)


def test_shipped_default_matches_the_trace(trace):
    default = load_profile()
    assert default.names == ("short", "long", "ultra_long")
    assert "Splitwise" in default.source  # the data's attribution travels with the profile
    assert default == fit_profile(*trace, source=default.source)


def test_sampled_lengths_follow_the_shares_and_weights():
    profile = load_profile()
    rng = np.random.default_rng(7)
    draws = [profile.sample_length(rng) for _ in range(20_000)]
    assert all(d.prompt_tokens >= 1 and d.response_tokens >= 1 for d in draws)
    assert profile.distance(profile.mix([d.total for d in draws])) < 0.02
    long_only = [profile.sample_length(rng, weights={"ultra_long": 1.0}).total for _ in range(200)]
    assert set(profile.bucket_names(long_only)) == {"ultra_long"}


def test_invalid_profiles_are_refused_with_the_reason():
    with pytest.raises(ProfileError, match="sum to 1"):
        WorkloadProfile((Bucket("a", 0, 10, 0.5, (1, 9)), Bucket("b", 10, None, 0.2, (10, 20))))
    with pytest.raises(ProfileError, match="must end where"):
        WorkloadProfile((Bucket("a", 0, 10, 0.5, (1, 9)), Bucket("b", 11, None, 0.5, (11, 20))))


def test_a_trace_without_token_columns_names_what_it_expected(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ProfileError, match="expected one pair of"):
        read_trace(path)
