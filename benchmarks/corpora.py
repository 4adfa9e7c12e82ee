"""How much of a corpus the memories learn, on corpora in distinct styles and on question-form probes.

Corpora (each built by its example script; none of their probes is written by memctl's prompt rules):

* elements:  118 element documents from mendeleev (examples/elements); probes.jsonl and the
             rephrased probes as the question-form set;
* fictional: invented people and organisations in six prose styles (examples/fictional): facts no
             anchor can know, the stand-in for private data; statement probes and "Question: ...?"
             probes, in wording that appears in no document;
* foldoc:    entries of the Free On-line Dictionary of Computing (Debian's dict-foldoc,
             examples/foldoc), with probes written by hand before any training;
* registers: the fictional entities' sections gathered REGISTER_SECTIONS to a long document ("Vindrel
             chamber register, part 1"), several windows each: a document's title names none of the
             facts' subjects, and a fact lives in one of its windows;
* incidents: a made-up company's outage reports in five styles (postmortem, ticket, timeline, review
             minutes, e-mail; examples/incidents): the subjects are events, and the probes name them
             by system and month ("the Harvion gateway outage in October 2022").

Each corpus is ingested once, with its cloze prompts, their teacher cache and the preservation pool
(the parts every variant shares; their seconds are reported apart). For each variant (a set of
`memctl train` options; "cloze" is self-study and echo questions off, "study2" is `--study 2` without echo
questions, "study2echo4" is memctl's default, `--study 2 --echo 4`, ...) a copy of that bank
is trained, then scored:
anchor alone, open book (oracle-rag), fetched, rag and rag+fetched on the main probes, the same
facts as questions (and, for fictional, foldoc and incidents, the questions asked in the anchor's chat template
as `memctl chat` asks them: `eval --chat`), coverage, student tokens trained, wall time, and the perplexity of unrelated
documents (Python docstrings) with the relevance gate on, over the whole set and over the documents
that met trained memories (gate passed; in a subtree run, routed into it). Results go to DIR/corpora.json as each
row is scored; running again with the same --out keeps scored rows (--fresh starts over).

--subtree N trains only level-1 subtree N of each bank and scores only the probes of documents whose
windows lie in it: a quicker, noisier reading of the same comparison. Probes whose question routes
outside the subtree meet untrained blocks and count as they come out, so the overall figure is a
lower bound; each setup's accuracy on the probes routed into their document's leaf is kept too.

    python benchmarks/corpora.py [--corpora elements,fictional,foldoc,registers,incidents]
        [--variants cloze,study2echo4] [--subtree N] [--routing nearest|tree] [--memory-layers all|last:N]
        [--ranks R1,R2] [--tree K,P] [--window N]
        [--train-args "..."] [--eval-args "--anchor-mix 0.5"]
        [--entities 300] [--incidents 200] [--limit N] [--out demo-out/corpora] [--fresh] [--no-baseline]

Unless --no-baseline, the run first trains the time goal's baseline unit on this CPU (benchmarks/time_baseline.py)
and each row's "unit s x base" is its unit seconds per corpus token against that unit's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import time_baseline
from corpora_bank import corpus_tokens, prompts_by_kind, subtree_coverage, subtree_probes, trained_perplexity
from corpora_table import table
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
console = Console()
HELDOUT = ROOT / "examples/elements/heldout.jsonl"  # unrelated text: Python docstrings
NO_ECHO = ["--echo", "0"]
VARIANTS: dict[str, list[str]] = {
    "cloze": ["--study", "0", *NO_ECHO],
    "study2": ["--study", "2", *NO_ECHO],
    "study2deep": ["--study", "2", "--match-hidden", "1", *NO_ECHO],  # deep context distillation (hidden states too)
    "study4": ["--study", "4", *NO_ECHO],
    "study8": ["--study", "8", *NO_ECHO],
    "questions4": ["--study", "0", "--questions", "4", *NO_ECHO],
    "study4q4": ["--study", "4", "--questions", "4", *NO_ECHO],
    "epochs24": ["--study", "0", "--epochs", "24", "--patience", "6", *NO_ECHO],
    "retire2": ["--study", "2", "--retire", "2", *NO_ECHO],  # learned prompts sit 2 epochs out (memctl.train.retire)
    # memctl's default: cloze statements asked back as questions (memctl.train.echo)
    "study2echo4": ["--study", "2", "--echo", "4"],
}
# corpus -> (build script, documents file, main probes, question-form probes)
CORPORA: dict[str, tuple[str, str, str, str]] = {
    "elements": ("examples/elements/build.py", "elements.jsonl", "probes.jsonl", "probes-rephrased.jsonl"),
    "fictional": ("examples/fictional/build.py", "fictional.jsonl", "probes.jsonl", "probes-questions.jsonl"),
    "foldoc": ("examples/foldoc/build.py", "foldoc.jsonl", "probes.jsonl", "probes-questions.jsonl"),
    "registers": ("examples/fictional/build.py", "fictional.jsonl", "probes.jsonl", "probes-questions.jsonl"),
    "incidents": ("examples/incidents/build.py", "incidents.jsonl", "probes.jsonl", "probes-questions.jsonl"),
}
REGISTER_SECTIONS = 12  # entity sections per register: about 1,200 anchor tokens, three windows
MAIN_SETUPS = "anchor,oracle-rag,fetched,rag,rag+fetched"
QUESTION_SETUPS = "anchor,oracle-rag,fetched"
MEMORYLESS = ("anchor", "oracle-rag", "rag")  # setups that fetch no memory
# a question is answered in a sentence that says the question again first ("The company was founded by ...",
# "The Harvion gateway incident of August 2024 hit the ..."): 8 tokens cut correct answers off, and 16 cut off
# incidents' (open book on one subtree: 33 of 120 at 16, 44 at 32). Greedy answers only grow: more tokens
# never unmake a correct one
QUESTION_ANSWER_TOKENS = 32
# the question-form probes asked again as `memctl chat` asks them (`eval --chat`), where they are questions
# (elements' are rephrased statements); an assistant's answer is a longer sentence
CHAT_CORPORA = ("fictional", "foldoc", "registers", "incidents")
CHAT_SETUPS = "oracle-rag,fetched"
CHAT_ANSWER_TOKENS = 32


SERVING_OPTIONS = ("--anchor-mix", "--relevance-ramp")  # change only how fetched memories are served


def mix_only(eval_extra: list[str]) -> bool:
    """The extra eval options change only how fetched memories are served (`--anchor-mix W`,
    `--relevance-ramp R`): the setups without memories answer as before."""
    flags = eval_extra[0::2]
    return bool(eval_extra) and len(eval_extra) % 2 == 0 and all(f in SERVING_OPTIONS for f in flags)


def answers_name(kind: str, eval_extra: list[str]) -> str:
    """The file a scoring's answers go to: one per set of extra eval options, so a rescore keeps the first's."""
    tag = "".join(a.strip("-").replace(".", "_") for a in eval_extra)
    return f"answers-{kind}{'-' + tag if tag else ''}.jsonl"


def run(env: dict[str, str], args: list[str], log: Path) -> str:
    """A command with its stdout captured and its stderr (progress lines) appended to `log`."""
    console.print("$ " + " ".join(args), style="dim", highlight=False)
    with log.open("a") as err:
        proc = subprocess.run(args, env=env, text=True, stdout=subprocess.PIPE, stderr=err)
    if proc.returncode:
        sys.exit(f"{' '.join(args[:4])} ... failed with exit code {proc.returncode}; see {log}")
    return proc.stdout


def memctl(env: dict[str, str], log: Path, *args: str) -> str:
    """A memctl command, run by the memctl this script imports (a worktree's, under PYTHONPATH): `-m` alone
    would put the working directory first on the path, and run the memctl found there."""
    import memctl as package

    here = str(Path(package.__file__).resolve().parents[1])
    env = dict(env, PYTHONPATH=os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])]))
    return run(env, [sys.executable, "-P", "-m", "memctl", *args], log)


def setups_of(out: str, answers: Path) -> dict[str, dict[str, Any]]:
    """Each setup's scores from `memctl eval --json`; every probe's answers go to `answers` (JSONL), to be
    read probe by probe."""
    d = json.loads(out)
    answers.write_text("".join(json.dumps(a) + "\n" for a in d.get("answers", [])))
    keys = ("accuracy", "ci95", "correct", "n", "routed_right", "routed_wrong")  # routed: into the doc's leaf or not
    return {r["setup"]: {k: r[k] for k in keys} for r in d["setups"]}


def prepare_base(
    corpus: str,
    data: Path,
    base: Path,
    log: Path,
    pool: int,
    routing: str,
    layers: str,
    ranks: str = "",
    window: int | None = None,
    tree: str = "",
) -> dict[str, float]:
    """A bank ingested once per corpus, with its cloze prompts, their teacher cache and the preservation
    pool: what every variant shares, made once (variants copy it). Returns seconds per step."""
    done = base / "base.json"
    if done.is_file():
        return json.loads(done.read_text())
    shutil.rmtree(base, ignore_errors=True)
    # the anchor's converted weights and the preservation pool depend on the anchor alone: hard links to a
    # sibling home's save converting and sampling them again (about 17 minutes on a 2-core CPU)
    donors = sorted(p / "anchors" for p in base.parent.glob("*") if p != base and (p / "anchors").is_dir())
    if donors:
        shutil.copytree(donors[0], base / "anchors", copy_function=os.link)
    env = dict(os.environ, MEMCTL_HOME=str(base))
    t0 = time.perf_counter()
    memctl(env, log, "ingest", str(data / CORPORA[corpus][1]), "--id-field", "id", "--bank", corpus,
           "--memory-layers", layers, "--routing", routing, *(["--ranks", ranks] if ranks else []),
           *(["--window", str(window)] if window else []), *(["--tree", tree] if tree else []))  # fmt: skip
    ingest_s = time.perf_counter() - t0
    from memctl.cli.common import Rates
    from memctl.registry import Registry
    from memctl.train.distill import prepare
    from memctl.train.loop import load_bank_anchor
    from memctl.train.preserve import prepare_pool

    rates = Rates()

    def progress(stage: str, done: int, total: int) -> None:  # a line per 10% to the log, with rate and ETA
        pace = rates(stage, done, total)
        if done == total or done % max(1, total // 10) == 0:
            with log.open("a") as f:
                f.write(f"{corpus} base: {stage} {done}/{total}{pace}\n")

    reg = Registry.open(corpus, base)
    try:
        anchor = load_bank_anchor(reg, base)
        t1 = time.perf_counter()
        prepare(reg, anchor, progress)  # cloze prompts and their teacher: the same for every variant
        teacher_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        prepare_pool(reg, anchor, progress, pool)
        pool_s = time.perf_counter() - t2
    finally:
        reg.close()
    seconds = {"ingest": ingest_s, "cloze_teacher": teacher_s, "preserve_pool": pool_s}
    done.write_text(json.dumps(seconds))
    return seconds


def score(
    corpus: str,
    variant: str,
    base: Path,
    data: Path,
    home: Path,
    log: Path,
    subtree: int | None,
    limit: int | None,
    train_extra: list[str],
    eval_extra: list[str],
    trained: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train a copy of `base` in `home` and score it; with `trained` (the row of an earlier run that
    trained `home` with the same options) score that bank again, with `eval_extra` on every eval."""
    _, _, main_probes, question_probes = CORPORA[corpus]
    env = dict(os.environ, MEMCTL_HOME=str(home))
    if trained is None:
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(base, home)
        t1 = time.perf_counter()
        train_args = ["train", "--bank", corpus, *VARIANTS[variant], *train_extra]  # not --json: progress to the log
        if subtree is not None:
            train_args += ["--subtree", str(subtree)]
        with log.open("a") as f:
            f.write(memctl(env, log, *train_args))
        train_s = time.perf_counter() - t1
    else:
        train_s = trained["seconds"]["train"]
    info = json.loads(memctl(env, log, "info", "--bank", corpus, "--json"))
    units = [r for r in info["runs"] if r["status"] == "done"]
    probes, questions = data / main_probes, data / question_probes
    if subtree is not None:
        probes = subtree_probes(home, corpus, subtree, probes, home / "probes-subtree.jsonl")
        questions = subtree_probes(home, corpus, subtree, questions, home / "questions-subtree.jsonl")
    extra = ["--limit", str(limit)] if limit else []
    t2 = time.perf_counter()
    base = ["eval", "--bank", corpus, "--json", *extra, *eval_extra]
    main_setups, question_setups, kept = MAIN_SETUPS, QUESTION_SETUPS, ()
    if trained is not None and mix_only(eval_extra):  # the setups without memories cannot change: theirs are kept
        kept = MEMORYLESS
        main_setups, question_setups = (",".join(s for s in x.split(",") if s not in kept)
                                        for x in (MAIN_SETUPS, QUESTION_SETUPS))  # fmt: skip
    main = setups_of(memctl(env, log, *base, "--probes", str(probes), "--setups", main_setups),
                     home / answers_name("main", eval_extra))  # fmt: skip
    asked = setups_of(
        memctl(env, log, *base, "--probes", str(questions), "--setups", question_setups,
               "--answer-tokens", str(QUESTION_ANSWER_TOKENS)),
        home / answers_name("questions", eval_extra),
    )  # fmt: skip
    chat = None
    if corpus in CHAT_CORPORA:
        chat = setups_of(
            memctl(env, log, *base, "--probes", str(questions), "--setups", CHAT_SETUPS, "--chat",
                   "--answer-tokens", str(CHAT_ANSWER_TOKENS)),
            home / answers_name("chat", eval_extra),
        )  # fmt: skip
    if trained is not None:
        main.update({s: r for s, r in trained["main"].items() if s in kept})
        asked.update({s: r for s, r in trained["questions"].items() if s in kept})
    ppl = json.loads(memctl(env, log, "eval", "--bank", corpus, "--json", "--setups", "anchor,fetched",
                            "--perplexity", str(HELDOUT), *eval_extra))["perplexity"]  # fmt: skip
    eval_s = time.perf_counter() - t2
    fetched_ppl = next((r for r in ppl["rows"] if r["setup"] == "fetched"), {})
    return {
        "corpus": corpus,
        "variant": variant,
        "train_options": VARIANTS[variant] + train_extra,
        "eval_options": eval_extra,
        "rescored": trained is not None,  # an earlier run's bank scored again: its training figures are that run's
        "subtree": subtree,
        "routing": info.get("routing"),
        "main": main,
        "questions": asked,
        "question_answer_tokens": QUESTION_ANSWER_TOKENS,
        "questions_chat": chat,  # None: not a corpus of questions
        "chat_answer_tokens": CHAT_ANSWER_TOKENS,
        "coverage": subtree_coverage(home, corpus, subtree, VARIANTS[variant])
        if subtree is not None
        else info.get("coverage"),
        "prompts_by_kind": prompts_by_kind(home, corpus),
        "tokens_trained": sum(u["tokens"] for u in units),
        "units": [{k: u.get(k) for k in ("unit", "steps", "tokens", "seconds")} for u in units],
        "corpus_tokens": corpus_tokens(home, corpus, subtree),
        "perplexity_vs_anchor": fetched_ppl.get("ratio_to_anchor"),
        "perplexity_trained": trained_perplexity(ppl, subtree),
        "seconds": {"train": train_s, "eval": eval_s},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default="elements,fictional,foldoc")
    ap.add_argument("--variants", default="cloze,study2echo4", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--subtree", type=int, default=None, help="train and score one level-1 subtree only")
    ap.add_argument("--entities", type=int, default=300, help="fictional corpus: invented entities")
    ap.add_argument("--incidents", type=int, default=200, help="incidents corpus: invented outages")
    ap.add_argument("--limit", type=int, default=None, help="score a reproducible sample of N probes")
    ap.add_argument("--routing", default="nearest", help="the banks' routing rule: nearest (memctl's default) or tree")
    ap.add_argument(
        "--memory-layers", default="all", help="the banks' memory layers (ingest --memory-layers; all is memctl's)"
    )
    ap.add_argument(
        "--ranks", default="", help="the banks' memory neurons per level (ingest --ranks; default: memctl's)"
    )
    ap.add_argument("--window", type=int, default=None, help="the banks' window (ingest --window; default: memctl's)")
    ap.add_argument("--tree", default="", help="the banks' tree, K,P (ingest --tree; default: by corpus size)")
    ap.add_argument("--train-args", default="", help="more `memctl train` options for every variant, quoted")
    ap.add_argument(
        "--eval-args",
        default="",
        help="more `memctl eval` options for every score, quoted (e.g. '--anchor-mix 0.5'); a bank trained before "
        "with the same corpus, variant and train options is scored again, not retrained",
    )
    ap.add_argument("--out", default=str(ROOT / "demo-out" / "corpora"))
    ap.add_argument("--fresh", action="store_true", help="drop earlier results under --out")
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the time goal's baseline unit (elements subtree 0, cloze, last 10 layers, fp32), which "
        "runs once per CPU model and divides each row's unit time per corpus token",
    )
    a = ap.parse_args()
    out = Path(a.out)
    if a.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    state_file = out / "corpora.json"
    rows: dict[str, dict[str, Any]] = json.loads(state_file.read_text()) if state_file.exists() else {}
    log = out / "progress.log"
    corpora = [c.strip() for c in a.corpora.split(",") if c.strip()]
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    for name in corpora + variants:
        if name not in CORPORA and name not in VARIANTS:
            sys.exit(
                f"unknown corpus or variant {name!r}: corpora {', '.join(CORPORA)}; variants {', '.join(VARIANTS)}"
            )
    baseline = None
    if not a.no_baseline:
        console.rule("the time goal's baseline: elements subtree 0, cloze, last 10 layers, fp32")
        data = build_data("elements", out, a.entities, log)
        base = base_home(out, "elements", a.routing, time_baseline.POOL, time_baseline.LAYERS)
        baseline = time_baseline.measure(out, log, data, base, a.routing, prepare_base, memctl, corpus_tokens)
        console.print(f"baseline: {baseline['seconds_per_1k']:.1f} unit s per 1k corpus tokens ({baseline['cpu']})")
    for corpus in corpora:
        data = build_data(corpus, out, a.entities, log, a.incidents)
        pool = 1024  # memctl's default --preserve-pool, unless --train-args says otherwise
        extra = a.train_args.split()
        if "--preserve-pool" in extra:
            pool = int(extra[extra.index("--preserve-pool") + 1])
        base = base_home(out, corpus, a.routing, pool, a.memory_layers, a.ranks, a.window, a.tree)
        for variant in variants:
            key = f"{corpus}/{variant}/{a.routing}" + (f"/subtree{a.subtree}" if a.subtree is not None else "")
            key += f" {a.train_args}" if a.train_args else ""
            key += f" --memory-layers {a.memory_layers}" if a.memory_layers != "last:10" else ""
            key += f" --ranks {a.ranks}" if a.ranks else ""
            key += f" --window {a.window}" if a.window else ""
            key += f" --tree {a.tree}" if a.tree else ""
            home = out / "homes" / key.replace("/", "-").replace(" ", "")
            trained = rows.get(key) if a.eval_args and (home / "banks" / corpus).is_dir() else None
            key += f" eval {a.eval_args}" if a.eval_args else ""
            if key in rows:
                console.print(f"{key}: scored before, kept")
                continue
            console.rule(key)
            t0 = time.perf_counter()
            shared = prepare_base(corpus, data, base, log, pool, a.routing, a.memory_layers, a.ranks, a.window, a.tree)
            rows[key] = score(corpus, variant, base, data, home, log, a.subtree, a.limit, a.train_args.split(),
                              a.eval_args.split(), trained)  # fmt: skip
            rows[key]["seconds"].update({f"shared_{k}": v for k, v in shared.items()})
            rows[key]["seconds"]["total"] = time.perf_counter() - t0 + sum(shared.values())
            rows[key]["commit"] = commit()
            rows[key]["memory_layers"] = a.memory_layers
            rows[key]["ranks"] = a.ranks or "default"
            rows[key]["tree"] = a.tree or "default"
            rows[key]["baseline"] = baseline
            rows[key]["time_vs_baseline"] = time_baseline.ratio(rows[key], baseline)
            state_file.write_text(json.dumps(rows, indent=2))
            console.print(table({key: rows[key]}))
    console.print(table({k: v for k, v in rows.items() if k.split("/")[0] in corpora}))
    console.print(f"results: {state_file}")


def base_home(
    out: Path,
    corpus: str,
    routing: str,
    pool: int,
    layers: str,
    ranks: str = "",
    window: int | None = None,
    tree: str = "",
) -> Path:
    """Where a corpus's base bank for these ingest settings lives: one per corpus and shape, shared by its variants
    (and, for elements' last-10 bank, by the time baseline)."""
    shape = "" if layers == "last:10" else f"-layers{layers.replace(':', '')}"
    shape += f"-ranks{ranks.replace(',', '-')}" if ranks else ""
    shape += f"-window{window}" if window else ""
    shape += f"-tree{tree.replace(',', 'x')}" if tree else ""
    return out / "homes" / f"{corpus}-{routing}-base-pool{pool}{shape}"


def build_data(corpus: str, out: Path, entities: int, log: Path, incidents: int = 200) -> Path:
    """The corpus's documents and probes under DIR/data/CORPUS, built by its example script once (a
    different `--entities` or `--incidents` needs another `--out`)."""
    script, docs, _, _ = CORPORA[corpus]
    data = out / "data" / corpus
    if not (data / docs).is_file():
        build = [sys.executable, str(ROOT / script), "--out", str(data)]
        if corpus in ("fictional", "registers"):
            build += ["--entities", str(entities)]
        if corpus == "registers":
            build += ["--per-document", str(REGISTER_SECTIONS)]
        if corpus == "incidents":
            build += ["--incidents", str(incidents)]
        run(dict(os.environ), build, log)
    return data


def commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, text=True,
                           capture_output=True).stdout.strip()  # fmt: skip
    return proc.stdout.strip() + ("+dirty" if dirty else "")


if __name__ == "__main__":
    main()
