"""A local Hugging Face model as a policy: transformers `generate` over the chat template.

The context is kept as token ids: what the model sampled is appended as sampled (never
re-tokenised from text), and each observation is appended as the tokens of the template's
rendering of that one turn. Each action returns the sampled token ids and their logprobs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from envs.parsing import ActionError, parse_action
from tasks.assemble import SYSTEM_PROMPT, assistant_call_message
from tasks.policies import PolicyOutput


def checkpoint_version(path: str | Path) -> str:
    """A short fingerprint of a checkpoint directory: its config and the size and head of each
    weights file (cheap for multi-GB checkpoints, distinct for every saved training run)."""
    path = Path(path)
    digest = hashlib.sha256()
    for file in sorted(path.glob("*.json")) + sorted(path.glob("*.safetensors")):
        digest.update(file.name.encode())
        with open(file, "rb") as handle:
            digest.update(handle.read(1 << 20))
        digest.update(str(file.stat().st_size).encode())
    return digest.hexdigest()[:12]


class HFPolicy:
    def __init__(self, model_path: str | Path, tools: list[dict[str, Any]] | None = None, *,
                 model=None, tokenizer=None, max_new_tokens: int = 96, temperature: float = 0.0,
                 max_thought_tokens: int = 48,
                 system_prompt: str = SYSTEM_PROMPT, policy_id: str | None = None, version: str | None = None,
                 seed: int = 0):
        from tasks.training.base_model import load_model, load_tokenizer

        self.model_path = str(model_path)
        if model is None:
            model, tokenizer = load_model(model_path)
        self.model = model.eval()
        self.tokenizer = tokenizer or load_tokenizer(model_path)
        self.tools = tools
        self.max_new_tokens = max_new_tokens
        self.max_thought_tokens = max_thought_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.policy_id = policy_id or f"hf:{Path(self.model_path).name}"
        self.version = version or (checkpoint_version(model_path) if Path(model_path).is_dir() else "unknown")
        self.reset(seed)

    # -- the Policy protocol ----------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        if seed is not None and self.temperature > 0:
            import torch

            torch.manual_seed(seed)  # generate samples from the global generator
        self.messages: list[dict[str, Any]] = []
        self.context: list[int] = []
        self.sampled_spans: list[tuple[int, int]] = []  # where each action's sampled ids sit in `context`
        self.last_parsed = True

    def act(self, observation: str) -> PolicyOutput:
        self._append_observation(observation)
        token_ids, logprobs = self._generate()
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        eos = self.tokenizer.eos_token
        if text.endswith(eos):
            text = text[: -len(eos)]
        self.sampled_spans.append((len(self.context), len(self.context) + len(token_ids)))
        self.context += token_ids if token_ids[-1:] == [self.tokenizer.eos_token_id] else \
            token_ids + [self.tokenizer.eos_token_id]
        self.messages.append(self._assistant_message(text))
        return PolicyOutput(text=text, thought=None, token_ids=token_ids, logprobs=logprobs)

    # -- context -----------------------------------------------------------------------------
    def _append_observation(self, observation: str) -> None:
        if not self.messages:
            self.messages = [{"role": "system", "content": self.system_prompt},
                             {"role": "user", "content": observation}]
            self.context = self._render(self.messages, generation_prompt=True)
            return
        # A parsed call gets its result as a tool turn; unparseable text gets the error as a user turn.
        turn = {"role": "tool", "content": observation} if self.last_parsed else {"role": "user", "content": observation}
        before = self._render_text(self.messages, generation_prompt=False)
        after = self._render_text(self.messages + [turn], generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template renders earlier turns differently once a turn is added; "
                             "incremental token contexts need a prefix-stable template")
        self.context += self.tokenizer(after[len(before):], add_special_tokens=False)["input_ids"]
        self.messages.append(turn)

    def _render_text(self, messages, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def _render(self, messages, generation_prompt: bool) -> list[int]:
        text = self._render_text(messages, generation_prompt)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _assistant_message(self, text: str) -> dict[str, Any]:
        """The turn as a message for rendering later turns: a parsed tool call where the env
        would parse one (the same parser the env uses), else the raw text."""
        try:
            parsed = parse_action(text)
        except ActionError:
            self.last_parsed = False
            return {"role": "assistant", "content": text}
        self.last_parsed = True
        return assistant_call_message(parsed.call, parsed.thought, parsed.call.id or f"call_{len(self.messages)}")

    # -- generation ----------------------------------------------------------------------------
    def _generate(self) -> tuple[list[int], list[float]]:
        """Greedy (temperature 0) or sampled decoding with a KV cache, one token at a time: for
        small models on a CPU this is several times faster than `generate`, and the logprob of
        each sampled token comes out of the same distribution it was drawn from."""
        import torch
        from transformers import DynamicCache

        eos = self.tokenizer.eos_token_id
        call_start, call_end = (self.tokenizer.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>"))
        unk = self.tokenizer.unk_token_id
        call_start = None if call_start in (None, unk) else call_start
        call_end = None if call_end in (None, unk) else call_end
        cache = DynamicCache()
        new: list[int] = []
        logprobs: list[float] = []
        with torch.inference_mode():
            step_input = torch.tensor([self.context])
            for _ in range(self.max_new_tokens):
                logits = self.model(input_ids=step_input, cache=cache, use_cache=True).logits[0, -1]
                logits = logits.float() / self.temperature if self.temperature > 0 else logits.float()
                dist = torch.log_softmax(logits, dim=-1)
                token = int(torch.multinomial(dist.exp(), 1)) if self.temperature > 0 else int(dist.argmax())
                new.append(token)
                logprobs.append(float(dist[token]))
                if token == eos or token == call_end:
                    break
                if call_start is not None and len(new) >= self.max_thought_tokens and call_start not in new:
                    break  # a stop rule: this turn can no longer be a well-formed call in budget
                step_input = torch.tensor([[token]])
        return new, logprobs


def family_tools(family: str) -> list[dict[str, Any]]:
    """The function schemas of a family's tools, as the SFT rows carry them."""
    from envs.registry import family_env_id, make

    return make(family_env_id(family), verified=False).available_tools
