"""Where a question suite's question starts in a prompt's tokens, for the question-agnostic protocol
(`QuestionProtocol.AFTER_COMPRESSION`, `polykv.eval.suites.answers`): the tokens before it are the context the plan
compresses, the tokens from it on (the question, the chat template's tail and the answer prefix) are fed after
compression and kept in full.

The prompt is tokenized once, as a whole, under both protocols, so both see the same tokens; the split is the
length of the longest common prefix of the prompt's ids and the ids of the text before the question (encoded as
the prompt is: with the tokenizer's special tokens, or in the chat template). A token that merges across the
boundary therefore goes with the question. The suites say which text is the question:
  RULER      everything after the sample's haystack (the template's `{context}`) and the whitespace after it:
             the question, then RULER's answer prefix;
  LongBench  everything after the sample's `{context}` in the task's official template and the whitespace after
             it: the question (`{input}`) with the template's request around it, or, for the tasks whose
             template asks nothing after the context but an instruction (`longbench.INSTRUCTION_ONLY`:
             summaries, passage counting, code completion), that instruction.
"""

from __future__ import annotations


def after_whitespace(text: str, end: int) -> int:
    """The first index at or after `end` that is not whitespace (whitespace after the context stays with it)."""
    while end < len(text) and text[end].isspace():
        end += 1
    return end


def question_start(tokenizer, prompt_ids: list[int], message: str, start: int, use_chat: bool) -> int:
    """The index in `prompt_ids` where the question starts: `message` is the text the prompt encodes (the chat
    template's user message when `use_chat`, else the whole prompt text) and the question starts at its
    character `start`. A one-line ValueError when the question cannot be placed inside the prompt."""
    if use_chat:
        templated = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
        at = templated.find(message)
        if at < 0:  # a template that rewrites the message (e.g. trims it): find the text before the question
            head = message[:start].strip()
            at = templated.find(head)
            if at < 0 or not head:
                raise ValueError("the chat template changes the prompt: the question's start cannot be found in it")
            start = len(head)
        head_ids = tokenizer(templated[: at + start], add_special_tokens=False, verbose=False).input_ids
    else:
        head_ids = tokenizer(message[:start], verbose=False).input_ids
    common = 0
    for a, b in zip(head_ids, prompt_ids):
        if a != b:
            break
        common += 1
    if common < len(head_ids) - 2:  # more than a token merging across the boundary (and an end token) differs
        raise ValueError("the text before the question tokenizes differently alone: its start cannot be placed")
    if not 0 < common < len(prompt_ids):
        raise ValueError(
            f"the question cannot be split from its context ({common} of the prompt's {len(prompt_ids)} tokens "
            "come before it)"
        )
    return common


__all__ = ["after_whitespace", "question_start"]
