"""Chat templates for the suites that ask questions (RULER, LongBench): whether a run wraps its prompts in
the tokenizer's chat template, and the token ids of a prompt so wrapped.

Instruct models are evaluated in their chat format by the official harnesses (RULER's model templates,
``hf-chat`` among them; LongBench's ``build_chat``): one user message holding the task, the generation
prompt, then (RULER) the task's answer prefix for the model to continue. Here the tokenizer's own template
does the wrapping. A suite's ``use_chat_template`` setting is "auto" (when the tokenizer has a template),
True (required) or False (never); it is part of a run's settings, so it is part of the run's id.
"""

from __future__ import annotations

CHOICES = ("auto", True, False)


def check_choice(value, suite: str) -> None:
    if value not in CHOICES:
        raise ValueError(f"{suite} use_chat_template must be 'auto', True or False, got {value!r}")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def resolve(tokenizer, use_chat_template: bool | str, suite: str) -> bool:
    """Does a run with this setting use the tokenizer's chat template?"""
    if use_chat_template is True and not has_chat_template(tokenizer):
        raise ValueError(f"{suite} use_chat_template=True but the tokenizer has no chat template")
    return use_chat_template is True or (use_chat_template == "auto" and has_chat_template(tokenizer))


def chat_ids(tokenizer, user_message: str, answer_prefix: str = "") -> list[int]:
    """The ids of one user message in the chat template with the generation prompt, then `answer_prefix`
    (the template brings its own special tokens: none are added)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text + answer_prefix, add_special_tokens=False, verbose=False).input_ids)
