"""Simulated people (envs/person.py): progressive disclosure by the scripted backend, its
endings, and the LLM backend against a local OpenAI-protocol server, alone and as the customer
of the conversation family, where its failures (HTTP 500, garbage, a private value said) are
environment faults of the rollout, never the model's failures; and, since that family's own
tests may not import `tasks`, its deliberately broken gold tasks rejected by the validity stage."""

import pytest

from gymfoundry import envs  # noqa: F401  (registers the families)
from gymfoundry.envs.conversation import FAMILY
from gymfoundry.envs.conversation.policy import ScriptedConversationPolicy
from gymfoundry.envs.errors import EnvFault
from gymfoundry.envs.person import (Fact, LLMSimulator, Persona, ScriptedSimulator, Simulator, SimulatorFault, asks,
                         make_simulator, new_memory)
from gymfoundry.envs.records import TaskSpec, ToolCall
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.tasks.stages.validate import validate_tasks
from tests.verifiers.openai_stub import OpenAIStub

PERSONA = Persona(
    opening="I want to return my lamp.",
    facts={"email": Fact(value="mia.novak42@example.com", asked_by=["email"], reply="My email is {value}."),
           "zip": Fact(value="40213", asked_by=["zip", "zip code"])},
    unknown={"order_number": ["order number"]},
    private={"card_number": "4111 2222 3333 4444"}, style="terse", patience=4)


def test_scripted_tells_a_fact_only_when_asked():
    sim, memory = ScriptedSimulator(seed=1), new_memory()
    first = sim.reply(PERSONA, memory, "Hello, how can I help?")
    assert first.disclosed == [] and "mia.novak42" not in first.text and "40213" not in first.text
    assert first.text in ("Ok.", "Go on.", "And?")
    second = sim.reply(PERSONA, memory, "What is your zip code?")
    assert second.text == "It's 40213." and second.disclosed == ["zip"]
    third = sim.reply(PERSONA, memory, "Thanks. Your email, please?")
    assert third.text == "My email is mia.novak42@example.com." and third.disclosed == ["email"]
    assert Simulator.state(memory) == {"turns": 3, "told": ["zip", "email"], "ended": None}


def test_asking_is_by_whole_words():
    assert asks("your zip?", ["zip"]) and asks("ZIP code", ["zip code"])
    assert not asks("the zipper broke", ["zip"]) and not asks("emails", ["email"])


def test_unknown_repeated_and_a_human():
    sim, memory = ScriptedSimulator(), new_memory()
    assert sim.reply(PERSONA, memory, "What is your order number?").text == "Sorry, I don't know my order number."
    sim.reply(PERSONA, memory, "Anything else?")
    assert sim.reply(PERSONA, memory, "Anything  else?").text == "You already asked me that."
    assert sim.reply(PERSONA, memory, "Shall I get a supervisor?").text == "Yes please, let me talk to a person."


def test_out_of_patience_and_closed():
    sim, memory = ScriptedSimulator(), new_memory()
    for k in range(PERSONA.patience):
        assert not sim.reply(PERSONA, memory, f"Question {k}").ended
    gone = sim.reply(PERSONA, memory, "One more?")
    assert gone.ended and gone.reason == "out_of_patience" and memory["ended"] == "out_of_patience"
    assert sim.reply(PERSONA, memory, "Hello?").text == "(the person has left the conversation)"
    memory = new_memory()
    bye = Simulator.close(PERSONA, memory)
    assert (bye.text, bye.ended, memory["ended"]) == ("Fine. Bye.", True, "resolved")


def test_make_simulator_backends(monkeypatch):
    monkeypatch.delenv("GYMFOUNDRY_USER_SIMULATOR", raising=False)
    assert isinstance(make_simulator(), ScriptedSimulator)
    with pytest.raises(ValueError, match="unknown user simulator 'oracle'"):
        make_simulator(backend="oracle")
    monkeypatch.delenv("GYMFOUNDRY_USER_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="needs base_url and model"):
        make_simulator(backend="llm")
    assert issubclass(SimulatorFault, EnvFault)


def chat(text):
    return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


def test_llm_simulator_against_a_local_server():
    with OpenAIStub(respond=lambda body, headers: chat("My email is mia.novak42@example.com.")) as server:
        sim = LLMSimulator(base_url=server.base_url, model="stub-user", api_key="k-1")
        memory = new_memory()
        reply = sim.reply(PERSONA, memory, "Your email?")
        sim.reply(PERSONA, memory, "Thanks!")
        sim.release()
        sent = server.requests
    assert reply.text == "My email is mia.novak42@example.com." and reply.disclosed == ["email"]
    assert memory["told"] == ["email"] and len(memory["history"]) == 4
    system = sent[0]["messages"][0]["content"]
    assert "- email: mia.novak42@example.com" in system and "4111 2222 3333 4444" not in system
    assert [m["role"] for m in sent[1]["messages"]] == ["system", "assistant", "user", "assistant", "user"]
    assert sent[0]["model"] == "stub-user" and sent[0]["temperature"] == 0.0


@pytest.mark.parametrize("status, payload, says", [
    (500, {"error": {"message": "overloaded"}}, "HTTPStatusError"),
    (200, {"nonsense": True}, "KeyError"),
    (200, {"choices": [{"message": {"content": "   "}}]}, "invalid reply"),
    (200, {"choices": [{"message": {"content": "My card is 4111 2222 3333 4444."}}]}, "private value"),
])
def test_llm_simulator_failures_raise_simulator_faults(status, payload, says):
    with OpenAIStub(respond=lambda body, headers: (status, payload)) as server:
        sim = LLMSimulator(base_url=server.base_url, model="stub-user")
        memory = new_memory()
        with pytest.raises(SimulatorFault, match=says):
            sim.reply(PERSONA, memory, "Your email?")
    assert memory["history"] == []


# -- the LLM customer of the conversation family, through tasks.rollout.episodes.run_episode -------------
def llm_customer(body, headers):
    """A model playing the persona: it tells a fact from its system prompt when the agent asks."""
    system, asked = body["messages"][0]["content"], body["messages"][-1]["content"].lower()
    facts = dict(line[2:].split(": ", 1) for line in system.splitlines() if line.startswith("- "))
    return chat(f"Sure, my email is {facts['email']}" if "email" in asked else "Okay, thank you.")


@pytest.fixture
def llm_configured(monkeypatch):
    def configure(server):
        monkeypatch.setenv("GYMFOUNDRY_USER_SIMULATOR", "llm")
        monkeypatch.setenv("GYMFOUNDRY_USER_BASE_URL", server.base_url)
        monkeypatch.setenv("GYMFOUNDRY_USER_MODEL", "stub-customer")
    return configure


def email_task():
    """A conversation task whose customer must be asked for their email."""
    for level in (3, 4, 5):
        for seed in range(60):
            task = FAMILY.generate(seed, level)
            facts = FAMILY.facts_of(task)
            if facts.verify_by == "email" and "@" not in facts.persona.opening and facts.expected_end == "resolved":
                return task
    raise AssertionError("no such task")


def test_the_llm_customer_works_through_the_conversation_env(llm_configured):
    task = email_task()
    persona = FAMILY.facts_of(task).persona
    with OpenAIStub(respond=llm_customer) as server:
        llm_configured(server)
        rollout = run_episode(task, ScriptedConversationPolicy(mistake_rate=0.0), seed=3)
        sent = list(server.requests)
    assert rollout.termination.value == "success", rollout.termination_reason
    assert len(sent) == sum(s.tool_call.name == "respond" for s in rollout.steps) >= 2
    assert all(r["model"] == "stub-customer" for r in sent)
    assert f"Sure, my email is {persona.facts['email'].value}" in rollout.steps[0].result
    assert not [v for v in persona.private.values() for r in sent for m in r["messages"] if v in m["content"]]


@pytest.mark.parametrize("reply", [
    (500, {"error": {"message": "overloaded"}}),
    (200, {"nonsense": True}),
    (200, {"choices": [{"message": {"role": "assistant", "content": ""}}]}),
    (200, {"choices": [{"message": {"role": "assistant", "content": None}}]}),
], ids=["http_500", "not_chat_json", "empty_content", "null_content"])
def test_llm_customer_failures_are_env_faults_not_model_failures(llm_configured, reply):
    task = email_task()
    with OpenAIStub(respond=lambda body, headers: reply) as server:
        llm_configured(server)
        rollout = run_episode(task, ScriptedConversationPolicy(mistake_rate=0.0), seed=3)
    assert rollout.termination.value == "env_fault", (rollout.termination, rollout.termination_reason)
    faulted = [s for s in rollout.steps if s.error == "env_fault"]
    assert faulted and all(s.tool_call.name == "respond" for s in faulted)
    assert "user simulator" in faulted[0].result


def test_an_llm_customer_saying_a_private_value_is_an_env_fault(llm_configured):
    task = email_task()
    card = FAMILY.facts_of(task).persona.private["card_number"]
    with OpenAIStub(respond=lambda body, headers: chat(f"My card is {card}")) as server:
        llm_configured(server)
        rollout = run_episode(task, ScriptedConversationPolicy(mistake_rate=0.0), seed=3)
    assert rollout.termination.value == "env_fault"
    assert not [s for s in rollout.steps if card in (s.result or "") or card in s.observation]


# -- a broken gold task of the conversation family is rejected by the validity stage ----------

def find_task(pred, levels=(1, 2, 3, 4, 5), seeds=range(60)):
    for level in levels:
        for seed in seeds:
            task = FAMILY.generate(seed, level)
            if pred(task, FAMILY.facts_of(task)):
                return task
    raise AssertionError("no generated task fits")


def edited(task, **hidden):
    """The task with hidden fields (its reference) replaced, and a fresh content id."""
    data = task.model_dump()
    data["hidden"].update(hidden)
    return TaskSpec.model_validate({**data, "task_id": ""})


def test_broken_gold_tasks_are_rejected_with_a_reason():
    task = find_task(lambda t, f: any(m.kind == "amount" for m in f.mentions))
    facts = FAMILY.facts_of(task)
    amount = next(m for m in facts.mentions if m.kind == "amount")
    *work, _say, end = task.hidden.reference
    silent = edited(task, reference=[c.model_dump() for c in [*work, end]])  # never tells the refund
    wrong = edited(task, reference=[c.model_dump() for c in
                                    [task.hidden.reference[0], ToolCall(name="get_order",
                                                                        arguments={"order_id": "#W000000"}),
                                     *task.hidden.reference[1:]]])
    valid, rejected = validate_tasks([task, silent, wrong])
    assert [t.task_id for t in valid] == [task.task_id]
    reasons = {r.task_id: r.reason for r in rejected}
    assert reasons[silent.task_id].startswith("reference fails its verifier: ")
    assert f"the customer was never told the refund of {amount.text} for {amount.order_id}" in reasons[silent.task_id]
    assert reasons[wrong.task_id].startswith("reference step 1 (get_order) failed") or \
        reasons[wrong.task_id].startswith("reference step 2 (get_order) failed")


def test_a_value_counts_as_told_only_as_a_whole():
    from gymfoundry.envs.person import says

    assert says("My horizon is 5 years.", "5 years") and not says("My horizon is 15 years.", "5 years")
    assert says("Write to ann@example.com.", "ann@example.com") and not says("ann@example.community", "ann@example.com")
