"""The hf policy's batched decoding: forks in threads decode their turns together, and every
episode's tokens are those it gets decoded alone.

Exactness: the tiny model runs in fp32. Batched, a sequence's logits differ from its logits
alone only in the last bits (padded attention rows and a wider matmul reduce in another order,
about 1e-7), far below the gaps between its top tokens, so greedy ids and the ids drawn by a
seeded generator (the same uniform draws against nearly the same distribution) are equal
exactly, and logprobs are equal to 1e-5."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gymfoundry.envs.records import Budget, PolicySpec
from gymfoundry.tasks.stages.generate import generate_tasks
from gymfoundry.tasks.policies.hf import HFPolicy, _Request, family_tools
from gymfoundry.tasks.policies.registry import make_policy
from gymfoundry.tasks.rollout.episodes import run_episode
from gymfoundry.tasks.policies.checkpoint import load_model

K = 6
LIMITS = Budget(max_steps=3)


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks("inventory", K, seed=1)  # goals of different lengths: left padding from turn one


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir)


def isolated_policy(tiny_model_dir, loaded, **knobs):
    """A policy with a batcher of its own (a model passed in is shared only with its forks)."""
    model, tokenizer = loaded
    return HFPolicy(tiny_model_dir, family_tools("inventory"), model=model, tokenizer=tokenizer, **knobs)


def episode_tokens(policy, task, seed, max_new_tokens):
    policy.max_new_tokens = max_new_tokens  # different lengths: sequences leave a batch at different steps
    rollout = run_episode(task, policy, seed=seed, limits=LIMITS)
    return [(s.token_ids, s.logprobs) for s in rollout.steps]


def alone_and_batched(policy, tasks, seeds):
    alone = [episode_tokens(policy.fork(), t, s, 4 + 3 * i) for i, (t, s) in enumerate(zip(tasks, seeds))]
    policy.batcher.batch_sizes.clear()
    forwards = policy.batcher.forwards
    with ThreadPoolExecutor(len(tasks)) as pool:
        futures = [pool.submit(episode_tokens, policy.fork(), t, s, 4 + 3 * i)
                   for i, (t, s) in enumerate(zip(tasks, seeds))]
        batched = [f.result(timeout=120) for f in futures]
    return alone, batched, policy.batcher.forwards - forwards


def assert_same_tokens(alone, batched):
    for one, many in zip(alone, batched):
        assert [ids for ids, _ in one] == [ids for ids, _ in many]
        for (_, lp_one), (_, lp_many) in zip(one, many):
            assert lp_many == pytest.approx(lp_one, abs=1e-5)


def test_fork_shares_weights_and_batcher_and_has_its_own_episode_state(tiny_model_dir, tasks):
    policy = HFPolicy(tiny_model_dir, family_tools("inventory"), max_new_tokens=5, temperature=0.7, max_batch=4)
    policy.spec = "the spec make_policy sets"
    fork = policy.fork()
    assert fork.model is policy.model and fork.tokenizer is policy.tokenizer and fork.batcher is policy.batcher
    assert (fork.policy_id, fork.version, fork.temperature, fork.max_new_tokens, fork.tools, fork.spec) == \
        (policy.policy_id, policy.version, 0.7, 5, policy.tools, policy.spec)
    assert policy.batcher.max_batch >= 4
    fork.reset(3)
    fork.act(tasks[0].goal)
    assert fork.context and len(fork.sampled_spans) == 1 and len(fork.messages) == 3
    assert policy.context == [] and policy.sampled_spans == [] and policy.messages == []
    assert fork._generator is not policy._generator


def test_greedy_turns_batched_across_forks_equal_each_decoded_alone(tiny_model_dir, loaded, tasks):
    policy = isolated_policy(tiny_model_dir, loaded, max_batch=K)
    alone, batched, forwards = alone_and_batched(policy, tasks, seeds=range(K))
    assert_same_tokens(alone, batched)
    sizes = policy.batcher.batch_sizes
    turns = sum(len(episode) for episode in batched)
    assert sum(size * n for size, n in sizes.items()) == turns
    assert max(sizes) > 1 and max(sizes) <= K
    assert forwards < sum(len(ids) for episode in batched for ids, _ in episode)  # fewer forwards than tokens


def test_sampled_turns_with_episode_seeds_equal_each_decoded_alone(tiny_model_dir, loaded, tasks):
    policy = isolated_policy(tiny_model_dir, loaded, max_batch=K, temperature=1.0)
    seeds = [11, 12, 13, 11, 12, 13]
    same = [tasks[0], tasks[1], tasks[2]] * 2
    alone, batched, _ = alone_and_batched(policy, same, seeds)
    assert_same_tokens(alone, batched)
    assert max(policy.batcher.batch_sizes) > 1
    # Two episodes with the same task and seed, whatever they shared a batch with, sampled the same
    # (their max_new_tokens differ, so compare the common prefix of the first action).
    first = [episode[0][0] for episode in batched]
    for i in range(3):
        n = min(len(first[i]), len(first[i + 3]))
        assert first[i][:n] == first[i + 3][:n]
    assert first[0] != first[1]  # and different seeds sampled differently


class Spy:
    """The model, recording what each forward was given."""

    def __init__(self, model):
        self.model, self.device, self.calls = model, model.device, []

    def __call__(self, **inputs):
        self.calls.append({k: inputs[k].clone() for k in ("input_ids", "attention_mask", "position_ids")})
        return self.model(**inputs)


def test_left_padded_sequences_keep_their_own_positions(tiny_model_dir, loaded, tasks):
    # A rotary model cannot tell positions shifted by the padding apart, so look at the inputs.
    policy = isolated_policy(tiny_model_dir, loaded)
    contexts = [policy.tokenizer(t.goal)["input_ids"] for t in tasks[:3]]
    assert len({len(c) for c in contexts}) == 3
    requests = [_Request(owner=i, context=c, temperature=0.0, max_new_tokens=2 + i, max_thought_tokens=48,
                         generator=None) for i, c in enumerate(contexts)]
    policy.batcher.model = spy = Spy(policy.model)
    policy.batcher._decode(requests)
    prefill, second, *rest = spy.calls
    width = max(map(len, contexts))
    for row, context in enumerate(contexts):
        pad = width - len(context)
        assert prefill["attention_mask"][row].tolist() == [0] * pad + [1] * len(context)
        assert prefill["input_ids"][row, pad:].tolist() == context
        assert prefill["position_ids"][row, pad:].tolist() == list(range(len(context)))
        assert second["position_ids"][row].tolist() == [len(context)]
    assert [c["input_ids"].shape[0] for c in spy.calls] == [3, 3, 2, 1]  # finished sequences leave
    assert spy.calls[-1]["position_ids"].tolist() == [[len(contexts[2]) + 2]]
    assert spy.calls[-1]["attention_mask"].shape == (1, width + 3)
    assert [len(r.ids) for r in requests] == [2, 3, 4]
    for r, context in zip(requests, contexts):  # and each decodes as it does alone
        alone = _Request(owner=9, context=context, temperature=0.0, max_new_tokens=r.max_new_tokens,
                         max_thought_tokens=48, generator=None)
        policy.batcher._decode([alone])
        assert alone.ids == r.ids


class Exploding:
    """A model whose forward fails, after a pause that lets the other callers queue up."""

    def __init__(self, model):
        self.device, self.seen = model.device, []

    def __call__(self, input_ids, **_):
        self.seen.append(input_ids.shape[0])
        time.sleep(0.3)
        raise RuntimeError("forward exploded")


def test_an_error_in_the_batched_forward_reaches_every_caller(tiny_model_dir, loaded, tasks):
    policy = isolated_policy(tiny_model_dir, loaded, max_batch=K, max_new_tokens=3)
    model = policy.batcher.model
    policy.batcher.model = Exploding(model)
    forks = [policy.fork() for _ in range(4)]
    start = threading.Barrier(len(forks))

    def act(fork, task):
        start.wait()
        with pytest.raises(RuntimeError, match="forward exploded"):
            fork.act(task.goal)
        return True

    try:
        with ThreadPoolExecutor(len(forks)) as pool:
            futures = [pool.submit(act, f, t) for f, t in zip(forks, tasks)]
            assert all(f.result(timeout=60) for f in futures)
        assert sum(policy.batcher.model.seen) == len(forks) and max(policy.batcher.model.seen) > 1
    finally:
        policy.batcher.model = model
    fork = policy.fork()  # the batcher is free again after the failure
    assert len(fork.act(tasks[0].goal).token_ids) <= 3


@pytest.mark.timeout(600)  # a caller that waited for the hour-long window would be stopped here
def test_a_lone_caller_never_waits_for_the_window(tiny_model_dir, loaded, tasks):
    policy = isolated_policy(tiny_model_dir, loaded, max_batch=K, max_new_tokens=2)
    policy.batcher.window = 3600.0
    for task in tasks[:3]:
        policy.reset(0)
        policy.act(task.goal)
    assert policy.batcher.batch_sizes == {1: 3}


def test_policies_built_for_one_checkpoint_share_weights_and_batcher(tiny_model_dir):
    one = make_policy(PolicySpec(kind="hf", model=str(tiny_model_dir), options={"max_batch": 2}), "inventory")
    two = make_policy(PolicySpec(kind="hf", model=str(tiny_model_dir), options={"max_batch": 8}), "inventory")
    assert one.model is two.model and one.batcher is two.batcher and one.batcher.max_batch >= 8
    assert one is not two and one.version == two.version
