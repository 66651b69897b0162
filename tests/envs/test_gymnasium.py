import gymnasium
from gymnasium.utils.env_checker import check_env

from gymfoundry import envs
from gymfoundry.envs import gym_adapter  # noqa: F401  (finds the families: Gymnasium knows their ids)


def test_gymnasium_make_passes_check_env():
    env = gymnasium.make("gymfoundry/inventory-v0")
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=7)
    assert isinstance(obs, str) and env.observation_space.contains(obs) and "task_id" in info
    obs, reward, terminated, truncated, info = env.step('{"name": "no_such_tool", "arguments": {}}')
    assert '"ok": false' in obs and not terminated and info["error"]["kind"] == "unknown_tool"


def test_gymnasium_episode_with_a_given_task_reaches_the_verified_reward():
    task = envs.family("inventory").generate(seed=11, level=1)
    env = gymnasium.make("gymfoundry/inventory-v0")
    env.reset(seed=0, options={"task": task})
    for call in task.hidden.reference:
        obs, reward, terminated, truncated, info = env.step(call.model_dump_json())
    assert terminated and reward == 1.0 and info["outcome"]["success"] is True


def test_seed_quick_start_loop():
    env = envs.family("inventory").make()
    task = env.generate_task(seed=3, level=2)
    reference = iter(task.hidden.reference)
    ts = env.reset(task=task)
    while not ts.done:
        action = next(reference)
        ts = env.step(action)
    env.close()
    assert ts.terminated and ts.reward == 1.0
