"""The run's files, wherever the actor that reads or writes them runs.

The driver's node holds the run folder (``logging.out_dir`` or ``eval.out_dir`` under
``storage.root``: a local folder, or a filesystem every node mounts) and the inputs it names
(the model, a replay file). An actor on another node reads them (a stage's export, the
checkpoint it resumes, the model) and writes them (checkpoints, exports) through ``RunStorage``:
in place where its node sees the file, otherwise through a ``StorageServer`` on the driver's
node, in object-store chunks, keeping a copy under ``storage.node_dir`` on its own node.

Whether a node sees the run folder is decided by a probe file the driver writes there with a
fresh token, never by the path's existing: another node may well have a folder of that name,
with other contents. An input outside the run folder (the model) is used in place where the
node has the same files (names and sizes), and copied otherwise.

A run on one node never starts the server: every actor sees every path. On several nodes the
driver starts it, pinned to its own node, and holds it for the run (an actor outlives its last
handle only); a node that joins later starts one there itself if the driver's is gone.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ray

PROBE = ".cuda-agent-storage-probe"
IN_FLIGHT = 4  # chunks in the object store at once per transfer: bounded memory, overlapped copies


class StorageError(RuntimeError):
    """A node cannot reach the run's files; the message names the node, the path and the setting to change."""


@ray.remote(num_cpus=0, max_concurrency=8)
class StorageServer:
    """Serves the files under ``roots`` on the driver's node to the nodes that do not see them."""

    def __init__(self, roots: list[str]):
        self.roots = [Path(r) for r in roots]

    def _checked(self, path: str) -> Path:
        p = Path(path)
        if not any(p == r or r in p.parents for r in self.roots):
            raise StorageError(f"{path} is outside the run's folder and inputs ({', '.join(map(str, self.roots))})")
        return p

    def manifest(self, path: str) -> dict[str, list[int]] | None:
        """{relative name: [size, mtime_ns]} of a folder's files ("" for a file itself); None if absent."""
        return manifest(self._checked(path))

    def read(self, path: str, offset: int, size: int) -> bytes:
        with open(self._checked(path), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def write(self, path: str, token: str, offset: int, data: bytes) -> None:
        part = _part(self._checked(path), token)
        part.parent.mkdir(parents=True, exist_ok=True)
        write_at(part, offset, data)

    def commit(self, path: str, token: str) -> None:
        """The upload ``token`` of ``path`` is whole: it replaces the file at once (a reader never sees half)."""
        target = self._checked(path)
        part = _part(target, token)
        if not part.exists():  # an empty file sends no chunk
            target.parent.mkdir(parents=True, exist_ok=True)
            part.touch()
        os.replace(part, target)

    def remove(self, path: str) -> None:
        _remove(self._checked(path))


def write_at(part: Path, offset: int, data: bytes) -> None:
    """``data`` at ``offset`` of ``part``, made if absent and never truncated: an upload's chunks
    arrive on the server's threads in any order, and a chunk that opened the file "wb" after
    another had written wiped it (CI read a shard back with its first megabyte zeroed)."""
    fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    finally:
        os.close(fd)


def manifest(path: Path) -> dict[str, list[int]] | None:
    if path.is_file():
        st = path.stat()
        return {"": [st.st_size, st.st_mtime_ns]}
    if not path.is_dir():
        return None
    files = {}
    for f in sorted(path.rglob("*")):
        if f.is_file() and ".part-" not in f.name:
            st = f.stat()
            files[f.relative_to(path).as_posix()] = [st.st_size, st.st_mtime_ns]
    return files


def _part(target: Path, token: str) -> Path:
    return target.with_name(f"{target.name}.part-{token}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def node_id() -> str:
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"


@dataclass
class RunStorage:
    """How this process reaches the run folder and the inputs; built by the driver, sent to every actor."""

    run_dir: str = ""  # the run folder on the driver's node (absolute); "": none (a run on one node)
    inputs: list[str] = field(default_factory=list)  # other folders or files on the driver's node that actors read (the model, a replay file)
    mode: str = "auto"  # storage.mode
    node_dir: str = "~/.cache/cuda-agent/storage"  # storage.node_dir
    chunk_bytes: int = 64 * 2**20  # storage.chunk_mb
    driver_node: str = "local"
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    server: Any = None  # the StorageServer's handle, when the driver started one
    _seen: dict[str, bool] = field(default_factory=dict, repr=False)  # per process: path -> used in place

    # ----------------------------------------------------------------- the driver's side

    @classmethod
    def for_run(cls, storage_cfg: Any, run_dir: str | Path, inputs: list[str | Path] = ()) -> "RunStorage":
        """The run's storage, its probe written; with storage.mode=shared every node must see it now."""
        run = Path(run_dir).expanduser().resolve()
        run.mkdir(parents=True, exist_ok=True)
        local_inputs = [str(Path(p).expanduser().resolve()) for p in inputs if p and Path(p).expanduser().exists()]
        storage = cls(str(run), local_inputs, str(storage_cfg.mode),
                      str(storage_cfg.node_dir), int(storage_cfg.chunk_mb) * 2**20, node_id())
        if storage.chunk_bytes <= 0:
            raise StorageError(f"storage.chunk_mb must be positive, got {storage_cfg.chunk_mb}")
        storage.probe_path.write_text(storage.token)
        if storage.mode == "shared":
            storage.check_every_node_sees_it()
        if ray.is_initialized() and sum(1 for n in ray.nodes() if n.get("Alive")) > 1:
            storage.server = storage._server()
        return storage

    @property
    def probe_path(self) -> Path:
        return Path(self.run_dir) / f"{PROBE}-{self.token}"

    def check_every_node_sees_it(self) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        seen = ray.get([_sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                        .remote(str(self.probe_path), self.token) for n in nodes])
        blind = [f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})" for n, ok in zip(nodes, seen) if not ok]
        if blind:
            raise StorageError(f"storage.mode=shared, but node(s) {', '.join(blind)} do not see the run folder "
                               f"{self.run_dir}: mount it there at the same path, or set storage.mode=auto to send "
                               "files through the object store")

    def close(self) -> None:
        self.probe_path.unlink(missing_ok=True)
        if self.server is not None:
            ray.kill(self.server)
            self.server = None

    # ----------------------------------------------------------------- any process

    def place(self, path: str | Path) -> Path:
        """Where this node keeps ``path``: the path itself where it sees it, else its copy's path."""
        path = Path(path)
        return path if self._in_place(path) else self._copy_of(path)

    def fetch(self, path: str | Path, missing_ok: bool = False) -> Path:
        """A readable ``path`` on this node (a copy, brought up to date, where it does not see it)."""
        path = Path(path)
        if self._in_place(path):
            return path
        copy = self._copy_of(path)
        with self._locked(copy):
            remote = ray.get(self._server().manifest.remote(str(path)))
            if remote is None:
                if not missing_ok:
                    raise StorageError(f"{path} is not on the driver's node ({self.driver_node[:8]})")
                _remove(copy)
                return copy
            self._download(path, copy, remote)
        return copy

    def publish(self, path: str | Path) -> None:
        """Send what this node wrote at ``place(path)`` (a file, or every file of a folder) to the run folder."""
        path = Path(path)
        if self._in_place(path):
            return
        copy = self._copy_of(path)
        files = [("", copy)] if copy.is_file() else [(f.relative_to(copy).as_posix(), f)
                                                      for f in sorted(copy.rglob("*")) if f.is_file()]
        for rel, f in files:
            self._upload(f, path / rel if rel else path)
        # What the driver's node holds now: a fetch on this node then finds its copy up to date.
        self._record(copy, ray.get(self._server().manifest.remote(str(path))) or {})

    def remove(self, path: str | Path) -> None:
        """Delete ``path`` from the run folder and this node's copy of it."""
        path = Path(path)
        if self._in_place(path):
            _remove(path)
            return
        ray.get(self._server().remove.remote(str(path)))
        _remove(self._copy_of(path))
        _remove(self._record_path(self._copy_of(path)))

    # ----------------------------------------------------------------- helpers

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_seen": {}}  # decisions are this process's: another node decides anew

    def _in_place(self, path: Path) -> bool:
        key = str(path)
        if key not in self._seen:
            self._seen[key] = self._decide(path)
        return self._seen[key]

    def _decide(self, path: Path) -> bool:
        if node_id() == self.driver_node:
            return True
        root = self._root_of(path)
        if root is None:  # not ours to serve: a path the config promises on every node
            return True
        if self.mode == "object_store":
            return False
        if root == self.run_dir:
            return _probe_matches(self.probe_path, self.token)
        local = manifest(Path(root))
        remote = ray.get(self._server().manifest.remote(root))
        return local is not None and remote is not None and _shape(local) == _shape(remote)

    def _root_of(self, path: Path) -> str | None:
        for root in [r for r in (self.run_dir, *self.inputs) if r]:
            r = Path(root)
            if path == r or r in path.parents:
                return root
        return None

    def _copy_of(self, path: Path) -> Path:
        return Path(self.node_dir).expanduser() / node_id()[:12] / str(path).lstrip("/")

    def _server(self) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self.server is not None:
            return self.server
        # Named and pinned to the driver's node: whoever asks first starts it there, and holds it.
        self.server = StorageServer.options(
            name=f"cuda-agent-storage-{self.token[:12]}", get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.driver_node, soft=False),
        ).remote([r for r in (self.run_dir, *self.inputs) if r])
        return self.server

    def _beside(self, copy: Path, kind: str) -> Path:
        """A file about ``copy`` kept apart from the copies (a lock, or the manifest it was fetched at)."""
        path = Path(self.node_dir).expanduser() / node_id()[:12] / f".{kind}" / str(copy).replace("/", "%")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    @contextmanager
    def _locked(self, copy: Path) -> Iterator[None]:
        """One fetch of a path at a time per node (the learner's ranks on one node share its copies)."""
        with open(self._beside(copy, "locks"), "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _record_path(self, copy: Path) -> Path:
        return self._beside(copy, "fetched")

    def _record(self, copy: Path, files: dict[str, list[int]]) -> None:
        self._record_path(copy).write_text(json.dumps(files))

    def _download(self, path: Path, copy: Path, remote: dict[str, list[int]]) -> None:
        """Bring ``copy`` to the driver's ``remote`` manifest: changed files fetched, gone ones deleted."""
        record = self._record_path(copy)
        had = json.loads(record.read_text()) if record.exists() else {}
        if "" in remote and copy.is_dir():
            _remove(copy)
        for rel, (size, mtime) in remote.items():
            target = copy / rel if rel else copy
            if had.get(rel) == [size, mtime] and target.is_file() and target.stat().st_size == size:
                continue
            self._download_file(path / rel if rel else path, target, size)
        if "" not in remote and copy.is_dir():
            for f in [f for f in copy.rglob("*") if f.is_file()]:
                if f.relative_to(copy).as_posix() not in remote:
                    f.unlink()
        self._record(copy, remote)

    def _download_file(self, source: Path, target: Path, size: int) -> None:
        server = self._server()
        target.parent.mkdir(parents=True, exist_ok=True)
        part = _part(target, uuid.uuid4().hex)
        offsets = list(range(0, size, self.chunk_bytes))
        with open(part, "wb") as f:
            pending = [server.read.remote(str(source), o, self.chunk_bytes) for o in offsets[:IN_FLIGHT]]
            for i in range(len(offsets)):
                chunk = ray.get(pending.pop(0))
                if i + IN_FLIGHT < len(offsets):
                    pending.append(server.read.remote(str(source), offsets[i + IN_FLIGHT], self.chunk_bytes))
                f.write(chunk)
        if part.stat().st_size != size:
            part.unlink()
            raise StorageError(f"{source} changed on the driver's node while it was copied; fetch it again")
        os.replace(part, target)

    def _upload(self, local: Path, path: Path) -> None:
        server, token = self._server(), uuid.uuid4().hex
        pending = []
        with open(local, "rb") as f:
            offset = 0
            while chunk := f.read(self.chunk_bytes):
                pending.append(server.write.remote(str(path), token, offset, chunk))
                offset += len(chunk)
                if len(pending) >= IN_FLIGHT:
                    ray.get(pending.pop(0))
        ray.get(pending)
        ray.get(server.commit.remote(str(path), token))


def absolute_spec(spec: str) -> str:
    """A policy spec (vllm:DIR, replay:FILE) with its path made absolute where it names one here,
    so that actors on other nodes ask the driver's node for that path."""
    kind, _, path = spec.partition(":")
    if kind in ("vllm", "replay") and path and Path(path).expanduser().exists():
        return f"{kind}:{Path(path).expanduser().resolve()}"
    return spec


def _probe_matches(probe: Path, token: str) -> bool:
    try:
        return probe.read_text() == token
    except OSError:
        return False


@ray.remote(num_cpus=0)
def _sees(probe: str, token: str) -> bool:
    return _probe_matches(Path(probe), token)


def _shape(files: dict[str, list[int]]) -> dict[str, int]:
    """Names and sizes: the same model on two disks has other mtimes."""
    return {rel: size for rel, (size, _) in files.items()}
