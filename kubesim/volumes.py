"""Pod volumes for locally run containers. Processes see the host filesystem, so a volume is
visible only at a real path: a PersistentVolumeClaim at exactly the local directory the test
mapped it to, a hostPath at its own path, and emptyDir / secret / configMap / downwardAPI /
projected volumes are created at their mountPath for the pod's lifetime (refused if that path
already exists and belongs to something else, so pods never clobber each other or the host)."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from .objects import JSON

#: mountPath -> uid of the pod that created it (process-wide: paths are shared).
_OWNED: dict[Path, str] = {}

Fetch = Callable[[str, JSON], Awaitable[JSON | str | None]]
FieldGetter = Callable[[str], str]


class PodConfigError(Exception):
    """The pod cannot start (bad mount, missing command...): the pod fails with this reason."""

    def __init__(self, reason: str, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry = reason, message, retry


def _mount_error(name: str, message: str) -> PodConfigError:
    return PodConfigError("FailedMount", f'volume "{name}": {message}')


class Mounter:
    """Resolves and materialises one pod's volume mounts; :meth:`cleanup` removes them."""

    def __init__(self, pod: JSON, claims: dict[str, Path], fetch: Fetch,
                 field: FieldGetter) -> None:
        self.pod, self.claims, self.fetch, self.field = pod, claims, fetch, field
        self.uid = pod["metadata"]["uid"]
        self.created: list[Path] = []

    async def mount(self, container: JSON) -> None:
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        for m in container.get("volumeMounts") or []:
            vol, target = volumes[m["name"]], Path(m["mountPath"])
            if "persistentVolumeClaim" in vol:
                self._claim(m, vol, target)
            elif "hostPath" in vol:
                host = Path(vol["hostPath"]["path"]) / m.get("subPath", "")
                if target.resolve() != host.resolve():
                    raise _mount_error(m["name"], f"hostPath {host} is mounted at {target}; "
                                       "the kube harness can only expose it at its own path")
            elif "emptyDir" in vol:
                if not target.is_dir() or _OWNED.get(target, self.uid) != self.uid:
                    self._claim_path(m["name"], target)
                    target.mkdir(parents=True, exist_ok=True)
            else:
                files = await self._files(m["name"], vol)
                if m.get("subPath"):
                    if m["subPath"] not in files:
                        raise _mount_error(m["name"], f"subPath {m['subPath']} not in volume")
                    files = {"": files[m["subPath"]]}
                self._claim_path(m["name"], target)
                for rel, data in files.items():
                    path = target / rel if rel else target
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)

    def _claim(self, m: JSON, vol: JSON, target: Path) -> None:
        claim = vol["persistentVolumeClaim"]["claimName"]
        if claim not in self.claims:
            raise _mount_error(m["name"], f'claim "{claim}" is not mapped to a local directory '
                                          "in the kube harness (kube.map_claim)")
        local = self.claims[claim] / m.get("subPath", "")
        if target.resolve() != local.resolve():
            raise _mount_error(m["name"], f'claim "{claim}" -> {local} is mounted at {target}, '
                                          "but the kube harness can only expose a claim at its "
                                          f"local path: mount it at {local}")
        local.mkdir(parents=True, exist_ok=True)

    def _claim_path(self, name: str, target: Path) -> None:
        owner = _OWNED.get(target)
        if owner == self.uid:
            return
        if owner is not None or target.exists():
            raise _mount_error(name, f"mountPath {target} already exists on this machine; the "
                                     "kube harness creates volumes at their mountPath, so use "
                                     "a path that does not exist yet")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _mount_error(name, f"cannot create {target}: {exc}") from None
        _OWNED[target] = self.uid
        self.created.append(target)

    async def _files(self, name: str, vol: JSON) -> dict[str, bytes]:
        if "projected" in vol:
            out: dict[str, bytes] = {}
            for src in vol["projected"].get("sources") or []:
                for kind in ("secret", "configMap", "downwardAPI"):
                    if kind in src:
                        out.update(await self._source(name, kind, src[kind]))
                if "serviceAccountToken" in src:
                    out[src["serviceAccountToken"]["path"]] = b"emulator-token"
            return out
        for kind in ("secret", "configMap", "downwardAPI"):
            if kind in vol:
                return await self._source(name, kind, vol[kind])
        raise _mount_error(name, f"volume type {sorted(set(vol) - {'name'})} is not supported "
                                 "by the kube harness")

    async def _source(self, name: str, kind: str, src: JSON) -> dict[str, bytes]:
        if kind == "downwardAPI":
            return {i["path"]: self.field(i["fieldRef"]["fieldPath"]).encode()
                    for i in src.get("items") or [] if "fieldRef" in i}
        ref = {"name": src.get("secretName") or src.get("name"), "key": None,
               "optional": src.get("optional")}
        obj = await self.fetch("secret" if kind == "secret" else "configmap", ref)
        if not isinstance(obj, dict):
            return {}
        data: dict[str, bytes] = {}
        for k, v in (obj.get("data") or {}).items():
            data[k] = base64.b64decode(v) if kind == "secret" else str(v).encode()
        for k, v in (obj.get("binaryData") or {}).items():
            data[k] = base64.b64decode(v)
        items = src.get("items")
        if items:
            missing = [i["key"] for i in items if i["key"] not in data]
            if missing and not src.get("optional"):
                raise PodConfigError("CreateContainerConfigError",
                                     f'volume "{name}": keys {missing} not found in {kind} '
                                     f'"{ref["name"]}"', retry=True)
            return {i["path"]: data[i["key"]] for i in items if i["key"] in data}
        return data

    def cleanup(self) -> None:
        for path in self.created:
            if _OWNED.get(path) == self.uid:
                del _OWNED[path]
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        self.created.clear()
