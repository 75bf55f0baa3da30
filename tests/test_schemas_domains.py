"""The domain registry: its format, the shipped file, and the fleet's agreement with it."""

from __future__ import annotations

import pytest

from producers.catalog import build_catalog
from schemas import DomainRegistry, DomainRegistryError, default_domains

TEXT = """
[task_types.math]
verifier = "math"
options = { tolerance = 1e-6 }

[domains]
"math/a" = "math"
"math/b" = { task_type = "math", tolerance = 0.01, reward_scale = 2.0 }
"""


def test_a_domain_is_one_line_with_its_task_types_defaults():
    registry = DomainRegistry.from_toml(TEXT)
    assert registry["math/a"].verifier == "math" and registry["math/a"].options == {"tolerance": 1e-6}
    assert registry["math/b"].options == {"tolerance": 0.01, "reward_scale": 2.0}
    assert registry["math/b"].reward_scale == 2.0 and registry["math/a"].reward_scale == 1.0


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[domains]\n'a' = 'math'\n", "task_types"),
        (TEXT + '"c" = "code"\n', "no \\[task_types.code\\]"),
        (TEXT + '"d" = { tolerance = 1 }\n', "expected"),
        (TEXT + '"e" = { task_type = "math", x = [1] }\n', "not a string, number or boolean"),
        ("not toml [", "not valid TOML"),
    ],
)
def test_malformed_registries_name_the_bad_entry(text, match):
    with pytest.raises(DomainRegistryError, match=match):
        DomainRegistry.from_toml(text)


def test_an_unknown_domain_says_where_to_register_it():
    with pytest.raises(DomainRegistryError, match=r"unknown domain 'math/zzz'.*register it"):
        DomainRegistry.from_toml(TEXT)["math/zzz"]


def test_the_shipped_registry_has_300_domains_and_every_fleet_domain():
    registry = default_domains()
    assert len(registry) >= 300
    assert {spec.task_type for spec in registry.values()} >= {
        "math",
        "code",
        "extraction",
        "precomputed",
        "tool_use",
    }
    for size in (4, 50, 120, 320):
        for domain in build_catalog(size):
            assert registry[domain.name].task_type == domain.task_type


def test_a_catalog_larger_than_the_registry_is_refused():
    from producers.exceptions import FleetConfigError

    with pytest.raises(FleetConfigError, match="not in the domain registry"):
        build_catalog(400)


def test_the_registry_does_not_need_the_stream_processors():
    import subprocess
    import sys

    code = "import sys, schemas.domains as d; d.default_domains(); print('stream_processors' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )


def test_rollstream_domains_lists_them_all(capsys):
    import json

    from infra.cli import main

    assert main(["domains", "--json"]) == 0
    out = capsys.readouterr()
    listed = [json.loads(line) for line in out.out.splitlines()]
    assert len(listed) >= 300 and "322 domains" in out.err
    assert {"domain", "task_type", "verifier", "options"} == set(listed[0])
    assert main(["domains", "--task-type", "tool_use"]) == 0
    assert "tool_use/files-000" in capsys.readouterr().out
