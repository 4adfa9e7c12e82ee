"""Windowing one huge single-line document: time and peak RSS, the streamed path against the old one.

    python benchmarks/hugeline.py                      # words without sentence ends, 0.1 MB .. 64 MB
    python benchmarks/hugeline.py --text prose --new 0.1,1,4 --old 0.1,0.2
    python benchmarks/hugeline.py --new 1024 --old ""  # the 1 GB file (about 20 min on one core)
    python benchmarks/hugeline.py --tokenizer chars --new 1,16,256,1024 --old 1,4  # windowing alone, 1 GB
    python benchmarks/hugeline.py --text spaces --new 16,256,1024 --old ""  # a huge run of spaces, then text

Each measurement runs in a fresh process (peak RSS is its own): it loads the anchor's tokenizer
(SmolLM2's; the tests' tiny one with --tokenizer tiny; or, with --tokenizer chars, none: 4 characters
per token, to measure windowing's own time and memory), then cuts a generated one-line file of the
given size into windows of --window tokens (--text spaces: one run of spaces filling all but the
line's last 4 KB, which are words). `new` is memctl's windowing (a file above
corpus.STREAM_BYTES is streamed: hashed, then windowed block by block); `old` is the windowing memctl had
before issue 26, copied below, which reads the file whole and bisects over the rest of the line for
every piece (quadratic). "rss" is the process's peak; "+rss" what windowing added to the tokenizer's
process. Old runs stop at --old-timeout seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = (
    "the of and to in is was for on that with by as at from his her an were are which this be has had it not or "
    "their first one also new other time after two may element metal discovered named atomic number used"
).split()


def generate(path: Path, n_bytes: int, prose: bool, seed: int = 0, spaces: int = 0) -> None:
    """One line of `n_bytes` ASCII words (with a sentence end every ~14 words if `prose`), written in chunks;
    the first `spaces` bytes of it a single run of spaces."""
    rng = random.Random(seed)
    written = 0
    with path.open("w") as f:
        while written < spaces:
            n = min(2**20, spaces - written)
            f.write(" " * n)
            written += n
        while written < n_bytes:
            words = [rng.choice(VOCAB) + ("." if prose and rng.random() < 0.07 else "") for _ in range(20_000)]
            chunk = " ".join(words) + " "
            chunk = chunk[: n_bytes - written]
            f.write(chunk)
            written += len(chunk)


# ---- the windowing before issue 26 (memctl/build/corpus.py at 395a54a), for the baseline -----------------
_PARA = re.compile(r"\n\s*\n")
_SENT = re.compile(r"(?<=[.!?])\s+")


def _old_spans(text: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    out, pos = [], start
    for m in pattern.finditer(text, start, end):
        if m.start() > pos:
            out.append((pos, m.start()))
        pos = m.end()
    if pos < end:
        out.append((pos, end))
    return out


def _old_hard_split(text: str, start: int, end: int, limit: int, count: Callable[[str], int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        lo, hi = pos + 1, end
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text[pos:mid]) <= limit:
                lo = mid
            else:
                hi = mid - 1
        cut = lo
        gap = text.rfind(" ", pos + 1, cut)
        if cut < end and gap > pos:
            cut = gap
        out.append((pos, cut))
        pos = cut
        while pos < end and text[pos].isspace():
            pos += 1
    return out


def old_windows(text: str, limit: int, count: Callable[[str], int]) -> int:
    segments: list[tuple[int, int]] = []
    for ps, pe in _old_spans(text, _PARA, 0, len(text)):
        if count(text[ps:pe]) <= limit:
            segments.append((ps, pe))
            continue
        for ss, se in _old_spans(text, _SENT, ps, pe):
            if count(text[ss:se]) <= limit:
                segments.append((ss, se))
            else:
                segments.extend(_old_hard_split(text, ss, se, limit, count))
    n, cur = 0, None
    for s, e in segments:
        if not text[s:e].strip():
            continue
        if cur is not None and count(text[cur[0] : e]) <= limit:
            cur = (cur[0], e)
            continue
        if cur is not None:
            count(text[cur[0] : cur[1]].strip())
            n += 1
        cur = (s, e)
    return n + (cur is not None)


# ---- one measurement (child process) -----------------------------------------------------------
def _tokenizer(kind: str) -> object:
    from transformers import AutoTokenizer

    if kind == "tiny":
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import build_tiny_llama

        return AutoTokenizer.from_pretrained(build_tiny_llama(Path(tempfile.mkdtemp()) / "llama"))
    from memctl.model.anchor import default_anchor_path

    path = default_anchor_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


class Quarter:
    """A stand-in tokenizer at 4 characters per token (--tokenizer chars): windowing's own cost, no BPE."""

    def __call__(self, text: str) -> int:
        return (len(text) + 3) // 4

    def prefix_end(self, text: str, n: int) -> int | None:
        return 4 * n if len(text) > 4 * n else None


def child(impl: str, path: Path, window: int, tokenizer: str) -> None:
    from memctl.build.corpus import iter_documents, iter_windows
    from memctl.build.stream import TokenCounter

    count: Callable[[str], int] = Quarter() if tokenizer == "chars" else TokenCounter(_tokenizer(tokenizer))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if impl == "old":
        n = old_windows(path.read_text(), window, count)
    else:
        (doc,) = iter_documents([path])
        n = sum(1 for _ in iter_windows(doc, window, count))
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "windows": n, "rss_mb": peak / 1024, "added_mb": (peak - base) / 1024}))


def measure(impl: str, path: Path, args: argparse.Namespace, timeout: float | None) -> dict[str, float] | None:
    cmd = [sys.executable, __file__, "--child", impl, str(path), "--window", str(args.window)]
    cmd += ["--tokenizer", args.tokenizer]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def _sizes(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new", default="0.1,0.2,0.4,4,16,64", help="sizes (MB) for memctl's windowing")
    ap.add_argument("--old", default="0.1,0.2,0.4", help="sizes (MB) for the old windowing (baseline)")
    ap.add_argument("--text", choices=["words", "prose", "spaces"], default="words")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--tokenizer", choices=["smollm2", "tiny", "chars"], default="smollm2")
    ap.add_argument("--old-timeout", type=float, default=600)
    ap.add_argument("--child", nargs=2, metavar=("IMPL", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), args.window, args.tokenizer)
        return
    new, old = _sizes(args.new), _sizes(args.old)
    print(f"one-line {args.text} file, windows of {args.window} tokens, tokenizer {args.tokenizer}", flush=True)
    head = f"{'MB':>8} {'old s':>9} {'new s':>9} {'old/new':>8} {'new MB/s':>9} {'old rss':>8} {'new rss':>8}"
    print(head + f" {'old +rss':>9} {'new +rss':>9} {'windows':>9}", flush=True)
    with tempfile.TemporaryDirectory(prefix="memctl-hugeline-") as tmp:
        for mb in sorted(set(new) | set(old)):
            path = Path(tmp) / f"line-{mb:g}MB.txt"
            size = int(mb * 2**20)
            generate(path, size, args.text == "prose", spaces=max(0, size - 4096) if args.text == "spaces" else 0)
            o = measure("old", path, args, args.old_timeout) if mb in old else None
            n = measure("new", path, args, None) if mb in new else None
            timed_out = mb in old and o is None

            def cell(d: dict[str, float] | None, key: str, fmt: str, late: bool = timed_out) -> str:
                return format(d[key], fmt) if d else ("timeout" if key == "seconds" and late else "-")

            ratio = f"{o['seconds'] / n['seconds']:.1f}x" if o and n else "-"
            rate = f"{mb / n['seconds']:.2f}" if n else "-"
            print(
                f"{mb:>8g} {cell(o, 'seconds', '.1f'):>9} {cell(n, 'seconds', '.1f'):>9} {ratio:>8} {rate:>9} "
                f"{cell(o, 'rss_mb', '.0f'):>8} {cell(n, 'rss_mb', '.0f'):>8} {cell(o, 'added_mb', '.0f'):>9} "
                f"{cell(n, 'added_mb', '.0f'):>9} {int((n or o or {}).get('windows', 0)):>9}",
                flush=True,
            )
            path.unlink()


if __name__ == "__main__":
    main()
