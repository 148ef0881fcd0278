// Reserve, Unreserve and Permit: the end of the scheduling cycle. kube-scheduler assumes the pod on
// its node (Reserve), asks Permit whether it may bind, and undoes the assumption when a later phase
// fails or a Permit wait times out (Unreserve). The gang barrier runs here: a member waits at
// Permit (the framework's waiting pods) until the service says every planned member is reserved.
// The release of waiting members (allowAll, release) serves the PreBind barrier (prebind.go) too.

package phalanx

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// Reserve: kube-scheduler assumed the member on its node. When that is the node of the mirror's
// plan nothing is called (the scheduling loop goes on): the member's Permit call tells the service
// it is reserved (reserved_uids) and the service checks the node again there. Otherwise the
// service is asked (its plan may be newer than the mirror's); when the node is one PreFilter
// offered for a trade, the service is asked to trade the two members' nodes first. In the
// simulation of kube-scheduler's pod-group cycle the call says so: the service then trades but
// does not count the member reserved (the simulation is reverted; the real Reserve that follows
// finds the traded node in the mirror, and the member's Permit call reports it reserved).
func (p *Plugin) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	group := GroupOf(pod)
	if group == "" {
		return nil
	}
	if planned, ok := p.mirror.PlannedNode(pod.UID); ok && planned == node {
		p.mirror.Take(pod.UID)
		return nil
	}
	var partner types.UID
	if s := readState(state); s != nil {
		partner = s.trades[node]
	}
	var reply *pb.ReserveReply
	err := p.unary(ctx, p.args.RPCTimeout.Duration, func(ctx context.Context) (err error) {
		reply, err = p.client.Reserve(ctx, &pb.ReserveRequest{Version: version, PodUid: string(pod.UID), Group: group,
			Node: node, TradedWith: string(partner), Simulation: inPodGroupSimulation(state)})
		return err
	})
	if err != nil {
		return p.unreachable(group, err)
	}
	if !reply.GetOk() {
		p.mirror.DropPlan(group)
		return fwk.NewStatus(fwk.Unschedulable, reply.GetReason())
	}
	if partner != "" {
		p.mirror.Trade(pod.UID, partner, node)
	}
	p.mirror.Take(pod.UID)
	return nil
}

// Unreserve tells the service the member is no longer assumed; when that ends its gang's chance
// (a member that reached the barrier was rejected there, e.g. a Permit timeout), the members still
// waiting are rejected too. A member whose Reserve was refused never reached the barrier and only
// leaves it (kube-scheduler runs Unreserve after a failed Reserve too). Asynchronous: Unreserve may
// run in the scheduling cycle, which must not wait for an RPC.
//
// With GenericWorkload on, kube-scheduler's pod-group cycle first reserves every member of the
// group in a simulation and reverts it (Unreserve) before it reserves them again for binding; the
// simulation's cycle state says so (IsPodGroupSchedulingCycle), and its revert is not reported: the
// member has not left the plan.
func (p *Plugin) Unreserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, node string) {
	group := GroupOf(pod)
	if group == "" {
		return
	}
	p.mirror.Release(pod.UID)
	if inPodGroupSimulation(state) {
		return
	}
	uid := pod.UID
	reason := "unreserved"
	if reachedPermit(state) && p.handle.GetWaitingPod(uid) == nil {
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

// permitKey marks a cycle whose member reached Permit (the gang's barrier, at Permit or PreBind).
// Unreserve tells by it a member rejected at the barrier — which ends its gang's plan — from one
// whose Reserve was refused (the service holds a newer plan than the mirror): that member only
// leaves, and kube-scheduler retries it against the service's current plan.
const permitKey fwk.StateKey = Name + "/permit"

type permitMark struct{}

func (permitMark) Clone() fwk.StateData { return permitMark{} }

func markReachedPermit(state fwk.CycleState) {
	if state != nil {
		state.Write(permitKey, permitMark{})
	}
}

func reachedPermit(state fwk.CycleState) bool {
	if state == nil {
		return false
	}
	_, err := state.Read(permitKey)
	return err == nil
}

// inPodGroupSimulation: the cycle is the simulation of kube-scheduler's pod-group cycle
// (GenericWorkload), whose reservations are reverted before the members are reserved for binding.
func inPodGroupSimulation(state fwk.CycleState) bool {
	return state != nil && state.IsPodGroupSchedulingCycle()
}

// Permit is the gang barrier: every member Waits; its Permit call runs beside the scheduling loop,
// and the reply of the member that completes the gang (after the service wrote the placement
// record) allows every waiting member.
func (p *Plugin) Permit(_ context.Context, state fwk.CycleState, pod *v1.Pod, node string) (*fwk.Status, time.Duration) {
	group := GroupOf(pod)
	if group == "" {
		return nil, 0
	}
	markReachedPermit(state)
	if p.waitsAtPreBind(pod) {
		return nil, 0
	}
	if p.breaker.Open() {
		return p.unreachable(group, ErrOpen), 0
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.permit(pod, group, node)
	}()
	return fwk.NewStatus(fwk.Wait, fmt.Sprintf("phalanx: podgroup %s: waiting for its gang", group)),
		p.args.PermitTimeout.Duration
}

// permitting is a member waiting at Permit for its group's Permit call.
type permitting struct {
	pod  *v1.Pod
	node string
}

// permit makes the member's Permit call and applies the decision to the waiting pods; it runs in
// the goroutine Permit starts, beside the scheduling loop. Members reserved on the mirror's
// planned node share their group's calls: while one call is in flight the next members queue,
// and the caller sends them all in one call when its reply is applied (a 1,000-pod gang reaches
// Permit within milliseconds: a call each would queue 1,000 RPCs at the service, every one
// rebuilding the reservations stream). A member assumed elsewhere calls alone.
func (p *Plugin) permit(pod *v1.Pod, group, node string) {
	if planned, ok := p.mirror.PlannedNode(pod.UID); !ok || planned != node {
		p.permitBatch(group, []permitting{{pod, node}})
		return
	}
	p.mu.Lock()
	if queued, inFlight := p.permitting[group]; inFlight {
		p.permitting[group] = append(queued, permitting{pod, node})
		p.mu.Unlock()
		return
	}
	p.permitting[group] = nil
	p.mu.Unlock()
	batch := []permitting{{pod, node}}
	for len(batch) > 0 {
		p.permitBatch(group, batch)
		p.mu.Lock()
		batch = p.permitting[group]
		if len(batch) == 0 {
			delete(p.permitting, group)
		} else {
			p.permitting[group] = nil
		}
		p.mu.Unlock()
	}
}

// permitBatch is one Permit call naming every member of batch reserved (the first is the caller,
// whose node the service checks against its plan), and its decision applied to them all.
func (p *Plugin) permitBatch(group string, batch []permitting) {
	first := batch[0]
	uids := make([]string, len(batch))
	nodes := make(map[string]string, len(batch))
	for i, m := range batch {
		uids[i] = string(m.pod.UID)
		nodes[uids[i]] = m.node
	}
	reply, err := p.callPermit(p.ctx, group, first.node, uids, nodes)
	if err != nil {
		for _, m := range batch {
			if wp := p.waitingPod(m.pod.UID); wp != nil {
				wp.Reject(Name, p.unreachable(group, err).Message())
			}
		}
		return
	}
	switch reply.GetDecision() {
	case pb.PermitReply_ALLOW:
		p.allowAll(append(reply.GetAllowUids(), uids...), "")
	case pb.PermitReply_WAIT: // the member that completes the gang allows these
	default:
		p.mirror.DropPlan(group)
		for _, m := range batch {
			if wp := p.waitingPod(m.pod.UID); wp != nil {
				wp.Reject(Name, reply.GetReason())
			}
		}
	}
}

// callPermit is a Permit call, from either barrier (permitBatch; PreBind): it names the members
// uids reserved (Reserve made no call when the mirror's plan agreed), the first of them on node,
// and where each was assumed (nodes): the service's plan may be newer than the mirror they were
// reserved against, and it rejects the call when one is not planned there.
func (p *Plugin) callPermit(ctx context.Context, group, node string, uids []string, nodes map[string]string,
) (reply *pb.PermitReply, err error) {
	err = p.unary(ctx, p.args.RPCTimeout.Duration, func(ctx context.Context) (err error) {
		reply, err = p.client.Permit(ctx, &pb.PermitRequest{Version: version, PodUid: uids[0], Group: group,
			Node: node, ReservedUids: uids, ReservedNodes: nodes, ConditionByScheduler: p.conditionByScheduler})
		return err
	})
	return reply, err
}

// waitingPod is the member's waiting pod (asked by permit, after Permit returned Wait). The
// framework registers it right after Permit returned, which a reply can beat: it is looked for a
// little while (rpcTimeout); nil when it never shows (the member is gone, or was rejected
// meanwhile).
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

// allowAll, after Permit (permit) or in PreBind, allows the members an ALLOW reply names, at
// whichever barrier each waits, except skip (a member in PreBind that took its own reply).
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

// release gives a member held at a barrier its decision (from allowAll, and from the goroutine
// Unreserve starts for the rest of a gang): a member waiting in PreBind through its
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

// decision is what a member waiting in PreBind is told: allowed, or rejected with a message.
type decision struct {
	allow bool
	msg   string
}
