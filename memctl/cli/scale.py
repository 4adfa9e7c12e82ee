"""Commands and output for scaling out: one unit trained into a directory, `merge`, torchrun ranks."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .common import BankOpt, JsonOpt, NoWaitOpt, app, err, out, print_json, run

if TYPE_CHECKING:
    from ..train.run import TrainResult


def train_out_command(
    bank: str,
    out_dir: Path | None,
    overrides: dict[str, Any],
    subtree: int | None,
    generic: bool,
    restart: bool,
    as_json: bool,
    dp: int = 1,
    device: str | None = None,
    dtype: str | None = None,
) -> None:
    """`memctl train --subtree I --out DIR` (or `--generic --out DIR`): one unit, the bank untouched."""
    from ..core.errors import InputError
    from ..train.distributed import World
    from ..train.merge import train_out
    from ..train.run import TrainEvent

    def go() -> Any:
        if out_dir is None:
            raise InputError("--generic trains the generic memory into a directory: give --out DIR")
        if World.from_env().size > 1 or dp != 1:
            raise InputError("--out trains one unit in one process; run it without torchrun or --dp")

        last = [0.0]

        def log(ev: TrainEvent) -> None:
            if as_json or not (ev.step == ev.total_steps or time.monotonic() - last[0] > 10):
                return
            last[0] = time.monotonic()
            loss = "" if ev.unit_no < 0 else f" loss {ev.loss:.3f}"  # a preparation stage has none
            err.print(f"{ev.unit} {ev.step}/{ev.total_steps}{loss}", highlight=False)

        return train_out(
            bank, out_dir, overrides, subtree=subtree, generic=generic, restart=restart, progress=log,
            device=device, dtype=dtype,
        )  # fmt: skip

    res = run(go)
    if as_json:
        d = dataclasses.asdict(res)
        print_json({k: v for k, v in d.items() if k != "prepare"})
        return
    if res.result is None:
        out.print(f"unit {res.unit} stopped before the end; rerun the same command to resume")
        return
    u = res.result
    out.print(
        f"unit {res.unit} of {res.bank}: {u.steps} steps, {u.tokens:,} tokens, loss {u.loss_first:.3f} → "
        f"{u.loss_last:.3f}; {res.blocks} block(s) and manifest.json in {res.out} "
        f"(`memctl merge --bank {res.bank} DIR...` records them)"
    )


def worker_summary(res: TrainResult, as_json: bool) -> bool:
    """Under torchrun: one line for a rank above 0 (True: nothing more to print), and for any idle rank."""
    if res.world <= 1:
        return False
    if not res.assigned:
        err.print(
            f"rank {res.rank}/{res.world}: idle, no unit left for this rank (`--dp N` trains each unit with N ranks)",
            highlight=False,
            soft_wrap=True,
        )
    if res.dp_steps:
        err.print(
            f"rank {res.rank}/{res.world}: data-parallel, {res.dp_steps} steps: "
            f"{res.dp_bytes / res.dp_steps / 2**20:.2f} MiB of gradients summed per step "
            f"(the touched blocks; all of the unit's blocks: {res.dp_dense_bytes / res.dp_steps / 2**20:.2f} MiB)",
            highlight=False,
            soft_wrap=True,
        )
    if res.rank == 0:
        return False
    if as_json:
        print_json({"rank": res.rank, "dp": res.dp, "trained": [u.unit for u in res.units]})
    elif res.units:
        names = ", ".join(u.unit for u in res.units)
        first = res.rank - res.rank % res.dp
        with_ = f" with ranks {first}-{first + res.dp - 1} (data-parallel)" if res.dp > 1 else ""
        err.print(
            f"rank {res.rank}/{res.world}: trained unit(s) {names}{with_}; rank 0 recorded them",
            highlight=False,
            soft_wrap=True,
        )
    return True


@app.command()
def merge(
    dirs: Annotated[list[Path], typer.Argument(help="Directories written by `memctl train --subtree I --out DIR`.")],
    bank: BankOpt,
    no_wait: NoWaitOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Record units trained elsewhere (`train --out`) into the bank: all of them in one transaction, after
    checking anchor, tree, configuration, data and block checksums; nothing is recorded on any mismatch."""
    from ..train.merge import merge as do_merge

    res = run(lambda: do_merge(bank, dirs), no_wait)
    if as_json:
        print_json(dataclasses.asdict(res))
        return
    out.print(f"merged {len(res.units)} unit(s) ({', '.join(res.units)}), {res.blocks} block(s) into {res.bank}")
