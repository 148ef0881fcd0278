// Filter, PostFilter, PreScore and Score: the phases of the scheduling cycle that look at the
// candidate nodes. Filter and Score run once per node, so they read the mirror's capacity held per
// node and make no RPC: plain pods are kept off capacity reserved for plans, then steered to nodes
// without reservations, and a member's planned node scores highest. PostFilter runs when no node
// passed Filter: for a member, that its planned node was rejected, which it tells the service.

package phalanx

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// Filter runs for each candidate node: it keeps a plain pod off capacity that plans reserve on the
// node (a member's only candidate is its planned node, which PreFilter chose).
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

// ReservedShortfall, Filter's test of one node, names the first resource the pod needs that is not
// free on the node once the reservations are held, or "". Units as the contract says: cpu in
// millicores, others base units.
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

// PostFilter runs when no node passed Filter. It reports the rejection of a member's planned node
// (plugin and reasons) so the service re-slots or re-plans. Members get no per-pod preemption
// (group preemption runs in the service's workload cycle); plain pods go on to the next PostFilter
// plugin (DefaultPreemption).
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

// PreScore, once per cycle before Score, skips scoring when it cannot matter: a member has exactly
// one node; a plain pod when no node holds reservations.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	s := readState(state)
	if s == nil || (s.group == "" && !p.mirror.HasReservations()) {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score, for each node that passed Filter: a member's planned node scores highest; a plain pod
// prefers nodes without reservations.
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
