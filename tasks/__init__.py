"""The work the flows call, one subpackage per idea, layered one way (a lower one never imports a higher):

    policies  <  rollout  <  stages  <  ops  <  training
                                    \\
                                     <  harness

- policies/: the policy protocol (base), the registry (`make_policy`), the hf and openai policies,
  the chat format they share with dataset assembly (chat), and checkpoint loading (checkpoint).
- rollout/: the episode machinery: episodes (`run_episode`, `collect_rollouts`), the episode
  scheduler (`play_watched`), the concurrent engine, retries, classification, collector, progress.
- stages/: one module per factory stage: generate, validate, isolate, score, assemble, audit,
  curriculum, land.
- ops/: after-the-factory operations: re-verification, judge calibration, held-out evaluation
  (below training: GRPO evaluates held-out tasks with evaluation's budget).
- training/: the trainers (SFT, DPO, GRPO), the embedded base model, and `train`.
- harness/: the harness servers: the episode hub, the MCP server, the recording proxy, the HTTP guard.

training/ and harness/ import nothing of each other."""
