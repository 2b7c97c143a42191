"""A Kubernetes cluster to test against, on one machine: an API server emulator over real HTTP
plus a scheduler/kubelet stand-in that runs pods' commands as local processes, and a Job
controller. No mocks: clients (kubernetes-asyncio, KubeSpawner, kubectl) talk HTTP to it.

Fixture API (stable; ``pytest_plugins = ["kubesim.fixtures"]`` or import the fixtures)::

    def test_something(kube):            # function-scoped, a fresh cluster per test
        kube.url                         # "http://127.0.0.1:PORT" (plain HTTP, bearer tokens)
        kube.kubeconfig                  # Path of a cluster-admin kubeconfig (namespace tunehub)
        kube.service_account_kubeconfig("sa")   # ... authenticating as ServiceAccount "sa"
        kube.apply([role, binding])      # kube.create each (RBAC objects, quotas, ...)
        kube.label_namespace({"pod-security.kubernetes.io/enforce": "restricted"})
        kube.exercised("sa"), kube.granted("sa")   # {(group, resource, verb)} used / granted
        kube.namespace                   # "tunehub" (exists, with ServiceAccount "default")
        kube.data_dir                    # local dir backing PVC "tunehub-data" (PVC exists)
        kube.map_claim("tunehub-data", path)   # back a claim by another local dir
        kube.counters                    # kubesim.store.Counters (see below)
        kube.objects("pods", label_selector="job-name=x")   # snapshot list of dicts
        kube.objects("jobs")             # group/version found from the plural when unique
        kube.objects("priorityclasses", None)   # namespace None: all / cluster-scoped
        kube.get("jobs", "name")         # one object or None
        kube.pod_log("pod-name")         # captured stdout+stderr of the (first) container
        kube.pids()                      # {pod: {container: pid}} of live processes
        kube.compact()                   # drop watch history: old resourceVersions -> 410
        kube.faults.inject(503, verb="create", resource="jobs", times=2)  # kubesim.faults
        kube.nodes                       # the FakeNode list (override fixture kube_nodes)
        kube.create(obj)                 # create via the API as the harness (not counted as
                                         # client): PriorityClasses, Kueue queues, Secrets...
        kube.runtime.missing_images.add("img:tag")   # pulls fail: ErrImagePull/BackOff
        kube.runtime.enforce_memory_limits = False   # default True: RSS > limit -> OOMKilled
        kube.runtime.run_as_users = True   # as root: containers run as runAsUser (+fsGroup)

Default nodes (``kubesim.cluster.default_nodes``): ``gpu-a100-0`` (2 x
``NVIDIA-A100-SXM4-80GB``), ``gpu-t4-0`` (4 x ``Tesla-T4``), ``cpu-0``; GPU nodes carry
``nvidia.com/gpu.product`` / ``nvidia.com/gpu.count`` labels and ``nvidia.com/gpu`` capacity.
Override with ``@pytest.fixture def kube_nodes(): return [FakeNode(..., taints=[...])]``.

Counters: every request is counted per (client, verb, resource), verbs get/list/watch/create/
update/patch/delete/deletecollection, resource e.g. ``jobs``, ``pods/status``. Requests of
this harness (User-Agent ``tunehub-kube-harness/...``) are counted as client ``harness``,
everything else as ``client``: ``kube.counters.writes()`` / ``.reads()`` /
``.snapshot()`` -> ``{(verb, resource): n}``, ``.reset()``; over HTTP
``GET /_emulator/counters`` (``{client: {resource: {verb: n}}}``), ``DELETE`` resets.

What the emulator does like a real API server: discovery, CRUD for core/v1 (namespaces,
nodes, pods, services, endpoints, secrets, configmaps, events, persistentvolumeclaims,
serviceaccounts, resourcequotas, limitranges), batch/v1 jobs, scheduling.k8s.io/v1
priorityclasses, networking.k8s.io/v1 networkpolicies, rbac.authorization.k8s.io/v1 roles,
rolebindings, clusterroles, clusterrolebindings, kueue.x-k8s.io/v1beta2
localqueues/clusterqueues/resourceflavors/workloads;
``/status``, ``pods/log``, ``pods/binding``; label selectors (=, ==, !=, in, notin, key, !key)
and field selectors (any dotted path, = and !=); list + watch with resourceVersion (replay,
410 Gone after compaction, ``timeoutSeconds``); merge, strategic-merge (applied as merge)
and JSON patch; 409 AlreadyExists / Conflict (stale resourceVersion); ``dryRun``;
generateName, uid, creationTimestamp, generation; defaulting (pod spec, Job selector and
labels, limits -> requests); admission (namespace must exist, service account must exist,
``priorityClassName`` must exist -> 403, resolves ``spec.priority``; LimitRange, Pod Security,
ResourceQuota); every stored object is
validated against the Kubernetes 1.36 OpenAPI schema (kubernetes-validate, strict: unknown
fields rejected) plus semantic checks (names, labels, requests <= limits, extended resources
integer with requests == limits, Job restartPolicy) -> 422 ``Status`` reason Invalid.
Deletion: propagationPolicy Background deletes dependents via ownerReferences after the
owner, Foreground first (the owner stays with deletionTimestamp and the foregroundDeletion
finalizer until they are gone), Orphan strips the references; without a policy Jobs orphan
their pods (the real batch/v1 default). Running pods terminate gracefully: DELETE sets
``deletionTimestamp`` (MODIFIED event), the kubelet SIGTERMs the processes, SIGKILLs after
min(grace, 3 s), then removes the pod (DELETED); ``gracePeriodSeconds=0`` removes at once.

Kubelet/scheduler: the scheduler works from the Node objects in the API (so tests may taint
or cordon nodes with a patch) and binds pending pods by priority (then age) honoring
``spec.unschedulable``, nodeSelector, required
and preferred node affinity, taints/tolerations and requests vs free capacity; preempts
lower-priority pods (DisruptionTarget condition, then delete) when that makes room;
unschedulable pods get PodScheduled=False/Unschedulable with the scheduler's message
("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.") and one FailedScheduling Event
per distinct message. Bound pods run: see :mod:`kubesim.runner` for env, restart policies
and logs, and :mod:`kubesim.volumes` for volumes (a claim is visible only when mounted at
exactly its mapped local directory, otherwise the pod fails with reason FailedMount and a
message saying where to mount it; secret/configMap/downwardAPI/projected/emptyDir volumes are
written at their mountPath for the pod's lifetime, refused over an existing path).

Updates follow the real rules (:mod:`kubesim.immutability`): a pod's spec is immutable
except image/tolerations/activeDeadlineSeconds; a Job's selector, completionMode, completions
and template are immutable, except scheduling directives (nodeSelector, tolerations, affinity,
labels, annotations) of a suspended Job that never started.

Job controller: NonIndexed and Indexed (JOB_COMPLETION_INDEX env, index annotation/label,
hostname), parallelism/completions, suspend, backoffLimit (OnFailure restarts count),
podFailurePolicy (Ignore / FailJob / Count on exit codes and pod conditions, e.g. ignore
DisruptionTarget so preemption is not a failure), activeDeadlineSeconds,
ttlSecondsAfterFinished, FailedCreate events (e.g. missing PriorityClass), conditions
SuccessCriteriaMet/Complete and FailureTarget/Failed with reasons BackoffLimitExceeded /
DeadlineExceeded / PodFailurePolicy. Pods deleted by others while running (preemption) count
as failed unless a policy ignores them. Kueue stand-in (:mod:`kubesim.kueue`): once any
ClusterQueue exists, Jobs labelled ``kueue.x-k8s.io/queue-name`` are created suspended and
plain pods so labelled (notebooks) get Kueue's ``kueue.x-k8s.io/admission`` scheduling gate;
both are admitted by quota (Workload objects with QuotaReserved/Admitted conditions and
Kueue's pending message), ordered by WorkloadPriorityClass (``kueue.x-k8s.io/priority-class``)
or PriorityClass value, and evicted for higher priorities (Evicted condition; the Job
suspended, the pod deleted). Kueue's visibility API
(``/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/NS/localqueues/LQ/pendingworkloads``,
:mod:`kubesim.kueue_visibility`) gives pending workloads with their positions.

Standalone: ``python -m kubesim --data DIR`` prints one JSON line (url, kubeconfig,
namespace, data, counters URL) and serves until SIGINT/SIGTERM.

Pods run as the test's own user (root on these machines): ``runAsUser`` / ``fsGroup`` are
not applied, so a Jupyter server in a "pod" needs ``--allow-root`` (see the JupyterHub test
in kubesim/tests/test_kube_harness.py for a working KubeSpawner configuration).

Pod network (:mod:`kubesim.podnet`): each pod has its own loopback address
(``status.podIP``) and host ports for its container ports; ``<hostname>.<subdomain>``
names resolve only inside ``TF_CONFIG`` (a ``sitecustomize`` on the pods' ``PYTHONPATH``).

Authentication and RBAC (:mod:`kubesim.rbac`), Pod Security Admission
(:mod:`kubesim.podsecurity`), LimitRange and ResourceQuota (:mod:`kubesim.quota`) refuse
what a real API server refuses, with its messages; each module lists what it leaves out.

Not emulated: user-set finalizers (only foregroundDeletion), cluster
DNS for other clients (Service names do not resolve), per-pod network namespaces (pods share
the host's ports; only ``TF_CONFIG``'s are remapped), runAsUser / read-only mounts (admission
checks the securityContext, the processes run as the test's user), images
(``command``+``args``, or ``args`` alone, run locally),
server-side apply (415), pagination (``limit`` ignored: lists are complete), watch
bookmarks, Kueue cohorts/borrowing/fair sharing.
"""

from .cluster import DATA_CLAIM, KubeCluster, default_nodes
from .nodes import FakeNode

__all__ = ["DATA_CLAIM", "FakeNode", "KubeCluster", "default_nodes"]
