"""Trainer helpers a training script imports to survive preemptions without losing a step.

    from spotrun.elastic.trainer import ElasticTrainer

    with ElasticTrainer(model, optimizer, total_steps=300, global_batch=64, dataset_len=len(data)) as t:
        for step, indices in t.batches():          # this rank's share of the global batch
            loss = loss_fn(t.model(x[indices]), y[indices])
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            t.step_done(loss.item())

What it does for the script:
- picks the device and the backend: worker LOCAL_RANK computes on `cuda:LOCAL_RANK` with NCCL
  where the VM has CUDA, else on the CPU with gloo (spotrun.elastic.devices); the model is moved
  to `t.device`, and the script moves its batches there;
- resumes from the newest valid checkpoint (a corrupt newest one is skipped, with a warning);
- re-shards data from the global sample offset, so a resize neither skips nor repeats a sample;
- "checkpoint now": when the node agent asks (a notice, a join, a drain), all ranks agree on it
  with one tiny all_reduce per step, all ranks save at that step boundary, and every worker exits
  with ExitCode.REFORM so torch elastic re-forms the group at the new size;
- emergency save: when a collective fails because a peer died, survivors save the last completed
  step (DDP replicas are identical) before exiting, so a hard kill loses no completed step (under
  FSDP the dead peer's shards are gone: the job resumes from the newest checkpoint instead);
- periodic checkpoints: staged to host memory at the step boundary, written by a background thread;
- progress for `spotrun status` and the TUI.

DDP (the default) or FSDP2, chosen with `parallel=` (spotrun.elastic.wrapping); FSDP2 needs the
optimizer built after sharding, so pass a factory and use `t.optimizer`:

    t = ElasticTrainer(model, lambda params: torch.optim.AdamW(params, lr=3e-4), parallel="fsdp", ...)

Checkpoints are sharded, DDP and FSDP alike: every rank writes its own shard, loaded at any world
size (spotrun.elastic.checkpoint.sharded in a directory; remote_sharded on object storage, where
each rank uploads its shard in parallel).

Configuration comes from arguments or from the environment the node agent sets:
SPOTRUN_CHECKPOINT_DIR, SPOTRUN_CHECKPOINT_EVERY_STEPS, SPOTRUN_CHECKPOINT_EVERY_SECONDS,
SPOTRUN_CHECKPOINT_KEEP, SPOTRUN_CONTROL_FILE, SPOTRUN_PROGRESS_FILE, SPOTRUN_COLLECTIVE_TIMEOUT_S,
SPOTRUN_PEER_LOST_FILE (the files and exit codes are spotrun.node.protocol's).
A checkpoint location may be a directory or an object-storage URL (s3://bucket/prefix).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist

from spotrun.elastic import devices, handoff, wrapping
from spotrun.elastic.checkpoint import files as checkpoint
from spotrun.elastic.checkpoint import memory, remote_sharded, sharded
from spotrun.elastic.checkpoint import remote as remote_checkpoint
from spotrun.node import protocol

STORE_POLL_S = 0.01
WRITER_NICE = 10  # the background checkpoint writer runs this much nicer than the training thread
SNAPSHOT_WAIT_S = 30.0  # how long a node's other workers wait for local rank 0's host snapshot

_T = TypeVar("_T")
_D = TypeVar("_D")


def _env(name: str, cast: Callable[[str], _T], default: _D) -> _T | _D:
    value = os.environ.get(name)
    return cast(value) if value not in (None, "") else default


def _say(message: str) -> None:
    sys.stderr.write(f"[spotrun rank {os.environ.get('RANK', '?')}] {message}\n")
    sys.stderr.flush()


class ElasticTrainer:
    """Wraps one training loop; see the module docstring. Use as a context manager."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | wrapping.OptimizerFactory,
        *,
        total_steps: int,
        global_batch: int,
        dataset_len: int,
        checkpoint_dir: str | Path | None = None,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        keep: int | None = None,
        seed: int = 0,
        parallel: wrapping.Parallel = "ddp",
    ) -> None:
        if global_batch < 1 or dataset_len < 1 or total_steps < 1:
            raise ValueError(
                f"global_batch ({global_batch}), dataset_len ({dataset_len}) and total_steps "
                f"({total_steps}) must be >= 1"
            )
        # Before the group: the backend follows the device (NCCL for CUDA tensors, gloo for CPU ones).
        self._worker = devices.select()
        self._init_group(self._worker.backend)
        self.device = torch.device(self._worker.name)  # cuda:LOCAL_RANK or cpu: move batches here
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.total_steps, self.global_batch, self.dataset_len, self.seed = total_steps, global_batch, dataset_len, seed
        location = str(checkpoint_dir or _env(protocol.CHECKPOINT_DIR_ENV, str, "checkpoints"))
        self._store = remote_checkpoint.module_for(location)  # a directory, or s3://... through libcloud
        self.checkpoint_dir = location if self._store is remote_checkpoint else Path(location)
        self.every_steps = every_steps or _env(protocol.CHECKPOINT_EVERY_STEPS_ENV, int, None)
        self.every_seconds = every_seconds or _env(protocol.CHECKPOINT_EVERY_SECONDS_ENV, float, None)
        self.keep = keep or _env(protocol.CHECKPOINT_KEEP_ENV, int, 3)
        # Sharded (DCP) checkpoints in a directory and on object storage: the same calls, another module.
        self._shards = remote_sharded if self._store is remote_checkpoint else sharded
        self._fsdp = wrapping.is_fsdp(parallel)
        self.raw_model = model.to(self.device)  # in place: parameters an optimizer holds move with it
        self.model = wrapping.fully_shard_model(model, parallel) if self._fsdp else model
        self.optimizer = wrapping.build_optimizer(optimizer, self.model, self._fsdp)
        # DDP replicas survive a re-formation in host memory (an FSDP rank holds a shard only: its
        # state goes through the sharded checkpoint).
        self._memory = None if self._fsdp else memory.directory()
        self._durable_due = False  # resumed from memory past the newest durable checkpoint
        self._local_zero = os.environ.get("LOCAL_RANK", "0") == "0"  # writes the node's host snapshot
        self._reserver = memory.Reserver()
        # Background checkpoint writes coordinate on their own group, never interleaving with training's.
        self._checkpoint_group = dist.new_group(backend="gloo")
        self._stager = sharded.stager()
        self.step = 0
        self.samples_seen = 0
        self._orders: dict[int, torch.Tensor] = {}
        self.resumed_from: int | None = None
        self._control = protocol.ControlReader(_env(protocol.CONTROL_FILE_ENV, Path, None))
        # One reporter per node: local rank 0 (the agent publishes one progress record per node).
        self._progress = _ProgressFile(
            _env(protocol.PROGRESS_FILE_ENV, Path, None) if self._local_zero else None, live=self._memory is not None
        )
        self._writer = _AsyncWriter()
        self._last_save_at = time.monotonic()
        # On the CPU whatever the device (gloo carries the control collectives): checkpoint now,
        # periodic save due by time, a writer still busy, no room for a host snapshot.
        self._flags = torch.zeros(4)
        self._no_room = False
        # The launcher stops workers with SIGTERM (a re-formation it decided, SIGKILL 5 s later): with
        # live recovery, finish the step and keep it in host memory instead of dying mid-step.
        self._stopping = False
        if self._memory is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self._resume()
        if not self._fsdp and self.world_size > 1:
            # After a resume every rank holds the same state: DDP's start-up broadcast of rank 0's
            # parameters is needed only at a fresh start (each rank's own random init).
            self.model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=self._worker.ddp_device_ids, init_sync=self.resumed_from is None
            )

    # -- public ---------------------------------------------------------------------------------
    def __enter__(self) -> ElasticTrainer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Finish after the last step; on a peer's failure save the completed step and exit the
        process (ExitCode.REFORM). Any other exception propagates."""
        if exc is None:
            self.finish()
        elif not isinstance(exc, (SystemExit, KeyboardInterrupt)) and _is_peer_failure(exc):
            self._emergency_exit(exc)

    def batches(self) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (step, this rank's sample indices) until total_steps; the step is 1-based."""
        while self.step < self.total_steps:
            yield self.step + 1, self._indices(self.samples_seen)

    def step_done(self, loss: float | None = None) -> None:
        """Call after optimizer.step(): counts the step, reports progress, checkpoints when due,
        and acts on an agreed "checkpoint now" (save, then exit ExitCode.REFORM on every rank)."""
        self.step += 1
        self.samples_seen += self.global_batch
        if self._stopping:  # every rank completed this step; peers still running save it when this one goes
            self._save_to_memory()
            _say(f"stopped by the launcher after step {self.step}, kept in host memory")
            self._exit(protocol.ExitCode.REFORM)
        if self._memory is not None and self._local_zero and not (self._reserver.started or self._no_room):
            self._reserve_arena()  # the optimizer's state exists now
        self._progress.report(self.step, self.world_size, self.global_batch, loss)
        now, due_by_time, busy, no_room = self._agree()
        if now:
            if self._memory is not None and not no_room:
                self._save_to_memory()  # the durable copy comes with the next periodic checkpoint
            else:
                self._save_sync()
            self._control.served()
            dist.barrier()
            _say(f"checkpoint at step {self.step} agreed by all ranks; leaving for re-formation")
            self._exit(protocol.ExitCode.REFORM)
        due = due_by_time or self._durable_due or (self.every_steps is not None and self.step % self.every_steps == 0)
        if due and not busy:
            self._durable_due = False
            self._writer.submit(self._snapshot(staged=True), self._write_and_prune)
            self._last_save_at = time.monotonic()

    def finish(self) -> None:
        """Final checkpoint, then leave the process group. Call once, after the last step."""
        self._save_sync()
        if self.world_size > 1:
            dist.barrier()
        dist.destroy_process_group()

    # -- data -----------------------------------------------------------------------------------
    def _indices(self, offset: int) -> torch.Tensor:
        """This rank's slice of the global batch starting at global sample `offset` (epochs are
        seeded permutations, so the sample sequence is the same whatever the world size)."""
        positions = torch.arange(offset, offset + self.global_batch)
        epochs, within = positions // self.dataset_len, positions % self.dataset_len
        samples = torch.empty_like(positions)
        for epoch in epochs.unique().tolist():
            mask = epochs == epoch
            samples[mask] = self._permutation(epoch)[within[mask]]
        return torch.tensor_split(samples, self.world_size)[self.rank]

    def _permutation(self, epoch: int) -> torch.Tensor:
        """The seeded sample order of `epoch`, computed once per epoch (not once per step)."""
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = torch.randperm(
                self.dataset_len, generator=torch.Generator().manual_seed(self.seed + epoch)
            )
        return self._orders[epoch]

    # -- checkpoints ----------------------------------------------------------------------------
    def _resume(self) -> None:
        if self._resume_from_memory():
            return
        # Rank 0 picks (and verifies) the checkpoint, so every rank loads the same one.
        found = [self._store.newest_valid(self.checkpoint_dir, warn=_say) if self.rank == 0 else None]
        if self.world_size > 1:
            dist.broadcast_object_list(found, src=0)
        manifest = found[0]
        if manifest is None:
            return
        if isinstance(manifest, checkpoint.ShardedManifest):  # else a state.pt of an earlier version
            from torch.distributed.checkpoint.state_dict import set_state_dict

            state = self._state_dict()
            self._shards.load(manifest, state)  # resharded to this world size
            set_state_dict(
                self.raw_model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
            self.step, self.samples_seen = manifest.step, manifest.samples_seen
        else:
            state = self._store.load_state(manifest)
            self.raw_model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.step, self.samples_seen = state["step"], state["samples_seen"]
        self.resumed_from = self.step
        if self.rank == 0:
            _say(f"resumed from step {self.step} (saved at world size {manifest.world_size}, now {self.world_size})")

    def _resume_from_memory(self) -> bool:
        """Survivors load the newest step from their node's host memory, joiners receive it from a
        survivor (spotrun.elastic.handoff): no storage read, no hash. False (collectively) when no
        rank holds a snapshot at least as new as the newest durable checkpoint."""
        if self._memory is None:
            return False
        started = time.monotonic()
        held = memory.newest(self._memory)
        durable = max(self._store.steps(self.checkpoint_dir), default=-1) if self.rank == 0 else -1
        plan = handoff.agree(held.step if held else -1, durable, self.world_size)
        if plan.step < 0 or plan.durable > plan.step:
            return False
        if self.rank in plan.sources:
            assert held is not None
            state = memory.load(held)
            if plan.receivers:  # straight from host memory, before loading it here: joiners wait on it
                handoff.send(state, plan, self.rank)
            self._load_replica(state, copy=True)
        else:
            self._load_replica(handoff.receive(plan, self.device), copy=False)
        self.resumed_from = self.step
        # The durable copy of this step comes with the next periodic checkpoint, off the recovery's
        # path; a job without periodic checkpoints writes it now, in the background.
        self._durable_due = plan.step > plan.durable and self.every_steps is None and self.every_seconds is None
        if self.rank == 0:
            _say(
                f"resumed from step {self.step} in host memory in {time.monotonic() - started:.2f} s "
                f"({len(plan.sources)} rank(s) held it, {len(plan.receivers)} received it from them; "
                f"newest durable checkpoint: step {plan.durable})"
            )
        return True

    def _replica(self) -> dict[str, Any]:
        """This rank's whole live state (a DDP replica), no copy: for a host snapshot or a handoff."""
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "samples_seen": self.samples_seen,
        }

    def _load_replica(self, state: dict[str, Any], copy: bool) -> None:
        """Load a `_replica`. `copy`: its tensors are mapped from a snapshot file; the optimizer gets
        its own memory (it keeps the tensors it is given, and the file goes with the next snapshot)."""
        self.raw_model.load_state_dict(state["model"])
        optim = state["optimizer"]
        if copy:
            own = lambda v: _owned(v, self.device)  # noqa: E731
            optim = {**optim, "state": {k: {n: own(t) for n, t in s.items()} for k, s in optim["state"].items()}}
        self.optimizer.load_state_dict(optim)
        self.step, self.samples_seen = int(state["step"]), int(state["samples_seen"])

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._stopping = True

    def _reserve_arena(self) -> None:
        """Size this node's arena for the state (the optimizer's exists after the first step) and
        reserve it in the background; without room for it, agreed checkpoints go to storage."""
        assert self._memory is not None
        size = memory.snapshot_bytes(self._replica())
        if memory.room(self._memory, size):
            self._reserver.start(self._memory, size)
        else:
            self._no_room = True
            _say(f"no room for a {size / 1e6:.0f} MB host snapshot in {self._memory}: recovery goes through storage")

    def _save_to_memory(self) -> None:
        """Leave this node's replica in host memory for the next workers: local rank 0 writes it, the
        node's other workers wait until it is whole (their exit would end it). Blocking."""
        assert self._memory is not None
        if self._local_zero:
            started = time.monotonic()
            # The launcher stops a node's workers (SIGTERM, SIGKILL 5 s later) as soon as the rendezvous
            # sees a peer gone, usually while this runs: finish the snapshot first, it is what survives.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self._reserver.wait()
            memory.save(self._memory, self.step, self._replica())
            _say(f"step {self.step} left in host memory in {time.monotonic() - started:.2f} s")
        elif not memory.wait_for(self._memory, self.step, SNAPSHOT_WAIT_S):
            _say(f"local rank 0 left no snapshot of step {self.step} within {SNAPSHOT_WAIT_S:.0f} s")

    def _state_dict(self) -> dict[str, Any]:
        """Model and optimizer state keyed by parameter name (DTensor shards under FSDP2), for DCP."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.raw_model, self.optimizer)
        return {"model": model, "optimizer": optim}

    def _snapshot(self, staged: bool = False, whole: bool = False) -> dict[str, Any]:
        """What this rank writes of a checkpoint: with `staged`, a host copy safe to write from another
        thread while training goes on, else (a save on this thread) the live state, no copy. A DDP
        rank takes only its part of the replica (sharded.replica_part), unless `whole` (a survivor
        saving alone); an FSDP rank holds its own shards only."""
        progress = {"step": self.step, "samples_seen": self.samples_seen, "world_size": self.world_size}
        state = self._state_dict()
        if not self._fsdp and not whole and self.world_size > 1:
            state = sharded.replica_part(state, self.rank, self.world_size)
        if staged:
            state = sharded.stage(state, self._stager)
        return {"dcp": state, **progress}

    def _write_and_prune(self, state: dict[str, Any]) -> None:
        """Write `state` (a `_snapshot`): collective on every rank."""
        started = time.monotonic()
        manifest = self._shards.save(
            self.checkpoint_dir,
            state["step"],
            state["world_size"],
            state["dcp"],
            state["samples_seen"],
            self._checkpoint_group,
        )
        if manifest is None:  # written by rank 0, or there already
            return
        took = time.monotonic() - started
        self._store.prune(self.checkpoint_dir, self.keep)
        self._progress.checkpointed(manifest, took)

    def _save_sync(self) -> None:
        self._writer.wait()
        self._write_and_prune(self._snapshot())

    def _agree(self) -> tuple[bool, bool, bool, bool]:
        """One tiny all_reduce per step, so every rank takes the same checkpoint decisions (a sharded
        save is collective): (any agent asked for a checkpoint now, a periodic save is due by time
        on any rank, any rank's previous background write still runs, any node has no room for its
        host snapshot: then an agreed checkpoint goes to storage)."""
        by_time = self.every_seconds is not None and time.monotonic() - self._last_save_at >= self.every_seconds
        flags = [self._control.requested(), by_time, self._writer.busy(), self._no_room]
        self._flags.copy_(torch.tensor(flags, dtype=torch.float))
        if self.world_size > 1:
            dist.all_reduce(self._flags, op=dist.ReduceOp.MAX)
        now, due, busy, no_room = (bool(v) for v in self._flags.tolist())
        return now, due, busy, no_room

    def _emergency_exit(self, exc: BaseException) -> NoReturn:
        """A peer died mid-collective: a DDP replica holds the last completed step, save it and go (an
        FSDP rank holds only its shard: go; the job resumes from the newest checkpoint)."""
        lost = "leaving" if self._fsdp else f"saving completed step {self.step} before leaving"
        _say(f"collective failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); {lost}")
        protocol.mark_peer_lost()
        try:
            if self.step > 0 and self._memory is not None and not self._no_room:
                self._save_to_memory()  # survivors go on from it; durable with the next periodic checkpoint
            elif self.step > 0 and self._fsdp:
                _say("FSDP shards of the lost peer are gone: the job resumes from the newest checkpoint")
            elif self.step > 0:
                # No collective: a background write, if any, fails on the dead peer by itself.
                state = self._snapshot(whole=True)
                started = time.monotonic()
                manifest = self._shards.save_alone(
                    self.checkpoint_dir, self.step, self.world_size, state["dcp"], self.samples_seen
                )
                self._store.prune(self.checkpoint_dir, self.keep)
                self._progress.checkpointed(manifest, time.monotonic() - started)
        finally:
            self._exit(protocol.ExitCode.REFORM)

    @staticmethod
    def _exit(code: int) -> NoReturn:
        # os._exit: a normal exit would run gloo/DDP destructors that can hang on a dead peer.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    @staticmethod
    def _init_group(backend: str) -> None:
        if not dist.is_initialized():
            timeout = timedelta(seconds=_env(protocol.COLLECTIVE_TIMEOUT_ENV, float, 60.0))
            if _env("RANK", int, 0) != 0 and "MASTER_ADDR" in os.environ:
                _wait_for_store(os.environ["MASTER_ADDR"], _env("MASTER_PORT", int, 0), timeout.total_seconds())
            dist.init_process_group(backend, timeout=timeout)


def _wait_for_store(host: str, port: int, timeout: float) -> None:
    """Wait until rank 0's TCPStore accepts connections. Ranks start within milliseconds of each
    other after a re-formation, and a TCPStore client refused even once backs off for about 0.6 s:
    polling first makes init_process_group's own connect succeed at once. Gives up silently at
    `timeout` (init_process_group then reports the problem)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(STORE_POLL_S)


def _owned(value: Any, device: torch.device) -> Any:
    """A tensor of its own (not mapped from a snapshot file): on `device`, where load_state_dict
    would move it anyway; a 0-dim one (a step count) stays where it is, as the optimizer keeps it."""
    if not torch.is_tensor(value):
        return value
    return value.clone() if value.dim() == 0 else value.to(device, copy=True)


def _is_peer_failure(exc: BaseException) -> bool:
    """Errors a dead or departed peer causes in gloo collectives (not bugs in the script)."""
    if isinstance(exc, (getattr(dist, "DistBackendError", ()), getattr(dist, "DistNetworkError", ()))):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("gloo", "connection closed", "connection reset", "broken pipe", "timed out")
    )


class _ProgressFile:
    """Step, throughput, loss and the newest checkpoint, for the agent to publish to etcd."""

    def __init__(self, path: Path | None, min_interval: float = 0.5, live: bool = False) -> None:
        self.path, self.min_interval, self.live = path, min_interval, live
        self._last_write = 0.0
        self._window: tuple[float, int] | None = None
        # Two fields, each replaced whole: the checkpoint writer thread sets one, the training loop the other.
        self._latest = protocol.ProgressReport()
        self._checkpoint: protocol.CheckpointReport | None = None

    def report(self, step: int, world_size: int, global_batch: int, loss: float | None) -> None:
        now = time.monotonic()
        if self._window is None:
            self._window = (now, step)
        start, start_step = self._window
        rate = (step - start_step) * global_batch / (now - start) if now > start else 0.0
        if now - start > 5.0:
            self._window = (now, step)
        step_s = round((now - start) / (step - start_step), 4) if step > start_step else 0.0
        self._latest = protocol.ProgressReport(
            step, world_size, round(rate, 2), loss, time.time(), live_recovery=self.live, step_s=step_s
        )
        if now - self._last_write >= self.min_interval:
            self._flush()

    def checkpointed(self, manifest: checkpoint.Manifest, seconds: float) -> None:
        self._checkpoint = protocol.CheckpointReport(
            manifest.step, manifest.path, manifest.bytes, manifest.sha256, manifest.written_at, round(seconds, 4)
        )
        self._flush()

    def _flush(self) -> None:
        if self.path is None:
            return
        self._last_write = time.monotonic()
        protocol.write_progress(self.path, dataclasses.replace(self._latest, checkpoint=self._checkpoint))


def _yielding(write: Callable[[dict[str, Any]], None], state: dict[str, Any]) -> None:
    """Run `write(state)` on this thread at a lower CPU priority (Linux sets a nice value per thread),
    so on a VM whose cores the training keeps busy the background write takes the spare cycles
    instead of stretching steps."""
    with contextlib.suppress(OSError, AttributeError):
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + WRITER_NICE))
    write(state)


class _AsyncWriter:
    """One background write at a time; a new request while one runs is dropped (the next is due soon)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, state: dict[str, Any], write: Callable[[dict[str, Any]], None]) -> None:
        if self.busy():
            return
        self._thread = threading.Thread(target=_yielding, args=(write, state), name="checkpoint-writer", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
