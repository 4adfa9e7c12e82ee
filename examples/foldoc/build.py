"""Build a corpus of computing definitions and hand-written fact probes from Debian's `dict-foldoc`.

Usage: python examples/foldoc/build.py --out DIR [--limit 150]

Reads the Free On-line Dictionary of Computing as installed by `apt-get install dict-foldoc`
(/usr/share/dictd/foldoc.index and foldoc.dict.dz, dictd format) and writes:

- DIR/foldoc.jsonl: one document per selected entry, {"id", "title", "text"}, the dictd markup cleaned;
- DIR/probes.jsonl: statement-completion probes, {"doc", "kind", "prompt", "answers"};
- DIR/probes-questions.jsonl: the same facts asked as "Question: ...\\nAnswer:".

Entries are chosen by rule (prose of 40-200 words that names a year, from factual categories, single sense,
no code), ordered by a hash of the headword and cut at --limit. The probes are not generated: they were written
by hand for the selected entries and live in probes-source.jsonl next to this script; this script only copies
those whose entry was selected, after checking that every answer is a whole word of the document and that no
prompt shares a run of five words with it or contains its answer. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

DICT_DIR = Path("/usr/share/dictd")
SOURCE = Path(__file__).resolve().parent / "probes-source.jsonl"
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"  # dictd's offsets and lengths
MIN_WORDS, MAX_WORDS = 40, 200
COPY_RUN = 5  # a prompt may not share this many consecutive words with its document

# Categories ("<language>", "<company>", ...) whose entries state facts rather than jargon, jokes or maths.
FACTUAL = {
    "language", "company", "person", "hardware", "operating system", "standard", "project", "body",
    "history", "processor", "computer", "networking", "tool", "protocol", "database", "graphics",
    "software", "product", "publication", "storage", "architecture", "file format", "application",
    "communications", "education", "library", "security", "artificial intelligence", "games", "web",
}  # fmt: skip
UNWANTED = {"jargon", "humour", "abuse", "spelling", "chat", "slang", "mathematics"}

TAGS = re.compile(r"^(?:<([a-z][a-z ,/'-]*)>\s*)+")  # leading "<language, business>" category markers
ONE_TAG = re.compile(r"<([a-z][a-z ,/'-]*)>")
DATE_STAMP = re.compile(r"^\(\d{4}-\d\d-\d\d\)$")  # "(1996-06-01)": when the entry was last edited
URL = re.compile(r"(?:https?|ftp|news|gopher|telnet|mailto):|www\.|@", re.IGNORECASE)
BRACES = re.compile(r"\{([^{}]*)\}")
# Jargon-File pronunciations, "/sayl/, not /S-A-I-L/", at the start or after the abbreviation "(SAIL)".
PRONUNCIATION = re.compile(r"(?:^|(?<=\) ))/[^/]{1,40}/(?:,? not /[^/]{1,40}/)?,?\s*")
DROP_PARAGRAPH = re.compile(r"^(?:\[|See also|See |E-mail|Mailing list|Usenet|Address|Telephone|Fax|FTP)")
EDITOR_NOTE = re.compile(r"\s*\[[^\[\]]*\?\]")  # the editors' open questions: "[who?]", "[in what sense?]"
YEAR = re.compile(r"\b(?:19[4-9]\d|20[0-2]\d)\b")
WORD = re.compile(r"[^\W_]+(?:['.+#-][^\W_]+)*")


def decode(number: str) -> int:
    value = 0
    for char in number:
        value = value * 64 + B64.index(char)
    return value


def read_entries(directory: Path) -> list[tuple[str, str]]:
    """(headword, raw definition) for each distinct definition, in index order; aliases are skipped."""
    data = gzip.decompress((directory / "foldoc.dict.dz").read_bytes())
    seen: set[tuple[int, int]] = set()
    entries: list[tuple[str, str]] = []
    for line in (directory / "foldoc.index").read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or re.match(r"00-?database", fields[0]):  # dictd's own metadata entries
            continue
        span = (decode(fields[1]), decode(fields[2]))
        if span in seen:
            continue
        seen.add(span)
        raw = data[span[0] : span[0] + span[1]].decode("utf-8", errors="replace")
        entries.append((raw.split("\n", 1)[0].strip(), raw))
    return entries


def paragraphs(raw: str) -> list[list[str]]:
    """The body's paragraphs as lists of lines; the headword lines before the first blank line are dropped."""
    body = raw.split("\n\n", 1)[1] if "\n\n" in raw else ""
    blocks: list[list[str]] = [[]]
    for line in body.split("\n"):
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [b for b in blocks if b]


def clean(raw: str) -> tuple[str, set[str], bool]:
    """(cleaned text, category tags, whether the entry is plain prose: one sense and no code or lists)."""
    kept: list[str] = []
    tags: set[str] = set()
    prose = True
    for block in paragraphs(raw):
        # Code, tables and indented lists are indented deeper than the body's three spaces.
        if any(line.startswith("    ") for line in block):
            prose = False
            continue
        text = " ".join(line.strip() for line in block)
        for group in ONE_TAG.findall(text[:80]) if text.startswith("<") else []:
            tags.update(t.strip() for t in group.split(","))
        text = TAGS.sub("", text)
        if re.match(r"^\d+\. ", text):  # "1. ... 2. ...": several senses under one headword
            prose = False
        if DATE_STAMP.match(text) or DROP_PARAGRAPH.match(text):
            continue
        if URL.search(text):  # links, addresses, mirror lists: what is left of them is not prose
            continue
        text = EDITOR_NOTE.sub("", PRONUNCIATION.sub("", BRACES.sub(r"\1", text)))
        text = re.sub(r"\s+", " ", text).strip()
        if "{" in text or "}" in text or len(text.split()) < 3:  # a link split across paragraphs, or "Home."
            continue
        kept.append(text)
    return "\n\n".join(kept), tags, prose


def slug(headword: str) -> str:
    ascii_only = unicodedata.normalize("NFKD", headword).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^a-z0-9]+", "-", ascii_only.lower()).strip("-") or "entry"


def eligible(text: str, tags: set[str], prose: bool) -> bool:
    words = len(text.split())
    return (
        prose
        and MIN_WORDS <= words <= MAX_WORDS
        and bool(tags & FACTUAL)
        and not tags & UNWANTED
        and YEAR.search(text) is not None
    )


def select(entries: list[tuple[str, str]], limit: int) -> list[dict[str, str]]:
    """Eligible entries ordered by a hash of the headword (a fixed, alphabet-independent shuffle), cut at limit."""
    docs: list[dict[str, str]] = []
    for headword, raw in entries:
        text, tags, prose = clean(raw)
        if eligible(text, tags, prose):
            docs.append({"id": slug(headword), "title": headword, "text": text})
    docs.sort(key=lambda d: hashlib.sha256(d["title"].encode("utf-8")).hexdigest())
    chosen: list[dict[str, str]] = []
    ids: set[str] = set()
    for doc in docs:
        if doc["id"] not in ids:  # two headwords differing only in punctuation keep the first
            ids.add(doc["id"])
            chosen.append(doc)
    return chosen[:limit]


def has_word(text: str, answer: str) -> bool:
    """Whether answer is a whole word of text, by memctl's scoring rule (memctl.core.probes.is_correct): short
    alphabetic answers (<= 3 letters) must match case exactly, everything else ignores case."""
    flags = 0 if len(answer) <= 3 and answer.isalpha() else re.IGNORECASE
    return re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", text, flags) is not None


def shared_run(prompt: str, text: str, n: int = COPY_RUN) -> str | None:
    """The first run of n consecutive words that the prompt shares with the text, if any."""
    doc_words = WORD.findall(text.lower())
    runs = {tuple(doc_words[i : i + n]) for i in range(len(doc_words) - n + 1)}
    words = WORD.findall(prompt.lower())
    for i in range(len(words) - n + 1):
        if tuple(words[i : i + n]) in runs:
            return " ".join(words[i : i + n])
    return None


def load_source(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def make_probes(
    docs: list[dict[str, str]], source: list[dict[str, Any]]
) -> tuple[list[dict[str, object]], list[dict[str, object]], list[str], list[str]]:
    """(statement probes, question probes, dropped answers, faulty wording) for the selected entries."""
    by_title = {d["title"]: d for d in docs}
    statements: list[dict[str, object]] = []
    questions: list[dict[str, object]] = []
    dropped: list[str] = []
    problems: list[str] = []  # a prompt that copies five words of its document, or contains its answer
    for record in source:
        doc = by_title.get(str(record["entry"]))
        if doc is None:
            continue
        answers = [str(a) for a in record["answers"]]
        present = [a for a in answers if has_word(doc["text"], a)]
        for answer in answers:
            if answer not in present:
                dropped.append(f"{doc['title']}: {answer!r} not a whole word of the document")
        if not present:
            continue
        for prompt in (str(record["prompt"]), str(record["question"])):
            run = shared_run(prompt, doc["text"])
            if run:
                problems.append(f"{doc['title']}: {prompt!r} copies {run!r} from its document")
            problems.extend(f"{doc['title']}: {prompt!r} gives away {a!r}" for a in answers if has_word(prompt, a))
        kind = str(record["kind"])
        statements.append({"doc": doc["id"], "kind": kind, "prompt": record["prompt"], "answers": present})
        question = f"Question: {record['question']}\nAnswer:"
        questions.append({"doc": doc["id"], "kind": kind, "prompt": question, "answers": present})
    return statements, questions, dropped, problems


def write_jsonl(path: Path, records: list[dict[str, object]] | list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def build(directory: Path, out: Path, limit: int, source_path: Path = SOURCE) -> int:
    entries = read_entries(directory)
    docs = select(entries, limit)
    source = load_source(source_path)
    statements, questions, dropped, problems = make_probes(docs, source)
    if problems:
        for line in problems:
            print(f"error: probe {line}", file=sys.stderr)
        return 1

    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "foldoc.jsonl", docs)
    write_jsonl(out / "probes.jsonl", statements)
    write_jsonl(out / "probes-questions.jsonl", questions)

    kinds = Counter(str(p["kind"]) for p in statements)
    print(f"dictionary entries: {len(entries)}")
    print(f"documents: {len(docs)} -> {out / 'foldoc.jsonl'}")
    print(f"documents with probes: {len({p['doc'] for p in statements})}")
    print(f"probes: {len(statements)} -> {out / 'probes.jsonl'}")
    print(f"question probes: {len(questions)} -> {out / 'probes-questions.jsonl'}")
    for kind, count in sorted(kinds.items()):
        print(f"  {kind}: {count}")
    titles = {d["title"] for d in docs}
    print(f"hand-written probes whose entry was not selected: {sum(r['entry'] not in titles for r in source)}")
    print(f"dropped answers: {len(dropped)}")
    for line in dropped:
        print(f"  {line}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--limit", type=int, default=150, help="number of entries to select (default 150)")
    parser.add_argument("--dict-dir", type=Path, default=DICT_DIR, help=f"dictd files (default {DICT_DIR})")
    args = parser.parse_args()
    index, dz = args.dict_dir / "foldoc.index", args.dict_dir / "foldoc.dict.dz"
    if not (index.is_file() and dz.is_file()):
        message = f"error: FOLDOC not found in {args.dict_dir}; install it with: apt-get install dict-foldoc"
        print(message, file=sys.stderr)
        return 2
    return build(args.dict_dir, args.out, args.limit)


if __name__ == "__main__":
    sys.exit(main())
