"""What a function shipped from a notebook imports, read from its pickle without running it.

A function sweep's trials run ``python -m tuner.sdk.run_function objective.pkl``: the entry file's
import graph (:mod:`tuner.backends.local.imports`) holds nothing of the person's, so without this a
Keras function always started cold. The pickle names the modules in three places:

- **by reference**: a class or function of an installed module (``keras.layers.Dense``, a
  function imported from a package) is a ``GLOBAL``/``STACK_GLOBAL`` opcode; loading the pickle
  imports the module;
- **globals of the function**: a module the function uses (``np`` after ``import numpy as np``
  in the notebook) is stored by cloudpickle as a call ``subimport("numpy")``, also run at load;
- **imports in the function's body** (``import tensorflow as tf`` inside it): the
  ``IMPORT_NAME`` instructions of the code objects cloudpickle stores by value, run each time
  the function runs.

Why an unpickler and not a scan of the opcodes: the second kind, the usual one, is a string
argument of a call, reached through the pickle's memo; the third is inside a code object's
bytes. The unpickler resolves every global to an inert stand-in (:class:`_Inert`), except the
two it records from (``subimport`` and ``CodeType``, whose arguments it reads as data), so
nothing the pickle names is imported, called or built: no code object is even created.

Not found: modules imported by a name computed at run time (``importlib.import_module(x)``),
modules imported lazily inside installed functions the function calls (their bodies are not in
the pickle), and relative imports inside the function (their level is not read).
"""

from __future__ import annotations

import dis
import hashlib
import io
import pickle
from pathlib import Path
from typing import Any

from tuner.backends.local.owned_files import read_owned

# A bigger pickle (data captured in the function's closure) is not read: no modules found.
MAX_BYTES = 64 * 2**20
# Modules every pickle of a function names: the machinery that rebuilds it, not the person's.
MACHINERY = frozenset({"builtins", "copyreg", "cloudpickle", "_codecs", "types", "__main__"})
_SUBIMPORT = {("cloudpickle.cloudpickle", "subimport"), ("cloudpickle.cloudpickle_fast",
                                                        "subimport")}
_BUILTIN_TYPE = {("cloudpickle.cloudpickle", "_builtin_type"),
                 ("cloudpickle.cloudpickle_fast", "_builtin_type")}
# CodeType(argcount, posonlyargcount, kwonlyargcount, nlocals, stacksize, flags, code, consts,
# names, ...) on every Python cloudpickle supports (3.8 on).
_CODE, _NAMES = 6, 8


class _Inert:
    """Whatever the pickle names: takes every call and every operation the unpickler makes
    (``REDUCE``, ``NEWOBJ``, ``BUILD``, ``APPENDS``, ``SETITEMS``, ``ADDITEMS``) and does
    nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def add(self, item: Any) -> None:
        pass


class _Reader(pickle.Unpickler):
    """Loads a pickle into inert stand-ins, noting the modules it would import."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.modules: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.modules.add(module)
        if (module, name) in _SUBIMPORT:
            return self._subimport
        if (module, name) in _BUILTIN_TYPE:
            return lambda type_name: self._code if type_name == "CodeType" else _Inert
        if (module, name) == ("types", "CodeType"):
            return self._code
        return _Inert

    def persistent_load(self, pid: Any) -> _Inert:
        return _Inert()

    def _subimport(self, name: Any) -> _Inert:
        if isinstance(name, str):
            self.modules.add(name)
        return _Inert()

    def _code(self, *args: Any) -> _Inert:
        if len(args) > _NAMES and isinstance(args[_CODE], bytes):
            names = args[_NAMES]
            if isinstance(names, tuple):
                self.modules.update(_imported_names(args[_CODE], names))
        return _Inert()


def _imported_names(code: bytes, names: tuple[Any, ...]) -> list[str]:
    """The module names of the ``IMPORT_NAME`` instructions in ``code`` (this Python's
    bytecode: two bytes per instruction, ``EXTENDED_ARG`` widening the next argument)."""
    found: list[str] = []
    extended = 0
    for i in range(0, len(code) - 1, 2):
        op, arg = code[i], code[i + 1] | extended
        extended = arg << 8 if op == dis.EXTENDED_ARG else 0
        if op == dis.opmap["IMPORT_NAME"] and arg < len(names) and isinstance(names[arg], str):
            found.append(names[arg])
    return found


def pickled_imports(path: Path, owner_uid: int | None = None) -> frozenset[str]:
    """Top-level names of the modules the pickled function at ``path`` imports (see the
    module text), without the pickling machinery; empty when the file cannot be read. The
    trial's directory links the file from the sweep's snapshot: the link is followed, but
    only to a regular file of the snapshot's owner ``owner_uid``
    (:func:`tuner.backends.local.owned_files.read_owned`)."""
    data = read_owned(path, owner_uid, MAX_BYTES)
    if data is None:
        return frozenset()
    key = hashlib.sha256(data).digest()
    if key not in _SEEN:
        if len(_SEEN) >= 64:
            _SEEN.clear()
        _SEEN[key] = _read(data)
    return _SEEN[key]


# What each pickle read so far imports, by its SHA-256: every trial of a sweep has the same
# pickle, and its start note asks again for what its launch just read.
_SEEN: dict[bytes, frozenset[str]] = {}


def _read(data: bytes) -> frozenset[str]:
    reader = _Reader(io.BytesIO(data))
    try:
        reader.load()
    except Exception:  # a damaged or unusual pickle: the modules seen so far count
        pass
    tops = {name.split(".")[0] for name in reader.modules if name}
    return frozenset(tops - MACHINERY)
