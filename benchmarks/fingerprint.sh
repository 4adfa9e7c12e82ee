#!/usr/bin/env bash
# A behaviour fingerprint of one source tree, to show a refactor changed nothing: ingest the elements
# example with the real anchor and MiniLM, train level-1 subtree 0 for one epoch, answer 48 probes
# (anchor, fetched, rag); write the trained blocks' sha256 and every answer's text under OUT.
# Two trees behave alike when `diff OUT1/blocks.txt OUT2/blocks.txt` and `cmp OUT1/answers.json
# OUT2/answers.json` both say nothing (training is deterministic on one machine).
#
#   git worktree add /tmp/before <commit>; git worktree add /tmp/after <commit>
#   bash benchmarks/fingerprint.sh /tmp/before /tmp/fp-before
#   bash benchmarks/fingerprint.sh /tmp/after /tmp/fp-after
set -euo pipefail
SRC=$(cd "$1" && pwd)
OUT=$2
PY=${PY:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
rm -rf "$OUT"
mkdir -p "$OUT"
export MEMCTL_HOME=$OUT/home PYTHONPATH=$SRC
cd "$SRC"
"$PY" examples/elements/build.py --out "$OUT/data" > /dev/null
"$PY" -m memctl ingest --bank e "$OUT/data/elements.jsonl" --json > "$OUT/ingest.json" 2> "$OUT/ingest.log"
"$PY" -m memctl train --bank e --subtree 0 --epochs 1 --preserve-pool 64 --json > "$OUT/train.json" 2> "$OUT/train.log"
"$PY" -m memctl eval --bank e --probes "$OUT/data/probes.jsonl" --limit 48 --setups anchor,fetched,rag --json \
  > "$OUT/eval.json" 2> "$OUT/eval.log"
"$PY" - "$OUT" <<'PY'
import json, sqlite3, sys
out = sys.argv[1]
db = sqlite3.connect(f"{out}/home/banks/e/registry.db")
rows = db.execute("select id, sha256 from blocks where sha256 is not null order by id").fetchall()
open(f"{out}/blocks.txt", "w").write("".join(f"{i} {s}\n" for i, s in rows))
d = json.load(open(f"{out}/eval.json"))
answers = [(a["prompt"], {k: v["text"] for k, v in a["answers"].items()}) for a in d["answers"]]
json.dump(answers, open(f"{out}/answers.json", "w"), indent=0)
print(f"{len(rows)} blocks; correct of {d['n']}:", {s["setup"]: s["correct"] for s in d["setups"]})
PY
