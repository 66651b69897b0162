"""A local Hugging Face model as a policy: transformers models over the chat template.

The context is kept as token ids: what the model sampled is appended as sampled (never
re-tokenised from text), and each observation is appended as the tokens of the template's
rendering of that one turn. Each action returns the sampled token ids and their logprobs.

Concurrent episodes each play a `fork()` of one policy, in threads of their own; the forks share
the weights and a `GenerationBatcher`, which decodes their turns together: one forward per
decoding step for every live sequence, left padded, each stopping on its own. Policies built
separately for the same checkpoint directory in one process share weights and batcher too."""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymfoundry.envs.family import family as family_of
from gymfoundry.envs.parsing import ActionError, parse_action
from gymfoundry.tasks.policies.base import PolicyOutput
from gymfoundry.tasks.policies.chat import SYSTEM_PROMPT, assistant_call_message
from gymfoundry.tasks.policies.checkpoint import load_model, load_tokenizer


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
    """A checkpoint as a policy. `max_batch` is the most sequences its batcher decodes in one
    batch (shared by its forks; policies sharing a checkpoint share the largest asked for);
    `device` is where a model loaded from `model_path` is placed (default: where it loads, the
    CPU). A `model` passed in is used as it is, on its own device, shared only with forks."""

    def __init__(self, model_path: str | Path, tools: list[dict[str, Any]] | None = None, *,
                 model=None, tokenizer=None, max_new_tokens: int = 96, temperature: float = 0.0,
                 max_thought_tokens: int = 48,
                 system_prompt: str = SYSTEM_PROMPT, policy_id: str | None = None, version: str | None = None,
                 seed: int = 0, max_batch: int = 1, device: str | None = None):
        self.model_path = str(model_path)
        fingerprint = (checkpoint_version(model_path) if Path(model_path).is_dir() else "unknown") \
            if model is None or version is None else None
        if model is None:
            self._checkpoint = _shared_checkpoint(self.model_path, fingerprint, device)
        else:
            model = model.eval()
            tokenizer = tokenizer or load_tokenizer(model_path)
            self._checkpoint = _Checkpoint(model, tokenizer, GenerationBatcher(model, tokenizer))
        self._checkpoint.batcher.widen(max_batch)
        self.model = self._checkpoint.model
        self.tokenizer = self._checkpoint.tokenizer
        self.tools = tools
        self.max_new_tokens = max_new_tokens
        self.max_thought_tokens = max_thought_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.policy_id = policy_id or f"hf:{Path(self.model_path).name}"
        self.version = version or fingerprint
        self._generator = None
        self.reset(seed)

    @property
    def batcher(self) -> GenerationBatcher:
        """The batcher this policy's forks (and same-checkpoint policies) decode through."""
        return self._checkpoint.batcher

    def fork(self) -> HFPolicy:
        """Another policy for a concurrent episode, to be used from another thread: the same
        weights, tokenizer, batcher, tools, knobs, id and version; a fresh episode state
        (reset with seed 0 until the episode's own `reset(seed)`)."""
        clone = object.__new__(HFPolicy)
        clone.__dict__.update(self.__dict__)
        clone._generator = None
        clone.reset(0)
        return clone

    # -- the Policy protocol ----------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        """A fresh episode. Sampling draws from this policy's own generator, seeded with `seed`
        (None continues the current stream), so an episode's tokens do not depend on which
        other episodes share its batches."""
        import torch

        if seed is not None or self._generator is None:
            self._generator = torch.Generator(device=self.model.device)
            if seed is None:
                self._generator.seed()
            else:
                self._generator.manual_seed(seed)
        self.messages: list[dict[str, Any]] = []
        self.context: list[int] = []
        self.sampled_spans: list[tuple[int, int]] = []  # where each action's sampled ids sit in `context`
        self.last_parsed = True

    def act(self, observation: str) -> PolicyOutput:
        self._append_observation(observation)
        token_ids, logprobs = self._generate()
        with self._checkpoint.lock:
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
        with self._checkpoint.lock:
            self.context += self.tokenizer(after[len(before):], add_special_tokens=False)["input_ids"]
        self.messages.append(turn)

    def _render_text(self, messages, generation_prompt: bool) -> str:
        with self._checkpoint.lock:
            return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                      add_generation_prompt=generation_prompt)

    def _render(self, messages, generation_prompt: bool) -> list[int]:
        text = self._render_text(messages, generation_prompt)
        with self._checkpoint.lock:
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
        """The next action's sampled ids and their logprobs, decoded by the shared batcher
        together with the turns of concurrent forks."""
        return self._checkpoint.batcher.generate(_Request(
            owner=id(self), context=list(self.context), temperature=self.temperature,
            max_new_tokens=self.max_new_tokens, max_thought_tokens=self.max_thought_tokens,
            generator=self._generator))


@dataclass(eq=False)
class _Request:
    """One sequence to decode, with its own knobs and generator, and where its result goes."""
    owner: int
    context: list[int]
    temperature: float
    max_new_tokens: int
    max_thought_tokens: int
    generator: Any
    arrived: float = field(default_factory=time.monotonic)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    error: BaseException | None = None
    done: bool = False

    def result(self) -> tuple[list[int], list[float]]:
        if self.error is not None:
            raise self.error
        return self.ids, self.logprobs


class GenerationBatcher:
    """Decodes the turns of concurrent callers together, in the callers' own threads: the first
    waiting caller leads a batch (no background thread), the others wait for their results.

    A batch starts, up to `max_batch` sequences, once every caller of the previous batch is
    waiting again (the rest are taken to be between episodes or in a slow env step), or `window`
    seconds after the batcher became free or the first waiting request came, whichever is
    later. A request arriving while a batch runs waits for the next. An exception in a batch
    is raised in every caller of that batch.

    Stats: `batch_sizes` (a Counter, batch size -> batches run) and `forwards` (model calls)."""

    def __init__(self, model, tokenizer, max_batch: int = 1, window: float = 0.02):
        self.model, self.max_batch, self.window = model, max_batch, window
        token = tokenizer.convert_tokens_to_ids
        unk = tokenizer.unk_token_id
        self.eos = tokenizer.eos_token_id
        self.call_start, self.call_end = (None if t in (None, unk) else t
                                          for t in (token("<tool_call>"), token("</tool_call>")))
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.batch_sizes: Counter[int] = Counter()
        self.forwards = 0
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._running = False
        self._free_since = time.monotonic()
        self._last_owners: set[int] = set()

    def widen(self, max_batch: int) -> None:
        """Let batches hold up to `max_batch` sequences (never narrows)."""
        with self._cond:
            self.max_batch = max(self.max_batch, max_batch)

    def generate(self, request: _Request) -> tuple[list[int], list[float]]:
        """The request's sampled ids and logprobs, once a batch holding it has been decoded."""
        if request.max_new_tokens < 1:
            return [], []
        with self._cond:
            self._pending.append(request)
            self._cond.notify_all()
            while not request.done:
                wait = self._wait_before_leading(request)
                if wait == 0:
                    break
                self._cond.wait(wait)
            else:
                return request.result()
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            self._running = True
        try:
            self._decode(batch)
        except BaseException as error:  # every caller of the batch gets it, none waits forever
            for r in batch:
                r.error = error
        finally:
            with self._cond:
                for r in batch:
                    r.done = True
                self._running, self._free_since = False, time.monotonic()
                self._last_owners = {r.owner for r in batch}
                self.batch_sizes[len(batch)] += 1
                self._cond.notify_all()
        return request.result()

    def _wait_before_leading(self, request: _Request) -> float | None:
        """0 if `request`'s caller should start a batch now, else how long to wait (None: until notified)."""
        if self._running or self._pending[0] is not request:
            return None
        if len(self._pending) >= self.max_batch or self._last_owners <= {r.owner for r in self._pending}:
            return 0
        return max(0.0, max(request.arrived, self._free_since) + self.window - time.monotonic())

    def _decode(self, batch: list[_Request]) -> None:
        """Decode `batch` with one KV cache: left padding with its attention mask and each
        sequence's own positions; a finished sequence is pruned from the batch."""
        import torch

        device = self.model.device
        width = max(len(r.context) for r in batch)
        ids = torch.full((len(batch), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, r in enumerate(batch):
            ids[row, width - len(r.context):] = torch.tensor(r.context, dtype=torch.long)
            mask[row, width - len(r.context):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
        cache = _growing_cache()
        live = list(batch)
        with torch.inference_mode():
            while True:
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                                    use_cache=True, logits_to_keep=1).logits[:, -1]
                self.forwards += 1
                tokens = self._sample(logits.float(), live)
                keep = [row for row, (r, token) in enumerate(zip(live, tokens)) if not self._stops(r, token)]
                if not keep:
                    return
                if len(keep) < len(live):
                    index = torch.tensor(keep, device=device)
                    cache.batch_select_indices(index)
                    mask, positions = mask[index], positions[index]
                    live = [live[row] for row in keep]
                ids = torch.tensor([[tokens[row]] for row in keep], device=device)
                mask = torch.cat([mask, mask.new_ones((len(keep), 1))], dim=1)
                positions = positions[:, -1:] + 1

    def _sample(self, logits, live: list[_Request]) -> list[int]:
        """Each row's next token, greedy at temperature 0, else drawn with the request's own
        generator; its logprob (of the temperature-scaled distribution it came from) is appended."""
        import torch

        temperatures = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in live],
                                    device=logits.device)
        dist = torch.log_softmax(logits / temperatures[:, None], dim=-1)
        tokens = dist.argmax(dim=-1)
        for row, r in enumerate(live):
            if r.temperature > 0:
                tokens[row] = torch.multinomial(dist[row].exp(), 1, generator=r.generator)[0]
        logprobs = dist.gather(1, tokens[:, None])[:, 0].tolist()
        tokens = tokens.tolist()
        for r, token, logprob in zip(live, tokens, logprobs):
            r.ids.append(token)
            r.logprobs.append(logprob)
        return tokens

    def _stops(self, r: _Request, token: int) -> bool:
        if token == self.eos or token == self.call_end or len(r.ids) >= r.max_new_tokens:
            return True
        # A stop rule: this turn can no longer be a well-formed call in budget.
        return self.call_start is not None and len(r.ids) >= r.max_thought_tokens and self.call_start not in r.ids


def _growing_cache():
    """A KV cache like `DynamicCache()` whose layers append into buffers grown by doubling:
    `DynamicCache` concatenates the whole cache at every step, which dominates a batched step
    on a CPU (batch x context copied per layer per token)."""
    from transformers.cache_utils import Cache

    return Cache(layer_class_to_replicate=_growing_layer())


@functools.cache
def _growing_layer():
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.is_initialized, self.device, self.length = True, key_states.device, 0
                self.buffers = (key_states.new_empty(key_states.shape[:2] + (0, key_states.shape[3])),
                                value_states.new_empty(value_states.shape[:2] + (0, value_states.shape[3])))
            end = self.length + key_states.shape[-2]
            if end > self.buffers[0].shape[-2]:
                grown = []
                for buffer, states in zip(self.buffers, (key_states, value_states)):
                    new = buffer.new_empty(buffer.shape[:2] + (max(2 * buffer.shape[-2], end + 64), buffer.shape[3]))
                    new[:, :, :self.length] = buffer[:, :, :self.length]
                    grown.append(new)
                self.buffers = tuple(grown)
            self.buffers[0][:, :, self.length:end] = key_states
            self.buffers[1][:, :, self.length:end] = value_states
            self.length = end
            self.keys, self.values = (buffer[:, :, :end] for buffer in self.buffers)
            return self.keys, self.values

        def batch_select_indices(self, indices):
            if self.is_initialized:
                self.buffers = tuple(buffer[indices] for buffer in self.buffers)
                self.keys, self.values = (buffer[:, :, :self.length] for buffer in self.buffers)

    return GrowingLayer


@dataclass(eq=False)
class _Checkpoint:
    """Loaded weights, their tokenizer (used under `lock`: a fast tokenizer is not meant to be
    called from several threads at once) and the batcher decoding with them."""
    model: Any
    tokenizer: Any
    batcher: GenerationBatcher
    lock: threading.Lock = field(default_factory=threading.Lock)


_CHECKPOINTS: weakref.WeakValueDictionary[tuple, _Checkpoint] = weakref.WeakValueDictionary()
_CHECKPOINTS_LOCK = threading.Lock()


def _shared_checkpoint(model_path: str, fingerprint: str, device: str | None) -> _Checkpoint:
    """The process's loaded copy of a checkpoint directory (by resolved path, fingerprint and
    device), loaded on first use and freed once no policy holds it. Anything else (a hub id)
    is loaded for this policy alone."""
    def load() -> _Checkpoint:
        model, tokenizer = load_model(model_path)
        model = (model.to(device) if device else model).eval()
        return _Checkpoint(model, tokenizer, GenerationBatcher(model, tokenizer))

    if not Path(model_path).is_dir():
        return load()
    key = (str(Path(model_path).resolve()), fingerprint, device)
    with _CHECKPOINTS_LOCK:
        checkpoint = _CHECKPOINTS.get(key)
        if checkpoint is None:
            checkpoint = _CHECKPOINTS[key] = load()
        return checkpoint


def family_tools(family: str) -> list[dict[str, Any]]:
    """The function schemas of a family's tools, as the SFT rows carry them."""
    return family_of(family).tool_schemas()
