"""Families found without a central list.

- Built-in: every folder under envs/ holding a `profile.yaml` is a family package; it must
  expose `FAMILY = Family(...)` (a folder without one is an error: it is ours to fix).
- External: each entry point of the group `gymfoundry.families` names a `Family` (or a function
  returning one) in an installed distribution, e.g. in its pyproject.toml:
      [project.entry-points."gymfoundry.families"]
      probe = "probe_family:FAMILY"
  One that fails to load does not stop the others or the lookup that found it: it is warned about, kept in
  `load_errors()`, and named in the error of a lookup that asks for it.
- YAML-only: every `*.yaml` domain file in the folders GYMFOUNDRY_FAMILY_DIRS names (os.pathsep-
  separated) is the family its `name:` declares, read by the interpreter in envs/generic/. A file
  that fails to load is warned about and kept in `load_errors()` the same way.

This module sits above the families (it imports the YAML interpreter, envs/generic/): nothing
below imports it. It runs once, on the first lookup (`family`, `families`, `masked_dirs` in
envs/family.py), through the finder the package `gymfoundry.envs` installs; `discover()` runs it
again explicitly (a family installed since is then found)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import warnings
from pathlib import Path

import yaml

from gymfoundry.envs.family import _ERRORS, Family, FamilyError, add, family
from gymfoundry.envs.generic.domain import DOMAINS, domain_text
from gymfoundry.envs.generic.loader import load_family

GROUP = "gymfoundry.families"
FAMILY_DIRS = "GYMFOUNDRY_FAMILY_DIRS"
ENVS_DIR = Path(__file__).resolve().parent


class FamilyLoadWarning(UserWarning):
    """An external family could not be loaded (the others still are)."""


def builtin_folders() -> list[Path]:
    """The folders of the built-in families: those under envs/ holding a profile.yaml."""
    return [folder for folder in sorted(ENVS_DIR.iterdir())
            if (folder / "profile.yaml").is_file() and (folder / "__init__.py").is_file()]


def discover() -> list[Family]:
    """Register the built-in families, then the external ones; the families registered."""
    found = [_builtin(folder.name) for folder in builtin_folders()]
    for fam in found:
        add(fam)
    return found + discover_yaml() + discover_external()


def discover_yaml() -> list[Family]:
    """The YAML domains in the folders GYMFOUNDRY_FAMILY_DIRS names, each file its own family."""
    found = []
    for folder in [Path(d).expanduser() for d in os.environ.get(FAMILY_DIRS, "").split(os.pathsep) if d.strip()]:
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            key = _yaml_name(path)
            try:
                fam = _yaml(path)
            except Exception as exc:  # a user's file: report it, load the rest
                why = str(exc) if isinstance(exc, FamilyError) else f"{path}: {type(exc).__name__}: {exc}"
                _ERRORS[key] = f"domain file {why} ({FAMILY_DIRS})"
                warnings.warn(f"family not loaded: {_ERRORS[key]}", FamilyLoadWarning, stacklevel=2)
                continue
            _ERRORS.pop(key, None)
            found.append(fam)
    return found


def discover_external() -> list[Family]:
    found = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        try:
            fam = _external(ep)
        except Exception as exc:  # someone else's package: report it, load the rest
            _ERRORS[ep.name] = f"entry point {ep.name} = {ep.value!r} ({GROUP}): {type(exc).__name__}: {exc}"
            warnings.warn(f"family not loaded: {_ERRORS[ep.name]}", FamilyLoadWarning, stacklevel=2)
            continue
        _ERRORS.pop(ep.name, None)
        found.append(fam)
    return found


def _builtin(name: str) -> Family:
    module = importlib.import_module(f"gymfoundry.envs.{name}")
    fam = getattr(module, "FAMILY", None)
    if not isinstance(fam, Family):
        raise FamilyError(f"envs/{name}/ has a profile.yaml but envs.{name} exposes no FAMILY = Family(...)")
    return fam


def _external(ep: importlib.metadata.EntryPoint) -> Family:
    fam = ep.load()
    if callable(fam) and not isinstance(fam, Family):
        fam = fam()
    if not isinstance(fam, Family):
        raise FamilyError(f"it gives a {type(fam).__name__}, not a Family")
    if fam.name != ep.name:
        raise FamilyError(f"the entry point is named {ep.name!r} but declares family {fam.name!r}")
    try:
        known = family(fam.name)
    except ValueError:
        known = None
    if known is not None and known is not fam:
        raise FamilyError(f"a family named {fam.name!r} is already registered (by {known.env.__module__})")
    add(fam)
    return fam


def _yaml_name(path: Path) -> str:
    """The family name a domain file declares (its stem if it declares none readable)."""
    try:  # never a bare read: a FIFO or /dev/zero in the folder would hang every lookup
        name = (yaml.safe_load(domain_text(path)) or {}).get("name")
    except Exception:
        name = None
    return name if isinstance(name, str) and name else path.stem


def _yaml(path: Path) -> Family:
    name = _yaml_name(path)
    try:
        known = family(name)
    except ValueError:
        known = None
    if known is not None:
        if DOMAINS.get(name, (None, None))[1] == path.resolve():
            return known  # discovered again: the same file
        raise FamilyError(f"{path}: name: a family named {name!r} is already registered (by {known.env.__module__})")
    fam = load_family(path)
    add(fam)
    return fam
