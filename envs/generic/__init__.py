"""The generic family: a domain defined by a YAML file alone, no Python. This package is the
interpreter (envs/generic/: the expression language, the domain file's models and checks, the
world, the generator, the scripted policy and the verifier); the shipped domain, room booking, is
the file profile.yaml names (rooms.yaml) and registers as the family `generic`. Any other domain
file in a folder named by GYMFOUNDRY_FAMILY_DIRS becomes the family it names (envs/discovery.py)."""

from pathlib import Path

import yaml

from gymfoundry.envs.generic.loader import load_family

HERE = Path(__file__).resolve().parent


def __getattr__(name: str):
    """`FAMILY`, the shipped domain's family, loaded on first use (and proven: see proof.py)."""
    if name != "FAMILY":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    marker = yaml.safe_load((HERE / "profile.yaml").read_text(encoding="utf-8"))
    family = globals()["FAMILY"] = load_family(HERE / marker["domain"], name="generic")
    return family
