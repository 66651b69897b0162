"""Families found without a central list.

- Built-in: every folder under envs/ holding a `profile.yaml` is a family package; it must
  expose `FAMILY = Family(...)` (a folder without one is an error: it is ours to fix).
- External: each entry point of the group `gymfoundry.families` names a `Family` (or a function
  returning one) in an installed distribution, e.g. in its pyproject.toml:
      [project.entry-points."gymfoundry.families"]
      probe = "probe_family:FAMILY"
  One that fails to load does not stop the others or `import envs`: it is warned about, kept in
  `load_errors()`, and named in the error of a `make` that asks for it."""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from pathlib import Path

from envs.family import Family, FamilyError, add, family

GROUP = "gymfoundry.families"
ENVS_DIR = Path(__file__).resolve().parent
_ERRORS: dict[str, str] = {}


class FamilyLoadWarning(UserWarning):
    """An external family could not be loaded (the others still are)."""


def discover() -> list[Family]:
    """Register the built-in families, then the external ones; the families registered."""
    found = [_builtin(folder.name) for folder in sorted(ENVS_DIR.iterdir())
             if (folder / "profile.yaml").is_file() and (folder / "__init__.py").is_file()]
    for fam in found:
        add(fam)
    return found + discover_external()


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


def load_errors() -> dict[str, str]:
    """Entry-point name -> why that family did not load."""
    return dict(_ERRORS)


def _builtin(name: str) -> Family:
    module = importlib.import_module(f"envs.{name}")
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
