"""Training under torchrun (or `accelerate launch`): level-1 units shared out across ranks.

Units share nothing (own data order, RNG, optimizer, clipping), so a rank trains its units exactly as a
single process would. Unit i of the sorted to-do list goes to rank i % WORLD_SIZE. Rank 0 alone
writes the registry: it checks the request, prepares prompts and the teacher cache, tells every rank
the configuration and the to-do list, trains its own units, and commits the units the other ranks send
it (their trained tensors, over torch.distributed) one transaction per unit, as `memctl train` does.
Checkpoints stay per unit, written by the rank that trains it.

With `dp` above 1 the ranks form WORLD_SIZE / dp groups of dp consecutive ranks; unit i goes to group
i % groups, whose ranks train it together, data-parallel (memctl.train.dataparallel), and whose first rank
(the leader) sends it to rank 0. Without it, ranks beyond the number of units idle.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..core import errors
from ..core.config import TrainConfig, train_config_from_json
from ..core.errors import InputError, MemctlError
from ..core.placement import CPU, Placement, dtype_name
from ..model.anchor import attach
from ..model.memory import PARTS
from ..registry import Registry, dumps, lock, memctl_home
from ..registry.runs import interrupt_dead_runs
from .dataparallel import DataParallel, check_dp, make_groups
from .events import INTERRUPTED, TrainEvent, TrainingInterrupted, TrainResult
from .loop import (
    _keep_freed_memory,
    load_bank_anchor,
    prepare_training,
    sigint_flag,
    train_unit,
)
from .packing import pack, unpack
from .plan import plan_training
from .records import TrainedUnit, UnitResult, commit_unit, start_run, stop_run
from .units import Unit, UnitParams


@dataclass(frozen=True)
class World:
    """This process's place in a torchrun job; size 1 outside one."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @staticmethod
    def from_env() -> World:
        def read(var: str, default: int) -> int:
            value = os.environ.get(var, "").strip()
            if not value:
                return default
            try:
                return int(value)
            except ValueError:
                raise InputError(f"{var}={value!r} is not an integer (set by torchrun or accelerate)") from None

        size = read("WORLD_SIZE", 1)
        rank = read("RANK", 0) if size > 1 else 0
        if size < 1 or not 0 <= rank < size:
            raise InputError(f"RANK={rank} and WORLD_SIZE={size} do not describe a rank of a job")
        return World(rank, size, read("LOCAL_RANK", 0) if size > 1 else 0)


def share(units: list[str], size: int) -> list[list[str]]:
    """Round-robin: unit i of the list goes to rank i % size."""
    return [units[r::size] for r in range(size)]


def backend(world: World) -> str:
    """gloo for CPU tensors (what memctl trains and sends), with nccl for CUDA tensors when this rank
    has a GPU of its own."""
    gpu = torch.cuda.is_available() and world.local_rank < torch.cuda.device_count() and dist.is_nccl_available()
    return "cpu:gloo,cuda:nccl" if gpu else "gloo"


@contextmanager
def process_group(world: World) -> Iterator[None]:
    """Join the job's process group (env:// rendezvous from torchrun), unless already in one."""
    if dist.is_initialized():
        yield
        return
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise InputError(
            f"WORLD_SIZE={world.size} but {' and '.join(missing)} unset: launch with `torchrun --nproc-per-node N`"
        )
    name = backend(world)
    if "nccl" in name:
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(name, rank=world.rank, world_size=world.size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _tags(unit_no: int) -> tuple[int, int]:
    return 2 * unit_no, 2 * unit_no + 1  # (size, bytes) of the message about unit `unit_no`


def encode_message(msg: tuple[str, Any]) -> bytes:
    """A message about a unit as tensors plus JSON (memctl.train.packing; no pickle): ("done", TrainedUnit)
    with the unit's blocks bit for bit, or (kind, plain JSON data) for the others."""
    kind, body = msg
    if kind != "done":
        return pack({}, {"kind": kind, "body": body})
    tu: TrainedUnit = body
    tensors = {f"{pos}.{part}": t for pos, level in enumerate(tu.params.tensors) for part, t in level.items()}
    data = {
        "kind": kind,
        "result": dataclasses.asdict(tu.result),
        "unit": {"name": tu.unit.name, "levels": tu.unit.levels},
        "seen": [[level, node, docs] for (level, node), docs in tu.seen.items()],
    }
    return pack(tensors, data)


def decode_message(buf: bytes) -> tuple[str, Any]:
    tensors, data = unpack(buf)
    kind = str(data["kind"])
    if kind != "done":
        body = data["body"]
        return kind, tuple(body) if isinstance(body, list) else body
    unit = Unit(str(data["unit"]["name"]), [(int(a), int(b), int(c)) for a, b, c in data["unit"]["levels"]])
    params = UnitParams.from_tensors(
        unit, [{p: tensors[f"{pos}.{p}"] for p in PARTS} for pos in range(len(unit.levels))]
    )
    seen = {(int(lv), int(nd)): {str(d): int(n) for d, n in docs.items()} for lv, nd, docs in data["seen"]}
    return kind, TrainedUnit(UnitResult(**data["result"]), unit, params, seen)


def send_message(msg: tuple[str, Any], unit_no: int, dst: int = 0) -> list[Any]:
    """Start sending a message (`encode_message`) without waiting for the receiver; returns what to
    keep alive and `.wait()` on."""
    data = torch.frombuffer(bytearray(encode_message(msg)), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    t_size, t_data = _tags(unit_no)
    return [dist.isend(size, dst, tag=t_size), dist.isend(data, dst, tag=t_data), size, data]


def recv_message(src: int, unit_no: int) -> tuple[str, Any]:
    t_size, t_data = _tags(unit_no)
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, src, tag=t_size)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(data, src, tag=t_data)
    return decode_message(data.numpy().tobytes())  # tensors on the CPU, where rank 0 writes them


@dataclass
class _Plan:
    tcfg: str  # TrainConfig as JSON
    todo: list[str]
    done: list[str]
    split_head: bool = False
    error: tuple[str, str] | None = None  # (MemctlError subclass name, message) raised on rank 0


def _raise(error: tuple[str, str]) -> None:
    cls = getattr(errors, error[0], None) or getattr(lock, error[0], None)  # BankBusy lives in memctl.registry.lock
    if not (isinstance(cls, type) and issubclass(cls, MemctlError)):
        cls = MemctlError
    raise cls(error[1])


def train_distributed(
    world: World,
    name: str,
    overrides: dict[str, Any] | None = None,
    *,
    subtree: int | None = None,
    retrain: bool = False,
    restart: bool = False,
    home: Path | None = None,
    progress: Callable[[TrainEvent], None] | None = None,
    max_steps: int | None = None,
    dp: int = 1,
    place: Placement = CPU,
) -> TrainResult:
    """`memctl train` on one rank of a torchrun job (see the module docstring); `place` is this
    rank's device and dtype."""
    home = home or memctl_home()
    check_dp(dp, world.size)
    if place.device.type == "cuda":  # nccl and its object collectives use the current device
        torch.cuda.set_device(place.device)
    with process_group(world), ExitStack() as held:  # rank 0 holds the writer lock until its last commit
        group = make_groups(world.size, dp, world.rank)
        result = TrainResult(bank=name, rank=world.rank, world=world.size, placement=place.label)
        reg, anchor, handle = None, None, None
        plan = _Plan("", [], [])
        try:
            if world.rank == 0:  # checks, configuration, preparation: everything that writes
                try:
                    held.enter_context(lock.bank_lock(name, home))  # one writer at a time (memctl.registry.lock)
                    reg = Registry.open(name, home)
                    interrupt_dead_runs(reg)  # we hold the lock: a run still 'running' is a killed process's
                    tcfg, todo, done = plan_training(reg, overrides, subtree, retrain, restart, place)
                    plan = _Plan(dumps(dataclasses.asdict(tcfg)), todo, done)
                    if todo:
                        anchor = load_bank_anchor(reg, home, place)
                        torch.manual_seed(tcfg.seed)
                        handle = attach(anchor.model, reg.config.memory.layers)
                        result.prepare, plan.split_head = prepare_training(reg, anchor, tcfg, todo, progress)
                except MemctlError as e:
                    plan.error = (type(e).__name__, str(e))
                except Exception as e:  # a bug: the other ranks must not wait forever
                    plan.error = ("MemctlError", f"rank 0 failed: {type(e).__name__}: {e}")
                    _broadcast(plan)
                    raise
            plan = _broadcast(plan)
            if plan.error:
                _raise(plan.error)
            result.skipped = plan.done
            tcfg = train_config_from_json(plan.tcfg)
            result.assigned = share(plan.todo, world.size // dp)[world.rank // dp]
            result.dp = dp
            if not plan.todo:
                return result
            with sigint_flag() as flag:
                if world.rank == 0:
                    assert reg is not None
                    _train_main(reg, anchor, handle, tcfg, plan, world, result, flag, progress, max_steps, group)
                elif result.assigned:
                    _train_worker(name, home, tcfg, plan, result, flag, progress, max_steps, group, place)
            if group is not None:
                result.dp_steps, result.dp_bytes = group.steps, group.bytes_reduced
                result.dp_dense_bytes = group.bytes_dense
            if result.interrupted and flag["stop"]:
                raise TrainingInterrupted(INTERRUPTED)
            return result
        finally:
            if handle is not None:
                handle.detach()
            if reg is not None:
                reg.close()


def _broadcast(plan: _Plan) -> _Plan:
    """Rank 0's plan on every rank, sent as one JSON string (plain data, no object of ours)."""
    box: list[Any] = [json.dumps(dataclasses.asdict(plan))]
    dist.broadcast_object_list(box, src=0)
    got = json.loads(box[0])
    got["error"] = tuple(got["error"]) if got["error"] else None
    return _Plan(**got)


def _train_worker(
    name: str,
    home: Path,
    tcfg: TrainConfig,
    plan: _Plan,
    result: TrainResult,
    flag: dict[str, bool],
    progress: Callable[[TrainEvent], None] | None,
    max_steps: int | None,
    group: DataParallel | None,
    place: Placement,
) -> None:
    """A rank above 0: train its units (reading the registry, never writing it) and send each to rank 0:
    ("done", TrainedUnit), ("stopped", None), ("error", (class, message)), or ("skipped", None) for the
    units after a stop or an error. Rank 0 receives exactly one message per unit, whatever happens.
    A rank that is not its group's leader trains alongside the leader and sends nothing."""
    send = group is None or group.leader
    if not send:
        progress = None  # the leader reports the unit's progress
    pending: list[Any] = []
    stop: tuple[str, Any] | None = None
    reg, handle = None, None
    try:
        for unit in result.assigned:
            no = plan.todo.index(unit)
            if stop is not None:
                if send:
                    pending += send_message(("skipped", None), no)
                continue
            try:
                if reg is None:
                    reg = Registry.open(name, home)
                    anchor = load_bank_anchor(reg, home, place)
                    torch.manual_seed(tcfg.seed)
                    handle = attach(anchor.model, reg.config.memory.layers)
                    _keep_freed_memory()
                tu = train_unit(
                    reg, anchor, handle, unit, tcfg, no, len(plan.todo), progress, flag, max_steps, plan.split_head,
                    dp=group,
                )  # fmt: skip
            except MemctlError as e:
                stop = ("error", (type(e).__name__, str(e)))
            except Exception as e:
                stop = ("error", ("MemctlError", f"{type(e).__name__}: {e}"))
            if stop is not None:
                if send:
                    pending += send_message(stop, no)
                continue
            if tu is None:
                result.interrupted = True
                if send:
                    pending += send_message(("stopped", None), no)
                if flag["stop"]:
                    stop = ("stopped", None)
                continue
            if send:
                pending += send_message(("done", tu), no)
            result.units.append(tu.result)
    finally:
        for w in pending:
            if isinstance(w, dist.Work):
                w.wait()
        if handle is not None:
            handle.detach()
        if reg is not None:
            reg.close()
    if stop is not None and stop[0] == "error":
        _raise(stop[1])


def _train_main(
    reg: Registry,
    anchor: Any,
    handle: Any,
    tcfg: TrainConfig,
    plan: _Plan,
    world: World,
    result: TrainResult,
    flag: dict[str, bool],
    progress: Callable[[TrainEvent], None] | None,
    max_steps: int | None,
    group: DataParallel | None,
) -> None:
    """Rank 0: train its own units (with its group), then commit those of every other group's leader,
    one transaction each."""
    n = len(plan.todo)
    dp = 1 if group is None else group.size
    dtype = dtype_name(anchor.dtype)  # every rank runs the same placement kind
    for unit in result.assigned:
        if group is None and flag["stop"]:  # a group stops together, inside train_unit
            break
        no = plan.todo.index(unit)
        run_id = start_run(reg, unit, tcfg, dtype)
        tu = train_unit(reg, anchor, handle, unit, tcfg, no, n, progress, flag, max_steps, plan.split_head, dp=group)
        if tu is None:
            stop_run(reg, run_id)
            result.interrupted = True
            if flag["stop"] and group is not None:
                break
            continue
        result.units.append(commit_unit(reg, tu, run_id))
    failure: tuple[str, str] | None = None
    for g, units in enumerate(share(plan.todo, world.size // dp)):
        rank = g * dp  # the group's leader
        for unit in units if g > 0 else []:
            kind, body = recv_message(rank, plan.todo.index(unit))
            if kind == "done":
                tu: TrainedUnit = body
                result.units.append(commit_unit(reg, tu, start_run(reg, unit, tcfg, dtype)))
            elif kind == "stopped":
                stop_run(reg, start_run(reg, unit, tcfg, dtype))
                result.interrupted = True
            elif kind == "error" and failure is None:
                failure = (body[0], f"rank {rank}, unit {unit}: {body[1]}")
    result.units.sort(key=lambda u: plan.todo.index(u.unit))
    if failure:
        _raise(failure)
