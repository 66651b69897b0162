"""DPO on the factory's pairs, with observation masking.

TRL's DPO trainer scores every completion token; in a multi-turn completion that includes the
tool results the env wrote. Here the chosen and rejected completions are tokenised through the
chat template and only the assistant tokens (the `{% generation %}` spans) enter the log-ratio."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from trl import DPOTrainer
from trl.trainer.dpo_trainer import DataCollatorForPreference

from gymfoundry.envs.records import DPORow
from gymfoundry.tasks.training.sft import render_ids


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def preference_example(row: DPORow, tokenizer) -> dict[str, list[int]]:
    chosen_ids, chosen_mask = render_ids(tokenizer, row.prompt + row.chosen, row.tools)
    rejected_ids, rejected_mask = render_ids(tokenizer, row.prompt + row.rejected, row.tools)
    prompt = common_prefix(chosen_ids, rejected_ids)
    # The completions start at the first assistant token, so the shared prompt ends with the
    # generation prompt and neither completion begins with a masked observation.
    first = min(chosen_mask.index(1) if 1 in chosen_mask else prompt,
                rejected_mask.index(1) if 1 in rejected_mask else prompt)
    prompt = min(prompt, first)
    return {"prompt_ids": chosen_ids[:prompt], "chosen_ids": chosen_ids[prompt:], "rejected_ids": rejected_ids[prompt:],
            "chosen_obs_mask": chosen_mask[prompt:], "rejected_obs_mask": rejected_mask[prompt:]}


@dataclass
class MaskedPreferenceCollator(DataCollatorForPreference):
    """TRL's preference collator, with the completion mask cut down to assistant tokens."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        output = super().torch_call(examples)
        masks = ([[0] * len(e["prompt_ids"]) + list(e["chosen_obs_mask"]) for e in examples]
                 + [[0] * len(e["prompt_ids"]) + list(e["rejected_obs_mask"]) for e in examples])
        width = output["completion_mask"].shape[1]
        if self.max_length is not None:
            masks = [m[: self.max_length] if self.truncation_mode == "keep_start" else m[-self.max_length:]
                     for m in masks]
        padded = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=output["completion_mask"].dtype)
        output["completion_mask"] = output["completion_mask"] * padded
        return output


class MaskedDPOTrainer(DPOTrainer):
    """Takes datasets already made of `preference_example`s."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        return dataset

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["prompt_ids", "chosen_ids", "rejected_ids", "chosen_obs_mask",
                                       "rejected_obs_mask", "ref_chosen_logps", "ref_rejected_logps"]
