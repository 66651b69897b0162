"""The installed import names sit under one namespace, `gymfoundry`, so installing gymfoundry shadows
no other distribution's (`verifiers` is also PrimeIntellect's). The folders stay where they are in the
repository: `gymfoundry.envs` is ./envs, `gymfoundry.tasks` is ./tasks, and so on. Metadata: pyproject.toml."""

from setuptools import find_packages, setup

FOLDERS = ("envs", "verifiers", "warehouse", "tasks", "flows", "deployments")
PACKAGES = find_packages(include=[f"{folder}*" for folder in FOLDERS], exclude=["*.tests", "*.tests.*"])

setup(packages=[f"gymfoundry.{package}" for package in PACKAGES],
      package_dir={"gymfoundry": "."})
