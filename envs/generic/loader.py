"""A domain file made a family: `load_family(path)` reads and checks the file (domain.py), builds
its classes (the env, the scripted policy and the verifier, made per domain) into a `Family`
ready to register, and proves its references on every level (proof.py)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from gymfoundry.envs.family import Family, FamilyError
from gymfoundry.envs.generic import policy, verifier, world
from gymfoundry.envs.generic.domain import DOMAINS, INTERPRETER_DIR, Domain, profile_of, read_domain
from gymfoundry.envs.generic.facts import GenericFacts
from gymfoundry.envs.generic.generator import generate
from gymfoundry.envs.generic.proof import prove_domain


def load_family(path: str | Path, *, name: str | None = None, prove: bool = True) -> Family:
    """The family of the domain file at `path`: checked, built, and (with `prove`) its references
    played at every level. `name`, when given, must be the file's declared name."""
    path = Path(path).resolve()
    domain = read_domain(path)
    if name is not None and domain.name != name:
        raise FamilyError(f"{path}: name: declares {domain.name!r}, expected {name!r}")
    clash = name_clash(domain.name)
    if clash:
        raise FamilyError(f"{path}: name: {clash}")
    before = DOMAINS.get(domain.name)
    fam = build(domain, path)
    if prove:
        problems = prove_domain(fam, domain)
        if problems:
            if before is None:  # what failed to load is not a domain verifiers can find
                DOMAINS.pop(domain.name, None)
            else:
                DOMAINS[domain.name] = before
            raise FamilyError(f"{path}: " + "; ".join(problems[:4]))
    return fam


def name_clash(name: str) -> str | None:
    """Why a domain cannot take `name`: one of the classes it makes (`<Name>Env`, `<Name>Policy`,
    `<Name>Verifier`, found by name when pickled or looked up) is the interpreter's own, or
    another loaded domain's (`a_b` and `a__b` both make ABEnv)."""
    for suffix, module in (("Env", world), ("Policy", policy), ("Verifier", verifier)):
        cls = world.class_name(name, suffix)
        if cls in vars(module):
            return f"{name!r} is reserved: it would make the class {cls}, which is the interpreter's own"
        other = next((d.name for d, _ in DOMAINS.values() if d.name != name and world.class_name(d.name, suffix) == cls),
                     None)
        if other is not None:
            return f"{name!r} clashes with the loaded domain {other!r}: both would make the class {cls}"
    return None


# -- the family ---------------------------------------------------------------------------------
def build(domain: Domain, path: Path) -> Family:
    """The `Family` of a checked domain (not yet registered)."""
    env = world.env_class(domain, profile_of(domain))
    scripted = policy.policy_class(domain)
    fam = Family(name=domain.name, env=env, generator=partial(generate, domain),
                 generator_version=domain.generator_version, facts=GenericFacts,
                 verifier=verifier.domain_verifier(domain),
                 scripted_policy=scripted, version=domain.version, levels=domain.levels,
                 masked=tuple(sorted({INTERPRETER_DIR, str(path.parent)})))
    world.remember(env)
    policy.remember(scripted)
    DOMAINS[domain.name] = (domain, path)
    return fam
