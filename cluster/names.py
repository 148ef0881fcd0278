"""Every annotation, label, gate, finalizer, condition, event reason and metric name phalanx uses.

One place, so a rename is one edit and a grep finds every use. Upstream names are spelled exactly
as upstream spells them (see the Workload-Aware Scheduling API, scheduling.k8s.io/v1beta1).
"""

# -- API groups and versions ------------------------------------------------------------------------
SCHEDULING_GROUP = "scheduling.k8s.io"  # built-in Workload/PodGroup (Kubernetes 1.37+, GenericWorkload)
CRD_GROUP = "scheduling.phalanx.dev"  # CRD fallback with the same v1beta1 schema
SCHEDULING_VERSION = "v1beta1"
COMPOSITE_VERSION = "v1alpha3"  # CompositePodGroup is served only here in 1.37 (gate CompositePodGroup)
RESOURCE_API_VERSION = "resource.k8s.io/v1"  # DRA ResourceClaims and ResourceClaimTemplates (GA since 1.34)

# -- phalanx's own names ----------------------------------------------------------------------------
ANNOTATION_SCHEDULING = "scheduling.phalanx.dev/scheduling"  # StatefulSet: scheduling config as JSON
LABEL_POD_GROUP = "scheduling.phalanx.dev/pod-group"  # pod -> PodGroup, CRD flavor
GATE_PODGROUP_SYNC = "scheduling.phalanx.dev/podgroup-sync"  # pod scheduling gate while minCount syncs
#: PodGroup: the write-ahead pod->node record where it is too long for the CONDITION_PLACEMENT
#: condition's message or kube-scheduler writes the group's status (and where earlier versions
#: wrote every record; still read)
ANNOTATION_PLACEMENT = "scheduling.phalanx.dev/placement"
ANNOTATION_PREFERRED_TOPOLOGY = "scheduling.phalanx.dev/preferred-topology"  # ordered keys, comma-separated
# PodGroup: what members without soft rules of their own get, "pack" (default) or "spread"
ANNOTATION_PLACEMENT_PREFERENCE = "scheduling.phalanx.dev/placement-preference"
#: PodGroup: how long the group runs once bound ("90m", "2h30m", "3600" seconds): lets it backfill a
#: domain held for a starving gang when it finishes before that gang could start
ANNOTATION_EXPECTED_DURATION = "scheduling.phalanx.dev/expected-duration"
ANNOTATION_RETRY = "scheduling.phalanx.dev/retry"  # pod: touched to make kube-scheduler retry a group that now fits
MANAGED_BY_VALUE = "phalanx.dev/statefulset-controller"
# ResourceClaim phalanx created for a PodGroup (shared claims without DRAWorkloadResourceClaims):
# the value is the name of the PodGroup's resourceClaims entry the claim serves.
LABEL_PODGROUP_CLAIM = "scheduling.phalanx.dev/podgroup-claim"

# -- upstream names ---------------------------------------------------------------------------------
# An annotation, as KEP-6277 has it: the value contains "/", which a label value may not.
ANNOTATION_MANAGED_BY = "scheduling.k8s.io/managed-by"
ANNOTATION_GROUP_TEMPLATE_NAME = "scheduling.k8s.io/group-template-name"
ANNOTATION_PARENT_COMPOSITE = "scheduling.k8s.io/parent-compositepodgroup"
ANNOTATION_PARENT_COMPOSITE_ALT = "scheduling.k8s.io/parent-composite-podgroup"  # read, never written
FINALIZER_PODGROUP_PROTECTION = "scheduling.k8s.io/podgroup-protection"
GATE_LWS_GROUP_REPLACEMENT = "leaderworkerset.sigs.k8s.io/group-replacement"
LABEL_STATEFULSET_POD_NAME = "statefulset.kubernetes.io/pod-name"  # set on every pod a StatefulSet creates
#: serve's WorkloadCycle gRPC port by default, and so the one `explain`, `whatif` and the demo use
GRPC_PORT = 50051
DEFAULT_SCHEDULER = "default-scheduler"  # a pod's spec.schedulerName when it names none
PLUGIN_NODE_RESOURCES_FIT = "NodeResourcesFit"  # kube-scheduler's resource filter (the plugin's rejections name it)

LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_RACK = "topology.kubernetes.io/rack"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"  # the API server sets it on every Namespace

# -- storage (as the PV controller and kube-scheduler's volume plugins read them) --------------------
ANNOTATION_BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"  # wins over storageClassName
# the default class a claim naming none gets (DefaultStorageClass admission; the beta annotation too)
ANNOTATION_DEFAULT_STORAGE_CLASS = "storageclass.kubernetes.io/is-default-class"
ANNOTATION_BETA_DEFAULT_STORAGE_CLASS = "storageclass.beta.kubernetes.io/is-default-class"
PROVISIONER_NONE = "kubernetes.io/no-provisioner"  # a StorageClass for static PVs only
BINDING_WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
PV_PHASE_AVAILABLE = "Available"

# -- the StatefulSet controller ----------------------------------------------------------------------
CONTROLLER_COMPONENT = "phalanx-statefulset-controller"  # event source, Lease holder prefix
CONTROLLER_LEASE = "phalanx-statefulset-controller"  # coordination.k8s.io/v1 Lease for leader election
EVENT_WORKLOAD_CREATED = "WorkloadCreated"
EVENT_PODGROUP_CREATED = "PodGroupCreated"
EVENT_WORKLOAD_CREATION_FAILED = "WorkloadCreationFailed"
EVENT_WORKLOAD_AMBIGUOUS = "WorkloadAmbiguous"  # more than one Workload/PodGroup matches: nothing done
EVENT_WORKLOAD_IGNORED = "WorkloadIgnored"  # a discovered Workload has a shape phalanx cannot use
EVENT_DELEGATION_IGNORED = "DelegationIgnored"  # group-template-name without a parent controller
EVENT_RESOURCECLAIM_CREATED = "ResourceClaimCreated"  # a PodGroup's shared claim, created by phalanx
EVENT_RESOURCECLAIM_FAILED = "ResourceClaimCreationFailed"  # template missing, name taken, API error

# -- LeaderWorkerSet (sigs.k8s.io/lws v0.9.0 spells these; phalanx reads them, never writes them) ---
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_API_GROUP = "leaderworkerset.x-k8s.io"
LABEL_LWS_NAME = "leaderworkerset.sigs.k8s.io/name"  # every LWS pod and StatefulSet
LABEL_LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"  # the replica a pod belongs to
LABEL_LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # 0 for the leader
LABEL_LWS_REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"  # a pod's LWS revision
ANNOTATION_LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"  # pods: the group size of their revision
ANNOTATION_LWS_LEADER_NAME = "leaderworkerset.sigs.k8s.io/leader-name"  # worker pods: their leader
ANNOTATION_LWS_EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
LABEL_POD_INDEX = "apps.kubernetes.io/pod-index"  # set by the StatefulSet controller
# set by the Job controller on an Indexed Job's pods (label and annotation): the pod's index, which
# its replacement keeps
LABEL_JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# phalanx's, for LWS: the leader pod's group incarnation (workers inherit it; see controller/lws.py),
# and on the PodGroups phalanx creates for an LWS, the scheduling level (replica, whole, role).
LABEL_LWS_INCARNATION = "scheduling.phalanx.dev/lws-incarnation"
ANNOTATION_LWS_LEVEL = "scheduling.phalanx.dev/lws-level"

# -- conditions -------------------------------------------------------------------------------------
CONDITION_INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"
REASON_SCHEDULED = "Scheduled"  # PodGroupInitiallyScheduled=True, as kube-scheduler writes it
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_SCHEDULER_ERROR = "SchedulerError"
#: PodGroupInitiallyScheduled=False while its namespace holds --namespace-max-plans open plans
REASON_NAMESPACE_LIMIT = "NamespaceLimit"
#: PodGroupInitiallyScheduled=False: minCount exceeds the pods every schedulable node together can run
REASON_MIN_COUNT_TOO_LARGE = "MinCountTooLarge"
#: phalanx's, beside it once a gang was admitted: False while members it lost (or that joined it)
#: wait — the reason and message say for what — and True again once they go to binding
CONDITION_MEMBERS_SCHEDULED = "scheduling.phalanx.dev/MembersScheduled"
REASON_WAITING_FOR_MEMBERS = "WaitingForMembers"
REASON_MEMBERS_SCHEDULED = "MembersScheduled"
#: phalanx's write-ahead placement record of a gang (True; message: {"domain": ..., "pods": {pod: node}}),
#: written in the same status write as PodGroupInitiallyScheduled=True, before any member binds;
#: False once abandoned (the recorded nodes no longer fit)
CONDITION_PLACEMENT = "scheduling.phalanx.dev/Placement"
REASON_PLACEMENT_RECORDED = "Recorded"
REASON_PLACEMENT_ABANDONED = "Abandoned"
REASON_PLACEMENT_ON_ANNOTATION = "OnAnnotation"  # ANNOTATION_PLACEMENT holds the record
CONDITION_DISRUPTION_TARGET = "DisruptionTarget"
REASON_PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"

# -- gang-aware autoscaling through ProvisioningRequests ---------------------------------------------
# (k8s.io/autoscaler/cluster-autoscaler/apis, provisioningrequest/autoscaling.x-k8s.io/v1 types.go)
PROVISIONING_API_VERSION = "autoscaling.x-k8s.io/v1"
PROVISIONING_CLASS_ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
#: PodGroup, StatefulSet or LeaderWorkerSet (copied onto the PodGroups phalanx creates): "atomic"
#: asks for a ProvisioningRequest when the gang lacks capacity, "none" never (over serve's default)
ANNOTATION_PROVISIONING = "scheduling.phalanx.dev/provisioning"
PROVISIONING_ATOMIC = "atomic"
PROVISIONING_NONE = "none"
#: ProvisioningRequest and its PodTemplates: the name of the PodGroup they were made for
LABEL_PROVISIONING_PODGROUP = "scheduling.phalanx.dev/provisioning-podgroup"
#: pod annotations cluster-autoscaler reads: the pod consumes that request's capacity (and is left
#: out of its ordinary scale-up), of that class
ANNOTATION_CONSUME_PROVISIONING = "autoscaling.x-k8s.io/consume-provisioning-request"
ANNOTATION_PROVISIONING_CLASS = "autoscaling.x-k8s.io/provisioning-class-name"
#: the request's conditions, as cluster-autoscaler sets them
PROVISIONING_ACCEPTED = "Accepted"
PROVISIONING_PROVISIONED = "Provisioned"
PROVISIONING_FAILED = "Failed"
PROVISIONING_CAPACITY_REVOKED = "CapacityRevoked"
PROVISIONING_BOOKING_EXPIRED = "BookingExpired"
#: PodGroupInitiallyScheduled=False while its ProvisioningRequest is outstanding, and once it failed
REASON_PROVISIONING = "WaitingForProvisioning"
REASON_PROVISIONING_FAILED = "ProvisioningFailed"
EVENT_PROVISIONING_REQUESTED = "ProvisioningRequested"  # PodGroup: a request created for its shortfall
EVENT_PROVISIONING_CHANGED = "ProvisioningChanged"  # PodGroup: its request's condition changed
EVENT_PROVISIONING_DELETED = "ProvisioningDeleted"  # PodGroup: bound (or gone), its request deleted
EVENT_PROVISIONING_ERROR = "ProvisioningError"  # PodGroup: the request could not be created

# -- gang-aware scale-up with Karpenter ------------------------------------------------------------
# (sigs.k8s.io/karpenter v1.15.0, pkg/apis/v1: nodeclaim.go, nodepool.go, labels.go)
KARPENTER_API_VERSION = "karpenter.sh/v1"
#: serve's --provisioner: who is asked for a gang's missing nodes
PROVISIONER_CLUSTER_AUTOSCALER = "cluster-autoscaler"  # a ProvisioningRequest
PROVISIONER_KARPENTER = "karpenter"  # NodeClaims of a NodePool
LABEL_KARPENTER_NODEPOOL = "karpenter.sh/nodepool"  # NodeClaim, Node: the NodePool it belongs to
#: NodeClaim, Node (Karpenter copies a NodeClaim's annotations to its Node at registration; a
#: registered node's own annotation is the one its disruption reads): "true" blocks consolidation,
#: drift and expiry's voluntary disruption
ANNOTATION_KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
#: NodeClaim conditions, as Karpenter sets them
NODECLAIM_LAUNCHED = "Launched"
NODECLAIM_REGISTERED = "Registered"
NODECLAIM_INITIALIZED = "Initialized"
#: NodeClaims phalanx made for a gang: its PodGroup's uid and the members it held when it asked
#: (labels), its namespace/name (an annotation: the value has a "/")
LABEL_NODECLAIM_PODGROUP_UID = "scheduling.phalanx.dev/podgroup-uid"
LABEL_NODECLAIM_HELD = "scheduling.phalanx.dev/held"
ANNOTATION_NODECLAIM_PODGROUP = "scheduling.phalanx.dev/podgroup"
EVENT_NODECLAIMS_CREATED = "NodeClaimsCreated"  # PodGroup: NodeClaims created for its shortfall
EVENT_NODECLAIMS_CHANGED = "NodeClaimsChanged"  # PodGroup: its NodeClaims' nodes registered
EVENT_NODECLAIMS_FAILED = "NodeClaimsFailed"  # PodGroup: its NodeClaims did not all come; all deleted
EVENT_NODECLAIMS_RELEASED = "NodeClaimsReleased"  # PodGroup: its nodes left to the NodePool's disruption

# -- metrics ----------------------------------------------------------------------------------------
METRIC_PODGROUP_ATTEMPTS = "scheduler_podgroup_schedule_attempts_total"
METRIC_PODGROUP_ATTEMPT_DURATION = "scheduler_podgroup_scheduling_attempt_duration_seconds"
METRIC_PREEMPTION_ATTEMPTS = "scheduler_workload_preemption_attempts_total"
METRIC_PREEMPTION_VICTIMS = "scheduler_workload_preemption_victims"
METRIC_STS_WORKLOAD_ERRORS = "statefulset_workload_creation_errors_total"
METRIC_PLANS = "phalanx_plans"
METRIC_PLANS_RELEASED = "phalanx_plans_released_total"
METRIC_BARRIER_OUTCOMES = "phalanx_barrier_outcomes_total"
METRIC_BARRIER_WAITING = "phalanx_barrier_waiting"
METRIC_EXTENDER_REQUESTS = "phalanx_extender_requests_total"
METRIC_EXTENDER_LATENCY = "phalanx_extender_request_duration_seconds"
METRIC_WEBHOOK_REQUESTS = "phalanx_controller_webhook_requests_total"  # {path, code}
METRIC_WEBHOOK_LATENCY = "phalanx_controller_webhook_request_duration_seconds"  # {path}

# -- repair after a webhook outage (pods of a StatefulSet admitted without their PodGroup) -----------
# PodGroup phalanx manages: comma-separated names of the StatefulSet's pods that are bound to nodes
# without naming the group (phalanx never deletes them); removed once there are none.
ANNOTATION_UNSTAMPED_BOUND = "scheduling.phalanx.dev/unstamped-bound-pods"
EVENT_UNSTAMPED_PODS_RECREATED = "UnstampedPodsRecreated"  # unbound unstamped pods deleted for re-admission
EVENT_UNSTAMPED_PODS_BOUND = "UnstampedPodsBound"  # bound unstamped pods: reported, never deleted
METRIC_UNSTAMPED_PODS_DELETED = "phalanx_controller_unstamped_pods_deleted_total"
METRIC_UNSTAMPED_PODS_BOUND = "phalanx_controller_unstamped_bound_pods"  # gauge, over all StatefulSets

# -- group preemption and broken `disruptionMode: all` units -------------------------------------------
EVENT_UNIT_BROKEN = "UnitBroken"  # PodGroup: a member was newly disrupted, the rest of the unit is evicted
EVENT_UNIT_EVICTION_BLOCKED = "UnitEvictionBlocked"  # PodGroup: a PDB refused evicting the rest; retrying

# -- the workload cycle's state machine, bind-barrier capacity and write dispatcher -----------------
EVENT_BIND_FAILED = "BindFailed"
EVENT_BARRIER_TIMEOUT = "BarrierTimeout"
EVENT_FAILED_SCHEDULING = "FailedScheduling"
EVENT_PLACEMENT_ABANDONED = "PlacementAbandoned"  # a partly bound gang's record no longer fits
EVENT_PREEMPTING = "Preempting"  # PodGroup: victims chosen, their eviction started
EVENT_PREEMPTED = "Preempted"  # victim pod
EVENT_SMALLEST_CHANGE = "SmallestChange"  # PodGroup: the smallest change that would make it fit
METRIC_TIME_TO_PLACE = "phalanx_podgroup_time_to_place_seconds"  # plan made -> every member bound
METRIC_PLAN_TRANSITIONS = "phalanx_plan_transitions_total"  # {to}: every plan state change
#: {plan}: a member's PlanForPod (plugin mode) found its group's plan held (made ahead), made it on the call, or none
METRIC_PLAN_REQUESTS = "phalanx_plan_requests_total"
METRIC_BARRIER_HELD = "phalanx_barrier_capacity_held"  # gang members planned and not yet bound
METRIC_DISPATCH_WRITES = "phalanx_dispatch_writes_total"  # {outcome, kind}: coalesced, retried, failed, dropped
METRIC_DISPATCH_QUEUED = "phalanx_dispatch_queued"  # API writes waiting in the dispatcher
METRIC_NAMESPACE_LIMITED = "phalanx_namespace_limited_total"  # {limit}: work held back by a per-namespace limit
METRIC_HEAP_RETURNED = "phalanx_heap_returned_bytes_total"  # freed memory handed back to the system (malloc_trim)
METRIC_THREADS = "phalanx_threads"  # {pool}: phalanx serve's threads by name, numbers dropped (read at scrape)
METRIC_INTERNAL_ENTRIES = "phalanx_internal_entries"  # {collection}: entries of each long-lived map (cluster/sizes.py)

# -- several replicas: only the serve whose kube-scheduler leads acts (cluster/leadership.py) --------
REASON_STANDBY = "Standby"  # WriteError.reason of a write a standby serve refused to make
METRIC_LEADING = "phalanx_leading"  # 1 while this serve acts, 0 while it is a standby
METRIC_API_WRITES = "phalanx_api_writes_total"  # {kind, outcome}: written, failed, standby (refused)
