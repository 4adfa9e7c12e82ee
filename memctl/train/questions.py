"""Questions about a window written by the anchor itself, in its chat template, and answered by the
anchor with the window in its context (the open-book teacher): self-study prompts of the `question`
kind, next to the cloze prompts of memctl.train.prompts.

Asked plainly, a 135M anchor writes chatter ("What's your favorite hobby?"), so the request shows
one worked example about a text outside any corpus, questions are sampled with a fixed seed, and
only lines that are one short question, not copied from the example, are kept. The answer is what
the teacher says greedily, cut at its end of turn; the student later learns the teacher's
distributions over those answer tokens with the question alone in its context.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.errors import InputError
from ..model.anchor import Anchor, has_chat_template, left_padded

EXAMPLE_TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower in Paris. It was completed in 1889 and is 330 metres tall."
)
EXAMPLE_QUESTIONS = (
    "When was the Eiffel Tower completed?",
    "How tall is the Eiffel Tower?",
    "In which city is the Eiffel Tower?",
)
REQUEST = (
    "Write questions that the text answers, one per line.\n\n"
    "Text: {example}\nQuestions:\n{questions}\n\nText: {text}\nQuestions:"
)
MIN_WORDS, MAX_WORDS = 3, 25
QUESTION_TOKENS = 48  # tokens sampled per request
ANSWER_TOKENS = 24  # at most this many tokens of the teacher's answer are learned
TEMPERATURE = 0.8
MIN_NEW_TOKENS = 2  # an answer (or a request) that ends at once says nothing
END_OF_TURN = "<|im_end|>"
_NUMBERING = re.compile(r"^\s*(?:\d+\s*[.):]|[-*\u2022]|Q(?:uestion)?\s*\d*\s*[:.])\s*", re.IGNORECASE)
_EXAMPLE_WORDS = {"eiffel"}
Progress = Callable[[str, int, int], None]


def request_text(tokenizer: Any, text: str) -> str:
    """The chat-formatted request for questions about `text` (the assistant's turn is next)."""
    content = REQUEST.format(example=EXAMPLE_TEXT, questions="\n".join(EXAMPLE_QUESTIONS), text=text.strip())
    return chat_prompt(tokenizer, content)


def chat_prompt(tokenizer: Any, content: str) -> str:
    """One user turn in the anchor's chat template, ready for the assistant's answer."""
    if not has_chat_template(tokenizer):
        raise InputError("--questions needs an anchor whose tokenizer has a chat template")
    return str(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    )


def parse_questions(generated: str) -> list[str]:
    """The usable questions of one generation: one per line, numbering stripped, cut at the first
    '?', MIN_WORDS..MAX_WORDS words, no word said three times, nothing from the example."""
    out: list[str] = []
    for line in generated.splitlines():
        line = _NUMBERING.sub("", line).strip()
        if "?" not in line:
            continue
        q = " ".join(line[: line.index("?") + 1].split())
        words = re.findall(r"[\w'-]+", q.lower())
        if not MIN_WORDS <= len(words) <= MAX_WORDS or _EXAMPLE_WORDS & set(words):
            continue
        if any(words.count(w) >= 3 for w in set(words)):
            continue
        if q.lower() not in (o.lower() for o in out):
            out.append(q)
    return out


@torch.no_grad()
def _generate(anchor: Anchor, texts: Sequence[str], max_new_tokens: int, sample: bool, n: int = 1) -> list[str]:
    """Continuations of a left-padded batch, `n` per text (sampled, or greedy), end of turn cut off."""
    tok = anchor.tokenizer
    enc = left_padded(tok, texts).to(anchor.device)
    kw: dict[str, Any] = (
        {"do_sample": True, "temperature": TEMPERATURE, "top_p": 1.0, "top_k": 0, "num_return_sequences": n}
        if sample
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    end = [t for t in {tok.eos_token_id, tok.convert_tokens_to_ids(END_OF_TURN)} if isinstance(t, int) and t >= 0]
    kw["eos_token_id"] = end or None  # the end of the turn ends an answer, whatever the model's own eos
    kw["min_new_tokens"] = MIN_NEW_TOKENS
    kw["suppress_tokens"] = [t for t in tok.all_special_ids if t not in end] or None  # no chat markup inside
    out = anchor.model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, **kw)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def write_questions(
    anchor: Anchor,
    texts: Sequence[str],
    per_window: int,
    seed: int,
    batch: int = 8,
    progress: Progress | None = None,
) -> list[list[str]]:
    """Up to `per_window` distinct questions about each text, from `per_window` seeded samples of
    the anchor. Deterministic for a given seed, batch size and order of texts."""
    out: list[list[str]] = []
    for s in range(0, len(texts), batch):
        chunk = texts[s : s + batch]
        torch.manual_seed(seed + s)
        gens = _generate(anchor, [request_text(anchor.tokenizer, t) for t in chunk], QUESTION_TOKENS, True, per_window)
        for i in range(len(chunk)):
            found: list[str] = []
            for g in gens[i * per_window : (i + 1) * per_window]:
                found += [q for q in parse_questions(g) if q.lower() not in (f.lower() for f in found)]
            out.append(found[:per_window])
        if progress:
            progress("questions", min(s + batch, len(texts)), len(texts))
    return out


def answer_questions(
    anchor: Anchor, window: str, questions: Sequence[str], separator: str, batch: int = 8
) -> list[str]:
    """The teacher's greedy answers: the window and `separator` (the context memctl.train.distill caches
    the teacher's distributions in), then each question in the chat template."""
    ctx = window + separator
    answers: list[str] = []
    for s in range(0, len(questions), batch):
        texts = [ctx + chat_prompt(anchor.tokenizer, q) for q in questions[s : s + batch]]
        answers += [" ".join(a.split()) for a in _generate(anchor, texts, ANSWER_TOKENS, False)]
    return answers
