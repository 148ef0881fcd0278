// PreEnqueue, the queueing hints, SignPod and PreFilter: the phases before kube-scheduler looks at
// nodes. PreEnqueue runs when a pod is added to the scheduling queue and keeps a member of an
// incomplete gang out of the active queue. The queueing hints run on each cluster event and decide
// whether an unschedulable pod is retried. SignPod runs at the start of a scheduling cycle, for
// opportunistic batching. PreFilter runs first in a pod's scheduling cycle and narrows a member to
// its planned node: this is where the service is asked for a plan (PlanForPod, beside the
// scheduling loop) when the mirror holds none.

package phalanx

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	pb "phalanx.dev/scheduler-plugin/gen/phalanx/v1"
)

// planCall is one PlanForPod call for a group, shared by the members that reach PreFilter while
// it runs. late: the members answered "being planned" (moved back to the active queue when the
// reply lands); done is closed once reply/err are set.
type planCall struct {
	started time.Time
	wait    time.Time // planWait after the call started: members waiting for it wait until then only
	done    chan struct{}
	reply   *pb.PlanForPodReply
	err     error
	late    map[types.UID]*v1.Pod
	waiting map[types.UID]bool // members in PreFilter waiting for the reply (they take it)
	// touched: phalanx serve touched a member while the call was in flight (its queueing hint
	// skipped it); a reply other than a plan may predate what the touch announced
	touched bool
}

// PreEnqueue runs when a pod is added to the scheduling queue (and again before it is moved to the
// active queue): it keeps a gang member out of the active queue while its group misses members,
// and a member of any group while the pods its preemption evicted have not all terminated or while
// the service has still to try planning it ahead (kube-scheduler's loop then meets the group with
// its plan, or its preemption under way, rather than failing it member by member).
func (p *Plugin) PreEnqueue(_ context.Context, pod *v1.Pod) *fwk.Status {
	group := GroupOf(pod)
	if group == "" {
		return nil
	}
	if p.mirror.Waiting(group) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("phalanx: podgroup %s is waiting for members", group))
	}
	if p.mirror.Preempting(group) {
		return preemptingStatus(group)
	}
	if p.mirror.HoldUntried(group) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("phalanx: podgroup %s is being planned", group))
	}
	return nil
}

// preemptingStatus is what a member of a group waiting for its preemption's victims is told: it
// cannot fit before they are gone, and the stream moves it back to the queue then.
func preemptingStatus(group string) *fwk.Status {
	return fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
		fmt.Sprintf("phalanx: podgroup %s is waiting for the pods its preemption evicts to terminate", group))
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

// unlessPlanning is the queueing hint of every event, called by the scheduling queue when the event
// happens, for each pod the plugin left unschedulable: QueueSkip for a member whose group is being
// planned (by its call, or ahead by the service) or waiting for its preemption's victims, Queue for
// everything else. A touch by phalanx
// serve of a member of a group being planned is not lost: the service touches once room it had not
// seen appears (a node added, say), and the call in flight may have been answered before it saw
// that room; the touch is noted on the call, and a reply other than a plan then moves the group's
// pending members back to the active queue.
func (p *Plugin) unlessPlanning(_ klog.Logger, pod *v1.Pod, oldObj, newObj interface{}) (fwk.QueueingHint, error) {
	if group := GroupOf(pod); group != "" {
		if p.mirror.Preempting(group) {
			return fwk.QueueSkip, nil // each victim's deletion is an event; the stream moves it when all are gone
		}
		if p.mirror.HoldUntried(group) {
			return fwk.QueueSkip, nil // the snapshot with its plan, or no longer listing it, moves it
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if call, planning := p.planning[group]; planning {
			if touched(oldObj, newObj, group) {
				call.touched = true
			}
			return fwk.QueueSkip, nil
		}
	}
	return fwk.Queue, nil
}

// touched reports whether an event is phalanx serve's touch of a member of group: a pod update
// that changes the pod's AnnotationRetry.
func touched(oldObj, newObj interface{}, group string) bool {
	old, okOld := oldObj.(*v1.Pod)
	cur, okNew := newObj.(*v1.Pod)
	if !okOld || !okNew || GroupOf(cur) != group {
		return false
	}
	stamp, ok := cur.Annotations[AnnotationRetry]
	return ok && stamp != old.Annotations[AnnotationRetry]
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
		return p.planned(state, pod, group, node), nil
	}
	if p.mirror.Preempting(group) {
		// the group's first member was just answered so and the rest meet kube-scheduler's loop in
		// the same pod-group cycle: each would ask phalanx serve the same, one after the other
		return nil, preemptingStatus(group)
	}
	podJSON, err := json.Marshal(pod)
	if err != nil {
		return nil, fwk.AsStatus(fmt.Errorf("phalanx: encoding pod: %w", err))
	}
	call := p.planFor(group, pod.UID, podJSON)
	deadline := call.wait // a member joining a call in flight waits what is left
	if inPodGroupSimulation(state) {
		// kube-scheduler's pod-group cycle (GenericWorkload) holds its loop for the whole group
		// anyway, and a member answered "being planned" there fails the group's attempt (its
		// PodGroupPostFilter runs, every member backs off): the member waits for the plan
		deadline = call.started.Add(p.args.PlanTimeout.Duration)
	}
	timer := time.NewTimer(time.Until(deadline))
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
		return nil, p.unreachable(group, call.err)
	}
	reply := call.reply
	switch reply.GetVerdict() {
	case pb.PlanForPodReply_PLANNED:
		node, ok := p.mirror.PlannedNode(pod.UID)
		if !ok { // a call another member made planned without this one (or the plan is gone)
			return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
				fmt.Sprintf("phalanx: podgroup %s holds no plan for this pod; re-planning", group))
		}
		return p.planned(state, pod, group, node), nil
	case pb.PlanForPodReply_NOT_A_MEMBER:
		return nil, fwk.NewStatus(fwk.Skip)
	default:
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reply.GetReason())
	}
}

// planned is PreFilter's result for a member planned on node: that node, and the nodes it may
// trade for (Mirror.Alternatives), which kube-scheduler's filters judge with the members already
// assumed; Score puts the member's own node first.
func (p *Plugin) planned(state fwk.CycleState, pod *v1.Pod, group, node string) *fwk.PreFilterResult {
	trades := p.mirror.Alternatives(pod.UID)
	state.Write(stateKey, &podState{group: group, node: node, trades: trades})
	names := sets.New(node)
	for other := range trades {
		names.Insert(other)
	}
	return &fwk.PreFilterResult{NodeNames: names}
}

// planFor, in PreFilter, is the group's PlanForPod call in flight, or a new one for pod. The call
// runs beside the scheduling loop under planTimeout, one group's call at a time; when it lands, a
// plan goes into the mirror and the group's pending members that did not take the reply (answered
// "being planned", or answered "wait for members" before the plan existed) are moved back to the
// active queue; a late "wait" moves back only the members it left answered "being planned", so they
// show the real reason. An open breaker makes no call: the result is its error at once.
func (p *Plugin) planFor(group string, uid types.UID, podJSON []byte) *planCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	if call := p.planning[group]; call != nil {
		call.waiting[uid] = true
		return call
	}
	now := time.Now()
	call := &planCall{started: now, wait: now.Add(p.args.PlanWait.Duration), done: make(chan struct{}),
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
		retry := call.touched && !planned && err == nil
		p.mu.Unlock()
		if planned {
			p.activate([]string{group}, func(uid types.UID) bool { return taken[uid] })
		} else if retry {
			// the reply may predate the touch: every pending member, those that took the reply
			// too (kube-scheduler moves a pod still in its cycle once that cycle ends)
			p.activate([]string{group}, nil)
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

// PreFilterExtensions implements fwk.PreFilterPlugin (none: the plugin keeps no per-node state).
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return nil }
