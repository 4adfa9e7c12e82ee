"""Probe accuracy of training variants on the elements example: one knob at a time.

Trains every level-1 unit of the elements bank with memctl's own `train_unit` (prompts and teacher
cache prepared once, held-out scoring off) under the given TrainConfig fields, and, with `init_std=`,
memory neurons started at another scale than the bank's; then scores both probe sets with each
unit's blocks on the probes that route into it. Each run appends one JSON line to --out.

    python benchmarks/variants.py NAME [field=value ...] [init_std=X] [--work DIR] [--out FILE]
    python benchmarks/variants.py base epochs=6 preserve=0
    python benchmarks/variants.py old_init epochs=6 preserve=0 init_std=0.0417

The bank (tree 4x2, memories in the last 10 layers, default ranks) is built under --work on the first
run and reused; every run trains from the blocks' seeded initial state, so runs are comparable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import memctl.train.loop as mt
from memctl.build.embed import get_embedder
from memctl.build.ingest import ingest
from memctl.core.config import MemoryConfig, TrainConfig
from memctl.core.probes import PROBE_TOKENS, is_correct, load_probes
from memctl.core.tree import route
from memctl.model.anchor import attach, greedy
from memctl.registry import Registry
from memctl.train.units import GENERIC, unit_of, units_to_train

ROOT = Path(__file__).resolve().parents[1]
BANK = "elements"


def parse(pairs: list[str]) -> tuple[dict[str, Any], float | None]:
    """field=value pairs -> TrainConfig overrides (typed like the defaults) and the init std."""
    over: dict[str, Any] = {}
    init_std = None
    defaults = TrainConfig()
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key == "init_std":
            init_std = float(value)
        elif key == "betas":
            over[key] = tuple(float(v) for v in value.split(","))
        elif key in {f.name for f in dataclasses.fields(TrainConfig)}:
            over[key] = type(getattr(defaults, key))(value)
        else:
            sys.exit(f"unknown option {key!r}: give TrainConfig fields or init_std")
    return over, init_std


def bank(work: Path) -> tuple[Registry, Path]:
    home, data = work / "home", work / "data"
    if not (data / "probes.jsonl").exists():
        build = [sys.executable, str(ROOT / "examples/elements/build.py"), "--out", str(data)]
        subprocess.run(build, check=True, stdout=subprocess.DEVNULL)
    if not Registry.bank_dir(BANK, home).exists():
        ingest(BANK, [data / "elements.jsonl"], id_field="id", tree=(4, 2), memory_layers="last:10", home=home)
    return Registry.open(BANK, home), data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name")
    ap.add_argument("options", nargs="*", help="TrainConfig field=value, or init_std=X")
    ap.add_argument("--work", default=str(ROOT / "demo-out" / "variants"))
    ap.add_argument("--out", default=None, help="JSON lines file (default: WORK/variants.jsonl)")
    a = ap.parse_args()
    over, init_std = parse(a.options)
    work = Path(a.work)
    reg, data = bank(work)
    home = work / "home"
    if init_std is not None:  # every block this process builds starts at this scale
        MemoryConfig.std = property(lambda self: init_std)  # type: ignore[method-assign,assignment]
    tcfg = dataclasses.replace(TrainConfig(), **over)
    anchor = mt.load_bank_anchor(reg, home)
    torch.manual_seed(tcfg.seed)
    handle = attach(anchor.model, reg.config.memory.layers)
    units = [u for u in units_to_train(reg, None, True)[0] if u != GENERIC]
    _, split_head = mt.prepare_training(reg, anchor, tcfg, units, None)
    mt.heldout_prompts = lambda *args, **kw: None  # held-out scoring (early stopping) off
    sets = {k: load_probes(data / f) for k, f in (("probes", "probes.jsonl"), ("rephrased", "probes-rephrased.jsonl"))}
    embedder, tree = get_embedder(reg.config.embedder), reg.load_tree()
    paths = {k: route(tree, embedder.encode([p.prompt for p in v])) for k, v in sets.items()}
    result: dict[str, Any] = {"name": a.name, "train": over, "init_std": init_std or reg.config.memory.std, "units": {}}
    totals = {k: [0, 0] for k in sets}
    t_all = time.perf_counter()
    for i, u in enumerate(units):
        t0 = time.perf_counter()
        tu = mt.train_unit(reg, anchor, handle, u, tcfg, i, len(units), None, {"stop": False}, None, split_head,
                           checkpoints=False)  # fmt: skip
        assert tu is not None
        unit = unit_of(reg.config, u)
        res = tu.result
        row: dict[str, Any] = {"seconds": time.perf_counter() - t0, "steps": res.steps, "tokens": res.tokens,
                               "loss": [res.loss_first, res.loss_last]}  # fmt: skip
        for k, probes in sets.items():
            mine = [j for j in range(len(probes)) if int(paths[k][j][0]) == int(u)]
            ok = 0
            for s in range(0, len(mine), 16):
                chunk = mine[s : s + 16]
                fetched = tu.params.fetched(unit.local_index([tuple(int(v) for v in paths[k][j]) for j in chunk]))
                texts = greedy(anchor, handle, [probes[j].prompt for j in chunk], fetched, PROBE_TOKENS)
                ok += sum(is_correct(t, probes[j].answers) for t, j in zip(texts, chunk, strict=True))
            row[k] = [ok, len(mine)]
            totals[k][0] += ok
            totals[k][1] += len(mine)
        result["units"][u] = row
        print(f"unit {u}: " + json.dumps(row), flush=True)
    result.update(totals=totals, seconds=time.perf_counter() - t_all)
    print(f"{a.name}: " + ", ".join(f"{k} {c}/{n} ({100 * c / n:.1f}%)" for k, (c, n) in totals.items())
          + f", {result['seconds']:.0f} s", flush=True)  # fmt: skip
    out = Path(a.out) if a.out else work / "variants.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
