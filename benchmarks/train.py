"""Training speed of memctl against PEFT LoRA on the same anchor, tokens and batches (issue #7).

On the elements example and the real anchor, in one process:

* compare: for each objective (`lm`, then `distill`, memctl's default), memctl trains every level-1
  unit with `memctl.train.run.train_unit`, and LoRA (PEFT, on gate/up/down of every layer, as many
  trainable parameters as the memory fetched per step) trains on exactly the same batches in the
  same order within each unit, with the same loss (`memctl.train.batches.batch_loss`: next-token on
  windows; under distill, cross-entropy against the open-book teacher's cached top-k on prompts
  about the windows). The two runs take turns on the CPU (Turns), so a drift in machine speed falls
  on both. Both are then scored on the same probes (8 greedy tokens, memctl.core.probes.is_correct), and
  on their rephrasings (the same facts in words no prompt rule writes).
* levers: the measured share of each of memctl's shortcuts in the speed-up, added one at a time to a
  naive scheme (full-depth memories, anchor gradients and AdamW state, batches mixing clusters).
* ceiling: FLOP per token from the anchor's shapes against the matmul GFLOP/s measured here.
* growth: step time on the bank and on a bank with ~10x the blocks (more leaves, same ranks).

    python benchmarks/train.py [--epochs 6] [--objectives lm,distill] [--out demo-out/train/train.json]
    python benchmarks/train.py --quick      # a few documents and steps: a smoke run of every part
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from train_common import (
    Key,
    Timed,
    Turns,
    bank_units,
    console,
    flops_per_token,
    matmul_gflops,
    mean_keys,
    show,
    unit_stream,
)
from train_levers import CHAIN, lever_run
from train_lora import FFN, lora_answers, lora_rank, lora_run

import memctl.train.run
from memctl.build.ingest import ingest
from memctl.core.config import TrainConfig
from memctl.core.placement import Placement, placement
from memctl.core.probes import PROBE_TOKENS, Probe, is_correct, load_probes, sample_probes, wilson
from memctl.model.anchor import Anchor, attach, load_anchor
from memctl.model.prefix import head_split_matches
from memctl.registry import Registry
from memctl.serve.session import BankSession
from memctl.train.batches import collate, load_samples, loss_positions
from memctl.train.loop import TrainEvent, _keep_freed_memory, prepare_training, train_unit
from memctl.train.records import record_unit, write_unit

ROOT = Path(__file__).resolve().parents[1]
MEMCTL = 0  # memctl's run index in Turns (LoRA's is train_lora.LORA)


# ---- data, banks, batches ---------------------------------------------------------------------------
ProbeSets = dict[str, list[Probe]]  # "probes" (the main set), "rephrased"


def build_data(work: Path, n_docs: int | None, n_probes: int | None) -> tuple[Path, ProbeSets]:
    data = work / "data"
    build = [sys.executable, str(ROOT / "examples/elements/build.py"), "--out", str(data)]
    subprocess.run(build, check=True, stdout=subprocess.DEVNULL)
    docs = [json.loads(line) for line in (data / "elements.jsonl").read_text().splitlines()]
    if n_docs and n_docs < len(docs):  # spread over the table, not the first n
        docs = [docs[i * len(docs) // n_docs] for i in range(n_docs)]
    corpus = data / "bench.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    ids = {str(d["id"]) for d in docs}
    sets = {}
    for name, file in (("probes", "probes.jsonl"), ("rephrased", "probes-rephrased.jsonl")):
        sets[name] = sample_probes([p for p in load_probes(data / file) if p.doc in ids], n_probes, seed=0)
    return corpus, sets


def make_bank(name: str, corpus: Path, home: Path, tree: tuple[int, int], ranks: tuple[int, ...] | None,
              layers: str) -> Registry:  # fmt: skip
    shutil.rmtree(Registry.bank_dir(name, home), ignore_errors=True)
    ingest(name, [corpus], id_field="id", tree=tree, ranks=ranks, memory_layers=layers, home=home)
    return Registry.open(name, home)


# ---- memctl: the real train_unit, timed step by step from its progress events ----------------------
@contextlib.contextmanager
def no_heldout() -> Iterator[None]:
    """train_unit without its held-out scoring (an early-stopping aid that LoRA's loop does not have):
    both runs train every batch, and memctl's step times hold training alone."""
    saved = memctl.train.run.heldout_prompts
    memctl.train.run.heldout_prompts = lambda *a, **k: None
    try:
        yield
    finally:
        memctl.train.run.heldout_prompts = saved


def memctl_run(reg: Registry, anchor: Anchor, tcfg: TrainConfig, units: list[str], split_head: bool,
               max_steps: int | None = None, turns: Turns | None = None,
               ) -> tuple[dict[Key, tuple[int, float]], float, list[Any]]:  # fmt: skip
    """Per batch (tokens, seconds) of every step but each unit's first; total seconds; trained units.
    With `turns`, timed on its clock and taking turns with LoRA's run."""
    clock = time.perf_counter if turns is None else (lambda: turns.clock(MEMCTL))
    times: dict[Key, tuple[int, float]] = {}
    trained, t_all = [], clock()
    handle = attach(anchor.model, reg.config.memory.layers)
    try:
        with no_heldout():
            for i, u in enumerate(units):
                marks: list[tuple[int, int, float]] = []

                def mark(ev: TrainEvent, u: str = u, marks: list = marks) -> None:
                    if ev.unit == u:
                        marks.append((ev.step, ev.tokens, clock()))
                    if turns is not None:
                        turns.step_done(MEMCTL)

                flag = {"stop": False}
                tu = train_unit(reg, anchor, handle, u, tcfg, i, len(units), mark, flag, max_steps, split_head,
                                checkpoints=False)  # fmt: skip
                for (_, k0, t0), (s1, k1, t1) in zip(marks, marks[1:], strict=False):
                    times[(u, s1 - 1)] = (k1 - k0, t1 - t0)
                if tu is not None:
                    trained.append(tu)
    finally:
        handle.detach()
        if turns is not None:
            turns.finish(MEMCTL)
    return times, clock() - t_all, trained


# ---- probes ------------------------------------------------------------------------------------------
def score(texts: list[str], probes: list[Probe]) -> dict[str, Any]:
    k = sum(is_correct(t, p.answers) for t, p in zip(texts, probes, strict=True))
    return {"correct": k, "n": len(probes), "accuracy": k / max(1, len(probes)), "ci95": wilson(k, len(probes))}


def memctl_scores(name: str, home: Path, anchor: Anchor, probes: list[Probe]) -> dict[str, dict]:
    """Fetched memories and the anchor alone on `probes`."""
    out: dict[str, list[str]] = {"none": [], "fetched": []}
    with BankSession(name, home, anchor=anchor) as s:
        for i in range(0, len(probes), 16):
            batch = [p.prompt for p in probes[i : i + 16]]
            for mode, texts in out.items():
                texts += [a.text for a in s.generate(batch, mode=mode, max_new_tokens=PROBE_TOKENS)]
    return {mode: score(texts, probes) for mode, texts in out.items()}


# ---- report --------------------------------------------------------------------------------------------
def pct(r: dict[str, Any]) -> str:
    lo, hi = r["ci95"]
    return f"{100 * r['accuracy']:.1f}% ({100 * lo:.0f}–{100 * hi:.0f})"


def mean_ends(losses: list[float]) -> tuple[float, float]:
    n = max(1, len(losses) // 20)
    return sum(losses[:n]) / n, sum(losses[-n:]) / n


@dataclass
class Bench:
    gflops: float
    t_att: float
    anchor: Anchor
    out: dict[str, Any] = field(default_factory=dict)

    def ceiling(self, n_fwd: int, n_bwd: int, extra: int, weight_grads: bool = False, t_att: float | None = None,
                head_frac: float = 1.0) -> dict[str, float]:  # fmt: skip
        f = flops_per_token(self.anchor, n_fwd, n_bwd, t_att or self.t_att, extra, weight_grads, head_frac)
        return {**f, "gflop_token": f["flop"] / 1e9, "ceiling_tok_s": self.gflops * 1e9 / f["flop"]}


def both_runs(reg: Registry, anchor: Anchor, home: Path, tcfg: TrainConfig, split_head: bool, stream: list,
              rank: int, lora_lr: float, turn_s: float) -> tuple[tuple, tuple, Turns]:  # fmt: skip
    """memctl (this thread) and LoRA (a second thread) trained in turns of `turn_s` seconds."""
    turns = Turns(turn_s)
    box: dict[str, Any] = {}

    def lora() -> None:
        try:
            place = Placement(anchor.device, anchor.dtype)
            box["lora"] = lora_run(reg.config.anchor, home, stream, tcfg, rank, lora_lr, turns, place)
        except BaseException as e:  # re-raised in the main thread
            box["error"] = e

    th = threading.Thread(target=lora, name="lora", daemon=True)  # an error or Ctrl-C here ends it too
    th.start()
    m = memctl_run(reg, anchor, tcfg, bank_units(reg), split_head, turns=turns)  # hands over for good when done
    th.join()
    if "error" in box:
        raise box["error"]
    return m, box["lora"], turns


def compare(a: argparse.Namespace, b: Bench, reg: Registry, home: Path, tcfg: TrainConfig, split_head: bool,
            sets: ProbeSets) -> None:  # fmt: skip
    anchor, mem, n, nm = b.anchor, reg.config.memory, b.anchor.n_layers, len(reg.config.memory.layers)
    obj = tcfg.objective
    prep_s = 0.0
    if obj != "lm":  # prompts and the teacher's top-k, cached once: both runs learn from them
        console.print("[dim]prompts and teacher cache[/dim]")
        t = time.perf_counter()
        prepare_training(reg, anchor, tcfg, bank_units(reg), None)
        prep_s = time.perf_counter() - t
    stream = unit_stream(reg, anchor, tcfg)
    samples = [s for _, batch in stream for s in batch]
    tokens = sum(len(s.ids) for s in samples)
    t_att = mean_keys([len(s.ids) for s in samples])
    head_frac = sum(loss_positions([s]) for s in samples) / tokens
    rank = lora_rank(anchor, mem.fetched_params)
    torch.manual_seed(tcfg.seed)
    console.print(f"[dim]{obj}: memctl ({len(bank_units(reg))} units) and LoRA rank {rank} on the same "
                  f"{len(stream)} batches, in turns of {a.turn_s:g} s[/dim]")  # fmt: skip
    (m_times, m_wall, trained), lora_out, turns = both_runs(reg, anchor, home, tcfg, split_head, stream, rank,
                                                            a.lora_lr, a.turn_s)  # fmt: skip
    la, l_times, l_wall, l_params, l_losses = lora_out
    for tu in trained:  # write the blocks, so that the bank serves them
        files = write_unit(reg, tu)
        with reg.db.atomic():
            record_unit(reg, tu, files)
    m, lo = Timed(), Timed()
    for key in m_times:  # the same batches for both: each unit's first step (warm-up) left out
        m.add(*m_times[key])
        lo.add(*l_times[key])
    console.print(f"[dim]scoring {' and '.join(f'{len(v)} {k}' for k, v in sets.items())}[/dim]")
    ms = {k: memctl_scores(reg.name, home, anchor, v) for k, v in sets.items()}
    ls = {k: score(lora_answers(la, v), v) for k, v in sets.items()}
    del la
    m_loss = [sum(getattr(t.result, f) for t in trained) / len(trained) for f in ("loss_first", "loss_last")]
    shape = {"t_att": t_att, "head_frac": head_frac}
    rows = {
        "memctl": {"params": mem.fetched_params, "steps": m.to_dict(), "tok_s_all": tokens / m_wall, "loss": m_loss,
                   **{k: v["fetched"] for k, v in ms.items()}, **b.ceiling(nm, nm, mem.fetched_params, **shape)},
        "lora": {"params": l_params, "rank": rank, "lr": a.lora_lr, "steps": lo.to_dict(), "tok_s_all": tokens / l_wall,
                 "loss": mean_ends(l_losses), **ls, **b.ceiling(n, n, l_params, **shape)},
    }  # fmt: skip
    ratio = m.tok_s / lo.tok_s
    b.out.setdefault("compare", {})[obj] = {
        "tokens": tokens, "batches": len(stream), "mean_keys": t_att, "head_frac": head_frac, "prepare_s": prep_s,
        "turn_s": a.turn_s, "handovers": turns.handovers, "anchor": {k: v["none"] for k, v in ms.items()},
        "ratio": ratio, **rows,
    }  # fmt: skip
    show(f"memctl vs LoRA, objective {obj}: the same {len(stream)} batches ({tokens:,} tokens, batch "
         f"{tcfg.batch_size}, {tcfg.epochs} epochs)",
         ("", "trainable/step", "tok/s (steps)", "tok/s (all)", "GFLOP/token", "ceiling tok/s", "of ceiling",
          "loss first → last", *(f"{k} ({len(v)})" for k, v in sets.items())),
         [[name, f"{r['params'] / 1e6:.2f}M", f"{r['steps']['tok_s']:.0f}", f"{r['tok_s_all']:.0f}",
           f"{r['gflop_token']:.3f}", f"{r['ceiling_tok_s']:.0f}",
           f"{100 * r['steps']['tok_s'] / r['ceiling_tok_s']:.0f}%",
           f"{r['loss'][0]:.2f} → {r['loss'][1]:.2f}", *(pct(r[k]) for k in sets)] for name, r in rows.items()]
         + [["anchor alone", *["-"] * 7, *(pct(ms[k]["none"]) for k in sets)]])  # fmt: skip
    loss = (
        "next-token cross-entropy on every window"
        if obj == "lm"
        else f"memctl's {obj} loss: cross-entropy against the anchor's cached top-k with the window in context "
        f"(open book), on the answer positions of prompts about each window ({100 * head_frac:.0f}% of tokens), "
        f"next-token on windows that yield no prompt; the teacher pass took {prep_s:.0f} s, once, for both"
    )
    console.print(
        f"memctl / LoRA tokens/s: [bold]{ratio:.2f}×[/bold] (goal ≥ 2× at equal or better accuracy). LoRA rank {rank} "
        f"on {'/'.join(FFN)} of all {n} layers matches the memory fetched per step ({mem.fetched_params / 1e6:.2f}M: "
        f"what a step computes with and trains; the bank holds {mem.bank_params(reg.config.tree.k) / 1e6:.1f}M, but a "
        f"step touches only its path's blocks). Both learn {loss}. The two runs took turns of {a.turn_s:g} s on the "
        f"CPU ({turns.handovers} handovers), each timed on its own clock, so a drift in machine speed falls on both. "
        "'steps': every step but each unit's first; 'all': all tokens over each run's own time (memctl: prefix "
        f"caches and block set-up included; LoRA: loading its copy of the anchor). lr: memctl {tcfg.lr:g}, LoRA "
        f"{a.lora_lr:g} (alpha 2r, untuned); neither keeps anchor gradients or optimizer state; held-out scoring "
        "(memctl's early-stopping aid) is off.",
        highlight=False,
    )


def levers(a: argparse.Namespace, b: Bench, reg: Registry, tcfg: TrainConfig, split_head: bool) -> None:
    mem, n, nm = reg.config.memory, b.anchor.n_layers, len(reg.config.memory.layers)
    rows = []
    for v in CHAIN:
        console.print(f"[dim]lever run: {v.name}[/dim]")
        timed = lever_run(reg, b.anchor, tcfg, v, a.lever_steps, split_head)
        depth = (n, n) if v.full_depth else (nm, nm) if v.cache else (n, nm)  # layers run forward, backward
        rows.append({"variant": dataclasses.asdict(v), **timed.to_dict(), **b.ceiling(*depth, mem.fetched_params,
                                                                                     v.anchor_grads)})  # fmt: skip
    total = math.log(rows[-1]["tok_s"] / rows[0]["tok_s"])
    for i, r in enumerate(rows):
        r["gain"] = r["tok_s"] / rows[i - 1]["tok_s"] if i else None
        r["share"] = math.log(r["gain"]) / total if i and total else None
    show(f"levers, added one at a time ({a.lever_steps} steps each after a warm-up step)",
         ("scheme", "tok/s", "ms/step", "× previous", "share of gain", "GFLOP/token", "of ceiling"),
         [[r["variant"]["name"], f"{r['tok_s']:.0f}", f"{r['ms_step']:.0f}", f"{r['gain']:.2f}×" if r["gain"] else "-",
           f"{100 * r['share']:.0f}%" if r["share"] is not None else "-", f"{r['gflop_token']:.3f}",
           f"{100 * r['tok_s'] / r['ceiling_tok_s']:.0f}%"] for r in rows])  # fmt: skip
    console.print(
        f"share = log of the row's speed-up / log of the whole ({math.exp(total):.2f}×); shares depend on the order "
        f"the levers are added in. Full-depth memories keep the fetched parameters (ranks scaled by {nm}/{n}). Mixed "
        "batches train one unit spanning the bank (every level gathered per sample, whole-bank gradients). A frozen "
        f"anchor also saves {3 * 4 * b.anchor.n_params / 2**30:.1f} GiB (gradients + AdamW moments); LoRA saves them "
        "too. Batches differ between grouped and mixed rows: compare tok/s, not ms/step.",
        highlight=False,
    )
    b.out["levers"] = rows


def growth(a: argparse.Namespace, b: Bench, reg: Registry, corpus: Path, home: Path, tcfg: TrainConfig,
           split_head: bool) -> None:  # fmt: skip
    k, p = reg.config.tree.k, reg.config.tree.p
    blocks = sum(k**lvl for lvl in range(1, p + 1))
    k2 = next(x for x in range(k + 1, 65) if sum(x**lvl for lvl in range(1, p + 1)) >= 10 * blocks)
    console.print(f"[dim]ingesting the growth bank (tree {k2}x{p}, same ranks)[/dim]")
    big = make_bank("train-big", corpus, home, (k2, p), reg.config.memory.ranks, a.memory_layers)
    gcfg = dataclasses.replace(tcfg, epochs=max(tcfg.epochs, 50))  # enough batches for max_steps in small units
    rows = {}
    for r in (reg, big):
        units = bank_units(r)[: a.growth_units or None]
        times, wall, _ = memctl_run(r, b.anchor, gcfg, units, split_head, max_steps=a.growth_steps + 1)
        timed = Timed()
        for tokens, secs in times.values():
            timed.add(tokens, secs)
        tk = r.config.tree.k
        rows[f"{tk}x{p}"] = {"blocks": sum(tk**lvl for lvl in range(1, p + 1)), "units": len(units),
                             "bank_params": r.config.memory.bank_params(tk), **timed.to_dict(),
                             "setup_s_unit": (wall - timed.seconds) / len(units),
                             "ms_1k_tokens": 1e6 * timed.seconds / max(1, timed.tokens)}  # fmt: skip
    small, large = rows.values()
    ratio, per_token = large["ms_step"] / small["ms_step"], large["ms_1k_tokens"] / small["ms_1k_tokens"]
    b.out["growth"] = {**rows, "ratio_ms_step": ratio, "ratio_ms_per_token": per_token}
    show(f"step time as the bank grows ({large['blocks'] / small['blocks']:.1f}× the blocks, same corpus and ranks)",
         ("tree", "blocks", "bank params", "units timed", "steps", "tokens/step", "ms/step", "ms/1k tokens",
          "unit set-up s"),
         [[name, str(r["blocks"]), f"{r['bank_params'] / 1e6:.0f}M", str(r["units"]), str(r["steps"]),
           f"{r['tokens'] / max(1, r['steps']):.0f}", f"{r['ms_step']:.0f}", f"{r['ms_1k_tokens']:.0f}",
           f"{r['setup_s_unit']:.1f}"]
          for name, r in rows.items()])  # fmt: skip
    console.print(
        f"step time {ratio:.2f}×, per token {per_token:.2f}× (goal: flat). memctl's own train_unit; each unit's first "
        "step left out; 'unit set-up' is its prefix cache, initial blocks, optimizer state and first step. Units of "
        "the larger bank hold fewer windows, so its batches can be smaller: per token is the fairer figure.",
        highlight=False,
    )


def main() -> None:
    if os.environ.get("MALLOC_ARENA_MAX") != "1":
        # glibc gives each new thread its own malloc arena, which maps and unmaps big buffers at every
        # step: LoRA's steps in its thread ran 20% slower than the same steps in the main thread.
        # One arena for all threads (this must be set before the process starts) makes them equal.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_ARENA_MAX": "1"})
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="compare,levers,growth")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-2, help="memctl learning rate (memctl's default)")
    ap.add_argument("--lora-lr", type=float, default=1e-3)
    ap.add_argument("--objectives", default="lm,distill", help="compare: the objectives both learn, in turn")
    ap.add_argument("--turn-s", type=float, default=30.0, help="compare: seconds each run holds the CPU per turn")
    ap.add_argument("--tree", default="4,2")
    ap.add_argument("--memory-layers", default="last:10")
    ap.add_argument("--docs", type=int, default=None, help="use this many documents (default: all 118)")
    ap.add_argument("--probes", type=int, default=None, help="score this many probes (default: all)")
    ap.add_argument("--lever-steps", type=int, default=20)
    ap.add_argument("--growth-steps", type=int, default=5, help="timed steps per unit")
    ap.add_argument("--growth-units", type=int, default=0, help="units timed per bank (default: all)")
    ap.add_argument("--gflops", type=float, default=None, help="matmul GFLOP/s (default: measured now)")
    ap.add_argument("--work", default=str(ROOT / "demo-out" / "train"), help="data and MEMCTL_HOME")
    ap.add_argument("--out", default=None, help="JSON file (default: WORK/train.json)")
    ap.add_argument("--quick", action="store_true", help="16 documents, 2 epochs, 2 lever and 2 growth steps")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (memctl train --device)")
    ap.add_argument("--dtype", default="fp32", help="fp32 or bf16 (memctl train --dtype)")
    a = ap.parse_args()
    if a.quick:
        a.docs, a.epochs, a.probes = a.docs or 16, 2, a.probes or 16
        a.lever_steps, a.growth_steps, a.growth_units = 2, 2, 1
    work, parts = Path(a.work), set(a.parts.split(","))
    home = work / "home"
    corpus, sets = build_data(work, a.docs, a.probes)
    k, p = (int(v) for v in a.tree.split(","))
    console.print(f"[dim]ingesting {corpus.name} (tree {k}x{p}, memories {a.memory_layers})[/dim]")
    reg = make_bank("train", corpus, home, (k, p), None, a.memory_layers)
    place = placement(a.device, a.dtype)
    anchor = load_anchor(reg.config.anchor, home, place)
    # without preservation: LoRA trains on exactly memctl's samples (compare sets the objective)
    tcfg = TrainConfig(epochs=a.epochs, lr=a.lr, batch_size=a.batch_size, objective="lm", preserve=0.0)
    _keep_freed_memory()  # as memctl.train.run.train does
    samples = [s for u in bank_units(reg) for s in load_samples(reg, anchor, u, "lm")]
    lens = [len(s.ids) for s in samples]
    t_att = mean_keys(lens)
    split_head = head_split_matches(anchor.model, *collate(samples[:2], anchor.tokenizer.pad_token_id)[:2])
    gflops = a.gflops or matmul_gflops(place=place)
    b, mem, n = Bench(gflops, t_att, anchor), reg.config.memory, anchor.n_layers
    nm = len(mem.layers)
    b.out["setup"] = {"gflops": gflops, "gflops_measured": a.gflops is None, "threads": torch.get_num_threads(),
                      "device": place.label,
                      "windows": len(lens), "window_tokens": sum(lens), "mean_keys": t_att, "tree": [k, p],
                      "ranks": list(mem.ranks), "memory_layers": a.memory_layers, "anchor_params": anchor.n_params,
                      "fetched_params": mem.fetched_params, "train": dataclasses.asdict(tcfg), "quick": a.quick,
                      "issue_gflop_token": {"all": b.ceiling(n, n, 0)["issue"] / 1e9,
                                            f"last:{nm}": b.ceiling(nm, nm, 0)["issue"] / 1e9}}  # fmt: skip
    console.print(
        f"{len(lens)} windows ({sum(lens):,} tokens), tree {k}x{p}, ranks {mem.ranks}, memories {a.memory_layers}; "
        f"matmul {gflops:.0f} GFLOP/s on {place.label} ({'measured now' if a.gflops is None else 'given'}, "
        f"{torch.get_num_threads()} threads). The issue's estimate from these shapes (4 × parameters that run): full "
        f"depth {b.out['setup']['issue_gflop_token']['all']:.2f}, last {nm} layers with the cached prefix "
        f"{b.out['setup']['issue_gflop_token'][f'last:{nm}']:.2f} GFLOP/token; the tables add attention over "
        f"{t_att:.0f} keys on average and 6 FLOP per memory or adapter parameter.",
        highlight=False,
    )
    if "compare" in parts:
        for obj in a.objectives.split(","):
            compare(a, b, reg, home, dataclasses.replace(tcfg, objective=obj), split_head, sets)
    if "levers" in parts:
        levers(a, b, reg, tcfg, split_head)
    if "growth" in parts:
        growth(a, b, reg, corpus, home, tcfg, split_head)
    out = Path(a.out) if a.out else work / "train.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(b.out, indent=2, default=float))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
