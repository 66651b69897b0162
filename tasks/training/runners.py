"""SFT and DPO runs: load the base model, build the TRL trainer, train, save."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, TypeVar

from transformers import TrainerCallback

from gymfoundry.envs.records import DPORow, SFTRow, TrainingRow
from gymfoundry.tasks.policies.checkpoint import load_model, template_source, tool_arguments_for
from gymfoundry.tasks.training.curriculum import CurriculumMixin, CurriculumSampler
from gymfoundry.tasks.training.dpo import MaskedDPOTrainer, MaskedPreferenceCollator, preference_example
from gymfoundry.tasks.training.progress import ReportProgress
from gymfoundry.tasks.training.sft import StepWeightedSFTTrainer, WeightedCollator, sft_examples

logger = logging.getLogger(__name__)


class TimeLimit(TrainerCallback):
    """Stops training once `seconds` of wall time have passed (the model is still saved).
    With `cosine_lr`, the learning rate follows a cosine over the time budget instead of over
    the steps, since how many steps fit in the budget is not known in advance."""

    def __init__(self, seconds: float | None, cosine_lr: bool = False, warmup_steps: int = 0):
        self.seconds = seconds
        self.cosine_lr = cosine_lr and seconds is not None
        self.warmup_steps = warmup_steps
        self.started = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self.seconds is None:
            return
        progress = (time.perf_counter() - self.started) / self.seconds
        if progress > 1:
            control.should_training_stop = True
        elif self.cosine_lr and optimizer is not None and state.global_step >= self.warmup_steps:
            for group in optimizer.param_groups:
                group["lr"] = args.learning_rate * 0.5 * (1 + math.cos(math.pi * progress))


def time_limit(hp) -> TimeLimit:
    return TimeLimit(hp.time_limit_s, cosine_lr=hp.max_steps >= 10_000, warmup_steps=hp.warmup_steps)


def common_args(hp, output_dir: str) -> dict[str, Any]:
    return dict(output_dir=output_dir, max_steps=hp.max_steps, per_device_train_batch_size=hp.batch_size,
                gradient_accumulation_steps=hp.grad_accum, learning_rate=hp.learning_rate,
                # A run bounded by time rather than steps gets its cosine from `TimeLimit`.
                lr_scheduler_type="constant_with_warmup" if hp.time_limit_s and hp.max_steps >= 10_000 else "cosine",
                warmup_steps=min(hp.warmup_steps, max(0, hp.max_steps - 1)),
                logging_steps=hp.logging_steps, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
                activation_checkpointing=False, seed=hp.seed, dataloader_num_workers=0, disable_tqdm=True,
                remove_unused_columns=False)


Row = TypeVar("Row", bound=TrainingRow)


def load_rows(dataset: str, record: type[Row]) -> list[Row]:
    """A dataset file's rows as their records, validated here, once."""
    from datasets import Dataset

    return [record.model_validate(row) for row in Dataset.from_parquet(str(dataset)).to_list()]


def curriculum_for(examples, hp) -> CurriculumSampler | None:
    if not hp.curriculum:
        return None
    return CurriculumSampler([e["weight"] for e in examples], [e["difficulty"] for e in examples],
                             hp.max_steps * hp.batch_size * hp.grad_accum, seed=hp.seed)


def template_metrics(tokenizer) -> dict[str, str]:
    """Which chat template the run trained with, and the tool-argument form it was given."""
    used = {"chat_template": template_source(tokenizer.chat_template), "tool_arguments": tool_arguments_for(tokenizer)}
    logger.info("training with chat template %(chat_template)s, tool-call arguments as %(tool_arguments)s", used)
    return used


def finish(trainer, tokenizer, output_dir: str, examples: int, started: float) -> dict[str, Any]:
    train_seconds = time.perf_counter() - started
    trainer.save_model(output_dir)
    tokenizer.save_pretrained(output_dir)
    history = [h for h in trainer.state.log_history if "loss" in h]
    return {"steps": trainer.state.global_step, "examples": examples, "train_seconds": round(train_seconds, 2),
            "final_loss": history[-1]["loss"] if history else None,
            "loss_history": [(h["step"], round(h["loss"], 4)) for h in history], **template_metrics(tokenizer)}


def run_sft(dataset: str, base_model: str, output_dir: str, hp) -> dict[str, Any]:
    from trl import SFTConfig

    class Trainer(CurriculumMixin, StepWeightedSFTTrainer):
        pass

    model, tokenizer = load_model(base_model)
    from datasets import Dataset

    examples = []
    for row in load_rows(dataset, SFTRow):
        for ex in sft_examples(row, tokenizer, hp.max_length, hp.overlap_steps, hp.weighted,
                               hp.step_weight_temperature):
            examples.append({**ex, "difficulty": row.difficulty, "weight": row.weight})
    if not examples:
        raise ValueError(f"no trainable SFT examples in {dataset}")
    args = SFTConfig(**common_args(hp, output_dir), max_length=None,
                     dataset_kwargs={"skip_prepare_dataset": True})
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(examples), processing_class=tokenizer,
                      data_collator=WeightedCollator(tokenizer.pad_token_id), callbacks=[time_limit(hp), ReportProgress(time_limit_s=hp.time_limit_s)])
    trainer.curriculum_sampler = curriculum_for(examples, hp)
    started = time.perf_counter()
    trainer.train()
    metrics = finish(trainer, tokenizer, output_dir, len(examples), started)
    metrics["trained_tokens"] = sum(sum(1 for t in e["labels"] if t != -100) for e in examples)
    return metrics


def run_dpo(dataset: str, base_model: str, output_dir: str, hp) -> dict[str, Any]:
    from datasets import Dataset
    from trl import DPOConfig

    class Trainer(CurriculumMixin, MaskedDPOTrainer):
        pass

    model, tokenizer = load_model(base_model)
    examples = [{**preference_example(row, tokenizer), "difficulty": row.difficulty, "weight": row.weight}
                for row in load_rows(dataset, DPORow)]
    if not examples:
        raise ValueError(f"no preference pairs in {dataset}")
    args = DPOConfig(**common_args(hp, output_dir), beta=hp.beta, max_length=hp.max_length,
                     truncation_mode="keep_start")
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(examples), processing_class=tokenizer,
                      data_collator=MaskedPreferenceCollator(pad_token_id=tokenizer.pad_token_id,
                                                             max_length=hp.max_length),
                      callbacks=[time_limit(hp), ReportProgress(time_limit_s=hp.time_limit_s)])
    trainer.curriculum_sampler = curriculum_for(examples, hp)
    started = time.perf_counter()
    trainer.train()
    return finish(trainer, tokenizer, output_dir, len(examples), started)
