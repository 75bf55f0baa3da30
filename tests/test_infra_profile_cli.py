"""`rollstream profile fit` and `profile show`: the Azure trace's own shares, printed with a histogram."""

from __future__ import annotations

from pathlib import Path

from infra.cli import main
from schemas.profile import load_profile
from schemas.profile_fit import read_trace

TRACE = (
    Path(__file__).resolve().parents[2]
    / "shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"
)


def test_fit_reproduces_the_trace_shares_and_show_prints_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ROLLSTREAM_STATE_DIR", str(tmp_path))
    out = tmp_path / "profile.toml"
    assert main(["profile", "fit", str(TRACE), "--quantiles", "0.5,0.9", "--out", str(out)]) == 0
    fitted = load_profile(out)
    prompt, generated = read_trace(TRACE)
    mix = fitted.mix(prompt + generated)
    assert fitted.names == ("short", "long", "ultra_long")
    assert all(abs(mix[name] - share) < 0.01 for name, share in fitted.targets.items())
    printed = capsys.readouterr().out
    assert "delivered" in printed and "█" in printed and fitted.id in printed

    assert main(["profile", "fit", str(TRACE), "--edges", "1024,4096", "--names", "s,m,l"]) == 0
    assert "[1024, 4096)" in capsys.readouterr().out

    assert main(["profile", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert fitted.id in shown and "ultra_long" in shown
    monkeypatch.setenv("ROLLSTREAM_PROFILE_PATH", str(out))
    assert main(["profile", "show"]) == 0  # the profile_path setting
    assert fitted.id in capsys.readouterr().out
    assert main(["profile", "show", str(tmp_path / "missing.toml")]) == 2
    assert "rollstream profile fit" in capsys.readouterr().err
