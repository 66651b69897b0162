"""The family SDK: tools declared once, the profile checked against them, typed hidden facts, a
required potential, and families found without a central list (built-in folders, entry points)."""

import importlib
import sys
import textwrap
import warnings
from typing import Annotated, Literal

import pytest
from pydantic import Field

from gymfoundry import envs
from gymfoundry.envs.base import ToolEnv
from gymfoundry.envs.discovery import FamilyLoadWarning, discover_external
from gymfoundry.envs.errors import InvalidTask
from gymfoundry.envs.errors import UnknownEnv
from gymfoundry.envs.family import family, families, load_errors, masked_dirs
from gymfoundry.envs.inventory import FAMILY, generate_task
from gymfoundry.envs.records import TaskSpec, ToolCategory
from gymfoundry.envs.tools import ProfileMismatch, arguments_schema, render_hint, tool
from gymfoundry.envs.verifier import ReplayVerifier
from gymfoundry.envs.inventory.verifier import InventoryVerifier


def test_builtin_families_are_found_from_their_folders():
    assert "inventory" in [f.name for f in families()]
    assert family("inventory") is FAMILY and FAMILY.env_id == "gymfoundry/inventory-v0"
    assert "gymfoundry/inventory-v0" in [f.env_id for f in envs.families()]


def test_schema_from_the_signature_keeps_constraints_and_descriptions():
    def tool_x(self, state, name: Annotated[str, Field(min_length=1, max_length=8, description="a name")],
               n: Annotated[int, Field(ge=1, le=9)], mode: Literal["a", "b"],
               note: Annotated[str, Field(max_length=5)] | None = None, tags: list[str] | None = None):
        """X."""

    assert arguments_schema(tool_x) == {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8, "minLength": 1, "description": "a name"},
                       "n": {"type": "integer", "maximum": 9, "minimum": 1},
                       "mode": {"type": "string", "enum": ["a", "b"]},
                       "note": {"type": "string", "maxLength": 5},  # optional, and null is refused
                       "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "n", "mode"], "additionalProperties": False}


def test_inventory_tools_come_from_the_code_with_the_schemas_the_profile_had():
    spec = FAMILY.profile.tool("reserve")
    assert spec.category == ToolCategory.write
    assert spec.description == "Reserve units of an item for the authorised order. Returns a reservation id."
    assert spec.parameters == {"type": "object", "properties": {
        "sku": {"type": "string", "minLength": 1, "maxLength": 32},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
        "auth_token": {"type": "string", "maxLength": 64}},
        "required": ["sku", "quantity", "auth_token"], "additionalProperties": False}
    assert FAMILY.tool_names == ["find_items", "get_stock", "request_authorization", "reserve", "release", "submit"]
    task = generate_task(3, 2)
    assert FAMILY.make(verified=False).reset(task).observation.endswith(
        'Call one tool per turn as JSON: {"name": <tool>, "arguments": {...}}. '
        "Tools: find_items, get_stock, request_authorization, reserve, release, submit.")


def test_task_ids_are_unchanged_by_the_port():
    # generator version 1's ids as they were before the SDK: the assembly helper hashes the same content
    assert [generate_task(0, level).task_id for level in (1, 2, 3)] == [
        "t-b4b536ab69088cc9", "t-d95d3f5c37ae470e", "t-c0a9f3d2466c5c3f"]
    assert generate_task(29, 5).task_id == "t-45f8dada8299f8d1"


def test_event_log_records_every_call_with_its_outcome():
    task = generate_task(3, 2)
    env = FAMILY.make(verified=False)
    env.reset(task)
    hold = task.initial_state["holds"][0]["hold_id"]
    env.step({"name": "release", "arguments": {"reservation_id": hold}})
    env.step({"name": "get_stock", "arguments": {"sku": task.hidden.checks["targets"][0]["sku"]}})
    env.step({"name": "nope", "arguments": {}})  # never reached a tool: not in the log
    assert [(e["seq"], e["tool"], e["outcome"], e["auth"]) for e in env.state()["events"]] == [
        (0, "release", "held_by_another_order", None), (1, "get_stock", "ok", None)]


def tiny_env(tmp_path, profile_text):
    path = tmp_path / "profile.yaml"
    path.write_text(textwrap.dedent(profile_text))

    class TinyEnv(ToolEnv):
        family = "tiny"
        profile_yaml = path

        def initial_state(self, task):
            return {"events": []}

        def is_finished(self, state):
            return False

        @tool(ToolCategory.write)
        def tool_put(self, state, key: str, value: int):
            """Store a value."""
            return {}

    return TinyEnv


def test_a_profile_naming_what_the_code_lacks_is_refused_at_load(tmp_path):
    base = "name: tiny\n"
    assert tiny_env(tmp_path, base + "grounded_arguments: {put: [key]}\n").profile.grounded("put") == ["key"]
    with pytest.raises(ProfileMismatch, match=r"grounded_arguments.put names argument 'kee', not an argument "
                                              r"of put \(its arguments: key, value\)"):
        tiny_env(tmp_path, base + "grounded_arguments: {put: [kee]}\n")
    with pytest.raises(ProfileMismatch, match=r"undoes.take names tool 'take', which TinyEnv does not declare"):
        tiny_env(tmp_path, base + "undoes: {take: {reverts: put, argument: key, matches: arguments.key}}\n")
    with pytest.raises(ProfileMismatch, match=r"tool 'put': category is 'read' in the profile, 'write' in the code"):
        tiny_env(tmp_path, base + "tools: [{name: put, category: read}]\n")
    with pytest.raises(ProfileMismatch, match=r"tool 'get' is listed but TinyEnv declares no @tool tool_get"):
        tiny_env(tmp_path, base + "tools: [{name: put}, {name: get}]\n")


def test_a_tool_needs_its_name_prefix_a_docstring_and_types():
    with pytest.raises(TypeError, match="must be named tool_<tool name>"):
        tool("read")(lambda self, state: None)
    with pytest.raises(TypeError, match="needs a docstring"):
        def tool_a(self, state): ...
        tool("read")(tool_a)
    with pytest.raises(TypeError, match="argument 'x' needs a type annotation"):
        def tool_b(self, state, x):
            """B."""
        tool("read")(tool_b)


def test_hint_lists_the_tools_with_their_hints():
    decls = [d for d in FAMILY.env.tools if d.name in ("reserve", "submit")]
    assert render_hint(decls).endswith("Tools: reserve, submit.")


def test_a_verifier_without_a_potential_cannot_be_made():
    class NoPotential(ReplayVerifier):
        verifier_id, version, family = "x", "1", "inventory"

        def verify(self, task, steps, final_state=None): ...

    with pytest.raises(TypeError, match="abstract method.*potential"):
        NoPotential()


def test_hidden_facts_of_the_wrong_shape_are_refused_when_built_and_when_read():
    task = generate_task(3, 2)
    facts = dict(task.hidden.checks)
    with pytest.raises(InvalidTask, match=r"hidden.checks are not InventoryFacts: approved: Input should be a valid boolean"):
        FAMILY.task(seed=3, level=2, template_id="x", goal="g", initial_state={}, reference=[],
                    facts={**facts, "approved": "yes"}, max_steps=5)
    dumped = task.model_dump()
    forged = TaskSpec.model_validate({**dumped, "task_id": "", "hidden": {
        **dumped["hidden"], "checks": {k: v for k, v in facts.items() if k != "targets"}}})
    with pytest.raises(InvalidTask, match=r"hidden.checks are not InventoryFacts: targets: Field required"):
        InventoryVerifier().potentials(forged, [])
    with pytest.raises(InvalidTask, match=r"extra: Extra inputs are not permitted"):
        FAMILY.facts_of(task.model_copy(update={"hidden": task.hidden.model_copy(
            update={"checks": {**facts, "extra": 1}})}))


TINY = '''
from typing import Annotated
from pydantic import Field
from gymfoundry.envs.base import ToolEnv
from gymfoundry.envs.family import Family, HiddenFacts
from gymfoundry.envs.records import ToolCall, ToolCategory
from gymfoundry.envs.tools import tool
from gymfoundry.envs.verifier import ReplayVerifier


class TinyFacts(HiddenFacts):
    target: int


class TinyEnv(ToolEnv):
    family = "tiny"
    profile_yaml = __file__.replace("__init__.py", "profile.yaml")

    def initial_state(self, task):
        return {"value": 0, "done": False, "events": []}

    def is_finished(self, state):
        return state["done"]

    @tool(ToolCategory.write)
    def tool_add(self, state, n: Annotated[int, Field(ge=1, le=9)]):
        """Add n to the value."""
        state["value"] += n
        return {"value": state["value"]}

    @tool(ToolCategory.irreversible)
    def tool_finish(self, state):
        """End the episode."""
        state["done"] = True
        return {"value": state["value"]}


class TinyVerifier(ReplayVerifier):
    verifier_id, version, family = "tiny-outcome", "1", "tiny"

    def verify(self, task, steps, final_state=None):
        raise NotImplementedError

    def potential(self, task, state):
        return min(1.0, state["value"] / self.facts(task).target)


def generate(family, seed, level):
    target = seed % 5 + 1
    return family.task(seed=seed, level=level, template_id=family.template_id(target), goal=f"Reach {target}.",
                       initial_state={}, reference=[ToolCall(name="add", arguments={"n": target}),
                                                    ToolCall(name="finish")],
                       facts=TinyFacts(target=target), max_steps=4)


FAMILY = Family(name="tiny", env=TinyEnv, generator=generate, generator_version="1", facts=TinyFacts,
                verifier=TinyVerifier, levels=(1,))
'''


def install(tmp_path, monkeypatch, name, value, module_source=None):
    """A distribution on sys.path declaring one `gymfoundry.families` entry point."""
    site = tmp_path / "site"
    if module_source is not None:
        pkg = site / "tiny_family"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(module_source)
        (pkg / "profile.yaml").write_text("name: tiny\n")
    dist = site / f"{name}_family-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-family\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[gymfoundry.families]\n{name} = {value}\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()


def test_an_installed_family_is_discovered_through_its_entry_point_and_makeable(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "tiny", "tiny_family:FAMILY", TINY)
    found = discover_external()
    assert [f.name for f in found] == ["tiny"]
    env = family("gymfoundry/tiny-v0").make()
    task = env.generate_task(7, 1)
    assert task.hidden.checks == {"target": 3} and task.template_id.startswith("tiny-")
    assert env.reset(task).observation.endswith("Tools: add, finish.")
    steps = [env.step(c) for c in task.hidden.reference]
    assert steps[-1].terminated and env.state()["value"] == 3
    assert family("tiny").verifier().potentials(task, env.steps) == [0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"level must be 1..1, not 2"):
        env.generate_task(7, 2)
    assert str(tmp_path / "site" / "tiny_family") in masked_dirs()
    sys.modules.pop("tiny_family", None)


def test_an_entry_point_that_fails_to_import_is_reported_and_breaks_nothing(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "broken", "no_such_module_here:FAMILY")
    with pytest.warns(FamilyLoadWarning, match=r"family not loaded: entry point broken = 'no_such_module_here:FAMILY'"
                                               r".*ModuleNotFoundError"):
        assert discover_external() == [] or True
    assert "ModuleNotFoundError" in load_errors()["broken"]
    with pytest.raises(UnknownEnv, match=r"no environment family 'broken'.*that family failed to load: .*"
                                         r"no_such_module_here"):
        family("broken")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FamilyLoadWarning)
        importlib.reload(envs)  # a lookup after `import gymfoundry.envs` still finds the built-ins
    assert "gymfoundry/inventory-v0" in [f.env_id for f in envs.families()]


def test_rendered_schemas_keep_the_order_a_person_writes():
    """The tool schemas are prompt text (chat templates render them): their key order is stable,
    lower bounds before upper ones, so porting a family onto @tool left its SFT rows unchanged."""
    from gymfoundry.envs.inventory import InventoryEnv

    params = {t["function"]["name"]: t["function"]["parameters"]["properties"]
              for t in InventoryEnv.profile.function_schemas(None)}
    assert list(params["find_items"]["query"]) == ["type", "minLength", "maxLength", "description"]
    assert list(params["reserve"]["quantity"]) == ["type", "minimum", "maximum"]
