// Package phalanx is phalanx's kube-scheduler framework plugin: a thin enforcement, at the
// framework's extension points, of what `phalanx serve` decides (plans, group preemption,
// explanations stay in the service).
//
//   - PreEnqueue: a gang member whose group is missing members stays out of the active queue.
//   - PreFilter: a member's planned node, from the local mirror of the service's plans or one
//     PlanForPod call per group cycle, as the PreFilterResult: kube-scheduler's own filters check
//     exactly that node. The call runs beside the scheduling loop: a reply later than planWait
//     (a solve) answers the member "being planned", and the group's members are moved back to
//     the active queue when it lands. Plain pods: nothing to do unless some node holds reserved
//     capacity.
//   - Filter: plain pods are kept off capacity reserved for plans (from the mirror, no RPC).
//   - PostFilter: the planned node was rejected: which plugin, and why, goes to the service,
//     which re-slots or re-plans with that knowledge. Gang members get no per-pod preemption.
//   - Score: the planned node first; plain pods prefer nodes that hold no reservation.
//   - Reserve / Unreserve: the service's plan follows kube-scheduler's assumed pods (a member
//     assumed on its planned node is reserved from the mirror and reported with its Permit call).
//   - Permit: the gang barrier in process. A member waits (the framework's waiting pods; no
//     thread, no connection held) until the service says every planned member is reserved and the
//     placement record is written; then every waiting member is allowed. The Permit call runs
//     beside the scheduling loop (the member that completes the gang waits for the record
//     write, the loop does not). When one member's wait times out or fails, the rest are
//     rejected with it: a gang never binds partially.
//   - PreBind: the same barrier, later, for members that name a ResourceClaim (the shape of a
//     claim shared by the gang). kube-scheduler's DynamicResources plugin writes a claim's
//     allocation in the PreBind of the member that allocated it and, outside its own PodGroup
//     scheduling cycle, answers every other pod of that claim "in the process of being
//     allocated" until then; a Permit barrier would hold that first member before the write and
//     the rest could never reach it. Such members pass Permit and wait in PreBind (after
//     DynamicResources'; a binding goroutine each, never the scheduling loop) until the service
//     allows the gang; on timeout or rejection they fail PreBind and kube-scheduler unreserves
//     them (their entries in the claim's reservedFor removed).
//
// Failure modes: every RPC has a deadline and goes through a circuit breaker, so an unreachable
// service costs the scheduling loop at most one deadline per cooldown; members then wait
// (Unschedulable, retried), plain pods schedule as stock kube-scheduler would.
package phalanx

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// Name is the plugin's name in KubeSchedulerConfiguration profiles.
const Name = "Phalanx"

// LabelPodGroup names a pod's PodGroup in phalanx's CRD flavor (cluster/names.py
// LABEL_POD_GROUP); the built-in flavor uses spec.schedulingGroup.podGroupName.
const LabelPodGroup = "scheduling.phalanx.dev/pod-group"

const stateKey fwk.StateKey = Name

const version = pb.ContractVersion_CONTRACT_VERSION_1

// Handle is the part of the framework handle the plugin uses (fwk.Handle satisfies it).
type Handle interface {
	GetWaitingPod(uid types.UID) fwk.WaitingPod
	RejectWaitingPod(uid types.UID) bool
	Activate(logger klog.Logger, pods map[string]*v1.Pod)
}

// Plugin implements the extension points listed in the package documentation.
type Plugin struct {
	args    Args
	handle  Handle
	pods    corelisters.PodLister // nil: no activation of waiting groups (tests)
	client  pb.SchedulerPluginClient
	breaker *Breaker
	mirror  *Mirror
	logger  klog.Logger
	ctx     context.Context // the plugin's lifetime: calls made beside the scheduling loop
	closeFn func()
	wg      sync.WaitGroup

	mu       sync.Mutex
	planning map[string]*planCall // group -> its PlanForPod call in flight
	// one PlanForPod call at a time: concurrent solves of different groups slow each other on the
	// service's cores and each plan committed makes the others start over
	calling chan struct{}
	// members waiting in PreBind (the barrier of members naming a ResourceClaim): each gate gets
	// one decision, sent under mu by whoever removes it from the map
	atPreBind map[types.UID]chan decision
	// whether the profile runs this plugin at PreBind after DynamicResources (read once, from the
	// built framework): only then do members naming a claim pass Permit
	preBindOnce sync.Once
	preBind     bool
}

// decision is what a member waiting in PreBind is told: allowed, or rejected with a message.
type decision struct {
	allow bool
	msg   string
}

// planCall is one PlanForPod call for a group, shared by the members that reach PreFilter while
// it runs. late: the members answered "being planned" (moved back to the active queue when the
// reply lands); done is closed once reply/err are set.
type planCall struct {
	wait    time.Time // planWait after the call started: members waiting for it wait until then only
	done    chan struct{}
	reply   *pb.PlanForPodReply
	err     error
	late    map[types.UID]*v1.Pod
	waiting map[types.UID]bool // members in PreFilter waiting for the reply (they take it)
}

var (
	_ fwk.PreEnqueuePlugin  = &Plugin{}
	_ fwk.PreFilterPlugin   = &Plugin{}
	_ fwk.FilterPlugin      = &Plugin{}
	_ fwk.PostFilterPlugin  = &Plugin{}
	_ fwk.PreScorePlugin    = &Plugin{}
	_ fwk.ScorePlugin       = &Plugin{}
	_ fwk.ReservePlugin     = &Plugin{}
	_ fwk.PermitPlugin      = &Plugin{}
	_ fwk.PreBindPlugin     = &Plugin{}
	_ fwk.EnqueueExtensions = &Plugin{}
	_ fwk.SignPlugin        = &Plugin{}
)

// New is the plugin factory registered with app.WithPlugin.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(args.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("phalanx plugin: gRPC client for %s: %w", args.Address, err)
	}
	var pods corelisters.PodLister
	if f := h.SharedInformerFactory(); f != nil {
		pods = f.Core().V1().Pods().Lister()
	}
	p := NewWithClient(ctx, args, h, pods, pb.NewSchedulerPluginClient(conn))
	p.closeFn = func() { _ = conn.Close() }
	return p, nil
}

// NewWithClient builds the plugin on an existing client and starts the reservations stream
// (until ctx ends).
func NewWithClient(ctx context.Context, args Args, h Handle, pods corelisters.PodLister,
	client pb.SchedulerPluginClient) *Plugin {
	p := &Plugin{args: args, handle: h, pods: pods, client: client, mirror: NewMirror(),
		breaker: NewBreaker(args.BreakerFailures, args.BreakerCooldown.Duration), logger: klog.FromContext(ctx),
		ctx: ctx, planning: map[string]*planCall{}, calling: make(chan struct{}, 1),
		atPreBind: map[types.UID]chan decision{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.watch(ctx)
	}()
	return p
}

// Close stops using the connection (the stream ends with the factory's context).
func (p *Plugin) Close() error {
	if p.closeFn != nil {
		p.closeFn()
	}
	return nil
}

// Name implements fwk.Plugin.
func (p *Plugin) Name() string { return Name }

// Mirror is the local copy of the service's plans and reservations.
func (p *Plugin) Mirror() *Mirror { return p.mirror }

// GroupOf is "namespace/name" of the pod's PodGroup, "" when it names none.
func GroupOf(pod *v1.Pod) string {
	name := ""
	if g := pod.Spec.SchedulingGroup; g != nil && g.PodGroupName != nil {
		name = *g.PodGroupName
	}
	if name == "" {
		name = pod.Labels[LabelPodGroup]
	}
	if name == "" {
		return ""
	}
	ns := pod.Namespace
	if ns == "" {
		ns = "default"
	}
	return ns + "/" + name
}

// podState is what PreFilter learned for the later extension points of the same cycle.
type podState struct {
	group    string
	node     string          // a member's planned node
	requests v1.ResourceList // a plain pod's requests (when some node holds reservations)
}

func (s *podState) Clone() fwk.StateData { return s }

func readState(state fwk.CycleState) *podState {
	if state == nil {
		return nil
	}
	data, err := state.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := data.(*podState)
	return s
}

// unary makes one call under the breaker, with a deadline.
func (p *Plugin) unary(ctx context.Context, timeout time.Duration, call func(context.Context) error) error {
	if err := p.breaker.Allow(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := call(ctx)
	p.breaker.Record(err)
	return err
}

// -- PreEnqueue -------------------------------------------------------------------------------

// PreEnqueue keeps a gang member out of the active queue while its group misses members.
func (p *Plugin) PreEnqueue(_ context.Context, pod *v1.Pod) *fwk.Status {
	group := GroupOf(pod)
	if group != "" && p.mirror.Waiting(group) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("phalanx: podgroup %s is waiting for members", group))
	}
	return nil
}

// EventsToRegister: a new or changed pod (a member arrives, phalanx touches a waiting member),
// a node or a PodGroup change may let a waiting member go on. Groups whose plan appears on the
// reservations stream are activated directly. No event retries a member whose group's PlanForPod
// call is in flight (answered "being planned"): the reply activates it, and retrying it before
// would only spin the scheduling loop (kube-scheduler pops the backoff queue while the active
// queue is empty), each retry a pod status write.
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.Pod, ActionType: fwk.All}, QueueingHintFn: p.unlessPlanning},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.All}, QueueingHintFn: p.unlessPlanning},
		{Event: fwk.ClusterEvent{Resource: fwk.PodGroup, ActionType: fwk.All}, QueueingHintFn: p.unlessPlanning},
	}, nil
}

// unlessPlanning is the queueing hint of every event: QueueSkip for a member whose group is being
// planned, Queue for everything else.
func (p *Plugin) unlessPlanning(_ klog.Logger, pod *v1.Pod, _, _ interface{}) (fwk.QueueingHint, error) {
	if group := GroupOf(pod); group != "" {
		p.mu.Lock()
		_, planning := p.planning[group]
		p.mu.Unlock()
		if planning {
			return fwk.QueueSkip, nil
		}
	}
	return fwk.Queue, nil
}

// SignPod keeps kube-scheduler's opportunistic batching (KEP-5598) for plain pods while no node
// holds reservations (the plugin then adds nothing to their signature); group members, and plain
// pods while reservations exist (they change with every plan), are not batched.
func (p *Plugin) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if GroupOf(pod) != "" || p.mirror.HasReservations() {
		return nil, fwk.NewStatus(fwk.Unschedulable, "phalanx: not batchable")
	}
	return nil, nil
}

// -- PreFilter / Filter -----------------------------------------------------------------------

// PreFilter answers a member with its planned node (PreFilterResult), or Unschedulable with the
// service's reason; a plain pod skips the plugin unless some node holds reserved capacity.
func (p *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo,
) (*fwk.PreFilterResult, *fwk.Status) {
	group := GroupOf(pod)
	if group == "" {
		if !p.mirror.HasReservations() {
			return nil, fwk.NewStatus(fwk.Skip)
		}
		state.Write(stateKey, &podState{requests: resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})})
		return nil, nil
	}
	if node, ok := p.mirror.PlannedNode(pod.UID); ok {
		state.Write(stateKey, &podState{group: group, node: node})
		return &fwk.PreFilterResult{NodeNames: sets.New(node)}, nil
	}
	podJSON, err := json.Marshal(pod)
	if err != nil {
		return nil, fwk.AsStatus(fmt.Errorf("phalanx: encoding pod: %w", err))
	}
	call := p.planFor(group, pod.UID, podJSON)
	timer := time.NewTimer(time.Until(call.wait)) // a member joining a call in flight waits what is left
	defer timer.Stop()
	select {
	case <-call.done:
	case <-timer.C:
		p.mu.Lock()
		select {
		case <-call.done: // landed meanwhile
		default:
			delete(call.waiting, pod.UID)
			call.late[pod.UID] = pod
			p.mu.Unlock()
			return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
				fmt.Sprintf("phalanx: podgroup %s is being planned by phalanx serve", group))
		}
		p.mu.Unlock()
	}
	if call.err != nil {
		return nil, unreachable(group, call.err)
	}
	reply := call.reply
	switch reply.GetVerdict() {
	case pb.PlanForPodReply_PLANNED:
		node, ok := p.mirror.PlannedNode(pod.UID)
		if !ok { // a call another member made planned without this one (or the plan is gone)
			return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
				fmt.Sprintf("phalanx: podgroup %s holds no plan for this pod; re-planning", group))
		}
		state.Write(stateKey, &podState{group: group, node: node})
		return &fwk.PreFilterResult{NodeNames: sets.New(node)}, nil
	case pb.PlanForPodReply_NOT_A_MEMBER:
		return nil, fwk.NewStatus(fwk.Skip)
	default:
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reply.GetReason())
	}
}

// planFor is the group's PlanForPod call in flight, or a new one for pod. The call runs beside
// the scheduling loop under planTimeout, one group's call at a time; when it lands, a plan goes into the mirror and the
// group's pending members that did not take the reply (answered "being planned", or answered
// "wait for members" before the plan existed) are moved back to the active queue; a late "wait"
// moves back only the members it left answered "being planned", so they show the real reason.
// An open breaker makes no call: the result is its error at once.
func (p *Plugin) planFor(group string, uid types.UID, podJSON []byte) *planCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	if call := p.planning[group]; call != nil {
		call.waiting[uid] = true
		return call
	}
	call := &planCall{wait: time.Now().Add(p.args.PlanWait.Duration), done: make(chan struct{}),
		late: map[types.UID]*v1.Pod{}, waiting: map[types.UID]bool{uid: true}}
	if err := p.breaker.Allow(); err != nil {
		call.err = err
		close(call.done)
		return call
	}
	p.planning[group] = call
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		var reply *pb.PlanForPodReply
		err := p.ctx.Err()
		select {
		case p.calling <- struct{}{}:
			ctx, cancel := context.WithTimeout(p.ctx, p.args.PlanTimeout.Duration)
			reply, err = p.client.PlanForPod(ctx, &pb.PlanForPodRequest{Version: version, PodJson: podJSON})
			cancel()
			<-p.calling
		case <-p.ctx.Done():
			err = p.ctx.Err()
		}
		p.breaker.Record(err)
		planned := err == nil && reply.GetVerdict() == pb.PlanForPodReply_PLANNED
		if planned {
			p.mirror.PutPlan(reply.GetPlan())
		} else if err == nil && reply.GetMembersMissing() {
			p.mirror.MembersMissing(group)
		}
		p.mu.Lock()
		call.reply, call.err = reply, err
		close(call.done)
		delete(p.planning, group)
		late := make(map[string]*v1.Pod, len(call.late))
		for _, m := range call.late {
			late[m.Namespace+"/"+m.Name] = m
		}
		taken := call.waiting // they take the reply themselves: not moved
		p.mu.Unlock()
		if planned {
			p.activate([]string{group}, func(uid types.UID) bool { return taken[uid] })
		} else if len(late) > 0 {
			p.handle.Activate(p.logger, late)
		}
		if len(late) > 0 {
			// a member answered "being planned" may still be on its way into the queue (its
			// activation would then wait out its backoff): once more, after a moment
			select {
			case <-p.ctx.Done():
			case <-time.After(p.args.PlanWait.Duration):
				p.activatePending(late)
			}
		}
	}()
	return call
}
func unreachable(group string, err error) *fwk.Status {
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
		fmt.Sprintf("phalanx: podgroup %s waits: phalanx serve did not answer: %v", group, err))
}

// PreFilterExtensions implements fwk.PreFilterPlugin (none: the plugin keeps no per-node state).
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// Filter keeps a plain pod off capacity that plans reserve on the node.
func (p *Plugin) Filter(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	s := readState(state)
	if s == nil || s.group != "" || nodeInfo.Node() == nil {
		return nil
	}
	held := p.mirror.Reserved(nodeInfo.Node().Name)
	if len(held) == 0 {
		return nil
	}
	if short := ReservedShortfall(s.requests, nodeInfo, held); short != "" {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("phalanx: %s on this node is reserved for a planned podgroup", short))
	}
	return nil
}

// ReservedShortfall names the first resource the pod needs that is not free on the node once the
// reservations are held, or "". Units as the contract says: cpu in millicores, others base units.
func ReservedShortfall(requests v1.ResourceList, nodeInfo fwk.NodeInfo, held map[string]int64) string {
	alloc, used := nodeInfo.GetAllocatable(), nodeInfo.GetRequested()
	if n := held["pods"]; n > 0 && int64(len(nodeInfo.GetPods()))+n+1 > int64(alloc.GetAllowedPodNumber()) {
		return "pods"
	}
	for name, q := range requests {
		amount, ok := held[string(name)]
		if !ok || amount == 0 {
			continue
		}
		var free, want int64
		switch name {
		case v1.ResourceCPU:
			free, want = alloc.GetMilliCPU()-used.GetMilliCPU(), q.MilliValue()
		case v1.ResourceMemory:
			free, want = alloc.GetMemory()-used.GetMemory(), q.Value()
		case v1.ResourceEphemeralStorage:
			free, want = alloc.GetEphemeralStorage()-used.GetEphemeralStorage(), q.Value()
		default:
			free, want = alloc.GetScalarResources()[name]-used.GetScalarResources()[name], q.Value()
		}
		if want > 0 && free-amount < want {
			return string(name)
		}
	}
	return ""
}

// -- PostFilter ---------------------------------------------------------------------------------

// PostFilter reports the rejection of a member's planned node (plugin and reasons) so the service
// re-slots or re-plans. Members get no per-pod preemption (group preemption runs in the service's
// workload cycle); plain pods go on to the next PostFilter plugin (DefaultPreemption).
func (p *Plugin) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader,
) (*fwk.PostFilterResult, *fwk.Status) {
	group := GroupOf(pod)
	if group == "" {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	s := readState(state)
	if s == nil || s.node == "" {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "phalanx: group preemption is phalanx serve's")
	}
	plugin, reason := "", ""
	if st := statuses.Get(s.node); st != nil {
		plugin, reason = st.Plugin(), strings.Join(st.Reasons(), "; ")
	}
	podJSON, err := json.Marshal(pod)
	if err != nil {
		return nil, fwk.AsStatus(fmt.Errorf("phalanx: encoding pod: %w", err))
	}
	var reply *pb.ReportRejectionReply
	err = p.unary(ctx, p.args.RPCTimeout.Duration, func(ctx context.Context) (err error) {
		reply, err = p.client.ReportRejection(ctx, &pb.ReportRejectionRequest{Version: version, PodJson: podJSON,
			Node: s.node, Plugin: plugin, Reason: reason})
		return err
	})
	p.mirror.DropPlan(group) // the next PreFilter asks the service, which knows what changed
	msg := fmt.Sprintf("phalanx: planned node %s rejected by %s: %s", s.node, plugin, reason)
	if err != nil {
		msg += fmt.Sprintf(" (not reported: %v)", err)
	} else {
		msg += "; " + reply.GetOutcome()
	}
	return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, msg)
}

// -- Score --------------------------------------------------------------------------------------

// PreScore skips scoring when it cannot matter: a member has exactly one node; a plain pod when no
// node holds reservations.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	s := readState(state)
	if s == nil || (s.group == "" && !p.mirror.HasReservations()) {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score: a member's planned node scores highest; a plain pod prefers nodes without reservations.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s := readState(state)
	if s == nil || nodeInfo.Node() == nil {
		return 0, nil
	}
	name := nodeInfo.Node().Name
	if s.group != "" {
		if name == s.node {
			return fwk.MaxNodeScore, nil
		}
		return 0, nil
	}
	if len(p.mirror.Reserved(name)) > 0 {
		return 0, nil
	}
	return fwk.MaxNodeScore, nil
}

// ScoreExtensions implements fwk.ScorePlugin (scores are already in range).
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

// -- Reserve / Unreserve ------------------------------------------------------------------------

// Reserve: kube-scheduler assumed the member on its node. When that is the node of the mirror's
// plan nothing is called (the scheduling loop goes on): the member's Permit call tells the service
// it is reserved (reserved_uids) and the service checks the node again there. Otherwise the
// service is asked (its plan may be newer than the mirror's).
func (p *Plugin) Reserve(ctx context.Context, _ fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	group := GroupOf(pod)
	if group == "" {
		return nil
	}
	if planned, ok := p.mirror.PlannedNode(pod.UID); ok && planned == node {
		return nil
	}
	var reply *pb.ReserveReply
	err := p.unary(ctx, p.args.RPCTimeout.Duration, func(ctx context.Context) (err error) {
		reply, err = p.client.Reserve(ctx, &pb.ReserveRequest{Version: version, PodUid: string(pod.UID), Group: group, Node: node})
		return err
	})
	if err != nil {
		return unreachable(group, err)
	}
	if !reply.GetOk() {
		p.mirror.DropPlan(group)
		return fwk.NewStatus(fwk.Unschedulable, reply.GetReason())
	}
	return nil
}

// Unreserve tells the service the member is no longer assumed; when that ends its gang's chance
// (a Permit timeout), the members still waiting are rejected too. Asynchronous: Unreserve may run
// in the scheduling cycle, which must not wait for an RPC.
func (p *Plugin) Unreserve(ctx context.Context, _ fwk.CycleState, pod *v1.Pod, node string) {
	group := GroupOf(pod)
	if group == "" {
		return
	}
	uid := pod.UID
	reason := "unreserved"
	if wp := p.handle.GetWaitingPod(uid); wp == nil {
		reason = "rejected"
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		var reply *pb.UnreserveReply
		err := p.unary(context.WithoutCancel(ctx), p.args.RPCTimeout.Duration, func(ctx context.Context) (err error) {
			reply, err = p.client.Unreserve(ctx, &pb.UnreserveRequest{Version: version, PodUid: string(uid), Group: group,
				Node: node, Reason: reason})
			return err
		})
		if err != nil {
			p.logger.V(2).Info("phalanx: unreserve not reported; the plan expires in the service", "pod", klog.KObj(pod), "err", err)
			return
		}
		for _, other := range reply.GetRejectUids() {
			p.release(types.UID(other), decision{msg: fmt.Sprintf("phalanx: podgroup %s: %s left the barrier, so the gang does not bind", group, pod.Name)})
		}
	}()
}

// -- Permit -------------------------------------------------------------------------------------

// Permit is the gang barrier: every member Waits; its Permit call runs beside the scheduling loop,
// and the reply of the member that completes the gang (after the service wrote the placement
// record) allows every waiting member.
func (p *Plugin) Permit(_ context.Context, _ fwk.CycleState, pod *v1.Pod, node string) (*fwk.Status, time.Duration) {
	group := GroupOf(pod)
	if group == "" || p.waitsAtPreBind(pod) {
		return nil, 0
	}
	if p.breaker.Open() {
		return unreachable(group, ErrOpen), 0
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.permit(pod, group, node)
	}()
	return fwk.NewStatus(fwk.Wait, fmt.Sprintf("phalanx: podgroup %s: waiting for its gang", group)),
		p.args.PermitTimeout.Duration
}

// permit makes the member's Permit call and applies the decision to the waiting pods.
func (p *Plugin) permit(pod *v1.Pod, group, node string) {
	reply, err := p.callPermit(p.ctx, pod, group, node)
	if err != nil {
		if wp := p.waitingPod(pod.UID); wp != nil {
			wp.Reject(Name, unreachable(group, err).Message())
		}
		return
	}
	switch reply.GetDecision() {
	case pb.PermitReply_ALLOW:
		p.allowAll(append(reply.GetAllowUids(), string(pod.UID)), "")
	case pb.PermitReply_WAIT: // the member that completes the gang allows this one
	default:
		p.mirror.DropPlan(group)
		if wp := p.waitingPod(pod.UID); wp != nil {
			wp.Reject(Name, reply.GetReason())
		}
	}
}

// callPermit is a member's Permit call, from either barrier: it names the member reserved on node
// (Reserve made no call when the mirror's plan agreed).
func (p *Plugin) callPermit(ctx context.Context, pod *v1.Pod, group, node string) (reply *pb.PermitReply, err error) {
	err = p.unary(ctx, p.args.RPCTimeout.Duration, func(ctx context.Context) (err error) {
		reply, err = p.client.Permit(ctx, &pb.PermitRequest{Version: version, PodUid: string(pod.UID), Group: group,
			Node: node, ReservedUids: []string{string(pod.UID)}})
		return err
	})
	return reply, err
}

// waitingPod is the member's waiting pod. The framework registers it right after Permit returned,
// which a reply can beat: it is looked for a little while (rpcTimeout); nil when it never shows
// (the member is gone, or was rejected meanwhile).
func (p *Plugin) waitingPod(uid types.UID) fwk.WaitingPod {
	var wp fwk.WaitingPod
	p.eventually(func() bool {
		wp = p.handle.GetWaitingPod(uid)
		return wp != nil
	})
	return wp
}

// eventually retries found for a little while (rpcTimeout): a member held at a barrier is
// registered by the framework (Permit) or by its PreBind call a moment after a reply may name it.
func (p *Plugin) eventually(found func() bool) bool {
	deadline := time.Now().Add(p.args.RPCTimeout.Duration)
	for {
		if found() {
			return true
		}
		if time.Now().After(deadline) || p.ctx.Err() != nil {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// allowAll allows the members an ALLOW reply names, at whichever barrier each waits, except skip
// (a member in PreBind that took its own reply).
func (p *Plugin) allowAll(uids []string, skip types.UID) {
	var late []types.UID // not registered yet (the member's own waiting pod, usually): looked for below
	for uid := range sets.New(uids...).Delete(string(skip)) {
		if !p.release(types.UID(uid), decision{allow: true}) {
			late = append(late, types.UID(uid))
		}
	}
	for _, uid := range late {
		p.eventually(func() bool { return p.release(uid, decision{allow: true}) })
	}
}

// release gives a member held at a barrier its decision: a member waiting in PreBind through its
// gate, one waiting at Permit through the framework. false: the member is held at neither.
func (p *Plugin) release(uid types.UID, d decision) bool {
	p.mu.Lock()
	if gate, ok := p.atPreBind[uid]; ok {
		delete(p.atPreBind, uid)
		gate <- d // buffered, one decision per gate
		p.mu.Unlock()
		return true
	}
	p.mu.Unlock()
	if d.allow {
		if wp := p.handle.GetWaitingPod(uid); wp != nil {
			wp.Allow(Name)
			return true
		}
		return false
	}
	return p.handle.RejectWaitingPod(uid)
}

// -- PreBind: the barrier of members naming a ResourceClaim -------------------------------------

// NamesClaim: the pod names a ResourceClaim directly (resourceClaimName), the shape of a claim
// its gang shares (phalanx's controller points every member at one PodGroup-owned claim). Claims
// from templates are each pod's own and need no later barrier.
func NamesClaim(pod *v1.Pod) bool {
	for _, c := range pod.Spec.ResourceClaims {
		if c.ResourceClaimName != nil && *c.ResourceClaimName != "" {
			return true
		}
	}
	return false
}

// waitsAtPreBind: the pod is a gang member whose barrier is PreBind, not Permit (it names a claim
// and the profile runs this plugin at PreBind after DynamicResources).
func (p *Plugin) waitsAtPreBind(pod *v1.Pod) bool {
	return GroupOf(pod) != "" && NamesClaim(pod) && p.barrierAtPreBind()
}

// barrierAtPreBind: the profile runs this plugin's PreBind after DynamicResources' (or without
// DynamicResources). Otherwise members naming a claim wait at Permit as the rest: a gang sharing a
// claim then cannot bind (said once in the log), but none binds without its barrier.
func (p *Plugin) barrierAtPreBind() bool {
	p.preBindOnce.Do(func() {
		lister, ok := p.handle.(interface{ ListPlugins() *config.Plugins })
		if !ok {
			return
		}
		dra, ours := -1, -1
		for i, plugin := range lister.ListPlugins().PreBind.Enabled {
			switch plugin.Name {
			case dynamicResources:
				dra = i
			case Name:
				ours = i
			}
		}
		p.preBind = ours >= 0 && dra < ours
		if !p.preBind {
			p.logger.Info("phalanx: the profile does not enable Phalanx at preBind after DynamicResources; " +
				"gang members naming a ResourceClaim wait at Permit, where a gang sharing one claim cannot complete")
		}
	})
	return p.preBind
}

// dynamicResources is the in-tree DRA plugin's name.
const dynamicResources = "DynamicResources"

// PreBindPreFlight: PreBind has work only for gang members naming a claim.
func (p *Plugin) PreBindPreFlight(_ context.Context, _ fwk.CycleState, pod *v1.Pod, _ string,
) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	if !p.waitsAtPreBind(pod) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	return nil, nil
}

// PreBind is the gang barrier of a member naming a claim (see the package documentation): the
// member's Permit call, then, told to wait, a wait on its gate until the reply of the member that
// completes the gang allows it, a rejection reaches it, or permitTimeout passes. It runs in the
// member's binding goroutine, after the in-tree PreBind plugins wrote its claim's allocation.
func (p *Plugin) PreBind(ctx context.Context, _ fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	if !p.waitsAtPreBind(pod) {
		return nil
	}
	group := GroupOf(pod)
	gate := make(chan decision, 1)
	p.mu.Lock()
	p.atPreBind[pod.UID] = gate
	p.mu.Unlock()
	reply, err := p.callPermit(ctx, pod, group, node)
	if err != nil || reply.GetDecision() != pb.PermitReply_WAIT {
		// the completing member's reply may have allowed this one meanwhile: that decision stands
		if d := p.leavePreBind(pod.UID, gate); d.allow {
			return nil
		}
		switch {
		case err != nil:
			return unreachable(group, err)
		case reply.GetDecision() == pb.PermitReply_ALLOW:
			p.allowAll(reply.GetAllowUids(), pod.UID)
			return nil
		default:
			p.mirror.DropPlan(group)
			return fwk.NewStatus(fwk.Unschedulable, reply.GetReason())
		}
	}
	timer := time.NewTimer(p.args.PermitTimeout.Duration)
	defer timer.Stop()
	var d decision
	select {
	case d = <-gate:
	case <-timer.C:
		d = p.leavePreBind(pod.UID, gate)
		if d == (decision{}) {
			d.msg = fmt.Sprintf("phalanx: podgroup %s: the gang was not complete within %s", group, p.args.PermitTimeout.Duration)
		}
	case <-ctx.Done():
		if d = p.leavePreBind(pod.UID, gate); d == (decision{}) {
			d.msg = fmt.Sprintf("phalanx: podgroup %s: %v", group, ctx.Err())
		}
	}
	if d.allow {
		return nil
	}
	return fwk.NewStatus(fwk.Unschedulable, d.msg)
}

// leavePreBind takes the member's gate out of the map; the decision already sent to it, if one
// was (the zero decision otherwise).
func (p *Plugin) leavePreBind(uid types.UID, gate chan decision) decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.atPreBind[uid] == gate {
		delete(p.atPreBind, uid)
		return decision{}
	}
	select {
	case d := <-gate:
		return d
	default:
		return decision{}
	}
}

// -- the reservations stream --------------------------------------------------------------------

func (p *Plugin) watch(ctx context.Context) {
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		err := p.watchOnce(ctx)
		p.mirror.Disconnect()
		if ctx.Err() != nil {
			return
		}
		p.logger.V(2).Info("phalanx: reservations stream ended; reconnecting", "err", err, "after", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (p *Plugin) watchOnce(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.client.WatchReservations(ctx, &pb.WatchReservationsRequest{Version: version})
	if err != nil {
		return err
	}
	first := true
	for {
		snap, err := stream.Recv()
		if err != nil {
			return err
		}
		progress := p.mirror.Apply(snap)
		if first {
			p.activateAll()
			first = false
		} else if len(progress) > 0 {
			p.activate(progress, nil)
		}
	}
}

// activate moves the pending members of the groups (but those “skip“ names) back to the active
// queue. (The scheduler's pod informer has no namespace index: one pass over its pods.)
func (p *Plugin) activate(groups []string, skip func(types.UID) bool) {
	if p.pods == nil {
		return
	}
	want := sets.New(groups...)
	list, err := p.pods.List(labels.Everything())
	if err != nil {
		return
	}
	pods := map[string]*v1.Pod{}
	for _, pod := range list {
		if pod.Spec.NodeName == "" && want.Has(GroupOf(pod)) && (skip == nil || !skip(pod.UID)) {
			pods[pod.Namespace+"/"+pod.Name] = pod
		}
	}
	if len(pods) > 0 {
		p.handle.Activate(p.logger, pods)
	}
}

// activatePending moves those of the pods still pending (per the scheduler's informer) back to
// the active queue.
func (p *Plugin) activatePending(pods map[string]*v1.Pod) {
	if p.pods == nil {
		return
	}
	still := map[string]*v1.Pod{}
	for key, pod := range pods {
		if cur, err := p.pods.Pods(pod.Namespace).Get(pod.Name); err == nil && cur.UID == pod.UID && cur.Spec.NodeName == "" {
			still[key] = cur
		}
	}
	if len(still) > 0 {
		p.handle.Activate(p.logger, still)
	}
}

// activateAll retries every pending member after the stream (re)connects: what it missed while
// disconnected is in the first snapshot.
func (p *Plugin) activateAll() {
	if p.pods == nil {
		return
	}
	list, err := p.pods.List(labels.Everything())
	if err != nil {
		return
	}
	pods := map[string]*v1.Pod{}
	for _, pod := range list {
		if pod.Spec.NodeName == "" && GroupOf(pod) != "" {
			pods[pod.Namespace+"/"+pod.Name] = pod
		}
	}
	if len(pods) > 0 {
		p.handle.Activate(p.logger, pods)
	}
}

// Wait blocks until the plugin's goroutines ended (the stream's context must be done). Tests.
func (p *Plugin) Wait() { p.wg.Wait() }
