"""Commands that answer: ask, chat."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from ..core.errors import InputError, MemctlError
from .common import (
    AllowOpt,
    AnchorMixOpt,
    BankOpt,
    CacheMbOpt,
    DeviceOpt,
    DtypeOpt,
    Int8Opt,
    JsonOpt,
    LexicalOpt,
    MinRelevanceOpt,
    RelevanceRampOpt,
    app,
    err,
    json_text,
    out,
    print_json,
    run,
)


@app.command()
def ask(
    prompt: Annotated[str, typer.Argument(help="The question or text to continue.")],
    bank: BankOpt,
    no_memory: Annotated[bool, typer.Option("--no-memory", help="Anchor alone.")] = False,
    generic: Annotated[bool, typer.Option("--generic", help="The generic memory instead of routed blocks.")] = False,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the anchor's chat template.")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 32,
    allow: AllowOpt = None,
    cache_mb: CacheMbOpt = 512,
    rag: Annotated[
        bool, typer.Option("--rag", help="Also put the nearest window of the routed leaf in the prompt.")
    ] = False,
    int8: Int8Opt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    min_relevance: MinRelevanceOpt = None,
    relevance_ramp: RelevanceRampOpt = None,
    lexical: LexicalOpt = None,
    anchor_mix: AnchorMixOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Answer with the memory blocks the prompt routes to (only those are read). A prompt unrelated
    to the bank (below its relevance floor) fetches none and, with --rag, retrieves nothing: the
    anchor answers alone."""
    from ..registry.access import allow_tags
    from ..serve.session import ask as do_ask

    def go() -> Any:
        if no_memory and generic:
            raise InputError("--no-memory and --generic exclude each other")
        mode = "none" if no_memory else "generic" if generic else "fetched"
        tags = allow_tags(allow)
        return do_ask(
            bank, prompt, mode=mode, max_new_tokens=max_new_tokens, chat=chat, allow=tags, cache_mb=cache_mb, rag=rag,
            int8=int8, device=device, dtype=dtype, min_relevance=min_relevance, anchor_mix=anchor_mix,
            relevance_ramp=relevance_ramp, lexical=lexical,
        )  # fmt: skip

    d = run(go)
    if as_json:
        print_json(d)
        return
    out.print(d["answer"].strip(), highlight=False)
    where = {"none": "anchor alone", "generic": "generic memory"}.get(d["mode"])
    if d["unrelated"]:
        where = (
            f"unrelated to the bank (relevance {d['relevance']:.2f} < floor {d['relevance_floor']:.2f}): "
            "anchor alone, no memory fetched" + (", nothing retrieved" if rag else "")
        )
    elif where is None:
        served = ", ".join(d["blocks"]) or ("none served" if d["withheld"] else "none trained")
        where = f"path {'/'.join(map(str, d['path']))}, blocks {served}"
        if d["withheld"]:
            where += f" (withheld: {', '.join(d['withheld'])})"
        if d["anchor_mix"]:
            where += f", anchor mix {d['anchor_mix']:.2g}"
    r = d["retrieved"]
    if rag and not d["unrelated"]:
        where += (
            f"; retrieved {r['doc_id']} ({r['title']}), window {r['window_id']}, score {r['score']:.2f}, "
            f"from node {r['node']}" + (f" (widened {r['widened']} level(s))" if r["widened"] else "")
            if r
            else "; nothing to retrieve in the routed subtree"
        )
    t = d["timings"]
    err.print(
        f"[dim]{where}; route {1e3 * t['route_s']:.0f} ms, retrieve {1e3 * t['retrieve_s']:.0f} ms, "
        f"fetch {1e3 * t['fetch_s']:.0f} ms, "
        f"generate {1e3 * t['generate_s']:.0f} ms[/dim]",
        highlight=False,
    )


@app.command()
def chat(
    bank: BankOpt,
    plain: Annotated[
        bool, typer.Option("--plain", help="Line mode for pipes and scripts (no full-screen app).")
    ] = False,
    mode: Annotated[str, typer.Option(help="fetched, generic or none (anchor alone).")] = "fetched",
    rag: Annotated[
        bool, typer.Option("--rag", help="Put the nearest window of the routed leaf in each message.")
    ] = False,
    route_on: Annotated[
        str, typer.Option(help="Route on the 'message' alone or the whole 'conversation'.")
    ] = "message",
    allow: AllowOpt = None,
    cache_mb: CacheMbOpt = 512,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per reply at most.")] = 96,
    int8: Int8Opt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    min_relevance: MinRelevanceOpt = None,
    relevance_ramp: RelevanceRampOpt = None,
    lexical: LexicalOpt = None,
    anchor_mix: AnchorMixOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Line mode that answers each stdin line with one JSON object per line.")
    ] = False,
) -> None:
    """Chat with a bank: each turn fetches only the blocks its message routes to, and streams.

    In --plain mode, lines starting with / change settings: /mode fetched|generic|none, /rag on|off,
    /route message|conversation, /compare (the last message in every mode), /quit. --json reads the
    same lines and writes one JSON object per line: a turn (reply, path, labels, blocks, timings),
    the settings after a / command, the turns of /compare, or {"error": ...}."""
    from ..core.placement import placement
    from ..registry.access import allow_tags
    from ..serve.chat import Chat, ChatSettings
    from ..serve.session import BankSession

    def open_chat() -> Chat:
        settings = ChatSettings(mode=mode, rag=rag, route_on=route_on, max_new_tokens=max_new_tokens).check()
        if not (plain or as_json) and not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise InputError("the chat app needs a terminal; use --plain for pipes and scripts")
        tags = allow_tags(allow)
        place = placement(device, dtype)
        session = BankSession(
            bank, allow=tags, cache_mb=cache_mb, int8=int8, place=place, min_relevance=min_relevance,
            anchor_mix=anchor_mix, relevance_ramp=relevance_ramp, lexical=lexical,
        )  # fmt: skip
        return Chat(session, settings)

    session_chat = run(open_chat)
    try:
        if as_json:
            run(lambda: _json_chat(session_chat))
        elif plain:
            run(lambda: _plain_chat(session_chat))  # Ctrl-C or a bug: one line, as every command
        else:
            from ..tui.chat import run_chat

            run(lambda: run_chat(session_chat))  # an error in the app: one line once the screen is restored
    finally:
        session_chat.session.close()


def _stdin_lines() -> Iterator[str]:
    """stdin's lines, decoded here in its own encoding: bytes that do not decode come through as lone
    surrogates (Python's surrogateescape), so the turn refuses that one line and the chat goes on."""
    if sys.stdin is None:
        return
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream without bytes underneath (tests)
        yield from sys.stdin
        return
    encoding = getattr(sys.stdin, "encoding", None) or "utf-8"
    for raw in buffer:
        yield raw.decode(encoding, "surrogateescape")


def _plain_chat(c: Any) -> None:
    from dataclasses import replace

    from ..serve.chat import describe

    for raw in _stdin_lines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("/"):
            cmd, _, arg = line[1:].partition(" ")
            arg = arg.strip()
            try:
                if cmd == "quit":
                    return
                if cmd == "compare":
                    for t in c.compare():
                        out.print(f"[bold]{t.settings.mode}[/bold]: {t.reply}", highlight=False)
                        err.print(f"[dim]{describe(t)}[/dim]", highlight=False)
                    continue
                changes = {"mode": {"mode": arg}, "rag": {"rag": arg == "on"}, "route": {"route_on": arg}}.get(cmd)
                if changes is None or (cmd == "rag" and arg not in ("on", "off")):
                    raise InputError(f"unknown command {line!r}: /mode, /rag on|off, /route, /compare, /quit")
                c.settings = replace(c.settings, **changes).check()
                err.print(f"[dim]{c.settings}[/dim]", highlight=False)
            except MemctlError as e:
                err.print(f"[red]error:[/red] {e}", highlight=False)
            continue

        def write(piece: str) -> None:
            sys.stdout.write(piece)
            sys.stdout.flush()

        try:
            turn = c.turn(line, write)
        except MemctlError as e:
            err.print(f"[red]error:[/red] {e}", highlight=False)
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        err.print(f"[dim]{describe(turn)}[/dim]", highlight=False)


def _json_chat(c: Any) -> None:
    """`chat --json`: each stdin line answered as one JSON line on stdout (errors too, as {"error": ...})."""
    from dataclasses import asdict, replace

    def emit(obj: Any) -> None:  # one line each, NaN as null (common.print_json's rule)
        sys.stdout.write(json_text(obj) + "\n")
        sys.stdout.flush()

    for raw in _stdin_lines():
        line = raw.strip()
        if not line:
            continue
        try:
            if line.startswith("/"):
                cmd, _, arg = line[1:].partition(" ")
                arg = arg.strip()
                if cmd == "quit":
                    return
                if cmd == "compare":
                    emit({"compare": [asdict(t) for t in c.compare()]})
                    continue
                changes = {"mode": {"mode": arg}, "rag": {"rag": arg == "on"}, "route": {"route_on": arg}}.get(cmd)
                if changes is None or (cmd == "rag" and arg not in ("on", "off")):
                    raise InputError(f"unknown command {line!r}: /mode, /rag on|off, /route, /compare, /quit")
                c.settings = replace(c.settings, **changes).check()
                emit({"settings": asdict(c.settings)})
                continue
            emit(asdict(c.turn(line)))
        except MemctlError as e:
            emit({"error": str(e)})
