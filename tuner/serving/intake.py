"""How a model gets from a trial's directory into the registry without the registry's writer
(root on one machine, the tuner's ServiceAccount on Kubernetes) ever following the trial.

The trial wrote its ``artifacts/model`` itself, and on Kubernetes the tuner shares that
directory with the trial's pod, so any name in it may be a link to a secret (the tuner's token,
``/proc/self/environ``), a FIFO, or a directory swapped while the copy runs. ``shutil.copytree``
follows links and judges paths it looked at before opening them; this walk does neither:

- below a directory the platform owns (``trusted``), every component is opened with ``openat``
  relative to its parent's descriptor, ``O_NOFOLLOW | O_NONBLOCK``, and the descriptor is
  ``fstat``-ed: a directory must be a directory, a file a regular file;
- a link, FIFO, socket or device anywhere refuses the whole model, with the name, so the sweep's
  reason says what to fix (a model needs none of them);
- the bytes copied are capped (``TUNEHUB_MODEL_MAX_BYTES``) while they are read, so a file that
  grows under the copy cannot outrun the cap;
- the copy, not the source, is then checked to be a SavedModel: ``saved_model.pb`` must parse
  as a ``SavedModel`` protocol buffer holding at least one meta graph whose graph has a node.
  What is checked is what was copied; the trial cannot change it afterwards.

The copy is written through the staging directory's descriptor with ``O_EXCL``, so nothing
planted in the registry is written through either.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from tuner.errors import TunehubError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
#: A SavedModel's graph is parsed whole; TensorFlow itself refuses protos above 2 GiB.
MAX_GRAPH_BYTES = 2**31 - 1
#: Deeper trees or more entries are refused (a SavedModel has a handful of each).
MAX_DEPTH = 32
MAX_ENTRIES = 100_000


class ModelRefused(TunehubError):
    """A trial's model the registry does not take; the message says why, for the sweep."""


def copy_model(source: Path, dest: Path, max_bytes: int, trusted: Path = Path("/")) -> None:
    """Copy the model directory ``source`` to the new directory ``dest`` as the module text
    says, then check it is a SavedModel. ``trusted`` is a directory above ``source`` that only
    the platform can change (its own path is resolved as given); every component below it is
    opened without following links. On refusal ``dest`` may hold part of the copy: the caller
    removes its staging directory."""
    try:
        relative = Path(os.path.abspath(source)).relative_to(os.path.abspath(trusted))
    except ValueError:
        raise ModelRefused(f"{source} is not inside {trusted}") from None
    walk = _Walk(max_bytes)
    src = walk.open_below(trusted, relative.parts)
    try:
        os.mkdir(dest, 0o755)
        out = os.open(dest, _DIR)
        try:
            walk.copy_dir(src, out, "", 0)
        finally:
            os.close(out)
    finally:
        os.close(src)
    check_saved_model(dest / "saved_model.pb")


class _Walk:
    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes
        self.max_bytes = max_bytes
        self.entries = 0

    @staticmethod
    def open_below(top: Path, parts: tuple[str, ...]) -> int:
        fd = os.open(top, _DIR)
        try:
            for i, part in enumerate(parts):
                try:
                    child = os.open(part, _DIR, dir_fd=fd)
                except OSError as exc:
                    raise ModelRefused(
                        f"{'/'.join(parts[:i + 1])} is not a directory (a link?): "
                        f"{exc.strerror}") from None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def copy_dir(self, src: int, dst: int, where: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ModelRefused(f"{where or '.'}: directories nested deeper than {MAX_DEPTH}")
        for name in sorted(os.listdir(src)):
            self.entries += 1
            if self.entries > MAX_ENTRIES:
                raise ModelRefused(f"more than {MAX_ENTRIES} files and directories")
            path = f"{where}{name}"
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                child = self._open(name, src, _DIR, path)
                try:
                    os.mkdir(name, 0o755, dir_fd=dst)
                    out = os.open(name, _DIR, dir_fd=dst)
                    try:
                        self.copy_dir(child, out, f"{path}/", depth + 1)
                    finally:
                        os.close(out)
                finally:
                    os.close(child)
            elif stat.S_ISREG(st.st_mode):
                self.copy_file(name, src, dst, path)
            else:
                raise ModelRefused(f"{path} is {_kind(st.st_mode)}; a model holds only regular "
                                   "files and directories")

    @staticmethod
    def _open(name: str, dir_fd: int, flags: int, path: str) -> int:
        """Open ``name`` and check the descriptor is what the walk expects (the entry may have
        been swapped since it was listed: what counts is what was opened)."""
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            raise ModelRefused(f"{path}: {exc.strerror} (replaced while copying?)") from None
        mode = os.fstat(fd).st_mode
        want_dir = bool(flags & os.O_DIRECTORY)
        if (stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)):
            return fd
        os.close(fd)
        raise ModelRefused(f"{path} is {_kind(mode)}; a model holds only regular files and "
                           "directories")

    def copy_file(self, name: str, src: int, dst: int, path: str) -> None:
        fd = self._open(name, src, _FILE, path)
        try:
            os.set_blocking(fd, True)
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o644, dir_fd=dst)
            try:
                while chunk := os.read(fd, min(_CHUNK, self.left + 1)):
                    if len(chunk) > self.left:
                        raise ModelRefused(f"the model is larger than {self.max_bytes} bytes "
                                           "(TUNEHUB_MODEL_MAX_BYTES)")
                    self.left -= len(chunk)
                    _write_all(out, chunk)
                os.fsync(out)  # on disk before the version's rename makes it visible
            finally:
                os.close(out)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data``: a disk that is nearly full takes part of a write and says so only by
    the count (the next write raises ``ENOSPC``); ignoring the count truncates the file."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a device"


def check_saved_model(pb: Path) -> None:
    """Refuse ``pb`` (a file of the registry's own copy) unless it parses as TensorFlow's
    ``SavedModel`` message with at least one meta graph whose graph has a node. The schema below is
    the part of ``tensorflow/core/protobuf/saved_model.proto`` and ``meta_graph.proto`` that
    says so; importing TensorFlow in the tuner for it would cost seconds and gigabytes."""
    try:
        fd = os.open(pb, _FILE)
    except OSError:
        raise ModelRefused("no saved_model.pb: not a SavedModel (tuner.save_model writes "
                           "one)") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_GRAPH_BYTES + 1)
    if len(data) > MAX_GRAPH_BYTES:
        raise ModelRefused("saved_model.pb is larger than a protocol buffer may be")
    saved = _saved_model_class()()
    try:
        saved.ParseFromString(data)
    except message.DecodeError as exc:
        raise ModelRefused(f"saved_model.pb is not a SavedModel: {exc}") from None
    if not any(len(g.graph_def.node) for g in saved.meta_graphs):
        raise ModelRefused(f"saved_model.pb ({len(data)} bytes) is not a SavedModel: it holds "
                           "no meta graph with a graph")


_SCHEMA: list[type[message.Message]] = []


def _saved_model_class() -> type[message.Message]:
    """``SavedModel`` as a message class, built once from the schema's fields that the check
    reads (the others are kept as unknown fields, which still have to be well formed)."""
    if _SCHEMA:
        return _SCHEMA[0]
    proto = descriptor_pb2.FileDescriptorProto(
        name="tunehub/saved_model_check.proto", package="tunehub.check", syntax="proto2")
    field = descriptor_pb2.FieldDescriptorProto
    optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    for inner in ("MetaInfoDef", "SaverDef", "NodeDef"):  # their fields: unknown, well formed
        proto.message_type.add(name=inner)
    proto.message_type.add(name="GraphDef").field.add(
        name="node", number=1, type=field.TYPE_MESSAGE, label=field.LABEL_REPEATED,
        type_name=".tunehub.check.NodeDef")
    meta = proto.message_type.add(name="MetaGraphDef")
    for number, name, kind in ((1, "meta_info_def", "MetaInfoDef"), (2, "graph_def", "GraphDef"),
                               (3, "saver_def", "SaverDef")):
        meta.field.add(name=name, number=number, type=field.TYPE_MESSAGE, label=optional,
                       type_name=f".tunehub.check.{kind}")
    saved = proto.message_type.add(name="SavedModel")
    saved.field.add(name="saved_model_schema_version", number=1, type=field.TYPE_INT64,
                    label=optional)
    saved.field.add(name="meta_graphs", number=2, type=field.TYPE_MESSAGE, label=repeated,
                    type_name=".tunehub.check.MetaGraphDef")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("tunehub.check.SavedModel"))
    _SCHEMA.append(cls)
    return cls
