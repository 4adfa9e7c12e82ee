"""Self-study: the open-book teacher writes the training text itself (Cartridges' recipe, routed).

No rule about the corpus's style: for every window, a few seed questions name its subject (the
document's title, or the window's opening words; in a document of sections, such as a register or
minutes, the name each section of the window opens on: memctl.train.sections) in forms that suit
any text ("What are the key facts about {S}?", "Tell me about {S}.", ...). The teacher, the frozen
anchor with the window in its context, samples continuations of each seed with temperature; at every
sampled token its own top-k next-token distribution is kept. The student, the anchor with the memories
of the seed's own route and no window, later matches those distributions on every token of the
continuation (memctl.train.distill's `kd_loss`). Continuations are stored as prompts of kind `study`
with their window and document, so `forget` removes them with the document.

The teacher reads the window and a seed question in one user turn of its chat template, the way a
user would ask it open book; the student reads the question alone. The window's KV cache is
computed once and shared by all of its continuations, which are sampled as one batch: one forward
pass per sampled token for the whole window.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..build.embed import get_embedder
from ..build.routing import route_prompts
from ..model.anchor import Anchor, has_chat_template
from ..model.prefix import layer_outputs, on_model
from ..registry import Registry
from .grounding import MIN_TOKENS, grounded_tokens
from .kinds import STUDY
from .leads import label_lead, topic, window_leads
from .sections import subjects, window_openings

TOPK = 16  # as memctl.train.distill.TOPK: the student's loss reads the same shape
# windows whose continuations are sampled together, one forward pass per token for all; only windows of one
# document in one level-1 subtree (study_chunks)
STUDY_WINDOWS = 8
STUDY_TOKENS = 40  # tokens sampled per continuation
# low: with the window in its context at 0.7, the 135M anchor drifted into invented biographies; at 0.3 it
# stayed with the window's facts; the seeds, one question each, give the variety
TEMPERATURE = 0.3
END_OF_TURN = "<|im_end|>"
MAX_SUBJECT_WORDS = 8
MAX_SECTION_SEEDS = 4  # a window of sections: at most this many times `--study` seeds, one per section
# questions in the anchor's chat template: the teacher reads the window and the question in the user's
# turn, the student the question alone. Anchors without a chat template continue raw seeds instead.
# The first ones ask for facts: with them the 135M teacher writes denser continuations ("Rynith Growers is a
# seed-breeding company founded by Nesisca Gormick in 1985") than after "Tell me about {S}." (which opened
# more often with invented colour); `--study 2` takes the first two (docs/history.md)
CHAT_SEEDS = (
    "What are the key facts about {S}?",
    "Summarize everything about {S}, with dates, names and places.",
    "Tell me about {S}.",
    "What is known about {S}?",
    "Describe {S} in detail.",
    "Give a short profile of {S}.",
)
RAW_SEEDS = ("{S} is", "About {S}:", "{S}:")
HIDDEN_LAYERS = 3  # memory layers whose hidden states `train --match-hidden` matches
_LEAD = re.compile(r"^[\W_]*(.+?)(?:\s+(?:is|was|are|were|has|had)\b|[:(,;.\n|]|$)")
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Seed:
    text: str  # what the student reads (a chat seed in the chat template)
    query: str  # what routes it: the seed as a user would type it
    chat: bool  # asked in the chat template (the teacher reads the window in the same turn)


def subject_of(title: str, text: str, lead: str | None = None) -> str:
    """What a window is about: its document's title (with its document's lead `lead`, for a title that is an
    id or a date: memctl.train.leads; None reads `text` as a whole document), else the opening words of its
    first line."""
    title = " ".join((title or "").split())
    if title:
        return topic(title, label_lead(title, text) if lead is None else lead)
    m = _LEAD.match(text.strip())
    words = (m.group(1) if m else text).split()[:MAX_SUBJECT_WORDS]
    return " ".join(words).strip(" -*")


def chat_turn(tokenizer: Any, content: str) -> str:
    """One user turn in the chat template, without the template's default system prompt where it writes
    one: an empty system turn is shorter (16 tokens fewer per SmolLM2 seed, 39 to 23 for "Tell me about
    {S}.", a fifth of that seed and its continuation), so each continuation trains that many fewer
    tokens. A template that refuses a system turn, or writes no default one, renders the user turn alone."""
    user = [{"role": "user", "content": content}]
    plain = str(tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True))
    try:
        bare = str(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": ""}, *user], tokenize=False, add_generation_prompt=True
            )
        )
    except Exception:  # jinja's TemplateError, or whatever a template raises for a role it does not take
        return plain
    return bare if len(bare) < len(plain) else plain


def seeds_for(tokenizer: Any, subject: str) -> list[Seed]:
    """Seeds naming the subject: questions in the chat template, or raw seeds without one."""
    if has_chat_template(tokenizer):
        return [Seed(chat_turn(tokenizer, q), q, True) for q in (s.format(S=subject) for s in CHAT_SEEDS)]
    return [Seed(s.format(S=subject), s.format(S=subject), False) for s in RAW_SEEDS]


def pick_seeds(seeds: Sequence[Seed], n: int) -> list[Seed]:
    """`n` seeds in order, cycling through them when n is larger (a repeat samples again)."""
    return [seeds[i % len(seeds)] for i in range(n)] if seeds else []


def teacher_context(tokenizer: Any, window: str, seeds: Sequence[Seed], separator: str) -> tuple[str, list[str]]:
    """What the open-book teacher reads before each continuation, as one prefix shared by all seeds (its
    KV cache is computed once) and a suffix per seed. A chat seed: the window and the question in one user
    turn. A raw seed: the window, `separator`, then the seed."""
    if not seeds or not seeds[0].chat:
        return window + separator, [s.text for s in seeds]
    fulls = [chat_turn(tokenizer, f"{window}\n\n{s.query}") for s in seeds]
    cut = fulls[0].index(window) + len(window)
    prefix = fulls[0][:cut]
    assert all(f.startswith(prefix) for f in fulls), "the chat template renders the window differently per seed"
    return prefix, [f[cut:] for f in fulls]


def hidden_layers(memory_layers: Sequence[int]) -> tuple[int, ...]:
    """The layers whose outputs deep context distillation matches: HIDDEN_LAYERS of the memory layers,
    evenly spaced and ending at the last (below the first memory layer the student cannot move anything)."""
    layers = sorted(memory_layers)
    n = min(HIDDEN_LAYERS, len(layers))
    step = len(layers) / n
    return tuple(sorted({layers[len(layers) - 1 - int(i * step)] for i in range(n)}))


@dataclass
class Continuation:
    seed: Seed
    ids: list[int]  # seed tokens + continuation tokens: the student's input
    n_prompt: int  # how many of them are the seed
    topk_idx: np.ndarray  # (m + 1, k) int32: the teacher's top-k at each continuation token and the one after
    topk_logp: np.ndarray  # (m + 1, k) float32
    hidden: np.ndarray | None = None  # (m + 1, layers, d) float16: the teacher's outputs of `layers` there


def _end_ids(tok: Any) -> list[int]:
    ids = {tok.eos_token_id, tok.convert_tokens_to_ids(END_OF_TURN)}
    return [t for t in ids if isinstance(t, int) and t >= 0]


@torch.no_grad()
def sample_continuations(
    anchor: Anchor,
    windows: Sequence[tuple[str, Sequence[Seed], torch.Generator]],
    separator: str,
    max_tokens: int = STUDY_TOKENS,
    temperature: float = TEMPERATURE,
    layers: Sequence[int] = (),
) -> list[list[Continuation]]:
    """For each (window, seeds, generator): one continuation per seed. All the windows' rows are sampled as
    one batch, one forward pass per sampled token, each window on its own shared KV cache.

    The teacher reads `teacher_context`: a prefix holding the window, read once per window, then each
    seed's suffix. The windows' caches are left-padded to the longest and stacked, one copy per seed;
    suffixes are left-padded, with explicit positions, so every row continues right after its own
    window. A row stops at an end token (kept as the position after its last token) or after
    `max_tokens`. Each window's rows draw from its own generator, as they would sampled alone. The
    student's input is the seed's own text followed by the continuation. With `layers`, the outputs of
    those decoder layers are kept at the same positions as the top-k."""
    tok, model = anchor.tokenizer, anchor.model
    todo = [(i, w, list(seeds), gen) for i, (w, seeds, gen) in enumerate(windows) if seeds]
    made: list[list[Continuation]] = [[] for _ in windows]
    if not todo:
        return made
    caches, n_ws, s_ids, groups = [], [], [], []  # groups: (first row, rows, generator) per window
    for _, window, seeds, gen in todo:
        prefix, suffixes = teacher_context(tok, window, seeds, separator)
        (w,) = on_model(model, tok(prefix, add_special_tokens=False, return_tensors="pt")["input_ids"])
        caches.append(model(input_ids=w, use_cache=True).past_key_values)  # the window, once
        n_ws.append(w.shape[1])
        groups.append((len(s_ids), len(seeds), gen))
        s_ids += [tok(x, add_special_tokens=False)["input_ids"] for x in suffixes]
    n_w, b, t = max(n_ws), len(s_ids), max(len(x) for x in s_ids)
    c = _stacked(model, caches, n_ws, [n for _, n, _ in groups], n_w)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((b, t), pad, dtype=torch.long)
    mask = torch.zeros((b, n_w + t), dtype=torch.long)
    pos = torch.zeros((b, t), dtype=torch.long)
    next_pos = torch.zeros(b, dtype=torch.long)
    for (first, rows, _), own in zip(groups, n_ws, strict=True):
        for i in range(first, first + rows):
            x = s_ids[i]
            ids[i, t - len(x) :] = torch.tensor(x)
            mask[i, n_w - own : n_w] = 1  # the window's own cache, after its left padding
            mask[i, n_w + t - len(x) :] = 1
            pos[i, t - len(x) :] = torch.arange(own, own + len(x))
            next_pos[i] = own + len(x)
    ends = _end_ids(tok)
    banned = [i for i in tok.all_special_ids if i not in set(ends)]
    out_ids: list[list[int]] = [[] for _ in range(b)]
    tops: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(b)]
    hids: list[list[torch.Tensor]] = [[] for _ in range(b)]
    done = torch.zeros(b, dtype=torch.bool)
    step_ids, step_pos = ids, pos
    with layer_outputs(model, layers) as outs:
        for step in range(max_tokens + 1):
            d_ids, d_mask, d_pos = on_model(model, step_ids, mask, step_pos)
            out = model(input_ids=d_ids, attention_mask=d_mask, position_ids=d_pos, past_key_values=c, use_cache=True)
            logits = out.logits[:, -1].float()  # (B, V)
            logp = F.log_softmax(logits, -1).cpu()  # the teacher's own distribution (temperature 1)
            top = logp.topk(TOPK, dim=-1)
            hid = torch.stack([outs.pop(layer)[:, -1] for layer in layers], 1).half().cpu() if layers else None
            for i in range(b):
                if not done[i]:
                    tops[i].append((top.indices[i].to(torch.int32), top.values[i]))
                    if hid is not None:
                        hids[i].append(hid[i])
            if step == max_tokens or bool(done.all()):
                break
            scaled = logits.cpu() / temperature
            if banned:
                scaled[:, banned] = float("-inf")
            probs = F.softmax(scaled, -1)
            nxt = torch.full((b,), pad, dtype=torch.long)
            for first, rows, gen in groups:
                part = slice(first, first + rows)
                if not bool(done[part].all()):  # a window sampled alone stops drawing once all its rows end
                    nxt[part] = torch.multinomial(probs[part], 1, generator=gen).squeeze(1)
            for i in range(b):
                if done[i]:
                    continue
                if int(nxt[i]) in ends:
                    done[i] = True  # its last top-k row is the position that predicts the end
                else:
                    out_ids[i].append(int(nxt[i]))
            step_ids = nxt.unsqueeze(1)
            step_pos = next_pos.unsqueeze(1).clone()
            next_pos += 1
            mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
    for (k, _, seeds, _), (first, _, _) in zip(todo, groups, strict=True):
        for j, s in enumerate(seeds):
            i = first + j
            m = len(out_ids[i])
            if m == 0:
                continue
            rows_ = tops[i][: m + 1]
            student = tok(s.text, add_special_tokens=False)["input_ids"]
            made[k].append(
                Continuation(
                    s,
                    student + out_ids[i],
                    len(student),
                    torch.stack([r[0] for r in rows_]).numpy(),
                    torch.stack([r[1] for r in rows_]).numpy().astype(np.float32),
                    torch.stack(hids[i][: m + 1]).numpy() if layers else None,
                )
            )
    return made


def _stacked(model: Any, caches: list[Any], lengths: list[int], copies: list[int], n: int) -> DynamicCache:
    """One KV cache of the windows' caches, each left-padded with zeros to `n` positions (the attention
    mask hides them) and repeated `copies` times, in order."""
    out = DynamicCache(config=model.config)
    for layer in range(len(caches[0].layers)):
        keys, values = [], []
        for cache, length, k in zip(caches, lengths, copies, strict=True):
            kv = cache.layers[layer]
            keys.append(F.pad(kv.keys, (0, 0, n - length, 0)).expand(k, -1, -1, -1))
            values.append(F.pad(kv.values, (0, 0, n - length, 0)).expand(k, -1, -1, -1))
        out.update(torch.cat(keys), torch.cat(values), layer)
    return out


def ground(tok: Any, ct: Continuation, window: str) -> Continuation | None:
    """`ct` cut before its first claim that neither `window` nor its seed makes (memctl.train.grounding):
    the tokens before it stay targets, with the teacher's rows that predict them; None when fewer than
    MIN_TOKENS are left."""
    out = ct.ids[ct.n_prompt :]
    keep = grounded_tokens(lambda x: tok.decode(list(x)), out, window, ct.seed.query)
    if keep == len(out):
        return ct
    if keep < MIN_TOKENS:
        return None
    # rows 0..keep-1 predict the kept tokens; the last of those need not be read, only predicted
    return Continuation(
        ct.seed,
        ct.ids[: ct.n_prompt + keep - 1],
        ct.n_prompt,
        ct.topk_idx[:keep],
        ct.topk_logp[:keep],
        ct.hidden[:keep] if ct.hidden is not None else None,
    )


def window_seeds(
    tokenizer: Any, title: str, text: str, per_window: int, start: str | None, lead: str | None = None
) -> list[Seed]:
    """The seeds of a window: `per_window` naming its subject (with its document's `lead`: `subject_of`); in a
    document of sections (`start`, the subject the window opens with, is not None) one at least for each of
    its sections' names, up to MAX_SECTION_SEEDS x `per_window`, the names taking turns and each next seed
    of a name its next form."""
    names = subjects(text, title, True, start) if start is not None else []
    if len(names) == 1 and names[0] != " ".join(title.split()):
        return pick_seeds(seeds_for(tokenizer, names[0]), per_window)
    if len(names) < 2:
        return pick_seeds(seeds_for(tokenizer, subject_of(title, text, lead)), per_window)
    forms = [seeds_for(tokenizer, name) for name in names]
    n = max(per_window, min(len(names), MAX_SECTION_SEEDS * per_window))
    return [forms[i % len(names)][(i // len(names)) % len(forms[0])] for i in range(n)]


def add_study(
    reg: Registry,
    anchor: Anchor,
    per_window: int,
    separator: str,
    progress: Progress | None = None,
    l1s: Sequence[int] | None = None,
    hidden: bool = False,
    grounded: bool = False,
) -> tuple[int, float]:
    """Self-study continuations for every window that has fewer than `per_window` (its earlier ones
    are replaced). Under nearest routing each trains on its window's path, where a question that nears the
    window goes (its seed names the document: alone it would route all of a long document's continuations
    to the one window nearest the title); under greedy descent it is routed from its seed as a user would
    ask it. With `grounded`, each cut before
    its first name or number the window does not give (memctl.train.grounding); with `l1s`, only the windows of
    those level-1 subtrees (the units being trained). With `hidden`, the teacher's hidden states at
    `hidden_layers` are kept too, and windows studied without them are studied again.
    Returns (how many, seconds)."""
    if per_window <= 0:
        return 0, 0.0
    t0 = time.perf_counter()
    only = f" and w.l1 in ({','.join(str(int(x)) for x in l1s)})" if l1s is not None else ""
    redo = (
        " or exists (select 1 from prompts p where p.window_id = w.id and p.kind = ? and p.hidden is null)"
        if hidden
        else ""
    )
    rows = list(
        reg.db.query(
            "select w.id, w.doc_id, w.text, w.path, w.l1, d.title from windows w "
            "join documents d on d.id = w.doc_id "
            f"where (w.studied < ?{redo})" + only + " order by w.id",
            [per_window, STUDY] if hidden else [per_window],
        )
    )
    layers = hidden_layers(reg.config.memory.layers) if hidden else ()
    if not rows:
        return 0, 0.0
    tok = anchor.tokenizer
    router = None if reg.config.routing == "nearest" else (get_embedder(reg.config.embedder), reg.load_tree())
    seed_base = int(reg.config.seed)
    total = 0
    docs = {r["doc_id"] for r in rows}
    starts, leads = window_openings(reg, docs), window_leads(reg, docs)
    done = 0
    for chunk in study_chunks(rows):
        asked = [
            (
                r["text"],
                window_seeds(tok, r["title"] or "", r["text"], per_window, starts[int(r["id"])], leads[int(r["id"])]),
                torch.Generator().manual_seed(seed_base * 1_000_003 + int(r["id"])),  # per window: resumable
            )
            for r in chunk
        ]
        sampled = sample_continuations(anchor, asked, separator, layers=layers)
        with reg.db.atomic():  # a chunk at a time: an interrupted run resumes at the next chunk, sampled alike
            for r, conts in zip(chunk, sampled, strict=True):
                total += _store(reg, tok, r, conts, per_window, grounded, router)
        done += len(chunk)
        if progress:
            progress("self-study", done, len(rows))
    return total, time.perf_counter() - t0


def study_chunks(rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The windows sampled together: consecutive windows (in id order) of one document in one level-1
    subtree, up to STUDY_WINDOWS of them. A window's teacher distributions depend, in their last bits,
    on the windows batched with it (padding and batch shape change how sums round), so a chunk holds only
    windows that every run studying one of them studies with it: forgetting another document, training
    one subtree alone (`--subtree`, separate jobs merged later) or resuming changes no chunk, and exact
    forgetting stays bit-identical."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((str(r["doc_id"]), int(r["l1"])), []).append(r)
    return [g[i : i + STUDY_WINDOWS] for g in groups.values() for i in range(0, len(g), STUDY_WINDOWS)]


def _store(
    reg: Registry,
    tok: Any,
    r: dict[str, Any],
    conts: list[Continuation],
    per_window: int,
    grounded: bool,
    router: tuple[Any, Any] | None,
) -> int:
    """One window's continuations (cut where they invent, with `grounded`) as its `study` prompts, in place
    of its earlier ones (add_study stores a chunk of windows in one transaction). Under nearest
    routing (`router` None) they train on the window's own path; otherwise (embedder, tree) routes each
    from its seed. Returns how many."""
    if grounded:
        conts = [c for c in (ground(tok, ct, r["text"]) for ct in conts) if c is not None]
    made: list[dict[str, Any]] = [
        {
            "window_id": r["id"],
            "doc_id": r["doc_id"],
            "kind": STUDY,
            "text": ct.seed.text,
            "answer": tok.decode(ct.ids[ct.n_prompt :], skip_special_tokens=True).strip(),
            "held_out": 0,
            "ids": np.asarray(ct.ids, np.int32).tobytes(),
            "n_prompt": ct.n_prompt,
            "topk_idx": ct.topk_idx.astype(np.int32).tobytes(),
            "topk_logp": ct.topk_logp.astype(np.float32).tobytes(),
            "hidden": ct.hidden.astype(np.float16).tobytes() if ct.hidden is not None else None,
        }
        for ct in conts
    ]
    if made:
        if router is None:  # the window's own path: the seed names the document, not the window
            paths = [r["path"]] * len(made)
        else:
            embedder, tree = router
            queries = [ct.seed.query for ct in conts]
            routed = route_prompts(reg, embedder.encode(queries), [r["doc_id"]] * len(conts), tree, queries)
            paths = [",".join(map(str, path)) for path in routed]
        for m, path in zip(made, paths, strict=True):
            m["path"] = path
            m["l1"] = int(path.split(",")[0])
    with reg.db.atomic():
        reg.db.execute("delete from prompts where kind = ? and window_id = ?", [STUDY, r["id"]])
        if made:
            reg.db["prompts"].insert_all(made, batch_size=1000)
        reg.db.execute("update windows set studied = ? where id = ?", [per_window, r["id"]])
    return len(made)
